#include "lm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "docs.h"
#include "mixer_common.h"

Status lm_parse_layers(LMConfig *cfg, const char *list) {
    cfg->n_layers = 0;
    const char *p = list;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        const char *e = p;
        while (*e && *e != ',' && *e != ' ') e++;
        size_t len = (size_t)(e - p);
        if (cfg->n_layers == LM_MAX_LAYERS) return status_err("more than %d layers", LM_MAX_LAYERS);
        if (len >= sizeof cfg->layers[0]) return status_err("layer name '%.*s' is too long", (int)len, p);
        char name[16];
        memcpy(name, p, len);
        name[len] = 0;
        if (!mixer_kind_find(name))
            return status_err("layer %d: unknown mixer '%s' (known: %s)", cfg->n_layers, name, mixer_kind_names());
        memcpy(cfg->layers[cfg->n_layers++], name, len + 1);
        p = e;
    }
    if (cfg->n_layers == 0) return status_err("no layers given");
    return status_ok();
}

// Sizes beyond which a tensor's element count or a loop index would leave
// int32 (the kernels index rows and columns with int).
#define LM_MAX_TENSOR ((int64_t)INT32_MAX)

const char *lm_config_check(const LMConfig *c, int64_t rows, char *why, size_t n) {
    bool form_used = false, attn_used = false, gdp_used = false, kda_used = false;
    for (int l = 0; l < c->n_layers; l++) {
        const char *key = mixer_config_check(c->layers[l], &c->mixer, why, n);
        if (key) {
            char msg[300];
            snprintf(msg, sizeof msg, "%s", why);
            snprintf(why, n, "layer %d: %s", l, msg);
            return key;
        }
        form_used |= mixer_kind_find(c->layers[l])->forms != 0;
        attn_used |= strcmp(c->layers[l], "attn") == 0 || strcmp(c->layers[l], "attn_dsa") == 0;
        gdp_used |= strcmp(c->layers[l], "gdp") == 0;
        kda_used |= strcmp(c->layers[l], "kda") == 0;
    }
    // An option that shapes only some mixers, set to other than its default
    // without one of them among the layers, would be a silent no-op.
    char gdp_val[32];
    snprintf(gdp_val, sizeof gdp_val, "%d", c->mixer.gdp_steps);
    const struct {
        const char *key, *value;   // value as the message says it
        bool set, used;
        const char *which;         // the layers it shapes
    } only[] = {
        {"gdp_steps", gdp_val, c->mixer.gdp_steps != 2, gdp_used, "is gdp"},
        {"kda_gate_bias", "false", !c->mixer.kda_gate_bias, kda_used, "is kda"},
        {"qk_norm", "true", c->mixer.qk_norm, attn_used, "is attn or attn_dsa"},
        {"attn_gate", "true", c->mixer.attn_gate, attn_used, "is attn or attn_dsa"},
        {"form", mixer_form_name(c->mixer.form), c->mixer.form != MIXER_FORM_CHUNKED, form_used,
         "has training forms to choose between (only linear, mamba, mamba2, gdn, gdp and kda do)"},
    };
    for (size_t i = 0; i < sizeof only / sizeof only[0]; i++)
        if (only[i].set && !only[i].used) {
            snprintf(why, n, "%s = %s has no effect: none of the layers (%s...) %s; remove the key", only[i].key,
                     only[i].value, c->layers[0], only[i].which);
            return only[i].key;
        }
    // Every tensor of a step must stay within int32 elements.
    const MixerConfig *m = &c->mixer;
    int64_t D = c->d_model, F = c->d_ff, V = c->vocab_size, H = m->n_heads;
    int64_t widest = D;
    int64_t steps = gdp_used ? m->gdp_steps : 1;   // gdp's wk, wv: n_h blocks of H*dk, H*dv
    const int64_t widths[] = {F, V, steps * H * m->d_k, steps * H * m->d_v, (int64_t)m->index_heads * m->index_dim};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        if (widths[i] > widest) widest = widths[i];
    if (D * F > LM_MAX_TENSOR || D * widest > LM_MAX_TENSOR || V * D > LM_MAX_TENSOR) {
        snprintf(why, n, "a weight of %lld x %lld elements is more than this build's %lld per tensor",
                 (long long)D, (long long)widest, (long long)LM_MAX_TENSOR);
        return "d_model";
    }
    if (rows * widest > LM_MAX_TENSOR || rows * m->topk > LM_MAX_TENSOR) {
        snprintf(why, n, "batch_size x seq_len = %lld rows of up to %lld numbers is more than %lld per tensor",
                 (long long)rows, (long long)(widest > m->topk ? widest : m->topk), (long long)LM_MAX_TENSOR);
        return "seq_len";
    }
    return NULL;
}

