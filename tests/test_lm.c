// The language model: gradients of the whole model, decode parity for every
// mixer and for a hybrid of all of them, layer-list parsing.
#include <math.h>
#include <string.h>

#include "lm.h"
#include "test_util.h"

// Float64 only: float32 central differences (eps 1e-2, 7 digits) cannot
// resolve the small gradients deep in a 4-layer model; every op and mixer has
// its own float32 check, and this one runs in the float64 build.
#ifdef AG_DOUBLE
typedef struct {
    LM *lm;
    const int *tokens, *targets;
    int B, T;
} LossCtx;

static int f_lm_loss(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    LossCtx *c = ctx;
    out[0] = lm_loss(tp, c->lm, c->tokens, c->targets, c->B, c->T, NULL);
    return 1;
}

static void check_lm_gradients(const char *layers, bool tied) {
    LMConfig cfg = test_tiny_lm_config(layers);
    cfg.tied = tied;
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 3);
    // Check at a point where every path carries weight: with the Mamba-2 init
    // (dt in [1e-3, 1e-1]) the paths through k and the state are ~1e-3 of the
    // skip, and their gradients sink below what central differences resolve.
    // dt = softplus(dt_bias) = 1 and A = 0.5 instead.
    // Likewise the residual branches' small output projections: weights are
    // scaled up 3x so no parameter's gradient sits near the finite-difference
    // noise (|f| * 1e-16 / eps ~ 1e-10), where 1e-6 cannot be resolved.
    for (int i = 0; i < ps.n; i++) {
        Tensor *p = ps.params[i];
        if (strstr(p->name, "dt_bias"))
            for (int64_t j = 0; j < p->numel; j++) p->data[j] = (real)log(expm1(1.0));
        else if (strstr(p->name, "A_log"))   // decay exp(-0.5) per step, so the state carries history
            for (int64_t j = 0; j < p->numel; j++) p->data[j] = (real)log(0.5);
        else if (p->ndim == 2)
            for (int64_t j = 0; j < p->numel; j++) p->data[j] *= 3;
    }
    int B = 2, T = 6;
    int tokens[12], targets[12];
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 7 + 3) % 11, targets[i] = (i * 5 + 1) % 11;
    LossCtx c = {&lm, tokens, targets, B, T};
    GradcheckOptions o = gradcheck_defaults();
    o.max_elems = 24;   // a random subset of each parameter, plus random directions over all of it
    o.n_directions = 1;
    // Compared normwise per parameter (floor_frac 1: an element's error is
    // measured against that parameter's largest gradient), as the forms are.
    // Through four layers the finite-difference noise is ~1e-10 absolute,
    // which is 1e-4 of the smallest elements of a gradient whose largest is
    // 1e-2: those elements cannot be resolved one by one, their tensor can.
    // Each op and each mixer layer has its own elementwise check.
    o.floor_frac = 1.0;
    GradcheckResult r = gradcheck(layers, f_lm_loss, ps.params, ps.n, &c, &o);
    ASSERT_GRADCHECK(r, layers);
    lm_destroy(&lm);
    params_free(&ps);
}

Test(lm, gradcheck_every_parameter_hybrid, .timeout = 120) {
    check_lm_gradients("gdn,attn,mamba,linear", true);
    check_lm_gradients("attn", false);
}
#endif

// Decode parity: token-by-token logits equal the parallel forward's, on
// device_default() (test_lm_decode_diff).
static void check_decode(const char *layers) {
    LMConfig cfg = test_tiny_lm_config(layers);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 5);
    int B = 2, T = 9, V = cfg.vocab_size;
    int tokens[18];
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 3 + 2) % V;
#ifdef AG_DOUBLE
    double tol = 1e-9;   // MODEL.md, Decoding
#else
    double tol = 1e-4;
