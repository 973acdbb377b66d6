// tile_mm.h: register-blocked products for the small blocks of the chunked
// and tiled kernels (attention tiles, GLA chunks), where a BLAS call spends
// more time on its set-up (copying panels, zeroing C before every beta = 0
// product) than on the arithmetic: measured 3x slower at 64 x 64 x 32.
//
// tile_mm: C (M x N) (+)= alpha A B. Its vector operands (B and C) are rows of
// whole aligned vectors (N, ldb, ldc multiples of VL, B and C VEC_BYTES-
// aligned): the tensors themselves when a head's rows are (in_place), else
// copies padded with zeros (pack_rows, pack_transposed); the broadcast operand
// A is read in place at any stride, so either orientation of A is free.
#ifndef AG_TILE_MM_H
#define AG_TILE_MM_H

#include <stdint.h>
#include <string.h>

#include "blas.h"
#include "common.h"

// GCC/Clang vector types (one SIMD register each), so that the accumulators
// of a register block are registers, which plain loops did not give (the
// compiler kept them in memory; measured 3x slower at these sizes).
#ifdef __AVX512F__
#define VEC_BYTES 64
#define MR 8   // rows per register block: 2 MR accumulators of the 32 vector registers
#else
#define VEC_BYTES 32
#define MR 4   // 16 vector registers (AVX2, SSE)
#endif
#define VL ((int)(VEC_BYTES / sizeof(real)))   // reals per vector
typedef real vreal __attribute__((vector_size(VEC_BYTES)));

static inline int round_vl(int n) { return (n + VL - 1) / VL * VL; }

// Ask for n rows of w reals at row stride ld from x (one head's slice of
// each row), for reading (write 0) or for writing (write 1), into L2. The
// chunk kernels' first touch of a row (v, o, dO, dq, dk, dv in gdn; q, k,
// v, o and the gradients in gla) waited on memory: perf put 11 % of the
// gdn kernel's time in a training step on those loops. Each is asked for
// at the start of the work before it, few enough (4 lines per row) not to
// clog the miss buffers.
static inline void prefetch_rows(const real *x, int64_t ld, int n, int w, int write) {
    for (int i = 0; i < n; i++) {
        const char *r = (const char *)(x + (int64_t)i * ld);
        for (size_t o = 0; o < (size_t)w * sizeof(real); o += 64) {
            if (write) __builtin_prefetch(r + o, 1, 2);
            else __builtin_prefetch(r + o, 0, 2);
        }
    }
}

// One register block: C (R x NV vectors) (+)= alpha s_r sum_k A(r, k) B(k, :),
// with A(r, k) = A[r lda + k ak] and s_r = rs[r] (rs NULL: 1). R <= MR and
// NV <= 2 are constants at each call, so the loops unroll and c[][] lives in
// registers.
static inline __attribute__((always_inline)) void mm_block(const int R, const int NV, int K, real alpha,
                                                           const real *rs, const real *A, int lda, int ak,
                                                           const real *B, int ldb, real *C, int ldc, bool add) {
    vreal c[MR][2];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) c[r][v] = (vreal){0};
    for (int k = 0; k < K; k++) {
        vreal b[2];
        for (int v = 0; v < NV; v++) b[v] = *(const vreal *)(B + (int64_t)k * ldb + v * VL);
        for (int r = 0; r < R; r++) {
            real a = A[r * lda + k * ak];
            for (int v = 0; v < NV; v++) c[r][v] += a * b[v];
        }
    }
    for (int r = 0; r < R; r++) {
        real s = rs ? alpha * rs[r] : alpha;
        for (int v = 0; v < NV; v++) {
            vreal *cv = (vreal *)(C + (int64_t)r * ldc + v * VL);
            *cv = add ? *cv + s * c[r][v] : s * c[r][v];
        }
    }
}

static inline __attribute__((always_inline)) void mm_rows(const int R, bool two, int K, real alpha,
                                                          const real *rs, const real *A, int lda, int ak,
                                                          const real *B, int ldb, real *C, int ldc, bool add) {
    if (two) mm_block(R, 2, K, alpha, rs, A, lda, ak, B, ldb, C, ldc, add);
    else mm_block(R, 1, K, alpha, rs, A, lda, ak, B, ldb, C, ldc, add);
}

