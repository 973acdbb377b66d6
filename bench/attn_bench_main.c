// attn_bench: timing of the causal softmax attention kernel (op_attention) at
// growing sequence length with the number of tokens per step fixed.
//
//   attn_bench [tokens=16384] [H=4] [d=64] [reps=1] [max_T=16384]
//
// For T in 256, 1024, 4096, 16384 (B = tokens / T): the forward alone (no
// grad), forward + backward, and one decoding step at a full cache (B
// queries, each over T cached keys). Then the DeepSeek sparse pieces:
// op_sparse_attention forward + backward with K = 256 selected positions per
// query (a sliding window here: the cost does not depend on which), and the
// indexer's fused scoring + top-k (dsa_index_select, H_I = 4, d_I = 32). GFLOP/s counts the causal half only:
// 2 T^2 d per head for the forward (QK^T and PV), 5 T^2 d for the backward.
// The projections (u Wq, ...) are not included: their cost per token does not
// depend on T. Each figure is the best of `reps` runs after one warm-up (the
// best, not the mean: on a shared machine the noise only ever adds time).
// max_T stops the sweep early (e.g. `attn_bench 4096 4 32 20 256` times the
// tiny configs' attention, B 16, T 256, alone). PRECISION bf16 also times
// the flash kernel with its tile products in bf16 ([train] precision = bf16),
// alternating with float32 round by round, and prints both (needs AVX512_BF16).
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "blas.h"
#include "bench_util.h"
#include "attn_kernel.h"
#include "dsa_kernel.h"
#include "rng.h"
#include "runlog.h"
#include "model_setup.h"

static void fill(Tensor *t, Rng *r) {
    for (int64_t i = 0; i < t->numel; i++) t->data[i] = (real)rng_normal(r);
}

// The flash kernel's best forward (no grad) and forward + backward times of
// `reps` rounds after a warm-up, into best[0], best[1]; with bf16 each round
// also times bf16 tile products, into best[2], best[3].
static void time_flash(Tape *tp, Tensor *q, Tensor *k, Tensor *v, const real *seed, int H, double scale, int reps,
                       bool bf16, GemmBackend backend, double best[4]) {
    double fwd = INFINITY, fb = INFINITY, fwd_h = INFINITY, fb_h = INFINITY, t0;
    char err[256];
    for (int p = 0; p <= (int)bf16; p++) {   // warm-up
        blas_select(backend, p ? PRECISION_BF16 : PRECISION_FP32, err, sizeof err);
        tape_no_grad_push(tp);
        op_attention(tp, q, k, v, H, scale, NULL);
        tape_reset(tp);
        tape_no_grad_pop(tp);
    }
    for (int r = 0; r < reps; r++)
        for (int p = 0; p <= (int)bf16; p++) {
            blas_select(backend, p ? PRECISION_BF16 : PRECISION_FP32, err, sizeof err);
            tape_no_grad_push(tp);
            t0 = runlog_now();
            op_attention(tp, q, k, v, H, scale, NULL);
            double dt = runlog_now() - t0;
            *(p ? &fwd_h : &fwd) = fmin(p ? fwd_h : fwd, dt);
            tape_reset(tp);
            tape_no_grad_pop(tp);
            t0 = runlog_now();
            Tensor *o = op_attention(tp, q, k, v, H, scale, NULL);
            tape_backward_from(tp, o, seed);
            dt = runlog_now() - t0;
            *(p ? &fb_h : &fb) = fmin(p ? fb_h : fb, dt);
            tape_reset(tp);
        }
    blas_select(backend, PRECISION_FP32, err, sizeof err);
    best[0] = fwd, best[1] = fb, best[2] = fwd_h, best[3] = fb_h;
}

