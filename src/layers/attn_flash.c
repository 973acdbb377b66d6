// attn_flash.c: causal softmax attention, FlashAttention-2 style. The
// reference form is attn_naive.c; the one-query decoding kernel is
// attn_decode.c.
//
// Forward, per (batch, head, query tile Q_i of bq rows), over the key tiles
// K_j, V_j (bk rows) that hold positions s <= the tile's last query:
//   S = scale Q_i K_j^T            (masked to s <= t on the diagonal tiles)
//   m' = max(m, rowmax S);  P = exp(S - m');  alpha = exp(m - m')
//   l = alpha l + rowsum P;  A = diag(alpha) A + P V_j
// then o_t = A_t / l_t and lse_t = m_t + log l_t, the only thing saved.
//
// Backward (FlashAttention-2): with D_t = rowsum(dO_t . O_t), per block
//   P = exp(scale Q_i K_j^T - lse)   (recomputed; 0 where s > t)
//   dV_j += P^T dO_i;  dP = dO_i V_j^T;  dS = P . (dP - D)
//   dQ_i += scale dS K_j;  dK_j += scale dS^T Q_i.
// One task per (batch, head) visits the blocks in a fixed order and writes
// only its own head's columns, so the gradients do not depend on the thread
// count and no atomics are needed.
//
// The block products are small (64 x 64 x 32 in the tiny configs): they go
// through tile_mm (tile_mm.h), a register-blocked loop nest, not BLAS.
// The forward scores QB queries at once, one per vector lane (St = K_j Q^T,
// keys x queries), so the online max and sum are lane-wise; the backward
// scores MR queries at a time with the keys along the lanes, against K_j^T
// and V_j^T packed once per key tile. Diagonal blocks skip their masked half
// (tile_mm_band). Scratch: one slot per thread from tape_thread_slots.
// Under [train] precision = bf16 the same products run on bf16 operands with
// float32 sums (tile_mm_bf16.h; attn_tiles_bf16 below says what stays float32).
//
// Documents (docs.h): query t sees the keys lo(t) <= s <= t, lo(t) the start
// of its document (block-diagonal causal). Key tiles wholly before a query
// tile's documents and query tiles wholly after a key tile's documents are
// skipped; inside a block that a boundary cuts, the scores across it are
// masked to weight 0 without an exp (a query that has seen no key yet keeps
// m = -inf, alpha = 1 as above); blocks that no boundary cuts run the code
// without documents.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn_exp.h"
#include "attn_kernel.h"
#include "blas.h"
#include "docs.h"
#include "ops_math.h"
#include "tile_mm.h"
#include "tile_amx.h"

// ---- The op ----

typedef struct AttnDims {
    int B, T, H, dk, dv;
    int bq, bk;           // tile sizes
    int dkp, dvp, bkp;    // dk, dv, bk rounded up to whole vectors (packed row strides)
    real scale;
    bool bf16, amx;       // the tile products in bf16 (tile_mm_bf16.h), on AMX (tile_amx.h)
} AttnDims;

// iarg: 0 B, 1 T, 2 H, 3 dk, 4 dv, 5 tile_q, 6 tile_k, 7 the tiles' Bf16Tiles; farg[0] scale.
static AttnDims dims_of(const Node *n) {
    const int *a = n->iarg;
    return (AttnDims){a[0], a[1], a[2], a[3], a[4], a[5], a[6], round_vl(a[3]), round_vl(a[4]), round_vl(a[6]),
                      (real)n->farg[0], a[7] != BF16_TILES_FP32, a[7] == BF16_TILES_AMX};
}

// Under [train] precision = bf16 the tile products take bf16 operands and sum
// in float32 (tile_mm_bf16.h): S = Q K^T and dP = dO V^T from Q, K, dO, V
// rounded to bf16, and P V, P^T dO, dS^T Q, dS K from P and dS rounded to
// bf16 as well. Everything else stays float32: the scores S and dP as summed,
// the online max and sum, exp, lse, D and dS = P (dP - D) (rounding P before
// its row sum would bias l), and the outputs and gradients. Needs even head
// sizes and tiles (the pairs of vdpbf16ps); otherwise, where the build
// has no AVX512_BF16 kernels, and under bf16_tiles = fp32, the products stay
// float32 (attn_tiles_kind, tile_amx.c; kept in the node for its backward).

// The forward takes a query tile QB queries at a time, one query per vector
// lane: the scores of the block are St (keys x QB queries), so the running
// max and sum of each query are lane-wise (no reduction across a vector), and
// St = K_j Q^T reads K_j in place, with only Q^T packed, once per query tile.
#define QB ATTN_QB   // (2 VL)

// Forward scratch (reals per thread), each piece a whole number of vectors:
// Qt (dk x bqp), Vp (bk x dvp), St (bk x QB), acc (bq x dvp), m, l (bqp each),
// with bqp = bq rounded up to QB; with bf16 products also (in pairs, the
// size of a real) Q^T (dk/2 x bqp), V_j (bk/2 x dvp), P^T (bk/2 x QB), Q's
// pairs of columns before their transpose (bq x dk/2), and the KvCache of
// one head's nkeys keys: K (nkeys x dk/2), V (nkeys/2 x dvp, nkeys rounded
// up to even) and a flag per key tile.
static int forward_bqp(const AttnDims *d) { return (d->bq + QB - 1) / QB * QB; }

