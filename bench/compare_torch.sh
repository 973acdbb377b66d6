#!/usr/bin/env bash
# bench/compare_torch.sh: tokens/s of a training step (forward + backward +
# clip + AdamW, random tokens) in C (build/train_bench) and in the PyTorch
# reference (bench/torch_ref/throughput.py), config by config, with the same
# thread count, and the ratios C / PyTorch.
#
#   bench/compare_torch.sh [-t THREADS] [-s STEPS] [-r ROUNDS] [-w WIDTHS] [-T LENGTHS]
#                          [-c C_VARIANTS] [-a] [-W WARMUP] [-p] [-b TRAIN_BENCH] [-P PYTHON]
#                          [CONFIG...]   default: every configs/tiny_*.ini
#
#   -w WIDTHS      d_model of the bench-only variants, comma list of 128, 256, 512 (default 128):
#                    128: the bundled configs as they are (H 4, d_k = d_v = 32, d_ff 384)
#                    256: H 4, d_k = d_v = 64, d_ff 704      512: H 8, d_k = d_v = 64, d_ff 1408
#   -T LENGTHS     sequence lengths, comma list (default 256); each step holds 4096 tokens
#                  (B = 4096 / T: 16 x 256, 1 x 4096), as the bundled configs do
#   -c C_VARIANTS  the C runs, comma list of gemm:precision (default auto:fp32,auto:bf16;
#                  e.g. openblas:fp32 for the products on OpenBLAS, as before oneDNN)
#   -a             also PyTorch with bf16 autocast (throughput.py --amp bf16)
#   -W WARMUP      PyTorch's untimed steps before the timed ones (default 2; C always
#                  runs 2: its tape arena settles into one block during step 2)
#   -p             C runs with --profile, and each C variant gets a column "bound": the
#                  C/torch ratio C would reach if every pass but its products took no
#                  time (PyTorch's step time / C's matmul time per step, best of the
#                  rounds each), i.e. how far the products alone let C go on this machine.
#                  C's tokens/s then come from profiled runs, which took ~4 % longer per step
#                  (tiny_mamba bf16, d_model 128: median 170 against 164 ms, 3 rounds)
#   -b TRAIN_BENCH the C program (default build/train_bench), e.g. one built elsewhere and
#                  packed with its libraries (a wrapper that sets LD_LIBRARY_PATH for it alone)
#   -P PYTHON      the interpreter of the PyTorch side (default $PYTHON, else /usr/bin/python3),
#                  e.g. python3 where a pip PyTorch is installed
#
# Needs build/train_bench (cmake --build build) and /usr/bin/python3 with
# python3-torch. THREADS defaults to nproc. Every run of a cell (each C
# variant, PyTorch, PyTorch bf16) runs alone, one after the other, ROUNDS
# times (default 3) alternating; each run's figure is its best round (the
# median step within a round), so a burst of load from elsewhere on a shared
# machine hits all of them alike rather than deciding the ratio. Both sides
# get the same thread counts; OPENBLAS_CORETYPE reaches C alone (it only
# corrects OpenBLAS's CPU detection, which a PyTorch on MKL and its own
# kernels does not use, and a pip PyTorch must run as users run it); the
# kernel set and the backend C ran are printed. The width and length variants
# are made with --set on both sides (nothing is written to configs/).
# C/torch is the ratio of tokens/s; "per CPU-s" the ratio of tokens per
# CPU-second (all threads), which a loaded machine moves less.
# COMPARE_LOG=DIR keeps every run's output in DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

THREADS=$(nproc)
STEPS=5
ROUNDS=3
WIDTHS=128
LENGTHS=256
CVARS=auto:fp32,auto:bf16
AMP=0
WARMUP=2
PROFILE=0
BIN=build/train_bench
PY=${PYTHON:-/usr/bin/python3}
while getopts "t:s:r:w:T:c:aW:pb:P:" opt; do
    case $opt in
        t) THREADS=$OPTARG ;;
        s) STEPS=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        w) WIDTHS=$OPTARG ;;
        T) LENGTHS=$OPTARG ;;
        c) CVARS=$OPTARG ;;
        a) AMP=1 ;;
        W) WARMUP=$OPTARG ;;
        p) PROFILE=1 ;;
        b) BIN=$OPTARG ;;
        P) PY=$OPTARG ;;
        *) echo "usage: $0 [-t THREADS] [-s STEPS] [-r ROUNDS] [-w WIDTHS] [-T LENGTHS] [-c GEMM:PREC,...] [-a] [-W WARMUP] [-p] [-b TRAIN_BENCH] [-P PYTHON] [CONFIG...]" >&2
           exit 2 ;;
    esac
