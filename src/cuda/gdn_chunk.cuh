// gdn_chunk.cuh: the block-wide steps that the per-chunk kernels of the
// chunked form (gdn_chunk.cu, gdn_chunk_backward.cu) share: blk_gemm (a
// block's product of two tiles in registers), the warp-wide sums, the
// per-block workspace of a chunk (ChunkWs), and chunk_prepare, one chunk's
// decays, (I + A)^-1, W, U and P of gdn_chunk.c (its header states the
// math; Delta is the scan's):
//   A    = beta_i exp(Gamma_i - Gamma_j) (k_i . k_j)  for j < i
//   Tm   = (I + A)^-1,  W = Tm diag(beta b) K,  U = Tm diag(beta) V
//   Delta = U - W S0,   P = (Q K^T) * [exp(Gamma_i - Gamma_j)]_{j<=i}
// Under [train] precision = bf16 the kernels' instances with BF = true
// (chunk_prepare<BF>, the kernels' template argument) run the products of
// this file and of the per-chunk kernels through blk_mm<true>, which runs them with bf16
// operands on the tensor cores (gdn_bf16.cuh states the rounding exactly):
// K K^T, Q K^T, W = Tm Xw, U = Tm Xu (Tm rounded as an operand, not as it is
// solved), and in the kernels Q S0 and P Delta (O), P^T dO, Q^T dY and the
// backward's counterparts of these. The rest stays float32 (gdn_common.cuh
// lists it), notably the scan's W S0 (gdn_scan.cu).
// Included by those two files (and kda_chunk.cuh: KDA's kernels call
// blk_gemm, and blk_mm<true> in their bf16 instances).
#ifndef AG_GDN_CHUNK_CUH
#define AG_GDN_CHUNK_CUH

#include "gdn_common.cuh"

// ---------------------------------------------------------------- block-wide products

// blk_gemm's register tiles: a thread computes a 4 x 4 block of C; the
// block's 256 threads a tile of TM x TN (64 x 64, or 128 x 32 / 32 x 128
// when that takes fewer tiles), walking K in slices of BK. A slice of op(A)
// is held k-major (BK rows of TM, pitch TM + BPAD) and op(B) likewise (BK
// rows of TN), so a thread's 4 values of each are one 16-byte load apiece;
// two buffers of each, the next slice being loaded from global memory into
// registers while the current one is computed. A tile's C goes through
// shared memory (over the slices' buffers) so that its global reads and
// writes are coalesced.
#define BK 16                            // K slice
#define BPAD (16 / (int)sizeof(real))    // a slice row's pad: 16 bytes
// Reals of shared memory: the largest of the three shapes' two buffers of
// A and B slices (BK (TM + TN + 2 BPAD) each) and the C stage (TM TN).
#define BLK_SMEM (2 * BK * (160 + 2 * BPAD))

// 32-byte aligned: the bf16 products' fragments (gdn_bf16.cuh) need it.
struct Tiles {
    __align__(32) real s[BLK_SMEM];
};

// The slice of op(A) (TM x BK from (i0, k0)) and of op(B) (BK x TN from
// (k0, j0)) into registers, zeros outside the matrices: element e = tid +
// 256 p of each, numbered along the stored rows (consecutive threads read
// consecutive addresses).
template <int TM, int TN>
__device__ __forceinline__ void blk_fetch(real *ra, real *rb, bool ta, bool tb, int M, int N, int K, int i0, int j0,
                                          int k0, const real *A, int lda, const real *as, const real *B, int ldb) {
    int tid = threadIdx.x;
    // Element p of A's: (i + p si, k + p sk), at pa + p step.
    int si = ta ? 0 : GDN_NT / BK, sk = ta ? GDN_NT / TM : 0;
    int i = i0 + (ta ? tid % TM : tid / BK), k = k0 + (ta ? tid / TM : tid % BK);
    const real *pa = A + (ta ? (int64_t)k * lda + i : (int64_t)i * lda + k);
    int64_t step = (int64_t)lda * (si + sk);
#pragma unroll
    for (int p = 0; p < TM * BK / GDN_NT; p++) {
        int ip = i + p * si, kp = k + p * sk;
        real v = 0;
        if (ip < M && kp < K) {
            v = pa[p * step];
            if (as) v = mul_rn(as[ta ? kp : ip], v);   // as: by A's stored row
        }
        ra[p] = v;
    }
    // B's: (k + p sk, j + p sj).
    int sj = tb ? GDN_NT / BK : 0;
    sk = tb ? 0 : GDN_NT / TN;
    int j = j0 + (tb ? tid / BK : tid % TN);
    k = k0 + (tb ? tid % BK : tid / TN);
    const real *pb = B + (tb ? (int64_t)j * ldb + k : (int64_t)k * ldb + j);
    step = (int64_t)ldb * (sj + sk);
#pragma unroll
    for (int p = 0; p < TN * BK / GDN_NT; p++) rb[p] = j + p * sj < N && k + p * sk < K ? pb[p * step] : (real)0;
}

