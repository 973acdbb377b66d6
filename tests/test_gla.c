// Tests of op_gla (src/layers/gla.h): gradient checks of every form, the
// three forms against each other, the decay regimes g = 0 and g ≈ −20 per
// step, state carried across segments, and a hand-computed case.
#include <math.h>
#include <omp.h>

#include "blas.h"
#include "gla.h"
#include "tile_amx.h"
#include "tile_mm_bf16.h"
#include "test_util.h"

enum { IN_Q, IN_K, IN_V, IN_G, IN_DT, IN_S0, N_IN };

typedef struct GlaCase {
    int B, T, H, dk, dv, chunk;
    MixerForm form;
    bool use_g, use_dt, use_s0;
    double g_lo, g_hi;   // g uniform in [g_lo, g_hi]
    const int *docs;     // doc_start (B, T), or NULL
} GlaCase;

static const MixerForm FORMS[] = {MIXER_FORM_PARALLEL, MIXER_FORM_CHUNKED, MIXER_FORM_RECURRENT};

// The three decay regimes: moderate, none (g = 0) and strong (≈ −20 per step).
typedef struct Regime {
    const char *name;
    double lo, hi;
} Regime;
static const Regime REGIMES[] = {{"mild", -0.7, -0.05}, {"zero", 0, 0}, {"strong", -21, -19}};

static void inputs_make(Tensor **x, const GlaCase *c, uint64_t seed) {
    test_gla_inputs(x, c->B, c->T, c->H, c->dk, c->dv, c->use_g, c->use_dt, c->use_s0, c->g_lo, c->g_hi, seed);
}

static void inputs_free(Tensor **x) {
    for (int i = 0; i < N_IN; i++) tensor_free(x[i]);
}

static Tensor *run_gla(Tape *tp, Tensor *const *in, const GlaCase *c, Tensor **s_out) {
    return op_gla_dt(tp, in[IN_Q], in[IN_K], in[IN_V], c->use_g ? in[IN_G] : NULL, c->use_dt ? in[IN_DT] : NULL,
                     c->use_s0 ? in[IN_S0] : NULL, c->docs, c->H, c->form, c->chunk, s_out);
}

static int f_gla(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = run_gla(tp, in, ctx, &out[1]);
    return 2;
}

// Gradcheck of one case w.r.t. q, k, v, g, dt, s0, seeded on o and the final
// state, with the build's finite-difference step, or eps when eps > 0.
static void check_case_eps(GlaCase c, const char *label, double eps) {
    Tensor *x[N_IN];
    inputs_make(x, &c, 100);
    bool strong = c.use_g && c.g_hi < -10;
    GradcheckOptions opt = gradcheck_defaults();
    if (eps > 0) opt.eps = eps;
    if (!strong) {
        GradcheckResult r = gradcheck(label, f_gla, x, N_IN, &c, &opt);
        ASSERT_GRADCHECK(r, label);
        cr_assert_gt(r.n_checked, 0);
    } else {
        // q, k, v, dt: O(1) gradients, checked as usual.
        x[IN_G]->requires_grad = x[IN_S0]->requires_grad = false;
        GradcheckResult r = gradcheck(label, f_gla, x, N_IN, &c, &opt);
        ASSERT_GRADCHECK(r, label);
#ifdef AG_DOUBLE
        // g, s0: every path from them carries a factor exp(−20) or smaller, so
        // their gradients are ~1e-9 and below while o is O(1). A step eps
        // moves o by ~1e-9 eps, resolved only to o's rounding (~1e-16): at
        // eps = 1e-6 that is ~10% noise on the largest of these gradients and
        // more on the smaller ones. With eps = 1e-2 the noise is ~1e-13
        // (1e-4 of the largest) and the truncation error ~eps²/6 (o is
        // exponential in g, linear in s0); so compare every element on the
        // scale of the input's largest gradient (floor_frac 1) at tol 1e-3.
        // The tight check of these gradients is forms_agree (strong regime)
        // against the recurrent form, which is checked here in the other
        // regimes. float32 cannot resolve them at all.
        x[IN_Q]->requires_grad = x[IN_K]->requires_grad = x[IN_V]->requires_grad = false;
        x[IN_DT]->requires_grad = false;
        x[IN_G]->requires_grad = x[IN_S0]->requires_grad = true;
        GradcheckOptions o = gradcheck_defaults();
        o.eps = 1e-2;
        o.tol = 1e-3;
        o.floor_frac = 1;
        r = gradcheck(label, f_gla, x, N_IN, &c, &o);
        ASSERT_GRADCHECK(r, label);
        cr_assert_gt(r.n_checked, 0);
#endif
    }
    inputs_free(x);
}

