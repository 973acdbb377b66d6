// test_cuda_kda.c: op_kda (Kimi Delta Attention) on the GPU against the CPU.
// The GPU's chunked form has its own kernels (kda_chunk.cu,
// kda_chunk_backward.cu); the recurrent form is the recurrence
// (kda_naive.cu) both ways. Each form is checked against its CPU twin on the same inputs,
// forward and every
// gradient: with and without s0, documents, T not a multiple of the chunk
// and T = 1, dk = dv and dk != dv, head sizes past one thread per row or
// column, decay regimes (one with the channels of a head decaying at very
// different rates), one output at a time, one tensor as several inputs,
// gradients accumulated over two nodes with the state carried between them.
// And on the GPU alone: op_kda with g shared by a head's channels is op_gdn
// (its own GPU kernels), and a run repeats bit for bit. The chunked kernel
// on decays that no exp of a positive number could survive (g = -30, and
// channels of 0 next to -30 and -1000) against the CPU's chunked form and
// the GPU's recurrence, and with its backward swapped for the recurrence's
// (ATTNLAB_KDA_CHUNK_BWD), naming the first element off.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "device.h"
#include "gdn_kernel.h"
#include "kda_kernel.h"

// REG_G_SPLIT: a head's even channels barely decay (g in (-0.02, 0)), its
// odd ones lose their past at every step (g near -20). REG_G_M30: g = -30
// exactly, every channel. REG_G_WILD: channels of g = 0, -30 and -1000 side
// by side (channel c % 3).
typedef enum { REG_PLAIN, REG_G_ZERO, REG_G_M20, REG_BETA_1, REG_G_SPLIT, REG_G_M30, REG_G_WILD } Regime;

enum { IQ, IK, IV, IBETA, IG, IS0, N_IN };
static const char *const GRAD_NAMES[N_IN] = {"dq", "dk", "dv", "dbeta", "dg", "ds0"};

// x[IQ..IS0]; x[IS0] NULL without s0. grad: whether they take gradients.
static void make_inputs(Tensor **x, int B, int T, int H, int dk, int dv, Regime reg, bool with_s0, bool grad,
                        uint64_t seed) {
    x[IQ] = tensor_newv(grad, 3, B, T, H * dk);
    x[IK] = tensor_newv(grad, 3, B, T, H * dk);
    x[IV] = tensor_newv(grad, 3, B, T, H * dv);
    x[IBETA] = tensor_newv(grad, 3, B, T, H);
    x[IG] = tensor_newv(grad, 3, B, T, H * dk);
    x[IS0] = with_s0 ? tensor_newv(grad, 4, B, H, dk, dv) : NULL;
    fill_normal(x[IQ], seed + 1, 1.0);
    fill_normal(x[IK], seed + 2, 1.0);
    fill_normal(x[IV], seed + 3, 1.0);
    if (x[IS0]) fill_normal(x[IS0], seed + 4, 0.5);
    test_l2norm_rows(x[IQ], dk, 1.0 / sqrt(dk));
    test_l2norm_rows(x[IK], dk, 1.0);
    Rng r;
    rng_seed(&r, seed + 5);
    for (int64_t e = 0; e < x[IBETA]->numel; e++) {
        double bt = 1.0 / (1.0 + exp(-rng_normal(&r)));
        if (reg == REG_BETA_1) bt = 1 - 1e-4 * (0.5 + rng_uniform(&r));
        x[IBETA]->data[e] = (real)bt;
    }
    for (int64_t e = 0; e < x[IG]->numel; e++) {
        double u = rng_uniform(&r), gt = -rng_range(&r, 0.01, 1.0);
        if (reg == REG_G_ZERO) gt = 0;
        if (reg == REG_G_M20) gt = -20 + u;
        if (reg == REG_G_SPLIT) gt = e % dk % 2 ? -20 + u : -0.02 * u;
        if (reg == REG_G_M30) gt = -30;
        if (reg == REG_G_WILD) gt = (double[]){0, -30, -1000}[e % dk % 3];
        x[IG]->data[e] = (real)gt;
    }
}

static void free_inputs(Tensor **x) {
    for (int i = 0; i < N_IN; i++) tensor_free(x[i]);
}

