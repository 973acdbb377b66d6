// mixer_common.h: the pieces the linear family (linear, mamba, gdn, kda) shares.
//
//  - ShortConv: causal depthwise convolution of width W over time followed by
//    SiLU (W = 0: identity, neither conv nor SiLU), with a decode-time cache
//    holding the last W-1 inputs per channel.
//  - OutGate: o' = RMSNorm_head(o) * SiLU(u Wg), the norm per head of size dv
//    with one weight (dv) shared by all heads.
//  - l2norm on q, k: op_l2norm_heads (ops.h).
#ifndef MIXER_COMMON_H
#define MIXER_COMMON_H

#include "mixer.h"

typedef struct ShortConv {
    Tensor *w;        // (C, W) or NULL when W == 0
    int channels;     // C
    int width;        // W
} ShortConv;

typedef struct ShortConvCache {
    real *buf;        // (B, W-1, C): the last W-1 inputs, oldest first, in dev's memory
    int B;
    Device dev;
} ShortConvCache;

void shortconv_create(ShortConv *c, ParamStore *ps, const char *name, int channels, int width);
// x: (B, T, C) -> SiLU(conv(x)), (B, T, C), one fused op (op_conv1d_causal_silu).
// doc_start (B, T) or NULL (docs.h): no position reads an input of an earlier document.
Tensor *shortconv_forward(Tape *tp, const ShortConv *c, Tensor *x, const int *doc_start);
void shortconv_cache_init(ShortConvCache *cc, const ShortConv *c, int B, Device dev);
void shortconv_cache_free(ShortConvCache *cc);
// Forget row b's cached inputs: its next step starts a new document.
void shortconv_cache_reset(ShortConvCache *cc, const ShortConv *c, int b);
// shortconv_forward over a window that continues a stream (carried state):
// cc->buf (B, W-1, C), the inputs before position 0, oldest first (zeros:
// none), is read by the positions whose document began before the window
// (no doc_start flag in [0, t]) as a constant (no gradient reaches it), and
// then receives the stream's last W-1 inputs after this window, zeros before
// the start of its last document: what the next window, or decoding, reads.
Tensor *shortconv_forward_carry(Tape *tp, const ShortConv *c, Tensor *x, const int *doc_start, ShortConvCache *cc);
// The cache's buffer and its element count (B (W-1) C); returns 0 (nothing
// written) when the width keeps no inputs, else 1.
int shortconv_cache_buffer(const ShortConv *c, ShortConvCache *cc, real **buf, int64_t *size);
// x: (B, 1, C) -> (B, 1, C), pushing x into the cache.
Tensor *shortconv_step(Tape *tp, const ShortConv *c, ShortConvCache *cc, Tensor *x);

typedef struct OutGate {
    Tensor *norm_w;   // (dv), or (H*dv) from outgate_create_gain (mamba2: a gain per channel)
    Tensor *wg;       // (D, H*dv)
    int n_heads, d_v;
    double eps;
} OutGate;

void outgate_create(OutGate *g, ParamStore *ps, const char *prefix, int d_model, int n_heads, int d_v,
                    double eps);
// The same with the gain out_norm of gain_size entries: dv (one gain that
// every head shares, as outgate_create) or H*dv (its own for every channel:
// mamba2, whose output stage is not outgate_apply's).
void outgate_create_gain(OutGate *g, ParamStore *ps, const char *prefix, int d_model, int n_heads, int d_v,
                         double eps, int gain_size);
// o: (B, T, H*dv), u: (B, T, D) -> RMSNorm_head(o) * SiLU(u Wg), (B, T, H*dv). Works for T = 1.
Tensor *outgate_forward(Tape *tp, const OutGate *g, Tensor *o, Tensor *u);
// The same given the gate's projection gz = u Wg (B, T, H*dv), which a layer
// computes with its other projections of u in one op_matmul_multi.
Tensor *outgate_apply(Tape *tp, const OutGate *g, Tensor *o, Tensor *gz);

// ---- the q, k, v convolutions and the state of the delta-rule layers (gdn, gdp, kda) ----

// Their decode cache (also the carried state of forward_carry): the inputs
// each of the three convolutions keeps and the state S (B, H, dk, dv), zeros
// at first, in dev's memory.
typedef struct QkvCache {
    ShortConvCache conv[3];   // q, k, v
    Tensor *S;
    Device dev;
} QkvCache;

// conv: the layer's q, k and v convolutions (3).
QkvCache *qkvcache_new(const ShortConv *conv, int B, int H, int dk, int dv, Device dev);
void qkvcache_free(QkvCache *c);
// Row b starts a new document at its next step (mixer.h, cache_reset).
void qkvcache_reset(const Mixer *m, QkvCache *c, const ShortConv *conv, int b);
// mixer.h's cache_state: S, then the convolutions' buffers that exist.
int qkvcache_state(QkvCache *c, const ShortConv *conv, real **bufs, int64_t *sizes);
// The checks of m's step (step: u (B, 1, D) on a no-grad tape) or carried
// window (u (B, T, D)) against the cache: rows, width and device.
void qkvcache_check(const Mixer *m, const QkvCache *c, const Tape *tp, const Tensor *u, bool step);
// x[i] through conv[i], i = q, k, v, in place: over the whole sequence (cache
// NULL; doc_start (B, T) or NULL), one step through the cache, or (carry) a
// window continuing the streams in the cache.
void qkv_convolve(Tape *tp, const ShortConv *conv, QkvCache *cache, bool carry, const int *doc_start, Tensor **x);

// Mamba-2 initialisation of the decay, shared by mamba and gdn (INIT_FN):
// A_log = log(a), a uniform in [a0, a1] (Mamba-2: [1, 16]);
// dt_bias = softplus^-1(dt0), dt0 log-uniform in [lo, hi] (Mamba-2: [1e-3, 1e-1]).
void init_A_log(real *x, int64_t n, Rng *r, double a0, double a1);
void init_dt_bias(real *x, int64_t n, Rng *r, double lo, double hi);

// A dense weight (in, out) initialised N(0, std^2), registered as prefix+name.
Tensor *param_linear(ParamStore *ps, const char *prefix, const char *name, int in, int out, double std);
// A vector of n entries free of weight decay (a bias, a gain, A_log, dt_bias), registered as prefix+name.
Tensor *param_vector(ParamStore *ps, const char *prefix, const char *name, int n, ParamInit init);

#endif
