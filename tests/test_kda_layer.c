// The kda mixer (Kimi Delta Attention, MODEL.md `kda`) as a layer: its
// parameters and their initialisation, gradients of the input, the initial
// state and every parameter, the two forms agreeing forward and backward,
// decoding token by token, packed documents, carried state, a tiny LM of
// kda layers that learns and comes back from its checkpoint, and the config.
// (The op op_kda has its own tests in test_kda.c; test_docs_layers.c,
// test_docs_carry.c and test_lm.c run kda beside the other mixers.)
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "export_gguf.h"
#include "model_setup.h"
#include "test_docs_util.h"
#include "trainer.h"

enum { D = 8, H = 2, DK = 4, DV = 3 };

// A kda layer with chunks of 4; the decay set to ~0.5 to ~0.9 per token
// (A_log and dt_bias), and w_f2 larger, so that g differs between key
// channels and positions and the state carries history.
static Mixer *make_kda_gate(ParamStore *ps, MixerForm form, int conv, uint64_t seed, bool gate_bias) {
    MixerConfig c = mixer_config_default(D, H, DK, DV);
    c.kda_gate_bias = gate_bias;
    c.chunk_size = 4;
    c.conv_size = conv;
    c.form = form;
    c.out_std = 0.3;
    params_init(ps);
    Mixer *m = mixer_create("kda", &c, ps, "m.");
    params_finalize(ps, seed);
    Tensor *bias = params_find(ps, "m.dt_bias"), *A = params_find(ps, "m.A_log"), *f2 = params_find(ps, "m.w_f2");
    for (int i = 0; i < H * DK; i++) bias->data[i] = (real)(-1.5 + 0.25 * i);
    for (int h = 0; h < H; h++) A->data[h] = (real)(-0.5 + 0.4 * h);
    for (int64_t i = 0; i < f2->numel; i++) f2->data[i] *= 3;
    // b_g2 starts at zero: give it values, so that its gradient is checked away from that point.
    Tensor *b = params_find(ps, "m.b_g2");
    for (int64_t i = 0; b && i < b->numel; i++) b->data[i] = (real)(0.3 * sin(1.0 + i));
    return m;
}

static Mixer *make_kda(ParamStore *ps, MixerForm form, int conv, uint64_t seed) {
    return make_kda_gate(ps, form, conv, seed, true);
}

