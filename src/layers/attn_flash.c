// attn_flash.c: causal softmax attention, FlashAttention-2 style, and the
// one-query decoding kernel. The reference form is attn_naive.c.
//
// Forward, per (batch, head, query tile Q_i of bq rows), over the key tiles
// K_j, V_j (bk rows) that hold positions s <= the tile's last query:
//   S = scale Q_i K_j^T            (masked to s <= t on the diagonal tiles)
//   m' = max(m, rowmax S);  P = exp(S - m');  alpha = exp(m - m')
//   l = alpha l + rowsum P;  A = diag(alpha) A + P V_j
// then o_t = A_t / l_t and lse_t = m_t + log l_t, the only thing saved.
//
// Backward (FlashAttention-2): with D_t = rowsum(dO_t . O_t), per block
//   P = exp(scale Q_i K_j^T - lse)   (recomputed; 0 where s > t)
//   dV_j += P^T dO_i;  dP = dO_i V_j^T;  dS = P . (dP - D)
//   dQ_i += scale dS K_j;  dK_j += scale dS^T Q_i.
// One task per (batch, head) visits the blocks in a fixed order and writes
// only its own head's columns, so the gradients do not depend on the thread
// count and no atomics are needed.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernel.h"
#include "blas.h"
#include "ops_math.h"

typedef struct AttnDims {
    int B, T, H, dk, dv;
    int bq, bk;        // tile sizes
    real scale;
} AttnDims;

// iarg: 0 B, 1 T, 2 H, 3 dk, 4 dv, 5 tile_q, 6 tile_k; farg[0] scale.
static AttnDims dims_of(const Node *n) {
    return (AttnDims){n->iarg[0], n->iarg[1], n->iarg[2], n->iarg[3], n->iarg[4],
                      n->iarg[5], n->iarg[6], (real)n->farg[0]};
}

// One query tile of one head: o rows t0..t0+nq-1 and their lse.
// q, k: head-h base pointers of batch b (row stride ldq); v, o: (row stride ldv).
// Scratch: S (bq*bk), acc (bq*dv), m, l (bq). The running max and sum stay in
// `real`: m is a max (exact), l a sum of at most T terms in [0, 1].
static void flash_forward_tile(const AttnDims *d, int t0, int nq, const real *q, const real *k,
                               const real *v, real *o, real *lse, real *S, real *acc, real *m,
                               real *l) {
    int ldq = d->H * d->dk, ldv = d->H * d->dv, bk = d->bk, dv = d->dv;
    for (int i = 0; i < nq; i++) m[i] = -INFINITY, l[i] = 0;
    memset(acc, 0, (size_t)nq * dv * sizeof(real));
    const real *Q = q + (int64_t)t0 * ldq;
    int s_end = t0 + nq;   // keys 0 .. s_end-1 can be seen by some row of the tile
    for (int s0 = 0; s0 < s_end; s0 += bk) {
        int nk = imin(bk, s_end - s0);
        gemm(false, true, nq, nk, d->dk, d->scale, Q, ldq, k + (int64_t)s0 * ldq, ldq, 0, S, bk);
        for (int i = 0; i < nq; i++) {
            real *Si = S + (int64_t)i * bk;
            int nvalid = imin(nk, t0 + i - s0 + 1);   // keys s0 .. t in this block
            if (nvalid <= 0) {                        // the whole block is in row i's future
                memset(Si, 0, (size_t)nk * sizeof(real));
                continue;
            }
            real mx = m[i];
#pragma omp simd reduction(max : mx)
            for (int j = 0; j < nvalid; j++) mx = Si[j] > mx ? Si[j] : mx;
            real sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < nvalid; j++) {
                Si[j] = r_exp(Si[j] - mx);
                sum += Si[j];
            }
            for (int j = nvalid; j < nk; j++) Si[j] = 0;
            real alpha = r_exp(m[i] - mx);   // 0 on the first block (m = -inf)
            l[i] = alpha * l[i] + sum;
            m[i] = mx;
            if (alpha != 1) {
                real *Ai = acc + (int64_t)i * dv;
                for (int j = 0; j < dv; j++) Ai[j] *= alpha;
            }
        }
        gemm(false, false, nq, dv, nk, 1, S, bk, v + (int64_t)s0 * ldv, ldv, 1, acc, dv);
    }
    for (int i = 0; i < nq; i++) {
        real inv = 1 / l[i];
        real *Oi = o + (int64_t)(t0 + i) * ldv;
        for (int j = 0; j < dv; j++) Oi[j] = acc[(int64_t)i * dv + j] * inv;
        if (lse) lse[t0 + i] = m[i] + (real)log(l[i]);
    }
}