static void check_case(GlaCase c, const char *label) { check_case_eps(c, label, 0); }

Test(gla, gradcheck_every_form_and_regime) {
    // T = 11 with chunks of 4: the last chunk is partial.
    for (size_t f = 0; f < 3; f++)
        for (size_t r = 0; r < 3; r++) {
            GlaCase c = {2, 11, 2, 3, 4, 4, FORMS[f], true, true, true, REGIMES[r].lo, REGIMES[r].hi};
            char label[96];
            snprintf(label, sizeof label, "gla %s g %s", mixer_form_name(FORMS[f]), REGIMES[r].name);
            check_case(c, label);
        }
}

Test(gla, gradcheck_without_g_dt_s0) {
    // linear's call: no decay, no dt, zero initial state (s_out still seeded).
    for (size_t f = 0; f < 3; f++) {
        GlaCase c = {2, 11, 2, 3, 4, 4, FORMS[f], false, false, false, 0, 0};
        char label[64];
        snprintf(label, sizeof label, "gla %s plain", mixer_form_name(FORMS[f]));
        check_case(c, label);
    }
}

// Forward o, s_out and every gradient of one case, seeded with fixed random
// dO, dS, on device_default() (AG_DEVICE=cuda: the GPU).
typedef struct Result {
    real *all;      // o | s_out | dq | dk | dv | dg | ddt | ds0
    int64_t n;
} Result;

static Result run_all(GlaCase c, Tensor **x) {
    real *out[2];
    int64_t on[2];
    cr_assert_eq(gradcheck_run(f_gla, x, N_IN, &c, 7, out, on), 2);
    Result r = {0};
    r.n = on[0] + on[1];
    for (int i = 0; i < N_IN; i++) r.n += x[i]->numel;
    r.all = xcalloc((size_t)r.n, sizeof(real));
    real *p = r.all;
    memcpy(p, out[0], on[0] * sizeof(real)), p += on[0];
    memcpy(p, out[1], on[1] * sizeof(real)), p += on[1];
    for (int i = 0; i < N_IN; i++) {
        if (x[i]->requires_grad) memcpy(p, x[i]->grad, x[i]->numel * sizeof(real));
        p += x[i]->numel;
    }
    free(out[0]);
    free(out[1]);
    return r;
}

// The sizes of a Result's eight parts, in its order.
static void result_sizes(Tensor **x, int64_t sizes[8]) {
    sizes[0] = x[IN_V]->numel, sizes[1] = x[IN_S0]->numel;
    for (int i = 0; i < N_IN; i++) sizes[2 + i] = x[i]->numel;
}

#ifdef AG_TILE_BF16
// r run again on another thread count (1, or 2 where it ran on 1): the same
// bits, asserted; `what` names the run in the message.
static void assert_same_on_other_threads(GlaCase c, Tensor **x, const Result *r, const char *what) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(saved == 1 ? 2 : 1);
    Result r1 = run_all(c, x);
    omp_set_num_threads(saved);
    cr_assert_eq(memcmp(r->all, r1.all, (size_t)r->n * sizeof(real)), 0, "%s dk %d: results differ on 1 and 2 threads",
                 what, c.dk);
    free(r1.all);
}
#endif

// Each part of the result compared on its own scale.
static void assert_results_agree(const Result *a, const Result *b, GlaCase c, Tensor **x, const char *label) {
    static const char *names[] = {"o", "s_out", "dq", "dk", "dv", "dg", "ddt", "ds0"};
    int64_t sizes[8], off = 0;
    result_sizes(x, sizes);
    for (int p = 0; p < 8; p++) {
        double d = max_rel_diff(a->all + off, b->all + off, sizes[p]);
        cr_assert(d <= FORM_TOL, "%s: %s differs by %.3e (tolerance %.0e)", label, names[p], d, FORM_TOL);
        for (int64_t e = 0; e < sizes[p]; e++)
            cr_assert(isfinite(a->all[off + e]), "%s: %s[%lld] not finite", label, names[p], (long long)e);
        off += sizes[p];
    }
}