static size_t forward_scratch(const AttnDims *d, int nkeys) {
    int bqp = forward_bqp(d);
    size_t n = (size_t)d->dk * bqp + (size_t)d->bk * d->dvp + (size_t)d->bk * QB + (size_t)d->bq * d->dvp +
               2 * (size_t)bqp;
    if (d->bf16)
        n += (size_t)(d->dk / 2) * bqp + (size_t)(d->bk / 2) * d->dvp + (size_t)(d->bk / 2) * QB +
             (size_t)round_vl(d->bq * (d->dk / 2)) + (size_t)round_vl(nkeys * (d->dk / 2)) +
             (size_t)(nkeys + 1) / 2 * d->dvp + (size_t)round_vl((nkeys + d->bk - 1) / d->bk);
    return n;
}

// With bf16 products, the pairs of one head's keys and values as the
// forward's products read them (K_j's rows, V_j's pairs of rows), packed
// once per thread and head where a thread runs several query tiles of the
// head: per query tile, the packing of every key tile it sees took 11-12 %
// of the op on AMX (T 256 and 1024, D 64). head: the (batch, head) held, -1
// none; done[j]: key tile j is packed. Its pieces follow the tile's scratch.
typedef struct KvCache {
    int64_t head;
    bfpair *K, *V;
    int *done;
} KvCache;


