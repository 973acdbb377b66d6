// kda_chunk.c: op_kda's builder and the chunked (WY) forward of Kimi Delta
// Attention (docs/kda.md).
//
// Inside a chunk of L <= C positions i = 0..L-1, Gamma_i = sum_{j<=i} g_j (a
// dk-vector, per key channel), S0 the state entering the chunk, m_i = [row i
// reads S0] (documents):
//
//   E_ij  = exp(Gamma_i - Gamma_j), per channel, for j <= i
//   A_ij  = beta_i sum_c k_ic k_jc E_ijc  for j < i     (KKE_ij = A_ij / beta_i)
//   P_ij  = sum_c q_ic k_jc E_ijc         for j <= i
//   R     = diag(beta) V - Xw S0,   Xw_i = beta_i m_i exp(Gamma_i) * k_i
//   Delta = (I + A)^-1 R               forward substitution: the rows delta_i
//   O     = Qg S0 + P Delta,           Qg_i = m_i exp(Gamma_i) * q_i
//   S_C   = Diag(m_{L-1} exp(Gamma_{L-1})) S0 + Kd^T Delta,  Kd_j = exp(Gamma_{L-1} - Gamma_j) * k_j
//
// (* elementwise over the channels.) With a decay per channel A and P no
// longer factor into a product times a decay matrix as in op_gdn: they are
// formed KDA_SUB rows at a time through each sub-block's first row
// (kda_sub_products), the same decays serving both. Every exp taken here is
// of a non-positive number, or of one at most KDA_SPAN_MAX, for any g <= 0
// however negative (docs/kda.md, "Numerics"). Documents: a row's terms from
// before its document and through S0 are zeros (the products masked after
// they are formed, eG, ek, bl zero), as gdn_chunk.c does; g at a document's
// first position enters no term that is used (inside a sub-block it may enter
// both factors of a term, which cancel it).
//
// Precision: float32 (float64 in that build) tile products (tile_mm.h),
// except under [train] precision = bf16 on the CPU (chunk_tiles_kind(),
// kept in the node's KDA_ARG_BF16 so that the backward rounds as its
// forward did; [train] bf16_tiles picks AMX or AVX512_BF16): then the
// products fla's chunk kernels also run in bf16 take bf16 operands,
// rounded to nearest even, and sum in float32 (tile_ctx_gemm,
// tile_mm_bf16.h), the same choice as op_gdn's GPU kernels
// (src/cuda/gdn_common.cuh, "Precision:"), product for product (op_gdn's
// CPU chunks, gdn_chunk.c, round the state's products too):
//   forward   P and KKE per sub-block (Qs Ys^T, Ks Ys^T: the row and column
//             operands rounded once each, after their decays to the
//             reference point are applied in float32), O = Qg S0 + P Delta;
//   backward  the same again (kda_chunk_prepare), dQg = dO S0^T, Qg^T dO
//             (into dS0), dP = dO Delta^T, P^T dO, dA = -dR Delta^T, and
//             the sub-blocks' dKKE Ys, dKKE^T Ks, dP Ys, dP^T Qs.
// (op_gdn's W = Tm Xw and U = Tm Xu have no counterpart here: Delta is a
// forward substitution.) Stay float32: the decays, gates and their exps,
// the state carried from chunk to chunk (never rounded: its bf16 copy
// enters only Qg S0 and dO S0^T), the products that update it or
// differentiate its recurrence (Xw S0 inside R, Kd^T Delta; Kd dS, dKd =
// Delta dS^T, dXw = -dR S0^T, Xw^T dR), the substitutions (summed in
// double), the slow channels' per-element terms, and every output and sum.
// The backward is the gradient of the forward's function with the rounding
// taken as the identity. A product whose shape the bf16 path does not take
// (P, KKE, dP, dA of a chunk whose length is not a multiple of 16, heads
// not whole vectors) runs in float32. The GPU's chunk kernels
// (src/cuda/kda_chunk*.cu) round the same products under the same
// conditions; the recurrent form stays float32.
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "docs.h"
#include "kda_kernel.h"
#include "tile_amx.h"
#include "tile_mm.h"

KdaDims kda_dims(const Node *n) {
    KdaDims d;
    d.B = n->iarg[KDA_ARG_B];
    d.T = n->iarg[KDA_ARG_T];
    d.H = n->iarg[KDA_ARG_H];
    d.dk = n->iarg[KDA_ARG_DK];
    d.dv = n->iarg[KDA_ARG_DV];
    d.C = n->iarg[KDA_ARG_C];
    d.NC = (d.T + d.C - 1) / d.C;
    d.ldk = d.H * d.dk;
    d.ldv = d.H * d.dv;
    return d;
}

