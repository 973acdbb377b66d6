#!/usr/bin/env bash
# bench/gpu_vs_fla.sh: attnlab's delta-rule mixing ops against
# flash-linear-attention's Triton kernels, op by op, on one GPU: tokens/s
# (forward, and forward + backward) against T with B*T fixed, for gdn
# (op_gdn, chunked, vs chunk_gated_delta_rule), gdp2 and gdp3 (op_gdp vs
# chunk_gated_delta_product) and kda (op_kda, chunked, vs chunk_kda); first
# a check that both compute the same function on one small case.
#
#   bench/gpu_vs_fla.sh [-f FLA_DIR] [-o OUT_DIR] [-O OPS] [-T LIST] [-d DK_LIST] [-n TOKENS]
#                       [-H HEADS] [-w WARMUP] [-r REPS] [-t SECONDS] [-D DTYPES] [-j N] [-B] [-C | -k]
#
#   -f FLA_DIR  the folder that holds fla/ (a source checkout; default .fla)
#   -o OUT_DIR  where the results go (default: a new folder under /tmp, named at the end):
#               check.txt, attnlab.tsv, fla_f32.tsv, fla_tf32_bf16.tsv and table.md
#   -O OPS      default gdn,gdp2,gdp3,kda
#   -T LIST     default 512,1024,2048,4096,8192,16384
#   -d DK_LIST  head sizes dk = dv (default 64; 64,128 for both)
#   -n TOKENS   B*T of every row (default 16384); -H heads (default 8)
#   -w, -r      warm-up and timed iterations of each row, both sides (default 3 and 20)
#   -t SECONDS  stop the check's fla part and each of the three timing runs after this long
#               (default 0: no limit); the rows a timing run printed stay in its TSV and the tables
#   -D DTYPES   fla's columns, a comma list of f32, tf32, bf16 (default all three)
#   -j N        before each fla run, compile its Triton kernels in N processes at once
#               (bench/torch_ref/triton_prewarm.sh; a short run of the same shapes), so that
#               fla's autotuning then times its configs instead of compiling them one by one
#               (on an H100, -j 16 over the four ops ran over 450 s; without it, gdn and kda
#               in bf16 at one T took under 200 s: prefer few ops and one T a call)
#   -B          lift fla's refusal of Triton < 3.7.1 on Hopper for its gated backward (fla
#               issue 640, a Triton miscompile) for the TIMING runs only; the check never does,
#               and the fla TSVs say which was done
#   -C          no check;  -k  the check alone, no timing
#
# Three fla columns: f32 (float32 inputs, Triton's float32 products in IEEE
# float32: TRITON_F32_DEFAULT=ieee, the arithmetic of attnlab's kernels),
# tf32 (float32 inputs, Triton's default TF32 products) and bf16; f32 and
# tf32 need two processes. fla's gated_delta_product takes bf16 only.
#
# Meant for the lent GPU machine (docs/cuda.md, "Mixing ops against
# flash-linear-attention"): build build-cuda/gdn_gpu_bench here, pack it
# (pack.sh .gpu build-cuda/gdn_gpu_bench) and compress it (tar -czf .gpu.tgz .gpu: the
# pack alone is about the 64 MiB the tree may travel in), copy fla/ into .fla, carry
# .gpu.tgz and .fla, and there unpack it first (tar -xzf .gpu.tgz).
# The programs, from the environment:
#   GDN_GPU_BENCH  default: .gpu/bin/gdn_gpu_bench, else build-cuda/gdn_gpu_bench; a packed one
#                  runs with its lib/ folder (pack.sh's) on LD_LIBRARY_PATH, PyTorch without it
#   PYTHON         default: python3 (with a CUDA torch and Triton)
set -euo pipefail