typedef struct {
    int H, chunk;
    MixerForm form;
    const int *doc_start;   // (B, T) or NULL
    int outs;               // the outputs the loss sees: 1 o, 2 S_T, 3 both
} KdaCtx;

static int f_kda(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const KdaCtx *c = ctx;
    Tensor *sT = NULL;
    Tensor *o = op_kda(tp, x[IQ], x[IK], x[IV], x[IBETA], x[IG], n > IS0 ? x[IS0] : NULL, c->doc_start, c->H, c->form,
                       c->chunk, &sT);
    int m = 0;
    if (c->outs & 1) outs[m++] = o;
    if (c->outs & 2) outs[m++] = sT;
    return m;
}

static const char *form_name(MixerForm f) { return f == MIXER_FORM_CHUNKED ? "chunked" : "recurrent"; }

// One cuda_check_op of op_kda on fresh inputs.
static void check_kda(MixerForm form, int B, int T, int H, int dk, int dv, int chunk, Regime reg, bool with_s0,
                      const int *doc_start, int outs, uint64_t seed) {
    Tensor *x[N_IN];
    make_inputs(x, B, T, H, dk, dv, reg, with_s0, true, seed);
    KdaCtx c = {H, chunk, form, doc_start, outs};
    char label[160];
    snprintf(label, sizeof label, "kda %s B=%d T=%d H=%d dk=%d dv=%d C=%d regime %d%s%s outs %d", form_name(form), B,
             T, H, dk, dv, chunk, (int)reg, with_s0 ? " +s0" : "", doc_start ? " +docs" : "", outs);
    cuda_check_op(label, f_kda, x, with_s0 ? N_IN : IS0, &c);
    free_inputs(x);
}

static const MixerForm FORMS[2] = {MIXER_FORM_CHUNKED, MIXER_FORM_RECURRENT};

Test(cuda_kda, both_forms_every_shape) {
    // T: one token (decoding), odd, a whole number of chunks, a partial last chunk.
    static const int Ts[] = {1, 37, 64, 100}, Cs[] = {16, 64}, dks[] = {32, 16};
    for (int f = 0; f < 2; f++)
        for (int d = 0; d < 2; d++)
            for (int c = 0; c < 2; c++)
                for (int t = 0; t < 4; t++)
                    for (int s = 0; s < 2; s++)
                        check_kda(FORMS[f], 2, Ts[t], 2, dks[d], 32, Cs[c], REG_PLAIN, s, NULL, 3,
                                  100 + 10 * t + c + 3 * d);
}

Test(cuda_kda, head_sizes) {
    // Tiny heads, sizes off the warp, chunks of odd length, three heads; then
    // more rows (dk 272) or columns (dv 264) than a block has threads (256):
    // a thread takes several, in the backward's row phase or in every phase.
    for (int f = 0; f < 2; f++) {
        check_kda(FORMS[f], 1, 50, 3, 8, 8, 7, REG_PLAIN, true, NULL, 3, 11);
        check_kda(FORMS[f], 2, 45, 1, 64, 48, 32, REG_PLAIN, true, NULL, 3, 12);
        check_kda(FORMS[f], 1, 70, 2, 40, 24, 33, REG_PLAIN, false, NULL, 3, 13);
        check_kda(FORMS[f], 1, 130, 2, 128, 128, 64, REG_PLAIN, true, NULL, 3, 14);
        check_kda(FORMS[f], 1, 21, 1, 272, 24, 8, REG_PLAIN, true, NULL, 3, 15);
        check_kda(FORMS[f], 2, 19, 1, 16, 264, 8, REG_PLAIN, true, NULL, 3, 16);
    }
}

Test(cuda_kda, decay_regimes) {
    // No decay (the state sums the whole history), strong decay (-20 a step:
    // the factors must be exact zeros, not NaN), beta near 1, and a head's
    // channels half kept, half wiped at every step.
    static const Regime regs[] = {REG_G_ZERO, REG_G_M20, REG_BETA_1, REG_G_SPLIT};
    for (int f = 0; f < 2; f++)
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 2; c++)
                check_kda(FORMS[f], 2, 100, 2, 32, 32, c ? 64 : 16, regs[r], true, NULL, 3, 40 + r);
}

