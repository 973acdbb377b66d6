// Tests of the `linear` and `mamba` mixers (src/layers/linear.c, mamba.c):
// gradient checks w.r.t. the input, the initial state and every parameter in
// each form, decoding token by token against the parallel forward, state
// carried across segments, and the parameters' names, flags and inits.
#include <math.h>

#include "gla_layer.h"
#include "test_util.h"

// Layer outputs of two computations of the same math (decode vs forward,
// segments vs one run). The output stage's per-head RMSNorm scales each
// head's o to unit RMS, so where a head's o_t is small next to the terms
// summed into it, their rounding shows at full size: in float32 one position
// in 26 differs by 1.5e-4 (the rest ≤ 2e-6); in float64 the same stays far
// below FORM_TOL.
#ifdef AG_DOUBLE
#define LAYER_TOL FORM_TOL
#else
#define LAYER_TOL FORM_TOL
#endif

static const char *const KIND_NAMES[] = {"linear", "mamba"};
static const MixerForm FORMS[] = {MIXER_FORM_PARALLEL, MIXER_FORM_CHUNKED, MIXER_FORM_RECURRENT};

typedef struct Layer {
    ParamStore ps;
    Mixer *m;
} Layer;

static MixerConfig small_config(MixerForm form, int conv_size) {
    MixerConfig c = mixer_config_default(8, 2, 4, 4);   // D 8, H 2, dk = dv = 4
    c.chunk_size = 4;
    c.conv_size = conv_size;
    c.form = form;
    c.out_std = 0.3;   // a larger output so that every gradient is well above rounding
    return c;
}

static void layer_make(Layer *L, const char *kind, const MixerConfig *c, uint64_t seed) {
    params_init(&L->ps);
    L->m = mixer_create(kind, c, &L->ps, "mix.");
    params_finalize(&L->ps, seed);
    // out_norm and D start at 1 and the convolutions at their init: perturb
    // every parameter a little so that no gradient is special by symmetry.
    Rng r;
    rng_seed(&r, seed + 99);
    for (int64_t i = 0; i < L->ps.numel; i++) L->ps.data[i] += (real)(0.05 * rng_normal(&r));
}

static void layer_free(Layer *L) {
    mixer_destroy(L->m);
    params_free(&L->ps);
}

static int f_layer(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    Mixer *m = ctx;
    out[0] = m->kind->forward(tp, m, in[0], NULL, in[1], &out[1]);
    return 2;
}

// Mamba-2's init makes dt = 1e-3..1e-1, so every path through k (scaled by
// dt) is ~1e-3 of the skip D ⊙ v: below what central differences resolve
// next to an O(10) f. Check at dt ≈ 0.6..1.2 and decay rates a ≈ 0.6..1.1.
static void mamba_moderate_dt(Layer *L) {
    Tensor *bias = params_find(&L->ps, "mix.dt_bias"), *A = params_find(&L->ps, "mix.A_log");
    for (int h = 0; h < bias->numel; h++) {
        bias->data[h] = (real)(0.2 + 0.5 * h);
        A->data[h] = (real)(-0.5 + 0.6 * h);
    }
}

Test(linear_mamba, gradcheck_input_state_and_every_parameter) {
    // The layer in its training form; op_gla's other forms have their own
    // gradchecks (test_gla.c) and the forms' layer outputs meet in decode_*.
    int B = 2, T = 9;   // T = 9 with chunks of 4: a partial last chunk
    for (int kind = 0; kind < 2; kind++)
        for (size_t f = 1; f < 2; f++) {
            MixerConfig c = small_config(FORMS[f], 4);
            Layer L;
            layer_make(&L, KIND_NAMES[kind], &c, 11);
            if (kind == 1) mamba_moderate_dt(&L);
            Tensor *u = tensor_newv(true, 3, B, T, c.d_model), *s0 = tensor_newv(true, 4, B, 2, 4, 4);
            fill_normal(u, 21, 1.0);
            fill_normal(s0, 22, 0.5);
            int n = 2 + L.ps.n;
            Tensor **in = xcalloc((size_t)n, sizeof *in);
            in[0] = u;
            in[1] = s0;
            for (int i = 0; i < L.ps.n; i++) in[2 + i] = L.ps.params[i];
            char label[64];
            snprintf(label, sizeof label, "%s %s", KIND_NAMES[kind], mixer_form_name(FORMS[f]));
            GradcheckOptions o = gradcheck_defaults();
#ifdef AG_DOUBLE
            // f here is O(10) and some weight gradients are ~1e-4: at eps 1e-6
            // the rounding of f (~1e-15 / eps) is 4e-6 of such an element
            // (measured; it grows as 1/eps: 1.4e-6 at 1e-7 for linear too).
            // eps 1e-5 keeps truncation negligible: worst measured 1.4e-7.
            o.eps = 1e-5;
#else
            // float32's default eps 1e-2 meets the curvature of the q path
            // (conv, SiLU, L2 norm): 9% truncation error on conv_q[0]. At 3e-3
            // truncation is ~10x smaller and rounding (~1e-7 |f| / eps) still
            // ~1e-3 of the gradients checked.
            o.eps = 3e-3;
#endif
            GradcheckResult r = gradcheck(label, f_layer, in, n, L.m, &o);
            ASSERT_GRADCHECK(r, label);
            cr_assert_gt(r.n_checked, 0);
            free(in);
            tensor_free(u);
            tensor_free(s0);
            layer_free(&L);
        }
}

