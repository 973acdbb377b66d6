// gla.c: op_gla, its forward kernels (chunked/parallel and recurrent) and the
// op builder. The backward is in gla_backward.c. Math: gla.h.
//
// Under [train] precision = bf16 (tile_products_bf16 when the op is built,
// kept in farg[0]) the chunk products of both directions take bf16 operands
// and sum in float32 (tile_ctx_gemm, tile_mm_bf16.h), as the GDN kernel's
// do (gdn_chunk.c says what stays float32: the carried state, the decays,
// the products' outputs, the recurrent form).
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "cuda_ops.h"
#include "docs.h"
#include "gla_internal.h"

void gla_chunk_scores(const TileCtx *tc, const real *Q, int ldq, const real *Kt, const double *G, const int *db, int L,
                      int dk, real *A, real *D) {
    tile_ctx_gemm_lower(tc, L, dk, 1, Q, ldq, Kt, L, 0, A, L);
    for (int i = 0; i < L; i++) {
        real *row = A + (int64_t)i * L, *drow = D ? D + (int64_t)i * L : NULL;
        int j0 = db ? imax(db[i], 0) : 0;   // earlier rows belong to another document
        for (int j = 0; j < j0; j++) {
            row[j] = 0;
            if (drow) drow[j] = 0;
        }
        if (G) {
            double Gi = G[i];
            if (drow)
                for (int j = j0; j <= i; j++) {
                    real e = r_exp_decay(Gi - G[j]);
                    row[j] *= e;
                    drow[j] = e;
                }
            else
                for (int j = j0; j <= i; j++) row[j] *= r_exp_decay(Gi - G[j]);
        }
        for (int j = i + 1; j < L; j++) row[j] = 0;
    }
}

// Per-thread scratch of the forward, sized for chunks of up to `seg` positions.
typedef struct FwdScratch {
    real *A;      // (seg, seg) decayed masked scores
    real *Kt;     // (dk, seg) K̃ᵀ (gla_pack_keys)
    real *Xd;     // (seg, dk) decay-scaled keys
    real *bm, *ek, *dtv;   // (seg) row decay factors (gla_chunk_decays), the chunk's dt
    double *G;    // (seg) chunk-local cumulative log decay
    int *db;      // (seg) the chunk's documents (gla_chunk_docs)
    TileCtx tc;   // the products: bf16 or float32 (gla_tiles)
} FwdScratch;

// One head, chunk by chunk (PARALLEL: one chunk of T). S: (dk, dv) the running
// state, ends as the final state. saved: (n_seg, dk, dv) chunk-entry states, or NULL.
// Documents (x->first): row i of a chunk reads S_in only while its document
// began before the chunk (db[i] < 0), the rows j >= db[i] of the chunk, and
// S_out holds only the chunk's last document: every term across a boundary
// is a zero factor, never an exp.
// The rows of v and o are asked for (prefetch_rows) before the scores,
// those of the next chunk's q and k after them: their first touch otherwise
// waits on memory.
static void chunked_head_forward(const GlaDims *d, const GlaHead *x, real *S, real *saved, FwdScratch *w) {
    int dk = d->dk, dv = d->dv, ldk = x->ldk, ldv = x->ldv;
    int64_t SZ = (int64_t)dk * dv;
    bool nonzero = x->s0 != NULL;   // S may be non-zero: the terms through it are needed
    if (x->s0) memcpy(S, x->s0, SZ * sizeof(real));
    else memset(S, 0, SZ * sizeof(real));
    for (int c = 0; c < d->n_seg; c++) {
        int t0 = c * d->seg, L = imin(d->seg, d->T - t0);
        const real *Q = x->q + (int64_t)t0 * ldk, *K = x->k + (int64_t)t0 * ldk, *V = x->v + (int64_t)t0 * ldv;
        real *O = x->o + (int64_t)t0 * ldv;
        prefetch_rows(V, ldv, L, dv, 0);
        prefetch_rows(O, ldv, L, dv, 1);
        if (saved) memcpy(saved + c * SZ, S, SZ * sizeof(real));
        gla_cumsum(w->G, x->g, d->H, t0, L);
        const double *G = x->g ? w->G : NULL;
        const int *db = x->first ? gla_chunk_docs(w->db, x->first, t0, L) : NULL;
        const real *dtv = NULL;
        if (x->dt) {
            for (int i = 0; i < L; i++) w->dtv[i] = x->dt[(int64_t)(t0 + i) * x->H];
            dtv = w->dtv;
        }
        bool plain = !G && !db;   // every row decay factor is 1
        if (!plain) gla_chunk_decays(w->bm, w->ek, G, db, L);
        // O = ((Q K̃ᵀ) ⊙ M ⊙ decay) V  +  diag(exp(G)) Q S_in
        gla_pack_keys(w->Kt, K, ldk, dtv, L, dk);
        gla_chunk_scores(&w->tc, Q, ldk, w->Kt, G, db, L, dk, w->A, NULL);
        if (c + 1 < d->n_seg) {
            int L1 = imin(d->seg, d->T - t0 - L);
            prefetch_rows(Q + (int64_t)L * ldk, ldk, L1, dk, 0);
            prefetch_rows(K + (int64_t)L * ldk, ldk, L1, dk, 0);
        }
        // A lower triangular
        tile_ctx_gemm(&w->tc, false, false, L, dv, L, 1, w->A, L, V, ldv, 0, O, ldv, -L, 0, NULL);
        if (nonzero && (!db || db[0] < 0))   // (db[0] >= 0: a document begins at t0, no row reads S_in)
            tile_ctx_gemm_rows(&w->tc, false, false, L, dv, dk, 1, plain ? NULL : w->bm, Q, ldk, S, dv, 1, O, ldv,
                               TILE_FULL(L, dk), NULL);
        // S_out = exp(G_L) S_in + (diag(exp(G_L − G)) K̃)ᵀ V, over the last document only
        bool keep = nonzero && (!db || db[L - 1] < 0);   // S_in reaches S_out
        if (keep && G)
            for (real eL = r_exp_decay(G[L - 1]), *e = S; e < S + SZ; e++) *e *= eL;
        const real *Xd = K;
        int ldx = ldk;
        if (!plain || dtv) {   // Xd = diag(exp(G_L − G)) K̃
            for (int i = 0; i < L; i++) {
                real e = plain ? 1 : w->ek[i], *xr = w->Xd + (int64_t)i * dk;
                const real *kr = K + (int64_t)i * ldk;
                if (dtv)
                    for (int a = 0; a < dk; a++) xr[a] = e * (dtv[i] * kr[a]);
                else
                    for (int a = 0; a < dk; a++) xr[a] = e * kr[a];
            }
            Xd = w->Xd;
            ldx = dk;
        }
        tile_ctx_gemm(&w->tc, true, false, dk, dv, L, 1, Xd, ldx, V, ldv, keep ? 1 : 0, S, dv, TILE_FULL(dk, L), NULL);
        nonzero = true;
    }
}