int main(int argc, char **argv) {
    if (bench_help(argc, argv, "usage: attn_bench [TOKENS [HEADS [HEAD_DIM [REPS [MAX_T [PRECISION]]]]]]\n  flash attention forward and forward+backward, decoding and sparse attention at T = 256 ... MAX_T\n  (default 16384), TOKENS = B x T per step (default 16384), HEADS (4), HEAD_DIM (64), best of REPS (1);\n  PRECISION bf16: the flash kernel with bf16 tile products too, alternating with fp32 (default fp32 only)\n")) return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    blas_select_from_env();     // ATTNLAB_GEMM=auto|openblas|onednn (default auto)
    int tokens = argc > 1 ? atoi(argv[1]) : 16384;
    int H = argc > 2 ? atoi(argv[2]) : 4;
    int d = argc > 3 ? atoi(argv[3]) : 64;
    int reps = argc > 4 ? imax(1, atoi(argv[4])) : 1;
    int max_T = argc > 5 ? atoi(argv[5]) : 16384;
    bool bf16 = argc > 6 && strcmp(argv[6], "bf16") == 0;
    if (argc > 6 && !bf16 && strcmp(argv[6], "fp32") != 0) {
        fprintf(stderr, "attn_bench: PRECISION must be fp32 or bf16, not '%s'\n", argv[6]);
        return 2;
    }
    GemmBackend backend = blas_backend;
    char err[256];
    if (bf16 && !blas_select(backend, PRECISION_BF16, err, sizeof err)) {
        fprintf(stderr, "attn_bench: %s\n", err);
        return 2;
    }
    if (bf16 && !attn_tiles_bf16(d, d, ATTN_TILE_Q, ATTN_TILE_K)) {
        fprintf(stderr, "attn_bench: this build's attention tiles have no bf16 products (AG_NATIVE=OFF?)\n");
        return 2;
    }
    if (bf16) blas_select(backend, PRECISION_FP32, err, sizeof err);
    char cpu[256];
    runlog_cpu_name(cpu, sizeof cpu);
    printf("attn_bench: %s, %d OpenMP threads, %s, tokens per step %d, H %d, dk = dv = %d, tiles %d x %d, "
           "best of %d\n", cpu, omp_get_max_threads(), REAL_NAME, tokens, H, d, ATTN_TILE_Q, ATTN_TILE_K, reps);
    printf("gemm: %s\n", blas_describe());
    printf("%7s %4s | %10s %8s | %10s %8s | %12s %10s | %14s %12s", "T", "B", "fwd ms", "GFLOP/s",
           "fwd+bwd ms", "GFLOP/s", "decode us", "tok/s", "sparse f+b ms", "index ms");
    if (bf16) printf(" | %12s %8s %14s %8s", "bf16 fwd ms", "GFLOP/s", "bf16 f+b ms", "GFLOP/s");
    printf("\n");
    const int K = 256, HI = 4, dI = 32;
    const int Ts[] = {256, 1024, 4096, 16384};
    double scale = 1.0 / sqrt(d);
    Rng rng;
    rng_seed(&rng, 1);
    Tape tp;
    tape_init(&tp);
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
        int T = Ts[i], B = tokens / T;
        if (B < 1 || T > max_T) continue;
        Tensor *q = tensor_newv(true, 3, B, T, H * d), *k = tensor_newv(true, 3, B, T, H * d);
        Tensor *v = tensor_newv(true, 3, B, T, H * d);
        fill(q, &rng);
        fill(k, &rng);
        fill(v, &rng);
        real *seed = xmalloc((size_t)v->numel * sizeof(real));
        for (int64_t j = 0; j < v->numel; j++) seed[j] = (real)rng_normal(&rng);
        double flop_fwd = 2.0 * B * H * (double)T * T * d, flop_bwd = 2.5 * flop_fwd;

        // Forward only (no saved state), after a warm-up; then forward +
        // backward. With bf16, each round times float32, then bf16.
        double best[4];   // fwd, fwd+bwd; then the same in bf16
        time_flash(&tp, q, k, v, seed, H, scale, reps, bf16, backend, best);
        double fwd = best[0], fb = best[1], fwd_h = best[2], fb_h = best[3], t0;
        Tensor *o;

        // Decoding: B queries over a full cache of T keys (the k, v above).
        real *qrow = xmalloc((size_t)B * H * d * sizeof(real)), *orow = xmalloc((size_t)B * H * d * sizeof(real));
        for (int64_t j = 0; j < (int64_t)B * H * d; j++) qrow[j] = (real)rng_normal(&rng);
        int steps = 20;
        attn_decode_forward(orow, qrow, k->data, v->data, B, T, T, NULL, H, d, d, scale);
        t0 = runlog_now();
        for (int s = 0; s < steps; s++)
            attn_decode_forward(orow, qrow, k->data, v->data, B, T, T, NULL, H, d, d, scale);
        double dec = (runlog_now() - t0) / steps;

        // Sparse attention over K positions per query, forward + backward.
        int *sel = xmalloc((size_t)B * T * K * sizeof(int));
        for (int64_t r = 0; r < (int64_t)B * T; r++) {
            int t = (int)(r % T), s0 = imax(0, t + 1 - K);
            for (int j = 0; j < K; j++) sel[r * K + j] = s0 + j <= t ? s0 + j : -1;
        }
        t0 = runlog_now();
        o = op_sparse_attention(&tp, q, k, v, sel, K, H, scale);
        tape_backward_from(&tp, o, seed);
        double sp = runlog_now() - t0;
        tape_reset(&tp);

        // The indexer: scores and top-K selection, tile by tile.
        Tensor *qI = tensor_newv(false, 3, B, T, HI * dI), *kI = tensor_newv(false, 3, B, T, dI);
        Tensor *wI = tensor_newv(false, 3, B, T, HI);
        fill(qI, &rng);
        fill(kI, &rng);
        fill(wI, &rng);
        t0 = runlog_now();
        dsa_index_select(sel, qI->data, kI->data, wI->data, B, T, HI, dI, K, NULL);
        double ix = runlog_now() - t0;

        printf("%7d %4d | %10.1f %8.1f | %10.1f %8.1f | %12.1f %10.0f | %14.1f %12.1f", T, B, 1e3 * fwd,
               flop_fwd / fwd / 1e9, 1e3 * fb, (flop_fwd + flop_bwd) / fb / 1e9, 1e6 * dec, B / dec, 1e3 * sp,
               1e3 * ix);
        if (bf16)
            printf(" | %12.1f %8.1f %14.1f %8.1f", 1e3 * fwd_h, flop_fwd / fwd_h / 1e9, 1e3 * fb_h,
                   (flop_fwd + flop_bwd) / fb_h / 1e9);
        printf("\n");
        free(sel);
        tensor_free(qI);
        tensor_free(kI);
        tensor_free(wI);
        fflush(stdout);
        free(qrow);
        free(orow);
        free(seed);
        tensor_free(q);
        tensor_free(k);
        tensor_free(v);
    }
    tape_free(&tp);
    printf("decode: one step for all B sequences at position T (cache full); tok/s = B / step time\n");
    return 0;
}
