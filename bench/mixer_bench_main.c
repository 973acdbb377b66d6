// mixer_bench: forward+backward time per token of the mixer kernels at
// growing sequence length with B*T fixed, and decode time per token.
//
//   mixer_bench [tokens]     (default 16384 tokens per measurement)
//
// Rows come from two tables, TRAIN_ROWS and DECODE_ROWS: to add a kernel
// (attn, gdn, ...) write one function with the BenchTrainFn / BenchDecodeFn
// signature and add one line to a table. Every kernel sees the same inputs:
// q, k (B, T, H*dk), v (B, T, H*dv), g (B, T, H) log decay, beta (B, T, H).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

#include "gla.h"

enum { BENCH_H = 4, BENCH_DK = 64, BENCH_DV = 64, BENCH_CHUNK = 64 };

typedef struct BenchInputs {
    int B, T, H, dk, dv;
    Tensor *q, *k;     // (B, T, H*dk)
    Tensor *v;         // (B, T, H*dv)
    Tensor *g;         // (B, T, H) per-step log decay in [-0.1, -0.001]
    Tensor *beta;      // (B, T, H) in (0, 1)
    Tensor *dO;        // (B, T, H*dv) the gradient seeded on the output
} BenchInputs;

// Build the op on the tape from `in` and run its backward (seeded with in->dO).
typedef void (*BenchTrainFn)(Tape *tp, const BenchInputs *in, const void *arg);
// Decode n_tokens tokens one at a time for B sequences (each step reads and
// advances a state of the kernel's own making). Returns the seconds taken.
typedef double (*BenchDecodeFn)(int B, int n_tokens, const void *arg);

typedef struct BenchTrainRow {
    const char *mixer, *form;
    BenchTrainFn fn;
    const void *arg;
    int max_T;         // skip longer sequences (0: no limit)
    const char *why;   // why they are skipped
} BenchTrainRow;

typedef struct BenchDecodeRow {
    const char *mixer;
    BenchDecodeFn fn;
    const void *arg;
} BenchDecodeRow;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// ---- gla (linear: no decay; mamba: decay g and dt = beta) ----

typedef struct GlaArg {
    MixerForm form;
    bool gated;        // mamba-style: decay g and k scaled by beta
} GlaArg;

static void gla_train(Tape *tp, const BenchInputs *in, const void *arg) {
    const GlaArg *a = arg;
    Tensor *o = op_gla_dt(tp, in->q, in->k, in->v, a->gated ? in->g : NULL, a->gated ? in->beta : NULL, NULL,
                          in->H, a->form, BENCH_CHUNK, NULL);
    tape_backward_from(tp, o, in->dO->data);
}

static double gla_decode(int B, int n_tokens, const void *arg) {
    const GlaArg *a = arg;
    int H = BENCH_H, dk = BENCH_DK, dv = BENCH_DV;
    Tensor *q = tensor_newv(false, 3, B, 1, H * dk), *k = tensor_newv(false, 3, B, 1, H * dk);
    Tensor *v = tensor_newv(false, 3, B, 1, H * dv), *g = tensor_newv(false, 3, B, 1, H);
    Tensor *beta = tensor_newv(false, 3, B, 1, H), *S = tensor_newv(false, 4, B, H, dk, dv);
    Rng r;
    rng_seed(&r, 7);
    Tape tp;
    tape_init(&tp);
    tape_no_grad_push(&tp);
    // The same token every step: the values do not change the work.
    for (int64_t i = 0; i < q->numel; i++) q->data[i] = (real)(0.1 * rng_normal(&r));
    for (int64_t i = 0; i < k->numel; i++) k->data[i] = (real)(0.1 * rng_normal(&r));
    for (int64_t i = 0; i < v->numel; i++) v->data[i] = (real)rng_normal(&r);
    for (int64_t i = 0; i < g->numel; i++) g->data[i] = -0.05f, beta->data[i] = 0.5f;
    double t0 = now();
    for (int t = 0; t < n_tokens; t++) {
        Tensor *s_out;
        op_gla_dt(&tp, q, k, v, a->gated ? g : NULL, a->gated ? beta : NULL, S, H, MIXER_FORM_RECURRENT, 1, &s_out);
        memcpy(S->data, s_out->data, (size_t)S->numel * sizeof(real));
        tape_reset(&tp);
    }
    double secs = now() - t0;
    tape_no_grad_pop(&tp);
    tape_free(&tp);
    Tensor *all[] = {q, k, v, g, beta, S};
    for (int i = 0; i < 6; i++) tensor_free(all[i]);
    return secs;
}

static const GlaArg LIN_PAR = {MIXER_FORM_PARALLEL, false}, LIN_CHUNK = {MIXER_FORM_CHUNKED, false},
                    LIN_REC = {MIXER_FORM_RECURRENT, false}, MAM_PAR = {MIXER_FORM_PARALLEL, true},
                    MAM_CHUNK = {MIXER_FORM_CHUNKED, true}, MAM_REC = {MIXER_FORM_RECURRENT, true};

