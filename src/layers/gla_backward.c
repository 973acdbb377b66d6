// gla_backward.c: the backward of op_gla in its forms (math: gla.h).
//
// Per chunk of L positions with chunk-local cumulative log decay G (G_L its
// last entry), entry state S_in, keys K̃ = diag(dt) K and
//   A     = (Q K̃ᵀ) ⊙ M ⊙ [exp(G_i − G_j)]
//   O     = A V + diag(exp(G)) Q S_in
//   S_out = exp(G_L) S_in + (diag(exp(G_L − G)) K̃)ᵀ V
// the gradients, given dO and dS = ∂/∂S_out, are
//   dV    = Aᵀ dO + diag(exp(G_L − G)) K̃ dS
//   dA    = (dO Vᵀ) ⊙ M,  dP = dA ⊙ [exp(G_i − G_j)]
//   dQ    = dP K̃ + diag(exp(G)) dO S_inᵀ
//   dK̃    = dPᵀ Q + diag(exp(G_L − G)) V dSᵀ
//   dS_in = exp(G_L) dS + (diag(exp(G)) Q)ᵀ dO
// and, with respect to the cumulative sums (Z = dA ⊙ A),
//   dG_i  = Σ_j Z_ij − Σ_j Z_ji + exp(G_i) q_i·(S_in dO_i)
//           − exp(G_L − G_i) k̃_i·(dS v_i)
//   dG_L += exp(G_L) <dS, S_in> + Σ_i exp(G_L − G_i) k̃_i·(dS v_i)   (= <dS, S_out>)
// then dg_i = Σ_{t ≥ i in the chunk} dG_t; dk = dt dK̃, ddt = k·dK̃.
// Chunks are visited in reverse, dS_in of a chunk becoming dS of the previous.
// Documents (gla.h): the masked factors of the forward (entries of A and D
// across a boundary, exp(G) of the rows that do not read S_in, exp(G_L − G)
// of the rows before the chunk's last document, exp(G_L) when a document
// begins in the chunk) are zeros here too, so every term through them
// vanishes and dS_in only collects the rows that read S_in.
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "gla_internal.h"

// The gradient buffers of one head (same offsets as GlaHead); NULL = not needed.
typedef struct GlaGrad {
    const real *dO;            // (T, dv), row stride ldv
    real *dq, *dk;             // (T, dk), row stride ldk
    real *dv;                  // (T, dv), row stride ldv
    real *dg, *ddt;            // (T), stride H
} GlaGrad;

// Whether each of dq, dk, dv (GlaGrad) is still uninitialised and must be
// written (=) rather than added to; set by tensor_grad_fresh.
typedef struct GlaFresh {
    bool q, k, v;
} GlaFresh;

typedef struct BwdScratch {
    real *A, *dA, *D;          // (seg, seg) scores, their gradient, decay factors
    real *Ks, *Xd, *dKs;       // (seg, dk)
    real *Kt;                  // (dk, seg) K̃ᵀ (gla_pack_keys)
    real *pack;                // a transposed operand of tile_gemm (gla_pack_elems)
    real *dQc;                 // (seg, dk) one chunk's dq, summed here then stored once
    real *dVc;                 // (seg, dv) one chunk's dv, likewise
    real *bm, *ek;             // (seg) row decay factors (gla_chunk_decays)
    double *G, *dG, *colZ;     // (seg)
    int *db;                   // (seg) the chunk's documents (gla_chunk_docs)
    real *Sbuf;                // (seg + 1, dk, dv) states of one segment (recurrent form)
    real *dkt;                 // (dk)
    TileCtx tc;                // the products: bf16 or float32 (gla_tiles)
} BwdScratch;

// In double, vectorised (the reduction order is fixed by the build, not the data).
static double dot(const real *a, const real *b, int n) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

// dst row r (stride ld) = or += src row r (stride n), for L rows of n; set
// false: no term reached src, the rows are zero.
static void store_rows(real *dst, int ld, real *src, int L, int n, bool fresh, bool set) {
    if (!set) memset(src, 0, (size_t)L * n * sizeof(real));
    for (int i = 0; i < L; i++) grad_store(dst + (int64_t)i * ld, src + (int64_t)i * n, n, fresh);
}

