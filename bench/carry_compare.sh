#!/usr/bin/env bash
# bench/carry_compare.sh: bits per byte of tiny_gdn and tiny_mamba trained
# with and without carried state ([train] carry_state) at equal steps
# (docs/documents.md), three ways: random windows (the default), the rows'
# streams read in order with every window from a zero state ([data] order =
# streams), and the streams with the state carried (+ carry_state = true),
# which separates the effect of reading in order from that of the state. Each model is scored on the validation split (the
# last val_fraction of cache/kjv.txt) two ways: windows of the training
# length T = 256 advancing by 128 (every model sees at most 256 tokens), and
# the whole split as one stream (evaluate --stream: the state carried
# through all of it).
#
#   bench/carry_compare.sh            train the six models, evaluate, write the table
#                                     (build/bench/carry_compare/carry_compare.tsv)
#   bench/carry_compare.sh --out docs/bench   the same into the committed table (replaces it)
#   VARIANTS="streams" bench/carry_compare.sh   some variants only (rows appended to the table)
#   STEPS=300 bench/carry_compare.sh  shorter runs
#   CONFIGS="tiny_gdn" bench/carry_compare.sh
#
# Output: runs/carry/<config>-<variant>/ (the runs), and DIR/carry_compare.tsv
# (--out DIR, default build/bench/carry_compare; the committed one is
# docs/bench). Without --out nothing under docs/ is written; there are no plots
# (--img is not used).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${BUILD:-$ROOT/build}
# shellcheck source=bench/bench_lib.sh
. "$ROOT/bench/bench_lib.sh"
bench_opts carry_compare "$@"   # OUT: --out DIR (default $BUILD/bench/carry_compare)
[ -z "$IMG" ] && [ -z "$PAGE" ] || { echo "carry_compare: --img, --page: this script writes no plots and no page" >&2; exit 2; }
[ ${#REST[@]} -eq 0 ] || { echo "carry_compare: unexpected argument '${REST[0]}' (options: --out DIR; the rest by STEPS, CONFIGS, VARIANTS)" >&2; exit 2; }
STEPS=${STEPS:-600}
CONFIGS=${CONFIGS:-tiny_gdn tiny_mamba}
VARIANTS=${VARIANTS:-random streams carry}
for variant in $VARIANTS; do
    case $variant in random|streams|carry) ;; *) echo "carry_compare: unknown variant $variant (random, streams, carry)" >&2; exit 2 ;; esac
done
for bin in train evaluate; do
    [ -x "$BUILD/$bin" ] || { echo "carry_compare: $BUILD/$bin not built (cmake --build $BUILD --target train evaluate)" >&2; exit 1; }
done
bench_dirs carry_compare   # the folders made only once the arguments and binaries are good
TSV=$OUT/carry_compare.tsv
mkdir -p "$ROOT/runs/carry"
scripts/get_corpus.sh
# The validation split of the byte tokenizer: the corpus's last 2% (val_fraction 0.02), as train cuts it.
n=$(stat -c %s cache/kjv.txt)
val=$ROOT/runs/carry/val.txt
tail -c $((n - (n - n * 2 / 100))) cache/kjv.txt > "$val"
[ -s "$TSV" ] && [ "$VARIANTS" != "random streams carry" ] ||
    printf 'config\tvariant\tsteps\ttrain_s\tval_bpb_train\twindow256_bpb\tstream_bpb\n' > "$TSV"
for cfg in $CONFIGS; do
    for variant in $VARIANTS; do
        case $variant in
        random) set_order=random set_carry=false ;;
        streams) set_order=streams set_carry=false ;;
        carry) set_order=streams set_carry=true ;;
        *) echo "carry_compare: unknown variant $variant" >&2; exit 2 ;;
        esac
        dir=$ROOT/runs/carry/$cfg-$variant
        t0=$(date +%s)
        "$BUILD/train" --config "$cfg.ini" --overwrite --set "train.steps=$STEPS" --set "data.order=$set_order" \
            --set "train.carry_state=$set_carry" --set "train.run_dir=$dir" 2> "$dir.log" || { tail -5 "$dir.log"; exit 1; }
        t1=$(date +%s)
        vb=$(grep -o 'val_bpb":[0-9.]*' "$dir/metrics.jsonl" | tail -1 | cut -d: -f2)
        wb=$("$BUILD/evaluate" --checkpoint "$dir/checkpoint.h5" --text "$val" --window 256 --stride 128 --json |
             grep -o '"bits_per_byte":[0-9.]*' | cut -d: -f2)
        sb=$("$BUILD/evaluate" --checkpoint "$dir/checkpoint.h5" --text "$val" --stream --json |
             grep -o '"bits_per_byte":[0-9.]*' | cut -d: -f2)
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$cfg" "$variant" "$STEPS" $((t1 - t0)) "$vb" "$wb" "$sb" | tee -a "$TSV"
    done
done
echo "carry_compare: $TSV ($(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
