#!/usr/bin/env bash
# bench/gpu_bf16_curve.sh: issue 43's loss-curve goal, "bf16 within 1 % of
# float32 over 2,000 steps of gpu_d1024_hybrid": the same run (seed, data
# order, schedule) trained twice on the GPU, with [train] precision = fp32 and
# = bf16, and the two loss curves compared.
#
#   bench/gpu_bf16_curve.sh run PREC [STEPS [SECONDS]] [--set KEY=VALUE]...
#       train (or go on training) runs/curve_PREC: CONFIG (default
#       configs/gpu_d1024_hybrid.ini) for STEPS steps (default 2000) at
#       precision PREC (fp32 | bf16); the --set options go to train (e.g.
#       --set train.cuda_graph=off, docs/cuda.md). With SECONDS, the run is sent SIGTERM
#       after that long: train then writes its checkpoint and stops, and the
#       next `run` with the same PREC resumes it bit for bit (train --resume).
#       So a run longer than one sitting on a lent machine is done in pieces
#       on the same machine. The loss log is runs/curve_PREC/metrics.jsonl.
#   bench/gpu_bf16_curve.sh [--out DIR] [--img DIR] compare FP32_METRICS BF16_METRICS
#       the table (stdout and DIR/gpu_bf16_curve.txt), the curves' data
#       (DIR/gpu_bf16_curve.tsv) and the plot (IMG/gpu_bf16_curve.png) of two
#       runs' metrics.jsonl (copies brought back from the GPU machine).
#
# The comparison: each run's training loss as a moving mean over 50 steps
# (one step's loss is one batch's, noisy), and at every step from 50 on the
# relative difference (bf16 - fp32) / fp32 of those means; its largest
# magnitude over the run and over the last 1,000 steps, and the validation
# losses the runs logged. Environment: CONFIG, TRAIN (default build-cuda/train,
# else .gpu/bin/train, else train on PATH), DEVICE (default cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/bench_lib.sh
BUILD=${BUILD:-build-cuda}
bench_opts gpu_bf16_curve "$@"
set -- "${REST[@]+"${REST[@]}"}"
CONFIG=${CONFIG:-configs/gpu_d1024_hybrid.ini}
DEVICE=${DEVICE:-cuda}
usage="usage: $0 run PREC [STEPS [SECONDS]] [--set KEY=VALUE]... | $0 [--out DIR] [--img DIR] compare FP32_METRICS BF16_METRICS"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
mode=$1
shift