// One query tile of one head: the queries at positions t0..t0+nq-1, which
// see keys 0 .. t, and their outputs and lse. k, v: head-h base pointers of
// batch b's keys and values (rows 0 ..; row strides ldq, ldv); q, o and lse
// hold position t at row t - qoff (0 but for attn_prefix_forward's windows).
// first: the row's (T) document index (docs.h), or NULL. kc: the thread's
// KvCache (bf16 products), head: which (batch, head) this is.
// The running max m and sum l stay in `real`: m is a max (exact), l a sum of
// at most T terms in [0, 1].
static void flash_forward_tile(const AttnDims *d, int t0, int nq, int qoff, const real *q, const real *k,
                               const real *v, real *o, real *lse, const int *first, real *scratch, KvCache *kc,
                               int64_t head) {
    int ldq = d->H * d->dk, ldv = d->H * d->dv, dvp = d->dvp, bqp = forward_bqp(d);
    real *Qt = scratch, *Vp = Qt + (size_t)d->dk * bqp, *St = Vp + (size_t)d->bk * dvp;
    real *acc = St + (size_t)d->bk * QB, *m = acc + (size_t)d->bq * dvp, *l = m + bqp;
#ifdef AG_TILE_BF16
    int dkh = d->dk / 2;   // (bf16: dk, dv, bk even)
    bfpair *QtP = (bfpair *)(l + bqp), *VR = QtP + (size_t)dkh * bqp;
    bfpair *PP = VR + (size_t)(d->bk / 2) * dvp, *tmp = PP + (size_t)(d->bk / 2) * QB;
    int kend = qoff + d->T;   // the keys of the window's last query: 0 .. kend-1
    if (d->bf16 && kc->head != head) {
        memset(kc->done, 0, (size_t)((kend + d->bk - 1) / d->bk) * sizeof(int));
        kc->head = head;
    }
    if (d->bf16) pack_pair_transposed(QtP, bqp, q + (int64_t)(t0 - qoff) * ldq, ldq, nq, d->dk, tmp);
    else
#endif
        pack_transposed(Qt, bqp, q + (int64_t)(t0 - qoff) * ldq, ldq, nq, d->dk);
    for (int i = 0; i < bqp; i++) m[i] = -INFINITY, l[i] = 0;
    memset(acc, 0, (size_t)nq * dvp * sizeof(real));
    bool v_in = in_place(v, ldv, d->dv);   // V rows used where they are (else copied into Vp)
    int ldvj = v_in ? ldv : dvp;
    int s_end = t0 + nq;   // keys 0 .. s_end-1 can be seen by some row of the tile
    int s_lo = docs_begin(first, t0) / d->bk * d->bk;   // the key tile holding the first key the tile sees
    for (int s0 = s_lo; s0 < s_end; s0 += d->bk) {
        int nk = imin(d->bk, s_end - s0);
        const real *Vj = v_in ? v + (int64_t)s0 * ldv : Vp;   // V_j rows, stride ldvj
#ifdef AG_TILE_BF16
        const bfpair *Kb = NULL, *VjP = NULL;
        if (d->bf16) {   // K_j's rows and V_j's pairs of rows, in bf16, from the cache (s0 even: bk is)
            int jt = s0 / d->bk, nkt = imin(d->bk, kend - s0);   // the whole tile: keys s0 .. s0+nkt-1
            if (!kc->done[jt]) {
                pack_pair_rows(kc->K + (int64_t)s0 * dkh, dkh, k + (int64_t)s0 * ldq, ldq, nkt, d->dk);
                pack_pair_cols(kc->V + (int64_t)(s0 / 2) * dvp, dvp, v + (int64_t)s0 * ldv, ldv, 0, nkt, d->dv);
                kc->done[jt] = 1;
            }
            Kb = kc->K + (int64_t)s0 * dkh, VjP = kc->V + (int64_t)(s0 / 2) * dvp;
            // A tile this query tile cuts at an odd key (a window at an odd
            // slot) pairs its last key with zero, as the products read it.
            if (nk % 2 && nk < nkt) {
                pack_pair_cols(VR, dvp, v + (int64_t)s0 * ldv, ldv, 0, nk, d->dv);
                VjP = VR;
            }
        } else
#endif
        if (!v_in) pack_rows(Vp, dvp, v + (int64_t)s0 * ldv, ldv, nk, d->dv);
        // Query blocks from the one holding the first query that sees key s0.
        for (int i0 = imax(0, s0 - t0) / QB * QB; i0 < nq; i0 += QB) {
            int nr = imin(QB, nq - i0);
            int kmax = imin(nk, t0 + i0 + nr - s0);   // keys s0 .. s0+kmax-1 seen by the block's last query
            int lag = t0 + i0 - s0;                    // key j is seen by query i of the block iff j <= lag + i
            // Documents: query i sees key j only if j >= lo[i]; cut: some query's document begins after s0.
            int lo[QB];
            bool cut = first && docs_begin(first, t0 + i0 + nr - 1) > s0;
            if (cut) {
                if (docs_begin(first, t0 + i0) >= s0 + kmax) continue;   // every query's document begins later
                for (int i = 0; i < QB; i++) lo[i] = docs_begin(first, t0 + i0 + imin(i, nr - 1)) - s0;
            }
#ifdef AG_TILE_BF16
            if (d->bf16)
                tile_mm_bf16_band_on(d->amx, kmax, QB, d->dk, TILE_FULL(kmax, d->dk), d->scale, Kb, dkh, 1,
                                     QtP + i0, bqp, St, QB, false);
            else
#endif
                tile_mm(kmax, QB, d->dk, d->scale, k + (int64_t)s0 * ldq, ldq, 1, Qt + i0, bqp, St, QB, false);
            real alpha[QB];
            attn_block_softmax(St, kmax, lag, cut ? lo : NULL, m + i0, l + i0, alpha);
            for (int i = 0; i < nr; i++)
                if (alpha[i] != 1) {
                    real *Ai = acc + (int64_t)(i0 + i) * dvp;
#pragma omp simd
                    for (int j = 0; j < dvp; j++) Ai[j] *= alpha[i];
                }
            // acc += P V_j, P = St^T.
#ifdef AG_TILE_BF16
            if (d->bf16) {   // P's pairs of keys in bf16 (rows kmax .. of St are not scores: zero)
                pack_pair_cols(PP, QB, St, QB, 0, kmax, QB);
                tile_mm_bf16_band_on(d->amx, nr, dvp, kmax, -nr, lag, 1, PP, 1, QB, VjP, dvp,
                                     acc + (int64_t)i0 * dvp, dvp, true);
            } else
#endif
                tile_mm_band(nr, dvp, kmax, -nr, lag, 1, St, 1, QB, Vj, ldvj, acc + (int64_t)i0 * dvp, dvp, true);
        }
    }
    for (int i = 0; i < nq; i++) {
        real *Oi = o + (int64_t)(t0 - qoff + i) * ldv;   // a division: one rounding, not two (1/l, then a product)
        for (int j = 0; j < d->dv; j++) Oi[j] = acc[(int64_t)i * dvp + j] / l[i];
        if (lse) lse[t0 - qoff + i] = m[i] + (real)log(l[i]);
    }
}

