// rope and conv1d_causal: gradients, values against direct computations, errors.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

// ---- RoPE ----

typedef struct {
    int hd, pos0;
    double base;
} RopeCtx;

static int f_rope(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    RopeCtx *c = ctx;
    out[0] = op_rope(tp, in[0], c->hd, c->pos0, c->base);
    return 1;
}

Test(ops_rope, gradcheck) {
    Tensor *x = tensor_newv(true, 3, 2, 7, 3 * 8);
    fill_normal(x, 1, 1.0);
    RopeCtx cs[] = {{8, 0, 10000.0}, {8, 5, 10000.0}, {4, 3, 100.0}, {24, 11, 10.0}};
    for (int k = 0; k < 4; k++) {
        GradcheckResult r = gradcheck("rope", f_rope, &x, 1, &cs[k], NULL);
        ASSERT_GRADCHECK(r, "rope");
    }
    tensor_free(x);
}

// A recorded rope reuses the table of an earlier one of the same positions,
// head size and base (ops_rope.c): on one tape, ropes that differ in each of
// them give the bits each gives alone on a fresh tape, forward and backward.
Test(ops_rope, shared_tables_only_between_equal_ropes) {
    RopeCtx cs[] = {{8, 0, 10000.0}, {8, 0, 10000.0}, {8, 2, 10000.0}, {4, 0, 10000.0}, {8, 0, 500.0}};
    int n = 5, numel = 2 * 7 * 24;
    Tensor *x = tensor_newv(true, 3, 2, 7, 24);
    fill_normal(x, 4, 1.0);
    Tape tp;
    tape_init(&tp);
    Tensor *y[5], *sum = NULL;
    for (int k = 0; k < n; k++) {
        y[k] = op_rope(&tp, x, cs[k].hd, cs[k].pos0, cs[k].base);
        Tensor *w = op_scale(&tp, y[k], k + 1.0);   // distinct seeds reach each rope's backward
        sum = sum ? op_add(&tp, sum, w) : w;
    }
    real *seed = xmalloc((size_t)numel * sizeof(real));
    for (int i = 0; i < numel; i++) seed[i] = (real)(0.25 * (i % 7) - 0.5);
    tape_backward_from(&tp, sum, seed);
    real *grad = xmalloc((size_t)numel * sizeof(real));
    memcpy(grad, x->grad, (size_t)numel * sizeof(real));
    real *want = xcalloc((size_t)numel, sizeof(real));   // the same, each rope on a tape of its own
    for (int k = 0; k < n; k++) {
        Tape one;
        tape_init(&one);
        memset(x->grad, 0, (size_t)numel * sizeof(real));
        Tensor *z = op_rope(&one, x, cs[k].hd, cs[k].pos0, cs[k].base);
        cr_assert(!memcmp(z->data, y[k]->data, (size_t)numel * sizeof(real)), "rope %d: forward", k);
        Tensor *w = op_scale(&one, z, k + 1.0);
        tape_backward_from(&one, w, seed);
        for (int i = 0; i < numel; i++) want[i] += x->grad[i];
        tape_free(&one);
    }
    cr_assert_leq(max_rel_diff(grad, want, numel), 1e-6, "backward: %.3e", max_rel_diff(grad, want, numel));
    free(seed), free(grad), free(want);
    tape_free(&tp);
    tensor_free(x);
}

Test(ops_rope, rotates_by_the_known_angle) {
    Tape tp;
    tape_init(&tp);
    // hd = 4, 2 heads, pos0 = 3. At t = 2 (position 5), pair i = 1 of head 1
    // turns by 5 * 10000^(-2/4) = 0.05 rad; pair i = 0 by 5 rad.
    int T = 4, hd = 4, H = 2;
    Tensor *x = tensor_newv(false, 3, 1, T, H * hd);
    int64_t at = (int64_t)2 * H * hd + 1 * hd;   // t = 2, head 1
    x->data[at + 2] = 1;                         // pair 1 = (1, 0)
    x->data[at + 0] = 0.5;                       // pair 0 = (0.5, -2)
    x->data[at + 1] = -2;
    Tensor *y = op_rope(&tp, x, hd, 3, 10000.0);
    cr_assert_float_eq(y->data[at + 2], 0.9987502603949663, 1e-7);   // cos 0.05
    cr_assert_float_eq(y->data[at + 3], 0.04997916927067833, 1e-7);  // sin 0.05
    double c5 = cos(5.0), s5 = sin(5.0);
    cr_assert_float_eq(y->data[at + 0], 0.5 * c5 + 2 * s5, 1e-6);
    cr_assert_float_eq(y->data[at + 1], 0.5 * s5 - 2 * c5, 1e-6);
    // Position 0 (pos0 = 0, t = 0) is the identity.
    Tensor *x0 = tensor_newv(false, 3, 1, 1, 8);
    fill_normal(x0, 2, 1.0);
    Tensor *y0 = op_rope(&tp, x0, 4, 0, 10000.0);
    for (int j = 0; j < 8; j++) cr_assert_eq(y0->data[j], x0->data[j]);
    tensor_free(x);
    tensor_free(x0);
    tape_free(&tp);
}

