#!/usr/bin/env python3
"""bench/equal_time.py: validation bits per byte of training runs at equal
training time (docs/training.md, "gdp against gdn and mamba" and "kda against
gdn, gdp and mamba").

    bench/equal_time.py [--runs DIR] [--out DIR] [--img DIR] [--name NAME]
                        [--measure TRAIN_BENCH [--rounds N] | --speeds FILE] RUN...

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

--measure TRAIN_BENCH (the train_bench program, e.g. build/train_bench)
takes the load out: it measures each run's model (its config.ini) side by
side, N rounds (--rounds, default 3) of `train_bench --steps 8` over the runs
in turn, and keeps each run's median tokens per CPU second (CPU time of all
threads, which a busy machine inflates much less than the wall clock). The
time axis is then the CPU time the run's tokens cost at that speed, tokens /
(tokens per CPU second), the equal time the shortest run's, and the speeds
go to DIR/NAME_speeds.tsv (with each round's load average). --speeds FILE
reuses such a file instead of measuring (the plot and tables again from the
committed data).

Output (--out DIR, default build/bench/equal_time; nothing under docs/ unless
named): DIR/NAME.tsv (one line per run), DIR/NAME_curves.tsv (every
evaluation: run, step, tokens, elapsed_s, val_bpb), DIR/NAME.md (the table
as Markdown), and NAME.png in the --img folder (default DIR; gnuplot):
validation bits per byte against training time and against tokens.
NAME defaults to equal_time.
"""
import argparse
import configparser
import re
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


def measure(runs, train_bench, rounds, out, name):
    """Each run's median tokens per CPU second over rounds of train_bench, interleaved; writes NAME_speeds.tsv."""
    got = {r["name"]: [] for r in runs}
    loads = []
    for k in range(rounds):
        with open("/proc/loadavg", encoding="ascii") as f:
            loads.append(" ".join(f.read().split()[:3]))
        for r in runs:
            cmd = [train_bench, "--config", os.path.join(r["path"], "config.ini"), "--steps", "8"]
            p = subprocess.run(cmd, capture_output=True, text=True, check=False)
            m = re.search(r"^RESULT .*\btokens_per_cpu_s=([0-9.]+)", p.stdout, re.M)
            if p.returncode != 0 or not m:
                fail(f"{' '.join(cmd)}: exit {p.returncode}, no tokens_per_cpu_s in its RESULT line: "
                     f"{(p.stderr or p.stdout).strip()[-300:]}")
            got[r["name"]].append(float(m.group(1)))
            print(f"equal_time: round {k + 1}/{rounds}: {r['name']} {float(m.group(1)):.0f} tokens per CPU second",
                  file=sys.stderr)
    with open(os.path.join(out, f"{name}_speeds.tsv"), "w", encoding="utf-8") as f:
        f.write("run\ttokens_per_cpu_s_median\tper_round\tloadavg_per_round\n")
        for r in runs:
            r["cpu_speed"] = statistics.median(got[r["name"]])
            f.write(f"{r['name']}\t{r['cpu_speed']:.0f}\t{','.join(f'{v:.0f}' for v in got[r['name']])}\t"
                    f"{' / '.join(loads)}\n")
    cpu_axis(runs)


def read_speeds(runs, path):
    """Each run's cpu_speed from a NAME_speeds.tsv of an earlier --measure."""
    speeds = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        fail(f"--speeds {path}: {e.strerror}")
    if not lines or lines[0].split("\t")[:2] != ["run", "tokens_per_cpu_s_median"]:
        fail(f"--speeds {path}: not a speeds file (its first line must start 'run<TAB>tokens_per_cpu_s_median')")
    for n, line in enumerate(lines[1:], 2):
        cols = line.split("\t")
        try:
            speeds[cols[0]] = float(cols[1])
        except (IndexError, ValueError):
            fail(f"--speeds {path}:{n}: no run and number")
        if not speeds[cols[0]] > 0:
            fail(f"--speeds {path}:{n}: speed {cols[1]} is not positive")
    for r in runs:
        if r["name"] not in speeds:
            fail(f"--speeds {path}: no speed for {r['name']}")
        r["cpu_speed"] = speeds[r["name"]]
    cpu_axis(runs)


def cpu_axis(runs):
    """The time axis: CPU seconds of each run's tokens at its measured speed."""
    for r in runs:
        r["curve"] = [(tok / r["cpu_speed"], s, tok, v) for _, s, tok, v in r["curve"]]
        r["time"] = r["steps"] * r["tok_step"] / r["cpu_speed"]


def load_runs(args):
    runs = []
    for arg in args.run:
        path = run_dir(arg, args.runs)
        start, elapsed, evals, speeds = read_metrics(path)
        tokens, mixer = read_config(path)
        tokens *= int(start.get("ranks", 1) or 1)
        last = max(elapsed)
        runs.append({"name": os.path.basename(os.path.normpath(path)), "path": path, "mixer": mixer,
                     "params": start.get("params"),
                     "steps": last, "time": elapsed[last], "tok_step": tokens,
                     "curve": [(elapsed[s], s, s * tokens, v) for s, v in sorted(evals)],
                     "speed": statistics.median(speeds)})
    return runs


