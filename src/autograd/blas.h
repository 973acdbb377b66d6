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
