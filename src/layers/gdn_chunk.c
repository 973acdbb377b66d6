// gdn_chunk.c: op_gdn's builder and the chunked (WY) forward of Gated DeltaNet.
//
// Inside a chunk of L <= C positions i = 0..L-1, Gamma_i = sum_{j<=i} g_j,
// b_i = exp(Gamma_i), S0 the state entering the chunk (MODEL.md, `gdn`):
//
//   A    = beta_i exp(Gamma_i - Gamma_j) (k_i . k_j)  for j < i     (L x L)
//   Tm   = (I + A)^-1                  forward substitution
//   W    = Tm diag(beta b) K,   U = Tm diag(beta) V
//   Delta = U - W S0                   the rows delta_i of the recurrence
//        = Tm R,  R = Xu - Xw S0,  Xw = diag(beta b) K, Xu = diag(beta) V
//   O    = diag(b) Q S0 + ((Q K^T) * [exp(Gamma_i - Gamma_j)]_{j<=i}) Delta
//   S_C  = b_{L-1} S0 + (diag(exp(Gamma_{L-1} - Gamma_j)) K)^T Delta
//
// Delta is computed in its second form, Tm (Xu - Xw S0): one product by Tm
// instead of two (W and U are never formed), and the backward's gradients
// through the solve then need neither W nor U (gdn_chunk_backward.c).
//
// Every decay factor is exp of a non-positive difference of cumulative log
// decays (never a ratio of exponentials), so g = 0 and g = -20 per step are
// both exact and finite. The forward keeps only the state entering each chunk.
// Documents mask E, b and the rows reaching S_C (gdn_kernel.h): the decay
// factors of gdn_chunk_prepare (E, bm, ek, bl) are the only ones used.
//
// Under [train] precision = bf16 (tile_products_bf16, kept in the node) every
// chunk product above and in the backward takes bf16 operands and sums in
// float32 (tile_ctx_gemm, tile_mm_bf16.h), as flash-linear-attention's chunk
// kernels do. Everything else stays float32: the state carried from chunk
// to chunk and its update's sums (a bf16 state would lose what the decays
// leave of it), the decays and their exp, the triangular solve (its
// forward substitution accumulates), the products' outputs (A, Tm, Delta,
// O, the gradients), and the recurrent form (decoding). The state enters a
// product (Q S0, Xw S0) rounded like any operand.
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "docs.h"
#include "gdn_kernel.h"
#include "tile_amx.h"
#include "tile_mm.h"

GdnDims gdn_dims(const Node *n) {
    GdnDims d;
    d.B = n->iarg[GDN_ARG_B];
    d.T = n->iarg[GDN_ARG_T];
    d.H = n->iarg[GDN_ARG_H];
    d.dk = n->iarg[GDN_ARG_DK];
    d.dv = n->iarg[GDN_ARG_DV];
    d.C = n->iarg[GDN_ARG_C];
    d.NC = (d.T + d.C - 1) / d.C;
    d.ldk = d.H * d.dk;
    d.ldv = d.H * d.dv;
    return d;
}

// Carve the workspace of chunks of up to C positions out of mem, each array
// starting on a whole vector (64 bytes); with mem NULL only count the bytes.
// One list of the arrays serves both gdn_chunk_bytes and gdn_chunk_bind.
static size_t chunk_layout(GdnChunk *ws, unsigned char *mem, int C, int dk, int dv) {
    size_t LL = (size_t)C * C, at = 0;
    GdnChunk counting;   // mem NULL: the fields are set (to NULL) in a throwaway
    if (!mem) ws = &counting;
    int ldt = round_vl(C);
#define TAKE(field, n, type) (ws->field = (type *)gdn_carve(mem, &at, (size_t)(n), sizeof(type)))
    TAKE(G, C, double);
    TAKE(E, LL, real);
    TAKE(KK, LL, real);
    TAKE(A, LL, real);
    TAKE(Tm, (size_t)C * ldt, real);
    TAKE(P, LL, real);
    TAKE(Xw, (size_t)C * dk, real);
    TAKE(Kd, (size_t)C * dk, real);
    TAKE(R, (size_t)C * dv, real);
    TAKE(Dl, (size_t)C * dv, real);
    TAKE(bet, C, real);
    TAKE(bm, C, real);
    TAKE(ek, C, real);
    TAKE(db, C, int);
    int m = imax(C, imax(dk, dv));
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
        ws->ldt = ldt;
    }
    return at;
}

