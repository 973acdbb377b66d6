// gdn.c: the Gated DeltaNet mixer (MODEL.md, `gdn`).
//
//   q, k, v = ShortConv(u Wq), ShortConv(u Wk), ShortConv(u Wv)   (conv + SiLU)
//   q = L2norm_head(q) / sqrt(dk),   k = L2norm_head(k)
//   beta = sigmoid(u w_beta),   g = -exp(A_log) * softplus(u w_dt + dt_bias)
//   o = GatedDeltaNet(q, k, v, beta, g; S_init)        (op_gdn, gdn_kernel.h)
//   out = OutGate(o, u) Wo
//
// Everything but op_gdn is composed from small ops. Decoding keeps, per
// sequence, the state S per head and the three short-convolution caches:
// constant memory and time per token.
//
// The same code is `gdp` (Gated DeltaProduct, MODEL.md): k, v and beta have
// n_h blocks per token (wk (D, n_h*H*dk), its short convolution over all
// n_h*H*dk channels, ...), q and g one, and op_gdp runs op_gdn over the n_h
// substeps of every token (gdp.c). n_h = 1 is gdn with the same parameters.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gdn_kernel.h"
#include "mixer_common.h"

typedef struct Gdn {
    Tensor *wq, *wk;        // (D, H*dk)
    Tensor *wv;             // (D, H*dv)
    Tensor *wo;             // (H*dv, D)
    Tensor *w_beta, *w_dt;  // (D, H)
    Tensor *dt_bias, *A_log;// (H)
    ShortConv conv[3];      // q, k, v
    OutGate gate;
    int steps;              // n_h: the blocks of wk, wv, w_beta (gdn: 1)
    bool product;           // gdp: mix with op_gdp (also at n_h = 1), else op_gdn
} Gdn;

// gdn (steps 1, op_gdn) or gdp (steps n_h, op_gdp): the parameters of gdn
// with n_h blocks of columns in wk, wv, w_beta and n_h blocks of channels
// in conv_k, conv_v, registered in gdn's order under gdn's names.
static void gdn_build(Mixer *m, ParamStore *ps, const char *prefix, int steps, bool product) {
    const MixerConfig *c = &m->cfg;
    int D = c->d_model, H = c->n_heads, dk = c->d_k, dv = c->d_v, n = steps;
    double s_in = 1.0 / sqrt((double)D);
    Gdn *g = xcalloc(1, sizeof *g);
    g->steps = steps;
    g->product = product;
    char name[256];
    g->wq = param_linear(ps, prefix, "wq", D, H * dk, s_in);
    g->wk = param_linear(ps, prefix, "wk", D, n * H * dk, s_in);
    g->wv = param_linear(ps, prefix, "wv", D, n * H * dv, s_in);
    snprintf(name, sizeof name, "%sconv_q", prefix);
    shortconv_create(&g->conv[0], ps, name, H * dk, c->conv_size);
    snprintf(name, sizeof name, "%sconv_k", prefix);
    shortconv_create(&g->conv[1], ps, name, n * H * dk, c->conv_size);
    snprintf(name, sizeof name, "%sconv_v", prefix);
    shortconv_create(&g->conv[2], ps, name, n * H * dv, c->conv_size);
    g->w_beta = param_linear(ps, prefix, "w_beta", D, n * H, s_in);
    g->w_dt = param_linear(ps, prefix, "w_dt", D, H, s_in);
    g->dt_bias = param_vector(ps, prefix, "dt_bias", H, init_fn(init_dt_bias, 1e-3, 1e-1));
    g->A_log = param_vector(ps, prefix, "A_log", H, init_fn(init_A_log, 1, 16));
    outgate_create(&g->gate, ps, prefix, D, H, dv, c->norm_eps);
    g->wo = param_linear(ps, prefix, "wo", H * dv, D, c->out_std);
    m->impl = g;
}

static void gdn_create(Mixer *m, ParamStore *ps, const char *prefix) { gdn_build(m, ps, prefix, 1, false); }
static void gdp_create(Mixer *m, ParamStore *ps, const char *prefix) {
    gdn_build(m, ps, prefix, m->cfg.gdp_steps, true);
}

static void gdn_destroy(Mixer *m) { free(m->impl); }

// q, k, v, beta, g and the output gate's projection gz of positions u
// (B, T, D), the convolutions either over the whole sequence (cache NULL;
// doc_start (B, T) or NULL), one step through the cache, or (carry) a window
// continuing the streams in the cache.
static void gdn_inputs(Tape *tp, const Mixer *m, QkvCache *cache, bool carry, Tensor *u, const int *doc_start,
                       Tensor **q, Tensor **k, Tensor **v, Tensor **beta, Tensor **g, Tensor **gz) {
    const Gdn *p = m->impl;
    int dk = m->cfg.d_k;
    Tensor *x[4];   // u Wq, u Wk, u Wv and the output gate's u Wg, in one node
    op_matmul_multi(tp, u, (Tensor *[]){p->wq, p->wk, p->wv, p->gate.wg}, 4, x);
    *gz = x[3];
    qkv_convolve(tp, p->conv, cache, carry, doc_start, x);
    *q = op_l2norm_heads_scaled(tp, x[0], dk, 1.0 / sqrt((double)dk));
    *k = op_l2norm_heads(tp, x[1], dk);
    *v = x[2];
    *beta = op_sigmoid(tp, op_matmul(tp, u, p->w_beta, false, false));
    Tensor *dt = op_softplus(tp, op_add(tp, op_matmul(tp, u, p->w_dt, false, false), p->dt_bias));
    *g = op_scale(tp, op_mul(tp, dt, op_exp(tp, p->A_log)), -1.0);
}

