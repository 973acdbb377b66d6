// export_gguf_mamba2.c: a model of `mamba2` layers (and plain `attn` layers)
// as llama.cpp's `granitehybrid` architecture (Mamba-2 + attention, each
// block with a SwiGLU MLP), computing what attnlab computes.
//
// Why granitehybrid, not llama.cpp's `mamba2`: a `mamba2` block there is
// norm, mixer, residual and nothing else, while every attnlab block has its
// SwiGLU MLP; granitehybrid's blocks are attnlab's (x + mixer(RMSNorm(x)),
// then h + MLP(RMSNorm(h))). It needs an attention layer, so a stack of
// mamba2 layers alone is written with the pass-through block after them
// (export_gguf_internal.h). Its Granite scales (embedding, residual,
// attention, logit) are left out of the file, which turns each off.
//
// Per layer, as llama.cpp's graph (src/models/granite-hybrid.cpp,
// mamba-base.cpp build_mamba2_layer) reads it:
//   attn_norm, ffn_norm, ffn_gate/up/down   norm1, norm2, the MLP
// mamba2 (attention.head_count_kv = 0 marks it):
//   ssm_in     {D, 2 H dv + 2 H dk + H}  [Wg | Wv | Wk | Wq | w_dt]: Mamba-2's
//              z, x, B, C and dt, with n_group = H (a B and a C per head)
//   ssm_conv1d {K, H dv + 2 H dk}  [conv_v; conv_k; conv_q], one row of K taps
//              per channel, oldest first (ggml_ssm_conv as in qwen35), then
//              SiLU; ssm_conv1d.bias zeros (attnlab's convolution has none;
//              granitehybrid loads the bias as optional, but its graph adds
//              it unconditionally and crashes without it)
//   ssm_dt.bias {H} dt_bias; ssm_a {1, H} = -exp(A_log); ssm_d {1, H} = D:
//              ggml_ssm_scan's S = exp(softplus(dt) A) S + softplus(dt) B xᵀ,
//              y = S C, then + D x: attnlab's unscaled q (C), k (B), v (x)
//   ssm_norm   {dv, H} out_norm: RMSNorm per group of dv after o * silu(z),
//              with the model's RMSNorm epsilon, as attnlab's norm_eps
//   ssm_out    Wo
// attn: attn_q, attn_k, attn_v, attn_output as llama's (RoPE type NORM:
//   attnlab's interleaved pairs), scale 1/sqrt(dk).
// llama.cpp's loader requires d_inner = H dv = 2 D (Mamba-2's expansion).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export_gguf_internal.h"

static bool is_mamba2(const TrainConfig *cfg, int l) { return strcmp(cfg->model.layers.name[l], "mamba2") == 0; }

bool gguf_is_granite(const TrainConfig *cfg) {
    for (int l = 0; l < cfg->model.layers.n; l++)
        if (is_mamba2(cfg, l)) return true;
    return false;
}

Status gguf_granite_check(const TrainConfig *cfg) {
    const __typeof__(cfg->model) *m = &cfg->model;
    for (int l = 0; l < m->layers.n; l++)
        if (!is_mamba2(cfg, l) && strcmp(m->layers.name[l], "attn") != 0)
            return status_err("layer %d is '%s' in a model with 'mamba2' layers: llama.cpp's 'granitehybrid' "
                              "architecture, which runs mamba2 layers, has only Mamba-2 and attention layers; use "
                              "'mamba2' and 'attn' layers to export",
                              l, m->layers.name[l]);
    if (m->qk_norm || m->attn_gate)
        return status_err("%s = true: llama.cpp's 'granitehybrid' architecture (mamba2/attn) has plain attention, "
                          "with no q/k norm and no output gate; train without it to export",
                          m->qk_norm ? "qk_norm" : "attn_gate");
    if (m->n_heads * m->d_v != 2 * m->d_model)
        return status_err("n_heads * d_v = %d * %d = %d: llama.cpp's 'granitehybrid' architecture accepts Mamba-2 "
                          "layers whose inner width is twice d_model (%d); train with n_heads * d_v = 2 * d_model "
                          "to export",
                          m->n_heads, m->d_v, m->n_heads * m->d_v, 2 * m->d_model);
    if (m->conv_size == 0)
        return status_err("conv_size = 0: mamba2 then has no short convolution and no SiLU, and llama.cpp's "
                          "'granitehybrid' architecture always applies both; train with conv_size >= 1 to export");
    return status_ok();
}

