// dsa_sparse.c: causal softmax attention over selected positions (the
// DeepSeek sparse attention of MODEL.md `attn_dsa`), O(T K d).
//
// Per batch b, head h, query t with selection Sel_t (K positions, -1 = none):
//   forward:  a_s = scale q_t . k_s (s in Sel_t);  lse_t = logsumexp(a);
//             o_t = sum_s exp(a_s - lse_t) v_s
//   backward: P_s = exp(a_s - lse_t) recomputed;  D_t = do_t . o_t
//             dv_s += P_s do_t;  dS_s = P_s (do_t . v_s - D_t)
//             dq_t += scale sum_s dS_s k_s;  dk_s += scale dS_s q_t
// The forward runs one task per (b, t), writing row t only; the backward
// one task per (b, h), visiting t in order, because dk_s and dv_s gather
// contributions from many queries (deterministic, no atomics). Saved: the
// lse (B, H, T) and the selection.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "dsa_kernel.h"

// Sums in double; `omp simd` lets the compiler vectorise the reduction
// (a fixed order for a given build, so results stay deterministic).
static inline double dot(const real *a, const real *b, int n) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

// One query, one head, over the positions of sel (K, -1 padded): ot (dv) and
// the row's log-sum-exp. kh, vh: the head's column base of position 0, rows
// ldk / ldv apart (a (T, H*d) activation or a (max_T, H*d) cache).
// Scratch: a (K), acc (dv).
static double sparse_row(real *ot, const real *qt, const real *kh, const real *vh, int64_t ldk, int64_t ldv,
                         const int *sel, int K, int dk, int dv, double scale, double *a, double *acc) {
    double mx = -INFINITY;
    for (int j = 0; j < K && sel[j] >= 0; j++) {
        a[j] = scale * dot(qt, kh + sel[j] * ldk, dk);
        mx = fmax(mx, a[j]);
    }
    double sum = 0;
    memset(acc, 0, (size_t)dv * sizeof(double));
    for (int j = 0; j < K && sel[j] >= 0; j++) {
        double pj = exp(a[j] - mx);
        sum += pj;
        const real *vs = vh + sel[j] * ldv;
        for (int i = 0; i < dv; i++) acc[i] += pj * vs[i];
    }
    for (int i = 0; i < dv; i++) ot[i] = (real)(acc[i] / sum);
    return mx + log(sum);
}

// iarg: 0 B, 1 T, 2 H, 3 dk, 4 dv, 5 K; farg[0] scale; aux: sel (B, T, K); saved: lse (B, H, T).
static void sparse_forward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], H = n->iarg[2], dk = n->iarg[3], dv = n->iarg[4], K = n->iarg[5];
    double scale = n->farg[0];
    const int *sel = n->aux;
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    real *o = n->out[0]->data, *lse = n->saved;
    size_t stride;   // per thread: a (K) scores, then weights; acc (dv)
    unsigned char *slots = tape_thread_slots(n->tape, ((size_t)K + dv) * sizeof(double), &stride);
#pragma omp parallel
    {
        double *a = (double *)(slots + stride * (size_t)omp_get_thread_num()), *acc = a + K;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    int64_t row = (int64_t)b * T + t;
                    double L = sparse_row(o + row * H * dv + h * dv, q + row * H * dk + h * dk,
                                          k + (int64_t)b * T * H * dk + h * dk, v + (int64_t)b * T * H * dv + h * dv,
                                          H * dk, H * dv, sel + row * K, K, dk, dv, scale, a, acc);
                    if (lse) lse[((int64_t)b * H + h) * T + t] = (real)L;
                }
    }
}