// The forward's tiles, for op_attention (pos 0, T0 = max_T = T, key0 NULL)
// and attn_prefix_forward (no documents, no lse): the queries of rows
// 0 .. T0-1 of q (B, T0, H*dk) at slots pos.., the keys and values of row b
// at kc, vc + b max_T rows from slot key0[b] on; positions count from
// key0[b], so the keys are cut into tiles there, as op_attention cuts a
// document that starts a sequence. o (B, T0, H*dv); lse (B, H, T0), first
// (B, T0) or NULL. Scratch from tp.
static void forward_rows(Tape *tp, const AttnDims *d, real *o, real *lse, const real *q, const real *kc,
                         const real *vc, int max_T, int pos, int T0, const int *key0, const int *first) {
    int ldq = d->H * d->dk, ldv = d->H * d->dv, n_tiles = (T0 + d->bq - 1) / d->bq;
    int chunk = d->bf16 && d->B * d->H >= 4 * omp_get_max_threads() ? n_tiles : 1;
    size_t stride;
    unsigned char *slots = tape_thread_slots(tp, forward_scratch(d, max_T) * sizeof(real), &stride);
    ASSERT((uintptr_t)slots % VEC_BYTES == 0 && stride % VEC_BYTES == 0, "attention: scratch not aligned");
#pragma omp parallel
    {
        real *scratch = (real *)(slots + stride * (size_t)omp_get_thread_num());
        KvCache kvc = {-1, NULL, NULL, NULL};
        if (d->bf16) {   // (the last pieces of forward_scratch)
            size_t kv = (size_t)round_vl(max_T * (d->dk / 2)) + (size_t)(max_T + 1) / 2 * d->dvp;
            kvc.K = (bfpair *)(scratch + forward_scratch(d, max_T) - kv - round_vl((max_T + d->bk - 1) / d->bk));
            kvc.V = kvc.K + round_vl(max_T * (d->dk / 2));
            kvc.done = (int *)(kvc.V + (size_t)(max_T + 1) / 2 * d->dvp);
        }
        if (d->amx) amx_tiles_begin();   // (once per thread and op: tile_amx.h)
        // Later query tiles see more keys: hand tiles out dynamically. Each
        // task writes its own rows, so the result is the same for any
        // schedule. With bf16 products and heads enough to keep the threads
        // busy, a thread takes a whole head (a chunk of n_tiles tiles), so
        // that it packs each key tile once (KvCache).
#pragma omp for collapse(3) schedule(dynamic, chunk)
        for (int b = 0; b < d->B; b++)
            for (int h = 0; h < d->H; h++)
                for (int it = 0; it < n_tiles; it++) {
                    int k0 = key0 ? key0[b] : 0, p0 = pos - k0, t0 = p0 + it * d->bq, nq = imin(d->bq, p0 + T0 - t0);
                    int64_t r0 = (int64_t)b * max_T + k0, row0 = (int64_t)b * T0;   // the first key, query
                    flash_forward_tile(d, t0, nq, p0, q + row0 * ldq + h * d->dk, kc + r0 * ldq + h * d->dk,
                                       vc + r0 * ldv + h * d->dv, o + row0 * ldv + h * d->dv,
                                       lse ? lse + ((int64_t)b * d->H + h) * T0 : NULL, first ? first + row0 : NULL,
                                       scratch, &kvc, (int64_t)b * d->H + h);
                }
        if (d->amx) amx_tiles_end();
    }
}

static void flash_forward(Node *n) {
    AttnDims d = dims_of(n);
    // lse: (B, H, T) or NULL when no backward will run.
    forward_rows(n->tape, &d, n->out[0]->data, n->saved, n->in[0]->data, n->in[1]->data, n->in[2]->data, d.T, 0, d.T,
                 NULL, n->aux);
}

// Backward scratch (reals per thread), each piece a whole number of vectors:
//   per key tile:   Kt (dk x bkp), Vt (dv x bkp), Kp (bk x dkp), dKj (bk x dkp), dVj (bk x dvp)
//   per query tile: Qp (bq x dkp), dOp (bq x dvp), P, dS (bq x bkp each), dQi (bq x dkp)
//   per head:       D (T)
// and with bf16 products (tile_mm_bf16.h; pairs, the size of a real), Th = T rounded up to even:
//   per key tile:   KtP (dk/2 x bkp), VtP (dv/2 x bkp), KR (bk/2 x dkp), and Tp (bk x max(dk, dv)/2),
//                   the pairs of K_j's and V_j's rows before their transpose
//   per query tile: PR, dSR (bq/2 x bkp each), dSb (bq x bkp/2)
//   per head:       Qb (T x dk/2), dOb (T x dv/2), QR (Th/2 x dkp), dOR (Th/2 x dvp)
typedef struct BwdScratch {
    real *Kt, *Vt, *Kp, *dKj, *dVj, *Qp, *dOp, *P, *dS, *dQi, *D;
    bfpair *KtP, *VtP, *KR, *PR, *dSR, *dSb, *Qb, *dOb, *QR, *dOR, *Tp;
} BwdScratch;

// The reals the scratch takes; with w, also points w's pieces into base.
static size_t backward_scratch(const AttnDims *d, real *base, BwdScratch *w) {
    size_t h = d->bf16, Th = (size_t)(d->T + 1) / 2;
    size_t sizes[22] = {(size_t)d->dk * d->bkp, (size_t)d->dv * d->bkp, (size_t)d->bk * d->dkp,
                        (size_t)d->bk * d->dkp, (size_t)d->bk * d->dvp, (size_t)d->bq * d->dkp,
                        (size_t)d->bq * d->dvp, (size_t)d->bq * d->bkp, (size_t)d->bq * d->bkp,
                        (size_t)d->bq * d->dkp, (size_t)d->T,
                        h * (d->dk / 2) * d->bkp, h * (d->dv / 2) * d->bkp, h * (d->bk / 2) * d->dkp,
                        h * (d->bq / 2) * d->bkp, h * (d->bq / 2) * d->bkp, h * d->bq * (d->bkp / 2),
                        h * d->T * (d->dk / 2), h * d->T * (d->dv / 2), h * Th * d->dkp, h * Th * d->dvp,
                        h * d->bk * (size_t)(imax(d->dk, d->dv) / 2)};
    size_t off[23] = {0};
    for (int i = 0; i < 22; i++) off[i + 1] = off[i] + (sizes[i] + VL - 1) / VL * VL;
    if (w) {
        real *p[22];
        for (int i = 0; i < 22; i++) p[i] = base + off[i];
        *w = (BwdScratch){p[0],           p[1],           p[2],           p[3],           p[4],
                          p[5],           p[6],           p[7],           p[8],           p[9],
                          p[10],          (bfpair *)p[11], (bfpair *)p[12], (bfpair *)p[13], (bfpair *)p[14],
                          (bfpair *)p[15], (bfpair *)p[16], (bfpair *)p[17], (bfpair *)p[18], (bfpair *)p[19],
                          (bfpair *)p[20], (bfpair *)p[21]};
    }
    return off[22];
}

