// gdn_kernel.h: the Gated DeltaNet mixing op, one fused node with a
// hand-written backward (MODEL.md, section `gdn`).
//
// Per batch element b and head h, with q_t, k_t (dk), v_t (dv), beta_t in
// (0, 1), g_t <= 0 (log decay, gamma_t = exp(g_t)) and S (dk x dv):
//
//   S_t   = gamma_t S_{t-1} + k_t delta_t^T,
//   delta_t = beta_t (v_t - gamma_t S_{t-1}^T k_t),     o_t = S_t^T q_t.
//
// Two forms compute it:
//  - MIXER_FORM_RECURRENT (gdn_naive.c): the line above, token by token,
//    O(dk dv) per token; its backward is the reverse-time recurrence. This is
//    the readable reference.
//  - MIXER_FORM_CHUNKED (gdn_chunk.c, gdn_chunk_backward.c): the WY form per
//    chunk of C positions, all matrix products plus one triangular solve.
//
// Both keep only the states entering each chunk of `chunk` positions for the
// backward (the recurrent form replays a chunk forward before reversing it).
//
// Documents (docs.h): at a position where a document begins the state
// restarts, S_t = k_t delta_t^T with delta_t = beta_t v_t (as if gamma_t = 0:
// the recurrent form sets exactly that). In the WY form of a chunk, with
// db[i] the chunk position where row i's document begins (-1: before the
// chunk), gamma_i S_{i-1} = m_i b_i S0 + sum_{db[i] <= j < i} E_ij k_j delta_j^T,
// m_i = [db[i] < 0], so the chunk equations hold with
//   E_ij = exp(Gamma_i - Gamma_j) for db[i] <= j <= i, else 0   (A and P masked)
//   b_i  -> m_i b_i in the terms through S0 (W, O's first term)
//   S_C  = m_{L-1} b_{L-1} S0 + sum_{j >= db[L-1]} exp(Gamma_{L-1} - Gamma_j) k_j delta_j^T.
// The masked factors are zeros, their exp never taken.

#ifndef GDN_KERNEL_H
#define GDN_KERNEL_H

#include <math.h>

#include "ops_math.h"
#include "tile_mm_bf16.h"

#include "gdn_node.h"
#include "mixer.h"

// q, k: (B, T, H*dk), L2-normalised per head, q already scaled by 1/sqrt(dk).
// v: (B, T, H*dv). beta: (B, T, H) in (0, 1). g: (B, T, H), <= 0.
// s0: (B, H, dk, dv) or NULL (zeros). doc_start: (B, T) or NULL (docs.h).
// Returns o (B, T, H*dv); when s_out is
// non-NULL it receives the final state (B, H, dk, dv), the node's second
// output, through which a gradient may flow back. chunk: C of the chunked
// form (T need not be a multiple of it), the checkpoint interval of the
// recurrent one. Gradients reach q, k, v, beta, g and s0.
Tensor *op_gdn(Tape *tp, Tensor *q, Tensor *k, Tensor *v, Tensor *beta, Tensor *g, Tensor *s0, const int *doc_start,
               int n_heads, MixerForm form, int chunk, Tensor **s_out);

// Gated DeltaProduct (gdp.c; MODEL.md, section `gdp`): n = steps delta-rule
// steps per token, the decay once per token, the output after the last step:
//   S' = gamma_t S_{t-1};  S' = S' + k_tj beta_tj (v_tj - S'^T k_tj)^T, j = 0..n-1;
//   S_t = S',  o_t = S_t^T q_t.
// q: (B, T, H*dk) as op_gdn's; k: (B, T, n*H*dk), v: (B, T, n*H*dv),
// beta: (B, T, n*H), step j of token t in the j-th block of its row; g:
// (B, T, H). Computed by op_gdn over the interleaved sequence of T*n
// positions (position t*n + j is step j of token t), so every form, the
// documents, the states and the devices are op_gdn's. Gradients reach q, k,
// v, beta, g and s0.
Tensor *op_gdp(Tape *tp, Tensor *q, Tensor *k, Tensor *v, Tensor *beta, Tensor *g, Tensor *s0, const int *doc_start,
               int n_heads, int steps, MixerForm form, int chunk, Tensor **s_out);

// ---- the builder op_gdn and op_kda share (gdn_chunk.c) ----

// Their nodes have one layout (gdn_node.h; kda_node.h asserts that its enums
// are gdn_node.h's):
// inputs q, k, v, beta, g, s0, outputs o and S_T, the sizes in iarg, the
// documents' first positions in aux, the state entering each chunk saved.
// Only g's width differs: H (one decay per head) or H*dk (one per key
// channel).
typedef struct DeltaRuleOp {
    const char *name;              // the messages' prefix
    const OpDef *chunked, *recurrent;
    bool g_per_channel;            // g (B, T, H*dk), else (B, T, H)
    bool bf16_products;            // its CPU chunk products may run in bf16 (GDN_ARG_BF16)
} DeltaRuleOp;

// Checks the shapes (each error names op->name), makes the node of `form`
// and runs its forward; returns o, and S_T into s_out when non-NULL.
Tensor *delta_rule_op(Tape *tp, const DeltaRuleOp *op, Tensor *q, Tensor *k, Tensor *v, Tensor *beta, Tensor *g,
                      Tensor *s0, const int *doc_start, int n_heads, MixerForm form, int chunk, Tensor **s_out);

