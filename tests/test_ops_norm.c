// rmsnorm and l2norm_heads: gradients, values, errors, determinism of dg.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

typedef struct {
    double eps;
    bool with_g;
} RmsCtx;

static int f_rmsnorm(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    RmsCtx *c = ctx;
    out[0] = op_rmsnorm(tp, in[0], c->with_g ? in[1] : NULL, c->eps);
    return 1;
}

Test(ops_norm, rmsnorm_gradcheck_with_and_without_weight) {
    Tensor *x = tensor_newv(true, 4, 2, 3, 4, 6), *g = tensor_newv(true, 1, 6);
    fill_normal(x, 1, 1.0);
    fill_uniform(g, 2, 0.5, 1.5);
    RmsCtx c = {1e-6, true};
    GradcheckResult r = gradcheck("rmsnorm", f_rmsnorm, (Tensor *[]){x, g}, 2, &c, NULL);
    ASSERT_GRADCHECK(r, "rmsnorm with g");
    c.with_g = false;
    c.eps = 0.1;   // a large eps so that the eps term matters in the gradient
    r = gradcheck("rmsnorm", f_rmsnorm, &x, 1, &c, NULL);
    ASSERT_GRADCHECK(r, "rmsnorm without g");
    Tensor *x3 = tensor_newv(true, 3, 3, 7, 5), *g5 = tensor_newv(true, 1, 5);
    fill_normal(x3, 3, 2.0);
    fill_normal(g5, 4, 1.0);
    c = (RmsCtx){1e-5, true};
    r = gradcheck("rmsnorm", f_rmsnorm, (Tensor *[]){x3, g5}, 2, &c, NULL);
    ASSERT_GRADCHECK(r, "rmsnorm 3-d");
    tensor_free(x);
    tensor_free(g);
    tensor_free(x3);
    tensor_free(g5);
}

Test(ops_norm, rmsnorm_values) {
    Tape tp;
    tape_init(&tp);
    // Row (3, 4): mean square 12.5, rms 3.5355339; with g (1, 2) and eps 0.
    Tensor *x = tensor_newv(false, 2, 2, 2), *g = tensor_newv(false, 1, 2);
    real xv[] = {3, 4, 0, 0};
    memcpy(x->data, xv, sizeof xv);
    g->data[0] = 1;
    g->data[1] = 2;
    Tensor *y = op_rmsnorm(&tp, x, g, 0.0);
    double rms = sqrt(12.5);
    cr_assert_float_eq(y->data[0], 3 / rms, 1e-6);
    cr_assert_float_eq(y->data[1], 8 / rms, 1e-6);
    // A zero row with eps > 0 stays zero (no NaN).
    y = op_rmsnorm(&tp, x, NULL, 1e-6);
    cr_assert(y->data[2] == 0 && y->data[3] == 0);
    // Without g, every row has mean square ~1.
    Tensor *z = tensor_newv(false, 3, 2, 3, 8);
    fill_normal(z, 5, 4.0);
    y = op_rmsnorm(&tp, z, NULL, 1e-6);
    for (int r = 0; r < 6; r++) {
        double ms = 0;
        for (int j = 0; j < 8; j++) ms += (double)y->data[r * 8 + j] * y->data[r * 8 + j];
        cr_assert_float_eq(ms / 8, 1.0, 1e-5);
    }
    tensor_free(x);
    tensor_free(g);
    tensor_free(z);
    tape_free(&tp);
}

static int f_rmsnorm_groups(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = op_rmsnorm_groups(tp, in[0], in[1], 4, ((RmsCtx *)ctx)->eps);
    return 1;
}

