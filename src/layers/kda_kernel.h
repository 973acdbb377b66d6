// kda_kernel.h: the mixing op of Kimi Delta Attention (docs/kda.md), one
// fused node with a hand-written backward.
//
// Per batch element b and head h, with q_t, k_t (dk), v_t (dv), beta_t in
// (0, 1), g_t in R^dk, g_t <= 0 (a log decay per key channel, alpha_t =
// exp(g_t)) and S (dk x dv, row i = key channel i):
//
//   S'    = Diag(alpha_t) S_{t-1},
//   delta_t = beta_t (v_t - S'^T k_t),   S_t = S' + k_t delta_t^T,   o_t = S_t^T q_t.
//
// This is Gated DeltaNet (gdn_kernel.h) with the scalar decay gamma_t
// replaced by the vector alpha_t: with g_t equal over the dk channels it is
// op_gdn. Two forms compute it:
//  - MIXER_FORM_RECURRENT (kda_naive.c): token by token, O(dk dv) per token;
//    its backward is the reverse-time recurrence. The readable reference.
//  - MIXER_FORM_CHUNKED (kda_chunk.c, kda_chunk_backward.c): the WY form per
//    chunk of C positions, with every decay factor the exp of a non-positive
//    number however negative g is (docs/kda.md, "Numerics").
// Both keep only the states entering each chunk of `chunk` positions for the
// backward. On the GPU the recurrent form is the recurrence
// (src/cuda/kda_naive.cu) both ways, the chunked form chunked kernels
// (src/cuda/kda_chunk.cu, kda_chunk_backward.cu).
//
// Documents (docs.h): at a position where a document begins alpha_t = 0 (the
// state before it is not read), as op_gdn does with gamma_t; a flag at t = 0
// means s0 is not read for that row.

#ifndef KDA_KERNEL_H
#define KDA_KERNEL_H

#include "gdn_kernel.h"
#include "kda_node.h"
#include "mixer.h"

// q, k: (B, T, H*dk), L2-normalised per head, q already scaled by 1/sqrt(dk).
// v: (B, T, H*dv). beta: (B, T, H) in (0, 1). g: (B, T, H*dk), <= 0 (log
// decay per key channel). s0: (B, H, dk, dv) or NULL (zeros). doc_start:
// (B, T) or NULL (docs.h). Returns o (B, T, H*dv); s_out (if non-NULL)
// receives the final state (B, H, dk, dv), the node's second output, through
// which a gradient may flow back. form: MIXER_FORM_CHUNKED or
// MIXER_FORM_RECURRENT; chunk: C of the chunked form, the checkpoint interval
// of the recurrent one (T need not be a multiple). Gradients reach q, k, v,
// beta, g and s0.
Tensor *op_kda(Tape *tp, Tensor *q, Tensor *k, Tensor *v, Tensor *beta, Tensor *g, Tensor *s0,
               const int *doc_start, int n_heads, MixerForm form, int chunk, Tensor **s_out);

// ---- internal: shared by kda_naive.c, kda_chunk.c, kda_chunk_backward.c ----

// The shapes of one op_kda node are op_gdn's, and so are the offsets of head
// (b, h) in each array (gdn_off_k for q, k and now g; gdn_off_v; gdn_off_h
// for beta; gdn_off_s for s0, S_T), and a chunk's documents (gdn_chunk_docs).
typedef GdnDims KdaDims;
KdaDims kda_dims(const Node *n);

// KDA_SUB and KDA_SPAN_MAX (the sub-blocks of the decayed products and the
// span bound of their reference-point route): kda_node.h, which the GPU's
// kernels read too.