Test(cuda_kda, documents) {
    // Row 0: documents starting at 0, inside the first chunk, at a chunk edge
    // of 16, just after it, two inside one chunk, at the last position; row 1:
    // one document starting mid-chunk (the state before it carries s0).
    enum { B = 2, T = 67 };
    int doc[B * T];
    memset(doc, 0, sizeof doc);
    int starts0[] = {0, 5, 16, 17, 40, 43, 64, T - 1};
    for (size_t i = 0; i < sizeof starts0 / sizeof starts0[0]; i++) doc[starts0[i]] = 1;
    doc[T + 30] = 1;
    for (int f = 0; f < 2; f++)
        for (int c = 0; c < 2; c++)
            for (int s = 0; s < 2; s++) {
                check_kda(FORMS[f], B, T, 2, 32, 32, c ? 64 : 16, REG_PLAIN, s, doc, 3, 60 + c);
                check_kda(FORMS[f], B, T, 2, 16, 32, c ? 64 : 16, REG_G_SPLIT, s, doc, 3, 62 + c);
            }
    // A document at the last position of a chunk and T = 1 starting one (s0 not read).
    int doc2[2 * 32] = {0};
    doc2[15] = doc2[32 + 31] = 1;
    for (int f = 0; f < 2; f++) {
        check_kda(FORMS[f], 2, 32, 1, 16, 16, 16, REG_PLAIN, true, doc2, 3, 70);
        int one[2] = {1, 1};
        check_kda(FORMS[f], 2, 1, 2, 32, 32, 16, REG_PLAIN, true, one, 3, 71);
    }
}

Test(cuda_kda, one_output_at_a_time) {
    // Only o takes a gradient (no dS_T), or only S_T (no dO).
    for (int f = 0; f < 2; f++)
        for (int outs = 1; outs <= 2; outs++) {
            check_kda(FORMS[f], 2, 37, 2, 16, 32, 16, REG_PLAIN, true, NULL, outs, 80 + outs);
            check_kda(FORMS[f], 1, 1, 2, 32, 32, 64, REG_PLAIN, false, NULL, outs, 82 + outs);
        }
}

Test(cuda_kda, forward_only_and_decoding) {
    // Inputs without gradients: the node is not recorded (no saved states).
    // T = 1 with chunk 1 is the decoding step (s0 the cache).
    for (int f = 0; f < 2; f++)
        for (int t = 0; t < 2; t++) {
            int T = t ? 41 : 1, C = t ? 16 : 1;
            Tensor *x[N_IN];
            make_inputs(x, 3, T, 2, 32, 16, REG_PLAIN, true, false, 90 + t);
            KdaCtx c = {2, C, FORMS[f], NULL, 3};
            char label[64];
            snprintf(label, sizeof label, "kda %s forward only T=%d", form_name(FORMS[f]), T);
            cuda_check_op(label, f_kda, x, N_IN, &c);
            free_inputs(x);
        }
}

// q, k and v one tensor (dk = dv): three gradients into one buffer.
static int f_kda_shared(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const KdaCtx *c = ctx;
    outs[0] = op_kda(tp, x[0], x[0], x[0], x[1], x[2], x[3], c->doc_start, c->H, c->form, c->chunk, &outs[1]);
    return 2;
}

Test(cuda_kda, one_tensor_as_several_inputs) {
    for (int f = 0; f < 2; f++) {
        Tensor *qkv = tensor_newv(true, 3, 2, 45, 2 * 16), *beta = tensor_newv(true, 3, 2, 45, 2);
        Tensor *g = tensor_newv(true, 3, 2, 45, 2 * 16), *s0 = tensor_newv(true, 4, 2, 2, 16, 16);
        fill_normal(qkv, 1, 1.0);
        test_l2norm_rows(qkv, 16, 1.0);
        fill_uniform(beta, 2, 0.05, 0.95);
        fill_uniform(g, 4, -0.9, -0.05);
        fill_normal(s0, 3, 0.5);
        KdaCtx c = {2, 16, FORMS[f], NULL, 3};
        char label[64];
        snprintf(label, sizeof label, "kda %s, q = k = v", form_name(FORMS[f]));
        cuda_check_op(label, f_kda_shared, (Tensor *[]){qkv, beta, g, s0}, 4, &c);
        tensor_free(qkv);
        tensor_free(beta);
        tensor_free(g);
        tensor_free(s0);
    }
}