size_t gdn_chunk_bytes(int C, int dk, int dv) { return chunk_layout(NULL, NULL, C, dk, dv); }

void gdn_chunk_bind(GdnChunk *ws, void *mem, int C, int dk, int dv) { chunk_layout(ws, mem, C, dk, dv); }

// Tm = (I + A)^-1 for the strictly lower A (L, L): row i of Tm is
// e_i - sum_{m<i} A_im Tm_m (forward substitution). Done one vector of
// columns [j0, j0 + VL) at a time, where the rows m < j0 of Tm are zero, so
// that row i's sum runs over m = j0 .. i-1 in registers, in four partial sums
// (the additions of one sum would otherwise wait on each other), instead of
// updating row i in memory once per m. Tm's rows (stride ldt) are whole
// aligned vectors; its columns L .. ldt-1 come out zero.
static void tri_inverse(real *Tm, int ldt, const real *A, int L) {
    for (int j0 = 0; j0 < L; j0 += VL) {
        for (int i = 0; i < j0; i++) *(vreal *)(Tm + (size_t)i * ldt + j0) = (vreal){0};
        for (int i = j0; i < L; i++) {
            const real *Ai = A + (size_t)i * L;
            const real *Tj = Tm + j0;
            vreal s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
            int m = j0;
            for (; m + 4 <= i; m += 4) {
                s0 += Ai[m] * *(const vreal *)(Tj + (size_t)m * ldt);
                s1 += Ai[m + 1] * *(const vreal *)(Tj + (size_t)(m + 1) * ldt);
                s2 += Ai[m + 2] * *(const vreal *)(Tj + (size_t)(m + 2) * ldt);
                s3 += Ai[m + 3] * *(const vreal *)(Tj + (size_t)(m + 3) * ldt);
            }
            for (; m < i; m++) s0 += Ai[m] * *(const vreal *)(Tj + (size_t)m * ldt);
            vreal t = -((s0 + s1) + (s2 + s3));
            if (i < j0 + VL) t[i - j0] = 1;
            *(vreal *)(Tm + (size_t)i * ldt + j0) = t;
        }
    }
}

