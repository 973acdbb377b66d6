// tile_mm.h's helpers against element loops: pack_transposed, whose whole
// VL x VL blocks are transposed in registers and whose edges element by
// element, at sizes that are and are not whole blocks, at odd source strides;
// tile_gemm_rows (the products with a scale per row) in each of its paths;
// tile_gemm_lower on and below the diagonal.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "tile_mm.h"

Test(tile_mm, pack_transposed_equals_element_loop) {
    // (n rows, w columns) of the source; its stride lds >= w, the packed stride ldd >= n.
    const int cases[][4] = {{VL, VL, VL, VL},     {64, 64, 256, 64},         {2 * VL, VL, VL + 3, 2 * VL + 5},
                            {VL + 3, 2 * VL + 1, 2 * VL + 7, VL + 3}, {5, 3, 3, 16}, {3 * VL - 1, VL - 1, VL, 3 * VL}};
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        int n = cases[t][0], w = cases[t][1], lds = cases[t][2], ldd = cases[t][3];
        real *src = test_randn((int64_t)n * lds, 7 + (int)t);
        real *dst = xmalloc((size_t)w * ldd * sizeof(real));
        for (int64_t i = 0; i < (int64_t)w * ldd; i++) dst[i] = -1;   // every element must be written
        pack_transposed(dst, ldd, src, lds, n, w);
        for (int c = 0; c < w; c++)
            for (int i = 0; i < ldd; i++) {
                real want = i < n ? src[(int64_t)i * lds + c] : 0;
                cr_assert(dst[(int64_t)c * ldd + i] == want, "case %zu (n %d, w %d): dst[%d][%d] = %g, want %g", t, n,
                          w, c, i, (double)dst[(int64_t)c * ldd + i], (double)want);
            }
        free(src);
        free(dst);
    }
}

// tile_gemm_rows, C = diag(rs) alpha op(A) op(B) + beta C, against a loop in
// double: every (ta, tb), beta 0 and 1, rs NULL or not, a band, and sizes
// that take the register blocks (N a multiple of VL, aligned rows, M not a
// multiple of MR) and that fall back to gemm() (N not a multiple of VL).
Test(tile_mm, tile_gemm_rows_equals_element_loop) {
    const int sizes[][3] = {{2 * MR + 3, 2 * VL, VL + 5}, {5, VL, 2 * VL}, {7, VL + 3, 6}};   // M, N, K
    for (size_t sz = 0; sz < sizeof sizes / sizeof sizes[0]; sz++) {
        int M = sizes[sz][0], N = sizes[sz][1], K = sizes[sz][2];
        int ldc = round_vl(N) + VL;   // rows of whole vectors, aligned, with room to spare
        for (int variant = 0; variant < 32; variant++) {
            bool ta = variant & 1, tb = variant & 2, add = variant & 4, scaled = variant & 8, band = variant & 16;
            int lo = -M, hi = band ? 0 : K;   // band: op(A)(i, k) = 0 for k > i (a causal mask)
            int lda = ta ? M + 2 : K + 1, ldb = tb ? K + 3 : round_vl(N);
            real *A = test_randn((int64_t)(ta ? K : M) * lda, 11 + variant);
            real *B = test_randn((int64_t)(tb ? N : K) * ldb, 13 + variant);   // 64-byte aligned
            real *rs = test_randn(M, 17 + variant);
            real *C = xaligned((size_t)M * ldc * sizeof(real));
            real *C0 = test_randn((int64_t)M * ldc, 19 + variant);
            memcpy(C, C0, (size_t)M * ldc * sizeof(real));
            real *pack = xaligned((size_t)K * round_vl(N) * sizeof(real));
            if (band)   // zero outside the band, as the callers' masked operands are
                for (int i = 0; i < M; i++)
                    for (int k = i + 1; k < K; k++) A[ta ? (int64_t)k * lda + i : (int64_t)i * lda + k] = 0;
            real alpha = (real)0.75;
            tile_gemm_rows(ta, tb, M, N, K, alpha, scaled ? rs : NULL, A, lda, B, ldb, add ? 1 : 0, C, ldc, lo, hi,
                           pack);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s = 0, mag = 0;
                    for (int k = 0; k < K; k++) {
                        double a = A[ta ? (int64_t)k * lda + i : (int64_t)i * lda + k];
                        double b = B[tb ? (int64_t)j * ldb + k : (int64_t)k * ldb + j];
                        s += a * b;
                        mag += fabs(a * b);
                    }
                    double f = alpha * (scaled ? rs[i] : 1);
                    double want = f * s + (add ? C0[(int64_t)i * ldc + j] : 0);
                    double tol = 1e-5 * (fabs(f) * mag + 1);
                    if (sizeof(real) == 8) tol = 1e-13 * (fabs(f) * mag + 1);
                    cr_assert(fabs(C[(int64_t)i * ldc + j] - want) <= tol,
                              "M %d N %d K %d ta %d tb %d add %d rs %d band %d: C[%d][%d] = %.9g, want %.9g", M, N,
                              K, ta, tb, add, scaled, band, i, j, (double)C[(int64_t)i * ldc + j], want);
                }
            free(A);
            free(B);
            free(rs);
            free(C);
            free(C0);
            free(pack);
        }
    }
}