// Two nodes on the same q, k, v, beta, g (each gradient is the sum of two
// backwards: the later node's writes, the earlier one's adds), the second
// starting from the first's final state (its gradient flows into dS_T of the
// first), the forms mixed.
typedef struct {
    MixerForm f1, f2;
    int chunk;
} TwoCtx;

static int f_kda_two(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const TwoCtx *c = ctx;
    Tensor *s1 = NULL;
    outs[0] = op_kda(tp, x[IQ], x[IK], x[IV], x[IBETA], x[IG], x[IS0], NULL, 2, c->f1, c->chunk, &s1);
    outs[1] = op_kda(tp, x[IQ], x[IK], x[IV], x[IBETA], x[IG], s1, NULL, 2, c->f2, c->chunk, &outs[2]);
    return 3;
}

Test(cuda_kda, accumulated_gradients_and_a_carried_state) {
    for (int f1 = 0; f1 < 2; f1++)
        for (int f2 = 0; f2 < 2; f2++) {
            Tensor *x[N_IN];
            make_inputs(x, 2, 29, 2, 16, 32, REG_PLAIN, true, true, 120 + 2 * f1 + f2);
            TwoCtx c = {FORMS[f1], FORMS[f2], 16};
            char label[64];
            snprintf(label, sizeof label, "kda %s then %s", form_name(FORMS[f1]), form_name(FORMS[f2]));
            cuda_check_op(label, f_kda_two, x, N_IN, &c);
            free_inputs(x);
        }
}

// ---------------------------------------------------------------- the GPU on its own

// o, S_T and every input gradient of op_kda (or, gdn, of op_gdn, whose g is
// (B, T, H)) on a tape of device d (host copies), the outputs' gradients
// from fixed seeds.
typedef struct {
    real *o, *sT, *grad[N_IN];
    int64_t n_o, n_s;
} GpuRun;

static GpuRun dev_run(Device d, Tensor *const *in, const KdaCtx *c, bool gdn) {
    if (d == DEVICE_CUDA) cuda_require();
    GpuRun r;
    memset(&r, 0, sizeof r);
    Tape tp;
    tape_init_on(&tp, d);
    Tensor *x[N_IN] = {0};
    for (int i = 0; i < N_IN; i++) {
        if (!in[i]) continue;
        x[i] = tape_tensor_copy(&tp, in[i]->ndim, in[i]->shape, in[i]->data);
        x[i]->requires_grad = true;
    }
    Tensor *sT = NULL;
    Tensor *o = (gdn ? op_gdn : op_kda)(&tp, x[IQ], x[IK], x[IV], x[IBETA], x[IG], x[IS0], c->doc_start, c->H,
                                        c->form, c->chunk, &sT);
    r.n_o = o->numel;
    r.n_s = sT->numel;
    real *so = test_randn(r.n_o, 7), *ss = test_randn(r.n_s, 8);
    tape_backward_multi(&tp, (Tensor *[]){o, sT}, (const real *[]){so, ss}, 2);
    r.o = malloc((size_t)r.n_o * sizeof(real));
    r.sT = malloc((size_t)r.n_s * sizeof(real));
    dev_to_host(r.o, o->data, (size_t)r.n_o * sizeof(real), d);
    dev_to_host(r.sT, sT->data, (size_t)r.n_s * sizeof(real), d);
    for (int i = 0; i < N_IN; i++) {
        if (!x[i]) continue;
        r.grad[i] = malloc((size_t)in[i]->numel * sizeof(real));
        dev_to_host(r.grad[i], x[i]->grad, (size_t)in[i]->numel * sizeof(real), d);
    }
    dev_sync(d);
    tape_free(&tp);
    free(so);
    free(ss);
    return r;
}

static GpuRun gpu_run(Tensor *const *in, const KdaCtx *c, bool gdn) { return dev_run(DEVICE_CUDA, in, c, gdn); }

static void gpu_run_free(GpuRun *r) {
    free(r->o);
    free(r->sT);
    for (int i = 0; i < N_IN; i++) free(r->grad[i]);
}

