// gla_layer.h: the parts the `linear` and `mamba` mixers share around op_gla:
// the q, k, v projections with their short convolutions, the output stage
// (OutGate, then wo), and the decode cache (the state S per head plus the
// convolutions' last inputs: constant memory and time per token).
#ifndef GLA_LAYER_H
#define GLA_LAYER_H

#include "gla.h"
#include "mixer_common.h"

typedef struct GlaLayer {
    Tensor *wq, *wk;                    // (D, H*dk)
    Tensor *wv;                         // (D, H*dv)
    Tensor *wo;                         // (H*dv, D), init std cfg->out_std
    ShortConv conv_q, conv_k, conv_v;   // width cfg->conv_size (0: none)
    OutGate gate;
} GlaLayer;

typedef struct GlaCache {
    Tensor *S;                          // (B, H, dk, dv) the state after the last token, in dev's memory
    ShortConvCache cq, ck, cv;
    Device dev;
} GlaCache;

// Registers prefix + wq, wk, wv, conv_q, conv_k, conv_v, out_norm, wg, wo.
void gla_layer_create(GlaLayer *L, ParamStore *ps, const char *prefix, const MixerConfig *cfg);
// The same with out_norm of gain_size entries (outgate_create_gain).
void gla_layer_create_gain(GlaLayer *L, ParamStore *ps, const char *prefix, const MixerConfig *cfg, int gain_size);
// u: (B, T, D) -> q, k (B, T, H*dk), v (B, T, H*dv), each projected then
// SiLU(conv(.)) (just projected when conv_size is 0). With a cache (decoding,
// T = 1) the convolutions read and advance it. doc_start: (B, T) or NULL
// (docs.h), without a cache only. gz: the output gate's projection u Wg
// (B, T, H*dv), made with the other three in one op_matmul_multi.
void gla_layer_qkv(Tape *tp, const GlaLayer *L, GlaCache *cache, Tensor *u, const int *doc_start, Tensor **q,
                   Tensor **k, Tensor **v, Tensor **gz);
// o: (B, T, H*dv), gz from gla_layer_qkv -> OutGate(o, u) wo, (B, T, D).
Tensor *gla_layer_out(Tape *tp, const GlaLayer *L, Tensor *o, Tensor *gz);

// The same for a window that continues the streams in cache (carried state):
// the convolutions read and then update its inputs (shortconv_forward_carry).
void gla_layer_qkv_carry(Tape *tp, const GlaLayer *L, GlaCache *cache, Tensor *u, const int *doc_start, Tensor **q,
                         Tensor **k, Tensor **v, Tensor **gz);
// cache->S as a constant on tp (the initial state of a carried window), checked against u's B.
Tensor *gla_cache_state_in(Tape *tp, const GlaCache *cache, const Tensor *u);
// The buffers of the carried state: S, then the q, k, v convolution inputs (MixerKind.cache_state).
int gla_cache_buffers(const GlaLayer *L, GlaCache *c, real **bufs, int64_t *sizes);

GlaCache *gla_cache_new(const GlaLayer *L, const MixerConfig *cfg, int B, Device dev);
void gla_cache_free(void *cache);
// Row b starts a new document: its state and convolution inputs are zeroed.
void gla_cache_reset(const GlaLayer *L, GlaCache *c, int b);

#endif
