// attn.c: the `attn` mixer, causal softmax attention with RoPE (MODEL.md `attn`).
//
//   q = RoPE(u Wq), k = RoPE(u Wk), v = u Wv          (B, T, H*dk / H*dv)
//   o = softmax_{s<=t}(q_t . k_s / sqrt(dk)) v        op_attention (attn_flash.c)
//   y = o Wo                                          (B, T, D)
//
// No recurrent state. Decoding keeps a KV cache of the rotated keys and the
// values; a step rotates the new q and k at the current absolute position,
// appends k and v, and attends over the cache (attn_decode_forward), O(pos d).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernel.h"
#include "mixer.h"

typedef struct AttnLayer {
    Tensor *wq;   // (D, H*dk)
    Tensor *wk;   // (D, H*dk)
    Tensor *wv;   // (D, H*dv)
    Tensor *wo;   // (H*dv, D)
} AttnLayer;

typedef struct AttnCache {
    int B, max_T;
    int pos;      // positions cached so far = the absolute position of the next token
    real *k;      // (B, max_T, H*dk) keys after RoPE
    real *v;      // (B, max_T, H*dv)
} AttnCache;

static Tensor *add_weight(ParamStore *ps, const char *prefix, const char *name, int in, int out, double std) {
    char full[256];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    return params_add(ps, full, 2, (int[]){in, out}, init_normal(std), 0);
}

static void attn_create(Mixer *m, ParamStore *ps, const char *prefix) {
    const MixerConfig *c = &m->cfg;
    AttnLayer *L = xcalloc(1, sizeof *L);
    double std = 1.0 / sqrt(c->d_model);
    L->wq = add_weight(ps, prefix, "wq", c->d_model, c->n_heads * c->d_k, std);
    L->wk = add_weight(ps, prefix, "wk", c->d_model, c->n_heads * c->d_k, std);
    L->wv = add_weight(ps, prefix, "wv", c->d_model, c->n_heads * c->d_v, std);
    L->wo = add_weight(ps, prefix, "wo", c->n_heads * c->d_v, c->d_model, c->out_std);
    ASSERT(c->d_k % 2 == 0, "attn: RoPE rotates pairs, d_k %d must be even", c->d_k);
    m->impl = L;
}

static void attn_destroy(Mixer *m) { free(m->impl); }

static Tensor *attn_forward(Tape *tp, Mixer *m, Tensor *u, Tensor *s_in, Tensor **s_out) {
    const MixerConfig *c = &m->cfg;
    const AttnLayer *L = m->impl;
    ASSERT(s_in == NULL, "attn: has no recurrent state, s_in must be NULL (got %s)", SHAPE(s_in));
    if (s_out) *s_out = NULL;
    ASSERT(u->ndim == 3 && u->shape[2] == c->d_model, "attn: u %s must be (B, T, %d)", SHAPE(u), c->d_model);
    Tensor *q = op_rope(tp, op_matmul(tp, u, L->wq, false, false), c->d_k, 0, c->rope_base);
    Tensor *k = op_rope(tp, op_matmul(tp, u, L->wk, false, false), c->d_k, 0, c->rope_base);
    Tensor *v = op_matmul(tp, u, L->wv, false, false);
    Tensor *o = op_attention(tp, q, k, v, c->n_heads, 1.0 / sqrt(c->d_k));
    return op_matmul(tp, o, L->wo, false, false);
}

static void *attn_cache_new(const Mixer *m, int B, int max_T) {
    ASSERT(B >= 1 && max_T >= 1, "attn cache: B %d, max_T %d", B, max_T);
    const MixerConfig *c = &m->cfg;
    AttnCache *cc = xcalloc(1, sizeof *cc);
    cc->B = B;
    cc->max_T = max_T;
    cc->k = xmalloc((size_t)B * max_T * c->n_heads * c->d_k * sizeof(real));
    cc->v = xmalloc((size_t)B * max_T * c->n_heads * c->d_v * sizeof(real));
    return cc;
}

static void attn_cache_free(void *cache) {
    AttnCache *cc = cache;
    if (!cc) return;
    free(cc->k);
    free(cc->v);
    free(cc);
}

static Tensor *attn_step(Tape *tp, Mixer *m, void *cache, Tensor *u) {
    const MixerConfig *c = &m->cfg;
    const AttnLayer *L = m->impl;
    AttnCache *cc = cache;
    int B = cc->B, H = c->n_heads, dk = c->d_k, dv = c->d_v;
    ASSERT(u->ndim == 3 && u->shape[0] == B && u->shape[1] == 1 && u->shape[2] == c->d_model,
           "attn step: u %s must be (%d, 1, %d)", SHAPE(u), B, c->d_model);
    ASSERT(cc->pos < cc->max_T, "attn step: the KV cache is full (%d positions)", cc->max_T);
    ASSERT(!tape_grad_enabled(tp), "attn step: decoding runs in no-grad mode (tape_no_grad_push first)");
    Tensor *q = op_rope(tp, op_matmul(tp, u, L->wq, false, false), dk, cc->pos, c->rope_base);
    Tensor *k = op_rope(tp, op_matmul(tp, u, L->wk, false, false), dk, cc->pos, c->rope_base);
    Tensor *v = op_matmul(tp, u, L->wv, false, false);
    for (int b = 0; b < B; b++) {
        memcpy(cc->k + ((int64_t)b * cc->max_T + cc->pos) * H * dk, k->data + (int64_t)b * H * dk,
               (size_t)H * dk * sizeof(real));
        memcpy(cc->v + ((int64_t)b * cc->max_T + cc->pos) * H * dv, v->data + (int64_t)b * H * dv,
               (size_t)H * dv * sizeof(real));
    }
    cc->pos++;
    Tensor *o = tape_tensorv(tp, 3, B, 1, H * dv);
    attn_decode_forward(o->data, q->data, cc->k, cc->v, B, cc->max_T, cc->pos, H, dk, dv, 1.0 / sqrt(dk));
    return op_matmul(tp, o, L->wo, false, false);
}

const MixerKind MIXER_ATTN = {
    .name = "attn",
    .recurrent = false,
    .create = attn_create,
    .forward = attn_forward,
    .cache_new = attn_cache_new,
    .cache_free = attn_cache_free,
    .step = attn_step,
    .destroy = attn_destroy,
};
