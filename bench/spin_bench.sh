#!/usr/bin/env bash
# bench/spin_bench.sh: how long should an idle OpenMP thread spin before it
# sleeps? libgomp's GOMP_SPINCOUNT (spins; its manual reckons 100,000 a
# millisecond, build/fork_bench measures what a count outlasts; 0 = sleep at
# once, which OMP_WAIT_POLICY=PASSIVE means) against the wake-up of a
# sleeping thread at every parallel region and barrier. A training step of
# tiny_mamba at d_model 128 forks 247 regions, some a few microseconds apart.
#
#   bench/spin_bench.sh [-r ROUNDS] [-s STEPS] [-c SPINS] [-b] [CONFIG [--set ...]]
#     default: 5 rounds, 10 timed steps, spins 0,2000,5000,20000,
#              configs/tiny_mamba.ini with precision = bf16
#     -b  also measure each setting beside a busy neighbour: another
#         train_bench (tiny_gdn, 2 threads, PASSIVE) running the whole time,
#         as when a build or a second run shares the machine
#
# Every setting runs once per round, in turn, so that a change in the
# machine's load hits all of them alike; each figure is the median over the
# rounds of train_bench's step time (itself the median of STEPS steps), and
# the CPU time per step. Prints the machine, the threads and the load.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=5
STEPS=10
SPINS=0,2000,5000,20000
BUSY=0
while getopts "r:s:c:b" opt; do
    case $opt in
        r) ROUNDS=$OPTARG ;;
        s) STEPS=$OPTARG ;;
        c) SPINS=$OPTARG ;;
        b) BUSY=1 ;;
        *) echo "usage: $0 [-r ROUNDS] [-s STEPS] [-c SPINS] [-b] [CONFIG [--set ...]]" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if [ $# -gt 0 ]; then ARGS=(--config "$@"); else ARGS=(--config configs/tiny_mamba.ini --set train.precision=bf16); fi
BIN=build/train_bench
[ -x "$BIN" ] || { echo "spin_bench: $BIN missing: cmake --build build" >&2; exit 1; }
IFS=, read -r -a SLIST <<<"$SPINS"
THREADS=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=PASSIVE   # PASSIVE: 0 spins unless GOMP_SPINCOUNT says otherwise
tmp=$(mktemp -d)
neighbour=""
cleanup() {
    [ -n "$neighbour" ] && kill "$neighbour" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

run_all() {  # run_all TAG
    for ((r = 0; r < ROUNDS; r++)); do
        for s in "${SLIST[@]}"; do
            if ! GOMP_SPINCOUNT=$s "$BIN" "${ARGS[@]}" --steps "$STEPS" >"$tmp/out.txt" 2>&1; then
                echo "spin_bench: train_bench ${ARGS[*]} failed:" >&2
                tail -3 "$tmp/out.txt" >&2
                exit 1
            fi
            grep '^RESULT' "$tmp/out.txt" >>"$tmp/$1-$s.txt"
        done
    done
}

echo "spin_bench: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $THREADS threads, ${ARGS[*]}"
echo "$ROUNDS rounds of $STEPS timed steps, the settings alternating; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
run_all idle
if [ "$BUSY" = 1 ]; then
    "$BIN" --config configs/tiny_gdn.ini --steps 100000 >/dev/null 2>&1 &
    neighbour=$!
    sleep 3
    run_all busy
    kill "$neighbour" 2>/dev/null || true
    neighbour=""
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| GOMP_SPINCOUNT | alone: step ms | CPU ms | step vs the first |$([ "$BUSY" = 1 ] && echo ' beside a busy neighbour: step ms | CPU ms | step vs the first |')"
echo "| ---: | ---: | ---: | ---: |$([ "$BUSY" = 1 ] && echo ' ---: | ---: | ---: |')"
source bench/bench_lib.sh   # field
fmed() { field "$1" "$(cat "$2")" | median; }   # fmed NAME FILE -> the median of NAME over FILE's RESULT lines
base_idle=$(fmed step_ms "$tmp/idle-${SLIST[0]}.txt")
[ "$BUSY" = 1 ] && base_busy=$(fmed step_ms "$tmp/busy-${SLIST[0]}.txt")
for s in "${SLIST[@]}"; do
    st=$(fmed step_ms "$tmp/idle-$s.txt")
    line="| $s | $st | $(fmed cpu_ms "$tmp/idle-$s.txt") | $(awk -v a="$st" -v b="$base_idle" 'BEGIN { printf "%.2f", a / b }') |"
    if [ "$BUSY" = 1 ]; then
        sb=$(fmed step_ms "$tmp/busy-$s.txt")
        line="$line $sb | $(fmed cpu_ms "$tmp/busy-$s.txt") | $(awk -v a="$sb" -v b="$base_busy" 'BEGIN { printf "%.2f", a / b }') |"
    fi
    echo "$line"
done
