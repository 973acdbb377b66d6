#!/usr/bin/env bash
# tests/test_outside.sh BUILD_DIR: the project as seen from outside it, for one
# build (float32 or float64):
#  1. `cmake --install` into a scratch prefix; the installed train and
#     generate answer --help;
#  2. examples/ built against the installed library both ways (pkg-config and
#     find_package) and run (a custom op's gradcheck, a custom mixer's LM
#     that learns);
#  3. the README's example error messages equal what train prints;
#  4. a tiny model of every reference mixer trained, exported with
#     export_model (safetensors checked against the format's specification),
#     and loaded by python/attnlab_torch.py from the checkpoint and from the
#     export: its logits equal the C model's (evaluate --logits), to 1e-4
#     normwise in float32 and 1e-9 in float64; the same for a mamba2/attn
#     hybrid (Mamba-2 as llama.cpp computes it), for a gdn/attn hybrid with
#     attn's options qk_norm and attn_gate on, for a gdp/gdn/attn hybrid
#     with gdp_steps = 3, for a kda/gdn/attn hybrid and for a kda/attn one
#     without the gate bias (kda_gate_bias = false); a BPE model's
#     tokenizer in Python encodes a multilingual text to bin/tokenize
#     encode's ids (gpt2, cl100k_base, o200k_base, a trained bpe:300) and the
#     loader prints the model's greedy continuation decoded;
#  5. train --dump-state of a run with documents and carried states equals
#     the PyTorch reference (bench/torch_ref/compare_dump.py).
# The Python and bench tools that no build changes (the loader's refusals of
# hostile files, the GPU benchmark's helpers, the bench scripts' output
# folders) are tests/test_tools.sh's, run once.
set -euo pipefail
BUILD=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/attnlab-outside-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
PY=/usr/bin/python3
precision=$(grep -q "AG_DOUBLE:BOOL=ON" "$BUILD/CMakeCache.txt" && echo float64 || echo float32)
tol=$([ "$precision" = float64 ] && echo 1e-9 || echo 1e-4)

# 1. install
cmake --install "$BUILD" --prefix "$TMP/prefix" >/dev/null
"$TMP/prefix/bin/train" --help >/dev/null
"$TMP/prefix/bin/generate" --help >/dev/null
for p in train generate evaluate export_model tokenize; do
    "$TMP/prefix/bin/$p" --version | grep -q "^$p (attnlab " || { echo "outside: $p --version" >&2; exit 1; }
done
# A prefix other than the configured one: the installed train finds its
# configs in that prefix's share/attnlab (a config only there is found, and
# its error names where it was found).
printf '[train]\nno_such_key = 1\n' > "$TMP/prefix/share/attnlab/configs/only_in_prefix.ini"
got=$(cd "$TMP" && "$TMP/prefix/bin/train" --config only_in_prefix 2>&1 >/dev/null || true)
case "$got" in
*"$(cd "$TMP" && pwd -P)/prefix/share/attnlab/configs/only_in_prefix.ini"*"no_such_key"*) ;;
*) echo "outside: the installed train did not find its prefix's configs: $got" >&2; exit 1 ;;
esac
rm "$TMP/prefix/share/attnlab/configs/only_in_prefix.ini"
export PKG_CONFIG_PATH="$TMP/prefix/lib/pkgconfig"

# 2. examples, both ways
for ex in custom_op custom_mixer; do
    # shellcheck disable=SC2046
    cc -O2 "$ROOT/examples/$ex.c" $(pkg-config --cflags --libs attnlab) -o "$TMP/$ex"
    "$TMP/$ex"
done
cmake -S "$ROOT/examples" -B "$TMP/examples" -DCMAKE_PREFIX_PATH="$TMP/prefix" >/dev/null
cmake --build "$TMP/examples" >/dev/null
"$TMP/examples/custom_op"
"$TMP/examples/custom_mixer"
echo "outside ($precision): installed programs, examples built with pkg-config and find_package: OK"

# 3. The README's example messages are what the programs print (a "$ bin/train ..." line, then its output).
while IFS=$'\t' read -r cmd want; do
    read -ra args <<<"${cmd#bin/train }"
    got=$(cd "$ROOT" && "$BUILD/train" "${args[@]}" 2>&1 >/dev/null | head -1 || true)
    [ "$got" = "$want" ] || { echo "README example '$cmd' prints: $got (the README says: $want)"; exit 1; }