// P and, when a gradient needs it, dS of the rows r0 .. nq-1 of a query tile
// (queries t0 ..) against a key tile (nk keys from s0), MR rows (AMX: 16) at a time:
// P = exp(scale Q_i K_j^T - lse), 0 for a key a row does not see, and
// dS = P . (dO_i V_j^T - D) into w->P and w->dS. Qi, dOi: the tile's first
// rows of q and dO.
static void tile_p_ds(const AttnDims *d, const BwdScratch *w, const real *Qi, const real *dOi, const real *lse,
                      const int *first, int t0, int s0, int nq, int nk, int r0, bool need_ds) {
    int ldq = d->H * d->dk, ldv = d->H * d->dv, bkp = d->bkp, nkv = round_vl(nk);
#ifdef AG_TILE_BF16
    int dkh = d->dk / 2, dvh = d->dv / 2;
#endif
    for (int i0 = r0, step = d->amx ? 16 : MR; i0 < nq; i0 += step) {
        int nr = imin(step, nq - i0);
        int kmax = imin(nk, t0 + i0 + nr - s0);   // keys seen by the block's last row
        real *P = w->P + (int64_t)i0 * bkp, *dS = w->dS + (int64_t)i0 * bkp;
#ifdef AG_TILE_BF16
        if (d->bf16)
            tile_mm_bf16_band_on(d->amx, nr, round_vl(kmax), d->dk, TILE_FULL(nr, d->dk), d->scale,
                                 w->Qb + (int64_t)(t0 + i0) * dkh, dkh, 1, w->KtP, bkp, P, bkp, false);
        else
#endif
            tile_mm(nr, round_vl(kmax), d->dk, d->scale, Qi + (int64_t)i0 * ldq, ldq, 1, w->Kt, bkp, P, bkp,
                    false);
        for (int r = 0; r < nr; r++) {
            real *Pr = P + (int64_t)r * bkp, L = lse[t0 + i0 + r];
            int nvalid = imin(nk, t0 + i0 + r - s0 + 1);
            int jlo = docs_begin(first, t0 + i0 + r) - s0;   // keys before it: another document
#ifdef ATTN_VEXP
            for (int j = 0; j < nkv; j += VL)
                _mm512_store_ps(Pr + j, attn_vexp(_mm512_sub_ps(_mm512_load_ps(Pr + j), _mm512_set1_ps(L)),
                                                  attn_lanes_in(j, jlo, nvalid)));
#else
#pragma omp simd
            for (int j = 0; j < nkv; j++) Pr[j] = j < nvalid && j >= jlo ? r_exp(Pr[j] - L) : 0;
#endif
        }
        if (!need_ds) continue;
#ifdef AG_TILE_BF16
        if (d->bf16)
            tile_mm_bf16_band_on(d->amx, nr, round_vl(kmax), d->dv, TILE_FULL(nr, d->dv), 1,
                                 w->dOb + (int64_t)(t0 + i0) * dvh, dvh, 1, w->VtP, bkp, dS, bkp, false);
        else
#endif
            tile_mm(nr, round_vl(kmax), d->dv, 1, dOi + (int64_t)i0 * ldv, ldv, 1, w->Vt, bkp, dS, bkp,
                    false);
        for (int r = 0; r < nr; r++) {
            real *Pr = P + (int64_t)r * bkp, *dSr = dS + (int64_t)r * bkp, Dt = w->D[t0 + i0 + r];
#ifdef ATTN_VEXP   // (the same arithmetic in 512-bit vectors)
            for (int j = 0; j < nkv; j += VL)
                _mm512_store_ps(dSr + j, _mm512_maskz_mul_ps(attn_lanes_in(j, 0, kmax), _mm512_load_ps(Pr + j),
                                                             _mm512_sub_ps(_mm512_load_ps(dSr + j),
                                                                           _mm512_set1_ps(Dt))));
#else
#pragma omp simd
            for (int j = 0; j < nkv; j++) dSr[j] = j < kmax ? Pr[j] * (dSr[j] - Dt) : 0;
#endif
        }
    }
}

