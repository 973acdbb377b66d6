// export_gguf_qwen35.c: a hybrid of `gdn` and `attn` layers, or a stack of
// `gdn` layers alone, as llama.cpp's `qwen35` architecture (Qwen3.5: Gated
// DeltaNet + gated softmax attention + SwiGLU), computing what attnlab
// computes. A stack of gdn layers alone is written with the pass-through
// block after them (export_gguf_internal.h): qwen35 needs an attention layer.
//
// Per layer, as llama.cpp's qwen35 graph (src/models/qwen35.cpp) reads it:
//   attn_norm, post_attention_norm   norm1, norm2 (x * w, pre-norm blocks)
// gdn (`attention.recurrent_layers` marks it):
//   attn_qkv   {D, 2 H dk + H dv}  [Wq | Wk | Wv]: the three projections in one
//   ssm_conv1d {K, 2 H dk + H dv}  [conv_q; conv_k; conv_v], one row of K taps
//              per channel, oldest first, as attnlab's (C, K): ggml_ssm_conv's
//              out[t] = sum_i x[t - K + 1 + i] w[i], then SiLU
//   q, k       L2-normalised per head as x / sqrt(|x|^2 + eps) with eps the
//              RMSNorm epsilon (attnlab's L2 norm adds 1e-6: needs norm_eps
//              = 1e-6); the delta rule scales q by 1/sqrt(dk), as attnlab
//   ssm_beta   {D, H}  w_beta (beta = sigmoid(u w_beta))
//   ssm_alpha  {D, H}  w_dt, ssm_dt.bias = dt_bias, ssm_a = -exp(A_log):
//              g = ssm_a * softplus(u w_dt + dt_bias)
//   ssm_norm   {dv}    out_norm, applied as x * w per head (the converter's +1
//              for Qwen's (1 + w) norms is not applied to this one, and
//              llama.cpp multiplies by the gain as stored), then
//   attn_gate  {D, H dv}  wg: o * silu(u Wg)
//   ssm_out    Wo
//   Key and value heads are both H (ssm.group_count = ssm.time_step_rank),
//   and the state is dv x dv: needs d_k = d_v.
// attn (qk_norm and attn_gate on):
//   attn_q     {D, 2 H dk}  per head h: its q columns, then its gate columns
//   attn_k, attn_v, attn_output; attn_q_norm, attn_k_norm {dk} (RMSNorm per
//              head, before RoPE)
//   RoPE: attnlab rotates interleaved pairs (2i, 2i+1) by pos * base^(-2i/dk);
//   qwen35 rotates halves (i, i + dk/2) (IMROPE) with the same frequencies.
//   Writing each head's q and k columns (and their norm gains) in the order
//   0, 2, 4, ..., 1, 3, 5, ... turns one rotation into the other and leaves
//   q.k unchanged. With rope.dimension_count = dk and sections that give
//   every pair of dimensions the text position (llama.cpp repeats a text
//   token's position in the first three of its four position streams) the
//   rotation is plain RoPE.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export_gguf_internal.h"

// The epsilon of attnlab's L2 norm of q and k (op_l2norm_heads, ops_norm.c).
#define GDN_L2_EPS 1e-6