// Carve the workspace of chunks of up to C positions out of mem (each array
// on a 64-byte boundary); with mem NULL only count the bytes.
static size_t chunk_layout(KdaChunk *ws, unsigned char *mem, int C, int dk, int dv) {
    size_t LL = (size_t)C * C, Lk = (size_t)C * dk, Lv = (size_t)C * dv, at = 0;
    KdaChunk counting;   // mem NULL: the fields are set (to NULL) in a throwaway
    if (!mem) ws = &counting;
    int m = imax(C, imax(dk, dv));
#define TAKE(field, n, type) (ws->field = (type *)gdn_carve(mem, &at, (size_t)(n), sizeof(type)))
    TAKE(G, Lk, double);
    TAKE(acc, imax(dk, dv), double);
    TAKE(ex, dk, real);
    TAKE(eG, Lk, real);
    TAKE(ek, Lk, real);
    TAKE(bl, dk, real);
    TAKE(bet, C, real);
    TAKE(Qg, Lk, real);
    TAKE(Xw, Lk, real);
    TAKE(Kd, Lk, real);
    TAKE(KKE, LL, real);
    TAKE(A, LL, real);
    TAKE(P, LL, real);
    TAKE(R, Lv, real);
    TAKE(Dl, Lv, real);
    TAKE(Ef, Lk, real);
    TAKE(Qs, Lk, real);
    TAKE(Ks, Lk, real);
    TAKE(Ec, Lk, real);
    TAKE(Ys, Lk, real);
    TAKE(T1, 2 * KDA_SUB * dk, real);
    TAKE(T2, Lk, real);
    TAKE(keep, dk, real);
    TAKE(slow, dk, int);
    TAKE(Gsub, KDA_SUB * dk, double);
    TAKE(qsub, KDA_SUB * dk, real);
    TAKE(ksub, KDA_SUB * dk, real);
    TAKE(db, C, int);
    TAKE(pack, (size_t)m * m, real);
    TAKE(tc.pa, (size_t)m * ((m + 1) / 2), bfpair);
    TAKE(tc.pb, (size_t)m * ((m + 1) / 2), bfpair);
#undef TAKE
    if (mem) {
        ws->tc.bf16 = false;
        ws->tc.amx = false;
        ws->dk = dk;
        ws->dv = dv;
        ws->L = 0;
        ws->docs = NULL;
    }
    return at;
}

size_t kda_chunk_bytes(int C, int dk, int dv) { return chunk_layout(NULL, NULL, C, dk, dv); }

void kda_chunk_bind(KdaChunk *ws, void *mem, int C, int dk, int dv) { chunk_layout(ws, mem, C, dk, dv); }

void kda_chunk_tiles(KdaChunk *ws, const Node *n) {
    ws->tc.bf16 = n->iarg[KDA_ARG_BF16] != CHUNK_TILES_FP32;
    ws->tc.amx = n->iarg[KDA_ARG_BF16] == CHUNK_TILES_AMX;
    if (ws->tc.amx) amx_tiles_begin();   // configuring the tiles costs a small product
}

void kda_chunk_tiles_end(KdaChunk *ws) {
    if (ws->tc.amx) amx_tiles_end();
}

// The rows' factors to their sub-block's reference point, Ef_i = exp(Gamma_i
// - Gamma_r(i)) (exponent <= 0), and Qs, Ks: q, k scaled by them.
static void row_factors(KdaChunk *ws, const real *q, const real *k, int ldk) {
    int dk = ws->dk;
    for (int i = 0; i < ws->L; i++) {
        real *ef = ws->Ef + (size_t)i * dk, *qs = ws->Qs + (size_t)i * dk, *ks = ws->Ks + (size_t)i * dk;
        const real *qi = q + (int64_t)i * ldk, *ki = k + (int64_t)i * ldk;
        kda_pair_decays(ef, ws->G + (size_t)i * dk, ws->G + (size_t)(i - i % KDA_SUB) * dk, dk);
        for (int c = 0; c < dk; c++) {
            qs[c] = qi[c] * ef[c];
            ks[c] = ki[c] * ef[c];
        }
    }
}

