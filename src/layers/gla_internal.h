// gla_internal.h: what gla.c (op, forward kernels) and gla_backward.c share.
// Not a public interface: use gla.h.
#ifndef GLA_INTERNAL_H
#define GLA_INTERNAL_H

#include <math.h>

#include "ops_math.h"
#include "tile_mm.h"
#include "tile_amx.h"
#include "tile_mm_bf16.h"

#include "gla.h"

// Sizes of one op_gla call, kept in the node's iarg[].
typedef struct GlaDims {
    int B, T, H, dk, dv;
    int form;      // MixerForm
    int seg;       // positions per chunk (CHUNKED, RECURRENT checkpoints); T for PARALLEL
    int n_seg;     // ceil(T / seg): saved states per (b, h)
    bool bf16;     // the chunk products in bf16 (chunk_tiles_kind at the build, the node's farg[0], not fp32)
    bool amx;      // and on AMX tiles (farg[0] CHUNK_TILES_AMX)
} GlaDims;

enum { GLA_IN_Q, GLA_IN_K, GLA_IN_V, GLA_IN_G, GLA_IN_DT, GLA_IN_S0, GLA_N_IN };

static inline GlaDims gla_dims_of(const Node *n) {
    const int *iarg = n->iarg;
    return (GlaDims){iarg[0], iarg[1], iarg[2], iarg[3], iarg[4], iarg[5], iarg[6], iarg[7],
                     n->farg[0] != CHUNK_TILES_FP32, n->farg[0] == CHUNK_TILES_AMX};
}

// Below this much work (B·H·T·dk·dv multiply-adds) a call runs on one thread:
// waking a team costs more than it saves (decoding, small tests).
static inline bool gla_parallel_worth(const GlaDims *d) {
    return d->B * d->H > 1 && (int64_t)d->B * d->H * d->T * d->dk * d->dv >= (1 << 16);
}

// One head of one batch element, addressed in place: row t of q is
// q + t*ldk (ldk = H*dk), g and dt step by H.
typedef struct GlaHead {
    const real *q, *k;   // (T, dk) with row stride ldk
    const real *v;       // (T, dv) with row stride ldv
    const real *g, *dt;  // (T) with stride H, or NULL
    const real *s0;      // (dk, dv) or NULL
    real *o;             // (T, dv) with row stride ldv
    const int *first;    // (T) the row's document index (docs.h), or NULL: no boundary
    int ldk, ldv, H;
} GlaHead;

// Element offsets of head h of batch element b in (B, T, H*dk), (B, T, H*dv),
// (B, T, H) and (B, H, dk, dv) tensors.
typedef struct GlaOffsets {
    int64_t k, v, g, s;
} GlaOffsets;

static inline GlaOffsets gla_offsets(const GlaDims *d, int b, int h) {
    return (GlaOffsets){(int64_t)b * d->T * d->H * d->dk + (int64_t)h * d->dk,
                        (int64_t)b * d->T * d->H * d->dv + (int64_t)h * d->dv, (int64_t)b * d->T * d->H + h,
                        ((int64_t)b * d->H + h) * d->dk * d->dv};
}

static inline GlaHead gla_head(const GlaDims *d, int b, int h, const real *q, const real *k, const real *v,
                               const real *g, const real *dt, const real *s0, real *o, const int *first) {
    GlaOffsets f = gla_offsets(d, b, h);
    return (GlaHead){q + f.k,  k + f.k, v + f.v, g ? g + f.g : NULL, dt ? dt + f.g : NULL, s0 ? s0 + f.s : NULL,
                     o ? o + f.v : NULL, first ? first + (int64_t)b * d->T : NULL, d->H * d->dk, d->H * d->dv, d->H};
}

// Documents inside one chunk [t0, t0+L) of a row (docs.h): db[i] = the chunk
// position where row i's document begins, or -1 when it began before the
// chunk. Row i then reads the rows j in [max(db[i], 0), i] of the chunk, and
// the state entering the chunk only when db[i] < 0. first: the row's (T).
// Returns db, or NULL when no document begins in the chunk (every db[i] is
// -1, db[L-1] among them: first[] does not decrease): the chunk then needs
// no mask, and takes the kernels' unmasked paths.
static inline const int *gla_chunk_docs(int *db, const int *first, int t0, int L) {
    for (int i = 0; i < L; i++) db[i] = first[t0 + i] >= t0 ? first[t0 + i] - t0 : -1;
    return db[L - 1] >= 0 ? db : NULL;
}

// Whether the recurrence restarts at position t (a document begins there:
// the state before it is not read).
static inline bool gla_restarts(const GlaHead *x, int64_t t) { return x->first && x->first[t] == t; }