Test(kda_layer, parameters_names_shapes_and_init) {
    ParamStore ps;
    MixerConfig c = mixer_config_default(D, H, DK, DV);
    params_init(&ps);
    Mixer *m = mixer_create("kda", &c, &ps, "layers.0.mixer.");
    params_finalize(&ps, 3);
    cr_assert(m->kind->recurrent && m->kind->forward_carry && m->kind->cache_state);
    cr_assert_eq(m->kind->forms, MIXER_FORMS_LINEAR_FAMILY);
    struct {
        const char *name;
        int d0, d1;
        bool no_decay;
    } want[] = {{"wq", D, H * DK, 0},       {"wk", D, H * DK, 0},       {"wv", D, H * DV, 0},
                {"conv_q", H * DK, 4, 0},   {"conv_k", H * DK, 4, 0},   {"conv_v", H * DV, 4, 0},
                {"w_beta", D, H, 0},        {"w_f1", D, DV, 0},         {"w_f2", DV, H * DK, 0},
                {"dt_bias", H * DK, -1, 1}, {"A_log", H, -1, 1},        {"w_g1", D, DV, 0},
                {"w_g2", DV, H * DV, 0},    {"b_g2", H * DV, -1, 1},    {"out_norm", DV, -1, 1},
                {"wo", H * DV, D, 0}};
    int n = sizeof want / sizeof want[0];
    cr_assert_eq(ps.n, n, "kda registers %d parameters, want %d", ps.n, n);
    for (int i = 0; i < n; i++) {
        char full[128];
        snprintf(full, sizeof full, "layers.0.mixer.%s", want[i].name);
        Tensor *p = ps.params[i];
        cr_assert_str_eq(p->name, full, "parameter %d is %s, want %s (the registration order)", i, p->name, full);
        cr_assert_eq(p->shape[0], want[i].d0, "%s %s", full, SHAPE(p));
        if (want[i].d1 > 0) cr_assert(p->ndim == 2 && p->shape[1] == want[i].d1, "%s %s", full, SHAPE(p));
        else cr_assert_eq(p->ndim, 1, "%s", full);
        cr_assert_eq((p->flags & TENSOR_NO_DECAY) != 0, want[i].no_decay, "%s weight decay flag", full);
    }
    // fla's initialisation: A_log = log U[1, 16] per head; softplus(dt_bias) in [1e-3, 1e-1] per key
    // channel, drawn for each; the gate's bias zeros; the norm's gain ones.
    Tensor *A_log = params_find(&ps, "layers.0.mixer.A_log"), *dtb = params_find(&ps, "layers.0.mixer.dt_bias");
    for (int h = 0; h < H; h++)
        cr_assert(A_log->data[h] >= 0 && A_log->data[h] <= log(16.0) + 1e-6, "A_log %g", A_log->data[h]);
    for (int i = 0; i < H * DK; i++) {
        double dt0 = log1p(exp(dtb->data[i]));
        cr_assert(dt0 >= 1e-3 * (1 - 1e-5) && dt0 <= 1e-1 * (1 + 1e-5), "softplus(dt_bias[%d]) = %g", i, dt0);
    }
    cr_assert(A_log->data[0] != A_log->data[1] && dtb->data[0] != dtb->data[1] && dtb->data[1] != dtb->data[DK],
              "A_log and dt_bias are drawn, not constant");
    Tensor *b = params_find(&ps, "layers.0.mixer.b_g2"), *gain = params_find(&ps, "layers.0.mixer.out_norm");
    for (int64_t i = 0; i < b->numel; i++) cr_assert_eq(b->data[i], 0, "b_g2[%lld]", (long long)i);
    for (int64_t i = 0; i < gain->numel; i++) cr_assert_eq(gain->data[i], 1, "out_norm[%lld]", (long long)i);
    cr_assert_null(params_find(&ps, "layers.0.mixer.wg"), "kda's gate is w_g1 w_g2, not gdn's wg");
    mixer_destroy(m);
    params_free(&ps);
}

// kda_gate_bias = false: the same parameters in the same order, b_g2 left
// out (no parameter, not a zero one), and the same draws for the others.
Test(kda_layer, without_the_gate_bias_there_is_no_b_g2) {
    ParamStore a, b;
    MixerConfig c = mixer_config_default(D, H, DK, DV);
    params_init(&a);
    Mixer *ma = mixer_create("kda", &c, &a, "m.");
    params_finalize(&a, 3);
    c.kda_gate_bias = false;
    params_init(&b);
    Mixer *mb = mixer_create("kda", &c, &b, "m.");
    params_finalize(&b, 3);
    cr_assert_eq(b.n, a.n - 1, "%d parameters, want %d", b.n, a.n - 1);
    cr_assert_null(params_find(&b, "m.b_g2"));
    for (int i = 0, j = 0; i < a.n; i++) {
        if (strcmp(a.params[i]->name, "m.b_g2") == 0) continue;
        Tensor *p = a.params[i], *q = b.params[j++];
        cr_assert_str_eq(q->name, p->name, "parameter %d", j - 1);
        cr_assert(q->numel == p->numel && q->ndim == p->ndim, "%s %s", q->name, SHAPE(q));
    }
    cr_assert_eq(b.numel, a.numel - H * DV);
    mixer_destroy(ma);
    mixer_destroy(mb);
    params_free(&a);
    params_free(&b);
}

