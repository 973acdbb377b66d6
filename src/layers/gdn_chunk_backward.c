// gdn_chunk_backward.c: the backward of the chunked (WY) Gated DeltaNet.
//
// Chunks are visited in reverse. Each one reloads the state S0 that entered
// it (saved by the forward), recomputes E, A, Tm, Xw, R, Delta and P with
// gdn_chunk_prepare, and back-propagates through the lines of gdn_chunk.c in
// reverse order, carrying dS (the gradient of the state leaving the chunk)
// to the previous chunk. With Gamma the in-chunk cumulative log decay, every
// decay factor's derivative lands on dGamma, and dg_m = sum_{i >= m} dGamma_i.
//
// The triangular solve: Tm = (I + A)^-1 and Delta = Tm R, R = Xu - Xw S0 give
//   dR = Tm^T dDelta (= dXu),  dXw = -dR S0^T,  dS0 -= Xw^T dR,
//   dA = -Tm^T dTm Tm^T = -Tm^T dDelta R^T Tm^T = -dR Delta^T (strictly lower).
// (In the W, U form the same lines read dW = -dDelta S0^T, dXw = Tm^T dW,
// dA = -(dXw W^T + dXu U^T): two products more, and W^T, U^T to transpose.)
// Documents: the decay factors are read from the chunk's masked E, bm, ek
// and bl (gdn_kernel.h), so every term across a boundary has a zero factor.
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "gdn_kernel.h"
#include "tile_amx.h"
#include "tile_mm.h"

static real dot(const real *a, const real *b, int n) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return (real)s;
}

// Gradient buffers of one chunk beyond those in GdnChunk.
typedef struct GdnChunkGrad {
    double *dG;      // (L) dLoss/dGamma_i
    double *dbeta;   // (L)
    double *colZ;    // (L) column sums of a chunk's (L, L) dG terms
    real *dDl;       // (L, dv) dDelta
    real *dK;        // (L, dk) dK of the chunk, accumulated
    real *dKd;       // (L, dk)
    real *dXw;       // (L, dk)
    real *dXu;       // (L, dv) dR = dXu
    real *Y;         // (L, dv) dY = diag(b) dO
    real *Z;         // (L, dk) dO S0^T
    real *S0t;       // (dv, dk) S0^T, the right operand of dO S0^T and dR S0^T
    real *Dlt;       // (dv, L) Delta^T, the right operand of dO Delta^T and dR Delta^T
    real *dA;        // (L, L) dP -> dQK, then dA -> dKK
    real *dS0;       // (dk, dv) gradient of the state entering the chunk
} GdnChunkGrad;

// Carve a chunk's gradient buffers out of mem as chunk_layout does (each on
// a 64-byte boundary); with mem NULL only count the bytes.
static size_t grad_layout(GdnChunkGrad *gr, unsigned char *mem, int C, int dk, int dv) {
    size_t at = 0;
    GdnChunkGrad counting;   // mem NULL: the fields are set (to NULL) in a throwaway
    if (!mem) gr = &counting;
#define TAKE(field, n, type) (gr->field = (type *)gdn_carve(mem, &at, (size_t)(n), sizeof(type)))
    TAKE(dG, C, double);
    TAKE(dbeta, C, double);
    TAKE(colZ, C, double);
    TAKE(dDl, (size_t)C * dv, real);
    TAKE(dXu, (size_t)C * dv, real);
    TAKE(Y, (size_t)C * dv, real);
    TAKE(dK, (size_t)C * dk, real);
    TAKE(dKd, (size_t)C * dk, real);
    TAKE(dXw, (size_t)C * dk, real);
    TAKE(Z, (size_t)C * dk, real);
    TAKE(S0t, (size_t)dk * dv, real);
    TAKE(Dlt, (size_t)dv * C, real);
    TAKE(dA, (size_t)C * C, real);
    TAKE(dS0, (size_t)dk * dv, real);
#undef TAKE
    return at;
}

