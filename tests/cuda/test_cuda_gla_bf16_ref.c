// test_cuda_gla_bf16_ref.c: the float64 reference of op_gla_dt with bf16
// chunk products (gla_bf16_ref.h) for test_cuda_gla_bf16.c, whose header
// states the bound. It replays the GPU's plan (src/cuda/gla_common.cuh) in
// chunks of 64: the states from s0 through each chunk's part and λ, the
// outputs from the state entering the chunk, the states' gradients in
// reverse, then each chunk's gradients (gla_backward.cu's formulas), every
// value with its bound alongside.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "docs.h"
#include "gla_bf16_ref.h"

#ifndef AG_DOUBLE
#define U 0x1p-23   // a float32 rounding, relative (twice the unit roundoff)

static double rnd(double x, bool on) { return on ? (double)bf16_round((float)x) : x; }

// The most that rounding a value anywhere in [x - d, x + d] to bf16 (through
// float32) can differ from rounding x: rounding is monotone, the ends give it.
static double flip(double x, double d) {
    double r = rnd(x, true);
    return fmax(fabs(rnd(x + d, true) - r), fabs(rnd(x - d, true) - r));
}

// The relative error bound of a float32 sum of n products.
static double sum_rel(int n) { return ldexp(2.0 * (n + 1), -23); }

// The relative error of a decay factor exp(x) in float32: x rounded, then
// exp within 2 ulp (the GPU's expf, the CPU's r_exp).
static double dec_rel(double x) { return fabs(x) * 0x1p-24 + 0x1p-21; }

// One (b, h): its rows as the reference reads them.
typedef struct {
    const Case *c;
    int b, h, mode;
    const real *q, *k, *v, *g, *dt, *dO;   // at (b, t = 0, h): rows of ldk, ldv; g, dt step by H
    const int *first;                      // row b's (T), or NULL
    int ldk, ldv;
} Head;

static double Qv(const Head *x, int t, int a) { return x->q[(int64_t)t * x->ldk + a]; }
static double Kv(const Head *x, int t, int a) { return x->k[(int64_t)t * x->ldk + a]; }
static double Vv(const Head *x, int t, int j) { return x->v[(int64_t)t * x->ldv + j]; }
static double DOv(const Head *x, int t, int j) { return x->dO[(int64_t)t * x->ldv + j]; }
static double DTv(const Head *x, int t) { return x->dt ? x->dt[(int64_t)t * x->c->H] : 1; }

// K̃ = β k as float32 forms it (one rounded product).
static double KTv(const Head *x, int t, int a) {
    real kk = x->k[(int64_t)t * x->ldk + a];
    return x->dt ? (double)(real)(x->dt[(int64_t)t * x->c->H] * kk) : kk;
}

// One chunk's rows (gla_common.cuh's Rows): decay factors and their
// relative errors.
typedef struct {
    int t0, L, j0;
    bool keep;
    int db[CH];
    double G[CH], eS[CH], deS[CH], eL[CH], deL[CH], lam, dlam;
} Rows;

static void rows_of(const Head *x, int t0, Rows *r) {
    int T = x->c->T, H = x->c->H, L = T - t0 < CH ? T - t0 : CH;
    r->t0 = t0, r->L = L;
    double acc = 0;
    for (int i = 0; i < L; i++) {
        if (x->g) acc += (double)x->g[(int64_t)(t0 + i) * H];
        r->G[i] = acc;
        int f = x->first ? x->first[t0 + i] : -1;
        r->db[i] = f >= t0 ? f - t0 : -1;
    }
    r->j0 = r->db[L - 1] > 0 ? r->db[L - 1] : 0;
    r->keep = r->db[L - 1] < 0;
    double gL = r->G[L - 1];
    for (int i = 0; i < L; i++) {
        r->eS[i] = r->db[i] >= 0 ? 0 : exp(r->G[i]);
        r->deS[i] = x->g ? dec_rel(r->G[i]) : 0;
        r->eL[i] = i < r->j0 ? 0 : exp(gL - r->G[i]);
        r->deL[i] = x->g ? dec_rel(gL - r->G[i]) : 0;
    }
    r->lam = r->keep ? exp(gL) : 0;
    r->dlam = x->g ? dec_rel(gL) : 0;
}