void lm_create(LM *lm, const LMConfig *cfg, ParamStore *ps) {
    memset(lm, 0, sizeof *lm);
    lm->cfg = *cfg;
    int V = cfg->vocab_size, D = cfg->d_model, F = cfg->d_ff, L = cfg->n_layers;
    ASSERT(V > 0 && D > 0 && F > 0 && L > 0 && L <= LM_MAX_LAYERS, "lm_create: V %d, D %d, F %d, L %d", V, D,
           F, L);
    double in_std = 1.0 / sqrt((double)D);
    // Residual branches end in a projection scaled down by sqrt(2L) (GPT-2's recipe).
    double res_scale = 1.0 / sqrt(2.0 * L);
    lm->embed = params_add(ps, "embed", 2, (int[]){V, D}, init_normal(cfg->tied ? in_std : 1.0), 0);
    MixerConfig mc = cfg->mixer;
    mc.d_model = D;
    mc.out_std = res_scale / sqrt((double)(mc.n_heads * mc.d_v));
    char prefix[64];
    for (int l = 0; l < L; l++) {
        LMBlock *b = &lm->blocks[l];
        snprintf(prefix, sizeof prefix, "layers.%d.norm1", l);
        b->norm1 = params_add(ps, prefix, 1, (int[]){D}, init_ones(), TENSOR_NO_DECAY);
        snprintf(prefix, sizeof prefix, "layers.%d.mixer.", l);
        b->mixer = mixer_create(cfg->layers[l], &mc, ps, prefix);
        snprintf(prefix, sizeof prefix, "layers.%d.norm2", l);
        b->norm2 = params_add(ps, prefix, 1, (int[]){D}, init_ones(), TENSOR_NO_DECAY);
        snprintf(prefix, sizeof prefix, "layers.%d.mlp.", l);
        b->w1 = param_linear(ps, prefix, "w1", D, F, in_std);
        b->w3 = param_linear(ps, prefix, "w3", D, F, in_std);
        b->w2 = param_linear(ps, prefix, "w2", F, D, res_scale / sqrt((double)F));
    }
    lm->norm_f = params_add(ps, "norm_f", 1, (int[]){D}, init_ones(), TENSOR_NO_DECAY);
    lm->lm_head = cfg->tied ? NULL : params_add(ps, "lm_head", 2, (int[]){D, V}, init_normal(in_std), 0);
}

void lm_destroy(LM *lm) {
    for (int l = 0; l < lm->cfg.n_layers; l++) mixer_destroy(lm->blocks[l].mixer);
    memset(lm, 0, sizeof *lm);
}

static Tensor *mlp_forward(Tape *tp, const LMBlock *b, Tensor *u) {
    Tensor *x[2];   // a = u W1 and c = u W3, in one node
    op_matmul_multi(tp, u, (Tensor *[]){b->w1, b->w3}, 2, x);
    return op_matmul(tp, op_silu_mul(tp, x[0], x[1]), b->w2, false, false);   // silu(a) * c
}

// Logits from the final normed residual stream h = RMSNorm(x) norm_f.
static Tensor *head_forward(Tape *tp, const LM *lm, Tensor *h) {
    return lm->lm_head ? op_matmul(tp, h, lm->lm_head, false, false) : op_matmul(tp, h, lm->embed, false, true);
}

