// gla_layer.c: projections, convolutions, output stage and decode cache
// shared by linear.c and mamba.c (mamba and mamba2).
#include "gla_layer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gla_layer_create(GlaLayer *L, ParamStore *ps, const char *prefix, const MixerConfig *cfg) {
    gla_layer_create_gain(L, ps, prefix, cfg, cfg->d_v);
}

void gla_layer_create_gain(GlaLayer *L, ParamStore *ps, const char *prefix, const MixerConfig *cfg, int gain_size) {
    int D = cfg->d_model, Hk = cfg->n_heads * cfg->d_k, Hv = cfg->n_heads * cfg->d_v;
    double std = 1.0 / sqrt(D);
    L->wq = param_linear(ps, prefix, "wq", D, Hk, std);
    L->wk = param_linear(ps, prefix, "wk", D, Hk, std);
    L->wv = param_linear(ps, prefix, "wv", D, Hv, std);
    char name[256];
    snprintf(name, sizeof name, "%sconv_q", prefix);
    shortconv_create(&L->conv_q, ps, name, Hk, cfg->conv_size);
    snprintf(name, sizeof name, "%sconv_k", prefix);
    shortconv_create(&L->conv_k, ps, name, Hk, cfg->conv_size);
    snprintf(name, sizeof name, "%sconv_v", prefix);
    shortconv_create(&L->conv_v, ps, name, Hv, cfg->conv_size);
    outgate_create_gain(&L->gate, ps, prefix, D, cfg->n_heads, cfg->d_v, cfg->norm_eps, gain_size);
    L->wo = param_linear(ps, prefix, "wo", Hv, D, cfg->out_std);
}

static Tensor *conv(Tape *tp, const ShortConv *c, ShortConvCache *cc, Tensor *x, const int *doc_start) {
    return cc ? shortconv_step(tp, c, cc, x) : shortconv_forward(tp, c, x, doc_start);
}

// u Wq, u Wk, u Wv and the gate's u Wg, in one node.
static void project(Tape *tp, const GlaLayer *L, Tensor *u, Tensor **p) {
    op_matmul_multi(tp, u, (Tensor *[]){L->wq, L->wk, L->wv, L->gate.wg}, 4, p);
}

void gla_layer_qkv(Tape *tp, const GlaLayer *L, GlaCache *cache, Tensor *u, const int *doc_start, Tensor **q,
                   Tensor **k, Tensor **v, Tensor **gz) {
    ASSERT(!(cache && doc_start), "gla_layer_qkv: documents in decoding are cache resets (gla_cache_reset)");
    Tensor *p[4];
    project(tp, L, u, p);
    *q = conv(tp, &L->conv_q, cache ? &cache->cq : NULL, p[0], doc_start);
    *k = conv(tp, &L->conv_k, cache ? &cache->ck : NULL, p[1], doc_start);
    *v = conv(tp, &L->conv_v, cache ? &cache->cv : NULL, p[2], doc_start);
    *gz = p[3];
}

void gla_layer_qkv_carry(Tape *tp, const GlaLayer *L, GlaCache *cache, Tensor *u, const int *doc_start, Tensor **q,
                         Tensor **k, Tensor **v, Tensor **gz) {
    Tensor *p[4];
    project(tp, L, u, p);
    *q = shortconv_forward_carry(tp, &L->conv_q, p[0], doc_start, &cache->cq);
    *k = shortconv_forward_carry(tp, &L->conv_k, p[1], doc_start, &cache->ck);
    *v = shortconv_forward_carry(tp, &L->conv_v, p[2], doc_start, &cache->cv);
    *gz = p[3];
}

Tensor *gla_cache_state_in(Tape *tp, const GlaCache *cache, const Tensor *u) {
    const Tensor *S = cache->S;
    ASSERT(cache->dev == tp->device, "carried state: a %s carry on a %s tape", device_name(cache->dev),
           device_name(tp->device));
    ASSERT(u->ndim == 3 && u->shape[0] == S->shape[0], "carried window: u %s, the cache holds %d rows", SHAPE(u),
           S->shape[0]);
    return tape_tensor_copy_dev(tp, 4, S->shape, S->data);
}

int gla_cache_buffers(const GlaLayer *L, GlaCache *c, real **bufs, int64_t *sizes) {
    bufs[0] = c->S->data;
    sizes[0] = c->S->numel;
    int n = 1;
    n += shortconv_cache_buffer(&L->conv_q, &c->cq, bufs + n, sizes + n);
    n += shortconv_cache_buffer(&L->conv_k, &c->ck, bufs + n, sizes + n);
    n += shortconv_cache_buffer(&L->conv_v, &c->cv, bufs + n, sizes + n);
    return n;
}

Tensor *gla_layer_out(Tape *tp, const GlaLayer *L, Tensor *o, Tensor *gz) {
    return op_matmul(tp, outgate_apply(tp, &L->gate, o, gz), L->wo, false, false);
}

GlaCache *gla_cache_new(const GlaLayer *L, const MixerConfig *cfg, int B, Device dev) {
    GlaCache *c = xcalloc(1, sizeof *c);
    c->dev = dev;
    c->S = tensor_new_on(dev, 4, (int[]){B, cfg->n_heads, cfg->d_k, cfg->d_v});   // zeros
    shortconv_cache_init(&c->cq, &L->conv_q, B, dev);
    shortconv_cache_init(&c->ck, &L->conv_k, B, dev);
    shortconv_cache_init(&c->cv, &L->conv_v, B, dev);
    return c;
}

void gla_cache_reset(const GlaLayer *L, GlaCache *c, int b) {
    Tensor *S = c->S;
    ASSERT(b >= 0 && b < S->shape[0], "gla_cache_reset: row %d of %d", b, S->shape[0]);
    int64_t row = S->numel / S->shape[0];
    dev_zero(c->dev, S->data + b * row, (size_t)row * sizeof(real));
    shortconv_cache_reset(&c->cq, &L->conv_q, b);
    shortconv_cache_reset(&c->ck, &L->conv_k, b);
    shortconv_cache_reset(&c->cv, &L->conv_v, b);
}

void gla_cache_free(void *cache) {
    GlaCache *c = cache;
    if (!c) return;
    tensor_free_on(c->dev, c->S);
    shortconv_cache_free(&c->cq);
    shortconv_cache_free(&c->ck);
    shortconv_cache_free(&c->cv);
    free(c);
}
