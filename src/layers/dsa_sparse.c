// dsa_sparse.c: causal softmax attention over selected positions (the
// DeepSeek sparse attention of MODEL.md `attn_dsa`), O(T K d).
//
// Per batch b, head h, query t with selection Sel_t (K positions, -1 = none):
//   forward:  a_s = scale q_t . k_s (s in Sel_t);  lse_t = logsumexp(a);
//             o_t = sum_s exp(a_s - lse_t) v_s
//   backward: P_s = exp(a_s - lse_t) recomputed;
//             dv_s += P_s do_t;  dS_s = P_s do_t . (v_s - o_t)   (= P_s (do_t . v_s - D_t), D_t = do_t . o_t)
//             dq_t += scale sum_s dS_s k_s;  dk_s += scale dS_s q_t
// The forward runs one task per (b, t), writing row t only; the backward
// one task per (b, h), visiting t in order, because dk_s and dv_s gather
// contributions from many queries (deterministic, no atomics). Saved: the
// lse (B, H, T) and the selection.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_ops.h"
#include "device.h"
#include "dsa_kernel.h"
#include "ops_math.h"

// Inner loops: every product runs over one head's row of d contiguous reals
// (d = 64 in the layers), in `real` with `omp simd`, so a row is a few
// vector FMAs; the selected keys are taken four at a time (four independent
// sums: the reductions of one key do not wait for the previous one's). The
// order of every sum is fixed by the build, not by the thread count. The
// reference form is op_attention_naive_masked (attn_naive.c), tested equal.

// out[j] = x . (row_j - y) for j < m, row_j = base + rows[j] ld (n reals),
// y (n) or NULL for 0: m dot products of one vector with gathered rows.
static inline __attribute__((always_inline)) void dots_rows(real *out, const real *x, const real *y,
                                                            const real *base, int64_t ld, const int *rows, int m,
                                                            int n) {
    int j = 0;
    for (; j + 4 <= m; j += 4) {
        const real *r0 = base + rows[j] * ld, *r1 = base + rows[j + 1] * ld, *r2 = base + rows[j + 2] * ld,
                   *r3 = base + rows[j + 3] * ld;
        real s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        if (y) {
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int i = 0; i < n; i++) {
                s0 += x[i] * (r0[i] - y[i]);
                s1 += x[i] * (r1[i] - y[i]);
                s2 += x[i] * (r2[i] - y[i]);
                s3 += x[i] * (r3[i] - y[i]);
            }
        } else {
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int i = 0; i < n; i++) {
                s0 += x[i] * r0[i];
                s1 += x[i] * r1[i];
                s2 += x[i] * r2[i];
                s3 += x[i] * r3[i];
            }
        }
        out[j] = s0, out[j + 1] = s1, out[j + 2] = s2, out[j + 3] = s3;
    }
    for (; j < m; j++) {
        const real *r = base + rows[j] * ld;
        real s0 = 0;
        if (y) {
#pragma omp simd reduction(+ : s0)
            for (int i = 0; i < n; i++) s0 += x[i] * (r[i] - y[i]);
        } else {
#pragma omp simd reduction(+ : s0)
            for (int i = 0; i < n; i++) s0 += x[i] * r[i];
        }
        out[j] = s0;
    }
}

// The number of valid entries of a selection row (K, -1 padded).
static inline int sel_count(const int *sel, int K) {
    int n = 0;
    while (n < K && sel[n] >= 0) n++;
    return n;
}

// One query, one head, over the positions of sel (K, -1 padded): ot (dv) and
// the row's log-sum-exp. kh, vh: the head's column base of position 0, rows
// ldk / ldv apart (a (T, H*d) activation or a (max_T, H*d) cache).
// Scratch: a (K), acc (dv). The sum of the weights stays in `real`: at most
// K terms in [0, 1].
static double sparse_row(real *ot, const real *qt, const real *kh, const real *vh, int64_t ldk, int64_t ldv,
                         const int *sel, int K, int dk, int dv, double scale, real *a, real *acc) {
    int n = sel_count(sel, K);
    dots_rows(a, qt, NULL, kh, ldk, sel, n, dk);
    real mx = -INFINITY, sc = (real)scale;
    for (int j = 0; j < n; j++) {
        a[j] *= sc;
        mx = a[j] > mx ? a[j] : mx;
    }
    real sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
        a[j] = r_exp(a[j] - mx);
        sum += a[j];
    }
    memset(acc, 0, (size_t)dv * sizeof(real));
    for (int j = 0; j < n; j++) {
        const real *vs = vh + sel[j] * ldv, pj = a[j];
#pragma omp simd
        for (int i = 0; i < dv; i++) acc[i] += pj * vs[i];
    }
    for (int i = 0; i < dv; i++) ot[i] = acc[i] / sum;   // a division: one rounding
    return mx + log(sum);
}

