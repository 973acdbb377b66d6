#!/usr/bin/env bash
# bench/linear_share.sh: validation bits per byte against the share of
# linear-family layers, at equal budgets.
#
# Trains the seven configs of configs/share/ (8 layers of the same shape, the
# same data, batches, schedule, seed and step count; only the layer pattern
# differs) with build/train (float32), collects each run's final validation
# loss and bits per byte, parameter count, training tokens/s and wall time into
# DIR/linear_share.tsv (one row per config; the validation curve of each run
# in DIR/linear_share_curves.tsv), and writes from them the page
# linear_share.md, linear_share.png (val bpb vs linear share) and
# linear_share_curves.png (val bpb vs step).
#
# Where (the same options as the other bench scripts, in any order here):
# --out DIR (default build/bench/linear_share) holds the TSVs, --img DIR the
# plots (default DIR), --page FILE the page (default DIR/linear_share.md).
# Without them nothing under docs/ is written; the committed results are
#   bench/linear_share.sh --out docs/bench --img docs/img --page docs/linear_share.md [OPTIONS]
#
#   bench/linear_share.sh                    the sweep: 7 runs, one after the other
#   bench/linear_share.sh --steps 20         override train.steps (warm-up scaled in proportion):
#                                            a smoke run, marked as such in the document
#   bench/linear_share.sh --only all_gdn     train only these configs (repeatable, or a comma
#                                            list); the other rows are kept from the TSV
#   bench/linear_share.sh --docs             only the plots and the page, from the --out folder's TSVs
#   bench/linear_share.sh --seed 2           the sweep with another seed (train.seed: weights
#                                            and batch order); its rows go to
#                                            DIR/linear_share_seeds.tsv (name, seed,
#                                            val loss, bits/byte, ...) and the document gains a
#                                            seed-spread table; the main table stays the
#                                            configs' own seed
#
# Runs go to runs/share/<name>/ (checkpoint, metrics.jsonl, loss.png) with the
# train output in runs/share/<name>.log. Idle OpenMP threads sleep
# (OMP_WAIT_POLICY=PASSIVE, as in every script here); OPENBLAS_CORETYPE is
# passed through from the environment and recorded. The machine, the commit
# and the load average at the start and end of each run are recorded: other
# processes on the machine slow the runs (tokens/s, wall time) but do not
# change the losses (a run does the same arithmetic whatever the load).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${BUILD:-$ROOT/build}
# shellcheck source=bench/bench_lib.sh
. "$ROOT/bench/bench_lib.sh"
RUNS=runs/share
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

# The sweep, in order of linear share. name : label used in tables and plots.
NAMES=(all_attn gdn_1to1 gdn_3to1 gdn_7to1 all_gdn all_mamba all_linear)
label() {
    case $1 in
        all_attn) echo "all-attn" ;; gdn_1to1) echo "1:1" ;; gdn_3to1) echo "3:1" ;;
        gdn_7to1) echo "7:1" ;; all_gdn) echo "all-gdn" ;; all_mamba) echo "all-mamba" ;;
        all_linear) echo "all-linear" ;; *) echo "$1" ;;
    esac
}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

OUT="" IMG="" PAGE=""
STEPS=""
SEED=""
ONLY=()
DOCS_ONLY=0
while [ $# -gt 0 ]; do
    case $1 in
        --steps) [ $# -ge 2 ] || { echo "linear_share: --steps needs a number" >&2; exit 2; }
                 STEPS=$2; shift 2
                 [[ $STEPS =~ ^[1-9][0-9]*$ ]] || { echo "linear_share: --steps '$STEPS' is not a positive integer" >&2; exit 2; } ;;
        --only)  [ $# -ge 2 ] || { echo "linear_share: --only needs a config name" >&2; exit 2; }
                 IFS=, read -r -a more <<<"$2"; ONLY+=("${more[@]}"); shift 2 ;;
        --docs)  DOCS_ONLY=1; shift ;;
        --seed)  [ $# -ge 2 ] || { echo "linear_share: --seed needs a number" >&2; exit 2; }
                 SEED=$2; shift 2
                 [[ $SEED =~ ^[0-9]+$ ]] || { echo "linear_share: --seed '$SEED' is not a non-negative integer" >&2; exit 2; } ;;
        --out|--img|--page)
                 [ $# -ge 2 ] || { echo "linear_share: $1 needs a $([ "$1" = --page ] && echo file || echo folder)" >&2; exit 2; }
                 case $1 in --out) OUT=$2 ;; --img) IMG=$2 ;; --page) PAGE=$2 ;; esac; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "linear_share: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for n in "${ONLY[@]}"; do
    [ -f "configs/share/$n.ini" ] || { echo "linear_share: --only $n: no configs/share/$n.ini (names: ${NAMES[*]})" >&2; exit 2; }
