// test_cuda_gla_bf16.c: op_gla_dt (the linear and mamba mixers) on the GPU
// under [train] precision = bf16 (device_set_bf16; float32 build): its chunk
// products take bf16 operands and sum in float32 with the CPU's semantics
// (src/cuda/gla_common.cuh names the rounded operands; gla.c, gla_backward.c).
// Against a float64 host reference that replays the GPU's chunks of 64
// (the CPU's too, at chunk 64) and rounds exactly those operands, after the
// same float32 scalings, and nothing else: o, the final state, dq, dk, dv,
// dg, ddt and ds0, with and without g, dt and s0, documents, T = 1, whole and
// partial chunks (whose scores the CPU, hence the GPU, does not round).
//
// The bound is worst-case float32 arithmetic around the reference, element
// by element, carried through the chunks (the states and their gradients
// have one too, as they enter later products):
//   - a float32 sum of n exact products (bf16 x bf16 is exact in float32):
//     below 2 (n + 1) 2^-23 times the sum of the terms' sizes (sum_rel);
//   - a decay factor exp(x) taken in float32: |x| 2^-24 + 2^-21 relative;
//   - a rounded operand computed in float32 (A, dP, the states, their
//     gradients, e β k, exp(G) q): where its value's interval holds a bf16
//     rounding edge it may take the neighbouring bf16 number (flip);
//   - 2^-23 per float32 multiply, add or write.
// Each bound is then checked against references that leave one rounding
// out, or round where the semantics do not (before the scaling; the scores
// of a partial chunk): each must fall outside it somewhere, so a kernel
// that made such a mistake would fail. Then the GPU against the CPU's bf16
// chunk kernels (where this build has them), the float32 kernels unchanged
// (head dims not multiples of 16 and the recurrent form run them, the same
// bits with bf16 on), and a repeated run bit for bit.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "cuda_check.h"
#include "device.h"
#include "gla_bf16_ref.h"
#include "tile_mm_bf16.h"

#ifndef AG_DOUBLE
static const char *NAMES[N_OUT] = {"o", "final state", "dq", "dk", "dv", "dg", "ddt", "ds0"};

static Inputs inputs_make(const Case *c, uint64_t seed) {
    Inputs in;
    test_gla_inputs(in.x, c->B, c->T, c->H, c->dk, c->dv, true, true, true, -0.7, -0.05, seed);
    in.dO = test_randn((int64_t)c->B * c->T * c->H * c->dv, seed + 7);
    in.dS = test_randn((int64_t)c->B * c->H * c->dk * c->dv, seed + 8);
    return in;
}

static void inputs_free(Inputs *in) {
    for (int i = 0; i < N_X; i++) tensor_free(in->x[i]);
    free(in->dO), free(in->dS);
}

static bool used(const Case *c, int i) {
    return i < X_G || (i == X_G && c->g) || (i == X_DT && c->dt) || (i == X_S0 && c->s0);
}

// op_gla_dt of the case on a tape of device dev in `form` (chunk 64), both
// outputs seeded; on the GPU with bf16 products on or off (then off again).
// Host copies (malloc) into r[N_OUT]; NULL for an unused input's gradient.
static void run(Device dev, const Case *c, const Inputs *in, bool bf16, MixerForm form, real *r[N_OUT]) {
    if (dev == DEVICE_CUDA) device_set_bf16(DEVICE_CUDA, bf16);
    Tape tp;
    tape_init_on(&tp, dev);
    Tensor *xs[N_X];
    for (int i = 0; i < N_X; i++) {
        xs[i] = tape_tensor_copy(&tp, in->x[i]->ndim, in->x[i]->shape, in->x[i]->data);
        xs[i]->requires_grad = used(c, i);
    }
    Tensor *s;
    Tensor *o = op_gla_dt(&tp, xs[X_Q], xs[X_K], xs[X_V], c->g ? xs[X_G] : NULL, c->dt ? xs[X_DT] : NULL,
                          c->s0 ? xs[X_S0] : NULL, c->doc_start, c->H, form, CH, &s);
    tape_backward_multi(&tp, (Tensor *const[]){o, s}, (const real *const[]){in->dO, in->dS}, 2);
    Tensor *src[N_OUT] = {o, s, xs[X_Q], xs[X_K], xs[X_V], xs[X_G], xs[X_DT], xs[X_S0]};
    for (int i = 0; i < N_OUT; i++) {
        r[i] = NULL;
        if (i >= O_DQ && !used(c, i - O_DQ)) continue;
        size_t bytes = (size_t)out_numel(c, i) * sizeof(real);
        r[i] = malloc(bytes);
        dev_to_host(r[i], i < O_DQ ? src[i]->data : src[i]->grad, bytes, dev);
    }
    dev_sync(dev);
    tape_free(&tp);
    if (dev == DEVICE_CUDA) device_set_bf16(DEVICE_CUDA, false);
}