// A chunk's (CH, CH) matrices, row i column s: the scores A with bounds eA
// and flips fA, dA = dO Vᵀ with bound edA, dP = dA ⊙ D with flips fdP; the
// per-row sums of dG; the flips of the state and of its gradient (dk, dv).
typedef struct {
    double A[CH * CH], eA[CH * CH], fA[CH * CH], dA[CH * CH], edA[CH * CH], dP[CH * CH], fdP[CH * CH];
    double dG[CH], edG[CH], sq[CH], esq[CH], cst[CH], ecst[CH];
    double *fS, *fdS;
} Work;

static bool reads(const Rows *r, int i, int s) { return s <= i && s >= r->db[i]; }

// A and, with grad, dA and dP, with their bounds. The scores' operands are
// rounded only in a chunk of whole vectors of 16 (or with PART).
static void scores(const Head *x, const Rows *r, Work *w, bool grad) {
    int L = r->L, dk = x->c->dk, dv = x->c->dv, m = x->mode;
    bool rl = L % 16 == 0 || (m & PART);
    for (int i = 0; i < L; i++)
        for (int s = 0; s < L; s++) {
            int e = i * CH + s;
            w->A[e] = w->eA[e] = w->fA[e] = w->dA[e] = w->edA[e] = w->dP[e] = w->fdP[e] = 0;
            if (!reads(r, i, s)) continue;
            double qk = 0, ab = 0;
            for (int a = 0; a < dk; a++) {
                double t = rnd(Qv(x, r->t0 + i, a), rl && (m & RQ)) * rnd(KTv(x, r->t0 + s, a), rl && (m & RK));
                qk += t, ab += fabs(t);
            }
            double D = exp(r->G[i] - r->G[s]), eD = x->g ? dec_rel(r->G[i] - r->G[s]) : 0;
            w->A[e] = qk * D;
            w->eA[e] = D * sum_rel(dk) * ab + fabs(w->A[e]) * (eD + U);
            w->fA[e] = flip(w->A[e], w->eA[e]);
            if (!grad) continue;
            double da = 0, ad = 0;
            for (int j = 0; j < dv; j++) {
                double t = rnd(DOv(x, r->t0 + i, j), rl && (m & RDO)) * rnd(Vv(x, r->t0 + s, j), rl && (m & RV));
                da += t, ad += fabs(t);
            }
            w->dA[e] = da;
            w->edA[e] = sum_rel(dv) * ad;
            w->dP[e] = da * D;
            w->fdP[e] = flip(w->dP[e], D * w->edA[e] + fabs(w->dP[e]) * (eD + U));
        }
}

static void flips(double *f, const double *v, const double *e, int64_t n) {
    for (int64_t i = 0; i < n; i++) f[i] = flip(v[i], e[i]);
}

// The output rows of a chunk: O = A V + diag(exp(G)) Q S_c (sin: S_c may be
// non-zero), S_c with bounds Se (w->fS its flips).
static void forward_out(const Head *x, const Rows *r, const Work *w, const double *S, bool sin, Ref *f) {
    const Case *c = x->c;
    int L = r->L, dk = c->dk, dv = c->dv, m = x->mode;
    for (int i = 0; i < L; i++)
        for (int j = 0; j < dv; j++) {
            double acc = 0, ab = 0, fl = 0;
            for (int s = 0; s <= i; s++) {
                if (!reads(r, i, s)) continue;
                double vv = rnd(Vv(x, r->t0 + s, j), m & RV), t = rnd(w->A[i * CH + s], m & RA) * vv;
                acc += t, ab += fabs(t), fl += w->fA[i * CH + s] * fabs(vv);
            }
            double bd = sum_rel(L) * ab + fl;
            if (sin && r->db[i] < 0) {
                double u = 0, au = 0, fu = 0;
                for (int a = 0; a < dk; a++) {
                    double qq = rnd(Qv(x, r->t0 + i, a), m & RQ), t = qq * rnd(S[a * dv + j], m & RS);
                    u += t, au += fabs(t), fu += fabs(qq) * w->fS[a * dv + j];
                }
                acc += r->eS[i] * u;
                bd += r->eS[i] * (sum_rel(dk) * au + fu + fabs(u) * (r->deS[i] + U));
            }
            int64_t o = (((int64_t)x->b * c->T + r->t0 + i) * c->H + x->h) * dv + j;
            f->v[O_O][o] = acc;
            f->t[O_O][o] = bd + 2 * U * fabs(acc);
        }
}

