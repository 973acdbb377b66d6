// kda_chunk.cuh: what the chunked form of op_kda on the GPU shares between
// its forward (kda_chunk.cu) and its backward (kda_chunk_backward.cu): the
// per-op rows, the per-chunk step that recomputes Gamma, and the launch of
// the per-chunk preparation (kda_chunk.cu's step 1), which the backward runs
// again to get W, U, Qg, Kd, P, bl and, for itself, KKE and Tm.
// Included by those two files only.
#ifndef AG_KDA_CHUNK_CUH
#define AG_KDA_CHUNK_CUH

#include "gdn_chunk.cuh"
#include "kda_node.h"

// The scans (step 2 of each pass): a block walks the chunks of one (batch,
// head) for nvb of the state's columns, nvb one of these (kda_scan_plan).
#define KDA_NVB_MAX 16
#define KDA_NVB_MIN 4

// The per-op rows of the chunked form beyond GdnArgs' Wb, Ub and states.
// A chunk's L x L matrices sit at its first row, r Cw (r = bh T + t0), L
// rows of pitch L (inside the chunk's L Cw reals).
struct KdaRows {
    real *Qg, *Kd;   // (B H, T, dk)
    real *P;         // (B H, T, Cw): row t of its chunk's P (pitch Cw; the chunk's L columns used)
    real *bl;        // (B H, NC, dk)
    real *KK, *Tm;   // (B H, T, Cw) or NULL: KKE (A / beta, strictly lower) and (I + A)^-1, L x L each
    real *PtdO;      // backward (B H, T, dv): P^T dO, then dDelta
    real *QtdO;      // backward (B H, NC, dk, dv): Qg^T dO per chunk
};

// The operands of one sub-block's decayed products under bf16 (the bf16
// instances only; kda_sub_operands forms them).
struct KdaSubWs {
    real *Ys, *Ec;        // (C, dk) the columns' operands k_j Ec_j and factors Ec_j = exp(Gamma_r - Gamma_j)
    real *Qs, *Ks, *Ef;   // (KDA_SUB, dk) the rows' operands q_i Ef_i, k_i Ef_i and Ef_i = exp(Gamma_i - Gamma_r)
    int *keep;            // (dk) 1: the channel goes through the reference point inside the sub-block
};

// Carves s at *at (bf false: every array empty, nothing taken).
static __host__ __device__ void kda_sub_layout(KdaSubWs *s, unsigned char *base, size_t *at, int C, int dk, bool bf) {
    size_t Ck = bf ? (size_t)C * dk : 0, Sk = bf ? (size_t)KDA_SUB * dk : 0;
    size_t oYs = ws_take(at, Ck, sizeof(real)), oEc = ws_take(at, Ck, sizeof(real));
    size_t oQs = ws_take(at, Sk, sizeof(real)), oKs = ws_take(at, Sk, sizeof(real));
    size_t oEf = ws_take(at, Sk, sizeof(real)), okp = ws_take(at, bf ? dk : 0, sizeof(int));
    if (s) {
        s->Ys = (real *)(base + oYs), s->Ec = (real *)(base + oEc);
        s->Qs = (real *)(base + oQs), s->Ks = (real *)(base + oKs), s->Ef = (real *)(base + oEf);
        s->keep = (int *)(base + okp);
    }
}

// Per-block workspace of step 1, chunks of up to C positions (sub: the bf16
// instances' only).
struct KdaPrepWs {
    double *G;             // (C, dk) Gamma
    real *A, *Tm;          // (C, C)
    real *Xw, *Xu;         // (C, dk), (C, dv)
    real *bet;             // (C)
    int *db;               // (C) where row i's document begins in the chunk, -1: before it
    KdaSubWs sub;
};

static __host__ __device__ size_t kda_prep_layout(KdaPrepWs *w, unsigned char *base, int C, int dk, int dv,
                                                  bool bf) {
    size_t at = 0, CC = (size_t)C * C;
    size_t oG = ws_take(&at, (size_t)C * dk, sizeof(double));
    size_t oA = ws_take(&at, CC, sizeof(real)), oTm = ws_take(&at, CC, sizeof(real));
    size_t oXw = ws_take(&at, (size_t)C * dk, sizeof(real)), oXu = ws_take(&at, (size_t)C * dv, sizeof(real));
    size_t ob = ws_take(&at, C, sizeof(real)), odb = ws_take(&at, C, sizeof(int));
    kda_sub_layout(w ? &w->sub : NULL, base, &at, C, dk, bf);
    if (w) {
        w->G = (double *)(base + oG);
        w->A = (real *)(base + oA), w->Tm = (real *)(base + oTm);
        w->Xw = (real *)(base + oXw), w->Xu = (real *)(base + oXu);
        w->bet = (real *)(base + ob), w->db = (int *)(base + odb);
    }
    return (at + 255) & ~(size_t)255;
}

// Gamma (L, dk) of chunk m (a thread's running sum per channel in double,
// in order: the CPU's), its beta and documents (db[i]: where row i's
// document begins in the chunk, -1 before it). Ends with a barrier.
static __device__ void kda_prep_gamma(const GdnArgs &a, const Item &m, double *G, real *bet, int *db) {
    int tid = threadIdx.x, dk = a.dk, L = m.L;
    int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * dk;
    int64_t oh = ((int64_t)m.b * a.T + m.t0) * a.H + m.h;
    for (int i = tid; i < L; i += GDN_NT) {
        bet[i] = a.beta[oh + (int64_t)i * a.H];
        int f = a.first ? a.first[(int64_t)m.b * a.T + m.t0 + i] : -1;
        db[i] = f >= m.t0 ? f - m.t0 : -1;
    }
    for (int c = tid; c < dk; c += GDN_NT) {
        double s = 0;
        for (int i = 0; i < L; i++) {
            s += a.g[ok + (int64_t)i * a.ldk + c];
            G[(size_t)i * dk + c] = s;
        }
    }
    __syncthreads();
}

