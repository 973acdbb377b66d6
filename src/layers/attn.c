// attn.c: the `attn` mixer, causal softmax attention with RoPE (MODEL.md `attn`).
//
//   q = RoPE(u Wq), k = RoPE(u Wk), v = u Wv          (B, T, H*dk / H*dv)
//   o = softmax_{s<=t}(q_t . k_s / sqrt(dk)) v        op_attention (attn_flash.c)
//   y = o Wo                                          (B, T, D)
//
// Options (MODEL.md): qk_norm normalises each head of u Wq and u Wk
// (RMSNorm, one gain of d_k shared by the heads) before RoPE; attn_gate
// multiplies o by sigmoid(u W_gate) before Wo. Every path (forward, step,
// prefill, and attn_dsa's) goes through attn_layer_qkv and attn_layer_out,
// so decoding applies them exactly as the forward does.
//
// No recurrent state. Decoding keeps a KV cache of the rotated keys and the
// values; a step rotates the new q and k at the current absolute position,
// appends k and v, and attends over the cache (attn_decode_forward), O(pos d).
//
// Documents (docs.h): the forward attends within each document
// (op_attention's block-diagonal mask) and RoPE positions restart at every
// document start, so a packed row computes exactly what its documents
// compute as rows of their own. In decoding, kvcache_reset(b) starts a new
// document in row b: later steps attend from that slot on, at positions
// counted from it.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernel.h"
#include "attn_layer.h"
#include "docs.h"
#include "mixer_common.h"

const char *attn_layer_check(const MixerConfig *c, char *why, size_t n) {
    if (c->d_k % 2 != 0) {
        snprintf(why, n, "attention's RoPE rotates pairs of dimensions: d_k = %d must be even", c->d_k);
        return "d_k";
    }
    return NULL;
}

// A norm gain prefix + name of n ones, without weight decay (like every norm gain).
static Tensor *gain_param(ParamStore *ps, const char *prefix, const char *name, int n) {
    char full[256];
    int len = snprintf(full, sizeof full, "%s%s", prefix, name);
    ASSERT(len < (int)sizeof full, "attn: parameter name '%s%s' too long", prefix, name);
    return params_add(ps, full, 1, (int[]){n}, init_ones(), TENSOR_NO_DECAY);
}

void attn_layer_create(AttnLayer *L, ParamStore *ps, const char *prefix, const MixerConfig *c) {
    double std = 1.0 / sqrt(c->d_model);
    L->wq = param_linear(ps, prefix, "wq", c->d_model, c->n_heads * c->d_k, std);
    L->wk = param_linear(ps, prefix, "wk", c->d_model, c->n_heads * c->d_k, std);
    L->wv = param_linear(ps, prefix, "wv", c->d_model, c->n_heads * c->d_v, std);
    L->wo = param_linear(ps, prefix, "wo", c->n_heads * c->d_v, c->d_model, c->out_std);
    L->q_norm = L->k_norm = L->w_gate = NULL;
    if (c->qk_norm) {
        L->q_norm = gain_param(ps, prefix, "q_norm", c->d_k);
        L->k_norm = gain_param(ps, prefix, "k_norm", c->d_k);
    }
    if (c->attn_gate) L->w_gate = param_linear(ps, prefix, "w_gate", c->d_model, c->n_heads * c->d_v, std);
}

Tensor *attn_layer_out(Tape *tp, const AttnLayer *L, Tensor *o, Tensor *u) {
    if (L->w_gate) o = op_mul(tp, o, op_sigmoid(tp, op_matmul(tp, u, L->w_gate, false, false)));
    return op_matmul(tp, o, L->wo, false, false);
}

// RoPE at pos (B, T) or, when NULL, at pos0 + t.
static Tensor *rope_at(Tape *tp, Tensor *x, int hd, int pos0, const int *pos, double base) {
    return pos ? op_rope_pos(tp, x, hd, pos, base) : op_rope(tp, x, hd, pos0, base);
}

