#!/usr/bin/env bash
# Train every bundled tiny config for the same number of steps and print a
# table of validation bits per byte and training tokens/s (the README's
# results table). Usage: scripts/train_all.sh [STEPS [CONFIG ...]]
# STEPS defaults to the configs' own (pass "" to keep it and name configs);
# CONFIG names a bundled config without .ini (default: all of them).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
scripts/get_corpus.sh
[ -x bin/train ] || scripts/run.sh build
steps=${1:-}
shift $(( $# > 0 ? 1 : 0 ))
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(tiny_gdn tiny_hybrid tiny_qwen35 tiny_attn tiny_mamba tiny_mamba2 tiny_linear tiny_gdp tiny_kda)
for name in "${configs[@]}"; do
    case $name in
    *[!A-Za-z0-9_]* | "") echo "train_all: '$name' is not a bundled config name" >&2; exit 2 ;;
    esac
    [ -f "configs/$name.ini" ] || { echo "train_all: configs/$name.ini does not exist" >&2; exit 2; }
done
printf '| config | layers | parameters | steps | val loss (nats/byte) | val bits/byte | train tokens/s | wall time |\n'
printf '| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n'
for name in "${configs[@]}"; do
    args=(--config "$name.ini" --set "train.run_dir=runs/$name" --overwrite)
    [ -n "$steps" ] && args+=(--set "train.steps=$steps")
    start=$(date +%s)
    bin/train "${args[@]}" > "runs/$name.log" 2>&1 || { echo "train_all: $name failed, see runs/$name.log" >&2; exit 1; }
    secs=$(( $(date +%s) - start ))
    m=runs/$name/metrics.jsonl
    layers=$(grep '^layers' "configs/$name.ini" | sed 's/.*= *//')
    params=$(grep -o '"params":[0-9]*' "$m" | tail -1 | cut -d: -f2)
    end=$(grep '"type":"end"' "$m" | tail -1)
    st=$(sed 's/.*"step":\([0-9]*\).*/\1/' <<<"$end")
    vl=$(sed 's/.*"val_loss":\([0-9.]*\).*/\1/' <<<"$end")
    bpb=$(sed 's/.*"val_bpb":\([0-9.]*\).*/\1/' <<<"$end")
    # tokens/s: median over the run's train records
    tps=$(grep '"type":"train"' "$m" | sed 's/.*"tok_per_s":\([0-9.]*\).*/\1/' | sort -n | awk '{a[NR]=$1} END {print int(a[int((NR+1)/2)])}')
    printf '| %s | %s | %s | %s | %.4f | %.4f | %s | %dm%02ds |\n' "$name" "$layers" "$params" "$st" "$vl" "$bpb" "$tps" $((secs/60)) $((secs%60))
done
echo
echo "machine: $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load average now $(cut -d' ' -f1-3 /proc/loadavg)"
