// conv1d_causal_silu (the fused convolution + SiLU) and the blocked backward
// of conv1d_causal: gradients, agreement with the composed ops and with a
// direct loop, thread-count independence, no saved state, errors.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

static int f_conv_silu(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = op_conv1d_causal_silu(tp, in[0], in[1], NULL);
    return 1;
}

static Tensor *conv_silu_composed(Tape *tp, Tensor *x, Tensor *w) {
    return op_silu(tp, op_conv1d_causal(tp, x, w, NULL));
}

static int f_conv_silu_composed(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = conv_silu_composed(tp, in[0], in[1]);
    return 1;
}

Test(ops_conv_silu, gradcheck_widths_and_lengths) {
    // The default float64 tolerance (1e-6) is already within ~10x of the
    // finite differences' own rounding noise here (~1e-10 absolute against a
    // floor of 1e-3 of the largest gradient): 1e-7 fails on noise alone.
    GradcheckOptions o = gradcheck_defaults();
    // (B, T, C, W): W = 1, 2, 4 with T > W, T < W for W = 2 and 4, T = W.
    int cfg[][4] = {{2, 6, 3, 1}, {2, 7, 4, 2}, {3, 1, 3, 2}, {2, 9, 5, 4}, {3, 2, 3, 4}, {2, 4, 2, 4}};
    for (int k = 0; k < 6; k++) {
        Tensor *x = tensor_newv(true, 3, cfg[k][0], cfg[k][1], cfg[k][2]);
        Tensor *w = tensor_newv(true, 2, cfg[k][2], cfg[k][3]);
        fill_normal(x, 100 + k, 1.0);
        fill_normal(w, 200 + k, 0.7);
        GradcheckResult r = gradcheck("conv1d_silu", f_conv_silu, (Tensor *[]){x, w}, 2, NULL, &o);
        cr_assert(r.passed, "config %d: max rel err %.3e (input %d, element %lld: analytic %.12g, numeric %.12g)",
                  k, r.max_rel, r.worst_input, (long long)r.worst_index, r.analytic, r.numeric);
        tensor_free(x);
        tensor_free(w);
    }
}

// Forward and backward of the fused op against silu(conv) on one input, with
// gradients wanted for x, w or both (need: bit 0 x, bit 1 w).
static void check_against_composed(int B, int T, int C, int W, int need) {
    Tensor *x = tensor_newv(need & 1, 3, B, T, C), *w = tensor_newv(need & 2, 2, C, W);
    fill_normal(x, 300 + T, 1.0);
    fill_normal(w, 400 + W, 0.7);
    Tensor *seed = tensor_newv(false, 3, B, T, C);
    fill_normal(seed, 500, 1.0);
    real *dx[2] = {NULL, NULL}, *dw[2] = {NULL, NULL}, *y[2];
    for (int form = 0; form < 2; form++) {   // on device_default() (AG_DEVICE=cuda: the GPU)
        gradcheck_run_seeds(form ? f_conv_silu : f_conv_silu_composed, (Tensor *[]){x, w}, 2, NULL,
                            (const real *[]){seed->data}, &y[form], NULL);
        if (x->grad) {
            dx[form] = xmalloc((size_t)x->numel * sizeof(real));
            memcpy(dx[form], x->grad, (size_t)x->numel * sizeof(real));
        }
        if (w->grad) {
            dw[form] = xmalloc((size_t)w->numel * sizeof(real));
            memcpy(dw[form], w->grad, (size_t)w->numel * sizeof(real));
        }
    }
    cr_assert_leq(max_rel_diff(y[0], y[1], x->numel), FORM_TOL, "y: B %d T %d C %d W %d", B, T, C, W);
    if (need & 1)
        cr_assert_leq(max_rel_diff(dx[0], dx[1], x->numel), FORM_TOL, "dx: B %d T %d C %d W %d", B, T, C, W);
    if (need & 2)
        cr_assert_leq(max_rel_diff(dw[0], dw[1], w->numel), FORM_TOL, "dw: B %d T %d C %d W %d", B, T, C, W);
    for (int form = 0; form < 2; form++) {
        free(y[form]);
        free(dx[form]);
        free(dw[form]);
    }
    tensor_free(x);
    tensor_free(w);
    tensor_free(seed);
}

