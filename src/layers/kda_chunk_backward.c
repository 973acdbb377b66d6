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
// computed through the same reference points and per-element exps as the
// forward (kda_sub_columns decides, per sub-block and channel, as there), so
// here too every exp is of a non-positive number or of one at most
// KDA_SPAN_MAX.
// The solve: Delta = (I + A)^-1 R gives dR = (I + A)^-T dDelta (back
// substitution) and dA = -dR Delta^T (strictly lower).
// Under bf16 (the node's KDA_ARG_BF16) the products kda_chunk.c's header
// lists run with bf16 operands (ws->tc); the state's products stay float32
// (tile_gemm).
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
    real *dQ;        // (L, dk) dQ through P, accumulated
    real *dP;        // (L, L) dP (when o has a gradient)
    real *dM;        // (L, L) dA, then dKKE
    real *dqsub, *dksub;   // (KDA_SUB, dk) the slow channels' dq, dk of a sub-block (kda_sub_columns)
    double *dGsub;   // (KDA_SUB, dk) and their dGamma
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
    TAKE(dQ, Lk, real);
    TAKE(dP, (size_t)C * C, real);
    TAKE(dM, (size_t)C * C, real);
    TAKE(dqsub, KDA_SUB * dk, real);
    TAKE(dksub, KDA_SUB * dk, real);
    TAKE(dGsub, KDA_SUB * dk, double);
    TAKE(dS0, (size_t)dk * dv, real);
#undef TAKE
    return at;
}

// The backward of the decayed products (kda_sub_products) KKE and P, for
// dKKE (gr->dM) and dP (gr->dP, or NULL: o has no gradient), adds into
// gr->dQ, gr->dK and dG. Each pair (i, j < i) adds a term to dG_i and takes
// one from dG_j, so that they cancel in dg where they should; the diagonal of
// P (exponent 0) adds none: its terms, X_i dX_i - Y_i dY_i summed, would
// cancel only to rounding of their own size, which may be far above dg's (g ~
// -30: dg ~ e^-30).

// First the entries the products did not form are zeroed.
static void mask_products(const KdaChunk *ws, real *dKKE, real *dP) {
    int L = ws->L;
    for (int i = 0; i < L; i++) {
        real *dKi = dKKE + (size_t)i * L, *dPi = dP ? dP + (size_t)i * L : NULL;
        for (int j = i; j < L; j++) dKi[j] = 0;
        for (int j = i + 1; j < L && dPi; j++) dPi[j] = 0;
        for (int j = 0; ws->docs && j < ws->docs[i]; j++) {
            dKi[j] = 0;
            if (dPi) dPi[j] = 0;
        }
    }
}

// The slow channels' pairs inside the sub-block of rows i0 .. i0+n-1 (j < i),
// an exp per element, over those channels packed (kda_sub_pack); the sums are
// scattered back at the end.
static void sub_per_element_backward(KdaChunk *ws, KdaChunkGrad *gr, const real *dP, const real *q, const real *k,
                                     int ldk, int i0, int n, int ns) {
    int L = ws->L, dk = ws->dk;
    kda_sub_pack(ws, q, k, ldk, i0, n, ns);
    memset(gr->dqsub, 0, (size_t)n * ns * sizeof(real));
    memset(gr->dksub, 0, (size_t)n * ns * sizeof(real));
    memset(gr->dGsub, 0, (size_t)n * ns * sizeof(double));
    for (int i = 1; i < n; i++) {
        const real *qi = ws->qsub + i * ns, *ki = ws->ksub + i * ns, *ex = ws->ex;
        real *dqi = gr->dqsub + i * ns, *dki = gr->dksub + i * ns;
        double *dGi = gr->dGsub + i * ns;
        for (int j = 0; j < i; j++) {
            real a = dP ? dP[(size_t)(i0 + i) * L + i0 + j] : 0, b = gr->dM[(size_t)(i0 + i) * L + i0 + j];
            if (a == 0 && b == 0) continue;   // masked (documents), or no gradient
            const real *kj = ws->ksub + j * ns;
            real *dkj = gr->dksub + j * ns;
            double *dGj = gr->dGsub + j * ns;
            kda_pair_decays(ws->ex, ws->Gsub + i * ns, ws->Gsub + j * ns, ns);
#pragma omp simd
            for (int s = 0; s < ns; s++) {
                real ea = a * ex[s], eb = b * ex[s];
                double t = (double)(ea * kj[s]) * qi[s] + (double)(eb * kj[s]) * ki[s];
                dqi[s] += ea * kj[s];
                dki[s] += eb * kj[s];
                dkj[s] += ea * qi[s] + eb * ki[s];
                dGi[s] += t;
                dGj[s] -= t;
            }
        }
    }
    for (int i = 0; i < n; i++)
        for (int s = 0; s < ns; s++) {
            size_t e = (size_t)(i0 + i) * dk + ws->slow[s];
            gr->dQ[e] += gr->dqsub[i * ns + s];
            gr->dK[e] += gr->dksub[i * ns + s];
            gr->dG[e] += gr->dGsub[i * ns + s];
        }
}