// The operands of the sub-block of rows i0 .. i0+n-1 of chunk m through its
// reference point r = i0, formed as kda_chunk.c's kda_sub_columns and
// row_factors form them (G: Gamma of the chunk): keep[c] = [Gamma_rc -
// Gamma_{i0+n-1,c} <= KDA_SPAN_MAX] (0 for a NaN span); for j < i0 + n, Ec_j
// = exp(Gamma_r - Gamma_j) (j < r: every channel, exponent <= 0; r <= j: the
// kept channels, exponent in [0, span], the others 0) and Ys_j = k_j Ec_j;
// for the sub-block's rows Ef_i = exp(Gamma_i - Gamma_r) (<= 0), Qs_i = q_i
// Ef_i, Ks_i = k_i Ef_i. Returns, in every thread, 1 if some channel is kept,
// plus 2 if some channel is slow. Ends with a barrier.
static __device__ int kda_sub_operands(const GdnArgs &a, const Item &m, const double *G, const KdaSubWs &s, int i0,
                                       int n) {
    int tid = threadIdx.x, dk = a.dk;
    int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * dk;
    const double *Gr = G + (size_t)i0 * dk, *Gl = G + (size_t)(i0 + n - 1) * dk;
    bool kept = false, slow = false;
    for (int c = tid; c < dk; c += GDN_NT) {
        bool in = Gr[c] - Gl[c] <= KDA_SPAN_MAX;   // false for NaN too
        s.keep[c] = in;
        kept |= in, slow |= !in;
    }
    int any_kept = __syncthreads_or(kept), any_slow = __syncthreads_or(slow);   // keep is written
    for (int e = tid; e < (i0 + n) * dk; e += GDN_NT) {
        int j = e / dk, c = e % dk;
        real ec = j < i0 || s.keep[c] ? d_decay(Gr[c] - G[e]) : (real)0;
        s.Ec[e] = ec;
        s.Ys[e] = a.k[ok + (int64_t)j * a.ldk + c] * ec;
    }
    for (int e = tid; e < n * dk; e += GDN_NT) {
        int i = e / dk, c = e % dk;
        int64_t x = ok + (int64_t)(i0 + i) * a.ldk + c;
        real ef = d_decay(G[(size_t)(i0 + i) * dk + c] - Gr[c]);
        s.Ef[e] = ef;
        s.Qs[e] = a.q[x] * ef;
        s.Ks[e] = a.k[x] * ef;
    }
    __syncthreads();
    return (any_kept ? 1 : 0) | (any_slow ? 2 : 0);
}

// A product of the KDA kernels in bf16 (blk_mm<true>) where the instance is
// bf16 (BF) and the CPU's bf16 path takes the product's shape (bf: its N a
// whole number of 16-wide vectors, tile_mm_bf16.h), else blk_gemm, as in the
// float32 instances.
template <bool BF>
__device__ __forceinline__ void kda_mm(bool bf, Tiles *sh, bool ta, bool tb, int M, int N, int K, real alpha,
                                       const real *A, int lda, const real *B, int ldb, real beta, real *C, int ldc) {
    if (BF && bf) blk_mm<BF>(sh, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else blk_gemm(sh, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// kda_chunk.cu: the per-op rows (a's Wb, Ub, items; kr's Qg, Kd, P, bl;
// KK and Tm too when keep), and step 1 over every chunk into them (BF: the
// bf16 instance, float32 build only: P and KKE through kda_prep_sub_bf16).
void kda_rows_alloc(Node *n, GdnArgs *a, KdaRows *kr, bool keep);
template <bool BF> void kda_prep_launch(Node *n, GdnArgs &a, const KdaRows &kr);

// A scan's shape (kda_scan_plan): nvb state columns a block; whether the
// chunk's two (L, dk) operands (W and Kd) are first copied into shared
// memory (stage), so that the walk reads them there rather than a scattered
// element at a time from device memory; the dynamic shared memory. Its
// blocks: B H a.NV. The kernels' shared memory: the slice of the state (or
// of its gradient), dk x nvb; of Delta (dDelta), Cw x nvb; then, staged,
// the two operands at the row pitch dk + 1 (kda_scan_rows).
struct KdaScan {
    int nvb;
    bool stage;
    size_t smem;
};
KdaScan kda_scan_plan(GdnArgs &a);
// Launches kernel (an instance for plan's nvb and stage) over a's B H NV
// blocks, after asking for its shared memory past 48 KiB.
void kda_scan_run(void (*kernel)(GdnArgs, KdaRows), const GdnArgs &a, const KdaRows &kr, const KdaScan &plan);

// Step 2's copy of a chunk's L rows of two (., dk) operands into shared
// memory at row pitch dk + 1 (a row's i-th element in a bank of its own
// for the rows a warp reads together); all threads, no barrier.
__device__ __forceinline__ void kda_scan_rows(real *d1, const real *s1, real *d2, const real *s2, int L, int dk) {
    for (int e = threadIdx.x; e < L * dk; e += GDN_NT) {
        int p = e / dk, q = e % dk;
        d1[p * (dk + 1) + q] = s1[e];
        d2[p * (dk + 1) + q] = s2[e];
    }
}

#endif
