// The "first contribution writes" path of the backward (tensor_grad_fresh):
// each op that writes a fresh input gradient instead of adding to a zeroed
// one is checked on inputs that are intermediates (so their gradient buffers
// are fresh, and NaN-filled in the float64 build: a missed element fails),
// and on one intermediate fed to both operands (the second contribution must
// add to the first).
#include <string.h>

#include "test_util.h"

enum { F_MATMUL_NARROW, F_MATMUL_WIDE, F_MATMUL, F_MATMUL_T, F_MATMUL_BATCHED, F_MATMUL_BATCHED_TA, F_ADD, F_SUB, F_MUL, F_MUL_BCAST, F_SCALE, F_RESHAPE,
       F_RMSNORM, F_SILU, F_SIGMOID, F_SOFTPLUS, F_EXP, F_SILU_MUL, F_COUNT };
static const char *NAMES[F_COUNT] = {"matmul_narrow", "matmul_wide", "matmul", "matmul_t", "matmul_batched", "matmul_batched_ta", "add", "sub", "mul", "mul_bcast",
                                     "scale", "reshape", "rmsnorm", "silu", "sigmoid", "softplus", "exp",
                                     "silu_mul"};

typedef struct {
    int kind;
    bool shared;   // both operands are the same intermediate
} FreshCtx;

// in[0] (2, 3, 4), in[1] (2, 3, 4), in[2] (4), in[3] (4, 3), in[4] (4, 12): every op first sees
// intermediates h = 1.5 x (fresh gradient buffers), then the op under test.
static int f_fresh(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)n;
    const FreshCtx *c = ctx;
    Tensor *h0 = op_scale(tp, in[0], 1.5);
    Tensor *h1 = c->shared ? h0 : op_scale(tp, in[1], 1.5);
    Tensor *w = op_scale(tp, in[2], 1.5);
    Tensor *y = NULL;
    switch (c->kind) {
    case F_MATMUL_NARROW: y = op_matmul(tp, h0, in[3], false, false); break;   // N = 3: the narrow loops
    case F_MATMUL_WIDE: y = op_matmul(tp, h0, in[4], false, false); break;     // N = 12: gemm
    case F_MATMUL: y = op_matmul(tp, op_reshape(tp, h0, 2, (int[]){6, 4}), op_reshape(tp, h1, 2, (int[]){6, 4}),
                                 true, false); break;   // (4, 4) = h0^T h1
    case F_MATMUL_T: y = op_matmul(tp, h0, op_reshape(tp, h1, 2, (int[]){6, 4}), false, true); break;
    case F_MATMUL_BATCHED: y = op_matmul(tp, h0, h1, false, true); break;   // (2, 3, 3)
    case F_MATMUL_BATCHED_TA: y = op_matmul(tp, h0, h1, true, false); break;   // (2, 4, 4)
    case F_ADD: y = op_add(tp, h0, h1); break;
    case F_SUB: y = op_sub(tp, h0, h1); break;
    case F_MUL: y = op_mul(tp, h0, h1); break;
    case F_MUL_BCAST: y = op_mul(tp, h0, w); break;
    case F_SCALE: y = op_scale(tp, h0, -0.7); break;
    case F_RESHAPE: y = op_reshape(tp, h0, 2, (int[]){4, 6}); break;
    case F_RMSNORM: y = op_rmsnorm(tp, h0, w, 1e-5); break;
    case F_SILU: y = op_silu(tp, h0); break;
    case F_SIGMOID: y = op_sigmoid(tp, h0); break;
    case F_SOFTPLUS: y = op_softplus(tp, h0); break;
    case F_EXP: y = op_exp(tp, h0); break;
    default: y = op_silu_mul(tp, h0, h1); break;
    }
    // A second use of h0 after the op: its gradient then has two contributions
    // in either order of the backward.
    out[0] = y;
    out[1] = op_mul(tp, h0, h0);
    return 2;
}

static void fresh_cases(const char *backend) {
    for (int shared = 0; shared < 2; shared++)
        for (int k = 0; k < F_COUNT; k++) {
            Tensor *a = tensor_newv(true, 3, 2, 3, 4), *b = tensor_newv(true, 3, 2, 3, 4);
            Tensor *w = tensor_newv(true, 1, 4);
            Tensor *wn = tensor_newv(true, 2, 4, 3), *ww = tensor_newv(true, 2, 4, 12);
            fill_normal(wn, 8, 1.0);
            fill_normal(ww, 9, 1.0);
            fill_normal(a, 40 + k, 1.0);
            fill_normal(b, 80 + k, 1.0);
            fill_normal(w, 7, 1.0);
            FreshCtx c = {k, shared};
            char label[96];
            snprintf(label, sizeof label, "%s%s (%s)", NAMES[k], shared ? " (shared operand)" : "", backend);
            GradcheckResult r = gradcheck(label, f_fresh, (Tensor *[]){a, b, w, wn, ww}, 5, &c, NULL);
            ASSERT_GRADCHECK(r, label);
            cr_assert_gt(r.n_checked, 0, "%s: nothing checked", label);
            tensor_free(a);
            tensor_free(b);
            tensor_free(w);
            tensor_free(wn);
            tensor_free(ww);
        }
}

// On every product backend of the build (for the matmul cases; the others
// simply run once more).
Test(grad_fresh, every_fresh_writing_op_gradchecks_on_intermediates) {
    for (int i = 0; i < test_n_backends(); i++) fresh_cases(test_use_backend(i));
}

static int f_silu_mul_form(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)n;
    out[0] = *(const int *)ctx == 0 ? op_silu_mul(tp, in[0], in[1]) : op_mul(tp, op_silu(tp, in[0]), in[1]);
    return 1;
}

// silu_mul is op_mul(op_silu(g), x) fused: the same values and gradients (on
// device_default(): AG_DEVICE=cuda, the GPU).
Test(grad_fresh, silu_mul_equals_silu_then_mul) {
    Tensor *g = tensor_newv(true, 3, 2, 5, 7), *x = tensor_newv(true, 3, 2, 5, 7);
    fill_normal(g, 3, 2.0);
    fill_normal(x, 4, 1.0);
    Tensor *seed = tensor_newv(false, 3, 2, 5, 7);
    fill_normal(seed, 5, 1.0);
    real *grads[2][2];
    real *vals[2];
    for (int form = 0; form < 2; form++) {
        gradcheck_run_seeds(f_silu_mul_form, (Tensor *[]){g, x}, 2, &form, (const real *[]){seed->data}, &vals[form],
                            NULL);
        for (int i = 0; i < 2; i++) {
            Tensor *t = i ? x : g;
            grads[form][i] = xmalloc((size_t)t->numel * sizeof(real));
            memcpy(grads[form][i], t->grad, (size_t)t->numel * sizeof(real));
        }
    }
    cr_assert_leq(max_rel_diff(vals[0], vals[1], g->numel), FORM_TOL, "values differ");
    for (int i = 0; i < 2; i++) {
        double d = max_rel_diff(grads[0][i], grads[1][i], g->numel);
        cr_assert_leq(d, FORM_TOL, "grad of %s differs by %g", i ? "x" : "g", d);
        free(grads[0][i]);
        free(grads[1][i]);
    }
    free(vals[0]);
    free(vals[1]);
    tensor_free(g);
    tensor_free(x);
    tensor_free(seed);
}
