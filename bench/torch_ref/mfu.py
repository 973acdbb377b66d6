#!/usr/bin/python3
"""Model FLOPs of a training step, and bench/gpu_vs_stack.sh's tables (tokens/s, MFU, ratios).

    mfu.py flops CONFIG [--set S.K=V ...]        model FLOPs per token of a training step, by part
    mfu.py table RUNS_TSV [--peak FLOP_PER_S]    the markdown tables of gpu_vs_stack.sh's runs

MFU = model FLOPs per token x tokens/s / peak, the peak by default the H100's (SXM) dense bf16
tensor-core 989 TFLOP/s (an H200 has the same), for every column: fp32 and tf32 runs too are
measured against what the GPU could do in bf16. RUNS_TSV: one line per run, tab-separated:
config path, column, round, tokens/s or a word (refused, failed, timeout); a cell is the median
of a column's numeric rounds, else the first word.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fla_model import config_with_sets  # noqa: E402
from model import param_shapes  # noqa: E402

H100_BF16_DENSE = 989e12
COLUMNS = [("attnlab_fp32", "attnlab fp32"), ("attnlab_tf32", "attnlab tf32"), ("attnlab_bf16", "attnlab bf16"),
           ("anchor_fp32", "anchor fp32"), ("anchor_bf16", "anchor bf16 autocast"),
           ("anchor_bf16_compile", "anchor bf16 autocast, compiled")]
RATIOS = [("attnlab_fp32", "anchor_fp32"), ("attnlab_tf32", "anchor_bf16"), ("attnlab_bf16", "anchor_bf16"),
          ("attnlab_bf16", "anchor_bf16_compile")]


def model_flops_per_token(cfg, T):
    """(total, {part: FLOPs}) of one training step (forward + backward) per token, T tokens a row.

    Counted as model FLOPs (what the model needs, not what an implementation spends: no
    recomputation, no padding), a multiply-add = 2 FLOPs, the backward = 2 x the forward:
      params: 6 x the parameters: every weight meets each token once in a product (projections,
        MLP, short convolutions, the head; a tied embedding counted once, as the head; an untied
        one is a lookup, not counted). Norm gains, A_log, dt_bias, D are counted too though
        elementwise: under 0.1 % of the parameters.
      attn: causal softmax attention, 3 x H (d_k + d_v) (T + 1) a layer: on average (T + 1)/2
        keys a query, q.k and p.v 2 d_k and 2 d_v FLOPs each.
      gla (linear, mamba, mamba2), chunked with chunk C: 3 x H [(d_k + d_v)(C + 1) + 4 d_k d_v]:
        the causal scores and products inside a chunk ((C + 1)/2 positions on average), q S and
        the state's k v^T update.
      gdn (kda too; gdp n times, over its n steps a token), chunked WY form: 3 x H [d_k (C - 1)
        (K K^T, strictly lower) + C^2/3 (inverting I + A) + 2 d_k (C + 1) (W = T K b, P = Q K^T
        with its diagonal) + 2 d_v (C + 1) (U = T V, P D) + 6 d_k d_v (W S, q S, K^T D)].
    Elementwise work (norms, gates, activations, softmax exponentials, the optimizer) is not
    counted."""
    shapes = param_shapes(cfg)
    n = 0
    for name, shape in shapes.items():
        if name == "embed" and not cfg.tied_embeddings:
            continue
        size = 1
        for s in shape:
            size *= s
        n += size
    H, dk, dv = cfg.n_heads, cfg.d_k, cfg.d_v
    C = min(cfg.chunk_size, T)
    per_kind = {
        "attn": 3 * H * (dk + dv) * (T + 1),
        "gla": 3 * H * ((dk + dv) * (C + 1) + 4 * dk * dv),
        "gdn": 3 * H * (dk * (C - 1) + C * C / 3 + 2 * dk * (C + 1) + 2 * dv * (C + 1) + 6 * dk * dv),
    }
    family = {"attn": "attn", "linear": "gla", "mamba": "gla", "mamba2": "gla", "gdn": "gdn", "kda": "gdn",
              "gdp": "gdn"}
    parts = {"params": 6.0 * n}
    for kind in cfg.layers:
        if kind not in family:
            raise ValueError("no FLOP count for mixer '%s'" % kind)
        steps = cfg.gdp_steps if kind == "gdp" else 1
        parts[kind] = parts.get(kind, 0.0) + steps * per_kind[family[kind]]
    return sum(parts.values()), parts


def load(path, sets=()):
    """(ModelConfig, T) of a config file."""
    with open(path) as f:
        text = f.read()
    try:
        cfg, cp = config_with_sets(text, list(sets))
    except ValueError as e:
        raise ValueError("%s: %s" % (path, e))
    T = int(cp["data"].get("seq_len", 256)) if cp.has_section("data") else 256
    return cfg, T


def cmd_flops(args):
    cfg, T = load(args.config, args.set)
    total, parts = model_flops_per_token(cfg, T)
    print("%s: T %d, %.4g model FLOPs per token of a training step" % (os.path.basename(args.config), T, total))
    for part, f in parts.items():
        print("  %-8s %.4g (%.1f %%)" % (part, f, 100 * f / total))


def median(v):
    v = sorted(v)
    k = len(v)
    return v[k // 2] if k % 2 else 0.5 * (v[k // 2 - 1] + v[k // 2])


def read_runs(path):
    """{(config path, column): [values]} in the order met, numbers as floats."""
    cells = {}
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 4:
                raise ValueError("%s:%d: %d fields, expected 4 (config, column, round, tokens/s)"
                                 % (path, i, len(parts)))
            cfg, col, _, value = parts
            try:
                value = float(value)
            except ValueError:
                pass
            cells.setdefault((cfg, col), []).append(value)
    return cells


def cell_value(values):
    nums = [v for v in values if isinstance(v, float)]
    return median(nums) if nums else (values[0] if values else None)


def tables(cells, peak):
    configs = list(dict.fromkeys(c for c, _ in cells))
    cols = [(k, label) for k, label in COLUMNS if any((c, k) in cells for c in configs)]
    flops = {c: model_flops_per_token(*load(c))[0] for c in configs}
    out = ["Tokens/s of a whole training step (median of the rounds), MFU in brackets (model FLOPs x tokens/s "
           "/ %.0f TFLOP/s):" % (peak / 1e12), ""]
    out.append("| model | GFLOP/token | " + " | ".join(label for _, label in cols) + " |")
    out.append("| --- | ---: | " + " | ".join("---:" for _ in cols) + " |")
    for c in configs:
        row = []
        for k, _ in cols:
            v = cell_value(cells.get((c, k), []))
            row.append("" if v is None else "%s (%.1f %%)" % (format(v, ",.0f"), 100 * flops[c] * v / peak)
                       if isinstance(v, float) else v)
        out.append("| %s | %.3f | %s |" % (os.path.basename(c).replace(".ini", ""), flops[c] / 1e9, " | ".join(row)))
    present = {k for _, k in cells}
    ratios = [(a, b) for a, b in RATIOS if a in present and b in present]
    if ratios:
        label = dict(COLUMNS)
        out += ["", "Ratios (attnlab / anchor):", ""]
        out.append("| model | " + " | ".join("%s / %s" % (label[a], label[b]) for a, b in ratios) + " |")
        out.append("| --- | " + " | ".join("---:" for _ in ratios) + " |")
        for c in configs:
            row = []
            for a, b in ratios:
                x, y = cell_value(cells.get((c, a), [])), cell_value(cells.get((c, b), []))
                row.append("%.2f" % (x / y) if isinstance(x, float) and isinstance(y, float) and y > 0 else "-")
            out.append("| %s | %s |" % (os.path.basename(c).replace(".ini", ""), " | ".join(row)))
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd")
    f = sub.add_parser("flops", help="model FLOPs per token of a config's training step")
    f.add_argument("config")
    f.add_argument("--set", action="append", default=[], metavar="S.K=V")
    t = sub.add_parser("table", help="gpu_vs_stack.sh's tables from its runs")
    t.add_argument("runs")
    t.add_argument("--peak", type=float, default=H100_BF16_DENSE, help="FLOP/s (default 989e12)")
    args = p.parse_args(argv)
    try:
        if args.cmd == "flops":
            cmd_flops(args)
        elif args.cmd == "table":
            if args.peak <= 0:
                p.error("--peak must be > 0")
            sys.stdout.write(tables(read_runs(args.runs), args.peak))
        else:
            p.error("say what to do: flops or table")
    except (OSError, ValueError, KeyError) as e:
        sys.exit("mfu: %s" % e)


if __name__ == "__main__":
    main()
