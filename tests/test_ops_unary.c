// Unary activations: gradients, values (including extreme inputs), errors.
#include <math.h>
#include <string.h>

#include "test_util.h"

typedef Tensor *(*UnaryFn)(Tape *, Tensor *);

static int f_unary(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = ((UnaryFn)ctx)(tp, in[0]);
    return 1;
}

static void check_unary(const char *name, UnaryFn fn, Tensor *x) {
    GradcheckResult r = gradcheck(name, f_unary, &x, 1, (void *)fn, NULL);
    ASSERT_GRADCHECK(r, name);
    cr_assert_eq(r.n_checked, x->numel + gradcheck_defaults().n_directions);
}

Test(ops_unary, gradcheck_smooth_activations_4d) {
    struct { const char *name; UnaryFn fn; } ops[] = {
        {"silu", op_silu}, {"sigmoid", op_sigmoid}, {"softplus", op_softplus}, {"exp", op_exp}};
    for (int k = 0; k < 4; k++) {
        Tensor *x = tensor_newv(true, 4, 2, 3, 4, 5);
        fill_normal(x, 10 + k, 2.0);
        check_unary(ops[k].name, ops[k].fn, x);
        tensor_free(x);
    }
}

Test(ops_unary, gradcheck_relu_away_from_kink) {
    // ReLU has a kink at 0: every input is kept at |x| >= 0.2, far beyond the
    // finite-difference step (1e-6 in float64, 1e-2 in float32), so the
    // central difference never straddles the kink.
    Tensor *x = tensor_newv(true, 3, 3, 7, 5);
    fill_uniform(x, 3, 0.2, 2.0);
    for (int64_t i = 0; i < x->numel; i += 2) x->data[i] = -x->data[i];
    check_unary("relu", op_relu, x);
    tensor_free(x);
}

Test(ops_unary, forward_values_and_extremes) {
    Tape tp;
    tape_init(&tp);
    real xv[] = {0, 1, -1, 100, -100, 1000, -1000};
    Tensor *x = tensor_newv(false, 1, 7);
    memcpy(x->data, xv, sizeof xv);
    Tensor *si = op_silu(&tp, x), *sg = op_sigmoid(&tp, x), *sp = op_softplus(&tp, x);
    Tensor *ex = op_exp(&tp, x), *re = op_relu(&tp, x);
    double tol = 1e-6;
    // sigmoid(1) = 1 / (1 + e^-1) = 0.7310585786300049
    cr_assert_float_eq(sg->data[0], 0.5, tol);
    cr_assert_float_eq(sg->data[1], 0.7310585786300049, tol);
    cr_assert_float_eq(sg->data[2], 1 - 0.7310585786300049, tol);
    cr_assert_eq(sg->data[5], 1.0);
    cr_assert_eq(sg->data[6], 0.0);
    cr_assert_float_eq(si->data[1], 0.7310585786300049, tol);
    cr_assert_float_eq(si->data[2], -(1 - 0.7310585786300049), tol);
    cr_assert_float_eq(si->data[5], 1000.0, 1e-9);
    cr_assert(si->data[6] == 0.0 && !isnan(si->data[6]), "silu(-1000) = %g", (double)si->data[6]);
    // softplus(0) = log 2, softplus(1) = log(1 + e) = 1.3132616875182228
    cr_assert_float_eq(sp->data[0], 0.6931471805599453, tol);
    cr_assert_float_eq(sp->data[1], 1.3132616875182228, tol);
    cr_assert_float_eq(sp->data[2], 1.3132616875182228 - 1, tol);
    cr_assert_float_eq(sp->data[3], 100.0, 1e-9 * 100);
    cr_assert(sp->data[4] >= 0 && sp->data[4] < 1e-30, "softplus(-100) = %g", (double)sp->data[4]);
    cr_assert(isfinite(sp->data[5]) && sp->data[5] == 1000.0, "softplus(1000) = %g", (double)sp->data[5]);
    cr_assert_eq(sp->data[6], 0.0);
    cr_assert_float_eq(ex->data[1], 2.718281828459045, 1e-6);
    cr_assert_float_eq(ex->data[2], 0.36787944117144233, 1e-7);
    real want_relu[] = {0, 1, 0, 100, 0, 1000, 0};
    for (int i = 0; i < 7; i++) cr_assert_eq(re->data[i], want_relu[i]);
    tensor_free(x);
    tape_free(&tp);
}

Test(ops_unary, backward_values_at_known_points) {
    // d/dx at x = 1: silu' = s(1 + x(1-s)) = 0.9276705118714867, sigmoid' = s(1-s),
    // softplus' = sigmoid(1), exp' = e, relu' = 1; and relu'(0) is taken as 0.
    UnaryFn fns[] = {op_silu, op_sigmoid, op_softplus, op_exp, op_relu, op_relu};
    double s = 0.7310585786300049;
    double want[] = {0.9276705118714867, s * (1 - s), s, 2.718281828459045, 1, 0};
    real at[] = {1, 1, 1, 1, 1, 0};
    for (int k = 0; k < 6; k++) {
        Tape tp;
        tape_init(&tp);
        Tensor *x = tensor_newv(true, 1, 1);
        x->data[0] = at[k];
        tape_backward(&tp, op_sum(&tp, fns[k](&tp, x)));
        cr_assert_float_eq(x->grad[0], want[k], 1e-6, "op %d: grad %g, want %g", k, (double)x->grad[0],
                           want[k]);
        tensor_free(x);
        tape_free(&tp);
    }
}

Test(ops_unary, null_input_names_the_op) {
    Tape tp;
    tape_init(&tp);
    cr_assert(EXPECT_FAILURE(op_softplus(&tp, NULL)));
    cr_assert(strstr(ag_last_error(), "softplus"), "got: %s", ag_last_error());
    tape_free(&tp);
}