Status gguf_qwen35_check(const TrainConfig *cfg) {
    const int n = cfg->model.layers.n;
    int n_attn = 0;
    for (int l = 0; l < n; l++) n_attn += strcmp(cfg->model.layers.name[l], "attn") == 0;
    if (n_attn == n)
        return status_err("qk_norm = %s, attn_gate = %s in a model of 'attn' layers only: llama.cpp's 'llama' "
                          "architecture has neither option, and its 'qwen35', which has both, fails without a gdn "
                          "layer; train without them (or with a 'gdn' layer and both on) to export",
                          cfg->model.qk_norm ? "true" : "false", cfg->model.attn_gate ? "true" : "false");
    // (A model without 'attn' layers has neither option: the pass-through block is ours, with both.)
    if (n_attn > 0 && !cfg->model.qk_norm)
        return status_err("the model's 'attn' layers have no q/k norm: llama.cpp's 'qwen35' architecture (a "
                          "gdn/attn hybrid) always applies a per-head RMSNorm to q and k; train with [model] "
                          "qk_norm = true to export");
    if (n_attn > 0 && !cfg->model.attn_gate)
        return status_err("the model's 'attn' layers have no output gate: llama.cpp's 'qwen35' architecture (a "
                          "gdn/attn hybrid) always gates attention with sigmoid(u W_gate); train with [model] "
                          "attn_gate = true to export");
    if (cfg->model.d_k != cfg->model.d_v)
        return status_err("d_k = %d and d_v = %d: llama.cpp's 'qwen35' architecture has one head size for keys and "
                          "values (its gdn state is d_v x d_v); train with d_k = d_v to export",
                          cfg->model.d_k, cfg->model.d_v);
    if (cfg->model.conv_size == 0)
        return status_err("conv_size = 0: gdn then has no short convolution and no SiLU, and llama.cpp's 'qwen35' "
                          "architecture always applies both; train with conv_size >= 1 to export");
    if (cfg->model.norm_eps != GDN_L2_EPS)
        return status_err("norm_eps = %g: llama.cpp's 'qwen35' architecture adds the RMSNorm epsilon inside gdn's "
                          "L2 norm of q and k, where attnlab adds %g; train with norm_eps = %g to export",
                          cfg->model.norm_eps, GDN_L2_EPS, GDN_L2_EPS);
    return status_ok();
}

// The outputs of a dense weight, one by one: output j is column col[j] of
// t[j] (attnlab's (in, out) weights, y = u W), written as ggml's {in, n}.
typedef struct Outputs {
    int n, cap;
    const Tensor **t;
    int *col;
} Outputs;

// Columns c0 + order[i] of t for i < count (order NULL: c0 + i).
static void outputs_add(Outputs *o, const Tensor *t, int c0, int count, const int *order) {
    if (o->n + count > o->cap) {
        o->cap = 2 * (o->n + count);
        o->t = xrealloc(o->t, (size_t)o->cap * sizeof *o->t);
        o->col = xrealloc(o->col, (size_t)o->cap * sizeof *o->col);
    }
    for (int i = 0; i < count; i++) {
        o->t[o->n] = t;
        o->col[o->n++] = c0 + (order ? order[i] : i);
    }
}

// Writes the weight and empties o (Q8_0 falls back to float16 for inputs
// not a multiple of 32, as gguf_matrix).
static void outputs_write(Gguf *g, const char *name, Outputs *o, GgufType type) {
    int64_t in = o->t[0]->shape[0];
    float *f = xmalloc((size_t)(in * o->n) * sizeof *f);
    for (int j = 0; j < o->n; j++) {
        const Tensor *t = o->t[j];
        ASSERT(t->ndim == 2 && t->shape[0] == in, "export_gguf: %s mixes inputs of %d and %d", name, t->shape[0],
               (int)in);
        for (int64_t i = 0; i < in; i++) f[j * in + i] = (float)t->data[i * t->shape[1] + o->col[j]];
    }
    if (type == GGUF_Q8_0 && in % 32 != 0) type = GGUF_F16;
    gguf_tensor(g, name, 2, (int64_t[]){in, o->n}, type, f);
    free(f);
    o->n = 0;
}

static const Tensor *param(const ParamStore *ps, int l, const char *what) {
    char fmt[96];
    snprintf(fmt, sizeof fmt, "layers.%%d.%s", what);
    return gguf_param(ps, fmt, l);
}

static void name_of(char *out, size_t n, int l, const char *what) { snprintf(out, n, "blk.%d.%s", l, what); }

// A parameter vector as float32: element i is its element order[i] (order
// NULL: i), and -exp of it with neg_exp (ssm_a from A_log).
static void vector_map(Gguf *g, const char *name, const Tensor *t, const int *order, bool neg_exp) {
    float *f = xmalloc((size_t)t->numel * sizeof *f);
    for (int64_t i = 0; i < t->numel; i++) {
        double x = (double)t->data[order ? order[i] : i];
        f[i] = (float)(neg_exp ? -exp(x) : x);
    }
    gguf_tensor(g, name, 1, (int64_t[]){t->numel}, GGUF_F32, f);
    free(f);
}

