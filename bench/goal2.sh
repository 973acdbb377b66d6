#!/usr/bin/env bash
# bench/goal2.sh: a float32 training step against the machine's measured fp32
# product peak: issue 18's goal 2 ("the whole step at d_model 256 >= 60 % of
# the peak", docs/cpu_perf.md) and issue 44's ("the products at d_model 512 on
# 2 threads >= 70 % of it": -w 512 -p).
#
#   bench/goal2.sh [-r ROUNDS] [-s STEPS] [-w WIDTH] [-T LEN] [-b BUILD] [-p] [CONFIG...]
#       default: 2 rounds, 6 steps, d_model 256, T 256, build/, configs/tiny_*.ini
#   -w WIDTH  d_model 256 or 512 (compare_torch.sh's widths: heads of 64)
#   -T LEN    T 256 (B 16) or 1024 (B 4)
#   -b BUILD  the build folder holding gemm_bench and train_bench
#   -p        also the products alone: train_bench --profile's matmul and
#             matmul_multi CPU time against the same FLOPs
#
# Each round measures the peak first (gemm_bench --cpu: the best of 20 float32
# products 2048^3 on oneDNN, GFLOP per CPU-second) and then one train_bench run
# per config at d_model WIDTH (256: H 4, d_k = d_v = 64, d_ff 704), B x T,
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
WIDTH=256
LEN=256
BUILD=build
PROD=0
usage="usage: $0 [-r ROUNDS] [-s STEPS] [-w WIDTH] [-T LEN] [-b BUILD] [-p] [CONFIG...]"
while getopts "r:s:w:T:b:p" opt; do
    case $opt in
        r) ROUNDS=$OPTARG ;;
        s) STEPS=$OPTARG ;;
        w) WIDTH=$OPTARG ;;
        T) LEN=$OPTARG ;;
        b) BUILD=$OPTARG ;;
        p) PROD=1 ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] && [[ $STEPS =~ ^[1-9][0-9]*$ ]] || { echo "goal2: ROUNDS and STEPS are positive integers" >&2; exit 2; }
shift $((OPTIND - 1))
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(configs/tiny_*.ini)
for b in gemm_bench train_bench; do
    [ -x "$BUILD/$b" ] || { echo "goal2: $BUILD/$b missing: cmake --build $BUILD" >&2; exit 1; }
done
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
source bench/bench_lib.sh   # width_sets, length_sets, field
ws=$(width_sets "$WIDTH") || exit 2
ls=$(length_sets "$LEN") || exit 2
read -r -a W <<<"$ws $ls --set train.precision=fp32 --set train.threads=$OMP_NUM_THREADS"
prof=()
[ "$PROD" = 1 ] && prof=(--profile)

echo "goal2: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $OMP_NUM_THREADS threads, d_model $WIDTH, T $LEN, $STEPS steps"
summary=()
for ((r = 1; r <= ROUNDS; r++)); do
    echo "round $r, load average $(cut -d' ' -f1-3 /proc/loadavg)"
    peak_line=$("$BUILD/gemm_bench" --rounds 1 --width 128 --cpu 2>/dev/null | grep '^peak' || true)
    echo "  $peak_line"
    peak=$(sed -n 's/.*onednn 1 \([0-9.]*\).*/\1/p' <<<"$peak_line")
    [ -n "$peak" ] || { echo "goal2: no oneDNN peak in gemm_bench's output (oneDNN not built?)" >&2; exit 1; }
    line="round $r (peak $peak):"
    for cfg in "${CONFIGS[@]}"; do
        all=$("$BUILD/train_bench" --config "$cfg" "${W[@]}" --steps "$STEPS" "${prof[@]}" 2>/dev/null || true)
        res=$(grep '^RESULT' <<<"$all" || true)
        params=$(field params "$res") tcs=$(field tokens_per_cpu_s "$res")
        [ -n "$params" ] && [ -n "$tcs" ] || { echo "goal2: train_bench gave no RESULT line for $cfg" >&2; exit 1; }
        share=$(awk -v p="$params" -v t="$tcs" -v k="$peak" 'BEGIN { printf "%.1f", 100 * 6 * p * t / 1e9 / k }')
        extra="" pshare=""
        if [ "$PROD" = 1 ]; then
            # the products' CPU ms per step: the profile's matmul and matmul_multi rows, column 7
            pms=$(awk '($1 == "matmul" || $1 == "matmul_multi") && NF >= 8 { s += $7 } END { if (s > 0) print s }' <<<"$all")
            [ -n "$pms" ] || { echo "goal2: no matmul rows in train_bench --profile's output for $cfg" >&2; exit 1; }
            tok=$(( $(field B "$res") * $(field T "$res") ))
            pshare=$(awk -v p="$params" -v n="$tok" -v ms="$pms" -v k="$peak" 'BEGIN { printf "%.1f", 100 * 6 * p * n / (ms / 1e3) / 1e9 / k }')
            extra=", products $pms CPU ms a step, $pshare % of the peak"
        fi
        echo "  $(basename "$cfg"): params $params, step $(field step_ms "$res") ms, $tcs tokens per CPU-s, $share % of the peak$extra"
        line="$line $(basename "$cfg" .ini) $share %${pshare:+ (products $pshare %)},"
    done
    summary+=("${line%,}")
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
note=""
[ "$PROD" = 1 ] && note=" (the products alone in brackets)"
echo "share of the fp32 peak, the whole step$note:"
printf '%s\n' "${summary[@]}"
