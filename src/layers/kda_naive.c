// kda_naive.c: the recurrent (reference) form of op_kda, token by token,
// forward and backward. Never forms a dk x dk matrix; O(dk dv) per token.
//
// Forward, one token (S' = Diag(alpha) S_{t-1}, alpha = exp(g) per key channel):
//   p = S'^T k,   delta = beta (v - p),   S_t = S' + k delta^T,   o = S_t^T q.
// Backward, the same lines in reverse, dS the gradient of S_t:
//   dS += q do^T,  dq = S_t do,
//   ddelta = dS^T k,  dk += dS delta,
//   dbeta = ddelta . (v - p),  dv = beta ddelta,  dp = -beta ddelta,
//   dS' = dS + k dp^T,  dk += S' dp,
//   dg[i] = alpha[i] <dS'[i,:], S_{t-1}[i,:]>,  dS_{t-1}[i,:] = alpha[i] dS'[i,:].
// The forward saves the state every `chunk` tokens; the backward replays each
// stretch forward (keeping its states) and then walks it in reverse.
// Documents: alpha = 0 at a position where a document begins (the state
// before it is not read), in the forward, the replay and the backward.
#include <stdlib.h>
#include <string.h>

#include "kda_kernel.h"

// alpha (dk) of token t of row b: exp(g), or 0 where a document begins at t
// (first: the node's (B, T) or NULL).
static void naive_alpha(real *alpha, const int *first, const KdaDims *d, int b, int t, const real *g) {
    bool restart = first && first[(int64_t)b * d->T + t] == t;
    for (int i = 0; i < d->dk; i++) alpha[i] = restart ? 0 : r_exp_decay(g[i]);
}

// One token: S (dk, dv) holds S_{t-1} on entry, S_t on return; o may be NULL.
static void naive_step(real *S, int dk, int dv, const real *q, const real *k, const real *v, real beta,
                       const real *alpha, real *o, real *delta) {
    for (int i = 0; i < dk; i++)
        for (int j = 0; j < dv; j++) S[i * dv + j] *= alpha[i];
    for (int j = 0; j < dv; j++) {
        double p = 0;
        for (int i = 0; i < dk; i++) p += (double)S[i * dv + j] * k[i];
        delta[j] = beta * (v[j] - (real)p);
    }
    for (int i = 0; i < dk; i++)
        for (int j = 0; j < dv; j++) S[i * dv + j] += k[i] * delta[j];
    if (o)
        for (int j = 0; j < dv; j++) {
            double s = 0;
            for (int i = 0; i < dk; i++) s += (double)S[i * dv + j] * q[i];
            o[j] = (real)s;
        }
}

void kda_naive_forward(Node *n) {
    KdaDims d = kda_dims(n);
    const real *q = n->in[KDA_IN_Q]->data, *k = n->in[KDA_IN_K]->data, *v = n->in[KDA_IN_V]->data;
    const real *beta = n->in[KDA_IN_BETA]->data, *g = n->in[KDA_IN_G]->data;
    const real *s0 = n->in[KDA_IN_S0] ? n->in[KDA_IN_S0]->data : NULL;
    const int *first = n->aux;
    real *o = n->out[0]->data, *sT = n->out[1]->data, *saved = n->saved;
    int64_t SS = (int64_t)d.dk * d.dv;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < d.B; b++)
        for (int h = 0; h < d.H; h++) {
            real *S = sT + gdn_off_s(&d, b, h);
            real *delta = xmalloc(d.dv * sizeof(real)), *alpha = xmalloc(d.dk * sizeof(real));
            if (s0) memcpy(S, s0 + gdn_off_s(&d, b, h), SS * sizeof(real));
            else memset(S, 0, SS * sizeof(real));
            for (int t = 0; t < d.T; t++) {
                if (saved && t % d.C == 0)
                    memcpy(saved + (((int64_t)b * d.H + h) * d.NC + t / d.C) * SS, S, SS * sizeof(real));
                int64_t ok = gdn_off_k(&d, b, t, h);
                naive_alpha(alpha, first, &d, b, t, g + ok);
                naive_step(S, d.dk, d.dv, q + ok, k + ok, v + gdn_off_v(&d, b, t, h), beta[gdn_off_h(&d, b, t, h)],
                           alpha, o + gdn_off_v(&d, b, t, h), delta);
            }
            free(delta);
            free(alpha);
        }
}

