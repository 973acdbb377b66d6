#!/usr/bin/env python3
"""bench/dist_model.py: a model of data-parallel scaling over several machines.

    python3 bench/dist_model.py [docs/bench/dist.tsv]

From bench/dist_bench.sh's measurements (the compute time of one training
step of each bundled config on one core of this machine, 1 rank x 1 thread)
and the bytes all-reduced per step (4 bytes per trainable parameter, float32),
with the ring all-reduce's cost 2 (N - 1) / N * bytes / bandwidth (latency
and the overlap with the backward left out, both of which the bench measures
separately), for 1, 10 and 100 Gbit/s links:

  strong scaling: the config's global batch shared by N ranks,
      t(N) = t_c / N + ring(N);  efficiency = t_c / (N t(N));
      at most as many ranks as the batch has windows;
  weak scaling: every rank keeps the config's batch (the global batch grows N-fold),
      t(N) = t_c + ring(N);  efficiency = t_c / t(N).

The largest N with efficiency >= 90% is given for both. Models 10x and 100x
the size of tiny_gdn keep its tokens per step: bytes and compute both grow
10x and 100x (compute per token ~ 6 x parameters).
"""
import csv
import statistics
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "docs/bench/dist.tsv"
rows = [r for r in csv.DictReader(open(path), delimiter="\t") if r["layout"] == "1x1"]
WINDOWS = 16  # every bundled config: batch 16 x accum 1
models = []
for r in rows:
    models.append((r["config"][:-4], int(r["params"]), float(r["step_ms"]) / 1e3))
gdn = next(m for m in models if m[0] == "tiny_gdn")
models.append(("tiny_gdn x10", gdn[1] * 10, gdn[2] * 10))
models.append(("tiny_gdn x100", gdn[1] * 100, gdn[2] * 100))


def ring(n, nbytes, gbit):
    return 2 * (n - 1) / n * nbytes / (gbit * 1e9 / 8) if n > 1 else 0.0


def nmax(eff, limit):
    best = 1
    for n in range(2, limit + 1):
        if eff(n) >= 0.9:
            best = n
    return best


print("| model | parameters | MB all-reduced per step | compute per step, 1 core | link | step at N = 2 / 8 / 16 (strong) "
      "| largest N >= 90%, strong | largest N >= 90%, weak |")
print("| --- | ---: | ---: | ---: | --- | --- | ---: | ---: |")
for name, params, tc in models:
    nbytes = 4 * params
    for gbit in (1, 10, 100):
        strong = lambda n: tc / (n * (tc / n + ring(n, nbytes, gbit)))
        weak = lambda n: tc / (tc + ring(n, nbytes, gbit))
        steps = " / ".join("%.0f ms" % (1e3 * (tc / n + ring(n, nbytes, gbit))) for n in (2, 8, 16))
        w = nmax(weak, 100000)
        print("| %s | %s | %.1f | %.0f ms | %d Gbit/s | %s | %d | %s |" % (
            name, format(params, ","), nbytes / 1e6, 1e3 * tc, gbit, steps, nmax(strong, WINDOWS),
            "any" if w == 100000 else str(w)))
