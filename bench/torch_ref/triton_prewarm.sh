#!/usr/bin/env bash
# bench/torch_ref/triton_prewarm.sh N CMD [ARG...]: compiles the Triton
# kernels that CMD (fla_ops_bench.py or throughput.py / fla_model.py with
# --fla) autotunes, N processes at once, before the timed run. Each process
# runs CMD with ATTNLAB_TRITON_SLICE=i/N, under which every autotuner keeps
# its configs i, i+N, ... (fla_ops_bench.py's slice_autotune), so the N
# processes compile every config of every kernel between them into Triton's
# on-disk cache (~/.triton/cache, or TRITON_CACHE_DIR). The timed run then
# autotunes over all configs as it always does, finding them compiled: fla's
# first use costs the timing of its configs, not minutes of compiling one
# config after another. CMD should be a short run of the same shapes and
# dtypes (autotuning keys hold head counts and sizes, not B or T; Triton
# specialises integer arguments on divisibility by 16, so keep T a multiple
# of 64) and must not outgrow the GPU's memory N times over.
# Exits 0 even where some processes failed (a prewarm is an optimisation);
# prints how long it took and the last lines of a failed process.
set -uo pipefail
if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 N CMD [ARG...]   (N: processes at once)" >&2
    exit 2
fi
n=$1
shift
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
t0=$(date +%s)
pids=()
for ((i = 0; i < n; i++)); do
    ATTNLAB_TRITON_SLICE="$i/$n" "$@" >"$logs/$i.txt" 2>&1 &
    pids+=($!)
done
failed=0 first=""
for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
        failed=$((failed + 1))
        [ -n "$first" ] || first=$i
    fi
done
echo "== triton_prewarm: $n processes in $(($(date +%s) - t0)) s, $failed failed: $(basename "$2") ${*:3:3} ..."
if [ -n "$first" ]; then
    echo "   process $first's last lines:"
    tail -5 "$logs/$first.txt" | sed 's/^/     /'
fi
exit 0
