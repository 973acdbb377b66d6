// test_cuda_lm.c: whole language models on the GPU against the CPU: the loss
// and every parameter's gradient of one forward/backward for each mixer
// kind and a hybrid, with and without document starts, then a few AdamW
// steps (parameters, moments and tape on the GPU) with the same losses.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "cuda_check.h"
#include "lm.h"
#include "optim.h"

#define B_ 3
#define T_ 37   // not a multiple of the chunk

static LMConfig gpu_lm_config(const char *layers) {
    LMConfig c = test_tiny_lm_config(layers);
    c.vocab_size = 97;
    c.d_model = 64;
    c.d_ff = 176;
    c.mixer = mixer_config_default(64, 4, 16, 16);
    c.mixer.chunk_size = 8;
    c.mixer.conv_size = 4;
    c.mixer.index_heads = 2;
    c.mixer.index_dim = 8;
    c.mixer.topk = 5;
    Status s = lm_parse_layers(&c, layers);
    cr_assert(s.ok, "%s", s.msg);
    return c;
}

typedef struct {
    double loss[4];
    real *grad;   // host copy of the whole gradient block after the first step
} LmRun;

static void tokens_of(int *tokens, int *targets, int *doc_start) {
    for (int i = 0; i < B_ * T_; i++) {
        tokens[i] = (i * 37 + 11) % 97;
        targets[i] = (i * 53 + 5) % 97;
    }
    if (doc_start) {   // documents of 10, 20 and 7 tokens in row 1; one in the others
        for (int i = 0; i < B_ * T_; i++) doc_start[i] = 0;
        doc_start[1 * T_ + 10] = 1;
        doc_start[1 * T_ + 30] = 1;
    }
}

typedef struct {
    int tokens[B_ * T_], targets[B_ * T_], ds[B_ * T_];
    bool docs;
} LmData;

static Tensor *lm_run_loss(Tape *tp, LM *lm, int step, void *ctx) {
    (void)step;
    LmData *x = ctx;
    return x->docs ? lm_loss_docs(tp, lm, x->tokens, x->targets, x->ds, B_, T_, NULL)
                   : lm_loss(tp, lm, x->tokens, x->targets, B_, T_, NULL);
}

static void lm_run(Device d, const char *layers, bool docs, int steps, LmRun *r) {
    LMConfig cfg = gpu_lm_config(layers);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 5);
    if (d != DEVICE_CPU) params_to_device(&ps, d);
    LmData x = {.docs = docs};
    tokens_of(x.tokens, x.targets, docs ? x.ds : NULL);
    cuda_train_steps(&lm, &ps, d, steps, lm_run_loss, &x, r->loss, &r->grad);
    lm_destroy(&lm);
    params_free(&ps);
}

static void compare_lm(const char *layers, bool docs) {
    cuda_require();
    LmRun c, g;
    lm_run(DEVICE_CPU, layers, docs, 4, &c);
    lm_run(DEVICE_CUDA, layers, docs, 4, &g);
    for (int s = 0; s < 4; s++)
        cr_assert(fabs(c.loss[s] - g.loss[s]) <= FORM_TOL * fabs(c.loss[s]),
                  "%s%s: step %d loss %.10g on the CPU, %.10g on the GPU", layers, docs ? " (documents)" : "", s,
                  c.loss[s], g.loss[s]);
    // Per parameter, normwise.
    LMConfig cfg = gpu_lm_config(layers);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    for (int i = 0; i < ps.n; i++) {
        int64_t off = ps.offsets[i], n = ps.params[i]->numel;
        double e = max_rel_diff(c.grad + off, g.grad + off, n);
        cr_assert(e <= FORM_TOL, "%s%s: gradient of '%s' differs by %.3e", layers, docs ? " (documents)" : "",
                  ps.params[i]->name, e);
    }
    lm_destroy(&lm);
    params_free(&ps);
    free(c.grad);
    free(g.grad);
}

Test(cuda_lm, attention) { compare_lm("attn,attn", false); }
Test(cuda_lm, linear) { compare_lm("linear,linear", false); }
Test(cuda_lm, mamba) { compare_lm("mamba,mamba", false); }
Test(cuda_lm, mamba2) { compare_lm("mamba2,mamba2", false); }
Test(cuda_lm, gdn) { compare_lm("gdn,gdn", false); }
Test(cuda_lm, gdp) { compare_lm("gdp,gdp", false); }
Test(cuda_lm, gdp_with_documents) { compare_lm("gdp,attn", true); }
Test(cuda_lm, kda) { compare_lm("kda,kda", false); }
Test(cuda_lm, kda_with_documents) { compare_lm("kda,attn", true); }
Test(cuda_lm, hybrid) { compare_lm("gdn,attn,mamba,linear", false); }
Test(cuda_lm, hybrid_with_documents) { compare_lm("gdn,attn,mamba,linear", true); }
