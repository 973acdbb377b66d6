// The gdn mixer layer: parameters and their initialisation, gradients with
// respect to the input, the initial state and every parameter, the two forms
// agreeing, and decoding token by token equal to the chunked forward.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mixer.h"
#include "test_util.h"

static Mixer *make_gdn(ParamStore *ps, int D, int H, int dk, int dv, int chunk, MixerForm form, uint64_t seed) {
    MixerConfig c = mixer_config_default(D, H, dk, dv);
    c.chunk_size = chunk;
    c.form = form;
    c.out_std = 0.3;   // large enough that the output carries the mixer's signal at these sizes
    params_init(ps);
    Mixer *m = mixer_create("gdn", &c, ps, "layers.0.mixer.");
    params_finalize(ps, seed);
    return m;
}

Test(gdn_layer, parameters_names_and_init) {
    ParamStore ps;
    int D = 16, H = 4, dk = 8, dv = 6;
    Mixer *m = make_gdn(&ps, D, H, dk, dv, 64, MIXER_FORM_CHUNKED, 3);
    cr_assert(m->kind->recurrent);
    struct {
        const char *name;
        int d0, d1;
        bool no_decay;
    } want[] = {{"wq", D, H * dk, 0},     {"wk", D, H * dk, 0},     {"wv", D, H * dv, 0},  {"wo", H * dv, D, 0},
                {"wg", D, H * dv, 0},     {"conv_q", H * dk, 4, 0}, {"conv_k", H * dk, 4, 0},
                {"conv_v", H * dv, 4, 0}, {"out_norm", dv, -1, 1},  {"w_dt", D, H, 0},     {"dt_bias", H, -1, 1},
                {"A_log", H, -1, 1},      {"w_beta", D, H, 0}};
    int n = sizeof want / sizeof want[0];
    cr_assert_eq(ps.n, n, "gdn registers %d parameters, want %d", ps.n, n);
    for (int i = 0; i < n; i++) {
        char full[128];
        snprintf(full, sizeof full, "layers.0.mixer.%s", want[i].name);
        Tensor *p = params_find(&ps, full);
        cr_assert_not_null(p, "missing parameter %s", full);
        cr_assert_eq(p->shape[0], want[i].d0, "%s", full);
        if (want[i].d1 > 0) cr_assert(p->ndim == 2 && p->shape[1] == want[i].d1, "%s %s", full, SHAPE(p));
        else cr_assert_eq(p->ndim, 1, "%s", full);
        cr_assert_eq((p->flags & TENSOR_NO_DECAY) != 0, want[i].no_decay, "%s weight decay flag", full);
    }
    // A_log = log(U[1, 16]); softplus(dt_bias) in [1e-3, 1e-1].
    Tensor *A_log = params_find(&ps, "layers.0.mixer.A_log"), *dtb = params_find(&ps, "layers.0.mixer.dt_bias");
    for (int h = 0; h < H; h++) {
        cr_assert(A_log->data[h] >= 0 && A_log->data[h] <= log(16.0) + 1e-6, "A_log %g", A_log->data[h]);
        double dt0 = log1p(exp(dtb->data[h]));
        cr_assert(dt0 >= 1e-3 * (1 - 1e-5) && dt0 <= 1e-1 * (1 + 1e-5), "softplus(dt_bias) = %g", dt0);
    }
    bool distinct = A_log->data[0] != A_log->data[1] && dtb->data[0] != dtb->data[1];
    cr_assert(distinct, "per-head A_log and dt_bias are drawn, not constant");
    mixer_destroy(m);
    params_free(&ps);
}

// ---- gradient check: input u, initial state, every parameter; outputs o and S_T ----

static int f_layer(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    Mixer *m = ctx;
    out[0] = m->kind->forward(tp, m, in[0], NULL, in[1], &out[1]);
    return 2;
}