#ifdef AG_DOUBLE
// u, s0 and every parameter, both outputs seeded, with documents (one at
// position 3 of row 0, one at 5 of row 1), in both forms, with and without
// the convolutions, with and without the gate's bias. float64 only, as the
// other layers' whole-layer checks.
Test(kda_layer, gradcheck_every_parameter) {
    struct {
        int conv;
        MixerForm form;
        bool gate_bias;
    } cases[] = {{4, MIXER_FORM_CHUNKED, true},
                 {0, MIXER_FORM_RECURRENT, true},
                 {3, MIXER_FORM_RECURRENT, true},
                 {4, MIXER_FORM_CHUNKED, false},
                 {2, MIXER_FORM_RECURRENT, false}};
    int B = 2, T = 7;
    int docs[2 * 7] = {0};
    docs[3] = docs[7 + 5] = 1;
    // h = 1e-5, not 1e-6: a central difference carries rounding noise of about
    // eps_machine |f| / h, ~2e-9 here, the size of tol x floor for the elements
    // near 1e-3 of their parameter's largest gradient (on the GPU, whose fused
    // multiply-adds round otherwise, an element of w_f2 failed at 1.1e-6); at
    // 1e-5 the noise is ten times lower and the truncation (h^2 f''' / 6) stays
    // far below the tolerance, which is unchanged.
    GradcheckOptions opt = gradcheck_defaults();
    opt.eps = 1e-5;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ParamStore ps;
        Mixer *m = make_kda_gate(&ps, cases[i].form, cases[i].conv, 41 + i, cases[i].gate_bias);
        char label[64];
        snprintf(label, sizeof label, "kda layer %s conv %d%s", mixer_form_name(cases[i].form), cases[i].conv,
                 cases[i].gate_bias ? "" : " no gate bias");
        docs_mixer_gradcheck(m, &ps, B, T, 42, docs, &opt, label);
        mixer_destroy(m);
        params_free(&ps);
    }
}
#endif

// 15 positions in chunks of 4 (a partial last chunk), documents inside
// chunks and at a chunk's first position: the chunked and recurrent forms of
// op_kda under the whole layer give the same outputs and gradients.
Test(kda_layer, chunked_equals_recurrent_forward_and_backward) {
    int B = 2, T = 15;
    int docs[2 * 15] = {0};
    docs[6] = docs[15 + 2] = docs[15 + 8] = docs[15 + 11] = 1;
    for (int conv = 0; conv <= 4; conv += 4) {
        ParamStore ps;
        Mixer *m = make_kda(&ps, MIXER_FORM_CHUNKED, conv, 9);
        DocsMixerRun a = docs_mixer_run(m, &ps, B, T, docs);
        m->cfg.form = MIXER_FORM_RECURRENT;
        DocsMixerRun b = docs_mixer_run(m, &ps, B, T, docs);
        docs_mixer_runs_agree(&a, &b, &ps, FORM_TOL, conv ? "conv 4" : "conv 0");
        docs_mixer_run_free(&a);
        docs_mixer_run_free(&b);
        mixer_destroy(m);
        params_free(&ps);
    }
}

// Step by step (a cache reset where a document begins) equals the parallel
// forward of either form, at every position of both rows.
Test(kda_layer, decode_equals_forward) {
    int B = 2, T = 13;
    int docs[2 * 13] = {0};
    docs[5] = docs[13 + 8] = 1;
    for (int c = 0; c < 8; c++) {   // form, conv 0 or 4, documents or none (with conv 4: no gate bias)
        int form = c & 1, conv = c & 2 ? 4 : 0, with_docs = c >> 2;
        ParamStore ps;
        Mixer *m = make_kda_gate(&ps, form ? MIXER_FORM_RECURRENT : MIXER_FORM_CHUNKED, conv, 13, c < 6);
        Tensor *u = tensor_newv(false, 3, B, T, D);
        fill_normal(u, 14, 1.0);
        int t = -1, b = -1;
        double e = test_mixer_decode_docs_diff(m, &ps, u, with_docs ? docs : NULL, &t, &b);
        cr_assert_leq(e, DECODE_TOL, "form %d conv %d docs %d: step differs from the forward by %.3e at (%d, %d)",
                      form, conv, with_docs, e, b, t);
        tensor_free(u);
        mixer_destroy(m);
        params_free(&ps);
    }
}

