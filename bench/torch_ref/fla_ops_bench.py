#!/usr/bin/python3
"""flash-linear-attention's delta-rule ops at the OP level, against attnlab's (gdn_gpu_bench).

    fla_ops_bench.py bench --fla DIR [--ops gdn,gdp2,gdp3,kda] [--T 512,1024,...] [--tokens N]
                           [--H N] [--dk 64,128] [--dtypes f32 | tf32,bf16] [--warmup N] [--reps N]
                           [--bypass-hopper-guard]
    fla_ops_bench.py check --fla DIR --dump DIR [--ops gdn,gdp2,gdp3] [--dtypes f32,bf16]
    fla_ops_bench.py join TSV... [--out FILE]

bench: tokens/s of fla's chunked Triton kernels (chunk_gated_delta_rule,
chunk_gated_delta_product, chunk_kda), forward alone (under no_grad) and
forward + backward (o.backward(dO), the inputs' .grad set to None before each
step), with B*T fixed, as gdn_gpu_bench times attnlab's ops: --warmup steps,
then --reps back to back between two CUDA events. Prints the same TSV
(side "fla", form "chunk"). The inputs: q, k L2-normalised per head, fla's
default scale 1/sqrt(dk) (attnlab takes q scaled already: the same function),
v and dO normal, beta in (0.1, 0.9), g (log decay) in (-0.1, -0.001); the
in-kernel l2norm and gate options off, as attnlab's ops have none.

dtypes: f32 = float32 inputs with Triton's float32 dot products in IEEE
float32 (TRITON_F32_DEFAULT=ieee), the arithmetic of attnlab's kernels;
tf32 = float32 inputs with Triton's default for them (TF32 tensor-core
products, float32 sums); bf16 = bfloat16 inputs (float32 sums), what users
train with. f32 and tf32 set Triton's process-wide default differently, so
they cannot be in one process: run them in two (gpu_vs_fla.sh does).
fla's gated_delta_product refuses float32 (its own assertion): its rows come
in bf16 only.

fla refuses Triton >= 3.4 and < 3.7.1 on Hopper for the gated backward
(chunk_bwd_dqkwg, fla issue 640: a Triton miscompile). --bypass-hopper-guard
lifts that refusal for timing; the output says so on every row's comment
line. The check never lifts it.

check: the same function on identical inputs. gdn_gpu_bench --dump DIR wrote
attnlab's inputs, dO, output and input gradients for one small case per op
(B 2, T 200, H 4: three whole chunks and a partial one); here they go through
fla (q as dumped, scale 1) and through a float64 recurrence written from the
ops' definition (reference() below). Printed per op and dtype: the output's
error of attnlab and of fla against the float64 reference and against each
other, normwise: max |a - b| / max(max |a|, max |b|), as the project's tests
measure; for bf16 also fla's output against the reference on the inputs
rounded to bf16 (the part of the error that is the kernels', not the
rounding of the inputs); then the gradients' where fla's backward runs (it
refuses under the guard above, and the check says so rather than lifting it).

join: the TSVs of both sides into markdown tables, one per (op, H, dk, pass),
T down, each (side, dtype) across, then attnlab's tokens/s over each fla
column's. Comment lines of the inputs are listed under the tables.

fla's top-level package imports its layers and models (transformers); this
script imports only the ops it names from the source folder --fla DIR (the
folder holding fla/), with fla, fla.ops and fla.modules registered as bare
packages so that their __init__ files do not run. No torch is needed for join.
"""

import argparse
import math
import os
import re
import struct
import sys
import types

TSV_COLUMNS = ["side", "op", "form", "dtype", "H", "dk", "T", "B", "pass", "ms", "tokens_per_s"]
DEFAULT_T = "512,1024,2048,4096,8192,16384"


def die(msg):
    sys.stderr.write("fla_ops_bench: " + msg + "\n")
    sys.exit(2)


def parse_ints(text, what, lo=1, hi=1 << 26):
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        die(f"{what} '{text}': a comma list of integers")
    if not vals or any(v < lo or v > hi for v in vals):
        die(f"{what} '{text}': each value must be in {lo} .. {hi}")
    return vals


