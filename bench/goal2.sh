#!/usr/bin/env bash
# bench/goal2.sh: issue 18's goal 2, "the whole training step at d_model 256
# >= 60 % of the machine's measured fp32 product peak", measured as
# docs/cpu_perf.md section 6 states it.
#
#   bench/goal2.sh [-r ROUNDS] [-s STEPS] [CONFIG...]   default: 2 rounds, 6 steps, configs/tiny_*.ini
#
# Each round measures the peak first (gemm_bench --cpu: the best of 20 float32
# products 2048^3 on oneDNN, GFLOP per CPU-second) and then one train_bench run
# per config at d_model 256 (H 4, d_k = d_v = 64, d_ff 704), B 16 x T 256,
# float32 products on the backend gemm = auto picks, in the same minutes.
# FLOPs counted per token: 6 x the parameters (2 per weight in the forward,
# 4 in the backward; the tied embedding counts once, as the LM head's
# product). The mixers' own work (chunk kernels, attention scores) is not
# counted, so the share understates the work done. Share = 6 x params x
# tokens per CPU-second / peak. Per CPU-second on both sides, so that load
# from elsewhere moves the two alike.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=2
STEPS=6
while getopts "r:s:" opt; do
    case $opt in
        r) ROUNDS=$OPTARG ;;
        s) STEPS=$OPTARG ;;
        *) echo "usage: $0 [-r ROUNDS] [-s STEPS] [CONFIG...]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(configs/tiny_*.ini)
for b in gemm_bench train_bench; do
    [ -x "build/$b" ] || { echo "goal2: build/$b missing: cmake --build build" >&2; exit 1; }
done
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
source bench/bench_lib.sh   # width_sets, length_sets, field
read -r -a W <<<"$(width_sets 256) $(length_sets 256) --set train.precision=fp32"

echo "goal2: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $OMP_NUM_THREADS threads, d_model 256, B 16 x T 256, $STEPS steps"
summary=()
for ((r = 1; r <= ROUNDS; r++)); do
    echo "round $r, load average $(cut -d' ' -f1-3 /proc/loadavg)"
    peak_line=$(./build/gemm_bench --rounds 1 --width 128 --cpu 2>/dev/null | grep '^peak' || true)
    echo "  $peak_line"
    peak=$(sed -n 's/.*onednn 1 \([0-9.]*\).*/\1/p' <<<"$peak_line")
    [ -n "$peak" ] || { echo "goal2: no oneDNN peak in gemm_bench's output (oneDNN not built?)" >&2; exit 1; }
    line="round $r (peak $peak):"
    for cfg in "${CONFIGS[@]}"; do
        res=$(./build/train_bench --config "$cfg" "${W[@]}" --steps "$STEPS" 2>/dev/null | grep '^RESULT' || true)
        params=$(field params "$res") tcs=$(field tokens_per_cpu_s "$res")
        [ -n "$params" ] && [ -n "$tcs" ] || { echo "goal2: train_bench gave no RESULT line for $cfg" >&2; exit 1; }
        share=$(awk -v p="$params" -v t="$tcs" -v k="$peak" 'BEGIN { printf "%.1f", 100 * 6 * p * t / 1e9 / k }')
        echo "  $(basename "$cfg"): params $params, step $(field step_ms "$res") ms, $tcs tokens per CPU-s, $share % of the peak"
        line="$line $(basename "$cfg" .ini) $share %,"
    done
    summary+=("${line%,}")
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "share of the fp32 peak (goal: >= 60 %):"
printf '%s\n' "${summary[@]}"
