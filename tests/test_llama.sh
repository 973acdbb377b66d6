#!/usr/bin/env bash
# tests/test_llama.sh BUILD_DIR: models exported as GGUF run in the real
# llama.cpp with attnlab's logits.
#
# llama.cpp comes from the npm registry, pinned: @node-llama-cpp/linux-x64
# ships a prebuilt libllama and its CPU backends, and node-llama-cpp ships
# the llama.cpp source they were built from (a git bundle), whose headers
# build tests/llama/llama_check.c. Both are unpacked under cache/ once.
# For each layout the test trains a small model a few steps, exports it, and
# llama_check compares llama.cpp's logits at every position (one batch, and
# token by token) with `evaluate --logits`, its tokenizer's ids with the
# text's bytes (a BPE: with `tokenize encode`'s ids of a multilingual text),
# and 64 greedy tokens with `generate --temperature 0`, for attention-only
# models (llama.cpp's `llama`), gdn/attn hybrids (its `qwen35`),
# mamba2/attn hybrids (its `granitehybrid`), kda models (its
# `kimi-linear`) and gdn-only and mamba2-only models (qwen35 and
# granitehybrid with a pass-through attention block); a model
# the exporter cannot map must be refused with a sentence and no file.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${1:?usage: tests/test_llama.sh BUILD_DIR}" && pwd)
VERSION=3.22.1
LLAMA=$ROOT/cache/llama-$VERSION
CC=${CC:-cc}

