#!/usr/bin/python3
"""The PyTorch + flash-linear-attention anchor of issue 43, and its check.

    fla_model.py check CONFIG --fla DIR [--set S.K=V ...] [--batch B] [--seq T] [--bypass-hopper-guard]
    fla_model.py check CONFIG --stand-in [--device cpu|cuda] ...     (the check's own logic, no fla)

AnchorLM is the reference LM of MODEL.md (python/attnlab_model.py, chunked
form) with its recurrences done by fla's Triton kernels; everything else
(parameters and their initialisation, projections, short convolutions, norms,
output gates, MLP, head, loss) is the reference's own code:
  gdn     chunk_gated_delta_rule(q, k, v, u w_dt, u w_beta, scale = 1/sqrt(d_k)) with the flags fla's
          own GatedDeltaNet layer passes: use_qk_l2norm_in_kernel (x / sqrt(sum x^2 + 1e-6), MODEL.md's
          l2norm), use_gate_in_kernel with A_log and dt_bias (g = -exp(A_log) softplus(u w_dt + dt_bias),
          MODEL.md's decay), use_beta_sigmoid_in_kernel (beta = sigmoid(u w_beta)), state_v_first (the
          state's layout only). MODEL.md's q / sqrt(d_k) is fla's scale.
  mamba   chunk_simple_gla(q, dt k, v, g = -exp(A_log) dt, scale = 1/sqrt(d_k)), then + D v.
  linear  chunk_simple_gla(l2norm q, l2norm k, v, g = None, scale = 1/sqrt(d_k)): g = None is fla's
          no-decay form, exactly g = 0, without the gated kernels (and without their Hopper refusal).
  attn    F.scaled_dot_product_attention(is_causal=True, scale = 1/sqrt(d_k)): what the reference's
          chunked form calls already (torch >= 2.0); its RoPE and options are the reference's.
fla takes [B, T, H, d]; the reference's heads() is the same memory seen as (B, H, T, d). Other mixers
(mamba2, gdp, kda) are refused: no fla kernel is swapped in for them here, and an anchor with some
layers left in plain PyTorch would be mislabelled.

Documents: none, refused by construction (loss() takes no document flags). The anchor times what
train_bench times, random tokens without document starts (lm_loss(..., NULL)); the reference has
no document path either, so fla's cu_seqlens could not be checked against it. The configs'
[data] documents key concerns training from the corpus, not these step timings.

check: the reference in float32 and in float64 and the anchor in float32 (fla's Triton products in
IEEE float32, TRITON_F32_DEFAULT=ieee; no TF32 in torch's) from the same weights on one batch of
random tokens (B, T default 2, 1024: sixteen chunks of 64 a row, the state carried across them).
Printed: the three losses and the anchor's relative difference to the float32 reference; each
mixer's output on the same input (the float32 reference's), normwise max |a - b| / max(|a|, |b|);
every parameter's gradient. Each figure of the anchor is judged against the float64 reference:
it passes when err(anchor, f64) <= max(FLOOR, 10 x err(reference f32, f64)), that is, when the
anchor is as exact as the plain float32 reference up to a factor 10, or within the floor:
  loss 1e-5 relative: float32 rounding (6e-8) through 12 layers and a mean over B*T tokens
      stays near 1e-6; a wrong scale or gate moves it further even at initialisation;
  mixer outputs 1e-4 normwise: both sides sum in float32 over 64-long chunks and d_k = 64
      products (fla's softplus uses ex2/lg2.approx, relative error ~1e-7); a wrong scale, norm,
      gate or layout errs by 1e-2 or more;
  gradients 1e-4 normwise per tensor: the same sums, then the backward's over B*T.
fla refuses the gated backward on Hopper with Triton >= 3.4, < 3.7.1 (fla issue 640, a Triton
miscompile); the check keeps that refusal and then compares no gradients, and says so. With
--bypass-hopper-guard it lifts it and prints the gradients anyway, marked as informational: they
tell whether the timed anchor's backward is right at this shape, and do not decide the verdict.
Exit status: 0 when every judged figure passes, 1 when one does not, 2 on bad usage or a missing
CUDA GPU, Triton or fla.

--stand-in replaces fla by TorchOps, a pure-PyTorch double with fla's calling conventions made of
the reference's own recurrences (any device, torch 1.13 too): tests/python/test_anchor_swap.py uses
it to check the swap bit for bit; fla itself runs only on the GPU machine.
"""