// S (bounds Se) becomes the state leaving the chunk: λ S + Σ_i (e_i β_i k_i)ᵀ v_i
// over the last document (nz: S may be non-zero, else it is not read).
static void forward_state(const Head *x, const Rows *r, double *S, double *Se, bool nz) {
    int L = r->L, dk = x->c->dk, dv = x->c->dv, m = x->mode;
    for (int a = 0; a < dk; a++)
        for (int j = 0; j < dv; j++) {
            double d = 0, ab = 0, fl = 0;
            for (int i = r->j0; i < L; i++) {
                double kt = KTv(x, r->t0 + i, a), xv = r->eL[i] * kt;
                double xr = (m & PRE) ? r->eL[i] * rnd(kt, m & RXK) : rnd(xv, m & RXK);
                double vv = rnd(Vv(x, r->t0 + i, j), m & RV), t = xr * vv;
                d += t, ab += fabs(t), fl += flip(xv, fabs(xv) * (r->deL[i] + U)) * fabs(vv);
            }
            double ed = sum_rel(L) * ab + fl;
            int e = a * dv + j;
            if (nz) {
                double s = r->lam * S[e] + d;
                Se[e] = r->lam * (Se[e] + fabs(S[e]) * r->dlam) + ed + U * fabs(s);
                S[e] = s;
            } else {
                S[e] = d, Se[e] = ed;
            }
        }
}

// dv of a chunk: Aᵀ dO + diag(exp(G_L − G)) K̃ dS (dS: w->fdS its flips).
static void grad_v(const Head *x, const Rows *r, const Work *w, const double *dS, Ref *f) {
    const Case *c = x->c;
    int L = r->L, dk = c->dk, dv = c->dv, m = x->mode;
    for (int s = 0; s < L; s++)
        for (int j = 0; j < dv; j++) {
            double acc = 0, ab = 0, fl = 0;
            for (int i = s; i < L; i++) {
                if (!reads(r, i, s)) continue;
                double g = rnd(DOv(x, r->t0 + i, j), m & RDO), t = rnd(w->A[i * CH + s], m & RA) * g;
                acc += t, ab += fabs(t), fl += w->fA[i * CH + s] * fabs(g);
            }
            double bd = sum_rel(L) * ab + fl;
            if (s >= r->j0) {
                double u = 0, au = 0, fu = 0;
                for (int a = 0; a < dk; a++) {
                    double kk = rnd(KTv(x, r->t0 + s, a), m & RK), t = kk * rnd(dS[a * dv + j], m & RDS);
                    u += t, au += fabs(t), fu += fabs(kk) * w->fdS[a * dv + j];
                }
                acc += r->eL[s] * u;
                bd += r->eL[s] * (sum_rel(dk) * au + fu + fabs(u) * (r->deL[s] + U));
            }
            int64_t o = (((int64_t)x->b * c->T + r->t0 + s) * c->H + x->h) * dv + j;
            f->v[O_DV][o] = acc;
            f->t[O_DV][o] = bd + 2 * U * fabs(acc);
        }
}

// dq of a chunk: dP K̃ + diag(exp(G)) dO S_cᵀ; dG's terms sq_i = exp(G_i) q_i·(S_c dO_i).
static void grad_q(const Head *x, const Rows *r, Work *w, const double *S, bool sin, Ref *f) {
    const Case *c = x->c;
    int L = r->L, dk = c->dk, dv = c->dv, m = x->mode;
    for (int i = 0; i < L; i++) {
        bool rs = sin && r->db[i] < 0;
        double sq = 0, esq = 0;
        for (int a = 0; a < dk; a++) {
            double acc = 0, ab = 0, fl = 0;
            for (int s = 0; s <= i; s++) {
                if (!reads(r, i, s)) continue;
                double kk = rnd(KTv(x, r->t0 + s, a), m & RK), t = rnd(w->dP[i * CH + s], m & RDP) * kk;
                acc += t, ab += fabs(t), fl += w->fdP[i * CH + s] * fabs(kk);
            }
            double bd = sum_rel(L) * ab + fl;
            if (rs) {
                double u = 0, au = 0, fu = 0;
                for (int j = 0; j < dv; j++) {
                    double g = rnd(DOv(x, r->t0 + i, j), m & RDO), t = g * rnd(S[a * dv + j], m & RS);
                    u += t, au += fabs(t), fu += fabs(g) * w->fS[a * dv + j];
                }
                double eu = sum_rel(dv) * au + fu;
                acc += r->eS[i] * u;
                bd += r->eS[i] * (eu + fabs(u) * (r->deS[i] + U));
                // (the CPU rounds exp(G_i) u to float32 before the dot)
                sq += Qv(x, r->t0 + i, a) * u, esq += fabs(Qv(x, r->t0 + i, a)) * (eu + U * fabs(u));
            }
            int64_t o = (((int64_t)x->b * c->T + r->t0 + i) * c->H + x->h) * dk + a;
            f->v[O_DQ][o] = acc;
            f->t[O_DQ][o] = bd + 2 * U * fabs(acc);
        }
        w->sq[i] = r->eS[i] * sq;
        w->esq[i] = r->eS[i] * esq + fabs(w->sq[i]) * r->deS[i];
    }
}

