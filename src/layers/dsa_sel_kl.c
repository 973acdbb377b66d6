// dsa_sel_kl.c: the KL of the indexer against the sparse attention, over the
// selected positions only (dsa_sel_kl.h).
//
// Forward per query row: the indexer scores of the K selected positions,
// their log-sum-exp, the KL. Backward, with gI_j = g (softmax(I_t)_j m_t - p_t,j)
// (m_t = sum_j p_t,j) and z = qI_t,i . kI_s recomputed:
//   dw_t,i  += c sum_j gI_j ReLU(z)
//   dqI_t,i += c gI_j w_t,i [z > 0] kI_s,   dkI_s += c gI_j w_t,i [z > 0] qI_t,i
// kI_s gathers from many queries, so the backward runs one task per batch
// element and visits the queries in order (deterministic, no atomics).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_ops.h"
#include "device.h"
#include "dsa_sel_kl.h"

static inline double dotd(const real *a, const real *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

void dsa_sparse_target(real *p, const real *q, const real *k, const int *sel, int B, int T, int K, int H, int dk,
                       double scale) {
    int ld = H * dk;
#pragma omp parallel
    {
        double *a = xmalloc((size_t)K * sizeof(double));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < (int64_t)B * T; r++) {
            int64_t b = r / T;
            const int *sr = sel + r * K;
            real *pr = p + r * K;
            memset(pr, 0, (size_t)K * sizeof(real));
            for (int h = 0; h < H; h++) {
                const real *qt = q + r * ld + h * dk;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < K && sr[j] >= 0; j++) {
                    a[j] = scale * dotd(qt, k + (b * T + sr[j]) * ld + h * dk, dk);
                    mx = fmax(mx, a[j]);
                }
                for (int j = 0; j < K && sr[j] >= 0; j++) sum += exp(a[j] - mx);
                for (int j = 0; j < K && sr[j] >= 0; j++) pr[j] += (real)(exp(a[j] - mx) / (sum * H));
            }
        }
        free(a);
    }
}

// One query row's scores: Ir (K) for the valid entries of sr.
static void sel_scores(real *Ir, const real *qt, const real *wt, const real *kb, const int *sr, int K, int HI,
                       int dI) {
    double c = 1.0 / sqrt(dI);
    for (int j = 0; j < K && sr[j] >= 0; j++) {
        double acc = 0;
        for (int i = 0; i < HI; i++) {
            double z = dotd(qt + i * dI, kb + (int64_t)sr[j] * dI, dI);
            if (z > 0) acc += wt[i] * z;
        }
        Ir[j] = (real)(c * acc);
    }
}

// iarg: 0 B, 1 T, 2 K, 3 HI, 4 dI, 5 the whole batch's rows (Tape.loss_rows;
// B in one process): the KL is summed over this B and divided by iarg[5] x T.
// in: qI, kI, w, p.
static void sel_kl_forward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], K = n->iarg[2], HI = n->iarg[3], dI = n->iarg[4];
    SelKlSaved *sv = n->saved;
    const int *sel = n->aux;
    const real *qI = n->in[0]->data, *kI = n->in[1]->data, *w = n->in[2]->data, *p = n->in[3]->data;
    double *row_loss = xmalloc((size_t)B * T * sizeof(double));
#pragma omp parallel
    {
        real *Ir = xmalloc((size_t)K * sizeof(real));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < (int64_t)B * T; r++) {
            int64_t b = r / T;
            const int *sr = sel + r * K;
            const real *pr = p + r * K;
            sel_scores(Ir, qI + r * HI * dI, w + r * HI, kI + b * T * dI, sr, K, HI, dI);
            double mx = -INFINITY, sum = 0, kl = 0;
            int nv = 0;
            while (nv < K && sr[nv] >= 0) nv++;
            for (int j = 0; j < nv; j++) mx = fmax(mx, Ir[j]);
            for (int j = 0; j < nv; j++) sum += exp(Ir[j] - mx);
            double lse = mx + log(sum);
            for (int j = 0; j < nv; j++)
                if (pr[j] > 0) kl += pr[j] * (log((double)pr[j]) - (Ir[j] - lse));
            row_loss[r] = kl;
            if (sv) {
                memcpy(sv->Isc + r * K, Ir, (size_t)nv * sizeof(real));
                sv->lse[r] = (real)lse;
            }
        }
        free(Ir);
    }
    double total = 0;   // fixed order: the same for any thread count
    for (int64_t r = 0; r < (int64_t)B * T; r++) total += row_loss[r];
    n->out[0]->data[0] = (real)(total / ((double)n->iarg[5] * T));
    free(row_loss);
}