static const Tensor *param(const ParamStore *ps, int l, const char *what) {
    char fmt[96];
    snprintf(fmt, sizeof fmt, "layers.%%d.%s", what);
    return gguf_param(ps, fmt, l);
}

// Dense weights side by side as one ggml matrix {in, sum of their outputs}:
// output block i is t[i] (attnlab's (in, out), y = u W), in order. Q8_0
// falls back to float16 for inputs not a multiple of 32, as gguf_matrix.
static void matrices_write(Gguf *g, const char *name, const Tensor *const *t, int n, GgufType type) {
    int64_t in = t[0]->shape[0], outs = 0;
    for (int i = 0; i < n; i++) outs += t[i]->shape[1];
    float *f = xmalloc((size_t)(in * outs) * sizeof *f);
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        int64_t c = t[i]->shape[1];
        for (int64_t j = 0; j < c; j++, at++)
            for (int64_t r = 0; r < in; r++) f[at * in + r] = (float)t[i]->data[r * c + j];
    }
    if (type == GGUF_Q8_0 && in % 32 != 0) type = GGUF_F16;
    gguf_tensor(g, name, 2, (int64_t[]){in, outs}, type, f);
    free(f);
}

// A float32 tensor of shape ne (2 dims) from the concatenated data of t[0..n).
static void floats_write(Gguf *g, const char *name, const Tensor *const *t, int n, int64_t ne0, int64_t ne1,
                         bool neg_exp) {
    float *f = xmalloc((size_t)(ne0 * ne1) * sizeof *f);
    int64_t at = 0;
    for (int i = 0; i < n; i++)
        for (int64_t j = 0; j < t[i]->numel; j++) {
            double x = (double)t[i]->data[j];
            f[at++] = (float)(neg_exp ? -exp(x) : x);
        }
    ASSERT(at == ne0 * ne1, "export_gguf: %s has %lld values for {%lld, %lld}", name, (long long)at,
           (long long)ne0, (long long)ne1);
    gguf_tensor(g, name, 2, (int64_t[]){ne0, ne1}, GGUF_F32, f);
    free(f);
}

static void mamba2_layer(Gguf *g, const TrainConfig *cfg, const ParamStore *ps, int l, GgufType type) {
    int H = cfg->model.n_heads, dv = cfg->model.d_v, K = cfg->model.conv_size;
    char name[96];
    const Tensor *in[] = {param(ps, l, "mixer.wg"), param(ps, l, "mixer.wv"), param(ps, l, "mixer.wk"),
                          param(ps, l, "mixer.wq"), param(ps, l, "mixer.w_dt")};
    snprintf(name, sizeof name, "blk.%d.ssm_in.weight", l);
    matrices_write(g, name, in, 5, type);
    // The taps stay float32: ggml_ssm_conv reads float32 only.
    const Tensor *conv[] = {param(ps, l, "mixer.conv_v"), param(ps, l, "mixer.conv_k"), param(ps, l, "mixer.conv_q")};
    int64_t C = conv[0]->shape[0] + conv[1]->shape[0] + conv[2]->shape[0];
    snprintf(name, sizeof name, "blk.%d.ssm_conv1d.weight", l);
    floats_write(g, name, conv, 3, K, C, false);
    float *zeros = xcalloc((size_t)C, sizeof *zeros);
    snprintf(name, sizeof name, "blk.%d.ssm_conv1d.bias", l);
    gguf_tensor(g, name, 1, (int64_t[]){C}, GGUF_F32, zeros);
    free(zeros);
    snprintf(name, sizeof name, "blk.%d.ssm_dt.bias", l);
    gguf_vector(g, name, param(ps, l, "mixer.dt_bias"));
    const Tensor *A = param(ps, l, "mixer.A_log"), *Dh = param(ps, l, "mixer.D"), *w = param(ps, l, "mixer.out_norm");
    snprintf(name, sizeof name, "blk.%d.ssm_a", l);
    floats_write(g, name, &A, 1, 1, H, true);
    snprintf(name, sizeof name, "blk.%d.ssm_d", l);
    floats_write(g, name, &Dh, 1, 1, H, false);
    snprintf(name, sizeof name, "blk.%d.ssm_norm.weight", l);
    floats_write(g, name, &w, 1, dv, H, false);
    snprintf(name, sizeof name, "blk.%d.ssm_out.weight", l);
    gguf_matrix(g, name, param(ps, l, "mixer.wo"), true, type);
}