// dK̃ = dPᵀ Q + diag(exp(G_L − G)) V dSᵀ of a chunk; dk = β dK̃, ddt = k·dK̃;
// dG's terms cst_s = exp(G_L − G_s) k̃_s·(dS v_s) (not the last row's).
static void grad_k(const Head *x, const Rows *r, Work *w, const double *dS, Ref *f) {
    const Case *c = x->c;
    int L = r->L, dk = c->dk, dv = c->dv, m = x->mode;
    for (int s = 0; s < L; s++) {
        double pc = 0, epc = 0, pk = 0, epk = 0, dts = DTv(x, r->t0 + s);
        for (int a = 0; a < dk; a++) {
            double acc = 0, ab = 0, fl = 0;
            for (int i = s; i < L; i++) {
                if (!reads(r, i, s)) continue;
                double qq = rnd(Qv(x, r->t0 + i, a), m & RQ), t = rnd(w->dP[i * CH + s], m & RDP) * qq;
                acc += t, ab += fabs(t), fl += w->fdP[i * CH + s] * fabs(qq);
            }
            double bd = sum_rel(L) * ab + fl;
            if (s >= r->j0) {
                double u = 0, au = 0, fu = 0;
                for (int j = 0; j < dv; j++) {
                    double vv = rnd(Vv(x, r->t0 + s, j), m & RV), t = vv * rnd(dS[a * dv + j], m & RDS);
                    u += t, au += fabs(t), fu += fabs(vv) * w->fdS[a * dv + j];
                }
                double eu = sum_rel(dv) * au + fu;
                acc += r->eL[s] * u;
                bd += r->eL[s] * (eu + fabs(u) * (r->deL[s] + U));
                pc += KTv(x, r->t0 + s, a) * u, epc += fabs(KTv(x, r->t0 + s, a)) * (eu + U * fabs(u));
            }
            double eacc = bd + 2 * U * fabs(acc);
            pk += Kv(x, r->t0 + s, a) * acc, epk += fabs(Kv(x, r->t0 + s, a)) * eacc;
            int64_t o = (((int64_t)x->b * c->T + r->t0 + s) * c->H + x->h) * dk + a;
            f->v[O_DK][o] = dts * acc;
            f->t[O_DK][o] = fabs(dts) * eacc + U * fabs(dts * acc);
        }
        int64_t og = ((int64_t)x->b * c->T + r->t0 + s) * c->H + x->h;
        f->v[O_DDT][og] = pk;
        f->t[O_DDT][og] = epk + U * fabs(pk);
        bool cs = s >= r->j0 && s < L - 1;
        w->cst[s] = cs ? r->eL[s] * pc : 0;
        w->ecst[s] = cs ? r->eL[s] * epc + fabs(w->cst[s]) * r->deL[s] : 0;
    }
}

