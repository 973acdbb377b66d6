// The attention options (MODEL.md, `attn` options): qk_norm, a per-head
// RMSNorm of q and k before RoPE with one gain of d_k shared by the heads,
// and attn_gate, o * sigmoid(u W_gate) before Wo; in `attn` and `attn_dsa`.
// Their parameters and what a model without them draws; gradients by finite
// differences; decoding (steps, cache resets, prefill windows) against the
// parallel forward; packed documents against separate rows; properties that
// pin the math (the norm's scale invariance, the gate at W_gate = 0); the
// config keys and their refusal without an attention layer.
#include <math.h>
#include <string.h>

#include "attn_dsa.h"
#include "config.h"
#include "checkpoint.h"
#include "export_gguf.h"
#include "lm.h"
#include "model_setup.h"
#include "test_docs_util.h"

static const char *const PREFIX = "layers.3.mixer.";
enum { D = 8, H = 2, DK = 4, DV = 4 };

// A mixer of `kind` with the options, every parameter perturbed (the gains
// away from 1, so no gain is special by symmetry). dsa_topk: attn_dsa's.
static Mixer *opt_mixer_new(ParamStore *ps, const char *kind, bool qk_norm, bool gate, int topk, uint64_t seed) {
    params_init(ps);
    MixerConfig c = mixer_config_default(D, H, DK, DV);
    c.out_std = 0.3;
    c.index_heads = 2;
    c.index_dim = 4;
    c.topk = topk;
    c.qk_norm = qk_norm;
    c.attn_gate = gate;
    Mixer *m = mixer_create(kind, &c, ps, PREFIX);
    params_finalize(ps, seed);
    Rng r;
    rng_seed(&r, seed + 99);
    for (int64_t i = 0; i < ps->numel; i++) ps->data[i] += (real)(0.1 * rng_normal(&r));
    return m;
}

static Tensor *param(ParamStore *ps, const char *name) {
    char full[64];
    snprintf(full, sizeof full, "%s%s", PREFIX, name);
    return params_find(ps, full);
}

Test(attn_options, parameters_names_shapes_and_draws) {
    ParamStore off, on;
    params_init(&off);
    MixerConfig c = mixer_config_default(16, 2, 4, 6);
    Mixer *a = mixer_create("attn", &c, &off, PREFIX);
    params_finalize(&off, 5);
    c.qk_norm = c.attn_gate = true;
    params_init(&on);
    Mixer *b = mixer_create("attn", &c, &on, PREFIX);
    params_finalize(&on, 5);
    cr_assert_eq(off.n, 4, "without the options: wq, wk, wv, wo only (got %d)", off.n);
    cr_assert_eq(on.n, 7, "with both: + q_norm, k_norm, w_gate (got %d)", on.n);
    cr_assert_null(param(&off, "q_norm"));
    cr_assert_null(param(&off, "w_gate"));
    const char *names[] = {"wq", "wk", "wv", "wo"};
    for (int i = 0; i < 4; i++) {   // the options' parameters come after: the same draws as without them
        Tensor *x = param(&off, names[i]), *y = param(&on, names[i]);
        cr_assert(x && y && x->numel == y->numel, "%s", names[i]);
        cr_assert(memcmp(x->data, y->data, (size_t)x->numel * sizeof(real)) == 0, "%s drawn differently", names[i]);
    }
    const char *gains[] = {"q_norm", "k_norm"};
    for (int i = 0; i < 2; i++) {
        Tensor *g = param(&on, gains[i]);
        cr_assert(g && g->ndim == 1 && g->shape[0] == 4, "%s: (d_k) = (4)", gains[i]);
        cr_assert(g->flags & TENSOR_NO_DECAY, "%s: a norm gain, no weight decay", gains[i]);
        for (int j = 0; j < 4; j++) cr_assert_eq(g->data[j], (real)1, "%s[%d] = %g, not 1", gains[i], j, g->data[j]);
    }
    Tensor *w = param(&on, "w_gate");
    cr_assert(w && w->ndim == 2 && w->shape[0] == 16 && w->shape[1] == 12, "w_gate (D, H*dv) = (16, 12)");
    cr_assert(!(w->flags & TENSOR_NO_DECAY), "w_gate is a weight: decayed like wq");
    double ss = 0;
    for (int64_t i = 0; i < w->numel; i++) ss += (double)w->data[i] * w->data[i];
    double std = sqrt(ss / w->numel);
    cr_assert(std > 0.5 / 4 && std < 1.5 / 4, "w_gate ~ N(0, 1/D) like wq: std %g, 1/sqrt(16) = 0.25", std);
    mixer_destroy(a);
    mixer_destroy(b);
    params_free(&off);
    params_free(&on);
}

