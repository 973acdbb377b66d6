#!/usr/bin/env bash
# bench/longctx_eval.sh: loss against position on the KJV validation split
# read as one sequence (docs/long_context.md, "Loss against position"):
# `evaluate --val --positions` on the checkpoints of the bundled tiny configs
# (train them first: build/train --config tiny_X.ini; RUNS names the folder
# of the runs, default runs/), then one plot with a line per model.
#
#   bench/longctx_eval.sh              evaluate every model in MODELS, then plot, in build/bench/longctx_eval/
#   bench/longctx_eval.sh --out docs/bench/longctx --img docs/img    into the committed results (replaces them)
#   bench/longctx_eval.sh [--out DIR] plot    only the plot and the tables, from DIR
#   MODELS="gdn attn" bench/longctx_eval.sh
#   MODELS="gdn gdp" RUNS=/elsewhere/runs PLOT=longctx_books bench/longctx_eval.sh --out DIR --img docs/img
#                                      other runs into another folder, the plot named
#                                      PLOT.png (the plot and tables hold every eval_*.jsonl
#                                      of --out, so a model added to a folder joins its set)
#
# Contexts (evaluate --context), two per model: the long one, where every
# token sees the whole split before it (all-recurrent models, gdn, mamba,
# linear: the state carried through chunks of 4096 tokens; models with
# attention, attn and hybrid: one flash-attention pass over the whole split,
# O(n) memory, O(n^2) time), and sliding windows of the training length 256
# advancing by 128 (every token sees 128-256 tokens: what the model was
# trained on). The same text is scored at the same positions in both, so
# their difference per position is what context beyond the window is worth
# to the model (positive: it helps), free of the text's own ups and downs.
# THREADS (default 2) threads each.
#
# Output (--out DIR; the committed ones: docs/bench/longctx, docs/img): DIR/eval_<model>_<context>.jsonl (JSON lines:
# buckets of powers of 2), docs/bench/longctx/positions.tsv (all of them),
# coarse.tsv (the buckets 0-256, 256-1k, 1k-4k, 4k-16k, 16k-64k, 64k+,
# pooled from the fine ones), IMG/PLOT.png, default longctx_position.png (left: bits per
# byte by position in the long context, one line per model; right: sliding
# window minus long context).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${BUILD:-$ROOT/build}
# shellcheck source=bench/bench_lib.sh
. "$ROOT/bench/bench_lib.sh"
bench_out longctx_eval "$@"   # OUT, IMG: --out DIR (default $BUILD/bench/longctx_eval), --img DIR
set -- "${REST[@]+"${REST[@]}"}"
DATA=$OUT
MODELS=${MODELS:-gdn mamba linear hybrid attn}
THREADS=${THREADS:-2}
RUNS=${RUNS:-$ROOT/runs}
PLOT=${PLOT:-longctx_position}   # the plot's file name in the --img folder, without .png
[[ $PLOT =~ ^[A-Za-z0-9_-]+$ ]] || { echo "longctx_eval: PLOT='$PLOT': letters, digits, '_' and '-' only" >&2; exit 2; }
export OMP_WAIT_POLICY=PASSIVE
FINE=16,32,64,128,256,512,1k,2k,4k,8k,16k,32k,64k,128k

long_context() {   # the context in which a model sees the whole split
    case $1 in attn | hybrid) echo full ;; *) echo carry ;; esac
}

if [ "${1:-}" != plot ]; then
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j 2 --target evaluate >/dev/null
    for m in $MODELS; do
        [[ $m =~ ^[a-z0-9_]+$ ]] || { echo "longctx_eval: '$m' is not a model name (tiny_<name> under $RUNS)" >&2; exit 2; }
        ckpt=$RUNS/tiny_$m/checkpoint.h5
        [ -f "$ckpt" ] || { echo "longctx_eval: no $ckpt: build/train --config tiny_$m.ini" >&2; exit 1; }
        for ctx in $(long_context "$m") window; do
            args=(--checkpoint "$ckpt" --val --context "$ctx" --threads "$THREADS" --json)
            [ "$ctx" = carry ] && args+=(--chunk 4096)
            [ "$ctx" = window ] && args+=(--window 256 --stride 128)
            echo "== tiny_$m, context $ctx (load: $(cut -d' ' -f1-3 /proc/loadavg))"
            "$BUILD/evaluate" "${args[@]}" --buckets "$FINE" >"$DATA/eval_${m}_$ctx.jsonl"
            tail -1 "$DATA/eval_${m}_$ctx.jsonl"
        done
    done
fi

