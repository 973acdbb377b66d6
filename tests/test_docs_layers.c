// Document boundaries (docs.h) through every mixer (mixer.h) and the LM
// (lm.h): a packed row equals its documents run as rows of their own (the
// output, the final state, and the gradients of the input, the initial state
// and every parameter), in every form; gradient checks of each layer with
// boundaries; decoding with cache resets at the boundaries equals the
// parallel forward with documents.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_dsa.h"
#include "attn_layer.h"
#include "lm.h"
#include "test_docs_util.h"

enum { D = 8, H = 2, DK = 4, DV = 4, CHUNK = 4 };

// One mixer of a kind and form, its layer configuration as in the mixers'
// own tests (a larger output projection, every parameter perturbed so none
// is special by symmetry; mamba and gdn at moderate dt, so that the paths
// through the state carry weight).
typedef struct Layer {
    ParamStore ps;
    Mixer *m;
    Tensor **in;      // u, [s0], every parameter
    DocsInKind *kind;
    int n_in;
} Layer;

static double g_norm_eps = 1e-6;   // the output stage's RMSNorm eps (gradcheck_every_mixer_with_boundaries)

static void layer_make(Layer *L, const char *kind, MixerForm form, DsaMode mode, int topk, uint64_t seed) {
    MixerConfig c = mixer_config_default(D, H, DK, DV);
    c.norm_eps = g_norm_eps;
    c.chunk_size = CHUNK;
    c.form = form;
    c.out_std = 0.3;
    c.index_heads = 2;
    c.index_dim = 4;
    c.topk = topk;
    params_init(&L->ps);
    L->m = mixer_create(kind, &c, &L->ps, "mix.");
    params_finalize(&L->ps, seed);
    Rng r;
    rng_seed(&r, seed + 99);
    for (int64_t i = 0; i < L->ps.numel; i++) L->ps.data[i] += (real)(0.05 * rng_normal(&r));
    Tensor *bias = params_find(&L->ps, "mix.dt_bias"), *A = params_find(&L->ps, "mix.A_log");
    for (int h = 0; bias && h < H; h++) {
        bias->data[h] = (real)(0.2 + 0.5 * h);
        A->data[h] = (real)(-0.5 + 0.6 * h);
    }
    if (strcmp(kind, "attn_dsa") == 0) attn_dsa_set_mode(L->m, mode);
    bool rec = L->m->kind->recurrent;
    L->n_in = 1 + rec + L->ps.n;
    L->in = xcalloc((size_t)L->n_in, sizeof *L->in);
    L->kind = xcalloc((size_t)L->n_in, sizeof *L->kind);
    for (int i = 0; i < L->ps.n; i++) {
        L->in[1 + rec + i] = L->ps.params[i];
        L->kind[1 + rec + i] = DOCS_SHARED;
    }
    L->kind[0] = DOCS_SEQ;
    if (rec) L->kind[1] = DOCS_ROW;
}

static void layer_inputs(Layer *L, int B, int T, uint64_t seed) {
    L->in[0] = tensor_newv(true, 3, B, T, D);
    fill_normal(L->in[0], seed, 1.0);
    if (L->m->kind->recurrent) {
        L->in[1] = tensor_newv(true, 4, B, H, DK, DV);
        fill_normal(L->in[1], seed + 1, 0.5);
    }
}

static void layer_free(Layer *L) {
    tensor_free(L->in[0]);
    if (L->m->kind->recurrent) tensor_free(L->in[1]);
    free(L->in);
    free(L->kind);
    mixer_destroy(L->m);
    params_free(&L->ps);
}

static int f_layer(Tape *tp, Tensor *const *in, const int *doc_start, void *ctx, Tensor **out) {
    Mixer *m = ctx;
    if (!m->kind->recurrent) {
        out[0] = m->kind->forward(tp, m, in[0], doc_start, NULL, NULL);
        return 1;
    }
    out[0] = m->kind->forward(tp, m, in[0], doc_start, in[1], &out[1]);
    return 2;
}

typedef struct Case {
    const char *kind;
    MixerForm form;
    DsaMode mode;
    int topk;
    const char *label;
} Case;

