// dsa_kernel.c: the DeepSeek sparse-attention indexer: scores, top-k
// selection, the distillation target and the KL loss (dsa_kernel.h). The
// sparse attention over the selection is dsa_sparse.c.
//
// Indexer scores, per batch element, for a tile of nq queries:
//   Z = Q_tile K^T      Q_tile (nq*HI, dI): the HI index heads of each query
//                       are consecutive rows; K (s_end, dI)
//   I_ts = c sum_j w_tj ReLU(Z_(t,j),s),  c = 1/sqrt(dI),  s <= t
// Backward (Z recomputed per tile):
//   dw_tj += c sum_s dI_ts ReLU(Z_(t,j),s)
//   dZ_(t,j),s = c dI_ts w_tj [Z > 0]
//   dQ_tile += dZ K,  dK += dZ^T Q_tile
//
// Documents (docs.h): every row's candidates are the positions s in
// [lo(t), t] of its own document (lo(t) its start) instead of [0, t]: the
// scores outside are zeros that nothing reads (the KL's softmax and the
// top-k run over [lo(t), t]), and key blocks before a tile's documents are
// not scored. A row with fewer than K candidates selects them all, -1
// padded, as the first rows of a sequence do.
#include <math.h>
#include <stdint.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernel.h"
#include "blas.h"
#include "cuda_ops.h"
#include "docs.h"
#include "dsa_kernel.h"
#include "tile_mm.h"

// ---- indexer scores ----

// The scores of the queries at positions t0 .. t0+nq-1 of one row: I_t,s
// for s <= t, written to out + i*ldo, zeros after s = t up to ldo (ldo = T
// for the full matrix). Q and W hold the tile's queries and weights (rows
// 0 .., i.e. position t at row t - t0), K the row's keys (row s = position
// s). The keys go in blocks of DSA_KEY_BLOCK, so that Z stays in cache
// between the product and the pass that reads it, and that pass writes each
// score once: I = 0 + term_0 + term_1 + ..., the index heads in order.
// first: the row's document starts (docs.h, (T)) or NULL: then only s in
// [lo(t), t] is scored, and the entries before lo(t) are zeroed when `full`
// (else left as they are: the caller reads [lo(t), t] only).
// Z: scratch (nq*HI, DSA_KEY_BLOCK).
static void index_tile(real *out, int64_t ldo, const real *Q, const real *K, const real *W, const int *first,
                       bool full, int t0, int nq, int HI, int dI, real *Z) {
    real c = (real)(1.0 / sqrt(dI));
    int s_end = t0 + nq;
    for (int s0 = docs_begin(first, t0) / DSA_KEY_BLOCK * DSA_KEY_BLOCK; s0 < s_end; s0 += DSA_KEY_BLOCK) {
        int ns = imin(DSA_KEY_BLOCK, s_end - s0);
        gemm(false, true, nq * HI, ns, dI, 1, Q, dI, K + (int64_t)s0 * dI, dI, 0, Z, ns);
        for (int i = imax(0, s0 - t0); i < nq; i++) {   // rows t >= s0
            int t = t0 + i, m = imin(ns, t + 1 - s0);
            real *It = out + (int64_t)i * ldo + s0;
            const real *wt = W + (int64_t)i * HI, *Zi = Z + (int64_t)i * HI * ns;
#pragma omp simd
            for (int s = 0; s < m; s++) {
                real acc = 0;
                for (int j = 0; j < HI; j++) {
                    real z = Zi[(int64_t)j * ns + s];
                    acc += z > 0 ? c * wt[j] * z : 0;
                }
                It[s] = acc;
            }
        }
    }
    for (int i = 0; i < nq; i++) {
        int t = t0 + i;
        memset(out + (int64_t)i * ldo + t + 1, 0, (size_t)(ldo - t - 1) * sizeof(real));
        if (full && first) memset(out + (int64_t)i * ldo, 0, (size_t)docs_begin(first, t) * sizeof(real));
    }
}

