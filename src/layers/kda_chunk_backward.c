// kda_chunk_backward.c: the backward of op_kda's chunked (WY) form
// (kda_chunk.c; docs/kda.md).
//
// Chunks are visited in reverse. Each one reloads the state S0 that entered
// it (saved by the forward), recomputes the chunk with kda_chunk_prepare, and
// back-propagates through the lines of kda_chunk.c in reverse order, carrying
// dS (the gradient of the state leaving the chunk) to the previous chunk.
// Every decay factor's derivative lands on dGamma (L, dk), and per channel
// dg_m = sum_{i >= m} dGamma_i.
//
// The decayed products M_ij = sum_c X_ic Y_jc exp(Gamma_ic - Gamma_jc) (P with
// X = Q, Y = K; KKE with X = Y = K) give, for dM,
//   dX_i = sum_j dM_ij Y_j * E_ij,   dY_j = sum_i dM_ij X_i * E_ij,
//   dGamma_i += sum_j dM_ij X_i * Y_j * E_ij,  dGamma_j -= the same   (j < i)
// computed through the same reference points as the forward, so here too
// every exp is of a non-positive number.
// The solve: Delta = (I + A)^-1 R gives dR = (I + A)^-T dDelta (back
// substitution) and dA = -dR Delta^T (strictly lower).
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "kda_kernel.h"
#include "tile_mm.h"

// Gradient buffers of one chunk beyond those in KdaChunk.
typedef struct KdaChunkGrad {
    double *dG;      // (L, dk) dLoss/dGamma
    double *dbeta;   // (L)
    real *dDl;       // (L, dv) dDelta
    real *dR;        // (L, dv) dR = dXu
    real *dK;        // (L, dk) dK of the chunk, accumulated
    real *dQg;       // (L, dk)
    real *dXw;       // (L, dk)
    real *dKd;       // (L, dk)
    real *dX, *dY;   // (L, dk) a decayed product's gradients
    real *dM;        // (L, L) dP, then dA -> dKKE
    real *dS0;       // (dk, dv) gradient of the state entering the chunk
} KdaChunkGrad;

// Carve a chunk's gradient buffers out of mem as the forward's workspace is
// carved; with mem NULL only count the bytes.
static size_t grad_layout(KdaChunkGrad *gr, unsigned char *mem, int C, int dk, int dv) {
    size_t at = 0, Lk = (size_t)C * dk, Lv = (size_t)C * dv;
    KdaChunkGrad counting;   // mem NULL: the fields are set (to NULL) in a throwaway
    if (!mem) gr = &counting;
#define TAKE(field, n, type) (gr->field = (type *)gdn_carve(mem, &at, (size_t)(n), sizeof(type)))
    TAKE(dG, Lk, double);
    TAKE(dbeta, C, double);
    TAKE(dDl, Lv, real);
    TAKE(dR, Lv, real);
    TAKE(dK, Lk, real);
    TAKE(dQg, Lk, real);
    TAKE(dXw, Lk, real);
    TAKE(dKd, Lk, real);
    TAKE(dX, Lk, real);
    TAKE(dY, Lk, real);
    TAKE(dM, (size_t)C * C, real);
    TAKE(dS0, (size_t)dk * dv, real);
#undef TAKE
    return at;
}

