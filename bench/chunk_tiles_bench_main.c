// chunk_tiles_bench: the chunked gdn, gla and kda ops (op_gdn, op_gla, op_kda;
// forward + backward) with their chunk products of each kind, A/B in one process:
//
//   chunk_tiles_bench [B=16] [T=256] [H=4] [D=64] [C=64] [ROUNDS=11]
//
//   fp32        precision = fp32: the float32 tiles (tile_mm.h);
//   avx512bf16  precision = bf16, bf16_tiles = avx512bf16 (vdpbf16ps);
//   amx         precision = bf16, bf16_tiles = amx (tdpbf16ps), where the
//               CPU has AMX-BF16 (else skipped, with the reason).
// Each round runs every kind once per op, in an order that rotates from
// round to round, so that load from elsewhere falls on all alike. Printed:
// the median over the rounds of the CPU time of the process (all threads)
// and of the wall time, in ms, and each kind's CPU time over fp32's.
// Threads: OMP_NUM_THREADS.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "blas.h"
#include "gdn_kernel.h"
#include "gla.h"
#include "kda_kernel.h"
#include "model_setup.h"
#include "rng.h"
#include "runlog.h"
#include "tile_amx.h"

enum { KINDS = 3, OPS = 3 };   // fp32, avx512bf16, amx; gdn, gla, kda

static const Bf16Tiles KIND_TILES[KINDS] = {BF16_TILES_FP32, BF16_TILES_AVX512BF16, BF16_TILES_AMX};
static const char *const OP_NAMES[OPS] = {"gdn", "gla", "kda"};

static bool use_kind(int k, char *err, size_t n) {
    return blas_select(blas_backend, k ? PRECISION_BF16 : PRECISION_FP32, err, n) &&
           bf16_tiles_select(k ? KIND_TILES[k] : BF16_TILES_AUTO, err, n);
}

typedef struct {
    int H, C;
    Tensor *q, *k, *v, *beta, *g, *gk;   // gk: kda's log decay per key channel
    real *seed;
} Inputs;

// A tensor of shape (B, T, F) with normal entries times scale plus shift.
static Tensor *filled(Rng *rng, int B, int T, int F, double scale, double shift) {
    Tensor *t = tensor_newv(true, 3, B, T, F);
    for (int64_t j = 0; j < t->numel; j++) t->data[j] = (real)(shift + scale * rng_normal(rng));
    return t;
}

// One forward + backward of op: CPU and wall seconds.
static void time_op(Tape *tp, const Inputs *x, int op, double *cpu, double *wall) {
    double c0 = runlog_cpu_now(), w0 = runlog_now();
    Tensor *o = op == 0 ? op_gdn(tp, x->q, x->k, x->v, x->beta, x->g, NULL, NULL, x->H, MIXER_FORM_CHUNKED, x->C, NULL)
                : op == 1 ? op_gla(tp, x->q, x->k, x->v, x->g, NULL, NULL, x->H, MIXER_FORM_CHUNKED, x->C, NULL)
                          : op_kda(tp, x->q, x->k, x->v, x->beta, x->gk, NULL, NULL, x->H, MIXER_FORM_CHUNKED, x->C,
                                   NULL);
    tape_backward_from(tp, o, x->seed);
    *cpu = runlog_cpu_now() - c0, *wall = runlog_now() - w0;
    tape_reset(tp);
}

// The machine's load, /proc/loadavg's first three fields ("?" elsewhere).
static void print_load(const char *when) {
    double l[3] = {-1, -1, -1};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &l[0], &l[1], &l[2]) != 3) l[0] = -1;
        fclose(f);
    }
    if (l[0] < 0) printf("load average %s: ?\n", when);
    else printf("load average %s: %.2f %.2f %.2f\n", when, l[0], l[1], l[2]);
}

static int arg(int argc, char **argv, int i, int def, int lo, int hi, const char *name) {
    return bench_int_arg("chunk_tiles_bench", argc, argv, i, def, lo, hi, name);
}

