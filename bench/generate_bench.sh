#!/usr/bin/env bash
# bench/generate_bench.sh: decoding tokens/s of `generate` for every bundled
# config after a prompt of P bytes of the Bible (context P), per product
# backend, alternating.
#
#   bench/generate_bench.sh [-c CONTEXTS] [-n TOKENS] [-r ROUNDS] [-g BACKENDS] [-b BUILD...] [CONFIG...]
#
#   -c CONTEXTS  prompt lengths in bytes, comma list (default 256,16384)
#   -n TOKENS    sampled tokens timed after the prompt (default 64)
#   -g BACKENDS  ATTNLAB_GEMM values to run, comma list (default openblas,onednn)
#   -b BUILD     a build folder to time (repeatable; default build): e.g. an
#                older build to compare before and after
#   CONFIG       configs/tiny_*.ini by default
#
# The model of each config is trained here for one step by the first BUILD
# into a temporary folder (decoding speed does not depend on the weights; an
# older build cannot read a newer build's checkpoint, whose config has keys it
# does not know, so list the oldest build first). generate runs as it does
# by default: one thread below 10M parameters, and every core for attention
# over a cache of 16384 keys x heads or more (older builds may use one
# thread throughout). Each figure is the best of
# ROUNDS (default 3) runs, the runs of one cell alternating between builds
# and backends. Needs cache/kjv.txt (scripts/get_corpus.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/bench_lib.sh   # one_step_checkpoint

CONTEXTS=256,16384
TOKENS=64
ROUNDS=3
BACKENDS=openblas,onednn
BUILDS=()
while getopts "c:n:r:g:b:" opt; do
    case $opt in
        c) CONTEXTS=$OPTARG ;;
        n) TOKENS=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        g) BACKENDS=$OPTARG ;;
        b) BUILDS+=("$OPTARG") ;;
        *) echo "usage: $0 [-c CONTEXTS] [-n TOKENS] [-r ROUNDS] [-g BACKENDS] [-b BUILD...] [CONFIG...]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(configs/tiny_*.ini)
[ ${#BUILDS[@]} -gt 0 ] || BUILDS=(build)
IFS=, read -r -a CLIST <<<"$CONTEXTS"
IFS=, read -r -a GLIST <<<"$BACKENDS"
[ -s cache/kjv.txt ] || { echo "generate_bench: cache/kjv.txt missing (scripts/get_corpus.sh)" >&2; exit 1; }
for b in "${BUILDS[@]}"; do
    [ -x "$b/generate" ] || { echo "generate_bench: $b/generate missing" >&2; exit 1; }
done
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
rows=()
for cfg in "${CONFIGS[@]}"; do
    name=$(basename "$cfg" .ini)
    ckpt=$TMP/$name/checkpoint.h5
    one_step_checkpoint generate_bench "${BUILDS[0]}/train" "$cfg" "$TMP/$name"
    for P in "${CLIST[@]}"; do
        head -c "$P" cache/kjv.txt >"$TMP/prompt"
        declare -A best=()
        for ((r = 0; r < ROUNDS; r++)); do
            for b in "${BUILDS[@]}"; do
                for g in "${GLIST[@]}"; do
                    out=$(ATTNLAB_GEMM=$g "$b/generate" --checkpoint "$ckpt" --prompt-file "$TMP/prompt" \
                        --max-tokens "$TOKENS" --seed 1 --no-echo 2>&1 >/dev/null | grep 'decoding' || true)
                    tps=$(sed -n 's/.*decoding \([0-9.]*\) tokens\/s.*/\1/p' <<<"$out")
                    key="$b|$g"
                    cur=${best[$key]:-0}
                    best[$key]=$(awk -v a="$tps" -v b="$cur" 'BEGIN { print (a > b) ? a : b }')
                done
            done
        done
        row="$name|$P"
        for b in "${BUILDS[@]}"; do
            for g in "${GLIST[@]}"; do row="$row|${best[$b|$g]}"; done
        done
        rows+=("$row")
        unset best
        echo "== $name P=$P done" >&2
    done
done

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; generate's default threads (1 below 10M parameters; attention over a long cache on all)"
echo "decoding tokens/s after a prompt of P bytes, $TOKENS sampled tokens, best of $ROUNDS alternating runs"
echo
hdr="| config | context P |"
sep="| --- | ---: |"
for b in "${BUILDS[@]}"; do
    for g in "${GLIST[@]}"; do
        hdr="$hdr $b $g |"
        sep="$sep ---: |"
    done
done
echo "$hdr"
echo "$sep"
for r in "${rows[@]}"; do echo "| ${r//|/ | } |"; done
echo
echo "load average before/after: $LOAD0 / $(cut -d' ' -f1-3 /proc/loadavg)"
