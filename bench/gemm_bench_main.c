// gemm_bench: the dense layers' products of a training step (forward x W,
// dX = dY W^T, dW = X^T dY over 4096 rows) at d_model 128, 256 and 512, on
// each backend of blas.h, and the machine's product peak.
//
//   gemm_bench [--rounds N] [--width 128|256|512|all] [--cpu]   (default 50 rounds, all widths)
//
// --cpu times each product by the CPU time of all threads (GFLOP per
// CPU-second): a thread that waits for a core sleeps and is not counted, so
// this moves less on a loaded machine than wall time does.
//
// Columns (GFLOP/s of the median product, 2 M N K flops each):
//   openblas 1: one threaded cblas_sgemm call; openblas: split as matmul runs
//   it (blas.h: gemm_rows, gemm_sum_rows); onednn 1: one dnnl_sgemm call;
//   onednn: split; bf16: split, bf16 operands and float32 sums (oneDNN).
// Memory as in a training step: every product writes a different part of a
// 512 MiB pool (each output is fresh memory); the activation input of a
// forward product and the output gradient of a backward one were written just
// before (by the op that made them: here a pass that writes them, untimed);
// the forward activation a weight gradient reads was written long before.
// Each round runs every column once, in turn, so that load from elsewhere
// hits them alike.
//
// Peak: the best of 20 products 2048 x 2048 x 2048 (in cache-friendly order,
// one call), per backend and precision: the machine's product peak that
// docs/cpu_perf.md compares a training step with.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "blas.h"
#include "model_setup.h"
#include "runlog.h"

#define POOL_BYTES ((size_t)512 << 20)

typedef enum { FWD, DX, DW } Kind;   // x W ; dY W^T ; X^T dY

typedef struct Shape {
    const char *name;
    Kind kind;
    int R, in, out;   // rows, input and output width of the layer
    int d_model;      // the model width it belongs to
} Shape;

typedef enum { COL_OB_ONE, COL_OB_SPLIT, COL_DN_ONE, COL_DN_SPLIT, COL_BF16, COL_COUNT } Column;
static const char *const COL_NAMES[COL_COUNT] = {"openblas 1", "openblas", "onednn 1", "onednn", "bf16"};

static bool cpu_time;   // --cpu: time products by the CPU time of all threads

static double clock_now(void) { return cpu_time ? runlog_cpu_now() : runlog_now(); }

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

static void set_column(Column c) {
    blas_backend = c == COL_OB_ONE || c == COL_OB_SPLIT ? GEMM_OPENBLAS : GEMM_ONEDNN;
    blas_precision = c == COL_BF16 ? PRECISION_BF16 : PRECISION_FP32;
}