// The mixing op of the kind: op_gdn, or op_gdp over the n_h substeps.
static Tensor *gdn_mix(Tape *tp, const Mixer *m, Tensor *q, Tensor *k, Tensor *v, Tensor *beta, Tensor *g,
                       Tensor *s_in, const int *doc_start, MixerForm form, int chunk, Tensor **s_out) {
    const Gdn *p = m->impl;
    if (!p->product) return op_gdn(tp, q, k, v, beta, g, s_in, doc_start, m->cfg.n_heads, form, chunk, s_out);
    return op_gdp(tp, q, k, v, beta, g, s_in, doc_start, m->cfg.n_heads, p->steps, form, chunk, s_out);
}

static Tensor *gdn_forward(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, Tensor *s_in, Tensor **s_out) {
    const Gdn *p = m->impl;
    const MixerConfig *c = &m->cfg;
    ASSERT(u->ndim == 3 && u->shape[2] == c->d_model, "%s: u %s must be (B, T, %d)", m->kind->name, SHAPE(u), c->d_model);
    Tensor *q, *k, *v, *beta, *g, *gz;
    gdn_inputs(tp, m, NULL, false, u, doc_start, &q, &k, &v, &beta, &g, &gz);
    Tensor *o = gdn_mix(tp, m, q, k, v, beta, g, s_in, doc_start, c->form, c->chunk_size, s_out);
    return op_matmul(tp, outgate_apply(tp, &p->gate, o, gz), p->wo, false, false);
}

static void *gdn_cache_new(const Mixer *m, int B, int max_T, Device dev) {
    (void)max_T;   // constant memory: nothing grows with the length
    const MixerConfig *c = &m->cfg;
    return qkvcache_new(((const Gdn *)m->impl)->conv, B, c->n_heads, c->d_k, c->d_v, dev);
}

static void gdn_cache_free(void *ptr) { qkvcache_free(ptr); }

static Tensor *gdn_step(Tape *tp, Mixer *m, void *ptr, Tensor *u) {
    const Gdn *p = m->impl;
    QkvCache *cache = ptr;
    qkvcache_check(m, cache, tp, u, true);
    Tensor *q, *k, *v, *beta, *g, *gz, *sT;
    gdn_inputs(tp, m, cache, false, u, NULL, &q, &k, &v, &beta, &g, &gz);
    // gdp: the n_h substeps of the token, one after the other (op_gdp's recurrent form).
    Tensor *o = gdn_mix(tp, m, q, k, v, beta, g, cache->S, NULL, MIXER_FORM_RECURRENT, 1, &sT);
    dev_copy(cache->dev, cache->S->data, sT->data, (size_t)sT->numel * sizeof(real));
    return op_matmul(tp, outgate_apply(tp, &p->gate, o, gz), p->wo, false, false);
}

static void gdn_cache_reset(const Mixer *m, void *ptr, int b) {
    qkvcache_reset(m, ptr, ((const Gdn *)m->impl)->conv, b);
}

static Tensor *gdn_forward_carry(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, void *ptr) {
    const Gdn *p = m->impl;
    const MixerConfig *c = &m->cfg;
    QkvCache *cache = ptr;
    Tensor *S = cache->S;
    qkvcache_check(m, cache, tp, u, false);
    Tensor *q, *k, *v, *beta, *g, *gz, *sT, *s_in = tape_tensor_copy_dev(tp, 4, S->shape, S->data);
    gdn_inputs(tp, m, cache, true, u, doc_start, &q, &k, &v, &beta, &g, &gz);
    Tensor *o = gdn_mix(tp, m, q, k, v, beta, g, s_in, doc_start, c->form, c->chunk_size, &sT);
    dev_copy(cache->dev, S->data, sT->data, (size_t)sT->numel * sizeof(real));
    return op_matmul(tp, outgate_apply(tp, &p->gate, o, gz), p->wo, false, false);
}

static int gdn_cache_state(const Mixer *m, void *ptr, real **bufs, int64_t *sizes) {
    return qkvcache_state(ptr, ((const Gdn *)m->impl)->conv, bufs, sizes);
}

// What gdn and gdp share: everything but the name, create (the parameters'
// widths, and the mixing op gdn_mix picks) and gdp's check of gdp_steps.
#define GDN_FAMILY_KIND                                                                              \
    .recurrent = true, .forward = gdn_forward, .cache_new = gdn_cache_new, .cache_free = gdn_cache_free, \
    .step = gdn_step, .cache_reset = gdn_cache_reset, .forward_carry = gdn_forward_carry,                 \
    .cache_state = gdn_cache_state, .destroy = gdn_destroy, .forms = MIXER_FORMS_LINEAR_FAMILY

const MixerKind MIXER_GDN = {.name = "gdn", .create = gdn_create, GDN_FAMILY_KIND};

static const char *gdp_check(const MixerConfig *c, char *why, size_t n) {
    if (c->gdp_steps < 1 || c->gdp_steps > GDP_MAX_STEPS) {
        snprintf(why, n, "gdp: gdp_steps = %d must be 1 to %d", c->gdp_steps, GDP_MAX_STEPS);
        return "gdp_steps";
    }
    return NULL;
}

const MixerKind MIXER_GDP = {.name = "gdp", .create = gdp_create, .check = gdp_check, GDN_FAMILY_KIND};
