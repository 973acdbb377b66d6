// export_gguf_kimi.c: a model of `kda` layers (Kimi Delta Attention) as
// llama.cpp's `kimi-linear` architecture (Kimi Linear: KDA layers beside MLA
// attention, each block with an MLP), computing what attnlab computes.
//
// Only models whose every layer is kda: kimi-linear's attention layers are
// Multi-head Latent Attention without RoPE, which no attnlab layer is. A layer
// is KDA where attention.head_count_kv (one per layer) is 0. Every block's
// MLP is the dense SwiGLU (ffn_gate, ffn_up, ffn_down) because
// leading_dense_block_count is the block count; the MoE keys the loader
// requires are written with values no dense block reads.
//
// The file has one block more than the model, after its layers: the
// pass-through block (export_gguf_internal.h: an attention block whose
// weights are all zero but its norm gains, which llama.cpp needs). Here it is
// MLA in its uncompressed form (attn_q, attn_kv_a_mqa, attn_kv_a_norm,
// attn_kv_b; key_length_mla = 0 turns the compressed cache off) with heads of
// PAD_ROPE + PAD_NOPE key and PAD_V value dimensions: its q, k and v are 0,
// every score is 0, its output is 0 and Wo is 0. The sizes are small and keep
// every view non-empty, with key and value heads of one size (keys of 2 and
// values of 1 stop llama.cpp's graph on GGML_ASSERT(ggml_can_mul_mat)); it
// has H heads, as attention.head_count is also the kda layers' head count,
// so its KV cache costs (PAD_ROPE + PAD_NOPE + PAD_V) H floats per position.
//
// Per layer, as llama.cpp's graph (src/models/kimi-linear.cpp, the delta rule
// of delta-net-base.cpp and ggml's fused gated_delta_net) reads it:
//   attn_norm, ffn_norm, ffn_gate/up/down   norm1, norm2, the MLP
//   attn_q, attn_k, attn_v  {D, H dk}  Wq, Wk, Wv (one head size: d_k = d_v)
//   ssm_conv1d_q/k/v {K, 1, H dk}  conv_q, conv_k, conv_v: one row of K taps
//              per channel, oldest first, as attnlab's (C, K); ggml_ssm_conv's
//              out[t] = sum_i x[t - K + 1 + i] w[i], then SiLU; float32, as
//              ggml_ssm_conv reads it
//   q, k       L2-normalised per head as x / sqrt(|x|^2 + eps) with eps the
//              RMSNorm epsilon (attnlab's L2 norm adds 1e-6: needs norm_eps
//              = 1e-6); the delta rule scales q by 1/sqrt(dk), as attnlab
//   ssm_f_a    {D, dk}    w_f1 (D, dv)      the decay's low-rank projection,
//   ssm_f_b    {dk, H dk} w_f2 (dv, H dk)   through dk = dv
//   ssm_dt.bias {H dk}    dt_bias; ssm_a {1, H} = -exp(A_log):
//              g = ssm_a[h] * softplus((u w_f1) w_f2 + dt_bias), one log decay
//              per key channel, head-major (channel h dk + i), as attnlab's
//   ssm_beta   {D, H}     w_beta (beta = sigmoid(u w_beta))
//   The state of a head is dk x dv with the key index decayed by exp(g), as
//   attnlab's Diag(exp(g_t)) S_{t-1}.
//   ssm_norm   {dk}       out_norm: RMSNorm of each head's output (the model's
//              RMSNorm epsilon, as attnlab's norm_eps), times
//   ssm_g_a    {D, dk}    w_g1, and
//   ssm_g_b    {dk, H dk} w_g2: sigmoid((u w_g1) w_g2) with no bias, as Kimi
//              Linear's g_b_proj (attnlab's kda_gate_bias = false)
//   attn_output {H dv, D} Wo
// The output projection is required: a tied model writes the embedding as it.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export_gguf_internal.h"

// The epsilon of attnlab's L2 norm of q and k (op_l2norm_heads, ops_norm.c).
#define KDA_L2_EPS 1e-6
// The pass-through block's head sizes (its rotary part, its other key part,
// its value: PAD_ROPE + PAD_NOPE = PAD_V) and its compressed kv width.
enum { PAD_ROPE = 1, PAD_NOPE = 1, PAD_V = 2, PAD_LORA = 1 };