int kda_sub_columns(KdaChunk *ws, const real *k, int ldk, int i0, int n) {
    int dk = ws->dk, ns = 0;
    const double *G = ws->G, *Gr = G + (size_t)i0 * dk, *Gl = G + (size_t)(i0 + n - 1) * dk;
    real *keep = ws->keep;
    for (int c = 0; c < dk; c++) {
        bool ok = Gr[c] - Gl[c] <= KDA_SPAN_MAX;   // false for NaN too
        keep[c] = ok;
        if (!ok) ws->slow[ns++] = c;
    }
    for (int j = 0; j < i0 + n; j++) {
        real *ec = ws->Ec + (size_t)j * dk, *ys = ws->Ys + (size_t)j * dk;
        const double *Gj = G + (size_t)j * dk;
        const real *kj = k + (int64_t)j * ldk;
        if (j < i0) kda_pair_decays(ec, Gr, Gj, dk);   // exponents <= 0
        else   // in [0, span <= KDA_SPAN_MAX] for a kept channel; 0 (of exp(0)) for a slow one
#pragma omp simd
            for (int c = 0; c < dk; c++) {
                double x = Gr[c] - Gj[c], cap = keep[c] * KDA_SPAN_MAX;   // a ternary, not fmin: it vectorises
                ec[c] = keep[c] * r_exp_decay(x < cap ? x : cap);
            }
        for (int c = 0; c < dk; c++) ys[c] = kj[c] * ec[c];
    }
    return ns;
}

void kda_sub_pack(KdaChunk *ws, const real *q, const real *k, int ldk, int i0, int n, int ns) {
    for (int i = 0; i < n; i++)
        for (int s = 0; s < ns; s++) {
            int c = ws->slow[s];
            ws->Gsub[i * ns + s] = ws->G[(size_t)(i0 + i) * ws->dk + c];
            ws->qsub[i * ns + s] = q[(int64_t)(i0 + i) * ldk + c];
            ws->ksub[i * ns + s] = k[(int64_t)(i0 + i) * ldk + c];
        }
}

// The slow channels' terms of KKE and P inside the sub-block (rows and
// columns i0 .. i0+n-1), added: an exp per element of Gamma_i - Gamma_j <= 0,
// over those channels packed (kda_sub_pack).
static void sub_per_element(KdaChunk *ws, const real *q, const real *k, int ldk, int i0, int n, int ns) {
    int L = ws->L;
    kda_sub_pack(ws, q, k, ldk, i0, n, ns);
    for (int i = 0; i < n; i++) {
        real *Pi = ws->P + (size_t)(i0 + i) * L + i0, *Ki = ws->KKE + (size_t)(i0 + i) * L + i0;
        const real *qi = ws->qsub + i * ns, *ki = ws->ksub + i * ns, *ex = ws->ex;
        int j0 = ws->docs ? imax(0, ws->docs[i0 + i] - i0) : 0;   // before row i's document: masked
        for (int j = j0; j <= i; j++) {
            const real *kj = ws->ksub + j * ns;
            kda_pair_decays(ws->ex, ws->Gsub + i * ns, ws->Gsub + j * ns, ns);
            real sp = 0, sk = 0;
#pragma omp simd reduction(+ : sp, sk)
            for (int s = 0; s < ns; s++) {
                real e = kj[s] * ex[s];
                sp += qi[s] * e;
                sk += ki[s] * e;
            }
            Pi[j] += sp;
            Ki[j] += sk;   // the diagonal is masked
        }
    }
}

int kda_sub_products(KdaChunk *ws, const real *q, const real *k, int ldk, int i0, int n) {
    int L = ws->L, dk = ws->dk;
    int ns = kda_sub_columns(ws, k, ldk, i0, n);
    int N = ns < dk ? i0 + n : i0;   // every channel slow: the sub-block's own columns are theirs alone
    real *P = ws->P + (size_t)i0 * L, *KKE = ws->KKE + (size_t)i0 * L;
    if (N > 0) {
        const real *Qs = ws->Qs + (size_t)i0 * dk, *Ks = ws->Ks + (size_t)i0 * dk;
        tile_ctx_gemm(&ws->tc, false, true, n, N, dk, 1, Qs, dk, ws->Ys, dk, 0, P, L, TILE_FULL(n, dk), ws->pack);
        tile_ctx_gemm(&ws->tc, false, true, n, N, dk, 1, Ks, dk, ws->Ys, dk, 0, KKE, L, TILE_FULL(n, dk), ws->pack);
    }
    for (int i = 0; i < n; i++)
        for (int j = N; j < L; j++) P[(size_t)i * L + j] = KKE[(size_t)i * L + j] = 0;
    if (ns) sub_per_element(ws, q, k, ldk, i0, n, ns);
    // Above the diagonal the products hold exp(Gamma_i - Gamma_j) >= 1 terms
    // (finite: at most exp(span)); before row i's document, terms of another.
    for (int i = 0; i < n; i++) {
        real *Pi = P + (size_t)i * L, *Ki = KKE + (size_t)i * L;
        for (int j = i0 + i + 1; j < i0 + n; j++) Pi[j] = 0;
        for (int j = i0 + i; j < i0 + n; j++) Ki[j] = 0;
        if (ws->docs)
            for (int j = 0; j < ws->docs[i0 + i]; j++) Pi[j] = Ki[j] = 0;
    }
    return ns;
}

