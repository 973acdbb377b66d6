// dsa_sel_kl.h: the indexer's loss in the sparse training stage (MODEL.md
// `attn_dsa`; DeepSeek-V3.2's second stage): the KL restricted to the
// selected positions.
//
// Per query t with selection Sel_t (K positions, -1 padded):
//   target   p_t,j = (1/H) sum_h softmax_{s in Sel_t}(scale q_t^h . k_s^h)     the sparse
//            attention the main model runs, head-averaged (a constant)
//   indexer  I_t,j = sum_i w_t,i ReLU(qI_t,i . kI_s) / sqrt(d_I),  s = Sel_t[j]
//   loss     mean over the B*T queries of KL(p_t || softmax_{j}(I_t,j))
// O(B T K (H_I d_I)) time and O(B T K) memory: the (B, T, T) score matrix of
// the dense distillation (op_dsa_kl) is never formed. With K >= T every
// position is selected and the loss equals op_dsa_kl's (tested).
#ifndef DSA_SEL_KL_H
#define DSA_SEL_KL_H

#include "tape.h"

#ifdef __cplusplus
extern "C" {
#endif

// p (B, T, K) <- the head-averaged attention over each row's selection sel
// (B, T, K); 0 at -1 entries. q, k: (B, T, H*dk) after RoPE. No autograd.
void dsa_sparse_target(real *p, const real *q, const real *k, const int *sel, int B, int T, int K, int H, int dk,
                       double scale);

// The op's saved state (the GPU twin reads it too): arrays in the tape's
// device memory.
typedef struct SelKlSaved {
    int *sel;    // (B, T, K)
    real *Isc;   // (B, T, K) the indexer scores at the selected positions
    real *lse;   // (B, T)
} SelKlSaved;

// The loss above. qI (B, T, HI*dI), kI (B, T, dI), w (B, T, HI) take
// gradients; sel (B, T, K) is copied (on a GPU tape from device memory, as
// cu_dsa_index_select's selection, or from host memory; there a bad row
// stops the kernel); p (B, T, K) is a constant target (rows
// sum to 1 over the valid entries). Returns (1).
Tensor *op_dsa_sel_kl(Tape *tp, Tensor *qI, Tensor *kI, Tensor *w, const int *sel, int K, Tensor *p,
                      int index_heads);

#ifdef __cplusplus
}
#endif
#endif
