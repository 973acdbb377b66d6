// Gradient checks for matmul, elementwise, reductions and reshape.
#include <math.h>

#include "test_util.h"

typedef struct {
    bool ta, tb;
} MatmulCtx;

static int f_matmul(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    MatmulCtx *c = ctx;
    out[0] = op_matmul(tp, in[0], in[1], c->ta, c->tb);
    return 1;
}

static void check_matmul(bool ta, bool tb, bool batched_b) {
    int M = 3, K = 4, N = 5;
    Tensor *a = ta ? tensor_newv(true, 3, 2, K, M) : tensor_newv(true, 3, 2, M, K);
    Tensor *b = batched_b ? (tb ? tensor_newv(true, 3, 2, N, K) : tensor_newv(true, 3, 2, K, N))
                          : (tb ? tensor_newv(true, 2, N, K) : tensor_newv(true, 2, K, N));
    fill_normal(a, 1, 1.0);
    fill_normal(b, 2, 1.0);
    MatmulCtx c = {ta, tb};
    GradcheckResult r = gradcheck("matmul", f_matmul, (Tensor *[]){a, b}, 2, &c, NULL);
    ASSERT_GRADCHECK(r, "matmul");
    cr_assert_gt(r.n_checked, 0);
    tensor_free(a);
    tensor_free(b);
}

// On every product backend of the build (OpenBLAS; oneDNN in float32 builds).
Test(ops_basic, matmul_gradcheck_all_transposes) {
    for (int i = 0; i < test_n_backends(); i++) {
        test_use_backend(i);
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int bb = 0; bb < 2; bb++) check_matmul(ta, tb, bb);
    }
}

// op_matmul_multi: three weights of one input, the second output unused, so
// that no gradient flows back through it (its weight's must stay 0), at 6
// rows (one product each) and at 1300 (slabs of rows, and the weight
// gradients in blocks of rows summed after: blas.c).
static int f_matmul_multi(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)n, (void)ctx;
    Tensor *y[3];
    op_matmul_multi(tp, in[0], (Tensor *[]){in[1], in[2], in[3]}, 3, y);
    out[0] = y[0];
    out[1] = y[2];
    return 2;
}

Test(ops_basic, matmul_multi_gradcheck_one_node_and_an_unused_output) {
    for (int i = 0; i < test_n_backends(); i++) {
        test_use_backend(i);
        for (int rows = 3; rows <= 650; rows += 647) {
            Tensor *x = tensor_newv(true, 3, 2, rows, 6);
            Tensor *w[3] = {tensor_newv(true, 2, 6, 10), tensor_newv(true, 2, 6, 12), tensor_newv(true, 2, 6, 9)};
            fill_normal(x, 11, 1.0);
            for (int j = 0; j < 3; j++) fill_normal(w[j], 12 + j, 0.5);
            // The outputs are linear in each input, so central differences are exact at any step:
            // a step of 1e-3 keeps the rounding of f (a sum over 25,000 products at 1300 rows; at
            // the default 1e-6 in float64 it is 5e-6 of the smallest gradients) under the tolerance.
            GradcheckOptions o = gradcheck_defaults();
            o.eps = fmax(o.eps, 1e-3);
            GradcheckResult r = gradcheck("matmul_multi", f_matmul_multi, (Tensor *[]){x, w[0], w[1], w[2]}, 4,
                                          NULL, &o);
            ASSERT_GRADCHECK(r, "matmul_multi");
            cr_assert_gt(r.n_checked, 0);
            for (int64_t e = 0; e < w[1]->numel; e++)
                cr_assert_eq(w[1]->grad[e], 0, "the unused output's weight got a gradient at %lld", (long long)e);
            // One node on a CPU tape (a GPU tape or a narrow weight gets op_matmul's).
            Tape tp;
            tape_init(&tp);
            Tensor *y[3];
            op_matmul_multi(&tp, x, w, 3, y);
            cr_assert_eq(tp.n_nodes, 1);
            cr_assert_str_eq(tp.nodes[0]->op->name, "matmul_multi");
            cr_assert(y[1]->ndim == 3 && y[1]->shape[0] == 2 && y[1]->shape[1] == rows && y[1]->shape[2] == 12);
            tape_free(&tp);
            tensor_free(x);
            for (int j = 0; j < 3; j++) tensor_free(w[j]);
        }
    }
}