// Finite differences w.r.t. the input and every parameter, each option alone
// and both, in attn and (both options) attn_dsa's dense distillation form.
// float64 only: float32 differences cannot resolve a whole layer's gradients
// (test_docs_layers.c says the same of its layer checks).
#ifdef AG_DOUBLE
static int f_layer(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)n;
    Mixer *m = ctx;
    out[0] = m->kind->forward(tp, m, in[0], NULL, NULL, NULL);
    return 1;
}

static void gradcheck_layer(const char *kind, bool qk_norm, bool gate, const char *label) {
    ParamStore ps;
    Mixer *m = opt_mixer_new(&ps, kind, qk_norm, gate, 64, 2);
    if (strcmp(kind, "attn_dsa") == 0) attn_dsa_set_mode(m, DSA_DISTILL);
    Tensor *u = tensor_newv(true, 3, 2, 7, D);
    fill_normal(u, 3, 1.0);
    Tensor *in[16] = {u};
    cr_assert_leq(ps.n, 15);
    for (int i = 0; i < ps.n; i++) in[1 + i] = ps.params[i];
    GradcheckResult r = gradcheck(label, f_layer, in, 1 + ps.n, m, NULL);
    ASSERT_GRADCHECK(r, label);
    int64_t want = 2 * 7 * D + 2 * (int64_t)D * H * DK + D * H * DV + H * DV * D;
    if (qk_norm) want += 2 * DK;
    if (gate) want += D * H * DV;
    cr_assert_geq(r.n_checked, want, "%s: %lld elements checked", label, (long long)r.n_checked);
    tensor_free(u);
    mixer_destroy(m);
    params_free(&ps);
}

Test(attn_options, gradcheck_each_option_and_both) {
    gradcheck_layer("attn", true, false, "attn qk_norm");
    gradcheck_layer("attn", false, true, "attn attn_gate");
    gradcheck_layer("attn", true, true, "attn qk_norm + attn_gate");
    gradcheck_layer("attn_dsa", true, true, "attn_dsa (distill) qk_norm + attn_gate");
}
#endif

// Decoding token by token, with cache resets where documents begin, equals
// the parallel forward with the same documents (device_default(): the GPU
// under AG_DEVICE=cuda). attn over T = 70 > the 64-query tile; attn_dsa at
// topk 5 < T (the sparse path) and at topk >= T (dense forward, sparse steps).
static void check_decode(const char *kind, bool qk_norm, bool gate, int topk, int T, bool docs) {
    ParamStore ps;
    Mixer *m = opt_mixer_new(&ps, kind, qk_norm, gate, topk, 4);
    int B = 2;
    Tensor *u = tensor_newv(false, 3, B, T, D);
    fill_normal(u, 5, 1.0);
    int *flags = docs ? docs_pattern(T, 4) : NULL;
    int t = -1, b = -1;
    double d = test_mixer_decode_docs_diff(m, &ps, u, flags, &t, &b);
    cr_assert_leq(d, DECODE_TOL, "%s (qk_norm %d, attn_gate %d, topk %d%s): step vs forward %.3e at (%d, %d)", kind,
                  qk_norm, gate, topk, docs ? ", documents" : "", d, t, b);
    free(flags);
    tensor_free(u);
    mixer_destroy(m);
    params_free(&ps);
}