static void assert_close(const real *a, const real *b, int64_t n, const char *label, const char *what) {
    double e = max_rel_diff(a, b, n);
    cr_assert_leq(e, FORM_TOL, "%s: %s differs by %.3e (tolerance %.0e)", label, what, e, FORM_TOL);
}

Test(cuda_kda, equals_gdn_when_the_channels_share_g) {
    // g_t the same for every channel of a head: op_kda is op_gdn, whose GPU
    // kernels are others (each form of op_kda against both of op_gdn's); dg
    // summed over the channels is op_gdn's dg. With and without documents, a
    // partial last chunk.
    enum { B = 2, T = 75, H = 2, dk = 16, dv = 32 };
    static int doc[B * T];
    memset(doc, 0, sizeof doc);
    doc[0] = doc[20] = doc[32] = doc[T + 50] = 1;
    for (int cse = 0; cse < 8; cse++) {
        const int *docs = cse % 2 ? doc : NULL;
        MixerForm gdn_form = FORMS[cse / 2 % 2], kda_form = FORMS[cse / 4];
        Tensor *x[N_IN], *gh = tensor_newv(true, 3, B, T, H);
        make_inputs(x, B, T, H, dk, dv, REG_PLAIN, true, true, 200 + cse);
        fill_uniform(gh, 210 + cse, -1.0, -0.01);
        for (int64_t r = 0; r < gh->numel; r++)
            for (int i = 0; i < dk; i++) x[IG]->data[r * dk + i] = gh->data[r];
        Tensor *xg[N_IN] = {x[IQ], x[IK], x[IV], x[IBETA], gh, x[IS0]};
        KdaCtx ck = {H, 16, kda_form, docs, 3}, cg = {H, 16, gdn_form, docs, 3};
        GpuRun a = gpu_run(x, &ck, false), b = gpu_run(xg, &cg, true);
        char label[64];
        snprintf(label, sizeof label, "kda %s against gdn %s%s", form_name(kda_form), form_name(gdn_form),
                 docs ? " +docs" : "");
        assert_close(a.o, b.o, a.n_o, label, "o");
        assert_close(a.sT, b.sT, a.n_s, label, "S_T");
        for (int i = 0; i < N_IN; i++)
            if (i != IG) assert_close(a.grad[i], b.grad[i], x[i]->numel, label, GRAD_NAMES[i]);
        real *dg = malloc((size_t)gh->numel * sizeof(real));
        for (int64_t r = 0; r < gh->numel; r++) {
            double s = 0;
            for (int i = 0; i < dk; i++) s += a.grad[IG][r * dk + i];
            dg[r] = (real)s;
        }
        assert_close(dg, b.grad[IG], gh->numel, label, "dg summed over the channels");
        free(dg);
        gpu_run_free(&a);
        gpu_run_free(&b);
        free_inputs(x);
        tensor_free(gh);
    }
}

Test(cuda_kda, a_run_repeats_bit_for_bit) {
    enum { B = 2, T = 100 };
    static int doc[B * T];
    memset(doc, 0, sizeof doc);
    doc[16] = doc[T + 41] = 1;
    Tensor *x[N_IN];
    make_inputs(x, B, T, 2, 32, 32, REG_PLAIN, true, true, 300);
    for (int f = 0; f < 2; f++) {
        KdaCtx c = {2, 16, FORMS[f], doc, 3};
        GpuRun a = gpu_run(x, &c, false), b = gpu_run(x, &c, false);
        const char *what = form_name(FORMS[f]);
        cr_assert(memcmp(a.o, b.o, (size_t)a.n_o * sizeof(real)) == 0, "%s: o differs", what);
        cr_assert(memcmp(a.sT, b.sT, (size_t)a.n_s * sizeof(real)) == 0, "%s: S_T differs", what);
        for (int i = 0; i < N_IN; i++)
            cr_assert(memcmp(a.grad[i], b.grad[i], (size_t)x[i]->numel * sizeof(real)) == 0, "%s: %s differs", what,
                      GRAD_NAMES[i]);
        gpu_run_free(&a);
        gpu_run_free(&b);
    }
    free_inputs(x);
}

// ---------------------------------------------------------------- the chunked kernel on hard decays