// The per-head buffers of the backward: states[s] = S_{t0+s-1} for the tokens
// of one stretch; Sp = S'; dS = dL/dS_t.
typedef struct NaiveBuf {
    real *states, *Sp, *dS, *delta, *p, *ddelta, *alpha;
} NaiveBuf;

// One token of the backward: S = S_{t-1}; bf->dS holds dL/dS_t on entry and
// dL/dS_{t-1} on return. qt, kt, vt, gt, dot_: the token's rows (dot_ may be
// NULL); each gradient pointer (may be NULL) is at the token's row.
static void naive_step_backward(NaiveBuf *bf, int dK, int dV, const real *S, const real *qt, const real *kt,
                                const real *vt, real bt, const real *dot_, real *dq, real *dk, real *dv, real *dbeta,
                                real *dg) {
    real *Sp = bf->Sp, *dS = bf->dS, *p = bf->p, *delta = bf->delta, *ddelta = bf->ddelta;
    const real *alpha = bf->alpha;
    // Recompute S' = Diag(alpha) S, p, delta; S_t = S' + k delta^T is used as Sp + k delta^T.
    for (int i = 0; i < dK; i++)
        for (int j = 0; j < dV; j++) Sp[i * dV + j] = alpha[i] * S[i * dV + j];
    for (int j = 0; j < dV; j++) {
        double acc = 0;
        for (int i = 0; i < dK; i++) acc += (double)Sp[i * dV + j] * kt[i];
        p[j] = (real)acc;
        delta[j] = bt * (vt[j] - p[j]);
    }
    // o = S_t^T q: dS += q do^T, dq += S_t do.
    if (dot_)
        for (int i = 0; i < dK; i++) {
            double acc = 0;
            for (int j = 0; j < dV; j++) {
                dS[i * dV + j] += qt[i] * dot_[j];
                acc += (double)(Sp[i * dV + j] + kt[i] * delta[j]) * dot_[j];
            }
            if (dq) dq[i] += (real)acc;
        }
    // S_t = S' + k delta^T: ddelta = dS^T k, dk += dS delta.
    double dbt = 0;
    for (int j = 0; j < dV; j++) {
        double acc = 0;
        for (int i = 0; i < dK; i++) acc += (double)dS[i * dV + j] * kt[i];
        ddelta[j] = (real)acc;
        dbt += acc * (vt[j] - p[j]);
    }
    for (int i = 0; i < dK; i++) {
        double acc = 0;
        for (int j = 0; j < dV; j++) acc += (double)dS[i * dV + j] * delta[j];
        if (dk) dk[i] += (real)acc;
    }
    // delta = beta (v - p): dv += beta ddelta, dp = -beta ddelta (kept in ddelta).
    if (dbeta) *dbeta += (real)dbt;
    for (int j = 0; j < dV; j++) {
        if (dv) dv[j] += bt * ddelta[j];
        ddelta[j] = -bt * ddelta[j];
    }
    // p = S'^T k: dS' = dS + k dp^T, dk += S' dp.
    for (int i = 0; i < dK; i++) {
        double acc = 0;
        for (int j = 0; j < dV; j++) {
            dS[i * dV + j] += kt[i] * ddelta[j];
            acc += (double)Sp[i * dV + j] * ddelta[j];
        }
        if (dk) dk[i] += (real)acc;
    }
    // S' = Diag(alpha) S: dg[i] += alpha[i] <dS'[i,:], S[i,:]>, dS_{t-1}[i,:] = alpha[i] dS'[i,:].
    for (int i = 0; i < dK; i++) {
        double acc = 0;
        for (int j = 0; j < dV; j++) {
            acc += (double)dS[i * dV + j] * S[i * dV + j];
            dS[i * dV + j] *= alpha[i];
        }
        if (dg) dg[i] += (real)(alpha[i] * acc);
    }
}