Test(kda_layer, packed_equals_separate) {
    int B = 2, T = 11;
    int *docs = docs_pattern(T, 4);
    for (int form = 0; form < 2; form++) {
        ParamStore ps;
        Mixer *m = make_kda(&ps, form ? MIXER_FORM_RECURRENT : MIXER_FORM_CHUNKED, 4, 17);
        docs_mixer_check_packed(m, &ps, B, T, 18, docs, FORM_TOL, form ? "kda layer recurrent" : "kda layer chunked");
        mixer_destroy(m);
        params_free(&ps);
    }
    free(docs);
}

// Windows of 5, 2 and 6 tokens carrying state and convolution inputs equal
// one forward over the 13 tokens (documents at a window's first position and
// inside windows); the cache lists S and the three convolutions' inputs.
Test(kda_layer, carried_state_equals_one_pass) {
    int B = 2, T = 13, wins[] = {5, 2, 6};
    int docs[2 * 13] = {0};
    docs[5] = docs[9] = docs[13 + 3] = 1;
    for (int form = 0; form < 2; form++) {
        ParamStore ps;
        Mixer *m = make_kda(&ps, form ? MIXER_FORM_RECURRENT : MIXER_FORM_CHUNKED, 4, 23);
        Tensor *u = tensor_newv(false, 3, B, T, D);
        fill_normal(u, 24, 1.0);
        void *cache;
        double worst = docs_mixer_carry_diff(m, u, docs, wins, 3, &cache);
        cr_assert_leq(worst, FORM_TOL, "form %d: carried windows differ from one pass by %.3e", form, worst);
        real *bufs[4];
        int64_t sizes[4];
        cr_assert_eq(m->kind->cache_state(m, cache, bufs, sizes), 4, "S and the q, k, v convolutions' inputs");
        cr_assert(sizes[0] == (int64_t)B * H * DK * DV && sizes[1] == (int64_t)B * 3 * H * DK &&
                      sizes[3] == (int64_t)B * 3 * H * DV,
                  "sizes %lld %lld %lld", (long long)sizes[0], (long long)sizes[1], (long long)sizes[3]);
        m->kind->cache_free(cache);
        tensor_free(u);
        mixer_destroy(m);
        params_free(&ps);
    }
}

Test(kda_layer, step_refuses_grad_mode_and_a_wrong_width) {
    ParamStore ps;
    Mixer *m = make_kda(&ps, MIXER_FORM_CHUNKED, 4, 1);
    void *cache = m->kind->cache_new(m, 1, 4, DEVICE_CPU);
    Tensor *u = tensor_newv(false, 3, 1, 1, D), *wide = tensor_newv(false, 3, 1, 1, D + 1);
    Tape tp;
    tape_init(&tp);
    cr_assert(EXPECT_FAILURE(m->kind->step(&tp, m, cache, u)));
    cr_assert(strstr(ag_last_error(), "kda step") && strstr(ag_last_error(), "no-grad"), "%s", ag_last_error());
    tape_no_grad_push(&tp);
    cr_assert(EXPECT_FAILURE(m->kind->step(&tp, m, cache, wide)));
    cr_assert(strstr(ag_last_error(), "kda step: u"), "%s", ag_last_error());
    cr_assert(EXPECT_FAILURE(m->kind->cache_reset(m, cache, 1)));
    cr_assert(strstr(ag_last_error(), "kda cache_reset: row 1 of 1"), "%s", ag_last_error());
    m->kind->cache_free(cache);
    tensor_free(u);
    tensor_free(wide);
    tape_free(&tp);
    mixer_destroy(m);
    params_free(&ps);
}

// ---- the LM and the config ----