void dsa_sparse_decode(real *o, const real *q, const real *kc, const real *vc, int B, int max_T, const int *sel,
                       int K, int H, int dk, int dv, double scale) {
    double *a = xmalloc((size_t)K * sizeof(double)), *acc = xmalloc((size_t)dv * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            sparse_row(o + (int64_t)b * H * dv + h * dv, q + (int64_t)b * H * dk + h * dk,
                       kc + (int64_t)b * max_T * H * dk + h * dk, vc + (int64_t)b * max_T * H * dv + h * dv, H * dk,
                       H * dv, sel + (int64_t)b * K, K, dk, dv, scale, a, acc);
    free(a);
    free(acc);
}

static void sparse_backward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], H = n->iarg[2], dk = n->iarg[3], dv = n->iarg[4], K = n->iarg[5];
    double scale = n->farg[0];
    real *gq = NODE_GRAD_IN(n, 0), *gk = NODE_GRAD_IN(n, 1), *gv = NODE_GRAD_IN(n, 2);
    if (!gq && !gk && !gv) return;
    const int *sel = n->aux;
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    const real *o = n->out[0]->data, *dO = n->out[0]->grad, *lse = n->saved;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const int *St = sel + ((int64_t)b * T + t) * K;
                int64_t qo = ((int64_t)b * T + t) * H * dk + h * dk, vo = ((int64_t)b * T + t) * H * dv + h * dv;
                const real *qt = q + qo, *dOt = dO + vo;
                double D = dot(dOt, o + vo, dv), L = lse[((int64_t)b * H + h) * T + t];
                for (int j = 0; j < K && St[j] >= 0; j++) {
                    int64_t ks = ((int64_t)b * T + St[j]) * H * dk + h * dk;
                    int64_t vs = ((int64_t)b * T + St[j]) * H * dv + h * dv;
                    double P = exp(scale * dot(qt, k + ks, dk) - L);
                    if (gv)
                        for (int i = 0; i < dv; i++) gv[vs + i] += (real)(P * dOt[i]);
                    if (!gq && !gk) continue;
                    double dS = scale * P * (dot(dOt, v + vs, dv) - D);
                    if (gq)
                        for (int i = 0; i < dk; i++) gq[qo + i] += (real)(dS * k[ks + i]);
                    if (gk)
                        for (int i = 0; i < dk; i++) gk[ks + i] += (real)(dS * qt[i]);
                }
            }
}

static const OpDef OP_SPARSE_ATTENTION = {"sparse_attention", sparse_forward, sparse_backward};

Tensor *op_sparse_attention(Tape *tp, Tensor *q, Tensor *k, Tensor *v, const int *sel, int K, int n_heads,
                            double scale) {
    ASSERT(q->ndim == 3 && tensor_same_shape(q, k) && v->ndim == 3 && v->shape[0] == q->shape[0] &&
               v->shape[1] == q->shape[1],
           "sparse_attention: q %s, k %s, v %s must be (B, T, H*dk), (B, T, H*dk), (B, T, H*dv)", SHAPE(q),
           SHAPE(k), SHAPE(v));
    ASSERT(n_heads > 0 && q->shape[2] % n_heads == 0 && v->shape[2] % n_heads == 0,
           "sparse_attention: %d heads do not divide q %s / v %s", n_heads, SHAPE(q), SHAPE(v));
    ASSERT(K >= 1, "sparse_attention: K = %d", K);
    int B = q->shape[0], T = q->shape[1];
    int *s = tape_alloc(tp, (size_t)B * T * K * sizeof(int));
    memcpy(s, sel, (size_t)B * T * K * sizeof(int));
    for (int64_t r = 0; r < (int64_t)B * T; r++) {
        int t = (int)(r % T);
        ASSERT(s[r * K] >= 0, "sparse_attention: row (b %d, t %d) selects nothing", (int)(r / T), t);
        for (int j = 0; j < K && s[r * K + j] >= 0; j++)
            ASSERT(s[r * K + j] <= t, "sparse_attention: row (b %d, t %d) selects the future position %d",
                   (int)(r / T), t, s[r * K + j]);
    }
    Tensor *o = tape_tensorv(tp, 3, B, T, v->shape[2]);
    Node *n = tape_op(tp, &OP_SPARSE_ATTENTION, (Tensor *[]){q, k, v}, 3, &o, 1);
    n->iarg[0] = B;
    n->iarg[1] = T;
    n->iarg[2] = n_heads;
    n->iarg[3] = q->shape[2] / n_heads;
    n->iarg[4] = v->shape[2] / n_heads;
    n->iarg[5] = K;
    n->farg[0] = scale;
    n->aux = s;
    if (n->recorded) n->saved = tape_alloc(tp, (size_t)B * n_heads * T * sizeof(real));
    sparse_forward(n);
    return o;
}