void gdn_chunk_prepare(GdnChunk *ws, int L, const real *q, const real *k, const real *v, const real *beta,
                       const real *g, int ldk, int ldv, int H, const real *S0, const int *db) {
    int dk = ws->dk, dv = ws->dv;
    ws->L = L;
    prefetch_rows(v, ldv, L, dv, 0);   // first read after E, A and Tm
    double *G = ws->G;
    real *E = ws->E, *KK = ws->KK, *A = ws->A, *Tm = ws->Tm, *P = ws->P, *bet = ws->bet;
    double acc = 0;
    for (int i = 0; i < L; i++) {
        acc += g[(int64_t)i * H];
        G[i] = acc;
        bet[i] = beta[(int64_t)i * H];
    }
    // E_ij = exp(Gamma_i - Gamma_j) inside row i's document (j >= db[i]), else 0.
    for (int i = 0; i < L; i++) {
        int j0 = db ? imax(db[i], 0) : 0;
        real *Ei = E + (size_t)i * L;
        double Gi = G[i];
        for (int j = 0; j < j0; j++) Ei[j] = 0;
        for (int j = j0; j <= i; j++) Ei[j] = r_exp_decay(Gi - G[j]);
        for (int j = i + 1; j < L; j++) Ei[j] = 0;
    }
    // The factors through S0 (0 for rows whose document begins in the chunk)
    // and to the end of the chunk (0 before its last document).
    int jL = db ? imax(db[L - 1], 0) : 0;
    for (int i = 0; i < L; i++) {
        ws->bm[i] = db && db[i] >= 0 ? 0 : r_exp_decay(G[i]);
        ws->ek[i] = i < jL ? 0 : r_exp_decay(G[L - 1] - G[i]);
    }
    ws->bl = ws->bm[L - 1];

    // K^T, packed once: the right operand of both K K^T and Q K^T.
    real *Kt = ws->pack;   // (dk, L)
    pack_transposed(Kt, L, k, ldk, L, dk);

    // A = strictly-lower (beta_i E_ij k_i.k_j).
    tile_ctx_gemm_lower(&ws->tc, L, dk, 1, k, ldk, Kt, L, 0, KK, L);
    for (int i = 0; i < L; i++)
        for (int j = 0; j < L; j++) A[i * L + j] = j < i ? bet[i] * E[i * L + j] * KK[i * L + j] : 0;

    // Tm = (I + A)^-1 by forward substitution.
    tri_inverse(Tm, ws->ldt, A, L);

    // Xw = diag(beta b) K, R = diag(beta) V - Xw S0, Delta = Tm R.
    for (int i = 0; i < L; i++) {
        real sw = bet[i] * ws->bm[i], su = bet[i];
        for (int c = 0; c < dk; c++) ws->Xw[i * dk + c] = sw * k[(int64_t)i * ldk + c];
        for (int c = 0; c < dv; c++) ws->R[i * dv + c] = su * v[(int64_t)i * ldv + c];
    }
    tile_ctx_gemm(&ws->tc, false, false, L, dv, dk, -1, ws->Xw, dk, S0, dv, 1, ws->R, dv, TILE_FULL(L, dk), NULL);
    tile_ctx_gemm(&ws->tc, false, false, L, dv, L, 1, Tm, ws->ldt, ws->R, dv, 0, ws->Dl, dv, -L, 0, NULL);   // Tm lower

    // P = (Q K^T) * E, lower with the diagonal, zero above.
    tile_ctx_gemm_lower(&ws->tc, L, dk, 1, q, ldk, Kt, L, 0, P, L);
    for (int i = 0; i < L; i++) {
        real *Pi = P + (size_t)i * L;
        const real *Ei = E + (size_t)i * L;
        for (int j = 0; j <= i; j++) Pi[j] *= Ei[j];
        for (int j = i + 1; j < L; j++) Pi[j] = 0;
    }

    // Kd: the rows of K decayed to the end of the chunk.
    for (int j = 0; j < L; j++) {
        real e = ws->ek[j];
        for (int c = 0; c < dk; c++) ws->Kd[j * dk + c] = e * k[(int64_t)j * ldk + c];
    }
}