static void gdn_layer(Gguf *g, const TrainConfig *cfg, const ParamStore *ps, int l, Outputs *o, GgufType type) {
    int H = cfg->model.n_heads, dk = cfg->model.d_k, dv = cfg->model.d_v, K = cfg->model.conv_size;
    char name[96];
    outputs_add(o, param(ps, l, "mixer.wq"), 0, H * dk, NULL);
    outputs_add(o, param(ps, l, "mixer.wk"), 0, H * dk, NULL);
    outputs_add(o, param(ps, l, "mixer.wv"), 0, H * dv, NULL);
    name_of(name, sizeof name, l, "attn_qkv.weight");
    outputs_write(g, name, o, type);
    // The convolution's taps stay float32: ggml_ssm_conv reads float32 only.
    const Tensor *conv[3] = {param(ps, l, "mixer.conv_q"), param(ps, l, "mixer.conv_k"), param(ps, l, "mixer.conv_v")};
    int64_t C = conv[0]->shape[0] + conv[1]->shape[0] + conv[2]->shape[0], at = 0;
    float *taps = xmalloc((size_t)(C * K) * sizeof *taps);
    for (int i = 0; i < 3; i++)
        for (int64_t j = 0; j < conv[i]->numel; j++) taps[at++] = (float)conv[i]->data[j];
    name_of(name, sizeof name, l, "ssm_conv1d.weight");
    gguf_tensor(g, name, 2, (int64_t[]){K, C}, GGUF_F32, taps);
    free(taps);
    static const struct {
        const char *gguf, *ours;
    } dense[] = {{"ssm_beta.weight", "mixer.w_beta"}, {"ssm_alpha.weight", "mixer.w_dt"},
                 {"attn_gate.weight", "mixer.wg"},    {"ssm_out.weight", "mixer.wo"}};
    for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++) {
        name_of(name, sizeof name, l, dense[i].gguf);
        gguf_matrix(g, name, param(ps, l, dense[i].ours), true, type);
    }
    name_of(name, sizeof name, l, "ssm_dt.bias");
    gguf_vector(g, name, param(ps, l, "mixer.dt_bias"));
    name_of(name, sizeof name, l, "ssm_a");
    vector_map(g, name, param(ps, l, "mixer.A_log"), NULL, true);
    name_of(name, sizeof name, l, "ssm_norm.weight");
    gguf_vector(g, name, param(ps, l, "mixer.out_norm"));
}

static void attn_layer(Gguf *g, const TrainConfig *cfg, const ParamStore *ps, int l, Outputs *o, GgufType type) {
    int H = cfg->model.n_heads, dk = cfg->model.d_k, dv = cfg->model.d_v;
    int *halves = xmalloc((size_t)dk * sizeof *halves);   // the interleaved pairs as halves
    for (int j = 0; j < dk; j++) halves[j] = j < dk / 2 ? 2 * j : 2 * (j - dk / 2) + 1;
    const Tensor *wq = param(ps, l, "mixer.wq"), *wk = param(ps, l, "mixer.wk"), *wgate = param(ps, l, "mixer.w_gate");
    char name[96];
    for (int h = 0; h < H; h++) {
        outputs_add(o, wq, h * dk, dk, halves);
        outputs_add(o, wgate, h * dv, dv, NULL);
    }
    name_of(name, sizeof name, l, "attn_q.weight");
    outputs_write(g, name, o, type);
    for (int h = 0; h < H; h++) outputs_add(o, wk, h * dk, dk, halves);
    name_of(name, sizeof name, l, "attn_k.weight");
    outputs_write(g, name, o, type);
    name_of(name, sizeof name, l, "attn_v.weight");
    gguf_matrix(g, name, param(ps, l, "mixer.wv"), true, type);
    name_of(name, sizeof name, l, "attn_output.weight");
    gguf_matrix(g, name, param(ps, l, "mixer.wo"), true, type);
    name_of(name, sizeof name, l, "attn_q_norm.weight");
    vector_map(g, name, param(ps, l, "mixer.q_norm"), halves, false);
    name_of(name, sizeof name, l, "attn_k_norm.weight");
    vector_map(g, name, param(ps, l, "mixer.k_norm"), halves, false);
    free(halves);
}