// Every position of step() against the forward of the whole sequence, on
// device_default() (test_mixer_decode_diff).
static void check_decode(const char *kind, MixerForm form, int conv_size) {
    int B = 2, T = 11;
    MixerConfig c = small_config(form, conv_size);
    Layer L;
    layer_make(&L, kind, &c, 31);
    Tensor *u = tensor_newv(false, 3, B, T, c.d_model);
    fill_normal(u, 32, 1.0);
    int t = -1;
    double d = test_mixer_decode_diff(L.m, &L.ps, u, &t);
    cr_assert(d <= LAYER_TOL, "%s (%s, conv %d): step at t = %d differs from the forward by %.3e (tolerance %.0e)",
              kind, mixer_form_name(form), conv_size, t, d, LAYER_TOL);
    tensor_free(u);
    layer_free(&L);
}

Test(linear_mamba, decode_steps_equal_forward_at_every_position) {
    for (int kind = 0; kind < 2; kind++)
        for (size_t f = 0; f < 3; f++) {
            check_decode(KIND_NAMES[kind], FORMS[f], 4);
            check_decode(KIND_NAMES[kind], FORMS[f], 0);
        }
}

// in = u1, u2, then the parameters: outputs y1, y2 and the final state of
// two runs on one tape, the first's final state the second's initial state.
static int f_segments(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    Mixer *m = ctx;
    Tensor *s1;
    out[0] = m->kind->forward(tp, m, in[0], NULL, NULL, &s1);
    out[1] = m->kind->forward(tp, m, in[1], NULL, s1, &out[2]);
    return 3;
}

// The layer's final state fed as the next segment's initial state equals one
// long run. Without a convolution: the forward API carries S only, not the
// convolution's last inputs, so with conv_size > 0 the second segment's first
// conv_size - 1 positions would differ. Forwards on device_default()
// (AG_DEVICE=cuda: the GPU), the parameters moved there as inputs of the runs.
Test(linear_mamba, state_carried_across_segments_equals_long_run) {
    int B = 2, T = 13, T1 = 5;
    for (int kind = 0; kind < 2; kind++) {
        MixerConfig c = small_config(MIXER_FORM_CHUNKED, 0);
        Layer L;
        layer_make(&L, KIND_NAMES[kind], &c, 41);
        Tensor *u = tensor_newv(false, 3, B, T, c.d_model);
        Tensor *u1 = tensor_newv(false, 3, B, T1, c.d_model), *u2 = tensor_newv(false, 3, B, T - T1, c.d_model);
        fill_normal(u, 42, 1.0);
        for (int b = 0; b < B; b++) {
            memcpy(u1->data + (int64_t)b * T1 * c.d_model, u->data + (int64_t)b * T * c.d_model,
                   (size_t)T1 * c.d_model * sizeof(real));
            memcpy(u2->data + (int64_t)b * (T - T1) * c.d_model, u->data + ((int64_t)b * T + T1) * c.d_model,
                   (size_t)(T - T1) * c.d_model * sizeof(real));
        }
        // Forwards alone (no output seeded): u and no initial state (f_layer), then u1, u2.
        Tensor **in = xcalloc((size_t)(2 + L.ps.n), sizeof *in);
        for (int i = 0; i < L.ps.n; i++) in[2 + i] = L.ps.params[i];
        in[0] = u;
        real *w[2], *sg[3];
        int64_t wn[2];
        cr_assert_eq(gradcheck_run_seeds(f_layer, in, 2 + L.ps.n, L.m, (const real *[]){NULL, NULL}, w, wn), 2);
        in[0] = u1, in[1] = u2;
        cr_assert_eq(
            gradcheck_run_seeds(f_segments, in, 2 + L.ps.n, L.m, (const real *[]){NULL, NULL, NULL}, sg, NULL), 3);
        const real *y = w[0], *sa = w[1], *y1 = sg[0], *y2 = sg[1], *s2 = sg[2];
        double d = max_rel_diff(sa, s2, wn[1]);
        cr_assert(d <= FORM_TOL, "%s: final state differs by %.3e", KIND_NAMES[kind], d);
        for (int b = 0; b < B; b++) {
            const real *yb = y + (int64_t)b * T * c.d_model;
            d = fmax(max_rel_diff(yb, y1 + (int64_t)b * T1 * c.d_model, (int64_t)T1 * c.d_model),
                     max_rel_diff(yb + (int64_t)T1 * c.d_model, y2 + (int64_t)b * (T - T1) * c.d_model,
                                  (int64_t)(T - T1) * c.d_model));
            cr_assert(d <= LAYER_TOL, "%s: outputs of batch %d differ by %.3e", KIND_NAMES[kind], b, d);
        }
        for (int k = 0; k < 2; k++) free(w[k]);
        for (int k = 0; k < 3; k++) free(sg[k]);
        free(in);
        tensor_free(u), tensor_free(u1), tensor_free(u2);
        layer_free(&L);
    }
}