// The registers of blk_fetch into a slice buffer (sa: BK x (TM + BPAD), sb:
// BK x (TN + BPAD)), k-major.
template <int TM, int TN>
__device__ __forceinline__ void blk_put(real *sa, real *sb, const real *ra, const real *rb, bool ta, bool tb) {
    int tid = threadIdx.x;
#pragma unroll
    for (int p = 0; p < TM * BK / GDN_NT; p++) {
        int e = tid + p * GDN_NT;
        sa[(ta ? e / TM : e % BK) * (TM + BPAD) + (ta ? e % TM : e / BK)] = ra[p];
    }
#pragma unroll
    for (int p = 0; p < TN * BK / GDN_NT; p++) {
        int e = tid + p * GDN_NT;
        sb[(tb ? e % BK : e / TN) * (TN + BPAD) + (tb ? e / BK : e % TN)] = rb[p];
    }
}

// A tile's C stage (sc, TM x TN row-major in shared memory, from (i0, j0))
// into C: alpha x rounded, and with beta, fma(C, beta, that); the threads
// along C's rows (coalesced).
template <int TM, int TN>
__device__ __forceinline__ void blk_store(const real *sc, int M, int N, int i0, int j0, real alpha, real beta,
                                          real *C, int ldc) {
    int tid = threadIdx.x, mr = min(TM, M - i0), nc = min(TN, N - j0), jj = tid % TN;
    if (jj < nc)
#pragma unroll 4
        for (int ii = tid / TN; ii < mr; ii += GDN_NT / TN) {
            real *c = C + (int64_t)(i0 + ii) * ldc + j0 + jj, v = mul_rn(alpha, sc[ii * TN + jj]);
            *c = beta == 0 ? v : fma(*c, beta, v);
        }
}

// blk_gemm_s in tiles of TM x TN. Threads: warp w, lane l compute rows
// 4 ty .. 4 ty + 3 and columns 4 tx .. 4 tx + 3 of a tile, ty = 4 (w / WX) +
// l / 8, tx = 8 (w % WX) + l % 8 (WX = TN / 32 warps across): a warp's
// 16-byte loads of a slice row are then 4 of A and 8 of B, one pass each.
// Every C element is one thread's fma chain from 0 over k = 0, 1, ..., K - 1
// (zeros past K: the last slice is filled with them, and the 32-wide slices
// of the products before these did as much, so acc + 0 once when K is not a
// multiple of 32: -0 becomes +0 as it did then), then alpha acc rounded, and
// with beta, fma(C, beta, that) (what the products before these compiled to).
template <int TM, int TN>
__device__ __forceinline__ void blk_tiles(Tiles *sh, bool ta, bool tb, int M, int N, int K, real alpha,
                                          const real *A, int lda, const real *as, const real *B, int ldb, real beta,
                                          real *C, int ldc) {
    constexpr int NA = TM * BK / GDN_NT, NB = TN * BK / GDN_NT, WX = TN / 32;
    constexpr int AP = TM + BPAD, BP = TN + BPAD, ASZ = BK * AP, BSZ = BK * BP;
    static_assert(TM * TN == 16 * GDN_NT && NA * GDN_NT == TM * BK && NB * GDN_NT == TN * BK, "blk_tiles");
    static_assert(2 * (ASZ + BSZ) <= BLK_SMEM && TM * TN <= BLK_SMEM, "blk_tiles: Tiles");
    real *sa = sh->s, *sb = sh->s + 2 * ASZ, *sc = sh->s;   // sc: the C stage, over the buffers
    int tid = threadIdx.x, w = tid / 32, l = tid % 32;
    int ty = w / WX * 4 + l / 8, tx = w % WX * 8 + l % 8;
    int tn = (N + TN - 1) / TN, nt = (M + TM - 1) / TM * tn, ns = (K + BK - 1) / BK;
    for (int tile = 0; tile < nt; tile++) {
        int i0 = tile / tn * TM, j0 = tile % tn * TN;
        real acc[4][4], ra[NA], rb[NB];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[r][c] = 0;
        if (ns > 0) {
            blk_fetch<TM, TN>(ra, rb, ta, tb, M, N, K, i0, j0, 0, A, lda, as, B, ldb);
            blk_put<TM, TN>(sa, sb, ra, rb, ta, tb);
        }
        __syncthreads();   // slice 0 is in
        for (int s = 0; s < ns; s++) {
            int cur = s & 1;
            if (s + 1 < ns) blk_fetch<TM, TN>(ra, rb, ta, tb, M, N, K, i0, j0, (s + 1) * BK, A, lda, as, B, ldb);
            const real *pa = sa + cur * ASZ + ty * 4, *pb = sb + cur * BSZ + tx * 4;
#pragma unroll
            for (int kk = 0; kk < BK; kk++) {
                R4 a = ld4(pa + kk * AP), b = ld4(pb + kk * BP);
#pragma unroll
                for (int r = 0; r < 4; r++)
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[r][c] = fma(a.v[r], b.v[c], acc[r][c]);
            }
            // The other buffer was last read before the previous barrier.
            if (s + 1 < ns) blk_put<TM, TN>(sa + (1 - cur) * ASZ, sb + (1 - cur) * BSZ, ra, rb, ta, tb);
            __syncthreads();   // slice s + 1 is in; slice s is no longer read
        }
        // No thread reads the slices any more (the barrier above): the stage.
        bool pad = (K & 31) != 0;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            if (pad)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[r][c] = add_rn(acc[r][c], 0);
            st4(sc + (ty * 4 + r) * TN + tx * 4, acc[r]);
        }
        __syncthreads();   // the stage is in
        blk_store<TM, TN>(sc, M, N, i0, j0, alpha, beta, C, ldc);
        __syncthreads();   // the stage is read (the next tile's slice 0 goes over it); C is written
    }
    if (nt == 0) __syncthreads();
}