done
shift $((OPTIND - 1))
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(configs/tiny_*.ini)
IFS=, read -r -a WLIST <<<"$WIDTHS"
IFS=, read -r -a TLIST <<<"$LENGTHS"
IFS=, read -r -a CLIST <<<"$CVARS"

[ -x "$BIN" ] || { echo "compare_torch: $BIN missing or not executable (cmake -S . -B build && cmake --build build, or -b)" >&2; exit 1; }
env -u OPENBLAS_CORETYPE "$PY" -c 'import torch' 2>/dev/null || { echo "compare_torch: $PY cannot import torch: apt-get install python3-torch" >&2; exit 1; }

# One thread count for every pool on both sides; idle OpenMP threads sleep.
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

source bench/bench_lib.sh   # width_sets, length_sets, field

LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
if [ -n "${COMPARE_LOG:-}" ]; then  # keep every run's output there
    LOG=$COMPARE_LOG
    mkdir -p "$LOG"
else
    LOG=$(mktemp -d)
    trap 'rm -rf "$LOG"' EXIT
fi
# the least matmul time per step (ms, forward + backward) of a file of --profile outputs:
# per run (an "op profile" table), its matmul and matmul_multi rows (op_matmul_multi) summed
matmul_ms() {
    awk 'function done() { if (run != "" && (best == "" || run < best)) best = run; run = "" }
         /^op profile/ { done() }
         ($1 == "matmul" || $1 == "matmul_multi") && NF >= 6 { run += $5 }
         END { done(); print best }' "$1"
}
# best RESULT line of a file of RESULT lines: the one with the most tokens_per_s
best() {
    grep '^RESULT' "$1" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^tokens_per_s=/) { split($i, a, "="); v = a[2] }
                                 if (v > best) { best = v; line = $0 } } END { print line }'
}