static bool is_kda(const TrainConfig *cfg, int l) { return strcmp(cfg->model.layers.name[l], "kda") == 0; }

bool gguf_is_kimi(const TrainConfig *cfg) {
    for (int l = 0; l < cfg->model.layers.n; l++)
        if (is_kda(cfg, l)) return true;
    return false;
}

Status gguf_kimi_check(const TrainConfig *cfg) {
    const __typeof__(cfg->model) *m = &cfg->model;
    for (int l = 0; l < m->layers.n; l++)
        if (!is_kda(cfg, l))
            return status_err("layer %d is '%s' in a model with 'kda' layers: llama.cpp's 'kimi-linear' "
                              "architecture, which runs kda layers, has besides them only Multi-head Latent "
                              "Attention without RoPE, which no attnlab layer computes; train with every layer "
                              "'kda' to export",
                              l, m->layers.name[l]);
    if (m->kda_gate_bias)
        return status_err("kda_gate_bias = true: the kda output gate has a bias b_g2, and llama.cpp's "
                          "'kimi-linear' architecture gates with sigmoid((u W_g1) W_g2) without one; train with "
                          "[model] kda_gate_bias = false to export");
    if (m->d_k != m->d_v)
        return status_err("d_k = %d and d_v = %d: llama.cpp's 'kimi-linear' architecture has one head size for "
                          "keys and values (kda.head_dim; its state is head_dim x head_dim); train with d_k = d_v "
                          "to export",
                          m->d_k, m->d_v);
    if (m->conv_size == 0)
        return status_err("conv_size = 0: kda then has no short convolution and no SiLU, and llama.cpp's "
                          "'kimi-linear' architecture always applies both; train with conv_size >= 1 to export");
    if (m->norm_eps != KDA_L2_EPS)
        return status_err("norm_eps = %g: llama.cpp's 'kimi-linear' architecture adds the RMSNorm epsilon inside "
                          "kda's L2 norm of q and k, where attnlab adds %g; train with norm_eps = %g to export",
                          m->norm_eps, KDA_L2_EPS, KDA_L2_EPS);
    return status_ok();
}

static const Tensor *param(const ParamStore *ps, int l, const char *what) {
    char fmt[96];
    snprintf(fmt, sizeof fmt, "layers.%%d.%s", what);
    return gguf_param(ps, fmt, l);
}

// A parameter's values as float32 under ggml's shape ne (ndim of them), each
// -exp of the stored one with neg_exp (ssm_a from A_log).
static void floats_write(Gguf *g, const char *name, const Tensor *t, int ndim, const int64_t *ne, bool neg_exp) {
    int64_t n = 1;
    for (int k = 0; k < ndim; k++) n *= ne[k];
    ASSERT(n == t->numel, "export_gguf: %s has %lld values, not %lld", name, (long long)t->numel, (long long)n);
    float *f = xmalloc((size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++) f[i] = (float)(neg_exp ? -exp((double)t->data[i]) : (double)t->data[i]);
    gguf_tensor(g, name, ndim, ne, GGUF_F32, f);
    free(f);
}

static void kda_layer(Gguf *g, const TrainConfig *cfg, const ParamStore *ps, int l, GgufType type) {
    int H = cfg->model.n_heads, dk = cfg->model.d_k, K = cfg->model.conv_size;
    char name[96];
    gguf_attn_plain(g, ps, l, type);   // attn_q, attn_k, attn_v, attn_output
    static const char *const conv[3][2] = {
        {"ssm_conv1d_q", "mixer.conv_q"}, {"ssm_conv1d_k", "mixer.conv_k"}, {"ssm_conv1d_v", "mixer.conv_v"}};
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, conv[i][0]);
        floats_write(g, name, param(ps, l, conv[i][1]), 3, (int64_t[]){K, 1, (int64_t)H * dk}, false);
    }
    static const char *const dense[5][2] = {{"ssm_f_a", "mixer.w_f1"},
                                            {"ssm_f_b", "mixer.w_f2"},
                                            {"ssm_beta", "mixer.w_beta"},
                                            {"ssm_g_a", "mixer.w_g1"},
                                            {"ssm_g_b", "mixer.w_g2"}};
    for (int i = 0; i < 5; i++) {
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, dense[i][0]);
        gguf_matrix(g, name, param(ps, l, dense[i][1]), true, type);
    }
    snprintf(name, sizeof name, "blk.%d.ssm_dt.bias", l);
    gguf_vector(g, name, param(ps, l, "mixer.dt_bias"));
    snprintf(name, sizeof name, "blk.%d.ssm_a", l);
    floats_write(g, name, param(ps, l, "mixer.A_log"), 2, (int64_t[]){1, H}, true);
    snprintf(name, sizeof name, "blk.%d.ssm_norm.weight", l);
    gguf_vector(g, name, param(ps, l, "mixer.out_norm"));
}