static void check_forms_agree(GlaCase c, const char *what) {
    Tensor *x[N_IN];
    inputs_make(x, &c, 200);
    c.form = MIXER_FORM_RECURRENT;
    Result ref = run_all(c, x);
    for (int f = 0; f < 2; f++) {
        c.form = FORMS[f];
        Result r = run_all(c, x);
        char label[128];
        snprintf(label, sizeof label, "%s: %s vs recurrent (T %d, C %d)", what, mixer_form_name(c.form), c.T,
                 c.chunk);
        assert_results_agree(&r, &ref, c, x, label);
        free(r.all);
    }
    free(ref.all);
    inputs_free(x);
}

Test(gla, forms_agree_forward_and_every_gradient) {
    int TC[][2] = {{37, 8}, {16, 4}, {3, 8}, {1, 4}, {20, 1}};   // partial, exact, T < C, T = 1, C = 1
    for (size_t r = 0; r < 3; r++)
        for (size_t i = 0; i < sizeof TC / sizeof TC[0]; i++) {
            GlaCase c = {2, TC[i][0], 3, 5, 6, TC[i][1], 0, true, true, true, REGIMES[r].lo, REGIMES[r].hi};
            check_forms_agree(c, REGIMES[r].name);
        }
    GlaCase plain = {2, 37, 3, 5, 6, 8, 0, false, false, false, 0, 0};
    check_forms_agree(plain, "plain");
}

// Head sizes and chunks of whole vectors (16 and 32 are multiples of the
// vector width in both builds), so the chunks' products run through the
// register-blocked tile_mm (chunk_mm), with a partial last chunk (T = 37)
// falling back to gemm(): gradients and agreement with the recurrent form.
// Finite-difference step 1e-4 in float64: these outputs are ~30x larger than
// the small cases', and at the default 1e-6 the rounding of f alone gave s0's
// gradient a 7e-6 relative error (8e-5 at 1e-7, 1e-6 at 1e-5, 1.4e-7 at 1e-4:
// the error falls as 1/eps, so it is rounding, the same with gemm() alone;
// k's in the strong regime likewise: 2.5e-6, 2e-7, 2e-8);
// the truncation error at 1e-4 is ~1e-8. The tolerance stays 1e-6.
#ifdef AG_DOUBLE
#define TILE_EPS 1e-4
#else
#define TILE_EPS 0   // the float32 default
#endif
Test(gla, tile_products_gradcheck_and_forms_agree) {
    for (size_t r = 0; r < 3; r++) {
        GlaCase c = {1, 37, 2, 16, 32, 16, MIXER_FORM_CHUNKED, true, true, true, REGIMES[r].lo, REGIMES[r].hi};
        char label[96];
        snprintf(label, sizeof label, "tile-sized gla g %s", REGIMES[r].name);
        check_case_eps(c, label, TILE_EPS);
        check_forms_agree(c, label);
    }
    GlaCase plain = {2, 37, 2, 32, 16, 16, MIXER_FORM_CHUNKED, false, false, false, 0, 0};
    check_case_eps(plain, "tile-sized gla plain", TILE_EPS);
    check_forms_agree(plain, "tile-sized gla plain");
}

