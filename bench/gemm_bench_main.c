// gemm_bench: the projections of a tiny config's training step (4096 rows of
// width 128, MLP width 384, vocabulary 256) as one threaded OpenBLAS call
// against the split matmul uses (blas.h: gemm_rows, gemm_sum_rows).
//
//   gemm_bench [rounds]   (default 100 pairs of products per shape)
//
// Memory as in a training step: every product writes a different part of a
// 512 MiB pool (each output is fresh memory); the activation input of a
// forward product and the output gradient of a backward one were written just
// before (by the op that made them: here a pass that writes them, untimed);
// the forward activation a weight gradient reads was written long before.
// Each round runs one call and then the split product; figures are GFLOP/s
// of each side's median product, and their ratio.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "blas.h"
#include "runlog.h"
#include "model_setup.h"

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

// One product of shape s, one call or split, on fresh memory: its seconds.
static double run_once(const Shape *s, bool split, real *W, real *part) {
    int R = s->R, Di = s->in, Do = s->out;
    double t0;
    if (s->kind == FWD) {   // C (R, Do) = X (R, Di) W (Di, Do)
        real *X = take_made((size_t)R * Di), *C = take((size_t)R * Do);
        t0 = runlog_now();
        if (split) gemm_rows(false, R, Do, Di, X, Di, W, Do, 0, C, Do);
        else gemm(false, false, R, Do, Di, 1, X, Di, W, Do, 0, C, Do);
    } else if (s->kind == DX) {   // dX (R, Di) = dY (R, Do) W^T, W (Di, Do)
        real *dY = take_made((size_t)R * Do), *dX = take((size_t)R * Di);
        t0 = runlog_now();
        if (split) gemm_rows(true, R, Di, Do, dY, Do, W, Do, 0, dX, Di);
        else gemm(false, true, R, Di, Do, 1, dY, Do, W, Do, 0, dX, Di);
    } else {   // dW (Di, Do) = X^T dY
        real *X = take((size_t)R * Di), *dY = take_made((size_t)R * Do), *dW = take((size_t)Di * Do);
        t0 = runlog_now();
        if (split) gemm_sum_rows(Di, Do, R, X, Di, dY, Do, 0, dW, Do, part);
        else gemm(true, false, Di, Do, R, 1, X, Di, dY, Do, 0, dW, Do);
    }
    return runlog_now() - t0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// rounds pairs (one call, split) run back to back, so that load from
// elsewhere hits both alike; GFLOP/s of each side's median product.
static void run_pairs(const Shape *s, int rounds, real *W, real *part, double *gf_one, double *gf_split) {
    double *t1 = xmalloc((size_t)rounds * sizeof(double)), *t2 = xmalloc((size_t)rounds * sizeof(double));
    for (int r = 0; r < rounds; r++) {
        t1[r] = run_once(s, false, W, part);
        t2[r] = run_once(s, true, W, part);
    }
    qsort(t1, rounds, sizeof *t1, cmp_double);
    qsort(t2, rounds, sizeof *t2, cmp_double);
    double flop = 2.0 * s->R * s->in * s->out;
    *gf_one = flop / t1[rounds / 2] * 1e-9;
    *gf_split = flop / t2[rounds / 2] * 1e-9;
    free(t1);
    free(t2);
}

int main(int argc, char **argv) {
    if (bench_help(argc, argv, "usage: gemm_bench [ROUNDS]\n  the tiny configs projection products: one threaded OpenBLAS call against the split products matmul\n  runs; GFLOP/s of the median of ROUNDS alternating pairs (default 100)\n")) return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    if (rounds < 1) {
        fprintf(stderr, "gemm_bench: rounds must be a positive number, got '%s'\n", argv[1]);
        return 2;
    }
    char cpu[256];
    runlog_cpu_name(cpu, sizeof cpu);
    printf("cpu: %s\nthreads: %d (omp_get_max_threads)   precision: %s   OpenBLAS core: %s\n", cpu,
           omp_get_max_threads(), REAL_NAME, blas_core_name());
    printf("GFLOP/s of the median of %d products each into fresh memory, the two kinds alternating\n"
           "(one call: one threaded OpenBLAS call; split: gemm_rows / gemm_sum_rows as matmul runs them)\n\n",
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
        double a, b;
        run_pairs(s, 2, W, part, &a, &b);   // warm-up: OpenBLAS buffers, thread team
        run_pairs(s, rounds, W, part, &a, &b);
        printf("| %s | %d x %d x %d | %.1f | %.1f | %.2f |\n", s->name, s->R, s->in, s->out, a, b, b / a);
    }
    free(W);
    free(part);
    free(pool);
    return 0;
}
