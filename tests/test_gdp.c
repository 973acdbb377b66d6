// The gdp mixer (Gated DeltaProduct, MODEL.md `gdp`): op_gdp against the
// recurrence written out step by step, its gradients, the layer at n_h = 2
// and 3 (gradients, forms, decoding, documents, carried state), n_h = 1
// against gdn bit for bit, and the config key gdp_steps. test_docs_layers.c,
// test_docs_carry.c and test_lm.c run gdp at the default n_h = 2 as well.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "gdn_kernel.h"
#include "test_docs_util.h"

enum { D = 8, H = 2, DK = 4, DV = 3 };

// ---- the op against the recurrence ----

typedef struct OpIn {
    int B, T, n;
    Tensor *q, *k, *v, *beta, *g, *s0;
} OpIn;

// Random inputs: k L2-normalised per head (the layer's), beta in (0, 1), g < 0.
static OpIn op_inputs(int B, int T, int n, uint64_t seed) {
    OpIn a = {B, T, n, NULL, NULL, NULL, NULL, NULL, NULL};
    a.q = tensor_newv(true, 3, B, T, H * DK);
    a.k = tensor_newv(true, 3, B, T, n * H * DK);
    a.v = tensor_newv(true, 3, B, T, n * H * DV);
    a.beta = tensor_newv(true, 3, B, T, n * H);
    a.g = tensor_newv(true, 3, B, T, H);
    a.s0 = tensor_newv(true, 4, B, H, DK, DV);
    fill_normal(a.q, seed, 0.5);
    fill_normal(a.k, seed + 1, 1.0);
    fill_normal(a.v, seed + 2, 1.0);
    fill_normal(a.beta, seed + 3, 1.0);
    fill_normal(a.g, seed + 4, 1.0);
    fill_normal(a.s0, seed + 5, 0.5);
    for (int64_t r = 0; r < a.k->numel / DK; r++) {
        real *x = a.k->data + r * DK, s = 0;
        for (int i = 0; i < DK; i++) s += x[i] * x[i];
        for (int i = 0; i < DK; i++) x[i] /= sqrt(s);
    }
    for (int64_t i = 0; i < a.beta->numel; i++) a.beta->data[i] = 1 / (1 + exp(-a.beta->data[i]));
    for (int64_t i = 0; i < a.g->numel; i++) a.g->data[i] = -log1p(exp(a.g->data[i]));
    return a;
}

static void op_inputs_free(OpIn *a) {
    Tensor *t[] = {a->q, a->k, a->v, a->beta, a->g, a->s0};
    for (int i = 0; i < 6; i++) tensor_free(t[i]);
}

// The definition, in double: per token the decay (none at a document start,
// where the state restarts from zero), then n delta steps, then the output.
static void reference(const OpIn *a, const int *docs, double *o, double *sT) {
    int n = a->n;
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < H; h++) {
            double S[DK][DV];
            for (int i = 0; i < DK; i++)
                for (int j = 0; j < DV; j++) S[i][j] = a->s0->data[((b * H + h) * DK + i) * DV + j];
            for (int t = 0; t < a->T; t++) {
                int64_t r = (int64_t)b * a->T + t;
                double gam = docs && docs[r] ? 0.0 : exp(a->g->data[r * H + h]);
                for (int i = 0; i < DK; i++)
                    for (int j = 0; j < DV; j++) S[i][j] *= gam;
                for (int s = 0; s < n; s++) {
                    const real *k = a->k->data + (r * n + s) * H * DK + h * DK;
                    const real *v = a->v->data + (r * n + s) * H * DV + h * DV;
                    double beta = a->beta->data[(r * n + s) * H + h];
                    for (int j = 0; j < DV; j++) {
                        double sk = 0;
                        for (int i = 0; i < DK; i++) sk += S[i][j] * k[i];
                        double delta = beta * (v[j] - sk);
                        for (int i = 0; i < DK; i++) S[i][j] += k[i] * delta;
                    }
                }
                const real *q = a->q->data + r * H * DK + h * DK;
                for (int j = 0; j < DV; j++) {
                    double acc = 0;
                    for (int i = 0; i < DK; i++) acc += S[i][j] * q[i];
                    o[r * H * DV + h * DV + j] = acc;
                }
            }
            for (int i = 0; i < DK; i++)
                for (int j = 0; j < DV; j++) sT[((b * H + h) * DK + i) * DV + j] = S[i][j];
        }
}