// The terms through O = diag(b) Q S0 + P Delta, for dO (rows of stride ldv).
// With Z = dO S0^T: dQ += diag(b) Z, and dGamma_i += b_i dO_i . (Q S0)_i =
// b_i q_i . Z_i, so Q S0 is not formed. Reads gr->S0t and gr->Dlt; adds into
// dq (may be NULL), gr->dK, gr->dG, gr->dS0 and gr->dDl; leaves dQK in gr->dA.
static void output_backward(const GdnChunk *ws, GdnChunkGrad *gr, const real *dO, const real *q, const real *k, int ldk,
                            int ldv, real *dq) {
    int L = ws->L, dk = ws->dk, dv = ws->dv;
    const real *E = ws->E, *P = ws->P, *S0t = gr->S0t, *Dlt = gr->Dlt;
    double *dG = gr->dG;
    real *dK = gr->dK, *dA = gr->dA, *dS0 = gr->dS0;
    real *Y = gr->Y, *Z = gr->Z;
    tile_ctx_gemm(&ws->tc, false, false, L, dk, dv, 1, dO, ldv, S0t, dk, 0, Z, dk, TILE_FULL(L, dv), NULL);
    for (int i = 0; i < L; i++) {
        real bi = ws->bm[i];
        const real *doi = dO + (int64_t)i * ldv, *zi = Z + i * dk;
        dG[i] += bi * dot(q + (int64_t)i * ldk, zi, dk);
        if (dq)
            for (int c = 0; c < dk; c++) dq[(int64_t)i * ldk + c] += bi * zi[c];
        for (int c = 0; c < dv; c++) Y[i * dv + c] = bi * doi[c];   // dY
    }
    // dS0 += Q^T dY
    tile_ctx_gemm(&ws->tc, true, false, dk, dv, L, 1, q, ldk, Y, dv, 1, dS0, dv, TILE_FULL(dk, L), NULL);
    real *dP = dA;
    // dP = dO Delta^T, lower (the rest is zeroed below)
    tile_ctx_gemm_lower(&ws->tc, L, dv, 1, dO, ldv, Dlt, L, 0, dP, L);
    // dDelta += P^T dO (P^T upper)
    tile_ctx_gemm(&ws->tc, true, false, L, dv, L, 1, P, L, dO, ldv, 1, gr->dDl, dv, 0, L, NULL);
    // f_ij = dP_ij P_ij (j < i) adds to dG_i and leaves dG_j: row sums,
    // and column sums in colZ.
    double *colZ = gr->colZ;
    memset(colZ, 0, L * sizeof(double));
    for (int i = 0; i < L; i++) {
        real *dpi = dP + i * L;
        const real *Ei = E + i * L;
        dG[i] += dot_into_cols(dpi, P + i * L, i, colZ);
        for (int j = 0; j <= i; j++) dpi[j] *= Ei[j];   // now dQK
        for (int j = i + 1; j < L; j++) dpi[j] = 0;
    }
    for (int j = 0; j < L; j++) dG[j] -= colZ[j];
    // dQ += dQK K (lower)
    if (dq) tile_ctx_gemm(&ws->tc, false, false, L, dk, L, 1, dP, L, k, ldk, 1, dq, ldk, -L, 0, NULL);
    // dK += dQK^T Q
    tile_ctx_gemm(&ws->tc, true, false, L, dk, L, 1, dP, L, q, ldk, 1, dK, dk, 0, L, NULL);
}

