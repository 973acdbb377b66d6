// gdp.c: op_gdp, Gated DeltaProduct as Gated DeltaNet over an interleaved
// sequence (MODEL.md, section `gdp`; gdn_kernel.h).
//
// Token t's n steps become n consecutive positions t*n + j of a sequence n
// times longer: k, v and beta of step j there, the log decay g_t at j = 0 and
// 0 (no decay) at the others, a document start at j = 0 only, q zero except
// at j = n-1. op_gdn's recurrence over these positions is the product of the
// n delta steps after one decay, and its output at t*n + n-1 is o_t; the
// outputs of the other positions are dropped (their q is zero: they read
// nothing, and no gradient comes back through them).
//
// The layouts make the interleaving a reshape: a (B, T, n*X) row-major tensor
// whose row t holds the n blocks of X is already (B, T*n, X) with block j at
// position t*n + j. Only q and g, which have one block per token, are padded
// with zeros first.
#include <limits.h>

#include "gdn_kernel.h"

Tensor *op_gdp(Tape *tp, Tensor *q, Tensor *k, Tensor *v, Tensor *beta, Tensor *g, Tensor *s0, const int *doc_start,
               int n_heads, int steps, MixerForm form, int chunk, Tensor **s_out) {
    int n = steps, H = n_heads;
    ASSERT(n >= 1 && n <= GDP_MAX_STEPS, "gdp: %d steps per token (1 to %d)", n, GDP_MAX_STEPS);
    ASSERT(q->ndim == 3 && H > 0 && q->shape[2] % H == 0 && q->shape[2] > 0,
           "gdp: q %s must be (B, T, H*dk) with H = %d", SHAPE(q), H);
    int B = q->shape[0], T = q->shape[1], Hk = q->shape[2];
    ASSERT(k->ndim == 3 && k->shape[0] == B && k->shape[1] == T && k->shape[2] == n * Hk,
           "gdp: k %s must be (B, T, n*H*dk) = (%d, %d, %d)", SHAPE(k), B, T, n * Hk);
    ASSERT(v->ndim == 3 && v->shape[0] == B && v->shape[1] == T && v->shape[2] % (n * H) == 0 && v->shape[2] > 0,
           "gdp: v %s must be (B, T, n*H*dv) = (%d, %d, %d*%d*dv)", SHAPE(v), B, T, n, H);
    int Hv = v->shape[2] / n;
    ASSERT(beta->ndim == 3 && beta->shape[0] == B && beta->shape[1] == T && beta->shape[2] == n * H,
           "gdp: beta %s must be (B, T, n*H) = (%d, %d, %d)", SHAPE(beta), B, T, n * H);
    ASSERT(g->ndim == 3 && g->shape[0] == B && g->shape[1] == T && g->shape[2] == H,
           "gdp: g %s must be (B, T, H) = (%d, %d, %d)", SHAPE(g), B, T, H);
    ASSERT((int64_t)T * n <= INT_MAX, "gdp: %d tokens of %d steps is more than %d positions", T, n, INT_MAX);
    int Tn = T * n;
    Tensor *qi = q, *gi = g;
    if (n > 1) {
        Tensor *zq = tape_tensor_zeros(tp, 3, (int[]){B, T, (n - 1) * Hk});
        Tensor *zg = tape_tensor_zeros(tp, 3, (int[]){B, T, (n - 1) * H});
        qi = op_concat(tp, (Tensor *[]){zq, q}, 2, 2);   // q at the last step
        gi = op_concat(tp, (Tensor *[]){g, zg}, 2, 2);   // the decay at the first
    }
    qi = op_reshape(tp, qi, 3, (int[]){B, Tn, Hk});
    gi = op_reshape(tp, gi, 3, (int[]){B, Tn, H});
    Tensor *ki = op_reshape(tp, k, 3, (int[]){B, Tn, Hk});
    Tensor *vi = op_reshape(tp, v, 3, (int[]){B, Tn, Hv});
    Tensor *bi = op_reshape(tp, beta, 3, (int[]){B, Tn, H});
    int *flags = NULL;   // a document starts at its first token's first step
    if (doc_start) {
        flags = tape_alloc(tp, (size_t)B * Tn * sizeof(int));
        for (int64_t r = 0; r < (int64_t)B * T; r++)
            for (int j = 0; j < n; j++) flags[r * n + j] = j == 0 ? doc_start[r] : 0;
    }
    Tensor *o = op_gdn(tp, qi, ki, vi, bi, gi, s0, flags, H, form, chunk, s_out);
    o = op_reshape(tp, o, 3, (int[]){B, T, n * Hv});
    return op_slice(tp, o, 2, (n - 1) * Hv, Hv);
}