static void flash_forward(Node *n) {
    AttnDims d = dims_of(n);
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    real *o = n->out[0]->data;
    real *lse = n->saved;   // (B, H, T) or NULL when no backward will run
    int ldq = d.H * d.dk, ldv = d.H * d.dv;
    int n_tiles = (d.T + d.bq - 1) / d.bq;
    size_t n_S = (size_t)d.bq * d.bk, n_acc = (size_t)d.bq * d.dv;
    size_t stride;
    unsigned char *slots =
        tape_thread_slots(n->tape, (2 * d.bq + n_S + n_acc) * sizeof(real), &stride);
#pragma omp parallel
    {
        unsigned char *slot = slots + stride * (size_t)omp_get_thread_num();
        real *m = (real *)slot, *l = m + d.bq, *S = l + d.bq, *acc = S + n_S;
        // Later query tiles see more keys: hand tiles out dynamically. Each
        // task writes its own rows, so the result is the same for any schedule.
#pragma omp for collapse(3) schedule(dynamic, 1)
        for (int b = 0; b < d.B; b++)
            for (int h = 0; h < d.H; h++)
                for (int it = 0; it < n_tiles; it++) {
                    int t0 = it * d.bq, nq = imin(d.bq, d.T - t0);
                    int64_t row0 = (int64_t)b * d.T;
                    flash_forward_tile(&d, t0, nq, q + row0 * ldq + h * d.dk, k + row0 * ldq + h * d.dk,
                                       v + row0 * ldv + h * d.dv, o + row0 * ldv + h * d.dv,
                                       lse ? lse + ((int64_t)b * d.H + h) * d.T : NULL, S, acc, m, l);
                }
    }
}

// All blocks of one (batch, head). Pointers are the head's base in batch b;
// gradient pointers may be NULL (that input takes no gradient).
// Scratch: S, dP (bq*bk), D (T).
static void flash_backward_head(const AttnDims *d, const real *q, const real *k, const real *v,
                                const real *o, const real *dO, const real *lse, real *dq, real *dk,
                                real *dv, real *S, real *dP, real *D) {
    int ldq = d->H * d->dk, ldv = d->H * d->dv, bq = d->bq, bk = d->bk, T = d->T;
    for (int t = 0; t < T; t++) {   // D_t = dO_t . O_t
        double s = 0;
        for (int j = 0; j < d->dv; j++) s += (double)dO[(int64_t)t * ldv + j] * o[(int64_t)t * ldv + j];
        D[t] = (real)s;
    }
    bool need_ds = dq || dk;
    for (int s0 = 0; s0 < T; s0 += bk) {
        int nk = imin(bk, T - s0);
        const real *Kj = k + (int64_t)s0 * ldq, *Vj = v + (int64_t)s0 * ldv;
        // Query tiles that can see key s0 onwards: the one holding s0, and later ones.
        for (int t0 = (s0 / bq) * bq; t0 < T; t0 += bq) {
            int nq = imin(bq, T - t0);
            const real *Qi = q + (int64_t)t0 * ldq, *dOi = dO + (int64_t)t0 * ldv;
            gemm(false, true, nq, nk, d->dk, d->scale, Qi, ldq, Kj, ldq, 0, S, bk);
            for (int i = 0; i < nq; i++) {
                real *Si = S + (int64_t)i * bk;
                int nvalid = imax(0, imin(nk, t0 + i - s0 + 1));
                real L = lse[t0 + i];
#pragma omp simd
                for (int j = 0; j < nvalid; j++) Si[j] = r_exp(Si[j] - L);
                for (int j = nvalid; j < nk; j++) Si[j] = 0;
            }
            if (dv) gemm(true, false, nk, d->dv, nq, 1, S, bk, dOi, ldv, 1, dv + (int64_t)s0 * ldv, ldv);
            if (!need_ds) continue;
            gemm(false, true, nq, nk, d->dv, 1, dOi, ldv, Vj, ldv, 0, dP, bk);
            for (int i = 0; i < nq; i++) {
                real *Pi = S + (int64_t)i * bk, *dPi = dP + (int64_t)i * bk;
                real Dt = D[t0 + i];
                for (int j = 0; j < nk; j++) dPi[j] = Pi[j] * (dPi[j] - Dt);   // dS
            }
            if (dq) gemm(false, false, nq, d->dk, nk, d->scale, dP, bk, Kj, ldq, 1, dq + (int64_t)t0 * ldq, ldq);
            if (dk) gemm(true, false, nk, d->dk, nq, d->scale, dP, bk, Qi, ldq, 1, dk + (int64_t)s0 * ldq, ldq);
        }
    }
}

