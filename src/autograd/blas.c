// blas.c: the two ways matmul splits large products among threads (blas.h).
//
// A threaded OpenBLAS call first scales its whole output by beta (zeroes it
// for beta 0) in one pass and only then runs its kernels over it. A training
// step's outputs are fresh arena memory of a few MiB each, so that pass and
// the kernels' later read of the output both go to memory. On the tiny
// configs' projections, with memory used as in a training step, the splits
// below run 1.04-1.18x faster than one call (bench/gemm_bench prints both).
// Neither split changes the result with the thread count.
#include <omp.h>

#include "blas.h"
#include "ops_math.h"

#define SLAB_BYTES (256 * 1024)                 // output per one-thread slab product
#define SUM_ROWS 512                            // rows per partial product of X^T Y
#define SUM_MAX_BYTES ((size_t)32 << 20)        // larger partials: one OpenBLAS call instead

static bool run_alone(void) { return omp_get_max_threads() < 2 || omp_in_parallel(); }

void gemm_rows(bool tb, int R, int N, int K, const real *A, int lda, const real *B, int ldb, real beta, real *C,
               int ldc) {
    // Each output element is the same dot product as in one big call, so the
    // slab size changes nothing but speed.
    int slab = imax(16, imin(1024, SLAB_BYTES / (int)sizeof(real) / imax(N, 1)));
    int ns = (R + slab - 1) / slab;
    if (ns < 2 || run_alone()) {
        gemm(false, tb, R, N, K, 1, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int s = 0; s < ns; s++) {
        int r0 = s * slab;
        gemm(false, tb, imin(slab, R - r0), N, K, 1, A + (int64_t)r0 * lda, lda, B, ldb, beta,
             C + (int64_t)r0 * ldc, ldc);
    }
}

size_t gemm_sum_rows_scratch(int M, int N, int R) {
    size_t nb = (size_t)(R + SUM_ROWS - 1) / SUM_ROWS, n = nb * M * N;
    return nb < 2 || n * sizeof(real) > SUM_MAX_BYTES ? 0 : n;
}

void gemm_sum_rows(int M, int N, int R, const real *X, int ldx, const real *Y, int ldy, real beta, real *C,
                   int ldc, real *part) {
    int nb = (R + SUM_ROWS - 1) / SUM_ROWS;
    size_t part_n = (size_t)M * N;
    if (gemm_sum_rows_scratch(M, N, R) == 0) {
        gemm(true, false, M, N, R, 1, X, ldx, Y, ldy, beta, C, ldc);
        return;
    }
#pragma omp parallel for schedule(static) if (!run_alone())
    for (int b = 0; b < nb; b++) {
        int r0 = b * SUM_ROWS;
        gemm(true, false, M, N, imin(SUM_ROWS, R - r0), 1, X + (int64_t)r0 * ldx, ldx, Y + (int64_t)r0 * ldy,
             ldy, 0, part + b * part_n, N);
    }
#pragma omp parallel for schedule(static) if (!run_alone() && (int64_t)part_n * nb > OPS_PAR_MIN)
    for (int i = 0; i < M; i++) {
        real *c = C + (int64_t)i * ldc;
        const real *p0 = part + (size_t)i * N;
        if (beta == 0)
            for (int j = 0; j < N; j++) c[j] = p0[j];
        else
            for (int j = 0; j < N; j++) c[j] += p0[j];
        for (int b = 1; b < nb; b++) {
            const real *pb = p0 + b * part_n;
            for (int j = 0; j < N; j++) c[j] += pb[j];
        }
    }
}