done
[ ${#ONLY[@]} -gt 0 ] && RUN_NAMES=("${ONLY[@]}") || RUN_NAMES=("${NAMES[@]}")
bench_dirs linear_share linear_share.md   # OUT, IMG, PAGE made absolute (defaults under $BUILD/bench/linear_share)
DATA=$OUT
TSV=$DATA/linear_share.tsv
CURVES=$DATA/linear_share_curves.tsv
SEEDS_TSV=$DATA/linear_share_seeds.tsv
DOC=$PAGE

# ini NAME KEY -> the value of KEY in configs/share/NAME.ini (first match).
ini() { sed -n "s/^$2 *= *//p" "configs/share/$1.ini" | head -1; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
commit() {  # short hash, "+dirty" for uncommitted changes to tracked files outside docs/ (as mixer_bench)
    local c
    c=$(git rev-parse --short HEAD 2>/dev/null) || { echo unknown; return; }
    [ -n "$(git status --porcelain --untracked-files=no -- . ':!docs' 2>/dev/null)" ] && c="$c+dirty"
    echo "$c"
}
HEADER="name	label	layers	share	params	steps	config_steps	tokens	val_loss	val_bpb	tok_per_s	wall_s	threads	precision	date	commit	load_start	load_end	openblas_coretype	cpu"

if [ "$DOCS_ONLY" = 0 ]; then
    echo "== build (float32) in $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j "$(nproc)" --target train >/dev/null
    built=$(commit)   # the tree the binary was built from (later commits do not change it)
    scripts/get_corpus.sh
    mkdir -p "$RUNS"
    [ -s "$TSV" ] || printf '%s\n' "$HEADER" >"$TSV"
    [ -s "$CURVES" ] || printf 'name\tstep\tval_loss\tval_bpb\n' >"$CURVES"
    cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
    [ -z "$SEED" ] || [ -s "$SEEDS_TSV" ] || printf 'name\tseed\tsteps\tval_loss\tval_bpb\ttok_per_s\twall_s\tdate\tcommit\n' >"$SEEDS_TSV"
    for name in "${RUN_NAMES[@]}"; do
        cfg=configs/share/$name.ini
        cfg_steps=$(ini "$name" steps)
        if [ -n "$SEED" ]; then
            run=$RUNS/seed$SEED/$name
            mkdir -p "$RUNS/seed$SEED"
            args=(--config "$cfg" --set "train.run_dir=$run" --set "train.seed=$SEED")
        else
            run=$RUNS/$name
            args=(--config "$cfg" --set "train.run_dir=$run")
        fi
        args+=(--overwrite)
        # the configs' warm-up is a fraction of the steps, so the schedule keeps its shape
        [ -z "$STEPS" ] || args+=(--set "train.steps=$STEPS")
        date=$(date -u '+%Y-%m-%d %H:%M:%S')
        load0=$(loadavg)
        echo "== $name ($(ini "$name" layers)) ${STEPS:+steps $STEPS }${SEED:+seed $SEED }| load $load0 | log $run.log"
        t0=$(date +%s.%N)
        if ! "$BUILD/train" "${args[@]}" >"$run.log" 2>&1; then
            echo "linear_share: $name failed, see $run.log:" >&2
            tail -5 "$run.log" >&2
            exit 1
        fi
        wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
        load1=$(loadavg)
        m=$run/metrics.jsonl
        num() { sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p"; }   # num KEY < json lines -> values
        start=$(grep '"type":"start"' "$m" | tail -1)
        end=$(grep '"type":"end"' "$m" | tail -1)
        [ -n "$end" ] || { echo "linear_share: $name: no end record in $m" >&2; exit 1; }
        params=$(num params <<<"$start")
        threads=$(num threads <<<"$start")
        precision=$(sed -n 's/.*"precision":"\([^"]*\)".*/\1/p' <<<"$start")
        steps=$(num step <<<"$end")
        vl=$(num val_loss <<<"$end")
        bpb=$(num val_bpb <<<"$end")
        # tokens/s: the median over the run's training steps
        tps=$(grep '"type":"train"' "$m" | num tok_per_s | sort -g | awk '{a[NR] = $1} END {printf "%.0f", a[int((NR + 1) / 2)]}')
        B=$(ini "$name" batch_size); T=$(ini "$name" seq_len)
        layers=$(ini "$name" layers)
        share=$(awk -v l="$layers" 'BEGIN {n = split(l, a, ","); k = 0; for (i = 1; i <= n; i++) k += (a[i] != "attn"); printf "%.4f", k / n}')
        if [ -n "$SEED" ]; then   # another seed: its own table, keyed by (name, seed)
            row="$name	$SEED	$steps	$vl	$bpb	$tps	$wall	$date	$built"
            { head -1 "$SEEDS_TSV"; awk -F'\t' -v n="$name" -v s="$SEED" 'NR > 1 && !($1 == n && $2 == s)' "$SEEDS_TSV"
              printf '%s\n' "$row"; } >"$SEEDS_TSV.tmp"
            mv "$SEEDS_TSV.tmp" "$SEEDS_TSV"
            printf '   %s steps, seed %s: val %.4f nats/byte = %.4f bits/byte | %s tok/s | %s s\n' \
                "$steps" "$SEED" "$vl" "$bpb" "$tps" "$wall"
            continue
        fi
        row="$name	$(label "$name")	$layers	$share	$params	$steps	$cfg_steps	$((steps * B * T))	$vl	$bpb	$tps	$wall	$threads	$precision	$date	$built	$load0	$load1	${OPENBLAS_CORETYPE:-unset}	$cpu"
        { head -1 "$TSV"; awk -F'\t' -v n="$name" 'NR > 1 && $1 != n' "$TSV"; printf '%s\n' "$row"; } >"$TSV.tmp"
        mv "$TSV.tmp" "$TSV"
        { head -1 "$CURVES"; awk -F'\t' -v n="$name" 'NR > 1 && $1 != n' "$CURVES"
          grep '"type":"eval"' "$m" | while read -r e; do
              printf '%s\t%s\t%s\t%s\n' "$name" "$(num step <<<"$e")" "$(num val_loss <<<"$e")" "$(num val_bpb <<<"$e")"
          done; } >"$CURVES.tmp"
        mv "$CURVES.tmp" "$CURVES"
        printf '   %s steps: val %.4f nats/byte = %.4f bits/byte | %s params | %s tok/s | %s s\n' \
            "$steps" "$vl" "$bpb" "$params" "$tps" "$wall"
    done
fi
if [ ! -s "$TSV" ] || [ "$(wc -l <"$TSV")" -le 1 ]; then
    echo "linear_share: no results in $TSV: run the sweep first, or name its folder with --out" >&2
    exit 1
fi

# The rows in sweep order (config names not in NAMES after them), in a temp file.
ORDERED=$(mktemp)
trap 'rm -f "$ORDERED"' EXIT
{ for n in "${NAMES[@]}"; do awk -F'\t' -v n="$n" 'NR > 1 && $1 == n' "$TSV"; done
  awk -F'\t' -v known=" ${NAMES[*]} " 'NR > 1 && index(known, " " $1 " ") == 0' "$TSV"; } >"$ORDERED"
col() {  # col NAME COLUMN -> that field of NAME's row, or empty
    awk -F'\t' -v n="$1" -v c="$2" '$1 == n {print $c}' "$ORDERED"
}
has() { [ -n "$(col "$1" 1)" ]; }

# ---- plots ----
echo "== plots"
gnuplot <<GP
set terminal pngcairo size 1000,600 font "DejaVu Sans,11" noenhanced
set datafile separator "\t"
set grid
set output "$IMG/linear_share.png"
set title "Validation bits/byte vs the share of linear-family layers (8 layers, equal budget)"
set xlabel "linear share (linear-family layers / all layers)" offset 0,-0.6
set bmargin 5
set ylabel "validation bits per byte (lower is better)"
set xrange [-0.08:1.12]
set offsets 0, 0, graph 0.08, graph 0.08
set xtics ("0\nall-attn" 0, "1/2\n1:1" 0.5, "3/4\n3:1" 0.75, "7/8\n7:1" 0.875, "1\nall" 1)
set key outside right top
gdn(n) = n eq "all_attn" || n eq "gdn_1to1" || n eq "gdn_3to1" || n eq "gdn_7to1" || n eq "all_gdn"
plot "$ORDERED" using 4:(gdn(strcol(1)) ? \$10 : NaN) with linespoints lw 2 pt 7 ps 1.3 lc rgb "#d62728" title "gdn : attn", \
     "$ORDERED" using 4:(strcol(1) eq "all_mamba" ? \$10 : NaN) with points pt 5 ps 1.6 lc rgb "#2ca02c" title "all-mamba", \
     "$ORDERED" using 4:(strcol(1) eq "all_linear" ? \$10 : NaN) with points pt 9 ps 1.8 lc rgb "#1f77b4" title "all-linear", \
     "$ORDERED" using 4:10:(sprintf("%s %.4f", strcol(2), \$10)) with labels left offset 1.2,0 font ",9" notitle

set output "$IMG/linear_share_curves.png"
set title "Validation bits/byte during training (same batches, same validation windows)"
set xlabel "step"
set autoscale x
set xtics autofreq
set offsets 0, 0, 0, 0
set xlabel offset 0,0
set bmargin
set key top right
colour(n) = n eq "all_attn" ? "#000000" : n eq "gdn_1to1" ? "#ff9896" : n eq "gdn_3to1" ? "#e377c2" : \
            n eq "gdn_7to1" ? "#9467bd" : n eq "all_gdn" ? "#d62728" : n eq "all_mamba" ? "#2ca02c" : "#1f77b4"
names = "$(cut -f1 "$ORDERED" | tr '\n' ' ')"
labels = "$(cut -f2 "$ORDERED" | tr '\n' ' ')"
plot for [i = 1:words(names)] "$CURVES" using 2:(strcol(1) eq word(names, i) ? \$4 : NaN) every ::1 \
     with linespoints lw 2 pt 7 ps 0.8 lc rgb colour(word(names, i)) title word(labels, i)
GP

# ---- the page (linear_share.md) ----
echo "== $DOC"
uniq_col() { cut -f"$1" "$ORDERED" | sort -u | paste -sd, - | sed 's/,/, /g'; }
nrows=$(wc -l <"$ORDERED")
smoke=$(awk -F'\t' '$6 < 100 {n++} END {print n + 0}' "$ORDERED")
overridden=$(awk -F'\t' '$6 != $7 {n++} END {print n + 0}' "$ORDERED")
nsteps=$(cut -f6 "$ORDERED" | sort -u | wc -l)
first_date=$(cut -f15 "$ORDERED" | sort | head -1)
last_date=$(cut -f15 "$ORDERED" | sort | tail -1)
sweep_s=$(awk -F'\t' '{s += $12} END {printf "%.0f", s}' "$ORDERED")
th() { awk -v x="$1" 'BEGIN { s = sprintf("%d", x); while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]($|,)/, ",&", s); print s }'; }
passes() {  # ", X of one pass over the training text" when the corpus is here to measure
    local f
    f=$(ini all_attn corpus)
    case $f in /*) ;; *) f=configs/share/$f ;; esac   # a config's relative paths are from its own folder
    [ -s "$f" ] || return 0
    awk -v b="$(head -1 "$ORDERED" | cut -f8)" -v n="$(wc -c <"$f")" -v v="$(ini all_attn val_fraction)" \
        'BEGIN {printf ", %.2f of one pass over the training text", b / (n * (1 - v))}'
}
warmup_pct() {  # the warm-up as a percentage of the steps: warmup_fraction, or the older warmup_steps
    local fr
    fr=$(ini all_attn warmup_fraction)
    if [ -n "$fr" ]; then awk -v f="$fr" 'BEGIN {printf "%g", 100 * f}'
    else awk -v w="$(ini all_attn warmup_steps)" -v n="$(ini all_attn steps)" 'BEGIN {printf "%g", 100 * w / n}'; fi
}
fmt_s() { awk -v s="$1" 'BEGIN {s = int(s + 0.5); printf "%dm%02ds", s / 60, s % 60}'; }
B=$(ini all_attn batch_size); T=$(ini all_attn seq_len)
steps_list=$(uniq_col 6)
ref_bpb=$(col all_attn 10)

results_table() {
    echo "| config | layers | linear share | parameters | steps | val loss (nats/byte) | val bits/byte | vs all-attn (bits/byte) | train tokens/s | wall time | load average start / end |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    awk -F'\t' -v ref="$ref_bpb" '
        function th(x,   s) { s = sprintf("%d", x); while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]($|,)/, ",&", s); return s }
        { d = ref == "" ? "-" : ($1 == "all_attn" ? "0" : sprintf("%+.4f", $10 - ref))
          s = int($12 + 0.5)
          printf "| %s (`%s`) | %s | %.3f | %s | %d | %.4f | %.4f | %s | %s | %dm%02ds | %s / %s |\n",
                 $2, $1, $3, $4, th($5), $6, $9, $10, d, th($11), s / 60, s % 60, $17, $18 }' "$ORDERED"
}

# The reading: figures computed from the gdn : attn family (share 0 .. 1).
FAM=(all_attn gdn_1to1 gdn_3to1 gdn_7to1 all_gdn)
fam_have=1
for n in "${FAM[@]}"; do has "$n" || fam_have=0; done
reading() {
    if [ "$fam_have" = 0 ]; then
        echo "The gdn : attn family is incomplete in this data (missing: $(for n in "${FAM[@]}"; do has "$n" || printf '%s ' "$n"; done)): no reading."
        return
    fi
    local b0 b1 b2 b3 b4
    b0=$(col all_attn 10); b1=$(col gdn_1to1 10); b2=$(col gdn_3to1 10); b3=$(col gdn_7to1 10); b4=$(col all_gdn 10)
    awk -v b0="$b0" -v b1="$b1" -v b2="$b2" -v b3="$b3" -v b4="$b4" \
        -v bm="$(col all_mamba 10)" -v bl="$(col all_linear 10)" -v smoke="$smoke" 'BEGIN {
        split("all-attn 1:1 3:1 7:1 all-gdn", lab, " "); split("0 0.5 0.75 0.875 1", s, " ")
        b[1] = b0; b[2] = b1; b[3] = b2; b[4] = b3; b[5] = b4
        up = 0; for (i = 2; i <= 5; i++) up += (b[i] > b[i - 1])
        best = 1; worst = 1
        for (i = 2; i <= 5; i++) { if (b[i] < b[best]) best = i; if (b[i] > b[worst]) worst = i }
        printf "**Along gdn : attn (linear share 0, 1/2, 3/4, 7/8, 1)** the validation bits per byte are "
        for (i = 1; i <= 5; i++) printf "%.4f%s", b[i], i < 5 ? ", " : ".\n"
        printf "Best: %s (%.4f), worst: %s (%.4f), a spread of %.4f bits/byte (%.1f%%). ", lab[best], b[best], lab[worst], b[worst],
               b[worst] - b[best], 100 * (b[worst] - b[best]) / b[best]
        printf "Going up the share, the loss rises at %d of the 4 steps.\n\n", up
        mono = up == 4
        lo = (b[2] - b[1]) / 0.5; hi = (b[5] - b[3]) / 0.25
        printf "- *Quality falls as the linear share rises* (bits/byte never decrease from share 0 to 1): **%s**. ", mono ? "yes" : "no"
        printf "All-gdn against all-attn: %+.4f bits/byte.\n", b[5] - b[1]
        printf "- *Slowly at low shares* (the loss rises less per unit of share from 0 to 1/2 than from 3/4 to 1): "
        if (lo <= 0)
            printf "**not so here**: from all-attn to 1:1 the loss does not rise at all but changes by %+.4f bits/byte (%+.4f per unit share; from 3/4 to 1: %+.4f).\n", b[2] - b[1], lo, hi
        else
            printf "%+.4f against %+.4f bits/byte per unit share: **%s**.\n", lo, hi, lo < hi ? "yes" : "no"
        if (best == 1) note = "no hybrid beats pure attention here."
        else if (best == 5) note = "no hybrid beats pure gdn here."
        else note = sprintf("a hybrid beats both pure ends here, by %.4f bits/byte against the better end.", (b[1] < b[5] ? b[1] : b[5]) - b[best])
        printf "- Best mix: %s; %s\n", lab[best], note
        if (bm != "" || bl != "") {
            printf "- At share 1, by linear family: gdn %.4f", b[5]
            if (bm != "") printf ", mamba %.4f", bm
            if (bl != "") printf ", plain linear %.4f", bl
            printf " bits/byte"
            if (bl != "") printf "; plain linear attention against all-attn: %+.4f", bl - b[1]
            printf ".\n"
        }
        if (smoke > 0) printf "\n*Smoke-run data: these figures only check the script and say nothing about the mixers.*\n"
    }'
}

# The seeds of linear_share_seeds.tsv run with the main table's step count.
other_seeds() {
    [ -s "$SEEDS_TSV" ] || return 0
    awk -F'\t' -v steps="$(head -1 "$ORDERED" | cut -f6)" 'NR > 1 && $3 == steps {print $2}' "$SEEDS_TSV" |
        sort -un | paste -sd' ' -
}
# Seed spread: every config's bits/byte at the configs' own seed (main table)
# and at each seed of linear_share_seeds.tsv with the same step count.
seed_spread() {
    local seeds
    seeds=$(other_seeds)
    [ -n "$seeds" ] || return 0
    echo "### Seed spread"
    echo
    echo "The same sweep with other seeds (\`--seed\`: other initial weights and batch order; the validation windows are the same):"
    echo
    printf '| config | seed %s |' "$(ini all_attn seed)"
    for sd in $seeds; do printf ' seed %s |' "$sd"; done
    echo ' mean | max - min |'
    printf '| --- | ---: |'
    for sd in $seeds; do printf ' ---: |'; done
    echo ' ---: | ---: |'
    awk -F'\t' -v seeds="$seeds" -v steps="$(head -1 "$ORDERED" | cut -f6)" '
        FNR == NR { if (FNR > 1 && $3 == steps) v[$1, $2] = $5; next }
        { n = split(seeds, sd, " "); line = sprintf("| %s | %.4f |", $2, $10); sum = $10; k = 1; lo = hi = $10
          for (i = 1; i <= n; i++) {
              if ((($1, sd[i]) in v)) { x = v[$1, sd[i]]; line = line sprintf(" %.4f |", x); sum += x; k++
                                        if (x < lo) lo = x; if (x > hi) hi = x }
              else line = line " - |"
          }
          printf "%s %.4f | %.4f |\n", line, sum / k, hi - lo }' "$SEEDS_TSV" "$ORDERED"
    echo
    awk -F'\t' -v steps="$(head -1 "$ORDERED" | cut -f6)" -v seeds="$seeds" '
        FNR == NR { if (FNR > 1 && $3 == steps) v[$1, $2] = $5; next }
        { b[$1] = $10 }
        END {
            split("all_attn gdn_1to1 gdn_3to1 gdn_7to1 all_gdn all_mamba all_linear", names, " ")
            n = split(seeds, sd, " ")
            # the largest spread within one config, and whether each seed ranks all-attn worst
            # and all-mamba best among the seven
            worst_attn = 1; best_mamba = 1
            for (i = 0; i <= n; i++) {
                for (j = 1; j <= 7; j++) { nm = names[j]; x[nm] = i == 0 ? b[nm] : ((nm, sd[i]) in v ? v[nm, sd[i]] : "") }
                for (j = 1; j <= 7; j++) {
                    nm = names[j]; if (x[nm] == "" || x["all_attn"] == "" || x["all_mamba"] == "") continue
                    if (nm != "all_attn" && x[nm] >= x["all_attn"]) worst_attn = 0
                    if (nm != "all_mamba" && x[nm] <= x["all_mamba"]) best_mamba = 0
                }
            }
            printf "Across the %d seeds: all-attn is the worst of the seven at every seed: **%s**; all-mamba the best at every seed: **%s**. ",
                   n + 1, worst_attn ? "yes" : "no", best_mamba ? "yes" : "no"
            printf "Differences between configs smaller than their max - min above are within seed noise.\n"
        }' "$SEEDS_TSV" "$ORDERED"
}
seed_caveat() {
    local seeds
    seeds=$(other_seeds)
    if [ -n "$seeds" ]; then
        echo "The seed spread above is from $(( $(wc -w <<<"$seeds") + 1 )) seeds only: a rough size of the noise, not an interval."
    else
        echo "One seed per config: the seed-to-seed spread is not measured (\`--seed\` runs it), so differences of a few thousandths of a bit per byte may be noise."
    fi
}

{
cat <<EOF
# Quality against the linear share

Generated by
\`bench/linear_share.sh --out docs/bench --img docs/img --page docs/linear_share.md\`
(do not edit by hand: re-run it; without those options it writes under
\`build/bench/linear_share/\` and leaves these files alone). Data:
[\`docs/bench/linear_share.tsv\`](bench/linear_share.tsv) (one row per run) and
[\`docs/bench/linear_share_curves.tsv\`](bench/linear_share_curves.tsv) (every
evaluation); configs: \`configs/share/\`.

EOF
if [ "$nsteps" -gt 1 ]; then
cat <<EOF
> **The runs do not share one budget (steps: $steps_list): the rows are not
> comparable.** Re-run the sweep with one step count.

EOF
fi
if [ "$smoke" -gt 0 ]; then
cat <<EOF
> **SMOKE RUN: $smoke of $nrows runs trained for fewer than 100 steps
> (\`--steps\`).** The numbers below check the script, not the mixers.
> Run \`bench/linear_share.sh\` without \`--steps\` for the real comparison.

EOF
elif [ "$overridden" -gt 0 ]; then
cat <<EOF
> $overridden of $nrows runs used \`--steps\` instead of their config's step count
> ($(uniq_col 7)).

EOF
fi
cat <<EOF
| | |
| --- | --- |
| CPU | $(uniq_col 20), $(nproc) cores |
| kernel | $(uname -srm) |
| threads | $(uniq_col 13) (train's OpenMP threads), OMP_WAIT_POLICY=$OMP_WAIT_POLICY, OPENBLAS_CORETYPE=$(uniq_col 19) |
| precision | $(uniq_col 14) |
| date (UTC) | runs started $first_date to $last_date |
| commit | $(uniq_col 16) |
| load average (1, 5, 15 min) | first run's start: $(head -1 "$ORDERED" | cut -f17); last run's end: $(tail -1 "$ORDERED" | cut -f18) (every run's in the table) |
| budget | $steps_list steps of $B x $T bytes each ($(th "$(head -1 "$ORDERED" | cut -f8)") training bytes per run$(passes)), the same batches in the same order for every run (seed $(ini all_attn seed)) |
| schedule | AdamW, lr $(ini all_attn lr) after a linear warm-up over the first $(warmup_pct)% of the steps, cosine to $(ini all_attn min_lr); weight decay $(ini all_attn weight_decay), gradient clip $(ini all_attn grad_clip) |
| model | 8 layers, d_model $(ini all_attn d_model), $(ini all_attn n_heads) heads, dk = dv = $(ini all_attn d_k), d_ff $(ini all_attn d_ff), tied byte embeddings, chunk $(ini all_attn chunk_size), short conv $(ini all_attn conv_size) |
| validation | the same $(ini all_attn eval_batches) x $B windows of $T bytes from the last $(awk -v f="$(ini all_attn val_fraction)" 'BEGIN {print 100 * f}')% of the text for every run and every evaluation |
| sweep run time | $(fmt_s "$sweep_s") (sum of the runs' wall times) |

The machine is shared: the load average (2 cores) says how many other
runnable processes competed with each run. The load changes tokens/s and wall
time, not the losses (a run does the same arithmetic whatever the load).

## What is compared

Seven byte-level LMs on the King James Bible that differ only in their layer
pattern; "x:1" is x Gated DeltaNet (\`gdn\`) layers per softmax-attention
(\`attn\`) layer, and the linear share is the fraction of layers that are not
softmax attention:

| config | layers | linear share |
| --- | --- | ---: |
| all-attn | attn x 8 | 0 |
| 1:1 | (gdn, attn) x 4 | 1/2 |
| 3:1 | (gdn, gdn, gdn, attn) x 2 | 3/4 |
| 7:1 | gdn x 7, attn | 7/8 |
| all-gdn | gdn x 8 | 1 |
| all-mamba | mamba x 8 | 1 |
| all-linear | linear x 8 | 1 |

Every hybrid is the block (gdn x k, attn) repeated, so the 7:1 model has its
one attention layer last, as the 3:1 and 1:1 models have an attention layer
closing each block (and as \`tiny_hybrid.ini\` does): the sweep changes k
only, not where attention sits within a block. The parameter counts differ
by mixer kind (gdn and mamba layers have gate, decay and convolution weights
that attention does not): they are in the table.

## Results

$(results_table)

![val bpb vs linear share](img/linear_share.png)

![validation curves](img/linear_share_curves.png)

## Reading

The claim (from the lecture): with the model size and the budget fixed,
quality falls as the share of linear layers rises, and slowly at low shares
(replacing some of the attention layers costs little). The usual explanation
is recall: a linear layer keeps a fixed-size state (here $(ini all_attn d_k) x $(ini all_attn d_v) per
head), softmax attention keeps every earlier token.

What this run shows:

$(reading)

$(seed_spread)

What it can and cannot say. $(seed_caveat) The scale is tiny ($(th "$(cut -f5 "$ORDERED" | sort -n | head -1)") to $(th "$(cut -f5 "$ORDERED" | sort -n | tail -1)") parameters, 8 layers of width
$(ini all_attn d_model)), the context short (T = $T bytes) and the budget
short ($steps_list steps: see in the curves how far each run is from
levelling off), so the figures say
how fast each pattern learns byte-level English at short context, where
local statistics (spelling, frequent words) dominate the loss and a gated
recurrence with a short convolution picks them up quickly (the 4-layer
runs of [training.md](training.md#results-of-the-bundled-configs) already
have gdn and mamba ahead of attention). The claim is
about the regime where recall over a long context matters, which this
set-up exercises little; [mqar.md](mqar.md) tests recall directly.
EOF
} >"$DOC"
echo "== done: $DOC, $IMG/linear_share.png, $IMG/linear_share_curves.png (data $TSV)"