import argparse
import copy
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import LM, gdn_chunked, gla_chunked, l2norm, model_config_from_ini, parse_ini  # noqa: E402

SWAPPED = ("gdn", "mamba", "linear", "attn")
FLA_PACKAGES = ("fla", "fla.ops", "fla.modules", "fla.ops.gated_delta_rule", "fla.ops.simple_gla")
FACTOR = 10.0
FLOOR = {"loss": 1e-5, "mixer": 1e-4, "grad": 1e-4}


class Unavailable(Exception):
    """fla, Triton or a CUDA GPU is missing: the message says which and what to do."""


# ---------------------------------------------------------------- config

def config_with_sets(text, sets):
    """(ModelConfig, configparser) of INI text with section.key=value overrides applied."""
    cp = parse_ini(text)
    for s in sets:
        key, sep, value = s.partition("=")
        sec, dot, k = key.partition(".")
        if not sep or not dot or not sec or not k:
            raise ValueError("--set '%s': expected section.key=value" % s)
        if not cp.has_section(sec):
            cp.add_section(sec)
        cp.set(sec, k, value)
    if not cp.has_section("model"):
        raise ValueError("no [model] section")
    lines = []
    for sec in cp.sections():
        lines.append("[%s]" % sec)
        lines += ["%s = %s" % kv for kv in cp.items(sec)]
    return model_config_from_ini("\n".join(lines)), cp


# ---------------------------------------------------------------- the ops

class FlaOps:
    """fla's chunk_gated_delta_rule and chunk_simple_gla imported from a source folder (the one
    holding fla/), its op packages registered bare (fla_ops_bench.register_bare)."""

    def __init__(self, fla_dir, chunk_size, bypass_guard=False):
        root = os.path.abspath(fla_dir)
        if not os.path.isfile(os.path.join(root, "fla", "ops", "gated_delta_rule", "chunk.py")):
            raise Unavailable("--fla '%s': no fla/ops/gated_delta_rule/chunk.py under it (give the folder that "
                              "holds fla/, e.g. .fla with a flash-linear-attention checkout's fla/ copied in)"
                              % fla_dir)
        if chunk_size not in (16, 32, 64):
            raise ValueError("chunk_size %d: fla's chunk_gated_delta_rule takes 16, 32 or 64" % chunk_size)
        try:
            import triton
        except ImportError:
            raise Unavailable("fla's kernels need Triton, which this Python (%s) does not have" % sys.executable)
        if not torch.cuda.is_available():
            raise Unavailable("fla's kernels need a CUDA GPU: torch %s sees none" % torch.__version__)
        import importlib
        from fla_ops_bench import fla_version, hopper_guard, register_bare
        register_bare(root, FLA_PACKAGES)
        self._gdn = importlib.import_module("fla.ops.gated_delta_rule.chunk").chunk_gated_delta_rule
        self._gla = importlib.import_module("fla.ops.simple_gla.chunk").chunk_simple_gla
        self.chunk = chunk_size
        self.guard = hopper_guard(bypass_guard)   # whether fla's issue-640 refusal applies here
        self.bypassed = self.guard and bypass_guard
        self.describe = "fla %s from %s, triton %s" % (fla_version(root), root, triton.__version__)

    def gdn(self, q, k, v, g_raw, beta_raw, A_log, dt_bias, scale):
        """o (B, T, H, dv): q, k before their l2norm, g_raw = u w_dt, beta_raw = u w_beta, all [B, T, H, ...]."""
        return self._gdn(q, k, v, g_raw, beta_raw, scale=scale, use_qk_l2norm_in_kernel=True,
                         use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True,
                         state_v_first=True, chunk_size=self.chunk)[0]

    def gla(self, q, k, v, g, scale):
        """o (B, T, H, dv) of S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t; g None: no decay."""
        return self._gla(q, k, v, g, scale=scale, chunk_size=self.chunk)[0]