void attn_layer_qkv_unrotated(Tape *tp, const AttnLayer *L, const MixerConfig *c, Tensor *u, Tensor *x[3]) {
    ASSERT(u->ndim == 3 && u->shape[2] == c->d_model, "attn: u %s must be (B, T, %d)", SHAPE(u), c->d_model);
    op_matmul_multi(tp, u, (Tensor *[]){L->wq, L->wk, L->wv}, 3, x);   // u Wq, u Wk, u Wv in one node
    if (L->q_norm) {   // per head: groups of d_k, one shared gain
        x[0] = op_rmsnorm_groups(tp, x[0], L->q_norm, c->d_k, c->norm_eps);
        x[1] = op_rmsnorm_groups(tp, x[1], L->k_norm, c->d_k, c->norm_eps);
    }
}

void attn_layer_qkv(Tape *tp, const AttnLayer *L, const MixerConfig *c, Tensor *u, int pos0, const int *pos,
                    Tensor **q, Tensor **k, Tensor **v) {
    Tensor *x[3];
    attn_layer_qkv_unrotated(tp, L, c, u, x);
    *q = rope_at(tp, x[0], c->d_k, pos0, pos, c->rope_base);
    *k = rope_at(tp, x[1], c->d_k, pos0, pos, c->rope_base);
    *v = x[2];
}

int *attn_doc_positions(Tape *tp, const int *doc_start, int B, int T) {
    const int *first = docs_first(tp, doc_start, B, T);
    if (!first) return NULL;
    int *pos = tape_alloc(tp, (size_t)B * T * sizeof(int));
    docs_positions(pos, first, B, T);
    return pos;
}

void kvcache_init(KVCache *kc, const MixerConfig *c, int B, int max_T, Device dev) {
    ASSERT(B >= 1 && max_T >= 1, "attn cache: B %d, max_T %d", B, max_T);
    kc->B = B;
    kc->max_T = max_T;
    kc->pos = 0;
    kc->dev = dev;
    kc->start = xcalloc((size_t)B, sizeof(int));
    kc->k = dev_alloc(dev, (size_t)B * max_T * c->n_heads * c->d_k * sizeof(real));
    kc->v = dev_alloc(dev, (size_t)B * max_T * c->n_heads * c->d_v * sizeof(real));
    kc->start_dev = NULL;
    kc->pos_dev = NULL;
    kc->invf_dev = NULL;
    if (dev != DEVICE_CPU) {
        kc->start_dev = dev_alloc(dev, (size_t)B * sizeof(int));
        dev_zero(dev, kc->start_dev, (size_t)B * sizeof(int));
        kc->pos_dev = dev_alloc(dev, sizeof(int));
        dev_zero(dev, kc->pos_dev, sizeof(int));
        int half = c->d_k / 2;
        double *invf = xmalloc((size_t)(half ? half : 1) * sizeof(double));
        for (int i = 0; i < half; i++) invf[i] = pow(c->rope_base, -2.0 * i / c->d_k);   // op_rope's (cu_rope_forward)
        kc->invf_dev = dev_alloc(dev, (size_t)(half ? half : 1) * sizeof(double));
        dev_from_host(kc->invf_dev, dev, invf, (size_t)half * sizeof(double));
        free(invf);
    }
}

void kvcache_sync_pos(KVCache *kc) {
    if (kc->pos_dev) dev_from_host(kc->pos_dev, kc->dev, &kc->pos, sizeof(int));
}

void kvcache_free(KVCache *kc) {
    if (kc->k) dev_free(kc->dev, kc->k);
    if (kc->v) dev_free(kc->dev, kc->v);
    if (kc->start_dev) dev_free(kc->dev, kc->start_dev);
    if (kc->pos_dev) dev_free(kc->dev, kc->pos_dev);
    if (kc->invf_dev) dev_free(kc->dev, kc->invf_dev);
    kc->pos_dev = NULL;
    kc->invf_dev = NULL;
    free(kc->start);
    kc->k = kc->v = NULL;
    kc->start = kc->start_dev = NULL;
}

void kvcache_reset(KVCache *kc, int b) {
    ASSERT(b >= 0 && b < kc->B, "attn cache reset: row %d of %d", b, kc->B);
    kc->start[b] = kc->pos;
    if (kc->start_dev) dev_from_host(kc->start_dev + b, kc->dev, &kc->start[b], sizeof(int));
}

