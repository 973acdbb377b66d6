// Gradient checks for matmul, elementwise, reductions and reshape.
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
