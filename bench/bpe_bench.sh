#!/usr/bin/env bash
# bpe_bench.sh: BPE encoding speed against the npm tiktoken package, one
# thread, same text, ids compared; then training times. Figures: docs/tokenizer.md.
#
#   bench/bpe_bench.sh        (after scripts/run.sh build and scripts/get_corpus.sh;
#                              tiktoken from `cd /tmp/tk && npm install tiktoken`, or TIKTOKEN_DIR)
# Texts it builds in cache/ (nothing committed):
#   bpe_mixed.txt  2.8 MB: tests/fixtures/bpe/text.txt.gz (353 KB, ~45 languages, emoji,
#                  code), the first 2 MB of the KJV Bible, the licences in
#                  /usr/share/common-licenses, C headers from /usr/include
#   bpe_50mb.txt   50 MB: the KJV Bible, then Debian's man pages (every language,
#                  roff source) and /usr/share/doc's gzip'd texts, in path order
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
NODE_PATH=${TIKTOKEN_DIR:-/tmp/tk/node_modules}
export NODE_PATH OMP_NUM_THREADS=1
[ -s cache/kjv.txt ] || scripts/get_corpus.sh
mix=cache/bpe_mixed.txt big=cache/bpe_50mb.txt
if [ ! -s $mix ]; then
    { zcat tests/fixtures/bpe/text.txt.gz; head -c 2000000 cache/kjv.txt; cat /usr/share/common-licenses/*;
      cat /usr/include/stdio.h /usr/include/stdlib.h /usr/include/string.h /usr/include/math.h; } > $mix.tmp
    mv $mix.tmp $mix
fi
if [ ! -s $big ]; then
    { cat cache/kjv.txt; find /usr/share/man -name '*.gz' | LC_ALL=C sort | xargs zcat 2>/dev/null | head -c 23000000;
      find /usr/share/doc -name '*.gz' | LC_ALL=C sort | xargs zcat 2>/dev/null; } | head -c 50000000 > $big.tmp || true
    mv $big.tmp $big
fi
for enc in cl100k_base o200k_base; do
    $B/bpe_bench encode $enc $mix /tmp/bpe_bench_ours.txt | sed 1d
    if [ -d "$NODE_PATH/tiktoken" ]; then
        node bench/bpe_bench_tiktoken.mjs $enc $mix /tmp/bpe_bench_theirs.txt
        cmp -s /tmp/bpe_bench_ours.txt /tmp/bpe_bench_theirs.txt && echo "  ids identical" || echo "  ids DIFFER"
    fi
done
$B/bpe_bench train cache/kjv.txt 4096,16384,65536 | sed 1d
$B/bpe_bench train $big 4096,16384,65536
