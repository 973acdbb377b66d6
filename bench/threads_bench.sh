#!/usr/bin/env bash
# bench/threads_bench.sh: is OMP_WAIT_POLICY=PASSIVE (the scripts' choice) the
# right one? The same measurements under PASSIVE and ACTIVE, on 1 and 2
# threads:
#   - one training step of the gdn layer, chunked, T = 1024, B*T = 16384
#     (best and median of 2 timed steps);
#   - one decoding step of the gdn layer at context 1024, B = 1 (fastest of 32).
# Two rounds, the four settings interleaved, so that a change in the load of
# the machine hits all of them alike; each figure is the better round.
#
#   bench/threads_bench.sh [BUILD_DIR=build] [OUT_TSV=threads.tsv] [TOKENS=16384]
#
# Prints a table and writes OUT_TSV (policy, threads, train us/token best,
# median, decode us/token).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${2:-threads.tsv}
TOKENS=${3:-16384}
BIN=$BUILD/mixer_bench
[ -x "$BIN" ] || { echo "threads_bench: $BIN not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

SETTINGS=("PASSIVE 1" "ACTIVE 1" "PASSIVE 2" "ACTIVE 2")
echo "threads_bench: gdn layer, chunked training step at T = 1024 (B*T = $TOKENS) and decode at P = 1024"
echo "loadavg at start: $(cat /proc/loadavg)"
for round in 1 2; do
    for s in "${SETTINGS[@]}"; do
        set -- $s
        d=$tmp/$1-$2-$round
        mkdir -p "$d"
        OMP_WAIT_POLICY=$1 OMP_NUM_THREADS=$2 "$BIN" -only gdn:chunked -T 1024 -pos 1024 -reps 2 -tokens "$TOKENS" -tsv "$d" \
            >"$d/out.txt"
    done
done
echo "loadavg at end:   $(cat /proc/loadavg)"

printf 'policy\tthreads\ttrain_us_per_token_best\ttrain_us_per_token_median\tdecode_us_per_token\n' >"$OUT"
for s in "${SETTINGS[@]}"; do
    set -- $s
    # The better of the two rounds (smallest), per figure.
    best=$(awk -F'\t' 'FNR > 1 && $11 == "ok" {print $5}' "$tmp/$1-$2-"{1,2}/train.tsv | sort -g | head -1)
    med=$(awk -F'\t' 'FNR > 1 && $11 == "ok" {print $6}' "$tmp/$1-$2-"{1,2}/train.tsv | sort -g | head -1)
    dec=$(awk -F'\t' 'FNR > 1 {print $3}' "$tmp/$1-$2-"{1,2}/decode.tsv | sort -g | head -1)
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$best" "$med" "$dec" >>"$OUT"
done
column -t -s $'\t' "$OUT"
