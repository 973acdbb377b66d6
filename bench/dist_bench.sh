#!/usr/bin/env bash
# bench/dist_bench.sh: data-parallel layouts on this machine (not a test).
#
#   bench/dist_bench.sh [--out DIR] [BUILD_DIR=build] [OUT_TSV=DIR/dist.tsv] [ROUNDS=3] [STEPS=12]
#
# DIR defaults to BUILD_DIR/bench/dist_bench: without --out or an OUT_TSV
# nothing under docs/ is written. `bench/dist_bench.sh --out docs/bench`
# replaces the committed docs/bench/dist.tsv; an OUT_TSV names the file
# itself (then --out is not needed, and not allowed).
#
# For tiny_gdn and tiny_hybrid: 1 rank x 2 threads, 2 ranks x 1 thread, and
# 2 ranks x 1 thread with ZeRO-1 (build/dist_bench: tokens/s of the real
# training step, the reduction alone, its time left after the backward: from
# the end of the last rank's backward to the last rank's reduced gradient;
# rank 0's own wait also holds waiting for a slower rank).
# Every bundled tiny config also once as 1 rank x 1 thread (the
# compute time per step of one core, for bench/dist_model.py). The layouts
# of a round run one after the other and the rounds repeat, so that a change
# in the machine's load hits all of them alike; the summary takes the median
# over the rounds. Writes every RESULT line (with the load average) to OUT_TSV.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/bench_lib.sh
. bench/bench_lib.sh
bench_opts dist_bench "$@"   # OUT: --out DIR (default BUILD_DIR/bench/dist_bench)
set -- "${REST[@]+"${REST[@]}"}"
[ -z "$IMG" ] && [ -z "$PAGE" ] || { echo "dist_bench.sh: --img, --page: this script writes no plots and no page" >&2; exit 2; }
[ $# -le 4 ] || { echo "dist_bench.sh: unexpected argument '$5' (BUILD_DIR OUT_TSV ROUNDS STEPS at most)" >&2; exit 2; }
BUILD=${1:-build}
TSV=${2:-}
ROUNDS=${3:-3}
STEPS=${4:-12}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "dist_bench.sh: ROUNDS '$ROUNDS' is not a positive integer" >&2; exit 2; }
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || { echo "dist_bench.sh: STEPS '$STEPS' is not a positive integer" >&2; exit 2; }
[ -z "$TSV" ] || [ -z "$OUT" ] || { echo "dist_bench.sh: --out $OUT and OUT_TSV $TSV both name where to write: give one" >&2; exit 2; }
BIN=$BUILD/dist_bench
[ -x "$BIN" ] || { echo "dist_bench.sh: $BIN not built" >&2; exit 1; }
if [ -z "$TSV" ]; then
    bench_dirs dist_bench
    TSV=$OUT/dist.tsv
fi
mkdir -p "$(dirname "$TSV")"
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" -ne 0 ] || MPIRUN+=(--allow-run-as-root)
export OMP_WAIT_POLICY=PASSIVE
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() {   # run LABEL CONFIG "DIST_BENCH ARGS" COMMAND PREFIX...
    local label=$1 config=$2 extra=$3 line
    shift 3
    # shellcheck disable=SC2086
    line=$("$@" "$BIN" --config "$config" --steps "$STEPS" $extra 2>"$tmp/err" | grep '^RESULT') ||
        { echo "dist_bench.sh: $label $config failed:" >&2; cat "$tmp/err" >&2; exit 1; }
    echo "$label ${line#RESULT }" | tee -a "$tmp/results"
}

echo "dist_bench.sh: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
echo "loadavg at start: $(cat /proc/loadavg)"
for config in tiny_gdn.ini tiny_attn.ini tiny_mamba.ini tiny_linear.ini tiny_hybrid.ini; do
    run 1x1 "$config" "" env OMP_NUM_THREADS=1
done
for round in $(seq "$ROUNDS"); do
    for config in tiny_gdn.ini tiny_hybrid.ini; do
        run 1x2 "$config" "" env OMP_NUM_THREADS=2
        run 2x1 "$config" "" env OMP_NUM_THREADS=1 "${MPIRUN[@]}" --bind-to core -np 2
        run 2x1z "$config" "--set train.zero=1" env OMP_NUM_THREADS=1 "${MPIRUN[@]}" --bind-to core -np 2
    done
done
echo "loadavg at end:   $(cat /proc/loadavg)"

# The TSV: one row per run, the RESULT fields as columns.
{
    printf 'layout'
    head -1 "$tmp/results" | tr ' ' '\n' | tail -n +2 | cut -d= -f1 | sed 's/^/\t/' | tr -d '\n'
    printf '\n'
    while read -r label rest; do
        printf '%s' "$label"
        echo "$rest" | tr ' ' '\n' | cut -d= -f2 | sed 's/^/\t/' | tr -d '\n'
        printf '\n'
    done <"$tmp/results"
} >"$TSV"
echo "wrote $TSV"

# Medians over the rounds, per config and layout.
python3 - "$TSV" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter='\t'))
print("| config | layout | tokens/s | step ms | reduction alone ms | left after the backward ms | hidden | rank 0 waited ms | all-gather ms | optimizer state MB/rank | load |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for cfg in ("tiny_gdn.ini", "tiny_hybrid.ini"):
    for lay in ("1x2", "2x1", "2x1z"):
        rs = [r for r in rows if r["config"] == cfg and r["layout"] == lay]
        if not rs:
            continue
        med = lambda k: statistics.median(float(r[k]) for r in rs)
        name = {"1x2": "1 rank x 2 threads", "2x1": "2 ranks x 1 thread", "2x1z": "2 ranks x 1 thread, ZeRO-1"}[lay]
        hidden = "" if lay == "1x2" else "%.0f%%" % (100 * max(0.0, med("hidden")))
        comm = "" if lay == "1x2" else "%.1f" % med("comm_ms")
        wait = "" if lay == "1x2" else "%.1f" % med("exposed_ms")
        waited = "" if lay == "1x2" else "%.1f" % med("waited_ms")
        gath = "%.1f" % med("allgather_ms") if lay == "2x1z" else ""
        print("| %s | %s | %.0f | %.0f | %s | %s | %s | %s | %s | %.2f | %.1f |" % (
            cfg[:-4], name, med("tokens_per_s"), med("step_ms"), comm, wait, hidden, waited, gath,
            med("opt_state_mb"), med("load")))
PY
