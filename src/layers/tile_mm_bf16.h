// tile_mm_bf16.h: tile_mm (tile_mm.h) with bf16 operands and float32 sums,
// for the attention tiles under [train] precision = bf16 (attn_flash.c).
//
// AVX512_BF16's vdpbf16ps multiplies 32 pairs of bf16 numbers and adds each
// two neighbouring products into one of 16 float32 lanes: c_j += a_2j b_2j +
// a_2j+1 b_2j+1. A product C = A B over k therefore takes its operands as
// pairs along k (`bfpair`: element 2p in the low 16 bits, 2p + 1 in the high):
//   A (M x K): A(i, p) = A[i lda + p ak], the pair (A(i, 2p), A(i, 2p + 1)),
//              broadcast to every lane (any strides, as tile_mm's A);
//   B (K x N): row p holds N pairs (B(2p, j), B(2p + 1, j)), j = 0 .. N-1,
//              whole aligned vectors (N and ldb multiples of 16).
// The packers below make these from float32 rows, rounding to nearest even
// (bf16.h); an odd K is padded with a zero element. The products of two bf16
// numbers are exact in float32, so the only roundings are the operands' and
// the float32 sums'.
//
// Built where the compiler targets AVX512_BF16 (-march=native on such a CPU,
// float32 builds): AG_TILE_BF16 is then defined. Elsewhere the attention
// tiles stay float32 under precision = bf16 (docs/cpu_perf.md, section 2).
#ifndef AG_TILE_MM_BF16_H
#define AG_TILE_MM_BF16_H

#include "tile_mm.h"

typedef uint32_t bfpair;   // two bf16 numbers: element 2p in the low 16 bits, 2p + 1 in the high

#if !defined(AG_DOUBLE) && defined(__AVX512BF16__) && defined(__AVX512F__) && !defined(__clang__)
#define AG_TILE_BF16 1
#include <immintrin.h>

// The packers round with AVX512_BF16's vcvtne2ps2bf16 (nearest even, as
// bf16_bits in bf16.h, the rounding of every bf16 path of the project;
// subnormal inputs become zero, which changes no product: vdpbf16ps takes
// subnormal bf16 inputs as zero anyway). Rounding 32 floats is one
// instruction; element loops would cost as much as the GDN chunk products
// they feed.

// 32 floats x[0..31] -> 16 pairs (x[2p], x[2p + 1]): vcvtne2ps2bf16 puts its
// second operand's 16 numbers first, so the bf16 numbers come out in x's order.
static inline __m512i pairs_along(__m512 x0, __m512 x1) { return (__m512i)_mm512_cvtne2ps_pbh(x1, x0); }

// 16 floats of each of two rows -> 16 pairs (a[c], b[c]): rounded as
// [a0..a15, b0..b15], then interleaved.
static inline __m512i pairs_across(__m512 a, __m512 b) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                         6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