// The norm that reads the residual stream after block l: the next block's
// first norm, or norm_f after the last block.
static Tensor *norm_after(const LM *lm, int l) {
    return l + 1 < lm->cfg.n_layers ? lm->blocks[l + 1].norm1 : lm->norm_f;
}

static bool is_dsa(const Mixer *m) { return strcmp(m->kind->name, "attn_dsa") == 0; }

// The mean of the KLs the attn_dsa layers recorded in this forward, or NULL.
static Tensor *collect_kl(Tape *tp, const LM *lm, int n_layers) {
    Tensor *sum = NULL;
    int n = 0;
    for (int l = 0; l < n_layers; l++) {
        const Mixer *m = lm->blocks[l].mixer;
        Tensor *kl = is_dsa(m) ? attn_dsa_last_kl(m) : NULL;
        if (!kl) continue;
        sum = sum ? op_add(tp, sum, kl) : kl;
        n++;
    }
    return n > 1 ? op_scale(tp, sum, 1.0 / n) : sum;
}

// Blocks 0 .. n_layers-1 over x (pre-norm: h = x + mixer(norm1(x)), then
// x' = h + mlp(norm2(h))). Each residual add is fused with the norm that
// reads its sum (op_add_rmsnorm). Returns the stream after block n_layers-1
// normed by norm_after(it); the last block stops after its mixer when
// `last_mixer_only` (NULL is returned then: the caller wants the KL).
static Tensor *run_blocks(Tape *tp, LM *lm, Tensor *x, int n_layers, bool last_mixer_only, const int *doc_start,
                          Tensor *const *states_in, Tensor **states_out, LMCache *carry) {
    double eps = lm->cfg.norm_eps;
    Tensor *u = op_rmsnorm(tp, x, lm->blocks[0].norm1, eps);
    for (int l = 0; l < n_layers; l++) {
        LMBlock *b = &lm->blocks[l];
        Tensor *s_in = states_in ? states_in[l] : NULL;
        Tensor **s_out = states_out && b->mixer->kind->recurrent ? &states_out[l] : NULL;
        if (states_out && !b->mixer->kind->recurrent) states_out[l] = NULL;
        const MixerKind *k = b->mixer->kind;
        Tensor *y = carry && k->forward_carry ? k->forward_carry(tp, b->mixer, u, doc_start, carry->mixer[l])
                                              : k->forward(tp, b->mixer, u, doc_start, s_in, s_out);
        if (last_mixer_only && l == n_layers - 1) return NULL;
        Tensor *h;
        Tensor *m = mlp_forward(tp, b, op_add_rmsnorm(tp, x, y, b->norm2, eps, &h));
        u = op_add_rmsnorm(tp, h, m, norm_after(lm, l), eps, &x);
    }
    return u;
}

// One copy of the flags for every layer (the caller's array may change
// later); NULL when nothing is flagged.
static const int *docs_copy(Tape *tp, const int *doc_start, int B, int T) {
    if (!doc_start || !docs_first(tp, doc_start, B, T)) return NULL;
    int *copy = tape_alloc(tp, (size_t)B * T * sizeof(int));
    memcpy(copy, doc_start, (size_t)B * T * sizeof(int));
    return copy;
}

// lm_forward_docs and lm_forward_carry.
static Tensor *forward_all(Tape *tp, LM *lm, const int *tokens, const int *doc_start, int B, int T,
                           Tensor *const *states_in, Tensor **states_out, LMCache *carry) {
    Tensor *x = op_embedding(tp, lm->embed, tokens, 2, (int[]){B, T});
    const int *docs = docs_copy(tp, doc_start, B, T);
    Tensor *h = run_blocks(tp, lm, x, lm->cfg.n_layers, false, docs, states_in, states_out, carry);
    lm->dsa_kl = collect_kl(tp, lm, lm->cfg.n_layers);
    return head_forward(tp, lm, h);
}

Tensor *lm_forward_docs(Tape *tp, LM *lm, const int *tokens, const int *doc_start, int B, int T,
                        Tensor *const *states_in, Tensor **states_out) {
    return forward_all(tp, lm, tokens, doc_start, B, T, states_in, states_out, NULL);
}

