#!/usr/bin/env python3
"""bench/equal_time.py: validation bits per byte of training runs at equal
training time (docs/training.md, "gdp against gdn and mamba").

    bench/equal_time.py [--runs DIR] [--out DIR] [--img DIR] [--name NAME] RUN...

RUN is a run folder (one that holds metrics.jsonl and config.ini) or the name
of one under --runs (default runs/ of the repository): `train --config
tiny_gdn.ini` writes runs/tiny_gdn. For each run this reads the validation
evaluations of metrics.jsonl ({"type":"eval"} lines: step, val_bpb) and the
wall time of the step each was made after (elapsed_s of that step's
{"type":"train"} line: seconds since the start, the earlier evaluations and
checkpoint writes included, as in every run of the same config), and the
tokens a step trains on (config.ini: seq_len x batch_size, x the ranks of
the "start" line).

Equal time: the shortest run's training time (the elapsed_s of its last
step). Each run's validation bits per byte at that time is interpolated
linearly in time between the two evaluations around it; a run whose first
evaluation came later than that has no value ("-"). A run's time is what
the machine gave it: runs made one after another on a shared machine met
different loads, so the table also gives each run's median tokens per second.

Output (--out DIR, default build/bench/equal_time; nothing under docs/ unless
named): DIR/NAME.tsv (one line per run), DIR/NAME_curves.tsv (every
evaluation: run, step, tokens, elapsed_s, val_bpb), DIR/NAME.md (the table
as Markdown), and NAME.png in the --img folder (default DIR; gnuplot):
validation bits per byte against training time and against tokens.
NAME defaults to equal_time.
"""
import argparse
import configparser
import json
import math
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The colours of bench/bench_lib.sh's mixer_colour, by the run's mixer (its
# layers' kinds when they are all one, else "hybrid").
COLOURS = {"attn": "#000000", "linear": "#1f77b4", "mamba": "#2ca02c", "mamba2": "#17becf", "gdn": "#d62728",
           "gdp": "#ff7f0e", "kda": "#e377c2", "hybrid": "#9467bd", "attn_dsa": "#bcbd22"}
EXTRA = ["#8c564b", "#7f7f7f", "#393b79", "#637939"]   # a run whose mixer has no colour above


def fail(msg):
    print(f"equal_time: {msg}", file=sys.stderr)
    sys.exit(1)


def run_dir(arg, runs):
    path = arg if os.path.isdir(arg) else os.path.join(runs, arg)
    if not os.path.isfile(os.path.join(path, "metrics.jsonl")):
        fail(f"{arg}: no metrics.jsonl in {path} (a run folder, or a run's name under {runs})")
    return path


def read_metrics(path):
    """(start line, {step: elapsed_s}, [(step, val_bpb)], [tok_per_s]) of path/metrics.jsonl."""
    start, elapsed, evals, speeds = None, {}, [], []
    name = os.path.join(path, "metrics.jsonl")
    with open(name, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{name}:{n}: not a JSON line ({e.msg})")
            kind = rec.get("type") if isinstance(rec, dict) else None
            try:
                if kind == "start" and start is None:
                    start = rec
                elif kind == "start":   # a resumed run: its clock restarted
                    fail(f"{name}:{n}: a second start line (a resumed run): its elapsed_s restart at 0")
                elif kind == "train":
                    elapsed[int(rec["step"])] = float(rec["elapsed_s"])
                    speeds.append(float(rec["tok_per_s"]))
                elif kind == "eval" and "val_bpb" in rec:
                    evals.append((int(rec["step"]), float(rec["val_bpb"])))
            except (KeyError, TypeError, ValueError) as e:
                fail(f"{name}:{n}: a {kind} line without a numeric {e}")
    if start is None:
        fail(f"{name}: no start line")
    if not elapsed:
        fail(f"{name}: no train lines with elapsed_s")
    if not evals:
        fail(f"{name}: no validation (eval lines with val_bpb): train with eval_every > 0")
    for step, _ in evals:
        if step not in elapsed:
            fail(f"{name}: an evaluation at step {step} with no train line of that step")
    return start, elapsed, evals, speeds


def read_config(path):
    """(tokens per step and rank, mixer label) from path/config.ini."""
    name = os.path.join(path, "config.ini")
    cp = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=("#", ";"))
    try:
        if not cp.read(name, encoding="utf-8"):
            fail(f"{name}: missing (the run's config, which train writes beside metrics.jsonl)")
        tokens = int(cp["data"]["seq_len"]) * int(cp["data"]["batch_size"])
        kinds = [k.strip() for k in cp["model"]["layers"].split(",")]
    except (KeyError, ValueError, configparser.Error) as e:
        fail(f"{name}: no [data] seq_len and batch_size or [model] layers ({e})")
    mixer = kinds[0] if len(set(kinds)) == 1 else "hybrid"
    return tokens, mixer


def interpolate(points, t):
    """The value at time t of [(time, value)] sorted by time, linear between neighbours; None before the first."""
    if t < points[0][0]:
        return None
    for (t0, v0), (t1, v1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[-1][1]


def load_runs(args):
    runs = []
    for arg in args.run:
        path = run_dir(arg, args.runs)
        start, elapsed, evals, speeds = read_metrics(path)
        tokens, mixer = read_config(path)
        tokens *= int(start.get("ranks", 1) or 1)
        last = max(elapsed)
        runs.append({"name": os.path.basename(os.path.normpath(path)), "mixer": mixer, "params": start.get("params"),
                     "steps": last, "time": elapsed[last], "tok_step": tokens,
                     "curve": [(elapsed[s], s, s * tokens, v) for s, v in sorted(evals)],
                     "speed": statistics.median(speeds)})
    return runs


def write_outputs(runs, t_eq, out, name):
    with open(os.path.join(out, f"{name}_curves.tsv"), "w", encoding="utf-8") as f:
        f.write("run\tmixer\tstep\ttokens\telapsed_s\tval_bpb\n")
        for r in runs:
            for t, s, tok, v in r["curve"]:
                f.write(f"{r['name']}\t{r['mixer']}\t{s}\t{tok}\t{t:.2f}\t{v:.6f}\n")
    rows = []
    for r in runs:
        at = interpolate([(t, v) for t, _, _, v in r["curve"]], t_eq)
        rows.append((r, at))
    with open(os.path.join(out, f"{name}.tsv"), "w", encoding="utf-8") as f:
        f.write("run\tmixer\tparams\tsteps\ttokens\ttime_s\tmedian_tok_per_s\tval_bpb_final\tequal_time_s\tval_bpb_at_equal_time\n")
        for r, at in rows:
            f.write(f"{r['name']}\t{r['mixer']}\t{r['params']}\t{r['steps']}\t{r['steps'] * r['tok_step']}\t"
                    f"{r['time']:.1f}\t{r['speed']:.0f}\t{r['curve'][-1][3]:.4f}\t{t_eq:.1f}\t"
                    f"{'NaN' if at is None else f'{at:.4f}'}\n")
    with open(os.path.join(out, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write(f"| run | params | steps | training time | median tokens/s | val bits/byte at the end "
                f"| val bits/byte at {t_eq:.0f} s |\n")
        f.write("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
        for r, at in sorted(rows, key=lambda x: math.inf if x[1] is None else x[1]):
            f.write(f"| {r['name']} | {r['params']:,} | {r['steps']} | {r['time']:.0f} s | {r['speed']:,.0f} "
                    f"| {r['curve'][-1][3]:.4f} | {'-' if at is None else f'{at:.4f}'} |\n")
    return rows


def plot(runs, t_eq, out, img, name):
    if not shutil.which("gnuplot"):
        print("equal_time: no gnuplot: the tables are written, the plot is not", file=sys.stderr)
        return
    curves = os.path.join(out, f"{name}_curves.tsv")
    extra = iter(EXTRA * 4)
    lines = []
    for r in runs:
        c = COLOURS.get(r["name"].replace("tiny_", "").split("_")[0]) or COLOURS.get(r["mixer"]) or next(extra)
        title = r["name"].replace('"', "'")
        sel = f'(strcol(1) eq "{title}" ? column(COL) : NaN)'
        lines.append((sel, c, title))

    def plot_cmd(x):
        return "plot " + ", ".join(
            f'"{curves}" using {x}:{sel.replace("COL", "6")} every ::1 with linespoints lw 2 pt 7 lc rgb "{c}" title "{t}"'
            for sel, c, t in lines)

    script = f"""set terminal pngcairo size 1300,520 font "DejaVu Sans,10" noenhanced
set output "{os.path.join(img, name + '.png')}"
set datafile separator "\\t"
set datafile missing "NaN"
set multiplot layout 1,2 title "Validation bits per byte of the KJV during training"
set grid
set key top right
set ylabel "validation bits per byte"
set xlabel "training wall time (s)"
set title "against training time (dotted: the shortest run's time, {t_eq:.0f} s)"
set arrow 1 from {t_eq}, graph 0 to {t_eq}, graph 1 nohead dt 3 lc rgb "#888888"
{plot_cmd("5")}
unset arrow 1
set xlabel "tokens trained on (millions)"
set title "against tokens"
{plot_cmd("($4/1e6)")}
unset multiplot
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", nargs="+", help="run folders, or run names under --runs")
    ap.add_argument("--runs", default=os.path.join(ROOT, "runs"), help="where run names are looked up")
    ap.add_argument("--out", help="tables and data (default build/bench/equal_time)")
    ap.add_argument("--img", help="the plot's folder (default: --out)")
    ap.add_argument("--name", default="equal_time", help="file names' stem (default equal_time)")
    args = ap.parse_args()
    if not args.name or not all(ch.isalnum() or ch in "_-" for ch in args.name):
        fail(f"--name '{args.name}': letters, digits, '_' and '-' only")
    out = args.out or os.path.join(ROOT, "build", "bench", "equal_time")
    img = args.img or out
    os.makedirs(out, exist_ok=True)
    os.makedirs(img, exist_ok=True)
    runs = load_runs(args)
    t_eq = min(r["time"] for r in runs)
    write_outputs(runs, t_eq, out, args.name)
    plot(runs, t_eq, out, img, args.name)
    with open(os.path.join(out, f"{args.name}.md"), encoding="utf-8") as f:
        sys.stdout.write(f.read())


if __name__ == "__main__":
    main()