static void run_free(real *r[N_OUT]) {
    for (int i = 0; i < N_OUT; i++) free(r[i]);
}

static void label(char *s, size_t len, const Case *c) {
    snprintf(s, len, "B %d T %d H %d dk %d dv %d g %d dt %d s0 %d%s", c->B, c->T, c->H, c->dk, c->dv, c->g, c->dt,
             c->s0, c->doc_start ? " documents" : "");
}

// Every output of r (device dev's) within the bound of the reference f.
static void assert_within(const char *who, const Case *c, real *r[N_OUT], const Ref *f, double wmax[N_OUT]) {
    char lab[128];
    label(lab, sizeof lab, c);
    for (int i = 0; i < N_OUT; i++) {
        wmax[i] = 0;
        if (!r[i]) continue;
        int64_t e;
        wmax[i] = cuda_worst_ratio(r[i], f->v[i], f->t[i], out_numel(c, i), &e);
        char at[96];
        where_str(at, sizeof at, c, i, e);
        cr_assert(wmax[i] <= 1, "%s, %s: %s at %s is %.9g, the bf16 reference %.9g: error %.3g, %.3g times the "
                  "float32 bound %.3g", who, lab, NAMES[i], at, (double)r[i][e], f->v[i][e],
                  fabs(r[i][e] - f->v[i][e]), wmax[i], f->t[i][e]);
    }
}

// The roundings left out or misplaced one at a time, and all left out; for
// each, the largest excess over the bound seen so far (outputs and cases).
static const int VARIANTS[] = {ROUND_ALL & ~RQ,  ROUND_ALL & ~RK,  ROUND_ALL & ~RV,  ROUND_ALL & ~RDO,
                               ROUND_ALL & ~RA,  ROUND_ALL & ~RDP, ROUND_ALL & ~RS,  ROUND_ALL & ~RDS,
                               ROUND_ALL & ~RXK, ROUND_ALL & ~RXQ, ROUND_ALL | PRE, ROUND_ALL | PART, 0};
#define N_VARIANTS ((int)(sizeof VARIANTS / sizeof VARIANTS[0]))
static const char *VARIANT_NAMES[N_VARIANTS] = {
    "Q", "K~", "V", "dO", "A", "dP", "S", "dS", "exp(G_L - G) K~ of the state", "exp(G) Q of dS",
    "(rounding before the decay scaling)", "(rounding a partial chunk's scores)", "(none)"};

// One case on the GPU within the bound of its reference; the variants'
// excesses into excess[]. keep (not NULL): the GPU's outputs and the
// reference are kept there for the caller.
static void check_case(const Case *c, uint64_t seed, double excess[N_VARIANTS], real *keep[N_OUT], Ref *keep_ref) {
    Inputs in = inputs_make(c, seed);
    real *r[N_OUT];
    run(DEVICE_CUDA, c, &in, true, MIXER_FORM_CHUNKED, r);
    Ref f = reference(c, &in, ROUND_ALL);
    double w[N_OUT];
    assert_within("GPU bf16", c, r, &f, w);
    char lab[128];
    label(lab, sizeof lab, c);
    cr_log_info("%s: worst error / bound: o %.3g, state %.3g, dq %.3g, dk %.3g, dv %.3g, dg %.3g, ddt %.3g, ds0 %.3g",
                lab, w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]);
    for (int vi = 0; vi < N_VARIANTS; vi++) {
        Ref u = reference(c, &in, VARIANTS[vi]);
        for (int i = 0; i < N_OUT; i++)
            if (r[i]) excess[vi] = fmax(excess[vi], cuda_worst_ratio_d(u.v[i], f.v[i], f.t[i], out_numel(c, i)));
        ref_free(&u);
    }
    if (keep) memcpy(keep, r, sizeof r);
    else run_free(r);
    if (keep_ref) *keep_ref = f;
    else ref_free(&f);
    inputs_free(&in);
}