// Per-group norm: the gradient, and the same values as reshaping the groups
// into the last dimension and normalising that.
Test(ops_norm, rmsnorm_groups_gradcheck_and_equals_reshaped) {
    Tensor *x = tensor_newv(true, 3, 2, 5, 12), *g = tensor_newv(true, 1, 4);
    fill_normal(x, 6, 1.5);
    fill_uniform(g, 7, 0.5, 1.5);
    RmsCtx c = {1e-5, true};
    GradcheckResult r = gradcheck("rmsnorm_groups", f_rmsnorm_groups, (Tensor *[]){x, g}, 2, &c, NULL);
    ASSERT_GRADCHECK(r, "rmsnorm groups of 4");
    Tape tp;
    tape_init(&tp);
    Tensor *y = op_rmsnorm_groups(&tp, x, g, 4, 1e-5);
    Tensor *yr = op_rmsnorm(&tp, op_reshape(&tp, x, 4, (int[]){2, 5, 3, 4}), g, 1e-5);
    for (int64_t i = 0; i < x->numel; i++)
        cr_assert_float_eq(y->data[i], yr->data[i], 1e-12, "element %lld", (long long)i);
    tape_free(&tp);
    tensor_free(x);
    tensor_free(g);
}

typedef struct {
    int outs;   // 1: only the norm, 2: the norm and the sum
    bool same;  // a and b one tensor
} AddRmsCtx;

static int f_add_rmsnorm(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    const AddRmsCtx *c = ctx;
    Tensor *sum;
    out[0] = op_add_rmsnorm(tp, in[0], c->same ? in[0] : in[1], in[2], 1e-5, &sum);
    out[1] = sum;
    return c->outs;
}

// Gradients through both outputs, through the norm alone, and with a and b
// one tensor (its two contributions add).
Test(ops_norm, add_rmsnorm_gradcheck) {
    Tensor *a = tensor_newv(true, 3, 2, 5, 6), *b = tensor_newv(true, 3, 2, 5, 6), *g = tensor_newv(true, 1, 6);
    fill_normal(a, 11, 1.0);
    fill_normal(b, 12, 1.0);
    fill_uniform(g, 13, 0.5, 1.5);
    Tensor *in[] = {a, b, g};
    AddRmsCtx c = {2, false};
    GradcheckResult r = gradcheck("add_rmsnorm", f_add_rmsnorm, in, 3, &c, NULL);
    ASSERT_GRADCHECK(r, "add_rmsnorm, both outputs");
    c.outs = 1;
    r = gradcheck("add_rmsnorm", f_add_rmsnorm, in, 3, &c, NULL);
    ASSERT_GRADCHECK(r, "add_rmsnorm, norm only");
    c = (AddRmsCtx){2, true};
    r = gradcheck("add_rmsnorm", f_add_rmsnorm, (Tensor *[]){a, b, g}, 3, &c, NULL);
    ASSERT_GRADCHECK(r, "add_rmsnorm, a == b");
    tensor_free(a);
    tensor_free(b);
    tensor_free(g);
}

// One forward and backward of add + rmsnorm, fused or not, on intermediates
// (their gradient buffers fresh, as in a model); out[]: y, h, da, db, dg,
// each copied (n[] elements).
static int f_add_norm(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)n;
    Tensor *a = op_scale(tp, in[0], 1.0), *b = op_scale(tp, in[1], 1.0);
    if (*(const bool *)ctx) {
        out[0] = op_add_rmsnorm(tp, a, b, in[2], 1e-5, &out[1]);
    } else {
        out[1] = op_add(tp, a, b);
        out[0] = op_rmsnorm(tp, out[1], in[2], 1e-5);
    }
    return 2;
}

// y, h and the three gradients on device_default() (AG_DEVICE=cuda: the GPU).
static void add_norm_run(bool fused, Tensor *a0, Tensor *b0, Tensor *g, const real *sy, const real *sh,
                         real *out[5], const int64_t n[5]) {
    real *yh[2];
    gradcheck_run_seeds(f_add_norm, (Tensor *[]){a0, b0, g}, 3, &fused, (const real *[]){sy, sh}, yh, NULL);
    const real *src[5] = {yh[0], yh[1], a0->grad, b0->grad, g->grad};
    for (int k = 0; k < 5; k++) memcpy(out[k], src[k], (size_t)n[k] * sizeof(real));
    free(yh[0]), free(yh[1]);
}