// C (M x N) = alpha op(A) op(B) + beta C, row-major with leading dimensions
// lda, ldb, ldc; op(A) is M x K, op(B) K x N. as: NULL, or a factor for each
// row of A as stored (as[r] A[r][.], so diag(as) A when A is not transposed,
// (diag(as) A)^T when it is), applied as A's elements are loaded. Every
// thread of the block calls it with the same arguments. beta == 0 never
// reads C (fresh buffers hold NaN in float64). C must not overlap A or B.
// Ends with a barrier: C is then ready for every thread, and A, B may be
// overwritten. Not inlined: one copy for the two dozen calls. Tiles of
// 64 x 64 unless 128 x 32 or 32 x 128 takes fewer (a short or a narrow C).
enum { BLK_SQUARE, BLK_TALL, BLK_WIDE };   // C's tiles: 64 x 64, 128 x 32, 32 x 128
static __device__ __forceinline__ int blk_shape(int M, int N) {
    int sq = (M + 63) / 64 * ((N + 63) / 64), tall = (M + 127) / 128 * ((N + 31) / 32);
    int wide = (M + 31) / 32 * ((N + 127) / 128);
    return tall < sq && tall <= wide ? BLK_TALL : wide < sq ? BLK_WIDE : BLK_SQUARE;
}

static __device__ __noinline__ void blk_gemm_s(Tiles *sh, bool ta, bool tb, int M, int N, int K, real alpha,
                                               const real *A, int lda, const real *as, const real *B, int ldb,
                                               real beta, real *C, int ldc) {
    int shape = blk_shape(M, N);
    if (shape == BLK_TALL) blk_tiles<128, 32>(sh, ta, tb, M, N, K, alpha, A, lda, as, B, ldb, beta, C, ldc);
    else if (shape == BLK_WIDE) blk_tiles<32, 128>(sh, ta, tb, M, N, K, alpha, A, lda, as, B, ldb, beta, C, ldc);
    else blk_tiles<64, 64>(sh, ta, tb, M, N, K, alpha, A, lda, as, B, ldb, beta, C, ldc);
}

__device__ __forceinline__ void blk_gemm(Tiles *sh, bool ta, bool tb, int M, int N, int K, real alpha, const real *A,
                                         int lda, const real *B, int ldb, real beta, real *C, int ldc) {
    blk_gemm_s(sh, ta, tb, M, N, K, alpha, A, lda, NULL, B, ldb, beta, C, ldc);
}

#include "gdn_bf16.cuh"   // blk_mm: blk_gemm, or its bf16 form under precision = bf16

// ---------------------------------------------------------------- warp-wide sums

#define GDN_NW (GDN_NT / 32)   // warps of a block of the chunked form

// sum_c x_c y_c over c < n in double by the calling warp (lane l takes c =
// l, l + 32, ... in order, then warp_sum), returned to every lane: the CPU's
// dot, in another fixed order.
__device__ __forceinline__ double warp_dot(const real *__restrict__ x, const real *__restrict__ y, int n) {
    double s = 0;
    for (int c = threadIdx.x % 32; c < n; c += 32) s += (double)x[c] * y[c];
    return warp_sum(s);
}