// iarg: 0 B, 1 T, 2 HI, 3 dI. aux: first (B, T) of the documents, or NULL.
static void index_forward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], HI = n->iarg[2], dI = n->iarg[3];
    int n_tiles = (T + DSA_TILE - 1) / DSA_TILE;
    size_t stride;   // per thread: Z (nq*HI, DSA_KEY_BLOCK)
    unsigned char *slots = tape_thread_slots(n->tape, (size_t)DSA_TILE * HI * DSA_KEY_BLOCK * sizeof(real), &stride);
#pragma omp parallel
    {
        real *Z = (real *)(slots + stride * (size_t)omp_get_thread_num());
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int it = 0; it < n_tiles; it++) {
                int t0 = it * DSA_TILE;
                int64_t r0 = (int64_t)b * T + t0;
                const int *first = n->aux;
                index_tile(n->out[0]->data + r0 * T, T, n->in[0]->data + r0 * HI * dI,
                           n->in[1]->data + (int64_t)b * T * dI, n->in[2]->data + r0 * HI, first ? first + b * T : NULL,
                           true, t0, imin(DSA_TILE, T - t0), HI, dI, Z);
            }
    }
}

static void index_backward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], HI = n->iarg[2], dI = n->iarg[3];
    real *gq = NODE_GRAD_IN(n, 0), *gk = NODE_GRAD_IN(n, 1), *gw = NODE_GRAD_IN(n, 2);
    if (!gq && !gk && !gw) return;
    const real *qI = n->in[0]->data, *kI = n->in[1]->data, *w = n->in[2]->data;
    const real *dI_ = n->out[0]->grad;
    const int *first = n->aux;
    real c = (real)(1.0 / sqrt(dI));
    // One task per batch element: dK collects every query tile in a fixed order.
    size_t stride;   // per thread: Z (nq*HI, s_end), then dZ
    unsigned char *slots = tape_thread_slots(n->tape, (size_t)DSA_TILE * HI * T * sizeof(real), &stride);
#pragma omp parallel
    {
        real *Z = (real *)(slots + stride * (size_t)omp_get_thread_num());
#pragma omp for schedule(static)
        for (int b = 0; b < B; b++)
            for (int t0 = 0; t0 < T; t0 += DSA_TILE) {
                int nq = imin(DSA_TILE, T - t0), s_end = t0 + nq;
                const real *Q = qI + ((int64_t)b * T + t0) * HI * dI, *K = kI + (int64_t)b * T * dI;
                gemm(false, true, nq * HI, s_end, dI, 1, Q, dI, K, dI, 0, Z, s_end);
                for (int i = 0; i < nq; i++) {
                    int t = t0 + i, lo = docs_begin(first, (int64_t)b * T + t);
                    const real *g = dI_ + ((int64_t)b * T + t) * T;
                    for (int j = 0; j < HI; j++) {
                        int64_t wi = ((int64_t)b * T + t) * HI + j;
                        real *Zr = Z + ((int64_t)i * HI + j) * s_end;
                        double dw = 0;
                        real cw = c * w[wi];
                        for (int s = 0; s < lo; s++) Zr[s] = 0;   // another document's keys
                        for (int s = lo; s <= t; s++) {
                            real z = Zr[s];
                            if (z > 0) dw += (double)g[s] * z;
                            Zr[s] = z > 0 ? cw * g[s] : 0;   // dZ
                        }
                        for (int s = t + 1; s < s_end; s++) Zr[s] = 0;
                        if (gw) gw[wi] += (real)(c * dw);
                    }
                }
                if (gq)
                    gemm(false, false, nq * HI, dI, s_end, 1, Z, s_end, K, dI, 1,
                         gq + ((int64_t)b * T + t0) * HI * dI, dI);
                if (gk) gemm(true, false, s_end, dI, nq * HI, 1, Z, s_end, Q, dI, 1, gk + (int64_t)b * T * dI, dI);
            }
    }
}

