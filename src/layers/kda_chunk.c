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
// kda_decay_product's, KDA_SUB rows at a time. Every exp taken here is of a
// non-positive number, for any g <= 0 however negative (docs/kda.md,
// "Numerics"). Documents: a row's terms from before its document and through
// S0 are zeros (the products masked after they are formed, eG, ek, bl zero),
// as gdn_chunk.c does; g at a document's first position enters no factor that
// is used. The products are float32 (or float64) tile products (tile_mm.h):
// op_kda takes no bf16 products.
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "docs.h"
#include "kda_kernel.h"
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
    TAKE(Xs, Lk, real);
    TAKE(Ys, Lk, real);
    TAKE(T1, Lk, real);
    TAKE(T2, Lk, real);
    TAKE(db, C, int);
    TAKE(pack, (size_t)m * m, real);
#undef TAKE
    if (mem) {
        ws->dk = dk;
        ws->dv = dv;
        ws->L = 0;
        ws->docs = NULL;
    }
    return at;
}

size_t kda_chunk_bytes(int C, int dk, int dv) { return chunk_layout(NULL, NULL, C, dk, dv); }

void kda_chunk_bind(KdaChunk *ws, void *mem, int C, int dk, int dv) { chunk_layout(ws, mem, C, dk, dv); }

void kda_to_reference(KdaChunk *ws, const real *X, int ldx, const real *Y, int ldy, int i0, int n) {
    int dk = ws->dk;
    const double *G = ws->G, *Gr = G + (size_t)i0 * dk;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < dk; c++)
            ws->Xs[i * dk + c] = X[(int64_t)(i0 + i) * ldx + c] * r_exp_decay(G[(size_t)(i0 + i) * dk + c] - Gr[c]);
    for (int j = 0; j < i0; j++)
        for (int c = 0; c < dk; c++)
            ws->Ys[j * dk + c] = Y[(int64_t)j * ldy + c] * r_exp_decay(Gr[c] - G[(size_t)j * dk + c]);
}

void kda_decay_product(KdaChunk *ws, const real *X, int ldx, const real *Y, int ldy, bool strict, real *M) {
    int L = ws->L, dk = ws->dk;
    const double *G = ws->G;
    for (int i0 = 0; i0 < L; i0 += KDA_SUB) {
        int n = imin(KDA_SUB, L - i0);
        // The block's rows against every earlier column through the reference
        // point r = i0, the block's first row: E_ij = exp(Gamma_i - Gamma_r)
        // exp(Gamma_r - Gamma_j), j < r <= i, both exponents <= 0.
        if (i0 > 0) {
            kda_to_reference(ws, X, ldx, Y, ldy, i0, n);
            tile_gemm(false, true, n, i0, dk, 1, ws->Xs, dk, ws->Ys, dk, 0, M + (size_t)i0 * L, L, TILE_FULL(n, dk),
                      ws->pack);
        }
        // Inside the block an exp per element, of Gamma_i - Gamma_j <= 0 (j <= i).
        for (int i = i0; i < i0 + n; i++) {
            real *Mi = M + (size_t)i * L;
            const real *xi = X + (int64_t)i * ldx;
            const double *Gi = G + (size_t)i * dk;
            int jmax = strict ? i - 1 : i;
            int j0 = ws->docs ? imax(i0, ws->docs[i]) : i0;   // before row i's document: zeroed below
            for (int j = j0; j <= jmax; j++) {
                const real *yj = Y + (int64_t)j * ldy, *ex = ws->ex;
                kda_pair_decays(ws->ex, Gi, G + (size_t)j * dk, dk);
                real s = 0;
#pragma omp simd reduction(+ : s)
                for (int c = 0; c < dk; c++) s += xi[c] * yj[c] * ex[c];
                Mi[j] = s;
            }
            for (int j = jmax + 1; j < L; j++) Mi[j] = 0;
            if (ws->docs)   // before row i's document (formed through a reference point, or not at all)
                for (int j = 0; j < ws->docs[i]; j++) Mi[j] = 0;
        }
    }
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
        bool reads_s0 = !db || db[i] < 0;
        const real *qi = q + (int64_t)i * ldk, *ki = k + (int64_t)i * ldk;
        for (int c = 0; c < dk; c++) {
            size_t e = (size_t)i * dk + c;
            ws->eG[e] = reads_s0 ? r_exp_decay(G[e]) : 0;
            ws->ek[e] = i < jL ? 0 : r_exp_decay(GL[c] - G[e]);
            ws->Qg[e] = ws->eG[e] * qi[c];
            ws->Xw[e] = ws->bet[i] * ws->eG[e] * ki[c];
            ws->Kd[e] = ws->ek[e] * ki[c];
        }
    }
    memcpy(ws->bl, ws->eG + (size_t)(L - 1) * dk, dk * sizeof(real));

    // A = diag(beta) KKE, strictly lower.
    kda_decay_product(ws, k, ldk, k, ldk, true, ws->KKE);
    for (int i = 0; i < L; i++)
        for (int j = 0; j < L; j++) ws->A[(size_t)i * L + j] = ws->bet[i] * ws->KKE[(size_t)i * L + j];

    // R = diag(beta) V - Xw S0, Delta = (I + A)^-1 R.
    for (int i = 0; i < L; i++)
        for (int c = 0; c < dv; c++) ws->R[i * dv + c] = ws->bet[i] * v[(int64_t)i * ldv + c];
    tile_gemm(false, false, L, dv, dk, -1, ws->Xw, dk, S0, dv, 1, ws->R, dv, TILE_FULL(L, dk), NULL);
    solve_lower(ws->A, L, ws->R, ws->Dl, dv, ws->acc);

    // P, lower with the diagonal.
    kda_decay_product(ws, q, ldk, k, ldk, false, ws->P);
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
                tile_gemm(false, false, L, d.dv, d.dk, 1, ws.Qg, d.dk, S, d.dv, 0, oc, d.ldv, TILE_FULL(L, d.dk), NULL);
                tile_gemm(false, false, L, d.dv, L, 1, ws.P, L, ws.Dl, d.dv, 1, oc, d.ldv, -L, 0, NULL);
                // S_C = Diag(bl) S0 + Kd^T Delta
                for (int i = 0; i < d.dk; i++)
                    for (int j = 0; j < d.dv; j++) S[i * d.dv + j] *= ws.bl[i];
                tile_gemm(true, false, d.dk, d.dv, L, 1, ws.Kd, d.dk, ws.Dl, d.dv, 1, S, d.dv, TILE_FULL(d.dk, L),
                          NULL);
            }
        }
}