// Under precision = bf16 the chunked form's products take bf16 operands and
// sum in float32 (gla.c; each product is held to the exact product of its
// rounded operands in tile_mm/tile_gemm_rows_bf16_*): the op against its
// float32 self, with g, dt, an initial state and documents, heads of whole
// vectors (16, 32), chunks of 32 and 64 and T = 100 (a last chunk of 4 or
// 36 rows, whose L x L products stay float32), the three decay regimes.
// Each output and gradient, normwise (largest difference over largest
// value): measured 2e-3..6.5e-3, allowed 2e-2 (rounding moves an operand by up
// to 2^-9 of itself, and an output passes through two products in a row:
// the scores, then A V). Were the products not bf16, both runs would be one
// float32 computation: every part must differ by more than 1e-4. Bit for
// bit on 1 and 2 threads.
Test(gla, bf16_chunk_products_follow_float32) {
#ifndef AG_TILE_BF16
    cr_skip_test("this build has no bf16 tile products (float64, or no AVX512_BF16 target)");
#else
    if (!(onednn_built() && onednn_has_bf16())) cr_skip_test("this CPU has no AVX512_BF16 (or no oneDNN)");
    static const char *names[] = {"o", "s_out", "dq", "dk", "dv", "dg", "ddt", "ds0"};
    enum { B = 2, T = 100 };
    int docs[B * T] = {0};
    docs[40] = docs[T + 77] = 1;   // a document inside a chunk of each row
    char err[256];
    double lo = INFINITY, hi = 0;
    for (size_t r = 0; r < 3; r++)
        for (int shape = 0; shape < 2; shape++) {
            GlaCase c = {B, T, 2, shape ? 16 : 32, shape ? 32 : 16, shape ? 32 : 64, MIXER_FORM_CHUNKED, true, true,
                         true, REGIMES[r].lo, REGIMES[r].hi, docs};
            Tensor *x[N_IN];
            inputs_make(x, &c, 300 + r);
            cr_assert(blas_select(GEMM_ONEDNN, PRECISION_FP32, err, sizeof err), "%s", err);
            Result f = run_all(c, x);
            cr_assert(blas_select(GEMM_ONEDNN, PRECISION_BF16, err, sizeof err), "%s", err);
            Result h = run_all(c, x);
            char what[64];
            snprintf(what, sizeof what, "%s, bf16", REGIMES[r].name);
            assert_same_on_other_threads(c, x, &h, what);
            int64_t sizes[8], off = 0;
            result_sizes(x, sizes);
            for (int p = 0; p < 8; p++) {
                double d = max_rel_diff(f.all + off, h.all + off, sizes[p]);
                cr_assert_leq(d, 2e-2, "%s dk %d dv %d C %d: bf16 %s differs from float32 by %.3g",
                              REGIMES[r].name, c.dk, c.dv, c.chunk, names[p], d);
                lo = fmin(lo, d), hi = fmax(hi, d);
                off += sizes[p];
            }
            free(f.all), free(h.all);
            inputs_free(x);
        }
    cr_assert_gt(lo, 1e-4, "a part is within %.3g of float32: were the chunk products bf16?", lo);
    cr_log_info("gla bf16 against float32, normwise: %.3g .. %.3g", lo, hi);
    test_use_backend(0);
#endif
}

// The same op under bf16 with its chunk products on AMX (bf16_tiles = amx)
// and on AVX512_BF16: the same rounded operands, float32 sums in another
// order (test_tile_amx_chunk.c holds each product to float32's bound, about
// 64 2^-24 = 4e-6 of its terms at these sizes). A sum on the other side of
// a bf16 rounding boundary moves the next product's operand (the scores,
// rounded for A V) by 2^-9 of itself, but rarely: normwise measured up to
// 3.2e-7, allowed 1e-4, far below bf16 from float32 (2e-3 at least, the
// test above). Some part must differ at all (else AMX did not run), and AMX
// is bit for bit on 1 and 2 threads.
#define AMX_GAP_SEEN "3.2e-7"
Test(gla, amx_chunk_products_follow_avx512bf16) {
#ifndef AG_TILE_AMX
    cr_skip_test("this build has no AMX tiles (float64, no AVX512_BF16 target, or not GCC 11+ on x86-64 Linux)");
#else
    char why[200], err[256];
    if (!amx_bf16_usable(why, sizeof why)) cr_skip_test("%s", why);
    static const char *names[] = {"o", "s_out", "dq", "dk", "dv", "dg", "ddt", "ds0"};
    enum { B = 2, T = 100 };
    int docs[B * T] = {0};
    docs[40] = docs[T + 77] = 1;
    cr_assert(blas_select(GEMM_ONEDNN, PRECISION_BF16, err, sizeof err), "%s", err);
    double hi = 0;
    for (size_t r = 0; r < 3; r++)
        for (int shape = 0; shape < 2; shape++) {
            GlaCase c = {B, T, 2, shape ? 16 : 32, shape ? 32 : 16, shape ? 32 : 64, MIXER_FORM_CHUNKED, true, true,
                         true, REGIMES[r].lo, REGIMES[r].hi, docs};
            Tensor *x[N_IN];
            inputs_make(x, &c, 400 + r);
            cr_assert(bf16_tiles_select(BF16_TILES_AVX512BF16, err, sizeof err), "%s", err);
            Result v = run_all(c, x);
            cr_assert(bf16_tiles_select(BF16_TILES_AMX, err, sizeof err), "%s", err);
            Result a = run_all(c, x);
            char what[64];
            snprintf(what, sizeof what, "%s, AMX", REGIMES[r].name);
            assert_same_on_other_threads(c, x, &a, what);
            int64_t sizes[8], off = 0;
            result_sizes(x, sizes);
            for (int p = 0; p < 8; p++) {
                double d = max_rel_diff(v.all + off, a.all + off, sizes[p]);
                cr_assert_leq(d, 1e-4, "%s dk %d dv %d C %d: %s on AMX differs from AVX512_BF16 by %.3g",
                              REGIMES[r].name, c.dk, c.dv, c.chunk, names[p], d);
                hi = fmax(hi, d);
                off += sizes[p];
            }
            free(v.all), free(a.all);
            inputs_free(x);
        }
    cr_assert_gt(hi, 0, "AMX and AVX512_BF16 gave the same bits everywhere: did AMX run?");
    cr_log_info("gla AMX against AVX512_BF16, normwise: up to %.3g (seen " AMX_GAP_SEEN ")", hi);
    cr_assert(bf16_tiles_select(BF16_TILES_AUTO, err, sizeof err), "%s", err);
    test_use_backend(0);
#endif
}