// Greedy decoding of n tokens after a prompt, token by token through
// lm_step: the tokens chosen and the logits of every step (n_prompt + n - 1
// steps of V), allocated.
static real *greedy(LM *lm, const int *prompt, int n_prompt, int n, int *out) {
    int V = lm->cfg.vocab_size, steps = n_prompt + n - 1;
    real *logits = xmalloc((size_t)steps * V * sizeof(real));
    Tape tp;
    tape_init(&tp);
    tape_no_grad_push(&tp);
    LMCache *cache = lm_cache_new(lm, 1, n_prompt + n);
    int tok = prompt[0];
    for (int i = 0; i < steps; i++) {
        Tensor *lg = lm_step(&tp, lm, cache, &tok);
        memcpy(logits + (size_t)i * V, lg->data, (size_t)V * sizeof(real));
        int best = 0;
        for (int j = 1; j < V; j++) best = lg->data[j] > lg->data[best] ? j : best;
        if (i + 1 >= n_prompt) out[i + 1 - n_prompt] = best;
        tok = i + 1 < n_prompt ? prompt[i + 1] : best;
        tape_reset(&tp);
    }
    lm_cache_free(lm, cache);
    tape_free(&tp);
    return logits;
}

// A tiny byte LM of kda layers (and one attn) trains: its loss falls over 8
// steps. The checkpoint it saved loads (model_load_checkpoint, as generate,
// evaluate and export do) into the same parameters, by name, which decode
// the same tokens with the same logits as the trained model (float64: the
// trained weights rounded to the checkpoint's float32 first), and whose
// decoding equals their parallel forward.
Test(kda_lm, trains_then_its_checkpoint_loads_and_generates_the_same, .timeout = 180) {
    enum { N = 8, NEW = 12 };
    const char *cfg = test_tiny_config("kda_lm", "kda,kda,attn", N, NULL, NULL);
    static Trainer t;
    TrainerOptions o = {.config = cfg, .quiet = true};
    Status s = trainer_setup(&t, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(trainer_run(&t, &o), 0);
    double first = trainer_loss(&t, 0), last = trainer_loss(&t, N - 1);
    cr_assert(isfinite(last) && last < first, "the loss should fall: %g -> %g", first, last);
    cr_assert_not_null(params_find(&t.ps, "layers.1.mixer.w_f2"));
    for (int64_t i = 0; i < t.ps.numel; i++) t.ps.data[i] = (real)(float)t.ps.data[i];
    TrainConfig tc;
    LM b;
    ParamStore pb;
    s = model_load_checkpoint(t.ckpt, &tc, &b, &pb, NULL);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_str_eq(tc.model.layers.name[0], "kda");
    cr_assert_eq(pb.n, t.ps.n);
    for (int i = 0; i < pb.n; i++) cr_assert_str_eq(pb.params[i]->name, t.ps.params[i]->name);
    cr_assert(memcmp(pb.data, t.ps.data, (size_t)pb.numel * sizeof(real)) == 0, "the weights came back changed");
    const int prompt[] = {'t', 'h', 'e', ' ', 'l'};
    int ta[NEW], tb[NEW], V = b.cfg.vocab_size, steps = 5 + NEW - 1;
    real *la = greedy(&t.lm, prompt, 5, NEW, ta), *lb = greedy(&b, prompt, 5, NEW, tb);
    cr_assert(memcmp(ta, tb, sizeof ta) == 0, "the reloaded model decodes other tokens");
    cr_assert(memcmp(la, lb, (size_t)steps * V * sizeof(real)) == 0, "the reloaded model's logits differ");
    int tokens[2 * 9];
    for (int i = 0; i < 18; i++) tokens[i] = (i * 37 + 11) % V;
    double d = test_lm_decode_diff(&b, &pb, tokens, 2, 9);
    cr_assert_leq(d, DECODE_TOL, "decoding the reloaded model differs from its forward by %.3e", d);
    free(la);
    free(lb);
    lm_destroy(&b);
    params_free(&pb);
    config_free(&tc);
    trainer_free(&t);
}

static Status load(const char *text) {
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    Status s = config_load_string(&cfg, text, "kda.ini");
    if (s.ok) s = config_validate(&cfg);
    config_free(&cfg);
    return s;
}

// kda in [model] layers, beside the others and in both forms; a misspelling
// is refused with the known names, kda among them; the parallel form is not kda's.
Test(kda_config, layers_accept_kda_and_refuse_misspellings) {
    cr_assert(load("[model]\nlayers = kda,attn,gdn\n").ok);
    cr_assert(load("[model]\nlayers = kda\nform = recurrent\n").ok);
    const char *bad[] = {"kd", "KDA", "kda2", "kda_"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[128];
        snprintf(text, sizeof text, "[model]\nlayers = attn,%s\n", bad[i]);
        Status s = load(text);
        cr_assert(!s.ok && strstr(s.msg, "kda.ini:2: [model] layers") && strstr(s.msg, "is not a known mixer") &&
                      strstr(s.msg, "gdp, kda"),
                  "%s: %s", bad[i], s.msg);
    }
    Status s = load("[model]\nlayers = kda\nform = parallel\n");
    cr_assert(!s.ok && strstr(s.msg, "kda has no 'parallel' form (it has: chunked, recurrent)"), "%s", s.msg);
    s = load("[model]\nlayers = attn\nform = recurrent\n");
    cr_assert(!s.ok && strstr(s.msg, "gdn, gdp and kda do"), "%s", s.msg);
}

// kda_gate_bias: true by default; false builds kda without b_g2; false
// without a kda layer would change nothing and is refused with the place and
// the key, as is a value that is not a bool.
Test(kda_config, gate_bias_key) {
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    cr_assert(cfg.model.kda_gate_bias, "kda_gate_bias defaults to true");
    LMConfig lc;
    cr_assert(config_model(&cfg, &lc).ok && lc.mixer.kda_gate_bias);
    config_free(&cfg);
    cr_assert(load("[model]\nlayers = kda,attn\nkda_gate_bias = false\n").ok);
    config_defaults(&cfg, NULL);
    Status s = config_load_string(&cfg, "[model]\nlayers = kda\nkda_gate_bias = no\n", "kda.ini");
    cr_assert(s.ok && config_validate(&cfg).ok, "%s", s.msg);
    cr_assert(config_model(&cfg, &lc).ok && !lc.mixer.kda_gate_bias);
    config_free(&cfg);
    s = load("[model]\nlayers = gdn,attn\nkda_gate_bias = false\n");
    cr_assert(!s.ok && strcmp(s.msg, "kda.ini:3: [model] kda_gate_bias: kda_gate_bias = false has no effect: none of "
                                     "the layers (gdn...) is kda; remove the key") == 0,
              "got: %s", s.ok ? "accepted" : s.msg);
    s = load("[model]\nlayers = kda\nkda_gate_bias = maybe\n");
    cr_assert(!s.ok && strstr(s.msg, "kda.ini:3") && strstr(s.msg, "kda_gate_bias"), "got: %s",
              s.ok ? "accepted" : s.msg);
}

// A kda model without the gate's bias through a checkpoint, as generate,
// evaluate and export rebuild it: the stored config keeps the option off,
// the parameters come back by name (no b_g2), the logits are the saved
// model's.
Test(kda_config, gate_bias_off_survives_the_checkpoint) {
    TrainConfig tc;
    config_defaults(&tc, NULL);
    Status st = config_load_string(&tc,
                                   "[model]\nlayers = kda,kda\nd_model = 8\nn_heads = 2\nd_k = 4\nd_v = 4\n"
                                   "d_ff = 12\nchunk_size = 4\nkda_gate_bias = false\n",
                                   "x.ini");
    cr_assert(st.ok && config_validate(&tc).ok, "%s", st.msg);
    LM a, b;
    ParamStore pa, pb;
    cr_assert(model_build(&tc, &a, &pa, NULL).ok);
    cr_assert_null(params_find(&pa, "layers.0.mixer.b_g2"));
    cr_assert_not_null(params_find(&pa, "layers.1.mixer.w_g2"));
    for (int64_t i = 0; i < pa.numel; i++) pa.data[i] = (real)(float)(pa.data[i] + 0.01 * (double)(i % 5));
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("kda_gate_bias"));
    snprintf(path, sizeof path, "%s/ckpt.h5", dir);
    CheckpointState cs;
    memset(&cs, 0, sizeof cs);
    cs.config_text = config_dump_string(&tc);
    cr_assert(strstr(cs.config_text, "kda_gate_bias = false"), "%s", cs.config_text);
    st = checkpoint_save(path, &pa, NULL, &cs);
    cr_assert(st.ok, "%s", st.msg);
    TrainConfig tb;
    st = model_load_checkpoint(path, &tb, &b, &pb, NULL);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert(!tb.model.kda_gate_bias && !b.cfg.mixer.kda_gate_bias);
    cr_assert_eq(pb.n, pa.n);
    for (int i = 0; i < pa.n; i++) cr_assert_str_eq(pb.params[i]->name, pa.params[i]->name);
    cr_assert(memcmp(pa.data, pb.data, (size_t)pa.numel * sizeof(real)) == 0, "the weights came back changed");
    int tokens[2 * 9];
    for (int i = 0; i < 18; i++) tokens[i] = (i * 37 + 11) % b.cfg.vocab_size;
    double d = test_lm_decode_diff(&b, &pb, tokens, 2, 9);
    cr_assert_leq(d, DECODE_TOL, "decoding the reloaded model differs from its forward by %.3e", d);
    free(cs.config_text);
    lm_destroy(&a);
    lm_destroy(&b);
    params_free(&pa);
    params_free(&pb);
    config_free(&tc);
    config_free(&tb);
    test_remove_tree(dir);
}

