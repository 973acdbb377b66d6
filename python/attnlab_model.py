"""An independent PyTorch implementation of the language model of MODEL.md.

Written from the spec (docs/MODEL.md), not from
the C code, so that agreeing with the C side means something. Parameter names
and shapes are the C checkpoint's (docs/checkpoint.md): dense weights are
stored (in, out) and applied on the right, y = u W; names such as
"layers.0.mixer.wq" are kept as they are in a plain dict (torch modules do not
allow dots in parameter names), so weights load by name.

Mixers: attn, linear, mamba, gdn, mamba2, gdp, kda. Each recurrent mixer has two forms:
  "recurrent"  the spec's recurrence, one token at a time (the reference);
  "chunked"    chunks of C positions, matrix products inside a chunk and the
               state carried across chunks (for speed; GLA form for linear and
               mamba, the WY form of MODEL.md for gdn, and for gdp over its
               interleaved sequence; for kda the WY form with a decay per key
               channel, docs/kda.md).
attn uses F.scaled_dot_product_attention when torch has it (>= 2.0) and an
explicit masked softmax otherwise (or when form is "recurrent", the reference).

Works with torch 1.13 (Debian 12's python3-torch) and newer.
"""

import configparser
import math

import torch
import torch.nn.functional as F

VOCAB = 256  # the byte tokenizer's vocabulary (data/tokenizer.h)


# ---------------------------------------------------------------- config

class ModelConfig:
    """The [model] section of a config (the keys this reference needs)."""

    def __init__(self, layers, d_model=128, n_heads=4, d_k=32, d_v=32, d_ff=512, tied_embeddings=True,
                 chunk_size=32, conv_size=4, norm_eps=1e-6, rope_base=10000.0, vocab_size=VOCAB,
                 qk_norm=False, attn_gate=False, gdp_steps=2, kda_gate_bias=True):
        self.layers = list(layers)
        self.d_model, self.n_heads, self.d_k, self.d_v, self.d_ff = d_model, n_heads, d_k, d_v, d_ff
        self.tied_embeddings = tied_embeddings
        self.chunk_size, self.conv_size = chunk_size, conv_size
        self.norm_eps, self.rope_base = norm_eps, rope_base
        self.vocab_size = vocab_size
        self.qk_norm, self.attn_gate = qk_norm, attn_gate   # attn's options (MODEL.md)
        self.gdp_steps = gdp_steps                          # gdp: delta steps per token n
        self.kda_gate_bias = kda_gate_bias                  # kda: the output gate's bias b_g2

    def __repr__(self):
        return "ModelConfig(%s)" % ", ".join("%s=%r" % kv for kv in vars(self).items())


def parse_ini(text):
    """INI text -> configparser (inline '#' comments allowed, keys case-sensitive)."""
    cp = configparser.ConfigParser(inline_comment_prefixes=("#", ";"), interpolation=None)
    cp.optionxform = str
    cp.read_string(text)
    return cp


def model_config_from_ini(text, vocab_size=VOCAB):
    """ModelConfig from INI text; missing keys take the C program's defaults (train/config.c)."""
    m = parse_ini(text)["model"]
    return ModelConfig(
        layers=[s.strip() for s in m.get("layers", "attn,gdn").split(",") if s.strip()],
        d_model=m.getint("d_model", 128), n_heads=m.getint("n_heads", 4),
        d_k=m.getint("d_k", 32), d_v=m.getint("d_v", 32), d_ff=m.getint("d_ff", 512),
        tied_embeddings=m.getboolean("tied_embeddings", True),
        chunk_size=m.getint("chunk_size", 32), conv_size=m.getint("conv_size", 4),
        norm_eps=m.getfloat("norm_eps", 1e-6), rope_base=m.getfloat("rope_base", 10000.0),
        vocab_size=vocab_size, qk_norm=m.getboolean("qk_norm", False), attn_gate=m.getboolean("attn_gate", False),
        gdp_steps=m.getint("gdp_steps", 2), kda_gate_bias=m.getboolean("kda_gate_bias", True))


# ---------------------------------------------------------------- small pieces

def rmsnorm(z, g, eps):
    """z / sqrt(mean(z^2) + eps) * g over the last dimension."""
    return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps) * g


def l2norm(z):
    """z / sqrt(sum z^2 + 1e-6) over the last dimension."""
    return z * torch.rsqrt(z.pow(2).sum(-1, keepdim=True) + 1e-6)


