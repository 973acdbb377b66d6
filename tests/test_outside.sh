#!/usr/bin/env bash
# tests/test_outside.sh BUILD_DIR: the project as seen from outside it, for one
# build (float32 or float64):
#  1. `cmake --install` into a scratch prefix; the installed train and
#     generate answer --help;
#  2. examples/ built against the installed library both ways (pkg-config and
#     find_package) and run (a custom op's gradcheck, a custom mixer's LM
#     that learns);
#  3. the README's example error messages equal what train prints;
#  4. the PyTorch loader refuses hostile checkpoints and exports (crafted
#     HDF5 and safetensors files, tests/fixtures/hostile/) with the C loader's
#     messages (tests/python/test_loader_*.py);
#     a tiny model of every reference mixer trained, exported with
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
#  5. the GPU benchmark's per-layer torch.compile path equals the eager model;
#     the fla anchor's swap, with a PyTorch double of fla, equals the reference;
#  6. bench/ncu_table.py's per-kernel table on a fixture counted by hand.
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

# 4. export and the PyTorch loader: first its refusals of hostile files, then
# its logits against the C model's, then a BPE model's tokenizer.
for t in "$ROOT"/tests/python/test_loader_*.py; do
    TMPDIR="$TMP" $PY "$t" 2>"$TMP/pytest.log" || { cat "$TMP/pytest.log"; echo "$t failed"; exit 1; }
    tail -1 "$TMP/pytest.log" | grep -qx OK || { cat "$TMP/pytest.log"; echo "$t: no OK"; exit 1; }
done
echo "outside ($precision): the PyTorch loader refuses hostile files with the C loader's messages: OK"
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

# 5. The GPU benchmark's per-layer torch.compile (bench/torch_ref/throughput.py
# --compile-layers) runs the model's own layers: with the compiler replaced by
# the identity (this torch may have none) its loss and every gradient equal the
# eager model's, float64, on a hybrid of every mixer the benchmark compiles.
$PY - "$ROOT" <<'PYEOF'
import os, sys
import torch
root = sys.argv[1]
sys.path.insert(0, os.path.join(root, "bench", "torch_ref"))
sys.argv = ["throughput.py", os.path.join(root, "configs", "tiny_hybrid.ini")]
torch.compile = lambda f, mode=None: f
import throughput
from model import LM, model_config_from_ini
cfg = model_config_from_ini("[model]\nlayers = gdn,attn,mamba,linear\nd_model = 32\nn_heads = 2\nd_k = 16\nd_v = 16\nd_ff = 64\nchunk_size = 8\nconv_size = 4\n")
lm = LM(cfg, dtype=torch.float64, seed=3, form="chunked")
step = throughput.layerwise_compiled_loss(lm)
g = torch.Generator().manual_seed(4)
x = torch.randint(0, cfg.vocab_size, (2, 21), generator=g)
y = torch.randint(0, cfg.vocab_size, (2, 21), generator=g)
a, _ = lm.loss(x, y)
b, _ = step(x, y)
ga = torch.autograd.grad(a, lm.parameters())
gb = torch.autograd.grad(b, lm.parameters())
err = max(float((u - v).abs().max()) for u, v in zip(ga, gb))
assert float(a) == float(b) and err == 0.0, "per-layer compile path: loss %r vs %r, gradients differ by %g" % (float(a), float(b), err)
print("outside: the benchmark's per-layer compile path equals the eager model (loss and %d gradients)" % len(ga))
PYEOF

# The fla anchor's swap (bench/torch_ref/fla_model.py) with a pure-PyTorch double of
# fla's calls equals the reference bit for bit; its check fails a wrong swap; the
# model FLOPs of bench/gpu_vs_stack.sh's MFU against a count by hand.
TMPDIR="$TMP" $PY "$ROOT/tests/python/test_anchor_swap.py" 2>"$TMP/pytest.log" ||
    { cat "$TMP/pytest.log"; echo "tests/python/test_anchor_swap.py failed"; exit 1; }
