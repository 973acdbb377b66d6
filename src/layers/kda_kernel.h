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
// backward. On the GPU both forms run the recurrence (src/cuda/kda_naive.cu)
// until a chunked CUDA kernel exists.
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

// The node functions of the two forms.
void kda_naive_forward(Node *n);
void kda_naive_backward(Node *n);

#endif
