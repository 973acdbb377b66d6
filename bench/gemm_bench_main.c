// gemm_bench: the projections of a tiny config's training step (4096 rows of
// width 128, MLP width 384, vocabulary 256) as one threaded OpenBLAS call
// against the split matmul uses (blas.h: gemm_rows, gemm_sum_rows).
//
//   gemm_bench [rounds]   (default 40 products per figure)
//
// Memory as in a training step: every product writes a different part of a
// 512 MiB pool (each output is fresh memory); the activation input of a
// forward product and the output gradient of a backward one were written just
// before (by the op that made them: here a pass that writes them, untimed);
// the forward activation a weight gradient reads was written long before.
// Figures are GFLOP/s, the mean over the rounds, and the ratio split / one
// call, measured in the same run.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "runlog.h"

#define POOL_BYTES ((size_t)512 << 20)

typedef enum { FWD, DX, DW } Kind;   // x W ; dY W^T ; X^T dY

typedef struct Shape {
    const char *name;
    Kind kind;
    int R, in, out;   // rows, input and output width of the layer
} Shape;

static real *pool;
static size_t pool_n, pool_at;

// n elements of the pool, cycling, so that consecutive products touch
// different memory.
static real *take(size_t n) {
    if (pool_at + n > pool_n) pool_at = 0;
    real *p = pool + pool_at;
    pool_at += (n + 1023) & ~(size_t)1023;
    return p;
}

// The same, just written, as the output of the op before the product.
static real *take_made(size_t n) {
    real *p = take(n);
    for (size_t i = 0; i < n; i++) p[i] = (real)((i % 5) * 0.02);
    return p;
}

static double run(const Shape *s, bool split, int rounds, real *W, real *part) {
    int R = s->R, Di = s->in, Do = s->out;
    double t = 0;
    for (int r = 0; r < rounds; r++) {
        if (s->kind == FWD) {   // C (R, Do) = X (R, Di) W (Di, Do)
            real *X = take_made((size_t)R * Di), *C = take((size_t)R * Do);
            double t0 = runlog_now();
            if (split) gemm_rows(false, R, Do, Di, X, Di, W, Do, 0, C, Do);
            else gemm(false, false, R, Do, Di, 1, X, Di, W, Do, 0, C, Do);
            t += runlog_now() - t0;
        } else if (s->kind == DX) {   // dX (R, Di) = dY (R, Do) W^T, W (Di, Do)
            real *dY = take_made((size_t)R * Do), *dX = take((size_t)R * Di);
            double t0 = runlog_now();
            if (split) gemm_rows(true, R, Di, Do, dY, Do, W, Do, 0, dX, Di);
            else gemm(false, true, R, Di, Do, 1, dY, Do, W, Do, 0, dX, Di);
            t += runlog_now() - t0;
        } else {   // dW (Di, Do) = X^T dY
            real *X = take((size_t)R * Di), *dY = take_made((size_t)R * Do), *dW = take((size_t)Di * Do);
            double t0 = runlog_now();
            if (split) gemm_sum_rows(Di, Do, R, X, Di, dY, Do, 0, dW, Do, part);
            else gemm(true, false, Di, Do, R, 1, X, Di, dY, Do, 0, dW, Do);
            t += runlog_now() - t0;
        }
    }
    return 2.0 * R * Di * Do * rounds / t * 1e-9;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 40;
    if (rounds < 1) {
        fprintf(stderr, "gemm_bench: rounds must be a positive number, got '%s'\n", argv[1]);
        return 2;
    }
    char cpu[256];
    runlog_cpu_name(cpu, sizeof cpu);
    printf("cpu: %s\nthreads: %d (omp_get_max_threads)   precision: %s   OpenBLAS core: %s\n", cpu,
           omp_get_max_threads(), REAL_NAME, blas_core_name());
    printf("GFLOP/s, mean of %d products each into fresh memory (one call: one threaded OpenBLAS call;\n"
           "split: gemm_rows / gemm_sum_rows as matmul runs them)\n\n",
           rounds);
    pool_n = POOL_BYTES / sizeof(real);
    pool = xaligned(POOL_BYTES);
    for (size_t i = 0; i < pool_n; i++) pool[i] = (real)((i % 7) * 0.01);   // touch every page
    const Shape shapes[] = {
        {"q/k/v/out projection", FWD, 4096, 128, 128}, {"MLP up (x W1)", FWD, 4096, 128, 384},
        {"MLP down (h W2)", FWD, 4096, 384, 128},      {"lm head", FWD, 4096, 128, 256},
        {"dX of a projection", DX, 4096, 128, 128},    {"dX of MLP up", DX, 4096, 128, 384},
        {"dX of MLP down", DX, 4096, 384, 128},        {"dW of a projection", DW, 4096, 128, 128},
        {"dW of MLP up", DW, 4096, 128, 384},          {"dW of MLP down", DW, 4096, 384, 128},
    };
    real *W = xaligned((size_t)384 * 384 * sizeof(real));
    for (int i = 0; i < 384 * 384; i++) W[i] = (real)((i % 13) * 0.01 - 0.06);
    real *part = xaligned(((size_t)4096 / 512 + 1) * 384 * 384 * sizeof(real));
    printf("| product | rows x in x out | one call | split | split / one call |\n");
    printf("| --- | --- | ---: | ---: | ---: |\n");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const Shape *s = &shapes[i];
        run(s, false, 2, W, part);   // warm-up: OpenBLAS buffers, thread team
        run(s, true, 2, W, part);
        double a = run(s, false, rounds, W, part), b = run(s, true, rounds, W, part);
        printf("| %s | %d x %d x %d | %.1f | %.1f | %.2f |\n", s->name, s->R, s->in, s->out, a, b, b / a);
    }
    free(W);
    free(part);
    free(pool);
    return 0;
}