// All blocks of one (batch, head). Pointers are the head's base in batch b;
// gradient pointers may be NULL (that input takes no gradient). first, end:
// the row's (T) documents (docs.h), or NULL. Operands
// that are whole aligned vectors (in_place) are used where they are: the
// products read q, k, dO and add into dq, dk, dv directly; otherwise through
// padded copies in scratch.
static void flash_backward_head(const AttnDims *d, const real *q, const real *k, const real *v,
                                const real *o, const real *dO, const real *lse, real *dq, real *dk,
                                real *dv, const int *first, const int *end, const BwdScratch *w) {
    int ldq = d->H * d->dk, ldv = d->H * d->dv, bq = d->bq, bk = d->bk, T = d->T;
    int bkp = d->bkp, dkp = d->dkp, dvp = d->dvp;
    for (int t = 0; t < T; t++) {   // D_t = dO_t . O_t
        const real *dOt = dO + (int64_t)t * ldv, *Ot = o + (int64_t)t * ldv;
        // The backward's first touch of the head's O and dO rows (a step's O
        // left the caches long ago): asked for 8 rows ahead, this pass took
        // 2 % of the kernel's time instead of 5 % (perf, D 256, T 256).
        if (t + 8 < T) {
            prefetch_rows(dOt + 8 * (int64_t)ldv, ldv, 1, d->dv, 0);
            prefetch_rows(Ot + 8 * (int64_t)ldv, ldv, 1, d->dv, 0);
        }
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < d->dv; j++) s += (double)dOt[j] * Ot[j];
        w->D[t] = (real)s;
    }
    bool need_ds = dq || dk;
    bool q_in = in_place(q, ldq, d->dk), k_in = in_place(k, ldq, d->dk), dO_in = in_place(dO, ldv, d->dv);
    bool dq_in = dq && in_place(dq, ldq, d->dk), dk_in = dk && in_place(dk, ldq, d->dk);
    bool dv_in = dv && in_place(dv, ldv, d->dv);
#ifdef AG_TILE_BF16
    // bf16 products: the head's Q and dO rows (for S and dP) and pairs of
    // rows (for dK and dV) once; the pairs of rows start at even rows, which
    // the query tiles do too (bq even).
    int dkh = d->dk / 2, dvh = d->dv / 2;
    if (d->bf16) {
        pack_pair_rows(w->Qb, dkh, q, ldq, T, d->dk);
        if (need_ds) pack_pair_rows(w->dOb, dvh, dO, ldv, T, d->dv);
        if (dk) pack_pair_cols(w->QR, dkp, q, ldq, 0, T, d->dk);
        if (dv) pack_pair_cols(w->dOR, dvp, dO, ldv, 0, T, d->dv);
    }
