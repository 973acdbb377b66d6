#!/usr/bin/python3
"""Where a PyTorch training step goes: the torch.profiler counterpart of
`build/train_bench --config X --profile`.

    /usr/bin/python3 bench/torch_ref/op_profile.py configs/tiny_mamba.ini --threads 2 [--steps 3]

Runs forward + backward of the reference LM (chunked forms, float32, random
tokens, B and T from the config) under torch.profiler and prints, per step,
the self time of the top aten ops, and the share of the matrix products
(aten::mm, bmm, addmm, matmul kernels) against the rest. Profiling adds
overhead of its own: compare shares, not absolute times, with the C profile.
"""

import argparse
import os
import sys

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("config")
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--rows", type=int, default=15)
args = ap.parse_args()
if args.threads > 0:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(args.threads)

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import LM, model_config_from_ini, parse_ini  # noqa: E402


def main():
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    with open(args.config) as f:
        text = f.read()
    cfg = model_config_from_ini(text)
    cp = parse_ini(text)
    data = cp["data"] if cp.has_section("data") else {}
    B, T = int(data.get("batch_size", 16)), int(data.get("seq_len", 256))
    lm = LM(cfg, dtype=torch.float32, seed=1337, form="chunked")
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
    y = torch.randint(0, cfg.vocab_size, (B, T), generator=gen)
    for _ in range(2):   # warm-up
        loss, _ = lm.loss(x, y)
        loss.backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            loss, _ = lm.loss(x, y)
            loss.backward()
    rows = [(e.key, e.self_cpu_time_total / 1e3 / args.steps, e.count / args.steps)
            for e in prof.key_averages() if e.self_cpu_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    mm = sum(r[1] for r in rows if r[0] in ("aten::mm", "aten::bmm", "aten::addmm", "aten::addbmm", "aten::baddbmm"))
    print("config: %s   B %d, T %d, threads %d, torch %s" % (os.path.basename(args.config), B, T,
                                                           torch.get_num_threads(), torch.__version__))
    print("%-40s %8s %10s %6s" % ("op (self time, per step)", "calls", "ms", "share"))
    for name, ms, calls in rows[:args.rows]:
        print("%-40s %8.1f %10.2f %5.1f%%" % (name[:40], calls, ms, 100 * ms / total))
    print("%-40s %8s %10.2f" % ("all ops (forward + backward)", "", total))
    print("matrix products (mm, bmm, addmm): %.2f ms = %.1f%%; the rest %.2f ms" % (mm, 100 * mm / total, total - mm))


if __name__ == "__main__":
    main()