void kda_naive_backward(Node *n) {
    KdaDims d = kda_dims(n);
    const real *q = n->in[KDA_IN_Q]->data, *k = n->in[KDA_IN_K]->data, *v = n->in[KDA_IN_V]->data;
    const real *beta = n->in[KDA_IN_BETA]->data, *g = n->in[KDA_IN_G]->data;
    real *dq = NODE_GRAD_IN(n, KDA_IN_Q), *dk = NODE_GRAD_IN(n, KDA_IN_K), *dv = NODE_GRAD_IN(n, KDA_IN_V);
    real *dbeta = NODE_GRAD_IN(n, KDA_IN_BETA), *dg = NODE_GRAD_IN(n, KDA_IN_G);
    real *ds0 = NODE_GRAD_IN(n, KDA_IN_S0);
    const real *dout = n->out[0]->grad, *dsT = n->out[1]->grad;
    const real *saved = n->saved;
    const int *first = n->aux;
    int64_t SS = (int64_t)d.dk * d.dv;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < d.B; b++)
        for (int h = 0; h < d.H; h++) {
            NaiveBuf bf = {
                .states = xmalloc((size_t)d.C * SS * sizeof(real)),
                .Sp = xmalloc(SS * sizeof(real)),
                .dS = xmalloc(SS * sizeof(real)),
                .delta = xmalloc(d.dv * sizeof(real)),
                .p = xmalloc(d.dv * sizeof(real)),
                .ddelta = xmalloc(d.dv * sizeof(real)),
                .alpha = xmalloc(d.dk * sizeof(real)),
            };
            if (dsT) memcpy(bf.dS, dsT + gdn_off_s(&d, b, h), SS * sizeof(real));
            else memset(bf.dS, 0, SS * sizeof(real));
            for (int c = d.NC - 1; c >= 0; c--) {
                int t0 = c * d.C, L = imin(d.C, d.T - t0);
                // Replay the stretch forward, keeping the state before each token.
                memcpy(bf.Sp, saved + (((int64_t)b * d.H + h) * d.NC + c) * SS, SS * sizeof(real));
                for (int s = 0; s < L; s++) {
                    int t = t0 + s;
                    int64_t ok = gdn_off_k(&d, b, t, h);
                    memcpy(bf.states + s * SS, bf.Sp, SS * sizeof(real));
                    if (s + 1 == L) break;
                    naive_alpha(bf.alpha, first, &d, b, t, g + ok);
                    naive_step(bf.Sp, d.dk, d.dv, q + ok, k + ok, v + gdn_off_v(&d, b, t, h),
                               beta[gdn_off_h(&d, b, t, h)], bf.alpha, NULL, bf.delta);
                }
                for (int s = L - 1; s >= 0; s--) {
                    int t = t0 + s;
                    int64_t ok = gdn_off_k(&d, b, t, h), ov = gdn_off_v(&d, b, t, h), oh = gdn_off_h(&d, b, t, h);
                    naive_alpha(bf.alpha, first, &d, b, t, g + ok);
                    naive_step_backward(&bf, d.dk, d.dv, bf.states + s * SS, q + ok, k + ok, v + ov, beta[oh],
                                        dout ? dout + ov : NULL, dq ? dq + ok : NULL, dk ? dk + ok : NULL,
                                        dv ? dv + ov : NULL, dbeta ? dbeta + oh : NULL, dg ? dg + ok : NULL);
                }
            }
            if (ds0)
                for (int64_t i = 0; i < SS; i++) ds0[gdn_off_s(&d, b, h) + i] += bf.dS[i];
            free(bf.states);
            free(bf.Sp);
            free(bf.dS);
            free(bf.delta);
            free(bf.p);
            free(bf.ddelta);
            free(bf.alpha);
        }
}