// a against b (n values) normwise (max_rel_diff) within FORM_TOL; on failure
// the error, the first element past the tolerance and both values there.
static void assert_close_at(const real *a, const real *b, int64_t n, const char *label, const char *what) {
    double e = max_rel_diff(a, b, n);
    if (e <= FORM_TOL) return;
    double scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fmax(fabs((double)a[i]), fabs((double)b[i])));
    int64_t at = -1;
    for (int64_t i = 0; i < n && at < 0; i++)
        if (!(fabs((double)a[i] - (double)b[i]) <= FORM_TOL * (scale > 0 ? scale : 1))) at = i;
    cr_assert_fail("%s: %s differs by %.3e (tolerance %.0e, scale %.3e); first at element %lld of %lld: %.17g vs %.17g",
                   label, what, e, FORM_TOL, scale, (long long)at, (long long)n, at >= 0 ? (double)a[at] : 0.0,
                   at >= 0 ? (double)b[at] : 0.0);
}

static void assert_runs_close(const GpuRun *a, const GpuRun *b, Tensor *const *x, const char *label) {
    assert_close_at(a->o, b->o, a->n_o, label, "o");
    assert_close_at(a->sT, b->sT, a->n_s, label, "S_T");
    for (int i = 0; i < N_IN; i++)
        if (x[i]) assert_close_at(a->grad[i], b->grad[i], x[i]->numel, label, GRAD_NAMES[i]);
}

#define CHUNK_BWD "ATTNLAB_KDA_CHUNK_BWD"

// One case: the GPU's chunked form against the CPU's chunked form and
// against the GPU's recurrence, and the chunked forward with the
// recurrence's backward against the CPU: o, S_T and every gradient.
static void check_chunked(int B, int T, int H, int dk, int dv, int chunk, Regime reg, bool with_s0, const int *docs,
                          uint64_t seed) {
    Tensor *x[N_IN];
    make_inputs(x, B, T, H, dk, dv, reg, with_s0, true, seed);
    KdaCtx cc = {H, chunk, MIXER_FORM_CHUNKED, docs, 3}, cr = {H, chunk, MIXER_FORM_RECURRENT, docs, 3};
    GpuRun gc = dev_run(DEVICE_CUDA, x, &cc, false), cpu = dev_run(DEVICE_CPU, x, &cc, false);
    GpuRun gr = dev_run(DEVICE_CUDA, x, &cr, false);
    setenv(CHUNK_BWD, "recurrent", 1);
    GpuRun gm = dev_run(DEVICE_CUDA, x, &cc, false);
    unsetenv(CHUNK_BWD);
    char head[128], label[192];
    snprintf(head, sizeof head, "B=%d T=%d H=%d dk=%d dv=%d C=%d regime %d%s%s", B, T, H, dk, dv, chunk, (int)reg,
             with_s0 ? " +s0" : "", docs ? " +docs" : "");
    snprintf(label, sizeof label, "%s: GPU chunked against CPU chunked", head);
    assert_runs_close(&gc, &cpu, x, label);
    snprintf(label, sizeof label, "%s: GPU chunked against GPU recurrent", head);
    assert_runs_close(&gc, &gr, x, label);
    snprintf(label, sizeof label, "%s: GPU chunked forward, recurrent backward, against CPU chunked", head);
    assert_runs_close(&gm, &cpu, x, label);
    gpu_run_free(&gc);
    gpu_run_free(&cpu);
    gpu_run_free(&gr);
    gpu_run_free(&gm);
    free_inputs(x);
}

Test(cuda_kda, chunked_kernel_on_every_decay_regime) {
    // Mild decays, none, -30 a step, 0 / -30 / -1000 side by side, beta near
    // 1; chunks of 16, 32, 64 and 80 (past 64 positions the kernel's
    // substitution goes row by row), T = 100 not a multiple of any, with and
    // without s0; B x H = 4.
    static const Regime regs[] = {REG_PLAIN, REG_G_ZERO, REG_G_M30, REG_G_WILD, REG_BETA_1};
    static const int Cs[] = {16, 32, 64, 80};
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 4; c++)
            check_chunked(2, 100, 2, 32, 32, Cs[c], regs[r], (r + c) % 2 == 0, NULL, 400 + 10 * r + c);
}