static const OpDef OP_DSA_INDEX = {"dsa_index_scores", index_forward, index_backward,
                                   CUDA_PAIR(cu_dsa_index_forward, cu_dsa_index_backward)};

Tensor *op_dsa_index_scores(Tape *tp, Tensor *qI, Tensor *kI, Tensor *w, int index_heads, const int *doc_start) {
    ASSERT(qI->ndim == 3 && kI->ndim == 3 && w->ndim == 3, "dsa_index_scores: qI %s, kI %s, w %s must be 3-D",
           SHAPE(qI), SHAPE(kI), SHAPE(w));
    int B = qI->shape[0], T = qI->shape[1], HI = index_heads, dI = kI->shape[2];
    ASSERT(HI > 0 && qI->shape[2] == HI * dI && kI->shape[0] == B && kI->shape[1] == T && w->shape[0] == B &&
               w->shape[1] == T && w->shape[2] == HI,
           "dsa_index_scores: with %d index heads, qI %s, kI %s, w %s must be (B, T, HI*dI), (B, T, dI), "
           "(B, T, HI)",
           HI, SHAPE(qI), SHAPE(kI), SHAPE(w));
    Tensor *Isc = tape_tensorv(tp, 3, B, T, T);
    Node *n = tape_op(tp, &OP_DSA_INDEX, (Tensor *[]){qI, kI, w}, 3, &Isc, 1);
    n->iarg[0] = B;
    n->iarg[1] = T;
    n->iarg[2] = HI;
    n->iarg[3] = dI;
    n->aux = docs_first(tp, doc_start, B, T);
    tape_forward(n);
    return Isc;
}

// VL keys at a time, transposed so that each key's dot products run along
// a vector lane (as attention's decoding kernel does), with the arithmetic
// of index_tile: I = sum_j (c w_j) z_j over z_j > 0, in real. The last block
// may be partial: pack_transposed zeroes its missing keys' lanes, whose
// scores are not stored. (A scalar loop in double made sparse decoding at
// 16k keys slower than dense attention: tiny_attn's indexer, 4 x 16 per
// key, against 4 x 64.)
static void index_keys(real *scores, const real *qI, const real *w, const real *kI, int64_t ld, int n, int HI,
                       int dI) {
    real c = (real)(1.0 / sqrt(dI));
    real Kt[dI * VL] __attribute__((aligned(VEC_BYTES)));   // (dI x VL): VL keys' columns
    for (int s = 0; s < n; s += VL) {
        int nk = imin(VL, n - s);
        pack_transposed(Kt, VL, kI + (int64_t)s * ld, (int)ld, nk, dI);
        real acc[VL] = {0};
        for (int j = 0; j < HI; j++) {
            real z[VL] = {0}, cw = c * w[j];
            for (int i = 0; i < dI; i++) {
                real a = qI[j * dI + i];
#pragma omp simd
                for (int k = 0; k < VL; k++) z[k] += a * Kt[i * VL + k];
            }
#pragma omp simd
            for (int k = 0; k < VL; k++) acc[k] += z[k] > 0 ? cw * z[k] : 0;
        }
        memcpy(scores + s, acc, (size_t)nk * sizeof(real));
    }
}

// A long row's keys in blocks of DSA_INDEX_BLOCK, shared by attention's
// decoding team (attn_decode_team: generate runs a small model on one thread
// but gives long caches every core). Each key's score is its own lane's
// arithmetic, so any split gives the same scores bit for bit. Rows of fewer
// than 4 blocks stay on one thread: waking a second cost more than it saved
// at 4,096 keys (dsa_decode_bench --indexer: 0.032 against 0.040 ms).
#define DSA_INDEX_BLOCK 2048
void dsa_index_row(real *scores, const real *qI, const real *w, const real *kI, int64_t ld, int n, int HI, int dI) {
    int team = attn_decode_team((int64_t)n * HI), blocks = (n + DSA_INDEX_BLOCK - 1) / DSA_INDEX_BLOCK;
    if (team <= 1 || blocks < 4) {
        index_keys(scores, qI, w, kI, ld, n, HI, dI);
        return;
    }
#pragma omp parallel for num_threads(team) schedule(static)
    for (int p = 0; p < blocks; p++) {
        int64_t s = (int64_t)p * DSA_INDEX_BLOCK;
        index_keys(scores + s, qI, w, kI + s * ld, ld, imin(DSA_INDEX_BLOCK, n - (int)s), HI, dI);
    }
}

