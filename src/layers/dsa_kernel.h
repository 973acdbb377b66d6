// dsa_kernel.h: the DeepSeek sparse-attention pieces (MODEL.md `attn_dsa`).
//
//   indexer scores  I_ts = sum_j w_tj ReLU(qI_tj . kI_s) / sqrt(d_I),  s <= t
//   selection       Sel_t = the K positions s <= t with the largest I_ts
//                   (all of them while t < K; ties go to the later position)
//   sparse attention softmax over Sel_t only, O(T K d) forward and backward
//   distillation    KL(p_t || softmax_{s<=t}(I_t)), p = head-averaged dense P
//
// For training the indexer (distillation) the scores are materialised,
// (B, T, T) with zeros above the diagonal, since the KL needs every row: O(T^2)
// memory. Sparse inference uses dsa_index_select, which scores and selects
// tile by tile in O(T) memory. Selections are int arrays (B, T, K) of positions in ascending
// order, -1 past the end of rows with fewer than K candidates (t + 1 < K).
//
// Documents (docs.h): with doc_start (B, T), a row's candidates are the
// positions of its own document, s in [lo(t), t] (lo(t) where it begins),
// wherever this header says s <= t: the scores outside are 0 and never
// read, the selection, the target and the KL's softmax run over [lo(t), t],
// and a row with fewer than K candidates (t + 1 - lo(t) < K) selects them
// all, -1 padded. NULL: no boundary.
#ifndef DSA_KERNEL_H
#define DSA_KERNEL_H

#include "tape.h"

#define DSA_TILE 64         // query rows per block of the indexer kernel
#define DSA_KEY_BLOCK 256   // keys per product of the indexer's forward (its scratch stays in cache)

// (Scores are named Isc in code: I is a macro of <complex.h>, which cblas.h pulls in.)

// qI: (B, T, HI*dI) (after RoPE), kI: (B, T, dI) (after RoPE, shared by the
// index heads), w: (B, T, HI) -> I (B, T, T), I[b,t,s] = 0 for s > t.
Tensor *op_dsa_index_scores(Tape *tp, Tensor *qI, Tensor *kI, Tensor *w, int index_heads, const int *doc_start);

// sel (B, T, K) <- the top K positions of each row of I (B, T, T) among s <= t,
// ascending; -1 padding when t + 1 < K. Ties: the later position wins.
void dsa_topk(int *sel, const real *Isc, int B, int T, int K, const int *doc_start);
// The scores and the selection fused, tile by tile, without the (B, T, T)
// matrix (O(T) memory per thread); no autograd. Same values as
// dsa_topk(op_dsa_index_scores(qI, kI, w)).
void dsa_index_select(int *sel, const real *qI, const real *kI, const real *w, int B, int T, int HI, int dI,
                      int K, const int *doc_start);
// Prefill after cached keys (attn_dsa's windows, no autograd): the T0
// queries of a window at slots pos .. pos+T0-1 of a decode cache, whose
// indexer keys kIc (B, max_T, dI) hold slots key0[b] .. pos+T0-1 of row b
// (key0 NULL: 0), the window's own included. qI (B, T0, HI*dI), w (B, T0,
// HI) -> sel (B, T0, K): query t's top K among slots key0[b] .. pos+t, as
// cache slots, ascending, -1 padded. Scores as dsa_index_select's.
void dsa_prefix_select(int *sel, const real *qI, const real *w, const real *kIc, int B, int max_T, int pos, int T0,
                       const int *key0, int HI, int dI, int K);
// One row: row (K) <- the top K of scores[0..n), ascending, -1 padded when n < K.
// work: scratch of DSA_TOPK_WORK(n) bytes. O(n): a bound on the K-th largest
// leaves a few candidates, a bitwise search for the K-th among those.
#define DSA_TOPK_WORK(n) ((size_t)(n) * (sizeof(int) + sizeof(real)))
void dsa_topk_row(int *row, const real *scores, int n, int K, void *work);
// The same among positions lo .. n-1 of scores (a row's own document), the
// selected positions counted from 0 (scores[0]); work: DSA_TOPK_WORK(n - lo).
void dsa_topk_from(int *row, const real *scores, int lo, int n, int K, void *work);
// The readable reference: a min-heap of K over all n positions, then a sort.
void dsa_topk_row_ref(int *row, const real *scores, int n, int K);

// Causal softmax attention restricted to sel (B, T, K) (copied, on a GPU
// tape from device or host memory; every row must hold at least one
// position, all <= t). q, k (B, T, H*dk), v (B, T, H*dv)
// -> o (B, T, H*dv). Saves the per-row log-sum-exp (B, H, T) only.
Tensor *op_sparse_attention(Tape *tp, Tensor *q, Tensor *k, Tensor *v, const int *sel, int K, int n_heads,
                            double scale);

// Decoding: one query per sequence over the cached positions in sel (B, K)
// (-1 padded). q: (B, H*dk); kc, vc: (B, max_T, H*dk / H*dv); o: (B, H*dv).
// The same arithmetic as op_sparse_attention's forward row.
void dsa_sparse_decode(real *o, const real *q, const real *kc, const real *vc, int B, int max_T, const int *sel,
                       int K, int H, int dk, int dv, double scale);

// Decoding: one query's indexer scores over n cached keys.
// qI (HI*dI), w (HI), kI: (n, dI) rows ld apart -> scores (n).
void dsa_index_row(real *scores, const real *qI, const real *w, const real *kI, int64_t ld, int n, int HI, int dI);

// Head-averaged dense attention, the distillation target (no autograd):
// p (B, T, T) = (1/H) sum_h softmax_{s<=t}(scale q_t^h . k_s^h), 0 for s > t.
// q, k: (B, T, H*dk) as the attention sees them (after RoPE).
void dsa_attn_target(real *p, const real *q, const real *k, int B, int T, int H, int dk, double scale,
                     const int *doc_start);

// The distillation loss: mean over the B*T rows of
// KL(p_t || softmax_{s<=t}(I_t)) = sum_{s<=t} p_ts (log p_ts - log softmax(I_t)_s).
// I (B, T, T) takes the gradient; p (B, T, T) is a constant target (built in
// no-grad mode; rows sum to 1). Returns (1).
Tensor *op_dsa_kl(Tape *tp, Tensor *Isc, Tensor *p, const int *doc_start);

// mean_t sum_{s in Sel_t} p_ts: the attention mass the selection keeps.
double dsa_selected_mass(const real *p, const int *sel, int B, int T, int K);

#endif
