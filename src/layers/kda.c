// kda.c: the Kimi Delta Attention mixer (MODEL.md, `kda`; the op's math:
// docs/kda.md).
//
//   q, k, v = ShortConv(u Wq), ShortConv(u Wk), ShortConv(u Wv)   (conv + SiLU, as gdn)
//   q = L2norm_head(q) / sqrt(dk),   k = L2norm_head(k)
//   beta = sigmoid(u w_beta)                                      (H per token)
//   g = -exp(A_log[h]) * softplus((u w_f1) w_f2 + dt_bias)        (H*dk: a log decay per key channel)
//   o = KDA(q, k, v, beta, g; S_init)                             (op_kda, kda_kernel.h)
//   out = (RMSNorm_head(o) out_norm * sigmoid((u w_g1) w_g2 + b_g2)) Wo    (b_g2: kda_gate_bias)
//
// gdn with its decay per head turned into one per key channel, and an output
// gate of its own. The layer follows fla's fla/layers/kda.py
// (KimiDeltaAttention, num_v_heads = num_heads) and fla/ops/kda/gate.py
// (naive_kda_gate): the decay's projection f_proj is low-rank through
// head_v_dim = dv (w_f1 (D, dv), w_f2 (dv, H*dk), no biases), A_log is one
// per head and dt_bias one per key channel (H*dk), the output gate g_proj is
// low-rank through dv as well with a bias on its second factor (w_g1 (D, dv),
// w_g2 (dv, H*dv), b_g2 (H*dv)), and the output norm is FusedRMSNormGated
// with a sigmoid: one gain of dv that the heads share. Initialisation as
// fla's _init_weights: A_log = log U[1, 16], dt_bias = softplus^-1 of a
// log-uniform in [1e-3, 1e-1], the bias b_g2 zeros. Differences from fla:
// conv_size = 0 means no convolution and no SiLU (gdn's convention; fla keeps
// the SiLU), dense weights are drawn N(0, 1/fan_in) as gdn's, and fla's
// options (grouped value heads, negative eigenvalues, a lower-bounded gate)
// are absent. kda_gate_bias = false leaves b_g2 out (no parameter): the
// gate of Kimi Linear's own g_b_proj, which has no bias, as llama.cpp's
// kimi-linear reads it.
//
// Decoding keeps, per sequence, the state S per head and the three
// short-convolution caches (QkvCache, shared with gdn): constant memory and
// time per token.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kda_kernel.h"
#include "mixer_common.h"

typedef struct Kda {
    Tensor *wq, *wk;          // (D, H*dk)
    Tensor *wv;               // (D, H*dv)
    Tensor *wo;               // (H*dv, D)
    Tensor *w_beta;           // (D, H)
    Tensor *w_f1, *w_f2;      // (D, dv), (dv, H*dk): the decay's low-rank projection
    Tensor *dt_bias;          // (H*dk)
    Tensor *A_log;            // (H)
    Tensor *w_g1, *w_g2;      // (D, dv), (dv, H*dv): the output gate's
    Tensor *b_g2;             // (H*dv); NULL without kda_gate_bias
    Tensor *out_norm;         // (dv)
    ShortConv conv[3];        // q, k, v
} Kda;

