// Optimisers, clipping and the learning-rate schedule against hand-computed values.
#include <math.h>
#include <omp.h>
#include <string.h>

#include "optim.h"
#include "test_util.h"

// Expected values are computed in double; float32 keeps ~7 digits of them.
#ifdef AG_DOUBLE
#define OPT_TOL 1e-12
#else
#define OPT_TOL 2e-6
#endif

// Three parameters: a (decays), b (TENSOR_NO_DECAY), c (frozen).
typedef struct { ParamStore ps; Tensor *a, *b, *c; } Tiny;

static void tiny_make(Tiny *t) {
    params_init(&t->ps);
    t->a = params_add(&t->ps, "a", 1, (int[]){2}, init_zeros(), 0);
    t->b = params_add(&t->ps, "b", 1, (int[]){1}, init_zeros(), TENSOR_NO_DECAY);
    t->c = params_add(&t->ps, "c", 1, (int[]){2}, init_zeros(), 0);
    params_finalize(&t->ps, 1);
    t->a->data[0] = 1.0, t->a->data[1] = -2.0;
    t->b->data[0] = 3.0;
    t->c->data[0] = 5.0, t->c->data[1] = -5.0;
    params_set_frozen(&t->ps, t->c, true);
}

static void tiny_grads(Tiny *t, double a0, double a1, double b0) {
    t->a->grad[0] = (real)a0, t->a->grad[1] = (real)a1;
    t->b->grad[0] = (real)b0;
}

Test(optim, adamw_two_steps_match_hand_computation) {
    Tiny t;
    tiny_make(&t);
    Optimizer opt;
    adamw_init(&opt, &t.ps, 0.9, 0.999, 1e-8, 0.1);
    // Step 1: m_hat = g, v_hat = g^2, so the Adam update is lr * g/(|g| + eps);
    // a decays first by lr*wd: 1 - 0.01 - 0.1 = 0.89.
    tiny_grads(&t, 0.5, -1.0, 2.0);
    optim_step(&opt, &t.ps, 0.1);
    cr_assert_float_eq(t.a->data[0], 0.890000002, OPT_TOL);
    cr_assert_float_eq(t.a->data[1], -1.880000001, OPT_TOL);
    cr_assert_float_eq(t.b->data[0], 2.9000000005, OPT_TOL);   // no decay: 3 - 0.1
    tiny_grads(&t, 0.2, 0.4, -1.0);
    optim_step(&opt, &t.ps, 0.1);
    cr_assert_eq(opt.step, 2);
    cr_assert_float_eq(t.a->data[0], 0.7912424838829282, OPT_TOL);
    cr_assert_float_eq(t.a->data[1], -1.826639416652626, OPT_TOL);
    cr_assert_float_eq(t.b->data[0], 2.8733662967024314, OPT_TOL);
    int64_t ao = t.ps.offsets[0], bo = t.ps.offsets[1], co = t.ps.offsets[2];
    cr_assert_float_eq(opt.m[ao], 0.065, OPT_TOL);
    cr_assert_float_eq(opt.v[ao + 1], 0.001159, OPT_TOL);
    cr_assert_float_eq(opt.m[bo], 0.08, OPT_TOL);
    cr_assert_float_eq(opt.v[bo], 0.004996, OPT_TOL);
    // The frozen parameter and its moments are untouched.
    cr_assert_eq(t.c->data[0], 5.0);
    cr_assert_eq(t.c->data[1], -5.0);
    cr_assert_eq(opt.m[co], 0);
    cr_assert_eq(opt.v[co + 1], 0);
    optim_free(&opt);
    params_free(&t.ps);
}

Test(optim, sgd_momentum_values) {
    Tiny t;
    tiny_make(&t);
    Optimizer opt;
    sgd_init(&opt, &t.ps, 0.9, 0.0);
    tiny_grads(&t, 0.5, -1.0, 0);
    optim_step(&opt, &t.ps, 0.1);
    cr_assert_float_eq(t.a->data[0], 0.95, OPT_TOL);
    cr_assert_float_eq(t.a->data[1], -1.9, OPT_TOL);
    tiny_grads(&t, 0.2, 0.4, 0);
    optim_step(&opt, &t.ps, 0.1);
    // m = 0.9 * 0.5 + 0.2 = 0.65, m = 0.9 * -1 + 0.4 = -0.5
    cr_assert_float_eq(opt.m[0], 0.65, OPT_TOL);
    cr_assert_float_eq(opt.m[1], -0.5, OPT_TOL);
    cr_assert_float_eq(t.a->data[0], 0.885, OPT_TOL);
    cr_assert_float_eq(t.a->data[1], -1.85, OPT_TOL);
    cr_assert_eq(t.b->data[0], 3.0);   // zero gradient, no momentum yet, no decay
    cr_assert_eq(t.c->data[0], 5.0);
    optim_free(&opt);
    params_free(&t.ps);
}

