// mixer_common.c: the short convolution, the output gate and dense weights
// shared by the linear family (linear, mamba, gdn, kda). Everything here composes
// ops, so the backward comes from the ops' own.
#include "mixer_common.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---- short convolution ----

void shortconv_create(ShortConv *c, ParamStore *ps, const char *name, int channels, int width) {
    ASSERT(channels > 0 && width >= 0, "shortconv '%s': channels %d, width %d", name, channels, width);
    c->channels = channels;
    c->width = width;
    c->w = NULL;
    if (width == 0) return;
    double a = 1.0 / sqrt((double)width);
    c->w = params_add(ps, name, 2, (int[]){channels, width}, init_uniform(-a, a), 0);
}

static void shortconv_check(const ShortConv *c, const Tensor *x, const char *what) {
    ASSERT(x->ndim == 3 && x->shape[2] == c->channels, "%s: x %s must be (B, T, %d)", what, SHAPE(x),
           c->channels);
}

Tensor *shortconv_forward(Tape *tp, const ShortConv *c, Tensor *x, const int *doc_start) {
    shortconv_check(c, x, "shortconv_forward");
    if (c->width == 0) return x;
    return op_conv1d_causal_silu(tp, x, c->w, doc_start);
}

void shortconv_cache_init(ShortConvCache *cc, const ShortConv *c, int B, Device dev) {
    ASSERT(B > 0, "shortconv_cache_init: B = %d", B);
    cc->B = B;
    cc->dev = dev;
    cc->buf = NULL;
    if (c->width > 1) {
        size_t bytes = (size_t)B * (c->width - 1) * c->channels * sizeof(real);
        cc->buf = dev_alloc(dev, bytes);
        dev_zero(dev, cc->buf, bytes);
    }
}

void shortconv_cache_reset(ShortConvCache *cc, const ShortConv *c, int b) {
    ASSERT(b >= 0 && b < cc->B, "shortconv_cache_reset: row %d of %d", b, cc->B);
    if (cc->buf) dev_zero(cc->dev, cc->buf + (int64_t)b * (c->width - 1) * c->channels,
                          (size_t)(c->width - 1) * c->channels * sizeof(real));
}

// The window is run as the sequence [tail, x] (doc_start shifted by W-1, the
// tail's positions unflagged), so each position reads exactly the inputs a
// single pass over the whole stream would, and the first W-1 outputs are
// dropped.
Tensor *shortconv_forward_carry(Tape *tp, const ShortConv *c, Tensor *x, const int *doc_start, ShortConvCache *cc) {
    shortconv_check(c, x, "shortconv_forward_carry");
    int P = c->width - 1, B = x->shape[0], T = x->shape[1], C = c->channels;
    if (P <= 0) return shortconv_forward(tp, c, x, doc_start);   // no history to carry
    ASSERT(cc->dev == tp->device, "shortconv_forward_carry: a %s carried state on a %s tape", device_name(cc->dev),
           device_name(tp->device));
    ASSERT(cc->B == B && cc->buf, "shortconv_forward_carry: the carried state holds %d rows, x %s", cc->B, SHAPE(x));
    Tensor *prev = tape_tensor_copy_dev(tp, 3, (int[]){B, P, C}, cc->buf);
    Tensor *xx = op_concat(tp, (Tensor *[]){prev, x}, 2, 1);   // (B, P + T, C)
    int *ds = NULL;
    if (doc_start) {
        ds = tape_alloc(tp, (size_t)B * (P + T) * sizeof(int));
        for (int b = 0; b < B; b++) {
            memset(ds + (int64_t)b * (P + T), 0, (size_t)P * sizeof(int));
            memcpy(ds + (int64_t)b * (P + T) + P, doc_start + (int64_t)b * T, (size_t)T * sizeof(int));
        }
    }
    Tensor *y = op_slice(tp, shortconv_forward(tp, c, xx, ds), 1, P, T);
    for (int b = 0; b < B; b++) {   // the new tail: the last P rows of [tail, x] in the last document
        int begin = 0;                // the first of them in it
        for (int t = T - 1; ds && t >= imax(0, T - P); t--)
            if (ds[(int64_t)b * (P + T) + P + t]) {
                begin = t + P - T;
                break;
            }
        real *dst = cc->buf + (int64_t)b * P * C;   // on the tape's device, as xx
        if (begin) dev_zero(cc->dev, dst, (size_t)begin * C * sizeof(real));
        dev_copy(cc->dev, dst + (int64_t)begin * C, xx->data + ((int64_t)b * (P + T) + T + begin) * C,
                 (size_t)(P - begin) * C * sizeof(real));
    }
    return y;
}