#endif
    double d = test_lm_decode_diff(&lm, &ps, tokens, B, T);
    cr_assert_leq(d, tol, "%s: decode vs parallel logits differ by %.3e", layers, d);
    lm_destroy(&lm);
    params_free(&ps);
}

Test(lm, decode_equals_parallel_every_mixer) {
    const char *kinds[] = {"attn", "linear", "mamba", "gdn", "gdp", "kda"};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) check_decode(kinds[i]);
    check_decode("gdn,attn,mamba,linear");
    check_decode("gdp,attn,gdn");
    check_decode("kda,attn,gdn");
}

// Prefill (lm_prefill): windows of a prompt decoded in one parallel forward
// each, with steps between them, give the logits token-by-token decoding
// gives at the windows' last positions and at every step after them, and
// leave the caches as the steps would. With docs = 1 every window but the
// first begins a document in both rows (lm_cache_reset_row); with docs = 2
// documents begin one step before the second and third windows, which then
// continue them (attention over the document's cached keys from a slot after
// 0); with docs = 0 the windows continue the rows (attention over the cached
// keys, recurrent states carried). Windows of 5 and 4 positions exceed attn_dsa's topk (3):
// its sparse path; one of 2 does not: its dense one. `window` is the
// cache's prefill_window (the LM's own windows; 0: the default); `stepped`:
// the kinds' prefill removed, so the LM steps the attention layers' windows
// (as it would a kind without one); `all`: the windows by lm_prefill_all,
// every position's logits compared.
static void check_prefill(const char *layers, int docs, bool distill, int window, bool stepped, bool all) {
    LMConfig cfg = test_tiny_lm_config(layers);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 7);
    if (distill) lm_set_dsa_mode(&lm, DSA_DISTILL);
    MixerKind plain[LM_MAX_LAYERS];
    for (int l = 0; stepped && l < cfg.n_layers; l++) {
        plain[l] = *lm.blocks[l].mixer->kind;
        plain[l].prefill = NULL;
        lm.blocks[l].mixer->kind = &plain[l];
    }
    enum { B = 2, T = 16 };
    const int win[][2] = {{0, 5}, {7, 4}, {12, 2}};   // {first position, length}; steps fill the rest
    int V = cfg.vocab_size, tokens[B * T], flags[B * T];
    memset(flags, 0, sizeof flags);
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 5 + 3 + i / T) % V;
    for (int w = 1; docs && w < 3; w++) {
        int at = win[w][0] - (docs == 2);   // the window's start, or the step before it
        flags[0 * T + at] = flags[1 * T + at] = 1;
    }
    Device d = device_default();
    if (d != DEVICE_CPU) params_to_device(&ps, d);
    real *par = NULL, *ref = test_lm_decode_logits_docs(&lm, d, tokens, docs ? flags : NULL, B, T, &par);
    Tape tp;
    tape_init_on(&tp, d);
    tape_no_grad_push(&tp);
    LMCache *c = lm_cache_new_on(&lm, B, T, d);
    if (window) c->prefill_window = window;
    real *got = xmalloc((size_t)B * T * V * sizeof(real));
    int tok[B * T];
    double worst = 0, worst_par = 0;
    int worst_t = -1, checked = 0;
    for (int t = 0, w = 0; t < T;) {
        Tensor *lg;
        int n = 1;
        if (w < 3 && t == win[w][0]) {   // a window: rows' tokens t .. t+n-1, row by row
            n = win[w++][1];
            for (int b = 0; b < B; b++) {
                if (flags[b * T + t]) lm_cache_reset_row(&lm, c, b);
                memcpy(tok + b * n, tokens + b * T + t, (size_t)n * sizeof(int));
            }
            lg = all ? lm_prefill_all(&tp, &lm, c, tok, n) : lm_prefill(&tp, &lm, c, tok, n);
        } else {
            for (int b = 0; b < B; b++) {
                if (flags[b * T + t]) lm_cache_reset_row(&lm, c, b);
                tok[b] = tokens[b * T + t];
            }
            lg = lm_step(&tp, &lm, c, tok);
        }
        int np = lg->shape[1];   // positions t+n-np .. t+n-1: the last one, or the window's all
        cr_assert(lg->ndim == 3 && lg->shape[0] == B && lg->shape[2] == V && (np == 1 || (all && np == n)), "%s",
                  SHAPE(lg));
        cr_assert_eq(c->pos, t + n, "%s: the cache is at %d after position %d", layers, c->pos, t + n - 1);
        t += n;
        dev_to_host(got, lg->data, (size_t)B * np * V * sizeof(real), d);
        for (int b = 0; b < B; b++)
            for (int j = 0, p = t - np; j < np; j++, p++) {
                const real *g = got + ((size_t)b * np + j) * V;
                double e = max_rel_diff(g, ref + ((size_t)p * B + b) * V, V);
                double ep = max_rel_diff(g, par + ((size_t)b * T + p) * V, V);
                if (e > worst) worst = e, worst_t = p;
                worst_par = fmax(worst_par, ep);
            }
        checked++;
        tape_reset(&tp);
    }
