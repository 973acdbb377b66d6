// attn_tiles_bench: the attention op (op_attention, forward + backward) on
// each kind of tile products (tile_amx.h), A/B in one process:
//
//   attn_tiles_bench [B=16] [T=256] [H=4] [D=64] [ROUNDS=15] [KINDS=fp32,avx512bf16,amx]
//
//   fp32        precision = fp32: the float32 tiles (tile_mm.h);
//   avx512bf16  precision = bf16, bf16_tiles = avx512bf16 (vdpbf16ps);
//   amx         precision = bf16, bf16_tiles = amx (tdpbf16ps), where the
//               CPU has AMX-BF16 (else skipped, with the reason).
// Each round runs every kind once, forward alone then forward + backward,
// in an order that rotates from round to round, so that load from elsewhere
// (a shared machine) falls on all alike. Printed: the median over the rounds
// of the CPU time of the process (all threads) and of the wall time, in ms,
// and each kind's CPU time over fp32's (when fp32 ran). KINDS: a comma list
// of the kinds to run (e.g. amx alone, under perf). Threads: OMP_NUM_THREADS.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernel.h"
#include "bench_util.h"
#include "blas.h"
#include "model_setup.h"
#include "rng.h"
#include "runlog.h"
#include "tile_amx.h"

enum { KINDS = 3, PARTS = 2 };   // fp32, avx512bf16, amx; forward, forward + backward

static const Bf16Tiles KIND_TILES[KINDS] = {BF16_TILES_FP32, BF16_TILES_AVX512BF16, BF16_TILES_AMX};

static bool use_kind(int k, char *err, size_t n) {
    return blas_select(blas_backend, k ? PRECISION_BF16 : PRECISION_FP32, err, n) &&
           bf16_tiles_select(k ? KIND_TILES[k] : BF16_TILES_AUTO, err, n);
}

// One forward (no grad) and one forward + backward of kind k: CPU and wall
// seconds of each into cpu[part], wall[part].
static void time_kind(Tape *tp, Tensor *q, Tensor *k, Tensor *v, const real *seed, int H, double scale,
                      double cpu[PARTS], double wall[PARTS]) {
    for (int part = 0; part < PARTS; part++) {
        double c0 = runlog_cpu_now(), w0 = runlog_now();
        if (part == 0) tape_no_grad_push(tp);
        Tensor *o = op_attention(tp, q, k, v, H, scale, NULL);
        if (part == 1) tape_backward_from(tp, o, seed);
        cpu[part] = runlog_cpu_now() - c0, wall[part] = runlog_now() - w0;
        tape_reset(tp);
        if (part == 0) tape_no_grad_pop(tp);
    }
}

static int arg(int argc, char **argv, int i, int def, int lo, int hi, const char *name) {
    return bench_int_arg("attn_tiles_bench", argc, argv, i, def, lo, hi, name);
}