static void flash_backward(Node *n) {
    AttnDims d = dims_of(n);
    real *dq = NODE_GRAD_IN(n, 0), *dk = NODE_GRAD_IN(n, 1), *dv = NODE_GRAD_IN(n, 2);
    if (!dq && !dk && !dv) return;
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    const real *o = n->out[0]->data, *dO = n->out[0]->grad;
    const real *lse = n->saved;
    int ldq = d.H * d.dk, ldv = d.H * d.dv;
    size_t n_S = (size_t)d.bq * d.bk, stride;
    unsigned char *slots = tape_thread_slots(n->tape, (2 * n_S + (size_t)d.T) * sizeof(real), &stride);
#pragma omp parallel
    {
        real *S = (real *)(slots + stride * (size_t)omp_get_thread_num()), *dP = S + n_S, *D = dP + n_S;
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < d.B; b++)
            for (int h = 0; h < d.H; h++) {
                int64_t qo = (int64_t)b * d.T * ldq + h * d.dk, vo = (int64_t)b * d.T * ldv + h * d.dv;
                flash_backward_head(&d, q + qo, k + qo, v + vo, o + vo, dO + vo,
                                    lse + ((int64_t)b * d.H + h) * d.T, dq ? dq + qo : NULL,
                                    dk ? dk + qo : NULL, dv ? dv + vo : NULL, S, dP, D);
            }
    }
}

static const OpDef OP_ATTENTION = {"attention", flash_forward, flash_backward};

Tensor *op_attention_tiled(Tape *tp, Tensor *q, Tensor *k, Tensor *v, int n_heads, double scale,
                           int tile_q, int tile_k) {
    ASSERT(q->ndim == 3 && k->ndim == 3 && v->ndim == 3,
           "attention: q %s, k %s, v %s must be (B, T, H*d)", SHAPE(q), SHAPE(k), SHAPE(v));
    ASSERT(tensor_same_shape(q, k), "attention: q %s and k %s must have the same shape", SHAPE(q), SHAPE(k));
    ASSERT(v->shape[0] == q->shape[0] && v->shape[1] == q->shape[1],
           "attention: v %s must have the (B, T) of q %s", SHAPE(v), SHAPE(q));
    ASSERT(n_heads > 0 && q->shape[2] % n_heads == 0 && v->shape[2] % n_heads == 0,
           "attention: %d heads do not divide q %s / v %s", n_heads, SHAPE(q), SHAPE(v));
    ASSERT(q->shape[1] >= 1, "attention: empty sequence, q %s", SHAPE(q));
    ASSERT(tile_q > 0 && tile_k > 0, "attention: tiles %d x %d", tile_q, tile_k);
    int B = q->shape[0], T = q->shape[1];
    Tensor *o = tape_tensorv(tp, 3, B, T, v->shape[2]);
    Node *n = tape_op(tp, &OP_ATTENTION, (Tensor *[]){q, k, v}, 3, &o, 1);
    n->iarg[0] = B;
    n->iarg[1] = T;
    n->iarg[2] = n_heads;
    n->iarg[3] = q->shape[2] / n_heads;
    n->iarg[4] = v->shape[2] / n_heads;
    n->iarg[5] = tile_q;
    n->iarg[6] = tile_k;
    n->farg[0] = scale;
    if (n->recorded) n->saved = tape_alloc(tp, (size_t)B * n_heads * T * sizeof(real));
    flash_forward(n);
    return o;
}

Tensor *op_attention(Tape *tp, Tensor *q, Tensor *k, Tensor *v, int n_heads, double scale) {
    return op_attention_tiled(tp, q, k, v, n_heads, scale, ATTN_TILE_Q, ATTN_TILE_K);
}

void attn_decode_forward(real *o, const real *q, const real *kc, const real *vc, int B, int max_T,
                         int n_keys, int H, int dk, int dv, double scale) {
    ASSERT(n_keys >= 1 && n_keys <= max_T, "attn_decode_forward: %d keys in a cache of %d", n_keys, max_T);
    int ldq = H * dk, ldv = H * dv;
#pragma omp parallel
    {
        real *s = xmalloc((size_t)n_keys * sizeof(real));   // (n_keys) scores, then weights
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                const real *K = kc + (int64_t)b * max_T * ldq + h * dk;
                const real *V = vc + (int64_t)b * max_T * ldv + h * dv;
                gemm(false, true, 1, n_keys, dk, (real)scale, q + (int64_t)b * ldq + h * dk, ldq, K, ldq, 0, s,
                     n_keys);
                real mx = s[0];
                for (int j = 1; j < n_keys; j++) mx = s[j] > mx ? s[j] : mx;
                double sum = 0;
                for (int j = 0; j < n_keys; j++) {
                    s[j] = r_exp(s[j] - mx);
                    sum += s[j];
                }
                gemm(false, false, 1, dv, n_keys, (real)(1.0 / sum), s, n_keys, V, ldv, 0,
                     o + (int64_t)b * ldv + h * dv, ldv);
            }
        free(s);
    }
}