Test(kda_config, bundled_config) {
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    Status st = config_load_file(&cfg, SOURCE_DIR "/configs/tiny_kda.ini");
    cr_assert(st.ok, "%s", st.msg);
    st = config_validate(&cfg);
    cr_assert(st.ok, "%s", st.msg);
    LMConfig lc;
    cr_assert(config_model(&cfg, &lc).ok);
    cr_assert_eq(lc.n_layers, 4);
    for (int l = 0; l < 4; l++) cr_assert_str_eq(lc.layers[l], "kda");
    config_free(&cfg);
}

// GGUF export writes kda layers only as llama.cpp's kimi-linear, whose other
// layers are MLA: kda beside attn or gdn is refused naming the other layer,
// and beside mamba2 (granitehybrid) naming the kda layer.
Test(kda_config, gguf_export_refuses_kda_beside_other_layers) {
    static const struct {
        const char *layers, *says;
    } cases[] = {{"kda,attn", "layer 1 is 'attn' in a model with 'kda' layers"},
                 {"gdn,attn,kda", "layer 0 is 'gdn' in a model with 'kda' layers"},
                 {"mamba2,attn,kda", "layer 2 is 'kda' in a model with 'mamba2' layers"}};
    Tokenizer tok;
    tokenizer_bytes(&tok);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[256];
        snprintf(text, sizeof text,
                 "[model]\nlayers = %s\nd_model = 16\nn_heads = 4\nd_k = 8\nd_v = 8\nqk_norm = true\n"
                 "attn_gate = true\n",
                 cases[i].layers);
        TrainConfig cfg;
        config_defaults(&cfg, NULL);
        Status s = config_load_string(&cfg, text, "kda.ini");
        cr_assert(s.ok && config_validate(&cfg).ok, "%s", s.msg);
        s = export_gguf_check(&cfg, &tok);
        cr_assert(!s.ok && strstr(s.msg, cases[i].says) && strstr(s.msg, "llama.cpp"), "%s: %s", cases[i].layers,
                  s.ok ? "exported" : s.msg);
        config_free(&cfg);
    }
}
