// gla.h: the gated linear attention recurrence shared by `linear` and `mamba`,
// as one fused op with a hand-written backward in each of three forms.
//
// Per batch element b and head h (MODEL.md, "linear" and "mamba"):
//
//   S_t = γ_t S_{t-1} + β_t k_t v_tᵀ,   o_t = S_tᵀ q_t,   γ_t = exp(g_t)
//
// S_t is dk x dv, S_{-1} = s0 (zeros when NULL); `linear` has g = NULL (γ = 1)
// and β = 1, `mamba` passes g_t = -exp(A_log) dt_t and β_t = dt_t. Unrolled,
// with G_t = Σ_{j≤t} g_j:
//
//   o_t = Σ_{s≤t} exp(G_t − G_s) β_s (q_t·k_s) v_s + exp(G_t) s0ᵀ q_t
//
// Every decay factor is computed as exp of a non-positive difference of
// cumulative sums (never a ratio of exponentials), so g = 0 and g ≈ −20 per
// step are both exact and finite. g must be ≤ 0 for that guarantee.
//
// Forms (MixerForm):
//  - PARALLEL: the masked (T x T) product over the whole sequence,
//    O = ((Q K̃ᵀ) ⊙ M ⊙ [exp(G_i − G_j)]) V + diag(exp(G)) Q s0. O(T² d) time,
//    a T x T scratch matrix per thread.
//  - CHUNKED: chunks of `chunk` positions (T need not be a multiple); inside a
//    chunk the masked form with chunk-local cumulative sums, across chunks the
//    state. The forward keeps only the chunk-entry states; the backward visits
//    the chunks in reverse, recomputing inside each. (PARALLEL is exactly
//    CHUNKED with one chunk of T positions, and shares its kernels.)
//  - RECURRENT: token by token, O(dk·dv) per token: the readable reference
//    and the decoding form. Its forward keeps the state every `chunk` tokens;
//    its backward recomputes the states of one such segment at a time.
//
// Gradients flow to q, k, v, g, dt, s0 and in from both outputs.
//
// Documents (docs.h): at a position t where a document begins, the state
// restarts from zero, S_t = β_t k_t v_tᵀ (as if γ_t = 0), so that
//
//   o_t = Σ_{f≤s≤t} exp(G_t − G_s) β_s (q_t·k_s) v_s + [f < 0] exp(G_t) s0ᵀ q_t
//
// with f = first(t) the start of t's document (−1: it began before the
// window and reads s0), and the final state holds the last document only.
// The recurrent form sets γ_t = 0 at each start. The masked forms mask: in a
// chunk, row i reads rows j ≥ db[i] (gla_chunk_docs), the entering state only
// while db[i] < 0, and the state leaving the chunk collects the rows of its
// last document; the masked entries are set to zero, their exp never taken
// (every exp stays that of a non-positive difference inside one document).
// g at a document's first position multiplies nothing: its gradient is 0.
#ifndef GLA_H
#define GLA_H

#include "mixer.h"

// q, k: (B, T, H*dk); v: (B, T, H*dv); g: (B, T, H) per-step log decay (≤ 0)
// or NULL (no decay); s0: (B, H, dk, dv) or NULL (zeros); doc_start: (B, T)
// or NULL (docs.h). Returns o (B, T, H*dv);
// when s_out is non-NULL it receives the final state (B, H, dk, dv), a second
// output of the same node (a gradient seeded on it flows back).
Tensor *op_gla(Tape *tp, Tensor *q, Tensor *k, Tensor *v, Tensor *g, Tensor *s0, const int *doc_start, int n_heads,
               MixerForm form, int chunk, Tensor **s_out);

// As op_gla with a per-step scale of the write: S_t = γ_t S_{t-1} + dt_t k_t v_tᵀ.
// dt: (B, T, H) or NULL (= 1). Mamba's dt scaling of k, fused so that the
// caller needs no (B, T, H) -> (B, T, H*dk) broadcast.
Tensor *op_gla_dt(Tape *tp, Tensor *q, Tensor *k, Tensor *v, Tensor *g, Tensor *dt, Tensor *s0, const int *doc_start,
                  int n_heads, MixerForm form, int chunk, Tensor **s_out);

#endif