int main(int argc, char **argv) {
    if (bench_help(argc, argv,
                   "usage: attn_tiles_bench [B=16] [T=256] [H=4] [D=64] [ROUNDS=15] [KINDS=fp32,avx512bf16,amx]\n"
                   "  the attention op's forward and forward + backward on float32, AVX512_BF16 and AMX tiles,\n"
                   "  alternating; medians of CPU and wall time (threads: OMP_NUM_THREADS)\n"))
        return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    blas_select_from_env();
    int B = arg(argc, argv, 1, 16, 1, 4096, "B"), T = arg(argc, argv, 2, 256, 1, 65536, "T");
    int H = arg(argc, argv, 3, 4, 1, 256, "H"), D = arg(argc, argv, 4, 64, 2, 512, "D");
    int rounds = arg(argc, argv, 5, 15, 1, 1000, "ROUNDS");
    char err[256], why[200], names[KINDS][16];
    bool want[KINDS] = {argc <= 6, argc <= 6, argc <= 6};
    for (int i = 0, n = argc > 6 ? bench_parse_names(argv[6], names, KINDS) : 0; i < n; i++) {
        int k = bf16_tiles_parse(names[i]);
        if (k < 0 || k == BF16_TILES_AUTO) {
            fprintf(stderr, "attn_tiles_bench: KINDS: '%s' is not one of fp32, avx512bf16, amx\n", names[i]);
            return 2;
        }
        want[k == BF16_TILES_FP32 ? 0 : k == BF16_TILES_AVX512BF16 ? 1 : 2] = true;
    }
    bool have[KINDS] = {want[0], want[1] && use_kind(1, err, sizeof err), want[2] && use_kind(2, why, sizeof why)};
    if (want[1] && !have[1]) {
        fprintf(stderr, "attn_tiles_bench: no bf16 tiles here: %s\n", err);
        return 2;
    }
    char cpu[256];
    runlog_cpu_name(cpu, sizeof cpu);
    printf("attn_tiles_bench: %s, %d OpenMP threads, B %d, T %d, H %d, dk = dv = %d, tiles %d x %d, %d rounds\n",
           cpu, omp_get_max_threads(), B, T, H, D, ATTN_TILE_Q, ATTN_TILE_K, rounds);
    if (want[2] && !have[2]) printf("amx: not timed: %s\n", why);
    Rng rng;
    rng_seed(&rng, 1);
    Tensor *q = tensor_newv(true, 3, B, T, H * D), *k = tensor_newv(true, 3, B, T, H * D);
    Tensor *v = tensor_newv(true, 3, B, T, H * D);
    Tensor *in[3] = {q, k, v};
    for (int i = 0; i < 3; i++)
        for (int64_t j = 0; j < in[i]->numel; j++) in[i]->data[j] = (real)rng_normal(&rng);
    real *seed = xmalloc((size_t)v->numel * sizeof(real));
    for (int64_t j = 0; j < v->numel; j++) seed[j] = (real)rng_normal(&rng);
    double scale = 1.0 / sqrt(D), *c[KINDS][PARTS], *w[KINDS][PARTS];
    for (int i = 0; i < KINDS; i++)
        for (int p = 0; p < PARTS; p++)
            c[i][p] = xmalloc((size_t)rounds * sizeof(double)), w[i][p] = xmalloc((size_t)rounds * sizeof(double));
    Tape tp;
    tape_init(&tp);
    for (int r = -1; r < rounds; r++)   // round -1 warms every kind up (arena, thread team), untimed
        for (int j = 0; j < KINDS; j++) {
            int kind = (j + (r < 0 ? 0 : r)) % KINDS;
            if (!have[kind]) continue;
            if (!use_kind(kind, err, sizeof err)) {
                fprintf(stderr, "attn_tiles_bench: %s\n", err);
                return 1;
            }
            double cs[PARTS], ws[PARTS];
            time_kind(&tp, q, k, v, seed, H, scale, cs, ws);
            for (int p = 0; r >= 0 && p < PARTS; p++) c[kind][p][r] = cs[p], w[kind][p][r] = ws[p];
        }
    double flop[PARTS] = {2.0 * B * H * (double)T * T * D, 7.0 * B * H * (double)T * T * D};   // causal half
    printf("| tiles | fwd CPU ms | fwd wall ms | fwd+bwd CPU ms | fwd+bwd wall ms | fwd+bwd GFLOP/s (wall) | "
           "CPU time / fp32's (fwd, fwd+bwd) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    double base[PARTS] = {0};
    for (int kind = 0; kind < KINDS; kind++) {
        if (!have[kind]) continue;
        double mc[PARTS], mw[PARTS];
        for (int p = 0; p < PARTS; p++) mc[p] = bench_median(c[kind][p], rounds), mw[p] = bench_median(w[kind][p], rounds);
        if (kind == 0) base[0] = mc[0], base[1] = mc[1];
        char rel[48] = "-";
        if (have[0]) snprintf(rel, sizeof rel, "%.2f, %.2f", mc[0] / base[0], mc[1] / base[1]);
        printf("| %s | %.2f | %.2f | %.2f | %.2f | %.1f | %s |\n", kind ? bf16_tiles_name(KIND_TILES[kind]) : "fp32",
               1e3 * mc[0], 1e3 * mw[0], 1e3 * mc[1], 1e3 * mw[1], flop[1] / mw[1] * 1e-9, rel);
    }
    printf("GFLOP/s: the causal half, 2 T^2 D per head forward and 5 T^2 D backward\n");
    for (int i = 0; i < KINDS; i++)
        for (int p = 0; p < PARTS; p++) free(c[i][p]), free(w[i][p]);
    tape_free(&tp);
    free(seed);
    for (int i = 0; i < 3; i++) tensor_free(in[i]);
    return 0;
}
