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

// (bf16_bits, bf16.h: one float's bits rounded to bf16, as every bf16 path of the project rounds.)
static inline bfpair bfpair_of(uint32_t lo, uint32_t hi) { return bf16_bits(lo) | bf16_bits(hi) << 16; }

// Pairs along each row: dst row i (stride ldd pairs) = n rows of w floats of
// src (stride lds) as bf16, a zero after an odd w, pairs up to ldd zero.
static inline void pack_pair_rows(bfpair *dst, int ldd, const float *src, int lds, int n, int w) {
    int wp = (w + 1) / 2;
    for (int i = 0; i < n; i++) {
        const bf16_bits32 *s = (const bf16_bits32 *)(src + (int64_t)i * lds);
        bfpair *d = dst + (int64_t)i * ldd;
#pragma omp simd
        for (int p = 0; p < w / 2; p++) d[p] = bfpair_of(s[2 * p], s[2 * p + 1]);
        if (w % 2) d[w / 2] = bf16_bits(s[w - 1]);
        for (int p = wp; p < ldd; p++) d[p] = 0;
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
        const bf16_bits32 *sa = (const bf16_bits32 *)(src + (int64_t)a * lds);
        const bf16_bits32 *sb = (const bf16_bits32 *)(src + (int64_t)b * lds);
        if (a >= r0 && b < r1) {
#pragma omp simd
            for (int c = 0; c < w; c++) d[c] = bfpair_of(sa[c], sb[c]);
        } else if (a >= r0) {
#pragma omp simd
            for (int c = 0; c < w; c++) d[c] = bf16_bits(sa[c]);
        } else {
#pragma omp simd
            for (int c = 0; c < w; c++) d[c] = bf16_bits(sb[c]) << 16;
        }
        for (int c = w; c < ldd; c++) d[c] = 0;
    }
}

// Pairs along the columns, transposed: dst row p (stride ldd) = (src[i][2p],
// src[i][2p + 1]) for the n rows i, zero from n to ldd; (w + 1) / 2 rows.
static inline void pack_pair_transposed(bfpair *dst, int ldd, const float *src, int lds, int n, int w) {
    for (int p = 0; p < (w + 1) / 2; p++) {
        bfpair *d = dst + (int64_t)p * ldd;
        const bf16_bits32 *s = (const bf16_bits32 *)(src + 2 * p);
        if (2 * p + 1 < w) {
#pragma omp simd
            for (int i = 0; i < n; i++) d[i] = bfpair_of(s[(int64_t)i * lds], s[(int64_t)i * lds + 1]);
        } else {   // (a loop of its own: never read past the w columns)
#pragma omp simd
            for (int i = 0; i < n; i++) d[i] = bf16_bits(s[(int64_t)i * lds]);
        }
        for (int i = n; i < ldd; i++) d[i] = 0;
    }
}

// One register block, as mm_block: C (R x NV vectors) (+)= alpha sum over the
// pairs p0 .. p1-1 of A(r, p) B(p, :).
static inline __attribute__((always_inline)) void mm_block_bf16(const int R, const int NV, int p0, int p1,
                                                                float alpha, const bfpair *A, int lda, int ak,
                                                                const bfpair *B, int ldb, float *C, int ldc,
                                                                bool add) {
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
    __m512 s = _mm512_set1_ps(alpha);
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) {
            float *cv = C + (int64_t)r * ldc + v * 16;
            __m512 x = _mm512_mul_ps(s, c[r][v]);
            _mm512_store_ps(cv, add ? _mm512_add_ps(_mm512_load_ps(cv), x) : x);
        }
}

static inline __attribute__((always_inline)) void mm_rows_bf16(const int R, bool two, int p0, int p1, float alpha,
                                                               const bfpair *A, int lda, int ak, const bfpair *B,
                                                               int ldb, float *C, int ldc, bool add) {
    if (two) mm_block_bf16(R, 2, p0, p1, alpha, A, lda, ak, B, ldb, C, ldc, add);
    else mm_block_bf16(R, 1, p0, p1, alpha, A, lda, ak, B, ldb, C, ldc, add);
}

// C (M x N) (+)= alpha A B with K elements along k (pairs (K + 1) / 2), as
// tile_mm_band: A(i, k) is zero outside i + lo <= k <= i + hi, and each
// block of rows takes only the pairs that hold such k (the other element of
// a pair at the band's edge must then be a zero of A too, which the callers'
// masks give). N, ldb and ldc multiples of 16; B and C 64-byte aligned.
static inline void tile_mm_bf16_band(int M, int N, int K, int lo, int hi, float alpha, const bfpair *A, int lda,
                                     int ak, const bfpair *B, int ldb, float *C, int ldc, bool add) {
    for (int j = 0; j < N; j += 32) {
        bool two = j + 32 <= N;
        for (int i = 0; i < M;) {
            int R = M - i >= MR ? MR : M - i >= 4 ? 4 : M - i >= 2 ? 2 : 1;
            int k0 = imax(0, i + lo), k1 = imin(K, i + R - 1 + hi + 1);
            int p0 = k0 / 2, p1 = k1 > k0 ? (k1 + 1) / 2 : p0;
            const bfpair *Ai = A + (int64_t)i * lda, *Bj = B + j;
            float *Ci = C + (int64_t)i * ldc + j;
            if (R == MR) mm_rows_bf16(MR, two, p0, p1, alpha, Ai, lda, ak, Bj, ldb, Ci, ldc, add);
            else if (R == 4) mm_rows_bf16(4, two, p0, p1, alpha, Ai, lda, ak, Bj, ldb, Ci, ldc, add);
            else if (R == 2) mm_rows_bf16(2, two, p0, p1, alpha, Ai, lda, ak, Bj, ldb, Ci, ldc, add);
            else mm_rows_bf16(1, two, p0, p1, alpha, Ai, lda, ak, Bj, ldb, Ci, ldc, add);
            i += R;
        }
    }
}

#endif
#endif
