#!/usr/bin/env bash
# bench/run_all.sh: build (float32, build/), run the benchmark suite and write
# its data (the .tsv files, the raw output), plots (.png, gnuplot) and the
# page benchmarks.md.
#
#   bench/run_all.sh            full suite (about 5-10 minutes on 2 cores), into build/bench/run_all/
#   bench/run_all.sh quick      small sizes, for checking the script itself
#   bench/run_all.sh docs       only the plots and the page, from the --out folder's data
#   bench/run_all.sh rows ROW,ROW,...
#                               only the named rows of mixer_bench (-only: a mixer, or
#                               mixer:form; e.g. gdn,gdp,gdp_nh3,mamba,mamba2), measured
#                               together into rows_train.tsv, rows_decode.tsv and rows.txt,
#                               then the plots and the page, whose section "Rows measured
#                               together" shows them beside each other (the other tables
#                               are kept from the --out folder's full run)
#   bench/run_all.sh --out docs/bench --img docs/img --page docs/benchmarks.md [MODE]
#                               the same into the committed results (replaces them)
#
# Output (--out DIR, default build/bench/run_all; the committed ones are
# docs/bench, docs/img and docs/benchmarks.md): DIR/train.tsv, decode.tsv,
# threads.tsv, run.tsv, mixer_bench.txt, threads.txt (and from the rows mode
# rows_train.tsv, rows_decode.tsv, rows.txt); the plots in the --img
# folder (default DIR); the page at --page FILE (default DIR/benchmarks.md).
# Without --out nothing under docs/ is written.
#
# Idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE, measured against ACTIVE
# in the "Threads" section). Other processes on the machine change the
# figures: the load average is recorded at the start and end of each run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${BUILD:-$ROOT/build}
# shellcheck source=bench/bench_lib.sh
. "$ROOT/bench/bench_lib.sh"
bench_opts run_all "$@"   # OUT, IMG, PAGE: --out DIR, --img DIR, --page FILE
set -- "${REST[@]+"${REST[@]}"}"
MODE=${1:-full}
ROWS=""
case $MODE in
    full|quick|docs) ;;
    rows)
        ROWS=${2:-}
        [[ $ROWS =~ ^[A-Za-z0-9_:]+(,[A-Za-z0-9_:]+)*$ ]] ||
            { echo "run_all: rows needs a list of mixer_bench rows, e.g. gdn,gdp,mamba (got '$ROWS')" >&2; exit 2; }
        shift ;;
    *) echo "run_all: unknown mode '$MODE' (full, quick, docs or rows LIST, after the --out/--img/--page options)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "run_all: unexpected argument '$2' after the mode" >&2; exit 2; }
bench_dirs run_all benchmarks.md
DATA=$OUT
DOC=$PAGE
export OMP_WAIT_POLICY=PASSIVE

if [ "$MODE" = docs ] || [ "$MODE" = rows ]; then
    for f in train.tsv decode.tsv threads.tsv run.tsv mixer_bench.txt threads.txt; do
        [ -s "$DATA/$f" ] || { echo "run_all: docs: no $DATA/$f (run the suite, or name the data with --out)" >&2; exit 1; }
    done
fi
if [ "$MODE" = rows ]; then
    echo "== build (float32) in $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j "$(nproc)" --target mixer_bench >/dev/null
    echo "== mixer_bench -only $ROWS"
    rm -rf "$DATA/rows.tmp"
    mkdir "$DATA/rows.tmp"
    "$BUILD/mixer_bench" -only "$ROWS" -tsv "$DATA/rows.tmp" | tee "$DATA/rows.tmp/rows.txt"
    mv "$DATA/rows.tmp/train.tsv" "$DATA/rows_train.tsv"
    mv "$DATA/rows.tmp/decode.tsv" "$DATA/rows_decode.tsv"
    mv "$DATA/rows.tmp/rows.txt" "$DATA/rows.txt"
    rmdir "$DATA/rows.tmp"