Test(linear_mamba, parameters_names_flags_and_init) {
    MixerConfig c = mixer_config_default(64, 8, 16, 16);
    c.out_std = 0.01;
    for (int kind = 0; kind < 2; kind++) {
        ParamStore ps;
        params_init(&ps);
        Mixer *m = mixer_create(KIND_NAMES[kind], &c, &ps, "layers.0.mixer.");
        params_finalize(&ps, 5);
        const char *common[] = {"wq", "wk", "wv", "wo", "wg", "conv_q", "conv_k", "conv_v", "out_norm"};
        char name[128];
        for (size_t i = 0; i < sizeof common / sizeof common[0]; i++) {
            snprintf(name, sizeof name, "layers.0.mixer.%s", common[i]);
            cr_assert(params_find(&ps, name), "%s: no parameter %s", KIND_NAMES[kind], name);
        }
        Tensor *wo = params_find(&ps, "layers.0.mixer.wo");
        cr_assert_eq(wo->shape[0], 8 * 16);
        cr_assert_eq(wo->shape[1], 64);
        double ss = 0;
        for (int64_t i = 0; i < wo->numel; i++) ss += (double)wo->data[i] * wo->data[i];
        double std = sqrt(ss / wo->numel);   // 8192 samples: within 5% of out_std
        cr_assert(fabs(std - c.out_std) < 0.05 * c.out_std, "%s: wo std %.4g, want %.4g", KIND_NAMES[kind], std,
                  c.out_std);
        cr_assert_eq(params_find(&ps, "layers.0.mixer.A_log") != NULL, kind == 1);
        if (kind == 1) {
            Tensor *A = params_find(&ps, "layers.0.mixer.A_log"), *bias = params_find(&ps, "layers.0.mixer.dt_bias");
            Tensor *D = params_find(&ps, "layers.0.mixer.D"), *wdt = params_find(&ps, "layers.0.mixer.w_dt");
            cr_assert(A && bias && D && wdt);
            cr_assert(A->flags & TENSOR_NO_DECAY && bias->flags & TENSOR_NO_DECAY && D->flags & TENSOR_NO_DECAY);
            cr_assert(!(wdt->flags & TENSOR_NO_DECAY));
            cr_assert_eq(wdt->shape[0], 64);
            cr_assert_eq(wdt->shape[1], 8);
            cr_assert_eq(D->shape[0], 8);
            cr_assert_eq(D->shape[1], 16);
            for (int h = 0; h < 8; h++) {
                double a = exp((double)A->data[h]);
                double dt0 = log1p(exp((double)bias->data[h]));   // softplus(dt_bias)
                cr_assert(a >= 1 - 1e-5 && a <= 16 + 1e-4, "A_log[%d] = %g: a = %g outside [1, 16]", h, A->data[h], a);
                cr_assert(dt0 >= 1e-3 * (1 - 1e-4) && dt0 <= 1e-1 * (1 + 1e-4), "softplus(dt_bias[%d]) = %g", h, dt0);
            }
            for (int64_t i = 0; i < D->numel; i++) cr_assert_eq(D->data[i], 1);
        }
        mixer_destroy(m);
        params_free(&ps);
    }
}
