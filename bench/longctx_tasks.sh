#!/usr/bin/env bash
# bench/longctx_tasks.sh: the length-generalisation runs of
# docs/long_context.md, "Synthetic long-range tasks": each mixer (attn,
# linear, mamba, gdn), 2 layers of width 64, every model at the same budget
# of 100k parameters (longctx --params: the MLP width makes up the
# difference), trained at T = 256 on passkey retrieval (2 digits; depth
# uniform at random) and on MQAR with a gap (8 pairs, 8 queries), then tested
# on fresh sequences at T = 256, 1k, 4k, 16k, 32k (passkey: at depths 0, 0.5
# and 1). Seed 1, up to STEPS (default 1500) steps of batch 16 at lr 3e-3; a
# run stops once an accuracy check at T = 256 (every 100 steps) reaches 99%.
# Each test: max(8, 131072 / T) sequences, at most 64.
#
#   bench/longctx_tasks.sh                 both tasks, then the plots and tables, in build/bench/longctx_tasks/
#   bench/longctx_tasks.sh --out docs/bench/longctx --img docs/img
#                                          the same into the committed results (replaces them)
#   bench/longctx_tasks.sh [--out DIR] plot    only the plots and tables, from DIR's .tsv files
#   TASKS=passkey MIXERS=attn,gdn bench/longctx_tasks.sh    a subset
#   MIXERS=gdp bench/longctx_tasks.sh [--out DIR] add
#                                          more mixers beside the runs in DIR: each
#                                          mixer's runs go to <task>_add_<mixer>.{txt,tsv}
#                                          (and _curve.tsv); the tables and plots hold them all
#   bench/longctx_tasks.sh long TASK MIXER one mixer on one task with up to 4000 steps
#                                          (<task>_long_<mixer>.{txt,tsv}): for the
#                                          runs not solved at 1500 (attn and mamba on
#                                          the passkey; gdn and mamba on mqar_gap)
#
# One call of longctx with several mixers trains them one after another, each
# from the same seed, as separate calls of one mixer each do.
#
# Output (--out DIR, default build/bench/longctx_tasks; the committed ones are
# docs/bench/longctx and docs/img): DIR/<task>.{txt,tsv} (printed table, one
# line per test), <task>_curve.tsv (accuracy checks during training),
# <task>_table.md (accuracy by mixer and depth against the test length), and
# longctx_<task>.png in the --img folder (default DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${BUILD:-$ROOT/build}
# shellcheck source=bench/bench_lib.sh
. "$ROOT/bench/bench_lib.sh"
bench_out longctx_tasks "$@"   # OUT, IMG: --out DIR (default $BUILD/bench/longctx_tasks), --img DIR
set -- "${REST[@]+"${REST[@]}"}"
DATA=$OUT
TASKS=${TASKS:-passkey mqar_gap}
MIXERS=${MIXERS:-attn,linear,mamba,gdn}
STEPS=${STEPS:-1500}
export OMP_WAIT_POLICY=PASSIVE

case ${1:-} in
    ""|plot|add|long) ;;
    *) echo "longctx_tasks: unknown mode '$1' (plot, add or long TASK MIXER, after the --out/--img options)" >&2; exit 2 ;;
esac
run_tasks() {   # run_tasks MIXERS NAME: every task in TASKS for the mixers, into DIR/<task>NAME.{txt,tsv}
    local task
    for task in $TASKS; do
        echo "== $task, $1 (load: $(cut -d' ' -f1-3 /proc/loadavg))"
        "$BUILD/longctx" --task "$task" --mixers "$1" --layers 2 --width 64 --params 100000 \
            --steps "$STEPS" --eval-every 100 --stop-at 0.99 --test-lens 256,1024,4096,16384,32768 \
            --depths 0,0.5,1 --test-tokens 131072 --min-seqs 8 --seed 1 \
            --tsv "$DATA/$task$2.tsv" --curve "$DATA/$task${2}_curve.tsv" | tee "$DATA/$task$2.txt"
    done
}

if [ "${1:-}" = long ]; then
    task=${2:?"usage: bench/longctx_tasks.sh long TASK MIXER"}
    m=${3:?"usage: bench/longctx_tasks.sh long TASK MIXER"}
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j 2 --target longctx >/dev/null
    "$BUILD/longctx" --task "$task" --mixers "$m" --layers 2 --width 64 --params 100000 \
        --steps 4000 --eval-every 100 --stop-at 0.99 --test-lens 256,1024,4096,16384,32768 \
        --depths 0,0.5,1 --test-tokens 131072 --min-seqs 8 --seed 1 \
        --tsv "$DATA/${task}_long_$m.tsv" --curve "$DATA/${task}_long_${m}_curve.tsv" | tee "$DATA/${task}_long_$m.txt"
    exit 0