// ---- top-k selection ----

// Is position a a better pick than b in row It? Larger score; on a tie, later.
static inline bool better(const real *It, int a, int b) { return It[a] > It[b] || (It[a] == It[b] && a > b); }

// heap[0] is the worst of the kept positions.
static void sift_down(int *heap, int n, int i, const real *It) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(It, heap[w], heap[l])) w = l;
        if (r < n && better(It, heap[w], heap[r])) w = r;
        if (w == i) return;
        int tmp = heap[i];
        heap[i] = heap[w];
        heap[w] = tmp;
        i = w;
    }
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

void dsa_topk_row_ref(int *row, const real *scores, int n, int K) {
    if (n <= K) {   // every candidate is selected
        for (int j = 0; j < K; j++) row[j] = j < n ? j : -1;
        return;
    }
    for (int j = 0; j < K; j++) row[j] = j;   // a min-heap of the first K ...
    for (int i = K / 2 - 1; i >= 0; i--) sift_down(row, K, i, scores);
    for (int s = K; s < n; s++)               // ... then replace its worst when beaten
        if (better(scores, s, row[0])) {
            row[0] = s;
            sift_down(row, K, 0, scores);
        }
    qsort(row, K, sizeof *row, cmp_int);
}

#define TOPK_LANES 16   // lanes of the group-maximum pass (one AVX-512 vector of floats)

// A lower bound of the K-th largest of x[0..n): split the positions into G >= K
// groups (s mod G; only the first n / G * G positions, so none is empty) and
// take the least of the group maxima: G distinct elements are >= it.
// G = K rounded up to whole lane blocks; needs n >= G.
static real topk_floor(const real *x, int n, int G) {
    int full = n / G * G;
    real m0 = INFINITY;
    for (int l0 = 0; l0 < G; l0 += TOPK_LANES) {
        real mx[TOPK_LANES];
        for (int l = 0; l < TOPK_LANES; l++) mx[l] = x[l0 + l];
        for (int s = G + l0; s < full; s += G)
#pragma omp simd
            for (int l = 0; l < TOPK_LANES; l++) mx[l] = x[s + l] > mx[l] ? x[s + l] : mx[l];
        for (int l = 0; l < TOPK_LANES; l++) m0 = mx[l] < m0 ? mx[l] : m0;
    }
    return m0;
}

// Scores as unsigned integers in the same order (for non-NaN x): flip a
// negative number's bits, set a positive one's sign bit. -0 becomes +0 first,
// so that the two zeros tie, as they do under `>`.
#ifdef AG_DOUBLE
typedef uint64_t rkey;
#else
typedef uint32_t rkey;
#endif
static inline rkey real_key(real x) {
    x += 0;
    rkey b, sign = (rkey)1 << (8 * sizeof(rkey) - 1);
    memcpy(&b, &x, sizeof b);
    return b & sign ? ~b : b | sign;
}

