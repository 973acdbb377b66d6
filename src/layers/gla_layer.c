// gla_layer.c: projections, convolutions, output stage and decode cache
// shared by linear.c and mamba.c.
#include "gla_layer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

void gla_layer_create(GlaLayer *L, ParamStore *ps, const char *prefix, const MixerConfig *cfg) {
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
    outgate_create(&L->gate, ps, prefix, D, cfg->n_heads, cfg->d_v, cfg->norm_eps);
    L->wo = param_linear(ps, prefix, "wo", Hv, D, cfg->out_std);
}

static Tensor *conv(Tape *tp, const ShortConv *c, ShortConvCache *cc, Tensor *x) {
    return cc ? shortconv_step(tp, c, cc, x) : shortconv_forward(tp, c, x, NULL);
}

void gla_layer_qkv(Tape *tp, const GlaLayer *L, GlaCache *cache, Tensor *u, Tensor **q, Tensor **k, Tensor **v) {
    *q = conv(tp, &L->conv_q, cache ? &cache->cq : NULL, op_matmul(tp, u, L->wq, false, false));
    *k = conv(tp, &L->conv_k, cache ? &cache->ck : NULL, op_matmul(tp, u, L->wk, false, false));
    *v = conv(tp, &L->conv_v, cache ? &cache->cv : NULL, op_matmul(tp, u, L->wv, false, false));
}

Tensor *gla_layer_out(Tape *tp, const GlaLayer *L, Tensor *o, Tensor *u) {
    return op_matmul(tp, outgate_forward(tp, &L->gate, o, u), L->wo, false, false);
}

GlaCache *gla_cache_new(const GlaLayer *L, const MixerConfig *cfg, int B) {
    GlaCache *c = xcalloc(1, sizeof *c);
    c->S = tensor_newv(false, 4, B, cfg->n_heads, cfg->d_k, cfg->d_v);   // zeros
    shortconv_cache_init(&c->cq, &L->conv_q, B);
    shortconv_cache_init(&c->ck, &L->conv_k, B);
    shortconv_cache_init(&c->cv, &L->conv_v, B);
    return c;
}

void gla_cache_free(void *cache) {
    GlaCache *c = cache;
    if (!c) return;
    tensor_free(c->S);
    shortconv_cache_free(&c->cq);
    shortconv_cache_free(&c->ck);
    shortconv_cache_free(&c->cv);
    free(c);
}