def parse_ops(text):
    ops = text.split(",")
    for op in ops:
        if op not in ("gdn", "kda") and not re.fullmatch(r"gdp[1-8]", op):
            die(f"--ops '{text}': ops are gdn, gdp1 .. gdp8 and kda")
    return ops


def parse_dtypes(text):
    dts = text.split(",")
    for d in dts:
        if d not in ("f32", "tf32", "bf16"):
            die(f"--dtypes '{text}': dtypes are f32, tf32 and bf16")
    if "f32" in dts and "tf32" in dts:
        die(f"--dtypes '{text}': f32 and tf32 set Triton's float32 products differently: run them in two processes")
    return dts


def op_steps(op):
    return int(op[3]) if op.startswith("gdp") else 1


# ---------------------------------------------------------------- fla import

def fla_root(fla_dir):
    """The absolute path of --fla, checked before anything is imported."""
    root = os.path.abspath(fla_dir)
    if not os.path.isfile(os.path.join(root, "fla", "ops", "gated_delta_rule", "chunk.py")):
        die(f"--fla '{fla_dir}': no fla/ops/gated_delta_rule/chunk.py under it (give the folder that holds fla/)")
    return root


def slice_autotune():
    """Under ATTNLAB_TRITON_SLICE=i/n (set by bench/torch_ref/triton_prewarm.sh
    alone, never for a timed run) every Triton autotuner made from here on
    keeps configs i, i+n, ... of its list (one at least): n such processes
    compile a kernel's configs between them into Triton's on-disk cache, where
    the timed run's own autotuning over every config then finds them compiled
    and only has to time them."""
    spec = os.environ.get("ATTNLAB_TRITON_SLICE")
    if not spec:
        return
    m = re.fullmatch(r"(\d+)/([1-9]\d*)", spec)
    if not m or int(m.group(1)) >= int(m.group(2)):
        die(f"ATTNLAB_TRITON_SLICE='{spec}': expected i/n with 0 <= i < n")
    i, n = int(m.group(1)), int(m.group(2))
    from triton.runtime.autotuner import Autotuner
    init = Autotuner.__init__

    def sliced_init(self, fn, arg_names, configs, *args, **kwargs):
        configs = list(configs)
        if configs:
            configs = configs[i::n] or [configs[i % len(configs)]]
        init(self, fn, arg_names, configs, *args, **kwargs)
    Autotuner.__init__ = sliced_init


