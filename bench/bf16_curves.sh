#!/usr/bin/env bash
# bench/bf16_curves.sh: train every bundled config twice, with float32 and
# with bf16 products ([train] precision), and compare: loss curves side by
# side (bf16_curves.png) and the final validation loss and bits/byte.
#
#   bench/bf16_curves.sh [STEPS]      (default: the configs' own, 600), into build/bench/bf16_curves/
#   PLOT_ONLY=1 bench/bf16_curves.sh  (redo the plot and table from the runs)
#   bench/bf16_curves.sh --out docs/bench --img docs/img [STEPS]
#                                     the same into the committed results (replaces them)
#
# Runs go to runs/<config> (float32; the checkpoints generate_bench.sh
# decodes) and runs/<config>_bf16. Same seed, data order and everything else:
# only the products' precision differs. BUILD (default build) names the
# build folder. Output (--out DIR, default build/bench/bf16_curves; the
# committed ones are docs/bench and docs/img): the table on stdout and in
# DIR/bf16_curves.txt, the data behind the plot in DIR/bf16_curves.tsv and
# DIR/bf16_curves_diff.tsv, and bf16_curves.png in the --img folder (default
# DIR). Without --out nothing under docs/ is written.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
# shellcheck source=bench/bench_lib.sh
. bench/bench_lib.sh
bench_out bf16_curves "$@"   # OUT, IMG: --out DIR (default $BUILD/bench/bf16_curves), --img DIR
set -- "${REST[@]+"${REST[@]}"}"
steps=${1:-}
[ -z "$steps" ] || [[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "bf16_curves: STEPS '$steps' is not a positive integer" >&2; exit 2; }
[ $# -le 1 ] || { echo "bf16_curves: unexpected argument '$2' after STEPS" >&2; exit 2; }
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
NAMES=(tiny_gdn tiny_hybrid tiny_attn tiny_mamba tiny_linear)
if [ -n "${PLOT_ONLY:-}" ]; then
    for name in "${NAMES[@]}"; do
        for dir in "runs/$name" "runs/${name}_bf16"; do
            [ -s "$dir/metrics.jsonl" ] && [ -s "$dir.secs" ] ||
                { echo "bf16_curves: PLOT_ONLY: no run in $dir (metrics.jsonl, $dir.secs): run the script without PLOT_ONLY first" >&2; exit 1; }
        done
    done
else
    scripts/get_corpus.sh
fi
mkdir -p runs
[ -n "${PLOT_ONLY:-}" ] || cut -d' ' -f1-3 /proc/loadavg >runs/bf16_curves.load0
for name in "${NAMES[@]}"; do
    [ -n "${PLOT_ONLY:-}" ] && break
    for prec in fp32 bf16; do
        dir=runs/$name
        [ "$prec" = bf16 ] && dir=runs/${name}_bf16
        args=(--config "$name.ini" --set "train.run_dir=$dir" --set "train.precision=$prec")
        [ -n "$steps" ] && args+=(--set "train.steps=$steps")
        rm -rf "$dir"
        start=$(date +%s)
        "$BUILD/train" "${args[@]}" >"$dir.log" 2>&1 || { echo "bf16_curves: $name $prec failed, see $dir.log" >&2; exit 1; }
        echo "$(( $(date +%s) - start ))" >"$dir.secs"
        echo "== $name $prec: $(cat "$dir.secs") s" >&2
    done
done

# The curves: step and training loss of every train record, per run.
tsv=$OUT/bf16_curves.tsv
{
    printf 'config\tprecision\tstep\tloss\n'
    for name in "${NAMES[@]}"; do
        for prec in fp32 bf16; do
            m=runs/$name/metrics.jsonl
            [ "$prec" = bf16 ] && m=runs/${name}_bf16/metrics.jsonl
            grep '"type":"train"' "$m" | sed 's/.*"step":\([0-9]*\),"loss":\([0-9.e+-]*\).*/\1\t\2/' |
                awk -v n="$name" -v p="$prec" '{ print n "\t" p "\t" $0 }'
        done
    done
} >"$tsv"
# The difference of the two runs' losses, each a moving mean over 50 steps.
diffs=$OUT/bf16_curves_diff.tsv
awk -F'\t' 'NR > 1 { key = $1 "\t" $3; v[$2, key] = $4; keys[key] = 1 }
             END { for (k in keys) if ((("fp32", k) in v) && (("bf16", k) in v)) print k "\t" v["bf16", k] - v["fp32", k] }' "$tsv" |
    sort -t$'\t' -k1,1 -k2,2n |
    awk -F'\t' '{ if ($1 != cur) { cur = $1; n = 0; s = 0; delete w }
                  n++; w[n] = $3; s += $3; if (n > 50) s -= w[n - 50]
                  if (n >= 50) print $1 "\t" $2 "\t" s / 50 }' >"$diffs"
plot=""
for name in "${NAMES[@]}"; do
    plot="${plot}set title '$name'; plot '< grep -P \"^$name\\tfp32\" $tsv' u 3:4 w l lw 1.5 lc rgb '#1f77b4' t 'fp32', '< grep -P \"^$name\\tbf16\" $tsv' u 3:4 w l lw 1 lc rgb '#d62728' t 'bf16'; "
done
dplot="set title 'bf16 - fp32 (50-step moving means)'; set yrange [-0.05:0.05]; set ylabel 'loss difference'; plot "
for name in "${NAMES[@]}"; do
    dplot="${dplot}'< grep -P \"^$name\\t\" $diffs' u 2:3 w l lw 1.5 t '$name', "
done
gnuplot -e "set terminal pngcairo size 1500,900 font ',10' noenhanced; set output '$IMG/bf16_curves.png';
            set multiplot layout 2,3 title 'training loss (nats/byte), float32 vs bf16 products, same seed and data';
            set xlabel 'step'; set ylabel 'loss'; set yrange [1:2.5]; set key top right; set grid;
            $plot ${dplot%, }; unset multiplot" 2>/dev/null || echo "bf16_curves: gnuplot failed (apt-get install gnuplot-nox)" >&2

{
printf '| config | val loss fp32 | val loss bf16 | val bits/byte fp32 | val bits/byte bf16 | bf16 - fp32 (bits/byte) | tokens/s fp32 | tokens/s bf16 | wall fp32 | wall bf16 |\n'
printf '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n'
for name in "${NAMES[@]}"; do
    row="| $name"
    vals=()
    for prec in fp32 bf16; do
        dir=runs/$name
        [ "$prec" = bf16 ] && dir=runs/${name}_bf16
        end=$(grep '"type":"end"' "$dir/metrics.jsonl" | tail -1)
        vl=$(sed 's/.*"val_loss":\([0-9.]*\).*/\1/' <<<"$end")
        bpb=$(sed 's/.*"val_bpb":\([0-9.]*\).*/\1/' <<<"$end")
        tps=$(grep '"type":"train"' "$dir/metrics.jsonl" | sed 's/.*"tok_per_s":\([0-9.]*\).*/\1/' | sort -n |
              awk '{a[NR]=$1} END {print int(a[int((NR+1)/2)])}')
        vals+=("$vl" "$bpb" "$tps" "$(cat "$dir.secs")")
    done
    diff=$(awk -v a="${vals[1]}" -v b="${vals[5]}" 'BEGIN { printf "%+.4f", b - a }')
    printf '%s | %.4f | %.4f | %.4f | %.4f | %s | %s | %s | %ss | %ss |\n' "$row" "${vals[0]}" "${vals[4]}" "${vals[1]}" \
        "${vals[5]}" "$diff" "${vals[2]}" "${vals[6]}" "${vals[3]}" "${vals[7]}"
done
echo
echo "machine: $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(grep -m1 -o 'GEMM [^|]*' runs/${NAMES[0]}_bf16.log || true)"
[ -n "${PLOT_ONLY:-}" ] || cut -d' ' -f1-3 /proc/loadavg >runs/bf16_curves.load1
echo "load average before/after the training runs: $(cat runs/bf16_curves.load0 2>/dev/null || echo ?) / $(cat runs/bf16_curves.load1 2>/dev/null || echo ?)"
} | tee "$OUT/bf16_curves.txt"