int shortconv_cache_buffer(const ShortConv *c, ShortConvCache *cc, real **buf, int64_t *size) {
    if (!cc->buf) return 0;
    *buf = cc->buf;
    *size = (int64_t)cc->B * (c->width - 1) * c->channels;
    return 1;
}

void shortconv_cache_free(ShortConvCache *cc) {
    if (cc->buf) dev_free(cc->dev, cc->buf);
    cc->buf = NULL;
    cc->B = 0;
}

// The convolution (with its SiLU) runs over the window [cache, x] of W
// positions and its last output is kept: the same products in the same order
// as the forward at that position (cached zeros before the start add exact
// zeros).
Tensor *shortconv_step(Tape *tp, const ShortConv *c, ShortConvCache *cc, Tensor *x) {
    shortconv_check(c, x, "shortconv_step");
    ASSERT(x->shape[0] == cc->B && x->shape[1] == 1, "shortconv_step: x %s must be (%d, 1, %d)", SHAPE(x), cc->B,
           c->channels);
    ASSERT(cc->dev == tp->device, "shortconv_step: a %s cache on a %s tape", device_name(cc->dev),
           device_name(tp->device));
    int W = c->width, C = c->channels, B = cc->B;
    if (W == 0) return x;
    Tensor *win = x;   // (B, W, C)
    if (W > 1) {
        Tensor *prev = tape_tensor_copy_dev(tp, 3, (int[]){B, W - 1, C}, cc->buf);
        win = op_concat(tp, (Tensor *[]){prev, x}, 2, 1);
        // Advance the cache: the window's last W-1 inputs (the oldest dropped, x appended).
        size_t row = (size_t)(W - 1) * C * sizeof(real);
        dev_copy2d(cc->dev, cc->buf, row, win->data + C, (size_t)W * C * sizeof(real), row, (size_t)B);
    }
    Tensor *y = op_conv1d_causal_silu(tp, win, c->w, NULL);
    return W > 1 ? op_slice(tp, y, 1, W - 1, 1) : y;
}

// ---- the delta-rule layers' convolutions and state ----

QkvCache *qkvcache_new(const ShortConv *conv, int B, int H, int dk, int dv, Device dev) {
    QkvCache *c = xcalloc(1, sizeof *c);
    c->dev = dev;
    for (int i = 0; i < 3; i++) shortconv_cache_init(&c->conv[i], &conv[i], B, dev);
    c->S = tensor_new_on(dev, 4, (int[]){B, H, dk, dv});   // zeros
    return c;
}

void qkvcache_free(QkvCache *c) {
    if (!c) return;
    for (int i = 0; i < 3; i++) shortconv_cache_free(&c->conv[i]);
    tensor_free_on(c->dev, c->S);
    free(c);
}

void qkvcache_reset(const Mixer *m, QkvCache *c, const ShortConv *conv, int b) {
    Tensor *S = c->S;
    ASSERT(b >= 0 && b < S->shape[0], "%s cache_reset: row %d of %d", m->kind->name, b, S->shape[0]);
    int64_t row = S->numel / S->shape[0];
    dev_zero(c->dev, S->data + b * row, (size_t)row * sizeof(real));
    for (int i = 0; i < 3; i++) shortconv_cache_reset(&c->conv[i], &conv[i], b);
}

int qkvcache_state(QkvCache *c, const ShortConv *conv, real **bufs, int64_t *sizes) {
    bufs[0] = c->S->data;
    sizes[0] = c->S->numel;
    int n = 1;
    for (int i = 0; i < 3; i++) n += shortconv_cache_buffer(&conv[i], &c->conv[i], bufs + n, sizes + n);
    return n;
}

void qkvcache_check(const Mixer *m, const QkvCache *c, const Tape *tp, const Tensor *u, bool step) {
    const char *name = m->kind->name, *what = step ? "step" : "carried window";
    int B = c->S->shape[0], D = m->cfg.d_model;
    ASSERT(!step || !tape_grad_enabled(tp), "%s step: call it in no-grad mode (tape_no_grad_push)", name);
    ASSERT(c->dev == tp->device, "%s %s: a %s cache on a %s tape", name, what, device_name(c->dev),
           device_name(tp->device));
    if (step)
        ASSERT(u->ndim == 3 && u->shape[0] == B && u->shape[1] == 1 && u->shape[2] == D,
               "%s step: u %s must be (%d, 1, %d)", name, SHAPE(u), B, D);
    else
        ASSERT(u->ndim == 3 && u->shape[0] == B && u->shape[2] == D, "%s carried window: u %s must be (%d, T, %d)",
               name, SHAPE(u), B, D);
}

