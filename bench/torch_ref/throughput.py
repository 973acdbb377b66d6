#!/usr/bin/python3
"""Tokens/s of a training step of a config's LM in PyTorch, on the CPU or a CUDA GPU.

    /usr/bin/python3 bench/torch_ref/throughput.py configs/tiny_gdn.ini --threads 2 [--steps 5] [--warmup 2]
                                                   [--set section.key=value ...] [--amp bf16]
                                                   [--device cpu|cuda] [--compile | --compile-layers]
                                                   [--fla DIR [--bypass-hopper-guard]]

The same work as bench/train_bench_main.c: forward, backward, gradient-norm
clipping and AdamW (decoupled weight decay, none on norms, dt_bias, A_log, D),
float32, on random tokens, B and T from the config's [data] section. Fast
forms: chunked GLA for linear and mamba, the chunked WY form for gdn (chunk
from the config), F.scaled_dot_product_attention for attn when torch has it.
Prints the time of each part (median over the timed steps) and, last:
  RESULT config=<name> B=.. T=.. threads=.. params=.. fwd_ms=.. bwd_ms=.. opt_ms=.. step_ms=.. tokens_per_s=..
         cpu_ms=.. tokens_per_cpu_s=.. amp=.. device=cpu|cuda compile=0|1
         (cpu: CPU time of all threads per step)

--device cuda (train_bench --device cuda's counterpart): parameters, AdamW
state and tokens on the GPU, each part of the step timed to a
torch.cuda.synchronize(); float32 products strict (no TF32), as the C side's
cuBLAS in pedantic mode. --compile: the forward and the loss under
torch.compile, mode "default" (Inductor kernels; no CUDA graphs, no autotuning),
its backward compiled with it by AOTAutograd; the first step compiles, so keep
--warmup >= 1 (the default 2 does). --compile-layers: torch.compile per layer
instead, for models whose one whole graph takes too long to compile (the
chunked GDN is a Python loop over T / C chunks, unrolled in every layer): one
compiled function per layer kind (RMSNorm, mixer, RMSNorm, SwiGLU MLP and both
residual adds), shared by every layer of that kind (its tensors are passed
in, not baked in), and one for the final norm, the head and the loss; the
embedding lookup stays eager. RESULT says compile=layers.

--fla DIR (with --device cuda): the anchor of issue 43 instead of the plain
reference, fla_model.AnchorLM: the same model, weights and step with gdn's
recurrence done by flash-linear-attention's chunk_gated_delta_rule, mamba's
and linear's by chunk_simple_gla (Triton kernels, imported from DIR, the
folder holding fla/), attention by scaled_dot_product_attention; its loss
is checked against the reference by fla_model.py check. Without --amp its
Triton float32 products are IEEE float32 (TRITON_F32_DEFAULT=ieee), as the
torch side's; with --amp bf16 Triton's defaults. fla refuses its gated
backward on Hopper with Triton >= 3.4, < 3.7.1 (fla issue 640, a Triton
miscompile): --bypass-hopper-guard lifts that for timing, never for
correctness (the header says so). RESULT ends in fla=0|1.

Needs python3-torch (Debian package) for the CPU; a CUDA build of torch >= 2.0
for --device cuda and --compile.
"""

import argparse
import os
import platform
import sys
import copy
import time

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("config", help="an INI config (configs/tiny_gdn.ini)")
ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: keep torch's default)")
ap.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2, as train_bench)")
ap.add_argument("--form", choices=("chunked", "recurrent"), default="chunked",
                help="mixer forms (default chunked; recurrent is the slow reference)")
ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
ap.add_argument("--set", action="append", default=[], metavar="S.K=V", help="override a config key")
ap.add_argument("--amp", choices=("none", "bf16"), default="none",
                help="bf16: the forward under torch.autocast(DEVICE, bfloat16), PyTorch's mixed precision "
                     "(products in bf16, parameters and optimizer float32)")
ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                help="where the step runs (default cpu; cuda: the current CUDA device, strict float32 products)")
ap.add_argument("--compile", action="store_true",
                help="forward + loss under torch.compile(mode='default') (torch >= 2.0); "
                     "the first step compiles")
ap.add_argument("--kernels", type=int, default=0, metavar="N",
                help="--device cuda: after the timed steps, one more step under torch.profiler; print the N GPU "
                     "kernels that took longest (KERNEL lines, ms in that step) and the step's kernel total")