int *kvcache_positions(Tape *tp, const KVCache *kc, int T0) {
    bool any = false;
    for (int b = 0; b < kc->B; b++) any |= kc->start[b] != 0;
    if (!any) return NULL;
    int *pos = tape_alloc(tp, (size_t)kc->B * T0 * sizeof(int));
    for (int b = 0; b < kc->B; b++)
        for (int t = 0; t < T0; t++) pos[b * T0 + t] = kc->pos + t - kc->start[b];
    return pos;
}

void kvcache_put(KVCache *kc, const Tensor *k, const Tensor *v) {
    int T0 = k->shape[1];
    ASSERT(kc->pos + T0 <= kc->max_T, "attn: the KV cache holds %d positions, %d are taken and %d more asked",
           kc->max_T, kc->pos, T0);
    size_t wk = (size_t)k->shape[2] * sizeof(real), wv = (size_t)v->shape[2] * sizeof(real);
    // Row b's T0 new keys and values to slots pos .. pos+T0-1 of row b.
    dev_copy2d(kc->dev, (char *)kc->k + (size_t)kc->pos * wk, (size_t)kc->max_T * wk, k->data, T0 * wk, T0 * wk,
               (size_t)kc->B);
    dev_copy2d(kc->dev, (char *)kc->v + (size_t)kc->pos * wv, (size_t)kc->max_T * wv, v->data, T0 * wv, T0 * wv,
               (size_t)kc->B);
}

bool kvcache_fresh(const KVCache *kc) {
    for (int b = 0; b < kc->B; b++)
        if (kc->start[b] != kc->pos) return false;
    return true;
}

Tensor *attn_layer_prefill(Tape *tp, const AttnLayer *L, const MixerConfig *c, KVCache *kc, Tensor *u) {
    int B = kc->B, T0 = u->shape[1], H = c->n_heads;
    ASSERT(u->ndim == 3 && u->shape[0] == B && u->shape[2] == c->d_model && kc->pos + T0 <= kc->max_T,
           "attn prefill: u %s must be (%d, T0, %d) with T0 <= %d free positions", SHAPE(u), B, c->d_model,
           kc->max_T - kc->pos);
    ASSERT(!tape_grad_enabled(tp), "attn prefill: runs in no-grad mode (tape_no_grad_push first)");
    ASSERT(kc->dev == tp->device, "attn prefill: a %s cache on a %s tape", device_name(kc->dev),
           device_name(tp->device));
    Tensor *q, *k, *v;   // rotated at the positions the steps would rotate them
    attn_layer_qkv(tp, L, c, u, kc->pos, kvcache_positions(tp, kc, T0), &q, &k, &v);
    kvcache_put(kc, k, v);
    double scale = 1.0 / sqrt(c->d_k);
    // The window's queries over the cache, its own keys included (a fresh window too: its keys start at its slot).
    Tensor *o = tape_tensorv(tp, 3, B, T0, H * c->d_v);
    device_kernels(tp->device)->attn_prefix(tp, o->data, q->data, kc->k, kc->v, B, kc->max_T, kc->pos, T0, kc->start,
                                            kc->start_dev, H, c->d_k, c->d_v, scale);
    return attn_layer_out(tp, L, o, u);
}

// ---- the `attn` kind ----

static void attn_create(Mixer *m, ParamStore *ps, const char *prefix) {
    AttnLayer *L = xcalloc(1, sizeof *L);
    attn_layer_create(L, ps, prefix, &m->cfg);
    m->impl = L;
}

static void attn_destroy(Mixer *m) { free(m->impl); }

static Tensor *attn_forward(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, Tensor *s_in, Tensor **s_out) {
    const MixerConfig *c = &m->cfg;
    const AttnLayer *L = m->impl;
    ASSERT(s_in == NULL, "attn: has no recurrent state, s_in must be NULL (got %s)", SHAPE(s_in));
    ASSERT(u->ndim == 3, "attn: u %s must be (B, T, D)", SHAPE(u));
    if (s_out) *s_out = NULL;
    Tensor *q, *k, *v;
    attn_layer_qkv(tp, L, c, u, 0, attn_doc_positions(tp, doc_start, u->shape[0], u->shape[1]), &q, &k, &v);
    Tensor *o = op_attention(tp, q, k, v, c->n_heads, 1.0 / sqrt(c->d_k), doc_start);
    return attn_layer_out(tp, L, o, u);
}