Test(attn_options, decode_equals_parallel_forward) {
    check_decode("attn", true, true, 64, 70, false);
    check_decode("attn", true, true, 64, 23, true);
    check_decode("attn", true, false, 64, 23, true);
    check_decode("attn", false, true, 64, 23, true);
    check_decode("attn_dsa", true, false, 5, 40, false);
    check_decode("attn_dsa", true, true, 5, 23, true);
    check_decode("attn_dsa", true, true, 64, 20, false);
}

static int f_docs(Tape *tp, Tensor *const *in, const int *doc_start, void *ctx, Tensor **out) {
    Mixer *m = ctx;
    out[0] = m->kind->forward(tp, m, in[0], doc_start, NULL, NULL);
    return 1;
}

// A packed row computes what its documents compute as rows of their own:
// the output and the gradients of the input and of every parameter.
Test(attn_options, packed_documents_equal_separate_rows) {
    int B = 2, T = 11;
    int *docs = docs_pattern(T, 4);
    const char *kinds[] = {"attn", "attn_dsa"};
    for (int i = 0; i < 2; i++) {
        ParamStore ps;
        Mixer *m = opt_mixer_new(&ps, kinds[i], true, true, 3, 10 + i);
        Tensor *in[16];
        DocsInKind kind[16];
        cr_assert_leq(ps.n, 15);
        in[0] = tensor_newv(true, 3, B, T, D);
        fill_normal(in[0], 20 + i, 1.0);
        kind[0] = DOCS_SEQ;
        for (int p = 0; p < ps.n; p++) in[1 + p] = ps.params[p], kind[1 + p] = DOCS_SHARED;
        DocsFn f = {f_docs, m, 1 + ps.n, kind};
        docs_check_packed(&f, in, docs, B, T, FORM_TOL, kinds[i]);
        tensor_free(in[0]);
        mixer_destroy(m);
        params_free(&ps);
    }
    free(docs);
}

// The forward of m over u on the host (no grad); the caller frees it.
static real *forward_of(Mixer *m, const Tensor *u) { return test_mixer_forward_host(m, u, NULL, DEVICE_CPU); }

static void copy_param(ParamStore *to, ParamStore *from, const char *name, double scale) {
    Tensor *a = param(to, name), *b = param(from, name);
    for (int64_t i = 0; i < a->numel; i++) a->data[i] = (real)(scale * b->data[i]);
}