static void kda_create(Mixer *m, ParamStore *ps, const char *prefix) {
    const MixerConfig *c = &m->cfg;
    int D = c->d_model, H = c->n_heads, dk = c->d_k, dv = c->d_v;
    double s_in = 1.0 / sqrt((double)D), s_rank = 1.0 / sqrt((double)dv);
    Kda *p = xcalloc(1, sizeof *p);
    p->wq = param_linear(ps, prefix, "wq", D, H * dk, s_in);
    p->wk = param_linear(ps, prefix, "wk", D, H * dk, s_in);
    p->wv = param_linear(ps, prefix, "wv", D, H * dv, s_in);
    static const char *const conv_names[3] = {"conv_q", "conv_k", "conv_v"};
    for (int i = 0; i < 3; i++) {
        char name[256];
        int len = snprintf(name, sizeof name, "%s%s", prefix, conv_names[i]);
        ASSERT(len < (int)sizeof name, "kda: prefix '%s' too long", prefix);
        shortconv_create(&p->conv[i], ps, name, H * (i < 2 ? dk : dv), c->conv_size);
    }
    p->w_beta = param_linear(ps, prefix, "w_beta", D, H, s_in);
    p->w_f1 = param_linear(ps, prefix, "w_f1", D, dv, s_in);
    p->w_f2 = param_linear(ps, prefix, "w_f2", dv, H * dk, s_rank);
    p->dt_bias = param_vector(ps, prefix, "dt_bias", H * dk, init_fn(init_dt_bias, 1e-3, 1e-1));
    p->A_log = param_vector(ps, prefix, "A_log", H, init_fn(init_A_log, 1, 16));
    p->w_g1 = param_linear(ps, prefix, "w_g1", D, dv, s_in);
    p->w_g2 = param_linear(ps, prefix, "w_g2", dv, H * dv, s_rank);
    if (c->kda_gate_bias) p->b_g2 = param_vector(ps, prefix, "b_g2", H * dv, init_zeros());
    p->out_norm = param_vector(ps, prefix, "out_norm", dv, init_ones());
    p->wo = param_linear(ps, prefix, "wo", H * dv, D, c->out_std);
    m->impl = p;
}

static void kda_destroy(Mixer *m) { free(m->impl); }

// g = -exp(A_log[h]) softplus(f w_f2 + dt_bias), (B, T, H*dk), f = u w_f1:
// exp(A_log) (H) reaches each head's dk channels through a product with
// ones (1, dk), so that every op here has its backward (and a GPU kernel).
static Tensor *kda_decay(Tape *tp, const Mixer *m, Tensor *f) {
    const Kda *p = m->impl;
    int H = m->cfg.n_heads, dk = m->cfg.d_k;
    real *one = tape_alloc(tp, (size_t)dk * sizeof(real));
    for (int i = 0; i < dk; i++) one[i] = 1;
    Tensor *ones = tape_tensor_copy(tp, 2, (int[]){1, dk}, one);
    Tensor *a = op_reshape(tp, op_exp(tp, p->A_log), 2, (int[]){H, 1});
    a = op_reshape(tp, op_matmul(tp, a, ones, false, false), 1, (int[]){H * dk});
    Tensor *dt = op_softplus(tp, op_add(tp, op_matmul(tp, f, p->w_f2, false, false), p->dt_bias));
    return op_scale(tp, op_mul(tp, dt, a), -1.0);
}

// q, k, v, beta, g and the output gate's pre-activation gz of positions u
// (B, T, D), the convolutions as qkv_convolve runs them (cache NULL: the
// whole sequence with doc_start; a step; or, carry, a window).
static void kda_inputs(Tape *tp, const Mixer *m, QkvCache *cache, bool carry, Tensor *u, const int *doc_start,
                       Tensor **q, Tensor **k, Tensor **v, Tensor **beta, Tensor **g, Tensor **gz) {
    const Kda *p = m->impl;
    int dk = m->cfg.d_k;
    Tensor *x[4], *y[2];   // u Wq, u Wk, u Wv, u w_f1; u w_g1, u w_beta
    op_matmul_multi(tp, u, (Tensor *[]){p->wq, p->wk, p->wv, p->w_f1}, 4, x);
    op_matmul_multi(tp, u, (Tensor *[]){p->w_g1, p->w_beta}, 2, y);
    qkv_convolve(tp, p->conv, cache, carry, doc_start, x);
    *q = op_l2norm_heads_scaled(tp, x[0], dk, 1.0 / sqrt((double)dk));
    *k = op_l2norm_heads(tp, x[1], dk);
    *v = x[2];
    *beta = op_sigmoid(tp, y[1]);
    *g = kda_decay(tp, m, x[3]);
    *gz = op_matmul(tp, y[0], p->w_g2, false, false);
    if (p->b_g2) *gz = op_add(tp, *gz, p->b_g2);
}