#endif
    for (int s0 = 0; s0 < T; s0 += bk) {
        int nk = imin(bk, T - s0);
        if (s0 + bk < T) {   // the next key tile's K and V rows, first read by its packing: ask now
            prefetch_rows(k + (int64_t)(s0 + bk) * ldq, ldq, imin(bk, T - s0 - bk), d->dk, 0);
            prefetch_rows(v + (int64_t)(s0 + bk) * ldv, ldv, imin(bk, T - s0 - bk), d->dv, 0);
        }
#ifdef AG_TILE_BF16
        if (d->bf16) {   // K_j^T and V_j^T in pairs along the head, K_j in pairs of keys
            pack_pair_transposed(w->KtP, bkp, k + (int64_t)s0 * ldq, ldq, nk, d->dk, w->Tp);
            if (need_ds) pack_pair_transposed(w->VtP, bkp, v + (int64_t)s0 * ldv, ldv, nk, d->dv, w->Tp);
            if (dq) pack_pair_cols(w->KR, dkp, k + (int64_t)s0 * ldq, ldq, 0, nk, d->dk);
        } else
#endif
        {
            pack_transposed(w->Kt, bkp, k + (int64_t)s0 * ldq, ldq, nk, d->dk);
            if (need_ds) pack_transposed(w->Vt, bkp, v + (int64_t)s0 * ldv, ldv, nk, d->dv);
        }
        if (dq && !k_in && !d->bf16) pack_rows(w->Kp, dkp, k + (int64_t)s0 * ldq, ldq, nk, d->dk);
        real *dKj = dk_in ? dk + (int64_t)s0 * ldq : w->dKj, *dVj = dv_in ? dv + (int64_t)s0 * ldv : w->dVj;
        int lddk = dk_in ? ldq : dkp, lddv = dv_in ? ldv : dvp;
        if (dk && !dk_in) memset(w->dKj, 0, (size_t)nk * dkp * sizeof(real));
        if (dv && !dv_in) memset(w->dVj, 0, (size_t)nk * dvp * sizeof(real));
        // Query tiles that can see key s0 onwards: the one holding s0, and
        // later ones up to the end of the tile's last key's document.
        int t_end = end ? end[s0 + nk - 1] : T;
        for (int t0 = (s0 / bq) * bq; t0 < t_end; t0 += bq) {
            int nq = imin(bq, T - t0);
            int r0 = imax(0, s0 - t0);   // rows before r0 see none of these keys: P = dS = 0 there
            const real *Qi = q + (int64_t)t0 * ldq, *dOi = dO + (int64_t)t0 * ldv;
            if (dk && !q_in && !d->bf16) pack_rows(w->Qp, dkp, Qi, ldq, nq, d->dk);
            if (dv && !dO_in && !d->bf16) pack_rows(w->dOp, dvp, dOi, ldv, nq, d->dv);
            tile_p_ds(d, w, Qi, dOi, lse, first, t0, s0, nq, nk, r0, need_ds);
            // Row r0 + i sees key j of the tile iff j <= i + cut (0 <= cut < bq).
            int nr = nq - r0, cut = t0 + r0 - s0;   // rows that see some key of the tile
            const real *P = w->P + (int64_t)r0 * bkp, *dS = w->dS + (int64_t)r0 * bkp;
#ifdef AG_TILE_BF16
            if (d->bf16) {
                // P and dS in pairs of rows r0 + 2i, r0 + 2i + 1, against the
                // head's pairs of Q and dO rows from row t0 + r0 (t0 and r0 =
                // s0 - t0 or 0 are even: the tiles are).
                int64_t pr = (t0 + r0) / 2;   // the pair of rows t0 + r0, t0 + r0 + 1
                if (dv) {   // dV_j += P^T dO_i
                    pack_pair_cols(w->PR, bkp, P, bkp, 0, nr, nk);
                    tile_mm_bf16_band_on(d->amx, nk, dvp, nr, -cut, nr, 1, w->PR, 1, bkp, w->dOR + pr * dvp, dvp,
                                         dVj, lddv, true);
                }
                if (dk) {   // dK_j += scale dS^T Q_i
                    pack_pair_cols(w->dSR, bkp, dS, bkp, 0, nr, nk);
                    tile_mm_bf16_band_on(d->amx, nk, dkp, nr, -cut, nr, d->scale, w->dSR, 1, bkp,
                                         w->QR + pr * dkp, dkp, dKj, lddk, true);
                }
                if (dq) {   // dQ_i += scale dS K_j
                    int bkh = bkp / 2;
                    pack_pair_rows(w->dSb, bkh, dS, bkp, nr, nk);
                    real *C = dq_in ? dq + (int64_t)(t0 + r0) * ldq : w->dQi;
                    tile_mm_bf16_band_on(d->amx, nr, dkp, nk, -nr, cut, d->scale, w->dSb, bkh, 1, w->KR, dkp, C,
                                         dq_in ? ldq : dkp, dq_in);
                    if (!dq_in) add_rows(dq + (int64_t)(t0 + r0) * ldq, ldq, w->dQi, dkp, nr, d->dk);
                }
                continue;
            }
#endif
            // Float32 tiles: Q_i, dO_i and K_j rows in place, or packed above when their rows are padded.
            const real *Qb = q_in ? Qi : w->Qp, *dOb = dO_in ? dOi : w->dOp;
            const real *Kj = k_in ? k + (int64_t)s0 * ldq : w->Kp;
            int ldqb = q_in ? ldq : dkp, ldob = dO_in ? ldv : dvp, ldk = k_in ? ldq : dkp;
            if (dv)   // dV_j += P^T dO_i
                tile_mm_band(nk, dvp, nr, -cut, nr, 1, P, 1, bkp, dOb + (int64_t)r0 * ldob, ldob, dVj, lddv, true);
            if (dk)   // dK_j += scale dS^T Q_i
                tile_mm_band(nk, dkp, nr, -cut, nr, d->scale, dS, 1, bkp, Qb + (int64_t)r0 * ldqb, ldqb, dKj, lddk,
                             true);
            if (dq && dq_in)   // dQ_i += scale dS K_j
                tile_mm_band(nr, dkp, nk, -nr, cut, d->scale, dS, bkp, 1, Kj, ldk, dq + (int64_t)(t0 + r0) * ldq,
                             ldq, true);
            else if (dq) {
                tile_mm_band(nr, dkp, nk, -nr, cut, d->scale, dS, bkp, 1, Kj, ldk, w->dQi, dkp, false);
                add_rows(dq + (int64_t)(t0 + r0) * ldq, ldq, w->dQi, dkp, nr, d->dk);
            }
        }
        if (dk && !dk_in) add_rows(dk + (int64_t)s0 * ldq, ldq, w->dKj, dkp, nk, d->dk);
        if (dv && !dv_in) add_rows(dv + (int64_t)s0 * ldv, ldv, w->dVj, dvp, nk, d->dv);
    }
}