// Block l = L, the pass-through block (export_gguf_internal.h) as a
// granitehybrid attention layer (llama's): every weight 0 but the norm gains.
static void pass_through_block(Gguf *g, const TrainConfig *cfg, int l) {
    int64_t D = cfg->model.d_model, F = cfg->model.d_ff, W = GGUF_PASS_HEADS * GGUF_PASS_HEAD_DIM;
    const GgufConstant block[] = {{"attn_norm", {D, 0}, 1}, {"ffn_norm", {D, 0}, 1},    {"attn_q", {D, W}, 0},
                                  {"attn_k", {D, W}, 0},    {"attn_v", {D, W}, 0},      {"attn_output", {W, D}, 0},
                                  {"ffn_gate", {D, F}, 0},  {"ffn_up", {D, F}, 0},      {"ffn_down", {F, D}, 0}};
    gguf_constant_block(g, l, block, sizeof block / sizeof block[0]);
}

void gguf_granite(Gguf *g, const TrainConfig *cfg, const ParamStore *ps, GgufType type) {
    const __typeof__(cfg->model) *m = &cfg->model;
    int L = m->layers.n;
    bool pass = gguf_pass_through("granitehybrid", cfg);
    // A layer is recurrent where its key/value head count is 0.
    int32_t *kv = xmalloc(((size_t)L + pass) * sizeof *kv);
    for (int l = 0; l < L; l++) kv[l] = is_mamba2(cfg, l) ? 0 : m->n_heads;
    if (pass) kv[L] = GGUF_PASS_HEADS;
    gguf_kv_i32s(g, "granitehybrid.attention.head_count_kv", kv, (size_t)L + pass);
    free(kv);
    gguf_kv_u32(g, "granitehybrid.ssm.conv_kernel", (uint32_t)m->conv_size);
    gguf_kv_u32(g, "granitehybrid.ssm.inner_size", (uint32_t)(m->n_heads * m->d_v));
    gguf_kv_u32(g, "granitehybrid.ssm.state_size", (uint32_t)m->d_k);
    gguf_kv_u32(g, "granitehybrid.ssm.time_step_rank", (uint32_t)m->n_heads);
    gguf_kv_u32(g, "granitehybrid.ssm.group_count", (uint32_t)m->n_heads);
    for (int l = 0; l < L; l++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        gguf_vector(g, name, param(ps, l, "norm1"));
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        gguf_vector(g, name, param(ps, l, "norm2"));
        if (is_mamba2(cfg, l))
            mamba2_layer(g, cfg, ps, l, type);
        else
            gguf_attn_plain(g, ps, l, type);
        gguf_mlp(g, ps, l, type);
    }
    if (pass) pass_through_block(g, cfg, L);
}