// Every kind in every form; attn_dsa sparse (top-3 of up to 11 positions,
// and top-16: every document dense), sparse with the selection's KL, and
// distillation (dense attention).
static const Case CASES[] = {
    {"attn", MIXER_FORM_CHUNKED, 0, 64, "attn"},
    {"linear", MIXER_FORM_PARALLEL, 0, 64, "linear parallel"},
    {"linear", MIXER_FORM_CHUNKED, 0, 64, "linear chunked"},
    {"linear", MIXER_FORM_RECURRENT, 0, 64, "linear recurrent"},
    {"mamba", MIXER_FORM_PARALLEL, 0, 64, "mamba parallel"},
    {"mamba", MIXER_FORM_CHUNKED, 0, 64, "mamba chunked"},
    {"mamba", MIXER_FORM_RECURRENT, 0, 64, "mamba recurrent"},
    {"mamba2", MIXER_FORM_PARALLEL, 0, 64, "mamba2 parallel"},
    {"mamba2", MIXER_FORM_CHUNKED, 0, 64, "mamba2 chunked"},
    {"mamba2", MIXER_FORM_RECURRENT, 0, 64, "mamba2 recurrent"},
    {"gdn", MIXER_FORM_CHUNKED, 0, 64, "gdn chunked"},
    {"gdn", MIXER_FORM_RECURRENT, 0, 64, "gdn recurrent"},
    {"attn_dsa", MIXER_FORM_CHUNKED, DSA_SPARSE, 3, "attn_dsa sparse top-3"},
    {"attn_dsa", MIXER_FORM_CHUNKED, DSA_SPARSE, 16, "attn_dsa sparse top-16"},
    {"attn_dsa", MIXER_FORM_CHUNKED, DSA_SPARSE_KL, 3, "attn_dsa sparse+KL top-3"},
    {"attn_dsa", MIXER_FORM_CHUNKED, DSA_DISTILL, 3, "attn_dsa distill"},
    {"gdp", MIXER_FORM_CHUNKED, 0, 64, "gdp chunked"},   // gdp_steps 2 (test_gdp.c: 3)
    {"gdp", MIXER_FORM_RECURRENT, 0, 64, "gdp recurrent"},
    {"kda", MIXER_FORM_CHUNKED, 0, 64, "kda chunked"},
    {"kda", MIXER_FORM_RECURRENT, 0, 64, "kda recurrent"},
};
enum { N_CASES = sizeof CASES / sizeof CASES[0] };

Test(docs_layers, packed_equals_separate_every_mixer_and_form) {
    int B = 2, T = 11;
    int *docs = docs_pattern(T, CHUNK);
    for (int i = 0; i < N_CASES; i++) {
        const Case *c = &CASES[i];
        Layer L;
        layer_make(&L, c->kind, c->form, c->mode, c->topk, 10 + i);
        layer_inputs(&L, B, T, 20 + i);
        DocsFn f = {f_layer, L.m, L.n_in, L.kind};
        docs_check_packed(&f, L.in, docs, B, T, FORM_TOL, c->label);
        layer_free(&L);
    }
    free(docs);
}

// The short convolution off (conv_size 0: the state alone carries history)
// and wider than some documents (conv_size 4 with documents of 1-2 tokens is
// the default above); here a longer row with chunk edges inside documents.
Test(docs_layers, packed_equals_separate_longer_rows) {
    int B = 2, T = 40;
    int *docs = xcalloc((size_t)B * T, sizeof(int));
    int starts[] = {0, 3, 4, 12, 13, 14, 26, 39, /* row 1 */ 45, 47, 60, 64};
    for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++) docs[starts[i]] = 1;
    const char *kinds[] = {"linear", "mamba", "gdn", "attn", "attn_dsa", "mamba2", "gdp", "kda"};
    for (int i = 0; i < (int)(sizeof kinds / sizeof kinds[0]); i++) {
        Layer L;
        layer_make(&L, kinds[i], MIXER_FORM_CHUNKED, DSA_SPARSE, 5, 30 + i);
        layer_inputs(&L, B, T, 40 + i);
        DocsFn f = {f_layer, L.m, L.n_in, L.kind};
        docs_check_packed(&f, L.in, docs, B, T, FORM_TOL, kinds[i]);
        layer_free(&L);
    }
    free(docs);
}

