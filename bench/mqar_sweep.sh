#!/usr/bin/env bash
# bench/mqar_sweep.sh: the associative-recall runs of docs/mqar.md, section
# "Capacity at equal state size": 2-layer models of each mixer at width 32
# (recurrent state 2 x 16 x 16 = 512 numbers per layer), 32 key-value pairs,
# T = 256, vocabulary 256, batch 16, up to 3000 steps, two learning rates per
# mixer; a run stops once an accuracy check (every 250 steps, 4 batches)
# reaches 99%. One thread, one run at a time.
#
#   bench/mqar_sweep.sh            all 8 runs, then the plot: about 35 minutes
#                                  (2-6 min a run on one thread of the 2-core
#                                  machine with a load of 4-8; less when idle),
#                                  in build/bench/mqar_sweep/
#   bench/mqar_sweep.sh --out docs/bench/mqar --img docs/img [MODE]
#                                  the same into the committed results (replaces them)
#   bench/mqar_sweep.sh [--out DIR] plot   only the plot, from DIR's runs
#   MIXERS="attn gdn" LRS="1e-2" bench/mqar_sweep.sh    a subset (files of other
#                                  runs are kept; the plot uses all of them); any
#                                  mixer kind, e.g. MIXERS=gdp (gdp_steps 2)
#   bench/mqar_sweep.sh attn-long  attention's reference point: width 64, lr
#                                  3e-3, up to 8000 steps (its induction phase
#                                  change came at ~6500): about 9 minutes
#
# Output (--out DIR, default build/bench/mqar_sweep; the committed ones are
# docs/bench/mqar and docs/img): DIR/<mixer>_<lr>.{tsv,curve.tsv,txt} (final
# accuracy, accuracy curve, raw output), DIR/all.tsv, DIR/curves.tsv, and
# mqar_curves.png in the --img folder (default DIR). Without --out nothing
# under docs/ is written.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${BUILD:-$ROOT/build}
# shellcheck source=bench/bench_lib.sh
. "$ROOT/bench/bench_lib.sh"
bench_out mqar_sweep "$@"   # OUT, IMG: --out DIR (default $BUILD/bench/mqar_sweep), --img DIR
set -- "${REST[@]+"${REST[@]}"}"
case ${1:-} in
    ""|plot|attn-long) ;;
    *) echo "mqar_sweep: unknown mode '$1' (plot or attn-long, after the --out/--img options)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "mqar_sweep: unexpected argument '$2' after the mode" >&2; exit 2; }
DATA=$OUT
MIXERS=${MIXERS:-attn gdn mamba linear}
LRS=${LRS:-3e-3 1e-2}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE

if [ "${1:-}" = attn-long ]; then
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j 2 --target mqar >/dev/null
    {
        echo "== attn width 64 lr 3e-3, up to 8000 steps (load: $(cut -d' ' -f1-3 /proc/loadavg))"
        "$BUILD/mqar" --mixers attn --widths 64 --pairs 32 --seq 256 --vocab 256 --batch 16 \
            --steps 8000 --lr 3e-3 --eval-every 250 --stop-at 0.99 \
            --tsv "$DATA/attn_w64_3e-3_long.tsv" --curve "$DATA/attn_w64_3e-3_long.curve.tsv"
    } | tee "$DATA/attn_w64_3e-3_long.txt"
elif [ "${1:-}" != plot ]; then
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j 2 --target mqar >/dev/null
    for m in $MIXERS; do
        for lr in $LRS; do
            {
                echo "== $m lr $lr (load: $(cut -d' ' -f1-3 /proc/loadavg))"
                "$BUILD/mqar" --mixers "$m" --widths 32 --pairs 32 --seq 256 --vocab 256 --batch 16 \
                    --steps 3000 --lr "$lr" --eval-every 250 --stop-at 0.99 \
                    --tsv "$DATA/${m}_$lr.tsv" --curve "$DATA/${m}_$lr.curve.tsv"
            } | tee "$DATA/${m}_$lr.txt"
        done
    done
fi

# all.tsv: every run's final line; curves.tsv: every accuracy check.
compgen -G "$DATA/*.curve.tsv" >/dev/null || { echo "mqar_sweep: no runs (*.curve.tsv) in $DATA: run the sweep, or name its folder with --out" >&2; exit 1; }
first=1
for f in "$DATA"/*_*.tsv; do
    case $f in *.curve.tsv) continue ;; esac
    if [ $first = 1 ]; then head -1 "$f"; first=0; fi
    tail -n +2 "$f"
done >"$DATA/all.tsv"
first=1
for f in "$DATA"/*.curve.tsv; do
    if [ $first = 1 ]; then head -1 "$f"; first=0; fi
    tail -n +2 "$f"
done >"$DATA/curves.tsv"

# One line per run (curve file): colour by mixer, dashed at lr 3e-3, squares
# for width 64.
PLOTS=""
for f in "$DATA"/*.curve.tsv; do
    base=$(basename "$f" .curve.tsv)
    read -r mixer width lr <<<"$(awk -F'\t' 'NR == 2 {print $1, $2, $3}' "$f")"
    [ -n "$mixer" ] || continue
    c=$(mixer_colour "$mixer")
    dt=1; awk -v l="$lr" 'BEGIN {exit !(l < 0.005)}' && dt=2
    pt=7; [ "$width" = 32 ] || pt=5
    title="$mixer"; [ "$width" = 32 ] || title="$title width $width"; title="$title lr $lr"
    case $base in *_long) title="$title (8000-step budget)" ;; esac
    PLOTS="$PLOTS${PLOTS:+, }\"$f\" using 4:(100*\$6) every ::1 with linespoints lw 2 pt $pt lc rgb \"$c\" dt $dt title \"$title\""
done
gnuplot <<GP
set terminal pngcairo size 1100,600 font "DejaVu Sans,11" noenhanced
set datafile separator "\t"
set grid
set key outside right top
set title "MQAR, 32 pairs, T = 256 (width 32: recurrent state 512 / layer): accuracy during training"
set xlabel "training step (batch 16)"
set ylabel "accuracy on 4 fresh batches (%)"
set yrange [0:100]
set output "$IMG/mqar_curves.png"
plot $PLOTS
GP
echo "== done: $DATA/all.tsv, $IMG/mqar_curves.png"
column -t -s $'\t' "$DATA/all.tsv"