Test(optim, sgd_weight_decay_spares_no_decay_params) {
    Tiny t;
    tiny_make(&t);
    Optimizer opt;
    sgd_init(&opt, &t.ps, 0.0, 0.5);
    tiny_grads(&t, 0, 0, 0);
    optim_step(&opt, &t.ps, 0.1);
    cr_assert_float_eq(t.a->data[0], 0.95, OPT_TOL);   // 1 - 0.1 * 0.5 * 1
    cr_assert_eq(t.b->data[0], 3.0);
    cr_assert_eq(t.c->data[1], -5.0);
    optim_free(&opt);
    params_free(&t.ps);
}

Test(optim, clip_returns_preclip_norm_and_scales) {
    Tiny t;
    tiny_make(&t);
    tiny_grads(&t, 3.0, 0.0, 4.0);   // norm 5
    double n = optim_clip_grad_norm(&t.ps, 1.0);
    cr_assert_float_eq(n, 5.0, 1e-12);
    cr_assert_float_eq(optim_grad_norm(&t.ps), 1.0, 1e-6);
    cr_assert_float_eq(t.a->grad[0], 0.6, 1e-6);
    cr_assert_float_eq(t.b->grad[0], 0.8, 1e-6);
    // Below the threshold, or with clipping off, gradients are unchanged.
    tiny_grads(&t, 0.3, 0.0, 0.4);
    cr_assert_float_eq(optim_clip_grad_norm(&t.ps, 1.0), 0.5, 1e-6);
    cr_assert_float_eq(t.a->grad[0], 0.3, 1e-7);
    tiny_grads(&t, 30, 0, 40);
    cr_assert_float_eq(optim_clip_grad_norm(&t.ps, 0.0), 50.0, 1e-9);
    cr_assert_eq(t.b->grad[0], 40);
    optim_scale_grads(&t.ps, 0.25);
    cr_assert_eq(t.b->grad[0], 10);
    params_free(&t.ps);
}

Test(optim, grad_norm_over_many_chunks) {
    // Larger than one summation chunk: 200001 gradients of 0.5 -> norm 0.5*sqrt(n).
    ParamStore ps;
    params_init(&ps);
    params_add(&ps, "w", 1, (int[]){200001}, init_zeros(), 0);
    params_finalize(&ps, 1);
    for (int64_t i = 0; i < ps.numel; i++) ps.grad[i] = 0.5;
    cr_assert_float_eq(optim_grad_norm(&ps), 0.5 * sqrt(200001.0), 1e-9);
    params_free(&ps);
}

Test(optim, cosine_schedule_key_steps) {
    const double lr = 1e-3, min_lr = 1e-4;
    cr_assert_float_eq(lr_cosine(0, 10, 110, lr, min_lr), 1e-4, 1e-15);     // (0+1)/10 * lr
    cr_assert_float_eq(lr_cosine(4, 10, 110, lr, min_lr), 5e-4, 1e-15);
    cr_assert_float_eq(lr_cosine(9, 10, 110, lr, min_lr), 1e-3, 1e-15);     // warm-up reaches lr
    cr_assert_float_eq(lr_cosine(10, 10, 110, lr, min_lr), 1e-3, 1e-15);    // decay starts at lr
    cr_assert_float_eq(lr_cosine(60, 10, 110, lr, min_lr), 5.5e-4, 1e-15);  // halfway: mean
    cr_assert_float_eq(lr_cosine(35, 10, 110, lr, min_lr), 1e-4 + 9e-4 * 0.5 * (1 + cos(M_PI / 4)), 1e-15);
    cr_assert_float_eq(lr_cosine(110, 10, 110, lr, min_lr), 1e-4, 1e-15);
    cr_assert_float_eq(lr_cosine(500, 10, 110, lr, min_lr), 1e-4, 1e-15);
    cr_assert_float_eq(lr_cosine(0, 0, 100, lr, min_lr), 1e-3, 1e-15);      // no warm-up
}