// Inclusive prefix sums of v[0..n) in place (reverse: suffix sums, v[i] =
// v[i] + ... + v[n-1]) by warp 0 of the block; the other warps return at
// once (the caller's barriers order it). Lane l sums a run of ceil(n / 32)
// consecutive entries in order; the runs' totals are scanned across the
// lanes (Hillis-Steele, a fixed order); each lane then adds the total of the
// runs before its own to its entries. In double, as the CPU's running sum.
static __device__ void warp0_cumsum(double *v, int n, bool reverse) {
    if (threadIdx.x >= 32) return;
    int l = threadIdx.x, run = (n + 31) / 32, i0 = l * run, i1 = min(n, i0 + run);
    double tot = 0;
    for (int i = i0; i < i1; i++) {
        int p = reverse ? n - 1 - i : i;
        tot += v[p];
        v[p] = tot;
    }
    double inc = tot;
    for (int o = 1; o < 32; o <<= 1) {
        double u = __shfl_up_sync(0xffffffffu, inc, o);
        if (l >= o) inc += u;
    }
    double before = __shfl_up_sync(0xffffffffu, inc, 1);   // the runs of lanes 0 .. l - 1
    if (l > 0)
        for (int i = i0; i < i1; i++) {
            int p = reverse ? n - 1 - i : i;
            v[p] = before + v[p];
        }
}

// ---------------------------------------------------------------- chunked form: workspace

// The per-block buffers of gdn_chunk.c's GdnChunk and gdn_chunk_backward.c's
// GdnChunkGrad, chunks of up to C positions; the gradient part only in the
// backward's workspace, which has no Tm, P, Xw, Xu, U, Delta: the backward
// reads them from the op's rows (the forward's, and P from its first kernel).
// W (and U, Delta, dDelta, Tm, P where the kernel says) are the op's rows of
// the chunk (GdnArgs), set per chunk.
struct ChunkWs {
    double *G;                        // (C) Gamma_i
    real *E, *KK, *A, *Tm, *P;        // (C, C)
    real *Xw, *W;                     // (C, dk); W: the op's rows
    real *Xu, *U, *Dl;                // (C, dv)
    real *bet, *bm, *ek;              // (C)
    int *db;                          // (C) the chunk's documents, -1: before the chunk
    // backward
    double *dG, *dbeta, *rsum;   // (C); rsum: a step's row sums
    real *dA;                           // (C, C) dP -> dQK, then dA -> dKK
    real *dK, *dW, *dXw;                // (C, dk)
    real *dXu, *Y;                      // (C, dv), one buffer: dO's Y, then the WY part's dXu
    real *dDl;                          // (C, dv) the op's dDelta rows
    const real *dS;                     // (dk, dv) the gradient of the state leaving the chunk (the op's)
};

// Binds w (unless NULL) to a block's workspace and returns its bytes (a
// multiple of 256). Each buffer whose bytes lie within the first `shared`
// bytes of the layout is bound to the block's shared memory `sbase` at the
// same offset, the others to `base` (whose first `shared` bytes go unused):
// the same buffers, the same arithmetic, only where they live.
static __host__ __device__ size_t chunk_ws_layout(ChunkWs *w, unsigned char *base, int C, int dk, int dv,
                                                  bool grad, unsigned char *sbase = NULL, size_t shared = 0) {
    size_t at = 0, CC = (size_t)C * C, Ck = (size_t)C * dk, Cv = (size_t)C * dv;
    size_t oG = ws_take(&at, C, sizeof(double));
    size_t oE = ws_take(&at, CC, sizeof(real)), oKK = ws_take(&at, CC, sizeof(real));
    size_t oA = ws_take(&at, CC, sizeof(real)), oTm = 0, oP = 0, oXw = 0, oXu = 0, oU = 0, oDl = 0;
    if (!grad) {
        oTm = ws_take(&at, CC, sizeof(real)), oP = ws_take(&at, CC, sizeof(real));
        oXw = ws_take(&at, Ck, sizeof(real));
        oXu = ws_take(&at, Cv, sizeof(real)), oU = ws_take(&at, Cv, sizeof(real));
        oDl = ws_take(&at, Cv, sizeof(real));
    }
    size_t obet = ws_take(&at, C, sizeof(real)), obm = ws_take(&at, C, sizeof(real));
    size_t oek = ws_take(&at, C, sizeof(real)), odb = ws_take(&at, C, sizeof(int));
    size_t odG = 0, odbeta = 0, orsum = 0, odA = 0, odK = 0, odW = 0, odXw = 0, oY = 0;
    if (grad) {
        odG = ws_take(&at, C, sizeof(double)), odbeta = ws_take(&at, C, sizeof(double));
        orsum = ws_take(&at, C, sizeof(double));
        odA = ws_take(&at, CC, sizeof(real));
        odK = ws_take(&at, Ck, sizeof(real)), odW = ws_take(&at, Ck, sizeof(real));
        odXw = ws_take(&at, Ck, sizeof(real));
        oY = ws_take(&at, Cv, sizeof(real));   // also dXu: Y's last use comes before dXu's first
    }
    if (w) {
        // Buffer at offset o of n bytes: shared memory when it ends within `shared`.
        auto at_ = [&](size_t o, size_t n) { return o + n <= shared ? sbase + o : base + o; };
        w->G = (double *)at_(oG, C * sizeof(double));
        w->E = (real *)at_(oE, CC * sizeof(real)), w->KK = (real *)at_(oKK, CC * sizeof(real));
        w->A = (real *)at_(oA, CC * sizeof(real));
        w->Tm = w->P = w->Xw = w->W = w->Xu = w->U = w->Dl = NULL;
        if (!grad) {
            w->Tm = (real *)at_(oTm, CC * sizeof(real)), w->P = (real *)at_(oP, CC * sizeof(real));
            w->Xw = (real *)at_(oXw, Ck * sizeof(real));
            w->Xu = (real *)at_(oXu, Cv * sizeof(real)), w->U = (real *)at_(oU, Cv * sizeof(real));
            w->Dl = (real *)at_(oDl, Cv * sizeof(real));
        }
        w->bet = (real *)at_(obet, C * sizeof(real)), w->bm = (real *)at_(obm, C * sizeof(real));
        w->ek = (real *)at_(oek, C * sizeof(real));
        w->db = (int *)at_(odb, C * sizeof(int));
        w->dG = (double *)at_(odG, C * sizeof(double)), w->dbeta = (double *)at_(odbeta, C * sizeof(double));
        w->rsum = (double *)at_(orsum, C * sizeof(double));
        w->dA = (real *)at_(odA, CC * sizeof(real));
        w->dK = (real *)at_(odK, Ck * sizeof(real)), w->dW = (real *)at_(odW, Ck * sizeof(real));
        w->dXw = (real *)at_(odXw, Ck * sizeof(real));
        w->dXu = w->Y = (real *)at_(oY, Cv * sizeof(real));
        w->dDl = NULL, w->dS = NULL;
    }
    return (at + 255) & ~(size_t)255;
}