static void flash_backward(Node *n) {
    AttnDims d = dims_of(n);
    real *dq = NODE_GRAD_IN(n, 0), *dk = NODE_GRAD_IN(n, 1), *dv = NODE_GRAD_IN(n, 2);
    if (!dq && !dk && !dv) return;
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    const real *o = n->out[0]->data, *dO = n->out[0]->grad;
    const real *lse = n->saved;
    const int *first = n->aux, *end = first ? docs_end(n->tape, first, d.B, d.T) : NULL;
    int ldq = d.H * d.dk, ldv = d.H * d.dv;
    size_t stride;
    unsigned char *slots = tape_thread_slots(n->tape, backward_scratch(&d, NULL, NULL) * sizeof(real), &stride);
    ASSERT((uintptr_t)slots % VEC_BYTES == 0 && stride % VEC_BYTES == 0, "attention: scratch not aligned");
#pragma omp parallel
    {
        BwdScratch w;
        backward_scratch(&d, (real *)(slots + stride * (size_t)omp_get_thread_num()), &w);
        if (d.amx) amx_tiles_begin();
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < d.B; b++)
            for (int h = 0; h < d.H; h++) {
                int64_t qo = (int64_t)b * d.T * ldq + h * d.dk, vo = (int64_t)b * d.T * ldv + h * d.dv;
                flash_backward_head(&d, q + qo, k + qo, v + vo, o + vo, dO + vo,
                                    lse + ((int64_t)b * d.H + h) * d.T, dq ? dq + qo : NULL,
                                    dk ? dk + qo : NULL, dv ? dv + vo : NULL, first ? first + (int64_t)b * d.T : NULL,
                                    end ? end + (int64_t)b * d.T : NULL, &w);
            }
        if (d.amx) amx_tiles_end();
    }
}

static const OpDef OP_ATTENTION = {"attention", flash_forward, flash_backward,
                                   CUDA_PAIR(cu_flash_forward, cu_flash_backward)};

Tensor *op_attention_tiled(Tape *tp, Tensor *q, Tensor *k, Tensor *v, int n_heads, double scale,
                           const int *doc_start, int tile_q, int tile_k) {
    ASSERT(q->ndim == 3 && k->ndim == 3 && v->ndim == 3,
           "attention: q %s, k %s, v %s must be (B, T, H*d)", SHAPE(q), SHAPE(k), SHAPE(v));
    ASSERT(tensor_same_shape(q, k), "attention: q %s and k %s must have the same shape", SHAPE(q), SHAPE(k));
    ASSERT(v->shape[0] == q->shape[0] && v->shape[1] == q->shape[1],
           "attention: v %s must have the (B, T) of q %s", SHAPE(v), SHAPE(q));
    ASSERT(n_heads > 0 && q->shape[2] % n_heads == 0 && v->shape[2] % n_heads == 0,
           "attention: %d heads do not divide q %s / v %s", n_heads, SHAPE(q), SHAPE(v));
    ASSERT(q->shape[1] >= 1, "attention: empty sequence, q %s", SHAPE(q));
    ASSERT(tile_q > 0 && tile_k > 0, "attention: tiles %d x %d", tile_q, tile_k);
    int B = q->shape[0], T = q->shape[1];
    Tensor *o = tape_tensorv(tp, 3, B, T, v->shape[2]);
    Node *n = tape_op(tp, &OP_ATTENTION, (Tensor *[]){q, k, v}, 3, &o, 1);
    n->iarg[0] = B;
    n->iarg[1] = T;
    n->iarg[2] = n_heads;
    n->iarg[3] = q->shape[2] / n_heads;
    n->iarg[4] = v->shape[2] / n_heads;
    n->iarg[5] = tile_q;
    n->iarg[6] = tile_k;
    n->iarg[7] = attn_tiles_kind(n->iarg[3], n->iarg[4], tile_q, tile_k);
    n->farg[0] = scale;
    n->aux = docs_first(tp, doc_start, B, T);
    if (n->recorded) n->saved = tape_dalloc(tp, (size_t)B * n_heads * T * sizeof(real));
    tape_forward(n);
    return o;
}

Tensor *op_attention(Tape *tp, Tensor *q, Tensor *k, Tensor *v, int n_heads, double scale, const int *doc_start) {
    return op_attention_tiled(tp, q, k, v, n_heads, scale, doc_start, ATTN_TILE_Q, ATTN_TILE_K);
}

void attn_prefix_forward(Tape *tp, real *o, const real *q, const real *kc, const real *vc, int B, int max_T, int pos,
                         int T0, const int *key0, int H, int dk, int dv, double scale) {
    ASSERT(B >= 1 && T0 >= 1 && pos >= 0 && pos + T0 <= max_T && H >= 1 && dk >= 1 && dv >= 1,
           "attn_prefix_forward: B %d, window %d at slot %d of %d, H %d, dk %d, dv %d", B, T0, pos, max_T, H, dk,
           dv);
    for (int b = 0; key0 && b < B; b++)
        ASSERT(key0[b] >= 0 && key0[b] <= pos, "attn_prefix_forward: row %d's keys begin at %d, its window at %d", b,
               key0[b], pos);
    Bf16Tiles k = attn_tiles_kind(dk, dv, ATTN_TILE_Q, ATTN_TILE_K);
    AttnDims d = {B, T0, H, dk, dv, ATTN_TILE_Q, ATTN_TILE_K, round_vl(dk), round_vl(dv), round_vl(ATTN_TILE_K),
                  (real)scale, k != BF16_TILES_FP32, k == BF16_TILES_AMX};
    forward_rows(tp, &d, o, NULL, q, kc, vc, max_T, pos, T0, key0, NULL);
}