// qwen35's keys beyond those every architecture has (gguf_common_metadata).
static void qwen35_metadata(Gguf *g, const TrainConfig *cfg, bool pass) {
    int L = cfg->model.layers.n, H = cfg->model.n_heads, pairs = (pass ? GGUF_PASS_HEAD_DIM : cfg->model.d_k) / 2;
    // IMROPE gives pair i the position stream i % 3 while i < 3 sections[i % 3]
    // (pairs counted modulo the sections' sum), the 4th stream (0 for text)
    // after: sections summing to the pairs, as even as can be, cover them all.
    int32_t sections[4] = {(pairs + 2) / 3, (pairs + 1) / 3, pairs / 3, 0};
    gguf_kv_i32s(g, "qwen35.rope.dimension_sections", sections, 4);
    gguf_kv_u32(g, "qwen35.ssm.conv_kernel", (uint32_t)cfg->model.conv_size);
    gguf_kv_u32(g, "qwen35.ssm.inner_size", (uint32_t)(H * cfg->model.d_v));
    gguf_kv_u32(g, "qwen35.ssm.state_size", (uint32_t)cfg->model.d_k);
    gguf_kv_u32(g, "qwen35.ssm.time_step_rank", (uint32_t)H);
    gguf_kv_u32(g, "qwen35.ssm.group_count", (uint32_t)H);
    int32_t *recurrent = xcalloc((size_t)L + pass, sizeof *recurrent);   // the pass-through block attends
    for (int l = 0; l < L; l++) recurrent[l] = strcmp(cfg->model.layers.name[l], "gdn") == 0;
    gguf_kv_i32s(g, "qwen35.attention.recurrent_layers", recurrent, (size_t)L + pass);
    free(recurrent);
}

// Block l = L, the pass-through block (export_gguf_internal.h) as a qwen35
// attention layer: its q/gate, k, v and output weights 0 (the gate's 0 gives
// sigmoid(0) = 1/2 times a zero output), its q/k norm gains 1.
static void pass_through_block(Gguf *g, const TrainConfig *cfg, int l) {
    int64_t D = cfg->model.d_model, F = cfg->model.d_ff, hd = GGUF_PASS_HEAD_DIM, H = GGUF_PASS_HEADS;
    const GgufConstant block[] = {{"attn_norm", {D, 0}, 1},          {"post_attention_norm", {D, 0}, 1},
                                  {"attn_q", {D, 2 * H * hd}, 0},    {"attn_k", {D, H * hd}, 0},
                                  {"attn_v", {D, H * hd}, 0},        {"attn_output", {H * hd, D}, 0},
                                  {"attn_q_norm", {hd, 0}, 1},       {"attn_k_norm", {hd, 0}, 1},
                                  {"ffn_gate", {D, F}, 0},           {"ffn_up", {D, F}, 0},
                                  {"ffn_down", {F, D}, 0}};
    gguf_constant_block(g, l, block, sizeof block / sizeof block[0]);
}

void gguf_qwen35(Gguf *g, const TrainConfig *cfg, const ParamStore *ps, GgufType type) {
    bool pass = gguf_pass_through("qwen35", cfg);
    qwen35_metadata(g, cfg, pass);
    Outputs o = {0};
    for (int l = 0; l < cfg->model.layers.n; l++) {
        char name[96];
        name_of(name, sizeof name, l, "attn_norm.weight");
        gguf_vector(g, name, param(ps, l, "norm1"));
        name_of(name, sizeof name, l, "post_attention_norm.weight");
        gguf_vector(g, name, param(ps, l, "norm2"));
        if (strcmp(cfg->model.layers.name[l], "gdn") == 0)
            gdn_layer(g, cfg, ps, l, &o, type);
        else
            attn_layer(g, cfg, ps, l, &o, type);
        gguf_mlp(g, ps, l, type);
    }
    if (pass) pass_through_block(g, cfg, cfg->model.layers.n);
    free(o.t);
    free(o.col);
}