static void gradcheck_layer(MixerForm form, int conv) {
    ParamStore ps;
    int B = 2, T = 7, D = 8, H = 2, dk = 4, dv = 3;
    MixerConfig c = mixer_config_default(D, H, dk, dv);
    c.chunk_size = 3;
    c.form = form;
    c.conv_size = conv;
    c.out_std = 0.3;
    params_init(&ps);
    Mixer *m = mixer_create("gdn", &c, &ps, "m.");
    params_finalize(&ps, 41);
    // Larger w_dt so that g varies visibly between positions.
    Tensor *w_dt = params_find(&ps, "m.w_dt");
    for (int i = 0; i < w_dt->numel; i++) w_dt->data[i] *= 4;
    Tensor *u = tensor_newv(true, 3, B, T, D), *s0 = tensor_newv(true, 4, B, H, dk, dv);
    fill_normal(u, 42, 1.0);
    fill_normal(s0, 43, 0.5);
    Tensor **ins = xmalloc((2 + ps.n) * sizeof *ins);
    ins[0] = u;
    ins[1] = s0;
    for (int i = 0; i < ps.n; i++) ins[2 + i] = ps.params[i];
    char label[64];
    snprintf(label, sizeof label, "gdn layer %s conv %d", mixer_form_name(form), conv);
    GradcheckOptions opt = gradcheck_defaults();
#ifndef AG_DOUBLE
    // float32: the default step 1e-2 sits where q's L2 norm (over dk = 4
    // channels of a small convolution output) curves enough that the central
    // difference's eps^2 term reaches ~5% on conv_q; 3e-3 keeps both that and
    // the rounding term (~1e-6 |f| / eps) well below the tolerance.
    opt.eps = 3e-3;
#endif
    GradcheckResult r = gradcheck(label, f_layer, ins, 2 + ps.n, m, &opt);
    ASSERT_GRADCHECK(r, label);
    cr_assert_gt(r.n_checked, 0);
    free(ins);
    tensor_free(u);
    tensor_free(s0);
    mixer_destroy(m);
    params_free(&ps);
}

Test(gdn_layer, gradcheck_chunked) { gradcheck_layer(MIXER_FORM_CHUNKED, 4); }
Test(gdn_layer, gradcheck_recurrent_without_conv) { gradcheck_layer(MIXER_FORM_RECURRENT, 0); }

// ---- forms and decoding ----

// Chunked vs recurrent at the layer's output. float64: FORM_TOL. float32:
// each form carries 1-4 float32 ulps of the largest element (the chunked one
// sums C-long products in float32; measured against the float64 build), and
// max_rel_diff compares elements below 1e-3 of the largest on that floor,
// where a single ulp of the largest is 1.2e-4 > FORM_TOL already. 1e-3 is
// ~8 ulps of the largest element; see also forms_tol in test_gdn.c.
#ifdef AG_DOUBLE
#define LAYER_FORM_TOL FORM_TOL
#else
#define LAYER_FORM_TOL FORM_TOL
#endif

// The layer's forward and its parameter gradients, copied out.
typedef struct LayerRun {
    real *y, *sT, *grad;   // (B, T, D), (B, H, dk, dv), (ps.numel)
} LayerRun;

// Forward of the layer (f_layer with no initial state: input 1 NULL) and
// backward seeded on y alone, on device_default() (AG_DEVICE=cuda: the GPU):
// the parameters are inputs 2.. of the run, so they move there for it and
// their gradients come back.
static LayerRun run_layer(Mixer *m, ParamStore *ps, Tensor *u) {
    params_zero_grad(ps);
    Tensor **in = xcalloc((size_t)(2 + ps->n), sizeof *in);
    in[0] = u;
    for (int i = 0; i < ps->n; i++) in[2 + i] = ps->params[i];
    Tensor *r = tensor_new(u->ndim, u->shape, false);   // y has u's shape (B, T, D)
    fill_normal(r, 5, 1.0);
    real *out[2];
    int64_t on[2];
    cr_assert_eq(gradcheck_run_seeds(f_layer, in, 2 + ps->n, m, (const real *[]){r->data, NULL}, out, on), 2);
    cr_assert_eq(on[0], u->numel);
    LayerRun lr = {out[0], out[1], xmalloc(ps->numel * sizeof(real))};
    memcpy(lr.grad, ps->grad, ps->numel * sizeof(real));
    tensor_free(r);
    free(in);
    return lr;
}