def short_conv(z, w):
    """Causal depthwise convolution then SiLU. z: (B, T, Ch), w: (Ch, W) or None (identity).

    y[t, c] = sum_j w[c, j] z[t - W + 1 + j, c], zeros before the start."""
    if w is None:
        return z
    Ch, W = w.shape
    x = F.pad(z.transpose(1, 2), (W - 1, 0))               # (B, Ch, T + W - 1)
    y = F.conv1d(x, w.unsqueeze(1), groups=Ch)             # cross-correlation = the formula above
    return F.silu(y.transpose(1, 2))


def heads(z, H):
    """(B, T, H*d) -> (B, H, T, d)."""
    B, T, _ = z.shape
    return z.reshape(B, T, H, -1).transpose(1, 2)


def unheads(z):
    """(B, H, T, d) -> (B, T, H*d)."""
    B, H, T, d = z.shape
    return z.transpose(1, 2).reshape(B, T, H * d)


def rope(z, base, pos0=0):
    """Rotate interleaved pairs (2i, 2i+1) of each head by t * base^(-2i/d). z: (B, H, T, d)."""
    T, d = z.shape[-2], z.shape[-1]
    t = torch.arange(pos0, pos0 + T, dtype=torch.float64, device=z.device)
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=z.device) / d)   # (d/2)
    ang = t[:, None] * inv[None, :]                                                       # (T, d/2)
    cos, sin = torch.cos(ang).to(z.dtype), torch.sin(ang).to(z.dtype)
    x0, x1 = z[..., 0::2], z[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


# ---------------------------------------------------------------- sequence kernels
# Inputs per head: q, k (B, H, T, dk), v (B, H, T, dv), g (B, H, T) log-decay
# (<= 0) or None, beta (B, H, T). Outputs o (B, H, T, dv); S (B, H, dk, dv).

def softmax_attention(q, k, v, scale, reference=False):
    """Causal softmax attention."""
    if not reference and hasattr(F, "scaled_dot_product_attention"):
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        except TypeError:   # torch 2.0: no scale argument
            return F.scaled_dot_product_attention(q * (scale * math.sqrt(q.shape[-1])), k, v, is_causal=True)
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * scale
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v


def gla_recurrent(q, k, v, g):
    """S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t (g None: no decay)."""
    B, H, T, dk = q.shape
    S = q.new_zeros(B, H, dk, v.shape[-1])
    out = []
    for t in range(T):
        if g is not None:
            S = torch.exp(g[:, :, t])[..., None, None] * S
        S = S + k[:, :, t, :, None] * v[:, :, t, None, :]
        out.append((q[:, :, t, :, None] * S).sum(-2))
    return torch.stack(out, dim=2)


def gdn_recurrent(q, k, v, beta, g):
    """S_t = exp(g_t) S_{t-1} + k_t d_t^T, d_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t), o_t = S_t^T q_t:
    kda_recurrent with the head's decay on every key channel."""
    return kda_recurrent(q, k, v, beta, g[..., None].expand(q.shape))


def kda_recurrent(q, k, v, beta, g):
    """S' = Diag(exp(g_t)) S_{t-1} (row i of S times exp(g_t[i])), d_t = beta_t (v_t - S'^T k_t),
    S_t = S' + k_t d_t^T, o_t = S_t^T q_t; g (B, H, T, dk)."""
    B, H, T, dk = q.shape
    S = q.new_zeros(B, H, dk, v.shape[-1])
    out = []
    for t in range(T):
        S = torch.exp(g[:, :, t])[..., None] * S
        kt = k[:, :, t]
        d = beta[:, :, t, None] * (v[:, :, t] - (kt[..., None] * S).sum(-2))
        S = S + kt[..., None] * d[..., None, :]
        out.append((q[:, :, t, :, None] * S).sum(-2))
    return torch.stack(out, dim=2)


def gdp_recurrent(q, k, v, beta, g):
    """Per token S = exp(g_t) S, then for each step j: S = S + k_tj d^T, d = beta_tj (v_tj - S^T k_tj);
    o_t = S^T q_t. k (B, H, T, n, dk), v (B, H, T, n, dv), beta (B, H, T, n)."""
    B, H, T, dk = q.shape
    S = q.new_zeros(B, H, dk, v.shape[-1])
    out = []
    for t in range(T):
        S = torch.exp(g[:, :, t])[..., None, None] * S
        for j in range(k.shape[3]):
            kt = k[:, :, t, j]
            d = beta[:, :, t, j, None] * (v[:, :, t, j] - (kt[..., None] * S).sum(-2))
            S = S + kt[..., None] * d[..., None, :]
        out.append((q[:, :, t, :, None] * S).sum(-2))
    return torch.stack(out, dim=2)


def gdp_chunked(q, k, v, beta, g, C):
    """gdp_recurrent as gdn_chunked over the T*n positions t*n + j (MODEL.md, gdp): step j's k, v, beta there,
    g_t at j = 0 and 0 after it, q_t at j = n - 1 and 0 before it; the output of each token's last step."""
    B, H, T, n, dk = k.shape
    qi = torch.cat((q.new_zeros(B, H, T, n - 1, dk), q[:, :, :, None]), dim=3).reshape(B, H, T * n, dk)
    gi = torch.cat((g[..., None], g.new_zeros(B, H, T, n - 1)), dim=3).reshape(B, H, T * n)
    o = gdn_chunked(qi, k.reshape(B, H, T * n, dk), v.reshape(B, H, T * n, -1), beta.reshape(B, H, T * n), gi, C)
    return o[:, :, n - 1::n]


def _chunks(x, C, value=0.0):
    """(B, H, T, ...) -> (B, H, N, C, ...), padding T up to N*C with `value`."""
    T = x.shape[2]
    N = (T + C - 1) // C
    pad = N * C - T
    if pad:
        widths = [0, 0] * (x.dim() - 3) + [0, pad]
        x = F.pad(x, widths, value=value)
    return x.reshape(x.shape[:2] + (N, C) + x.shape[3:])


def _decays(g, C):
    """Within-chunk cumulative log-decay G (B, H, N, C), the masked decay matrix
    exp(G_i - G_j) for j <= i (else 0) and exp(G_C - G_j), all from non-positive differences."""
    G = torch.cumsum(g, dim=-1)
    diff = G[..., :, None] - G[..., None, :]
    mask = torch.ones(C, C, dtype=torch.bool, device=g.device).tril()
    L = torch.exp(diff.masked_fill(~mask, float("-inf")))
    to_end = torch.exp(G[..., -1:] - G)
    return G, L, to_end


def gla_chunked(q, k, v, g, C):
    """The chunked form of gla_recurrent: masked parallel inside a chunk, state across chunks."""
    B, H, T, dk = q.shape
    dv = v.shape[-1]
    qc, kc, vc = _chunks(q, C), _chunks(k, C), _chunks(v, C)
    N = qc.shape[2]
    if g is None:
        g = q.new_zeros(B, H, T)
    G, L, to_end = _decays(_chunks(g, C), C)
    o = ((qc @ kc.transpose(-1, -2)) * L) @ vc                 # intra-chunk
    qd = qc * torch.exp(G)[..., None]                           # q_i exp(G_i)
    kd = kc * to_end[..., None]                                 # k_j exp(G_C - G_j)
    S = q.new_zeros(B, H, dk, dv)
    inter = []
    for n in range(N):
        inter.append(qd[:, :, n] @ S)
        S = torch.exp(G[:, :, n, -1])[..., None, None] * S + kd[:, :, n].transpose(-1, -2) @ vc[:, :, n]
    o = o + torch.stack(inter, dim=2)
    return o.reshape(B, H, N * C, dv)[:, :, :T]


def gdn_chunked(q, k, v, beta, g, C):
    """The chunked WY form of MODEL.md for gdn_recurrent."""
    B, H, T, dk = q.shape
    dv = v.shape[-1]
    qc, kc, vc, bc = _chunks(q, C), _chunks(k, C), _chunks(v, C), _chunks(beta, C)
    N = qc.shape[2]
    G, L, to_end = _decays(_chunks(g, C), C)
    b = torch.exp(G)                                            # (B, H, N, C)
    strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)
    A = (bc[..., None] * L * (kc @ kc.transpose(-1, -2))).masked_fill(~strict, 0.0)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    Tm = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
    W = Tm @ (kc * (bc * b)[..., None])                         # (B, H, N, C, dk)
    U = Tm @ (vc * bc[..., None])                               # (B, H, N, C, dv)
    P = (qc @ kc.transpose(-1, -2)) * L                         # includes the diagonal
    qb = qc * b[..., None]
    kd = kc * to_end[..., None]
    S = q.new_zeros(B, H, dk, dv)
    out = []
    for n in range(N):
        D = U[:, :, n] - W[:, :, n] @ S
        out.append(qb[:, :, n] @ S + P[:, :, n] @ D)
        S = b[:, :, n, -1][..., None, None] * S + kd[:, :, n].transpose(-1, -2) @ D
    return torch.stack(out, dim=2).reshape(B, H, N * C, dv)[:, :, :T]