if [ ! -f "$LLAMA/ready" ]; then
    command -v npm >/dev/null || { echo "test_llama: npm not found (apt-get install npm)" >&2; exit 2; }
    rm -rf "$LLAMA" && mkdir -p "$LLAMA/lib" "$LLAMA/include"
    (cd "$LLAMA" && npm pack --silent "@node-llama-cpp/linux-x64@$VERSION" "node-llama-cpp@$VERSION" >/dev/null)
    tar xzf "$LLAMA/node-llama-cpp-linux-x64-$VERSION.tgz" -C "$LLAMA/lib" --strip-components=3 package/bins/linux-x64
    tar xzf "$LLAMA/node-llama-cpp-$VERSION.tgz" -C "$LLAMA" package/llama/gitRelease.bundle
    git clone -q --no-checkout "$LLAMA/package/llama/gitRelease.bundle" "$LLAMA/src"
    git -C "$LLAMA/src" archive HEAD include ggml/include | tar x -C "$LLAMA/include"
    rm -rf "$LLAMA/src" "$LLAMA/package" "$LLAMA"/*.tgz
    touch "$LLAMA/ready"
fi
CHECK=$BUILD/llama_check
"$CC" -O1 -std=c11 -Wall -Werror -I"$LLAMA/include/include" -I"$LLAMA/include/ggml/include" \
    "$ROOT/tests/llama/llama_check.c" -o "$CHECK" -L"$LLAMA/lib" -l:libllama.v0.5.0.so -l:libggml.v0.5.0.so \
    -l:libggml-base.so -Wl,-rpath,"$LLAMA/lib" -lm

tmp=$(mktemp -d "${TMPDIR:-/tmp}/attnlab-llama-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cat "$ROOT"/docs/*.md >"$tmp/corpus.txt"
printf 'And God said, Let there be light: and there was light. Und Gott sprach: Es werde Licht! Et Dieu dit: Que la lumière soit! И сказал Бог: да будет свет. 神说：要有光，就有了光。' >"$tmp/text.txt"
fail=0

train() {  # train NAME [--set ...]: a few steps of a small model into $tmp/NAME
    local name=$1
    shift
    cat >"$tmp/$name.ini" <<EOF
[model]
layers = attn,attn
d_model = 64
n_heads = 4
d_k = 16
d_v = 16
d_ff = 128
[data]
corpus = $tmp/corpus.txt
cache_dir = $tmp/cache
seq_len = 64
batch_size = 4
val_fraction = 0
[train]
steps = 8
lr = 3e-3
eval_every = 0
log_every = 8
seed = 7
EOF
    "$BUILD/train" --config "$tmp/$name.ini" --set train.run_dir="$tmp/$name" "$@" >"$tmp/$name.log" 2>&1 ||
        { cat "$tmp/$name.log"; echo "test_llama: training $name failed"; exit 1; }
}

check() {  # check NAME TYPE TOL [defaults]
    local name=$1 type=$2 tol=$3 mode=${4:-}
    "$BUILD/export_model" --checkpoint "$tmp/$name/checkpoint.h5" --format gguf --type "$type" --overwrite \
        --out "$tmp/$name-$type.gguf" >/dev/null
    "$BUILD/evaluate" --checkpoint "$tmp/$name/checkpoint.h5" --text "$tmp/text.txt" --window 160 \
        --logits "$tmp/$name.npy" >/dev/null 2>&1
    echo "== llama.cpp: $name, $type ${mode:-(no flash attention, f32 cache)}"
    "$CHECK" "$LLAMA/lib" "$tmp/$name-$type.gguf" "$tmp/text.txt" "$tmp/$name.npy" "$tol" $mode || fail=1
}

greedy() {  # greedy NAME: 64 greedy tokens after the text, llama.cpp against generate
    local name=$1
    "$BUILD/generate" --checkpoint "$tmp/$name/checkpoint.h5" --prompt-file "$tmp/text.txt" --temperature 0 \
        --max-tokens 64 --no-echo 2>/dev/null | od -An -tu1 -v >"$tmp/$name.ids"
    "$CHECK" "$LLAMA/lib" "$tmp/$name-f32.gguf" "$tmp/text.txt" --greedy 64 "$tmp/$name.ids" || fail=1
}

train attn_tied
check attn_tied f32 1e-5
check attn_tied f32 1e-3 defaults
greedy attn_tied
check attn_tied f16 2e-3
check attn_tied q8_0 3e-2
train attn_untied --set model.tied_embeddings=false
check attn_untied f32 1e-5
greedy attn_untied

# BPE tokenizers: tiktoken's three and one trained on the corpus. A small
# d_model keeps the 100k and 200k-row embeddings cheap. The text has what
# pre-tokenizers split differently: diacritics (composed and combining),
# Greek, Cyrillic, CJK, Devanagari, emoji, digit and whitespace runs,
# contractions in both cases, camel case, code.
printf '%s\n' "Don't stop: WE'LL see, they've I'M. Ça déjà vu, naïve Zürich, Ökonom," $'e\xcc\x81te\xcc\x81 Cafe\xcc\x81.' \
    'Αθήνα ΣΟΦΙΑ. Москва — столица, ПриветМир. 東京都と北京市、서울. नमस्ते दुनिया. 😀👍🏽 ok' \
    '12345678 9999 3.14159 0x1F  HTTPServer camelCase' $'\tdef f(x):' '        return x**2  # code' \
    '' '' "  trailing   " >"$tmp/multi.txt"
bpe() {  # bpe NAME TOKENIZER: the ids, logits and greedy text of a BPE model on multi.txt
    local name=$1 tokenizer=$2
    "$BUILD/export_model" --checkpoint "$tmp/$name/checkpoint.h5" --format gguf --overwrite \
        --out "$tmp/$name-f32.gguf" >/dev/null
    "$BUILD/tokenize" encode --tokenizer "$tokenizer" --in "$tmp/multi.txt" --out "$tmp/$name.tok"
    "$BUILD/evaluate" --checkpoint "$tmp/$name/checkpoint.h5" --text "$tmp/multi.txt" --window 400 \
        --logits "$tmp/$name.npy" >/dev/null 2>&1
    # (generate ends its output with a line break of its own)
    "$BUILD/generate" --checkpoint "$tmp/$name/checkpoint.h5" --prompt-file "$tmp/multi.txt" --temperature 0 \
        --max-tokens 64 --no-echo 2>/dev/null | head -c -1 >"$tmp/$name.gen"
    echo "== llama.cpp: $name, f32 (no flash attention, f32 cache)"
    "$CHECK" "$LLAMA/lib" "$tmp/$name-f32.gguf" "$tmp/multi.txt" --ids "$tmp/$name.tok" "$tmp/$name.npy" 1e-5 || fail=1
    "$CHECK" "$LLAMA/lib" "$tmp/$name-f32.gguf" "$tmp/multi.txt" --ids "$tmp/$name.tok" \
        --greedy-text 64 "$tmp/$name.gen" || fail=1
}
small=(--set model.d_model=32 --set model.n_heads=2 --set model.d_ff=64 --set train.steps=2)
for enc in gpt2 cl100k_base o200k_base; do
    train "$enc" "${small[@]}" --set data.tokenizer=$enc
    bpe "$enc" "$enc"
done
train bpe300 "${small[@]}" --set data.tokenizer=bpe:300
bpe300=$(ls "$tmp"/cache/tokenizer-*-300.bpe)
bpe bpe300 "$bpe300"

# A BPE whose split pattern llama.cpp has no pre-tokenizer for is refused, naming it.
sed '2s/^#pattern .*/#pattern \\S+|\\s+/' "$bpe300" >"$tmp/ws.bpe"
train ws "${small[@]}" --set train.steps=1 --set data.tokenizer="$tmp/ws.bpe"
if "$BUILD/export_model" --checkpoint "$tmp/ws/checkpoint.h5" --format gguf --out "$tmp/ws.gguf" 2>"$tmp/ws.err"; then
    echo "test_llama: a BPE split by \\S+|\\s+ was exported"; fail=1
elif ! grep -qF "pattern '\S+|\s+'" "$tmp/ws.err" || [ -e "$tmp/ws.gguf" ]; then
    echo "test_llama: the refusal of a pattern llama.cpp lacks: $(cat "$tmp/ws.err")"; fail=1
fi