FLA=.fla
OUT=""
OPS=gdn,gdp2,gdp3,kda
TS=512,1024,2048,4096,8192,16384
DKS=64
TOKENS=16384
HEADS=8
WARMUP=3
REPS=20
BYPASS=""
CHECK=1
TIMING=1
LIMIT=0
DTYPES=f32,tf32,bf16
PREWARM=0
usage() {
    echo "usage: $0 [-f FLA_DIR] [-o OUT_DIR] [-O OPS] [-T LIST] [-d DK_LIST] [-n TOKENS] [-H HEADS] [-w WARMUP] [-r REPS] [-t SECONDS] [-D DTYPES] [-j N] [-B] [-C | -k]" >&2
    exit 2
}
while getopts "f:o:O:T:d:n:H:w:r:t:D:j:BCk" opt; do
    case $opt in
        f) FLA=$OPTARG ;;
        o) OUT=$OPTARG ;;
        O) OPS=$OPTARG ;;
        T) TS=$OPTARG ;;
        d) DKS=$OPTARG ;;
        n) TOKENS=$OPTARG ;;
        H) HEADS=$OPTARG ;;
        w) WARMUP=$OPTARG ;;
        r) REPS=$OPTARG ;;
        t) LIMIT=$OPTARG ;;
        D) DTYPES=$OPTARG ;;
        j) PREWARM=$OPTARG ;;
        B) BYPASS=--bypass-hopper-guard ;;
        C) CHECK=0 ;;
        k) TIMING=0 ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 0 ] || usage
