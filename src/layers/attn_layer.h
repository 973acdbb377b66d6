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
    Tensor *q_norm, *k_norm;   // (dk) each, MixerConfig.qk_norm (else NULL)
    Tensor *w_gate;            // (D, H*dv), MixerConfig.attn_gate (else NULL)
} AttnLayer;

typedef struct KVCache {
    int B, max_T;
    int pos;      // positions cached so far = the cache slot of the next token
    int *start;   // (B) the slot where each row's current document begins (0 until a reset)
    real *k;      // (B, max_T, H*dk) keys after RoPE, in dev's memory
    real *v;      // (B, max_T, H*dv), in dev's memory
    Device dev;
    int *start_dev;   // (B) a copy of start in dev's memory (the GPU; NULL on the CPU)
    // The GPU: pos in dev's memory, which attn's steps read and advance there
    // (DeviceKernels.attn_step: a CUDA graph of a step replays any step), and
    // RoPE's frequencies (d_k/2, double); NULL on the CPU.
    int *pos_dev;
    double *invf_dev;
} KVCache;

// wq, wk, wv ~ N(0, 1/D), wo ~ N(0, out_std^2); the options' q_norm and
// k_norm = 1 (no weight decay), w_gate ~ N(0, 1/D), registered after wo so
// that a model without them draws what it always drew.
// Constraints of the attention projections (d_k even for RoPE); MixerKind.check.
const char *attn_layer_check(const MixerConfig *c, char *why, size_t n);
void attn_layer_create(AttnLayer *L, ParamStore *ps, const char *prefix, const MixerConfig *c);
// u (B, T, D) -> q = RoPE(u Wq), k = RoPE(u Wk), v = u Wv; RoPE at positions
// pos (B, T) (docs_positions, kvcache_positions), or pos0 + t when pos is NULL.
// With qk_norm, each head of u Wq and u Wk is RMS-normalised (gains q_norm,
// k_norm, eps norm_eps) before its rotation.
void attn_layer_qkv(Tape *tp, const AttnLayer *L, const MixerConfig *c, Tensor *u, int pos0, const int *pos,
                    Tensor **q, Tensor **k, Tensor **v);
// The same before RoPE: x[0..2] = u Wq, u Wk (each head normalised with
// qk_norm), u Wv.
void attn_layer_qkv_unrotated(Tape *tp, const AttnLayer *L, const MixerConfig *c, Tensor *u, Tensor *x[3]);
// The attention output o (B, T, H*dv) of the positions u (B, T, D) to the
// mixer's output: o Wo, or (o * sigmoid(u W_gate)) Wo with attn_gate.
Tensor *attn_layer_out(Tape *tp, const AttnLayer *L, Tensor *o, Tensor *u);
// The RoPE positions of a forward with documents: t - (the start of t's
// document), on tp's arena; NULL when doc_start flags nothing (positions t).
// MODEL.md's project notes: positions restart at every document.
int *attn_doc_positions(Tape *tp, const int *doc_start, int B, int T);

void kvcache_init(KVCache *kc, const MixerConfig *c, int B, int max_T, Device dev);
// pos_dev = pos (after a change of pos on the host: a prefill).
void kvcache_sync_pos(KVCache *kc);
void kvcache_free(KVCache *kc);
// Store k (B, T0, H*dk), v (B, T0, H*dv) at slots kc->pos .. kc->pos+T0-1 (does not advance kc->pos).
void kvcache_put(KVCache *kc, const Tensor *k, const Tensor *v);
// Whether every row's document begins at the next slot (nothing cached to attend to).
bool kvcache_fresh(const KVCache *kc);
// The prefill of attention (MixerKind.prefill): the window u (B, T0, D) of
// the next T0 positions, its rotated keys and values stored at slots
// kc->pos..., and its output as T0 steps would give it, each query attending
// to its row's cached keys and the window's up to itself (kc->pos is not
// advanced): attn_prefix_forward (cu_attn_prefix_forward on a GPU), fresh
// window or not. No-grad mode.
Tensor *attn_layer_prefill(Tape *tp, const AttnLayer *L, const MixerConfig *c, KVCache *kc, Tensor *u);
// Row b's next token begins a new document: it and the tokens after it
// attend from slot kc->pos on, at RoPE positions counted from there.
void kvcache_reset(KVCache *kc, int b);
// The RoPE positions (B, T0) of T0 tokens from slot kc->pos on (pos + t -
// start[b]), on tp's arena; NULL when no row was reset (positions pos + t).
int *kvcache_positions(Tape *tp, const KVCache *kc, int T0);

#endif
