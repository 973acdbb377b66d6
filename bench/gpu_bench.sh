#!/usr/bin/env bash
# bench/gpu_bench.sh: tokens/s of a training step (forward + backward + clip +
# AdamW, random tokens, float32) on one GPU (issue 17): the C program
# (train_bench --device cuda) against the PyTorch reference
# (bench/torch_ref/throughput.py --device cuda), eager and under torch.compile,
# config by config, and the ratios C / PyTorch.
#
#   bench/gpu_bench.sh [-s STEPS] [-W WARMUP] [-t SECONDS] [-E | -L] RESULTS_FILE [CONFIG...]
#
#   RESULTS_FILE  gets every run's RESULT line (C: ... device=cuda; PyTorch: ... device=cuda compile=0|1)
#   CONFIG        default: configs/tiny_{gdn,hybrid,qwen35,attn,mamba,mamba2,linear,gdp,kda}.ini (those that exist),
#                 configs/gpu_d1024_gdn.ini and configs/gpu_d1024_hybrid.ini
#   -s STEPS      timed steps of each run (default 5; the median is reported)
#   -W WARMUP     untimed steps first, both sides (default 2: the C tape arena settles into one
#                 block during step 2; torch.compile compiles during step 1)
#   -t SECONDS    stop a run that takes longer (default 0: no limit); its cell reads "timeout"
#   -E            eager PyTorch only (no torch.compile runs)
#   -L            the compile column per layer (throughput.py --compile-layers: one compiled
#                 function per layer kind, shared by its layers) instead of one whole graph, for
#                 models whose whole graph does not compile in reasonable time (d_model 1024, T 4096)
#
# Meant for the lent GPU machine (docs/cuda.md, ../shared/device/README.md): build
# build-cuda here, pack it (pack.sh .gpu build-cuda/train_bench), carry .gpu, then
# there: bench/gpu_bench.sh "$OUT/results.txt". The programs, from the environment:
#   TRAIN_BENCH  default: .gpu/bin/train_bench, else build-cuda/train_bench, else train_bench on PATH;
#                a packed one runs with its lib/ folder (pack.sh's) on LD_LIBRARY_PATH
#   PYTHON       default: python3 (there: torch 2.11 with CUDA; Debian's CPU torch here will not do)
# GPU_BENCH_LOG=DIR keeps every run's whole output in DIR. A run that fails (an op
# with no GPU kernel yet, out of memory) is reported in its cell and the rest go on.
set -euo pipefail

STEPS=5
WARMUP=2
LIMIT=0
COMPILE=1
usage() { echo "usage: $0 [-s STEPS] [-W WARMUP] [-t SECONDS] [-E | -L] RESULTS_FILE [CONFIG...]" >&2; exit 2; }
COMPILE_FLAG=--compile
while getopts "s:W:t:EL" opt; do
    case $opt in
        s) STEPS=$OPTARG ;;
        W) WARMUP=$OPTARG ;;
        t) LIMIT=$OPTARG ;;
        E) COMPILE=0 ;;
        L) COMPILE_FLAG=--compile-layers ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || usage
for n in "$STEPS" "$WARMUP" "$LIMIT"; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "gpu_bench: '$n' is not a whole number" >&2; exit 2; }
done
[ "$STEPS" -ge 1 ] || { echo "gpu_bench: -s needs at least 1 step" >&2; exit 2; }

# Paths the caller gave are relative to the caller's folder: make them absolute
# before moving to the repository root.
absolute() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
RESULTS=$(absolute "$1")
shift
CONFIGS=()
for c in "$@"; do
    if [ -f "$c" ]; then CONFIGS+=("$(absolute "$c")"); else CONFIGS+=("$c"); fi   # else: from the root
done
if [ -n "${TRAIN_BENCH:-}" ] && [[ $TRAIN_BENCH == */* ]]; then TRAIN_BENCH=$(absolute "$TRAIN_BENCH"); fi
if [ -n "${PYTHON:-}" ] && [[ $PYTHON == */* ]]; then PYTHON=$(absolute "$PYTHON"); fi
LOG=${GPU_BENCH_LOG:+$(absolute "$GPU_BENCH_LOG")}
cd "$(dirname "$0")/.."