typedef struct OpCtx {
    int n;
    MixerForm form;
    int chunk;
} OpCtx;

static int f_op(Tape *tp, Tensor *const *in, const int *doc_start, void *ctx, Tensor **out) {
    const OpCtx *c = ctx;
    out[0] = op_gdp(tp, in[0], in[1], in[2], in[3], in[4], in[5], doc_start, H, c->n, c->form, c->chunk, &out[1]);
    return 2;
}

static const DocsInKind OP_KINDS[] = {DOCS_SEQ, DOCS_SEQ, DOCS_SEQ, DOCS_SEQ, DOCS_SEQ, DOCS_ROW};

// Documents: row 0 at 0, 5 and 6 (a one-token document), row 1 at 9 and the
// last token; row 1's first document reads s0.
static void op_docs(int *docs, int B, int T) {
    memset(docs, 0, (size_t)B * T * sizeof(int));
    docs[0] = docs[5] = docs[6] = 1;
    docs[T + 9] = docs[T + T - 1] = 1;
}

static void check_reference(int n, MixerForm form, bool with_docs) {
    int B = 2, T = 13;
    OpIn a = op_inputs(B, T, n, 100 + n);
    int docs[2 * 13];
    op_docs(docs, B, T);
    double *o = xmalloc((size_t)B * T * H * DV * sizeof(double)), sT[2 * H * DK * DV];
    reference(&a, with_docs ? docs : NULL, o, sT);
    OpCtx c = {n, form, 4};   // chunks of 4 positions: edges inside a token's steps
    DocsFn f = {f_op, &c, 6, OP_KINDS};
    real *out[2];
    int64_t on[2];
    Tensor *in[] = {a.q, a.k, a.v, a.beta, a.g, a.s0};
    cr_assert_eq(docs_run(&f, in, with_docs ? docs : NULL, (const real *[]){NULL, NULL}, out, on), 2);
    cr_assert_eq(on[0], (int64_t)B * T * H * DV);
    real *ro = xmalloc((size_t)on[0] * sizeof(real)), rs[2 * H * DK * DV];
    for (int64_t i = 0; i < on[0]; i++) ro[i] = (real)o[i];
    for (int64_t i = 0; i < on[1]; i++) rs[i] = (real)sT[i];
    double eo = max_rel_diff(out[0], ro, on[0]), es = max_rel_diff(out[1], rs, on[1]);
    cr_assert_leq(eo, FORM_TOL, "n %d %s docs %d: o differs from the recurrence by %.3e", n, mixer_form_name(form),
                  with_docs, eo);
    cr_assert_leq(es, FORM_TOL, "n %d %s docs %d: S_T differs by %.3e", n, mixer_form_name(form), with_docs, es);
    free(out[0]);
    free(out[1]);
    free(ro);
    free(o);
    op_inputs_free(&a);
}

Test(gdp_op, equals_the_recurrence_every_form) {
    for (int n = 1; n <= 3; n++)
        for (int docs = 0; docs < 2; docs++) {
            check_reference(n, MIXER_FORM_CHUNKED, docs);
            check_reference(n, MIXER_FORM_RECURRENT, docs);
        }
}

Test(gdp_op, packed_equals_separate) {
    int B = 2, T = 13;
    int docs[2 * 13];
    op_docs(docs, B, T);
    for (int form = 0; form < 2; form++) {
        OpIn a = op_inputs(B, T, 3, 7);
        OpCtx c = {3, form ? MIXER_FORM_RECURRENT : MIXER_FORM_CHUNKED, 4};
        DocsFn f = {f_op, &c, 6, OP_KINDS};
        docs_check_packed(&f, (Tensor *[]){a.q, a.k, a.v, a.beta, a.g, a.s0}, docs, B, T, FORM_TOL, "op_gdp");
        op_inputs_free(&a);
    }
}