Test(cuda_kda, chunked_kernel_with_documents) {
    // Documents starting at 0, inside a chunk, at the edges of chunks of 16,
    // 32 and 64, two inside one chunk, at the last position; row 1 one
    // document mid-chunk (the state before it carries s0). dk != dv, three heads.
    enum { B = 2, T = 131 };
    static int doc[B * T];
    memset(doc, 0, sizeof doc);
    static const int starts0[] = {0, 5, 16, 32, 33, 64, 70, 72, 96, T - 1};
    for (size_t i = 0; i < sizeof starts0 / sizeof starts0[0]; i++) doc[starts0[i]] = 1;
    doc[T + 45] = 1;
    static const Regime regs[] = {REG_PLAIN, REG_G_WILD, REG_G_M30};
    static const int Cs[] = {16, 32, 64};
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 3; c++)
            for (int s = 0; s < 2; s++) check_chunked(B, T, 3, 16, 24, Cs[c], regs[r], s, doc, 500 + 10 * r + 2 * c + s);
}

Test(cuda_kda, chunked_kernel_head_sizes) {
    // Heads off the warp and off the scan's 16 columns, a head larger than
    // the block (dk 272: the per-channel loops take several channels a thread),
    // dv past 256, one token, one position per chunk.
    check_chunked(1, 50, 3, 8, 8, 7, REG_G_WILD, true, NULL, 600);
    check_chunked(2, 45, 1, 64, 48, 32, REG_G_WILD, true, NULL, 601);
    check_chunked(1, 70, 2, 40, 24, 33, REG_PLAIN, false, NULL, 602);
    check_chunked(1, 130, 2, 128, 128, 64, REG_G_WILD, true, NULL, 603);
    check_chunked(1, 21, 1, 272, 24, 8, REG_PLAIN, true, NULL, 604);
    check_chunked(2, 19, 1, 16, 264, 8, REG_G_M30, true, NULL, 605);
    check_chunked(2, 1, 2, 32, 32, 16, REG_PLAIN, true, NULL, 606);
    check_chunked(2, 9, 2, 16, 16, 1, REG_G_WILD, true, NULL, 607);
}

Test(cuda_kda, chunked_backward_choice_refuses_an_unknown_value) {
    cuda_require();
    Tensor *x[N_IN];
    make_inputs(x, 1, 20, 1, 16, 16, REG_PLAIN, false, false, 700);
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *d[IS0];
    for (int i = 0; i < IS0; i++) {
        d[i] = tape_tensor_copy(&tp, x[i]->ndim, x[i]->shape, x[i]->data);
        d[i]->requires_grad = true;
    }
    Tensor *o = op_kda(&tp, d[IQ], d[IK], d[IV], d[IBETA], d[IG], NULL, NULL, 1, MIXER_FORM_CHUNKED, 16, NULL);
    real *seed = test_randn(o->numel, 9);
    setenv(CHUNK_BWD, "recurrnt", 1);
    cr_assert(EXPECT_FAILURE(tape_backward_multi(&tp, (Tensor *[]){o}, (const real *[]){seed}, 1)),
              "a misspelt " CHUNK_BWD " was taken");
    unsetenv(CHUNK_BWD);
    const char *msg = ag_last_error();
    cr_assert(strstr(msg, CHUNK_BWD) && strstr(msg, "recurrnt") && strstr(msg, "'chunked' or 'recurrent'"),
              "message: %s", msg);
    free(seed);
    dev_sync(DEVICE_CUDA);
    tape_free(&tp);
    free_inputs(x);
}

// ---------------------------------------------------------------- the scans' widths and staging

#define SCAN_COLS "ATTNLAB_KDA_SCAN_COLS"
#define SCAN_STAGE "ATTNLAB_KDA_SCAN_STAGE"