elif [ "$MODE" != docs ]; then
    echo "== build (float32) in $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j "$(nproc)" --target mixer_bench >/dev/null
    start=$(date +%s)
    ARGS=()
    THREADS_TOKENS=16384
    if [ "$MODE" = quick ]; then
        ARGS=(-tokens 2048 -T 256,1024,2048 -pos 256,1024,2048)
        THREADS_TOKENS=2048
    fi
    echo "== mixer_bench ${ARGS[*]:-}"
    "$BUILD/mixer_bench" -tsv "$DATA" "${ARGS[@]}" | tee "$DATA/mixer_bench.txt"
    echo "== threads_bench"
    bench/threads_bench.sh "$BUILD" "$DATA/threads.tsv" "$THREADS_TOKENS" | tee "$DATA/threads.txt"
    printf 'seconds\t%s\nthreads_tokens\t%s\n' "$(( $(date +%s) - start ))" "$THREADS_TOKENS" >"$DATA/run.tsv"
fi
# The 3:1 hybrid (3 gdn layers, then 1 attn, as tiny_hybrid.ini): its layers
# run one after another, so its cost per token and layer is the average
# (3 gdn + 1 attn) / 4 of the measured gdn (chunked) and attn (flash) rows,
# added here as derived rows "hybrid 3:1" (idempotent: old ones are dropped).
derive_hybrid() {
    local tmp
    tmp=$(mktemp)
    # train.tsv: mixer form T B best median tok/s cold_s arena_mib rss_mib status cpu
    awk -F'\t' -v OFS='\t' '
        function avg(x, y) { return (x == "" || y == "" || x !~ /^[0-9.]/ || y !~ /^[0-9.]/) ? "NaN" : sprintf("%.4f", (3 * x + y) / 4) }
        NR == 1 { print; next }
        $1 == "hybrid" { next }
        { print }
        $1 == "gdn" && $2 == "chunked" { n++; T[n] = $3; B[$3] = $4; for (c = 5; c <= 12; c++) g[$3, c] = $c }
        $1 == "attn" && $2 == "flash" { for (c = 5; c <= 12; c++) a[$3, c] = $c; have[$3] = 1 }
        END { for (i = 1; i <= n; i++) { t = T[i]; if (!have[t]) continue
                  ok = g[t, 11] == "ok" && a[t, 11] == "ok"
                  best = avg(g[t, 5], a[t, 5])
                  print "hybrid", "3:1", t, B[t], best, avg(g[t, 6], a[t, 6]), (ok ? sprintf("%.1f", 1e6 / best) : "NaN"),
                        avg(g[t, 8], a[t, 8]), avg(g[t, 9], a[t, 9]), avg(g[t, 10], a[t, 10]), (ok ? "ok" : "skipped"),
                        avg(g[t, 12], a[t, 12]) } }' "$DATA/train.tsv" >"$tmp" && mv "$tmp" "$DATA/train.tsv"
    tmp=$(mktemp)
    # decode.tsv: mixer pos best median mean how
    awk -F'\t' -v OFS='\t' '
        NR == 1 { print; next }
        $1 == "hybrid" { next }
        { print }
        $1 == "gdn" { n++; P[n] = $2; for (c = 3; c <= 5; c++) g[$2, c] = $c }
        $1 == "attn" { for (c = 3; c <= 5; c++) a[$2, c] = $c; have[$2] = 1 }
        END { for (i = 1; i <= n; i++) { p = P[i]; if (!have[p]) continue
                  printf "hybrid\t%s", p
                  for (c = 3; c <= 5; c++) printf "\t%.4f", (3 * g[p, c] + a[p, c]) / 4
                  printf "\t3 gdn + 1 attn, averaged\n" } }' "$DATA/decode.tsv" >"$tmp" && mv "$tmp" "$DATA/decode.tsv"
}
derive_hybrid
elapsed=$(awk -F'\t' '$1 == "seconds" {print $2}' "$DATA/run.tsv")
THREADS_TOKENS=$(awk -F'\t' '$1 == "threads_tokens" {print $2}' "$DATA/run.tsv")