// The GPU runs the recurrence for both forms (the same math) until a chunked
// CUDA kernel exists.
static const OpDef OP_KDA_CHUNKED = {"kda_chunked", kda_chunk_forward, kda_chunk_backward,
                                     CUDA_PAIR(cu_kda_naive_forward, cu_kda_naive_backward)};
static const OpDef OP_KDA_RECURRENT = {"kda_recurrent", kda_naive_forward, kda_naive_backward,
                                       CUDA_PAIR(cu_kda_naive_forward, cu_kda_naive_backward)};
Tensor *op_kda(Tape *tp, Tensor *q, Tensor *k, Tensor *v, Tensor *beta, Tensor *g, Tensor *s0,
               const int *doc_start, int n_heads, MixerForm form, int chunk, Tensor **s_out) {
    ASSERT(form == MIXER_FORM_CHUNKED || form == MIXER_FORM_RECURRENT,
           "kda: form '%s' is not available (chunked or recurrent)", mixer_form_name(form));
    ASSERT(chunk > 0, "kda: chunk %d must be positive", chunk);
    ASSERT(q->ndim == 3 && n_heads > 0 && q->shape[2] % n_heads == 0,
           "kda: q %s must be (B, T, H*dk) with H = %d", SHAPE(q), n_heads);
    int B = q->shape[0], T = q->shape[1], H = n_heads, dk = q->shape[2] / H;
    ASSERT(B > 0 && T > 0 && dk > 0, "kda: q %s is empty", SHAPE(q));
    ASSERT(tensor_same_shape(k, q), "kda: k %s must have q's shape %s", SHAPE(k), SHAPE(q));
    ASSERT(v->ndim == 3 && v->shape[0] == B && v->shape[1] == T && v->shape[2] % H == 0 && v->shape[2] > 0,
           "kda: v %s must be (B, T, H*dv) = (%d, %d, %d*dv)", SHAPE(v), B, T, H);
    int dv = v->shape[2] / H;
    ASSERT(beta->ndim == 3 && beta->shape[0] == B && beta->shape[1] == T && beta->shape[2] == H,
           "kda: beta %s must be (B, T, H) = (%d, %d, %d)", SHAPE(beta), B, T, H);
    ASSERT(tensor_same_shape(g, q), "kda: g %s must be (B, T, H*dk) like q %s", SHAPE(g), SHAPE(q));
    if (s0)
        ASSERT(s0->ndim == 4 && s0->shape[0] == B && s0->shape[1] == H && s0->shape[2] == dk && s0->shape[3] == dv,
               "kda: s0 %s must be (B, H, dk, dv) = (%d, %d, %d, %d)", SHAPE(s0), B, H, dk, dv);
    Tensor *o = tape_tensorv(tp, 3, B, T, H * dv);
    Tensor *sT = tape_tensorv(tp, 4, B, H, dk, dv);
    const OpDef *op = form == MIXER_FORM_CHUNKED ? &OP_KDA_CHUNKED : &OP_KDA_RECURRENT;
    Node *n = tape_op(tp, op, (Tensor *[]){q, k, v, beta, g, s0}, KDA_N_IN, (Tensor *[]){o, sT}, 2);
    n->iarg[KDA_ARG_B] = B;
    n->iarg[KDA_ARG_T] = T;
    n->iarg[KDA_ARG_H] = H;
    n->iarg[KDA_ARG_DK] = dk;
    n->iarg[KDA_ARG_DV] = dv;
    n->iarg[KDA_ARG_C] = chunk;
    n->aux = docs_first(tp, doc_start, B, T);
    if (n->recorded) {
        KdaDims d = kda_dims(n);
        n->saved = tape_dalloc(tp, (size_t)B * H * d.NC * dk * dv * sizeof(real));   // read by the kernels
    }
    tape_forward(n);
    if (s_out) *s_out = sT;
    return o;
}