done < <(awk '/^\$ bin\/train / {cmd = substr($0, 3); getline out; print cmd "\t" out}' "$ROOT/README.md")
echo "outside ($precision): the README's example messages: OK"

# 4. export and the PyTorch loader: its logits against the C model's, then a
# BPE model's tokenizer (its refusals of hostile files: tests/test_tools.sh).
python_text() {   # deterministic English-like text
    $PY -c "
import random
r = random.Random(5)
w = 'the light and darkness was good evening morning day of god earth heaven'.split()
print(' '.join(r.choice(w) for _ in range(6000)))"
}
python_text >"$TMP/corpus.txt"
parity() {   # LAYERS [MODEL KEY LINE]: train a tiny model, its logits in C and in PyTorch
rm -rf "$TMP/run" "$TMP/cache"
cat >"$TMP/tiny.ini" <<INI
[model]
layers = $1
${2:-}
d_model = 32
n_heads = 2
d_k = 16
d_v = 16
d_ff = 64
chunk_size = 8
[data]
corpus = corpus.txt
cache_dir = cache
seq_len = 48
batch_size = 4
val_fraction = 0.05
[train]
steps = 4
eval_every = 0
run_dir = run
INI
"$BUILD/train" --config "$TMP/tiny.ini" >/dev/null 2>&1
"$BUILD/export_model" --checkpoint "$TMP/run/checkpoint.h5" --out "$TMP/model.safetensors" 2>/dev/null
head -c 200 "$TMP/corpus.txt" >"$TMP/probe.txt"
"$BUILD/evaluate" --checkpoint "$TMP/run/checkpoint.h5" --text "$TMP/probe.txt" --window 199 --logits "$TMP/c.npy" >/dev/null
$PY - "$ROOT/python" "$TMP" "$tol" "$precision" "$1" <<'PYEOF'
import json, struct, sys
import numpy as np
import torch
sys.path.insert(0, sys.argv[1])
import attnlab_torch
tmp, tol, precision, layers = sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5].split(",")
# The safetensors file against the format's specification.
data = open(tmp + "/model.safetensors", "rb").read()
(n,) = struct.unpack("<Q", data[:8])
assert (8 + n) % 8 == 0, "data not 8-byte aligned"
header = json.loads(data[8:8 + n])
meta = header.pop("__metadata__")
assert meta["format"] == "pt" and "[model]" in meta["attnlab_config"]
end = 0
for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    b, e = info["data_offsets"]
    assert info["dtype"] == "F32" and b == end and e - b == 4 * int(np.prod(info["shape"])), name
    end = e
assert 8 + n + end == len(data), "trailing or missing bytes"
cfg = json.load(open(tmp + "/config.json"))
assert cfg["layers"] == layers and cfg["vocab_size"] == 256
# Logits of the C model against the PyTorch reference loaded from both files.
c = np.load(tmp + "/c.npy").astype(np.float64)
tokens = torch.tensor([list(open(tmp + "/probe.txt", "rb").read())[:c.shape[0]]])
dtype = torch.float64 if precision == "float64" else torch.float32
for f in ("run/checkpoint.h5", "model.safetensors"):
    for form in ("chunked", "recurrent"):
        lm = attnlab_torch.load(tmp + "/" + f, dtype=dtype, form=form)
        with torch.no_grad():
            ref = lm.forward(tokens)[0].double().numpy()
        err = np.abs(ref - c).max() / np.abs(ref).max()
        print("outside (%s): %s: PyTorch from %s (%s form) vs C logits: %.2e (tolerance %g)"
              % (precision, ",".join(layers), f, form, err, tol))
        assert err <= tol, "the PyTorch reference disagrees with the C model"
PYEOF
}
parity attn,linear,mamba,gdn
# Mamba-2 as llama.cpp computes it, next to attention.
parity mamba2,attn
# attn's options (qk_norm, attn_gate), both on, in a gdn/attn hybrid.
parity gdn,attn $'qk_norm = true\nattn_gate = true'
# gdp at three delta steps per token (its weights n-fold wide) beside gdn.
parity gdp,gdn,attn 'gdp_steps = 3'
# kda (a decay per key channel, its own output gate) beside gdn and attn.
parity kda,gdn,attn
# kda without its gate's bias (Kimi Linear's gate, as llama.cpp's kimi-linear).
parity kda,attn 'kda_gate_bias = false'

