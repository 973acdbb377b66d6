// custom_mixer.c: define your own token mixer outside the library, register
// it, and train a small language model that uses it, through the public API.
//
//   cc custom_mixer.c $(pkg-config --cflags --libs attnlab) -o custom_mixer && ./custom_mixer
//
// The mixer "convmix": v = u Wv, o = SiLU(causal depthwise conv of width 4
// over v), out = o Wo. It has no recurrent state; decoding keeps the last
// three inputs of the convolution (ShortConv's cache). The LM below mixes it
// with a Gated DeltaNet layer ("convmix,gdn") and learns a repeating text.
#include <attnlab/lm.h>
#include <attnlab/mixer_common.h>
#include <attnlab/optim.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ConvMix {
    Tensor *wv, *wo;   // (D, D) each
    ShortConv conv;    // (D, 4)
} ConvMix;

static void convmix_create(Mixer *m, ParamStore *ps, const char *prefix) {
    int D = m->cfg.d_model;
    ConvMix *c = calloc(1, sizeof *c);
    c->wv = param_linear(ps, prefix, "wv", D, D, 1.0 / D);
    c->wo = param_linear(ps, prefix, "wo", D, D, m->cfg.out_std);
    char name[128];
    snprintf(name, sizeof name, "%sconv", prefix);
    shortconv_create(&c->conv, ps, name, D, 4);
    m->impl = c;
}

// doc_start (B, T) or NULL: where packed documents begin; the convolution
// does not read across a boundary.
static Tensor *convmix_forward(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, Tensor *s_in, Tensor **s_out) {
    (void)s_in, (void)s_out;   // no recurrent state
    ConvMix *c = m->impl;
    Tensor *v = op_matmul(tp, u, c->wv, false, false);
    return op_matmul(tp, shortconv_forward(tp, &c->conv, v, doc_start), c->wo, false, false);
}

// The decode cache in dev's memory (the CPU, or the GPU for a model decoded there).
static void *convmix_cache_new(const Mixer *m, int B, int max_T, Device dev) {
    (void)max_T;
    ShortConvCache *cc = calloc(1, sizeof *cc);
    shortconv_cache_init(cc, &((const ConvMix *)m->impl)->conv, B, dev);
    return cc;
}

static void convmix_cache_free(void *cache) {
    shortconv_cache_free(cache);
    free(cache);
}

// Row b's next token starts a new document: forget its last inputs.
static void convmix_cache_reset(const Mixer *m, void *cache, int b) {
    shortconv_cache_reset(cache, &((const ConvMix *)m->impl)->conv, b);
}

static Tensor *convmix_step(Tape *tp, Mixer *m, void *cache, Tensor *u) {
    ConvMix *c = m->impl;
    Tensor *v = op_matmul(tp, u, c->wv, false, false);
    return op_matmul(tp, shortconv_step(tp, &c->conv, cache, v), c->wo, false, false);
}

static void convmix_destroy(Mixer *m) { free(m->impl); }

static const MixerKind CONVMIX = {.name = "convmix",
                                  .create = convmix_create,
                                  .forward = convmix_forward,
                                  .cache_new = convmix_cache_new,
                                  .cache_free = convmix_cache_free,
                                  .step = convmix_step,
                                  .cache_reset = convmix_cache_reset,
                                  .destroy = convmix_destroy};

int main(void) {
    mixer_kind_register(&CONVMIX);
    LMConfig cfg = {.vocab_size = 256, .d_model = 32, .d_ff = 64, .tied = true, .norm_eps = 1e-6};
    Status s = lm_parse_layers(&cfg, "convmix,gdn");
    if (!s.ok) {
        fprintf(stderr, "custom_mixer: %s\n", s.msg);
        return 1;
    }
    cfg.mixer = mixer_config_default(32, 2, 16, 16);
    cfg.mixer.chunk_size = 16;
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 1);
    Optimizer opt;
    adamw_init(&opt, &ps, 0.9, 0.95, 1e-8, 0.0);
    // A repeating text: the model should learn to continue it.
    const char *text = "the quick brown fox jumps over the lazy dog. ";
    int B = 4, T = 32, n = (int)strlen(text);
    int x[4 * 32], y[4 * 32];
    Tape tp;
    tape_init(&tp);
    double first = 0, last = 0;
    for (int step = 0; step < 150; step++) {
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                int pos = (step * 7 + b * 11 + t) % n;
                x[b * T + t] = (unsigned char)text[pos];
                y[b * T + t] = (unsigned char)text[(pos + 1) % n];
            }
        params_zero_grad(&ps);
        Tensor *loss = lm_loss(&tp, &lm, x, y, B, T, NULL);
        double l = loss->data[0];
        tape_backward(&tp, loss);
        tape_reset(&tp);
        optim_clip_grad_norm(&ps, 1.0);
        optim_step(&opt, &ps, 1e-2);
        if (step == 0) first = l;
        last = l;
    }
    printf("custom mixer 'convmix' in an LM (convmix,gdn), %lld parameters: loss %.3f -> %.3f in 150 steps\n",
           (long long)params_count(&ps, false), first, last);
    tape_free(&tp);
    optim_free(&opt);
    lm_destroy(&lm);
    params_free(&ps);
    return last < 0.5 * first ? 0 : 1;   // it learned the text
}