// Each layer in its training form by finite differences w.r.t. the input,
// the initial state and every parameter, with boundaries at position 0,
// chunk edges, inside chunks (several in one) and at the last position.
// float64 only, as test_lm.c's: float32 differences of a whole layer's O(10)
// output cannot resolve its small gradients (the ops' own checks above run
// in both builds, and packed-equals-separate in every build).
// The output stage's RMSNorm runs at eps 1e-2 here, not 1e-6: a one-token
// document's o = (q.k) v is tiny where q.k ~ 0, and there RMSNorm_head(o) at
// eps 1e-6 turns nearly into sign(o), a curvature central differences cannot
// follow (measured: conv_q of linear off by 1.5e-5 at eps 1e-5, 1.5e-3 at
// 1e-4, i.e. truncation). The math checked is the same.
#ifdef AG_DOUBLE
Test(docs_layers, gradcheck_every_mixer_with_boundaries) {
    int B = 2, T = 11;
    int *docs = docs_pattern(T, CHUNK);
    // attn (RoPE positions and the mask together), gdn (chunked, with its
    // convolutions), gdp (its document flags mapped to the substeps) and kda
    // (a decay per key channel). The ops of the others have their own gradchecks with
    // boundaries (op_gla: test_docs_recurrent.c; the DSA indexer's scores and
    // KL: test_docs_dsa.c), and every layer in every form is checked packed
    // against separate rows above, whose gradients the layers' own tests
    // check by finite differences.
    static const int pick[] = {0, 10, 16, 18};   // attn, gdn chunked, gdp chunked, kda chunked
    GradcheckOptions o = gradcheck_defaults();
    o.eps = 1e-5;   // f is O(10) here: the rounding of f at 1e-6 reaches 1e-6 of small gradients (test_linear_mamba.c)
    g_norm_eps = 1e-2;
    for (size_t i = 0; i < sizeof pick / sizeof pick[0]; i++) {
        const Case *c = &CASES[pick[i]];
        Layer L;
        layer_make(&L, c->kind, c->form, c->mode, c->topk, 50 + i);
        layer_inputs(&L, B, T, 60 + i);
        DocsFn f = {f_layer, L.m, L.n_in, L.kind};
        docs_gradcheck(&f, L.in, docs, &o, c->label);
        layer_free(&L);
    }
    g_norm_eps = 1e-6;
    free(docs);
}
#endif

// Step by step with a cache reset at every flagged position equals the
// parallel forward with documents, at every position (on device_default():
// AG_DEVICE=cuda runs both on the GPU).
Test(docs_layers, decode_with_resets_equals_forward) {
    int B = 2, T = 11;
    int *docs = docs_pattern(T, CHUNK);
    for (int i = 0; i < N_CASES; i++) {
        const Case *c = &CASES[i];
        Layer L;
        layer_make(&L, c->kind, c->form, c->mode, c->topk, 70 + i);
        Tensor *u = tensor_newv(false, 3, B, T, D);
        fill_normal(u, 80 + i, 1.0);
        int t = -1, b = -1;
        double d = test_mixer_decode_docs_diff(L.m, &L.ps, u, docs, &t, &b);
        cr_assert_leq(d, DECODE_TOL, "%s: position %d, row %d: step vs forward %.3e", c->label, t, b, d);
        tensor_free(u);
        mixer_destroy(L.m);
        params_free(&L.ps);
        free(L.in);
        free(L.kind);
    }
    free(docs);
}