#ifdef AG_DOUBLE
// Every input, the final state seeded too, documents included.
Test(gdp_op, gradcheck) {
    int B = 2, T = 13;
    int docs[2 * 13];
    op_docs(docs, B, T);
    for (int n = 2; n <= 3; n++)
        for (int form = 0; form < 2; form++) {
            OpIn a = op_inputs(B, T, n, 30 + n);
            OpCtx c = {n, form ? MIXER_FORM_RECURRENT : MIXER_FORM_CHUNKED, 4};
            DocsFn f = {f_op, &c, 6, OP_KINDS};
            char label[64];
            snprintf(label, sizeof label, "op_gdp n %d %s", n, mixer_form_name(c.form));
            // A central difference carries rounding noise of about eps_machine |f| / h:
            // with h = 1e-6 and the |f| of 26-39 interleaved positions that is ~1e-9, as
            // large as tol x floor for the elements of s0's gradient near 1e-3 of its
            // largest (on the GPU, whose fused multiply-adds round differently, one such
            // element failed at 1.5e-6). h = 1e-5 puts the noise ten times lower; the
            // truncation error (h^2 f''' / 6, ~1e-11 here) stays far below the tolerance.
            GradcheckOptions o = gradcheck_defaults();
            o.eps = 1e-5;
            docs_gradcheck(&f, (Tensor *[]){a.q, a.k, a.v, a.beta, a.g, a.s0}, docs, &o, label);
            op_inputs_free(&a);
        }
}
#endif

Test(gdp_op, refuses_wrong_shapes) {
    OpIn a = op_inputs(1, 3, 2, 1);
    Tape tp;
    tape_init(&tp);
    // k of one step where two are declared
    Tensor *k1 = op_slice(&tp, a.k, 2, 0, H * DK);
    cr_assert(EXPECT_FAILURE(op_gdp(&tp, a.q, k1, a.v, a.beta, a.g, NULL, NULL, H, 2, MIXER_FORM_CHUNKED, 4, NULL)));
    cr_assert(strstr(ag_last_error(), "gdp: k"), "message: %s", ag_last_error());
    cr_assert(EXPECT_FAILURE(op_gdp(&tp, a.q, a.k, a.v, a.beta, a.g, NULL, NULL, H, 0, MIXER_FORM_CHUNKED, 4, NULL)));
    cr_assert(strstr(ag_last_error(), "steps per token"), "message: %s", ag_last_error());
    tape_free(&tp);
    op_inputs_free(&a);
}

// ---- the layer ----

static Mixer *make_gdp(ParamStore *ps, const char *kind, int n, MixerForm form, int conv, uint64_t seed) {
    MixerConfig c = mixer_config_default(D, H, DK, DV);
    c.chunk_size = 4;
    c.conv_size = conv;
    c.form = form;
    c.out_std = 0.3;
    c.gdp_steps = n;
    params_init(ps);
    Mixer *m = mixer_create(kind, &c, ps, "m.");
    params_finalize(ps, seed);
    // A decay of ~0.6 and ~0.3 per token (g = -exp(A_log) softplus(dt_bias)): the state carries history.
    Tensor *bias = params_find(ps, "m.dt_bias"), *A = params_find(ps, "m.A_log");
    for (int h = 0; h < H; h++) {
        bias->data[h] = (real)(0.2 + 0.5 * h);
        A->data[h] = (real)(-0.5 + 0.6 * h);
    }
    return m;
}

Test(gdp_layer, parameters) {
    ParamStore ps;
    int n = 3;
    Mixer *m = make_gdp(&ps, "gdp", n, MIXER_FORM_CHUNKED, 4, 1);
    struct {
        const char *name;
        int d0, d1;
    } want[] = {{"wq", D, H * DK},          {"wk", D, n * H * DK},     {"wv", D, n * H * DV},
                {"conv_q", H * DK, 4},      {"conv_k", n * H * DK, 4}, {"conv_v", n * H * DV, 4},
                {"w_beta", D, n * H},       {"w_dt", D, H},            {"wo", H * DV, D}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char full[64];
        snprintf(full, sizeof full, "m.%s", want[i].name);
        Tensor *p = params_find(&ps, full);
        cr_assert_not_null(p, "missing %s", full);
        cr_assert(p->ndim == 2 && p->shape[0] == want[i].d0 && p->shape[1] == want[i].d1, "%s %s", full, SHAPE(p));
    }
    cr_assert_eq(ps.n, 13, "gdp registers gdn's 13 parameters, not %d", ps.n);
    mixer_destroy(m);
    params_free(&ps);
}