void qkv_convolve(Tape *tp, const ShortConv *conv, QkvCache *cache, bool carry, const int *doc_start, Tensor **x) {
    for (int i = 0; i < 3; i++) {
        if (carry) x[i] = shortconv_forward_carry(tp, &conv[i], x[i], doc_start, &cache->conv[i]);
        else if (cache) x[i] = shortconv_step(tp, &conv[i], &cache->conv[i], x[i]);
        else x[i] = shortconv_forward(tp, &conv[i], x[i], doc_start);
    }
}

// ---- output gate ----

Tensor *param_linear(ParamStore *ps, const char *prefix, const char *name, int in, int out, double std) {
    char full[256];
    int len = snprintf(full, sizeof full, "%s%s", prefix, name);
    ASSERT(len < (int)sizeof full, "param_linear: name '%s%s' too long", prefix, name);
    return params_add(ps, full, 2, (int[]){in, out}, init_normal(std), 0);
}

Tensor *param_vector(ParamStore *ps, const char *prefix, const char *name, int n, ParamInit init) {
    char full[256];
    int len = snprintf(full, sizeof full, "%s%s", prefix, name);
    ASSERT(len < (int)sizeof full, "param_vector: name '%s%s' too long", prefix, name);
    return params_add(ps, full, 1, (int[]){n}, init, TENSOR_NO_DECAY);
}

void outgate_create(OutGate *g, ParamStore *ps, const char *prefix, int d_model, int n_heads, int d_v,
                    double eps) {
    outgate_create_gain(g, ps, prefix, d_model, n_heads, d_v, eps, d_v);
}

void outgate_create_gain(OutGate *g, ParamStore *ps, const char *prefix, int d_model, int n_heads, int d_v,
                         double eps, int gain_size) {
    ASSERT(d_model > 0 && n_heads > 0 && d_v > 0 && eps >= 0 && (gain_size == d_v || gain_size == n_heads * d_v),
           "outgate '%s': D %d, H %d, dv %d, eps %g, gain %d", prefix, d_model, n_heads, d_v, eps, gain_size);
    char name[256];
    int len = snprintf(name, sizeof name, "%sout_norm", prefix);
    ASSERT(len < (int)sizeof name, "outgate: prefix '%s' too long", prefix);
    g->norm_w = params_add(ps, name, 1, (int[]){gain_size}, init_ones(), TENSOR_NO_DECAY);
    g->wg = param_linear(ps, prefix, "wg", d_model, n_heads * d_v, 1.0 / sqrt((double)d_model));
    g->n_heads = n_heads;
    g->d_v = d_v;
    g->eps = eps;
}

Tensor *outgate_forward(Tape *tp, const OutGate *g, Tensor *o, Tensor *u) {
    int H = g->n_heads, dv = g->d_v, D = g->wg->shape[0];
    ASSERT(o->ndim == 3 && o->shape[2] == H * dv && u->ndim == 3 && u->shape[0] == o->shape[0] &&
               u->shape[1] == o->shape[1] && u->shape[2] == D,
           "outgate: o %s must be (B, T, %d) and u %s (B, T, %d)", SHAPE(o), H * dv, SHAPE(u), D);
    return outgate_apply(tp, g, o, op_matmul(tp, u, g->wg, false, false));
}

Tensor *outgate_apply(Tape *tp, const OutGate *g, Tensor *o, Tensor *gz) {
    int H = g->n_heads, dv = g->d_v;
    ASSERT(o->ndim == 3 && o->shape[2] == H * dv && tensor_same_shape(o, gz),
           "outgate: o %s and the gate's projection %s must both be (B, T, %d)", SHAPE(o), SHAPE(gz), H * dv);
    // RMSNorm_head(o) * silu(u Wg), fused (ops_norm.c)
    return op_rmsnorm_gate(tp, o, g->norm_w, gz, dv, g->eps);
}

void init_A_log(real *x, int64_t n, Rng *r, double a0, double a1) {
    for (int64_t i = 0; i < n; i++) x[i] = (real)log(rng_range(r, a0, a1));
}

// softplus^-1(y) = log(e^y - 1) = y + log(1 - e^-y), stable for small y.
void init_dt_bias(real *x, int64_t n, Rng *r, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) {
        double dt0 = exp(rng_range(r, log(lo), log(hi)));
        x[i] = (real)(dt0 + log(-expm1(-dt0)));
    }
}