// A forward alone (no output seeded) of f on device_default() (AG_DEVICE=cuda:
// the GPU): its two outputs back on the host (free with free()), out_n
// their sizes (may be NULL).
static void forward_only(GradcheckFn f, Tensor *const *in, int n, void *ctx, real **out, int64_t *out_n) {
    cr_assert_eq(gradcheck_run_seeds(f, in, n, ctx, (const real *[]){NULL, NULL}, out, out_n), 2);
}

Test(gla, strong_decay_is_finite_and_exact) {
    // −20 per step over chunks of 64: cumulative sums reach −1280 inside a
    // chunk; a ratio of exponentials would overflow. With g = −20 exactly,
    // o_t has only the current token and the previous one (e^−20) above
    // double rounding: compare with that closed form. On device_default().
    GlaCase c = {1, 150, 2, 4, 4, 64, 0, true, false, false, -20, -20};
    Tensor *x[N_IN];
    inputs_make(x, &c, 300);
    for (size_t f = 0; f < 3; f++) {
        c.form = FORMS[f];
        real *out[2];
        int64_t on[2];
        forward_only(f_gla, x, N_IN, &c, out, on);
        const real *o = out[0], *s = out[1];
        int Hk = c.H * c.dk, Hv = c.H * c.dv;
        double worst = 0;
        for (int t = 0; t < c.T; t++)
            for (int h = 0; h < c.H; h++)
                for (int j = 0; j < c.dv; j++) {
                    double want = 0;
                    for (int s2 = imax(0, t - 1); s2 <= t; s2++) {
                        double qk = 0;
                        for (int a = 0; a < c.dk; a++)
                            qk += x[IN_Q]->data[t * Hk + h * c.dk + a] * x[IN_K]->data[s2 * Hk + h * c.dk + a];
                        want += exp(-20.0 * (t - s2)) * qk * x[IN_V]->data[s2 * Hv + h * c.dv + j];
                    }
                    double got = o[t * Hv + h * c.dv + j];
                    cr_assert(isfinite(got));
                    worst = fmax(worst, fabs(got - want));
                }
        cr_assert(worst < 1e3 * REAL_EPS, "%s: |o - closed form| = %.3e", mixer_form_name(c.form), worst);
        for (int64_t e = 0; e < on[1]; e++) cr_assert(isfinite(s[e]));
        free(out[0]);
        free(out[1]);
    }
    inputs_free(x);
}

// hand_computed_two_steps' inputs, (1, 2, 1) each, built on the tape from host arrays.
typedef struct HandCase {
    const real *q, *k, *v, *g, *dt;
    MixerForm form;
} HandCase;

