// gdn_bench: the Gated DeltaNet kernel (op_gdn) on this machine.
//
//   gdn_bench [tokens]    (default 16384 tokens per measurement, B*T fixed)
//
// 1. forward+backward time per token vs T, chunked (C = 64) and recurrent;
// 2. the chunked form at chunk sizes 16, 32, 64, 128;
// 3. peak tape memory of one training step vs T (B = 1): the arena's
//    high-water mark and, inside it, the saved chunk-entry states;
// 4. GFLOP/s of the chunked forward (its matrix products counted) next to
//    one big sgemm on all threads and a 64 x 64 x 64 sgemm on one thread.
// H = 4, dk = dv = 64 throughout.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "blas.h"
#include "gdn_kernel.h"
#include "runlog.h"
#include "model_setup.h"

enum { H = 4, DK = 64, DV = 64 };

typedef struct Inputs {
    int B, T;
    Tensor *q, *k, *v, *beta, *g;   // (B, T, H*dk), (B, T, H*dk), (B, T, H*dv), (B, T, H), (B, T, H)
    Tensor *dO;                     // (B, T, H*dv) the seed of the backward
} Inputs;

static void normalise_heads(Tensor *x, double scale) {
    for (int64_t r = 0; r < x->numel / DK; r++) {
        real *z = x->data + r * DK;
        double s = 0;
        for (int i = 0; i < DK; i++) s += (double)z[i] * z[i];
        s = scale / sqrt(s + 1e-6);
        for (int i = 0; i < DK; i++) z[i] = (real)(z[i] * s);
    }
}

static Inputs inputs_make(int B, int T, bool grad) {
    Inputs in = {B, T, NULL, NULL, NULL, NULL, NULL, NULL};
    in.q = tensor_newv(grad, 3, B, T, H * DK);
    in.k = tensor_newv(grad, 3, B, T, H * DK);
    in.v = tensor_newv(grad, 3, B, T, H * DV);
    in.beta = tensor_newv(grad, 3, B, T, H);
    in.g = tensor_newv(grad, 3, B, T, H);
    in.dO = tensor_newv(false, 3, B, T, H * DV);
    Rng r;
    rng_seed(&r, 1);
    Tensor *normal[] = {in.q, in.k, in.v, in.dO};
    for (int j = 0; j < 4; j++)
        for (int64_t i = 0; i < normal[j]->numel; i++) normal[j]->data[i] = (real)rng_normal(&r);
    normalise_heads(in.q, 1.0 / sqrt(DK));
    normalise_heads(in.k, 1.0);
    for (int64_t i = 0; i < in.g->numel; i++) {
        in.g->data[i] = (real)rng_range(&r, -0.1, -0.001);
        in.beta->data[i] = (real)rng_range(&r, 0.1, 0.9);
    }
    return in;
}

static void inputs_free(Inputs *in) {
    Tensor *all[] = {in->q, in->k, in->v, in->beta, in->g, in->dO};
    for (int i = 0; i < 6; i++) tensor_free(all[i]);
}

// One training step of the op: forward, then backward seeded on o.
static void train_step(Tape *tp, const Inputs *in, MixerForm form, int C) {
    Tensor *o = op_gdn(tp, in->q, in->k, in->v, in->beta, in->g, NULL, NULL, H, form, C, NULL);
    tape_backward_from(tp, o, in->dO->data);
}

// Best of `reps` training steps, seconds.
static double time_train(const Inputs *in, MixerForm form, int C, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        Tape tp;
        tape_init(&tp);
        double t0 = runlog_now();
        train_step(&tp, in, form, C);
        double dt = runlog_now() - t0;
        tape_free(&tp);
        if (dt < best) best = dt;
    }
    return best;
}

// Flops of the chunked forward's matrix products (2 per multiply-add) and
// its triangular solve, for a sequence of T positions in chunks of C, per head.
static double chunked_forward_flops(int T, int C) {
    double f = 0;
    for (int t0 = 0; t0 < T; t0 += C) {
        double L = T - t0 < C ? T - t0 : C;
        f += 2 * L * L * DK * 2      // K K^T, Q K^T (counted whole; the kernel forms their lower halves)
             + 2 * L * L * DV * 2    // Delta = Tm R, P Delta
             + 2 * L * DK * DV * 3   // Xw S0 (in R = Xu - Xw S0), Q S0, Kd^T Delta
             + L * L * L / 3;        // forward substitution for Tm
    }
    return f;
}

static void print_machine(void) {
    char cpu[256];
    runlog_cpu_name(cpu, sizeof cpu);
    printf("cpu: %s\n", cpu);
    printf("threads: %d (omp_get_max_threads)   precision: %s   OpenBLAS core: %s\ngemm: %s\n",
           omp_get_max_threads(), REAL_NAME, blas_core_name(), blas_describe());
    printf("H %d, dk %d, dv %d\n\n", H, DK, DV);
}