# ---- plots ----
# plot_set TRAIN_TSV DECODE_TSV PREFIX: the five plots of a train.tsv and a
# decode.tsv, as IMG/PREFIXtrain_throughput.png, ... (PREFIX: "" for the full
# run, rows_ for the rows measured together).
plot_set() {
local train=$1 decode=$2 prefix=$3
local SERIES_TRAIN SERIES_DECODE TICS PTICS XRANGE PRANGE
SERIES_TRAIN=$(awk -F'\t' 'NR > 1 && !seen[$1 " " $2]++ {print $1 ":" $2}' "$train")
SERIES_DECODE=$(awk -F'\t' 'NR > 1 && !seen[$1]++ {print $1}' "$decode")
TICS=$(awk -F'\t' 'NR > 1 && !seen[$3]++ {printf "%s%s", (n++ ? "," : ""), $3}' "$train")
PTICS=$(awk -F'\t' 'NR > 1 && !seen[$2]++ {printf "%s%s", (n++ ? "," : ""), $2}' "$decode")
# x ranges with a margin, so that the end points and their tic labels show.
XRANGE=$(awk -F'\t' 'NR > 1 {if (lo == "" || $3 < lo) lo = $3; if ($3 > hi) hi = $3} END {print lo / 1.3 ":" hi * 1.3}' "$train")
PRANGE=$(awk -F'\t' 'NR > 1 {if (lo == "" || $2 < lo) lo = $2; if ($2 > hi) hi = $2} END {print lo / 1.3 ":" hi * 1.3}' "$decode")
gnuplot <<GP
set terminal pngcairo size 1000,600 font "DejaVu Sans,11" noenhanced
set datafile separator "\t"
set datafile missing "NaN"
set logscale x 2
set grid
set key outside right top
set xlabel "sequence length T (B*T fixed)"
set xtics ($TICS)
set xrange [$XRANGE]
trainseries = "$(echo $SERIES_TRAIN)"
decodeseries = "$(echo $SERIES_DECODE)"
mixer(s) = strstrt(s, ":") ? s[1:strstrt(s, ":")-1] : s
form(s) = s[strstrt(s, ":")+1:]
# One colour per mixer, one dash pattern per form.
$(gnuplot_colours $SERIES_DECODE $(echo "$SERIES_TRAIN" | cut -d: -f1))
dash(s) = form(s) eq "parallel" ? 2 : form(s) eq "recurrent" ? 3 : 1
# The column c of the rows of train.tsv for series s, NaN elsewhere.
pick(s, c) = (strcol(1) eq mixer(s) && strcol(2) eq form(s)) ? column(c) : NaN

set output "$IMG/${prefix}train_throughput.png"
set title "Training step (forward + backward) of one layer: throughput vs T"
set ylabel "tokens / s (log)"
set logscale y
plot for [s in trainseries] "$train" using 3:(pick(s, 7)) every ::1 \
     with linespoints lw 2 pt 7 lc rgb colour(s) dt dash(s) title s

set output "$IMG/${prefix}train_us_per_token.png"
set title "Training step of one layer: time per token vs T (wall clock, best step)"
set ylabel "microseconds / token (log)"
plot for [s in trainseries] "$train" using 3:(pick(s, 5)) every ::1 \
     with linespoints lw 2 pt 7 lc rgb colour(s) dt dash(s) title s

set output "$IMG/${prefix}train_cpu_per_token.png"
set title "Training step of one layer: CPU time (all threads) per token vs T"
plot for [s in trainseries] "$train" using 3:(pick(s, 12)) every ::1 \
     with linespoints lw 2 pt 7 lc rgb colour(s) dt dash(s) title s

set output "$IMG/${prefix}memory.png"
set title "Memory of one training step (B*T fixed): peak RSS growth"
set ylabel "MiB (log)"
plot for [s in trainseries] "$train" using 3:(pick(s, 10)) every ::1 \
     with linespoints lw 2 pt 7 lc rgb colour(s) dt dash(s) title s

set output "$IMG/${prefix}decode.png"
set title "Decoding one token (B = 1) vs context position"
set xlabel "context position P"
set xtics ($PTICS)
set xrange [$PRANGE]
set ylabel "microseconds / token (log)"
plot for [s in decodeseries] "$decode" using 2:(strcol(1) eq s ? column(3) : NaN) every ::1 \
     with linespoints lw 2 pt 7 lc rgb colour(s) title s
GP
}
echo "== plots"
plot_set "$DATA/train.tsv" "$DATA/decode.tsv" ""
[ ! -s "$DATA/rows_train.tsv" ] || plot_set "$DATA/rows_train.tsv" "$DATA/rows_decode.tsv" rows_