Test(ops_basic, matmul_multi_refuses_mismatched_and_repeated_weights) {
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(false, 2, 3, 4), *w = tensor_newv(false, 2, 4, 16), *bad = tensor_newv(false, 2, 5, 16);
    Tensor *y[2];
    cr_assert(EXPECT_FAILURE(op_matmul_multi(&tp, x, (Tensor *[]){w, bad}, 2, y)));
    cr_assert(strstr(ag_last_error(), "matmul_multi") && strstr(ag_last_error(), "(5, 16)"), "got: %s",
              ag_last_error());
    cr_assert(EXPECT_FAILURE(op_matmul_multi(&tp, x, (Tensor *[]){w, w}, 2, y)));
    cr_assert(strstr(ag_last_error(), "one tensor"), "got: %s", ag_last_error());
    cr_assert(EXPECT_FAILURE(op_matmul_multi(&tp, x, (Tensor *[]){w, w, w, w, w}, 5, y)));
    tensor_free(x), tensor_free(w), tensor_free(bad);
    tape_free(&tp);
}

static void matmul_values(void) {
    // [[1,2],[3,4]] @ [[5,6],[7,8]] = [[19,22],[43,50]]; with b^T: [[17,23],[39,53]]
    Tape tp;
    tape_init(&tp);
    Tensor *a = tensor_newv(false, 2, 2, 2), *b = tensor_newv(false, 2, 2, 2);
    real av[] = {1, 2, 3, 4}, bv[] = {5, 6, 7, 8};
    for (int i = 0; i < 4; i++) a->data[i] = av[i], b->data[i] = bv[i];
    Tensor *c = op_matmul(&tp, a, b, false, false);
    real want[] = {19, 22, 43, 50};
    for (int i = 0; i < 4; i++) cr_assert_float_eq(c->data[i], want[i], 1e-6);
    c = op_matmul(&tp, a, b, false, true);
    real want_t[] = {17, 23, 39, 53};
    for (int i = 0; i < 4; i++) cr_assert_float_eq(c->data[i], want_t[i], 1e-6);
    tensor_free(a);
    tensor_free(b);
    tape_free(&tp);
}

Test(ops_basic, matmul_forward_values) {
    for (int i = 0; i < test_n_backends(); i++) {
        test_use_backend(i);
        matmul_values();
    }
}

typedef struct {
    int kind;
} EwCtx;

static int f_ew(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    int k = ((EwCtx *)ctx)->kind;
    out[0] = k == 0 ? op_add(tp, in[0], in[1]) : k == 1 ? op_sub(tp, in[0], in[1]) : op_mul(tp, in[0], in[1]);
    return 1;
}

Test(ops_basic, elementwise_gradcheck_same_shape_and_broadcast) {
    const char *names[] = {"add", "sub", "mul"};
    for (int kind = 0; kind < 3; kind++) {
        for (int bcast = 0; bcast < 3; bcast++) {
            Tensor *a = tensor_newv(true, 3, 2, 3, 4);
            Tensor *b = bcast == 0   ? tensor_newv(true, 3, 2, 3, 4)
                        : bcast == 1 ? tensor_newv(true, 1, 4)
                                     : tensor_newv(true, 2, 3, 4);
            fill_normal(a, 3, 1.0);
            fill_normal(b, 4, 1.0);
            EwCtx c = {kind};
            GradcheckResult r = gradcheck(names[kind], f_ew, (Tensor *[]){a, b}, 2, &c, NULL);
            ASSERT_GRADCHECK(r, names[kind]);
            tensor_free(a);
            tensor_free(b);
        }
    }
}

static int f_scale_sum_mean(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    Tensor *s = op_scale(tp, in[0], -2.5);
    out[0] = op_sum(tp, op_mul(tp, s, in[0]));
    out[1] = op_mean(tp, op_mul(tp, in[0], in[0]));
    out[2] = op_reshape(tp, s, 2, (int[]){4, 6});
    return 3;
}