Tensor *lm_forward_carry(Tape *tp, LM *lm, const int *tokens, const int *doc_start, int B, int T, LMCache *carry) {
    ASSERT(carry && carry->B == B, "lm_forward_carry: the carry holds %d rows, the window %d", carry ? carry->B : 0, B);
    ASSERT(carry->device == tp->device, "lm_forward_carry: a %s carry on a %s tape", device_name(carry->device),
           device_name(tp->device));
    return forward_all(tp, lm, tokens, doc_start, B, T, NULL, NULL, carry);
}

Tensor *lm_loss_carry(Tape *tp, LM *lm, const int *tokens, const int *targets, const int *doc_start, int B, int T,
                      LMCache *carry, Tensor **logits_out) {
    Tensor *logits = lm_forward_carry(tp, lm, tokens, doc_start, B, T, carry);
    if (logits_out) *logits_out = logits;
    return op_cross_entropy(tp, logits, targets);
}

int lm_carry_buffers(const LM *lm, LMCache *carry, real **bufs, int64_t *sizes, int max) {
    int n = 0;
    for (int l = 0; l < lm->cfg.n_layers; l++) {
        const Mixer *m = lm->blocks[l].mixer;
        if (!m->kind->cache_state) continue;
        real *b[4];
        int64_t s[4];
        int k = m->kind->cache_state(m, carry->mixer[l], b, s);
        ASSERT(n + k <= max, "lm_carry_buffers: more than %d buffers", max);
        for (int i = 0; i < k; i++) bufs[n + i] = b[i], sizes[n + i] = s[i];
        n += k;
    }
    return n;
}

Tensor *lm_forward(Tape *tp, LM *lm, const int *tokens, int B, int T, Tensor *const *states_in,
                   Tensor **states_out) {
    return lm_forward_docs(tp, lm, tokens, NULL, B, T, states_in, states_out);
}

Tensor *lm_distill_loss(Tape *tp, LM *lm, const int *tokens, int B, int T) {
    return lm_distill_loss_docs(tp, lm, tokens, NULL, B, T);
}

Tensor *lm_distill_loss_docs(Tape *tp, LM *lm, const int *tokens, const int *doc_start, int B, int T) {
    int last = -1;
    for (int l = 0; l < lm->cfg.n_layers; l++)
        if (is_dsa(lm->blocks[l].mixer)) {
            attn_dsa_set_mode(lm->blocks[l].mixer, DSA_DISTILL);
            last = l;
        }
    ASSERT(last >= 0, "lm_distill_loss: the model has no attn_dsa layer");
    Tensor *x = op_embedding(tp, lm->embed, tokens, 2, (int[]){B, T});
    run_blocks(tp, lm, x, last + 1, true, docs_copy(tp, doc_start, B, T), NULL, NULL, NULL);
    lm->dsa_kl = collect_kl(tp, lm, last + 1);
    return lm->dsa_kl;
}

int lm_dsa_count(const LM *lm) {
    int n = 0;
    for (int l = 0; l < lm->cfg.n_layers; l++) n += is_dsa(lm->blocks[l].mixer);
    return n;
}

void lm_set_dsa_mode(LM *lm, DsaMode mode) {
    for (int l = 0; l < lm->cfg.n_layers; l++)
        if (is_dsa(lm->blocks[l].mixer)) attn_dsa_set_mode(lm->blocks[l].mixer, mode);
}

double lm_dsa_mass(const LM *lm) {
    double sum = 0;
    int n = 0;
    for (int l = 0; l < lm->cfg.n_layers; l++)
        if (is_dsa(lm->blocks[l].mixer)) {
            sum += attn_dsa_last_mass(lm->blocks[l].mixer);
            n++;
        }
    return n ? sum / n : NAN;
}

Tensor *lm_loss_docs(Tape *tp, LM *lm, const int *tokens, const int *targets, const int *doc_start, int B, int T,
                     Tensor **logits_out) {
    Tensor *logits = lm_forward_docs(tp, lm, tokens, doc_start, B, T, NULL, NULL);
    if (logits_out) *logits_out = logits;
    return op_cross_entropy(tp, logits, targets);
}