// Ask for the head's slices of rows sel[0..K) of x (rows ld apart, d reals)
// ahead of their use: the rows of a selection are scattered over the
// sequence, and the backward's updates of dk and dv waited on their misses.
static inline void prefetch_rows(const real *x, int64_t ld, const int *sel, int K, int d, bool write) {
    for (int j = 0; j < K && sel[j] >= 0; j++)
        for (int i = 0; i < d; i += 64 / (int)sizeof(real)) {
            if (write) __builtin_prefetch(x + sel[j] * ld + i, 1);
            else __builtin_prefetch(x + sel[j] * ld + i, 0);
        }
}

// iarg: 0 B, 1 T, 2 H, 3 dk, 4 dv, 5 K; farg[0] scale; aux: sel (B, T, K); saved: lse (B, H, T).
static void sparse_forward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], H = n->iarg[2], dk = n->iarg[3], dv = n->iarg[4], K = n->iarg[5];
    double scale = n->farg[0];
    const int *sel = n->aux;
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    real *o = n->out[0]->data, *lse = n->saved;
    size_t stride;   // per thread: a (K) scores, then weights; acc (dv)
    unsigned char *slots = tape_thread_slots(n->tape, ((size_t)K + dv) * sizeof(real), &stride);
#pragma omp parallel
    {
        real *a = (real *)(slots + stride * (size_t)omp_get_thread_num()), *acc = a + K;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                if (t + 1 < T) {   // the next query's rows (all heads), while this one computes
                    const int *next = sel + ((int64_t)b * T + t + 1) * K;
                    prefetch_rows(k + (int64_t)b * T * H * dk, H * dk, next, K, H * dk, false);
                    prefetch_rows(v + (int64_t)b * T * H * dv, H * dv, next, K, H * dv, false);
                }
                for (int h = 0; h < H; h++) {
                    int64_t row = (int64_t)b * T + t;
                    double L = sparse_row(o + row * H * dv + h * dv, q + row * H * dk + h * dk,
                                          k + (int64_t)b * T * H * dk + h * dk, v + (int64_t)b * T * H * dv + h * dv,
                                          H * dk, H * dv, sel + row * K, K, dk, dv, scale, a, acc);
                    if (lse) lse[((int64_t)b * H + h) * T + t] = (real)L;
                }
            }
    }
}

void dsa_sparse_decode(real *o, const real *q, const real *kc, const real *vc, int B, int max_T, const int *sel,
                       int K, int H, int dk, int dv, double scale) {
    real *a = xmalloc((size_t)K * sizeof(real)), *acc = xmalloc((size_t)dv * sizeof(real));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            sparse_row(o + (int64_t)b * H * dv + h * dv, q + (int64_t)b * H * dk + h * dk,
                       kc + (int64_t)b * max_T * H * dk + h * dk, vc + (int64_t)b * max_T * H * dv + h * dv, H * dk,
                       H * dv, sel + (int64_t)b * K, K, dk, dv, scale, a, acc);
    free(a);
    free(acc);
}

// One query t of one head: its share of dq_t, dk_s, dv_s (s in sel). Scores
// and dO_t . v_s first (four keys at a time), then the weights and dS as one
// vector loop, then one pass over the keys for the three updates (dq_t summed
// in scratch, added once). Scratch: P, dS (K each), dq_acc (dk).
static void sparse_backward_row(const real *qt, const real *dOt, const real *ot, real L, const real *kh,
                                const real *vh, int64_t ldk, int64_t ldv, const int *sel, int K, int dk, int dv,
                                real scale, real *gqt, real *gkh, real *gvh, real *P, real *dS, real *dq_acc) {
    int n = sel_count(sel, K);
    dots_rows(P, qt, NULL, kh, ldk, sel, n, dk);
    bool need_ds = gqt || gkh;
    if (need_ds) {
        // dO_t . v_s - D_t as dO_t . (v_s - o_t): no cancellation, and exactly
        // 0 where the row attends to one position only (o_t = v_s).
        dots_rows(dS, dOt, ot, vh, ldv, sel, n, dv);
#pragma omp simd
        for (int j = 0; j < n; j++) {
            P[j] = r_exp(scale * P[j] - L);
            dS[j] = scale * P[j] * dS[j];
        }
    } else {
#pragma omp simd
        for (int j = 0; j < n; j++) P[j] = r_exp(scale * P[j] - L);
    }
    if (gqt) memset(dq_acc, 0, (size_t)dk * sizeof(real));
    for (int j = 0; j < n; j++) {
        int64_t s = sel[j];
        if (gvh) {
            real *gv = gvh + s * ldv, p = P[j];
#pragma omp simd
            for (int i = 0; i < dv; i++) gv[i] += p * dOt[i];
        }
        real ds = need_ds ? dS[j] : 0;
        if (gqt) {
            const real *ks = kh + s * ldk;
#pragma omp simd
            for (int i = 0; i < dk; i++) dq_acc[i] += ds * ks[i];
        }
        if (gkh) {
            real *gk = gkh + s * ldk;
#pragma omp simd
            for (int i = 0; i < dk; i++) gk[i] += ds * qt[i];
        }
    }
    if (gqt)
#pragma omp simd
        for (int i = 0; i < dk; i++) gqt[i] += dq_acc[i];
}