#ifdef AG_DOUBLE
    double tol = 1e-9;   // MODEL.md, Decoding
#else
    double tol = 1e-4;
#endif
    cr_assert_eq(checked, 3 + 2 + 1 + 2, "%s: %d calls", layers, checked);
    cr_assert_leq(worst, tol, "%s%s%s, window %d%s: prefill + steps vs token by token differ by %.3e at position %d",
                  layers, docs == 1 ? " (documents)" : docs == 2 ? " (documents begun before)" : "",
                  distill ? " (distill)" : "", window,
                  stepped ? " (stepped)" : "", worst, worst_t);
    cr_assert_leq(worst_par, tol, "%s: prefill + steps vs the parallel forward differ by %.3e", layers, worst_par);
    free(got), free(ref), free(par);
    lm_cache_free(&lm, c);
    tape_no_grad_pop(&tp);
    tape_free(&tp);
    lm_destroy(&lm);
    params_free(&ps);
}

Test(lm, prefill_then_steps_equal_token_by_token_every_mixer) {
    const char *kinds[] = {"attn", "linear", "mamba", "gdn", "attn_dsa", "kda", "gdn,attn,mamba,linear,attn_dsa"};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        for (int docs = 0; docs < 3; docs++) check_prefill(kinds[i], docs, false, 0, false, false);
    for (int docs = 0; docs < 3; docs++) check_prefill("attn_dsa,gdn", docs, true, 0, false, false);   // dense
    // The LM's own windows of 3 (5 = 3 + 2, 4 = 3 + 1), and attention stepped.
    check_prefill("gdn,attn,mamba,linear,attn_dsa", 0, false, 3, false, false);
    check_prefill("gdn,attn,attn_dsa", 1, false, 3, true, false);
    check_prefill("gdn,attn,attn_dsa", 2, false, 3, true, false);
    check_prefill("attn,attn_dsa", 0, true, 0, true, false);
    // Every position's logits (lm_prefill_all), across the LM's windows too.
    check_prefill("gdn,attn,mamba,linear,attn_dsa", 0, false, 0, false, true);
    check_prefill("gdn,attn,mamba,linear,attn_dsa", 1, false, 3, false, true);
    check_prefill("gdn,attn,mamba,linear,attn_dsa", 2, false, 3, false, true);
}

Test(lm, parse_layers_rejects_unknown_mixer) {
    LMConfig c;
    memset(&c, 0, sizeof c);
    Status s = lm_parse_layers(&c, "gdn, attn,gdm");
    cr_assert(!s.ok);
    cr_assert(strstr(s.msg, "gdm") && strstr(s.msg, "layer 2"), "got: %s", s.msg);
    s = lm_parse_layers(&c, "gdn,gdn,gdn,attn");
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(c.n_layers, 4);
    cr_assert_str_eq(c.layers[3], "attn");
}
