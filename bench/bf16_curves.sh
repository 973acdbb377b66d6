#!/usr/bin/env bash
# bench/bf16_curves.sh: train every bundled config twice, with float32 and
# with bf16 products ([train] precision), and compare: loss curves side by
# side (docs/img/bf16_curves.png) and the final validation loss and bits/byte.
#
#   bench/bf16_curves.sh [STEPS]      (default: the configs' own, 600)
#
# Runs go to runs/<config> (float32; the checkpoints generate_bench.sh
# decodes) and runs/<config>_bf16. Same seed, data order and everything else:
# only the products' precision differs. BUILD (default build) names the
# build folder. The table goes to stdout; the data behind the plot to
# docs/bench/bf16_curves.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
scripts/get_corpus.sh
steps=${1:-}
NAMES=(tiny_gdn tiny_hybrid tiny_attn tiny_mamba tiny_linear)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p runs docs/img docs/bench
for name in "${NAMES[@]}"; do
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
tsv=docs/bench/bf16_curves.tsv
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
plot=""
i=0
for name in "${NAMES[@]}"; do
    i=$((i + 1))
    plot="${plot}set title '$name'; plot '< grep -P \"^$name\\tfp32\" $tsv' u 3:4 w l lw 2 t 'fp32', '< grep -P \"^$name\\tbf16\" $tsv' u 3:4 w l lw 1 dt 2 t 'bf16'; "
done
gnuplot -e "set terminal pngcairo size 1500,900 font ',10'; set output 'docs/img/bf16_curves.png';
            set multiplot layout 2,3 title 'training loss (nats/byte), float32 vs bf16 products, same seed and data';
            set xlabel 'step'; set ylabel 'loss'; set yrange [1:3.5]; set key top right; set grid;
            $plot unset multiplot" 2>/dev/null || echo "bf16_curves: gnuplot failed (apt-get install gnuplot-nox)" >&2

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
echo "load average before/after: $LOAD0 / $(cut -d' ' -f1-3 /proc/loadavg)"