// The backward of kda_decay_product: dX, dY (L, dk) = the gradients of X and
// Y for dM (L, L), whose entries the product did not form are zeroed first;
// the decays' terms are added into dG (L, dk). Each pair (i, j < i) adds a
// term to dG_i and the same term taken from dG_j, so that they cancel in dg
// exactly where they should; the diagonal (exponent 0) adds none: its terms,
// X_i dX_i - Y_i dY_i summed, would cancel only to rounding of their own
// size, which may be far above dg's (g ~ -30: dg ~ e^-30).
static void decay_product_backward(KdaChunk *ws, real *dM, const real *X, int ldx, const real *Y, int ldy,
                                   bool strict, real *dX, real *dY, double *dG) {
    int L = ws->L, dk = ws->dk;
    const double *G = ws->G;
    real *Xs = ws->Xs, *Ys = ws->Ys, *T1 = ws->T1, *T2 = ws->T2;
    for (int i = 0; i < L; i++) {
        real *dMi = dM + (size_t)i * L;
        for (int j = strict ? i : i + 1; j < L; j++) dMi[j] = 0;
        if (ws->docs)
            for (int j = 0; j < ws->docs[i]; j++) dMi[j] = 0;
    }
    memset(dX, 0, (size_t)L * dk * sizeof(real));
    memset(dY, 0, (size_t)L * dk * sizeof(real));
    for (int i0 = 0; i0 < L; i0 += KDA_SUB) {
        int n = imin(KDA_SUB, L - i0);
        const double *Gr = G + (size_t)i0 * dk;   // the forward's reference point
        if (i0 > 0) {
            kda_to_reference(ws, X, ldx, Y, ldy, i0, n);
            const real *dMb = dM + (size_t)i0 * L;   // (n, i0): the block's rows, the earlier columns
            tile_gemm(false, false, n, dk, i0, 1, dMb, L, Ys, dk, 0, T1, dk, TILE_FULL(n, i0), NULL);
            tile_gemm(true, false, i0, dk, n, 1, dMb, L, Xs, dk, 0, T2, dk, TILE_FULL(i0, n), NULL);
            for (int i = 0; i < n; i++)
                for (int c = 0; c < dk; c++) {
                    size_t e = (size_t)(i0 + i) * dk + c;
                    dX[e] += T1[i * dk + c] * r_exp_decay(G[e] - Gr[c]);
                    dG[e] += (double)Xs[i * dk + c] * T1[i * dk + c];
                }
            for (int j = 0; j < i0; j++)
                for (int c = 0; c < dk; c++) {
                    size_t e = (size_t)j * dk + c;
                    dY[e] += T2[j * dk + c] * r_exp_decay(Gr[c] - G[e]);
                    dG[e] -= (double)Ys[j * dk + c] * T2[j * dk + c];
                }
        }
        for (int i = i0; i < i0 + n; i++) {   // inside the block, per element
            const real *xi = X + (int64_t)i * ldx;
            const double *Gi = G + (size_t)i * dk;
            real *dxi = dX + (size_t)i * dk;
            double *dGi = dG + (size_t)i * dk;
            for (int j = i0; j < i; j++) {
                real a = dM[(size_t)i * L + j];
                if (a == 0) continue;
                const real *yj = Y + (int64_t)j * ldy, *ex = ws->ex;
                real *dyj = dY + (size_t)j * dk;
                double *dGj = dG + (size_t)j * dk;
                kda_pair_decays(ws->ex, Gi, G + (size_t)j * dk, dk);
#pragma omp simd
                for (int c = 0; c < dk; c++) {
                    real e = a * ex[c];
                    double t = (double)(e * yj[c]) * xi[c];
                    dxi[c] += e * yj[c];
                    dyj[c] += e * xi[c];
                    dGi[c] += t;
                    dGj[c] -= t;
                }
            }
            real a = strict ? 0 : dM[(size_t)i * L + i];   // the diagonal: E_ii = 1
            const real *yi = Y + (int64_t)i * ldy;
            for (int c = 0; c < dk && a != 0; c++) {
                dxi[c] += a * yi[c];
                dY[(size_t)i * dk + c] += a * xi[c];
            }
        }
    }
}

// dR (L, dv) = (I + A)^-T dD for the strictly lower A: row i is dD_i -
// sum_{m>i} A_mi dR_m (back substitution), summed in double.
static void solve_upper(const real *A, int L, const real *dD, real *dR, int dv, double *acc) {
    for (int i = L - 1; i >= 0; i--) {
        for (int c = 0; c < dv; c++) acc[c] = dD[i * dv + c];
        for (int m = i + 1; m < L; m++) {
            double a = A[(size_t)m * L + i];
            if (a == 0) continue;
            const real *Rm = dR + (size_t)m * dv;
            for (int c = 0; c < dv; c++) acc[c] -= a * Rm[c];
        }
        for (int c = 0; c < dv; c++) dR[i * dv + c] = (real)acc[c];
    }
}