def kda_chunked(q, k, v, beta, g, C):
    """The chunked WY form of kda_recurrent (docs/kda.md): gdn_chunked's with the decay exp(Gamma_i - Gamma_j)
    a vector over the key channels inside the products, Gamma (B, H, N, C, dk) the in-chunk sums of g."""
    B, H, T, dk = q.shape
    dv = v.shape[-1]
    qc, kc, vc, bc = _chunks(q, C), _chunks(k, C), _chunks(v, C), _chunks(beta, C)
    N = qc.shape[2]
    G = torch.cumsum(_chunks(g, C), dim=3)
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    diff = (G[:, :, :, :, None] - G[:, :, :, None, :]).masked_fill(~lower[..., None], float("-inf"))
    E = torch.exp(diff)                                         # (B, H, N, C, C, dk), 0 above the diagonal
    KK = torch.einsum("bhnic,bhnijc,bhnjc->bhnij", kc, E, kc)
    P = torch.einsum("bhnic,bhnijc,bhnjc->bhnij", qc, E, kc)    # includes the diagonal
    A = (bc[..., None] * KK).tril(-1)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    Tm = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
    eG = torch.exp(G)
    W = Tm @ (kc * eG * bc[..., None])                          # (B, H, N, C, dk)
    U = Tm @ (vc * bc[..., None])                               # (B, H, N, C, dv)
    qb, kd = qc * eG, kc * torch.exp(G[:, :, :, -1:] - G)
    S = q.new_zeros(B, H, dk, dv)
    out = []
    for n in range(N):
        D = U[:, :, n] - W[:, :, n] @ S
        out.append(qb[:, :, n] @ S + P[:, :, n] @ D)
        S = eG[:, :, n, -1][..., None] * S + kd[:, :, n].transpose(-1, -2) @ D
    return torch.stack(out, dim=2).reshape(B, H, N * C, dv)[:, :, :T]


