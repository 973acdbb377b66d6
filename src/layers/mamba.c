// mamba.c: the `mamba` mixer (MODEL.md "mamba"): gated linear attention with
// a skip, Mamba-2 style.
//   q, k, v = SiLU(conv(u W)); q scaled 1/sqrt(dk) (no L2 norm)
//   dt_t = softplus(u_t w_dt + dt_bias),  g_t = −exp(A_log) dt_t  (per head)
//   S_t = exp(g_t) S_{t-1} + dt_t k_t v_tᵀ,  o_t = S_tᵀ q_t + D ⊙ v_t
//   y = (RMSNorm_head(o) ⊙ SiLU(u Wg)) Wo
// The dt scaling of k is fused into the kernel (op_gla_dt).
//
// The `mamba2` mixer (MODEL.md "mamba2") is Mamba-2 as llama.cpp's `mamba2`
// and `granitehybrid` compute it, on the same recurrence and parameters:
//   no scale on q (C); o_t = S_tᵀ q_t + D_h v_t with a scalar D_h per head;
//   y = (RMSNorm_head(o ⊙ SiLU(u Wg)) ⊙ w) Wo, the norm after the gate, per
//   head (llama.cpp's n_group = H, as B and C are per head here), w (H*dv).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gla_layer.h"

typedef struct Mamba {
    GlaLayer L;
    Tensor *w_dt;      // (D, H)
    Tensor *dt_bias;   // (H) softplus⁻¹(dt0), dt0 log-uniform in [1e-3, 1e-1]
    Tensor *A_log;     // (H) log(a), a uniform in [1, 16]
    Tensor *D;         // (H, dv) the skip, init 1; mamba2: (H)
    bool v2;           // mamba2
} Mamba;

static void mamba_new(Mixer *m, ParamStore *ps, const char *prefix, bool v2) {
    const MixerConfig *c = &m->cfg;
    Mamba *M = xcalloc(1, sizeof *M);
    M->v2 = v2;
    gla_layer_create_gain(&M->L, ps, prefix, c, v2 ? c->n_heads * c->d_v : c->d_v);
    int H = c->n_heads;
    M->w_dt = param_linear(ps, prefix, "w_dt", c->d_model, H, 1.0 / sqrt(c->d_model));
    char name[256];
    snprintf(name, sizeof name, "%sdt_bias", prefix);
    M->dt_bias = params_add(ps, name, 1, (int[]){H}, init_fn(init_dt_bias, 1e-3, 1e-1), TENSOR_NO_DECAY);
    snprintf(name, sizeof name, "%sA_log", prefix);
    M->A_log = params_add(ps, name, 1, (int[]){H}, init_fn(init_A_log, 1, 16), TENSOR_NO_DECAY);
    snprintf(name, sizeof name, "%sD", prefix);
    M->D = v2 ? params_add(ps, name, 1, (int[]){H}, init_ones(), TENSOR_NO_DECAY)
              : params_add(ps, name, 2, (int[]){H, c->d_v}, init_ones(), TENSOR_NO_DECAY);
    m->impl = M;
}

static void mamba_create(Mixer *m, ParamStore *ps, const char *prefix) { mamba_new(m, ps, prefix, false); }
static void mamba2_create(Mixer *m, ParamStore *ps, const char *prefix) { mamba_new(m, ps, prefix, true); }

// mamba2's output stage from o = S_tᵀ q_t: + D_h v, then the gate, the
// per-head RMSNorm with a gain per channel, Wo. D (H) is spread over each
// head's dv channels by adding it to a (dv, H) zero constant and
// transposing: broadcasting in attnlab's ops is over leading dimensions.
static Tensor *mamba2_out(Tape *tp, const Mamba *M, const MixerConfig *c, Tensor *o, Tensor *v, Tensor *gz) {
    int H = c->n_heads, dv = c->d_v;
    Tensor *Dc = op_add(tp, tape_tensor_zeros(tp, 2, (int[]){dv, H}), M->D);   // (dv, H)
    Tensor *Dflat = op_reshape(tp, op_transpose(tp, Dc, 0, 1), 1, (int[]){H * dv});
    o = op_add(tp, o, op_mul(tp, v, Dflat));
    Tensor *y = op_rmsnorm_groups(tp, op_silu_mul(tp, gz, o), NULL, dv, c->norm_eps);
    return op_matmul(tp, op_mul(tp, y, M->L.gate.norm_w), M->L.wo, false, false);
}

static void mamba_destroy(Mixer *m) { free(m->impl); }