static int f_hand(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    const HandCase *h = ctx;
    const int *shape = (int[]){1, 2, 1};
    Tensor *tq = tape_tensor_copy(tp, 3, shape, h->q), *tk = tape_tensor_copy(tp, 3, shape, h->k);
    Tensor *tv = tape_tensor_copy(tp, 3, shape, h->v), *tg = tape_tensor_copy(tp, 3, shape, h->g);
    Tensor *tdt = tape_tensor_copy(tp, 3, shape, h->dt);
    out[0] = op_gla_dt(tp, tq, tk, tv, tg, tdt, NULL, NULL, 1, h->form, 1, &out[1]);
    return 2;
}

Test(gla, hand_computed_two_steps) {
    // H = 1, dk = dv = 1: S_0 = dt0 k0 v0, o_0 = q0 S_0; S_1 = γ1 S_0 + dt1 k1 v1, o_1 = q1 S_1.
    // On device_default().
    real q[] = {2, 3}, k[] = {5, 7}, v[] = {11, 13}, g[] = {-0.5, -0.25}, dt[] = {0.5, 2};
    double S0 = 0.5 * 5 * 11, S1 = exp(-0.25) * S0 + 2 * 7 * 13;
    double want[] = {2 * S0, 3 * S1};
    for (size_t f = 0; f < 3; f++) {
        HandCase h = {q, k, v, g, dt, FORMS[f]};
        real *out[2];
        forward_only(f_hand, NULL, 0, &h, out, NULL);
        for (int t = 0; t < 2; t++) cr_assert_float_eq(out[0][t], want[t], 1e-4 * fabs(want[t]));
        cr_assert_float_eq(out[1][0], S1, 1e-4 * S1);
        free(out[0]);
        free(out[1]);
    }
}

// Inverse of test_time_slice: copy src, (B, len, C), into x-shaped buf at t0.
static void time_unslice(real *buf, const Tensor *x, const real *src, int len, int t0) {
    int B = x->shape[0], T = x->shape[1], C = x->shape[2];
    for (int b = 0; b < B; b++)
        memcpy(buf + ((int64_t)b * T + t0) * C, src + (int64_t)b * len * C, (size_t)len * C * sizeof(real));
}

// Two segments on one tape: in = q, k, v, g, dt of segment 1, the same of
// segment 2, s0; outputs o1, o2 and the second segment's final state.
enum { SEG_S0 = 2 * IN_S0, N_SEG_IN };
static int f_segments(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    const GlaCase *c = ctx;
    Tensor *const *a = in, *const *b = in + IN_S0;
    Tensor *s1;
    out[0] = op_gla_dt(tp, a[IN_Q], a[IN_K], a[IN_V], a[IN_G], a[IN_DT], in[SEG_S0], NULL, c->H, c->form, c->chunk,
                       &s1);
    out[1] = op_gla_dt(tp, b[IN_Q], b[IN_K], b[IN_V], b[IN_G], b[IN_DT], s1, NULL, c->H, c->form, c->chunk, &out[2]);
    return 3;
}