Test(ops_norm, add_rmsnorm_equals_add_then_rmsnorm) {
    Tensor *a0 = tensor_newv(true, 3, 3, 64, 40), *b0 = tensor_newv(true, 3, 3, 64, 40);
    Tensor *g = tensor_newv(true, 1, 40);
    fill_normal(a0, 14, 1.0);
    fill_normal(b0, 15, 2.0);
    fill_uniform(g, 16, 0.5, 1.5);
    Tensor *sy = tensor_newv(false, 3, 3, 64, 40), *sh = tensor_newv(false, 3, 3, 64, 40);
    fill_normal(sy, 17, 1.0);
    fill_normal(sh, 18, 1.0);
    int64_t N = a0->numel, n[5] = {N, N, N, N, 40};
    real *got[2][5];
    for (int f = 0; f < 2; f++) {
        for (int k = 0; k < 5; k++) got[f][k] = xmalloc((size_t)n[k] * sizeof(real));
        add_norm_run(f, a0, b0, g, sy->data, sh->data, got[f], n);
    }
    const char *name[5] = {"y", "h", "da", "db", "dg"};
    for (int k = 0; k < 5; k++) {
        for (int64_t i = 0; i < n[k]; i++)
            cr_assert(fabs(got[1][k][i] - got[0][k][i]) <= FORM_TOL * (1 + fabs(got[0][k][i])), "%s[%lld]: %g vs %g",
                      name[k], (long long)i, (double)got[1][k][i], (double)got[0][k][i]);
        free(got[0][k]);
        free(got[1][k]);
    }
    tensor_free(a0);
    tensor_free(b0);
    tensor_free(g);
    tensor_free(sy);
    tensor_free(sh);
}

typedef struct {
    int hd;
    double scale;   // 0: op_l2norm_heads
} L2Ctx;

static int f_l2norm(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    const L2Ctx *c = ctx;
    out[0] = c->scale ? op_l2norm_heads_scaled(tp, in[0], c->hd, c->scale) : op_l2norm_heads(tp, in[0], c->hd);
    return 1;
}

Test(ops_norm, l2norm_heads_gradcheck) {
    Tensor *x = tensor_newv(true, 3, 2, 5, 12);
    fill_normal(x, 6, 1.0);
    int hds[] = {4, 3, 12};
    for (int k = 0; k < 3; k++) {
        L2Ctx c = {hds[k], 0};
        GradcheckResult r = gradcheck("l2norm_heads", f_l2norm, &x, 1, &c, NULL);
        ASSERT_GRADCHECK(r, "l2norm_heads");
        c.scale = 0.35;   // the scaled form, as linear and gdn scale q
        r = gradcheck("l2norm_heads_scaled", f_l2norm, &x, 1, &c, NULL);
        ASSERT_GRADCHECK(r, "l2norm_heads_scaled");
    }
    Tensor *x4 = tensor_newv(true, 4, 2, 3, 2, 8);
    fill_normal(x4, 7, 1.0);
    L2Ctx c = {4, 0};
    GradcheckResult r = gradcheck("l2norm_heads", f_l2norm, &x4, 1, &c, NULL);
    ASSERT_GRADCHECK(r, "l2norm_heads 4-d");
    tensor_free(x);
    tensor_free(x4);
}

Test(ops_norm, l2norm_heads_values) {
    Tape tp;
    tape_init(&tp);
    // Two heads of size 2: (3, 4) -> (3, 4) / sqrt(25 + 1e-6); (0, 2) -> (0, 2) / sqrt(4 + 1e-6).
    Tensor *x = tensor_newv(false, 1, 4);
    real xv[] = {3, 4, 0, 2};
    memcpy(x->data, xv, sizeof xv);
    Tensor *y = op_l2norm_heads(&tp, x, 2);
    cr_assert_float_eq(y->data[0], 3 / sqrt(25 + 1e-6), 1e-7);
    cr_assert_float_eq(y->data[1], 4 / sqrt(25 + 1e-6), 1e-7);
    cr_assert_float_eq(y->data[2], 0, 0);
    cr_assert_float_eq(y->data[3], 2 / sqrt(4 + 1e-6), 1e-7);
    // Scaled: one node, each value s times the above, the gradient as scale's after l2norm's.
    Tensor *xs = tensor_newv(true, 1, 4);
    memcpy(xs->data, xv, sizeof xv);
    Tape t2;
    tape_init(&t2);
    Tensor *ys = op_l2norm_heads_scaled(&t2, xs, 2, 0.25);
    cr_assert_eq(t2.n_nodes, 1);
    for (int j = 0; j < 4; j++) cr_assert_float_eq(ys->data[j], 0.25 * y->data[j], 1e-7);
    real seed[] = {1, -2, 0.5, 3};
    tape_backward_multi(&t2, &ys, (const real *[]){seed}, 1);
    real got[4];
    memcpy(got, xs->grad, sizeof got);
    tape_free(&t2);
    memset(xs->grad, 0, 4 * sizeof(real));
    tape_init(&t2);
    Tensor *y2 = op_scale(&t2, op_l2norm_heads(&t2, xs, 2), 0.25);
    tape_backward_multi(&t2, &y2, (const real *[]){seed}, 1);
    for (int j = 0; j < 4; j++) cr_assert_float_eq(got[j], xs->grad[j], 1e-6, "dx[%d]", j);
    tape_free(&t2);
    tensor_free(xs);
    tensor_free(x);
    tape_free(&tp);
}

