#!/usr/bin/env bash
# bench/gpu_vs_stack.sh: attnlab's training step on one GPU against the stack
# a GPU user would pick instead (issue 43): tokens/s of a whole step (forward,
# backward, clip, AdamW; random tokens, B and T of the config) of
# train_bench --device cuda at [train] precision fp32, tf32 and bf16, and of
# the anchor (bench/torch_ref/throughput.py --fla: the PyTorch reference with
# fla's Triton kernels for gdn/mamba/linear and SDPA for attn, eager) in
# float32 and under bf16 autocast; the runs alternate between the two sides,
# config by config and round by round. Then a markdown table with MFU (model
# FLOPs per token x tokens/s / the H100's dense bf16 989 TFLOP/s; the count is
# bench/torch_ref/mfu.py's model_flops_per_token) and the ratios attnlab / anchor.
# First, unless -C, the anchor's check (fla_model.py check): its loss, mixer
# outputs and gradients against the float32 and float64 references.
#
#   bench/gpu_vs_stack.sh [-f FLA_DIR] [-o OUT_DIR] [-s STEPS] [-W WARMUP] [-t SECONDS] [-r ROUNDS]
#                         [-p PRECISIONS] [-j N] [-B] [-c] [-C | -k] [CONFIG...]
#
#   CONFIG      default configs/gpu_d1024_gdn.ini configs/gpu_d1024_hybrid.ini
#   -f FLA_DIR  the folder that holds fla/ (a source checkout; default .fla)
#   -o OUT_DIR  where the results go (default: a new folder under /tmp, named at the end):
#               table.md, runs.tsv (config, column, round, tokens/s or a word), results.txt (every
#               RESULT line), check_<config>.txt, logs/<run>.txt (each run's whole output)
#   -s, -W      timed and untimed steps of each run (default 5 and 2; fla's Triton kernels
#               compile and autotune during the first, untimed step)
#   -t SECONDS  stop a run (or a check) that takes longer (default 0: no limit); its cell reads "timeout"
#   -r ROUNDS   the whole alternation this many times (default 1); a cell is the median
#   -p LIST     the precisions timed, a comma list of fp32, tf32, bf16 (default all three; the
#               anchor has no tf32 column: fp32 gives attnlab fp32 and anchor fp32, bf16 both bf16)
#   -j N        before the anchor's first run of a config and precision (and its check),
#               compile fla's Triton kernels in N processes at once (bench/torch_ref/
#               triton_prewarm.sh; one step at B 1 x T 1024 each), so that fla's autotuning
#               then times its configs instead of compiling them one by one (on an H100 at
#               d_model 1024, -j 12 ran out of GPU memory in every process; without it the
#               anchor's 2 warm-up steps compiled and autotuned within -t 150)
#   -B          lift fla's refusal of Triton < 3.7.1 on Hopper for its gated backward (fla issue
#               640, a Triton miscompile) for the anchor's timing runs; the check then shows
#               the gradients as information, outside its verdict
#   -c          one more anchor column: bf16 autocast under torch.compile per layer kind
#               (throughput.py --compile-layers; off by default: d_model 1024 compiles slowly)
#   -C          no check;  -k  the check alone, no timing
#
# A cell reads "refused" when train_bench refuses the precision (bf16 before the
# GPU has it), "failed" (its log's last lines are printed) or "timeout"; the
# other runs go on.
#
# Meant for the lent GPU machine, from a tree with the packed programs in .gpu
# (pack.sh .gpu build-cuda/train_bench; `source .gpu/env.sh` puts them on PATH)
# and fla's source in .fla/fla. The programs, from the environment:
#   TRAIN_BENCH  default: .gpu/bin/train_bench, else build-cuda/train_bench, else train_bench on PATH;
#                a packed one runs with its lib/ folder on LD_LIBRARY_PATH, PyTorch without it
#   PYTHON       default: python3 (with a CUDA torch >= 2.0 and Triton)
set -euo pipefail

FLA=.fla
OUT=""
STEPS=5
WARMUP=2
LIMIT=0
ROUNDS=1
BYPASS=()
COMPILE=0
PREWARM=0
CHECK=1
TIMING=1
usage() {
    echo "usage: $0 [-f FLA_DIR] [-o OUT_DIR] [-s STEPS] [-W WARMUP] [-t SECONDS] [-r ROUNDS] [-p PRECISIONS] [-j N] [-B] [-c] [-C | -k] [CONFIG...]" >&2
    exit 2
}
PRECS=fp32,tf32,bf16
while getopts "f:o:s:W:t:r:p:j:BcCk" opt; do
    case $opt in
        f) FLA=$OPTARG ;;
        o) OUT=$OPTARG ;;
        s) STEPS=$OPTARG ;;
        W) WARMUP=$OPTARG ;;
        t) LIMIT=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        p) PRECS=$OPTARG ;;
        j) PREWARM=$OPTARG ;;
        B) BYPASS=(--bypass-hopper-guard) ;;
        c) COMPILE=1 ;;
        C) CHECK=0 ;;
        k) TIMING=0 ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ "$CHECK" = 1 ] || [ "$TIMING" = 1 ] || { echo "gpu_vs_stack: -C and -k leave nothing to do" >&2; exit 2; }
