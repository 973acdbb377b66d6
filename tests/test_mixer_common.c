// ShortConv, OutGate and param_linear: init, step == forward, gradients, values.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mixer_common.h"
#include "test_util.h"

// ---- ShortConv ----

Test(mixer_common, shortconv_init) {
    ParamStore ps;
    params_init(&ps);
    ShortConv c4, c0;
    shortconv_create(&c4, &ps, "m.conv_q", 6, 4);
    shortconv_create(&c0, &ps, "m.conv_k", 6, 0);
    params_finalize(&ps, 3);
    cr_assert_null(c0.w);
    cr_assert_eq(ps.n, 1, "width 0 registers no parameter");
    cr_assert(c4.w == params_find(&ps, "m.conv_q") && c4.w->shape[0] == 6 && c4.w->shape[1] == 4);
    double lo = 1, hi = -1;
    for (int i = 0; i < 24; i++) lo = fmin(lo, c4.w->data[i]), hi = fmax(hi, c4.w->data[i]);
    cr_assert(lo >= -0.5 && hi <= 0.5 && hi - lo > 0.2, "conv weights in [%g, %g], want within +-1/sqrt(4)", lo,
              hi);
    params_free(&ps);
}

// Feed x token by token through shortconv_step (no-grad) and compare every
// position with shortconv_forward over the whole sequence, on
// device_default() (AG_DEVICE=cuda: the GPU).
static void check_step_equals_forward(int B, int T, int C, int W) {
    ParamStore ps;
    params_init(&ps);
    ShortConv c;
    shortconv_create(&c, &ps, "conv", C, W);
    params_finalize(&ps, 11);
    Device d = device_default();
    params_to_device(&ps, d);
    Tape tp;
    tape_init_on(&tp, d);
    tape_no_grad_push(&tp);
    Tensor *x = tensor_newv(false, 3, B, T, C);
    fill_normal(x, 12, 1.0);
    Tensor *xd = tape_tensor_copy(&tp, 3, x->shape, x->data);
    Tensor *full = shortconv_forward(&tp, &c, xd, NULL);
    real *want = xmalloc((size_t)x->numel * sizeof(real)), *got = xmalloc((size_t)B * C * sizeof(real));
    dev_to_host(want, full->data, (size_t)x->numel * sizeof(real), d);
    ShortConvCache cc;
    shortconv_cache_init(&cc, &c, B, d);
    for (int t = 0; t < T; t++) {
        Tensor *yt = shortconv_step(&tp, &c, &cc, op_slice(&tp, xd, 1, t, 1));
        cr_assert(yt->ndim == 3 && yt->shape[0] == B && yt->shape[1] == 1 && yt->shape[2] == C);
        dev_to_host(got, yt->data, (size_t)B * C * sizeof(real), d);
        for (int b = 0; b < B; b++)
            cr_assert_leq(max_rel_diff(got + (int64_t)b * C, want + ((int64_t)b * T + t) * C, C), FORM_TOL,
                          "W %d, t %d, row %d", W, t, b);
    }
    shortconv_cache_free(&cc);
    tape_no_grad_pop(&tp);
    tape_free(&tp);
    free(want), free(got);
    tensor_free(x);
    params_free(&ps);
}

Test(mixer_common, shortconv_step_equals_forward) {
    check_step_equals_forward(2, 9, 5, 4);
    check_step_equals_forward(3, 2, 4, 4);   // T < W
    check_step_equals_forward(2, 5, 3, 1);
    check_step_equals_forward(2, 5, 3, 2);
    check_step_equals_forward(2, 4, 3, 0);   // identity
}