// One line per kernel and form.
static const BenchTrainRow TRAIN_ROWS[] = {
    {"linear", "parallel", gla_train, &LIN_PAR, 4096, "T x T scores: 1 GiB per matrix per thread"},
    {"linear", "chunked", gla_train, &LIN_CHUNK, 0, NULL},
    {"linear", "recurrent", gla_train, &LIN_REC, 0, NULL},
    {"mamba", "parallel", gla_train, &MAM_PAR, 4096, "T x T scores: 1 GiB per matrix per thread"},
    {"mamba", "chunked", gla_train, &MAM_CHUNK, 0, NULL},
    {"mamba", "recurrent", gla_train, &MAM_REC, 0, NULL},
};

static const BenchDecodeRow DECODE_ROWS[] = {
    {"linear", gla_decode, &LIN_REC},
    {"mamba", gla_decode, &MAM_REC},
};

static void inputs_make(BenchInputs *in, int B, int T) {
    int H = BENCH_H, dk = BENCH_DK, dv = BENCH_DV;
    *in = (BenchInputs){B, T, H, dk, dv, NULL, NULL, NULL, NULL, NULL, NULL};
    in->q = tensor_newv(true, 3, B, T, H * dk);
    in->k = tensor_newv(true, 3, B, T, H * dk);
    in->v = tensor_newv(true, 3, B, T, H * dv);
    in->g = tensor_newv(true, 3, B, T, H);
    in->beta = tensor_newv(true, 3, B, T, H);
    in->dO = tensor_newv(false, 3, B, T, H * dv);
    Rng r;
    rng_seed(&r, 1);
    Tensor *normal[] = {in->q, in->k, in->v, in->dO};
    for (int j = 0; j < 4; j++)
        for (int64_t i = 0; i < normal[j]->numel; i++) normal[j]->data[i] = (real)(0.1 * rng_normal(&r));
    for (int64_t i = 0; i < in->g->numel; i++) {
        in->g->data[i] = (real)rng_range(&r, -0.1, -0.001);
        in->beta->data[i] = (real)rng_range(&r, 0.1, 0.9);
    }
}

static void inputs_free(BenchInputs *in) {
    Tensor *all[] = {in->q, in->k, in->v, in->g, in->beta, in->dO};
    for (int i = 0; i < 6; i++) tensor_free(all[i]);
}

static void print_machine(void) {
    struct utsname u;
    if (uname(&u) == 0) printf("machine: %s %s %s\n", u.sysname, u.release, u.machine);
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            printf("cpu: %s", c ? c + 2 : line);
            break;
        }
    if (f) fclose(f);
    printf("threads: %d (omp_get_max_threads)   precision: %s\n", omp_get_max_threads(), REAL_NAME);
}

int main(int argc, char **argv) {
    int tokens = argc > 1 ? atoi(argv[1]) : 16384;
    const int Ts[] = {256, 1024, 4096, 16384};
    const int nT = sizeof Ts / sizeof Ts[0];
    print_machine();
    printf("H %d, dk %d, dv %d, chunk %d, B*T = %d tokens per measurement\n\n", BENCH_H, BENCH_DK, BENCH_DV,
           BENCH_CHUNK, tokens);
    printf("forward+backward, microseconds per token (best of 2)\n");
    printf("%-8s %-10s", "mixer", "form");
    for (int i = 0; i < nT; i++) printf(" %9s%-5d", "T=", Ts[i]);
    printf("\n");
    Tape tp;
    tape_init(&tp);
    for (size_t r = 0; r < sizeof TRAIN_ROWS / sizeof TRAIN_ROWS[0]; r++) {
        const BenchTrainRow *row = &TRAIN_ROWS[r];
        printf("%-8s %-10s", row->mixer, row->form);
        fflush(stdout);
        for (int i = 0; i < nT; i++) {
            int T = Ts[i], B = tokens / T;
            if (B < 1 || (row->max_T && T > row->max_T)) {
                printf(" %14s", "skipped");
                continue;
            }
            BenchInputs in;
            inputs_make(&in, B, T);
            double best = 1e30;
            for (int rep = 0; rep < 2; rep++) {
                double t0 = now();
                row->fn(&tp, &in, row->arg);
                double dt = now() - t0;
                tape_reset(&tp);
                if (dt < best) best = dt;
            }
            printf(" %14.3f", 1e6 * best / ((double)B * T));
            fflush(stdout);
            inputs_free(&in);
        }
        printf("\n");
    }
    tape_free(&tp);
    for (size_t r = 0; r < sizeof TRAIN_ROWS / sizeof TRAIN_ROWS[0]; r++)
        if (TRAIN_ROWS[r].max_T)
            printf("(%s %s skipped above T=%d: %s)\n", TRAIN_ROWS[r].mixer, TRAIN_ROWS[r].form, TRAIN_ROWS[r].max_T,
                   TRAIN_ROWS[r].why);

    printf("\ndecode (recurrent step, no grad), microseconds per token\n");
    printf("%-8s %12s %12s\n", "mixer", "B=1", "B=16");
    for (size_t r = 0; r < sizeof DECODE_ROWS / sizeof DECODE_ROWS[0]; r++) {
        const BenchDecodeRow *row = &DECODE_ROWS[r];
        int n = 2000;
        double s1 = row->fn(1, n, row->arg), s16 = row->fn(16, n / 8, row->arg);
        printf("%-8s %12.3f %12.3f\n", row->mixer, 1e6 * s1 / n, 1e6 * s16 / (16.0 * (n / 8)));
    }
    return 0;
}