static void *attn_cache_new(const Mixer *m, int B, int max_T, Device dev) {
    KVCache *kc = xcalloc(1, sizeof *kc);
    kvcache_init(kc, &m->cfg, B, max_T, dev);
    return kc;
}

static void attn_cache_free(void *cache) {
    if (!cache) return;
    kvcache_free(cache);
    free(cache);
}

// Whether this cache's steps read its length from the device (DeviceKernels.attn_step).
static bool attn_step_replayable(const void *cache) {
    const KVCache *kc = cache;
    const DeviceKernels *dk = kc->pos_dev ? device_kernels(kc->dev) : NULL;
    return dk && dk->attn_step && dk->attn_step_fits(kc->max_T);
}

static Tensor *attn_step(Tape *tp, Mixer *m, void *cache, Tensor *u) {
    const MixerConfig *c = &m->cfg;
    KVCache *kc = cache;
    ASSERT(u->ndim == 3 && u->shape[0] == kc->B && u->shape[1] == 1 && u->shape[2] == c->d_model,
           "attn step: u %s must be (%d, 1, %d)", SHAPE(u), kc->B, c->d_model);
    ASSERT(kc->pos < kc->max_T, "attn step: the KV cache is full (%d positions)", kc->max_T);
    ASSERT(!tape_grad_enabled(tp), "attn step: decoding runs in no-grad mode (tape_no_grad_push first)");
    ASSERT(kc->dev == tp->device, "attn step: a %s cache on a %s tape", device_name(kc->dev), device_name(tp->device));
    Tensor *q, *k, *v;
    Tensor *o = tape_tensorv(tp, 3, kc->B, 1, c->n_heads * c->d_v);
    const DeviceKernels *dk = device_kernels(tp->device);
    if (attn_step_replayable(kc)) {   // the GPU: the cache's length read from its memory
        Tensor *x[3];
        attn_layer_qkv_unrotated(tp, m->impl, c, u, x);
        dk->attn_step(tp, o->data, x[0]->data, x[1]->data, x[2]->data, kc->k, kc->v, kc->pos_dev, kc->start_dev,
                      kc->invf_dev, kc->B, kc->max_T, c->n_heads, c->d_k, c->d_v, 1.0 / sqrt(c->d_k));
        kc->pos++;
        return attn_layer_out(tp, m->impl, o, u);
    }
    attn_layer_qkv(tp, m->impl, c, u, kc->pos, kvcache_positions(tp, kc, 1), &q, &k, &v);
    kvcache_put(kc, k, v);
    kc->pos++;
    dk->attn_decode(tp, o->data, q->data, kc->k, kc->v, kc->B, kc->max_T, kc->pos, kc->start,
                    kc->start_dev, c->n_heads, c->d_k, c->d_v, 1.0 / sqrt(c->d_k));
    return attn_layer_out(tp, m->impl, o, u);
}

static void attn_cache_reset(const Mixer *m, void *cache, int b) { kvcache_reset(cache, b); }

static void attn_step_advance(void *cache, int delta) { ((KVCache *)cache)->pos += delta; }

static Tensor *attn_prefill(Tape *tp, Mixer *m, void *cache, Tensor *u) {
    KVCache *kc = cache;
    Tensor *y = attn_layer_prefill(tp, m->impl, &m->cfg, kc, u);
    kc->pos += u->shape[1];
    kvcache_sync_pos(kc);
    return y;
}

const MixerKind MIXER_ATTN = {
    .name = "attn",
    .recurrent = false,
    .create = attn_create,
    .forward = attn_forward,
    .cache_new = attn_cache_new,
    .cache_free = attn_cache_free,
    .step = attn_step,
    .step_replayable = attn_step_replayable,
    .step_advance = attn_step_advance,
    .cache_reset = attn_cache_reset,
    .prefill = attn_prefill,
    .destroy = attn_destroy,
    .check = attn_layer_check,
};
