#!/usr/bin/env bash
# bench/profile_ab.sh: two train_bench builds (A, B: e.g. before and after a
# change to the ops) run by run alternating, --profile, and the medians of
# each cell's step CPU time and of each op's CPU time, A against B.
#
#   bench/profile_ab.sh -a TRAIN_BENCH_A -b TRAIN_BENCH_B [-r ROUNDS] [-t THREADS] [-p PRECISIONS]
#                       [-w WIDTH] [-T LENGTH] [-s STEPS] [-o OUT_DIR] [MIX...]
#
#   MIX          attn, gdn, mamba, linear, hybrid (configs/tiny_MIX.ini; default all five)
#   -t THREADS   comma list (default 1,2)        -p PRECISIONS  comma list (default fp32,bf16)
#   -w WIDTH     d_model 128, 256 or 512 as bench/compare_torch.sh's widths (default 256)
#   -T LENGTH    sequence length, B = 4096 / T (default 256)
#   -r ROUNDS    rounds (default 3); each round runs every cell with A, then B
#   -s STEPS     timed steps per run (default 3, after train_bench's 2 untimed)
#   -o OUT_DIR   keeps every run's output (default: a temporary folder, removed)
#
# CPU time (all threads) rather than wall time: on a shared machine a burst
# of load from elsewhere moves the wall clock more. Prints, per cell, the step
# and every op above 0.5 ms: A, B, B / A.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/bench_lib.sh   # width_sets, length_sets

A= B= ROUNDS=3 THREADS=1,2 PRECS=fp32,bf16 WIDTH=256 LEN=256 STEPS=3 OUT=
while getopts "a:b:r:t:p:w:T:s:o:" opt; do
    case $opt in
        a) A=$OPTARG ;; b) B=$OPTARG ;; r) ROUNDS=$OPTARG ;; t) THREADS=$OPTARG ;; p) PRECS=$OPTARG ;;
        w) WIDTH=$OPTARG ;; T) LEN=$OPTARG ;; s) STEPS=$OPTARG ;; o) OUT=$OPTARG ;;
        *) echo "usage: $0 -a TRAIN_BENCH_A -b TRAIN_BENCH_B [-r ROUNDS] [-t THREADS] [-p PRECISIONS] [-w WIDTH] [-T LENGTH] [-s STEPS] [-o OUT_DIR] [MIX...]" >&2
           exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ -n "$A" ] && [ -n "$B" ] || { echo "profile_ab.sh: -a and -b (two train_bench programs) are required" >&2; exit 2; }
for bin in "$A" "$B"; do [ -x "$bin" ] || { echo "profile_ab.sh: $bin is not an executable" >&2; exit 2; }; done
MIXES=("$@")
[ ${#MIXES[@]} -gt 0 ] || MIXES=(attn gdn mamba linear hybrid)
for m in "${MIXES[@]}"; do
    [ -f "configs/tiny_$m.ini" ] || { echo "profile_ab.sh: no configs/tiny_$m.ini for mix '$m'" >&2; exit 2; }
done
read -r -a sets <<<"$(width_sets "$WIDTH") $(length_sets "$LEN")"
IFS=, read -r -a TLIST <<<"$THREADS"
IFS=, read -r -a PLIST <<<"$PRECS"
if [ -z "$OUT" ]; then
    OUT=$(mktemp -d)
    trap 'rm -rf "$OUT"' EXIT
fi
mkdir -p "$OUT"

echo "A: $A   B: $B   width $WIDTH, T $LEN, $ROUNDS rounds of $STEPS steps; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
    for m in "${MIXES[@]}"; do for p in "${PLIST[@]}"; do for t in "${TLIST[@]}"; do for side in A B; do
        bin=$A; [ $side = B ] && bin=$B
        "$bin" --config "configs/tiny_$m.ini" "${sets[@]}" --set train.threads="$t" --set train.precision="$p" \
            --steps "$STEPS" --profile >"$OUT/${m}_${p}_t${t}_${side}_r$r.txt" 2>&1 ||
            { echo "profile_ab.sh: $bin failed on $m $p $t threads: see $OUT/${m}_${p}_t${t}_${side}_r$r.txt" >&2; trap - EXIT; exit 1; }
    done; done; done; done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$OUT" <<'EOF'
import collections, glob, os, re, statistics, sys
runs = collections.defaultdict(list)   # (cell, side, what) -> CPU ms per round
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.txt"))):
    cell, side, _ = os.path.basename(f)[:-4].rsplit("_", 2)
    text = open(f).read()
    m = re.search(r"cpu_ms=([\d.]+)", text)
    runs[(cell, side, "step")].append(float(m.group(1)))
    for line in text.split("op profile", 1)[1].splitlines():
        p = line.split()
        if len(p) == 8 and p[0] not in ("op", "all"):
            runs[(cell, side, p[0])].append(float(p[6]))
cells = sorted({k[0] for k in runs})
print("CPU ms per step, median of the rounds: A, B, B / A")
for c in cells:
    print(c)
    whats = sorted({k[2] for k in runs if k[0] == c}, key=lambda w: (w != "step", -statistics.median(runs[(c, "A", w)] or [0])))
    for w in whats:
        a, b = runs.get((c, "A", w)), runs.get((c, "B", w))
        if not a or not b or (w != "step" and statistics.median(a) < 0.5):
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"  {w:<16} {ma:9.2f} {mb:9.2f}  {mb / ma:.3f}")
EOF
