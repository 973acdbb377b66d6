// Tests of the `mamba2` mixer (src/layers/mamba.c, MODEL.md "mamba2"): a
// float64 gradient check of the layer, its three forms equal forward and
// backward, decoding token by token against the forward, the output against
// a direct loop over MODEL.md's formulas (no scale on q, a scalar D per head,
// the per-head RMSNorm after the gate with a gain per channel), and its
// parameters. Packed documents: test_docs_layers.c.
#include <math.h>

#include "gla_layer.h"
#include "test_util.h"

enum { D = 8, H = 2, DK = 4, DV = 3 };   // dk != dv: the state is dk x dv

typedef struct Layer {
    ParamStore ps;
    Mixer *m;
} Layer;

static MixerConfig small_config(MixerForm form, int conv_size) {
    MixerConfig c = mixer_config_default(D, H, DK, DV);
    c.chunk_size = 4;
    c.conv_size = conv_size;
    c.form = form;
    c.out_std = 0.3;   // a larger output so that every gradient is well above rounding
    return c;
}

// Every parameter perturbed (none special by symmetry: out_norm and D start
// at 1), and dt moderate as in test_linear_mamba.c: at Mamba-2's init the
// paths through the state are ~1e-3 of the skip.
static void layer_make(Layer *L, const MixerConfig *c, uint64_t seed) {
    params_init(&L->ps);
    L->m = mixer_create("mamba2", c, &L->ps, "mix.");
    params_finalize(&L->ps, seed);
    Rng r;
    rng_seed(&r, seed + 99);
    for (int64_t i = 0; i < L->ps.numel; i++) L->ps.data[i] += (real)(0.05 * rng_normal(&r));
    Tensor *bias = params_find(&L->ps, "mix.dt_bias"), *A = params_find(&L->ps, "mix.A_log");
    for (int h = 0; h < H; h++) {
        bias->data[h] = (real)(0.2 + 0.5 * h);
        A->data[h] = (real)(-0.5 + 0.6 * h);
    }
}

static void layer_free(Layer *L) {
    mixer_destroy(L->m);
    params_free(&L->ps);
}

static int f_layer(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)n;
    Mixer *m = ctx;
    out[0] = m->kind->forward(tp, m, in[0], NULL, in[1], &out[1]);
    return 2;
}

// in[0] = u (B, T, D), in[1] = s0 (B, H, dk, dv), then every parameter.
static Tensor **layer_inputs(const Layer *L, int B, int T, uint64_t seed, int *n) {
    *n = 2 + L->ps.n;
    Tensor **in = xcalloc((size_t)*n, sizeof *in);
    in[0] = tensor_newv(true, 3, B, T, D);
    in[1] = tensor_newv(true, 4, B, H, DK, DV);
    fill_normal(in[0], seed, 1.0);
    fill_normal(in[1], seed + 1, 0.5);
    for (int i = 0; i < L->ps.n; i++) in[2 + i] = L->ps.params[i];
    return in;
}

static void inputs_free(Tensor **in) {
    tensor_free(in[0]);
    tensor_free(in[1]);
    free(in);
}

Test(mamba2, gradcheck_input_state_and_every_parameter) {
    int B = 2, T = 9;   // chunks of 4: a partial last chunk
    for (int conv = 0; conv <= 4; conv += 4) {
        Layer L;
        MixerConfig c = small_config(MIXER_FORM_CHUNKED, conv);
        layer_make(&L, &c, 11 + conv);
        int n;
        Tensor **in = layer_inputs(&L, B, T, 21, &n);
        GradcheckOptions o = gradcheck_defaults();
#ifdef AG_DOUBLE
        o.eps = 1e-5;   // as test_linear_mamba.c: f is O(10), some weight gradients ~1e-4
#else
        o.eps = 3e-3;   // as test_linear_mamba.c: the curvature of the conv/SiLU path
#endif
        char label[64];
        snprintf(label, sizeof label, "mamba2 chunked, conv %d", conv);
        GradcheckResult r = gradcheck(label, f_layer, in, n, L.m, &o);
        ASSERT_GRADCHECK(r, label);
        cr_assert_gt(r.n_checked, 0);
        inputs_free(in);
        layer_free(&L);
    }
}