// dA (the gradient of the scores A, lower triangle) becomes dP in place: times
// the decay factors D, 0 above the diagonal and before the row's document
// (db). With need_g, Z = dA ⊙ A adds its row sums into dG and takes its
// column sums out of it.
static void chunk_dp(BwdScratch *w, double *dG, bool decay, const int *db, int L, bool need_g) {
    real *dA = w->dA;
    // Z = dA ⊙ A: row sums into dG_i, column sums (colZ) out of
    // dG_j; j == i cancels, so it is skipped (it is O(1) when the
    // rest is tiny).
    double *colZ = w->colZ;
    if (need_g)
        for (int j = 0; j < L; j++) colZ[j] = 0;
    for (int i = 0; i < L; i++) {
        real *r = dA + (int64_t)i * L;
        const real *a = w->A + (int64_t)i * L;
        if (need_g) dG[i] += dot_into_cols(r, a, i, colZ);
        if (decay) {   // (D is 0 across a boundary)
            const real *dec = w->D + (int64_t)i * L;
            for (int j = 0; j <= i; j++) r[j] *= dec[j];
        } else if (db) {
            for (int j = 0; j < db[i]; j++) r[j] = 0;
        }
        for (int j = i + 1; j < L; j++) r[j] = 0;
    }
    if (need_g)
        for (int j = 0; j < L; j++) dG[j] -= colZ[j];
}

// dS_in = exp(G_L) dS + (diag(exp(G)) Q)ᵀ dO, each term over the rows that
// read S_in (keep: S_in reaches S_out; db: the chunk's documents). dS holds
// dS_out on entry (all zero when !dS_nonzero) and dS_in on return; returns
// whether it may be nonzero.
static bool chunk_state_grad(const GlaDims *d, const GlaHead *x, BwdScratch *w, real *dS, bool dS_nonzero, bool keep,
                             const double *G, double gL, const real *dO, const int *db, const real *Q, const real *bm,
                             int L) {
    int dk = d->dk, dv = d->dv, ldk = x->ldk, ldv = x->ldv;
    int64_t SZ = (int64_t)dk * dv;
    if (!keep) {
        memset(dS, 0, SZ * sizeof(real));
        dS_nonzero = false;
    } else if (G) {
        for (real eL = r_exp_decay(gL), *e = dS; e < dS + SZ; e++) *e *= eL;
    }
    if (dO && (!db || db[0] < 0)) {
        const real *Xd = Q;
        int ldx = ldk;
        if (bm) {
            for (int i = 0; i < L; i++)
                for (int a = 0; a < dk; a++) w->Xd[(int64_t)i * dk + a] = bm[i] * Q[(int64_t)i * ldk + a];
            Xd = w->Xd;
            ldx = dk;
        }
        tile_ctx_gemm(&w->tc, true, false, dk, dv, L, 1, Xd, ldx, dO, ldv, dS_nonzero ? 1 : 0, dS, dv,
                      TILE_FULL(dk, L), NULL);
        dS_nonzero = true;
    }
    return dS_nonzero;
}

// dK̃ -> dk, ddt; dG -> dg (reverse cumulative sum inside the chunk), for the
// chunk of L rows from t0 (dk_set: some term wrote w->dKs).
static void chunk_key_grads(const GlaDims *d, const GlaHead *x, const GlaGrad *gr, GlaFresh fr, BwdScratch *w, int t0,
                            int L, bool dk_set, bool need_k, bool need_g) {
    int dk = d->dk, ldk = x->ldk, H = d->H;
    double *dG = w->dG;
    if (need_k) {
        if (!dk_set) memset(w->dKs, 0, (size_t)L * dk * sizeof(real));
        if (x->dt)
            for (int i = 0; i < L; i++) {
                int64_t t = t0 + i;
                real *dks = w->dKs + (int64_t)i * dk;
                if (gr->ddt) gr->ddt[t * H] += (real)dot(x->k + t * ldk, dks, dk);
                real s = x->dt[t * H];
                for (int a = 0; a < dk; a++) dks[a] *= s;
            }
        if (gr->dk) store_rows(gr->dk + (int64_t)t0 * ldk, ldk, w->dKs, L, dk, fr.k, true);
    }
    if (need_g) {
        double acc = 0;
        for (int i = L - 1; i >= 0; i--) {
            acc += dG[i];
            gr->dg[(int64_t)(t0 + i) * H] += (real)acc;
        }
    }
}