# ---- the page (benchmarks.md) ----
echo "== $DOC"
hdr() { sed -n "s/^$1: *//p" "${2:-$DATA/mixer_bench.txt}" | head -1 | sed 's/ (at start)$//'; }
# Markdown table from train.tsv (or the file named third), column c, printf format f.
train_table() {
    awk -F'\t' -v c="$1" -v f="$2" '
        NR == 1 { next }
        { key = $1 " | " $2; if (!(key in seen)) { seen[key] = 1; order[++n] = key }
          if (!($3 in ts)) { ts[$3] = 1; tl[++nt] = $3 }
          if ($11 == "ok") s = sprintf(f, $c)
          else if ($11 == "skip:memory") s = "skipped (> 4 GiB)"
          else if ($11 == "skip:time") s = "skipped (> 60 s)"
          else s = "-"
          v[key, $3] = s }
        END { printf "| mixer | form |"; for (i = 1; i <= nt; i++) printf " T = %s |", tl[i]; print ""
              printf "| --- | --- |"; for (i = 1; i <= nt; i++) printf " ---: |"; print ""
              for (j = 1; j <= n; j++) { printf "| %s |", order[j]
                  for (i = 1; i <= nt; i++) printf " %s |", v[order[j], tl[i]]; print "" } }' "${3:-$DATA/train.tsv}"
}
decode_table() {  # [FILE]: decode.tsv by default
    awk -F'\t' '
        NR == 1 { next }
        { if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1; how[$1] = $6 }
          if (!($2 in ps)) { ps[$2] = 1; pl[++np] = $2 }
          v[$1, $2] = sprintf("%.1f", $3) }
        END { printf "| mixer |"; for (i = 1; i <= np; i++) printf " P = %s |", pl[i]; print " cache reaches P |"
              printf "| --- |"; for (i = 1; i <= np; i++) printf " ---: |"; print " --- |"
              for (j = 1; j <= n; j++) { printf "| %s |", order[j]
                  for (i = 1; i <= np; i++) printf " %s |", v[order[j], pl[i]]; print " " how[order[j]] " |" } }' \
        "${1:-$DATA/decode.tsv}"
}
# shellcheck source=bench/run_all_rows.sh
. "$ROOT/bench/run_all_rows.sh"   # rows_section: the rows measured together
# Figures for the claims: first / last measured value of a series and their ratio.
tval() {  # tval MIXER FORM T -> us per token (best), or "NaN"
    awk -F'\t' -v m="$1" -v f="$2" -v t="$3" 'NR > 1 && $1 == m && $2 == f && $3 == t {printf "%.1f\n", $5; found = 1}
        END {if (!found) print "NaN"}' "$DATA/train.tsv"
}
tspread() {  # tspread MIXER FORM [COLUMN=5] -> max/min of us per token over the measured T
    awk -F'\t' -v m="$1" -v f="$2" -v c="${3:-5}" 'NR > 1 && $1 == m && $2 == f && $11 == "ok" {
        if (lo == "" || $c + 0 < lo) lo = $c + 0; if (hi == "" || $c + 0 > hi) hi = $c + 0 }
        END {printf "%.2f", hi / lo}' "$DATA/train.tsv"
}
tgrowth() {  # tgrowth MIXER FORM -> "last/first" ratio and the T range it spans
    awk -F'\t' -v m="$1" -v f="$2" 'NR > 1 && $1 == m && $2 == f && $11 == "ok" {
        if (first == "") { first = $5; t0 = $3 } last = $5; t1 = $3 }
        END {printf "%.1fx from T = %s to %s", last / first, t0, t1}' "$DATA/train.tsv"
}
dval() {  # dval MIXER P -> decode us per token
    awk -F'\t' -v m="$1" -v p="$2" 'NR > 1 && $1 == m && $2 == p {printf "%.1f\n", $3}' "$DATA/decode.tsv"
}
dspread() {  # dspread MIXER -> max/min decode time over P
    awk -F'\t' -v m="$1" 'NR > 1 && $1 == m { if (lo == "" || $3 + 0 < lo) lo = $3 + 0
        if (hi == "" || $3 + 0 > hi) hi = $3 + 0 } END {printf "%.2f", hi / lo}' "$DATA/decode.tsv"
}
tgrow() {  # tgrow MIXER FORM -> last/first us per token, as a number
    awk -F'\t' -v m="$1" -v f="$2" 'NR > 1 && $1 == m && $2 == f && $11 == "ok" { if (a == "") a = $5; b = $5 }
        END {printf "%.2f", b / a}' "$DATA/train.tsv"
}
thr() {  # thr POLICY THREADS COLUMN -> a figure of threads.tsv
    awk -F'\t' -v p="$1" -v n="$2" -v c="$3" 'NR > 1 && $1 == p && $2 == n {print $c}' "$DATA/threads.tsv"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
dratio() {  # dratio MIXER -> last/first decode time
    awk -F'\t' -v m="$1" 'NR > 1 && $1 == m { if (first == "") first = $3; last = $3 }
        END {printf "%.2f", last / first}' "$DATA/decode.tsv"
}
verdict() {  # verdict VALUE OP LIMIT -> "yes" / "no"
    awk -v x="$1" -v op="$2" -v l="$3" 'BEGIN {ok = op == "<=" ? x <= l : x >= l; print ok ? "**yes**" : "**no**"}'
}
# The decoding step's indexer was vectorised in 1f889dd: figures from a build
# before it get a note that says so (none when the build is unknown here).
dsa_note() {
    local c
    c=$(hdr commit | sed 's/+dirty$//')
    git cat-file -e "$c^{commit}" 2>/dev/null && git cat-file -e "1f889dd^{commit}" 2>/dev/null || return 0
    ! git merge-base --is-ancestor 1f889dd "$c" || return 0
    printf '\n%s' "   (The decoding step's indexer was a scalar loop in double when these" \
        "   figures were taken; it is vectorised now: \`dsa_decode_bench\` at 16k" \
        "   gives 0.23 ms per token for attn_dsa against 1.7 for dense attn," \
        "   [sparse_attention.md](sparse_attention.md#speed-of-one-layers-decoding).)"
}
TFIRST=$(awk -F'\t' 'NR == 2 {print $3}' "$DATA/train.tsv")
TLAST=$(awk -F'\t' 'NR > 1 {t = $3} END {print t}' "$DATA/train.tsv")
PFIRST=$(awk -F'\t' 'NR == 2 {print $2}' "$DATA/decode.tsv")
PLAST=$(awk -F'\t' 'NR > 1 {p = $2} END {print p}' "$DATA/decode.tsv")

{
cat <<EOF
# Benchmarks

Generated by
\`bench/run_all.sh --out docs/bench --img docs/img --page docs/benchmarks.md\`
(re-run it rather than edit the tables by hand; without those options it
writes under \`build/bench/run_all/\` and leaves these files alone), except
the last part of [Threads](#threads), which comes from
\`bench/spin_bench.sh\` and \`bench/region_count.sh\`. Raw output and data:
[\`docs/bench/\`](bench/); plots: [\`docs/img/\`](img/).

| | |
| --- | --- |
| CPU | $(hdr cpu) |
| kernel | $(hdr uname) |
| threads | $(hdr threads) |
| date | $(hdr date) |
| commit | $(hdr commit) |
| load average | start: $(hdr loadavg); end: $(sed -n 's/^loadavg: \(.*\) (at end).*/\1/p' "$DATA/mixer_bench.txt" | tail -1) |
| precision | $(hdr precision) |
| layer | $(hdr layer) |
| suite run time | ${elapsed} s |

The machine is shared: the load average (1, 5, 15 minutes; 2 cores) says how
many other runnable processes competed with the benchmark. With a load above
2 every figure is slower than on an idle machine, and by a varying amount;
timings are the best of 2 steps (one step when it takes over 5 s) to take
out some of that noise, not all of it. The CPU time of all threads per step
is much less sensitive to the load (a thread that waits sleeps and is not
counted): it is the better measure of the work per token, and the claims
below are checked on both.

## What is measured

One mixer **layer** as the LM uses it, built by \`mixer_create\` through the
\`MixerKind\` interface: input u (B, T, 256) -> q, k, v projections (and
short convolutions, gates, decay and beta projections where the kind has
them) -> the mixing op -> output stage and projection -> (B, T, 256). So the
per-token cost of the projections (constant in T) is included; the pure
kernel figures are in \`gdn_bench\` and \`attn_bench\`.

- **Training step**: forward, then backward seeded on the output (gradients
  into u and every parameter). B*T = $(sed -n 's/^train: *B\*T = \([0-9]*\).*/\1/p' "$DATA/mixer_bench.txt") tokens per step at every T.
- **Memory**: the growth of the process's peak resident set during the first
  training step of each cell (VmHWM reset through \`/proc/self/clear_refs\`):
  the tape arena (activations, saved state, activation gradients) plus any
  heap the kernels allocate (per-thread scratch). Inputs and parameters exist
  before the step and are not counted. The arena high-water alone is in
  \`docs/bench/train.tsv\` (column arena_mib).
- **Decoding**: B = 1, one token at a time through \`MixerKind.step\`, on
  one thread (as \`generate\` runs small models: a B = 1 step is too small
  to gain from a second thread, whose wake-up at every parallel region only
  adds jitter; \`mixer_bench -decode-threads N\` changes it); at
  context position P, the fastest of the next 64 steps (their median is in
  \`docs/bench/decode.tsv\`). attn's KV cache
  is filled directly with random keys and values up to P (stepping there
  costs O(P^2); the values do not change the work of the next step); the
  other kinds step their way to P.
- **hybrid 3:1** (the mix of \`tiny_hybrid.ini\`: 3 gdn layers, then 1 attn)
  is derived, not run: a stack's layers run one after another, so its cost
  per token and layer is (3 x gdn chunked + 1 x attn flash) / 4 of the rows
  measured above, for training time, memory and decoding alike. The whole
  hybrid LM, measured end to end, is in the PyTorch comparison
  ([cpu_perf.md](cpu_perf.md#a-training-step-against-pytorch)) and the
  training table ([training.md](training.md#results-of-the-bundled-configs)).

## Training step: microseconds per token

$(train_table 5 "%.1f")

![throughput](img/train_throughput.png)

![time per token](img/train_us_per_token.png)

## Training step: CPU microseconds per token (all threads)

$(train_table 12 "%.1f")

![CPU time per token](img/train_cpu_per_token.png)

## Memory of one training step: MiB (peak RSS growth)

$(train_table 10 "%.0f")

![memory](img/memory.png)

## Decoding: microseconds per token (B = 1)

$(decode_table)

![decode](img/decode.png)

## The claims, and what these figures say

1. **Chunked linear, mamba and gdn cost the same per token from T = $TFIRST to
   $TLAST (within 1.3x).** Spread (slowest / fastest per-token time over T),
   wall clock: linear $(tspread linear chunked), mamba $(tspread mamba chunked), gdn $(tspread gdn chunked);
   CPU time: linear $(tspread linear chunked 12), mamba $(tspread mamba chunked 12), gdn $(tspread gdn chunked 12).
   Within 1.3x (wall / CPU): linear $(verdict "$(tspread linear chunked)" "<=" 1.3) / $(verdict "$(tspread linear chunked 12)" "<=" 1.3),
   mamba $(verdict "$(tspread mamba chunked)" "<=" 1.3) / $(verdict "$(tspread mamba chunked 12)" "<=" 1.3),
   gdn $(verdict "$(tspread gdn chunked)" "<=" 1.3) / $(verdict "$(tspread gdn chunked 12)" "<=" 1.3).
   The recurrent training forms are flat too (wall spread: linear $(tspread linear recurrent),
   mamba $(tspread mamba recurrent), gdn $(tspread gdn recurrent)) and slower per token. Memory per
   step at fixed B*T is flat for all of them (O(T) per sequence: chunk-boundary states only).
2. **The masked parallel form and softmax attention grow with T.** Per-token
   time: linear parallel $(tgrowth linear parallel); attn $(tgrowth attn flash). The
   attention core's cost per token is proportional to T, the projections' is
   constant, so the ratio approaches 4x per 4x in T only once the core dominates.
   The parallel form also needs T x T scratch per thread (its memory column
   grows), so it stops at T = 4096. Grows (> 2x over the range): parallel
   $(verdict "$(tgrow linear parallel)" ">=" 2), attn $(verdict "$(tgrow attn flash)" ">=" 2). attn's memory stays flat
   (it keeps one log-sum-exp per row, never a T x T matrix).
3. **Recurrent decoding costs the same per token at any context.** Spread of
   the decoding time over P = $PFIRST..$PLAST: linear $(dspread linear), mamba $(dspread mamba), gdn $(dspread gdn)
   (flat within 1.3x: linear $(verdict "$(dspread linear)" "<=" 1.3), mamba $(verdict "$(dspread mamba)" "<=" 1.3),
   gdn $(verdict "$(dspread gdn)" "<=" 1.3)); attn, reading its whole KV cache, goes from
   $(dval attn "$PFIRST") to $(dval attn "$PLAST") us/token. At B = 1 a recurrent step is dominated by
   the five 256-wide projections (matrix-vector products), not by the 64 x 64
   state update.
4. **DeepSeek sparse attention is O(T k).** The attention itself reads k = 64
   positions per query whatever T; the indexer that picks them scores every
   earlier position with H_I d_I = 4 x 32 multiply-adds per pair (attention:
   H (dk + dv) = 512 forward), so the layer is still O(T^2) overall, with a
   quarter of attention's constant and no backward through the scores.
   Training, per token: attn_dsa $(tgrowth attn_dsa sparse), against attn
   $(tgrowth attn flash); at T = $TLAST attn_dsa takes $(tval attn_dsa sparse "$TLAST") us/token,
   attn $(tval attn flash "$TLAST"). Decoding at P = $PLAST: attn_dsa $(dval attn_dsa "$PLAST") us/token
   (x$(dratio attn_dsa) over P = $PFIRST), attn $(dval attn "$PLAST") (x$(dratio attn)). So: the
   sparse attention part is O(T k) as claimed; the layer as a whole grows with
   T through its indexer, more slowly than dense attention.$(dsa_note)$(rows_section)

## Threads

\`bench/threads_bench.sh\`: the gdn layer, chunked training step at T = 1024
(B*T = $THREADS_TOKENS; best and median of 2 timed steps) and one decoding step
at P = 1024 (B = 1, fastest of 32), under \`OMP_WAIT_POLICY\` PASSIVE and
ACTIVE, on 1 and 2 threads. Two rounds with the four settings interleaved;
each figure is the better round. Microseconds per token:

$(awk -F'\t' 'NR == 1 {print "| OMP_WAIT_POLICY | threads | train best | train median | decode |"; print "| --- | ---: | ---: | ---: | ---: |"; next}
   {printf "| %s | %s | %.1f | %.1f | %.1f |\n", $1, $2, $3, $4, $5}' "$DATA/threads.tsv")

$(sed -n 's/^loadavg at \(start\|end\): *\(.*\)/Load average at \1: \2./p' "$DATA/threads.txt")

PASSIVE lets an idle OpenMP thread sleep (futex) at once, ACTIVE keeps it
spinning; a spinning thread holds a core that another thread (of this
process, or of another job on the machine) could use, a sleeping one must be
woken at the next parallel region. Measured here, on 2 threads, ACTIVE takes
$(ratio "$(thr ACTIVE 2 3)" "$(thr PASSIVE 2 3)")x the time of PASSIVE per training step (best step; median: $(ratio "$(thr ACTIVE 2 4)" "$(thr PASSIVE 2 4)")x)
and $(ratio "$(thr ACTIVE 2 5)" "$(thr PASSIVE 2 5)")x per decoding step; on 1 thread $(ratio "$(thr ACTIVE 1 3)" "$(thr PASSIVE 1 3)")x (median $(ratio "$(thr ACTIVE 1 4)" "$(thr PASSIVE 1 4)")x) and
$(ratio "$(thr ACTIVE 1 5)" "$(thr PASSIVE 1 5)")x. Two threads against one (PASSIVE): the training step takes
$(ratio "$(thr PASSIVE 2 3)" "$(thr PASSIVE 1 3)")x the time of one thread (median $(ratio "$(thr PASSIVE 2 4)" "$(thr PASSIVE 1 4)")x), the decoding step
$(ratio "$(thr PASSIVE 2 5)" "$(thr PASSIVE 1 5)")x. With the machine loaded by other jobs, single figures move by
tens of percent between rounds; the medians are the steadier comparison. The
scripts' choice, PASSIVE, is supported by this run for training when ACTIVE
is no faster on 2 threads (median ratio >= 0.95): $(verdict "$(ratio "$(thr ACTIVE 2 4)" "$(thr PASSIVE 2 4)")" ">=" 0.95).
EOF
# The spin and region figures: measured by bench/spin_bench.sh, fork_bench and
# bench/region_count.sh, not by this suite; kept as written.
cat <<'EOF'

**A short spin before sleeping.** PASSIVE puts an idle thread to
sleep at once, so every parallel region of a step begins by waking it.
libgomp's `GOMP_SPINCOUNT` makes it spin first (libgomp's manual reckons
100,000 spins a millisecond; here 1,000 spins outlasted a 20 us gap but not
an 80 us one, below); a value set there wins over the policy's default, and every
program keeps it when it sets `OMP_WAIT_POLICY` for itself.
`bench/spin_bench.sh -r 5 -b` measured it on the Zen 4 (2 threads; median
step of 5 alternating rounds; [bench/spin_bench_zen4.txt](bench/spin_bench_zen4.txt)).
The step is tiny_mamba's bf16 step at d_model 128, B 16 x T 256: 160 ms,
and 247 parallel regions that fork both threads (370 calls of
`GOMP_parallel`, counted with an LD_PRELOAD shim, `bench/region_count.sh`;
the others have an `if` clause that keeps them on one thread). What one region costs beyond its
work, `build/fork_bench` (20 us of work per thread; 2000 regions after a
gap of serial work on the calling thread):

| setting | gap 0 us | gap 5 us | gap 20 us | gap 80 us |
| --- | ---: | ---: | ---: | ---: |
| PASSIVE (0 spins) | 64 us | 55 us | 58 us | 70 us |
| PASSIVE, GOMP_SPINCOUNT=1000 | 1.5 us | 1.6 us | 1.7 us | 30 us |
| PASSIVE, GOMP_SPINCOUNT=10000 | 1.5 us | 1.1 us | 1.1 us | 1.4 us |
| ACTIVE | 8.5 us | 1.1 us | 1.0 us | 1.5 us |

On this virtual machine a sleeping thread takes 50-70 us to wake (a second
run: 51-66 us; [bench/fork_bench_zen4.txt](bench/fork_bench_zen4.txt)), since the wake
goes through the hypervisor. 247 regions x ~60 us is about 15 ms of a
160 ms step, which matches the 13 % that spinning saves at d_model 128.

The whole step under each spin count (`spin_bench`; "busy": another
train_bench, 2 threads, PASSIVE, ran beside it the whole time):

| GOMP_SPINCOUNT | step, alone | step, beside a busy neighbour |
| ---: | ---: | ---: |
| 0 (PASSIVE) | 1.00 | 1.00 |
| 1,000 | 0.94 | 1.04 |
| 3,000 | 0.93 | 1.15 |
| 10,000 | 0.87 | 1.57 |
| 20,000 | 0.91 | 2.09 |

- Alone, up to 13 % of a short step is waking threads.
- Beside other work, a spinning thread holds a core that the thread it
  waits for needs, and the step slows by up to 2x.
- At d_model 256 (400 ms steps), 0, 1,000 and 10,000 spins gave the same
  step (1.00-1.01).

The default stays PASSIVE (0 spins): it never costs more than 13 %, and a
spin can cost 2x. On a machine of your own, `GOMP_SPINCOUNT=10000` is worth
up to 13 % on small models.

The step now forks fewer regions than when the spins were measured: a layer's projections
of one input are one node (`op_matmul_multi`: one region forward, one for
the input and weight gradients together, where each product would fork four),
a single product's backward is one region instead of three, the optimizer
updates every parameter in one region, and q's 1/sqrt(d_k) is part of its
L2 norm. Forked regions per step at d_model 128 (bf16;
`bench/region_count.sh -p bf16`, which also names where they fork), then
and now: tiny_mamba 248 -> 153, attn 172 -> 93, gdn 252 -> 149, gdn_bpe
252 -> 149, the hybrid 232 -> 135, and tiny_linear in fp32 228 -> 125. With
fewer regions, waking threads costs a step less than the spin figures above
say.
EOF
} >"$DOC"
echo "== done: $DOC, $IMG/*.png (benchmarks ran ${elapsed} s)"