// One product of shape s in column c, on fresh memory: its seconds.
static double run_once(const Shape *s, Column c, real *W, real *part) {
    int R = s->R, Di = s->in, Do = s->out;
    bool split = c != COL_OB_ONE && c != COL_DN_ONE;
    set_column(c);
    double t0;
    if (s->kind == FWD) {   // C (R, Do) = X (R, Di) W (Di, Do)
        real *X = take_made((size_t)R * Di), *C = take((size_t)R * Do);
        t0 = clock_now();
        if (split) gemm_rows(false, R, Do, Di, X, Di, W, Do, 0, C, Do);
        else gemm(false, false, R, Do, Di, 1, X, Di, W, Do, 0, C, Do);
    } else if (s->kind == DX) {   // dX (R, Di) = dY (R, Do) W^T, W (Di, Do)
        real *dY = take_made((size_t)R * Do), *dX = take((size_t)R * Di);
        t0 = clock_now();
        if (split) gemm_rows(true, R, Di, Do, dY, Do, W, Do, 0, dX, Di);
        else gemm(false, true, R, Di, Do, 1, dY, Do, W, Do, 0, dX, Di);
    } else {   // dW (Di, Do) = X^T dY
        real *X = take((size_t)R * Di), *dY = take_made((size_t)R * Do), *dW = take((size_t)Di * Do);
        t0 = clock_now();
        if (split) gemm_sum_rows(Di, Do, R, X, Di, dY, Do, 0, dW, Do, part);
        else gemm(true, false, Di, Do, R, 1, X, Di, dY, Do, 0, dW, Do);
    }
    return clock_now() - t0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// GFLOP/s of each column's median product over `rounds` rounds.
static void run_rounds(const Shape *s, int rounds, const bool *on, real *W, real *part, double *gf) {
    double *t = xmalloc((size_t)rounds * COL_COUNT * sizeof(double));
    for (int r = 0; r < rounds; r++)
        for (int c = 0; c < COL_COUNT; c++)
            if (on[c]) t[c * rounds + r] = run_once(s, (Column)c, W, part);
    double flop = 2.0 * s->R * s->in * s->out;
    for (int c = 0; c < COL_COUNT; c++) {
        if (!on[c]) continue;
        qsort(t + c * rounds, rounds, sizeof *t, cmp_double);
        gf[c] = flop / t[c * rounds + rounds / 2] * 1e-9;
    }
    free(t);
}

// The best GFLOP/s of 20 products 2048^3 in column c (one call, or split for bf16).
static double peak(Column c) {
    int n = 2048;
    real *A = xaligned((size_t)n * n * sizeof(real)), *B = xaligned((size_t)n * n * sizeof(real));
    real *C = xaligned((size_t)n * n * sizeof(real));
    for (int i = 0; i < n * n; i++) A[i] = B[i] = (real)((i % 9) * 0.01 - 0.04);
    set_column(c);
    double best = 1e30;
    for (int r = 0; r < 22; r++) {
        double t0 = clock_now();
        if (c == COL_BF16) gemm_rows(false, n, n, n, A, n, B, n, 0, C, n);
        else gemm(false, false, n, n, n, 1, A, n, B, n, 0, C, n);
        double t = clock_now() - t0;
        if (r >= 2 && t < best) best = t;
    }
    free(A);
    free(B);
    free(C);
    return 2.0 * n * n * n / best * 1e-9;
}

static void usage(FILE *f) {
    fprintf(f, "usage: gemm_bench [--rounds N] [--width 128|256|512|all] [--cpu]\n"
               "  GFLOP/s of the dense layers' products on each backend (OpenBLAS, oneDNN, bf16), and the peak;\n"
               "  --cpu: GFLOP per CPU-second of all threads instead (steadier on a loaded machine)\n");
}

int main(int argc, char **argv) {
    if (bench_help(argc, argv, "usage: gemm_bench [ROUNDS]\n  the tiny configs projection products: one threaded OpenBLAS call against the split products matmul\n  runs; GFLOP/s of the median of ROUNDS alternating pairs (default 100)\n")) return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    int rounds = 50, width = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu")) cpu_time = true;
        else if (!strcmp(argv[i], "--width") && i + 1 < argc) {
            i++;
            width = strcmp(argv[i], "all") ? atoi(argv[i]) : 0;
            if (width != 0 && width != 128 && width != 256 && width != 512) {
                usage(stderr);
                return 2;
            }
        } else {
            usage(strcmp(argv[i], "--help") ? stderr : stdout);
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (rounds < 1) {
        usage(stderr);
        return 2;
    }
    char cpu[256], err[256];
    runlog_cpu_name(cpu, sizeof cpu);
    bool on[COL_COUNT] = {true, true, false, false, false};
#ifndef AG_DOUBLE
    on[COL_DN_ONE] = on[COL_DN_SPLIT] = onednn_built();
    on[COL_BF16] = onednn_built() && onednn_has_bf16();
#endif
    blas_select(GEMM_AUTO, PRECISION_FP32, err, sizeof err);
    FILE *la = fopen("/proc/loadavg", "r");
    char load[128] = "?";
    if (la) {
        if (!fgets(load, sizeof load, la)) snprintf(load, sizeof load, "?");
        load[strcspn(load, "\n")] = 0;
        fclose(la);
    }
    printf("cpu: %s\nthreads: %d (omp_get_max_threads)   precision: %s   OpenBLAS core: %s   oneDNN: %s\n"
           "auto would choose: %s\nload average: %s\n",
           cpu, omp_get_max_threads(), REAL_NAME, blas_core_name(), onednn_built() ? onednn_isa_name() : "not built",
           blas_describe(), load);
    printf("%s of the median of %d products each into fresh memory, the columns alternating\n\n",
           cpu_time ? "GFLOP per CPU-second (all threads)" : "GFLOP/s", rounds);
    pool_n = POOL_BYTES / sizeof(real);
    pool = xaligned(POOL_BYTES);
    for (size_t i = 0; i < pool_n; i++) pool[i] = (real)((i % 7) * 0.01);   // touch every page
    // The widths of the bundled configs and their bench variants: D, MLP 8/3 D
    // rounded to 64 (384 at D 128 as the tiny configs have), vocabulary 256.
    const Shape all[] = {
        {"projection", FWD, 4096, 128, 128, 128}, {"MLP up", FWD, 4096, 128, 384, 128}, {"MLP down", FWD, 4096, 384, 128, 128},
        {"lm head", FWD, 4096, 128, 256, 128},    {"dX projection", DX, 4096, 128, 128, 128},
        {"dX MLP up", DX, 4096, 128, 384, 128},   {"dW projection", DW, 4096, 128, 128, 128},
        {"dW MLP up", DW, 4096, 128, 384, 128},

        {"projection", FWD, 4096, 256, 256, 256}, {"MLP up", FWD, 4096, 256, 704, 256}, {"MLP down", FWD, 4096, 704, 256, 256},
        {"lm head", FWD, 4096, 256, 256, 256},    {"dX projection", DX, 4096, 256, 256, 256},
        {"dX MLP up", DX, 4096, 256, 704, 256},   {"dW projection", DW, 4096, 256, 256, 256},
        {"dW MLP up", DW, 4096, 256, 704, 256},

        {"projection", FWD, 4096, 512, 512, 512}, {"MLP up", FWD, 4096, 512, 1408, 512}, {"MLP down", FWD, 4096, 1408, 512, 512},
        {"lm head", FWD, 4096, 512, 256, 512},    {"dX projection", DX, 4096, 512, 512, 512},
        {"dX MLP up", DX, 4096, 512, 1408, 512},  {"dW projection", DW, 4096, 512, 512, 512},
        {"dW MLP up", DW, 4096, 512, 1408, 512},
    };
    int maxw = 1408;
    real *W = xaligned((size_t)maxw * maxw * sizeof(real));
    for (int i = 0; i < maxw * maxw; i++) W[i] = (real)((i % 13) * 0.01 - 0.06);
    real *part = xaligned(((size_t)4096 / 512 + 1) * maxw * maxw * sizeof(real));
    printf("| product | rows x in x out |");
    for (int c = 0; c < COL_COUNT; c++)
        if (on[c]) printf(" %s |", COL_NAMES[c]);
    printf("%s\n", on[COL_DN_SPLIT] ? " onednn / openblas |" : "");
    printf("| --- | --- |");
    for (int c = 0; c < COL_COUNT; c++)
        if (on[c]) printf(" ---: |");
    printf("%s\n", on[COL_DN_SPLIT] ? " ---: |" : "");
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const Shape *s = &all[i];
        if (width && s->d_model != width) continue;
        double gf[COL_COUNT] = {0};
        run_rounds(s, 2, on, W, part, gf);   // warm-up: buffers, thread team, JIT kernels
        run_rounds(s, rounds, on, W, part, gf);
        printf("| %s | %d x %d x %d |", s->name, s->R, s->in, s->out);
        for (int c = 0; c < COL_COUNT; c++)
            if (on[c]) printf(" %.1f |", gf[c]);
        if (on[COL_DN_SPLIT]) printf(" %.2f |", gf[COL_DN_SPLIT] / gf[COL_OB_SPLIT]);
        printf("\n");
    }
    printf("\npeak (best of 20 products 2048 x 2048 x 2048, %s):", cpu_time ? "GFLOP per CPU-second" : "GFLOP/s");
    for (int c = 0; c < COL_COUNT; c++)
        if (on[c] && c != COL_OB_SPLIT && c != COL_DN_SPLIT) printf("  %s %.1f", COL_NAMES[c], peak((Column)c));
    printf("\n");
    free(W);
    free(part);
    free(pool);
    onednn_release();
    return 0;
}