// The terms through O = Qg S0 + P Delta for dO (rows of stride ldv): adds
// into dq (may be NULL), gr->dK, dG, dS0 and dDl.
static void output_backward(KdaChunk *ws, KdaChunkGrad *gr, const real *S0, const real *dO, const real *q,
                            const real *k, int ldk, int ldv, real *dq) {
    int L = ws->L, dk = ws->dk, dv = ws->dv;
    // dQg = dO S0^T, dS0 += Qg^T dO; Qg_i = eG_i * q_i.
    tile_gemm(false, true, L, dk, dv, 1, dO, ldv, S0, dv, 0, gr->dQg, dk, TILE_FULL(L, dv), ws->pack);
    tile_gemm(true, false, dk, dv, L, 1, ws->Qg, dk, dO, ldv, 1, gr->dS0, dv, TILE_FULL(dk, L), NULL);
    for (size_t e = 0; e < (size_t)L * dk; e++) {
        gr->dG[e] += (double)ws->Qg[e] * gr->dQg[e];
        if (dq) dq[(int64_t)(e / dk) * ldk + e % dk] += ws->eG[e] * gr->dQg[e];
    }
    // dP = dO Delta^T, dDelta += P^T dO (P^T upper), then through P's decayed product.
    tile_gemm(false, true, L, L, dv, 1, dO, ldv, ws->Dl, dv, 0, gr->dM, L, TILE_FULL(L, dv), ws->pack);
    tile_gemm(true, false, L, dv, L, 1, ws->P, L, dO, ldv, 1, gr->dDl, dv, 0, L, NULL);
    decay_product_backward(ws, gr->dM, q, ldk, k, ldk, false, gr->dX, gr->dY, gr->dG);
    for (int i = 0; i < L; i++)
        for (int c = 0; c < dk; c++) {
            if (dq) dq[(int64_t)i * ldk + c] += gr->dX[(size_t)i * dk + c];
            gr->dK[(size_t)i * dk + c] += gr->dY[(size_t)i * dk + c];
        }
}

// The terms through Delta = (I + A)^-1 R, R = diag(beta) V - Xw S0, A =
// diag(beta) KKE, for gr->dDl: adds into dv_out (may be NULL), gr->dK, dG,
// dbeta and dS0.
static void solve_backward(KdaChunk *ws, KdaChunkGrad *gr, const real *S0, const real *k, const real *v, int ldk,
                           int ldv, real *dv_out) {
    int L = ws->L, dk = ws->dk, dv = ws->dv;
    const real *bet = ws->bet;
    solve_upper(ws->A, L, gr->dDl, gr->dR, dv, ws->acc);
    // R: dXw = -dR S0^T, dS0 -= Xw^T dR, dV = diag(beta) dR, dbeta_i += dR_i . v_i.
    tile_gemm(false, true, L, dk, dv, -1, gr->dR, dv, S0, dv, 0, gr->dXw, dk, TILE_FULL(L, dv), ws->pack);
    tile_gemm(true, false, dk, dv, L, -1, ws->Xw, dk, gr->dR, dv, 1, gr->dS0, dv, TILE_FULL(dk, L), NULL);
    for (int i = 0; i < L; i++) {
        const real *dri = gr->dR + (size_t)i * dv, *vi = v + (int64_t)i * ldv;
        double s = 0;
        for (int c = 0; c < dv; c++) {
            s += (double)dri[c] * vi[c];
            if (dv_out) dv_out[(int64_t)i * ldv + c] += bet[i] * dri[c];
        }
        gr->dbeta[i] += s;
        // Xw_i = beta_i eG_i * k_i.
        for (int c = 0; c < dk; c++) {
            size_t e = (size_t)i * dk + c;
            real dx = gr->dXw[e];
            gr->dK[e] += bet[i] * ws->eG[e] * dx;
            gr->dbeta[i] += (double)ws->eG[e] * k[(int64_t)i * ldk + c] * dx;
            gr->dG[e] += (double)ws->Xw[e] * dx;
        }
    }
    // dA = -dR Delta^T (strictly lower); A_ij = beta_i KKE_ij.
    real *dA = gr->dM;
    tile_gemm(false, true, L, L, dv, -1, gr->dR, dv, ws->Dl, dv, 0, dA, L, TILE_FULL(L, dv), ws->pack);
    for (int i = 0; i < L; i++) {
        double s = 0;
        for (int j = 0; j < i; j++) {
            s += (double)dA[(size_t)i * L + j] * ws->KKE[(size_t)i * L + j];
            dA[(size_t)i * L + j] *= bet[i];   // now dKKE
        }
        gr->dbeta[i] += s;
    }
    decay_product_backward(ws, dA, k, ldk, k, ldk, true, gr->dX, gr->dY, gr->dG);
    for (size_t e = 0; e < (size_t)L * dk; e++) gr->dK[e] += gr->dX[e] + gr->dY[e];
}