// The math the options add, pinned by two properties: with W_gate = 0 the
// gate is sigmoid(0) = 1/2, so the output is half the ungated layer's; with
// qk_norm (eps 0) scaling Wq and Wk changes nothing, which it does without.
Test(attn_options, gate_at_zero_halves_and_qk_norm_is_scale_invariant) {
    ParamStore p0, p1;
    Mixer *plain = opt_mixer_new(&p0, "attn", false, false, 64, 6);
    Mixer *gated = opt_mixer_new(&p1, "attn", false, true, 64, 7);
    const char *names[] = {"wq", "wk", "wv", "wo"};
    for (int i = 0; i < 4; i++) copy_param(&p1, &p0, names[i], 1.0);
    memset(param(&p1, "w_gate")->data, 0, (size_t)param(&p1, "w_gate")->numel * sizeof(real));
    Tensor *u = tensor_newv(false, 3, 2, 9, D);
    fill_normal(u, 8, 1.0);
    real *y0 = forward_of(plain, u), *y1 = forward_of(gated, u);
    int64_t n = u->numel;
    for (int64_t i = 0; i < n; i++) y0[i] *= (real)0.5;
    cr_assert_leq(max_rel_diff(y1, y0, n), FORM_TOL, "W_gate = 0: the output must be half the ungated one");
    free(y0), free(y1);
    mixer_destroy(plain), mixer_destroy(gated);
    params_free(&p0), params_free(&p1);

    for (int qk = 0; qk < 2; qk++) {
        Mixer *a = opt_mixer_new(&p0, "attn", qk, false, 64, 9);
        Mixer *b = opt_mixer_new(&p1, "attn", qk, false, 64, 9);
        a->cfg.norm_eps = b->cfg.norm_eps = 0;
        copy_param(&p1, &p0, "wq", 3.0);
        copy_param(&p1, &p0, "wk", 0.25);
        real *ya = forward_of(a, u), *yb = forward_of(b, u);
        double d = max_rel_diff(ya, yb, n);
        if (qk) cr_assert_leq(d, FORM_TOL, "qk_norm: Wq x 3, Wk x 1/4 changed the output by %.3e", d);
        else cr_assert_gt(d, 1e-3, "without qk_norm the scores scale with Wq, Wk (diff %.3e)", d);
        free(ya), free(yb);
        mixer_destroy(a), mixer_destroy(b);
        params_free(&p0), params_free(&p1);
    }
    tensor_free(u);
}

// The keys: default off; the bundled config turns both on and validates; set
// without any attention layer they would change nothing, so they are refused
// with the place and the key; a value that is not a bool names the key.
Test(attn_options, config_keys_and_refusals) {
    TrainConfig cfg;
    config_defaults(&cfg, NULL);
    cr_assert(!cfg.model.qk_norm && !cfg.model.attn_gate, "both default to false");
    config_free(&cfg);
    config_defaults(&cfg, NULL);
    Status st = config_load_file(&cfg, SOURCE_DIR "/configs/tiny_qwen35.ini");
    cr_assert(st.ok, "%s", st.msg);
    st = config_validate(&cfg);
    cr_assert(st.ok, "%s", st.msg);
    LMConfig lc;
    cr_assert(config_model(&cfg, &lc).ok);
    cr_assert(lc.mixer.qk_norm && lc.mixer.attn_gate && lc.mixer.d_k == lc.mixer.d_v);
    cr_assert_eq(lc.n_layers, 4);
    cr_assert_str_eq(lc.layers[3], "attn");
    config_free(&cfg);
    const char *keys[] = {"qk_norm", "attn_gate"};
    for (int i = 0; i < 2; i++) {
        char text[128], want[200];
        config_defaults(&cfg, NULL);
        snprintf(text, sizeof text, "[model]\nlayers = gdn,mamba\n%s = true\n", keys[i]);
        st = config_load_string(&cfg, text, "x.ini");
        cr_assert(st.ok, "%s", st.msg);
        st = config_validate(&cfg);
        snprintf(want, sizeof want,
                 "x.ini:3: [model] %s: %s = true has no effect: none of the layers (gdn...) is attn or attn_dsa; "
                 "remove the key",
                 keys[i], keys[i]);
        cr_assert(!st.ok && strcmp(st.msg, want) == 0, "got: %s", st.msg);
        config_free(&cfg);
        config_defaults(&cfg, NULL);
        snprintf(text, sizeof text, "[model]\nlayers = gdn,attn_dsa\n%s = true\n", keys[i]);
        st = config_load_string(&cfg, text, "x.ini");
        cr_assert(st.ok && config_validate(&cfg).ok, "%s with attn_dsa", keys[i]);
        config_free(&cfg);
        config_defaults(&cfg, NULL);
        snprintf(text, sizeof text, "[model]\nlayers = attn\n%s = maybe\n", keys[i]);
        st = config_load_string(&cfg, text, "x.ini");
        cr_assert(!st.ok && strstr(st.msg, "x.ini:3") && strstr(st.msg, keys[i]), "got: %s", st.msg);
        config_free(&cfg);
    }
}

