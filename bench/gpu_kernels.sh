#!/usr/bin/env bash
# bench/gpu_kernels.sh: where a GPU training step's time goes, kernel by kernel
# (issue 17's "GB/s per kernel"): one step of train_bench --device cuda under
# Nsight Compute (ncu), then bench/ncu_table.py's table: time, share, DRAM
# GB/s against the copy ceiling, registers, occupancy, FMA and shared-memory
# pipe use per kernel.
#
#   bench/gpu_kernels.sh OUT_PREFIX CONFIG [train_bench --set ARGS...]
#
#   OUT_PREFIX.csv  ncu's raw CSV (the program's own output first)
#   OUT_PREFIX.md   the table (also printed)
# ncu replays each kernel to read its counters, so the step takes ~50x its
# normal time (a d_model 1024 step: about a minute); the clocks are left
# alone (--clock-control none), as the device notes ask. Kernel time is the
# kernels' own, without launch gaps. Programs from the environment:
#   TRAIN_BENCH  default: train_bench on PATH (pack.sh's env.sh puts the packed one there)
#   NCU          default: ncu;  PYTHON  default: python3
#   CEILING      DRAM ceiling in GB/s for the table (default 4237, the H200's copy, docs/cuda.md)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OUT_PREFIX CONFIG [train_bench ARGS...]" >&2; exit 2; }
out=$1 cfg=$2
shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread
metrics+=,launch__block_size,sm__warps_active.avg.pct_of_peak_sustained_active
metrics+=,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active
metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed
"${NCU:-ncu}" --clock-control none --metrics "$metrics" --csv --page raw \
    "${TRAIN_BENCH:-train_bench}" --config "$cfg" --device cuda --steps 1 --warmup 0 "$@" >"$out.csv"
"${PYTHON:-python3}" "$here/ncu_table.py" --ceiling "${CEILING:-4237}" "$out.csv" | tee "$out.md"
