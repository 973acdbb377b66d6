#!/usr/bin/env bash
# bench/prefill_bench.sh: how long `generate` takes over a prompt of P bytes
# of the Bible, in parallel windows (lm_prefill, the default) against token by
# token (--no-prefill), for every bundled config, and its peak memory.
#
#   bench/prefill_bench.sh [-c CONTEXTS] [-r ROUNDS] [-b BUILD] [CONFIG...]
#
#   -c CONTEXTS  prompt lengths in bytes, comma list (default 1024,16384)
#   -r ROUNDS    runs of each side, alternating; the best is shown (default 2)
#   -b BUILD     the build folder (default build)
#   CONFIG       configs/tiny_*.ini by default
#
# The model of each config is trained here for one step into a temporary
# folder (the speed does not depend on the weights). generate runs with its
# default threads: the prompt on every core, the sampled tokens (one here) on
# one thread below 10M parameters. The prompt's seconds are generate's own
# ("prompt X s" on its status line); peak memory is the process's maximum
# resident set (VmHWM of /proc/PID/status, the whole process: model, caches
# and activations). Needs cache/kjv.txt (scripts/get_corpus.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/bench_lib.sh   # one_step_checkpoint

CONTEXTS=1024,16384
ROUNDS=2
BUILD=build
while getopts "c:r:b:" opt; do
    case $opt in
        c) CONTEXTS=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        b) BUILD=$OPTARG ;;
        *) echo "usage: $0 [-c CONTEXTS] [-r ROUNDS] [-b BUILD] [CONFIG...]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(configs/tiny_*.ini)
IFS=, read -r -a CLIST <<<"$CONTEXTS"
[ -s cache/kjv.txt ] || { echo "prefill_bench: cache/kjv.txt missing (scripts/get_corpus.sh)" >&2; exit 1; }
[ -x "$BUILD/generate" ] || { echo "prefill_bench: $BUILD/generate missing" >&2; exit 1; }
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# run CKPT PROMPT [FLAG]: prints "SECONDS PEAK_MB" (the prompt's seconds, the peak resident set).
run() {
    local out
    # generate's high-water mark (VmHWM), read while it runs: it only grows,
    # so the last reading is within 50 ms of the end.
    out=$( (exec "$BUILD/generate" --checkpoint "$1" --prompt-file "$2" --max-tokens 1 --no-echo "${@:3}" \
        2>"$TMP/err" >/dev/null & pid=$!
        peak=0
        while kill -0 "$pid" 2>/dev/null; do
            p=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$pid/status" 2>/dev/null || true)
            [ -n "$p" ] && [ "$p" -gt "$peak" ] && peak=$p
            sleep 0.05
        done
        wait "$pid"
        echo "$peak") )
    local s
    s=$(sed -n 's/.*(prompt \([0-9.]*\) s .*/\1/p' "$TMP/err")
    [ -n "$s" ] || { echo "prefill_bench: generate failed: $(cat "$TMP/err")" >&2; exit 1; }
    echo "$s $((out / 1024))"
}

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
rows=()
for cfg in "${CONFIGS[@]}"; do
    name=$(basename "$cfg" .ini)
    ckpt=$TMP/$name/checkpoint.h5
    one_step_checkpoint prefill_bench "$BUILD/train" "$cfg" "$TMP/$name"
    for P in "${CLIST[@]}"; do
        head -c "$P" cache/kjv.txt >"$TMP/prompt"
        best_p=1e9 best_s=1e9 mem_p=0 mem_s=0
        for ((r = 0; r < ROUNDS; r++)); do
            read -r sp mp < <(run "$ckpt" "$TMP/prompt")
            read -r ss ms < <(run "$ckpt" "$TMP/prompt" --no-prefill)
            best_p=$(awk -v a="$sp" -v b="$best_p" 'BEGIN { print (a < b) ? a : b }')
            best_s=$(awk -v a="$ss" -v b="$best_s" 'BEGIN { print (a < b) ? a : b }')
            mem_p=$mp mem_s=$ms
        done
        ratio=$(awk -v p="$best_p" -v s="$best_s" 'BEGIN { if (p > 0) printf "%.1fx", s / p; else print "-" }')
        rows+=("$name|$P|$best_p|$best_s|$ratio|$mem_p|$mem_s")
        echo "== $name P=$P done" >&2
    done
done

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; the prompt on every core"
echo "seconds over a prompt of P bytes, best of $ROUNDS alternating runs; peak resident MB of the last run"
echo
echo "| config | P | parallel windows s | token by token s | speed-up | peak MB parallel | peak MB token by token |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for r in "${rows[@]}"; do echo "| ${r//|/ | } |"; done
echo
echo "load average before/after: $LOAD0 / $(cut -d' ' -f1-3 /proc/loadavg)"