static inline __mmask16 mask16(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

// Pairs along each row: dst row i (stride ldd pairs) = n rows of w floats of
// src (stride lds) as bf16, a zero after an odd w, pairs up to ldd zero.
static inline void pack_pair_rows(bfpair *dst, int ldd, const float *src, int lds, int n, int w) {
    for (int i = 0; i < n; i++) {
        const float *s = src + (int64_t)i * lds;
        bfpair *d = dst + (int64_t)i * ldd;
        int c = 0;
        for (; c + 32 <= w; c += 32)
            _mm512_storeu_si512((void *)(d + c / 2), pairs_along(_mm512_loadu_ps(s + c), _mm512_loadu_ps(s + c + 16)));
        for (; c < w; c += 32) {   // the last 1..31 floats, zeros after them
            int r = w - c;
            __m512 x0 = _mm512_maskz_loadu_ps(mask16(r), s + c);
            __m512 x1 = _mm512_maskz_loadu_ps(mask16(r > 16 ? r - 16 : 0), s + c + 16);
            _mm512_mask_storeu_epi32(d + c / 2, mask16((r + 1) / 2), pairs_along(x0, x1));
        }
        for (int p = (w + 1) / 2; p < ldd; p++) d[p] = 0;
    }
}

// Pairs across rows: dst row p (stride ldd) holds (src row 2p, src row 2p + 1)
// column by column, for the pairs p of rows [r0 / 2 * 2, r1) (dst row 0 is
// pair r0 / 2); rows outside [r0, r1) count as zero, and so do columns w ..
// ldd-1. src rows are w floats at stride lds.
static inline void pack_pair_cols(bfpair *dst, int ldd, const float *src, int lds, int r0, int r1, int w) {
    for (int p = r0 / 2; 2 * p < r1; p++) {
        bfpair *d = dst + (int64_t)(p - r0 / 2) * ldd;
        int a = 2 * p, b = 2 * p + 1;
        const float *sa = a >= r0 ? src + (int64_t)a * lds : NULL, *sb = b < r1 ? src + (int64_t)b * lds : NULL;
        for (int c = 0; c < w; c += 16) {
            __mmask16 m = mask16(w - c);
            __m512 va = sa ? _mm512_maskz_loadu_ps(m, sa + c) : _mm512_setzero_ps();
            __m512 vb = sb ? _mm512_maskz_loadu_ps(m, sb + c) : _mm512_setzero_ps();
            _mm512_mask_storeu_epi32(d + c, m, pairs_across(va, vb));
        }
        for (int c = w; c < ldd; c++) d[c] = 0;
    }
}

// Pairs along the columns, transposed: dst row p (stride ldd) = (src[i][2p],
// src[i][2p + 1]) for the n rows i, zero from n to ldd; (w + 1) / 2 rows.
// Through tmp (n x (w + 1) / 2 pairs): the pairs of each row
// (pack_pair_rows), then transposed as 32-bit words in register blocks
// (pack_transposed), several times faster than an element loop. The
// attention tiles (Q^T, K^T, V^T) and the chunk kernels' transposed operands
// are packed this way.
static inline void pack_pair_transposed(bfpair *dst, int ldd, const float *src, int lds, int n, int w,
                                        bfpair *tmp) {
    int wp = (w + 1) / 2;
    pack_pair_rows(tmp, wp, src, lds, n, w);
    pack_transposed((float *)dst, ldd, (const float *)tmp, wp, n, wp);
}

// One register block, as mm_block: C (R x NV vectors) (+)= alpha s_r sum
// over the pairs p0 .. p1-1 of A(r, p) B(p, :), s_r = rs[r] (rs NULL: 1).
static inline __attribute__((always_inline)) void mm_block_bf16(const int R, const int NV, int p0, int p1,
                                                                float alpha, const float *rs, const bfpair *A,
                                                                int lda, int ak, const bfpair *B, int ldb, float *C,
                                                                int ldc, bool add) {
    __m512 c[MR][2];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) c[r][v] = _mm512_setzero_ps();
    for (int p = p0; p < p1; p++) {
        __m512i b[2];
        for (int v = 0; v < NV; v++) b[v] = _mm512_load_si512((const void *)(B + (int64_t)p * ldb + v * 16));
        for (int r = 0; r < R; r++) {
            __m512i a = _mm512_set1_epi32((int)A[r * lda + p * ak]);
            for (int v = 0; v < NV; v++) c[r][v] = _mm512_dpbf16_ps(c[r][v], (__m512bh)a, (__m512bh)b[v]);
        }
    }
    for (int r = 0; r < R; r++) {
        __m512 s = _mm512_set1_ps(rs ? alpha * rs[r] : alpha);
        for (int v = 0; v < NV; v++) {
            float *cv = C + (int64_t)r * ldc + v * 16;
            __m512 x = _mm512_mul_ps(s, c[r][v]);
            _mm512_store_ps(cv, add ? _mm512_add_ps(_mm512_load_ps(cv), x) : x);
        }
    }
}

static inline __attribute__((always_inline)) void mm_rows_bf16(const int R, bool two, int p0, int p1, float alpha,
                                                               const float *rs, const bfpair *A, int lda, int ak,
                                                               const bfpair *B, int ldb, float *C, int ldc,
                                                               bool add) {
    if (two) mm_block_bf16(R, 2, p0, p1, alpha, rs, A, lda, ak, B, ldb, C, ldc, add);
    else mm_block_bf16(R, 1, p0, p1, alpha, rs, A, lda, ak, B, ldb, C, ldc, add);
}

// C (M x N) (+)= alpha diag(rs) A B with K elements along k (pairs (K + 1) /
// 2), as tile_mm_band_part (tile_mm.h): A(i, k) is zero outside i + lo <= k
// <= i + hi, and each block of rows takes only the pairs that hold such k
// (the other element of a pair at the band's edge must then be a zero of A
// too, which the callers' masks give); lower: only the blocks of C on or
// below the diagonal; rs NULL: no row scale. N, ldb and ldc multiples of 16;
// B and C 64-byte aligned.
static inline void tile_mm_bf16_band_part(int M, int N, int K, int lo, int hi, bool lower, float alpha,
                                          const float *rs, const bfpair *A, int lda, int ak, const bfpair *B,
                                          int ldb, float *C, int ldc, bool add) {
    for (int j = 0; j < N; j += 32) {
        bool two_j = j + 32 <= N;
        for (int i = lower ? j / MR * MR : 0; i < M;) {
            int R = M - i >= MR ? MR : M - i >= 4 ? 4 : M - i >= 2 ? 2 : 1;
            int k0 = imax(0, i + lo), k1 = imin(K, i + R - 1 + hi + 1);
            int p0 = k0 / 2, p1 = k1 > k0 ? (k1 + 1) / 2 : p0;
            const bfpair *Ai = A + (int64_t)i * lda, *Bj = B + j;
            float *Ci = C + (int64_t)i * ldc + j;
            const float *ri = rs ? rs + i : NULL;
            bool two = two_j && !(lower && i + R <= j + 16);   // lower: rows that end before the second vector
            if (R == MR) mm_rows_bf16(MR, two, p0, p1, alpha, ri, Ai, lda, ak, Bj, ldb, Ci, ldc, add);
            else if (R == 4) mm_rows_bf16(4, two, p0, p1, alpha, ri, Ai, lda, ak, Bj, ldb, Ci, ldc, add);
            else if (R == 2) mm_rows_bf16(2, two, p0, p1, alpha, ri, Ai, lda, ak, Bj, ldb, Ci, ldc, add);
            else mm_rows_bf16(1, two, p0, p1, alpha, ri, Ai, lda, ak, Bj, ldb, Ci, ldc, add);
            i += R;
        }
    }
}

