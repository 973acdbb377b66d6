#!/usr/bin/env bash
# bench/tokenizer_compare.sh [STEPS]: tiny_gdn.ini (bytes) against
# tiny_gdn_bpe.ini (a 4096-id BPE) at equal training time. Trains the byte
# model for STEPS steps (default 600), then the BPE model for as many steps
# with an evaluation every 25, and reports the BPE model's validation bits
# per byte at the evaluation closest to the byte model's wall time, and at
# the end. Prints one table row per model: bits/byte, tokens/s, bytes of
# text per second. Not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-600}
scripts/get_corpus.sh >/dev/null
[ -x build/train ] || scripts/run.sh build
mkdir -p runs
run() {  # run NAME [--set ...]: train into runs/tokcmp_NAME, print its wall seconds
    local name=$1
    shift
    local t0 t1
    t0=$(date +%s.%N)
    build/train --config "tiny_gdn${name#byte}.ini" --overwrite --set "train.run_dir=runs/tokcmp_$name" \
        --set "train.steps=$STEPS" "$@" >"runs/tokcmp_$name.log" 2>&1
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
}
median_tps() { grep '"type":"train"' "$1" | sed 's/.*"tok_per_s":\([0-9.]*\).*/\1/' | sort -n | awk '{a[NR]=$1} END {print int(a[int((NR+1)/2)])}'; }
w_byte=$(run byte)
w_bpe=$(run _bpe --set train.eval_every=25)
m=runs/tokcmp_byte/metrics.jsonl
b=runs/tokcmp__bpe/metrics.jsonl
bpb_byte=$(grep '"type":"end"' "$m" | sed 's/.*"val_bpb":\([0-9.]*\).*/\1/')
bpb_bpe_end=$(grep '"type":"end"' "$b" | sed 's/.*"val_bpb":\([0-9.]*\).*/\1/')
# The BPE run's last evaluation no later than the byte run's wall time (elapsed_s of the train record at that step).
read -r eq_step eq_bpb < <(awk -v W="$w_byte" -F'[:,}]' '
    /"type":"train"/ {for (i = 1; i < NF; i++) {if ($i ~ /"step"/) s = $(i+1); if ($i ~ /"elapsed_s"/) e[s] = $(i+1)}}
    /"type":"eval"/  {for (i = 1; i < NF; i++) {if ($i ~ /"step"/) s = $(i+1); if ($i ~ /"val_bpb"/) v = $(i+1)}
                      if (e[s] <= W) {best = s; bv = v}}
    END {print best, bv}' "$b")
tps_byte=$(median_tps "$m")
tps_bpe=$(median_tps "$b")
bpt=$(grep -o 'BPE of [0-9]* ids' runs/tokcmp__bpe.log | head -1)
# Bytes of text per token on the corpus: the cache's token count against the corpus size.
ntok=$(sed -n 's/.*corpus \([0-9]*\) tokens.*/\1/p' runs/tokcmp__bpe.log | head -1)
nbytes=$(wc -c < cache/kjv.txt)
printf '| config | tokenizer | steps | wall | val bits/byte | tokens/s | text bytes/s |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n'
printf '| tiny_gdn | bytes | %d | %.0f s | %.4f | %d | %d |\n' "$STEPS" "$w_byte" "$bpb_byte" "$tps_byte" "$tps_byte"
printf '| tiny_gdn_bpe | %s | %d (equal time) | %.0f s | %.4f | %d | %.0f |\n' "$bpt" "$eq_step" "$w_byte" "$eq_bpb" "$tps_bpe" \
    "$(echo "$tps_bpe * $nbytes / $ntok" | bc -l)"
printf '| tiny_gdn_bpe | %s | %d | %.0f s | %.4f | %d | %.0f |\n' "$bpt" "$STEPS" "$w_bpe" "$bpb_bpe_end" "$tps_bpe" \
    "$(echo "$tps_bpe * $nbytes / $ntok" | bc -l)"
echo
echo "BPE: $ntok tokens for $nbytes bytes ($(echo "scale=2; $nbytes / $ntok" | bc) bytes per token)"
echo "machine: $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
