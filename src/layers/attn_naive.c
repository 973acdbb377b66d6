// attn_naive.c: the readable reference for op_attention (attn_flash.c).
//
// Plain loops, sums in double, the full probability matrix P (B, H, T, T)
// saved for the backward. O(T^2) memory: for tests only.
//
//   forward:  P_ts = exp(scale q_t.k_s - max) / sum   (s <= t, else 0)
//             o_t  = sum_s P_ts v_s
//   backward: dv_s += sum_t P_ts do_t
//             dP_ts = do_t . v_s
//             dS_ts = P_ts (dP_ts - sum_s' P_ts' dP_ts')      (softmax backward)
//             dq_t += scale sum_s dS_ts k_s,   dk_s += scale sum_t dS_ts q_t
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernel.h"
#include "cuda_ops.h"

// iarg: 0 B, 1 T, 2 H, 3 dk, 4 dv; farg[0] scale; aux: the mask (B, T, T) or
// NULL; saved: P (B, H, T, T).
static void naive_forward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], H = n->iarg[2], dk = n->iarg[3], dv = n->iarg[4];
    double scale = n->farg[0];
    const unsigned char *allow = n->aux;
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    real *o = n->out[0]->data;
    real *P = n->saved;
    double *p = xmalloc((size_t)T * sizeof(double));   // one row of P
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const real *qt = q + ((int64_t)b * T + t) * H * dk + h * dk;
                double mx = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    p[s] = -INFINITY;   // masked out: exp gives 0
                    if (allow && !allow[((int64_t)b * T + t) * T + s]) continue;
                    const real *ks = k + ((int64_t)b * T + s) * H * dk + h * dk;
                    double dot = 0;
                    for (int i = 0; i < dk; i++) dot += (double)qt[i] * ks[i];
                    p[s] = scale * dot;
                    mx = fmax(mx, p[s]);
                }
                double sum = 0;
                for (int s = 0; s <= t; s++) sum += p[s] = exp(p[s] - mx);
                for (int s = 0; s <= t; s++) p[s] /= sum;
                real *ot = o + ((int64_t)b * T + t) * H * dv + h * dv;
                for (int j = 0; j < dv; j++) {
                    double acc = 0;
                    for (int s = 0; s <= t; s++) acc += p[s] * v[((int64_t)b * T + s) * H * dv + h * dv + j];
                    ot[j] = (real)acc;
                }
                if (P) {
                    real *Pt = P + (((int64_t)b * H + h) * T + t) * T;
                    for (int s = 0; s < T; s++) Pt[s] = s <= t ? (real)p[s] : 0;
                }
            }
    free(p);
}

static void naive_backward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], H = n->iarg[2], dk = n->iarg[3], dv = n->iarg[4];
    double scale = n->farg[0];
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    const real *dO = n->out[0]->grad, *P = n->saved;
    real *gq = NODE_GRAD_IN(n, 0), *gk = NODE_GRAD_IN(n, 1), *gv = NODE_GRAD_IN(n, 2);
    double *dS = xmalloc((size_t)T * sizeof(double));   // one row
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const real *Pt = P + (((int64_t)b * H + h) * T + t) * T;
                const real *dOt = dO + ((int64_t)b * T + t) * H * dv + h * dv;
                double rowdot = 0;   // sum_s P_ts dP_ts
                for (int s = 0; s <= t; s++) {
                    const real *vs = v + ((int64_t)b * T + s) * H * dv + h * dv;
                    double dp = 0;
                    for (int j = 0; j < dv; j++) dp += (double)dOt[j] * vs[j];
                    dS[s] = dp;
                    rowdot += Pt[s] * dp;
                    if (gv) {
                        real *gvs = gv + ((int64_t)b * T + s) * H * dv + h * dv;
                        for (int j = 0; j < dv; j++) gvs[j] += (real)(Pt[s] * dOt[j]);
                    }
                }
                for (int s = 0; s <= t; s++) dS[s] = Pt[s] * (dS[s] - rowdot);
                const real *qt = q + ((int64_t)b * T + t) * H * dk + h * dk;
                for (int s = 0; s <= t; s++) {
                    const real *ks = k + ((int64_t)b * T + s) * H * dk + h * dk;
                    if (gq) {
                        real *gqt = gq + ((int64_t)b * T + t) * H * dk + h * dk;
                        for (int i = 0; i < dk; i++) gqt[i] += (real)(scale * dS[s] * ks[i]);
                    }
                    if (gk) {
                        real *gks = gk + ((int64_t)b * T + s) * H * dk + h * dk;
                        for (int i = 0; i < dk; i++) gks[i] += (real)(scale * dS[s] * qt[i]);
                    }
                }
            }
    free(dS);
}

static const OpDef OP_ATTENTION_NAIVE = {"attention_naive", naive_forward, naive_backward,
                                         CUDA_PAIR(cu_naive_attn_forward, cu_naive_attn_backward)};

Tensor *op_attention_naive(Tape *tp, Tensor *q, Tensor *k, Tensor *v, int n_heads, double scale) {
    return op_attention_naive_masked(tp, q, k, v, n_heads, scale, NULL);
}

Tensor *op_attention_naive_masked(Tape *tp, Tensor *q, Tensor *k, Tensor *v, int n_heads, double scale,
                                  const unsigned char *allow) {
    ASSERT(q->ndim == 3 && tensor_same_shape(q, k) && v->ndim == 3 && v->shape[0] == q->shape[0] &&
               v->shape[1] == q->shape[1],
           "attention_naive: q %s, k %s, v %s", SHAPE(q), SHAPE(k), SHAPE(v));
    ASSERT(n_heads > 0 && q->shape[2] % n_heads == 0 && v->shape[2] % n_heads == 0,
           "attention_naive: %d heads do not divide q %s / v %s", n_heads, SHAPE(q), SHAPE(v));
    int B = q->shape[0], T = q->shape[1];
    Tensor *o = tape_tensorv(tp, 3, B, T, v->shape[2]);
    Node *n = tape_op(tp, &OP_ATTENTION_NAIVE, (Tensor *[]){q, k, v}, 3, &o, 1);
    n->iarg[0] = B;
    n->iarg[1] = T;
    n->iarg[2] = n_heads;
    n->iarg[3] = q->shape[2] / n_heads;
    n->iarg[4] = v->shape[2] / n_heads;
    n->farg[0] = scale;
    if (allow) {
        unsigned char *m = tape_alloc(tp, (size_t)B * T * T);
        memcpy(m, allow, (size_t)B * T * T);
        for (int64_t r = 0; r < (int64_t)B * T; r++) {
            int t = (int)(r % T), any = 0;
            for (int s = 0; s <= t; s++) any |= m[r * T + s];
            ASSERT(any, "attention_naive: mask row (b %d, t %d) allows no position s <= t", (int)(r / T), t);
        }
        n->aux = m;
    }
    if (n->recorded) n->saved = tape_dalloc(tp, (size_t)B * n_heads * T * T * sizeof(real));
    tape_forward(n);
    return o;
}