// C (M x N) = alpha A B, or C += alpha A B when `add`. A (M x K) has element
// (i, k) at A[i lda + k ak] (ak = 1: row-major; lda = 1: stored transposed);
// B (K x N) has rows of stride ldb, C rows of stride ldc. N, ldb and ldc are
// multiples of VL, and B and C are VEC_BYTES-aligned.
// Band: A(i, k) is zero outside i + lo <= k <= i + hi (a causal mask), and
// each block of rows skips the k where all its rows are zero.
// lower: only the blocks of C that hold an element on or below the diagonal
// (j <= i) are computed; the others are left as they were.
// rs: row i of the product is scaled by rs[i] (C = diag(rs) alpha A B (+ C)),
// in the registers before the store; NULL: no scale.
static inline void tile_mm_band_part(int M, int N, int K, int lo, int hi, bool lower, real alpha, const real *rs,
                                     const real *A, int lda, int ak, const real *B, int ldb, real *C, int ldc,
                                     bool add) {
    for (int j = 0; j < N; j += 2 * VL) {
        bool two_j = j + 2 * VL <= N;
        for (int i = lower ? j / MR * MR : 0; i < M;) {
            int R = M - i >= MR ? MR : M - i >= 4 ? 4 : M - i >= 2 ? 2 : 1;
            int k0 = imax(0, i + lo), k1 = imin(K, i + R - 1 + hi + 1);
            int nk = imax(0, k1 - k0);
            const real *Ai = A + i * lda + k0 * ak, *Bk = B + (int64_t)k0 * ldb + j;
            real *Ci = C + (int64_t)i * ldc + j;
            const real *ri = rs ? rs + i : NULL;
            // lower: rows that end before the second vector's columns need only the first
            bool two = two_j && !(lower && i + R <= j + VL);
            if (R == MR) mm_rows(MR, two, nk, alpha, ri, Ai, lda, ak, Bk, ldb, Ci, ldc, add);
            else if (MR > 4 && R == 4) mm_rows(4, two, nk, alpha, ri, Ai, lda, ak, Bk, ldb, Ci, ldc, add);
            else if (R == 2) mm_rows(2, two, nk, alpha, ri, Ai, lda, ak, Bk, ldb, Ci, ldc, add);
            else mm_rows(1, two, nk, alpha, ri, Ai, lda, ak, Bk, ldb, Ci, ldc, add);
            i += R;
        }
    }
}

static inline void tile_mm_band(int M, int N, int K, int lo, int hi, real alpha, const real *A, int lda, int ak,
                                const real *B, int ldb, real *C, int ldc, bool add) {
    tile_mm_band_part(M, N, K, lo, hi, false, alpha, NULL, A, lda, ak, B, ldb, C, ldc, add);
}

static inline void tile_mm(int M, int N, int K, real alpha, const real *A, int lda, int ak, const real *B, int ldb,
                    real *C, int ldc, bool add) {
    tile_mm_band(M, N, K, -M, K, alpha, A, lda, ak, B, ldb, C, ldc, add);
}

// dst (n x ldd) = the first w columns of n rows of src (row stride lds), the
// rest of each row zero.
static inline void pack_rows(real *dst, int ldd, const real *src, int lds, int n, int w) {
    for (int i = 0; i < n; i++) {
        memcpy(dst + (int64_t)i * ldd, src + (int64_t)i * lds, (size_t)w * sizeof(real));
        memset(dst + (int64_t)i * ldd + w, 0, (size_t)(ldd - w) * sizeof(real));
    }
}

// Unaligned whole vectors (rows of a tensor at any offset), and the index
// vectors of __builtin_shuffle for vreal.
typedef real vreal_u __attribute__((vector_size(VEC_BYTES), aligned(sizeof(real))));
#ifdef AG_DOUBLE
typedef int64_t vindex __attribute__((vector_size(VEC_BYTES)));
#else
typedef int32_t vindex __attribute__((vector_size(VEC_BYTES)));
#endif