for n in "$STEPS" "$WARMUP" "$LIMIT" "$ROUNDS" "$PREWARM"; do
    [[ $n =~ ^[0-9]+$ ]] || { echo "gpu_vs_stack: '$n' is not a whole number" >&2; exit 2; }
done
[[ ,$PRECS, =~ ^(,(fp32|tf32|bf16))+,$ ]] || { echo "gpu_vs_stack: -p '$PRECS': a comma list of fp32, tf32, bf16" >&2; exit 2; }
want() { [[ ,$PRECS, == *,$1,* ]]; }
if [ "$STEPS" -lt 1 ] || [ "$ROUNDS" -lt 1 ]; then echo "gpu_vs_stack: -s and -r need at least 1" >&2; exit 2; fi

absolute() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
FLA=$(absolute "$FLA")
[ -z "$OUT" ] || OUT=$(absolute "$OUT")
CONFIGS=()
for c in "$@"; do
    [ -f "$c" ] || { echo "gpu_vs_stack: $c: no such config" >&2; exit 2; }
    CONFIGS+=("$(absolute "$c")")
done
if [ -n "${TRAIN_BENCH:-}" ] && [[ $TRAIN_BENCH == */* ]]; then TRAIN_BENCH=$(absolute "$TRAIN_BENCH"); fi
if [ -n "${PYTHON:-}" ] && [[ $PYTHON == */* ]]; then PYTHON=$(absolute "$PYTHON"); fi
cd "$(dirname "$0")/.."
# shellcheck source=bench/bench_lib.sh
. bench/bench_lib.sh