ap.add_argument("--compile-layers", action="store_true",
                help="torch.compile per layer kind (shared by the layers of a kind) and of the head + loss, "
                     "instead of one graph (see above)")
ap.add_argument("--fla", metavar="DIR",
                help="time the anchor: the reference with fla's Triton kernels for gdn, mamba and linear and SDPA "
                     "for attn (DIR holds fla/; needs --device cuda)")
ap.add_argument("--bypass-hopper-guard", action="store_true",
                help="with --fla: lift fla's refusal of its gated backward on Hopper with Triton < 3.7.1 "
                     "(fla issue 640), for timing only")
args = ap.parse_args()
if args.steps < 1 or args.warmup < 0:
    ap.error("--steps must be >= 1 and --warmup >= 0")
if args.kernels and args.device != "cuda":
    ap.error("--kernels lists GPU kernels: it needs --device cuda")
if args.compile and args.compile_layers:
    ap.error("--compile and --compile-layers are two ways to compile: pick one")
if args.fla and args.device != "cuda":
    ap.error("--fla runs fla's Triton kernels: it needs --device cuda")
if args.fla and (args.form != "chunked" or args.dtype != "float32"):
    ap.error("--fla: fla's kernels are chunked forms in float32 (or bf16 under --amp): drop --form/--dtype")
if args.bypass_hopper_guard and not args.fla:
    ap.error("--bypass-hopper-guard concerns fla's kernels: it goes with --fla")
if args.fla and args.amp == "none":
    # Read by Triton when it compiles a kernel: strict float32 products, as torch's below.
    os.environ["TRITON_F32_DEFAULT"] = "ieee"

# Thread pools are sized when torch loads: set every one of them first.
if args.threads > 0:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(args.threads)

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch.nn.functional as F  # noqa: E402
from fla_model import AnchorLM, FlaOps, Unavailable, check_kinds, config_with_sets  # noqa: E402
from model import LM, rmsnorm  # noqa: E402

COMPILE_MODE = "default"   # no CUDA graphs (train_bench has none either), no minutes of autotuning


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def check_device():
    """Stop with a message, before any work, when the requested device or compiler is missing."""
    if args.device == "cuda" and not torch.cuda.is_available():
        why = ("this torch is built without CUDA" if torch.version.cuda is None
               else "torch %s (CUDA %s) finds no usable GPU" % (torch.__version__, torch.version.cuda))
        sys.exit("throughput: --device cuda: torch.cuda.is_available() is false: %s" % why)
    if (args.compile or args.compile_layers) and not hasattr(torch, "compile"):
        sys.exit("throughput: --compile needs torch >= 2.0 (torch.compile); this is torch %s" % torch.__version__)