static void free_layer_run(LayerRun *lr) {
    free(lr->y);
    free(lr->sT);
    free(lr->grad);
}

Test(gdn_layer, chunked_equals_recurrent) {
    ParamStore ps;
    int B = 2, T = 37, D = 16, H = 2, dk = 8, dv = 8;
    Mixer *m = make_gdn(&ps, D, H, dk, dv, 16, MIXER_FORM_CHUNKED, 9);
    Tensor *u = tensor_newv(false, 3, B, T, D);
    fill_normal(u, 10, 1.0);
    LayerRun a = run_layer(m, &ps, u);
    m->cfg.form = MIXER_FORM_RECURRENT;
    LayerRun b = run_layer(m, &ps, u);
    cr_assert_leq(max_rel_diff(a.y, b.y, u->numel), LAYER_FORM_TOL);
    cr_assert_leq(max_rel_diff(a.sT, b.sT, (int64_t)B * H * dk * dv), LAYER_FORM_TOL);
    for (int i = 0; i < ps.n; i++) {
        int64_t off = ps.offsets[i], n = ps.params[i]->numel;
        double e = max_rel_diff(a.grad + off, b.grad + off, n);
        cr_assert_leq(e, LAYER_FORM_TOL, "gradient of %s differs by %.3e", ps.params[i]->name, e);
    }
    free_layer_run(&a);
    free_layer_run(&b);
    tensor_free(u);
    mixer_destroy(m);
    params_free(&ps);
}

// Feed the tokens one at a time through step() and compare every position
// with the chunked forward over the whole sequence (the state and the
// convolution caches carry everything: a wrong cache shows at a later position).
static void check_decode(int conv) {
    ParamStore ps;
    int B = 2, T = 21, D = 16, H = 2, dk = 8, dv = 8;
    MixerConfig c = mixer_config_default(D, H, dk, dv);
    c.chunk_size = 8;
    c.conv_size = conv;
    c.out_std = 0.3;
    params_init(&ps);
    Mixer *m = mixer_create("gdn", &c, &ps, "layers.0.mixer.");
    params_finalize(&ps, 13);
    Tensor *u = tensor_newv(false, 3, B, T, D);
    fill_normal(u, 14, 1.0);
    int t = -1;
    double e = test_mixer_decode_diff(m, &ps, u, &t);
    cr_assert_leq(e, LAYER_FORM_TOL, "conv %d, position %d: step differs from the forward by %.3e", conv, t, e);
    tensor_free(u);
    mixer_destroy(m);
    params_free(&ps);
}

Test(gdn_layer, decode_step_equals_chunked_forward) {
    check_decode(4);
    check_decode(0);
}

Test(gdn_layer, step_refuses_grad_mode) {
    ParamStore ps;
    Mixer *m = make_gdn(&ps, 8, 2, 4, 4, 4, MIXER_FORM_CHUNKED, 1);
    void *cache = m->kind->cache_new(m, 1, 4, DEVICE_CPU);
    Tensor *u = tensor_newv(false, 3, 1, 1, 8);
    Tape tp;
    tape_init(&tp);
    cr_assert(EXPECT_FAILURE(m->kind->step(&tp, m, cache, u)));
    cr_assert(strstr(ag_last_error(), "no-grad"), "message: %s", ag_last_error());
    m->kind->cache_free(cache);
    tensor_free(u);
    tape_free(&tp);
    mixer_destroy(m);
    params_free(&ps);
}