// One head, one token at a time: the reference. S as above; saved: the state
// before every seg-th token, or NULL.
static void recurrent_head_forward(const GlaDims *d, const GlaHead *x, real *S, real *saved) {
    int dk = d->dk, dv = d->dv;
    int64_t SZ = (int64_t)dk * dv;
    if (x->s0) memcpy(S, x->s0, SZ * sizeof(real));
    else memset(S, 0, SZ * sizeof(real));
    for (int t = 0; t < d->T; t++) {
        if (saved && t % d->seg == 0) memcpy(saved + (t / d->seg) * SZ, S, SZ * sizeof(real));
        // A document starting at t: the state before it is not read (γ = 0).
        real gam = gla_restarts(x, t) ? 0 : x->g ? r_exp_decay((double)x->g[(int64_t)t * d->H]) : 1;
        real beta = x->dt ? x->dt[(int64_t)t * d->H] : 1;
        const real *q = x->q + (int64_t)t * x->ldk, *k = x->k + (int64_t)t * x->ldk;
        const real *v = x->v + (int64_t)t * x->ldv;
        real *o = x->o + (int64_t)t * x->ldv;
        for (int a = 0; a < dk; a++) {   // S = γ S + β k vᵀ
            real kb = beta * k[a], *row = S + (int64_t)a * dv;
            for (int j = 0; j < dv; j++) row[j] = gam * row[j] + kb * v[j];
        }
        for (int j = 0; j < dv; j++) o[j] = 0;   // o = Sᵀ q
        for (int a = 0; a < dk; a++) {
            const real *row = S + (int64_t)a * dv;
            for (int j = 0; j < dv; j++) o[j] += q[a] * row[j];
        }
    }
}

static void gla_forward(Node *n) {
    GlaDims d = gla_dims_of(n);
    Tensor *const *in = n->in;
    const real *g = in[GLA_IN_G] ? in[GLA_IN_G]->data : NULL;
    const real *dt = in[GLA_IN_DT] ? in[GLA_IN_DT]->data : NULL;
    const real *s0 = in[GLA_IN_S0] ? in[GLA_IN_S0]->data : NULL;
    const int *first = n->aux;
    int64_t SZ = (int64_t)d.dk * d.dv;
    real *saved = NULL;   // (B, H, n_seg, dk, dv)
    if (n->recorded) saved = tape_alloc(n->tape, (size_t)d.B * d.H * d.n_seg * SZ * sizeof(real));
    n->saved = saved;
    real *S_all = n->out[1]->data;   // (B, H, dk, dv)
    int seg = d.seg;
#pragma omp parallel if (gla_parallel_worth(&d))
    {
        FwdScratch w = {0};
        if (d.form != MIXER_FORM_RECURRENT) {
            w.A = xaligned((size_t)seg * seg * sizeof(real));
            w.Kt = xaligned((size_t)d.dk * seg * sizeof(real));
            w.Xd = xaligned((size_t)seg * d.dk * sizeof(real));
            w.bm = xmalloc((size_t)seg * sizeof(real));
            w.ek = xmalloc((size_t)seg * sizeof(real));
            w.dtv = xmalloc((size_t)seg * sizeof(real));
            w.G = xmalloc((size_t)seg * sizeof(double));
            w.db = xmalloc((size_t)seg * sizeof(int));
            w.tc = gla_tiles(&d);
        }
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < d.B; b++)
            for (int h = 0; h < d.H; h++) {
                GlaHead x = gla_head(&d, b, h, in[GLA_IN_Q]->data, in[GLA_IN_K]->data, in[GLA_IN_V]->data, g,
                                     dt, s0, n->out[0]->data, first);
                int64_t bh = (int64_t)b * d.H + h;
                real *sv = saved ? saved + bh * d.n_seg * SZ : NULL;
                if (d.form == MIXER_FORM_RECURRENT) recurrent_head_forward(&d, &x, S_all + bh * SZ, sv);
                else chunked_head_forward(&d, &x, S_all + bh * SZ, sv, &w);
            }
        free(w.A);
        free(w.Kt);
        free(w.Xd);
        free(w.bm);
        free(w.ek);
        free(w.dtv);
        free(w.G);
        free(w.db);
        gla_tiles_free(&w.tc);
    }
}