// Block l = L, the pass-through attention block (the header comment).
static void pass_through_block(Gguf *g, const TrainConfig *cfg, int l) {
    int64_t D = cfg->model.d_model, H = cfg->model.n_heads, F = cfg->model.d_ff;
    const GgufConstant block[] = {{"attn_norm", {D, 0}, 1},
                                  {"attn_q", {D, H * (PAD_ROPE + PAD_NOPE)}, 0},
                                  {"attn_kv_a_mqa", {D, PAD_LORA + PAD_ROPE}, 0},
                                  {"attn_kv_a_norm", {PAD_LORA, 0}, 1},
                                  {"attn_kv_b", {PAD_LORA, H * (PAD_NOPE + PAD_V)}, 0},
                                  {"attn_output", {H * PAD_V, D}, 0},
                                  {"ffn_norm", {D, 0}, 1},
                                  {"ffn_gate", {D, F}, 0},
                                  {"ffn_up", {D, F}, 0},
                                  {"ffn_down", {F, D}, 0}};
    gguf_constant_block(g, l, block, sizeof block / sizeof block[0]);
}

// kimi-linear's keys beyond those every architecture has (gguf_common_metadata).
static void kimi_metadata(Gguf *g, const TrainConfig *cfg) {
    const __typeof__(cfg->model) *m = &cfg->model;
    int L = m->layers.n;
    int32_t *kv = xcalloc((size_t)L + 1, sizeof *kv);   // 0: a recurrent (KDA) layer
    kv[L] = m->n_heads;                                  // the pass-through block attends
    gguf_kv_i32s(g, "kimi-linear.attention.head_count_kv", kv, (size_t)L + 1);
    free(kv);
    gguf_kv_u32(g, "kimi-linear.ssm.conv_kernel", (uint32_t)m->conv_size);
    gguf_kv_u32(g, "kimi-linear.kda.head_dim", (uint32_t)m->d_k);
    // The pass-through block's attention sizes (uncompressed MLA, no RoPE applied).
    gguf_kv_u32(g, "kimi-linear.attention.key_length", PAD_ROPE + PAD_NOPE);
    gguf_kv_u32(g, "kimi-linear.attention.value_length", PAD_V);
    gguf_kv_u32(g, "kimi-linear.rope.dimension_count", PAD_ROPE);
    gguf_kv_u32(g, "kimi-linear.attention.key_length_mla", 0);
    gguf_kv_u32(g, "kimi-linear.attention.value_length_mla", 0);
    gguf_kv_u32(g, "kimi-linear.attention.kv_lora_rank", PAD_LORA);
    // Every block dense: the expert keys are required but read by no block.
    gguf_kv_u32(g, "kimi-linear.leading_dense_block_count", (uint32_t)L + 1);
    gguf_kv_u32(g, "kimi-linear.expert_feed_forward_length", (uint32_t)m->d_ff);
    gguf_kv_u32(g, "kimi-linear.expert_shared_count", 0);
    gguf_kv_u32(g, "kimi-linear.expert_gating_func", 2);   // sigmoid, Kimi's (no experts here)
}

void gguf_kimi(Gguf *g, const TrainConfig *cfg, const ParamStore *ps, GgufType type) {
    kimi_metadata(g, cfg);
    for (int l = 0; l < cfg->model.layers.n; l++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        gguf_vector(g, name, param(ps, l, "norm1"));
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        gguf_vector(g, name, param(ps, l, "norm2"));
        kda_layer(g, cfg, ps, l, type);
        gguf_mlp(g, ps, l, type);
    }
    pass_through_block(g, cfg, cfg->model.layers.n);
}