// The same selection as dsa_topk_row_ref (the top K under the order of
// `better`, which is total, so the set is unique), in O(n) and without
// data-dependent branches on most positions:
// 1. the positions scoring at least topk_floor() are the candidates (their
//    keys kept alongside; typically a few times K);
// 2. th = the K-th largest candidate key, built bit by bit from the top: a
//    bit stays set when at least K keys are >= the value so far (a vector
//    count per bit; stops early when exactly K are);
// 3. one scan of the candidates (ascending) keeps every key > th and, of the
//    keys == th, the latest K - #(> th): ties go to the later position.
void dsa_topk_row(int *row, const real *scores, int n, int K, void *work) {
    if (n <= K) {
        for (int j = 0; j < K; j++) row[j] = j < n ? j : -1;
        return;
    }
    rkey *key = work;
    int *cand = (int *)(key + n);
    int G = (K + TOPK_LANES - 1) / TOPK_LANES * TOPK_LANES, c = 0;
    real m0 = n >= 2 * G ? topk_floor(scores, n, G) : -INFINITY;
    for (int s = 0; s < n; s++) {   // branch-free: most positions fail the test
        cand[c] = s;
        key[c] = real_key(scores[s]);
        c += scores[s] >= m0;
    }
    rkey th = 0;
    for (int bit = 8 * (int)sizeof(rkey) - 1; bit >= 0; bit--) {
        rkey try = th | (rkey)1 << bit;
        int cnt = 0;
#pragma omp simd reduction(+ : cnt)
        for (int j = 0; j < c; j++) cnt += key[j] >= try;
        if (cnt >= K) th = try;
        if (cnt == K) break;
    }
    int gt = 0, eq = 0;
#pragma omp simd reduction(+ : gt, eq)
    for (int j = 0; j < c; j++) {
        gt += key[j] > th;
        eq += key[j] == th;
    }
    int skip = eq - (K - gt), m = 0;   // the earliest ties that stay out
    for (int j = 0; j < c; j++)
        if (key[j] > th || (key[j] == th && skip-- <= 0)) row[m++] = cand[j];
    ASSERT(m == K, "dsa_topk_row: kept %d of K = %d (NaN scores?)", m, K);
}

void dsa_topk_from(int *row, const real *scores, int lo, int n, int K, void *work) {
    dsa_topk_row(row, scores + lo, n - lo, K, work);
    if (lo)
        for (int j = 0; j < K && row[j] >= 0; j++) row[j] += lo;
}

// first (B*T) of doc_start, malloc'd, or NULL (no flag).
static int *first_of(const int *doc_start, int B, int T) {
    if (!doc_start) return NULL;
    int *first = xmalloc((size_t)imax(B * T, 1) * sizeof(int));
    if (docs_first_fill(first, doc_start, B, T)) return first;
    free(first);
    return NULL;
}

void dsa_topk(int *sel, const real *Isc, int B, int T, int K, const int *doc_start) {
    ASSERT(K >= 1, "dsa_topk: K = %d", K);
    int *first = first_of(doc_start, B, T);
#pragma omp parallel
    {
        void *cand = xmalloc(DSA_TOPK_WORK(T));
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                int64_t r = (int64_t)b * T + t;
                dsa_topk_from(sel + r * K, Isc + r * T, docs_begin(first, r), t + 1, K, cand);
            }
        free(cand);
    }
    free(first);
}

// dsa_index_select (pos 0, T0 = max_T = T, key0 NULL, documents first) and
// dsa_prefix_select (no documents): the queries of rows 0 .. T0-1 of qI, w
// (B, T0, ...) at slots pos.., the keys of row b at kI + b max_T dI from
// slot key0[b] on; positions count from key0[b], selections are slots.
static void select_rows(int *sel, const real *qI, const real *w, const real *kI, int B, int max_T, int pos, int T0,
                        const int *key0, const int *first, int HI, int dI, int K) {
    int n_tiles = (T0 + DSA_TILE - 1) / DSA_TILE, most = pos + T0;   // the longest row of scores
#pragma omp parallel
    {
        real *Z = xmalloc((size_t)DSA_TILE * HI * DSA_KEY_BLOCK * sizeof(real));
        real *rows = xmalloc((size_t)DSA_TILE * most * sizeof(real));   // (nq, t0+nq) one tile of scores
        void *cand = xmalloc(DSA_TOPK_WORK(most));
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int it = 0; it < n_tiles; it++) {
                int k0 = key0 ? key0[b] : 0, p0 = pos - k0, t0 = p0 + it * DSA_TILE;   // the tile's first query
                int nq = imin(DSA_TILE, p0 + T0 - t0);
                int64_t r0 = (int64_t)b * T0 + t0 - p0;   // its row
                const int *fb = first ? first + (int64_t)b * T0 : NULL;
                index_tile(rows, t0 + nq, qI + r0 * HI * dI, kI + ((int64_t)b * max_T + k0) * dI, w + r0 * HI, fb,
                           false, t0, nq, HI, dI, Z);
                for (int i = 0; i < nq; i++) {
                    int *row = sel + (r0 + i) * K;
                    dsa_topk_from(row, rows + (int64_t)i * (t0 + nq), docs_begin(fb, t0 + i), t0 + i + 1, K, cand);
                    for (int j = 0; k0 && j < K && row[j] >= 0; j++) row[j] += k0;
                }
            }
        free(Z);
        free(rows);
        free(cand);
    }
}