// One forward and backward per form from the same inputs and output seeds:
// the outputs, the final state and every gradient agree.
Test(mamba2, forms_equal_forward_and_backward) {
    int B = 2, T = 11;
    static const MixerForm forms[] = {MIXER_FORM_CHUNKED, MIXER_FORM_PARALLEL, MIXER_FORM_RECURRENT};
    Layer L;
    MixerConfig c = small_config(MIXER_FORM_CHUNKED, 4);
    layer_make(&L, &c, 51);
    int n;
    Tensor **in = layer_inputs(&L, B, T, 52, &n);
    real *out[3][2], *grad[3];
    int64_t out_n[2], total = 0;
    for (int i = 0; i < n; i++) total += in[i]->numel;
    for (int f = 0; f < 3; f++) {
        L.m->cfg.form = forms[f];
        cr_assert_eq(gradcheck_run(f_layer, in, n, L.m, 53, out[f], out_n), 2);
        grad[f] = xmalloc((size_t)total * sizeof(real));
        int64_t at = 0;
        for (int i = 0; i < n; i++) {
            memcpy(grad[f] + at, in[i]->grad, (size_t)in[i]->numel * sizeof(real));
            at += in[i]->numel;
        }
    }
    for (int f = 1; f < 3; f++) {
        const char *name = mixer_form_name(forms[f]);
        double dy = max_rel_diff(out[0][0], out[f][0], out_n[0]), ds = max_rel_diff(out[0][1], out[f][1], out_n[1]);
        cr_assert(dy <= FORM_TOL && ds <= FORM_TOL, "%s vs chunked: output %.3e, final state %.3e", name, dy, ds);
        int64_t at = 0;
        for (int i = 0; i < n; i++) {
            double d = max_rel_diff(grad[0] + at, grad[f] + at, in[i]->numel);
            cr_assert(d <= FORM_TOL, "%s vs chunked: the gradient of input %d differs by %.3e", name, i, d);
            at += in[i]->numel;
        }
    }
    for (int f = 0; f < 3; f++) {
        free(out[f][0]), free(out[f][1]), free(grad[f]);
    }
    inputs_free(in);
    layer_free(&L);
}

Test(mamba2, decode_steps_equal_forward_at_every_position) {
    static const MixerForm forms[] = {MIXER_FORM_CHUNKED, MIXER_FORM_PARALLEL, MIXER_FORM_RECURRENT};
    for (int f = 0; f < 3; f++)
        for (int conv = 0; conv <= 4; conv += 4) {
            int B = 2, T = 11, t = -1;
            MixerConfig c = small_config(forms[f], conv);
            Layer L;
            layer_make(&L, &c, 31);
            Tensor *u = tensor_newv(false, 3, B, T, D);
            fill_normal(u, 32, 1.0);
            double d = test_mixer_decode_diff(L.m, &L.ps, u, &t);
            cr_assert(d <= FORM_TOL, "%s, conv %d: step at t = %d differs from the forward by %.3e",
                      mixer_form_name(forms[f]), conv, t, d);
            tensor_free(u);
            layer_free(&L);
        }
}

static const real *P(const Layer *L, const char *name) {
    char full[64];
    snprintf(full, sizeof full, "mix.%s", name);
    const Tensor *t = params_find(&L->ps, full);
    cr_assert(t, "no parameter %s", full);
    return t->data;
}

// x (D) times W (D, n) -> y (n).
static void matvec(const real *x, const real *W, int n, double *y) {
    for (int j = 0; j < n; j++) {
        y[j] = 0;
        for (int i = 0; i < D; i++) y[j] += (double)x[i] * W[i * n + j];
    }
}

// MODEL.md's formulas for one row, token by token in double, without the
// short convolution (conv_size 0: q, k, v are the projections themselves).
static void reference_row(const Layer *L, const real *u, int T, double eps, double *y) {
    const real *wq = P(L, "wq"), *wk = P(L, "wk"), *wv = P(L, "wv"), *wg = P(L, "wg"), *wo = P(L, "wo");
    const real *wdt = P(L, "w_dt"), *bias = P(L, "dt_bias"), *Alog = P(L, "A_log"), *Dh = P(L, "D");
    const real *gain = P(L, "out_norm");
    double S[H][DK][DV] = {{{0}}}, q[H * DK], k[H * DK], v[H * DV], z[H * DV], a[H], o[H * DV];
    for (int t = 0; t < T; t++) {
        const real *ut = u + t * D;
        matvec(ut, wq, H * DK, q), matvec(ut, wk, H * DK, k), matvec(ut, wv, H * DV, v), matvec(ut, wg, H * DV, z);
        matvec(ut, wdt, H, a);
        for (int h = 0; h < H; h++) {
            double x = a[h] + bias[h], dt = x > 30 ? x : log1p(exp(x)), decay = exp(-exp((double)Alog[h]) * dt);
            double ss = 0;
            for (int j = 0; j < DV; j++) {
                double oj = 0;
                for (int i = 0; i < DK; i++) {
                    S[h][i][j] = decay * S[h][i][j] + dt * k[h * DK + i] * v[h * DV + j];
                    oj += S[h][i][j] * q[h * DK + i];   // no 1/sqrt(dk) on q
                }
                double zj = z[h * DV + j];
                oj = (oj + Dh[h] * v[h * DV + j]) * zj / (1 + exp(-zj));   // scalar D, then the gate
                o[h * DV + j] = oj;
                ss += oj * oj;
            }
            double r = 1 / sqrt(ss / DV + eps);   // RMSNorm per head, after the gate
            for (int j = 0; j < DV; j++) o[h * DV + j] *= r * gain[h * DV + j];
        }
        for (int e = 0; e < D; e++) {
            y[t * D + e] = 0;
            for (int j = 0; j < H * DV; j++) y[t * D + e] += o[j] * wo[j * D + e];
        }
    }
}

