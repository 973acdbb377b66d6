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

#endif