// The full-sequence rotation, and each position t rotated alone at pos0 = t
// (concatenated along time).
static int f_rope_offsets(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)n, (void)ctx;
    int T = in[0]->shape[1];
    out[0] = op_rope(tp, in[0], 6, 0, 10000.0);
    Tensor *ys[8];
    for (int t = 0; t < T; t++) ys[t] = op_rope(tp, op_slice(tp, in[0], 1, t, 1), 6, t, 10000.0);
    out[1] = op_concat(tp, ys, T, 1);
    return 2;
}

Test(ops_rope, offset_position_matches_the_full_sequence) {
    // Decoding applies RoPE one position at a time with pos0 = t: it must
    // equal the full-sequence rotation at that position, and keep norms (on
    // device_default(): AG_DEVICE=cuda, the GPU).
    int B = 2, T = 6, C = 12;
    Tensor *x = tensor_newv(false, 3, B, T, C);
    fill_normal(x, 3, 1.0);
    real *y[2];
    gradcheck_run_seeds(f_rope_offsets, &x, 1, NULL, (const real *[]){NULL, NULL}, y, NULL);
    const real *full = y[0];
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++) {
            int64_t at = ((int64_t)b * T + t) * C;
            cr_assert_leq(max_rel_diff(y[1] + at, full + at, C), FORM_TOL, "t = %d, row %d", t, b);
        }
    for (int64_t p = 0; p < x->numel; p += 2) {
        double a = hypot(x->data[p], x->data[p + 1]), b = hypot(full[p], full[p + 1]);
        cr_assert_float_eq(a, b, 1e-6 * fmax(1, a));
    }
    free(y[0]), free(y[1]);
    tensor_free(x);
}

Test(ops_rope, bad_shapes_name_the_op) {
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(false, 3, 2, 5, 12);
    cr_assert(EXPECT_FAILURE(op_rope(&tp, x, 5, 0, 10000.0)));
    cr_assert(strstr(ag_last_error(), "rope") && strstr(ag_last_error(), "(2, 5, 12)"), "got: %s",
              ag_last_error());
    Tensor *x2 = tensor_newv(false, 2, 5, 12);
    cr_assert(EXPECT_FAILURE(op_rope(&tp, x2, 4, 0, 10000.0)));
    cr_assert(strstr(ag_last_error(), "rope") && strstr(ag_last_error(), "(5, 12)"), "got: %s", ag_last_error());
    tensor_free(x);
    tensor_free(x2);
    tape_free(&tp);
}

// ---- causal depthwise convolution ----

static int f_conv(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = op_conv1d_causal(tp, in[0], in[1], NULL);
    return 1;
}

// The direct definition, written independently of the kernel.
static void conv_direct(real *y, const Tensor *x, const Tensor *w) {
    int B = x->shape[0], T = x->shape[1], C = x->shape[2], W = w->shape[1];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                double s = 0;
                for (int j = 0; j < W; j++) {
                    int src = t - W + 1 + j;
                    if (src >= 0) s += (double)w->data[c * W + j] * x->data[(b * T + src) * C + c];
                }
                y[(b * T + t) * C + c] = (real)s;
            }
}

Test(ops_conv, gradcheck_various_widths) {
    // (B, T, C, W): the brief's T=7, C=5, W=4; T < W; W = 1; W = T.
    int cfg[][4] = {{2, 7, 5, 4}, {3, 2, 3, 4}, {2, 5, 4, 1}, {1, 6, 3, 6}};
    for (int k = 0; k < 4; k++) {
        Tensor *x = tensor_newv(true, 3, cfg[k][0], cfg[k][1], cfg[k][2]);
        Tensor *w = tensor_newv(true, 2, cfg[k][2], cfg[k][3]);
        fill_normal(x, 10 + k, 1.0);
        fill_normal(w, 20 + k, 0.5);
        GradcheckResult r = gradcheck("conv1d_causal", f_conv, (Tensor *[]){x, w}, 2, NULL, NULL);
        ASSERT_GRADCHECK(r, "conv1d_causal");
        tensor_free(x);
        tensor_free(w);
    }
}