// One head, chunks in reverse. dS: (dk, dv) in: gradient of the final state;
// out: gradient of s0, formed only when need_ds0 (else the first chunk's dS_in
// is not computed).
// Each of the chunk's (L, d) gradients (dq, dK̃, dv) is written (beta 0) by
// its first term and added to by the others, and the row decay factors
// (bm, ek) scale the rows of a product in its registers (tile_gemm_rows):
// no pass zeroes them or forms a scaled copy. The terms through S_out come
// first, so that the dG terms k̃_i·(ek_i dS v_i) read dK̃ before dPᵀ Q joins it,
// and the term through S_in (Z = diag(bm) dO S_inᵀ) before dP K̃ joins dq.
// Products whose upper triangle is masked (Q K̃ᵀ, dO Vᵀ) are formed on and
// below the diagonal only (tile_gemm_lower).
static void chunked_head_backward(const GlaDims *d, const GlaHead *x, const GlaGrad *gr, GlaFresh fr,
                                  const real *saved, real *dS, bool dS_nonzero, bool need_ds0, BwdScratch *w) {
    int dk = d->dk, dv = d->dv, ldk = x->ldk, ldv = x->ldv, H = d->H;
    int64_t SZ = (int64_t)dk * dv;
    bool need_k = gr->dk || gr->ddt, need_g = gr->dg != NULL;
    for (int c = d->n_seg - 1; c >= 0; c--) {
        int t0 = c * d->seg, L = imin(d->seg, d->T - t0);
        const real *S_in = (c > 0 || x->s0) ? saved + c * SZ : NULL;   // NULL: zero
        const real *Q = x->q + (int64_t)t0 * ldk, *V = x->v + (int64_t)t0 * ldv;
        const real *dO = gr->dO ? gr->dO + (int64_t)t0 * ldv : NULL;
        // The rows this chunk writes; those of the chunk's inputs were asked
        // for during the chunk after it (below), except for the first one.
        if (gr->dq) prefetch_rows(gr->dq + (int64_t)t0 * ldk, ldk, L, dk, 1);
        if (gr->dk) prefetch_rows(gr->dk + (int64_t)t0 * ldk, ldk, L, dk, 1);
        if (gr->dv) prefetch_rows(gr->dv + (int64_t)t0 * ldv, ldv, L, dv, 1);
        if (c == d->n_seg - 1) {
            prefetch_rows(V, ldv, L, dv, 0);
            if (dO) prefetch_rows(dO, ldv, L, dv, 0);
        }
        gla_cumsum(w->G, x->g, H, t0, L);
        const double *G = x->g ? w->G : NULL;
        double gL = G ? G[L - 1] : 0;
        const int *db = x->first ? gla_chunk_docs(w->db, x->first, t0, L) : NULL;
        if (db && db[0] >= 0) S_in = NULL;   // a document begins at t0: no row reads S_in
        int j0 = db ? imax(db[L - 1], 0) : 0;       // the rows of the chunk's last document reach S_out
        bool keep = !db || db[L - 1] < 0;           // S_in reaches S_out
        bool plain = !G && !db;                     // every row decay factor is 1
        if (!plain) gla_chunk_decays(w->bm, w->ek, G, db, L);
        const real *bm = plain ? NULL : w->bm, *ek = plain ? NULL : w->ek;
        const real *K;
        int ldkk = gla_keys(x, dk, t0, L, w->Ks, &K);
        // dq and dv of the chunk are summed in the (L, d) scratch, in cache,
        // and stored once at the end (written when fresh).
        real *dq = gr->dq ? w->dQc : NULL;
        real *dV = gr->dv ? w->dVc : NULL;
        bool dq_set = false, dk_set = false, dv_set = false;
        double *dG = w->dG;
        for (int i = 0; i < L; i++) dG[i] = 0;

        if (dS_nonzero) {   // the terms through S_out
            if (need_k || need_g) {
                // dK̃ = diag(exp(G_L − G)) V dSᵀ
                tile_ctx_gemm_rows(&w->tc, false, true, L, dk, dv, 1, ek, V, ldv, dS, dv, 0, w->dKs, dk,
                                   TILE_FULL(L, dv), w->pack);
                dk_set = true;
                if (need_g)
                    for (int i = j0; i < L - 1; i++) {   // i == L-1 cancels, as below
                        double cst = dot(K + (int64_t)i * ldkk, w->dKs + (int64_t)i * dk, dk);
                        dG[i] -= cst;
                        dG[L - 1] += cst;
                    }
            }
            if (dV) {   // dV = diag(exp(G_L − G)) K̃ dS
                tile_ctx_gemm_rows(&w->tc, false, false, L, dv, dk, 1, ek, K, ldkk, dS, dv, 0, dV, dv, TILE_FULL(L, dk),
                                   NULL);
                dv_set = true;
            }
            if (need_g && S_in && keep) dG[L - 1] += exp(gL) * dot(dS, S_in, (int)SZ);
        }
        if (dO) {   // the terms through O
            gla_pack_keys(w->Kt, K, ldkk, NULL, L, dk);
            gla_chunk_scores(&w->tc, Q, ldk, w->Kt, G, db, L, dk, w->A, w->D);
            if (dV) {   // Aᵀ upper
                tile_ctx_gemm(&w->tc, true, false, L, dv, L, 1, w->A, L, dO, ldv, dv_set, dV, dv, 0, L, NULL);
                dv_set = true;
            }
            if (dq || need_k || need_g) {
                real *dA = w->dA;   // becomes dP in place
                pack_transposed(w->pack, L, V, ldv, L, dv);
                tile_ctx_gemm_lower(&w->tc, L, dv, 1, dO, ldv, w->pack, L, 0, dA, L);
                chunk_dp(w, dG, G != NULL, db, L, need_g);
                if (c > 0) {   // the next chunk's inputs, while this one computes
                    int tp = t0 - d->seg;
                    prefetch_rows(x->q + (int64_t)tp * ldk, ldk, d->seg, dk, 0);
                    prefetch_rows(x->k + (int64_t)tp * ldk, ldk, d->seg, dk, 0);
                    prefetch_rows(x->v + (int64_t)tp * ldv, ldv, d->seg, dv, 0);
                    prefetch_rows(gr->dO + (int64_t)tp * ldv, ldv, d->seg, dv, 0);
                }
                if (S_in && (dq || need_g)) {   // o += exp(G) S_inᵀ q: Z = diag(exp(G)) dO S_inᵀ
                    real *Z = w->dQc;
                    tile_ctx_gemm_rows(&w->tc, false, true, L, dk, dv, 1, bm, dO, ldv, S_in, dv, 0, Z, dk,
                                       TILE_FULL(L, dv), w->pack);
                    dq_set = true;
                    if (need_g)
                        for (int i = 0; i < L; i++)
                            if (!db || db[i] < 0) dG[i] += dot(Q + (int64_t)i * ldk, Z + (int64_t)i * dk, dk);
                }
                if (dq) {   // dP lower
                    tile_ctx_gemm(&w->tc, false, false, L, dk, L, 1, dA, L, K, ldkk, dq_set, dq, dk, -L, 0, NULL);
                    dq_set = true;
                }
                if (need_k) {   // dPᵀ upper
                    tile_ctx_gemm(&w->tc, true, false, L, dk, L, 1, dA, L, Q, ldk, dk_set, w->dKs, dk, 0, L, NULL);
                    dk_set = true;
                }
            }
        }
        if (c > 0 || need_ds0)   // not formed for the first chunk unless ds0 is wanted
            dS_nonzero = chunk_state_grad(d, x, w, dS, dS_nonzero, keep, G, gL, dO, db, Q, bm, L);
        if (dq) store_rows(gr->dq + (int64_t)t0 * ldk, ldk, dq, L, dk, fr.q, dq_set);
        if (dV) store_rows(gr->dv + (int64_t)t0 * ldv, ldv, dV, L, dv, fr.v, dv_set);
        chunk_key_grads(d, x, gr, fr, w, t0, L, dk_set, need_k, need_g);
    }
}