static inline void tile_mm_bf16_band(int M, int N, int K, int lo, int hi, float alpha, const bfpair *A, int lda,
                                     int ak, const bfpair *B, int ldb, float *C, int ldc, bool add) {
    tile_mm_bf16_band_part(M, N, K, lo, hi, false, alpha, NULL, A, lda, ak, B, ldb, C, ldc, add);
}

// Pairs of A packed as tile_mm_bf16_band_part reads them, A(i, p) at
// pa[i lda + p ak], with every element outside the band lo <= k - i <= hi
// zero within MR + 1 of its edges (as far as a block of MR rows reads past a
// row's own band): the chunk kernels' operands may hold anything there
// ("above: unspecified"), which the float32 path skips but a pair at the
// edge would take in.
static inline void pack_band_zero(bfpair *pa, int lda, int ak, int M, int K, int lo, int hi) {
    int KP = (K + 1) / 2;
    for (int i = 0; i < M; i++) {
        bfpair *a = pa + (int64_t)i * lda;
        int klo = i + lo, khi = i + hi;   // row i's band, maybe beyond [0, K)
        if (klo > 0 && klo - MR - 1 < K) {   // below: the elements max(0, klo - MR - 1) .. klo - 1
            int pe = imin(klo / 2, KP);
            for (int p = imax(0, klo - MR - 1) / 2; p < pe; p++) a[p * ak] = 0;
            if (klo % 2 && klo / 2 < KP) a[(klo / 2) * ak] &= 0xffff0000u;   // its element klo - 1 (low half)
        }
        if (khi < K - 1 && khi + MR + 2 > 0) {   // above: the elements max(0, khi + 1) .. khi + MR + 1
            int k0 = imax(0, khi + 1);
            if (k0 % 2) a[(k0 / 2) * ak] &= 0x0000ffffu, k0++;   // its element k0 (high half)
            for (int p = k0 / 2; p < imin(KP, (khi + MR + 3) / 2); p++) a[p * ak] = 0;
        }
    }
}

// tile_mm_bf16_band_part on AMX tiles (tile_amx.c; tile_amx.h tells how its
// sums differ): the same operands, row scales and band; lower writes the 16 x
// 16 blocks of C on or below the diagonal, the blocks tile_mm_bf16_band_part
// writes. C needs no alignment. Returns false (nothing done) where the build
// has no AMX or K exceeds AMX_MAX_K; call only between amx_tiles_begin and
// amx_tiles_end (tile_amx.h) on the calling thread, where amx_bf16_usable().
bool amx_mm_bf16_band_part(int M, int N, int K, int lo, int hi, bool lower, float alpha, const float *rs,
                           const bfpair *A, int lda, int ak, const bfpair *B, int ldb, float *C, int ldc, bool add);

