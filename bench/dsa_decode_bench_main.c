// dsa_decode_bench: decoding time per token against context length for one
// mixer layer: dense `attn`, `attn_dsa` with topk 64 and 256, and `gdn`.
//
//   dsa_decode_bench [--device cpu|cuda | --indexer] [max_ctx=32768] [steps=32]
//
// One layer, d_model 256, H 4, dk = dv 64; the indexer has H_I 4 heads of
// d_I 32. Batch 1. For each context n in 1k, 2k, ..., max_ctx the cache is
// filled to n positions, then `steps` tokens are decoded (after 2 untimed
// warm-up steps) and the mean time per token is printed.
//
// How the cache is filled: attn_cache_prefill (attn_dsa.h) writes the keys,
// values and indexer keys of n random inputs in one parallel projection, as n
// decode steps would, without computing their attention outputs (filling a
// 32k cache token by token costs O(n^2) for attn). Decode time does not depend
// on what the keys are, except the top-k's heap updates (a few percent at
// most). gdn keeps an O(1) state: its cache is not filled (its time per token
// does not depend on n; it is measured at every n as a check).
//
// --indexer times the CPU step's indexer alone: its scores on one thread and
// on the team generate gives long caches, and its top-k.
//
// On a GPU (--device cuda, a build with AG_CUDA) the layer, its cache and
// the step run there; each step's time ends at a device sync.
//
// Per token, attn reads n keys and values (O(n (dk + dv) H)); attn_dsa scores
// n indexer keys (O(n H_I d_I), here half of attn's key reads) plus topk
// selection, then attends to topk positions (O(topk (dk + dv) H)).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

#include "blas.h"
#include "device.h"
#include "bench_util.h"
#include "attn_dsa.h"
#include "attn_kernel.h"
#include "dsa_kernel.h"
#include "mixer.h"
#include "rng.h"
#include "runlog.h"
#include "model_setup.h"

enum { D = 256, H = 4, DK = 64, HI = 4, DI = 32, WARM = 2 };

// Mean seconds per decoded token after a context of n positions.
static double time_decode(const char *kind, int topk, int n, int steps, Rng *r, Device dev) {
    MixerConfig cfg = mixer_config_default(D, H, DK, DK);
    cfg.index_heads = HI;
    cfg.index_dim = DI;
    cfg.topk = topk;
    ParamStore ps;
    params_init(&ps);
    Mixer *m = mixer_create(kind, &cfg, &ps, "bench.");
    params_finalize(&ps, 1);
    if (dev != DEVICE_CPU) params_to_device(&ps, dev);
    void *cache = m->kind->cache_new(m, 1, n + WARM + steps, dev);
    Tape tp;
    tape_init_on(&tp, dev);
    tape_no_grad_push(&tp);
    if (strcmp(kind, "gdn") != 0) {
        real *h = xmalloc((size_t)n * D * sizeof(real));
        for (int64_t i = 0; i < (int64_t)n * D; i++) h[i] = (real)rng_normal(r);
        attn_cache_prefill(&tp, m, cache, tape_tensor_copy(&tp, 3, (int[]){1, n, D}, h));
        free(h);
        tape_reset(&tp);
    }
    real u[D];
    double t0 = 0;
    for (int i = 0; i < WARM + steps; i++) {
        if (i == WARM) {
            dev_sync(dev);
            t0 = runlog_now();
        }
        for (int j = 0; j < D; j++) u[j] = (real)rng_normal(r);
        m->kind->step(&tp, m, cache, tape_tensor_copy(&tp, 3, (int[]){1, 1, D}, u));
        tape_reset(&tp);
    }
    dev_sync(dev);
    double dt = (runlog_now() - t0) / steps;
    tape_free(&tp);
    m->kind->cache_free(cache);
    mixer_destroy(m);
    params_free(&ps);
    return dt;
}

