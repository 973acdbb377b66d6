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
    const char *kinds[] = {"attn", "linear", "mamba", "gdn"};
    for (int i = 0; i < 4; i++) check_decode(kinds[i]);
    check_decode("gdn,attn,mamba,linear");
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