Test(ops_basic, scale_sum_mean_reshape_gradcheck) {
    Tensor *x = tensor_newv(true, 3, 2, 3, 4);
    fill_normal(x, 5, 1.0);
    GradcheckResult r = gradcheck("scale/sum/mean/reshape", f_scale_sum_mean, &x, 1, NULL, NULL);
    ASSERT_GRADCHECK(r, "scale/sum/mean/reshape");
    tensor_free(x);
}

Test(ops_basic, matmul_shape_mismatch_names_op_and_shapes) {
    Tape tp;
    tape_init(&tp);
    Tensor *a = tensor_newv(false, 2, 3, 4), *b = tensor_newv(false, 2, 5, 6);
    bool failed = EXPECT_FAILURE(op_matmul(&tp, a, b, false, false));
    cr_assert(failed, "a (3,4) @ (5,6) must fail");
    cr_assert(strstr(ag_last_error(), "matmul") && strstr(ag_last_error(), "(3, 4)") &&
                  strstr(ag_last_error(), "(5, 6)"),
              "message should name the op and both shapes, got: %s", ag_last_error());
    tensor_free(a);
    tensor_free(b);
    tape_free(&tp);
}

Test(ops_basic, add_broadcast_mismatch_fails) {
    Tape tp;
    tape_init(&tp);
    Tensor *a = tensor_newv(false, 2, 3, 4), *b = tensor_newv(false, 1, 3);
    cr_assert(EXPECT_FAILURE(op_add(&tp, a, b)));
    cr_assert(strstr(ag_last_error(), "add") && strstr(ag_last_error(), "(3, 4)"), "got: %s", ag_last_error());
    tensor_free(a);
    tensor_free(b);
    tape_free(&tp);
}

// The checker itself: an op whose backward gives half the true gradient
// (y = 2x, dx += dy) must fail on every element and every random direction,
// and the result must name that input (not the correct one beside it), the
// worst element, and both values.
static void twice_forward(Node *n) {
    for (int64_t i = 0; i < n->out[0]->numel; i++) n->out[0]->data[i] = 2 * n->in[0]->data[i];
}
static void twice_wrong_backward(Node *n) {
    real *dx = NODE_GRAD_IN(n, 0);
    for (int64_t i = 0; dx && i < n->out[0]->numel; i++) dx[i] += n->out[0]->grad[i];
}
static const OpDef OP_TWICE_WRONG = {"twice_wrong", twice_forward, twice_wrong_backward, NULL, NULL};

static int f_wrong(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    Tensor *y = tape_tensorv(tp, 2, in[1]->shape[0], in[1]->shape[1]);
    Node *node = tape_op(tp, &OP_TWICE_WRONG, (Tensor *[]){in[1]}, 1, &y, 1);
    tape_forward(node);
    out[0] = op_add(tp, in[0], y);
    return 1;
}

Test(ops_basic, gradcheck_finds_a_wrong_gradient) {
    Tensor *a = tensor_newv(true, 2, 3, 4), *b = tensor_newv(true, 2, 3, 4);
    fill_normal(a, 3, 1.0);
    fill_normal(b, 4, 1.0);
    GradcheckOptions o = gradcheck_defaults();
    o.quiet = true;   // (the failure is the expected outcome: no FAILED line in the test log)
    GradcheckResult r = gradcheck("twice_wrong", f_wrong, (Tensor *[]){a, b}, 2, NULL, &o);
    cr_assert(!r.passed);
    cr_assert_eq(r.worst_input, 1);
    cr_assert_eq(r.n_checked, 2 * (12 + o.n_directions));   // every element of both, and the directions
    cr_assert_gt(r.max_rel, 0.45);
    cr_assert_lt(r.max_rel, 0.55);   // |g/2 - g| / |g|
    if (r.worst_index >= 0) cr_assert_lt(r.worst_index, 12);
    cr_assert(fabs(r.analytic - r.numeric / 2) <= 0.1 * fabs(r.numeric), "analytic %g, numeric %g", r.analytic,
              r.numeric);
    tensor_free(a);
    tensor_free(b);
}