// RoPE positions restart at every document, in the forward and after a cache
// reset. (Attention scores under RoPE depend on t - s only, so the outputs
// cannot show this beyond rounding: restarting makes every rotation of a
// packed row the same bits as in a row of its own; MODEL.md's notes.)
Test(docs_layers, rope_positions_restart_in_forward_and_decoding) {
    int T = 11;
    int *docs = docs_pattern(T, CHUNK);
    Tape tp;
    tape_init(&tp);
    const int *pos = attn_doc_positions(&tp, docs, 2, T);
    int want[22] = {0, 1, 2, 3, 0, 0, 0, 1, 2, 0, 0, /* row 1: no flag at 0 */ 0, 1, 0, 0, 1, 2, 3, 4, 0, 0, 1};
    for (int i = 0; i < 2 * T; i++) cr_assert_eq(pos[i], want[i], "position %d: %d, want %d", i, pos[i], want[i]);
    cr_assert_null(attn_doc_positions(&tp, NULL, 2, T));
    MixerConfig c = mixer_config_default(D, H, DK, DV);
    KVCache kc;
    kvcache_init(&kc, &c, 2, 8, DEVICE_CPU);
    kc.pos = 5;
    cr_assert_null(kvcache_positions(&tp, &kc, 2), "no reset: positions pos + t");
    kvcache_reset(&kc, 1);
    kc.pos = 7;
    const int *dp = kvcache_positions(&tp, &kc, 1);
    cr_assert(dp[0] == 7 && dp[1] == 2, "after a reset at slot 5: %d %d, want 7 2", dp[0], dp[1]);
    kvcache_free(&kc);
    tape_free(&tp);
    free(docs);
}

// ---- the LM ----

static void lm_make(LM *lm, ParamStore *ps, const char *layers, uint64_t seed) {
    LMConfig cfg = test_tiny_lm_config(layers);
    params_init(ps);
    lm_create(lm, &cfg, ps);
    params_finalize(ps, seed);
    for (int i = 0; i < ps->n; i++) {   // as test_lm.c: every path carries weight
        Tensor *p = ps->params[i];
        if (strstr(p->name, "dt_bias"))
            for (int64_t j = 0; j < p->numel; j++) p->data[j] = (real)log(expm1(1.0));
        else if (strstr(p->name, "A_log"))
            for (int64_t j = 0; j < p->numel; j++) p->data[j] = (real)log(0.5);
        else if (p->ndim == 2)
            for (int64_t j = 0; j < p->numel; j++) p->data[j] *= 3;
    }
}

static const char *const HYBRID = "gdn,attn,mamba,linear,attn_dsa";

// The LM's loss and logits as a GradcheckFn over its parameters (which
// gradcheck_run moves to device_default() for the call): lm_loss_docs over
// docs, or lm_loss when docs is NULL.
typedef struct LossCtx {
    LM *lm;
    const int *tokens, *targets, *docs;
    int B, T;
} LossCtx;

static int f_lm_loss(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)in, (void)n;
    const LossCtx *c = ctx;
    out[0] = c->docs ? lm_loss_docs(tp, c->lm, c->tokens, c->targets, c->docs, c->B, c->T, &out[1])
                     : lm_loss(tp, c->lm, c->tokens, c->targets, c->B, c->T, &out[1]);
    return 2;
}