// Chunk-local inclusive cumulative log decay: G[i] = Σ_{j≤i} g[(t0+j)*H], in
// double; all zeros when g is NULL.
static inline void gla_cumsum(double *G, const real *g, int H, int t0, int L) {
    double acc = 0;
    for (int i = 0; i < L; i++) {
        if (g) acc += (double)g[(int64_t)(t0 + i) * H];
        G[i] = acc;
    }
}

// The keys of one chunk as the kernels use them, K̃ = diag(dt) K: a pointer
// into k itself (row stride ldk) when dt is NULL, else a scaled copy in buf
// (row stride dk). Returns the row stride.
static inline int gla_keys(const GlaHead *x, int dk, int t0, int L, real *buf, const real **K) {
    if (!x->dt) {
        *K = x->k + (int64_t)t0 * x->ldk;
        return x->ldk;
    }
    for (int i = 0; i < L; i++) {
        real s = x->dt[(int64_t)(t0 + i) * x->H];
        const real *kr = x->k + (int64_t)(t0 + i) * x->ldk;
        for (int c = 0; c < dk; c++) buf[(int64_t)i * dk + c] = s * kr[c];
    }
    *K = buf;
    return dk;
}

// Elements of tile_gemm's `pack` scratch for any product of a chunk: the
// transposed operand is at most max(dk, dv, seg) on each side.
static inline size_t gla_pack_elems(const GlaDims *d) {
    size_t m = (size_t)imax(imax(d->dk, d->dv), d->seg);
    return m * m;
}

// The chunk's products through tc (tile_mm_bf16.h): bf16 when d->bf16, with
// pairs of m ((m + 1) / 2) each, m the largest size of a product, on AMX
// when d->amx (the calling thread's tiles configured until gla_tiles_free);
// freed with gla_tiles_free, on the same thread.
static inline TileCtx gla_tiles(const GlaDims *d) {
    TileCtx tc = {d->bf16, NULL, NULL, d->bf16 && d->amx};
    if (tc.amx) amx_tiles_begin();
    if (d->bf16) {
        size_t m = (size_t)imax(imax(d->dk, d->dv), d->seg), n = m * ((m + 1) / 2);
        tc.pa = xaligned(n * sizeof(bfpair));
        tc.pb = xaligned(n * sizeof(bfpair));
    }
    return tc;
}

static inline void gla_tiles_free(TileCtx *tc) {
    if (tc->amx) amx_tiles_end();
    free(tc->pa);
    free(tc->pb);
}

// The row decay factors of one chunk, in the build's precision (r_exp_decay):
// bm[i] = exp(G_i), the factor of row i's read of S_in (0 when row i's
// document begins in the chunk); ek[i] = exp(G_L − G_i), the factor of row
// i's write into S_out (0 before the chunk's last document, j0). G NULL: 1.
static inline void gla_chunk_decays(real *bm, real *ek, const double *G, const int *db, int L) {
    double gL = G ? G[L - 1] : 0;
    int j0 = db ? imax(db[L - 1], 0) : 0;
    for (int i = 0; i < L; i++) {
        bm[i] = db && db[i] >= 0 ? 0 : G ? r_exp_decay(G[i]) : 1;
        ek[i] = i < j0 ? 0 : G ? r_exp_decay(gL - G[i]) : 1;
    }
}

// Kt (dk, L), row stride L: K̃ᵀ for the chunk's keys K (row stride ldk)
// and K̃ = diag(dt) K (dtv (L) the chunk's dt, or NULL: K̃ = K). The right
// operand of Q K̃ᵀ, packed once per chunk.
static inline void gla_pack_keys(real *Kt, const real *K, int ldk, const real *dtv, int L, int dk) {
    pack_transposed(Kt, L, K, ldk, L, dk);
    if (dtv)
        for (int a = 0; a < dk; a++)
            for (int i = 0; i < L; i++) Kt[(int64_t)a * L + i] = dtv[i] * Kt[(int64_t)a * L + i];
}

// A = (Q K̃ᵀ) ⊙ M ⊙ [exp(G_i − G_j)] for one chunk of L positions, (L, L),
// zero above the diagonal, from Kt = K̃ᵀ (gla_pack_keys): the product is
// formed on and below the diagonal only (tile_gemm_lower). G NULL: no decay.
// D: (L, L) receives the decay factors exp(G_i − G_j) (lower triangle), or
// NULL. db (L) or NULL: the chunk's documents (gla_chunk_docs); entries j <
// db[i] are zero in A and D (M is then the block-diagonal causal mask), and
// their exp is not taken.
void gla_chunk_scores(const TileCtx *tc, const real *Q, int ldq, const real *Kt, const double *G, const int *db, int L,
                      int dk, real *A, real *D);

// The op's backward (gla_backward.c).
void gla_backward(Node *n);

#endif