def write_outputs(runs, t_eq, out, name, cpu):
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
        f.write(f"run\tmixer\tparams\tsteps\ttokens\t{'cpu_time_s' if cpu else 'time_s'}\tlogged_median_tok_per_s\t"
                "tokens_per_cpu_s\tval_bpb_final\tequal_time_s\tval_bpb_at_equal_time\n")
        for r, at in rows:
            f.write(f"{r['name']}\t{r['mixer']}\t{r['params']}\t{r['steps']}\t{r['steps'] * r['tok_step']}\t"
                    f"{r['time']:.1f}\t{r['speed']:.0f}\t{format(r['cpu_speed'], '.0f') if cpu else 'NaN'}\t"
                    f"{r['curve'][-1][3]:.4f}\t{t_eq:.1f}\t"
                    f"{'NaN' if at is None else f'{at:.4f}'}\n")
    with open(os.path.join(out, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write(f"| run | params | steps | {'CPU time' if cpu else 'training time'} | "
                f"{'tokens per CPU second' if cpu else 'median tokens/s (logged)'} | val bits/byte at the end "
                f"| val bits/byte at {t_eq:.0f} s |\n")
        f.write("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
        for r, at in sorted(rows, key=lambda x: math.inf if x[1] is None else x[1]):
            speed = r["cpu_speed"] if cpu else r["speed"]
            f.write(f"| {r['name']} | {r['params']:,} | {r['steps']} | {r['time']:.0f} s | {speed:,.0f} "
                    f"| {r['curve'][-1][3]:.4f} | {'-' if at is None else f'{at:.4f}'} |\n")
    return rows


def plot(runs, t_eq, out, img, name, axis):
    if not shutil.which("gnuplot"):
        print("equal_time: no gnuplot: the tables are written, the plot is not", file=sys.stderr)
        return

    curves = os.path.join(out, f"{name}_curves.tsv")
    extra = iter(EXTRA * 4)
    lines = []
    for r in runs:
        c = COLOURS.get(r["name"].replace("tiny_", "").split("_")[0]) or COLOURS.get(r["mixer"]) or next(extra)
        title = r["name"]
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
set xlabel "{axis}"
set title "against training time (dotted: the shortest run's, {t_eq:.0f} s)"
set arrow 1 from {t_eq}, graph 0 to {t_eq}, graph 1 nohead dt 3 lc rgb "#888888"
{plot_cmd("5")}
unset arrow 1
set xlabel "tokens trained on (millions)"
set title "against tokens"
{plot_cmd("($4/1e6)")}
unset multiplot
"""
    p = subprocess.run(["gnuplot"], input=script, text=True, capture_output=True, check=False)
    if p.returncode != 0:
        fail(f"gnuplot failed on {os.path.join(img, name + '.png')}: {p.stderr.strip()[-300:]}")


def check_quotable(out, img, runs):
    """Paths and run names go into gnuplot's double-quoted strings: a quote,
    a backslash or a line break there would end the string early."""
    for what, text in [("--out", out), ("--img", img)] + [("run name", r["name"]) for r in runs]:
        if any(ch in text for ch in '"\\\n'):
            fail(f"{what} '{text}': a double quote, backslash or line break, which the plot script cannot quote")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", nargs="+", help="run folders, or run names under --runs")
    ap.add_argument("--runs", default=os.path.join(ROOT, "runs"), help="where run names are looked up")
    ap.add_argument("--out", help="tables and data (default build/bench/equal_time)")
    ap.add_argument("--img", help="the plot's folder (default: --out)")
    ap.add_argument("--name", default="equal_time", help="file names' stem (default equal_time)")
    ap.add_argument("--measure", metavar="TRAIN_BENCH", help="time axis: CPU time at speeds train_bench measures")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --measure (default 3)")
    ap.add_argument("--speeds", metavar="FILE", help="time axis: CPU time at the speeds of an earlier --measure")
    args = ap.parse_args()
    if not args.name or not all(ch.isalnum() or ch in "_-" for ch in args.name):
        fail(f"--name '{args.name}': letters, digits, '_' and '-' only")
    out = args.out or os.path.join(ROOT, "build", "bench", "equal_time")
    img = args.img or out
    if args.measure and not (os.path.isfile(args.measure) and os.access(args.measure, os.X_OK)):
        fail(f"--measure {args.measure}: not an executable file (build it: cmake --build build --target train_bench)")
    if args.rounds < 1:
        fail(f"--rounds {args.rounds}: at least 1")
    if args.measure and args.speeds:
        fail("--measure and --speeds: one or the other")
    runs = load_runs(args)
    check_quotable(out, img, runs)
    os.makedirs(out, exist_ok=True)
    os.makedirs(img, exist_ok=True)
    if args.measure:
        measure(runs, args.measure, args.rounds, out, args.name)
    elif args.speeds:
        read_speeds(runs, args.speeds)
    t_eq = min(r["time"] for r in runs)
    cpu = bool(args.measure or args.speeds)
    axis = "CPU time at the speed measured side by side (s)" if cpu else "training wall time (s)"
    write_outputs(runs, t_eq, out, args.name, cpu)
    plot(runs, t_eq, out, img, args.name, axis)
    with open(os.path.join(out, f"{args.name}.md"), encoding="utf-8") as f:
        sys.stdout.write(f.read())


if __name__ == "__main__":
    main()
