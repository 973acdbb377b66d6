#!/usr/bin/env python3
"""bench/ncu_table.py: per-kernel time, DRAM traffic and occupancy of a GPU run,
from Nsight Compute's raw CSV (bench/gpu_kernels.sh writes it), as a markdown
table: kernels grouped by name, largest total time first.

    ncu_table.py [--top N] [--ceiling GBS] [--peak TFLOPS] NCU_CSV

Columns: launches; total ms (the sum of gpu__time_duration over launches: ncu
runs kernels one at a time, so the sum is the kernels' own time, without
launch gaps); share of all kernels' time; DRAM GB/s (bytes read + written /
time) and that as a share of the copy ceiling (--ceiling, GB/s, default
4237: gpu_ceiling's device-to-device copy on the H200, docs/cuda.md);
registers per thread; threads per block; warps active (% of the SM's peak,
i.e. the occupancy achieved); the FMA pipe's busy share and the shared-memory
pipe's (what a compute-bound kernel would fill). Standard library only.
"""
import argparse
import collections
import csv
import io
import sys

METRICS = {
    "time": "gpu__time_duration.sum",
    "rd": "dram__bytes_read.sum",
    "wr": "dram__bytes_write.sum",
    "regs": "launch__registers_per_thread",
    "block": "launch__block_size",
    "warps": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "fma": "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
    "smem": "l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed",
}
# ncu's own units for the columns read; anything else is refused rather than misread.
UNITS = {"time": {"ns": 1e-9, "us": 1e-6, "usecond": 1e-6, "nsecond": 1e-9, "ms": 1e-3, "msecond": 1e-3},
         "rd": {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9},
         "wr": {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}}


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return float("nan")


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    # The program's own output comes first: the CSV begins at the line "ID",...
    start = 0 if text.startswith('"ID",') else text.find('\n"ID",') + 1
    if start <= 0 and not text.startswith('"ID",'):
        sys.exit(f"{path}: no Nsight Compute CSV header (a line starting \"ID\",) found")
    rows = list(csv.reader(io.StringIO(text[start:])))
    if len(rows) < 3:
        sys.exit(f"{path}: no kernels in the CSV")
    header, units = rows[0], rows[1]
    col = {h: i for i, h in enumerate(header)}
    missing = [m for m in METRICS.values() if m not in col]
    if missing or "Kernel Name" not in col:
        sys.exit(f"{path}: metrics missing from the CSV: {', '.join(missing or ['Kernel Name'])}")
    scale = {}
    for key, table in UNITS.items():
        unit = units[col[METRICS[key]]]
        if unit not in table:
            sys.exit(f"{path}: {METRICS[key]} in unit '{unit}', expected one of {sorted(table)}")
        scale[key] = table[unit]
    return rows[2:], col, scale


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30, help="kernels listed (default 30; the rest summed in one row)")
    ap.add_argument("--ceiling", type=float, default=4237.0, help="DRAM ceiling in GB/s (default 4237)")
    args = ap.parse_args()
    rows, col, scale = read(args.csv)
    groups = collections.OrderedDict()
    for r in rows:
        name = r[col["Kernel Name"]]
        short = name.split("(")[0].replace("void ", "")
        if len(short) > 64:
            short = short[:61] + "..."
        g = groups.setdefault(short, {"n": 0, "t": 0.0, "bytes": 0.0, "last": r})
        g["n"] += 1
        g["t"] += number(r[col[METRICS["time"]]]) * scale["time"]
        g["bytes"] += number(r[col[METRICS["rd"]]]) * scale["rd"] + number(r[col[METRICS["wr"]]]) * scale["wr"]
        g["last"] = r
    total = sum(g["t"] for g in groups.values())
    order = sorted(groups.items(), key=lambda kv: -kv[1]["t"])
    print(f"{len(rows)} kernel launches, {total * 1e3:.2f} ms of kernel time; DRAM ceiling {args.ceiling:.0f} GB/s")
    print()
    print("| kernel | launches | ms | share | DRAM GB/s | of ceiling | regs | threads | warps active % | FMA pipe % "
          "| smem pipe % |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rest = {"n": 0, "t": 0.0, "bytes": 0.0}
    for i, (name, g) in enumerate(order):
        if i >= args.top:
            for k in rest:
                rest[k] += g[k]
            continue
        r = g["last"]
        gbs = g["bytes"] / g["t"] / 1e9 if g["t"] > 0 else 0.0
        cells = [name, str(g["n"]), f"{g['t'] * 1e3:.2f}", f"{100 * g['t'] / total:.1f} %", f"{gbs:.0f}",
                 f"{100 * gbs / args.ceiling:.0f} %", r[col[METRICS["regs"]]], r[col[METRICS["block"]]],
                 f"{number(r[col[METRICS['warps']]]):.1f}", f"{number(r[col[METRICS['fma']]]):.1f}",
                 f"{number(r[col[METRICS['smem']]]):.1f}"]
        print("| " + " | ".join(cells) + " |")
    if rest["n"]:
        gbs = rest["bytes"] / rest["t"] / 1e9 if rest["t"] > 0 else 0.0
        print(f"| ({len(order) - args.top} others) | {rest['n']} | {rest['t'] * 1e3:.2f} | "
              f"{100 * rest['t'] / total:.1f} % | {gbs:.0f} | {100 * gbs / args.ceiling:.0f} % | | | | | |")
    print()
    print("regs, threads, warps, FMA and smem columns: the group's last launch.")


if __name__ == "__main__":
    main()