// One chunk of one head: the work item `it` (0 <= it < B H NC) of a
// per-chunk kernel, heads major.
struct Item {
    int b, h, c, t0, L;
    int64_t bh;
};

__device__ __forceinline__ Item item_of(const GdnArgs &a, int64_t it) {
    Item m;
    m.bh = it / a.NC;
    m.c = (int)(it % a.NC);
    m.b = (int)(m.bh / a.H);
    m.h = (int)(m.bh % a.H);
    m.t0 = m.c * a.C;
    m.L = min(a.C, a.T - m.t0);
    return m;
}

// A chunk's rows of q, k, v and dO (dO NULL without it) as the per-chunk
// steps read them: in the op's inputs (leading dims H dk, H dv), or copied
// into shared memory by the backward's chunk kernel (dk, dv; GdnArgs.in_shared).
struct ChunkIn {
    const real *q, *k, *v, *dO;
    int ldk, ldv;
};

__device__ __forceinline__ ChunkIn chunk_in(const GdnArgs &a, int b, int h, int t0) {
    int64_t r = (int64_t)b * a.T + t0;
    ChunkIn in;
    in.q = a.q + r * a.ldk + (int64_t)h * a.dk, in.k = a.k + r * a.ldk + (int64_t)h * a.dk;
    in.v = a.v + r * a.ldv + (int64_t)h * a.dv, in.dO = a.dout ? a.dout + r * a.ldv + (int64_t)h * a.dv : NULL;
    in.ldk = a.ldk, in.ldv = a.ldv;
    return in;
}

// What chunk_prepare computes beyond the decays (G, bet, db, E, bm, ek).
enum {
    PREP_SOLVE = 1,   // KK, A, Tm
    PREP_W = 2,       // W = Tm diag(beta b) K into w.W (needs PREP_SOLVE)
    PREP_U = 4,       // U = Tm diag(beta) V into w.U (needs PREP_SOLVE)
    PREP_P = 16,      // P = (Q K^T) * E
    PREP_A = 32,      // KK, A (PREP_SOLVE without Tm)
};

// dst[i d + c] = f(i) x[i ld + c] over L rows of d (dst packed), all
// threads: each issues the loads of GDN_UNROLL of its elements before their
// stores (the compiler cannot know that dst is not x, so a plain loop waits
// out each load in turn). No barrier.
#define GDN_UNROLL 4
template <typename F>
__device__ __forceinline__ void scale_rows(real *dst, const real *x, int ld, int L, int d, F f) {
    int n = L * d;
    for (int e0 = threadIdx.x; e0 < n; e0 += GDN_UNROLL * GDN_NT) {
        real r[GDN_UNROLL];
#pragma unroll
        for (int u = 0; u < GDN_UNROLL; u++) {
            int e = e0 + u * GDN_NT;
            r[u] = e < n ? x[(int64_t)(e / d) * ld + e % d] : (real)0;
        }
#pragma unroll
        for (int u = 0; u < GDN_UNROLL; u++) {
            int e = e0 + u * GDN_NT;
            if (e < n) dst[e] = f(e / d) * r[u];
        }
    }
}