# A BPE model's tokenizer in Python (python/attnlab_tokenizer.py): its ids for
# a multilingual text (bytes that are not UTF-8 included) equal bin/tokenize
# encode's for gpt2, cl100k_base, o200k_base and the tokenizer.bpe of a
# trained bpe:N model, and decode back to the text; the loader finds that
# tokenizer beside the export and in the checkpoint, reads --ids and prints
# the model's greedy continuation decoded as bin/tokenize decode decodes it;
# the hostile tokenizer files are refused with the C reader's messages.
printf 'In the beginning God created the heaven and the earth. Don'"'"'t PANIC: 1234567 apples, 3.14 pears!\n\nGrüße aus München, naïve café. Привет, мир! Γειά σου κόσμε. 你好，世界。こんにちは、世界！\nمرحبا بالعالم. नमस्ते दुनिया. 안녕하세요 🙂👍🏽\t tabs\t\there   and   spaces   \r\n<|endoftext|>bad \xff\xfe bytes \xe2\x82 end\n' >"$TMP/multi.txt"
rm -rf "$TMP/run" "$TMP/cache" "$TMP/bpe_export"
"$BUILD/train" --config "$TMP/tiny.ini" --set data.tokenizer=bpe:300 >/dev/null 2>&1 ||
    { echo "outside: training a bpe:300 model failed"; exit 1; }
"$BUILD/export_model" --checkpoint "$TMP/run/checkpoint.h5" --out "$TMP/bpe_export/model.safetensors" 2>/dev/null
for t in gpt2 cl100k_base o200k_base "$TMP/bpe_export/tokenizer.bpe"; do
    "$BUILD/tokenize" encode --tokenizer "$t" --in "$TMP/multi.txt" --out "$TMP/ids_$(basename "$t").txt"
done
head -c 120 "$TMP/corpus.txt" >"$TMP/probe.txt"
"$BUILD/tokenize" encode --tokenizer "$TMP/bpe_export/tokenizer.bpe" --in "$TMP/probe.txt" --out "$TMP/probe_ids.txt"
$PY - "$ROOT" "$TMP" "$BUILD" <<'PYEOF' || exit 1
import os, subprocess, sys
root, tmp, build = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(root, "python"))
import attnlab_tokenizer, attnlab_torch
text = open(tmp + "/multi.txt", "rb").read()
export = tmp + "/bpe_export/model.safetensors"
for name in ("gpt2", "cl100k_base", "o200k_base", "tokenizer.bpe"):
    t = attnlab_tokenizer.load_file(tmp + "/bpe_export/" + name) if name == "tokenizer.bpe" else \
        attnlab_tokenizer.from_name(name, os.path.join(root, "data", "bpe"))
    want = [int(x) for x in open(tmp + "/ids_%s.txt" % name).read().split()]
    got = t.encode(text)
    assert got == want, "%s: Python's ids differ from bin/tokenize encode's at %d" % (
        name, next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want))))
    assert t.decode(got) == text, name
    print("outside: %s: Python's %d ids of a multilingual text equal bin/tokenize encode's" % (name, len(got)))
lm = attnlab_torch.load(export)
assert lm.cfg.vocab_size == 300 and lm.tokenizer.vocab == 300
assert attnlab_torch.load(tmp + "/run/checkpoint.h5").tokenizer.tokens == lm.tokenizer.tokens, "/tokenizer"
ids = [int(x) for x in open(tmp + "/probe_ids.txt").read().split()]
assert attnlab_torch.encode(lm, open(tmp + "/probe.txt", "rb").read()) == ids
run = lambda *a: subprocess.run([sys.executable, os.path.join(root, "python", "attnlab_torch.py"), export] + list(a),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True).stdout.decode()
by_ids = run("--ids", tmp + "/probe_ids.txt", "--generate", "12")
by_text = run("--text-file", tmp + "/probe.txt", "--generate", "12")
more = attnlab_torch.greedy(lm, ids, 12)[len(ids):]
with open(tmp + "/more_ids.txt", "w") as f:
    f.write(" ".join(map(str, more)) + "\n")
c_text = subprocess.run([build + "/tokenize", "decode", "--tokenizer", tmp + "/bpe_export/tokenizer.bpe",
                         "--in", tmp + "/more_ids.txt"], stdout=subprocess.PIPE, check=True).stdout
