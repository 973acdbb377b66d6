// gdn_naive.c: the recurrent (reference) form of Gated DeltaNet, token by
// token, forward and backward. Never forms a dk x dk matrix; O(dk dv) per token.
//
// Forward, one token (S' = gamma S_{t-1}):
//   p = S'^T k,   delta = beta (v - p),   S_t = S' + k delta^T,   o = S_t^T q.
// Backward, the same lines in reverse, dS the gradient of S_t:
//   dS += q do^T,  dq = S_t do,
//   ddelta = dS^T k,  dk += dS delta,
//   dbeta = ddelta . (v - p),  dv = beta ddelta,  dp = -beta ddelta,
//   dS' = dS + k dp^T,  dk += S' dp,
//   dg = gamma <dS', S_{t-1}>,  dS_{t-1} = gamma dS'.
// The forward saves the state every `chunk` tokens; the backward replays each
// stretch forward (keeping its states) and then walks it in reverse.
// Documents: gamma = 0 at a position where a document begins (the state
// before it is not read), in the forward, the replay and the backward.
#include <stdlib.h>
#include <string.h>

#include "gdn_kernel.h"

// gamma_t: 0 where a document begins at t (first: the node's (B, T) or NULL).
static inline real naive_gamma(const int *first, const GdnDims *d, int b, int t, real g) {
    return first && first[(int64_t)b * d->T + t] == t ? 0 : r_exp_decay(g);
}

// One token: S (dk, dv) holds S_{t-1} on entry, S_t on return; o may be NULL.
static void naive_step(real *S, int dk, int dv, const real *q, const real *k, const real *v, real beta, real gamma,
                       real *o, real *delta) {
    for (int i = 0; i < dk * dv; i++) S[i] *= gamma;
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

void gdn_naive_forward(Node *n) {
    GdnDims d = gdn_dims(n);
    const real *q = n->in[GDN_IN_Q]->data, *k = n->in[GDN_IN_K]->data, *v = n->in[GDN_IN_V]->data;
    const real *beta = n->in[GDN_IN_BETA]->data, *g = n->in[GDN_IN_G]->data;
    const real *s0 = n->in[GDN_IN_S0] ? n->in[GDN_IN_S0]->data : NULL;
    const int *first = n->aux;
    real *o = n->out[0]->data, *sT = n->out[1]->data, *saved = n->saved;
    int64_t SS = (int64_t)d.dk * d.dv;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < d.B; b++)
        for (int h = 0; h < d.H; h++) {
            real *S = sT + gdn_off_s(&d, b, h);
            real *delta = xmalloc(d.dv * sizeof(real));
            if (s0) memcpy(S, s0 + gdn_off_s(&d, b, h), SS * sizeof(real));
            else memset(S, 0, SS * sizeof(real));
            for (int t = 0; t < d.T; t++) {
                if (saved && t % d.C == 0)
                    memcpy(saved + (((int64_t)b * d.H + h) * d.NC + t / d.C) * SS, S, SS * sizeof(real));
                int64_t ok = gdn_off_k(&d, b, t, h), oh = gdn_off_h(&d, b, t, h);
                naive_step(S, d.dk, d.dv, q + ok, k + ok, v + gdn_off_v(&d, b, t, h), beta[oh],
                           naive_gamma(first, &d, b, t, g[oh]), o + gdn_off_v(&d, b, t, h), delta);
            }
            free(delta);
        }
}