class TorchOps:
    """FlaOps' calls done by the reference's own code (gdn_chunked, gla_chunked and the reference's
    elementwise formulas), for tests on any device and torch. With a d_k whose square root is a power
    of two (16, 64) scale * q equals the reference's q / sqrt(d_k) bit for bit, and so does the model."""
    describe = "TorchOps (the reference's own chunked recurrences with fla's conventions; no fla)"
    guard = bypassed = False

    def __init__(self, chunk_size):
        self.chunk = chunk_size

    def gdn(self, q, k, v, g_raw, beta_raw, A_log, dt_bias, scale):
        # The reference's layouts and order of operations: autograd sums the gradients that meet
        # (in u, in q) in the order their nodes were made, so that order decides the last bits.
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = l2norm(q) * scale, l2norm(k)
        beta = torch.sigmoid(beta_raw).transpose(1, 2)
        g = -torch.exp(A_log) * F.softplus(g_raw + dt_bias)
        return gdn_chunked(q, k, v, beta, g.transpose(1, 2), self.chunk).transpose(1, 2)

    def gla(self, q, k, v, g, scale):
        o = gla_chunked((q * scale).transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                        None if g is None else g.transpose(1, 2), self.chunk)
        return o.transpose(1, 2)


# ---------------------------------------------------------------- the model

def check_kinds(cfg):
    for l, kind in enumerate(cfg.layers):
        if kind not in SWAPPED:
            raise ValueError("layer %d is %s: the anchor swaps fla's kernels into %s only"
                             % (l, kind, ", ".join(SWAPPED)))


class AnchorLM(LM):
    """The reference LM with ops (FlaOps or TorchOps) doing gdn's, mamba's and linear's recurrences."""

    def __init__(self, cfg, ops, dtype=torch.float32, seed=1337):
        check_kinds(cfg)
        super().__init__(cfg, dtype=dtype, seed=seed, form="chunked")
        self.ops = ops

    @classmethod
    def sharing(cls, lm, ops):
        """An anchor over lm's parameter tensors (the same leaves: gradients land in them)."""
        check_kinds(lm.cfg)
        a = copy.copy(lm)
        a.__class__ = cls
        a.form, a.ops = "chunked", ops
        return a

    def _bthd(self, m, u):
        """q, k, v after the short convolutions, as (B, T, H, d)."""
        P, H = self.params, self.cfg.n_heads
        B, T, _ = u.shape
        return [self._conv(m, w, u @ P[m + "w" + w]).reshape(B, T, H, -1) for w in "qkv"]

    def _gdn(self, m, u):
        P = self.params
        q, k, v = self._bthd(m, u)
        beta_raw = u @ P[m + "w_beta"]   # before u w_dt, as the reference (the order of u's gradient sum)
        o = self.ops.gdn(q, k, v, u @ P[m + "w_dt"], beta_raw, P[m + "A_log"], P[m + "dt_bias"],
                         1 / math.sqrt(self.cfg.d_k))
        return self._out(m, o.transpose(1, 2), u)

    def _mamba(self, m, u):
        P = self.params
        q, k, v = self._bthd(m, u)
        dt, g = self._decay(m, u)                                   # (B, H, T): the reference's own
        # dt_t k_t in the reference's (B, H, T, d) view: the same values, and the same order of the
        # sums in dt's gradient, whatever the layout (fla copies its inputs contiguous anyway)
        k = (k.transpose(1, 2) * dt[..., None]).transpose(1, 2)
        o = self.ops.gla(q, k, v, g.transpose(1, 2), 1 / math.sqrt(self.cfg.d_k))
        o = o + P[m + "D"][None, None] * v                          # + D_h * v_t
        return self._out(m, o.transpose(1, 2), u)

    def _linear(self, m, u):
        q, k, v = self._bthd(m, u)
        # l2norm over the reference's (B, H, T, d) view of the same memory: fla does not mind the
        # layout, and TorchOps then computes exactly what the reference does
        q, k = (l2norm(z.transpose(1, 2)).transpose(1, 2) for z in (q, k))
        o = self.ops.gla(q, k, v, None, 1 / math.sqrt(self.cfg.d_k))
        return self._out(m, o.transpose(1, 2), u)


# ---------------------------------------------------------------- check

def rel_err(a, b):
    """max |a - b| / max(max |a|, max |b|), in float64 (the project's max_rel_diff); inf if not finite."""
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return math.inf
    scale = max(float(a.abs().max()), float(b.abs().max()))
    worst = float((a - b).abs().max())
    return worst / scale if scale > 0 else worst


def bound(what, ref_err):
    return max(FLOOR[what], FACTOR * ref_err)


def with_f64(lm):
    """A view of lm whose parameters are float64 copies of its own."""
    r = copy.copy(lm)
    r.params = {n: p.detach().double().requires_grad_(True) for n, p in lm.params.items()}
    return r


