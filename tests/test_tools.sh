#!/usr/bin/env bash
# tests/test_tools.sh: the project's Python and bench tools, which no build
# changes, so the test command runs this once (tests/test_outside.sh runs
# for each build):
#  1. the PyTorch loader refuses hostile checkpoints and exports (crafted
#     HDF5 and safetensors files, tests/fixtures/hostile/) and hostile
#     tokenizer files with the C loader's messages (tests/python/test_loader_*.py);
#  2. the GPU benchmark's per-layer torch.compile path equals the eager model;
#     the fla anchor's swap, with a PyTorch double of fla, equals the
#     reference; throughput.py --kernels without a GPU says why;
#  3. bench/ncu_table.py's per-kernel table on a fixture counted by hand;
#  4. the bench scripts write under the build folder or --out, never over docs/.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/attnlab-tools-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
PY=/usr/bin/python3

# 1. The PyTorch loader's refusals of hostile files.
for t in "$ROOT"/tests/python/test_loader_*.py; do
    TMPDIR="$TMP" $PY "$t" 2>"$TMP/pytest.log" || { cat "$TMP/pytest.log"; echo "$t failed"; exit 1; }
    tail -1 "$TMP/pytest.log" | grep -qx OK || { cat "$TMP/pytest.log"; echo "$t: no OK"; exit 1; }
done
echo "tools: the PyTorch loader refuses hostile files with the C loader's messages: OK"

# 2. The GPU benchmark's per-layer torch.compile (bench/torch_ref/throughput.py
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
print("tools: the benchmark's per-layer compile path equals the eager model (loss and %d gradients)" % len(ga))
PYEOF

# The fla anchor's swap (bench/torch_ref/fla_model.py) with a pure-PyTorch double of
# fla's calls equals the reference bit for bit; its check fails a wrong swap; the
# model FLOPs of bench/gpu_vs_stack.sh's MFU against a count by hand.
TMPDIR="$TMP" $PY "$ROOT/tests/python/test_anchor_swap.py" 2>"$TMP/pytest.log" ||
    { cat "$TMP/pytest.log"; echo "tests/python/test_anchor_swap.py failed"; exit 1; }
echo "tools: the fla anchor's swap equals the reference bit for bit; model FLOPs by hand: OK"

# throughput.py --kernels lists GPU kernels: without --device cuda it says so
# and stops, before any work.
msg=$($PY "$ROOT/bench/torch_ref/throughput.py" "$ROOT/configs/tiny_gdn.ini" --kernels 3 2>&1) &&
    { echo "throughput.py --kernels ran on the CPU"; exit 1; }
grep -qF -- "--kernels lists GPU kernels: it needs --device cuda" <<<"$msg" ||
    { echo "throughput.py --kernels on the CPU printed:"; echo "$msg"; exit 1; }
echo "tools: throughput.py --kernels without a GPU says why: OK"

# 3. bench/ncu_table.py (the GPU per-kernel table) on a fixture whose figures
# are counted by hand: k_a 2 launches, 4 ms, 4e9 bytes = 1000 GB/s, 25 % of a
# 4000 GB/s ceiling, 80 % of the 5 ms; k_b 1 ms, no traffic; the last launch's
# occupancy columns.
table=$($PY "$ROOT/bench/ncu_table.py" --ceiling 4000 "$ROOT/tests/fixtures/ncu_small.csv")
want_a='| k_a | 2 | 4.00 | 80.0 % | 1000 | 25 % | 32 | 256 | 82.5 | 11.0 | 2.0 |'
want_b='| k_b | 1 | 1.00 | 20.0 % | 0 | 0 % | 255 | 256 | 12.5 | 20.0 | 30.0 |'
grep -qF "3 kernel launches, 5.00 ms of kernel time" <<<"$table" && grep -qxF "$want_a" <<<"$table" &&
    grep -qxF "$want_b" <<<"$table" || { echo "ncu_table.py on tests/fixtures/ncu_small.csv printed:"; echo "$table"; exit 1; }
! $PY "$ROOT/bench/ncu_table.py" "$ROOT/README.md" 2>/dev/null || { echo "ncu_table.py accepted a file with no ncu CSV"; exit 1; }
echo "tools: bench/ncu_table.py's per-kernel table on a counted fixture: OK"

# 4. A bench script replaces committed results only when --out names their
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
        { echo "tools: bench/longctx_tasks.sh plot wrote no table or plot in $d"; exit 1; }
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
        { echo "tools: bench/run_all.sh docs wrote no $png.png under the build folder or --img"; exit 1; }
done
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then   # the page's note on old data asks git
    for page in "$TMP/bench_build/bench/run_all/benchmarks.md" "$TMP/ra_page/b.md"; do
        cmp -s "$page" "$ROOT/docs/benchmarks.md" ||
            { echo "tools: bench/run_all.sh docs writes another page than docs/benchmarks.md:"; diff "$page" "$ROOT/docs/benchmarks.md" | head -20; exit 1; }
    done
fi
mkdir -p "$TMP/ls_out"
cp "$ROOT"/docs/bench/linear_share*.tsv "$TMP/ls_out/"
"$ROOT/bench/linear_share.sh" --docs --out "$TMP/ls_out" >/dev/null
machine_lines() { grep -v '^| \(CPU\|kernel\|budget\) |' "$1"; }
[ "$(machine_lines "$TMP/ls_out/linear_share.md")" = "$(machine_lines "$ROOT/docs/linear_share.md")" ] ||
    { echo "tools: bench/linear_share.sh --docs writes another page than docs/linear_share.md:"
      diff <(machine_lines "$TMP/ls_out/linear_share.md") <(machine_lines "$ROOT/docs/linear_share.md") | head -20; exit 1; }
[ -s "$TMP/ls_out/linear_share.png" ] && [ -s "$TMP/ls_out/linear_share_curves.png" ] ||
    { echo "tools: bench/linear_share.sh --docs wrote no plots in --out"; exit 1; }
mkdir -p "$TMP/bench_build/bench/mqar_sweep"
for f in "$ROOT"/docs/bench/mqar/*_*.tsv "$ROOT"/docs/bench/mqar/*.txt; do cp "$f" "$TMP/bench_build/bench/mqar_sweep/"; done
BUILD="$TMP/bench_build" "$ROOT/bench/mqar_sweep.sh" plot >/dev/null
for f in all.tsv curves.tsv; do
    cmp -s "$TMP/bench_build/bench/mqar_sweep/$f" "$ROOT/docs/bench/mqar/$f" ||
        { echo "tools: bench/mqar_sweep.sh plot made another $f than docs/bench/mqar/$f from the same runs"; exit 1; }
done
[ -s "$TMP/bench_build/bench/mqar_sweep/mqar_curves.png" ] || { echo "tools: bench/mqar_sweep.sh plot wrote no plot"; exit 1; }
[ "$before" = "$(sum_docs)" ] && [ -z "$(find "$ROOT/docs" -newer "$TMP/docs_mark" -print -quit)" ] ||
    { echo "tools: a bench script wrote into docs/ without --out"; exit 1; }
echo "tools: bench/longctx_tasks.sh, run_all.sh, linear_share.sh and mqar_sweep.sh write under the build folder or --out, never over docs/; the pages they write are the committed ones: OK"
