#!/usr/bin/env bash
# bench/bf16_tiles_step.sh: a training step (train_bench) with the bf16
# tile products (the attention's and the gla / GDN chunk kernels') of each
# kind ([train] bf16_tiles, tile_amx.h):
#   fp32        precision = fp32 (every product float32);
#   bf16-fp32   precision = bf16, bf16_tiles = fp32 (the attention's tiles float32,
#               the chunk products on AVX512_BF16);
#   bf16-avx512 precision = bf16, bf16_tiles = avx512bf16;
#   bf16-amx    precision = bf16, bf16_tiles = amx (skipped where it cannot run).
# ROUNDS rounds, each running every kind once in an order that rotates from
# round to round, so that load from elsewhere falls on all alike; printed:
# the median over the rounds of train_bench's CPU time per step (all threads)
# and of its wall time per step (each itself a median of STEPS steps).
#
#   bench/bf16_tiles_step.sh [BUILD_DIR=build] [ROUNDS=5] [STEPS=6] CONFIG[:SET,SET...] ...
#
# e.g. bench/bf16_tiles_step.sh build 5 6 tiny_attn.ini tiny_hybrid.ini \
#        tiny_attn.ini:model.d_model=256,model.d_k=64,model.d_v=64,model.d_ff=704
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ROUNDS=${2:-5}
STEPS=${3:-6}
shift $(($# < 3 ? $# : 3))
[ $# -gt 0 ] || set -- tiny_attn.ini
BIN=$BUILD/train_bench
[ -x "$BIN" ] || { echo "bf16_tiles_step: $BIN not built" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
KINDS=(fp32 bf16-fp32 bf16-avx512 bf16-amx)
kind_sets() {
    case $1 in
        fp32) echo "--set train.precision=fp32" ;;
        bf16-fp32) echo "--set train.precision=bf16 --set train.bf16_tiles=fp32" ;;
        bf16-avx512) echo "--set train.precision=bf16 --set train.bf16_tiles=avx512bf16" ;;
        bf16-amx) echo "--set train.precision=bf16 --set train.bf16_tiles=amx" ;;
    esac
}
echo "bf16_tiles_step: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), OMP_NUM_THREADS=${OMP_NUM_THREADS:-default}"
echo "loadavg at start: $(cat /proc/loadavg)"
for cfg in "$@"; do
    file=${cfg%%:*}
    sets=()
    if [[ $cfg == *:* ]]; then
        IFS=, read -r -a extra <<<"${cfg#*:}"
        for s in "${extra[@]}"; do sets+=(--set "$s"); done
    fi
    for ((r = 0; r < ROUNDS; r++)); do
        for ((j = 0; j < ${#KINDS[@]}; j++)); do
            k=${KINDS[$(((j + r) % ${#KINDS[@]}))]}
            # shellcheck disable=SC2046
            if ! "$BIN" --config "$file" "${sets[@]}" $(kind_sets "$k") --steps "$STEPS" >"$tmp/out" 2>&1; then
                [ $r -eq 0 ] && echo "  $k: $(tail -1 "$tmp/out")"
                continue
            fi
            grep '^RESULT' "$tmp/out" | sed "s/^/$k /" >>"$tmp/$(echo "$cfg" | tr '/:,=' '____').txt"
        done
    done
    echo "== $cfg"
    printf '%-12s %12s %12s %14s\n' kind "CPU ms/step" "wall ms/step" "attn_tiles"
    for k in "${KINDS[@]}"; do
        f=$tmp/$(echo "$cfg" | tr '/:,=' '____').txt
        grep -q "^$k " "$f" 2>/dev/null || continue
        med() { grep "^$k " "$f" | grep -o " $1=[0-9.]*" | cut -d= -f2 | sort -g |
            awk '{a[NR] = $1} END {print NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
        tiles=$(grep "^$k " "$f" | head -1 | grep -o 'attn_tiles=[a-z0-9]*' | cut -d= -f2)
        printf '%-12s %12.1f %12.1f %14s\n' "$k" "$(med cpu_ms)" "$(med step_ms)" "$tiles"
    done
done
echo "loadavg at end:   $(cat /proc/loadavg)"