int main(int argc, char **argv) {
    if (bench_help(argc, argv,
                   "usage: chunk_tiles_bench [B=16] [T=256] [H=4] [D=64] [C=64] [ROUNDS=11]\n"
                   "  the chunked gdn, gla and kda ops, forward + backward, with float32, AVX512_BF16 and AMX chunk\n"
                   "  products, alternating; medians of CPU and wall time (threads: OMP_NUM_THREADS)\n"))
        return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    blas_select_from_env();
    int B = arg(argc, argv, 1, 16, 1, 4096, "B"), T = arg(argc, argv, 2, 256, 1, 65536, "T");
    int H = arg(argc, argv, 3, 4, 1, 256, "H"), D = arg(argc, argv, 4, 64, 2, 512, "D");
    int C = arg(argc, argv, 5, 64, 1, 512, "C"), rounds = arg(argc, argv, 6, 11, 1, 1000, "ROUNDS");
    char err[256], why[200];
    bool have[KINDS] = {true, use_kind(1, err, sizeof err), use_kind(2, why, sizeof why)};
    if (!have[1]) {
        fprintf(stderr, "chunk_tiles_bench: no bf16 tiles here: %s\n", err);
        return 2;
    }
    char cpu[256];
    runlog_cpu_name(cpu, sizeof cpu);
    printf("chunk_tiles_bench: %s, %d OpenMP threads, B %d, T %d, H %d, dk = dv = %d, chunk %d, %d rounds\n", cpu,
           omp_get_max_threads(), B, T, H, D, C, rounds);
    print_load("at start");
    if (!have[2]) printf("amx: not timed: %s\n", why);
    Rng rng;
    rng_seed(&rng, 1);
    double ks = 1.0 / sqrt(D);   // keys of norm about 1, as the delta rule wants them
    Inputs x = {H, C, filled(&rng, B, T, H * D, ks, 0), filled(&rng, B, T, H * D, ks, 0),
                filled(&rng, B, T, H * D, 1, 0), filled(&rng, B, T, H, 0.1, 0.5), filled(&rng, B, T, H, 0.02, -0.05),
                filled(&rng, B, T, H * D, 0.02, -0.05), NULL};
    x.seed = xmalloc((size_t)x.v->numel * sizeof(real));
    for (int64_t j = 0; j < x.v->numel; j++) x.seed[j] = (real)rng_normal(&rng);
    double *c[OPS][KINDS], *w[OPS][KINDS];
    for (int o = 0; o < OPS; o++)
        for (int i = 0; i < KINDS; i++)
            c[o][i] = xmalloc((size_t)rounds * sizeof(double)), w[o][i] = xmalloc((size_t)rounds * sizeof(double));
    Tape tp;
    tape_init(&tp);
    for (int r = -1; r < rounds; r++)   // round -1 warms every kind up (arena, thread team), untimed
        for (int op = 0; op < OPS; op++)
            for (int j = 0; j < KINDS; j++) {
                int kind = (j + (r < 0 ? 0 : r)) % KINDS;
                if (!have[kind]) continue;
                if (!use_kind(kind, err, sizeof err)) {
                    fprintf(stderr, "chunk_tiles_bench: %s\n", err);
                    return 1;
                }
                double cs, ws;
                time_op(&tp, &x, op, &cs, &ws);
                if (r >= 0) c[op][kind][r] = cs, w[op][kind][r] = ws;
            }
    printf("| op | products | fwd+bwd CPU ms | fwd+bwd wall ms | CPU time / fp32's |\n"
           "| --- | --- | ---: | ---: | ---: |\n");
    for (int op = 0; op < OPS; op++) {
        double base = bench_median(c[op][0], rounds);
        for (int kind = 0; kind < KINDS; kind++) {
            if (!have[kind]) continue;
            double mc = bench_median(c[op][kind], rounds), mw = bench_median(w[op][kind], rounds);
            const char *name = kind ? bf16_tiles_name(KIND_TILES[kind]) : "fp32";
            printf("| %s | %s | %.2f | %.2f | %.2f |\n", OP_NAMES[op], name, 1e3 * mc, 1e3 * mw, mc / base);
        }
    }
    print_load("at end");
    for (int o = 0; o < OPS; o++)
        for (int i = 0; i < KINDS; i++) free(c[o][i]), free(w[o][i]);
    tape_free(&tp);
    free(x.seed);
    Tensor *in[6] = {x.q, x.k, x.v, x.beta, x.g, x.gk};
    for (int i = 0; i < 6; i++) tensor_free(in[i]);
    return 0;
}