static void assert_variants(const double excess[N_VARIANTS]) {
    for (int vi = 0; vi < N_VARIANTS; vi++) {
        cr_log_info("reference without rounding %s: %.3g times the bound at most", VARIANT_NAMES[vi], excess[vi]);
        cr_assert_gt(excess[vi], 1, "the reference with rounding %s changed is within the bound everywhere (%.3g of "
                     "it at most): the test would not see a kernel that made that mistake", VARIANT_NAMES[vi],
                     excess[vi]);
    }
}

// Documents: row 0 at 0, 5, 40, 63, 64, 65, 130 and T - 1 (one-position
// documents, both sides of a chunk edge); row 1 from before the window, then
// at 3, T / 3 + 1 and 70.
static int *docs_make(int B, int T) {
    int *d = calloc((size_t)B * T, sizeof(int));
    int row0[] = {0, 5, 40, 63, 64, 65, 130, T - 1}, row1[] = {3, T / 3 + 1, 70};
    for (size_t i = 0; i < sizeof row0 / sizeof row0[0]; i++)
        if (row0[i] >= 0 && row0[i] < T) d[row0[i]] = 1;
    for (size_t i = 0; B > 1 && i < sizeof row1 / sizeof row1[0]; i++)
        if (row1[i] > 0 && row1[i] < T) d[T + row1[i]] = 1;
    return d;
}

// Lengths: one row, a partial chunk, one whole chunk, and 64 + 64 + 22.
static const int TS[] = {1, 17, 64, 150};
static const int DIMS[][2] = {{32, 32}, {16, 48}, {64, 64}};

Test(cuda_gla_bf16, against_rounded_reference) {
    cuda_require();
    double excess[N_VARIANTS] = {0};
    for (size_t ti = 0; ti < sizeof TS / sizeof TS[0]; ti++)
        for (size_t di = 0; di < sizeof DIMS / sizeof DIMS[0]; di++)
            for (int opt = 0; opt < 3; opt++)   // linear's (none), mamba's (g, dt), everything with s0
                for (int docs = 0; docs < 2; docs++) {
                    int *ds = docs ? docs_make(2, TS[ti]) : NULL;
                    Case c = {2, TS[ti], 2, DIMS[di][0], DIMS[di][1], opt > 0, opt > 0, opt == 2, ds};
                    check_case(&c, 1000 + 100 * ti + 10 * di + 2 * opt + docs, excess, NULL, NULL);
                    free(ds);
                }
    // dk above GLA_MMA_DK (128): the backward's dq and dK̃ products in the
    // scalar loops, the rest on the tensor cores
    int *ds = docs_make(1, 150);
    Case big = {1, 150, 2, 144, 16, true, true, true, ds};
    check_case(&big, 1999, excess, NULL, NULL);
    free(ds);
    assert_variants(excess);
}

// The GPU's bf16 kernels against the CPU's (gla.c's chunked form at chunk
// 64, tile_products_bf16): both within the bound of the same reference,
// so within twice it of each other. The CPU's bf16 tile products need
// AVX512_BF16 code (AG_NATIVE on such a CPU) and oneDNN's bf16 switch: where
// this build or CPU lacks them the test says so and skips.
Test(cuda_gla_bf16, against_cpu_bf16) {
    cuda_require();
    if (!onednn_built() || !onednn_has_bf16())
        cr_skip_test("this build has no oneDNN or this CPU no AVX512_BF16: no bf16 products on the CPU here");
    char err[256];
    cr_assert(blas_select(GEMM_ONEDNN, PRECISION_BF16, err, sizeof err), "%s", err);
    if (!tile_products_bf16()) {
        blas_select(GEMM_ONEDNN, PRECISION_FP32, err, sizeof err);
        cr_skip_test("this build's CPU chunk kernels have no bf16 tile products (AG_NATIVE=OFF?)");
    }
    int cases[][4] = {{150, 32, 32, 2}, {100, 64, 64, 1}, {64, 16, 48, 0}};
    double excess[N_VARIANTS] = {0};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int docs = 0; docs < 2; docs++) {
            int *ds = docs ? docs_make(2, cases[ci][0]) : NULL;
            int opt = cases[ci][3];
            Case c = {2, cases[ci][0], 2, cases[ci][1], cases[ci][2], opt > 0, opt > 0, opt == 2, ds};
            uint64_t seed = 5000 + 10 * ci + docs;
            real *g[N_OUT], *h[N_OUT];
            Ref f;
            check_case(&c, seed, excess, g, &f);
            Inputs in = inputs_make(&c, seed);   // check_case's inputs again
            run(DEVICE_CPU, &c, &in, true, MIXER_FORM_CHUNKED, h);
            double w[N_OUT];
            assert_within("CPU bf16", &c, h, &f, w);
            for (int i = 0; i < N_OUT; i++) {
                if (!g[i]) continue;
                int64_t at = 0, n = out_numel(&c, i);
                double wg = 0;
                for (int64_t e = 0; e < n; e++) {
                    double d = fabs((double)g[i][e] - h[i][e]) / (2 * f.t[i][e]);
                    if (!(d <= wg)) wg = d, at = e;
                }
                char where[96];
                where_str(where, sizeof where, &c, i, at);
                cr_assert(wg <= 1, "T %d dk %d dv %d%s: %s at %s: GPU %.9g, CPU %.9g, %.3g times twice the bound %.3g",
                          c.T, c.dk, c.dv, docs ? ", documents" : "", NAMES[i], where, (double)g[i][at],
                          (double)h[i][at], wg, f.t[i][at]);
                cr_log_info("T %d dk %d dv %d%s: %s, GPU against CPU: %.3g of twice the bound", c.T, c.dk, c.dv,
                            docs ? " docs" : "", NAMES[i], wg);
            }
            run_free(g), run_free(h), ref_free(&f);
            inputs_free(&in);
            free(ds);
        }
    blas_select(GEMM_ONEDNN, PRECISION_FP32, err, sizeof err);
}