def strict_fp32():
    """No TF32 anywhere on the GPU: the C side runs strict float32 (cuBLAS pedantic math).

    Only the legacy switches: they set the newer fp32_precision ones to match,
    and torch refuses to read a state set through a mix of the two."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False   # the short convolutions (depthwise conv1d) go through cuDNN


def layerwise_compiled_loss(lm):
    """lm.loss with each layer under torch.compile, one compiled function per
    layer kind. The layer code is the model's own (LM._gdn, ...), run on a
    view whose params hold the current layer's tensors under layer 0's names,
    so every layer of a kind presents the same graph with different inputs.
    """
    cfg = lm.cfg
    view = copy.copy(lm)   # its params are replaced per call; cfg, form (and an anchor's ops) are lm's
    pre = "layers.0."
    names = []   # per layer: {layer 0's name: this layer's tensor}
    for l in range(len(cfg.layers)):
        p = "layers.%d." % l
        names.append({pre + n[len(p):]: t for n, t in lm.params.items() if n.startswith(p)})

    def layer(x, params, kind):
        view.params = params
        u = rmsnorm(x, params[pre + "norm1"], cfg.norm_eps)
        h = x + getattr(view, "_" + kind)(pre + "mixer.", u)
        u = rmsnorm(h, params[pre + "norm2"], cfg.norm_eps)
        return h + (F.silu(u @ params[pre + "mlp.w1"]) * (u @ params[pre + "mlp.w3"])) @ params[pre + "mlp.w2"]

    def head(x, norm_f, w_out, targets):
        logits = rmsnorm(x, norm_f, cfg.norm_eps) @ w_out
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)), logits

    layer_c = torch.compile(layer, mode=COMPILE_MODE)
    head_c = torch.compile(head, mode=COMPILE_MODE)
    P = lm.params

    def loss(tokens, targets):
        x = P["embed"][tokens]
        for l, kind in enumerate(cfg.layers):
            x = layer_c(x, names[l], kind)
        w_out = P["embed"].t() if cfg.tied_embeddings else P["lm_head"]
        return head_c(x, P["norm_f"], w_out, targets)
    return loss


def main():
    check_device()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if args.threads > 0:
        torch.set_num_threads(args.threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:   # already set
            pass
    if cuda:
        strict_fp32()
    with open(args.config) as f:
        text = f.read()
    try:
        cfg, cp = config_with_sets(text, args.set)
    except ValueError as e:
        sys.exit("throughput: %s: %s" % (args.config, e))
    data, train = cp["data"] if cp.has_section("data") else {}, cp["train"] if cp.has_section("train") else {}
    B, T = int(data.get("batch_size", 16)), int(data.get("seq_len", 256))
    lr = float(train.get("lr", 1e-3))
    wd = float(train.get("weight_decay", 0.1))
    betas = (float(train.get("beta1", 0.9)), float(train.get("beta2", 0.95)))
    eps = float(train.get("adam_eps", 1e-8))
    clip = float(train.get("grad_clip", 1.0))
    dtype = torch.float32 if args.dtype == "float32" else torch.float64

    # Initialised on the CPU (its generator), then moved: the same weights on either device.
    ops = fla_ops(cfg) if args.fla else None
    lm = AnchorLM(cfg, ops, dtype=dtype, seed=1337) if ops else LM(cfg, dtype=dtype, seed=1337, form=args.form)
    if cuda:
        for n in list(lm.params):
            lm.params[n] = lm.params[n].detach().to(dev).requires_grad_(True)
    decay = [p for n, p in lm.params.items() if n not in lm.no_decay]
    no_decay = [p for n, p in lm.params.items() if n in lm.no_decay]
    # On the GPU fused AdamW: one multi-tensor kernel for every parameter, the
    # nearest to train_bench's one element-wise kernel per tensor and PyTorch's
    # fastest (foreach, the CUDA default, runs several passes over the state).
    # On the CPU torch's default, as before.
    kw = {"fused": True} if cuda else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=betas, eps=eps, **kw)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (B, T), generator=gen).to(dev)
    y = torch.randint(0, cfg.vocab_size, (B, T), generator=gen).to(dev)
    nparams = sum(p.numel() for p in lm.parameters())
    if args.compile_layers:
        loss_fn = layerwise_compiled_loss(lm)
    else:
        loss_fn = torch.compile(lm.loss, mode=COMPILE_MODE) if args.compile else lm.loss
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    name = os.path.basename(args.config)
    print("machine: %s %s %s" % (platform.system(), platform.release(), platform.machine()))
    print("cpu: %s" % cpu_name())
    if cuda:
        prop = torch.cuda.get_device_properties(dev)
        print("gpu: %s (sm_%d%d, %.1f GiB, %d SMs)   CUDA %s   cuDNN %s"
              % (prop.name, prop.major, prop.minor, prop.total_memory / 2**30, prop.multi_processor_count,
                 torch.version.cuda, torch.backends.cudnn.version()))
        print("float32 products: torch.backends.cuda.matmul.allow_tf32 = %s, torch.backends.cudnn.allow_tf32 = %s "
              "(float32_matmul_precision %s); AdamW fused"
              % (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                 torch.get_float32_matmul_precision()))
    print("config: %s   layers: %s   B %d, T %d, D %d, params %d, form %s, chunk %d"
          % (name, ",".join(cfg.layers), B, T, cfg.d_model, nparams, args.form, cfg.chunk_size))
    print("threads: %d (torch.get_num_threads)   precision: %s%s   torch %s"
          % (torch.get_num_threads(), args.dtype, ", autocast bf16" if args.amp == "bf16" else "", torch.__version__))
    how = "no (eager)"
    if args.compile:
        how = "torch.compile mode=%s (forward + loss)" % COMPILE_MODE
    elif args.compile_layers:
        how = "torch.compile mode=%s per layer kind (%s) and of the head + loss" % (
            COMPILE_MODE, ", ".join(sorted(set(cfg.layers))))
    print("device: %s   compile: %s" % (args.device, how))
    if ops:
        print("anchor: %s; TRITON_F32_DEFAULT=%s%s" % (
            ops.describe, os.environ.get("TRITON_F32_DEFAULT", "(unset: tf32 products)"),
            "; fla's Hopper guard (issue 640) LIFTED for timing: a timing, not a result to trust" if ops.bypassed
            else ""))

    def forward():
        opt.zero_grad(set_to_none=False)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            loss, _ = loss_fn(x, y)
        return loss

    def update():
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(lm.parameters(), clip)
        opt.step()

    def step():   # one whole step, untimed (--kernels)
        forward().backward()
        update()
        sync()

    tf, tb, to, ts, tc = [], [], [], [], []
    loss = None
    first = None
    for it in range(args.warmup + args.steps):
        c0, t0 = time.process_time(), time.perf_counter()
        loss = forward()
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        update()
        sync()
        t3, c3 = time.perf_counter(), time.process_time()
        if it == 0:
            first = t3 - t0   # with --compile: mostly compilation
        if it >= args.warmup:
            tf.append(t1 - t0)
            tb.append(t2 - t1)
            to.append(t3 - t2)
            ts.append(t3 - t0)
            tc.append(c3 - c0)

    def med(v):
        v = sorted(v)
        n = len(v)
        return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])

    mf, mb, mo, ms, mc = med(tf), med(tb), med(to), med(ts), med(tc)
    compiling = args.compile or args.compile_layers
    if compiling or cuda:
        print("first step (untimed%s): %.1f s" % (", compiles" if compiling else "", first))
    if cuda:
        print("GPU memory: peak %.2f GiB allocated, %.2f GiB reserved by torch's caching allocator"
              % (torch.cuda.max_memory_allocated(dev) / 2**30, torch.cuda.max_memory_reserved(dev) / 2**30))
    print("per step (median of %d after %d warm-up): forward %.1f ms, backward %.1f ms, clip+AdamW %.1f ms, "
          "total %.1f ms = %.0f tokens/s; CPU time %.1f ms = %.0f tokens per CPU-second   (last loss %.4f)"
          % (args.steps, args.warmup, 1e3 * mf, 1e3 * mb, 1e3 * mo, 1e3 * ms, B * T / ms, 1e3 * mc, B * T / mc,
             float(loss)))
    print("RESULT config=%s B=%d T=%d threads=%d params=%d fwd_ms=%.2f bwd_ms=%.2f opt_ms=%.2f step_ms=%.2f "
          "tokens_per_s=%.0f cpu_ms=%.2f tokens_per_cpu_s=%.0f amp=%s device=%s compile=%s fla=%d"
          % (name, B, T, torch.get_num_threads(), nparams, 1e3 * mf, 1e3 * mb, 1e3 * mo, 1e3 * ms, B * T / ms,
             1e3 * mc, B * T / mc, args.amp, args.device,
             "layers" if args.compile_layers else str(int(args.compile)), int(bool(args.fla))))
    if args.kernels > 0 and cuda:
        kernel_table(step, args.kernels)


def fla_ops(cfg):
    """FlaOps for --fla, or a stop with why not (before any work)."""
    try:
        check_kinds(cfg)
        ops = FlaOps(args.fla, cfg.chunk_size, args.bypass_hopper_guard)
    except (Unavailable, ValueError) as e:
        sys.exit("throughput: %s" % e)
    gated = sorted({k for k in cfg.layers if k in ("gdn", "mamba")})
    if ops.guard and not ops.bypassed and gated:
        sys.exit("throughput: --fla: fla refuses the gated backward (%s) on Hopper with Triton %s < 3.7.1 (fla issue "
                 "640, a Triton miscompile); --bypass-hopper-guard times it anyway" % (
                     ", ".join(gated), ops.describe.rsplit(" ", 1)[-1]))
    return ops


def kernel_table(step, n):
    """One step under torch.profiler: the n GPU kernels with the most time."""
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = getattr(e, "cuda_time_total", 0)
        if us > 0:
            rows.append((us, e.count, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print("kernels of one profiled step: %d kinds, %.2f ms in all" % (len(rows), total / 1e3))
    for us, count, key in rows[:n]:
        print("KERNEL ms=%.3f count=%d share=%.1f%% name=%s" % (us / 1e3, count, 100 * us / total, key[:160]))


if __name__ == "__main__":
    main()