// One head, token by token in reverse: the reference. The states of one
// segment are recomputed from its saved entry state. dS as above.
static void recurrent_head_backward(const GlaDims *d, const GlaHead *x, const GlaGrad *gr, const real *saved,
                                    real *dS, BwdScratch *w) {
    int dk = d->dk, dv = d->dv, H = d->H;
    int64_t SZ = (int64_t)dk * dv;
    for (int c = d->n_seg - 1; c >= 0; c--) {
        int t0 = c * d->seg, L = imin(d->seg, d->T - t0);
        memcpy(w->Sbuf, saved + c * SZ, SZ * sizeof(real));
        for (int i = 0; i < L; i++) {   // Sbuf[i+1] = state after token t0+i
            int64_t t = t0 + i;
            real gam = gla_restarts(x, t) ? 0 : x->g ? r_exp_decay((double)x->g[t * H]) : 1;
            real beta = x->dt ? x->dt[t * H] : 1;
            const real *k = x->k + t * x->ldk, *v = x->v + t * x->ldv;
            const real *Sp = w->Sbuf + i * SZ;
            real *Sn = w->Sbuf + (i + 1) * SZ;
            for (int a = 0; a < dk; a++)
                for (int j = 0; j < dv; j++) Sn[a * dv + j] = gam * Sp[a * dv + j] + beta * k[a] * v[j];
        }
        for (int i = L - 1; i >= 0; i--) {
            int64_t t = t0 + i;
            real gam = gla_restarts(x, t) ? 0 : x->g ? r_exp_decay((double)x->g[t * H]) : 1;
            real beta = x->dt ? x->dt[t * H] : 1;
            const real *q = x->q + t * x->ldk, *k = x->k + t * x->ldk, *v = x->v + t * x->ldv;
            const real *St = w->Sbuf + (i + 1) * SZ, *Sp = w->Sbuf + i * SZ;
            if (gr->dO) {   // o_t = S_tᵀ q_t
                const real *dO = gr->dO + t * x->ldv;
                for (int a = 0; a < dk; a++)
                    for (int j = 0; j < dv; j++) dS[a * dv + j] += q[a] * dO[j];
                if (gr->dq)
                    for (int a = 0; a < dk; a++) gr->dq[t * x->ldk + a] += (real)dot(St + a * dv, dO, dv);
            }
            // S_t = γ S_{t-1} + β k vᵀ
            if (gr->dk || gr->ddt) {
                for (int a = 0; a < dk; a++) w->dkt[a] = (real)dot(dS + a * dv, v, dv);   // ∂/∂(β k)
                if (gr->dk)
                    for (int a = 0; a < dk; a++) gr->dk[t * x->ldk + a] += beta * w->dkt[a];
                if (gr->ddt) gr->ddt[t * H] += (real)dot(k, w->dkt, dk);
            }
            if (gr->dv)
                for (int j = 0; j < dv; j++) {
                    double s = 0;
                    for (int a = 0; a < dk; a++) s += (double)dS[a * dv + j] * k[a];
                    gr->dv[t * x->ldv + j] += beta * (real)s;
                }
            if (gr->dg) gr->dg[t * H] += gam * (real)dot(dS, Sp, (int)SZ);
            for (int64_t e = 0; e < SZ; e++) dS[e] *= gam;
        }
    }
}