// dg of a chunk: dG_i = Σ_s Z_is − Σ_s Z_si + sq_i − cst_i (Z = dA ⊙ A off
// the diagonal), dG_L += Σ cst + exp(G_L) <dS, S_c>; dg its reverse
// cumulative sum. Se, dSe: the states' bounds.
static void grad_g(const Head *x, const Rows *r, Work *w, const double *S, const double *Se, const double *dS,
                   const double *dSe, bool sin, Ref *f) {
    const Case *c = x->c;
    int L = r->L;
    int64_t SZ = (int64_t)c->dk * c->dv;
    for (int i = 0; i < L; i++) w->dG[i] = w->sq[i] - w->cst[i], w->edG[i] = w->esq[i] + w->ecst[i];
    for (int i = 0; i < L; i++)
        for (int s = 0; s < i; s++) {
            int e = i * CH + s;
            double z = w->dA[e] * w->A[e];
            double ez = fabs(w->dA[e]) * w->eA[e] + w->edA[e] * fabs(w->A[e]) + w->edA[e] * w->eA[e];
            w->dG[i] += z, w->dG[s] -= z;
            w->edG[i] += ez, w->edG[s] += ez;
        }
    for (int s = 0; s < L - 1; s++) w->dG[L - 1] += w->cst[s], w->edG[L - 1] += w->ecst[s];
    if (sin && r->keep) {
        double ss = 0, es = 0, eg = exp(r->G[L - 1]);
        for (int64_t e = 0; e < SZ; e++) ss += dS[e] * S[e], es += fabs(dS[e]) * Se[e] + dSe[e] * fabs(S[e]);
        w->dG[L - 1] += eg * ss, w->edG[L - 1] += eg * es + 0x1p-40 * eg * fabs(ss);
    }
    double acc = 0, eacc = 0;
    for (int i = L - 1; i >= 0; i--) {
        acc += w->dG[i], eacc += w->edG[i];
        int64_t og = ((int64_t)x->b * c->T + r->t0 + i) * c->H + x->h;
        f->v[O_DG][og] = acc;
        f->t[O_DG][og] = eacc + U * fabs(acc);
    }
}

// dS (bounds dSe) becomes the gradient of the state entering the chunk:
// λ dS + Σ_i (exp(G_i) q_i)ᵀ dO_i over the rows that read it.
static void state_grad(const Head *x, const Rows *r, double *dS, double *dSe) {
    int L = r->L, dk = x->c->dk, dv = x->c->dv, m = x->mode;
    for (int a = 0; a < dk; a++)
        for (int j = 0; j < dv; j++) {
            double d = 0, ab = 0, fl = 0;
            for (int i = 0; i < L && r->db[i] < 0; i++) {
                double qq = Qv(x, r->t0 + i, a), xv = r->eS[i] * qq;
                double xr = (m & PRE) ? r->eS[i] * rnd(qq, m & RXQ) : rnd(xv, m & RXQ);
                double g = rnd(DOv(x, r->t0 + i, j), m & RDO), t = xr * g;
                d += t, ab += fabs(t), fl += flip(xv, fabs(xv) * (r->deS[i] + U)) * fabs(g);
            }
            int e = a * dv + j;
            double s = r->lam * dS[e] + d;
            dSe[e] = r->lam * (dSe[e] + fabs(dS[e]) * r->dlam) + sum_rel(L) * ab + fl + U * fabs(s);
            dS[e] = s;
        }
}

int64_t out_numel(const Case *c, int i) {
    int64_t bt = (int64_t)c->B * c->T * c->H, st = (int64_t)c->B * c->H * c->dk * c->dv;
    int64_t n[N_OUT] = {bt * c->dv, st, bt * c->dk, bt * c->dk, bt * c->dv, bt, bt, st};
    return n[i];
}

// Both passes of one head; St, Ste: (nc + 1) states and their bounds, dS,
// dSe: one state gradient.
static void ref_head(const Head *x, Work *w, double *St, double *Ste, double *dS, double *dSe, const real *s0,
                     const real *dSf, Ref *f) {
    const Case *c = x->c;
    int nc = (c->T + CH - 1) / CH;
    int64_t SZ = (int64_t)c->dk * c->dv, sb = ((int64_t)x->b * c->H + x->h) * SZ;
    for (int64_t e = 0; e < SZ; e++) St[e] = s0 ? s0[sb + e] : 0, Ste[e] = 0;
    Rows r;
    for (int k = 0; k < nc; k++) {
        double *S = St + k * SZ, *Se = Ste + k * SZ;
        rows_of(x, k * CH, &r);
        scores(x, &r, w, false);
        flips(w->fS, S, Se, SZ);
        forward_out(x, &r, w, S, k > 0 || s0, f);
        memcpy(S + SZ, S, SZ * sizeof(double)), memcpy(Se + SZ, Se, SZ * sizeof(double));
        forward_state(x, &r, S + SZ, Se + SZ, k > 0 || s0);
    }
    for (int64_t e = 0; e < SZ; e++) {
        f->v[O_S][sb + e] = St[nc * SZ + e], f->t[O_S][sb + e] = Ste[nc * SZ + e];
        dS[e] = dSf[sb + e], dSe[e] = 0;
    }
    for (int k = nc - 1; k >= 0; k--) {
        const double *S = St + k * SZ, *Se = Ste + k * SZ;
        bool sin = k > 0 || s0;
        rows_of(x, k * CH, &r);
        scores(x, &r, w, true);
        flips(w->fS, S, Se, SZ);
        flips(w->fdS, dS, dSe, SZ);
        grad_v(x, &r, w, dS, f);
        grad_q(x, &r, w, S, sin, f);
        grad_k(x, &r, w, dS, f);
        grad_g(x, &r, w, S, Se, dS, dSe, sin, f);
        state_grad(x, &r, dS, dSe);
    }
    for (int64_t e = 0; e < SZ; e++) f->v[O_DS0][sb + e] = dS[e], f->t[O_DS0][sb + e] = dSe[e];
}