// D (L, dv) = (I + A)^-1 R for the strictly lower A (L, L): row i is R_i -
// sum_{j<i} A_ij D_j (forward substitution), summed in double.
static void solve_lower(const real *A, int L, const real *R, real *D, int dv, double *acc) {
    for (int i = 0; i < L; i++) {
        const real *Ai = A + (size_t)i * L;
        for (int c = 0; c < dv; c++) acc[c] = R[i * dv + c];
        for (int j = 0; j < i; j++) {
            double a = Ai[j];
            if (a == 0) continue;
            const real *Dj = D + (size_t)j * dv;
            for (int c = 0; c < dv; c++) acc[c] -= a * Dj[c];
        }
        for (int c = 0; c < dv; c++) D[i * dv + c] = (real)acc[c];
    }
}

void kda_chunk_prepare(KdaChunk *ws, int L, const real *q, const real *k, const real *v, const real *beta,
                       const real *g, int ldk, int ldv, int H, const real *S0, const int *db) {
    int dk = ws->dk, dv = ws->dv;
    ws->L = L;
    ws->docs = db;
    double *G = ws->G;
    for (int i = 0; i < L; i++) {
        const real *gi = g + (int64_t)i * ldk;
        for (int c = 0; c < dk; c++) G[(size_t)i * dk + c] = (i ? G[(size_t)(i - 1) * dk + c] : 0) + gi[c];
        ws->bet[i] = beta[(int64_t)i * H];
    }
    // The factors through S0 (0 for rows whose document begins in the chunk)
    // and to the end of the chunk (0 before its last document).
    int jL = db ? imax(db[L - 1], 0) : 0;
    const double *GL = G + (size_t)(L - 1) * dk;
    for (int i = 0; i < L; i++) {
        size_t o = (size_t)i * dk;
        const real *qi = q + (int64_t)i * ldk, *ki = k + (int64_t)i * ldk;
        real *eG = ws->eG + o, *ek = ws->ek + o, bi = ws->bet[i];
        // The exps in loops of their own, without a condition, so that they vectorise.
        if (!db || db[i] < 0) {
            const double *Gi = G + o;
#pragma omp simd
            for (int c = 0; c < dk; c++) eG[c] = r_exp_decay(Gi[c]);
        } else
            memset(eG, 0, dk * sizeof(real));
        if (i >= jL) kda_pair_decays(ek, GL, G + o, dk);
        else memset(ek, 0, dk * sizeof(real));
        // (Through locals: stores through ws's members kept the loop scalar.)
        real *restrict Qg = ws->Qg + o, *restrict Xw = ws->Xw + o, *restrict Kd = ws->Kd + o;
#pragma omp simd
        for (int c = 0; c < dk; c++) {
            Qg[c] = eG[c] * qi[c];
            Xw[c] = bi * eG[c] * ki[c];
            Kd[c] = ek[c] * ki[c];
        }
    }
    memcpy(ws->bl, ws->eG + (size_t)(L - 1) * dk, dk * sizeof(real));

    // KKE and P, sub-block by sub-block; A = diag(beta) KKE, strictly lower.
    row_factors(ws, q, k, ldk);
    for (int i0 = 0; i0 < L; i0 += KDA_SUB) kda_sub_products(ws, q, k, ldk, i0, imin(KDA_SUB, L - i0));
    for (int i = 0; i < L; i++) {
        real bi = ws->bet[i], *restrict Ai = ws->A + (size_t)i * L;
        const real *KKEi = ws->KKE + (size_t)i * L;
#pragma omp simd
        for (int j = 0; j < L; j++) Ai[j] = bi * KKEi[j];
    }

    // R = diag(beta) V - Xw S0 (float32: the state's recurrence), Delta = (I + A)^-1 R.
    for (int i = 0; i < L; i++) {
        real bi = ws->bet[i], *restrict Ri = ws->R + (size_t)i * dv;
        const real *vi = v + (int64_t)i * ldv;
#pragma omp simd
        for (int c = 0; c < dv; c++) Ri[c] = bi * vi[c];
    }
    tile_gemm(false, false, L, dv, dk, -1, ws->Xw, dk, S0, dv, 1, ws->R, dv, TILE_FULL(L, dk), NULL);
    solve_lower(ws->A, L, ws->R, ws->Dl, dv, ws->acc);
}