void dsa_index_select(int *sel, const real *qI, const real *kI, const real *w, int B, int T, int HI, int dI,
                      int K, const int *doc_start) {
    ASSERT(K >= 1, "dsa_index_select: K = %d", K);
    int *first = first_of(doc_start, B, T);
    select_rows(sel, qI, w, kI, B, T, 0, T, NULL, first, HI, dI, K);
    free(first);
}

void dsa_prefix_select(int *sel, const real *qI, const real *w, const real *kIc, int B, int max_T, int pos, int T0,
                       const int *key0, int HI, int dI, int K) {
    ASSERT(K >= 1 && T0 >= 1 && pos >= 0 && pos + T0 <= max_T, "dsa_prefix_select: K %d, window %d at %d of %d", K,
           T0, pos, max_T);
    for (int b = 0; key0 && b < B; b++)
        ASSERT(key0[b] >= 0 && key0[b] <= pos, "dsa_prefix_select: row %d's keys begin at %d, its window at %d", b,
               key0[b], pos);
    select_rows(sel, qI, w, kIc, B, max_T, pos, T0, key0, NULL, HI, dI, K);
}

// ---- distillation target and loss ----

void dsa_attn_target(real *p, const real *q, const real *k, int B, int T, int H, int dk, double scale,
                     const int *doc_start) {
    int ld = H * dk, n_tiles = (T + DSA_TILE - 1) / DSA_TILE;
    int *first = first_of(doc_start, B, T);
#pragma omp parallel
    {
        real *S = xmalloc((size_t)DSA_TILE * T * sizeof(real));   // (nq, s_end)
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int b = 0; b < B; b++)
            for (int it = 0; it < n_tiles; it++) {
                int t0 = it * DSA_TILE, nq = imin(DSA_TILE, T - t0), s_end = t0 + nq;
                real *P = p + ((int64_t)b * T + t0) * T;
                memset(P, 0, (size_t)nq * T * sizeof(real));
                for (int h = 0; h < H; h++) {
                    gemm(false, true, nq, s_end, dk, (real)scale, q + ((int64_t)b * T + t0) * ld + h * dk, ld,
                         k + (int64_t)b * T * ld + h * dk, ld, 0, S, s_end);
                    for (int i = 0; i < nq; i++) {
                        int t = t0 + i, lo = docs_begin(first, (int64_t)b * T + t);
                        real *Si = S + (int64_t)i * s_end;
                        double mx = -INFINITY, sum = 0;
                        for (int s = lo; s <= t; s++) mx = fmax(mx, Si[s]);
                        for (int s = lo; s <= t; s++) sum += exp(Si[s] - mx);
                        double inv = 1.0 / (sum * H);
                        for (int s = lo; s <= t; s++) P[(int64_t)i * T + s] += (real)(exp(Si[s] - mx) * inv);
                    }
                }
            }
        free(S);
    }
    free(first);
}