elif [ "${1:-}" != plot ]; then
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j 2 --target longctx >/dev/null
    if [ "${1:-}" = add ]; then
        for m in ${MIXERS//,/ }; do
            [[ $m =~ ^[a-z0-9_]+$ ]] || { echo "longctx_tasks: add: '$m' is not a mixer name" >&2; exit 2; }
            run_tasks "$m" "_add_$m"
        done
    else
        run_tasks "$MIXERS" ""
    fi
fi

# Columns of <task>.tsv: 1 task, 2 mixer, 10 test_T, 11 depth, 12 gap,
# 13 seqs, 14 accuracy, 15 token_accuracy, 9 train_acc, 7 steps, 6 params.
# The added mixers (<task>_add_<mixer>.tsv) follow; the longer runs
# (<task>_long_<mixer>.tsv) join as "<mixer>_long".
for task in passkey mqar_gap; do
    tsv=$DATA/$task.tsv
    compgen -G "$DATA/${task}_add_*.tsv" >/dev/null || [ -f "$tsv" ] || continue
    all=$DATA/${task}_all.tsv
    for f in "$tsv" "$DATA/${task}"_add_*.tsv "$DATA/${task}"_long_*.tsv; do
        case $f in *_curve.tsv) continue ;; esac
        [ -f "$f" ] || continue
        long=0; case $f in *_long_*) long=1 ;; esac
        awk -F'\t' -v OFS='\t' -v long=$long 'FNR > 1 { if (long) $2 = $2 "_long"; print }' "$f"
    done >"$all"
    # The table: one row per (mixer, depth), one column per test length.
    awk -F'\t' -v task="$task" '
        { key = $2 "\t" $11; if (!(key in seen)) { seen[key] = 1; rows[nr++] = key; info[key] = $6 "\t" $7 "\t" $9 }
          if (!($10 in lens)) { lens[$10] = 1; cols[nc++] = $10 }
          acc[key, $10] = sprintf("%.0f%%", 100 * $14); n[key, $10] = $13; gap[$10] = $12 }
        END {
          printf "| mixer | params | steps | acc. at 256 in training |%s", task == "passkey" ? " depth |" : ""
          for (c = 0; c < nc; c++) printf " T = %d%s |", cols[c], task == "passkey" ? "" : " (gap " gap[cols[c]] ")"
          printf "\n|---|---|---|---|%s", task == "passkey" ? "---|" : ""
          for (c = 0; c < nc; c++) printf "---|"
          printf "\n"
          for (r = 0; r < nr; r++) {
            split(rows[r], k, "\t"); split(info[rows[r]], f, "\t")
            printf "| %s | %d | %d | %.0f%% |%s", k[1], f[1], f[2], 100 * f[3], task == "passkey" ? " " k[2] " |" : ""
            for (c = 0; c < nc; c++) printf " %s |", acc[rows[r], cols[c]]
            printf "\n"
          }
        }' "$all" >"$DATA/${task}_table.md"
    cat "$DATA/${task}_table.md"
    # One file per (mixer, depth): test length, accuracy (%).
    rm -f "$DATA"/acc_"$task"_*.tsv
    awk -F'\t' -v dir="$DATA" -v task="$task" '{
        f = dir "/acc_" task "_" $2 "_" $11 ".tsv"; print $10 "\t" 100 * $14 "\t" 100 * $15 >>f; close(f) }' "$all"
    depths=$(awk -F'\t' '!seen[$11]++ {print $11}' "$all")
    n_depths=$(echo "$depths" | wc -w)
    {
        echo "set terminal pngcairo size $((420 * n_depths + 300)),440 font 'DejaVu Sans,10' noenhanced"
        echo "set output '$IMG/longctx_$task.png'"
        echo "set datafile separator '\t'"
        if [ "$task" = passkey ]; then
            echo "set multiplot layout 1,$n_depths title 'Passkey retrieval (2 digits): 2-layer models of 100k parameters trained at T = 256'"
        else
            echo "set multiplot layout 1,1 title 'MQAR with a gap (8 pairs, 8 queries): 2-layer models of 100k parameters trained at T = 256'"
        fi
        echo "set grid; set logscale x 2; set xrange [200:40000]; set yrange [-3:103]"
        echo "set xtics ('256' 256, '1k' 1024, '4k' 4096, '16k' 16384, '32k' 32768)"
        echo "set xlabel 'test length T (log scale)'"
        echo "set arrow 1 from 256, graph 0 to 256, graph 1 nohead dt 3 lc rgb '#888888'"
        echo "set key top right"   # in the first panel only: the curves share their colours
        for d in $depths; do
            if [ "$task" = passkey ]; then
                echo "set title 'passkey at depth $d (0: start, 1: just before the question)'"
                echo "set ylabel 'passkeys retrieved (%)'"
            else
                echo "set title 'the gap between pairs and queries is T - 31 tokens'"
                echo "set ylabel 'answers right (%)'"
            fi
            plots=""
            # Colour by mixer; the longer runs dashed, with squares.
            for m in $(awk -F'\t' '!seen[$2]++ {print $2}' "$all"); do
                f=$DATA/acc_${task}_${m}_$d.tsv
                [ -f "$f" ] || continue
                c=$(mixer_colour "$m")
                style="lw 2 pt 7 dt 1"
                title=$m
                case $m in *_long) style="lw 2 pt 5 dt 2"; title="${m%_long}, up to 4000 steps" ;; esac
                plots="$plots${plots:+, }'$f' using 1:2 with linespoints $style ps 0.8 lc rgb '$c' title '$title'"
            done
            echo "plot $plots"
            echo "unset key"
        done
        echo "unset multiplot"
    } | gnuplot
done
echo "== done: $DATA/*_table.md, $IMG/longctx_*.png"