static void sel_kl_backward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], K = n->iarg[2], HI = n->iarg[3], dI = n->iarg[4];
    real *gq = NODE_GRAD_IN(n, 0), *gk = NODE_GRAD_IN(n, 1), *gw = NODE_GRAD_IN(n, 2);
    if (!gq && !gk && !gw) return;
    const SelKlSaved *sv = n->saved;
    const real *qI = n->in[0]->data, *kI = n->in[1]->data, *w = n->in[2]->data, *p = n->in[3]->data;
    double g = n->out[0]->grad[0] / ((double)n->iarg[5] * T), c = 1.0 / sqrt(dI);
#pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int64_t r = (int64_t)b * T + t;
            const int *sr = sv->sel + r * K;
            const real *pr = p + r * K, *Ir = sv->Isc + r * K, *qt = qI + r * HI * dI, *wt = w + r * HI;
            double mass = 0;
            for (int j = 0; j < K && sr[j] >= 0; j++) mass += pr[j];
            for (int j = 0; j < K && sr[j] >= 0; j++) {
                double gI = g * (exp(Ir[j] - sv->lse[r]) * mass - pr[j]);
                const real *ks = kI + ((int64_t)b * T + sr[j]) * dI;
                for (int i = 0; i < HI; i++) {
                    const real *qi = qt + i * dI;
                    double z = dotd(qi, ks, dI);
                    if (z <= 0) continue;
                    if (gw) gw[r * HI + i] += (real)(c * gI * z);
                    double a = c * gI * wt[i];
                    if (gq)
                        for (int d = 0; d < dI; d++) gq[r * HI * dI + i * dI + d] += (real)(a * ks[d]);
                    if (gk) {
                        real *gks = gk + ((int64_t)b * T + sr[j]) * dI;
                        for (int d = 0; d < dI; d++) gks[d] += (real)(a * qi[d]);
                    }
                }
            }
        }
}

static const OpDef OP_DSA_SEL_KL = {"dsa_sel_kl", sel_kl_forward, sel_kl_backward,
                                   CUDA_PAIR(cu_sel_kl_forward, cu_sel_kl_backward)};

Tensor *op_dsa_sel_kl(Tape *tp, Tensor *qI, Tensor *kI, Tensor *w, const int *sel, int K, Tensor *p,
                      int index_heads) {
    ASSERT(qI->ndim == 3 && kI->ndim == 3 && w->ndim == 3 && p->ndim == 3,
           "dsa_sel_kl: qI %s, kI %s, w %s, p %s must be 3-D", SHAPE(qI), SHAPE(kI), SHAPE(w), SHAPE(p));
    int B = qI->shape[0], T = qI->shape[1], HI = index_heads, dI = kI->shape[2];
    ASSERT(HI > 0 && K > 0 && qI->shape[2] == HI * dI && kI->shape[0] == B && kI->shape[1] == T &&
               w->shape[0] == B && w->shape[1] == T && w->shape[2] == HI && p->shape[0] == B && p->shape[1] == T &&
               p->shape[2] == K,
           "dsa_sel_kl: with %d index heads and K %d, qI %s, kI %s, w %s, p %s must be (B, T, HI*dI), "
           "(B, T, dI), (B, T, HI), (B, T, K)",
           HI, K, SHAPE(qI), SHAPE(kI), SHAPE(w), SHAPE(p));
    ASSERT(!p->requires_grad, "dsa_sel_kl: the target p %s takes no gradient", SHAPE(p));
    size_t nsel = (size_t)B * T * K;
    int *sel_copy;
    if (tp->device == DEVICE_CPU) {
        sel_copy = tape_alloc(tp, nsel * sizeof(int));
        memcpy(sel_copy, sel, nsel * sizeof(int));
        for (size_t r = 0; r < (size_t)B * T; r++)
            ASSERT(sel_copy[r * K] >= 0 && sel_copy[r * K] <= (int)(r % T),
                   "dsa_sel_kl: row %zu of the selection must start with a position <= t", r);
    } else {   // device or host memory, copied to the device; the forward kernel checks the rows
        sel_copy = tape_dalloc(tp, nsel * sizeof(int));
        if (dev_holds(tp->device, sel)) dev_copy(tp->device, sel_copy, sel, nsel * sizeof(int));
        else dev_from_host(sel_copy, tp->device, sel, nsel * sizeof(int));
    }
    Tensor *loss = tape_tensorv(tp, 1, 1);
    Node *n = tape_op(tp, &OP_DSA_SEL_KL, (Tensor *[]){qI, kI, w, p}, 4, &loss, 1);
    n->iarg[0] = B;
    n->iarg[1] = T;
    n->iarg[2] = K;
    n->iarg[3] = HI;
    n->iarg[4] = dI;
    n->iarg[5] = tape_loss_rows(tp, B, "dsa_sel_kl");
    n->aux = sel_copy;
    if (n->recorded) {
        SelKlSaved *sv = tape_alloc(tp, sizeof *sv);
        sv->sel = sel_copy;
        sv->Isc = tape_dalloc(tp, nsel * sizeof(real));
        sv->lse = tape_dalloc(tp, (size_t)B * T * sizeof(real));
        n->saved = sv;
    }
    tape_forward(n);
    return loss;
}