// One chunk: given dS (the gradient of S_C) and dO (rows of stride ldv, or
// NULL), add into dq, dk, dv, dbeta, dg (each may be NULL) and write the
// gradient of the entering state into gr->dS0.
static void chunk_backward(KdaChunk *ws, KdaChunkGrad *gr, const real *S0, const real *dS, const real *dO,
                           const real *q, const real *k, const real *v, int ldk, int ldv, int H, real *dq,
                           real *dk_out, real *dv_out, real *dbeta_out, real *dg_out) {
    int L = ws->L, dk = ws->dk, dv = ws->dv;
    double *dG = gr->dG;
    memset(dG, 0, (size_t)L * dk * sizeof(double));
    memset(gr->dbeta, 0, L * sizeof(double));
    memset(gr->dK, 0, (size_t)L * dk * sizeof(real));

    // S_C = Diag(bl) S0 + Kd^T Delta; bl = exp(Gamma_{L-1}) (or 0).
    for (int i = 0; i < dk; i++) {
        double s = 0;
        for (int j = 0; j < dv; j++) {
            s += (double)dS[i * dv + j] * S0[i * dv + j];
            gr->dS0[i * dv + j] = ws->bl[i] * dS[i * dv + j];
        }
        dG[(size_t)(L - 1) * dk + i] += ws->bl[i] * s;
    }
    // dDelta = Kd dS, dKd = Delta dS^T; Kd_j = exp(Gamma_{L-1} - Gamma_j) * k_j.
    tile_gemm(false, false, L, dv, dk, 1, ws->Kd, dk, dS, dv, 0, gr->dDl, dv, TILE_FULL(L, dk), NULL);
    tile_gemm(false, true, L, dk, dv, 1, ws->Dl, dv, dS, dv, 0, gr->dKd, dk, TILE_FULL(L, dv), ws->pack);
    for (int j = 0; j < L; j++)
        for (int c = 0; c < dk; c++) {
            size_t e = (size_t)j * dk + c;
            gr->dK[e] += ws->ek[e] * gr->dKd[e];
            if (j == L - 1) continue;   // exp(Gamma_{L-1} - Gamma_{L-1}) = 1 has no derivative
            double s = (double)ws->Kd[e] * gr->dKd[e];
            dG[(size_t)(L - 1) * dk + c] += s;
            dG[e] -= s;
        }

    if (dO) output_backward(ws, gr, S0, dO, q, k, ldk, ldv, dq);
    solve_backward(ws, gr, S0, k, v, ldk, ldv, dv_out);

    if (dk_out)
        for (int i = 0; i < L; i++)
            for (int c = 0; c < dk; c++) dk_out[(int64_t)i * ldk + c] += gr->dK[(size_t)i * dk + c];
    if (dbeta_out)
        for (int i = 0; i < L; i++) dbeta_out[(int64_t)i * H] += (real)gr->dbeta[i];
    if (dg_out)   // dg_m = sum_{i >= m} dGamma_i, per channel
        for (int c = 0; c < dk; c++) {
            double acc = 0;
            for (int i = L - 1; i >= 0; i--) {
                acc += dG[(size_t)i * dk + c];
                dg_out[(int64_t)i * ldk + c] += (real)acc;
            }
        }
}