// One sub-block's rows i0 .. i0+n-1 against the columns the forward's
// products covered, through its reference point (kda_sub_columns):
//   T1 = dM Ys (rows),  dX_i += Ef_i * T1_i,  dG_i += Xs_i * T1_i
//   T2 = dM^T Xs (columns),  dY_j += Ec_j * T2_j,  dG_j -= Ys_j * T2_j
// for (X, M) = (K, KKE) and (Q, P), Y = K; then the slow channels per element.
static void sub_backward(KdaChunk *ws, KdaChunkGrad *gr, real *dP, const real *q, const real *k, int ldk, int i0,
                         int n) {
    int L = ws->L, dk = ws->dk;
    int ns = kda_sub_columns(ws, k, ldk, i0, n);
    int N = ns < dk ? i0 + n : i0;
    real *dKb = gr->dM + (size_t)i0 * L, *dPb = dP ? dP + (size_t)i0 * L : NULL;
    if (dPb)   // the diagonal, E_ii = 1, then out of the products (no dG)
        for (int i = 0; i < n; i++) {
            real a = dPb[(size_t)i * L + i0 + i];
            const real *qi = q + (int64_t)(i0 + i) * ldk, *ki = k + (int64_t)(i0 + i) * ldk;
            for (int c = 0; c < dk && a != 0; c++) {
                gr->dQ[(size_t)(i0 + i) * dk + c] += a * ki[c];
                gr->dK[(size_t)(i0 + i) * dk + c] += a * qi[c];
            }
            dPb[(size_t)i * L + i0 + i] = 0;
        }
    if (N > 0) {
        const real *Qs = ws->Qs + (size_t)i0 * dk, *Ks = ws->Ks + (size_t)i0 * dk;
        real *T1k = ws->T1, *T1p = ws->T1 + KDA_SUB * dk, *T2 = ws->T2;
        const TileCtx *tc = &ws->tc;
        tile_ctx_gemm(tc, false, false, n, dk, N, 1, dKb, L, ws->Ys, dk, 0, T1k, dk, TILE_FULL(n, N), NULL);
        tile_ctx_gemm(tc, true, false, N, dk, n, 1, dKb, L, Ks, dk, 0, T2, dk, TILE_FULL(N, n), NULL);
        if (dPb) {
            tile_ctx_gemm(tc, false, false, n, dk, N, 1, dPb, L, ws->Ys, dk, 0, T1p, dk, TILE_FULL(n, N), NULL);
            tile_ctx_gemm(tc, true, false, N, dk, n, 1, dPb, L, Qs, dk, 1, T2, dk, TILE_FULL(N, n), NULL);
        }
        // Rows of locals, the dP terms in a loop of their own but after the
        // dKKE ones per element as before (stores through gr's and ws's
        // members, and the branch, kept these loops scalar).
        for (int i = 0; i < n; i++) {
            size_t e0 = (size_t)(i0 + i) * dk, b0 = (size_t)i * dk;
            real *restrict dK = gr->dK + e0, *restrict dQ = gr->dQ + e0;
            double *restrict dG = gr->dG + e0;
            const real *Ef = ws->Ef + e0, *t1k = T1k + b0, *t1p = T1p + b0, *ks = Ks + b0, *qs = Qs + b0;
#pragma omp simd
            for (int c = 0; c < dk; c++) {
                dK[c] += Ef[c] * t1k[c];
                dG[c] += (double)ks[c] * t1k[c];
            }
            if (!dPb) continue;
#pragma omp simd
            for (int c = 0; c < dk; c++) {
                dQ[c] += Ef[c] * t1p[c];
                dG[c] += (double)qs[c] * t1p[c];
            }
        }
        for (int j = 0; j < N; j++) {
            size_t e0 = (size_t)j * dk;
            real *restrict dK = gr->dK + e0;
            double *restrict dG = gr->dG + e0;
            const real *Ec = ws->Ec + e0, *t2 = T2 + e0, *ys = ws->Ys + e0;
#pragma omp simd
            for (int c = 0; c < dk; c++) {
                dK[c] += Ec[c] * t2[c];
                dG[c] -= (double)ys[c] * t2[c];
            }
        }
    }
    if (ns) sub_per_element_backward(ws, gr, dP, q, k, ldk, i0, n, ns);
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
// into dq (may be NULL), dG, dS0 and dDl, and sets gr->dP.
static void output_backward(KdaChunk *ws, KdaChunkGrad *gr, const real *S0, const real *dO, int ldk, int ldv,
                            real *dq) {
    int L = ws->L, dk = ws->dk, dv = ws->dv;
    // dQg = dO S0^T, dS0 += Qg^T dO; Qg_i = eG_i * q_i.
    tile_ctx_gemm(&ws->tc, false, true, L, dk, dv, 1, dO, ldv, S0, dv, 0, gr->dQg, dk, TILE_FULL(L, dv), ws->pack);
    tile_ctx_gemm(&ws->tc, true, false, dk, dv, L, 1, ws->Qg, dk, dO, ldv, 1, gr->dS0, dv, TILE_FULL(dk, L), NULL);
    for (size_t e = 0; e < (size_t)L * dk; e++) gr->dG[e] += (double)ws->Qg[e] * gr->dQg[e];
    for (int i = 0; i < L && dq; i++)
        for (int c = 0; c < dk; c++) dq[(int64_t)i * ldk + c] += ws->eG[(size_t)i * dk + c] * gr->dQg[(size_t)i * dk + c];
    // dP = dO Delta^T (through P's products with the solve's, decay_products_backward),
    // dDelta += P^T dO (P^T upper).
    tile_ctx_gemm(&ws->tc, false, true, L, L, dv, 1, dO, ldv, ws->Dl, dv, 0, gr->dP, L, TILE_FULL(L, dv), ws->pack);
    tile_ctx_gemm(&ws->tc, true, false, L, dv, L, 1, ws->P, L, dO, ldv, 1, gr->dDl, dv, 0, L, NULL);
}

// The terms through Delta = (I + A)^-1 R, R = diag(beta) V - Xw S0, A =
// diag(beta) KKE, for gr->dDl: adds into dv_out (may be NULL), gr->dK, dG,
// dbeta and dS0, and sets gr->dM = dKKE.
static void solve_backward(KdaChunk *ws, KdaChunkGrad *gr, const real *S0, const real *k, const real *v, int ldk,
                           int ldv, real *dv_out) {
    int L = ws->L, dk = ws->dk, dv = ws->dv;
    const real *bet = ws->bet;
    solve_upper(ws->A, L, gr->dDl, gr->dR, dv, ws->acc);
    // R: dXw = -dR S0^T, dS0 -= Xw^T dR (float32: the state's recurrence),
    // dV = diag(beta) dR, dbeta_i += dR_i . v_i.
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
    tile_ctx_gemm(&ws->tc, false, true, L, L, dv, -1, gr->dR, dv, ws->Dl, dv, 0, dA, L, TILE_FULL(L, dv), ws->pack);
    for (int i = 0; i < L; i++) {
        double s = 0;
        for (int j = 0; j < i; j++) {
            s += (double)dA[(size_t)i * L + j] * ws->KKE[(size_t)i * L + j];
            dA[(size_t)i * L + j] *= bet[i];   // now dKKE
        }
        gr->dbeta[i] += s;
    }
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
    // dDelta = Kd dS, dKd = Delta dS^T (float32: the state's recurrence);
    // Kd_j = exp(Gamma_{L-1} - Gamma_j) * k_j.
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

    if (dO) output_backward(ws, gr, S0, dO, ldk, ldv, dq);
    solve_backward(ws, gr, S0, k, v, ldk, ldv, dv_out);
    // KKE and P (without dO, KKE alone), sharing each sub-block's decays.
    real *dP = dO ? gr->dP : NULL;
    mask_products(ws, gr->dM, dP);
    memset(gr->dQ, 0, (size_t)L * dk * sizeof(real));
    for (int i0 = 0; i0 < L; i0 += KDA_SUB) sub_backward(ws, gr, dP, q, k, ldk, i0, imin(KDA_SUB, L - i0));
    if (dq && dO)
        for (int i = 0; i < L; i++)
            for (int c = 0; c < dk; c++) dq[(int64_t)i * ldk + c] += gr->dQ[(size_t)i * dk + c];

    if (dk_out)
        for (int i = 0; i < L; i++)
            for (int c = 0; c < dk; c++) dk_out[(int64_t)i * ldk + c] += gr->dK[(size_t)i * dk + c];
    if (dbeta_out)
        for (int i = 0; i < L; i++) dbeta_out[(int64_t)i * H] += (real)gr->dbeta[i];
    if (dg_out) {   // dg_m = sum_{i >= m} dGamma_i, per channel (a row at a time: dg_out's rows are contiguous)
        double *acc = ws->acc;
        memset(acc, 0, dk * sizeof(double));
        for (int i = L - 1; i >= 0; i--)
            for (int c = 0; c < dk; c++) {
                acc[c] += dG[(size_t)i * dk + c];
                dg_out[(int64_t)i * ldk + c] += (real)acc[c];
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
            kda_chunk_tiles(&ws, n);   // the forward's kind, whatever is selected now
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
            kda_chunk_tiles_end(&ws);
        }
}
