#!/usr/bin/env bash
# bench/region_count.sh: the OpenMP parallel regions a training step forks,
# per step and by where they are (docs/benchmarks.md: each costs 50-70 us on
# a 2-core KVM guest under OMP_WAIT_POLICY=PASSIVE, bench/fork_bench).
#
#   bench/region_count.sh [-p fp32|bf16] [-w 128|256|512] [-b TRAIN_BENCH] [-n TOP] [CONFIG...]
#                                          default: fp32, d_model 128, build/train_bench, every configs/tiny_*.ini
#
# Runs train_bench for 1 and for 6 steps (no warm-up) under an LD_PRELOAD
# library (bench/region_count_shim.c, compiled here with cc) that counts
# libgomp's GOMP_parallel calls that fork more than one thread; the
# difference over 5 is one step's, without the start-up's. Prints that
# count per config and its TOP sources (default 8), each named by addr2line
# (the outlined function: e.g. rows_real._omp_fn.0). -b times another build
# (before and after). Counts, not times: the machine's load does not move them.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/bench_lib.sh

PREC=fp32
WIDTH=128
TB=build/train_bench
TOP=8
while getopts "p:w:b:n:" opt; do
    case $opt in
        p) PREC=$OPTARG ;;
        w) WIDTH=$OPTARG ;;
        b) TB=$OPTARG ;;
        n) TOP=$OPTARG ;;
        *) sed -n '2,16p' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ -x "$TB" ] || { echo "region_count: no $TB (cmake --build build)" >&2; exit 1; }
command -v addr2line > /dev/null || { echo "region_count: needs addr2line (binutils)" >&2; exit 1; }
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(configs/tiny_*.ini)
WSETS=$(width_sets "$WIDTH")

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cc -O2 -shared -fPIC -o "$TMP/shim.so" bench/region_count_shim.c -ldl

echo "forked parallel regions per training step: $TB, precision $PREC, d_model $WIDTH, $(nproc) threads"
for cfg in "${CONFIGS[@]}"; do
    for s in 1 6; do
        # shellcheck disable=SC2086
        REGION_COUNT_OUT="$TMP/c$s.txt" LD_PRELOAD="$TMP/shim.so" "$TB" --config "$cfg" --steps $s --warmup 0 \
            --set train.precision="$PREC" $WSETS > "$TMP/out$s.txt" 2>&1 ||
            { echo "region_count: $TB failed on $cfg:" >&2; tail -5 "$TMP/out$s.txt" >&2; exit 1; }
        [ -s "$TMP/c$s.txt" ] || { echo "region_count: the shim wrote nothing (LD_PRELOAD refused?)" >&2; exit 1; }
    done
    echo "== $(basename "$cfg" .ini): $(awk 'NR == 1 { a = $2 } FNR == 1 && NR > 1 { print ($2 - a) / 5 }' "$TMP/c1.txt" "$TMP/c6.txt") a step"
    # Per site: (count after 6 steps - after 1) / 5, the largest first, named.
    awk 'NR == FNR { if (FNR > 1) one[$2 " " $3] = $1; next }
         FNR > 1 { d = ($1 - one[$2 " " $3]) / 5; if (d > 0) print d, $2, $3 }' "$TMP/c1.txt" "$TMP/c6.txt" |
        sort -k1,1 -g -r | head -n "$TOP" |
        while read -r per obj off; do
            printf '  %6s  %s\n' "$per" "$(addr2line -f -e "$obj" "$off" | head -1)"
        done
done