Test(mamba2, output_equals_the_formulas_of_model_md) {
    int B = 2, T = 7;
    MixerConfig c = small_config(MIXER_FORM_CHUNKED, 0);
    c.norm_eps = 1e-3;   // large enough that an eps in the wrong place shows
    Layer L;
    layer_make(&L, &c, 61);
    Tensor *u = tensor_newv(false, 3, B, T, D);
    fill_normal(u, 62, 1.0);
    real *y = test_mixer_forward_host(L.m, u, NULL, DEVICE_CPU);
    double *ref = xmalloc((size_t)T * D * sizeof *ref);
    real *refr = xmalloc((size_t)T * D * sizeof *refr);
    for (int b = 0; b < B; b++) {
        reference_row(&L, u->data + (int64_t)b * T * D, T, c.norm_eps, ref);
        for (int i = 0; i < T * D; i++) refr[i] = (real)ref[i];
        double d = max_rel_diff(y + (int64_t)b * T * D, refr, (int64_t)T * D);
        cr_assert(d <= FORM_TOL, "row %d: the layer differs from MODEL.md's formulas by %.3e", b, d);
    }
    free(ref), free(refr), free(y);
    tensor_free(u);
    layer_free(&L);
}

Test(mamba2, parameters_names_shapes_and_init) {
    MixerConfig c = mixer_config_default(64, 8, 16, 12);
    ParamStore ps;
    params_init(&ps);
    Mixer *m = mixer_create("mamba2", &c, &ps, "layers.0.mixer.");
    params_finalize(&ps, 5);
    cr_assert(m->kind->recurrent);
    static const struct {
        const char *name;
        int ndim, d0, d1;
        bool no_decay;
    } want[] = {{"wq", 2, 64, 128, false},      {"wk", 2, 64, 128, false},    {"wv", 2, 64, 96, false},
                {"wg", 2, 64, 96, false},       {"wo", 2, 96, 64, false},     {"w_dt", 2, 64, 8, false},
                {"conv_q", 2, 128, 4, false},   {"conv_k", 2, 128, 4, false}, {"conv_v", 2, 96, 4, false},
                {"out_norm", 1, 96, 0, true},   {"D", 1, 8, 0, true},         {"A_log", 1, 8, 0, true},
                {"dt_bias", 1, 8, 0, true}};
    int64_t numel = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "layers.0.mixer.%s", want[i].name);
        const Tensor *t = params_find(&ps, name);
        cr_assert(t, "no parameter %s", name);
        cr_assert(t->ndim == want[i].ndim && t->shape[0] == want[i].d0 && (t->ndim == 1 || t->shape[1] == want[i].d1),
                  "%s is %s", name, SHAPE(t));
        cr_assert_eq(!!(t->flags & TENSOR_NO_DECAY), want[i].no_decay, "%s: weight decay flag", name);
        numel += t->numel;
    }
    cr_assert_eq(numel, ps.numel, "mamba2 has parameters beyond MODEL.md's");
    const Tensor *Dh = params_find(&ps, "layers.0.mixer.D"), *g = params_find(&ps, "layers.0.mixer.out_norm");
    for (int64_t i = 0; i < Dh->numel; i++) cr_assert_eq(Dh->data[i], 1);
    for (int64_t i = 0; i < g->numel; i++) cr_assert_eq(g->data[i], 1);
    mixer_destroy(m);
    params_free(&ps);
}