# ---------------------------------------------------------------- the model

def _normal(shape, std, gen, dtype):
    return torch.randn(shape, generator=gen, dtype=dtype) * std


def _uniform(shape, lo, hi, gen, dtype):
    return torch.rand(shape, generator=gen, dtype=dtype) * (hi - lo) + lo


def param_shapes(cfg):
    """name -> shape of every parameter of the model of cfg, in the C model's registration order
    (docs/checkpoint.md). Nothing is allocated: a loader checks a file's shapes against these first."""
    D, F_, V, H = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.n_heads
    dk, dv, W = cfg.d_k, cfg.d_v, cfg.conv_size
    s = {"embed": (V, D)}
    for l, kind in enumerate(cfg.layers):
        if kind not in ("attn", "linear", "mamba", "gdn", "mamba2", "gdp", "kda"):
            raise ValueError("layer %d: mixer '%s' is not in this reference (attn, linear, mamba, gdn, mamba2, gdp, "
                             "kda)" % (l, kind))
        n = cfg.gdp_steps if kind == "gdp" else 1   # gdp: n blocks of keys, values and beta
        p = "layers.%d." % l
        m = p + "mixer."
        s[p + "norm1"] = (D,)
        s[m + "wq"], s[m + "wk"], s[m + "wv"] = (D, H * dk), (D, n * H * dk), (D, n * H * dv)
        if kind == "kda":   # src/layers/kda.c's order
            if W > 0:
                s[m + "conv_q"], s[m + "conv_k"], s[m + "conv_v"] = (H * dk, W), (H * dk, W), (H * dv, W)
            s[m + "w_beta"], s[m + "w_f1"], s[m + "w_f2"] = (D, H), (D, dv), (dv, H * dk)
            s[m + "dt_bias"], s[m + "A_log"] = (H * dk,), (H,)
            s[m + "w_g1"], s[m + "w_g2"] = (D, dv), (dv, H * dv)
            if cfg.kda_gate_bias:
                s[m + "b_g2"] = (H * dv,)
            s[m + "out_norm"] = (dv,)
        elif kind != "attn":
            if W > 0:
                s[m + "conv_q"], s[m + "conv_k"], s[m + "conv_v"] = (H * dk, W), (n * H * dk, W), (n * H * dv, W)
            s[m + "out_norm"] = (H * dv,) if kind == "mamba2" else (dv,)
            s[m + "wg"] = (D, H * dv)
            if kind in ("mamba", "gdn", "mamba2", "gdp"):
                s[m + "w_dt"], s[m + "dt_bias"], s[m + "A_log"] = (D, H), (H,), (H,)
            if kind == "mamba":
                s[m + "D"] = (H, dv)
            if kind == "mamba2":
                s[m + "D"] = (H,)
            if kind in ("gdn", "gdp"):
                s[m + "w_beta"] = (D, n * H)
        s[m + "wo"] = (H * dv, D)
        if kind == "attn" and cfg.qk_norm:
            s[m + "q_norm"], s[m + "k_norm"] = (dk,), (dk,)
        if kind == "attn" and cfg.attn_gate:
            s[m + "w_gate"] = (D, H * dv)
        s[p + "norm2"] = (D,)
        s[p + "mlp.w1"], s[p + "mlp.w3"], s[p + "mlp.w2"] = (D, F_), (D, F_), (F_, D)
    s["norm_f"] = (D,)
    if not cfg.tied_embeddings:
        s["lm_head"] = (D, V)
    return s


