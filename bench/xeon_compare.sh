#!/usr/bin/env bash
# bench/xeon_compare.sh: the comparison with PyTorch of issue 44 on one machine (written for
# the lent GPU machine's Xeon and its pip PyTorch, where our Debian packages are not): the
# five layer mixes (gdn, attn, mamba, linear, 3:1 hybrid; 4 layers) at d_model 256 and 512,
# T 256 x 16 and 1024 x 4, C fp32 and bf16 (auto GEMM) against PyTorch fp32, through
# bench/compare_torch.sh once per thread count; before that, train_bench --profile of the
# attn step (fp32, the same four shapes) at the thread counts named by -p (first: it is
# what the attention work needs most, and a run cut short by a time limit keeps it).
#
#   bench/xeon_compare.sh [-t THREADS] [-p PROFILE_THREADS] [-s STEPS] [-r ROUNDS] [-W WARMUP]
#                         [-b TRAIN_BENCH] [-P PYTHON] [-f] OUT_DIR
#
#   -t THREADS          comma list (default 2,8,16)
#   -p PROFILE_THREADS  comma list, each also in THREADS or not (default: none)
#   -s, -r, -W          compare_torch.sh's steps, rounds, PyTorch warmup (default 3, 1, 1)
#   -b, -P              compare_torch.sh's C program and Python (default build/train_bench,
#                       python3); TRAIN_BENCH relative to the repository root
#   -f                  overwrite files already in OUT_DIR (without it they stop the run)
#
# Writes OUT_DIR/machine.txt (CPU, cores, ISA flags, torch and its CPU backends),
# OUT_DIR/compare_tN.txt (compare_torch.sh's output: per-cell progress, header, table) and
# OUT_DIR/attn_profile_tN.txt; every run's raw output is kept in OUT_DIR/log_tN/.
# On a machine without our Debian packages, pack train_bench built here with
# shared/device/pack.sh and pass as -b a wrapper that puts the pack's lib/ on
# LD_LIBRARY_PATH for train_bench alone (PyTorch keeps its own libraries); the
# figures and that build are in docs/cpu_perf.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

THREADS=2,8,16
PTHREADS=
STEPS=3
ROUNDS=1
WARMUP=1
BIN=build/train_bench
PY=python3
FORCE=0
while getopts "t:p:s:r:W:b:P:f" opt; do
    case $opt in
        t) THREADS=$OPTARG ;;
        p) PTHREADS=$OPTARG ;;
        s) STEPS=$OPTARG ;;
        r) ROUNDS=$OPTARG ;;
        W) WARMUP=$OPTARG ;;
        b) BIN=$OPTARG ;;
        P) PY=$OPTARG ;;
        f) FORCE=1 ;;
        *) echo "usage: $0 [-t THREADS] [-p PROFILE_THREADS] [-s STEPS] [-r ROUNDS] [-W WARMUP] [-b TRAIN_BENCH] [-P PYTHON] [-f] OUT_DIR" >&2
           exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] || { echo "xeon_compare: name one OUT_DIR (usage: $0 [options] OUT_DIR)" >&2; exit 2; }
IFS=, read -r -a TLIST <<<"$THREADS"
IFS=, read -r -a PLIST <<<"$PTHREADS"
for n in "${TLIST[@]}" "${PLIST[@]}"; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "xeon_compare: thread count '$n' is not a positive integer" >&2; exit 2; }
done
mkdir -p "$1"
out=$(cd "$1" && pwd)

# what this run writes: refuse to replace any of it unless -f
targets=("$out/machine.txt")
for n in "${TLIST[@]}"; do targets+=("$out/compare_t$n.txt" "$out/log_t$n"); done
for n in "${PLIST[@]}"; do targets+=("$out/attn_profile_t$n.txt"); done
if [ "$FORCE" = 0 ]; then
    for f in "${targets[@]}"; do
        [ ! -e "$f" ] || { echo "xeon_compare: $f exists; move it away or pass -f" >&2; exit 1; }
    done
fi

cd "$root"
# PyTorch runs with OPENBLAS_CORETYPE unset (compare_torch.sh does so too); C keeps the caller's.
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
    echo "logical cpus: $(nproc)   $(lscpu 2>/dev/null | grep -E '^(Thread|Core|Socket|NUMA node\(s\)|L2|L3)' | tr -s ' ' | paste -sd';' -)"
    echo "isa: $(grep -o -w -E 'avx512[a-z0-9_]*|amx[a-z0-9_]*|avx_vnni' /proc/cpuinfo | sort -u | paste -sd' ' -)"
    echo "OPENBLAS_CORETYPE for C: ${OPENBLAS_CORETYPE:-unset}"
    env -u OPENBLAS_CORETYPE "$PY" -c 'import torch
cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "?")()   # torch >= 2.1
print("torch", torch.__version__, "mkl", torch.backends.mkl.is_available(), "mkldnn", torch.backends.mkldnn.is_available(),
      "cpu capability", cap)'
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"

source bench/bench_lib.sh   # width_sets, length_sets
for n in "${PLIST[@]}"; do
    f="$out/attn_profile_t$n.txt"
    : >"$f"
    for w in 256 512; do
        for T in 256 1024; do
            read -r -a sets <<<"$(width_sets "$w") $(length_sets "$T")"
            echo "== tiny_attn d_model $w T $T threads $n fp32 auto" >>"$f"
            OMP_NUM_THREADS=$n OPENBLAS_NUM_THREADS=$n OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} \
                "$BIN" --config configs/tiny_attn.ini "${sets[@]}" --set train.threads="$n" \
                --set train.gemm=auto --set train.precision=fp32 --steps "$STEPS" --profile >>"$f" 2>&1 ||
                { cat "$f" >&2; echo "xeon_compare: the profiled attn run failed ($w, $T, $n threads)" >&2; exit 1; }
        done
    done
    echo "attn profile at $n threads: $f"
done

configs=(configs/tiny_attn.ini configs/tiny_gdn.ini configs/tiny_mamba.ini configs/tiny_linear.ini configs/tiny_hybrid.ini)
for n in "${TLIST[@]}"; do
    echo "== $n threads" >&2
    rm -rf "$out/log_t$n"
    COMPARE_LOG="$out/log_t$n" bench/compare_torch.sh -t "$n" -s "$STEPS" -r "$ROUNDS" -W "$WARMUP" \
        -w 256,512 -T 256,1024 -b "$BIN" -P "$PY" "${configs[@]}" >"$out/compare_t$n.txt" 2>&1 ||
        { cat "$out/compare_t$n.txt" >&2; echo "xeon_compare: compare_torch.sh failed at $n threads" >&2; exit 1; }
    cat "$out/compare_t$n.txt"
done