// An LM with both options in its attention layers: token-by-token decoding
// equals the parallel forward's logits, and prefill windows then steps equal
// token-by-token decoding (the windows run attn's and attn_dsa's prefill).
Test(attn_options, lm_decode_and_prefill_equal_forward) {
    LMConfig cfg = test_tiny_lm_config("gdn,attn,attn_dsa");
    cfg.mixer.qk_norm = cfg.mixer.attn_gate = true;
    char why[300];
    cr_assert_null(lm_config_check(&cfg, 32, why, sizeof why), "%s", why);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 11);
    Rng r;
    rng_seed(&r, 12);
    for (int64_t i = 0; i < ps.numel; i++) ps.data[i] += (real)(0.1 * rng_normal(&r));
    enum { B = 2, T = 14 };
    int V = cfg.vocab_size, tokens[B * T];
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 7 + 2 + i / T) % V;
    Device d = device_default();
    if (d != DEVICE_CPU) params_to_device(&ps, d);
    real *par = NULL, *ref = test_lm_decode_logits_docs(&lm, d, tokens, NULL, B, T, &par);
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++)
            worst = fmax(worst, max_rel_diff(ref + ((size_t)t * B + b) * V, par + ((size_t)b * T + t) * V, V));
    cr_assert_leq(worst, DECODE_TOL, "steps vs the parallel forward: %.3e", worst);
    Tape tp;
    tape_init_on(&tp, d);
    tape_no_grad_push(&tp);
    LMCache *c = lm_cache_new_on(&lm, B, T, d);
    real got[B * T * 16];
    cr_assert_leq(V, 16);
    int tok[B * T], at[] = {0, 6, 7, T};   // windows of 6 (> topk 3: sparse), 1, 7
    for (int w = 0; w < 3; w++) {
        int n = at[w + 1] - at[w];
        for (int b = 0; b < B; b++) memcpy(tok + b * n, tokens + b * T + at[w], (size_t)n * sizeof(int));
        Tensor *lg = lm_prefill_all(&tp, &lm, c, tok, n);
        cr_assert(lg->ndim == 3 && lg->shape[1] == n, "%s", SHAPE(lg));
        dev_to_host(got, lg->data, (size_t)B * n * V * sizeof(real), d);
        for (int b = 0; b < B; b++)
            for (int j = 0; j < n; j++) {
                double e = max_rel_diff(got + ((size_t)b * n + j) * V, ref + ((size_t)(at[w] + j) * B + b) * V, V);
                cr_assert_leq(e, DECODE_TOL, "window %d, row %d, position %d: prefill vs steps %.3e", w, b, at[w] + j,
                              e);
            }
        tape_reset(&tp);
    }
    free(ref), free(par);
    lm_cache_free(&lm, c);
    tape_no_grad_pop(&tp);
    tape_free(&tp);
    lm_destroy(&lm);
    params_free(&ps);
}

// GGUF export writes attention-only models as llama.cpp's 'llama', whose
// attention has neither option: such a model is refused, never written as a
// file that would load and compute something else.
Test(attn_options, gguf_llama_export_refuses_the_options) {
    const char *keys[] = {"qk_norm", "attn_gate"};
    for (int i = 0; i < 2; i++) {
        TrainConfig cfg;
        config_defaults(&cfg, NULL);
        char set[64];
        snprintf(set, sizeof set, "model.%s=true", keys[i]);
        cr_assert(config_set(&cfg, "model.layers=attn,attn").ok && config_set(&cfg, set).ok);
        Status st = export_gguf_check(&cfg, NULL);
        char on[32];
        snprintf(on, sizeof on, "%s = true", keys[i]);
        cr_assert(!st.ok && strstr(st.msg, on) && strstr(st.msg, "'llama'"), "got: %s", st.msg);
        config_free(&cfg);
    }
}