void kda_chunk_forward(Node *n) {
    KdaDims d = kda_dims(n);
    const real *q = n->in[KDA_IN_Q]->data, *k = n->in[KDA_IN_K]->data, *v = n->in[KDA_IN_V]->data;
    const real *beta = n->in[KDA_IN_BETA]->data, *g = n->in[KDA_IN_G]->data;
    const real *s0 = n->in[KDA_IN_S0] ? n->in[KDA_IN_S0]->data : NULL;
    const int *first = n->aux;
    real *o = n->out[0]->data, *sT = n->out[1]->data;
    real *saved = n->saved;   // (B, H, NC, dk, dv) or NULL
    int64_t SS = (int64_t)d.dk * d.dv;
    size_t stride;
    unsigned char *slots = tape_thread_slots(n->tape, kda_chunk_bytes(d.C, d.dk, d.dv), &stride);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < d.B; b++)
        for (int h = 0; h < d.H; h++) {
            KdaChunk ws;
            kda_chunk_bind(&ws, slots + stride * (size_t)omp_get_thread_num(), d.C, d.dk, d.dv);
            kda_chunk_tiles(&ws, n);
            real *S = sT + gdn_off_s(&d, b, h);   // the running state, (dk, dv)
            if (s0) memcpy(S, s0 + gdn_off_s(&d, b, h), SS * sizeof(real));
            else memset(S, 0, SS * sizeof(real));
            for (int c = 0; c < d.NC; c++) {
                int t0 = c * d.C, L = imin(d.C, d.T - t0);
                if (saved) memcpy(saved + (((int64_t)b * d.H + h) * d.NC + c) * SS, S, SS * sizeof(real));
                int64_t ok = gdn_off_k(&d, b, t0, h), ov = gdn_off_v(&d, b, t0, h);
                const int *db = gdn_chunk_docs(ws.db, first, &d, b, t0, L);
                kda_chunk_prepare(&ws, L, q + ok, k + ok, v + ov, beta + gdn_off_h(&d, b, t0, h), g + ok, d.ldk,
                                  d.ldv, d.H, S, db);
                // O = Qg S0 + P Delta (P lower)
                real *oc = o + ov;
                tile_ctx_gemm(&ws.tc, false, false, L, d.dv, d.dk, 1, ws.Qg, d.dk, S, d.dv, 0, oc, d.ldv,
                              TILE_FULL(L, d.dk), NULL);
                tile_ctx_gemm(&ws.tc, false, false, L, d.dv, L, 1, ws.P, L, ws.Dl, d.dv, 1, oc, d.ldv, -L, 0, NULL);
                // S_C = Diag(bl) S0 + Kd^T Delta (float32: the state is never rounded)
                for (int i = 0; i < d.dk; i++)
                    for (int j = 0; j < d.dv; j++) S[i * d.dv + j] *= ws.bl[i];
                tile_gemm(true, false, d.dk, d.dv, L, 1, ws.Kd, d.dk, ws.Dl, d.dv, 1, S, d.dv, TILE_FULL(d.dk, L),
                          NULL);
            }
            kda_chunk_tiles_end(&ws);
        }
}

static const OpDef OP_KDA_CHUNKED = {"kda_chunked", kda_chunk_forward, kda_chunk_backward,
                                     CUDA_PAIR(cu_kda_chunk_forward, cu_kda_chunk_backward)};
static const OpDef OP_KDA_RECURRENT = {"kda_recurrent", kda_naive_forward, kda_naive_backward,
                                       CUDA_PAIR(cu_kda_naive_forward, cu_kda_naive_backward)};
Tensor *op_kda(Tape *tp, Tensor *q, Tensor *k, Tensor *v, Tensor *beta, Tensor *g, Tensor *s0,
               const int *doc_start, int n_heads, MixerForm form, int chunk, Tensor **s_out) {
    static const DeltaRuleOp OP = {"kda", &OP_KDA_CHUNKED, &OP_KDA_RECURRENT, true, true};
    return delta_rule_op(tp, &OP, q, k, v, beta, g, s0, doc_start, n_heads, form, chunk, s_out);
}