Tensor *lm_loss(Tape *tp, LM *lm, const int *tokens, const int *targets, int B, int T, Tensor **logits_out) {
    return lm_loss_docs(tp, lm, tokens, targets, NULL, B, T, logits_out);
}

LMCache *lm_cache_new_on(const LM *lm, int B, int max_T, Device d) {
    LMCache *c = xcalloc(1, sizeof *c);
    c->B = B;
    c->max_T = max_T;
    c->device = d;
    c->prefill_window = d == DEVICE_CPU ? LM_PREFILL_WINDOW : LM_PREFILL_WINDOW_GPU;
    for (int l = 0; l < lm->cfg.n_layers; l++) {
        const Mixer *m = lm->blocks[l].mixer;
        c->mixer[l] = m->kind->cache_new(m, B, max_T, d);
    }
    return c;
}

LMCache *lm_cache_new(const LM *lm, int B, int max_T) { return lm_cache_new_on(lm, B, max_T, DEVICE_CPU); }

void lm_cache_free(const LM *lm, LMCache *c) {
    if (!c) return;
    for (int l = 0; l < lm->cfg.n_layers; l++) lm->blocks[l].mixer->kind->cache_free(c->mixer[l]);
    free(c);
}

void lm_cache_reset_row(const LM *lm, LMCache *c, int b) {
    ASSERT(b >= 0 && b < c->B, "lm_cache_reset_row: row %d of %d", b, c->B);
    for (int l = 0; l < lm->cfg.n_layers; l++) {
        const Mixer *m = lm->blocks[l].mixer;
        m->kind->cache_reset(m, c->mixer[l], b);
    }
}

Tensor *lm_step(Tape *tp, LM *lm, LMCache *c, const int *tokens) {
    ASSERT(!tape_grad_enabled(tp), "lm_step: decode on a tape in no-grad mode (tape_no_grad_push)");
    ASSERT(c->pos < c->max_T, "lm_step: the cache holds %d positions and is full", c->max_T);
    ASSERT(c->device == tp->device, "lm_step: a %s cache on a %s tape", device_name(c->device),
           device_name(tp->device));
    double eps = lm->cfg.norm_eps;
    Tensor *x = op_embedding(tp, lm->embed, tokens, 2, (int[]){c->B, 1});
    Tensor *u = op_rmsnorm(tp, x, lm->blocks[0].norm1, eps);
    for (int l = 0; l < lm->cfg.n_layers; l++) {   // as run_blocks, one position
        LMBlock *b = &lm->blocks[l];
        Tensor *y = b->mixer->kind->step(tp, b->mixer, c->mixer[l], u);
        Tensor *h;
        Tensor *m = mlp_forward(tp, b, op_add_rmsnorm(tp, x, y, b->norm2, eps, &h));
        u = op_add_rmsnorm(tp, h, m, norm_after(lm, l), eps, &x);
    }
    c->pos++;
    return head_forward(tp, lm, u);
}

// Layer l over a window by its steps: u (B, T0, D) -> (B, T0, D) on tp.
static Tensor *step_window(Tape *tp, const Mixer *m, void *cache, Tensor *u) {
    int B = u->shape[0], T0 = u->shape[1], D = u->shape[2];
    Tensor *y = tape_tensorv(tp, 3, B, T0, D), *ut = tape_tensorv(tp, 3, B, 1, D);
    size_t w = (size_t)D * sizeof(real);
    for (int t = 0; t < T0; t++) {   // row b's position t in and out
        dev_copy2d(tp->device, ut->data, w, u->data + (int64_t)t * D, (size_t)T0 * w, w, (size_t)B);
        Tensor *yt = m->kind->step(tp, (Mixer *)m, cache, ut);
        dev_copy2d(tp->device, y->data + (int64_t)t * D, (size_t)T0 * w, yt->data, w, w, (size_t)B);
    }
    return y;
}