echo "outside: the fla anchor's swap equals the reference bit for bit; model FLOPs by hand: OK"

# throughput.py --kernels lists GPU kernels: without --device cuda it says so
# and stops, before any work.
msg=$($PY "$ROOT/bench/torch_ref/throughput.py" "$ROOT/configs/tiny_gdn.ini" --kernels 3 2>&1) &&
    { echo "throughput.py --kernels ran on the CPU"; exit 1; }
grep -qF -- "--kernels lists GPU kernels: it needs --device cuda" <<<"$msg" ||
    { echo "throughput.py --kernels on the CPU printed:"; echo "$msg"; exit 1; }
echo "outside: throughput.py --kernels without a GPU says why: OK"

# 6. bench/ncu_table.py (the GPU per-kernel table) on a fixture whose figures
# are counted by hand: k_a 2 launches, 4 ms, 4e9 bytes = 1000 GB/s, 25 % of a
# 4000 GB/s ceiling, 80 % of the 5 ms; k_b 1 ms, no traffic; the last launch's
# occupancy columns.
table=$($PY "$ROOT/bench/ncu_table.py" --ceiling 4000 "$ROOT/tests/fixtures/ncu_small.csv")
want_a='| k_a | 2 | 4.00 | 80.0 % | 1000 | 25 % | 32 | 256 | 82.5 | 11.0 | 2.0 |'
want_b='| k_b | 1 | 1.00 | 20.0 % | 0 | 0 % | 255 | 256 | 12.5 | 20.0 | 30.0 |'
grep -qF "3 kernel launches, 5.00 ms of kernel time" <<<"$table" && grep -qxF "$want_a" <<<"$table" &&
    grep -qxF "$want_b" <<<"$table" || { echo "ncu_table.py on tests/fixtures/ncu_small.csv printed:"; echo "$table"; exit 1; }
! $PY "$ROOT/bench/ncu_table.py" "$ROOT/README.md" 2>/dev/null || { echo "ncu_table.py accepted a file with no ncu CSV"; exit 1; }
echo "outside: bench/ncu_table.py's per-kernel table on a counted fixture: OK"

# 7. A bench script replaces committed results only when --out names their
# folder: by default it writes under BUILD/bench/<script> (here: the plots and
# tables of bench/longctx_tasks.sh from a copy of the committed passkey runs,
# bench/run_all.sh docs, bench/linear_share.sh --docs and bench/mqar_sweep.sh
# plot from copies of the committed data). The pages the last two write are the committed ones, so a
# rerun keeps what was edited into them (linear_share.md but its machine
# lines: CPU cores, kernel and the corpus's size are read where it runs).
sum_docs() { (cd "$ROOT" && find docs -type f -print0 | sort -z | xargs -0 md5sum); }
before=$(sum_docs)
touch "$TMP/docs_mark"   # a file rewritten with the same bytes is newer than this
mkdir -p "$TMP/bench_build/bench/longctx_tasks" "$TMP/lc_out"
cp "$ROOT/docs/bench/longctx/passkey.tsv" "$TMP/bench_build/bench/longctx_tasks/"
cp "$ROOT/docs/bench/longctx/passkey.tsv" "$TMP/lc_out/"
BUILD="$TMP/bench_build" "$ROOT/bench/longctx_tasks.sh" plot >/dev/null
BUILD="$TMP/bench_build" "$ROOT/bench/longctx_tasks.sh" --out "$TMP/lc_out" plot >/dev/null
for d in "$TMP/bench_build/bench/longctx_tasks" "$TMP/lc_out"; do
    [ -s "$d/passkey_table.md" ] && [ -s "$d/longctx_passkey.png" ] ||
        { echo "outside: bench/longctx_tasks.sh plot wrote no table or plot in $d"; exit 1; }