// tile_gemm_rows (tile_mm.h) with bf16 operands and float32 sums: C (M x N)
// = diag(rs) alpha op(A) op(B) + beta C (beta 0 or 1, rs NULL: none), op(A)
// zero outside the band lo, hi; lower: only the blocks of C on or below the
// diagonal (as tile_gemm_lower, M = N), the rest left as it was. Both
// operands are rounded into pairs along k: pa (at least M ((K + 1) / 2)
// pairs, and N ((K + 1) / 2) when tb) and pb ((K + 1) / 2 N pairs), 64-byte
// aligned. Needs N and ldc
// multiples of 16 and C 64-byte aligned; returns false (nothing done)
// otherwise, and the caller runs the float32 product. amx: the products on
// AMX tiles (amx_mm_bf16_band_part) where they fit, else on AVX512_BF16.
static inline bool tile_gemm_rows_bf16_on(bool amx, bool ta, bool tb, bool lower, int M, int N, int K, float alpha,
                                          const float *rs, const float *A, int lda, const float *B, int ldb,
                                          float beta, float *C, int ldc, int lo, int hi, bfpair *pa, bfpair *pb) {
    if (N % 16 || ldc % 16 || (uintptr_t)C % 64) return false;
    if (M == 0 || N == 0) return true;
    int KP = (K + 1) / 2, plda, pak;
    if (tb) pack_pair_transposed(pb, N, B, ldb, N, K, pa);   // op(B)(k, j) = B[j ldb + k]; pa as scratch
    else pack_pair_cols(pb, N, B, ldb, 0, K, N);
    if (ta) {   // op(A)(i, k) = A[k lda + i]: pairs across A's rows, pa[p M + i]
        pack_pair_cols(pa, M, A, lda, 0, K, M);
        plda = 1, pak = M;
    } else {    // op(A)(i, k) = A[i lda + k]: pairs along A's rows, pa[i KP + p]
        pack_pair_rows(pa, KP, A, lda, M, K);
        plda = KP, pak = 1;
    }
    if (lo > -M || hi < K) pack_band_zero(pa, plda, pak, M, K, lo, hi);
    if (amx && amx_mm_bf16_band_part(M, N, K, lo, hi, lower, alpha, rs, pa, plda, pak, pb, N, C, ldc, beta != 0))
        return true;
    tile_mm_bf16_band_part(M, N, K, lo, hi, lower, alpha, rs, pa, plda, pak, pb, N, C, ldc, beta != 0);
    return true;
}

static inline bool tile_gemm_rows_bf16(bool ta, bool tb, bool lower, int M, int N, int K, float alpha,
                                       const float *rs, const float *A, int lda, const float *B, int ldb, float beta,
                                       float *C, int ldc, int lo, int hi, bfpair *pa, bfpair *pb) {
    return tile_gemm_rows_bf16_on(false, ta, tb, lower, M, N, K, alpha, rs, A, lda, B, ldb, beta, C, ldc, lo, hi, pa,
                                  pb);
}

#endif

// The chunk kernels' products (gla, gdn): bf16 operands with float32 sums
// when `bf16` (tile_gemm_rows_bf16; pa, pb its pairs, each at least
// m ((m + 1) / 2) for products of sizes up to m), else float32 (tile_gemm_rows);
// amx (with bf16): on AMX tiles, the thread's tiles configured
// (amx_tiles_begin, tile_amx.h) while it runs them.
typedef struct TileCtx {
    bool bf16;
    bfpair *pa, *pb;
    bool amx;
} TileCtx;

// Whether the chunk kernels' products run in bf16 now: under [train]
// precision = bf16 where the build has the bf16 tile products. A node keeps
// the answer of its build, so that its backward rounds as its forward did.
static inline bool tile_products_bf16(void) {
#ifdef AG_TILE_BF16
    return blas_precision == PRECISION_BF16;
#else
    return false;
#endif
}

// tile_gemm_rows (tile_mm.h) through tc; a shape the bf16 path does not take
// (N not whole vectors) runs in float32.
static inline void tile_ctx_gemm_rows(const TileCtx *tc, bool ta, bool tb, int M, int N, int K, real alpha,
                                      const real *rs, const real *A, int lda, const real *B, int ldb, real beta,
                                      real *C, int ldc, int lo, int hi, real *pack) {
#ifdef AG_TILE_BF16
    if (tc->bf16 && tile_gemm_rows_bf16_on(tc->amx, ta, tb, false, M, N, K, alpha, rs, A, lda, B, ldb, beta, C, ldc,
                                           lo, hi, tc->pa, tc->pb))
        return;
#else
    (void)tc;
#endif
    tile_gemm_rows(ta, tb, M, N, K, alpha, rs, A, lda, B, ldb, beta, C, ldc, lo, hi, pack);
}

static inline void tile_ctx_gemm(const TileCtx *tc, bool ta, bool tb, int M, int N, int K, real alpha, const real *A,
                                 int lda, const real *B, int ldb, real beta, real *C, int ldc, int lo, int hi,
                                 real *pack) {
    tile_ctx_gemm_rows(tc, ta, tb, M, N, K, alpha, NULL, A, lda, B, ldb, beta, C, ldc, lo, hi, pack);
}

// tile_gemm_lower (tile_mm.h) through tc.
static inline void tile_ctx_gemm_lower(const TileCtx *tc, int M, int K, real alpha, const real *A, int lda,
                                       const real *B, int ldb, real beta, real *C, int ldc) {
#ifdef AG_TILE_BF16
    if (tc->bf16 && tile_gemm_rows_bf16_on(tc->amx, false, false, true, M, M, K, alpha, NULL, A, lda, B, ldb, beta, C,
                                           ldc, -M, K, tc->pa, tc->pb))
        return;
#else
    (void)tc;
#endif
    tile_gemm_lower(M, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

#endif