// lm_prefill, and with `all` lm_prefill_all.
static Tensor *prefill(Tape *tp, LM *lm, LMCache *c, const int *tokens, int T, bool all) {
    ASSERT(!tape_grad_enabled(tp), "lm_prefill: decode on a tape in no-grad mode (tape_no_grad_push)");
    ASSERT(T >= 1 && c->pos + T <= c->max_T, "lm_prefill: %d positions into a cache of %d that holds %d", T,
           c->max_T, c->pos);
    ASSERT(c->device == tp->device, "lm_prefill: a %s cache on a %s tape", device_name(c->device),
           device_name(tp->device));
    ASSERT(c->prefill_window >= 1, "lm_prefill: window %d", c->prefill_window);
    int B = c->B, D = lm->cfg.d_model, W = imin(T, c->prefill_window);
    double eps = lm->cfg.norm_eps;
    // Layer l runs on own[l % 2]: only two layers' activations are alive at a time.
    Tape own[2];
    for (int i = 0; i < 2; i++) tape_init_on(&own[i], tp->device), tape_no_grad_push(&own[i]);
    int *win = xmalloc((size_t)B * W * sizeof(int));
    int V = lm->cfg.vocab_size;
    // Each row's last position normed by norm_f, or every position's logits.
    Tensor *out = all ? tape_tensorv(tp, 3, B, T, V) : tape_tensorv(tp, 3, B, 1, D);
    for (int t0 = 0; t0 < T; t0 += W) {
        int T0 = imin(W, T - t0);
        for (int b = 0; b < B; b++)
            memcpy(win + (int64_t)b * T0, tokens + (int64_t)b * T + t0, (size_t)T0 * sizeof(int));
        tape_reset(&own[0]);
        Tensor *x = op_embedding(&own[0], lm->embed, win, 2, (int[]){B, T0});
        Tensor *u = op_rmsnorm(&own[0], x, lm->blocks[0].norm1, eps);
        for (int l = 0; l < lm->cfg.n_layers; l++) {   // as run_blocks
            Tape *t = &own[l % 2];
            if (l >= 1) tape_reset(t);   // layer l-2's; layer l reads layer l-1's x and u on the other tape
            LMBlock *b = &lm->blocks[l];
            const MixerKind *k = b->mixer->kind;
            Tensor *y = k->forward_carry ? k->forward_carry(t, b->mixer, u, NULL, c->mixer[l])
                        : k->prefill     ? k->prefill(t, b->mixer, c->mixer[l], u)
                                         : NULL;
            if (!y) y = step_window(t, b->mixer, c->mixer[l], u);
            Tensor *h;
            Tensor *m = mlp_forward(t, b, op_add_rmsnorm(t, x, y, b->norm2, eps, &h));
            u = op_add_rmsnorm(t, h, m, norm_after(lm, l), eps, &x);
        }
        if (all) {   // the window's logits to columns t0 .. t0+T0-1 of out
            Tensor *lg = head_forward(&own[(lm->cfg.n_layers - 1) % 2], lm, u);
            size_t w = (size_t)T0 * V * sizeof(real);
            dev_copy2d(tp->device, out->data + (int64_t)t0 * V, (size_t)T * V * sizeof(real), lg->data, w, w,
                       (size_t)B);
        } else {
            size_t w = (size_t)D * sizeof(real);
            dev_copy2d(tp->device, out->data, w, u->data + (int64_t)(T0 - 1) * D, (size_t)T0 * w, w, (size_t)B);
        }
        c->pos += T0;
    }
    free(win);
    for (int i = 0; i < 2; i++) tape_no_grad_pop(&own[i]), tape_free(&own[i]);
    return all ? out : head_forward(tp, lm, out);
}

Tensor *lm_prefill(Tape *tp, LM *lm, LMCache *c, const int *tokens, int T) {
    return prefill(tp, lm, c, tokens, T, false);
}

Tensor *lm_prefill_all(Tape *tp, LM *lm, LMCache *c, const int *tokens, int T) {
    return prefill(tp, lm, c, tokens, T, true);
}