// lm_loss_docs over packed rows against lm_loss over each document alone
// (B = 1, its length): the loss (the mean over all positions = the
// length-weighted mean of the documents'), the logits at every position and
// every parameter's gradient. Both on device_default().
Test(docs_layers, lm_loss_packed_equals_separate) {
    int B = 2, T = 11, V = 11;
    int *docs = docs_pattern(T, CHUNK);
    int tokens[22], targets[22];
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 7 + 3) % V, targets[i] = (i * 5 + 1) % V;
    targets[5] = -1;   // an ignored target counts in neither
    LM lm;
    ParamStore ps;
    lm_make(&lm, &ps, HYBRID, 3);
    real one = 1, *out[2];
    LossCtx packed = {&lm, tokens, targets, docs, B, T};
    cr_assert_eq(gradcheck_run_seeds(f_lm_loss, ps.params, ps.n, &packed, (const real *[]){&one, NULL}, out, NULL), 2);
    double loss = out[0][0];
    real *lp = out[1], *gp = xmalloc((size_t)ps.numel * sizeof(real));
    free(out[0]);
    memcpy(gp, ps.grad, (size_t)ps.numel * sizeof(real));

    real *ls = xmalloc((size_t)B * T * V * sizeof(real)), *gs = xcalloc((size_t)ps.numel, sizeof(real));
    double sum = 0;
    int counted = B * T - 1;
    for (int b = 0; b < B; b++)
        for (int s = 0, e; s < T; s = e) {
            for (e = s + 1; e < T && !docs[b * T + e]; e++) {}
            int n = e - s, valid = 0;
            for (int t = s; t < e; t++) valid += targets[b * T + t] >= 0;
            LossCtx one_doc = {&lm, tokens + b * T + s, targets + b * T + s, NULL, 1, n};
            real share = (real)((double)valid / counted);   // its share of the packed mean
            gradcheck_run_seeds(f_lm_loss, ps.params, ps.n, &one_doc, (const real *[]){&share, NULL}, out, NULL);
            memcpy(ls + ((int64_t)b * T + s) * V, out[1], (size_t)n * V * sizeof(real));
            sum += valid * out[0][0];
            for (int64_t k = 0; k < ps.numel; k++) gs[k] += ps.grad[k];
            free(out[0]), free(out[1]);
        }
    cr_assert_float_eq(loss, sum / counted, FORM_TOL * fabs(loss), "loss: packed %.12g, separate %.12g", loss,
                       sum / counted);
    double d = max_rel_diff(lp, ls, (int64_t)B * T * V);
    cr_assert_leq(d, FORM_TOL, "logits differ by %.3e", d);
    for (int i = 0; i < ps.n; i++) {
        Tensor *p = ps.params[i];
        int64_t off = p->grad - ps.grad;
        d = max_rel_diff(gp + off, gs + off, p->numel);
        cr_assert_leq(d, FORM_TOL, "gradient of %s differs by %.3e", p->name, d);
    }
    free(lp), free(gp), free(ls), free(gs), free(docs);
    lm_destroy(&lm);
    params_free(&ps);
}

// Decoding with lm_cache_reset_row at the boundaries equals lm_forward_docs,
// on device_default().
Test(docs_layers, lm_decode_with_resets_equals_forward) {
    int B = 2, T = 11, V = 11;
    int *docs = docs_pattern(T, CHUNK);
    int tokens[22];
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 3 + 2) % V;
    LM lm;
    ParamStore ps;
    lm_make(&lm, &ps, HYBRID, 5);
    Device dev = device_default();
    params_to_device(&ps, dev);
    real *logits = NULL, *steps = test_lm_decode_logits_docs(&lm, dev, tokens, docs, B, T, &logits);
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++) {
            double d = max_rel_diff(steps + ((int64_t)t * B + b) * V, logits + ((int64_t)b * T + t) * V, V);
            cr_assert_leq(d, DECODE_TOL, "position %d, row %d: decode vs forward logits %.3e", t, b, d);
        }
    free(steps), free(logits);
    lm_destroy(&lm);
    params_free(&ps);
    free(docs);
}

typedef struct FwdCtx {
    LM *lm;
    const int *tokens, *none;
    int B, T;
} FwdCtx;

static int f_lm_forwards(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)in, (void)n;
    const FwdCtx *c = ctx;
    out[0] = lm_forward(tp, c->lm, c->tokens, c->B, c->T, NULL, NULL);
    out[1] = lm_forward_docs(tp, c->lm, c->tokens, c->none, c->B, c->T, NULL, NULL);
    return 2;
}

// No flag anywhere is lm_forward, bit for bit (on device_default()).
Test(docs_layers, lm_no_flag_equals_lm_forward) {
    int B = 2, T = 11, V = 11;
    int tokens[22], none[22] = {0};
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 3 + 2) % V;
    LM lm;
    ParamStore ps;
    lm_make(&lm, &ps, HYBRID, 7);
    FwdCtx c = {&lm, tokens, none, B, T};
    real *out[2];
    int64_t n[2];
    gradcheck_run_seeds(f_lm_forwards, ps.params, ps.n, &c, (const real *[]){NULL, NULL}, out, n);
    cr_assert(n[0] == (int64_t)B * T * V && n[1] == n[0]);
    cr_assert_eq(memcmp(out[0], out[1], (size_t)n[0] * sizeof(real)), 0);
    free(out[0]), free(out[1]);
    lm_destroy(&lm);
    params_free(&ps);
}