// tile_gemm_lower, C = alpha A B + beta C on and below the diagonal, against a
// loop in double: sizes whose rows take the register blocks (M a multiple of
// VL, and not of 2 VL: a last block of one vector) and that fall back to
// gemm(); the elements above the diagonal are not looked at (unspecified).
Test(tile_mm, tile_gemm_lower_equals_element_loop_on_and_below_the_diagonal) {
    const int sizes[][2] = {{4 * VL, VL + 3}, {3 * VL, 2 * VL}, {VL, 5}, {VL + 5, 7}};   // M, K
    for (size_t sz = 0; sz < sizeof sizes / sizeof sizes[0]; sz++)
        for (int add = 0; add < 2; add++) {
            int M = sizes[sz][0], K = sizes[sz][1], lda = K + 1, ldb = round_vl(M), ldc = round_vl(M) + VL;
            real *A = test_randn((int64_t)M * lda, 23 + (int)sz);
            real *B = test_randn((int64_t)K * ldb, 29 + (int)sz);
            real *C = xaligned((size_t)M * ldc * sizeof(real));
            real *C0 = test_randn((int64_t)M * ldc, 31 + (int)sz);
            memcpy(C, C0, (size_t)M * ldc * sizeof(real));
            real alpha = (real)-1.25;
            tile_gemm_lower(M, K, alpha, A, lda, B, ldb, add, C, ldc);
            for (int i = 0; i < M; i++)
                for (int j = 0; j <= i; j++) {
                    double s = 0, mag = 0;
                    for (int k = 0; k < K; k++) {
                        s += (double)A[(int64_t)i * lda + k] * B[(int64_t)k * ldb + j];
                        mag += fabs((double)A[(int64_t)i * lda + k] * B[(int64_t)k * ldb + j]);
                    }
                    double want = alpha * s + (add ? C0[(int64_t)i * ldc + j] : 0);
                    double tol = (sizeof(real) == 8 ? 1e-13 : 1e-5) * (fabs(alpha) * mag + 1);
                    cr_assert(fabs(C[(int64_t)i * ldc + j] - want) <= tol, "M %d K %d add %d: C[%d][%d] = %.9g, want %.9g",
                              M, K, add, i, j, (double)C[(int64_t)i * ldc + j], want);
                }
            free(A);
            free(B);
            free(C);
            free(C0);
        }
}

#include "tile_mm_bf16.h"

