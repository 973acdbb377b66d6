// tile_bench: the chunk kernels' small products on one thread, float32
// against bf16 (tile_mm.h, tile_mm_bf16.h), at the chunk shapes of the
// bundled configs (chunk 64, heads of 32) and of the d_model 256 / 512
// variants (heads of 64).
//
//   tile_bench [ROUNDS=15]
//
// For each shape, three ways of forming C (M x N) = A (M x K) B (K x N):
//   fp32        tile_gemm: float32 operands read in place;
//   bf16        tile_gemm_rows_bf16: both operands rounded into bf16 pairs
//               (the packing the gla / GDN kernels pay per product), then
//               vdpbf16ps with float32 sums;
//   bf16 kernel the kernel alone on operands packed once, outside the timing
//               (as pairs of a row-major A and B: for the transposed shapes
//               the same sizes, without the transpose);
//   amx kernel  the same on AMX tiles (tile_amx.h: amx_mm_bf16_band, the
//               attention's products under bf16_tiles = amx), where the CPU
//               has AMX-BF16 (else "-").
// Each figure is the median over ROUNDS rounds of GFLOP/s (2 M N K per
// product), a round being enough repetitions for ~20 ms; the three ways
// alternate within a round, so a burst of load elsewhere hits them alike.
// Compare them as ratios. One thread: the kernels run one product per
// thread, each (batch, head) on its own.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "model_setup.h"
#include "rng.h"
#include "runlog.h"
#include "tile_mm.h"
#include "tile_amx.h"
#include "tile_mm_bf16.h"

#ifdef AG_TILE_BF16
typedef struct Shape {
    const char *what;
    int M, N, K;
    bool ta, tb;   // A stored transposed (K x M), B stored transposed (N x K)
} Shape;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { WAYS = 4 };   // fp32, bf16, bf16 kernel, amx kernel

// Seconds per product of way w, over reps products.
static double run_way(int w, const Shape *s, int reps, const float *A, const float *B, float *C, float *pack,
                      bfpair *pa, bfpair *pb, const bfpair *qa, const bfpair *qb) {
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N, KP = (s->K + 1) / 2;
    if (w == 3) amx_tiles_begin();
    double t0 = runlog_now();
    for (int r = 0; r < reps; r++) {
        if (w == 0)
            tile_gemm(s->ta, s->tb, s->M, s->N, s->K, 1, A, lda, B, ldb, 0, C, s->N, TILE_FULL(s->M, s->K), pack);
        else if (w == 1)
            tile_gemm_rows_bf16(s->ta, s->tb, false, s->M, s->N, s->K, 1, NULL, A, lda, B, ldb, 0, C, s->N,
                                TILE_FULL(s->M, s->K), pa, pb);
        else if (w == 2)
            tile_mm_bf16_band(s->M, s->N, s->K, TILE_FULL(s->M, s->K), 1, qa, KP, 1, qb, s->N, C, s->N, false);
        else
            tile_mm_bf16_band_on(true, s->M, s->N, s->K, TILE_FULL(s->M, s->K), 1, qa, KP, 1, qb, s->N, C, s->N,
                                 false);
        __asm__ volatile("" : : "r"(C) : "memory");
    }
    double t = (runlog_now() - t0) / reps;
    if (w == 3) amx_tiles_end();
    return t;
}
#endif