static void sparse_backward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], H = n->iarg[2], dk = n->iarg[3], dv = n->iarg[4], K = n->iarg[5];
    real scale = (real)n->farg[0];
    real *gq = NODE_GRAD_IN(n, 0), *gk = NODE_GRAD_IN(n, 1), *gv = NODE_GRAD_IN(n, 2);
    if (!gq && !gk && !gv) return;
    const int *sel = n->aux;
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    const real *o = n->out[0]->data, *dO = n->out[0]->grad, *lse = n->saved;
    int64_t ldk = (int64_t)H * dk, ldv = (int64_t)H * dv;
    size_t stride;   // per thread: P, dS (K each), dq_acc (dk)
    unsigned char *slots = tape_thread_slots(n->tape, (2 * (size_t)K + dk) * sizeof(real), &stride);
#pragma omp parallel
    {
        real *P = (real *)(slots + stride * (size_t)omp_get_thread_num()), *dS = P + K, *dq_acc = dS + K;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                int64_t kb = (int64_t)b * T * ldk + h * dk, vb = (int64_t)b * T * ldv + h * dv;
                for (int t = 0; t < T; t++) {
                    int64_t qo = kb + t * ldk, vo = vb + t * ldv;
                    if (t + 1 < T) {   // the next query's rows, while this one computes
                        const int *next = sel + ((int64_t)b * T + t + 1) * K;
                        prefetch_rows(k + kb, ldk, next, K, dk, false);
                        prefetch_rows(v + vb, ldv, next, K, dv, false);
                        if (gk) prefetch_rows(gk + kb, ldk, next, K, dk, true);
                        if (gv) prefetch_rows(gv + vb, ldv, next, K, dv, true);
                    }
                    sparse_backward_row(q + qo, dO + vo, o + vo, lse[((int64_t)b * H + h) * T + t], k + kb,
                                        v + vb, ldk, ldv, sel + ((int64_t)b * T + t) * K, K, dk, dv, scale,
                                        gq ? gq + qo : NULL, gk ? gk + kb : NULL, gv ? gv + vb : NULL, P, dS,
                                        dq_acc);
                }
            }
    }
}

static const OpDef OP_SPARSE_ATTENTION = {"sparse_attention", sparse_forward, sparse_backward,
                                          CUDA_PAIR(cu_sparse_forward, cu_sparse_backward)};

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
    int *s;
    if (tp->device == DEVICE_CPU) {
        s = tape_alloc(tp, (size_t)B * T * K * sizeof(int));
        memcpy(s, sel, (size_t)B * T * K * sizeof(int));
        for (int64_t r = 0; r < (int64_t)B * T; r++) {
            int t = (int)(r % T);
            ASSERT(s[r * K] >= 0, "sparse_attention: row (b %d, t %d) selects nothing", (int)(r / T), t);
            for (int j = 0; j < K && s[r * K + j] >= 0; j++)
                ASSERT(s[r * K + j] <= t, "sparse_attention: row (b %d, t %d) selects the future position %d",
                       (int)(r / T), t, s[r * K + j]);
        }
    } else {   // device or host memory, copied to the device; the forward kernel checks the rows
        s = tape_dalloc(tp, (size_t)B * T * K * sizeof(int));
        if (dev_holds(tp->device, sel)) dev_copy(tp->device, s, sel, (size_t)B * T * K * sizeof(int));
        else dev_from_host(s, tp->device, sel, (size_t)B * T * K * sizeof(int));
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
    if (n->recorded) n->saved = tape_dalloc(tp, (size_t)B * n_heads * T * sizeof(real));
    tape_forward(n);
    return o;
}