Test(mixer_common, shortconv_forward_is_silu_of_the_conv) {
    ParamStore ps;
    params_init(&ps);
    ShortConv c;
    shortconv_create(&c, &ps, "conv", 3, 2);
    params_finalize(&ps, 5);
    real wv[] = {0.5, -1, 2, 0.25, -0.5, 1};   // (3, 2)
    memcpy(c.w->data, wv, sizeof wv);
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(false, 3, 1, 3, 3);
    fill_normal(x, 6, 1.0);
    Tensor *y = shortconv_forward(&tp, &c, x, NULL);
    for (int t = 0; t < 3; t++)
        for (int ch = 0; ch < 3; ch++) {
            double z = wv[ch * 2 + 1] * x->data[t * 3 + ch] + (t ? wv[ch * 2] * x->data[(t - 1) * 3 + ch] : 0);
            double want = z / (1 + exp(-z));
            cr_assert_float_eq(y->data[t * 3 + ch], want, 1e-6);
        }
    tensor_free(x);
    tape_free(&tp);
    params_free(&ps);
}

static int f_shortconv(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = shortconv_forward(tp, ctx, in[0], NULL);
    return 1;
}

Test(mixer_common, shortconv_gradcheck_input_and_weight) {
    int cfg[][3] = {{7, 5, 4}, {3, 4, 4}};   // (T, C, W): T > W and T < W
    for (int k = 0; k < 2; k++) {
        ParamStore ps;
        params_init(&ps);
        ShortConv c;
        shortconv_create(&c, &ps, "conv", cfg[k][1], cfg[k][2]);
        params_finalize(&ps, 20 + k);
        Tensor *x = tensor_newv(true, 3, 2, cfg[k][0], cfg[k][1]);
        fill_normal(x, 30 + k, 1.0);
        GradcheckResult r = gradcheck("shortconv", f_shortconv, (Tensor *[]){x, c.w}, 2, &c, NULL);
        ASSERT_GRADCHECK(r, "shortconv");
        tensor_free(x);
        params_free(&ps);
    }
}

// ---- OutGate ----

Test(mixer_common, outgate_init_and_names) {
    ParamStore ps;
    params_init(&ps);
    OutGate g;
    int D = 64, H = 4, dv = 16;
    outgate_create(&g, &ps, "layers.0.mixer.", D, H, dv, 1e-6);
    params_finalize(&ps, 7);
    cr_assert_eq(g.norm_w, params_find(&ps, "layers.0.mixer.out_norm"));
    cr_assert_eq(g.wg, params_find(&ps, "layers.0.mixer.wg"));
    cr_assert(g.wg->shape[0] == D && g.wg->shape[1] == H * dv);
    cr_assert(g.norm_w->flags & TENSOR_NO_DECAY, "the norm weight takes no weight decay");
    cr_assert(!(g.wg->flags & TENSOR_NO_DECAY));
    for (int i = 0; i < dv; i++) cr_assert_eq(g.norm_w->data[i], 1);
    double s2 = 0;
    for (int64_t i = 0; i < g.wg->numel; i++) s2 += (double)g.wg->data[i] * g.wg->data[i];
    double std = sqrt(s2 / g.wg->numel);
    // 4096 samples: the sample std is within ~1% of 1/sqrt(D) = 0.125; 5% is safe.
    cr_assert(fabs(std - 0.125) < 0.05 * 0.125, "wg std %g, want 1/sqrt(64)", std);
    params_free(&ps);
}

Test(mixer_common, outgate_values_against_direct_loop) {
    int B = 2, T = 3, D = 5, H = 2, dv = 3;
    double eps = 1e-6;
    ParamStore ps;
    params_init(&ps);
    OutGate g;
    outgate_create(&g, &ps, "", D, H, dv, eps);
    params_finalize(&ps, 8);
    fill_uniform(g.norm_w, 9, 0.5, 1.5);
    Tape tp;
    tape_init(&tp);
    Tensor *o = tensor_newv(false, 3, B, T, H * dv), *u = tensor_newv(false, 3, B, T, D);
    fill_normal(o, 10, 2.0);
    fill_normal(u, 11, 1.0);
    Tensor *y = outgate_forward(&tp, &g, o, u);
    cr_assert(y->ndim == 3 && y->shape[2] == H * dv);
    for (int bt = 0; bt < B * T; bt++)
        for (int h = 0; h < H; h++) {
            const real *oh = o->data + (bt * H + h) * dv;
            double ms = 0;
            for (int i = 0; i < dv; i++) ms += (double)oh[i] * oh[i] / dv;
            for (int i = 0; i < dv; i++) {
                double z = 0;
                for (int d = 0; d < D; d++) z += (double)u->data[bt * D + d] * g.wg->data[d * H * dv + h * dv + i];
                double want = oh[i] / sqrt(ms + eps) * g.norm_w->data[i] * z / (1 + exp(-z));
                cr_assert_float_eq(y->data[(bt * H + h) * dv + i], want, 1e-5 * fmax(1, fabs(want)));
            }
        }
    tensor_free(o);
    tensor_free(u);
    tape_free(&tp);
    params_free(&ps);
}