if [ ${#CONFIGS[@]} -eq 0 ]; then
    for name in tiny_gdn tiny_hybrid tiny_qwen35 tiny_attn tiny_mamba tiny_mamba2 tiny_linear tiny_gdp tiny_kda gpu_d1024_gdn gpu_d1024_hybrid; do
        [ -f "configs/$name.ini" ] && CONFIGS+=("configs/$name.ini")
    done
fi
[ ${#CONFIGS[@]} -gt 0 ] || { echo "gpu_bench: no configs" >&2; exit 2; }
for c in "${CONFIGS[@]}"; do
    [ -f "$c" ] || { echo "gpu_bench: $c: no such config" >&2; exit 2; }
done

if [ -z "${TRAIN_BENCH:-}" ]; then
    for t in .gpu/bin/train_bench build-cuda/train_bench; do
        [ -x "$t" ] && { TRAIN_BENCH=$PWD/$t; break; }
    done
fi
TRAIN_BENCH=${TRAIN_BENCH:-$(command -v train_bench || true)}
if [ -z "$TRAIN_BENCH" ] || [ ! -x "$TRAIN_BENCH" ]; then
    echo "gpu_bench: no train_bench: build it with -DAG_CUDA=ON (docs/cuda.md), pack it into .gpu, or set TRAIN_BENCH" >&2
    exit 1
fi
# A packed program's libraries (OpenBLAS, HDF5, ...: pack.sh's lib/ beside
# its env.sh) for the C runs only: PyTorch keeps its own.
C_LIBS=${LD_LIBRARY_PATH:-}
if [ -f "$(dirname "$TRAIN_BENCH")/../env.sh" ] && [ -d "$(dirname "$TRAIN_BENCH")/../lib" ]; then
    C_LIBS="$(cd "$(dirname "$TRAIN_BENCH")/../lib" && pwd):/usr/local/cuda/lib64${C_LIBS:+:$C_LIBS}"
fi
PY=${PYTHON:-python3}
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || {
    echo "gpu_bench: $PY has no torch that sees a CUDA GPU (set PYTHON)" >&2
    exit 1
}

if [ -n "$LOG" ]; then
    mkdir -p "$LOG"
else
    LOG=$(mktemp -d)
    trap 'rm -rf "$LOG"' EXIT
fi
: >"$RESULTS"

# run NAME CMD...: CMD's output into $LOG/NAME.txt, its RESULT line into
# $RESULTS; prints the line's tokens_per_s, or why there is none.
run() {
    local name=$1 rc=0
    shift
    if [ "$LIMIT" -gt 0 ]; then
        timeout "$LIMIT" "$@" >"$LOG/$name.txt" 2>&1 || rc=$?
    else
        "$@" >"$LOG/$name.txt" 2>&1 || rc=$?
    fi
    local line
    line=$(grep '^RESULT' "$LOG/$name.txt" | tail -1 || true)
    if [ "$rc" -eq 0 ] && [ -n "$line" ]; then
        echo "$line" >>"$RESULTS"
        sed -n 's/.* tokens_per_s=\([^ ]*\).*/\1/p' <<<"$line"
    elif [ "$rc" -eq 124 ]; then
        echo "gpu_bench: $name: stopped after $LIMIT s" >&2
        echo timeout
    else
        echo "gpu_bench: $name failed (exit $rc); its last lines:" >&2
        tail -5 "$LOG/$name.txt" | sed 's/^/    /' >&2
        echo failed
    fi
}

ratio() {  # ratio A B -> A / B to 2 places, or - when either is not a number
    awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b > 0) printf "%.2f", a / b; else printf "-" }'
}

rows=()
first=""
for cfg in "${CONFIGS[@]}"; do
    name=$(basename "$cfg" .ini)
    echo "== $name" >&2
    c=$(run "c_$name" env LD_LIBRARY_PATH="$C_LIBS" "$TRAIN_BENCH" --config "$cfg" --device cuda \
        --steps "$STEPS" --warmup "$WARMUP")
    e=$(run "eager_$name" "$PY" bench/torch_ref/throughput.py "$cfg" --device cuda --steps "$STEPS" --warmup "$WARMUP")
    k=-
    if [ "$COMPILE" = 1 ]; then
        k=$(run "compile_$name" "$PY" bench/torch_ref/throughput.py "$cfg" --device cuda "$COMPILE_FLAG" \
            --steps "$STEPS" --warmup "$WARMUP")
    fi
    [ -n "$first" ] || first=$name
    rows+=("| $name | $c | $e | $k | $(ratio "$c" "$e") | $(ratio "$c" "$k") |")
done

echo
sed -n 's/^gpu: /GPU: /p' "$LOG/eager_$first.txt" | head -1
sed -n 's/^device: /C device: /p' "$LOG/c_$first.txt" | head -1
sed -n 's/^float32 products: /PyTorch float32 products: /p' "$LOG/eager_$first.txt" | head -1
echo "torch $("$PY" -c 'import torch; print(torch.__version__)'); C: $TRAIN_BENCH"
echo "each run: the median of $STEPS timed steps after $WARMUP untimed ones, each part timed to a GPU synchronisation;"
how="of forward + loss"
[ "$COMPILE_FLAG" = --compile-layers ] && how="per layer kind (shared by its layers) and of the head + loss"
echo "float32 both sides; PyTorch: fused AdamW$([ "$COMPILE" = 1 ] && echo ", compile = torch.compile(mode=default) $how")"
echo
echo "| config | C tok/s | torch eager tok/s | torch compile tok/s | C/eager | C/compile |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
printf '%s\n' "${rows[@]}"
echo
echo "RESULT lines: $RESULTS$([ -n "${GPU_BENCH_LOG:-}" ] && echo "; every run's output: $LOG")"
