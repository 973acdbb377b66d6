// blas.h: row-major GEMM over `real`, through OpenBLAS's cblas.
#ifndef AG_BLAS_H
#define AG_BLAS_H

#include <cblas.h>

#include "common.h"

// C (M x N) = alpha * op(A) * op(B) + beta * C, all row-major.
// op(A) is M x K (A stored K x M when ta); op(B) is K x N (B stored N x K when tb).
static inline void gemm(bool ta, bool tb, int M, int N, int K, real alpha, const real *A, int lda,
                        const real *B, int ldb, real beta, real *C, int ldc) {
    if (M == 0 || N == 0) return;
#ifdef AG_DOUBLE
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
#else
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

// Products over many rows, split among the OpenMP threads by hand (blas.c
// says why); both fall back to one gemm() call inside a parallel region or
// on one thread, and neither result depends on the thread count.
//
// C (R, N) = A (R, K) op(B) + beta C: per-thread slabs of rows.
void gemm_rows(bool tb, int R, int N, int K, const real *A, int lda, const real *B, int ldb, real beta, real *C,
               int ldc);
// C (M, N) = X^T Y + beta C with X (R, M), Y (R, N), beta 0 or 1 (a weight
// gradient summed over R rows): a partial product per fixed block of rows,
// summed in block order. part: gemm_sum_rows_scratch(M, N, R) elements of
// scratch (0: the product is one gemm() call and part may be NULL).
size_t gemm_sum_rows_scratch(int M, int N, int R);
void gemm_sum_rows(int M, int N, int R, const real *X, int ldx, const real *Y, int ldy, real beta, real *C,
                   int ldc, real *part);

// The kernel set OpenBLAS runs ("Haswell", "SkylakeX", ...), for the headers
// of logs and benchmarks. OpenBLAS picks it once, when it loads, from
// OPENBLAS_CORETYPE if set, else from the CPU; the environment pins Haswell
// on this project's Zen 5 machines and the project keeps that choice
// (docs/torch_ref.md has the AVX-512 figures).
static inline const char *blas_core_name(void) {
    const char *name = openblas_get_corename();
    return name ? name : "?";
}

#endif