void kda_chunk_backward(Node *n) {
    KdaDims d = kda_dims(n);
    const real *q = n->in[KDA_IN_Q]->data, *k = n->in[KDA_IN_K]->data, *v = n->in[KDA_IN_V]->data;
    const real *beta = n->in[KDA_IN_BETA]->data, *g = n->in[KDA_IN_G]->data;
    real *dq = NODE_GRAD_IN(n, KDA_IN_Q), *dk = NODE_GRAD_IN(n, KDA_IN_K), *dv = NODE_GRAD_IN(n, KDA_IN_V);
    real *dbeta = NODE_GRAD_IN(n, KDA_IN_BETA), *dg = NODE_GRAD_IN(n, KDA_IN_G);
    real *ds0 = NODE_GRAD_IN(n, KDA_IN_S0);
    const real *dout = n->out[0]->grad, *dsT = n->out[1]->grad;   // either may be NULL
    const real *saved = n->saved;
    const int *first = n->aux;
    int64_t SS = (int64_t)d.dk * d.dv;
    // Per thread: the chunk workspace, its gradients, and dS, one slot each.
    size_t b_ws = kda_chunk_bytes(d.C, d.dk, d.dv);   // both multiples of 64 (gdn_carve)
    size_t b_gr = grad_layout(NULL, NULL, d.C, d.dk, d.dv);
    size_t stride;
    unsigned char *slots = tape_thread_slots(n->tape, b_ws + b_gr + SS * sizeof(real), &stride);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < d.B; b++)
        for (int h = 0; h < d.H; h++) {
            unsigned char *slot = slots + stride * (size_t)omp_get_thread_num();
            KdaChunk ws;
            KdaChunkGrad gr;
            kda_chunk_bind(&ws, slot, d.C, d.dk, d.dv);
            grad_layout(&gr, slot + b_ws, d.C, d.dk, d.dv);
            real *dS = (real *)(slot + b_ws + b_gr);   // gradient of the state leaving the chunk
            if (dsT) memcpy(dS, dsT + gdn_off_s(&d, b, h), SS * sizeof(real));
            else memset(dS, 0, SS * sizeof(real));
            for (int c = d.NC - 1; c >= 0; c--) {
                int t0 = c * d.C, L = imin(d.C, d.T - t0);
                const real *S0 = saved + (((int64_t)b * d.H + h) * d.NC + c) * SS;
                int64_t ok = gdn_off_k(&d, b, t0, h), ov = gdn_off_v(&d, b, t0, h), oh = gdn_off_h(&d, b, t0, h);
                const int *db = gdn_chunk_docs(ws.db, first, &d, b, t0, L);
                kda_chunk_prepare(&ws, L, q + ok, k + ok, v + ov, beta + oh, g + ok, d.ldk, d.ldv, d.H, S0, db);
                chunk_backward(&ws, &gr, S0, dS, dout ? dout + ov : NULL, q + ok, k + ok, v + ov, d.ldk, d.ldv, d.H,
                               dq ? dq + ok : NULL, dk ? dk + ok : NULL, dv ? dv + ov : NULL,
                               dbeta ? dbeta + oh : NULL, dg ? dg + ok : NULL);
                memcpy(dS, gr.dS0, SS * sizeof(real));
            }
            if (ds0)
                for (int64_t i = 0; i < SS; i++) ds0[gdn_off_s(&d, b, h) + i] += dS[i];
        }
}