// Everything the WY form computes inside one chunk of L <= C positions before
// its outputs, recomputed by the backward. All row-major, per head; m_i =
// [row i reads S0] (no document begins in the chunk at or before i); r(i) the
// first row of row i's sub-block.
typedef struct KdaChunk {
    int L, dk, dv;
    double *G;       // (L, dk) Gamma_i = sum_{j<=i} g_j inside the chunk, per channel
    real *eG;        // (L, dk) m_i exp(Gamma_i)
    real *ek;        // (L, dk) exp(Gamma_{L-1} - Gamma_j), 0 before the chunk's last document
    real *bl;        // (dk) m_{L-1} exp(Gamma_{L-1}): S0's factor in S_C
    real *bet;       // (L) beta of the chunk, contiguous
    real *Qg;        // (L, dk) eG * Q
    real *Xw;        // (L, dk) diag(beta) eG * K
    real *Kd;        // (L, dk) ek * K: the rows that reach S_C
    real *KKE;       // (L, L) sum_c k_ic k_jc exp(Gamma_ic - Gamma_jc), j < i in row i's document, else 0
    real *A;         // (L, L) diag(beta) KKE
    real *P;         // (L, L) sum_c q_ic k_jc exp(Gamma_ic - Gamma_jc), j <= i in row i's document, else 0
    real *R;         // (L, dv) diag(beta) V - Xw S0
    real *Dl;        // (L, dv) Delta = (I + A)^-1 R: the rows delta_i of the recurrence
    real *Ef;        // (L, dk) exp(Gamma_i - Gamma_r(i)) <= 1: the rows' factors to their reference point
    real *Qs, *Ks;   // (L, dk) each: Ef * Q, Ef * K
    real *Ec;        // (L, dk) one sub-block's column factors (kda_sub_columns)
    real *Ys;        // (L, dk) Ec * K
    real *T1, *T2;   // (2 KDA_SUB, dk), (L, dk): the backward's products before their scale
    real *keep;      // (dk) 1 for a channel through the reference point inside the sub-block, else 0
    int *slow;       // (dk) the other channels: one exp per element
    double *Gsub;    // (KDA_SUB, dk) Gamma of the sub-block's rows in those channels, packed
    real *qsub, *ksub;   // (KDA_SUB, dk) q, k of the same
    double *acc;     // (max(dk, dv)) one row's sums
    real *ex;        // (dk) one pair's decays (kda_pair_decays)
    int *db;         // (C) the chunk's documents (gdn_chunk_docs)
    const int *docs; // db when the chunk holds a document boundary, else NULL
    real *pack;      // (m, m), m = max(C, dk, dv): a transposed operand of tile_gemm
    TileCtx tc;      // the products that may be bf16 (kda_chunk.c's header): the node's KDA_ARG_BF16
} KdaChunk;

// Workspace of one chunk: kda_chunk_bytes of memory (64-byte aligned; a
// multiple of 64), bound to ws (its products float32: ws->tc.bf16 false
// until the caller sets the node's kind, kda_chunk_tiles). One slot per
// OpenMP thread from the tape's arena (tape_thread_slots).
size_t kda_chunk_bytes(int C, int dk, int dv);
void kda_chunk_bind(KdaChunk *ws, void *mem, int C, int dk, int dv);
// The node's kind of products (KDA_ARG_BF16) into ws->tc, the AMX tiles
// configured on this thread when it is AMX (kda_chunk_tiles_end releases
// them): once per head, as gdn_chunk.c does.
void kda_chunk_tiles(KdaChunk *ws, const Node *n);
void kda_chunk_tiles_end(KdaChunk *ws);
// Fill ws for the chunk of L positions whose first rows are q, k, g (stride
// ldk), v (stride ldv), beta (stride H), entering state S0 (dk x dv); db (L):
// its documents (gdn_chunk_docs), or NULL.
void kda_chunk_prepare(KdaChunk *ws, int L, const real *q, const real *k, const real *v, const real *beta,
                       const real *g, int ldk, int ldv, int H, const real *S0, const int *db);
// The column operands of the sub-block of rows i0 .. i0+n-1 (after
// kda_chunk_prepare has set G): decides which channels go through its
// reference point r = i0 inside it (span <= KDA_SPAN_MAX: keep[c] = 1) and
// lists the others in slow; ws->Ec (i0+n, dk) = exp(Gamma_r - Gamma_j) (j < r:
// every channel, exponent <= 0; r <= j: the kept channels, exponent in [0,
// span], else 0), ws->Ys = Ec * K. Returns the number of slow channels.
int kda_sub_columns(KdaChunk *ws, const real *k, int ldk, int i0, int n);
// The slow channels (ws->slow, ns of them) of the sub-block's rows packed
// contiguously: Gsub (n, ns) of Gamma, qsub, ksub of q, k.
void kda_sub_pack(KdaChunk *ws, const real *q, const real *k, int ldk, int i0, int n, int ns);
// Rows i0 .. i0+n-1 of KKE and P (kda_chunk_prepare calls it for every
// sub-block, after the row factors Ef, Qs, Ks): per kept channel the tile
// products Qs Ys^T and Ks Ys^T, per slow channel an exp per element inside
// the sub-block; then masked (strictly lower for KKE, lower for P, row i's
// document). Returns the number of slow channels (0: the products alone).
int kda_sub_products(KdaChunk *ws, const real *q, const real *k, int ldk, int i0, int n);

// ex (dk) = exp(Gi - Gj) per channel (the decays of one pair inside a
// sub-block, Gi - Gj <= 0): a loop of its own, so that it vectorises (the
// exp inlined in the dot product that uses it kept both scalar).
static inline void kda_pair_decays(real *restrict ex, const double *restrict Gi, const double *restrict Gj, int dk) {
#pragma omp simd
    for (int c = 0; c < dk; c++) ex[c] = r_exp_decay(Gi[c] - Gj[c]);
}

// The node functions of the two forms.
void kda_chunk_forward(Node *n);
void kda_chunk_backward(Node *n);
void kda_naive_forward(Node *n);
void kda_naive_backward(Node *n);

#endif
