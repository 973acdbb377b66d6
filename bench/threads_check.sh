#!/usr/bin/env bash
# bench/threads_check.sh: does oneDNN share our OpenMP pool, or oversubscribe?
#
#   bench/threads_check.sh [-t THREADS] [-s STEPS] [CONFIG]   default: every core, 8 steps, tiny_mamba at d_model 256
#
# Runs train_bench on each product backend (OpenBLAS, oneDNN float32, oneDNN
# bf16) and reports, per run: the most threads the process ever had (sampled
# from /proc/PID/status every 10 ms), the OpenMP runtimes it mapped (libgomp,
# libomp, libiomp5: two would mean two pools), context switches per step
# (perf stat; a thread that finds its core taken switches often), and CPU
# time over wall time (at most THREADS when nothing else runs: more would mean
# more busy threads than we asked for). Needs build/train_bench and perf.
set -euo pipefail
cd "$(dirname "$0")/.."

THREADS=$(nproc)
STEPS=8
while getopts "t:s:" opt; do
    case $opt in
        t) THREADS=$OPTARG ;;
        s) STEPS=$OPTARG ;;
        *) echo "usage: $0 [-t THREADS] [-s STEPS] [CONFIG]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
CONFIG=${1:-configs/tiny_mamba.ini}
WIDE=(--set model.d_model=256 --set model.d_k=64 --set model.d_v=64 --set model.d_ff=704)
[ $# -gt 0 ] && WIDE=()
[ -x build/train_bench ] || { echo "threads_check: build/train_bench missing (cmake --build build)" >&2; exit 1; }
command -v perf >/dev/null || { echo "threads_check: perf not found (apt-get install linux-perf)" >&2; exit 1; }
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} OMP_NUM_THREADS=$THREADS

echo "config: $CONFIG ${WIDE[*]}"
echo "threads asked: $THREADS (OMP_NUM_THREADS, [train] threads), OMP_WAIT_POLICY=$OMP_WAIT_POLICY, $(nproc) cores"
echo "libdnnl links: $(ldd "$(ldconfig -p | awk '/libdnnl.so.2 / {print $NF; exit}')" 2>/dev/null | grep -oE 'lib(gomp|omp|iomp5)[^ ]*' | sort -u | tr '\n' ' ')"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
printf '| backend | products | max threads | OpenMP runtimes mapped | context switches / step | CPU time / wall time | tokens/s |\n'
printf '| --- | --- | ---: | --- | ---: | ---: | ---: |\n'
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for run in "openblas fp32" "onednn fp32" "onednn bf16"; do
    read -r gemm prec <<<"$run"
    perf stat -x, -e task-clock,context-switches -o "$tmp/perf" \
        ./build/train_bench --config "$CONFIG" "${WIDE[@]}" --set train.threads="$THREADS" \
        --set train.gemm="$gemm" --set train.precision="$prec" --steps "$STEPS" >"$tmp/out" 2>&1 &
    perf_pid=$!
    max=0
    runtimes=""
    sleep 0.05
    pid=$(pgrep -P "$perf_pid" -n train_bench || true)
    while kill -0 "$perf_pid" 2>/dev/null; do
        if [ -n "$pid" ] && [ -r "/proc/$pid/status" ]; then
            n=$(awk '/^Threads:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
            [ "${n:-0}" -gt "$max" ] && max=$n
            [ -n "$runtimes" ] || runtimes=$(grep -oE 'lib(gomp|omp|iomp5)\.so[.0-9]*' "/proc/$pid/maps" 2>/dev/null | sort -u | tr '\n' ' ' || true)
        else
            pid=$(pgrep -P "$perf_pid" -n train_bench || true)
        fi
        sleep 0.01
    done
    wait "$perf_pid"
    # train_bench re-executes itself once (OMP_WAIT_POLICY), same pid.
    task_ms=$(awk -F, '$3 == "task-clock" {print $1}' "$tmp/perf")
    cs=$(awk -F, '$3 == "context-switches" {print $1}' "$tmp/perf")
    steps_all=$((STEPS + 2))
    res=$(grep '^RESULT' "$tmp/out")
    tps=$(sed -n 's/.* tokens_per_s=\([^ ]*\).*/\1/p' <<<"$res")
    step_ms=$(sed -n 's/.* step_ms=\([^ ]*\).*/\1/p' <<<"$res")
    cpu_ms=$(sed -n 's/.* cpu_ms=\([^ ]*\).*/\1/p' <<<"$res")
    ratio=$(awk -v c="$cpu_ms" -v w="$step_ms" 'BEGIN { printf "%.2f", c / w }')
    csps=$(awk -v c="$cs" -v s="$steps_all" 'BEGIN { printf "%.0f", c / s }')
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$gemm" "$prec" "$max" "${runtimes:-?}" "$csps" "$ratio" "$tps"
done
echo
echo "(context switches: the whole run, start-up and $((STEPS + 2)) steps, per step; CPU/wall: the timed steps' median)"
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