rows=()
first=""
for cfg in "${CONFIGS[@]}"; do
    name=$(basename "$cfg" .ini)
    for w in "${WLIST[@]}"; do
        for T in "${TLIST[@]}"; do
            read -r -a sets <<<"$(width_sets "$w") $(length_sets "$T")"
            cell="${name}_d${w}_T${T}"
            echo "== $cell" >&2
            for ((r = 0; r < ROUNDS; r++)); do
                for ((i = 0; i < ${#CLIST[@]}; i++)); do
                    IFS=: read -r gemm prec <<<"${CLIST[$i]}"
                    prof=()
                    [ "$PROFILE" = 1 ] && prof=(--profile)
                    "$BIN" --config "$cfg" "${sets[@]}" --set train.threads="$THREADS" \
                        --set train.gemm="$gemm" --set train.precision="$prec" --steps "$STEPS" "${prof[@]}" \
                        >>"$LOG/c${i}_$cell.txt"
                done
                env -u OPENBLAS_CORETYPE "$PY" bench/torch_ref/throughput.py "$cfg" "${sets[@]}" --threads "$THREADS" --steps "$STEPS" \
                    --warmup "$WARMUP" >>"$LOG/t_$cell.txt"
                if [ "$AMP" = 1 ]; then
                    env -u OPENBLAS_CORETYPE "$PY" bench/torch_ref/throughput.py "$cfg" "${sets[@]}" --threads "$THREADS" --steps "$STEPS" \
                        --warmup "$WARMUP" --amp bf16 >>"$LOG/a_$cell.txt"
                fi
            done
            [ -n "$first" ] || first="$cell"
            t=$(best "$LOG/t_$cell.txt")
            row="$name|$w|$T|$(field tokens_per_s "$t")|$(field tokens_per_cpu_s "$t")"
            if [ "$AMP" = 1 ]; then row="$row|$(field tokens_per_s "$(best "$LOG/a_$cell.txt")")"; fi
            for ((i = 0; i < ${#CLIST[@]}; i++)); do
                c=$(best "$LOG/c${i}_$cell.txt")
                row="$row|$(field tokens_per_s "$c")|$(field tokens_per_cpu_s "$c")"
                if [ "$PROFILE" = 1 ]; then
                    m=$(matmul_ms "$LOG/c${i}_$cell.txt")
                    [ -n "$m" ] || { echo "compare_torch: no matmul line in C's op profile ($LOG/c${i}_$cell.txt)" >&2; exit 1; }
                    row="$row|$m"
                fi
            done
            rows+=("$row")
        done
    done
done

echo
sed -n 's/^machine: /machine: /p; s/^cpu: /cpu: /p' "$LOG/c0_$first.txt" | head -2
echo "threads: $THREADS (both sides)   steps timed: $STEPS (median) after 2 (C) / $WARMUP (PyTorch), best of $ROUNDS alternating rounds   torch $(env -u OPENBLAS_CORETYPE "$PY" -c 'import torch; print(torch.__version__)')"
echo "OpenBLAS kernels: $(sed -n 's/.*blas_core=\([^ ]*\).*/\1/p' "$LOG/c0_$first.txt" | head -1) (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} for C, unset for PyTorch)"
for ((i = 0; i < ${#CLIST[@]}; i++)); do
    echo "C ${CLIST[$i]}: GEMM $(sed -n 's/^GEMM: //p' "$LOG/c${i}_$first.txt" | head -1)"
done
echo "C: float32 master weights, chunked forms (linear, mamba, gdn), flash attention; PyTorch: float32, chunked forms,"
echo "scaled_dot_product_attention when available$([ "$AMP" = 1 ] && echo '; torch bf16: the same under torch.autocast(cpu, bfloat16)')"
echo "widths: 128 = the bundled configs; 256: H 4, d_k = d_v = 64, d_ff 704; 512: H 8, d_k = d_v = 64, d_ff 1408; B x T = 4096 tokens"
echo
hdr="| config | d_model | T | torch tok/s |"
sep="| --- | ---: | ---: | ---: |"
[ "$AMP" = 1 ] && { hdr="$hdr torch bf16 tok/s |"; sep="$sep ---: |"; }
for c in "${CLIST[@]}"; do
    hdr="$hdr C $c tok/s | C/torch | C/torch per CPU-s |"
    sep="$sep ---: | ---: | ---: |"
    [ "$PROFILE" = 1 ] && { hdr="$hdr bound |"; sep="$sep ---: |"; }
    [ "$AMP" = 1 ] && { hdr="$hdr C/torch bf16 |"; sep="$sep ---: |"; }
done
echo "$hdr"
echo "$sep"
for r in "${rows[@]}"; do
    IFS='|' read -r -a f <<<"$r"
    line="| ${f[0]} | ${f[1]} | ${f[2]} | ${f[3]} |"
    k=5
    [ "$AMP" = 1 ] && { amp=${f[5]}; line="$line $amp |"; k=6; }
    tt=${f[3]} tc=${f[4]}
    for ((i = 0; i < ${#CLIST[@]}; i++)); do
        ct=${f[$k]} cc=${f[$((k + 1))]}
        line="$line $ct | $(awk -v a="$ct" -v b="$tt" 'BEGIN { printf "**%.2f**", a / b }') |"
        line="$line $(awk -v a="$cc" -v b="$tc" 'BEGIN { printf "%.2f", a / b }') |"
        [ "$AMP" = 1 ] && line="$line $(awk -v a="$ct" -v b="$amp" 'BEGIN { printf "%.2f", a / b }') |"
        k=$((k + 2))
        if [ "$PROFILE" = 1 ]; then   # PyTorch's step (4096 tokens) over C's products alone
            line="$line $(awk -v m="${f[$k]}" -v b="$tt" 'BEGIN { printf "%.2f", 4096 / b * 1000 / m }') |"
            k=$((k + 1))
        fi
    done
    echo "$line"
done
echo
echo "load average before/after: $LOAD0 / $(cut -d' ' -f1-3 /proc/loadavg)"