def mixer_inputs(lm, x):
    """[(layer, kind, mixer prefix, u)]: each mixer's input in lm's forward on tokens x."""
    seen = []
    view = copy.copy(lm)
    for kind in set(lm.cfg.layers):
        def record(m, u, f=getattr(lm, "_" + kind), kind=kind):
            seen.append((int(m.split(".")[1]), kind, m, u.detach()))
            return f(m, u)
        setattr(view, "_" + kind, record)
    with torch.no_grad():
        view.forward(x)
    return seen


def loss_and_grads(lm, x, y):
    """(loss, {name: gradient} or None, why none)."""
    loss, _ = lm.loss(x, y)
    names = list(lm.params)
    try:
        grads = torch.autograd.grad(loss, [lm.params[n] for n in names])
    except Exception as e:   # fla's issue-640 refusal (RuntimeError), or a backward kernel that fails
        return float(loss), None, "%s: %s" % (type(e).__name__, (str(e).strip().splitlines() or [""])[0])
    return float(loss), dict(zip(names, grads)), None


def check_mixers(ref, anchor, ref64, x):
    ok = True
    for l, kind, m, u in mixer_inputs(ref, x):
        with torch.no_grad():
            o32 = getattr(ref, "_" + kind)(m, u)
            oa = getattr(anchor, "_" + kind)(m, u)
            o64 = getattr(ref64, "_" + kind)(m, u.double())
        e_ref, e_a = rel_err(o32, o64), rel_err(oa, o64)
        good = e_a <= bound("mixer", e_ref)
        ok &= good
        print("layer %2d %-6s mixer output vs float64: reference f32 %.2e, anchor %.2e (bound %.1e), "
              "anchor vs reference f32 %.2e   %s" % (l, kind, e_ref, e_a, bound("mixer", e_ref), rel_err(oa, o32),
                                                     "ok" if good else "FAIL"))
    return ok


def check_grads(g32, ga, g64, judged):
    """Prints the worst gradients (anchor's error over its bound); returns whether all pass."""
    rows = []
    for n in g32:
        e_ref, e_a = rel_err(g32[n], g64[n]), rel_err(ga[n], g64[n])
        rows.append((e_a / bound("grad", e_ref), n, e_ref, e_a, rel_err(ga[n], g32[n])))
    rows.sort(reverse=True)
    bad = [r for r in rows if r[0] > 1]
    tag = "" if judged else "   [informational: fla's Hopper guard lifted]"
    print("gradients of %d tensors vs float64, the 5 nearest their bound:%s" % (len(rows), tag))
    for ratio, n, e_ref, e_a, e_x in rows[:5]:
        print("  %-32s reference f32 %.2e, anchor %.2e (bound %.1e), anchor vs reference f32 %.2e   %s"
              % (n, e_ref, e_a, bound("grad", e_ref), e_x, "ok" if ratio <= 1 else "FAIL"))
    print("gradients: %d of %d within their bound%s" % (len(rows) - len(bad), len(rows), tag))
    return not bad


def run_check(cfg, ops, B, T, device, loss_only=False):
    """Prints the comparison; returns the exit status (0 pass, 1 fail)."""
    dev = torch.device(device)
    ref = LM(cfg, dtype=torch.float32, seed=1337, form="chunked")
    for n in list(ref.params):
        ref.params[n] = ref.params[n].detach().to(dev).requires_grad_(True)
    anchor, ref64 = AnchorLM.sharing(ref, ops), with_f64(ref)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (B, T), generator=gen).to(dev)
    y = torch.randint(0, cfg.vocab_size, (B, T), generator=gen).to(dev)
    print("check: %s, layers %s, B %d, T %d, D %d, chunk %d, on %s; ops: %s"
          % ("float32 anchor vs reference", ",".join(cfg.layers), B, T, cfg.d_model, cfg.chunk_size, device,
             ops.describe))
    ok = check_mixers(ref, anchor, ref64, x)
    if loss_only:   # forward kernels only: fla's backward kernels autotune for minutes
        with torch.no_grad():
            l32, l64, la = (float(m.loss(x, y)[0]) for m in (ref, ref64, anchor))
        g32 = g64 = ga = None
        why = "--loss-only"
    else:
        l32, g32, _ = loss_and_grads(ref, x, y)
        l64, g64, _ = loss_and_grads(ref64, x, y)
        la, ga, why = loss_and_grads(anchor, x, y)
    e_ref, e_a = abs(l32 - l64) / abs(l64), abs(la - l64) / abs(l64)
    good = e_a <= bound("loss", e_ref)
    ok &= good
    print("loss: reference f32 %.9f, anchor %.9f, reference f64 %.12f" % (l32, la, l64))
    print("loss: anchor vs reference f32 %.2e relative; vs float64: reference f32 %.2e, anchor %.2e (bound %.1e)   %s"
          % (abs(la - l32) / abs(l32), e_ref, e_a, bound("loss", e_ref), "ok" if good else "FAIL"))
    judged = not ops.bypassed
    if loss_only:
        print("gradients: not compared (--loss-only)")
    elif ga is None:
        print("gradients: NOT compared: the anchor's backward refused or failed: %s" % why)
        if ops.guard:
            print("  (fla's guard for Triton < 3.7.1 on Hopper, fla issue 640; --bypass-hopper-guard shows them "
                  "as information)")
    elif not check_grads(g32, ga, g64, judged) and judged:
        ok = False
    print("check: %s%s" % ("PASS" if ok else "FAIL",
                           "" if ga is not None and judged else " (loss and mixer outputs; gradients not judged)"))
    return 0 if ok else 1