// Two segments, the first's final state fed as the second's initial state,
// equal one long run: outputs, final state and every gradient (the one into
// the first segment and s0 flows back through the carried state). Both runs
// on device_default() (AG_DEVICE=cuda: the GPU), the segments on one tape.
static void segments_vs_long(MixerForm form) {
    GlaCase c = {2, 13, 2, 3, 4, 4, form, true, true, true, -0.8, -0.05};
    Tensor *x[N_IN];
    inputs_make(x, &c, 400);
    int T1 = 6, T2 = c.T - T1;
    Result whole = run_all(c, x);

    Tensor *in[N_SEG_IN];
    for (int i = 0; i < IN_S0; i++) {   // q, k, v, g, dt cut along time
        in[i] = test_time_slice(x[i], 0, T1);
        in[IN_S0 + i] = test_time_slice(x[i], T1, T2);
    }
    in[SEG_S0] = x[IN_S0];
    // The same dO as run_all, cut in two; the same dS on the final state.
    Tensor *dO = tensor_new(3, (int[]){c.B, c.T, c.H * c.dv}, false), *dS = tensor_new(4, x[IN_S0]->shape, false);
    fill_normal(dO, 7, 1.0);
    fill_normal(dS, 8, 1.0);
    Tensor *dO1 = test_time_slice(dO, 0, T1), *dO2 = test_time_slice(dO, T1, T2);
    real *out[3];
    cr_assert_eq(gradcheck_run_seeds(f_segments, in, N_SEG_IN, &c, (const real *[]){dO1->data, dO2->data, dS->data},
                                     out, NULL),
                 3);

    Result seg = {xcalloc((size_t)whole.n, sizeof(real)), whole.n};
    real *p = seg.all;
    time_unslice(p, dO, out[0], T1, 0), time_unslice(p, dO, out[1], T2, T1), p += dO->numel;
    memcpy(p, out[2], x[IN_S0]->numel * sizeof(real)), p += x[IN_S0]->numel;
    for (int i = 0; i < IN_S0; i++) {
        time_unslice(p, x[i], in[i]->grad, T1, 0);
        time_unslice(p, x[i], in[IN_S0 + i]->grad, T2, T1);
        p += x[i]->numel;
    }
    memcpy(p, x[IN_S0]->grad, x[IN_S0]->numel * sizeof(real));
    char label[64];
    snprintf(label, sizeof label, "segments vs long run, %s", mixer_form_name(form));
    assert_results_agree(&seg, &whole, c, x, label);
    free(seg.all);
    free(whole.all);
    for (int k = 0; k < 3; k++) free(out[k]);
    tensor_free(dO), tensor_free(dO1), tensor_free(dO2), tensor_free(dS);
    for (int i = 0; i < 2 * IN_S0; i++) tensor_free(in[i]);
    inputs_free(x);
}

Test(gla, state_carried_across_segments_equals_long_run) {
    for (size_t f = 0; f < 3; f++) segments_vs_long(FORMS[f]);
}

Test(gla, only_state_output_seeded) {
    // A gradient that enters only through s_out (o unused, not seeded) still
    // reaches every input. On device_default().
    GlaCase c = {1, 9, 2, 3, 3, 4, MIXER_FORM_CHUNKED, true, true, true, -0.5, -0.1};
    Tensor *x[N_IN];
    inputs_make(x, &c, 500);
    real *ones = test_ones(x[IN_S0]->numel);   // d sum(s_out) / d s_out
    for (size_t f = 0; f < 3; f++) {
        c.form = FORMS[f];
        real *out[2];
        cr_assert_eq(gradcheck_run_seeds(f_gla, x, N_IN, &c, (const real *[]){NULL, ones}, out, NULL), 2);
        // q only reaches o: its gradient stays zero; every other input moves S_T.
        for (int i = 0; i < N_IN; i++) {
            double mx = 0;
            for (int64_t e = 0; e < x[i]->numel; e++) mx = fmax(mx, fabs(x[i]->grad[e]));
            if (i == IN_Q) cr_assert_eq(mx, 0.0, "%s: dq should be 0", mixer_form_name(c.form));
            else cr_assert_gt(mx, 0.0, "%s: input %d got no gradient", mixer_form_name(c.form), i);
        }
        free(out[0]);
        free(out[1]);
    }
    free(ones);
    inputs_free(x);
}

Test(gla, shape_mismatch_names_op_and_shapes) {
    Tape tp;
    tape_init(&tp);
    Tensor *q = tensor_newv(false, 3, 1, 5, 8), *v = tensor_newv(false, 3, 1, 5, 8);
    Tensor *g = tensor_newv(false, 3, 1, 5, 3);
    cr_assert(EXPECT_FAILURE(op_gla(&tp, q, q, v, g, NULL, NULL, 2, MIXER_FORM_CHUNKED, 4, NULL)));
    cr_assert(strstr(ag_last_error(), "gla") && strstr(ag_last_error(), "(1, 5, 3)"), "got: %s", ag_last_error());
    cr_assert(EXPECT_FAILURE(op_gla(&tp, q, q, v, NULL, NULL, NULL, 3, MIXER_FORM_CHUNKED, 4, NULL)));
    cr_assert(strstr(ag_last_error(), "n_heads 3"), "got: %s", ag_last_error());
    tensor_free(q);
    tensor_free(v);
    tensor_free(g);
    tape_free(&tp);
}