// (RMSNorm_head(o) out_norm * sigmoid(gz)) Wo.
static Tensor *kda_output(Tape *tp, const Mixer *m, Tensor *o, Tensor *gz) {
    const Kda *p = m->impl;
    Tensor *y = op_rmsnorm_groups(tp, o, p->out_norm, m->cfg.d_v, m->cfg.norm_eps);
    return op_matmul(tp, op_mul(tp, y, op_sigmoid(tp, gz)), p->wo, false, false);
}

static Tensor *kda_forward(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, Tensor *s_in, Tensor **s_out) {
    const MixerConfig *c = &m->cfg;
    ASSERT(u->ndim == 3 && u->shape[2] == c->d_model, "kda: u %s must be (B, T, %d)", SHAPE(u), c->d_model);
    Tensor *q, *k, *v, *beta, *g, *gz;
    kda_inputs(tp, m, NULL, false, u, doc_start, &q, &k, &v, &beta, &g, &gz);
    Tensor *o = op_kda(tp, q, k, v, beta, g, s_in, doc_start, c->n_heads, c->form, c->chunk_size, s_out);
    return kda_output(tp, m, o, gz);
}

static void *kda_cache_new(const Mixer *m, int B, int max_T, Device dev) {
    (void)max_T;   // constant memory: nothing grows with the length
    const MixerConfig *c = &m->cfg;
    return qkvcache_new(((const Kda *)m->impl)->conv, B, c->n_heads, c->d_k, c->d_v, dev);
}

static void kda_cache_free(void *ptr) { qkvcache_free(ptr); }

static Tensor *kda_step(Tape *tp, Mixer *m, void *ptr, Tensor *u) {
    QkvCache *cache = ptr;
    qkvcache_check(m, cache, tp, u, true);
    Tensor *q, *k, *v, *beta, *g, *gz, *sT;
    kda_inputs(tp, m, cache, false, u, NULL, &q, &k, &v, &beta, &g, &gz);
    Tensor *o = op_kda(tp, q, k, v, beta, g, cache->S, NULL, m->cfg.n_heads, MIXER_FORM_RECURRENT, 1, &sT);
    dev_copy(cache->dev, cache->S->data, sT->data, (size_t)sT->numel * sizeof(real));
    return kda_output(tp, m, o, gz);
}

static void kda_cache_reset(const Mixer *m, void *ptr, int b) {
    qkvcache_reset(m, ptr, ((const Kda *)m->impl)->conv, b);
}

// The cache's state is the window's initial state, read as a constant
// (mixer.h: no gradient reaches it), and receives its final one.
static Tensor *kda_forward_carry(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, void *ptr) {
    const MixerConfig *c = &m->cfg;
    QkvCache *cache = ptr;
    Tensor *S = cache->S;
    qkvcache_check(m, cache, tp, u, false);
    Tensor *q, *k, *v, *beta, *g, *gz, *sT, *s_in = tape_tensor_copy_dev(tp, 4, S->shape, S->data);
    kda_inputs(tp, m, cache, true, u, doc_start, &q, &k, &v, &beta, &g, &gz);
    Tensor *o = op_kda(tp, q, k, v, beta, g, s_in, doc_start, c->n_heads, c->form, c->chunk_size, &sT);
    dev_copy(cache->dev, S->data, sT->data, (size_t)sT->numel * sizeof(real));
    return kda_output(tp, m, o, gz);
}

static int kda_cache_state(const Mixer *m, void *ptr, real **bufs, int64_t *sizes) {
    return qkvcache_state(ptr, ((const Kda *)m->impl)->conv, bufs, sizes);
}

const MixerKind MIXER_KDA = {
    .name = "kda", .recurrent = true, .create = kda_create, .forward = kda_forward, .cache_new = kda_cache_new,
    .cache_free = kda_cache_free, .step = kda_step, .cache_reset = kda_cache_reset,
    .forward_carry = kda_forward_carry, .cache_state = kda_cache_state, .destroy = kda_destroy,
    .forms = MIXER_FORMS_LINEAR_FAMILY};