// One chunk: given dS (the gradient of S_C) and dO (rows of stride ldv, or
// NULL), add into dq, dk, dv, dbeta, dg (each may be NULL) and write the
// gradient of the entering state into gr->dS0.
static void chunk_backward(const GdnChunk *ws, GdnChunkGrad *gr, const real *S0, const real *dS, const real *dO,
                           const real *q, const real *k, const real *v, int ldk, int ldv, int H, real *dq,
                           real *dk_out, real *dv_out, real *dbeta_out, real *dg_out) {
    int L = ws->L, dk = ws->dk, dv = ws->dv;
    int64_t SS = (int64_t)dk * dv;
    const real *E = ws->E, *bet = ws->bet;
    double *dG = gr->dG, *dbeta = gr->dbeta;
    real *dK = gr->dK, *dA = gr->dA, *dS0 = gr->dS0, *pk = ws->pack;
    memset(dG, 0, L * sizeof(double));
    memset(dbeta, 0, L * sizeof(double));
    memset(dK, 0, (size_t)L * dk * sizeof(real));

    // S_C = b_{L-1} S0 + Kd^T Delta.
    real bl = ws->bl;
    for (int64_t i = 0; i < SS; i++) dS0[i] = bl * dS[i];
    dG[L - 1] += bl * dot(dS, S0, (int)SS);
    // dDelta = Kd dS
    tile_ctx_gemm(&ws->tc, false, false, L, dv, dk, 1, ws->Kd, dk, dS, dv, 0, gr->dDl, dv, TILE_FULL(L, dk), NULL);
    real *dKd = gr->dKd;
    // dKd = Delta dS^T
    tile_ctx_gemm(&ws->tc, false, true, L, dk, dv, 1, ws->Dl, dv, dS, dv, 0, dKd, dk, TILE_FULL(L, dv), pk);
    for (int j = 0; j < L; j++) {
        real e = ws->ek[j];
        const real *kj = k + (int64_t)j * ldk;
        for (int c = 0; c < dk; c++) dK[j * dk + c] += e * dKd[j * dk + c];
        if (j == L - 1) continue;   // exp(Gamma_{L-1} - Gamma_{L-1}) = 1 has no derivative
        double s = e * dot(dKd + j * dk, kj, dk);
        dG[L - 1] += s;
        dG[j] -= s;
    }

    // S0^T and Delta^T, packed once each for two products.
    real *S0t = gr->S0t, *Dlt = gr->Dlt;
    pack_transposed(S0t, dk, S0, dv, dk, dv);
    pack_transposed(Dlt, L, ws->Dl, dv, L, dv);

    // O = diag(b) Q S0 + P Delta.
    if (dO) output_backward(ws, gr, dO, q, k, ldk, ldv, dq);

    // Delta = Tm R, R = Xu - Xw S0 (header): dR = Tm^T dDelta, dXw = -dR S0^T,
    // dS0 -= Xw^T dR, dA = -dR Delta^T (lower: only j < i is read; the rest is zeroed below).
    // Tm^T upper
    tile_ctx_gemm(&ws->tc, true, false, L, dv, L, 1, ws->Tm, ws->ldt, gr->dDl, dv, 0, gr->dXu, dv, 0, L, NULL);
    tile_ctx_gemm(&ws->tc, false, false, L, dk, dv, -1, gr->dXu, dv, S0t, dk, 0, gr->dXw, dk, TILE_FULL(L, dv), NULL);
    tile_ctx_gemm(&ws->tc, true, false, dk, dv, L, -1, ws->Xw, dk, gr->dXu, dv, 1, dS0, dv, TILE_FULL(dk, L), NULL);
    tile_ctx_gemm_lower(&ws->tc, L, dv, -1, gr->dXu, dv, Dlt, L, 0, dA, L);

    // Xw_i = beta_i b_i k_i, Xu_i = beta_i v_i.
    for (int i = 0; i < L; i++) {
        real bi = ws->bm[i], sw = bet[i] * bi;
        const real *ki = k + (int64_t)i * ldk, *vi = v + (int64_t)i * ldv;
        const real *dxw = gr->dXw + i * dk, *dxu = gr->dXu + i * dv;
        for (int c = 0; c < dk; c++) dK[i * dk + c] += sw * dxw[c];
        double s = dot(dxw, ki, dk);
        dbeta[i] += bi * s;
        dG[i] += sw * s;
        if (dv_out)
            for (int c = 0; c < dv; c++) dv_out[(int64_t)i * ldv + c] += bet[i] * dxu[c];
        dbeta[i] += dot(dxu, vi, dv);
    }

    // A_ij = beta_i E_ij KK_ij (j < i); KK = K K^T.
    // As above: row sums into dbeta_i and dG_i, column sums out of dG_j.
    double *colZ = gr->colZ;
    memset(colZ, 0, L * sizeof(double));
    for (int i = 0; i < L; i++) {
        real *dai = dA + i * L;
        const real *Ei = E + i * L, *KKi = ws->KK + i * L;
        double rb = 0;
#pragma omp simd reduction(+ : rb)
        for (int j = 0; j < i; j++) rb += (double)dai[j] * (Ei[j] * KKi[j]);
        dbeta[i] += rb;
        dG[i] += dot_into_cols(dai, ws->A + i * L, i, colZ);
        for (int j = 0; j < i; j++) dai[j] = dai[j] * bet[i] * Ei[j];   // now dKK
        for (int j = i; j < L; j++) dai[j] = 0;
    }
    for (int j = 0; j < L; j++) dG[j] -= colZ[j];
    tile_ctx_gemm(&ws->tc, false, false, L, dk, L, 1, dA, L, k, ldk, 1, dK, dk, -L, 0, NULL);   // dK += dKK K (lower)
    tile_ctx_gemm(&ws->tc, true, false, L, dk, L, 1, dA, L, k, ldk, 1, dK, dk, 0, L, NULL);   // dK += dKK^T K

    if (dk_out)
        for (int i = 0; i < L; i++)
            for (int c = 0; c < dk; c++) dk_out[(int64_t)i * ldk + c] += dK[i * dk + c];
    if (dbeta_out)
        for (int i = 0; i < L; i++) dbeta_out[(int64_t)i * H] += (real)dbeta[i];
    if (dg_out) {
        double acc = 0;   // dg_m = sum_{i >= m} dGamma_i
        for (int i = L - 1; i >= 0; i--) {
            acc += dG[i];
            dg_out[(int64_t)i * H] += (real)acc;
        }
    }
}