void gla_backward(Node *n) {
    GlaDims d = gla_dims_of(n);
    Tensor *const *in = n->in;
    const real *g = in[GLA_IN_G] ? in[GLA_IN_G]->data : NULL;
    const real *dt = in[GLA_IN_DT] ? in[GLA_IN_DT]->data : NULL;
    const real *s0 = in[GLA_IN_S0] ? in[GLA_IN_S0]->data : NULL;
    const int *first = n->aux;
    const real *dO = n->out[0]->grad, *dSf = n->out[1]->grad;
    // The chunked form stores every element of dq, dk and dv exactly once,
    // so a fresh buffer is written instead of zeroed and added to (unless two
    // of q, k, v are one tensor: then its contributions add).
    bool distinct = in[GLA_IN_Q] != in[GLA_IN_K] && in[GLA_IN_Q] != in[GLA_IN_V] && in[GLA_IN_K] != in[GLA_IN_V];
    GlaFresh fr = {false, false, false};
    real *dq, *dk, *dv;
    if (distinct && d.form != MIXER_FORM_RECURRENT) {
        dq = NODE_GRAD_FRESH(n, GLA_IN_Q, &fr.q);
        dk = NODE_GRAD_FRESH(n, GLA_IN_K, &fr.k);
        dv = NODE_GRAD_FRESH(n, GLA_IN_V, &fr.v);
    } else {
        dq = NODE_GRAD_IN(n, GLA_IN_Q);
        dk = NODE_GRAD_IN(n, GLA_IN_K);
        dv = NODE_GRAD_IN(n, GLA_IN_V);
    }
    real *dg = NODE_GRAD_IN(n, GLA_IN_G), *ddt = NODE_GRAD_IN(n, GLA_IN_DT), *ds0 = NODE_GRAD_IN(n, GLA_IN_S0);
    const real *saved = n->saved;
    ASSERT(saved, "gla backward: no saved states (was the node recorded?)");
    int64_t SZ = (int64_t)d.dk * d.dv;
    int seg = d.seg;
    bool rec = d.form == MIXER_FORM_RECURRENT;
#pragma omp parallel if (gla_parallel_worth(&d))
    {
        BwdScratch w = {0};
        real *dS = xaligned((size_t)SZ * sizeof(real));
        if (rec) {
            w.Sbuf = xmalloc((size_t)(seg + 1) * SZ * sizeof(real));
            w.dkt = xmalloc((size_t)d.dk * sizeof(real));
        } else {
            w.A = xaligned((size_t)seg * seg * sizeof(real));
            w.dA = xaligned((size_t)seg * seg * sizeof(real));
            if (g) w.D = xaligned((size_t)seg * seg * sizeof(real));
            w.Ks = xaligned((size_t)seg * d.dk * sizeof(real));
            w.Xd = xaligned((size_t)seg * d.dk * sizeof(real));
            w.dKs = xaligned((size_t)seg * d.dk * sizeof(real));
            w.Kt = xaligned((size_t)d.dk * seg * sizeof(real));
            w.pack = xaligned(gla_pack_elems(&d) * sizeof(real));
            w.bm = xmalloc((size_t)seg * sizeof(real));
            w.ek = xmalloc((size_t)seg * sizeof(real));
            w.dQc = xaligned((size_t)seg * d.dk * sizeof(real));
            w.dVc = xaligned((size_t)seg * d.dv * sizeof(real));
            w.G = xmalloc((size_t)seg * sizeof(double));
            w.dG = xmalloc((size_t)seg * sizeof(double));
            w.colZ = xmalloc((size_t)seg * sizeof(double));
            w.db = xmalloc((size_t)seg * sizeof(int));
            w.tc = gla_tiles(&d);
        }
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < d.B; b++)
            for (int h = 0; h < d.H; h++) {
                GlaHead x = gla_head(&d, b, h, in[GLA_IN_Q]->data, in[GLA_IN_K]->data, in[GLA_IN_V]->data, g,
                                     dt, s0, NULL, first);
                GlaOffsets f = gla_offsets(&d, b, h);
                GlaGrad gr = {dO ? dO + f.v : NULL,  dq ? dq + f.k : NULL,  dk ? dk + f.k : NULL,
                              dv ? dv + f.v : NULL,  dg ? dg + f.g : NULL,  ddt ? ddt + f.g : NULL};
                int64_t bh = (int64_t)b * d.H + h;
                if (dSf) memcpy(dS, dSf + bh * SZ, SZ * sizeof(real));
                else memset(dS, 0, SZ * sizeof(real));
                const real *sv = saved + bh * d.n_seg * SZ;
                if (rec) recurrent_head_backward(&d, &x, &gr, sv, dS, &w);
                else chunked_head_backward(&d, &x, &gr, fr, sv, dS, dSf != NULL, ds0 != NULL, &w);
                if (ds0)
                    for (int64_t e = 0; e < SZ; e++) ds0[bh * SZ + e] += dS[e];
            }
        free(dS);
        free(w.A);
        free(w.dA);
        free(w.D);
        free(w.Ks);
        free(w.Xd);
        free(w.dKs);
        free(w.Kt);
        free(w.pack);
        free(w.bm);
        free(w.ek);
        free(w.dQc);
        free(w.dVc);
        free(w.G);
        free(w.dG);
        free(w.colZ);
        free(w.db);
        free(w.Sbuf);
        free(w.dkt);
        gla_tiles_free(&w.tc);
    }
}