if [ "$mode" = run ]; then
    pos=() sets=()
    while [ $# -gt 0 ]; do
        case $1 in
            --set)
                if [ $# -lt 2 ] || [[ $2 != *=* ]]; then echo "gpu_bf16_curve: --set needs KEY=VALUE" >&2; exit 2; fi
                sets+=(--set "$2")
                shift 2 ;;
            *) pos+=("$1"); shift ;;
        esac
    done
    set -- "${pos[@]+"${pos[@]}"}"
    [ $# -ge 1 ] && [ $# -le 3 ] || { echo "$usage" >&2; exit 2; }
    prec=$1 steps=${2:-2000} secs=${3:-}
    case $prec in fp32 | bf16) ;; *) echo "gpu_bf16_curve: PREC is '$prec': say fp32 or bf16" >&2; exit 2 ;; esac
    [[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "gpu_bf16_curve: STEPS '$steps' is not a positive integer" >&2; exit 2; }
    [ -z "$secs" ] || [[ $secs =~ ^[1-9][0-9]*$ ]] ||
        { echo "gpu_bf16_curve: SECONDS '$secs' is not a positive integer" >&2; exit 2; }
    train=${TRAIN:-}
    if [ -z "$train" ]; then
        for t in "$BUILD/train" .gpu/bin/train; do [ -x "$t" ] && { train=$t; break; }; done
        [ -n "$train" ] || train=$(command -v train || true)
    fi
    [ -n "$train" ] && [ -x "$train" ] || { echo "gpu_bf16_curve: no train program (set TRAIN)" >&2; exit 1; }
    dir=runs/curve_$prec
    again=--overwrite
    [ -f "$dir/checkpoint.h5" ] && again=--resume
    mkdir -p runs
    # The checkpoint only at the end (or at SIGTERM): at d_model 1024 it is 1.9 GB.
    args=(--config "$CONFIG" --device "$DEVICE" "$again" --set "train.precision=$prec" --set "train.steps=$steps"
          --set train.checkpoint_every=0 --set "train.run_dir=$dir" "${sets[@]+"${sets[@]}"}")
    echo "gpu_bf16_curve: $train ${args[*]}" >&2
    rc=0
    if [ -n "$secs" ]; then
        timeout -s TERM -k 120 "$secs" "$train" "${args[@]}" || rc=$?
    else
        "$train" "${args[@]}" || rc=$?
    fi
    last=$(grep '"type":"train"' "$dir/metrics.jsonl" 2>/dev/null | tail -1 | sed 's/.*"step":\([0-9]*\).*/\1/')
    echo "gpu_bf16_curve: $prec: step ${last:-0} of $steps (train's status $rc)" >&2
    # 124: the time was up and train stopped with its checkpoint; go on with another `run`.
    [ "$rc" = 0 ] || [ "$rc" = 124 ] || exit "$rc"
    exit 0
fi

[ "$mode" = compare ] && [ $# -eq 2 ] || { echo "$usage" >&2; exit 2; }
for f in "$1" "$2"; do
    [ -s "$f" ] || { echo "gpu_bf16_curve: no metrics in '$f'" >&2; exit 1; }
done
bench_dirs gpu_bf16_curve
tsv=$OUT/gpu_bf16_curve.tsv
# step, loss of every train record; a resumed run logs the steps after its
# checkpoint again only if it was stopped between logging and saving, so the
# last record of a step wins.
losses() {
    grep '"type":"train"' "$1" | sed 's/.*"step":\([0-9]*\),"loss":\([0-9.e+-]*\).*/\1\t\2/' |
        awk -F'\t' '{ v[$1] = $2 } END { for (s in v) print s "\t" v[s] }' | sort -n
}
# the steps both runs logged, in order (awk, not join: join wants a lexical order)
both() { awk 'NR == FNR { v[$1] = $2; next } ($1 in v) { print $1 "\t" v[$1] "\t" $2 }' "$@"; }
both <(losses "$1") <(losses "$2") |
    awk -F'\t' 'BEGIN { print "step\tfp32\tbf16\tfp32_mean50\tbf16_mean50\trel_diff" }
                { n++; a[n] = $2; b[n] = $3; sa += $2; sb += $3
                  if (n > 50) { sa -= a[n - 50]; sb -= b[n - 50] }
                  if (n >= 50) printf "%d\t%s\t%s\t%.6f\t%.6f\t%+.6f\n", $1, $2, $3, sa / 50, sb / 50, (sb - sa) / sa
                  else printf "%d\t%s\t%s\tNaN\tNaN\tNaN\n", $1, $2, $3 }' >"$tsv"
n=$(awk 'NR > 1' "$tsv" | wc -l)
[ "$n" -ge 50 ] || { echo "gpu_bf16_curve: only $n steps in common: nothing to compare" >&2; exit 1; }
last=$(awk -F'\t' 'NR > 1 { s = $1 } END { print s }' "$tsv")
worst() {   # largest |rel_diff| from step $1 on: "value at step"
    awk -F'\t' -v from="$1" 'NR > 1 && $6 != "NaN" && $1 >= from { d = $6 < 0 ? -$6 : $6
                                                                       if (d > m) { m = d; s = $1; v = $6 } }
                             END { printf "%+.2f %% at step %d", 100 * v, s }' "$tsv"
}
val() {   # "step: loss" of every eval record
    grep '"type":"eval"' "$1" | sed 's/.*"step":\([0-9]*\).*"val_loss":\([0-9.e+-]*\).*/\1 \2/' |
        awk '{ v[$1] = $2 } END { for (s in v) print s, v[s] }' | sort -n
}
{
    echo "config: $CONFIG   steps in both runs: $n (last $last)"
    echo "fp32: $1"
    echo "bf16: $2"
    echo
    echo "training loss, 50-step moving means, (bf16 - fp32) / fp32:"
    echo "  largest from step 50: $(worst 50)"
    echo "  largest from step $((last > 1000 ? last - 999 : 50)): $(worst $((last > 1000 ? last - 999 : 50)))"
    awk -F'\t' -v s="$last" 'NR > 1 && $1 == s { printf "  at step %d: fp32 %.4f, bf16 %.4f, %+.2f %%\n", $1, $4, $5, 100 * $6 }' "$tsv"
    echo
    echo "| step | val loss fp32 | val loss bf16 | (bf16 - fp32) / fp32 |"
    echo "| ---: | ---: | ---: | ---: |"
    both <(val "$1") <(val "$2") | awk '{ printf "| %d | %.4f | %.4f | %+.2f %% |\n", $1, $2, $3, 100 * ($3 - $2) / $2 }'
} | tee "$OUT/gpu_bf16_curve.txt"
# the difference's axis: +-2 %, wider when the curves part further
ylim=$(awk -F'\t' 'NR > 1 && $6 != "NaN" { d = $6 < 0 ? -$6 : $6; if (d > m) m = d }
                   END { l = int(100 * m) + 1; print (l > 2 ? l : 2) }' "$tsv")
gnuplot -e "set terminal pngcairo size 1200,800 font ',10' noenhanced; set output '$IMG/gpu_bf16_curve.png';
            set multiplot layout 2,1 title 'training loss (nats/byte), $(basename "$CONFIG" .ini), float32 vs bf16, same seed and data';
            set grid; set key top right; set xlabel 'step'; set ylabel 'loss (50-step mean)';
            plot '$tsv' u 1:4 every ::50 w l lw 1.5 lc rgb '#1f77b4' t 'fp32', '' u 1:5 every ::50 w l lw 1 lc rgb '#d62728' t 'bf16';
            set ylabel '(bf16 - fp32) / fp32 (%)'; set yrange [-$ylim:$ylim];
            plot '$tsv' u 1:(100*\$6) every ::50 w l lw 1.5 lc rgb '#2ca02c' t 'relative difference', 1 lc rgb '#888888' dt 2 t '+-1 %', -1 lc rgb '#888888' dt 2 notitle;
            unset multiplot" 2>/dev/null || echo "gpu_bf16_curve: gnuplot failed (apt-get install gnuplot-nox)" >&2