# gdn/attn hybrids as llama.cpp's qwen35: 3:1 (gdn,gdn,gdn,attn) and 1:1
# with the attention first (the recurrent layers listed, not a period) and
# a convolution of one tap (llama.cpp then keeps no convolution state), untied.
qwen35=(--set model.qk_norm=true --set model.attn_gate=true)
train hybrid31 --set model.layers=gdn,gdn,gdn,attn "${qwen35[@]}"
check hybrid31 f32 1e-5
check hybrid31 f32 1e-3 defaults
greedy hybrid31
train hybrid11 --set model.layers=attn,gdn --set model.conv_size=1 --set model.tied_embeddings=false "${qwen35[@]}"
check hybrid11 f32 1e-5
greedy hybrid11

bundled() {  # bundled NAME: configs/NAME.ini as bundled (its model and windows), a few steps on the corpus
    local name=$1
    "$BUILD/train" --config "$ROOT/configs/$name.ini" --set train.run_dir="$tmp/$name" \
        --set data.corpus="$tmp/corpus.txt" --set data.cache_dir="$tmp/cache" --set train.steps=3 \
        --set train.log_every=3 >"$tmp/$name.log" 2>&1 ||
        { cat "$tmp/$name.log"; echo "test_llama: training $name failed"; exit 1; }
}

# gdn layers only: configs/tiny_gdn.ini as qwen35 with the pass-through
# attention block after its layers.
bundled tiny_gdn
check tiny_gdn f32 1e-5
check tiny_gdn f32 1e-3 defaults
greedy tiny_gdn

# mamba2/attn hybrids as llama.cpp's granitehybrid (its Mamba-2 layers need
# n_heads * d_v = 2 * d_model): 3:1, and 1:1 with the attention first, untied.
mamba2=(--set model.n_heads=8 --set model.d_k=16 --set model.d_v=16)
train mamba2_31 --set model.layers=mamba2,mamba2,mamba2,attn "${mamba2[@]}"
check mamba2_31 f32 1e-5
check mamba2_31 f32 1e-3 defaults
greedy mamba2_31
train mamba2_11 --set model.layers=attn,mamba2 --set model.tied_embeddings=false "${mamba2[@]}"
check mamba2_11 f32 1e-5
greedy mamba2_11
# mamba2 layers only, with the pass-through attention block:
# configs/tiny_mamba2.ini, two tied layers, and three untied with a state
# wider than a head (d_k > d_v: the block's head size is its own).
bundled tiny_mamba2
check tiny_mamba2 f32 1e-5
greedy tiny_mamba2
train mamba2_only --set model.layers=mamba2,mamba2 "${mamba2[@]}"
check mamba2_only f32 1e-5
check mamba2_only f32 1e-3 defaults
greedy mamba2_only
train mamba2_wide --set model.layers=mamba2,mamba2,mamba2 "${mamba2[@]}" --set model.d_k=32 \
    --set model.tied_embeddings=false
check mamba2_wide f32 1e-5
greedy mamba2_wide

# kda models as llama.cpp's kimi-linear (without the gate's bias, as Kimi
# Linear): two layers tied, and three untied with a convolution of one tap.
kimi=(--set model.layers=kda,kda --set model.kda_gate_bias=false)
train kda2 "${kimi[@]}"
check kda2 f32 1e-5
check kda2 f32 1e-3 defaults
greedy kda2
check kda2 f16 2e-3
train kda3 "${kimi[@]}" --set model.layers=kda,kda,kda --set model.conv_size=1 --set model.tied_embeddings=false
check kda3 f32 1e-5
greedy kda3

# What cannot be written exactly is refused, naming what to change, and no file is left.
refused() {  # refused NAME EXPECTED [--set ...]: a one-step model that export_model must refuse
    local name=$1 expected=$2
    shift 2
    train "$name" --set train.steps=1 --set train.log_every=1 "$@"
    if "$BUILD/export_model" --checkpoint "$tmp/$name/checkpoint.h5" --format gguf --out "$tmp/$name.gguf" \
        2>"$tmp/$name.err"; then
        echo "test_llama: $name was exported"; fail=1
    elif ! grep -qF "$expected" "$tmp/$name.err" || [ -e "$tmp/$name.gguf" ]; then
        echo "test_llama: the refusal of $name: $(cat "$tmp/$name.err")"; fail=1
    else
        echo "== refused: $name"
    fi
}
refused mamba "layer 1 is 'mamba'" --set model.layers=attn,mamba
refused hybrid_plain "qk_norm = true" --set model.layers=gdn,attn
refused hybrid_nogate "attn_gate = true" --set model.layers=gdn,attn --set model.qk_norm=true
refused gdn_eps "norm_eps = 1e-06" --set model.layers=gdn,gdn --set model.norm_eps=1e-5
refused mamba2_narrow "twice d_model" --set model.layers=mamba2,attn
refused mamba2_gdn "layer 1 is 'gdn'" --set model.layers=mamba2,gdn "${mamba2[@]}"
refused kda_bias "kda_gate_bias = false" --set model.layers=kda,kda
refused kda_attn "layer 1 is 'attn' in a model with 'kda' layers" "${kimi[@]}" --set model.layers=kda,attn
refused kda_eps "norm_eps = 1e-06" "${kimi[@]}" --set model.norm_eps=1e-5
[ $fail -eq 0 ] && echo "test_llama: every exported model runs in llama.cpp $VERSION with attnlab's logits"
exit $fail
