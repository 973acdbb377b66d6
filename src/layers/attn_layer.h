// attn_layer.h: what the `attn` and `attn_dsa` mixers share (attn.c): the
// projections with RoPE and the KV cache of decoding.
#ifndef ATTN_LAYER_H
#define ATTN_LAYER_H

#include "mixer.h"

typedef struct AttnLayer {
    Tensor *wq;   // (D, H*dk)
    Tensor *wk;   // (D, H*dk)
    Tensor *wv;   // (D, H*dv)
    Tensor *wo;   // (H*dv, D)
} AttnLayer;

typedef struct KVCache {
    int B, max_T;
    int pos;      // positions cached so far = the absolute position of the next token
    real *k;      // (B, max_T, H*dk) keys after RoPE
    real *v;      // (B, max_T, H*dv)
} KVCache;

// wq, wk, wv ~ N(0, 1/D), wo ~ N(0, out_std^2).
// Constraints of the attention projections (d_k even for RoPE); MixerKind.check.
const char *attn_layer_check(const MixerConfig *c, char *why, size_t n);
void attn_layer_create(AttnLayer *L, ParamStore *ps, const char *prefix, const MixerConfig *c);
// u (B, T, D) -> q = RoPE(u Wq), k = RoPE(u Wk) at absolute positions pos0.., v = u Wv.
void attn_layer_qkv(Tape *tp, const AttnLayer *L, const MixerConfig *c, Tensor *u, int pos0, Tensor **q,
                    Tensor **k, Tensor **v);

void kvcache_init(KVCache *kc, const MixerConfig *c, int B, int max_T);
void kvcache_free(KVCache *kc);
// Store k (B, 1, H*dk), v (B, 1, H*dv) at position kc->pos (does not advance it).
void kvcache_put(KVCache *kc, const Tensor *k, const Tensor *v);

#endif