void gdn_chunk_forward(Node *n) {
    GdnDims d = gdn_dims(n);
    const real *q = n->in[GDN_IN_Q]->data, *k = n->in[GDN_IN_K]->data, *v = n->in[GDN_IN_V]->data;
    const real *beta = n->in[GDN_IN_BETA]->data, *g = n->in[GDN_IN_G]->data;
    const real *s0 = n->in[GDN_IN_S0] ? n->in[GDN_IN_S0]->data : NULL;
    const int *first = n->aux;
    real *o = n->out[0]->data, *sT = n->out[1]->data;
    real *saved = n->saved;   // (B, H, NC, dk, dv) or NULL
    int64_t SS = (int64_t)d.dk * d.dv;
    size_t stride;
    unsigned char *slots = tape_thread_slots(n->tape, gdn_chunk_bytes(d.C, d.dk, d.dv), &stride);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < d.B; b++)
        for (int h = 0; h < d.H; h++) {
            GdnChunk ws;
            gdn_chunk_bind(&ws, slots + stride * (size_t)omp_get_thread_num(), d.C, d.dk, d.dv);
            ws.tc.bf16 = n->iarg[GDN_ARG_BF16] != CHUNK_TILES_FP32;
            ws.tc.amx = n->iarg[GDN_ARG_BF16] == CHUNK_TILES_AMX;
            if (ws.tc.amx) amx_tiles_begin();   // once per head: configuring the tiles costs a small product
            real *S = sT + gdn_off_s(&d, b, h);   // the running state, (dk, dv)
            if (s0) memcpy(S, s0 + gdn_off_s(&d, b, h), SS * sizeof(real));
            else memset(S, 0, SS * sizeof(real));
            for (int c = 0; c < d.NC; c++) {
                int t0 = c * d.C, L = imin(d.C, d.T - t0);
                if (saved) memcpy(saved + (((int64_t)b * d.H + h) * d.NC + c) * SS, S, SS * sizeof(real));
                const real *qc = q + gdn_off_k(&d, b, t0, h), *kc = k + gdn_off_k(&d, b, t0, h);
                const int *db = gdn_chunk_docs(ws.db, first, &d, b, t0, L);
                prefetch_rows(o + gdn_off_v(&d, b, t0, h), d.ldv, L, d.dv, 1);
                gdn_chunk_prepare(&ws, L, qc, kc, v + gdn_off_v(&d, b, t0, h), beta + gdn_off_h(&d, b, t0, h),
                                  g + gdn_off_h(&d, b, t0, h), d.ldk, d.ldv, d.H, S, db);
                // O = diag(b) Q S0 + P Delta
                real *oc = o + gdn_off_v(&d, b, t0, h);
                tile_ctx_gemm(&ws.tc, false, false, L, d.dv, d.dk, 1, qc, d.ldk, S, d.dv, 0, oc, d.ldv,
                              TILE_FULL(L, d.dk), NULL);
                for (int i = 0; i < L; i++) {
                    real bi = ws.bm[i];
                    for (int j = 0; j < d.dv; j++) oc[(int64_t)i * d.ldv + j] *= bi;
                }
                // P lower
                tile_ctx_gemm(&ws.tc, false, false, L, d.dv, L, 1, ws.P, L, ws.Dl, d.dv, 1, oc, d.ldv, -L, 0, NULL);
                // S_C = b_{L-1} S0 + Kd^T Delta
                real bl = ws.bl;
                for (int64_t i = 0; i < SS; i++) S[i] *= bl;
                tile_ctx_gemm(&ws.tc, true, false, d.dk, d.dv, L, 1, ws.Kd, d.dk, ws.Dl, d.dv, 1, S, d.dv,
                              TILE_FULL(d.dk, L), NULL);
            }
            if (ws.tc.amx) amx_tiles_end();
        }
}

static const OpDef OP_GDN_CHUNKED = {"gdn_chunked", gdn_chunk_forward, gdn_chunk_backward,
                                     CUDA_PAIR(cu_gdn_chunk_forward, cu_gdn_chunk_backward)};
static const OpDef OP_GDN_RECURRENT = {"gdn_recurrent", gdn_naive_forward, gdn_naive_backward,
                                       CUDA_PAIR(cu_gdn_naive_forward, cu_gdn_naive_backward)};