static bool same(const real *a, const real *b, int64_t n) { return !memcmp(a, b, (size_t)n * sizeof(real)); }

// Head dims that are not multiples of 16 and the recurrent form run the
// float32 kernels with bf16 on: the same bits as with it off. Float32 runs
// before and after a bf16 run give the same bits (the switch leaves nothing
// behind), which the bf16 run does not; the parallel form is the chunked
// one on the GPU (the same bits in bf16); a bf16 run repeats bit for bit.
Test(cuda_gla_bf16, float32_kernels_unchanged) {
    cuda_require();
    int *ds = docs_make(2, 100);
    int dims[][2] = {{24, 40}, {32, 32}};
    for (int di = 0; di < 2; di++) {
        Case c = {2, 100, 2, dims[di][0], dims[di][1], true, true, true, ds};
        Inputs in = inputs_make(&c, 70 + di);
        real *f[N_OUT], *h[N_OUT], *f2[N_OUT], *h2[N_OUT], *p[N_OUT], *rf[N_OUT], *rh[N_OUT];
        run(DEVICE_CUDA, &c, &in, false, MIXER_FORM_CHUNKED, f);
        run(DEVICE_CUDA, &c, &in, true, MIXER_FORM_CHUNKED, h);
        run(DEVICE_CUDA, &c, &in, false, MIXER_FORM_CHUNKED, f2);
        run(DEVICE_CUDA, &c, &in, true, MIXER_FORM_CHUNKED, h2);
        run(DEVICE_CUDA, &c, &in, true, MIXER_FORM_PARALLEL, p);
        run(DEVICE_CUDA, &c, &in, false, MIXER_FORM_RECURRENT, rf);
        run(DEVICE_CUDA, &c, &in, true, MIXER_FORM_RECURRENT, rh);
        bool differs = false;
        for (int i = 0; i < N_OUT; i++) {
            int64_t n = out_numel(&c, i);
            cr_assert(same(f[i], f2[i], n), "dk %d dv %d: %s of float32 runs before and after a bf16 run differ",
                      c.dk, c.dv, NAMES[i]);
            cr_assert(same(h[i], h2[i], n), "dk %d dv %d: %s differs between two bf16 runs", c.dk, c.dv, NAMES[i]);
            cr_assert(same(h[i], p[i], n), "dk %d dv %d: %s of the parallel form differs from the chunked form's in "
                      "bf16", c.dk, c.dv, NAMES[i]);
            cr_assert(same(rf[i], rh[i], n), "dk %d dv %d: the recurrent form's %s changed with bf16 on", c.dk, c.dv,
                      NAMES[i]);
            if (di == 0)
                cr_assert(same(f[i], h[i], n), "dk %d dv %d (not multiples of 16: float32 kernels): %s changed with "
                          "bf16 on", c.dk, c.dv, NAMES[i]);
            else
                differs = differs || !same(f[i], h[i], n);
        }
        if (di == 1) cr_assert(differs, "dk 32 dv 32: every output the same bits with bf16 on: did it run in bf16?");
        run_free(f), run_free(h), run_free(f2), run_free(h2), run_free(p), run_free(rf), run_free(rh);
        inputs_free(&in);
    }
    free(ds);
}
#endif