[ "$CHECK" = 1 ] || [ "$TIMING" = 1 ] || { echo "gpu_vs_fla: -C and -k leave nothing to do" >&2; exit 2; }
# The values go to the programs as single arguments, never through a shell;
# they check them. Only the shape of the lists is checked here.
[[ ,$DTYPES, =~ ^(,(f32|tf32|bf16))+,$ ]] || { echo "gpu_vs_fla: -D '$DTYPES': a comma list of f32, tf32, bf16" >&2; exit 2; }
for v in "$TS" "$DKS" "$TOKENS" "$HEADS" "$WARMUP" "$REPS" "$LIMIT" "$PREWARM"; do
    [[ $v =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "gpu_vs_fla: '$v' is not a number or a comma list of numbers" >&2; exit 2; }
done
[[ $OPS =~ ^[a-z0-9]+(,[a-z0-9]+)*$ ]] || { echo "gpu_vs_fla: -O '$OPS' is not a comma list of op names" >&2; exit 2; }

absolute() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
FLA=$(absolute "$FLA")
[ -n "$OUT" ] && OUT=$(absolute "$OUT")
if [ -n "${GDN_GPU_BENCH:-}" ] && [[ $GDN_GPU_BENCH == */* ]]; then GDN_GPU_BENCH=$(absolute "$GDN_GPU_BENCH"); fi
if [ -n "${PYTHON:-}" ] && [[ $PYTHON == */* ]]; then PYTHON=$(absolute "$PYTHON"); fi
cd "$(dirname "$0")/.."

[ -f "$FLA/fla/ops/gated_delta_rule/chunk.py" ] || {
    echo "gpu_vs_fla: -f $FLA: no fla/ops/gated_delta_rule/chunk.py under it (copy a checkout's fla/ there)" >&2
    exit 2
}
if [ -z "${GDN_GPU_BENCH:-}" ]; then
    for t in .gpu/bin/gdn_gpu_bench build-cuda/gdn_gpu_bench; do
        [ -x "$t" ] && { GDN_GPU_BENCH=$PWD/$t; break; }
    done
fi
if [ -z "${GDN_GPU_BENCH:-}" ] || [ ! -x "$GDN_GPU_BENCH" ]; then
    echo "gpu_vs_fla: no gdn_gpu_bench: build it with -DAG_CUDA=ON (docs/cuda.md), pack it into .gpu, or set GDN_GPU_BENCH" >&2
    exit 1
fi
C_LIBS=${LD_LIBRARY_PATH:-}
if [ -f "$(dirname "$GDN_GPU_BENCH")/../env.sh" ] && [ -d "$(dirname "$GDN_GPU_BENCH")/../lib" ]; then
    C_LIBS="$(cd "$(dirname "$GDN_GPU_BENCH")/../lib" && pwd):/usr/local/cuda/lib64${C_LIBS:+:$C_LIBS}"
fi
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1   # a run stopped by -t keeps every line it printed
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || {
    echo "gpu_vs_fla: $PY has no torch that sees a CUDA GPU (set PYTHON)" >&2
    exit 1
}
FLA_PY=bench/torch_ref/fla_ops_bench.py

if [ -z "$OUT" ]; then OUT=$(mktemp -d /tmp/gpu_vs_fla.XXXXXX); fi
mkdir -p "$OUT"
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT

prewarm() { if [ "$PREWARM" -gt 0 ]; then bench/torch_ref/triton_prewarm.sh "$PREWARM" "$@"; fi; }
cbench() { LD_LIBRARY_PATH=$C_LIBS "$GDN_GPU_BENCH" --device cuda "$@"; }
limited() { if [ "$LIMIT" -gt 0 ]; then timeout "$LIMIT" "$@"; else "$@"; fi; }

echo "== gpu_vs_fla: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'nvidia-smi absent')"
"$PY" - "$FLA" <<'PY'
import re, sys, torch, triton
init = open(sys.argv[1] + "/fla/__init__.py").read()
m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", init)
print(f"== {torch.cuda.get_device_name(0)}; torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"triton {triton.__version__}, fla {m.group(1) if m else 'unknown'}")
PY
echo "== OPS $OPS, T $TS, dk $DKS, B*T $TOKENS, H $HEADS, warm-up $WARMUP, timed $REPS; results in $OUT"

failed=0
if [ "$CHECK" = 1 ]; then
    echo "== check: the same function on one small case (B 2, T 200, H 4, dk = dv = ${DKS%%,*})"
    check=("$PY" "$FLA_PY" check --fla "$FLA" --dump "$SCRATCH" --ops "$OPS" --dtypes f32,bf16)
    if cbench --ops "$OPS" --dk "$DKS" --dump "$SCRATCH" >"$OUT/check.txt" 2>&1 &&
        prewarm "${check[@]}" && limited "${check[@]}" >>"$OUT/check.txt" 2>&1; then
        cat "$OUT/check.txt"
    else
        echo "gpu_vs_fla: the check failed; its last lines:" >&2
        tail -5 "$OUT/check.txt" | sed 's/^/    /' >&2
        failed=1
    fi
fi

# step NAME CMD...: CMD's stdout into $OUT/NAME.tsv, its stderr after it as comments.
step() {
    local name=$1 rc=0
    shift
    echo "== $name"
    limited "$@" >"$OUT/$name.tsv" 2>"$SCRATCH/$name.err" || rc=$?
    sed 's/^/# stderr: /' "$SCRATCH/$name.err" >>"$OUT/$name.tsv"
    if [ "$rc" -eq 124 ]; then
        echo "# $name: stopped after $LIMIT s (-t): later rows missing" >>"$OUT/$name.tsv"
        echo "gpu_vs_fla: $name stopped after $LIMIT s; its rows so far are kept" >&2
        failed=1
    elif [ "$rc" -ne 0 ]; then
        echo "gpu_vs_fla: $name failed (exit $rc); its last lines:" >&2
        tail -5 "$OUT/$name.tsv" | sed 's/^/    /' >&2
        failed=1
    fi
}
if [ "$TIMING" = 1 ]; then
    common=(--ops "$OPS" --T "$TS" --dk "$DKS" --tokens "$TOKENS" --H "$HEADS" --warmup "$WARMUP" --reps "$REPS")
    step attnlab env LD_LIBRARY_PATH="$C_LIBS" "$GDN_GPU_BENCH" --device cuda "${common[@]}"
    # fla's columns: f32 in a process of its own (TRITON_F32_DEFAULT is read at compile time), then tf32 and bf16.
    short=(--ops "$OPS" --T "${TS%%,*}" --dk "$DKS" --tokens "$TOKENS" --H "$HEADS" --warmup 1 --reps 1)
    if [[ ,$DTYPES, == *,f32,* ]]; then
        prewarm "$PY" "$FLA_PY" bench --fla "$FLA" "${short[@]}" --dtypes f32 $BYPASS
        step fla_f32 "$PY" "$FLA_PY" bench --fla "$FLA" "${common[@]}" --dtypes f32 $BYPASS
    fi
    rest=$(tr ',' '\n' <<<"$DTYPES" | grep -v '^f32$' | paste -sd, -)
    if [ -n "$rest" ]; then
        prewarm "$PY" "$FLA_PY" bench --fla "$FLA" "${short[@]}" --dtypes "$rest" $BYPASS
        step fla_tf32_bf16 "$PY" "$FLA_PY" bench --fla "$FLA" "${common[@]}" --dtypes "$rest" $BYPASS
    fi

    tsvs=()
    for f in attnlab fla_f32 fla_tf32_bf16; do
        grep -q $'^side\top' "$OUT/$f.tsv" 2>/dev/null && tsvs+=("$OUT/$f.tsv")
    done
    if [ ${#tsvs[@]} -gt 0 ]; then
        "$PY" "$FLA_PY" join "${tsvs[@]}" --out "$OUT/table.md" && cat "$OUT/table.md"
    fi
fi
echo "== results in $OUT"
exit $failed