void gdn_naive_backward(Node *n) {
    GdnDims d = gdn_dims(n);
    const real *q = n->in[GDN_IN_Q]->data, *k = n->in[GDN_IN_K]->data, *v = n->in[GDN_IN_V]->data;
    const real *beta = n->in[GDN_IN_BETA]->data, *g = n->in[GDN_IN_G]->data;
    real *dq = NODE_GRAD_IN(n, GDN_IN_Q), *dk = NODE_GRAD_IN(n, GDN_IN_K), *dv = NODE_GRAD_IN(n, GDN_IN_V);
    real *dbeta = NODE_GRAD_IN(n, GDN_IN_BETA), *dg = NODE_GRAD_IN(n, GDN_IN_G);
    real *ds0 = NODE_GRAD_IN(n, GDN_IN_S0);
    const real *dout = n->out[0]->grad, *dsT = n->out[1]->grad;
    const real *saved = n->saved;
    const int *first = n->aux;
    int64_t SS = (int64_t)d.dk * d.dv;
    int dK = d.dk, dV = d.dv;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < d.B; b++)
        for (int h = 0; h < d.H; h++) {
            // states[s] = S_{t0+s-1} for the tokens of one stretch; Sp = S'; dS = dL/dS_t.
            real *states = xmalloc((size_t)d.C * SS * sizeof(real));
            real *Sp = xmalloc(SS * sizeof(real)), *dS = xmalloc(SS * sizeof(real));
            real *delta = xmalloc(dV * sizeof(real)), *p = xmalloc(dV * sizeof(real));
            real *ddelta = xmalloc(dV * sizeof(real));
            if (dsT) memcpy(dS, dsT + gdn_off_s(&d, b, h), SS * sizeof(real));
            else memset(dS, 0, SS * sizeof(real));
            for (int c = d.NC - 1; c >= 0; c--) {
                int t0 = c * d.C, L = imin(d.C, d.T - t0);
                // Replay the stretch forward, keeping the state before each token.
                memcpy(Sp, saved + (((int64_t)b * d.H + h) * d.NC + c) * SS, SS * sizeof(real));
                for (int s = 0; s < L; s++) {
                    int t = t0 + s;
                    int64_t ok = gdn_off_k(&d, b, t, h), oh = gdn_off_h(&d, b, t, h);
                    memcpy(states + s * SS, Sp, SS * sizeof(real));
                    if (s + 1 < L)
                        naive_step(Sp, dK, dV, q + ok, k + ok, v + gdn_off_v(&d, b, t, h), beta[oh],
                                   naive_gamma(first, &d, b, t, g[oh]), NULL, delta);
                }
                for (int s = L - 1; s >= 0; s--) {
                    int t = t0 + s;
                    int64_t ok = gdn_off_k(&d, b, t, h), ov = gdn_off_v(&d, b, t, h), oh = gdn_off_h(&d, b, t, h);
                    const real *S = states + s * SS, *qt = q + ok, *kt = k + ok, *vt = v + ov;
                    real bt = beta[oh], gamma = naive_gamma(first, &d, b, t, g[oh]);
                    // Recompute S' = gamma S, p, delta; S_t = S' + k delta^T is used as Sp + k delta^T.
                    for (int64_t i = 0; i < SS; i++) Sp[i] = gamma * S[i];
                    for (int j = 0; j < dV; j++) {
                        double acc = 0;
                        for (int i = 0; i < dK; i++) acc += (double)Sp[i * dV + j] * kt[i];
                        p[j] = (real)acc;
                        delta[j] = bt * (vt[j] - p[j]);
                    }
                    // o = S_t^T q: dS += q do^T, dq += S_t do.
                    if (dout) {
                        const real *dot_ = dout + ov;
                        for (int i = 0; i < dK; i++) {
                            double acc = 0;
                            for (int j = 0; j < dV; j++) {
                                dS[i * dV + j] += qt[i] * dot_[j];
                                acc += (double)(Sp[i * dV + j] + kt[i] * delta[j]) * dot_[j];
                            }
                            if (dq) dq[ok + i] += (real)acc;
                        }
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
                        if (dk) dk[ok + i] += (real)acc;
                    }
                    // delta = beta (v - p): dv += beta ddelta, dp = -beta ddelta (kept in ddelta).
                    if (dbeta) dbeta[oh] += (real)dbt;
                    for (int j = 0; j < dV; j++) {
                        if (dv) dv[ov + j] += bt * ddelta[j];
                        ddelta[j] = -bt * ddelta[j];
                    }
                    // p = S'^T k: dS' = dS + k dp^T, dk += S' dp.
                    for (int i = 0; i < dK; i++) {
                        double acc = 0;
                        for (int j = 0; j < dV; j++) {
                            dS[i * dV + j] += kt[i] * ddelta[j];
                            acc += (double)Sp[i * dV + j] * ddelta[j];
                        }
                        if (dk) dk[ok + i] += (real)acc;
                    }
                    // S' = gamma S: dg += gamma <dS', S>, dS_{t-1} = gamma dS'.
                    double dgt = 0;
                    for (int64_t i = 0; i < SS; i++) {
                        dgt += (double)dS[i] * S[i];
                        dS[i] *= gamma;
                    }
                    if (dg) dg[oh] += (real)(gamma * dgt);
                }
            }
            if (ds0)
                for (int64_t i = 0; i < SS; i++) ds0[gdn_off_s(&d, b, h) + i] += dS[i];
            free(states);
            free(Sp);
            free(dS);
            free(delta);
            free(p);
            free(ddelta);
        }
}
