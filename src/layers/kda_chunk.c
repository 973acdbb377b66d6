// kda_chunk.c: op_kda's builder.
#include "docs.h"
#include "kda_kernel.h"

KdaDims kda_dims(const Node *n) {
    KdaDims d;
    d.B = n->iarg[KDA_ARG_B];
    d.T = n->iarg[KDA_ARG_T];
    d.H = n->iarg[KDA_ARG_H];
    d.dk = n->iarg[KDA_ARG_DK];
    d.dv = n->iarg[KDA_ARG_DV];
    d.C = n->iarg[KDA_ARG_C];
    d.NC = (d.T + d.C - 1) / d.C;
    d.ldk = d.H * d.dk;
    d.ldv = d.H * d.dv;
    return d;
}

// The GPU runs the recurrence for both forms (the same math) until a chunked
// CUDA kernel exists.
static const OpDef OP_KDA_CHUNKED = {"kda_chunked", kda_naive_forward, kda_naive_backward,
                                     CUDA_PAIR(cu_kda_naive_forward, cu_kda_naive_backward)};
static const OpDef OP_KDA_RECURRENT = {"kda_recurrent", kda_naive_forward, kda_naive_backward,
                                       CUDA_PAIR(cu_kda_naive_forward, cu_kda_naive_backward)};

Tensor *op_kda(Tape *tp, Tensor *q, Tensor *k, Tensor *v, Tensor *beta, Tensor *g, Tensor *s0,
               const int *doc_start, int n_heads, MixerForm form, int chunk, Tensor **s_out) {
    ASSERT(form == MIXER_FORM_CHUNKED || form == MIXER_FORM_RECURRENT,
           "kda: form '%s' is not available (chunked or recurrent)", mixer_form_name(form));
    ASSERT(chunk > 0, "kda: chunk %d must be positive", chunk);
    ASSERT(q->ndim == 3 && n_heads > 0 && q->shape[2] % n_heads == 0,
           "kda: q %s must be (B, T, H*dk) with H = %d", SHAPE(q), n_heads);
    int B = q->shape[0], T = q->shape[1], H = n_heads, dk = q->shape[2] / H;
    ASSERT(B > 0 && T > 0 && dk > 0, "kda: q %s is empty", SHAPE(q));
    ASSERT(tensor_same_shape(k, q), "kda: k %s must have q's shape %s", SHAPE(k), SHAPE(q));
    ASSERT(v->ndim == 3 && v->shape[0] == B && v->shape[1] == T && v->shape[2] % H == 0 && v->shape[2] > 0,
           "kda: v %s must be (B, T, H*dv) = (%d, %d, %d*dv)", SHAPE(v), B, T, H);
    int dv = v->shape[2] / H;
    ASSERT(beta->ndim == 3 && beta->shape[0] == B && beta->shape[1] == T && beta->shape[2] == H,
           "kda: beta %s must be (B, T, H) = (%d, %d, %d)", SHAPE(beta), B, T, H);
    ASSERT(tensor_same_shape(g, q), "kda: g %s must be (B, T, H*dk) like q %s", SHAPE(g), SHAPE(q));
    if (s0)
        ASSERT(s0->ndim == 4 && s0->shape[0] == B && s0->shape[1] == H && s0->shape[2] == dk && s0->shape[3] == dv,
               "kda: s0 %s must be (B, H, dk, dv) = (%d, %d, %d, %d)", SHAPE(s0), B, H, dk, dv);
    Tensor *o = tape_tensorv(tp, 3, B, T, H * dv);
    Tensor *sT = tape_tensorv(tp, 4, B, H, dk, dv);
    const OpDef *op = form == MIXER_FORM_CHUNKED ? &OP_KDA_CHUNKED : &OP_KDA_RECURRENT;
    Node *n = tape_op(tp, op, (Tensor *[]){q, k, v, beta, g, s0}, KDA_N_IN, (Tensor *[]){o, sT}, 2);
    n->iarg[KDA_ARG_B] = B;
    n->iarg[KDA_ARG_T] = T;
    n->iarg[KDA_ARG_H] = H;
    n->iarg[KDA_ARG_DK] = dk;
    n->iarg[KDA_ARG_DV] = dv;
    n->iarg[KDA_ARG_C] = chunk;
    n->aux = docs_first(tp, doc_start, B, T);
    if (n->recorded) {
        KdaDims d = kda_dims(n);
        n->saved = tape_dalloc(tp, (size_t)B * H * d.NC * dk * dv * sizeof(real));   // read by the kernels
    }
    tape_forward(n);
    if (s_out) *s_out = sT;
    return o;
}