// The transpose of the VL x VL block at src (row stride lds) into dst (row
// stride ldd), in registers rather than VL^2 single-element loads and stores.
#if VEC_BYTES == 64 && !defined(AG_DOUBLE)
// float32 on AVX-512 (16 x 16): the classic four rounds of two-register
// shuffles, written with constant index vectors so that GCC emits vunpcklps,
// vunpckhps, vshufps and vshuff32x4, which need no index registers: 3x
// faster than the generic rounds below (vpermt2ps with indices built at run
// time, which GCC spilled to the stack).
#ifdef __clang__   // (clang has no __builtin_shuffle; the fuzz targets build with it)
#define TB_SH(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
#else
#define TB_SH(x, y, ...) __builtin_shuffle(x, y, (vindex){__VA_ARGS__})
#endif
static inline __attribute__((always_inline)) void transpose_block(real *dst, int ldd, const real *src, int lds) {
    vreal r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = *(const vreal_u *)(src + (int64_t)i * lds);
    for (int i = 0; i < 16; i += 2) {   // interleave rows i, i+1 element by element, per 128-bit lane
        t[i] = TB_SH(r[i], r[i + 1], 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29);
        t[i + 1] = TB_SH(r[i], r[i + 1], 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
    }
    for (int i = 0; i < 16; i += 4) {   // then pairs of elements
        r[i] = TB_SH(t[i], t[i + 2], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
        r[i + 1] = TB_SH(t[i], t[i + 2], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
        r[i + 2] = TB_SH(t[i + 1], t[i + 3], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
        r[i + 3] = TB_SH(t[i + 1], t[i + 3], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
    for (int i = 0; i < 16; i += 8)     // then 128-bit lanes, twice
        for (int j = 0; j < 4; j++) {
            t[i + j] = TB_SH(r[i + j], r[i + j + 4], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
            t[i + j + 4] = TB_SH(r[i + j], r[i + j + 4], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = TB_SH(t[j], t[j + 8], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
        r[j + 8] = TB_SH(t[j], t[j + 8], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    }
    for (int i = 0; i < 16; i++) *(vreal_u *)(dst + (int64_t)i * ldd) = r[i];
}
#undef TB_SH
#elif defined(__clang__)
// clang (the fuzz targets): its shuffles take constant indices only; element by element.
static inline void transpose_block(real *dst, int ldd, const real *src, int lds) {
    for (int i = 0; i < VL; i++)
        for (int j = 0; j < VL; j++) dst[(int64_t)j * ldd + i] = src[(int64_t)i * lds + j];
}
#else
// Any VL: at each level b = VL/2, ..., 1, every 2b x 2b block swaps its
// off-diagonal b x b blocks (log2 VL rounds of two-register shuffles).
static inline __attribute__((always_inline)) void transpose_block(real *dst, int ldd, const real *src, int lds) {
    vreal r[VL];
#pragma GCC unroll 16
    for (int i = 0; i < VL; i++) r[i] = *(const vreal_u *)(src + (int64_t)i * lds);
#pragma GCC unroll 4
    for (int b = VL / 2; b >= 1; b /= 2) {
        vindex lo, hi;   // lo: x's first b of each 2b, then y's; hi: x's second b, then y's
#pragma GCC unroll 16
        for (int j = 0; j < VL; j++) {
            lo[j] = j & b ? VL + j - b : j;
            hi[j] = j & b ? VL + j : j + b;
        }
#pragma GCC unroll 16
        for (int i = 0; i < VL; i++)
            if (!(i & b)) {
                vreal x = r[i], y = r[i + b];
                r[i] = __builtin_shuffle(x, y, lo);
                r[i + b] = __builtin_shuffle(x, y, hi);
            }
    }
#pragma GCC unroll 16
    for (int i = 0; i < VL; i++) *(vreal_u *)(dst + (int64_t)i * ldd) = r[i];
}
#endif

// dst (w x ldd) = the transpose of w columns of n rows of src: dst[c][i] =
// src[i][c], columns n .. ldd-1 zero. Whole VL x VL blocks in registers
// (transpose_block), the edges element by element.
static inline void pack_transposed(real *dst, int ldd, const real *src, int lds, int n, int w) {
    int nb = n / VL * VL, wb = w / VL * VL;
    for (int c = 0; c < wb; c += VL)
        for (int i = 0; i < nb; i += VL) transpose_block(dst + (int64_t)c * ldd + i, ldd, src + (int64_t)i * lds + c, lds);
    for (int c = 0; c < w; c++) {
        real *row = dst + (int64_t)c * ldd;
        for (int i = c < wb ? nb : 0; i < n; i++) row[i] = src[(int64_t)i * lds + c];
        for (int i = n; i < ldd; i++) row[i] = 0;
    }
}

// Whether rows of w reals at stride ld from p can be tile_mm's B or C as they
// are: whole vectors, aligned.
static inline bool in_place(const real *p, int ld, int w) {
    return w % VL == 0 && ld % VL == 0 && (uintptr_t)p % VEC_BYTES == 0;
}

// dst rows (row stride ldd) += the first w columns of n rows of src (row stride lds).
static inline void add_rows(real *dst, int ldd, const real *src, int lds, int n, int w) {
    for (int i = 0; i < n; i++)
        for (int c = 0; c < w; c++) dst[(int64_t)i * ldd + c] += src[(int64_t)i * lds + c];
}

// A small block's product C (M x N) = alpha op(A) op(B) + beta C, beta 0 or 1,
// arguments as gemm(). op(A)(i, k) is zero outside i + lo <= k <= i + hi
// (TILE_FULL: no band; the causal masks: -M, 0 and, transposed, 0, K), which the
// register-blocked tile_mm skips. tile_mm runs when B's rows (after
// transposing B into `pack`, (K x N) scratch, when tb) and C's are whole
// aligned vectors (N a multiple of VL: head sizes 16, 32, 64, ...), else
// gemm(), whose set-up costs more than the arithmetic at these sizes.
// tile_gemm_rows: the same with row i of the product scaled by rs[i] (rs
// NULL: none), C = diag(rs) alpha op(A) op(B) + beta C: the decay factors of
// the chunk kernels' rows, applied in the registers instead of a pass over a
// scaled copy of A or over C.
static inline void tile_gemm_rows(bool ta, bool tb, int M, int N, int K, real alpha, const real *rs, const real *A,
                                  int lda, const real *B, int ldb, real beta, real *C, int ldc, int lo, int hi,
                                  real *pack) {
    bool b_ok = tb ? N % VL == 0 && pack && (uintptr_t)pack % VEC_BYTES == 0 : in_place(B, ldb, N);
    if (M == 0 || N == 0) return;
    if (!b_ok || !in_place(C, ldc, N)) {
        if (!rs) gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        else   // one row at a time: op(A)'s row i is A + i lda, or A + i stored transposed
            for (int i = 0; i < M; i++)
                gemm(ta, tb, 1, N, K, alpha * rs[i], A + (ta ? i : (int64_t)i * lda), lda, B, ldb, beta,
                     C + (int64_t)i * ldc, ldc);
        return;
    }
    if (tb) {
        pack_transposed(pack, N, B, ldb, N, K);   // pack[k][j] = B[j][k]
        B = pack;
        ldb = N;
    }
    // op(A)(i, k) = A[i lda + k] (row-major) or A[k lda + i] (stored transposed)
    tile_mm_band_part(M, N, K, lo, hi, false, alpha, rs, A, ta ? 1 : lda, ta ? lda : 1, B, ldb, C, ldc, beta != 0);
}

static inline void tile_gemm(bool ta, bool tb, int M, int N, int K, real alpha, const real *A, int lda,
                             const real *B, int ldb, real beta, real *C, int ldc, int lo, int hi, real *pack) {
    tile_gemm_rows(ta, tb, M, N, K, alpha, NULL, A, lda, B, ldb, beta, C, ldc, lo, hi, pack);
}
#define TILE_FULL(M, K) -(M), (K)   // lo, hi of a product without a band

// C (M x M) = alpha A B + beta C (beta 0 or 1; A row-major (M x K), B (K x M))
// on and below the diagonal, for the products whose upper triangle is masked
// away (the chunk kernels' Q K^T, K K^T, dO Delta^T): the blocks of C above
// the diagonal are skipped where C's and B's rows are whole aligned vectors;
// elsewhere gemm() computes all of C. What lies above the diagonal is
// unspecified.
static inline void tile_gemm_lower(int M, int K, real alpha, const real *A, int lda, const real *B, int ldb, real beta,
                                   real *C, int ldc) {
    if (M == 0) return;
    if (!in_place(B, ldb, M) || !in_place(C, ldc, M)) {
        gemm(false, false, M, M, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    tile_mm_band_part(M, M, K, -M, K, true, alpha, NULL, A, lda, 1, B, ldb, C, ldc, beta != 0);
}

#endif