line = "the greedy continuation: %r" % c_text.decode("utf-8", "replace")
assert line in by_ids and by_ids == by_text, "the loader printed:\n%s\n%s\nexpected: %s" % (by_ids, by_text, line)
print("outside: the loader's --ids and --text give the greedy continuation, decoded as bin/tokenize decode does")
for f in sorted(os.listdir(os.path.join(root, "tests", "fixtures", "hostile"))):
    if not f.endswith(".tok"):
        continue
    path = os.path.join(root, "tests", "fixtures", "hostile", f)
    c = subprocess.run([build + "/tokenize", "encode", "--tokenizer", path], input=b"x",
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).stderr.decode().strip()
    try:
        attnlab_tokenizer.load_file(path)
        py = "loaded"
    except attnlab_tokenizer.CheckpointError as e:
        py = "tokenize encode: " + str(e)
    assert c == py, "%s: C says %r, Python %r" % (f, c, py)
print("outside: hostile tokenizer files refused with the C reader's messages")
PYEOF

# 5. train --dump-state of a run with documents and carried states against the
# PyTorch reference (bench/torch_ref/compare_dump.py): the dump's document
# flags are what the step used (with them cleared, the reference disagrees), a
# frozen parameter's missing gradient is listed, not a KeyError, and carried
# states that are not zero are refused with a sentence.
$PY - "$TMP/dump_corpus.txt" <<'PYEOF'
import random, sys
random.seed(1)
words = "the light and darkness was good evening morning day".split()
with open(sys.argv[1], "w") as f:
    for _ in range(300):
        f.write(" ".join(random.choice(words) for _ in range(random.randint(3, 30))) + "\n\n")
PYEOF
"$BUILD/train" --config "$ROOT/configs/tiny_hybrid.ini" --set "data.corpus=$TMP/dump_corpus.txt" \
    --set "data.cache_dir=$TMP/dump_cache" --set data.documents=blank_line --set data.seq_len=64 \
    --set data.batch_size=4 --set data.order=streams --set train.carry_state=true \
    --set "train.run_dir=$TMP/dump_run" --dump-state "$TMP/dump.h5" >/dev/null 2>&1 ||
    { echo "outside: train --dump-state failed"; exit 1; }
cmp_dump() { $PY "$ROOT/bench/torch_ref/compare_dump.py" --tol "$tol" "$@"; }
cmp_dump "$TMP/dump.h5" >"$TMP/cmp.txt" || { echo "outside: compare_dump on a documents + carry dump:"; cat "$TMP/cmp.txt"; exit 1; }
cp "$TMP/dump.h5" "$TMP/dump_edit.h5"
$PY -c 'import h5py, sys; f = h5py.File(sys.argv[1], "r+"); assert f["doc_start"][:, 1:].any(); f["doc_start"][...] = 0' \
    "$TMP/dump_edit.h5"
! cmp_dump "$TMP/dump_edit.h5" >/dev/null || { echo "outside: compare_dump ignores the dump's document flags"; exit 1; }
cp "$TMP/dump.h5" "$TMP/dump_edit.h5"
$PY -c 'import h5py, sys; f = h5py.File(sys.argv[1], "r+"); del f["grads/norm_f"]' "$TMP/dump_edit.h5"
out=$(cmp_dump "$TMP/dump_edit.h5") || { echo "outside: compare_dump with a frozen parameter:"; echo "$out"; exit 1; }
grep -q "no gradient in the dump (frozen in the C step), not compared: norm_f" <<<"$out" ||
    { echo "outside: compare_dump did not list the frozen parameter:"; echo "$out"; exit 1; }
cp "$TMP/dump.h5" "$TMP/dump_edit.h5"
$PY -c 'import h5py, sys; f = h5py.File(sys.argv[1], "r+"); f["initial_state/0"][0] = 1' "$TMP/dump_edit.h5"
msg=$(cmp_dump "$TMP/dump_edit.h5" 2>&1 || true)
grep -q "starts from carried states that are not zero (initial_state 0" <<<"$msg" ||
    { echo "outside: compare_dump on nonzero carried states printed:"; echo "$msg"; exit 1; }
echo "outside: --dump-state of a documents + carry run equals the PyTorch reference; frozen and carried cases: OK"