int main(int argc, char **argv) {
    if (bench_help(argc, argv,
                   "usage: tile_bench [ROUNDS=15]\n"
                   "  GFLOP/s of the chunk kernels' small products on one thread: float32 tile_gemm against\n"
                   "  bf16 tile_gemm_rows_bf16 (operands rounded inside) and its kernel on packed operands,\n"
                   "  on AVX512_BF16 and on AMX\n"))
        return 0;
    model_init_process(argv);
    int rounds = argc > 1 ? atoi(argv[1]) : 15;
    if (rounds < 1 || rounds > 1000) {
        fprintf(stderr, "tile_bench: ROUNDS must be 1 .. 1000, not '%s'\n", argv[1]);
        return 2;
    }
#ifndef AG_TILE_BF16
    printf("tile_bench: this build has no bf16 tile products (float64, or no AVX512_BF16 target)\n");
    return 0;
#else
    char cpu[256];
    runlog_cpu_name(cpu, sizeof cpu);
    printf("cpu: %s\nthreads: 1 (each product on one thread, as in the kernels)\n", cpu);
    printf("GFLOP/s, median of %d rounds, the three ways alternating within each round\n\n", rounds);
    static const Shape shapes[] = {
        {"L x dv x L, chunk 64, head 32 (A V, Tm R)", 64, 32, 64, false, false},
        {"L x L x dk, head 32 (Q K^T via K^T)", 64, 64, 32, false, false},
        {"dk x dv x L, head 32 (K^T V, A transposed)", 32, 32, 64, true, false},
        {"L x dk x dv, head 32 (dO S^T, B transposed)", 64, 32, 32, false, true},
        {"L x dv x L, chunk 64, head 64", 64, 64, 64, false, false},
        {"dk x dv x L, head 64 (A transposed)", 64, 64, 64, true, false},
        {"L x dk x dv, head 64 (B transposed)", 64, 64, 64, false, true},
    };
    size_t big = 64 * 64;
    float *A = xaligned(big * sizeof(float)), *B = xaligned(big * sizeof(float)), *C = xaligned(big * sizeof(float));
    float *pack = xaligned(big * sizeof(float));
    bfpair *pa = xaligned(big * sizeof(bfpair)), *pb = xaligned(big * sizeof(bfpair));
    bfpair *qa = xaligned(big * sizeof(bfpair)), *qb = xaligned(big * sizeof(bfpair));
    Rng rng;
    rng_seed(&rng, 7);
    for (size_t i = 0; i < big; i++) A[i] = (float)rng_normal(&rng), B[i] = (float)rng_normal(&rng);
    char why[200];
    bool amx = amx_bf16_usable(why, sizeof why);
    if (!amx) printf("amx kernel: not timed: %s\n\n", why);
    printf("| product | M x N x K | fp32 | bf16 | bf16 kernel | amx kernel | bf16 / fp32 | amx / bf16 kernel |\n"
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const Shape *s = &shapes[si];
        // The kernel-only way's operands, packed once: A row-major pairs, B pairs across rows.
        pack_pair_rows(qa, (s->K + 1) / 2, A, s->K, s->M, s->K);
        pack_pair_cols(qb, s->N, B, s->N, 0, s->K, s->N);
        double flop = 2.0 * s->M * s->N * s->K, per = run_way(0, s, 200, A, B, C, pack, pa, pb, qa, qb);
        int reps = per > 0 ? (int)(0.02 / (3 * per)) + 1 : 1000;
        double *g = xmalloc((size_t)rounds * WAYS * sizeof(double));
        for (int r = 0; r < rounds; r++)
            for (int w = 0; w < WAYS - !amx; w++)
                g[w * rounds + r] = flop / run_way(w, s, reps, A, B, C, pack, pa, pb, qa, qb) * 1e-9;
        double med[WAYS] = {0};
        for (int w = 0; w < WAYS - !amx; w++) {
            qsort(g + w * rounds, rounds, sizeof *g, cmp_double);
            med[w] = g[w * rounds + rounds / 2];
        }
        char ax[32] = "-", ar[32] = "-";
        if (amx) snprintf(ax, sizeof ax, "%.1f", med[3]), snprintf(ar, sizeof ar, "%.2f", med[3] / med[2]);
        printf("| %s | %d x %d x %d | %.1f | %.1f | %.1f | %s | %.2f | %s |\n", s->what, s->M, s->N, s->K, med[0],
               med[1], med[2], ax, med[1] / med[0], ar);
        free(g);
    }
    free(A), free(B), free(C), free(pack), free(pa), free(pb), free(qa), free(qb);
    return 0;
#endif
}
