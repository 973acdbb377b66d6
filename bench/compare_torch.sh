#!/usr/bin/env bash
# bench/compare_torch.sh: tokens/s of a training step (forward + backward +
# clip + AdamW, float32, random tokens) in C (build/train_bench) and in the
# PyTorch reference (bench/torch_ref/throughput.py), config by config, with
# the same thread count, and the ratio C / PyTorch.
#
#   bench/compare_torch.sh [-t THREADS] [-s STEPS] [-r ROUNDS] [CONFIG...]   default: every configs/tiny_*.ini
#
# Needs build/train_bench (cmake --build build) and /usr/bin/python3 with
# python3-torch. THREADS defaults to nproc. Each side runs alone, one after
# the other, ROUNDS times (default 3) alternating C, PyTorch, C, PyTorch...;
# each side's figure is its best round (the median step within a round), so
# a burst of load from elsewhere on a shared machine hits both sides alike
# rather than deciding the ratio. Run it on an otherwise idle machine. Both
# sides inherit the same OpenBLAS settings (OPENBLAS_CORETYPE, thread counts);
# the kernel set C ran is printed.
set -euo pipefail
cd "$(dirname "$0")/.."

THREADS=$(nproc)
STEPS=5
ROUNDS=3
while getopts "t:s:r:" opt; do
    case $opt in
        t) THREADS=$OPTARG ;;
        s) STEPS=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        *) echo "usage: $0 [-t THREADS] [-s STEPS] [-r ROUNDS] [CONFIG...]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(configs/tiny_*.ini)

PY=${PYTHON:-/usr/bin/python3}
[ -x build/train_bench ] || { echo "compare_torch: build/train_bench missing: cmake -S . -B build && cmake --build build" >&2; exit 1; }
"$PY" -c 'import torch' 2>/dev/null || { echo "compare_torch: $PY cannot import torch: apt-get install python3-torch" >&2; exit 1; }

# One thread count for every pool on both sides; idle OpenMP threads sleep.
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

field() {  # field NAME "RESULT ..." -> value
    sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"
}

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT
# best RESULT line of a file of RESULT lines: the one with the most tokens_per_s
best() {
    grep '^RESULT' "$1" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^tokens_per_s=/) { split($i, a, "="); v = a[2] }
                                 if (v > best) { best = v; line = $0 } } END { print line }'
}

rows=()
for cfg in "${CONFIGS[@]}"; do
    name=$(basename "$cfg" .ini)
    echo "== $name" >&2
    : >"$LOG/c_$name.txt"
    : >"$LOG/t_$name.txt"
    for ((r = 0; r < ROUNDS; r++)); do
        ./build/train_bench --config "$cfg" --set train.threads="$THREADS" --steps "$STEPS" >>"$LOG/c_$name.txt"
        "$PY" bench/torch_ref/throughput.py "$cfg" --threads "$THREADS" --steps "$STEPS" >>"$LOG/t_$name.txt"
    done
    c=$(best "$LOG/c_$name.txt")
    t=$(best "$LOG/t_$name.txt")
    rows+=("$name|$(field tokens_per_s "$c")|$(field tokens_per_s "$t")|$(field tokens_per_cpu_s "$c")|$(field tokens_per_cpu_s "$t")|$(field fwd_ms "$c")/$(field bwd_ms "$c")/$(field opt_ms "$c")|$(field fwd_ms "$t")/$(field bwd_ms "$t")/$(field opt_ms "$t")")
done

echo
sed -n 's/^machine: /machine: /p; s/^cpu: /cpu: /p' "$LOG/c_$(basename "${CONFIGS[0]}" .ini).txt" | head -2
echo "threads: $THREADS (both sides)   steps timed: $STEPS (median), best of $ROUNDS alternating rounds   torch $("$PY" -c 'import torch; print(torch.__version__)')"
echo "OpenBLAS kernels: $(sed -n 's/.*blas_core=\([^ ]*\).*/\1/p' "$LOG/c_$(basename "${CONFIGS[0]}" .ini).txt" | head -1) (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}), shared by both sides"
echo "C: float32, chunked forms (linear, mamba, gdn), flash attention; PyTorch: float32, chunked forms, scaled_dot_product_attention when available"
echo
# tok/s: wall clock; tok/CPU-s: per second of CPU time of all threads (steadier on a shared machine).
printf '| %-12s | %9s | %11s | %7s | %11s | %15s | %9s | %-21s | %-21s |\n' config "C tok/s" "torch tok/s" "C/torch" \
    "C tok/CPU-s" "torch tok/CPU-s" "C/torch" "C fwd/bwd/opt ms" "torch fwd/bwd/opt ms"
printf '| %-12s | %9s | %11s | %7s | %11s | %15s | %9s | %-21s | %-21s |\n' ------------ --------- ----------- ------- \
    ----------- --------------- --------- --------------------- ---------------------
for r in "${rows[@]}"; do
    IFS='|' read -r name ct tt cc tc cp tp <<<"$r"
    ratio=$(awk -v a="$ct" -v b="$tt" 'BEGIN { printf "%.2f", a / b }')
    cratio=$(awk -v a="$cc" -v b="$tc" 'BEGIN { printf "%.2f", a / b }')
    printf '| %-12s | %9s | %11s | %7s | %11s | %15s | %9s | %-21s | %-21s |\n' "$name" "$ct" "$tt" "$ratio" "$cc" "$tc" \
        "$cratio" "$cp" "$tp"
done
echo
echo "load average before/after: $LOAD0 / $(cut -d' ' -f1-3 /proc/loadavg)"