static const OpDef OP_GLA = {"gla", gla_forward, gla_backward, CUDA_PAIR(cu_gla_forward, cu_gla_backward)};

static void check_bth(const char *what, const Tensor *t, int B, int T, int H, const Tensor *q) {
    ASSERT(t->ndim == 3 && t->shape[0] == B && t->shape[1] == T && t->shape[2] == H,
           "gla: %s must be (B, T, H) = (%d, %d, %d) for q %s, got %s", what, B, T, H, SHAPE(q), SHAPE(t));
}

Tensor *op_gla_dt(Tape *tp, Tensor *q, Tensor *k, Tensor *v, Tensor *g, Tensor *dt, Tensor *s0, const int *doc_start,
                  int n_heads, MixerForm form, int chunk, Tensor **s_out) {
    ASSERT(q && k && v, "gla: q, k and v are required");
    ASSERT(q->ndim == 3, "gla: q must be (B, T, H*dk), got %s", SHAPE(q));
    int B = q->shape[0], T = q->shape[1], H = n_heads;
    ASSERT(H > 0 && q->shape[2] % H == 0, "gla: q %s: last dimension not a multiple of n_heads %d", SHAPE(q), H);
    ASSERT(T > 0, "gla: empty sequence, q %s", SHAPE(q));
    ASSERT(tensor_same_shape(q, k), "gla: q %s and k %s differ", SHAPE(q), SHAPE(k));
    ASSERT(v->ndim == 3 && v->shape[0] == B && v->shape[1] == T && v->shape[2] % H == 0,
           "gla: v must be (B, T, H*dv) = (%d, %d, %d*dv) for q %s, got %s", B, T, H, SHAPE(q), SHAPE(v));
    int dk = q->shape[2] / H, dv = v->shape[2] / H;
    if (g) check_bth("g", g, B, T, H, q);
    if (dt) check_bth("dt", dt, B, T, H, q);
    if (s0)
        ASSERT(s0->ndim == 4 && s0->shape[0] == B && s0->shape[1] == H && s0->shape[2] == dk && s0->shape[3] == dv,
               "gla: s0 must be (B, H, dk, dv) = (%d, %d, %d, %d), got %s", B, H, dk, dv, SHAPE(s0));
    ASSERT(form >= 0 && form < MIXER_FORM_COUNT, "gla: unknown form %d", (int)form);
    ASSERT(form == MIXER_FORM_PARALLEL || chunk > 0, "gla: form %s needs chunk > 0, got %d", mixer_form_name(form),
           chunk);
    int seg = form == MIXER_FORM_PARALLEL ? T : imin(chunk, T);
    Tensor *o = tape_tensorv(tp, 3, B, T, H * dv);
    Tensor *st = tape_tensorv(tp, 4, B, H, dk, dv);
    Tensor *in[GLA_N_IN] = {q, k, v, g, dt, s0};
    Node *n = tape_op(tp, &OP_GLA, in, GLA_N_IN, (Tensor *[]){o, st}, 2);
    int iarg[8] = {B, T, H, dk, dv, form, seg, (T + seg - 1) / seg};
    memcpy(n->iarg, iarg, sizeof iarg);
    n->farg[0] = tp->device == DEVICE_CPU ? chunk_tiles_kind() : CHUNK_TILES_FP32;   // GlaDims.bf16, amx
    n->aux = docs_first(tp, doc_start, B, T);
    tape_forward(n);
    if (s_out) *s_out = st;
    return o;
}

Tensor *op_gla(Tape *tp, Tensor *q, Tensor *k, Tensor *v, Tensor *g, Tensor *s0, const int *doc_start, int n_heads,
               MixerForm form, int chunk, Tensor **s_out) {
    return op_gla_dt(tp, q, k, v, g, NULL, s0, doc_start, n_heads, form, chunk, s_out);
}