int main(int argc, char **argv) {
    if (bench_help(argc, argv, "usage: gdn_bench [TOKENS]\n  Gated DeltaNet: time per token of the chunked and recurrent forms against T, and the chunk-size sweep,\n  with TOKENS = B x T per step (default 16384)\n")) return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    blas_select_from_env();     // ATTNLAB_GEMM=auto|openblas|onednn (default auto)
    int tokens = argc > 1 ? atoi(argv[1]) : 16384;
    const int Ts[] = {256, 1024, 4096, 16384};
    const int nT = sizeof Ts / sizeof Ts[0];
    print_machine();

    // 1. time per token vs T
    printf("1. forward+backward, microseconds per token, B*T = %d (best of 2; recurrent: 1 run)\n", tokens);
    printf("%-16s", "form");
    for (int i = 0; i < nT; i++) printf("   T=%-7d", Ts[i]);
    printf("\n");
    for (int form = 0; form < 2; form++) {
        MixerForm f = form ? MIXER_FORM_RECURRENT : MIXER_FORM_CHUNKED;
        printf("%-16s", form ? "recurrent" : "chunked C=64");
        for (int i = 0; i < nT; i++) {
            int T = Ts[i], B = tokens / T;
            if (B < 1) {
                printf(" %11s", "-");
                continue;
            }
            Inputs in = inputs_make(B, T, true);
            double s = time_train(&in, f, 64, form ? 1 : 2);
            printf(" %11.3f", 1e6 * s / ((double)B * T));
            fflush(stdout);
            inputs_free(&in);
        }
        printf("\n");
    }

    // 2. chunk sizes
    {
        int T = 4096, B = tokens / T > 0 ? tokens / T : 1;
        printf("\n2. chunked forward+backward at T = %d, B = %d: microseconds per token\n", T, B);
        Inputs in = inputs_make(B, T, true);
        const int Cs[] = {16, 32, 64, 128};
        for (int i = 0; i < 4; i++) {
            double s = time_train(&in, MIXER_FORM_CHUNKED, Cs[i], 2);
            printf("   C=%-4d %9.3f\n", Cs[i], 1e6 * s / ((double)B * T));
            fflush(stdout);
        }
        inputs_free(&in);
    }

    // 3. memory of one training step vs T (B = 1)
    printf("\n3. one training step, B = 1, C = 64: tape arena high-water (o, dO, S_T, saved states)\n");
    printf("   %-7s %12s %12s %14s %14s\n", "T", "arena KiB", "states KiB", "arena B/token", "recurrent KiB");
    for (int T = 256; T <= 16384; T *= 4) {
        Inputs in = inputs_make(1, T, true);
        size_t hw[2];
        for (int form = 0; form < 2; form++) {
            Tape tp;
            tape_init(&tp);
            train_step(&tp, &in, form ? MIXER_FORM_RECURRENT : MIXER_FORM_CHUNKED, 64);
            hw[form] = tp.arena.high_water;
            tape_free(&tp);
        }
        size_t states = (size_t)H * ((T + 63) / 64) * DK * DV * sizeof(real);
        printf("   %-7d %12.1f %12.1f %14.1f %14.1f\n", T, hw[0] / 1024.0, states / 1024.0, (double)hw[0] / T,
               hw[1] / 1024.0);
        inputs_free(&in);
    }
    printf("   expected: T*(2*H*dv)*%zu B (o, dO) + (T/64)*H*dk*dv*%zu B (states) + O(1)\n", sizeof(real),
           sizeof(real));

    // 4. GFLOP/s: chunked forward vs sgemm
    {
        int T = 4096, B = tokens / T > 0 ? tokens / T : 1;
        Inputs in = inputs_make(B, T, false);
        Tape tp;
        tape_init(&tp);
        double best = 1e30;
        for (int r = 0; r < 3; r++) {
            double t0 = runlog_now();
            op_gdn(&tp, in.q, in.k, in.v, in.beta, in.g, NULL, NULL, H, MIXER_FORM_CHUNKED, 64, NULL);
            double dt = runlog_now() - t0;
            tape_reset(&tp);
            if (dt < best) best = dt;
        }
        tape_free(&tp);
        double fl = chunked_forward_flops(T, 64) * B * H;
        printf("\n4. chunked forward (C = 64, T = %d, B = %d): %.3f ms, %.2f GFLOP/s (%.2f GFLOP counted)\n", T, B,
               1e3 * best, fl / best * 1e-9, fl * 1e-9);
        inputs_free(&in);

        int n = 2048;
        real *a = xaligned((size_t)n * n * sizeof(real)), *b = xaligned((size_t)n * n * sizeof(real));
        real *c = xaligned((size_t)n * n * sizeof(real));
        for (int64_t i = 0; i < (int64_t)n * n; i++) a[i] = (real)(i % 7) * 0.1f, b[i] = (real)(i % 5) * 0.1f;
        gemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n);   // warm-up
        best = 1e30;
        for (int r = 0; r < 3; r++) {
            double t0 = runlog_now();
            gemm(false, false, n, n, n, 1, a, n, b, n, 0, c, n);
            double dt = runlog_now() - t0;
            if (dt < best) best = dt;
        }
        printf("   gemm %d x %d x %d, all threads:      %.2f GFLOP/s\n", n, n, n, 2.0 * n * n * n / best * 1e-9);
        // The size the kernel uses, one thread (inside a parallel region OpenBLAS runs single-threaded).
        int m = 64, reps = 2000;
        double secs = 0;
#pragma omp parallel num_threads(1)
        {
            double t0 = runlog_now();
            for (int r = 0; r < reps; r++) gemm(false, false, m, m, m, 1, a, n, b, n, 0, c, n);
            secs = runlog_now() - t0;
        }
        printf("   gemm %d x %d x %d, one thread:          %.2f GFLOP/s (x %d threads = %.2f)\n", m, m, m,
               2.0 * m * m * m * reps / secs * 1e-9, omp_get_max_threads(),
               omp_get_max_threads() * 2.0 * m * m * m * reps / secs * 1e-9);
        free(a);
        free(b);
        free(c);
    }
    return 0;
}