// The logits of lm over a fixed token pattern (B = 1, T = 9), on the host.
static void logits_of(LM *lm, real *out, int n) {
    int tokens[9];
    for (int i = 0; i < 9; i++) tokens[i] = (i * 5 + 1) % lm->cfg.vocab_size;
    Tape tp;
    tape_init(&tp);
    tape_no_grad_push(&tp);
    Tensor *lg = lm_forward(&tp, lm, tokens, 1, 9, NULL, NULL);
    cr_assert_eq(lg->numel, n);
    memcpy(out, lg->data, (size_t)n * sizeof(real));
    tape_free(&tp);
}

// A model with both options through a checkpoint, as generate, evaluate and
// export rebuild it (model_load_checkpoint): the stored config turns them on,
// the options' parameters come back by name, and the logits are the saved
// model's (float32 build: bit for bit; float64: from float32-rounded weights).
Test(attn_options, checkpoint_round_trip) {
    TrainConfig tc;
    config_defaults(&tc, NULL);
    Status st = config_load_string(&tc,
                                   "[model]\nlayers = gdn,attn,attn_dsa\nd_model = 8\nn_heads = 2\nd_k = 4\nd_v = 4\n"
                                   "d_ff = 12\nchunk_size = 4\nindex_heads = 2\nindex_dim = 4\ntopk = 3\n"
                                   "qk_norm = true\nattn_gate = true\n",
                                   "x.ini");
    cr_assert(st.ok && config_validate(&tc).ok, "%s", st.msg);
    LM a, b;
    ParamStore pa, pb;
    cr_assert(model_build(&tc, &a, &pa, NULL).ok);
    Rng r;
    rng_seed(&r, 3);
    for (int64_t i = 0; i < pa.numel; i++) pa.data[i] = (real)(float)(pa.data[i] + 0.1 * rng_normal(&r));
    const char *names[] = {"layers.1.mixer.q_norm", "layers.1.mixer.k_norm", "layers.1.mixer.w_gate",
                           "layers.2.mixer.q_norm", "layers.2.mixer.k_norm", "layers.2.mixer.w_gate"};
    for (int i = 0; i < 6; i++) cr_assert_not_null(params_find(&pa, names[i]), "%s", names[i]);
    cr_assert_null(params_find(&pa, "layers.0.mixer.q_norm"), "gdn has no q_norm");
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("attn_options"));
    snprintf(path, sizeof path, "%s/ckpt.h5", dir);
    CheckpointState cs;
    memset(&cs, 0, sizeof cs);
    cs.config_text = config_dump_string(&tc);
    cr_assert(strstr(cs.config_text, "qk_norm = true") && strstr(cs.config_text, "attn_gate = true"), "%s",
              cs.config_text);
    st = checkpoint_save(path, &pa, NULL, &cs);
    cr_assert(st.ok, "%s", st.msg);
    TrainConfig tb;
    st = model_load_checkpoint(path, &tb, &b, &pb, NULL);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert(tb.model.qk_norm && tb.model.attn_gate);
    cr_assert_eq(pb.n, pa.n);
    for (int i = 0; i < pa.n; i++) cr_assert_str_eq(pb.params[i]->name, pa.params[i]->name);
    cr_assert(memcmp(pa.data, pb.data, (size_t)pa.numel * sizeof(real)) == 0, "the weights came back changed");
    real la[9 * 256], lb[9 * 256];
    int n = 9 * a.cfg.vocab_size;
    cr_assert_leq(n, 9 * 256);
    logits_of(&a, la, n);
    logits_of(&b, lb, n);
    cr_assert(memcmp(la, lb, (size_t)n * sizeof(real)) == 0, "the reloaded model's logits differ");
    free(cs.config_text);
    lm_destroy(&a), lm_destroy(&b);
    params_free(&pa), params_free(&pb);
    config_free(&tc), config_free(&tb);
    test_remove_tree(dir);
}