if [ ${#CONFIGS[@]} -eq 0 ]; then
    CONFIGS=("$PWD/configs/gpu_d1024_gdn.ini" "$PWD/configs/gpu_d1024_hybrid.ini")
fi
[ -f "$FLA/fla/ops/gated_delta_rule/chunk.py" ] || {
    echo "gpu_vs_stack: -f $FLA: no fla/ops/gated_delta_rule/chunk.py under it (copy a checkout's fla/ there)" >&2
    exit 2
}
TRAIN_BENCH=$(gpu_program train_bench "${TRAIN_BENCH:-}")
if [ "$TIMING" = 1 ] && [ -z "$TRAIN_BENCH" ]; then
    echo "gpu_vs_stack: no train_bench: build it with -DAG_CUDA=ON (docs/cuda.md), pack it into .gpu, or set TRAIN_BENCH" >&2
    exit 1
fi
C_LIBS=$(packed_libs "${TRAIN_BENCH:-.}")
PY=${PYTHON:-python3}
"$PY" -c 'import sys, torch, triton; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || {
    echo "gpu_vs_stack: $PY has no torch that sees a CUDA GPU, or no Triton (set PYTHON)" >&2
    exit 1
}
export PYTHONUNBUFFERED=1   # a run stopped by -t keeps every line it printed

[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/gpu_vs_stack.XXXXXX)
mkdir -p "$OUT/logs"
: >"$OUT/results.txt"
: >"$OUT/runs.tsv"
limited() { if [ "$LIMIT" -gt 0 ]; then timeout "$LIMIT" "$@"; else "$@"; fi; }
prewarm() { if [ "$PREWARM" -gt 0 ]; then bench/torch_ref/triton_prewarm.sh "$PREWARM" "$@"; fi; }

echo "== gpu_vs_stack: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'nvidia-smi absent')"
"$PY" - "$FLA" <<'PY'
import re, sys, torch, triton
m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", open(sys.argv[1] + "/fla/__init__.py").read())
print(f"== {torch.cuda.get_device_name(0)}; torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"triton {triton.__version__}, fla {m.group(1) if m else 'unknown'}")
PY
echo "== train_bench: ${TRAIN_BENCH:-none}; $STEPS timed steps after $WARMUP, $ROUNDS round(s); results in $OUT"

failed=0
if [ "$CHECK" = 1 ]; then
    for cfg in "${CONFIGS[@]}"; do
        name=$(basename "$cfg" .ini)
        echo "== check: $name (fla_model.py check, float32, B 2 x T 1024)"
        rc=0
        prewarm "$PY" bench/torch_ref/fla_model.py check "$cfg" --fla "$FLA" "${BYPASS[@]}"
        limited "$PY" bench/torch_ref/fla_model.py check "$cfg" --fla "$FLA" "${BYPASS[@]}" \
            >"$OUT/check_$name.txt" 2>&1 || rc=$?
        grep -E '^(#|loss:|gradients|check:)' "$OUT/check_$name.txt" || true
        if [ "$rc" -ne 0 ]; then
            echo "gpu_vs_stack: the check of $name failed (exit $rc); its last lines:" >&2
            tail -5 "$OUT/check_$name.txt" | sed 's/^/    /' >&2
            failed=1
        fi
    done
fi

# run CONFIG COLUMN ROUND CMD...: CMD's output into logs/, its RESULT line into
# results.txt, a line (config, column, round, tokens/s or why none) into runs.tsv.
run() {
    local cfg=$1 col=$2 round=$3 rc=0 line value log
    shift 3
    log="$OUT/logs/$(basename "$cfg" .ini)_${col}_$round.txt"
    echo "== $(basename "$cfg" .ini) $col (round $round)"
    limited "$@" >"$log" 2>&1 || rc=$?
    line=$(grep '^RESULT' "$log" | tail -1 || true)
    if [ "$rc" -eq 0 ] && [ -n "$line" ]; then
        echo "$line" >>"$OUT/results.txt"
        value=$(field tokens_per_s "$line")
    elif [ "$rc" -eq 124 ]; then
        value=timeout
    elif [ "$col" = attnlab_bf16 ] && ! grep -q '^per step' "$log" && grep -qi 'bf16' "$log"; then
        value=refused   # this build's train_bench has no bf16 on the GPU (yet)
    else
        value=failed
        echo "gpu_vs_stack: $(basename "$log" .txt) failed (exit $rc); its last lines:" >&2
        tail -5 "$log" | sed 's/^/    /' >&2
    fi
    printf '%s\t%s\t%s\t%s\n' "$cfg" "$col" "$round" "$value" >>"$OUT/runs.tsv"
}

if [ "$TIMING" = 1 ]; then
    steps=(--steps "$STEPS" --warmup "$WARMUP")
    attnlab=(env LD_LIBRARY_PATH="$C_LIBS" "$TRAIN_BENCH" --device cuda "${steps[@]}")
    anchor=("$PY" bench/torch_ref/throughput.py --device cuda --fla "$FLA" "${BYPASS[@]}" "${steps[@]}")
    short=(--steps 1 --warmup 0 --set train.batch_size=1 --set train.seq_len=1024)
    for cfg in "${CONFIGS[@]}"; do
        # (argparse takes the last --steps / --warmup: short's)
        if want fp32; then prewarm "${anchor[@]}" "$cfg" "${short[@]}"; fi
        if want bf16; then prewarm "${anchor[@]}" "$cfg" "${short[@]}" --amp bf16; fi
    done
    for round in $(seq "$ROUNDS"); do
        for cfg in "${CONFIGS[@]}"; do
            if want fp32; then
                run "$cfg" attnlab_fp32 "$round" "${attnlab[@]}" --config "$cfg" --set train.precision=fp32
                run "$cfg" anchor_fp32 "$round" "${anchor[@]}" "$cfg"
            fi
            want tf32 && run "$cfg" attnlab_tf32 "$round" "${attnlab[@]}" --config "$cfg" --set train.precision=tf32
            if want bf16; then
                run "$cfg" anchor_bf16 "$round" "${anchor[@]}" "$cfg" --amp bf16
                run "$cfg" attnlab_bf16 "$round" "${attnlab[@]}" --config "$cfg" --set train.precision=bf16
            fi
            if [ "$COMPILE" = 1 ]; then
                run "$cfg" anchor_bf16_compile "$round" "${anchor[@]}" "$cfg" --amp bf16 --compile-layers
            fi
        done
    done
    if grep -qE $'\t(failed|timeout)$' "$OUT/runs.tsv"; then failed=1; fi
    {
        echo "GPU: $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))'); each run the median of $STEPS" \
            "timed steps after $WARMUP, each part timed to a GPU synchronisation; $ROUNDS round(s), alternating"
        echo "attnlab: train_bench --device cuda --set train.precision=fp32|tf32|bf16 ($TRAIN_BENCH)."
        echo "anchor: bench/torch_ref/throughput.py --fla (PyTorch eager, fused AdamW, fla's chunk kernels for" \
            "gdn/mamba/linear, SDPA for attn; fp32: no TF32 in torch, Triton products IEEE float32; bf16:" \
            "torch.autocast, Triton's defaults)$([ ${#BYPASS[@]} -gt 0 ] && echo "; fla's Hopper guard (issue 640) lifted for timing")."
        echo "Model FLOPs per token: 6 x parameters + attention's and the mixers' sequence terms" \
            "(bench/torch_ref/mfu.py, model_flops_per_token)."
        echo
        "$PY" bench/torch_ref/mfu.py table "$OUT/runs.tsv"
    } >"$OUT/table.md"
    echo
    cat "$OUT/table.md"
fi
echo "== results in $OUT"
exit $failed