// tile_gemm_rows_bf16 (tile_mm_bf16.h), the chunk kernels' products under
// precision = bf16, against a loop in double over the operands rounded to
// bf16: every (ta, tb), beta 0 and 1, rs NULL or not, lower or not, no band,
// the causal band (op(A)(i, k) = 0 for k > i) and its transpose (k < i), odd
// K (a pair padded with zero), M not a multiple of MR. A product of two bf16
// numbers is exact in float32, so the only error is the float32 sums':
// within K 2^-24 sum |terms|. Outside the band A holds large numbers (as
// the kernels' "unspecified" halves may): a pair that took one in fails.
// The same products in float32 differ by far more (the path is bf16).
Test(tile_mm, tile_gemm_rows_bf16_equals_the_product_of_rounded_operands) {
#ifndef AG_TILE_BF16
    cr_skip_test("this build has no bf16 tile products (float64, or no AVX512_BF16 target)");
#else
    const int sizes[][3] = {{2 * MR + 3, 32, 21}, {64, 64, 64}, {5, 16, 2 * MR + 1}, {48, 48, 48}};   // M, N, K
    double worst_f32 = 0;
    for (size_t sz = 0; sz < sizeof sizes / sizeof sizes[0]; sz++) {
        int M = sizes[sz][0], N = sizes[sz][1], K = sizes[sz][2], ldc = N + 16;
        for (int variant = 0; variant < 96; variant++) {
            bool ta = variant & 1, tb = variant & 2, add = variant & 4, scaled = variant & 8, lower = variant & 16;
            int band = variant / 32;   // 0 none, 1 causal (k <= i), 2 anti-causal (k >= i)
            if (lower && M != N) continue;
            int lo = band == 2 ? 0 : -M, hi = band == 1 ? 0 : K;
            int lda = ta ? M + 3 : K + 1, ldb = tb ? K + 5 : N + 16;
            real *A = test_randn((int64_t)(ta ? K : M) * lda, 41 + variant);
            real *B = test_randn((int64_t)(tb ? N : K) * ldb, 43 + variant);
            real *rs = test_randn(M, 47 + variant);
            real *C = xaligned((size_t)M * ldc * sizeof(real)), *C32 = xaligned((size_t)M * ldc * sizeof(real));
            real *C0 = test_randn((int64_t)M * ldc, 53 + variant);
            bfpair *pa = xaligned((size_t)imax(M, N) * (K + 1) * sizeof(bfpair));   // N rows: tb scratch
            bfpair *pb = xaligned((size_t)(K + 1) * N * sizeof(bfpair));
            real *pack = xaligned((size_t)K * N * sizeof(real));
            for (int i = 0; i < M; i++)   // outside the band: large numbers the product must not read
                for (int k = 0; k < K; k++)
                    if (k < i + lo || k > i + hi) A[ta ? (int64_t)k * lda + i : (int64_t)i * lda + k] = 1e6f;
            memcpy(C, C0, (size_t)M * ldc * sizeof(real));
            memcpy(C32, C0, (size_t)M * ldc * sizeof(real));
            real alpha = (real)-0.75;
            cr_assert(tile_gemm_rows_bf16(ta, tb, lower, M, N, K, alpha, scaled ? rs : NULL, A, lda, B, ldb,
                                          add ? 1 : 0, C, ldc, lo, hi, pa, pb));
            tile_gemm_rows(ta, tb, M, N, K, alpha, scaled ? rs : NULL, A, lda, B, ldb, add ? 1 : 0, C32, ldc, lo, hi,
                           pack);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < (lower ? i + 1 : N); j++) {
                    double s = 0, mag = 0;
                    for (int k = imax(0, i + lo); k <= imin(K - 1, i + hi); k++) {
                        double a = bf16_round(A[ta ? (int64_t)k * lda + i : (int64_t)i * lda + k]);
                        double b = bf16_round(B[tb ? (int64_t)j * ldb + k : (int64_t)k * ldb + j]);
                        s += a * b;
                        mag += fabs(a * b);
                    }
                    double f = alpha * (scaled ? rs[i] : 1), c0 = add ? C0[(int64_t)i * ldc + j] : 0;
                    double want = f * s + c0;
                    double tol = K * 0x1p-24 * fabs(f) * mag + 0x1p-24 * (fabs(f * s) + fabs(c0)) * 2;
                    double got = C[(int64_t)i * ldc + j];
                    cr_assert(fabs(got - want) <= tol,
                              "M %d N %d K %d ta %d tb %d add %d rs %d lower %d band %d: C[%d][%d] = %.9g, want "
                              "%.9g (tol %.3g)",
                              M, N, K, ta, tb, add, scaled, lower, band, i, j, got, want, tol);
                    worst_f32 = fmax(worst_f32, fabs(C32[(int64_t)i * ldc + j] - want) / (fabs(f) * mag + 1e-30));
                }
            free(A), free(B), free(rs), free(C), free(C32), free(C0), free(pa), free(pb), free(pack);
        }
    }
    cr_assert_gt(worst_f32, 1e-4, "the float32 products are within %.3g of the bf16 reference: is it bf16?", worst_f32);
    // Refused (the caller runs float32): N or ldc not whole vectors, C not aligned.
    real *C = xaligned(64 * 48 * sizeof(real)), *X = test_randn(64 * 64, 5);
    bfpair *pa = xaligned(64 * 64 * sizeof(bfpair)), *pb = xaligned(64 * 64 * sizeof(bfpair));
    cr_assert(!tile_gemm_rows_bf16(false, false, false, 8, 24, 8, 1, NULL, X, 8, X, 24, 0, C, 32, -8, 8, pa, pb));
    cr_assert(!tile_gemm_rows_bf16(false, false, false, 8, 16, 8, 1, NULL, X, 8, X, 16, 0, C, 24, -8, 8, pa, pb));
    cr_assert(!tile_gemm_rows_bf16(false, false, false, 8, 16, 8, 1, NULL, X, 8, X, 16, 0, C + 4, 16, -8, 8, pa, pb));
    free(C), free(X), free(pa), free(pb);
#endif
}