// Tm = (I + A)^-1 (A strictly lower, L x L, L <= 32 R) by warps, from At =
// A^T in shared memory (pitch L + 1); no barrier. A column of Tm is the
// solution of (I + A) x = e_j: a warp takes the columns j, j + 1 of a pair
// (pairs dealt to the warps back and forth, so that the long and the short
// columns even out), lane l holds rows l + 32 r of both in registers, and
// for m = j, j + 1, ..., L - 2 broadcasts x_m (final after step m - 1) and
// updates the rows below: x_i -= A_im x_m. Each x_i is then, as in the
// row-by-row substitution, e_ij minus its terms m = j .. i - 1 in ascending
// order, one fma each (column j + 1 at m = j subtracts A_im 0: x_i stays).
// Writes Tm whole (zeros above the diagonal). NW: the block's warps (which
// warp takes a column does not change its arithmetic).
static_assert(64 * (64 + 1) <= BLK_SMEM, "solve_warps: A^T of 64 positions over the Tiles");
template <int R, int NW = GDN_NW> __device__ void solve_warps(real *Tm, const real *At, int L) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, ap = L + 1, np = (L + 1) / 2;
    for (int q = 0; q * NW < np; q++) {
        int p = q * NW + (q & 1 ? NW - 1 - warp : warp), j = 2 * p;
        if (p >= np) continue;
        real x0[R], x1[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = lane + 32 * r;
            x0[r] = i == j ? (real)1 : (real)0;
            x1[r] = i == j + 1 ? (real)1 : (real)0;
        }
        for (int m = j; m < L - 1; m++) {
            real s0 = x0[0], s1 = x1[0];
#pragma unroll
            for (int r = 1; r < R; r++)
                if (m >> 5 == r) s0 = x0[r], s1 = x1[r];
            s0 = __shfl_sync(0xffffffffu, s0, m & 31);
            s1 = __shfl_sync(0xffffffffu, s1, m & 31);
            const real *am = At + m * ap;
#pragma unroll
            for (int r = 0; r < R; r++) {
                int i = lane + 32 * r;
                if (i > m && i < L) {
                    real av = am[i];
                    x0[r] -= av * s0;
                    x1[r] -= av * s1;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = lane + 32 * r;
            if (i < L) {
                Tm[i * L + j] = x0[r];
                if (j + 1 < L) Tm[i * L + j + 1] = x1[r];
            }
        }
    }
}

// gdn_chunk_prepare (the parts `what` asks for): the chunk of L positions
// starting at t0 of head (b, h), its q, k, v rows from `in`.
// All threads, `what` the same in all; ends with a barrier.
template <bool BF>
static __device__ void chunk_prepare(const GdnArgs &a, ChunkWs &w, Tiles *sh, const ChunkIn &in, int b, int h,
                                     int t0, int L, unsigned what) {
    int tid = threadIdx.x, dk = a.dk, dv = a.dv, H = a.H, ldk = in.ldk, ldv = in.ldv;
    int64_t oh = ((int64_t)b * a.T + t0) * H + h;
    const real *q = in.q, *k = in.k, *v = in.v, *beta = a.beta + oh, *g = a.g + oh;
    bool docs = a.first != NULL;
    // Gamma: the running sum of g (warp0_cumsum).
    for (int i = tid; i < L; i += GDN_NT) {
        w.G[i] = g[(int64_t)i * H];
        w.bet[i] = beta[(int64_t)i * H];
        int f = docs ? a.first[(int64_t)b * a.T + t0 + i] : -1;
        w.db[i] = f >= t0 ? f - t0 : -1;
    }
    __syncthreads();
    warp0_cumsum(w.G, L, false);
    __syncthreads();
    // E_ij = exp(Gamma_i - Gamma_j) inside row i's document (j >= db[i]), j <= i.
    for (int e = tid; e < L * L; e += GDN_NT) {
        int i = e / L, j = e % L;
        int j0 = docs && w.db[i] > 0 ? w.db[i] : 0;
        w.E[e] = j >= j0 && j <= i ? d_decay(w.G[i] - w.G[j]) : (real)0;
    }
    // The factors through S0 and to the end of the chunk (gdn_kernel.h).
    int jL = docs && w.db[L - 1] > 0 ? w.db[L - 1] : 0;
    for (int i = tid; i < L; i += GDN_NT) {
        w.bm[i] = docs && w.db[i] >= 0 ? (real)0 : d_decay(w.G[i]);
        w.ek[i] = i < jL ? (real)0 : d_decay(w.G[L - 1] - w.G[i]);
    }
    __syncthreads();
    if (what & (PREP_SOLVE | PREP_A)) {
        // A = strictly-lower (beta_i E_ij k_i.k_j).
        blk_mm<BF>(sh, false, true, L, L, dk, 1, k, ldk, k, ldk, 0, w.KK, L);
        // A short chunk's A^T also goes to shared memory (over the Tiles,
        // free between products; pitch L + 1: no bank conflicts) for solve_warps.
        bool fast = (what & PREP_SOLVE) && L <= 2 * 32;
        real *At = sh->s;
        for (int e = tid; e < L * L; e += GDN_NT) {
            int i = e / L, j = e % L;
            real x = j < i ? w.bet[i] * w.E[e] * w.KK[e] : (real)0;
            w.A[e] = x;
            if (fast) At[j * (L + 1) + i] = x;
        }
        __syncthreads();
        if (what & PREP_SOLVE) {
            // Tm = (I + A)^-1, row i = e_i - sum_{m<i} A_im Tm_m, m in the CPU's order.
            if (fast) {
                if (L <= 32) solve_warps<1>(w.Tm, At, L);
                else solve_warps<2>(w.Tm, At, L);
                // The barrier after Xw, Xu below ends it (Tm is written, At no longer read).
            } else {
                for (int i = 0; i < L; i++) {
                    for (int j = tid; j < L; j += GDN_NT) {
                        real t = j == i ? (real)1 : (real)0;
                        for (int m = j; m < i; m++) t -= w.A[i * L + m] * w.Tm[m * L + j];
                        w.Tm[i * L + j] = t;
                    }
                    __syncthreads();
                }
            }
        }
    }
    // W = Tm diag(beta b) K, U = Tm diag(beta) V.
    if (what & PREP_W) scale_rows(w.Xw, k, ldk, L, dk, [&](int i) { return w.bet[i] * w.bm[i]; });
    if (what & PREP_U) scale_rows(w.Xu, v, ldv, L, dv, [&](int i) { return w.bet[i]; });
    __syncthreads();
    if (what & PREP_W) blk_mm<BF>(sh, false, false, L, dk, L, 1, w.Tm, L, w.Xw, dk, 0, w.W, dk);
    if (what & PREP_U) blk_mm<BF>(sh, false, false, L, dv, L, 1, w.Tm, L, w.Xu, dv, 0, w.U, dv);
    // P = (Q K^T) * E. (Kd = diag(ek) K is applied as K is loaded: blk_gemm_s.)
    if (what & PREP_P) {
        blk_mm<BF>(sh, false, true, L, L, dk, 1, q, ldk, k, ldk, 0, w.P, L);
        for (int e = tid; e < L * L; e += GDN_NT) w.P[e] *= w.E[e];
    }
    __syncthreads();
}

// The per-chunk kernels' grids: as many blocks as the GPU keeps resident
// (each walks the chunks gridDim.x apart) with `dyn` bytes of dynamic shared
// memory each, at most one per chunk.
template <typename K> static int resident_blocks(K kernel, size_t dyn = 0) {
    int dev = 0, sms = 0, per = 0;
    CU_CHECK(cudaGetDevice(&dev));
    CU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, GDN_NT, dyn));
    return sms * (per > 0 ? per : 1);
}