def register_bare(root, packages=("fla", "fla.ops", "fla.modules")):
    """Puts the source folder root (the one holding fla/) on sys.path with the
    named packages registered bare, so that their __init__ files do not run
    (fla's imports transformers; an op package's imports its naive forms and
    einops); their submodules import as usual."""
    slice_autotune()
    sys.path.insert(0, root)
    for name in packages:
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [os.path.join(root, *name.split("."))]
            sys.modules[name] = mod
    # fla.utils reads fla.__version__, which the bare package lacks: take it from
    # fla/__init__.py's text without running that file (it imports transformers).
    with open(os.path.join(root, "fla", "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', f.read(), re.M)
    sys.modules["fla"].__version__ = m.group(1) if m else "0"


def load_fla(fla_dir):
    """The fla ops as a dict name -> function, imported from the source folder."""
    register_bare(fla_root(fla_dir))
    import importlib
    fns = {
        "gdn": importlib.import_module("fla.ops.gated_delta_rule").chunk_gated_delta_rule,
        "gdp": importlib.import_module("fla.ops.gated_delta_product").chunk_gated_delta_product,
    }
    try:
        fns["kda"] = importlib.import_module("fla.ops.kda").chunk_kda
    except ImportError as e:
        print(f"# kda: fla.ops.kda does not import here: {e}")
    return fns


def fla_version(fla_dir):
    try:
        with open(os.path.join(fla_dir, "fla", "__init__.py")) as f:
            m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", f.read())
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


def hopper_guard(bypass):
    """Whether fla's issue-640 refusal applies on this GPU and Triton; lifts it when bypass."""
    import importlib
    chunk_o = importlib.import_module("fla.ops.common.chunk_o")
    active = bool(chunk_o.IS_NVIDIA_HOPPER and chunk_o.TRITON_ABOVE_3_4_0 and not chunk_o.TRITON_ABOVE_3_7_1)
    if active and bypass:
        chunk_o.TRITON_ABOVE_3_7_1 = True   # the name the refusal reads when called
    return active


def set_f32_mode(dtypes):
    # Read by Triton when it compiles a kernel: set before the first one.
    if "f32" in dtypes:
        os.environ["TRITON_F32_DEFAULT"] = "ieee"
    elif "tf32" in dtypes:
        os.environ.pop("TRITON_F32_DEFAULT", None)


def torch_dtype(torch, name):
    return torch.bfloat16 if name == "bf16" else torch.float32


# ---------------------------------------------------------------- fla calls

def fla_call(fns, op, q, k, v, g, beta, scale):
    """o (B, T, H, dv) of fla's op; q, k, v, beta, g in fla's layouts."""
    if op == "gdn":
        return fns["gdn"](q, k, v, g, beta, scale=scale)[0]
    if op == "kda":
        return fns["kda"](q, k, v, g, beta, scale=scale)[0]
    return fns["gdp"](q, k, v, g, beta, num_householder=op_steps(op), scale=scale)[0]


def make_inputs(torch, op, B, T, H, dk, dtype, seed):
    """q, k, v, g, beta, dO on the GPU in fla's layouts, as gdn_gpu_bench draws them."""
    n = op_steps(op)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    f32 = dict(device="cuda", dtype=torch.float32, generator=gen)
    q = torch.nn.functional.normalize(torch.randn(B, T, H, dk, **f32), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T * n, H, dk, **f32), dim=-1)
    v = torch.randn(B, T * n, H, dk, **f32)
    beta = torch.rand(B, T * n, H, **f32) * 0.8 + 0.1
    g_shape = (B, T, H, dk) if op == "kda" else (B, T, H)
    g = -(torch.rand(*g_shape, **f32) * 0.099 + 0.001)
    dO = torch.randn(B, T, H, dk, **f32)
    return [x.to(dtype) for x in (q, k, v, g, beta, dO)]


def time_ms(torch, fn, warmup, reps):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


class Refused(Exception):
    """fla refuses the dtype (its own assertion): no other T of the op will do either."""


def bench_cell(torch, fns, op, dtype_name, H, dk, T, B, args):
    """Prints the cell's two TSV rows (fwd, fwdbwd), or why one is missing."""
    q, k, v, g, beta, dO = make_inputs(torch, op, B, T, H, dk, torch_dtype(torch, dtype_name), 1)
    leaves = [q, k, v, g, beta]

    def fwd():
        with torch.no_grad():
            fla_call(fns, op, q, k, v, g, beta, None)

    def fwdbwd():
        for x in leaves:
            x.grad = None
        fla_call(fns, op, q, k, v, g, beta, None).backward(dO)

    for name, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
        if name == "fwdbwd":
            for x in leaves:
                x.requires_grad_(True)
        try:
            ms = time_ms(torch, fn, args.warmup, args.reps)
        except Exception as e:   # fla's refusals, Triton's compile errors, out of memory: say which, go on
            first = (str(e).strip().splitlines() or [""])[0]
            print(f"# {op} {dtype_name} dk {dk} T {T} {name}: skipped: fla: {type(e).__name__}: {first}", flush=True)
            torch.cuda.empty_cache()
            if isinstance(e, AssertionError):
                raise Refused() from e
            continue
        print(f"fla\t{op}\tchunk\t{dtype_name}\t{H}\t{dk}\t{T}\t{B}\t{name}\t{ms:.4f}\t{B * T / ms * 1e3:.0f}",
              flush=True)


def cmd_bench(args):
    dtypes = parse_dtypes(args.dtypes)
    set_f32_mode(dtypes)
    ops, Ts, dks = parse_ops(args.ops), parse_ints(args.T, "--T"), parse_ints(args.dk, "--dk", 1, 256)
    fla_root(args.fla)
    import torch
    if not torch.cuda.is_available():
        die("bench needs a CUDA GPU (torch.cuda.is_available() is False)")
    fns = load_fla(args.fla)
    guard = hopper_guard(args.bypass_hopper_guard)
    print_versions(torch, args.fla)
    print(f"# TRITON_F32_DEFAULT={os.environ.get('TRITON_F32_DEFAULT', '(unset: tf32)')}")
    if guard:
        print("# fla's Hopper guard (issue 640) applies to this GPU and Triton: "
              + ("LIFTED for timing (--bypass-hopper-guard): these backward figures are timings only, "
                 "not results to trust" if args.bypass_hopper_guard else "kept: gated backwards will refuse"))
    print("\t".join(TSV_COLUMNS), flush=True)
    for op in ops:
        base = "gdp" if op.startswith("gdp") else op
        if base not in fns:
            print(f"# {op}: skipped: not in this fla")
            continue
        for dt in dtypes:
            for dk in dks:
                for T in Ts:
                    B = args.tokens // T
                    if B < 1 or B * T != args.tokens:
                        print(f"# {op}: T {T} skipped: it does not divide --tokens {args.tokens}")
                        continue
                    try:
                        bench_cell(torch, fns, op, dt, args.H, dk, T, B, args)
                    except Refused:
                        break
                    finally:
                        torch.cuda.empty_cache()   # (the cell's tensors are gone by now)


def print_versions(torch, fla_dir):
    import triton
    print(f"# gpu: {torch.cuda.get_device_name(0)}")
    print(f"# torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, "
          f"fla {fla_version(fla_dir)} from {os.path.abspath(fla_dir)}")


# ---------------------------------------------------------------- check

def read_dump(path):
    """(op, H, dk, dv, steps, {name: (shape, float32 bytes)}) of a gdn_gpu_bench --dump file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 44 or data[:8] != b"ATLDUMP1":
        raise ValueError(f"{path}: not a gdn_gpu_bench dump (no ATLDUMP1 header)")
    op = data[8:24].split(b"\0")[0].decode("ascii", "replace")
    H, dk, dv, steps, n_arr = struct.unpack_from("<5i", data, 24)
    at, arrays = 44, {}
    for i in range(n_arr):
        if at + 36 > len(data):
            raise ValueError(f"{path}: cut short in the header of array {i}")
        name = data[at:at + 16].split(b"\0")[0].decode("ascii", "replace")
        ndim, *shape = struct.unpack_from("<5i", data, at + 16)
        if not 1 <= ndim <= 4 or any(s < 0 for s in shape[:ndim]):
            raise ValueError(f"{path}: array '{name}' has a bad shape {shape[:ndim]}")
        shape = tuple(shape[:ndim])
        nbytes = 4 * math.prod(shape)
        at += 36
        if at + nbytes > len(data):
            raise ValueError(f"{path}: array '{name}' {shape} is cut short")
        arrays[name] = (shape, data[at:at + nbytes])
        at += nbytes
    if at != len(data):
        raise ValueError(f"{path}: {len(data) - at} bytes after the last array")
    return op, H, dk, dv, steps, arrays


def dump_tensors(torch, arrays):
    return {name: torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape)
            for name, (shape, raw) in arrays.items()}


def reference(torch, x, H, steps, kda):
    """o and the input gradients in float64, token by token from the definition:
    S <- diag(exp(g_t)) S (one decay per token: a scalar per head, or per key
    channel for kda), then for each of the token's steps j
    S <- S + k_tj beta_tj (v_tj - S^T k_tj)^T; o_t = S^T q_t (q scaled already).
    The gradients are those of sum(o * dO)."""
    B, T = x["q"].shape[:2]
    dk = x["q"].shape[2] // H
    dv = x["v"].shape[2] // (steps * H)
    leaves = {n: x[n].double().clone().requires_grad_(True) for n in ("q", "k", "v", "beta", "g")}
    q = leaves["q"].reshape(B, T, H, dk)
    k = leaves["k"].reshape(B, T, steps, H, dk)
    v = leaves["v"].reshape(B, T, steps, H, dv)
    beta = leaves["beta"].reshape(B, T, steps, H)
    g = leaves["g"].reshape(B, T, H, dk) if kda else leaves["g"].reshape(B, T, H, 1)
    S = torch.zeros(B, H, dk, dv, dtype=torch.float64)
    outs = []
    for t in range(T):
        S = S * g[:, t].exp().unsqueeze(-1)
        for j in range(steps):
            kt = k[:, t, j]
            delta = beta[:, t, j].unsqueeze(-1) * (v[:, t, j] - torch.einsum("bhkv,bhk->bhv", S, kt))
            S = S + kt.unsqueeze(-1) * delta.unsqueeze(-2)
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    o = torch.stack(outs, 1).reshape(B, T, H * dv)
    (o * x["dO"].double()).sum().backward()
    return o.detach(), {"d" + n: leaves[n].grad for n in leaves}


def rel_err(a, b):
    """max |a - b| / max(max |a|, max |b|), in float64 (the project's max_rel_diff)."""
    a, b = a.double().cpu().flatten(), b.double().cpu().flatten()
    if not (a.isfinite().all() and b.isfinite().all()):
        return math.inf
    scale = max(a.abs().max().item(), b.abs().max().item())
    worst = (a - b).abs().max().item()
    return worst / scale if scale > 0 else worst


def fla_on_dump(torch, fns, op, x, H, steps, dtype):
    """fla's o and input gradients (dump layouts, float32 on the host) for the dumped inputs;
    the gradients are None, with why, when fla's backward refuses."""
    B, T = x["q"].shape[:2]
    dk = x["q"].shape[2] // H
    dv = x["v"].shape[2] // (steps * H)
    g_shape = (B, T, H, dk) if op == "kda" else (B, T, H)
    shapes = {"q": (B, T, H, dk), "k": (B, T * steps, H, dk), "v": (B, T * steps, H, dv),
              "beta": (B, T * steps, H), "g": g_shape}
    t = {n: x[n].reshape(s).to("cuda", dtype).requires_grad_(True) for n, s in shapes.items()}
    o = fla_call(fns, op, t["q"], t["k"], t["v"], t["g"], t["beta"], 1.0)
    o_host = o.detach().float().cpu().reshape(B, T, H * dv)
    try:
        o.backward(x["dO"].reshape(B, T, H, dv).to("cuda", dtype))
    except Exception as e:   # the issue-640 refusal (RuntimeError) or a failing backward kernel
        return o_host, None, f"{type(e).__name__}: " + (str(e).strip().splitlines() or [""])[0]
    grads = {"d" + n: t[n].grad.float().cpu().reshape(x[n].shape) for n in shapes}
    return o_host, grads, None


def check_one(torch, fns, path, dtypes):
    op, H, dk, dv, steps, arrays = read_dump(path)
    x = dump_tensors(torch, arrays)
    kda = op == "kda"
    ref_o, ref_g = reference(torch, x, H, steps, kda)
    print(f"{op}: B {x['q'].shape[0]}, T {x['q'].shape[1]}, H {H}, dk {dk}, dv {dv}, steps {steps} ({path})")
    print(f"  attnlab o vs float64 reference: {rel_err(x['o'], ref_o):.3e}")
    worst = max(rel_err(x[n], ref_g[n]) for n in ref_g)
    print(f"  attnlab gradients vs float64 reference (worst of dq dk dv dbeta dg): {worst:.3e}")
    if fns is None:
        return
    for dt in dtypes:
        label = f"fla {dt}"
        try:
            o, grads, why = fla_on_dump(torch, fns, op, x, H, steps, torch_dtype(torch, dt))
        except Exception as e:   # fla's refusals, Triton's compile errors: say which, go on
            first = (str(e).strip().splitlines() or [""])[0]
            print(f"  {label}: not run: {type(e).__name__}: {first}")
            continue
        print(f"  {label} o vs float64 reference: {rel_err(o, ref_o):.3e}   "
              f"vs attnlab: {rel_err(o, x['o']):.3e}   (max relative error of the output, normwise)")
        if dt == "bf16":   # how much of that is the inputs' rounding to bf16, how much the kernels'
            xr = {n: (t.to(torch.bfloat16).float() if n in ("q", "k", "v", "beta", "g", "dO") else t)
                  for n, t in x.items()}
            print(f"  {label} o vs float64 reference on the inputs rounded to bf16: "
                  f"{rel_err(o, reference(torch, xr, H, steps, kda)[0]):.3e}")
        if grads is None:
            print(f"  {label} gradients: not compared: fla's backward refused: {why}")
            continue
        for n in ("dq", "dk", "dv", "dbeta", "dg"):
            print(f"  {label} {n} vs float64 reference: {rel_err(grads[n], ref_g[n]):.3e}   "
                  f"vs attnlab: {rel_err(grads[n], x[n]):.3e}")


def cmd_check(args):
    dtypes = parse_dtypes(args.dtypes)
    set_f32_mode(dtypes)
    ops = parse_ops(args.ops)
    if not os.path.isdir(args.dump):
        die(f"--dump '{args.dump}': not a folder (gdn_gpu_bench --dump DIR writes one)")
    if args.fla:
        fla_root(args.fla)
    import torch
    fns = None
    if args.fla:
        if not torch.cuda.is_available():
            die("check --fla needs a CUDA GPU (torch.cuda.is_available() is False)")
        fns = load_fla(args.fla)
        print_versions(torch, args.fla)
        if hopper_guard(False):
            print("# fla's Hopper guard (issue 640) applies here and is kept: gated backwards refuse")
        print(f"# TRITON_F32_DEFAULT={os.environ.get('TRITON_F32_DEFAULT', '(unset: tf32)')}")
    else:
        print("# no --fla: attnlab's dump against the float64 reference only")
    for op in ops:
        path = os.path.join(args.dump, f"check_{op}.bin")
        if not os.path.exists(path):
            print(f"# {op}: no {path} (gdn_gpu_bench --dump skips ops it does not have)")
            continue
        try:
            check_one(torch, fns, path, dtypes)
        except (OSError, ValueError) as e:
            die(str(e))


# ---------------------------------------------------------------- join

def read_tsv(path):
    """(rows as dicts, comment lines) of one TSV with TSV_COLUMNS."""
    rows, notes, header = [], [], None
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        die(f"{path}: {e.strerror}")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            if not line[1:].strip().startswith("stderr:"):   # (gpu_vs_fla.sh keeps those in the TSV only)
                notes.append(line[1:].strip())
            continue
        cells = line.split("\t")
        if header is None:
            if cells != TSV_COLUMNS:
                die(f"{path}:{n}: expected the header '{' '.join(TSV_COLUMNS)}', got '{line[:120]}'")
            header = cells
            continue
        if len(cells) != len(TSV_COLUMNS):
            die(f"{path}:{n}: {len(cells)} cells, expected {len(TSV_COLUMNS)}")
        row = dict(zip(TSV_COLUMNS, cells))
        try:
            for c in ("H", "dk", "T", "B"):
                row[c] = int(row[c])
            for c in ("ms", "tokens_per_s"):
                row[c] = float(row[c])
        except ValueError:
            die(f"{path}:{n}: a number that is not one: '{line[:120]}'")
        rows.append(row)
    return rows, notes


def column_label(row):
    extra = "" if row["form"] in ("chunked", "chunk") else " " + row["form"]
    return f"{row['side']} {row['dtype']}{extra}"


def fmt_int(x):
    return f"{x:,.0f}"


def join_tables(rows, notes):
    """The markdown text of the joined tables."""
    groups = {}
    for r in rows:
        groups.setdefault((r["op"], r["H"], r["dk"], r["pass"]), []).append(r)
    out = []
    pass_name = {"fwd": "forward", "fwdbwd": "forward + backward"}
    for (op, H, dk, p) in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3] != "fwdbwd")):
        grp = groups[(op, H, dk, p)]
        cols = []
        for r in sorted(grp, key=lambda r: r["side"] != "attnlab"):
            if column_label(r) not in cols:
                cols.append(column_label(r))
        ours = [c for c in cols if c.startswith("attnlab")]
        theirs = [c for c in cols if not c.startswith("attnlab")]
        cell = {(r["T"], column_label(r)): r for r in grp}
        Ts = sorted({r["T"] for r in grp})
        ratios = [(a, b) for a in ours for b in theirs]
        out.append(f"### {op}, H {H}, dk = dv = {dk}, {pass_name.get(p, p)}: tokens/s")
        out.append("")
        head = ["T", "B"] + cols + [f"{a} / {b}" for a, b in ratios]
        out.append("| " + " | ".join(head) + " |")
        out.append("| " + " | ".join(["---:"] * len(head)) + " |")
        for T in Ts:
            B = next(r["B"] for r in grp if r["T"] == T)
            line = [fmt_int(T), str(B)]
            line += [fmt_int(cell[(T, c)]["tokens_per_s"]) if (T, c) in cell else "" for c in cols]
            for a, b in ratios:
                ok = (T, a) in cell and (T, b) in cell and cell[(T, b)]["tokens_per_s"] > 0
                line.append(f"{cell[(T, a)]['tokens_per_s'] / cell[(T, b)]['tokens_per_s']:.2f}" if ok else "")
            out.append("| " + " | ".join(line) + " |")
        out.append("")
    if notes:
        out.append("Notes from the runs:")
        out.append("")
        out += [f"- {n}" for n in dict.fromkeys(notes)]   # each once, in order
        out.append("")
    return "\n".join(out)