done
mkdir -p "$TMP/bench_build/bench/run_all" "$TMP/ra_out"
for f in train.tsv decode.tsv threads.tsv run.tsv mixer_bench.txt threads.txt rows_train.tsv rows_decode.tsv rows.txt; do
    cp "$ROOT/docs/bench/$f" "$TMP/bench_build/bench/run_all/"
    cp "$ROOT/docs/bench/$f" "$TMP/ra_out/"
done
BUILD="$TMP/bench_build" "$ROOT/bench/run_all.sh" docs >/dev/null
BUILD="$TMP/bench_build" "$ROOT/bench/run_all.sh" --out "$TMP/ra_out" --img "$TMP/ra_img" --page "$TMP/ra_page/b.md" docs >/dev/null
for png in train_throughput train_us_per_token train_cpu_per_token memory decode; do
    [ -s "$TMP/bench_build/bench/run_all/$png.png" ] && [ -s "$TMP/ra_img/$png.png" ] ||
        { echo "outside: bench/run_all.sh docs wrote no $png.png under the build folder or --img"; exit 1; }
done
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then   # the page's note on old data asks git
    for page in "$TMP/bench_build/bench/run_all/benchmarks.md" "$TMP/ra_page/b.md"; do
        cmp -s "$page" "$ROOT/docs/benchmarks.md" ||
            { echo "outside: bench/run_all.sh docs writes another page than docs/benchmarks.md:"; diff "$page" "$ROOT/docs/benchmarks.md" | head -20; exit 1; }
    done
fi
mkdir -p "$TMP/ls_out"
cp "$ROOT"/docs/bench/linear_share*.tsv "$TMP/ls_out/"
"$ROOT/bench/linear_share.sh" --docs --out "$TMP/ls_out" >/dev/null
machine_lines() { grep -v '^| \(CPU\|kernel\|budget\) |' "$1"; }
[ "$(machine_lines "$TMP/ls_out/linear_share.md")" = "$(machine_lines "$ROOT/docs/linear_share.md")" ] ||
    { echo "outside: bench/linear_share.sh --docs writes another page than docs/linear_share.md:"
      diff <(machine_lines "$TMP/ls_out/linear_share.md") <(machine_lines "$ROOT/docs/linear_share.md") | head -20; exit 1; }
[ -s "$TMP/ls_out/linear_share.png" ] && [ -s "$TMP/ls_out/linear_share_curves.png" ] ||
    { echo "outside: bench/linear_share.sh --docs wrote no plots in --out"; exit 1; }
mkdir -p "$TMP/bench_build/bench/mqar_sweep"
for f in "$ROOT"/docs/bench/mqar/*_*.tsv "$ROOT"/docs/bench/mqar/*.txt; do cp "$f" "$TMP/bench_build/bench/mqar_sweep/"; done
BUILD="$TMP/bench_build" "$ROOT/bench/mqar_sweep.sh" plot >/dev/null
for f in all.tsv curves.tsv; do
    cmp -s "$TMP/bench_build/bench/mqar_sweep/$f" "$ROOT/docs/bench/mqar/$f" ||
        { echo "outside: bench/mqar_sweep.sh plot made another $f than docs/bench/mqar/$f from the same runs"; exit 1; }
done
[ -s "$TMP/bench_build/bench/mqar_sweep/mqar_curves.png" ] || { echo "outside: bench/mqar_sweep.sh plot wrote no plot"; exit 1; }
[ "$before" = "$(sum_docs)" ] && [ -z "$(find "$ROOT/docs" -newer "$TMP/docs_mark" -print -quit)" ] ||
    { echo "outside: a bench script wrote into docs/ without --out"; exit 1; }
echo "outside: bench/longctx_tasks.sh, run_all.sh, linear_share.sh and mqar_sweep.sh write under the build folder or --out, never over docs/; the pages they write are the committed ones: OK"

# 8. train --dump-state of a run with documents and carried states against the
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