# pos_<model>_<context>.tsv from the fine buckets (lo, hi, tokens, mean
# position, loss, bits/byte), and positions.tsv: all of them with the model
# and the context in front.
bucket_rows() {
    grep '"type":"bucket"' "$1" |
        sed -E 's/.*"lo":([0-9]+),"hi":([0-9]+),"tokens":([0-9]+),"bytes":[0-9]+,"mean_pos":([0-9.]+),"loss":([0-9.]+),"bits_per_byte":([0-9.]+).*/\1\t\2\t\3\t\4\t\5\t\6/'
}
printf 'model\tcontext\tlo\thi\ttokens\tmean_pos\tloss\tbits_per_byte\n' >"$DATA/positions.tsv"
LEFT="" RIGHT=""
for f in "$DATA"/eval_*.jsonl; do
    base=$(basename "$f" .jsonl)
    base=${base#eval_}
    model=${base%_*}
    ctx=${base##*_}
    bucket_rows "$f" >"$DATA/pos_${model}_$ctx.tsv"
    awk -v m="$model" -v c="$ctx" -v OFS='\t' '{print m, c, $0}' "$DATA/pos_${model}_$ctx.tsv" >>"$DATA/positions.tsv"
done
for f in "$DATA"/eval_*_carry.jsonl "$DATA"/eval_*_full.jsonl; do
    [ -f "$f" ] || continue
    base=$(basename "$f" .jsonl)
    base=${base#eval_}
    model=${base%_*}
    ctx=${base##*_}
    # One line per model, coloured by model; the right panel joins the
    # model's window buckets to its long-context ones (same edges).
    c=$(mixer_colour "$model")
    case $ctx in full) title="tiny_$model (full attention)" ;; *) title="tiny_$model (carried state)" ;; esac
    style="with linespoints lw 2 pt 7 ps 0.6 lc rgb \"$c\" title \"$title\""
    LEFT="$LEFT${LEFT:+, }\"$DATA/pos_${model}_$ctx.tsv\" using 4:6 $style"
    if [ -f "$DATA/pos_${model}_window.tsv" ]; then
        paste "$DATA/pos_${model}_$ctx.tsv" "$DATA/pos_${model}_window.tsv" |
            awk -F'\t' -v OFS='\t' '$1 == $7 && $2 == $8 {print $1, $2, $4, $12 - $6}' >"$DATA/gain_$model.tsv"
        RIGHT="$RIGHT${RIGHT:+, }\"$DATA/gain_$model.tsv\" using 3:4 $style"
    fi
done
[ -n "$LEFT" ] || { echo "longctx_eval: no results in $DATA" >&2; exit 1; }
[ -n "$RIGHT" ] || RIGHT="0 notitle"
# The text, from the first result's total line; the fixed scales and their
# notes are for a set with tiny_attn, whose full-context loss leaves them.
TEXT=$(grep -h '"type":"total"' "$DATA"/eval_*.jsonl | head -1 |
    sed -E 's/.*"tokens":([0-9]+),"documents":([0-9]+).*/\1 \2/' |
    awk 'function commas(n) { return n < 1000 ? n : commas(int(n / 1000)) sprintf(",%03d", n % 1000) }
         { printf "%s", $2 == 1 ? "as one sequence (" commas($1) " bytes)" : "(" commas($1) " bytes in " $2 " documents, each from its start)" }')
LEFT_TITLE="bits per byte, every token seeing the whole text before it"
RIGHT_TITLE="sliding window of 256 minus whole context (> 0: it helps)"
SCALES="set autoscale y"
if [ -f "$DATA/eval_attn_full.jsonl" ]; then
    LEFT_TITLE="$LEFT_TITLE (attn leaves the scale: 5.5 from 4k on)"
    RIGHT_TITLE="sliding window of 256 minus whole context (> 0: it helps; attn leaves the scale: -1.2 to -3.8)"
    SCALES="set yrange [1.2:2.4]"
fi
gnuplot <<GP
set terminal pngcairo size 1300,520 font "DejaVu Sans,10" noenhanced
set output "$IMG/$PLOT.png"
set datafile separator "\t"
set multiplot layout 1,2 title "KJV validation split $TEXT, models trained on windows of 256"
set grid
set logscale x 2
set format x "%.0f"
set xlabel "position in the sequence (mean of a power-of-2 bucket; log scale)"
set arrow 1 from 256, graph 0 to 256, graph 1 nohead dt 3 lc rgb "#888888"
set key top right
set title "$LEFT_TITLE"
set ylabel "bits per byte"
$SCALES
plot $LEFT
set title "$RIGHT_TITLE"
set ylabel "bits per byte gained"
$( [ -f "$DATA/eval_attn_full.jsonl" ] && echo "set yrange [-0.04:0.03]" || echo "set autoscale y")
set key bottom left
plot $RIGHT
unset multiplot
set output
GP
echo "== done: $DATA/positions.tsv, $IMG/$PLOT.png"

# The coarse buckets, pooled from the fine ones (a bucket's loss is the mean
# over its tokens; byte-level tokens: bits per byte = loss / ln 2 per token
# when tokens = bytes, in general sum(loss x tokens) / (ln 2 x bytes)).
grep -h '"type":"bucket"' "$DATA"/eval_*.jsonl |
    sed -E 's/.*"checkpoint":"[^"]*tiny_([a-z0-9_]+)\/checkpoint.h5".*"context":"(carry|full|window)[^"]*","lo":([0-9]+),"hi":([0-9]+),"tokens":([0-9]+),"bytes":([0-9]+),"mean_pos":[0-9.]+,"loss":([0-9.]+).*/\1\t\2\t\3\t\5\t\6\t\7/' |
    awk -F'\t' -v OFS='\t' '
        function coarse(lo) { return lo < 256 ? "0-256" : lo < 1024 ? "256-1k" : lo < 4096 ? "1k-4k" : lo < 16384 ? "4k-16k" : lo < 65536 ? "16k-64k" : "64k+" }
        { k = $1 "\t" $2 "\t" coarse($3); nll[k] += $6 * $4; tok[k] += $4; by[k] += $5; if (!(k in seen)) { seen[k] = 1; order[n++] = k } }
        END { print "model", "context", "bucket", "tokens", "loss", "bits_per_byte"
              for (i = 0; i < n; i++) { k = order[i]; printf "%s\t%d\t%.4f\t%.4f\n", k, tok[k], nll[k] / tok[k], nll[k] / (by[k] * log(2)) } }' \
    >"$DATA/coarse.tsv"
column -t -s "$(printf '\t')" "$DATA/coarse.tsv"