// f(x) = 0.5 * sum_i k_i (x_i - c_i)^2: both optimisers find c.
static double minimise_quadratic(OptimKind kind, int steps, double lr) {
    ParamStore ps;
    params_init(&ps);
    Tensor *x = params_add(&ps, "x", 1, (int[]){8}, init_normal(2.0), 0);
    params_finalize(&ps, 3);
    double k[8], c[8];
    for (int i = 0; i < 8; i++) k[i] = 0.5 + 0.25 * i, c[i] = (i % 3) - 1.0 + 0.1 * i;
    Optimizer opt;
    if (kind == OPTIM_ADAMW) adamw_init(&opt, &ps, 0.9, 0.99, 1e-8, 0.0);
    else sgd_init(&opt, &ps, 0.9, 0.0);
    for (int s = 0; s < steps; s++) {
        params_zero_grad(&ps);
        for (int i = 0; i < 8; i++) x->grad[i] = (real)(k[i] * (x->data[i] - c[i]));
        optim_step(&opt, &ps, lr_cosine(s, 10, steps, lr, lr * 1e-3));
    }
    double err = 0;
    for (int i = 0; i < 8; i++) err = fmax(err, fabs(x->data[i] - c[i]));
    optim_free(&opt);
    params_free(&ps);
    return err;
}

Test(optim, quadratic_converges) {
    double e_adam = minimise_quadratic(OPTIM_ADAMW, 400, 0.1);
    double e_sgd = minimise_quadratic(OPTIM_SGD, 400, 0.1);
    cr_assert_lt(e_adam, 1e-3, "AdamW max |x - c| = %g", e_adam);
    cr_assert_lt(e_sgd, 1e-4, "SGD max |x - c| = %g", e_sgd);
}

// A step over enough elements to run in one parallel region, whose threads'
// shares cut parameters anywhere (optim_update_slices): the same bits on 1,
// 2 and 3 threads, and each element as the formula gives it alone, for
// AdamW and SGD, whole and sharded (ZeRO-1's [lo, hi) cuts a and e).
// Sizes: 60000, 3 (no decay), 70001 (frozen), 129, 25000: 85,132 elements
// to update (over 65,536: a region), 69,999 in the shard.
static void big_make(ParamStore *ps, Tensor **p) {
    params_init(ps);
    const int n[5] = {60000, 3, 70001, 129, 25000};
    for (int i = 0; i < 5; i++) {
        char name[8] = {(char)('a' + i), 0};
        p[i] = params_add(ps, name, 1, (int[]){n[i]}, init_normal(1.0), i == 1 ? TENSOR_NO_DECAY : 0);
    }
    params_finalize(ps, 7);
    params_set_frozen(ps, p[2], true);
}

static void big_grads(ParamStore *ps, int step) {
    for (int64_t e = 0; e < ps->numel; e++) ps->grad[e] = (real)sin(0.37 * e + step) * (e % 5 ? 1 : 1e-3);
}