Test(ops_norm, bad_shapes_name_the_op) {
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(false, 3, 2, 3, 8), *g = tensor_newv(false, 1, 6);
    cr_assert(EXPECT_FAILURE(op_rmsnorm(&tp, x, g, 1e-6)));
    cr_assert(strstr(ag_last_error(), "rmsnorm") && strstr(ag_last_error(), "(6)") &&
                  strstr(ag_last_error(), "(2, 3, 8)"),
              "got: %s", ag_last_error());
    cr_assert(EXPECT_FAILURE(op_rmsnorm_groups(&tp, x, NULL, 3, 1e-6)));
    cr_assert(strstr(ag_last_error(), "group 3") && strstr(ag_last_error(), "(2, 3, 8)"), "got: %s",
              ag_last_error());
    cr_assert(EXPECT_FAILURE(op_l2norm_heads(&tp, x, 3)));
    cr_assert(strstr(ag_last_error(), "l2norm_heads") && strstr(ag_last_error(), "(2, 3, 8)"), "got: %s",
              ag_last_error());
    tensor_free(x);
    tensor_free(g);
    tape_free(&tp);
}

// dg sums over all rows: the same bits with 1 and 2 threads.
static void run_rms(int threads, Tensor *x, Tensor *g, real *dx, real *dg) {
    omp_set_num_threads(threads);
    Tape tp;
    tape_init(&tp);
    memset(x->grad, 0, (size_t)x->numel * sizeof(real));
    memset(g->grad, 0, (size_t)g->numel * sizeof(real));
    Tensor *y = op_rmsnorm(&tp, x, g, 1e-6);
    tape_backward(&tp, op_sum(&tp, op_mul(&tp, y, y)));
    memcpy(dx, x->grad, (size_t)x->numel * sizeof(real));
    memcpy(dg, g->grad, (size_t)g->numel * sizeof(real));
    tape_free(&tp);
}

Test(ops_norm, rmsnorm_backward_deterministic_across_thread_counts) {
    int R = 300, D = 200;
    Tensor *x = tensor_newv(true, 2, R, D), *g = tensor_newv(true, 1, D);
    fill_normal(x, 8, 1.0);
    fill_uniform(g, 9, 0.5, 1.5);
    real *dx1 = xmalloc((size_t)R * D * sizeof(real)), *dx2 = xmalloc((size_t)R * D * sizeof(real));
    real dg1[200], dg2[200];
    run_rms(1, x, g, dx1, dg1);
    run_rms(2, x, g, dx2, dg2);
    cr_assert_eq(memcmp(dx1, dx2, (size_t)R * D * sizeof(real)), 0);
    cr_assert_eq(memcmp(dg1, dg2, sizeof dg1), 0);
    free(dx1);
    free(dx2);
    tensor_free(x);
    tensor_free(g);
}

// ---- rmsnorm_gate: RMSNorm per group times silu(z) ----

static int f_rmsnorm_gate(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = op_rmsnorm_gate(tp, in[0], in[1], in[2], *(int *)ctx, 1e-5);
    return 1;
}