#ifdef AG_DOUBLE
// u, s0 and every parameter, both outputs seeded, with documents.
Test(gdp_layer, gradcheck) {
    struct {
        int n, conv;
        MixerForm form;
    } cases[] = {{2, 4, MIXER_FORM_CHUNKED}, {3, 4, MIXER_FORM_CHUNKED}, {3, 0, MIXER_FORM_RECURRENT}};
    int B = 2, T = 7;
    int docs[2 * 7] = {0};
    docs[3] = docs[7 + 5] = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ParamStore ps;
        Mixer *m = make_gdp(&ps, "gdp", cases[i].n, cases[i].form, cases[i].conv, 41 + i);
        Tensor *w_dt = params_find(&ps, "m.w_dt");   // g varies visibly between tokens
        for (int64_t j = 0; j < w_dt->numel; j++) w_dt->data[j] *= 4;
        char label[64];
        snprintf(label, sizeof label, "gdp layer n %d %s conv %d", cases[i].n, mixer_form_name(cases[i].form),
                 cases[i].conv);
        docs_mixer_gradcheck(m, &ps, B, T, 42, docs, NULL, label);
        mixer_destroy(m);
        params_free(&ps);
    }
}
#endif

Test(gdp_layer, chunked_equals_recurrent_forward_and_backward) {
    int B = 2, T = 15;
    int docs[2 * 15] = {0};
    docs[6] = docs[15 + 2] = docs[15 + 11] = 1;
    for (int n = 2; n <= 3; n++) {
        ParamStore ps;
        Mixer *m = make_gdp(&ps, "gdp", n, MIXER_FORM_CHUNKED, 4, 9);
        DocsMixerRun a = docs_mixer_run(m, &ps, B, T, docs);
        m->cfg.form = MIXER_FORM_RECURRENT;
        DocsMixerRun b = docs_mixer_run(m, &ps, B, T, docs);
        char label[32];
        snprintf(label, sizeof label, "n %d", n);
        docs_mixer_runs_agree(&a, &b, &ps, FORM_TOL, label);
        docs_mixer_run_free(&a);
        docs_mixer_run_free(&b);
        mixer_destroy(m);
        params_free(&ps);
    }
}

// n_h = 1 is gdn: the same parameters give the same bits, forward and
// backward, in both forms, with documents and an initial state.
Test(gdp_layer, one_step_is_gdn_bit_for_bit) {
    int B = 2, T = 11;
    int docs[2 * 11] = {0};
    docs[4] = docs[11 + 7] = 1;
    for (int form = 0; form < 2; form++) {
        MixerForm f = form ? MIXER_FORM_RECURRENT : MIXER_FORM_CHUNKED;
        ParamStore pa, pb;
        Mixer *ma = make_gdp(&pa, "gdn", 2, f, 4, 21), *mb = make_gdp(&pb, "gdp", 1, f, 4, 22);
        cr_assert_eq(pa.n, pb.n);
        for (int i = 0; i < pa.n; i++) {
            Tensor *x = pa.params[i], *y = params_find(&pb, x->name);
            cr_assert(y && tensor_same_shape(x, y), "gdp (n_h = 1) lacks gdn's %s %s", x->name, SHAPE(x));
            memcpy(y->data, x->data, x->numel * sizeof(real));
        }
        DocsMixerRun a = docs_mixer_run(ma, &pa, B, T, docs), b = docs_mixer_run(mb, &pb, B, T, docs);
        for (int k = 0; k < 2; k++)
            cr_assert(!memcmp(a.out[k], b.out[k], a.on[k] * sizeof(real)), "%s: output %d", mixer_form_name(f), k);
        cr_assert(!memcmp(a.du, b.du, a.on[0] * sizeof(real)), "%s: du", mixer_form_name(f));
        cr_assert(!memcmp(a.ds0, b.ds0, a.on[1] * sizeof(real)), "%s: ds0", mixer_form_name(f));
        cr_assert(!memcmp(a.grad, b.grad, pa.numel * sizeof(real)), "%s: parameter gradients", mixer_form_name(f));
        docs_mixer_run_free(&a);
        docs_mixer_run_free(&b);
        mixer_destroy(ma);
        mixer_destroy(mb);
        params_free(&pa);
        params_free(&pb);
    }
}

Test(gdp_layer, decode_equals_forward) {
    int B = 2, T = 13;
    int docs[2 * 13] = {0};
    docs[5] = docs[13 + 8] = 1;
    for (int conv = 0; conv <= 4; conv += 4) {
        ParamStore ps;
        Mixer *m = make_gdp(&ps, "gdp", 3, MIXER_FORM_CHUNKED, conv, 13);
        Tensor *u = tensor_newv(false, 3, B, T, D);
        fill_normal(u, 14, 1.0);
        int t = -1, b = -1;
        double e = test_mixer_decode_docs_diff(m, &ps, u, docs, &t, &b);
        cr_assert_leq(e, FORM_TOL, "conv %d: step differs from the forward by %.3e at (%d, %d)", conv, e, b, t);
        tensor_free(u);
        mixer_destroy(m);
        params_free(&ps);
    }
}