static void big_case(bool adamw, int64_t lo, int64_t hi) {
    real *after[3];
    ParamStore ps;
    Tensor *p[5];
    for (int th = 1; th <= 3; th++) {
        big_make(&ps, p);
        real *p0 = xmalloc((size_t)ps.numel * sizeof(real));
        memcpy(p0, ps.data, (size_t)ps.numel * sizeof(real));
        Optimizer opt;
        if (adamw) adamw_init(&opt, &ps, 0.9, 0.999, 1e-8, 0.1);
        else sgd_init(&opt, &ps, 0.9, 0.1);
        if (hi) optim_set_shard(&opt, lo, hi);
        else lo = 0, hi = ps.numel;
        int saved = omp_get_max_threads();
        omp_set_num_threads(th);
        for (int s = 1; s <= 2; s++) {
            big_grads(&ps, s);
            if (s == 2) {   // the formula, element by element, for the step about to run
                for (int64_t e = 0; e < ps.numel; e++) {
                    int i = 0;
                    while (e >= ps.offsets[i] + ps.params[i]->numel) i++;
                    double x = ps.data[e], want = x;
                    if (e >= lo && e < hi && i != 2) {
                        double g = ps.grad[e], wd = i == 1 ? 0 : 0.1, lr = 0.01;
                        if (adamw) {
                            double m = 0.9 * opt.m[e - lo] + 0.1 * g, v = 0.999 * opt.v[e - lo] + 0.001 * g * g;
                            want = x - lr * wd * x - lr * (m / (1 - 0.81)) / (sqrt(v / (1 - 0.998001)) + 1e-8);
                        } else {
                            want = x - lr * wd * x - lr * (0.9 * opt.m[e - lo] + g);
                        }
                    }
                    p0[e] = (real)want;
                }
            }
            optim_step(&opt, &ps, 0.01);
        }
        omp_set_num_threads(saved);
        for (int64_t e = 0; e < ps.numel; e++)
            cr_assert(fabs(ps.data[e] - p0[e]) <= 1e-5 * (1 + fabs(p0[e])), "%s, %d threads: element %lld %.9g, want %.9g",
                      adamw ? "adamw" : "sgd", th, (long long)e, (double)ps.data[e], (double)p0[e]);
        after[th - 1] = p0;
        memcpy(p0, ps.data, (size_t)ps.numel * sizeof(real));
        optim_free(&opt);
        if (th < 3) params_free(&ps);
    }
    for (int th = 2; th <= 3; th++)
        cr_assert_eq(memcmp(after[0], after[th - 1], (size_t)ps.numel * sizeof(real)), 0,
                     "%s [%lld, %lld): 1 and %d threads differ", adamw ? "adamw" : "sgd", (long long)lo, (long long)hi, th);
    for (int th = 0; th < 3; th++) free(after[th]);
    params_free(&ps);
}

Test(optim, one_region_steps_are_the_formula_on_any_thread_count) {
    for (int adamw = 0; adamw < 2; adamw++) {
        big_case(adamw, 0, 0);
        big_case(adamw, 10000, 150000);
    }
}

Test(optim, the_kind_table_names_each_kind) {
    cr_assert_str_eq(optim_kind(OPTIM_ADAMW)->name, "adamw");
    cr_assert_str_eq(optim_kind(OPTIM_SGD)->name, "sgd");
    for (int k = 0; k < OPTIM_COUNT; k++) {
        cr_assert_not_null(optim_kind((OptimKind)k)->step, "kind %d has no step", k);
        cr_assert_str_eq(optim_name((OptimKind)k), optim_kind((OptimKind)k)->name);
    }
    cr_assert_str_eq(optim_name(OPTIM_COUNT), "?");
}

// The finite check names the first parameter with a non-finite value or
// moment (of the elements a shard owns), whichever block it is in.
Test(optim, the_finite_check_names_the_first_bad_parameter) {
    ParamStore ps;
    params_init(&ps);
    Tensor *w = params_add(&ps, "w", 2, (int[]){37, 53}, init_normal(0.5), 0);
    Tensor *gain = params_add(&ps, "gain", 1, (int[]){53}, init_ones(), TENSOR_NO_DECAY);
    Tensor *big = params_add(&ps, "big", 1, (int[]){20003}, init_normal(0.1), 0);
    params_finalize(&ps, 7);
    Optimizer opt;
    adamw_init(&opt, &ps, 0.9, 0.95, 1e-8, 0.1);
    cr_assert_null(optim_nonfinite_param(&ps, &opt));
    big->data[12345] = (real)NAN;
    cr_assert_eq(optim_nonfinite_param(&ps, &opt), big);
    cr_assert_eq(optim_nonfinite_param(&ps, NULL), big);
    int64_t goff = gain->data - ps.data;
    opt.v[goff + 3] = (real)INFINITY;   // an earlier parameter's second moment
    cr_assert_eq(optim_nonfinite_param(&ps, &opt), gain);
    cr_assert_eq(optim_nonfinite_param(&ps, NULL), big);   // without the moments: only values count
    opt.m[5] = (real)NAN;               // and the first one's first moment
    cr_assert_eq(optim_nonfinite_param(&ps, &opt), w);
    big->data[12345] = 0;
    // A shard owning only 'big' sees its own moments: none of them is bad.
    optim_set_shard(&opt, big->data - ps.data, ps.numel);
    cr_assert_null(optim_nonfinite_param(&ps, &opt));
    opt.m[7] = (real)NAN;               // big's element 7
    cr_assert_eq(optim_nonfinite_param(&ps, &opt), big);
    optim_free(&opt);
    params_free(&ps);
}