def cmd_join(args):
    rows, notes = [], []
    for path in args.tsv:
        r, n = read_tsv(path)
        rows += r
        notes += n
    if not rows:
        die("no rows in " + ", ".join(args.tsv))
    text = join_tables(rows, notes)
    if args.out:
        try:
            with open(args.out, "w") as f:
                f.write(text)
        except OSError as e:
            die(f"--out '{args.out}': {e.strerror}")
    else:
        sys.stdout.write(text)


def build_parser():
    p = argparse.ArgumentParser(description="fla's delta-rule ops against attnlab's, op by op")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="tokens/s of fla's ops as a TSV")
    b.add_argument("--fla", required=True, help="the folder that holds fla/ (a source checkout)")
    b.add_argument("--ops", default="gdn,gdp2,gdp3,kda")
    b.add_argument("--T", default=DEFAULT_T)
    b.add_argument("--tokens", type=int, default=16384)
    b.add_argument("--H", type=int, default=8)
    b.add_argument("--dk", default="64")
    b.add_argument("--dtypes", default="f32")
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--reps", type=int, default=20)
    b.add_argument("--bypass-hopper-guard", action="store_true",
                   help="lift fla's issue-640 refusal for timing (never for correctness)")
    c = sub.add_parser("check", help="fla and attnlab on gdn_gpu_bench --dump's inputs")
    c.add_argument("--fla", help="the folder that holds fla/; without it only attnlab against the reference")
    c.add_argument("--dump", required=True, help="the folder gdn_gpu_bench --dump wrote")
    c.add_argument("--ops", default="gdn,gdp2,gdp3,kda")
    c.add_argument("--dtypes", default="f32,bf16")
    j = sub.add_parser("join", help="the TSVs of both sides as markdown tables")
    j.add_argument("tsv", nargs="+")
    j.add_argument("--out")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.cmd == "bench":
        for name in ("tokens", "H", "warmup", "reps"):
            if getattr(args, name) < (0 if name == "warmup" else 1):
                die(f"--{name} {getattr(args, name)}: too small")
        cmd_bench(args)
    elif args.cmd == "check":
        cmd_check(args)
    else:
        cmd_join(args)


if __name__ == "__main__":
    main()
