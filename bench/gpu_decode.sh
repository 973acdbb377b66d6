#!/usr/bin/env bash
# bench/gpu_decode.sh: decoding tokens/s of `generate --device cuda` after a
# prompt of P bytes of the Bible (context P), config by config, beside
# `generate --device cpu` on the same machine (issue 17; not a test).
#
#   bench/gpu_decode.sh [-c CONTEXTS] [-n TOKENS] [-C] [-G] [-E] RESULTS_FILE CONFIG...
#
#   CONTEXTS  prompt lengths in bytes, comma list (default 256,16384)
#   TOKENS    sampled tokens timed after the prompt (default 128)
#   -C        also run --check on the GPU (its decoded logits against
#             its own parallel forward over prompt + sample; the verdict is
#             printed with the figures)
#   -G        the GPU only (models too big to decode on the CPU in reasonable time)
#   -E        also decode on the GPU without CUDA graphs (--cuda-graph off; the
#             GPU column is generate's default, --cuda-graph auto, which
#             replays the steps of every model without attn_dsa layers): a
#             column of those tokens/s and one of graphs / eager
#
# Each config's model is trained for one step on the GPU into a temporary
# folder (decoding speed does not depend on the weights). Needs the corpus at
# the config's [data] corpus (cache/kjv.txt for the bundled ones) and the
# programs from the environment: GENERATE and TRAIN (default
# .gpu/bin/generate, .gpu/bin/train, else build-cuda/, else on PATH). The
# CPU runs use generate's default threads (1 below 10M parameters); on the
# lent GPU machine set OPENBLAS_CORETYPE=SkylakeX (its OpenBLAS takes the
# CPU for Prescott: ../shared/device/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
CONTEXTS=256,16384
TOKENS=128
CHECK=0
EAGER=0
DEVICES="cuda cpu"
while getopts "c:n:CGE" opt; do
    case $opt in
        c) CONTEXTS=$OPTARG ;;
        n) TOKENS=$OPTARG ;;
        C) CHECK=1 ;;
        G) DEVICES=cuda ;;
        E) EAGER=1 ;;
        *) echo "usage: $0 [-c CONTEXTS] [-n TOKENS] [-C] [-G] [-E] RESULTS_FILE CONFIG..." >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 2 ] || { echo "usage: $0 [-c CONTEXTS] [-n TOKENS] [-C] [-G] [-E] RESULTS_FILE CONFIG..." >&2; exit 2; }
RESULTS=$1
shift
pick() {   # pick NAME: the program from $NAME, .gpu/bin, build-cuda, PATH
    local var=$1 name=$2
    if [ -n "${!var:-}" ]; then echo "${!var}"
    elif [ -x ".gpu/bin/$name" ]; then echo ".gpu/bin/$name"
    elif [ -x "build-cuda/$name" ]; then echo "build-cuda/$name"
    else command -v "$name" || { echo "gpu_decode: no $name" >&2; exit 1; }
    fi
}
GEN=$(pick GENERATE generate)
TRN=$(pick TRAIN train)
IFS=, read -r -a CLIST <<<"$CONTEXTS"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
: >"$RESULTS"
echo "| config | context P | GPU tokens/s | CPU tokens/s | GPU / CPU |$([ $EAGER = 1 ] && echo ' GPU eager tokens/s | graphs / eager |')$([ $CHECK = 1 ] && echo ' GPU --check |')"
echo "| --- | ---: | ---: | ---: | ---: |$([ $EAGER = 1 ] && echo ' ---: | ---: |')$([ $CHECK = 1 ] && echo ' --- |')"
for cfg in "$@"; do
    name=$(basename "$cfg" .ini)
    corpus_dir=$(dirname "$cfg")
    "$TRN" --config "$cfg" --device cuda --set train.steps=1 --set train.eval_every=0 \
        --set "train.run_dir=$TMP/$name" >"$TMP/train.log" 2>&1 ||
        { echo "gpu_decode: training $name failed:" >&2; tail -5 "$TMP/train.log" >&2; continue; }
    ckpt=$TMP/$name/checkpoint.h5
    corpus=$(sed -n 's/^corpus *= *//p' "$cfg" | head -1)
    for P in "${CLIST[@]}"; do
        head -c "$P" "$corpus_dir/$corpus" >"$TMP/prompt"
        tps=()
        for dev in $DEVICES; do
            out=$("$GEN" --checkpoint "$ckpt" --device $dev --prompt-file "$TMP/prompt" --max-tokens "$TOKENS" \
                --seed 1 --no-echo 2>&1 >/dev/null | grep 'decoding' || true)
            echo "$name P=$P device=$dev $out" >>"$RESULTS"
            tps+=("$(sed -n 's/.*decoding \([0-9.]*\) tokens\/s.*/\1/p' <<<"$out")")
        done
        eager=""
        if [ $EAGER = 1 ]; then
            out=$("$GEN" --checkpoint "$ckpt" --device cuda --cuda-graph off --prompt-file "$TMP/prompt" \
                --max-tokens "$TOKENS" --seed 1 --no-echo 2>&1 >/dev/null | grep 'decoding' || true)
            echo "$name P=$P device=cuda graph=off $out" >>"$RESULTS"
            e=$(sed -n 's/.*decoding \([0-9.]*\) tokens\/s.*/\1/p' <<<"$out")
            r=$(awk -v g="${tps[0]:-0}" -v e="${e:-0}" 'BEGIN { if (e > 0) printf "%.2fx", g / e; else print "-" }')
            eager=" ${e:-failed} | $r |"
        fi
        verdict=""
        if [ $CHECK = 1 ]; then
            out=$("$GEN" --checkpoint "$ckpt" --device cuda --prompt-file "$TMP/prompt" --max-tokens "$TOKENS" \
                --seed 1 --no-echo --check 2>&1 >/dev/null | grep -- '--check' || true)
            echo "$name P=$P device=cuda $out" >>"$RESULTS"
            verdict=" $(sed -n 's/.*difference decoding vs parallel \([^ ]*\).*: \(.*\)$/\1 \2/p' <<<"$out") |"
        fi
        ratio=$(awk -v g="${tps[0]:-0}" -v c="${tps[1]:-0}" 'BEGIN { if (c > 0) printf "%.1fx", g / c; else print "-" }')
        cpu=${tps[1]:-failed}
        [ "$DEVICES" = cuda ] && cpu=-
        echo "| $name | $P | ${tps[0]:-failed} | $cpu | $ratio |$eager$verdict"
    done
done