// --indexer: a step's indexer alone over one row of n keys (dsa_index_row, then dsa_topk_row's top-64), best
// of 3 runs of `reps` queries, on one thread and on one thread with attn_decode_set_threads(every core) (generate's
// choice for a small model: its long rows' scores are shared by every core). Indexer keys in [-0.5, 0.5).
static void indexer_bench(int max_ctx, int reps, Rng *r) {
    int all = omp_get_max_threads(), K = 64;
    printf("the step's indexer alone: one row, H_I %d x d_I %d, top-%d; ms per query, best of 3 runs of %d\n\n", HI,
           DI, K, reps);
    printf("%8s | %16s | %16s | %10s\n", "n", "scores 1 thread", "scores decode", "top-k");
    printf("---------+------------------+------------------+-----------\n");
    real q[HI * DI], w[HI];
    for (int i = 0; i < HI * DI; i++) q[i] = (real)rng_normal(r);
    for (int i = 0; i < HI; i++) w[i] = (real)rng_normal(r);
    for (int n = 1024; n <= max_ctx; n *= 2) {
        real *kI = xmalloc((size_t)n * DI * sizeof(real)), *sc = xmalloc((size_t)n * sizeof(real));
        for (int64_t i = 0; i < (int64_t)n * DI; i++) kI[i] = (real)(rng_uniform(r) - 0.5);
        void *work = xmalloc(DSA_TOPK_WORK(n));
        int sel[64];
        double best[3] = {1e30, 1e30, 1e30};
        omp_set_num_threads(1);
        for (int run = 0; run < 3; run++)
            for (int mode = 0; mode < 3; mode++) {
                attn_decode_set_threads(mode == 1 ? all : 0);
                double t0 = runlog_now();
                for (int i = 0; i < reps; i++) {
                    if (mode < 2) dsa_index_row(sc, q, w, kI, DI, n, HI, DI);
                    else dsa_topk_row(sel, sc, n, K, work);
                }
                double dt = (runlog_now() - t0) / reps;
                best[mode] = dt < best[mode] ? dt : best[mode];
            }
        attn_decode_set_threads(0);
        omp_set_num_threads(all);
        printf("%8d | %16.4f | %16.4f | %10.4f\n", n, 1e3 * best[0], 1e3 * best[1], 1e3 * best[2]);
        fflush(stdout);
        free(kI), free(sc), free(work);
    }
}

int main(int argc, char **argv) {
    if (bench_help(argc, argv, "usage: dsa_decode_bench [--device cpu|cuda | --indexer] [MAX_CONTEXT [STEPS]]\n  time per decoded token of one layer (attn, attn_dsa top-64 and top-256, gdn) after contexts of\n  1024, 2048, ... up to MAX_CONTEXT positions (default 32768), STEPS timed steps each (default 32);\n  --indexer: the CPU step's indexer alone (scores on one thread and on the decoding team, top-k)\n")) return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    blas_select_from_env();     // ATTNLAB_GEMM=auto|openblas|onednn (default auto)
    Device dev = DEVICE_CPU;
    bool indexer = argc > 1 && strcmp(argv[1], "--indexer") == 0;
    if (indexer) argv++, argc--;
    else if (argc > 2 && strcmp(argv[1], "--device") == 0) {
        int d = device_parse(argv[2]);
        if (d < 0) {
            fprintf(stderr, "dsa_decode_bench: unknown device '%.64s'\n", argv[2]);
            return 2;
        }
        char err[256];
        if (d == DEVICE_CUDA && !device_cuda_init(err, sizeof err)) {
            fprintf(stderr, "dsa_decode_bench: no GPU: %s\n", err);
            return 2;
        }
        dev = (Device)d;
        argv += 2, argc -= 2;
    }
    int max_ctx = argc > 1 ? atoi(argv[1]) : 32768;
    int steps = argc > 2 ? atoi(argv[2]) : 32;
    char cpu[256];
    runlog_cpu_name(cpu, sizeof cpu);
    struct utsname un;
    uname(&un);
    printf("dsa_decode_bench: %s (%s), %d OpenMP threads, %s, gemm %s, device %s\n", cpu, un.machine,
           omp_get_max_threads(), REAL_NAME, blas_describe(), device_describe(dev));
    Rng r;
    rng_seed(&r, 7);
    if (indexer) {
        indexer_bench(max_ctx, steps, &r);
        return 0;
    }
    printf("one layer, d_model %d, H %d, dk = dv = %d, indexer H_I %d x d_I %d, batch 1, %d steps after %d warm-up\n",
           D, H, DK, HI, DI, steps, WARM);
    printf("time per decoded token (ms) after a context of n positions (cache prefilled, see the source)\n\n");
    printf("%8s | %10s | %14s | %15s | %10s\n", "n", "attn", "attn_dsa k=64", "attn_dsa k=256", "gdn");
    printf("---------+------------+----------------+-----------------+-----------\n");
    for (int n = 1024; n <= max_ctx; n *= 2) {
        double a = time_decode("attn", 64, n, steps, &r, dev);
        double s64 = time_decode("attn_dsa", 64, n, steps, &r, dev);
        double s256 = time_decode("attn_dsa", 256, n, steps, &r, dev);
        double g = time_decode("gdn", 64, n, steps, &r, dev);
        printf("%8d | %10.4f | %14.4f | %15.4f | %10.4f\n", n, 1e3 * a, 1e3 * s64, 1e3 * s256, 1e3 * g);
        fflush(stdout);
    }
    return 0;
}