Ref reference(const Case *c, const Inputs *in, int mode) {
    Ref f;
    for (int i = 0; i < N_OUT; i++) {
        f.v[i] = calloc((size_t)out_numel(c, i), sizeof(double));
        f.t[i] = calloc((size_t)out_numel(c, i), sizeof(double));
    }
    int *first = NULL;
    if (c->doc_start) {
        first = malloc((size_t)c->B * c->T * sizeof(int));
        docs_first_fill(first, c->doc_start, c->B, c->T);
    }
    int nc = (c->T + CH - 1) / CH, ldk = c->H * c->dk, ldv = c->H * c->dv;
    int64_t SZ = (int64_t)c->dk * c->dv;
    Work *w = malloc(sizeof *w);
    w->fS = malloc((size_t)SZ * sizeof(double));
    w->fdS = malloc((size_t)SZ * sizeof(double));
    double *St = malloc((size_t)(nc + 1) * SZ * sizeof(double)), *Ste = malloc((size_t)(nc + 1) * SZ * sizeof(double));
    double *dS = malloc((size_t)SZ * sizeof(double)), *dSe = malloc((size_t)SZ * sizeof(double));
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++) {
            int64_t rk = (int64_t)b * c->T * ldk + (int64_t)h * c->dk, rv = (int64_t)b * c->T * ldv + (int64_t)h * c->dv;
            int64_t rg = (int64_t)b * c->T * c->H + h;
            Head x = {c, b, h, mode, in->x[X_Q]->data + rk, in->x[X_K]->data + rk, in->x[X_V]->data + rv,
                      c->g ? in->x[X_G]->data + rg : NULL, c->dt ? in->x[X_DT]->data + rg : NULL, in->dO + rv,
                      first ? first + (int64_t)b * c->T : NULL, ldk, ldv};
            ref_head(&x, w, St, Ste, dS, dSe, c->s0 ? in->x[X_S0]->data : NULL, in->dS, &f);
        }
    for (int i = 0; i < N_OUT; i++)
        for (int64_t e = 0; e < out_numel(c, i); e++) f.t[i][e] = 1.01 * f.t[i][e] + 1e-30;
    free(w->fS), free(w->fdS), free(w);
    free(St), free(Ste), free(dS), free(dSe), free(first);
    return f;
}

void ref_free(Ref *r) {
    for (int i = 0; i < N_OUT; i++) free(r->v[i]), free(r->t[i]);
}

void where_str(char *s, size_t len, const Case *c, int i, int64_t e) {
    if (i == O_S || i == O_DS0) {
        int64_t SZ = (int64_t)c->dk * c->dv;
        snprintf(s, len, "b %d head %d row %d column %d", (int)(e / SZ / c->H), (int)(e / SZ % c->H),
                 (int)(e % SZ / c->dv), (int)(e % c->dv));
    } else if (i == O_DG || i == O_DDT) {
        snprintf(s, len, "b %d t %d head %d", (int)(e / c->H / c->T), (int)(e / c->H % c->T), (int)(e % c->H));
    } else {
        int d = i == O_O || i == O_DV ? c->dv : c->dk, W = c->H * d;
        snprintf(s, len, "b %d t %d head %d column %d", (int)(e / W / c->T), (int)(e / W % c->T), (int)(e % W / d),
                 (int)(e % d));
    }
}
#endif