// ---- internal: shared by gdn_chunk.c, gdn_chunk_backward.c, gdn_naive.c ----

// Node layout of op_gdn: gdn_node.h.

// The shapes of one op_gdn node and where head (b, h) starts in each array.
typedef struct GdnDims {
    int B, T, H, dk, dv, C, NC;
    int ldk, ldv;              // H*dk, H*dv: the stride between positions
} GdnDims;

GdnDims gdn_dims(const Node *n);
static inline int64_t gdn_off_k(const GdnDims *d, int b, int t, int h) {
    return ((int64_t)b * d->T + t) * d->ldk + (int64_t)h * d->dk;
}
static inline int64_t gdn_off_v(const GdnDims *d, int b, int t, int h) {
    return ((int64_t)b * d->T + t) * d->ldv + (int64_t)h * d->dv;
}
static inline int64_t gdn_off_h(const GdnDims *d, int b, int t, int h) {   // beta, g
    return ((int64_t)b * d->T + t) * d->H + h;
}
static inline int64_t gdn_off_s(const GdnDims *d, int b, int h) {          // s0, S_T
    return ((int64_t)b * d->H + h) * d->dk * d->dv;
}

// The documents of the chunk [t0, t0+L) of row b: db (L) as in the header
// comment; returns db, or NULL when first is NULL (no boundary).
static inline const int *gdn_chunk_docs(int *db, const int *first, const GdnDims *d, int b, int t0, int L) {
    if (!first) return NULL;
    const int *f = first + (int64_t)b * d->T + t0;
    for (int i = 0; i < L; i++) db[i] = f[i] >= t0 ? f[i] - t0 : -1;
    return db;
}

// The chunk workspaces' carving (gdn_chunk.c, gdn_chunk_backward.c): the
// next n elements of `type` at byte offset *at of mem, each array on a
// 64-byte boundary; NULL when mem is NULL (only the bytes are counted).
static inline void *gdn_carve(unsigned char *mem, size_t *at, size_t n, size_t size) {
    void *p = mem ? mem + *at : NULL;
    *at += (n * size + 63) & ~(size_t)63;
    return p;
}

// Everything the WY form computes inside one chunk of L <= C positions
// before its outputs, recomputed by the backward. All row-major, per head.
typedef struct GdnChunk {
    int L, dk, dv;
    double *G;       // (L) Gamma_i = sum_{j<=i} g_j inside the chunk
    real *E;         // (L, L) exp(Gamma_i - Gamma_j) for j <= i, 0 above
    real *KK;        // (L, L) K K^T on and below the diagonal (above: unspecified)
    real *A;         // (L, L) beta_i E_ij KK_ij for j < i, else 0
    real *Tm;        // (L, ldt) (I + A)^-1, unit lower-triangular; rows of whole vectors
    int ldt;         // Tm's row stride: C rounded up to whole vectors (tile_mm.h)
    real *Xw;        // (L, dk) diag(beta * b) K,  b_i = exp(Gamma_i)
    real *R;         // (L, dv) Xu - Xw S0, Xu = diag(beta) V
    real *Dl;        // (L, dv) Delta = Tm R (= U - W S0 with W = Tm Xw, U = Tm Xu)
    real *P;         // (L, L) (Q K^T) * E, lower with the diagonal
    real *Kd;        // (L, dk) diag(ek) K: the rows that reach S_C
    real *bet;       // (L) beta of the chunk, contiguous
    real *bm;        // (L) m_i b_i: exp(Gamma_i), 0 for rows that do not read S0 (documents)
    real *ek;        // (L) exp(Gamma_{L-1} - Gamma_j), 0 before the chunk's last document
    real bl;         // m_{L-1} b_{L-1}: the factor of S0 in S_C
    int *db;         // (C) the chunk's documents (gdn_chunk_docs)
    real *pack;      // (m, m), m = max(C, dk, dv): K^T in gdn_chunk_prepare, then a transposed operand of tile_gemm
    // Its products: bf16 (pairs (m, (m + 1) / 2) each) or float32. tc.bf16 is set by the caller from the node
    // (GDN_ARG_BF16: chunk_tiles_kind when it was built, tile_amx.h); what stays float32: gdn_chunk.c's header.
    TileCtx tc;
} GdnChunk;

// Workspace of one chunk: gdn_chunk_bytes of memory (64-byte aligned; the
// size is a multiple of 64), bound to ws. The kernels take one slot per OpenMP thread from the tape's arena
// (tape_thread_slots), so a training step does no malloc.
size_t gdn_chunk_bytes(int C, int dk, int dv);
void gdn_chunk_bind(GdnChunk *ws, void *mem, int C, int dk, int dv);
// Fill ws for the chunk of L positions whose first rows are q, k (stride
// ldk), v (stride ldv), beta, g (stride H), entering state S0 (dk x dv);
// db (L): its documents (gdn_chunk_docs), or NULL.
void gdn_chunk_prepare(GdnChunk *ws, int L, const real *q, const real *k, const real *v, const real *beta,
                       const real *g, int ldk, int ldv, int H, const real *S0, const int *db);

// The node functions of the two forms.
void gdn_chunk_forward(Node *n);
void gdn_chunk_backward(Node *n);
void gdn_naive_forward(Node *n);
void gdn_naive_backward(Node *n);

#endif