// iarg: 0 B, 1 T, 2 the whole batch's rows (Tape.loss_rows; B in one
// process): the KL is summed over this B and divided by iarg[2] x T. saved:
// lse (B*T) of the rows of I over s <= t (s >= lo(t) with documents); aux:
// first (B, T) or NULL.
static void kl_forward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1];
    const real *Isc = n->in[0]->data, *p = n->in[1]->data;
    const int *first = n->aux;
    double *row_loss = tape_alloc(n->tape, (size_t)B * T * sizeof(double));
    real *lse_saved = n->saved;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < (int64_t)B * T; r++) {
        int t = (int)(r % T), lo = docs_begin(first, r);
        const real *Ir = Isc + r * T, *pr = p + r * T;
        double mx = -INFINITY, sum = 0, kl = 0;
        for (int s = lo; s <= t; s++) mx = fmax(mx, Ir[s]);
        for (int s = lo; s <= t; s++) sum += exp(Ir[s] - mx);
        double lse = mx + log(sum);
        for (int s = lo; s <= t; s++)
            if (pr[s] > 0) kl += pr[s] * (log((double)pr[s]) - (Ir[s] - lse));
        row_loss[r] = kl;
        if (lse_saved) lse_saved[r] = (real)lse;
    }
    double total = 0;   // fixed order: the same for any thread count
    for (int64_t r = 0; r < (int64_t)B * T; r++) total += row_loss[r];
    n->out[0]->data[0] = (real)(total / ((double)n->iarg[2] * T));
}

static void kl_backward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1];
    real *gI = NODE_GRAD_IN(n, 0);
    if (!gI) return;
    const real *Isc = n->in[0]->data, *p = n->in[1]->data, *lse = n->saved;
    const int *first = n->aux;
    double g = n->out[0]->grad[0] / ((double)n->iarg[2] * T);
    // d/dI_ts sum_s' p_ts' (log p_ts' - I_ts' + lse_t) = softmax(I_t)_s sum_s' p_ts' - p_ts
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < (int64_t)B * T; r++) {
        int t = (int)(r % T), lo = docs_begin(first, r);
        const real *Ir = Isc + r * T, *pr = p + r * T;
        double mass = 0;
        for (int s = lo; s <= t; s++) mass += pr[s];
        for (int s = lo; s <= t; s++) gI[r * T + s] += (real)(g * (exp(Ir[s] - lse[r]) * mass - pr[s]));
    }
}

static const OpDef OP_DSA_KL = {"dsa_kl", kl_forward, kl_backward, CUDA_PAIR(cu_dsa_kl_forward, cu_dsa_kl_backward)};

Tensor *op_dsa_kl(Tape *tp, Tensor *Isc, Tensor *p, const int *doc_start) {
    ASSERT(Isc->ndim == 3 && Isc->shape[1] == Isc->shape[2] && tensor_same_shape(Isc, p),
           "dsa_kl: Isc %s and p %s must both be (B, T, T)", SHAPE(Isc), SHAPE(p));
    ASSERT(!p->requires_grad, "dsa_kl: the target p %s takes no gradient (build it in no-grad mode)", SHAPE(p));
    Tensor *loss = tape_tensorv(tp, 1, 1);
    Node *n = tape_op(tp, &OP_DSA_KL, (Tensor *[]){Isc, p}, 2, &loss, 1);
    n->iarg[0] = Isc->shape[0];
    n->iarg[1] = Isc->shape[1];
    n->iarg[2] = tape_loss_rows(tp, Isc->shape[0], "dsa_kl");
    n->aux = docs_first(tp, doc_start, Isc->shape[0], Isc->shape[1]);
    if (n->recorded) n->saved = tape_dalloc(tp, (size_t)Isc->shape[0] * Isc->shape[1] * sizeof(real));
    tape_forward(n);
    return loss;
}

double dsa_selected_mass(const real *p, const int *sel, int B, int T, int K) {
    double total = 0;
    for (int64_t r = 0; r < (int64_t)B * T; r++)
        for (int j = 0; j < K; j++) {
            int s = sel[r * K + j];
            if (s >= 0) total += p[r * T + s];
        }
    return total / ((double)B * T);
}