void gdn_chunk_backward(Node *n) {
    GdnDims d = gdn_dims(n);
    const real *q = n->in[GDN_IN_Q]->data, *k = n->in[GDN_IN_K]->data, *v = n->in[GDN_IN_V]->data;
    const real *beta = n->in[GDN_IN_BETA]->data, *g = n->in[GDN_IN_G]->data;
    real *dq = NODE_GRAD_IN(n, GDN_IN_Q), *dk = NODE_GRAD_IN(n, GDN_IN_K), *dv = NODE_GRAD_IN(n, GDN_IN_V);
    real *dbeta = NODE_GRAD_IN(n, GDN_IN_BETA), *dg = NODE_GRAD_IN(n, GDN_IN_G);
    real *ds0 = NODE_GRAD_IN(n, GDN_IN_S0);
    const real *dout = n->out[0]->grad, *dsT = n->out[1]->grad;   // either may be NULL
    const real *saved = n->saved;
    const int *first = n->aux;
    int64_t SS = (int64_t)d.dk * d.dv;
    // Per thread: the chunk workspace, its gradients, and dS, one slot each.
    size_t b_ws = gdn_chunk_bytes(d.C, d.dk, d.dv);   // both multiples of 64 (gdn_carve)
    size_t b_gr = grad_layout(NULL, NULL, d.C, d.dk, d.dv);
    size_t stride;
    unsigned char *slots = tape_thread_slots(n->tape, b_ws + b_gr + SS * sizeof(real), &stride);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < d.B; b++)
        for (int h = 0; h < d.H; h++) {
            unsigned char *slot = slots + stride * (size_t)omp_get_thread_num();
            GdnChunk ws;
            GdnChunkGrad gr;
            gdn_chunk_bind(&ws, slot, d.C, d.dk, d.dv);
            grad_layout(&gr, slot + b_ws, d.C, d.dk, d.dv);
            ws.tc.bf16 = n->iarg[GDN_ARG_BF16] != CHUNK_TILES_FP32;
            ws.tc.amx = n->iarg[GDN_ARG_BF16] == CHUNK_TILES_AMX;
            if (ws.tc.amx) amx_tiles_begin();   // once per head: configuring the tiles costs a small product
            real *dS = (real *)(slot + b_ws + b_gr);   // gradient of the state leaving the chunk
            if (dsT) memcpy(dS, dsT + gdn_off_s(&d, b, h), SS * sizeof(real));
            else memset(dS, 0, SS * sizeof(real));
            for (int c = d.NC - 1; c >= 0; c--) {
                int t0 = c * d.C, L = imin(d.C, d.T - t0);
                const real *S0 = saved + (((int64_t)b * d.H + h) * d.NC + c) * SS;
                int64_t ok = gdn_off_k(&d, b, t0, h), ov = gdn_off_v(&d, b, t0, h), oh = gdn_off_h(&d, b, t0, h);
                const int *db = gdn_chunk_docs(ws.db, first, &d, b, t0, L);
                // The rows first touched after gdn_chunk_prepare, asked for now.
                if (dout) prefetch_rows(dout + ov, d.ldv, L, d.dv, 0);
                if (dq) prefetch_rows(dq + ok, d.ldk, L, d.dk, 1);
                if (dv) prefetch_rows(dv + ov, d.ldv, L, d.dv, 1);
                if (dk) prefetch_rows(dk + ok, d.ldk, L, d.dk, 1);
                gdn_chunk_prepare(&ws, L, q + ok, k + ok, v + ov, beta + oh, g + oh, d.ldk, d.ldv, d.H, S0, db);
                chunk_backward(&ws, &gr, S0, dS, dout ? dout + ov : NULL, q + ok, k + ok, v + ov, d.ldk, d.ldv, d.H,
                               dq ? dq + ok : NULL, dk ? dk + ok : NULL, dv ? dv + ov : NULL,
                               dbeta ? dbeta + oh : NULL, dg ? dg + oh : NULL);
                memcpy(dS, gr.dS0, SS * sizeof(real));
            }
            if (ds0)
                for (int64_t i = 0; i < SS; i++) ds0[gdn_off_s(&d, b, h) + i] += dS[i];
            if (ws.tc.amx) amx_tiles_end();
        }
}