class LM:
    """The LM of MODEL.md. params: dict name -> leaf tensor (C checkpoint names and shapes).

    form: "recurrent" (reference: token-by-token recurrences, explicit softmax) or
    "chunked" (fast: chunked forms, scaled_dot_product_attention)."""

    def __init__(self, cfg, dtype=torch.float64, seed=0, form="recurrent"):
        self.cfg, self.dtype, self.form = cfg, dtype, form
        self.params = {}
        self.no_decay = set()
        gen = torch.Generator().manual_seed(seed)
        D, F_, L, H = cfg.d_model, cfg.d_ff, len(cfg.layers), cfg.n_heads
        in_std, res = 1 / math.sqrt(D), 1 / math.sqrt(2 * L)
        out_std = res / math.sqrt(H * cfg.d_v)
        for name, shape in param_shapes(cfg).items():
            leaf = name.rsplit(".", 1)[-1]
            decay = leaf not in ("norm1", "norm2", "norm_f", "out_norm", "q_norm", "k_norm", "D", "dt_bias", "A_log",
                                 "b_g2")
            if name == "embed":
                value = _normal(shape, in_std if cfg.tied_embeddings else 1.0, gen, dtype)
            elif leaf == "b_g2":   # kda's output gate bias: zeros, as fla initialises biases
                value = torch.zeros(shape)
            elif not decay and leaf not in ("dt_bias", "A_log"):
                value = torch.ones(shape)
            elif leaf.startswith("conv_"):
                a = 1 / math.sqrt(cfg.conv_size)
                value = _uniform(shape, -a, a, gen, dtype)
            elif leaf == "dt_bias":   # softplus^-1(dt0), dt0 log-uniform in [1e-3, 1e-1]
                dt0 = torch.exp(_uniform(shape, math.log(1e-3), math.log(1e-1), gen, torch.float64))
                value = dt0 + torch.log(-torch.expm1(-dt0))
            elif leaf == "A_log":
                value = torch.log(_uniform(shape, 1.0, 16.0, gen, torch.float64))
            else:
                std = out_std if leaf == "wo" else res / math.sqrt(F_) if name.endswith("mlp.w2") else in_std
                if leaf in ("w_f2", "w_g2"):   # kda's second low-rank factors: fan-in dv
                    std = 1 / math.sqrt(cfg.d_v)
                value = _normal(shape, std, gen, dtype)
            self.params[name] = value.to(dtype).requires_grad_(True)
            if not decay:
                self.no_decay.add(name)

    def parameters(self):
        return list(self.params.values())

    def load(self, arrays):
        """Copy values by name from a mapping name -> array; every name and shape must match."""
        missing = sorted(set(self.params) - set(arrays))
        extra = sorted(set(arrays) - set(self.params))
        if missing or extra:
            raise KeyError("parameters missing from the file: %s; in the file but not in the model: %s"
                           % (missing, extra))
        with torch.no_grad():
            for name, p in self.params.items():
                a = torch.as_tensor(arrays[name])
                if tuple(a.shape) != tuple(p.shape):
                    raise ValueError("%s: shape %s in the file, %s in the model"
                                     % (name, tuple(a.shape), tuple(p.shape)))
                p.copy_(a.to(p.dtype))

    # ---- mixers: u (B, T, D) -> (B, T, D)

    def _conv(self, m, which, z):
        return short_conv(z, self.params.get(m + "conv_" + which))

    def _out(self, m, o, u):
        """o' = RMSNorm_head(o) * SiLU(u Wg), then Wo. o: (B, H, T, dv)."""
        P, c = self.params, self.cfg
        on = rmsnorm(o.transpose(1, 2), P[m + "out_norm"], c.norm_eps)      # (B, T, H, dv)
        B, T = on.shape[:2]
        return (on.reshape(B, T, -1) * F.silu(u @ P[m + "wg"])) @ P[m + "wo"]

    def _attn(self, m, u):
        """With qk_norm each head of q and k is RMS-normalised (one gain of d_k for all heads) before RoPE;
        with attn_gate the output is multiplied by sigmoid(u W_gate) before Wo (MODEL.md, attn's options)."""
        P, c = self.params, self.cfg
        q, k = heads(u @ P[m + "wq"], c.n_heads), heads(u @ P[m + "wk"], c.n_heads)
        if c.qk_norm:
            q, k = rmsnorm(q, P[m + "q_norm"], c.norm_eps), rmsnorm(k, P[m + "k_norm"], c.norm_eps)
        q, k = rope(q, c.rope_base), rope(k, c.rope_base)
        v = heads(u @ P[m + "wv"], c.n_heads)
        o = unheads(softmax_attention(q, k, v, 1 / math.sqrt(c.d_k), reference=self.form == "recurrent"))
        if c.attn_gate:
            o = o * torch.sigmoid(u @ P[m + "w_gate"])
        return o @ P[m + "wo"]

    def _qkv(self, m, u):
        P, H = self.params, self.cfg.n_heads
        q = heads(self._conv(m, "q", u @ P[m + "wq"]), H)
        k = heads(self._conv(m, "k", u @ P[m + "wk"]), H)
        v = heads(self._conv(m, "v", u @ P[m + "wv"]), H)
        return q, k, v

    def _decay(self, m, u):
        """dt = softplus(u w_dt + dt_bias), g = -exp(A_log) dt; both (B, H, T)."""
        P = self.params
        dt = F.softplus(u @ P[m + "w_dt"] + P[m + "dt_bias"]).transpose(1, 2)
        return dt, -torch.exp(P[m + "A_log"])[None, :, None] * dt

    def _linear(self, m, u):
        c = self.cfg
        q, k, v = self._qkv(m, u)
        q, k = l2norm(q) / math.sqrt(c.d_k), l2norm(k)
        o = gla_recurrent(q, k, v, None) if self.form == "recurrent" else gla_chunked(q, k, v, None, c.chunk_size)
        return self._out(m, o, u)

    def _mamba(self, m, u):
        c = self.cfg
        q, k, v = self._qkv(m, u)
        dt, g = self._decay(m, u)
        q, k = q / math.sqrt(c.d_k), k * dt[..., None]      # dt_t k_t v_t^T
        o = gla_recurrent(q, k, v, g) if self.form == "recurrent" else gla_chunked(q, k, v, g, c.chunk_size)
        o = o + self.params[m + "D"][None, :, None, :] * v     # + D_h * v_t
        return self._out(m, o, u)

    def _mamba2(self, m, u):
        """Mamba-2 as llama.cpp computes it: no scale on q, a scalar D per head, then
        RMSNorm_head(o * SiLU(u Wg)) with a gain per channel, then Wo."""
        P, c = self.params, self.cfg
        q, k, v = self._qkv(m, u)
        dt, g = self._decay(m, u)
        k = k * dt[..., None]
        o = gla_recurrent(q, k, v, g) if self.form == "recurrent" else gla_chunked(q, k, v, g, c.chunk_size)
        o = o + P[m + "D"][None, :, None, None] * v                       # (B, H, T, dv)
        B, T = u.shape[:2]
        gated = o.transpose(1, 2) * F.silu(u @ P[m + "wg"]).reshape(B, T, c.n_heads, c.d_v)
        on = rmsnorm(gated, 1.0, c.norm_eps).reshape(B, T, -1) * P[m + "out_norm"]
        return on @ P[m + "wo"]

    def _gdn(self, m, u):
        c = self.cfg
        q, k, v = self._qkv(m, u)
        q, k = l2norm(q) / math.sqrt(c.d_k), l2norm(k)
        beta = torch.sigmoid(u @ self.params[m + "w_beta"]).transpose(1, 2)
        _, g = self._decay(m, u)
        if self.form == "recurrent":
            o = gdn_recurrent(q, k, v, beta, g)
        else:
            o = gdn_chunked(q, k, v, beta, g, c.chunk_size)
        return self._out(m, o, u)

    def _gdp(self, m, u):
        """gdn with n = gdp_steps keys, values and betas per token: block j of u Wk, u Wv, u w_beta is step j."""
        P, c = self.params, self.cfg
        B, T, _ = u.shape
        H, n = c.n_heads, c.gdp_steps

        def steps(z):   # (B, T, n*H*d) -> (B, H, T, n, d)
            return z.reshape(B, T, n, H, -1).permute(0, 3, 1, 2, 4)
        q = heads(self._conv(m, "q", u @ P[m + "wq"]), H)
        k = steps(self._conv(m, "k", u @ P[m + "wk"]))
        v = steps(self._conv(m, "v", u @ P[m + "wv"]))
        q, k = l2norm(q) / math.sqrt(c.d_k), l2norm(k)
        beta = torch.sigmoid(u @ P[m + "w_beta"]).reshape(B, T, n, H).permute(0, 3, 1, 2)
        _, g = self._decay(m, u)
        if self.form == "recurrent":
            o = gdp_recurrent(q, k, v, beta, g)
        else:
            o = gdp_chunked(q, k, v, beta, g, c.chunk_size)
        return self._out(m, o, u)

    def _kda(self, m, u):
        """gdn's q, k, v and beta; the decay g = -exp(A_log) softplus((u w_f1) w_f2 + dt_bias) per key channel;
        the output RMSNorm_head(o) times sigmoid((u w_g1) w_g2 + b_g2), then Wo (MODEL.md, kda); no b_g2 without
        kda_gate_bias."""
        P, c = self.params, self.cfg
        B, T, _ = u.shape
        q, k, v = self._qkv(m, u)
        q, k = l2norm(q) / math.sqrt(c.d_k), l2norm(k)
        beta = torch.sigmoid(u @ P[m + "w_beta"]).transpose(1, 2)
        dt = heads(F.softplus((u @ P[m + "w_f1"]) @ P[m + "w_f2"] + P[m + "dt_bias"]), c.n_heads)   # (B, H, T, dk)
        g = -torch.exp(P[m + "A_log"])[None, :, None, None] * dt
        if self.form == "recurrent":
            o = kda_recurrent(q, k, v, beta, g)
        else:
            o = kda_chunked(q, k, v, beta, g, c.chunk_size)
        on = rmsnorm(o.transpose(1, 2), P[m + "out_norm"], c.norm_eps).reshape(B, T, -1)
        gz = (u @ P[m + "w_g1"]) @ P[m + "w_g2"]
        if c.kda_gate_bias:
            gz = gz + P[m + "b_g2"]
        return (on * torch.sigmoid(gz)) @ P[m + "wo"]

    # ---- the LM

    def forward(self, tokens):
        """tokens (B, T) int64 -> logits (B, T, V)."""
        P, c = self.params, self.cfg
        x = P["embed"][tokens]
        for l, kind in enumerate(c.layers):
            p = "layers.%d." % l
            u = rmsnorm(x, P[p + "norm1"], c.norm_eps)
            h = x + getattr(self, "_" + kind)(p + "mixer.", u)
            u = rmsnorm(h, P[p + "norm2"], c.norm_eps)
            x = h + (F.silu(u @ P[p + "mlp.w1"]) * (u @ P[p + "mlp.w3"])) @ P[p + "mlp.w2"]
        x = rmsnorm(x, P["norm_f"], c.norm_eps)
        return x @ (P["embed"].t() if c.tied_embeddings else P["lm_head"])

    def loss(self, tokens, targets):
        """(mean cross-entropy over all B*T targets, logits)."""
        logits = self.forward(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)), logits