static void set_or_unset(const char *name, const char *value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

Test(cuda_kda, scan_widths_and_staging_give_the_same_bits) {
    // A state column's arithmetic is the same whatever the scans' width (4, 8
    // or 16 columns a block) and whether a chunk's W and Kd are staged in
    // shared memory: o, S_T and every gradient the same bits as the host's
    // own choice. dv off every width (72, 22, 33), a chunk past 64, dk 9,
    // documents, and chunks of 128 with dk 128, whose W and Kd the float64
    // build has no room to stage (the staged setting falls back).
    enum { T = 700 };
    static int doc[T];
    memset(doc, 0, sizeof doc);
    doc[0] = doc[63] = doc[64] = doc[333] = doc[699] = 1;
    static const struct {
        int B, T, H, dk, dv, C;
        const int *doc;
    } cases[] = {{1, T, 2, 40, 72, 64, doc}, {2, 300, 1, 24, 22, 100, NULL}, {1, 90, 2, 9, 33, 16, NULL},
                 {1, 130, 1, 128, 16, 128, NULL}};
    static const char *const set[][2] = {{"16", "0"}, {"16", "1"}, {"8", "1"}, {"8", "0"}, {"4", "1"}, {"4", "0"}};
    enum { NSET = sizeof set / sizeof set[0] };
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        Tensor *x[N_IN];
        make_inputs(x, cases[cs].B, cases[cs].T, cases[cs].H, cases[cs].dk, cases[cs].dv, REG_G_SPLIT, true, true,
                    800 + cs);
        KdaCtx c = {cases[cs].H, cases[cs].C, MIXER_FORM_CHUNKED, cases[cs].doc, 3};
        GpuRun base = gpu_run(x, &c, false);
        for (int s = 0; s < NSET; s++) {
            set_or_unset(SCAN_COLS, set[s][0]);
            set_or_unset(SCAN_STAGE, set[s][1]);
            GpuRun r = gpu_run(x, &c, false);
            set_or_unset(SCAN_COLS, NULL);
            set_or_unset(SCAN_STAGE, NULL);
            char what[96];
            snprintf(what, sizeof what, "case %zu, %s columns, staged %s", cs, set[s][0], set[s][1]);
            cr_assert(memcmp(base.o, r.o, (size_t)r.n_o * sizeof(real)) == 0, "%s: o differs", what);
            cr_assert(memcmp(base.sT, r.sT, (size_t)r.n_s * sizeof(real)) == 0, "%s: S_T differs", what);
            for (int i = 0; i < N_IN; i++)
                cr_assert(memcmp(base.grad[i], r.grad[i], (size_t)x[i]->numel * sizeof(real)) == 0, "%s: %s differs",
                          what, GRAD_NAMES[i]);
            gpu_run_free(&r);
        }
        gpu_run_free(&base);
        free_inputs(x);
    }
    // And the widest blocks, unstaged, against the CPU on the hard decays.
    set_or_unset(SCAN_COLS, "16");
    set_or_unset(SCAN_STAGE, "0");
    check_chunked(1, 150, 2, 32, 40, 32, REG_G_WILD, true, doc, 810);
    set_or_unset(SCAN_COLS, NULL);
    set_or_unset(SCAN_STAGE, NULL);
}

Test(cuda_kda, scan_settings_refuse_unknown_values) {
    cuda_require();
    static const char *const bad[][3] = {{SCAN_COLS, "32", "4, 8 or 16"}, {SCAN_STAGE, "yes", "0 (W and Kd"}};
    for (int b = 0; b < 2; b++) {
        Tensor *x[N_IN];
        make_inputs(x, 1, 20, 1, 16, 16, REG_PLAIN, false, false, 820 + b);
        Tape tp;
        tape_init_on(&tp, DEVICE_CUDA);
        Tensor *d[IS0];
        for (int i = 0; i < IS0; i++) d[i] = tape_tensor_copy(&tp, x[i]->ndim, x[i]->shape, x[i]->data);
        setenv(bad[b][0], bad[b][1], 1);
        cr_assert(EXPECT_FAILURE(op_kda(&tp, d[IQ], d[IK], d[IV], d[IBETA], d[IG], NULL, NULL, 1, MIXER_FORM_CHUNKED,
                                        16, NULL)),
                  "%s = %s was taken", bad[b][0], bad[b][1]);
        unsetenv(bad[b][0]);
        const char *msg = ag_last_error();
        cr_assert(strstr(msg, bad[b][0]) && strstr(msg, bad[b][1]) && strstr(msg, bad[b][2]), "message: %s", msg);
        dev_sync(DEVICE_CUDA);
        tape_free(&tp);
        free_inputs(x);
    }
}