Test(gdp_layer, packed_equals_separate) {
    int B = 2, T = 11;
    int *docs = docs_pattern(T, 4);
    for (int form = 0; form < 2; form++) {
        ParamStore ps;
        Mixer *m = make_gdp(&ps, "gdp", 3, form ? MIXER_FORM_RECURRENT : MIXER_FORM_CHUNKED, 4, 17);
        docs_mixer_check_packed(m, &ps, B, T, 18, docs, FORM_TOL, "gdp layer n 3");
        mixer_destroy(m);
        params_free(&ps);
    }
    free(docs);
}

// Windows of 5, 2 and 6 tokens carrying state and convolution inputs equal
// one forward over the 13 tokens (documents at a window's first position and
// inside windows).
Test(gdp_layer, carried_state_equals_one_pass) {
    int B = 2, T = 13, wins[] = {5, 2, 6};
    int docs[2 * 13] = {0};
    docs[5] = docs[9] = docs[13 + 3] = 1;
    ParamStore ps;
    Mixer *m = make_gdp(&ps, "gdp", 3, MIXER_FORM_CHUNKED, 4, 23);
    Tensor *u = tensor_newv(false, 3, B, T, D);
    fill_normal(u, 24, 1.0);
    void *cache;
    double worst = docs_mixer_carry_diff(m, u, docs, wins, 3, &cache);
    cr_assert_leq(worst, FORM_TOL, "carried windows differ from one pass by %.3e", worst);
    m->kind->cache_free(cache);
    tensor_free(u);
    mixer_destroy(m);
    params_free(&ps);
}

// ---- the config key ----

static Status load(const char *text) {
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    Status s = config_load_string(&cfg, text, "gdp.ini");
    if (s.ok) s = config_validate(&cfg);
    if (s.ok) cr_assert_eq(cfg.model.gdp_steps, strstr(text, "gdp_steps = 3") ? 3 : 2);
    config_free(&cfg);
    return s;
}

Test(gdp_config, steps_key) {
    cr_assert(load("[model]\nlayers = gdp,attn\ngdp_steps = 3\n").ok);
    cr_assert(load("[model]\nlayers = gdp\n").ok);   // the default, 2
    Status s = load("[model]\nlayers = gdn,attn\ngdp_steps = 3\n");
    cr_assert(!s.ok && strstr(s.msg, "gdp.ini:3: [model] gdp_steps") && strstr(s.msg, "no effect"), "%s", s.msg);
    s = load("[model]\nlayers = gdp\ngdp_steps = 9\n");
    cr_assert(!s.ok && strstr(s.msg, "gdp_steps") && strstr(s.msg, "out of range"), "%s", s.msg);
    s = load("[model]\nlayers = gdp\ngdp_steps = 0\n");
    cr_assert(!s.ok && strstr(s.msg, "gdp_steps"), "%s", s.msg);
}

// The kind's own check (what mixer_create asserts), for a config built in code.
Test(gdp_config, mixer_check) {
    MixerConfig c = mixer_config_default(D, H, DK, DV);
    char why[256];
    cr_assert_null(mixer_config_check("gdp", &c, why, sizeof why));
    for (int bad = 0; bad < 2; bad++) {
        c.gdp_steps = bad ? GDP_MAX_STEPS + 1 : 0;
        const char *key = mixer_config_check("gdp", &c, why, sizeof why);
        cr_assert(key && !strcmp(key, "gdp_steps") && strstr(why, "must be 1 to 8"), "%s", why);
    }
    cr_assert_null(mixer_config_check("gdn", &c, why, sizeof why), "gdn does not read gdp_steps");
}

Test(gdp_config, bundled_config) {
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    Status st = config_load_file(&cfg, SOURCE_DIR "/configs/tiny_gdp.ini");
    cr_assert(st.ok, "%s", st.msg);
    st = config_validate(&cfg);
    cr_assert(st.ok, "%s", st.msg);
    LMConfig lc;
    cr_assert(config_model(&cfg, &lc).ok);
    cr_assert_eq(lc.n_layers, 4);
    cr_assert_str_eq(lc.layers[0], "gdp");
    cr_assert_eq(lc.mixer.gdp_steps, 2);
    config_free(&cfg);
}
