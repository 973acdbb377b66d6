#!/usr/bin/env bash
# tests/fuzz/run.sh [SECONDS] [TARGET...]: build the libFuzzer targets with
# clang (ASan + UBSan, build-fuzz/) and run each for SECONDS (default 60) on
# its committed seeds (tests/fuzz/seeds/<name>/). Inputs the fuzzer finds go
# to build-fuzz/corpus/<name>/ (not committed); a crash, leak, timeout or
# out-of-memory stops with the input saved in build-fuzz/artifacts/ and exit 1.
# Prints each target's executions.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
SECONDS_EACH=${1:-60}
shift || true
command -v clang >/dev/null || { echo "fuzz: clang not found (apt-get install clang libclang-rt-14-dev libomp-14-dev)" >&2; exit 2; }
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
    for src in tests/fuzz/fuzz_*.c; do
        name=$(basename "$src" .c)
        [ "$name" = fuzz_util ] || TARGETS+=("${name#fuzz_}")
    done
fi
BUILD=$ROOT/build-fuzz
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_C_COMPILER=clang -DAG_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]/#/fuzz_}" >/dev/null
mkdir -p "$BUILD/artifacts"
# HDF5 files are rewritten on every input: keep them in memory when we can.
export TMPDIR=${FUZZ_TMPDIR:-$( [ -d /dev/shm ] && [ -w /dev/shm ] && echo /dev/shm || echo /tmp )}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for t in "${TARGETS[@]}"; do
    corpus=$BUILD/corpus/$t
    mkdir -p "$corpus"
    log=$BUILD/fuzz_$t.log
    if "$BUILD/tests/fuzz/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=${FUZZ_TIMEOUT:-60} -rss_limit_mb=2048 \
        -artifact_prefix="$BUILD/artifacts/$t-" -print_final_stats=1 "$corpus" "$ROOT/tests/fuzz/seeds/$t" >"$log" 2>&1; then
        runs=$(grep -a "stat::number_of_executed_units" "$log" | awk '{print $2}')
        echo "fuzz $t: ${runs:-?} executions in ${SECONDS_EACH} s, no crash, leak, hang or OOM"
    else
        echo "fuzz $t: FAILED (see $log; input in $BUILD/artifacts/)" >&2
        grep -aE "ERROR|SUMMARY|runtime error" "$log" | head -5 >&2 || true
        status=1
    fi
done
exit $status