// The workspace in shared memory (gdn_ws_shared_on: ATTNLAB_GDN_WS=backward,
// the default, for the backward's chunk kernel; =shared for every per-chunk
// kernel; =global for none).
// The per-chunk kernels pass a chunk's matrices from one block-wide step to
// the next through their workspace; in device
// memory that is most of their traffic (k_gdn_bwd_chunk: 4.4 GB a call at
// B 4 x T 4,096, 16 heads of 64, on an H100, for 0.6 GB of inputs and
// gradients) at a quarter of the warps resident. The SM instances (one
// block a multiprocessor, no register cap) keep the layout's first bytes,
// as many as fit beside their static shared memory, in dynamic shared
// memory; the buffers past that stay in device memory. The arithmetic and
// its order are the same, so are the results' bits.
enum GdnWsKernel { WS_FWD, WS_BWD_PREP, WS_BWD_CHUNK };   // the forward's two kernels, the backward's each
bool gdn_ws_shared_on(GdnWsKernel k);
extern size_t gdn_ws_last[2];   // the last forward's [0] and backward's [1] bytes of it (cu_gdn_ws_shared_last)
extern size_t gdn_in_last;      // the last backward's a.in_shared (cu_gdn_in_shared_last)

// The per-chunk steps around the scans for bf16 products at heads of 64 and
// chunks of at most 64 (gdn_chunk64.cu): whether they take a's pass, and
// the launches that replace k_gdn_fwd_prep, k_gdn_fwd_out, k_gdn_bwd_prep.
bool gdn_chunk64_takes(const GdnArgs &a);
void gdn_fwd_prep64(const GdnArgs &a);
void gdn_fwd_out64(const GdnArgs &a);
void gdn_bwd_prep64(const GdnArgs &a);