Test(ops_norm, rmsnorm_gate_gradcheck) {
    Tensor *x = tensor_newv(true, 3, 2, 5, 12), *z = tensor_newv(true, 3, 2, 5, 12);
    fill_normal(x, 21, 1.0);
    fill_normal(z, 22, 1.5);
    int groups[] = {4, 12};
    for (int k = 0; k < 2; k++) {
        Tensor *g = tensor_newv(true, 1, groups[k]);
        fill_uniform(g, 23, 0.5, 1.5);
        GradcheckResult r = gradcheck("rmsnorm_gate", f_rmsnorm_gate, (Tensor *[]){x, g, z}, 3, &groups[k], NULL);
        ASSERT_GRADCHECK(r, "rmsnorm_gate");
        tensor_free(g);
    }
    tensor_free(x);
    tensor_free(z);
}

// Fused against rmsnorm_groups then silu_mul, on intermediates (fresh
// gradient buffers) and with a second use of x and z (their gradients then
// add to another contribution): values and every gradient; and the same bits
// on 1 and 2 threads (dg sums fixed row blocks).
typedef struct {
    bool fused;
    const real *seed;
} GateCtx;

// <y, seed> + sum(x * z), and y.
static int f_gate(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)n;
    const GateCtx *c = ctx;
    Tensor *x = op_scale(tp, in[0], 1.0), *z = op_scale(tp, in[1], 1.0);
    Tensor *y = c->fused ? op_rmsnorm_gate(tp, x, in[2], z, 16, 1e-6)
                         : op_silu_mul(tp, z, op_rmsnorm_groups(tp, x, in[2], 16, 1e-6));
    Tensor *extra = op_mul(tp, x, z);
    out[0] = op_add(tp, op_sum(tp, op_mul(tp, y, tape_tensor_copy(tp, y->ndim, y->shape, c->seed))),
                    op_sum(tp, extra));
    out[1] = y;
    return 2;
}

// On device_default() (AG_DEVICE=cuda: the GPU; the thread count then
// concerns only the host).
static void gate_run(bool fused, int threads, Tensor *x0, Tensor *z0, Tensor *g, const real *seed, real *out[4]) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    GateCtx c = {fused, seed};
    real one = 1, *ly[2];
    gradcheck_run_seeds(f_gate, (Tensor *[]){x0, z0, g}, 3, &c, (const real *[]){&one, NULL}, ly, NULL);
    const real *src[4] = {ly[1], x0->grad, z0->grad, g->grad};
    int64_t n[4] = {x0->numel, x0->numel, z0->numel, g->numel};
    for (int k = 0; k < 4; k++) memcpy(out[k], src[k], (size_t)n[k] * sizeof(real));
    free(ly[0]), free(ly[1]);
    omp_set_num_threads(saved);
}

Test(ops_norm, rmsnorm_gate_equals_rmsnorm_then_silu_mul) {
    Tensor *x = tensor_newv(true, 3, 4, 300, 64), *z = tensor_newv(true, 3, 4, 300, 64);
    Tensor *g = tensor_newv(true, 1, 16), *seed = tensor_newv(false, 3, 4, 300, 64);
    fill_normal(x, 31, 1.0);
    fill_normal(z, 32, 2.0);
    fill_uniform(g, 33, 0.5, 1.5);
    fill_normal(seed, 34, 1.0);
    int64_t n[4] = {x->numel, x->numel, z->numel, 16};
    real *got[3][4];
    for (int f = 0; f < 3; f++) {
        for (int k = 0; k < 4; k++) got[f][k] = xmalloc((size_t)n[k] * sizeof(real));
        gate_run(f > 0, f == 2 ? 1 : 2, x, z, g, seed->data, got[f]);   // 0: composed; 1, 2: fused on 2, 1 threads
    }
    const char *name[4] = {"y", "dx", "dz", "dg"};
    for (int k = 0; k < 4; k++) {
        double d = max_rel_diff(got[1][k], got[0][k], n[k]);
        cr_assert_leq(d, FORM_TOL, "%s: fused vs composed %.3g", name[k], d);
        cr_assert_eq(memcmp(got[1][k], got[2][k], (size_t)n[k] * sizeof(real)), 0, "%s: 1 and 2 threads differ",
                     name[k]);
        for (int f = 0; f < 3; f++) free(got[f][k]);
    }
    tensor_free(x);
    tensor_free(z);
    tensor_free(g);
    tensor_free(seed);
}
