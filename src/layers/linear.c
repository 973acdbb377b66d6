// linear.c: the `linear` mixer (MODEL.md "linear"): plain linear attention.
//   q, k, v = SiLU(conv(u W)); q, k L2-normalised per head, q scaled 1/sqrt(dk)
//   S_t = S_{t-1} + k_t v_tᵀ,  o_t = S_tᵀ q_t   (op_gla with g = NULL)
//   y = (RMSNorm_head(o) ⊙ SiLU(u Wg)) Wo
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gla_layer.h"

static void linear_create(Mixer *m, ParamStore *ps, const char *prefix) {
    GlaLayer *L = xcalloc(1, sizeof *L);
    gla_layer_create(L, ps, prefix, &m->cfg);
    m->impl = L;
}

static void linear_destroy(Mixer *m) { free(m->impl); }

// From q, k, v (after the convolutions) to the layer's output.
static Tensor *linear_mix(Tape *tp, const Mixer *m, Tensor *gz, Tensor *q, Tensor *k, Tensor *v,
                          const int *doc_start, Tensor *s_in, MixerForm form, Tensor **s_out) {
    const MixerConfig *c = &m->cfg;
    q = op_l2norm_heads_scaled(tp, q, c->d_k, 1.0 / sqrt(c->d_k));
    k = op_l2norm_heads(tp, k, c->d_k);
    Tensor *o = op_gla(tp, q, k, v, NULL, s_in, doc_start, c->n_heads, form, c->chunk_size, s_out);
    return gla_layer_out(tp, m->impl, o, gz);
}

static Tensor *linear_forward(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, Tensor *s_in, Tensor **s_out) {
    Tensor *q, *k, *v, *gz;
    gla_layer_qkv(tp, m->impl, NULL, u, doc_start, &q, &k, &v, &gz);
    return linear_mix(tp, m, gz, q, k, v, doc_start, s_in, m->cfg.form, s_out);
}

static void *linear_cache_new(const Mixer *m, int B, int max_T, Device dev) {
    (void)max_T;   // constant memory
    return gla_cache_new(m->impl, &m->cfg, B, dev);
}

static Tensor *linear_step(Tape *tp, Mixer *m, void *cache, Tensor *u) {
    ASSERT(u->ndim == 3 && u->shape[1] == 1, "linear step: u must be (B, 1, D), got %s", SHAPE(u));
    GlaCache *c = cache;
    ASSERT(c->dev == tp->device, "%s step: a %s cache on a %s tape", m->kind->name, device_name(c->dev),
           device_name(tp->device));
    Tensor *q, *k, *v, *gz, *s;
    gla_layer_qkv(tp, m->impl, c, u, NULL, &q, &k, &v, &gz);
    Tensor *y = linear_mix(tp, m, gz, q, k, v, NULL, c->S, MIXER_FORM_RECURRENT, &s);
    dev_copy(c->dev, c->S->data, s->data, (size_t)s->numel * sizeof(real));
    return y;
}

static void linear_cache_reset(const Mixer *m, void *cache, int b) { gla_cache_reset(m->impl, cache, b); }

static Tensor *linear_forward_carry(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, void *cache) {
    GlaCache *c = cache;
    Tensor *q, *k, *v, *gz, *s, *s_in = gla_cache_state_in(tp, c, u);
    gla_layer_qkv_carry(tp, m->impl, c, u, doc_start, &q, &k, &v, &gz);
    Tensor *y = linear_mix(tp, m, gz, q, k, v, doc_start, s_in, m->cfg.form, &s);
    dev_copy(c->dev, c->S->data, s->data, (size_t)s->numel * sizeof(real));
    return y;
}

static int linear_cache_state(const Mixer *m, void *cache, real **bufs, int64_t *sizes) {
    return gla_cache_buffers(m->impl, cache, bufs, sizes);
}

const MixerKind MIXER_LINEAR = {
    .name = "linear",
    .recurrent = true,
    .create = linear_create,
    .forward = linear_forward,
    .cache_new = linear_cache_new,
    .cache_free = gla_cache_free,
    .step = linear_step,
    .cache_reset = linear_cache_reset,
    .forward_carry = linear_forward_carry,
    .cache_state = linear_cache_state,
    .destroy = linear_destroy,
    .forms = MIXER_FORMS_LINEAR_FAMILY | (1u << MIXER_FORM_PARALLEL),
};