Test(ops_conv, forward_matches_direct_loop) {
    Tape tp;
    tape_init(&tp);
    int cfg[][4] = {{2, 7, 5, 4}, {2, 3, 5, 4}, {1, 9, 33, 3}};
    for (int k = 0; k < 3; k++) {
        Tensor *x = tensor_newv(false, 3, cfg[k][0], cfg[k][1], cfg[k][2]);
        Tensor *w = tensor_newv(false, 2, cfg[k][2], cfg[k][3]);
        fill_normal(x, 30 + k, 1.0);
        fill_normal(w, 40 + k, 1.0);
        Tensor *y = op_conv1d_causal(&tp, x, w, NULL);
        real *want = xmalloc((size_t)x->numel * sizeof(real));
        conv_direct(want, x, w);
        cr_assert_leq(max_rel_diff(y->data, want, x->numel), FORM_TOL, "config %d", k);
        free(want);
        tensor_free(x);
        tensor_free(w);
    }
    // By hand: one channel, W = 2, w = (a, b) = (2, 3), x = (1, 10, 100):
    // y = (3*1, 2*1 + 3*10, 2*10 + 3*100) = (3, 32, 320).
    Tensor *x = tensor_newv(false, 3, 1, 3, 1), *w = tensor_newv(false, 2, 1, 2);
    x->data[0] = 1, x->data[1] = 10, x->data[2] = 100;
    w->data[0] = 2, w->data[1] = 3;
    Tensor *y = op_conv1d_causal(&tp, x, w, NULL);
    cr_assert(y->data[0] == 3 && y->data[1] == 32 && y->data[2] == 320);
    tensor_free(x);
    tensor_free(w);
    tape_free(&tp);
}

static void run_conv(int threads, Tensor *x, Tensor *w, real *dx, real *dw) {
    omp_set_num_threads(threads);
    Tape tp;
    tape_init(&tp);
    memset(x->grad, 0, (size_t)x->numel * sizeof(real));
    memset(w->grad, 0, (size_t)w->numel * sizeof(real));
    Tensor *y = op_conv1d_causal(&tp, x, w, NULL);
    tape_backward(&tp, op_sum(&tp, op_mul(&tp, y, y)));
    memcpy(dx, x->grad, (size_t)x->numel * sizeof(real));
    memcpy(dw, w->grad, (size_t)w->numel * sizeof(real));
    tape_free(&tp);
}

Test(ops_conv, backward_deterministic_across_thread_counts) {
    int B = 4, T = 64, C = 96, W = 4;
    Tensor *x = tensor_newv(true, 3, B, T, C), *w = tensor_newv(true, 2, C, W);
    fill_normal(x, 50, 1.0);
    fill_normal(w, 51, 0.5);
    size_t nx = (size_t)x->numel * sizeof(real), nw = (size_t)w->numel * sizeof(real);
    real *dx1 = xmalloc(nx), *dx2 = xmalloc(nx), *dw1 = xmalloc(nw), *dw2 = xmalloc(nw);
    run_conv(1, x, w, dx1, dw1);
    run_conv(2, x, w, dx2, dw2);
    cr_assert_eq(memcmp(dx1, dx2, nx), 0);
    cr_assert_eq(memcmp(dw1, dw2, nw), 0);
    free(dx1);
    free(dx2);
    free(dw1);
    free(dw2);
    tensor_free(x);
    tensor_free(w);
}

Test(ops_conv, bad_shapes_name_the_op) {
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(false, 3, 2, 7, 5), *w = tensor_newv(false, 2, 4, 3);
    cr_assert(EXPECT_FAILURE(op_conv1d_causal(&tp, x, w, NULL)));
    cr_assert(strstr(ag_last_error(), "conv1d_causal") && strstr(ag_last_error(), "(2, 7, 5)") &&
                  strstr(ag_last_error(), "(4, 3)"),
              "got: %s", ag_last_error());
    tensor_free(x);
    tensor_free(w);
    tape_free(&tp);
}
