// attn_kernel.h: causal softmax attention as one fused op, plus its readable
// reference and the one-query decoding kernel.
//
// Per batch element b and head h (MODEL.md, `attn`):
//   P_ts = softmax_{s <= t}(scale * q_t . k_s),   o_t = sum_s P_ts v_s.
// Layout: q, k (B, T, H*dk), v and o (B, T, H*dv), head h occupying columns
// [h*d, (h+1)*d) of each row; kernels address a head with leading dimension
// H*d instead of transposing.
//
// op_attention (attn_flash.c) is the FlashAttention-2 form: the forward walks
// (query tile x key tile) blocks with an online softmax and keeps only each
// row's log-sum-exp, lse (B, H, T); the backward recomputes P block by block
// from lse. Memory is O(T) beyond the inputs; no T x T matrix exists.
//
// op_attention_naive (attn_naive.c) is the reference: plain loops, the full
// P (B, H, T, T) saved for the backward. Use it only to test the fast one.
//
// Documents (docs.h): with doc_start, query t attends to the keys of its own
// document only, s in [lo(t), t] (block-diagonal causal), lo(t) the position
// where t's document begins; each document is then computed as a sequence of
// its own (up to rounding: the tiles cut it elsewhere).
#ifndef ATTN_KERNEL_H
#define ATTN_KERNEL_H

#include "tape.h"

#define ATTN_TILE_Q 64   // queries per block (forward and backward)
#define ATTN_TILE_K 64   // keys per block

// q, k: (B, T, H*dk), v: (B, T, H*dv) -> o (B, T, H*dv), causal.
// doc_start: (B, T) or NULL (docs.h).
Tensor *op_attention(Tape *tp, Tensor *q, Tensor *k, Tensor *v, int n_heads, double scale, const int *doc_start);
// The same with explicit tile sizes (tests run several tiles per sequence at small T).
Tensor *op_attention_tiled(Tape *tp, Tensor *q, Tensor *k, Tensor *v, int n_heads, double scale,
                           const int *doc_start, int tile_q, int tile_k);
// Whether op_attention's tile products run in bf16 (float32 sums) for these
// head sizes and tiles now: under [train] precision = bf16 (blas_precision),
// in float32 builds whose compiler targets AVX512_BF16, with even head sizes
// and tiles, unless [train] bf16_tiles = fp32 (tile_amx.h: attn_tiles_kind
// says which kind, AMX or AVX512_BF16). attn_flash.c says which parts stay
// float32.
bool attn_tiles_bf16(int dk, int dv, int tile_q, int tile_k);
// The O(T^2)-memory reference, same contract as op_attention.
Tensor *op_attention_naive(Tape *tp, Tensor *q, Tensor *k, Tensor *v, int n_heads, double scale);
// The reference restricted to allowed positions: allow (B, T, T), row (b, t)
// lets query t see key s <= t where allow != 0 (copied; at least one per row).
// The brute-force form of sparse attention (dsa_kernel.h).
Tensor *op_attention_naive_masked(Tape *tp, Tensor *q, Tensor *k, Tensor *v, int n_heads, double scale,
                                  const unsigned char *allow);

// Decoding: one new query per sequence attends over the first n_keys cached
// positions, from key0[b] on in row b (key0 (B): where its document begins,
// < n_keys; NULL: 0). q: (B, H*dk); kc: (B, max_T, H*dk); vc: (B, max_T, H*dv);
// o: (B, H*dv). Cost O(n_keys * (dk + dv)) per head. No autograd.
void attn_decode_forward(real *o, const real *q, const real *kc, const real *vc, int B, int max_T,
                         int n_keys, const int *key0, int H, int dk, int dv, double scale);

// Prefill: a window of T0 new queries per sequence, at slots pos ..
// pos+T0-1, whose keys and values are in the cache already; query t attends
// causally to slots key0[b] .. t of row b (NULL: from 0). q: (B, T0, H*dk);
// o: (B, T0, H*dv); kc, vc as above. FlashAttention's forward tiles (its
// scratch on tp), so that the window's outputs equal op_attention's over the
// row's whole document to rounding. No autograd.
void attn_prefix_forward(Tape *tp, real *o, const real *q, const real *kc, const real *vc, int B, int max_T, int pos,
                         int T0, const int *key0, int H, int dk, int dv, double scale);

// Threads attn_decode_forward may take for a long cache (at least
// ATTN_DECODE_PAR_KEYS keys x heads) when the rest of decoding runs on fewer:
// generate runs a small model on one thread, whose products of one row a
// second thread only slows, while attention over a 16k cache is work enough
// to share. 0 (the default): the team's size, omp_get_max_threads().
// Results do not depend on it (the kernel's parts are fixed).
#define ATTN_DECODE_PAR_KEYS 16384
void attn_decode_set_threads(int threads);
// The team for `work` keys x heads of such a kernel: attn_decode_set_threads's
// threads at ATTN_DECODE_PAR_KEYS or more, else omp_get_max_threads(). Also
// the attn_dsa step's indexer over a long cache (dsa_index_row).
int attn_decode_team(int64_t work);

#endif