static int f_outgate(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = outgate_forward(tp, ctx, in[0], in[1]);
    return 1;
}

Test(mixer_common, outgate_gradcheck_inputs_and_parameters) {
    int Ts[] = {4, 1};   // also T = 1 (decoding)
    for (int k = 0; k < 2; k++) {
        int B = 2, T = Ts[k], D = 6, H = 3, dv = 4;
        ParamStore ps;
        params_init(&ps);
        OutGate g;
        outgate_create(&g, &ps, "m.", D, H, dv, 1e-6);
        params_finalize(&ps, 12);
        fill_uniform(g.norm_w, 13, 0.5, 1.5);
        Tensor *o = tensor_newv(true, 3, B, T, H * dv), *u = tensor_newv(true, 3, B, T, D);
        fill_normal(o, 14, 1.0);
        fill_normal(u, 15, 1.0);
        GradcheckResult r =
            gradcheck("outgate", f_outgate, (Tensor *[]){o, u, g.norm_w, g.wg}, 4, &g, NULL);
        ASSERT_GRADCHECK(r, "outgate");
        tensor_free(o);
        tensor_free(u);
        params_free(&ps);
    }
}

Test(mixer_common, bad_shapes_are_reported) {
    ParamStore ps;
    params_init(&ps);
    OutGate g;
    ShortConv c;
    outgate_create(&g, &ps, "", 6, 2, 4, 1e-6);
    shortconv_create(&c, &ps, "conv", 8, 4);
    params_finalize(&ps, 1);
    Tape tp;
    tape_init(&tp);
    Tensor *o = tensor_newv(false, 3, 2, 3, 7), *u = tensor_newv(false, 3, 2, 3, 6);
    cr_assert(EXPECT_FAILURE(outgate_forward(&tp, &g, o, u)));
    cr_assert(strstr(ag_last_error(), "outgate") && strstr(ag_last_error(), "(2, 3, 7)") &&
                  strstr(ag_last_error(), "(2, 3, 6)"),
              "got: %s", ag_last_error());
    cr_assert(EXPECT_FAILURE(shortconv_forward(&tp, &c, u, NULL)));
    cr_assert(strstr(ag_last_error(), "shortconv") && strstr(ag_last_error(), "(2, 3, 6)"), "got: %s",
              ag_last_error());
    tensor_free(o);
    tensor_free(u);
    tape_free(&tp);
    params_free(&ps);
}

Test(mixer_common, param_linear_registers_prefixed_normal_weight) {
    ParamStore ps;
    params_init(&ps);
    Tensor *w = param_linear(&ps, "layers.3.mixer.", "wq", 32, 48, 0.02);
    params_finalize(&ps, 2);
    cr_assert_eq(w, params_find(&ps, "layers.3.mixer.wq"));
    cr_assert(w->ndim == 2 && w->shape[0] == 32 && w->shape[1] == 48 && w->requires_grad);
    double s2 = 0;
    for (int64_t i = 0; i < w->numel; i++) s2 += (double)w->data[i] * w->data[i];
    cr_assert(fabs(sqrt(s2 / w->numel) - 0.02) < 0.002);
    params_free(&ps);
}