// The dynamic shared memory kernel may take for the workspace (opted in
// once, up to the GPU's per-block limit beside its static shared memory).
template <typename K> static size_t ws_room(K kernel) {
    cudaFuncAttributes fa;
    CU_CHECK(cudaFuncGetAttributes(&fa, kernel));
    size_t optin = cu_smem_optin(), st = fa.sharedSizeBytes;
    size_t room = optin > st ? (optin - st) & ~(size_t)15 : 0;
    if (room > 0) CU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)room));
    return room;
}

static int chunk_grid(int64_t items, int resident) { return (int)(items < resident ? items : resident); }

// What a pass's two per-chunk kernels were sized for, kept across launches
// (one per instance of the pass): their resident blocks, the shared memory
// room both may take, and the shared bytes the blocks were counted with.
struct WsGrids {
    int res1, res2;
    size_t room, res_for, in_for;
};

// A pass's workspace for its per-chunk kernels k1 and k2 (SM1, SM2: the
// instances with the workspace's start in shared memory, each launched with
// a.ws_shared bytes of it, the others with none): a's ws_stride, ws_shared
// (also into gdn_ws_last[grad]) and ws, one slot per block of the larger grid;
// the two grids into *g1 and *g2. With SM2, when the whole workspace and
// in2 bytes more fit in k2's shared memory, k2 takes them too (a.in_shared;
// else 0): it is launched with a.ws_shared + a.in_shared bytes. The
// occupancy is asked again only when the shared bytes change.
template <bool SM1, bool SM2, typename K1, typename K2>
static void ws_plan(Node *n, GdnArgs &a, bool grad, K1 k1, K2 k2, WsGrids &p, int *g1, int *g2, size_t in2 = 0) {
    a.ws_stride = chunk_ws_layout(NULL, NULL, a.Cw, a.dk, a.dv, grad);
    if ((SM1 || SM2) && !p.room) {
        size_t r1 = SM1 ? ws_room(k1) : SIZE_MAX, r2 = SM2 ? ws_room(k2) : SIZE_MAX;
        p.room = r1 < r2 ? r1 : r2;
    }
    a.ws_shared = gdn_ws_last[grad] = SM1 || SM2 ? (a.ws_stride < p.room ? a.ws_stride : p.room) : 0;
    a.in_shared = SM2 && in2 > 0 && a.ws_stride + in2 <= p.room ? in2 : 0;
    if (grad) gdn_in_last = a.in_shared;
    if (!p.res1 || a.ws_shared != p.res_for || a.in_shared != p.in_for) {
        p.res1 = resident_blocks(k1, SM1 ? a.ws_shared : 0);
        p.res2 = resident_blocks(k2, SM2 ? a.ws_shared + a.in_shared : 0);
        p.res_for = a.ws_shared, p.in_for = a.in_shared;
    }
    *g1 = chunk_grid(a.items, p.res1);
    *g2 = chunk_grid(a.items, p.res2);
    a.ws = (unsigned char *)tape_dalloc(n->tape, a.ws_stride * (size_t)(*g1 > *g2 ? *g1 : *g2));
}

// The op's rows shared by the kernels of a pass (GdnArgs), from the arena;
// W, U, Delta and Tm are the node's saved ones (gdn_node.h) when it is
// recorded: the forward writes them, the backward reads them.
static void chunk_rows(Node *n, GdnArgs *a, bool backward) {
    int64_t BH = (int64_t)a->B * a->H, rows = BH * a->T;
    a->items = BH * a->NC;
    if (a->saved) {
        GdnSaved sv = gdn_saved_layout(a->B, a->H, a->T, a->C, a->dk, a->dv, true);
        a->Wb = a->saved + sv.W, a->Usv = a->saved + sv.U, a->Dsv = a->saved + sv.Delta, a->Tmb = a->saved + sv.Tm;
    } else {
        a->Wb = (real *)tape_dalloc(n->tape, (size_t)(rows * a->dk) * sizeof(real));
    }
    a->Ub = a->saved && !backward ? a->Dsv : (real *)tape_dalloc(n->tape, (size_t)(rows * a->dv) * sizeof(real));
    a->Uin = !backward && a->Usv ? a->Usv : a->Ub;
    if (backward && a->dout) a->Pb = (real *)tape_dalloc(n->tape, (size_t)(rows * a->Cw) * sizeof(real));
    a->ekb = (real *)tape_dalloc(n->tape, (size_t)rows * sizeof(real));
    a->blb = (real *)tape_dalloc(n->tape, (size_t)a->items * sizeof(real));
}

#endif