static Tensor *mamba_mix(Tape *tp, const Mixer *m, Tensor *u, Tensor *gz, Tensor *q, Tensor *k, Tensor *v,
                         const int *doc_start, Tensor *s_in, MixerForm form, Tensor **s_out) {
    const MixerConfig *c = &m->cfg;
    const Mamba *M = m->impl;
    Tensor *dt = op_softplus(tp, op_add(tp, op_matmul(tp, u, M->w_dt, false, false), M->dt_bias));   // (B, T, H)
    Tensor *g = op_mul(tp, dt, op_scale(tp, op_exp(tp, M->A_log), -1.0));                          // (B, T, H)
    if (!M->v2) q = op_scale(tp, q, 1.0 / sqrt(c->d_k));
    Tensor *o = op_gla_dt(tp, q, k, v, g, dt, s_in, doc_start, c->n_heads, form, c->chunk_size, s_out);
    if (M->v2) return mamba2_out(tp, M, c, o, v, gz);
    Tensor *Dflat = op_reshape(tp, M->D, 1, (int[]){c->n_heads * c->d_v});
    o = op_add(tp, o, op_mul(tp, v, Dflat));   // + D ⊙ v
    return gla_layer_out(tp, &M->L, o, gz);
}

static Tensor *mamba_forward(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, Tensor *s_in, Tensor **s_out) {
    Mamba *M = m->impl;
    Tensor *q, *k, *v, *gz;
    gla_layer_qkv(tp, &M->L, NULL, u, doc_start, &q, &k, &v, &gz);
    return mamba_mix(tp, m, u, gz, q, k, v, doc_start, s_in, m->cfg.form, s_out);
}

static void *mamba_cache_new(const Mixer *m, int B, int max_T, Device dev) {
    (void)max_T;   // constant memory
    const Mamba *M = m->impl;
    return gla_cache_new(&M->L, &m->cfg, B, dev);
}

static Tensor *mamba_step(Tape *tp, Mixer *m, void *cache, Tensor *u) {
    ASSERT(u->ndim == 3 && u->shape[1] == 1, "%s step: u must be (B, 1, D), got %s", m->kind->name, SHAPE(u));
    Mamba *M = m->impl;
    GlaCache *c = cache;
    ASSERT(c->dev == tp->device, "%s step: a %s cache on a %s tape", m->kind->name, device_name(c->dev),
           device_name(tp->device));
    Tensor *q, *k, *v, *gz, *s;
    gla_layer_qkv(tp, &M->L, c, u, NULL, &q, &k, &v, &gz);
    Tensor *y = mamba_mix(tp, m, u, gz, q, k, v, NULL, c->S, MIXER_FORM_RECURRENT, &s);
    dev_copy(c->dev, c->S->data, s->data, (size_t)s->numel * sizeof(real));
    return y;
}

static void mamba_cache_reset(const Mixer *m, void *cache, int b) {
    const Mamba *M = m->impl;
    gla_cache_reset(&M->L, cache, b);
}

static Tensor *mamba_forward_carry(Tape *tp, Mixer *m, Tensor *u, const int *doc_start, void *cache) {
    Mamba *M = m->impl;
    GlaCache *c = cache;
    Tensor *q, *k, *v, *gz, *s, *s_in = gla_cache_state_in(tp, c, u);
    gla_layer_qkv_carry(tp, &M->L, c, u, doc_start, &q, &k, &v, &gz);
    Tensor *y = mamba_mix(tp, m, u, gz, q, k, v, doc_start, s_in, m->cfg.form, &s);
    dev_copy(c->dev, c->S->data, s->data, (size_t)s->numel * sizeof(real));
    return y;
}

static int mamba_cache_state(const Mixer *m, void *cache, real **bufs, int64_t *sizes) {
    const Mamba *M = m->impl;
    return gla_cache_buffers(&M->L, cache, bufs, sizes);
}

// What mamba and mamba2 share: all but the name and create.
#define MAMBA_FAMILY                                                                                        \
    .recurrent = true, .forward = mamba_forward, .cache_new = mamba_cache_new, .cache_free = gla_cache_free, \
    .step = mamba_step, .cache_reset = mamba_cache_reset, .forward_carry = mamba_forward_carry,             \
    .cache_state = mamba_cache_state, .destroy = mamba_destroy,                                             \
    .forms = MIXER_FORMS_LINEAR_FAMILY | (1u << MIXER_FORM_PARALLEL)

const MixerKind MIXER_MAMBA = {.name = "mamba", .create = mamba_create, MAMBA_FAMILY};

// One kind apart from `mamba` (not an option of it): its checkpoints, D's
// shape and out_norm's, and what a GGUF export may map differ.
const MixerKind MIXER_MAMBA2 = {.name = "mamba2", .create = mamba2_create, MAMBA_FAMILY};