def cmd_check(args):
    if not args.stand_in:
        # Read by Triton when it compiles a kernel, so before the first one: float32 dot
        # products in IEEE float32, as the reference's products (no TF32).
        os.environ["TRITON_F32_DEFAULT"] = "ieee"
    try:
        with open(args.config) as f:
            cfg, _ = config_with_sets(f.read(), args.set)
        check_kinds(cfg)
    except (OSError, ValueError, KeyError) as e:
        sys.exit("fla_model: %s: %s" % (args.config, e))
    if args.batch < 1 or args.seq < 1:
        sys.exit("fla_model: --batch and --seq must be >= 1")
    device = args.device
    if device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("fla_model: check: torch %s sees no CUDA GPU (%s); fla's kernels run only there (--stand-in "
                     "--device cpu checks the swap without them)"
                     % (torch.__version__, "built without CUDA" if torch.version.cuda is None else "none usable"))
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        ops = TorchOps(cfg.chunk_size) if args.stand_in else FlaOps(args.fla, cfg.chunk_size, args.bypass_hopper_guard)
    except (Unavailable, ValueError) as e:
        print("fla_model: %s" % e, file=sys.stderr)
        sys.exit(2)
    if ops.guard:
        print("# fla's Hopper guard (issue 640) applies to this GPU and Triton: %s"
              % ("LIFTED: the gradients below are information, not part of the verdict" if ops.bypassed else
                 "kept: gated backwards refuse, gradients will not be compared"))
    print("# TRITON_F32_DEFAULT=%s; torch %s" % (os.environ.get("TRITON_F32_DEFAULT", "(unset)"), torch.__version__))
    sys.exit(run_check(cfg, ops, args.batch, args.seq, device, args.loss_only))


def main(argv=None):
    p = argparse.ArgumentParser(description="the PyTorch + fla anchor of issue 43")
    sub = p.add_subparsers(dest="cmd")
    c = sub.add_parser("check", help="the anchor's loss, mixer outputs and gradients against the reference")
    c.add_argument("config", help="an INI config (configs/gpu_d1024_hybrid.ini)")
    src = c.add_mutually_exclusive_group(required=True)
    src.add_argument("--fla", help="the folder that holds fla/ (a source checkout)")
    src.add_argument("--stand-in", action="store_true", help="TorchOps instead of fla (tests the check itself)")
    c.add_argument("--set", action="append", default=[], metavar="S.K=V", help="override a config key")
    c.add_argument("--batch", type=int, default=2, help="rows (default 2)")
    c.add_argument("--seq", type=int, default=1024, help="tokens a row (default 1024)")
    c.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    c.add_argument("--loss-only", action="store_true",
                   help="the loss and mixer outputs, no gradients (no backward kernels to compile and autotune)")
    c.add_argument("--bypass-hopper-guard", action="store_true",
                   help="lift fla's issue-640 refusal to show the gradients (information, not part of the verdict)")
    args = p.parse_args(argv)
    if args.cmd != "check":
        p.error("say what to do: check")
    if args.fla and args.device != "cuda":
        p.error("--fla runs fla's Triton kernels: they need --device cuda")
    cmd_check(args)


if __name__ == "__main__":
    main()
