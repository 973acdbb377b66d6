#!/usr/bin/env bash
# build_bpe.sh: build the BPE fuzz target (fuzz_bpe.c) with clang's libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer, and optionally run it.
#
#   tests/fuzz/build_bpe.sh              build build-fuzz/fuzz_bpe
#   tests/fuzz/build_bpe.sh run [SECS]   build, then fuzz for SECS seconds (default 60)
#                                        from a copy of tests/fuzz/seeds/bpe/
# Needs clang (Debian: clang), libpcre2-dev and zlib1g-dev. Self-contained:
# compiles the few library files the target uses, not the whole project.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
command -v clang >/dev/null || { echo "build_bpe.sh: clang not found (apt-get install clang)" >&2; exit 1; }
mkdir -p build-fuzz
clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -DSOURCE_DIR="\"$ROOT\"" -Isrc/autograd -Idata \
    tests/fuzz/fuzz_bpe.c data/bpe.c data/bpe_load.c data/bpe_split.c data/bpe_unicode.c data/corpus.c src/autograd/common.c \
    -lpcre2-8 -lz -o build-fuzz/fuzz_bpe
echo "build_bpe.sh: built build-fuzz/fuzz_bpe"
if [ "${1:-}" = run ]; then
    corpus=build-fuzz/corpus_bpe
    mkdir -p "$corpus"
    cp -n tests/fuzz/seeds/bpe/* "$corpus/"
    build-fuzz/fuzz_bpe -max_total_time="${2:-60}" -max_len=65536 -rss_limit_mb=2048 "$corpus"
fi