Test(ops_conv_silu, equals_silu_of_conv) {
    check_against_composed(2, 7, 5, 4, 3);
    check_against_composed(3, 2, 3, 4, 3);   // T < W
    check_against_composed(2, 5, 4, 1, 3);
    // Several row blocks and tiles, blocks crossing sequence boundaries,
    // parallel (numel * W above OPS_PAR_MIN).
    check_against_composed(3, 100, 40, 4, 3);
    check_against_composed(3, 100, 40, 4, 1);   // dx only
    check_against_composed(3, 100, 40, 4, 2);   // dw only
    check_against_composed(5, 33, 17, 3, 3);
    // Blocks longer than a tile (> 2048 rows): tiles split inside a block and
    // the recomputed halo rows are used for dx.
    check_against_composed(1, 2200, 4, 4, 3);
    check_against_composed(2, 1500, 3, 2, 1);
}

// The direct definitions of both gradients of the bare convolution, in
// double, written independently of the kernel: g is dL/dy.
static void conv_backward_direct(double *dx, double *dw, const real *g, const Tensor *x, const Tensor *w) {
    int B = x->shape[0], T = x->shape[1], C = x->shape[2], W = w->shape[1];
    memset(dx, 0, (size_t)x->numel * sizeof(double));
    memset(dw, 0, (size_t)w->numel * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                for (int j = 0; j < W; j++) {
                    int src = t - W + 1 + j;
                    if (src < 0) continue;
                    double gy = g[(b * T + t) * C + c];
                    dx[(b * T + src) * C + c] += gy * w->data[c * W + j];
                    dw[c * W + j] += gy * x->data[(b * T + src) * C + c];
                }
}

Test(ops_conv_silu, conv_backward_matches_direct_loop) {
    // Row counts below one block, a few blocks, and the block cap (4 * 600 rows).
    int cfg[][4] = {{2, 7, 5, 4}, {3, 100, 40, 4}, {4, 600, 12, 3}, {2, 50, 9, 1}};
    for (int k = 0; k < 4; k++) {
        int B = cfg[k][0], T = cfg[k][1], C = cfg[k][2], W = cfg[k][3];
        Tensor *x = tensor_newv(true, 3, B, T, C), *w = tensor_newv(true, 2, C, W);
        Tensor *g = tensor_newv(false, 3, B, T, C);
        fill_normal(x, 600 + k, 1.0);
        fill_normal(w, 700 + k, 0.7);
        fill_normal(g, 800 + k, 1.0);
        Tape tp;
        tape_init(&tp);
        tape_backward_from(&tp, op_conv1d_causal(&tp, x, w, NULL), g->data);
        double *dx = xmalloc((size_t)x->numel * sizeof(double)), *dw = xmalloc((size_t)w->numel * sizeof(double));
        conv_backward_direct(dx, dw, g->data, x, w);
        real *dxr = xmalloc((size_t)x->numel * sizeof(real)), *dwr = xmalloc((size_t)w->numel * sizeof(real));
        for (int64_t i = 0; i < x->numel; i++) dxr[i] = (real)dx[i];
        for (int64_t i = 0; i < w->numel; i++) dwr[i] = (real)dw[i];
        cr_assert_leq(max_rel_diff(x->grad, dxr, x->numel), FORM_TOL, "dx, config %d", k);
        cr_assert_leq(max_rel_diff(w->grad, dwr, w->numel), FORM_TOL, "dw, config %d", k);
        free(dx);
        free(dw);
        free(dxr);
        free(dwr);
        tape_free(&tp);
        tensor_free(x);
        tensor_free(w);
        tensor_free(g);
    }
}

static void run_fused(int threads, Tensor *x, Tensor *w, const real *seed, real *y, real *dx, real *dw) {
    omp_set_num_threads(threads);
    Tape tp;
    tape_init(&tp);
    memset(x->grad, 0, (size_t)x->numel * sizeof(real));
    memset(w->grad, 0, (size_t)w->numel * sizeof(real));
    Tensor *out = op_conv1d_causal_silu(&tp, x, w, NULL);
    memcpy(y, out->data, (size_t)x->numel * sizeof(real));
    tape_backward_from(&tp, out, seed);
    memcpy(dx, x->grad, (size_t)x->numel * sizeof(real));
    memcpy(dw, w->grad, (size_t)w->numel * sizeof(real));
    tape_free(&tp);
}

Test(ops_conv_silu, deterministic_across_thread_counts) {
    int B = 3, T = 200, C = 64, W = 4;   // 600 rows: several row blocks
    Tensor *x = tensor_newv(true, 3, B, T, C), *w = tensor_newv(true, 2, C, W), *g = tensor_newv(false, 3, B, T, C);
    fill_normal(x, 900, 1.0);
    fill_normal(w, 901, 0.5);
    fill_normal(g, 902, 1.0);
    size_t nx = (size_t)x->numel * sizeof(real), nw = (size_t)w->numel * sizeof(real);
    real *y1 = xmalloc(nx), *y3 = xmalloc(nx), *dx1 = xmalloc(nx), *dx3 = xmalloc(nx);
    real *dw1 = xmalloc(nw), *dw3 = xmalloc(nw);
    int saved = omp_get_max_threads();
    run_fused(1, x, w, g->data, y1, dx1, dw1);
    run_fused(3, x, w, g->data, y3, dx3, dw3);
    omp_set_num_threads(saved);
    cr_assert_eq(memcmp(y1, y3, nx), 0);
    cr_assert_eq(memcmp(dx1, dx3, nx), 0);
    cr_assert_eq(memcmp(dw1, dw3, nw), 0);
    free(y1);
    free(y3);
    free(dx1);
    free(dx3);
    free(dw1);
    free(dw3);
    tensor_free(x);
    tensor_free(w);
    tensor_free(g);
}

Test(ops_conv_silu, one_node_and_no_saved_state) {
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(true, 3, 2, 5, 3), *w = tensor_newv(true, 2, 3, 4);
    fill_normal(x, 1, 1.0);
    fill_normal(w, 2, 1.0);
    op_conv1d_causal_silu(&tp, x, w, NULL);
    cr_assert_eq(tp.n_nodes, 1);
    cr_assert_str_eq(tp.nodes[0]->op->name, "conv1d_silu");
    cr_assert_null(tp.nodes[0]->saved);
    tensor_free(x);
    tensor_free(w);
    tape_free(&tp);
}

Test(ops_conv_silu, bad_shapes_name_the_op) {
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(false, 3, 2, 7, 5), *w = tensor_newv(false, 2, 4, 3), *w0 = tensor_newv(false, 2, 5, 0);
    cr_assert(EXPECT_FAILURE(op_conv1d_causal_silu(&tp, x, w, NULL)));
    cr_assert(strstr(ag_last_error(), "conv1d_silu") && strstr(ag_last_error(), "(2, 7, 5)") &&
                  strstr(ag_last_error(), "(4, 3)"),
              "got: %s", ag_last_error());
    cr_assert(EXPECT_FAILURE(op_conv1d_causal_silu(&tp, x, w0, NULL)));
    cr_assert(strstr(ag_last_error(), "conv1d_silu") && strstr(ag_last_error(), "W >= 1"), "got: %s",
              ag_last_error());
    tensor_free(x);
    tensor_free(w);
    tensor_free(w0);
    tape_free(&tp);
}