Tensor *delta_rule_op(Tape *tp, const DeltaRuleOp *op, Tensor *q, Tensor *k, Tensor *v, Tensor *beta, Tensor *g,
                      Tensor *s0, const int *doc_start, int n_heads, MixerForm form, int chunk, Tensor **s_out) {
    const char *who = op->name;
    ASSERT(form == MIXER_FORM_CHUNKED || form == MIXER_FORM_RECURRENT,
           "%s: form '%s' is not available (chunked or recurrent)", who, mixer_form_name(form));
    ASSERT(chunk > 0, "%s: chunk %d must be positive", who, chunk);
    ASSERT(q->ndim == 3 && n_heads > 0 && q->shape[2] % n_heads == 0,
           "%s: q %s must be (B, T, H*dk) with H = %d", who, SHAPE(q), n_heads);
    int B = q->shape[0], T = q->shape[1], H = n_heads, dk = q->shape[2] / H;
    ASSERT(B > 0 && T > 0 && dk > 0, "%s: q %s is empty", who, SHAPE(q));
    ASSERT(tensor_same_shape(k, q), "%s: k %s must have q's shape %s", who, SHAPE(k), SHAPE(q));
    ASSERT(v->ndim == 3 && v->shape[0] == B && v->shape[1] == T && v->shape[2] % H == 0 && v->shape[2] > 0,
           "%s: v %s must be (B, T, H*dv) = (%d, %d, %d*dv)", who, SHAPE(v), B, T, H);
    int dv = v->shape[2] / H;
    ASSERT(beta->ndim == 3 && beta->shape[0] == B && beta->shape[1] == T && beta->shape[2] == H,
           "%s: beta %s must be (B, T, H) = (%d, %d, %d)", who, SHAPE(beta), B, T, H);
    if (op->g_per_channel)
        ASSERT(tensor_same_shape(g, q), "%s: g %s must be (B, T, H*dk) like q %s", who, SHAPE(g), SHAPE(q));
    else
        ASSERT(tensor_same_shape(g, beta), "%s: g %s must be (B, T, H) like beta %s", who, SHAPE(g), SHAPE(beta));
    if (s0)
        ASSERT(s0->ndim == 4 && s0->shape[0] == B && s0->shape[1] == H && s0->shape[2] == dk && s0->shape[3] == dv,
               "%s: s0 %s must be (B, H, dk, dv) = (%d, %d, %d, %d)", who, SHAPE(s0), B, H, dk, dv);
    Tensor *o = tape_tensorv(tp, 3, B, T, H * dv);
    Tensor *sT = tape_tensorv(tp, 4, B, H, dk, dv);
    const OpDef *def = form == MIXER_FORM_CHUNKED ? op->chunked : op->recurrent;
    Node *n = tape_op(tp, def, (Tensor *[]){q, k, v, beta, g, s0}, GDN_N_IN, (Tensor *[]){o, sT}, 2);
    n->iarg[GDN_ARG_B] = B;
    n->iarg[GDN_ARG_T] = T;
    n->iarg[GDN_ARG_H] = H;
    n->iarg[GDN_ARG_DK] = dk;
    n->iarg[GDN_ARG_DV] = dv;
    n->iarg[GDN_ARG_C] = chunk;
    n->iarg[GDN_ARG_BF16] = op->bf16_products && tp->device == DEVICE_CPU ? chunk_tiles_kind() : CHUNK_TILES_FP32;
    n->aux = docs_first(tp, doc_start, B, T);
    if (n->recorded) {
        // The GPU's chunked gdn also keeps the forward's W, U, Delta and Tm
        // rows (gdn_node.h).
        bool rows = def == &OP_GDN_CHUNKED && tp->device == DEVICE_CUDA;
        GdnSaved sv = gdn_saved_layout((size_t)B, (size_t)H, (size_t)T, (size_t)chunk, (size_t)dk, (size_t)dv, rows);
        n->saved = tape_dalloc(tp, sv.total * sizeof(real));   // read by the kernels
    }
    tape_forward(n);
    if (s_out) *s_out = sT;
    return o;
}

Tensor *op_gdn(Tape *tp, Tensor *q, Tensor *k, Tensor *v, Tensor *beta, Tensor *g, Tensor *s0, const int *doc_start,
               int n_heads, MixerForm form, int chunk, Tensor **s_out) {
    static const DeltaRuleOp OP = {"gdn", &OP_GDN_CHUNKED, &OP_GDN_RECURRENT, false, true};
    return delta_rule_op(tp, &OP, q, k, v, beta, g, s0, doc_start, n_heads, form, chunk, s_out);
}
