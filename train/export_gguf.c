// export_gguf.c: an attnlab model as llama.cpp's GGUF (export_gguf.h).
//
// attnlab applies dense weights on the right (y = u W, W stored (in, out));
// ggml multiplies by a matrix whose rows are its outputs (ne = {in, out}), so
// every dense weight is written transposed. The embedding is already one row
// per token, as ggml's token_embd is.
#include "export_gguf.h"
#include "export_gguf_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Which architecture: 'granitehybrid' for a model with mamba2 layers
// (export_gguf_mamba2.c), 'kimi-linear' for one with kda layers
// (export_gguf_kimi.c), 'llama' for plain attention stacks, 'qwen35' for a
// model with gdn layers or with attention that has qwen35's q/k norm and gate.
static bool is_llama(const TrainConfig *cfg) {
    for (int l = 0; l < cfg->model.layers.n; l++)
        if (strcmp(cfg->model.layers.name[l], "attn") != 0) return false;
    return !cfg->model.qk_norm && !cfg->model.attn_gate;
}

static const char *architecture(const TrainConfig *cfg) {
    return gguf_is_granite(cfg) ? "granitehybrid"
           : gguf_is_kimi(cfg)  ? "kimi-linear"
           : is_llama(cfg)      ? "llama"
                                : "qwen35";
}

static bool has_attn(const TrainConfig *cfg) {
    for (int l = 0; l < cfg->model.layers.n; l++)
        if (strcmp(cfg->model.layers.name[l], "attn") == 0) return true;
    return false;
}

bool gguf_pass_through(const char *arch, const TrainConfig *cfg) {
    if (strcmp(arch, "kimi-linear") == 0) return true;
    return (strcmp(arch, "qwen35") == 0 || strcmp(arch, "granitehybrid") == 0) && !has_attn(cfg);
}

void gguf_constant_block(Gguf *g, int l, const GgufConstant *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int64_t count = t[i].ne[0] * (t[i].ne[1] ? t[i].ne[1] : 1);
        float *f = xmalloc((size_t)count * sizeof *f);
        for (int64_t j = 0; j < count; j++) f[j] = t[i].value;
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, t[i].name);
        // A matrix of zeros costs least as Q8_0 (float16 where rows are not a multiple of 32 long): zero is
        // exact in both, and what the block multiplies is finite, RMS-normalised or 0, so no product is NaN.
        GgufType type = !t[i].ne[1] || t[i].value != 0 ? GGUF_F32 : t[i].ne[0] % 32 == 0 ? GGUF_Q8_0 : GGUF_F16;
        gguf_tensor(g, name, t[i].ne[1] ? 2 : 1, t[i].ne, type, f);
        free(f);
    }
}

Status export_gguf_check(const TrainConfig *cfg, const Tokenizer *tok) {
    bool granite = gguf_is_granite(cfg), kimi = !granite && gguf_is_kimi(cfg);
    for (int l = 0; !granite && !kimi && l < cfg->model.layers.n; l++)
        if (strcmp(cfg->model.layers.name[l], "attn") != 0 && strcmp(cfg->model.layers.name[l], "gdn") != 0)
            return status_err("layer %d is '%s': GGUF export maps only 'attn' layers (llama.cpp's 'llama' "
                              "architecture), 'gdn' layers with or without 'attn' layers (its 'qwen35'), 'mamba2' "
                              "layers with or without 'attn' layers (its 'granitehybrid') and 'kda' layers alone (its "
                              "'kimi-linear'); that mixer has no exact counterpart there yet",
                              l, cfg->model.layers.name[l]);
    Status s = granite ? gguf_granite_check(cfg)
               : kimi  ? gguf_kimi_check(cfg)
               : is_llama(cfg) ? status_ok()
                               : gguf_qwen35_check(cfg);
    // (Without attention layers the file's one attention is the pass-through
    // block's, of its own head size; the recurrent layers' checks ask what they need.)
    if (s.ok && has_attn(cfg) && cfg->model.d_k != cfg->model.d_v)
        s = status_err("d_k = %d and d_v = %d: llama.cpp's '%s' architecture has one head size for keys and "
                       "values; train with d_k = d_v to export",
                       cfg->model.d_k, cfg->model.d_v, architecture(cfg));
    return s.ok ? gguf_vocabulary_check(tok) : s;
}

// A parameter (it must exist: the model was built from this config).
const Tensor *gguf_param(const ParamStore *ps, const char *fmt, int l) {
    char name[128];
    snprintf(name, sizeof name, fmt, l);
    const Tensor *t = params_find(ps, name);
    ASSERT(t, "export_gguf: the model has no parameter '%s'", name);
    return t;
}

void gguf_vector(Gguf *g, const char *name, const Tensor *t) {
    float *f = xmalloc((size_t)t->numel * sizeof *f);
    for (int64_t i = 0; i < t->numel; i++) f[i] = (float)t->data[i];
    gguf_tensor(g, name, 1, (int64_t[]){t->numel}, GGUF_F32, f);
    free(f);
}

// A (rows, cols) parameter as ggml's {cols, rows} (as stored) or, transposed, {rows, cols}.
void gguf_matrix(Gguf *g, const char *name, const Tensor *t, bool transpose, GgufType type) {
    int64_t r = t->shape[0], c = t->shape[1], row = transpose ? r : c, rows = transpose ? c : r;
    float *f = xmalloc((size_t)(r * c) * sizeof *f);
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < c; j++) f[transpose ? j * r + i : i * c + j] = (float)t->data[i * c + j];
    if (type == GGUF_Q8_0 && row % 32 != 0) type = GGUF_F16;
    gguf_tensor(g, name, 2, (int64_t[]){row, rows}, type, f);
    free(f);
}

void gguf_common_metadata(Gguf *g, const char *arch, const TrainConfig *cfg, int vocab) {
    char key[96];
    // A file with the pass-through block has one block more than the model. kimi-linear's attention sizes are
    // that block's own (gguf_kimi writes them); where it is qwen35's or granitehybrid's only attention, the
    // file's attention sizes are its sizes.
    bool kimi = strcmp(arch, "kimi-linear") == 0, pass = gguf_pass_through(arch, cfg), own = pass && !kimi;
    uint32_t heads = (uint32_t)(own ? GGUF_PASS_HEADS : cfg->model.n_heads);
    uint32_t dk = (uint32_t)(own ? GGUF_PASS_HEAD_DIM : cfg->model.d_k);
    uint32_t dv = (uint32_t)(own ? GGUF_PASS_HEAD_DIM : cfg->model.d_v);
#define KEY(name) (snprintf(key, sizeof key, "%s." name, arch), key)
    gguf_kv_str(g, "general.architecture", arch);
    gguf_kv_str(g, "general.name", "attnlab");
    gguf_kv_u32(g, "general.alignment", GGUF_ALIGNMENT);
    // RoPE sets no hard limit: the context llama.cpp offers by default is the
    // training window, but at least 4096 tokens, as attnlab's generate decodes.
    gguf_kv_u32(g, KEY("context_length"), (uint32_t)(cfg->data.seq_len > 4096 ? cfg->data.seq_len : 4096));
    gguf_kv_u32(g, KEY("embedding_length"), (uint32_t)cfg->model.d_model);
    gguf_kv_u32(g, KEY("block_count"), (uint32_t)(cfg->model.layers.n + pass));
    gguf_kv_u32(g, KEY("feed_forward_length"), (uint32_t)cfg->model.d_ff);
    gguf_kv_u32(g, KEY("attention.head_count"), heads);
    // granitehybrid's and kimi-linear's is one per layer (0 marks a recurrent one): gguf_granite and
    // gguf_kimi write it.
    if (strcmp(arch, "granitehybrid") != 0 && strcmp(arch, "kimi-linear") != 0)
        gguf_kv_u32(g, KEY("attention.head_count_kv"), heads);
    if (!kimi) {
        gguf_kv_u32(g, KEY("attention.key_length"), dk);
        gguf_kv_u32(g, KEY("attention.value_length"), dv);
        gguf_kv_u32(g, KEY("rope.dimension_count"), dk);
        gguf_kv_f32(g, KEY("rope.freq_base"), (float)cfg->model.rope_base);
    }
    gguf_kv_f32(g, KEY("attention.layer_norm_rms_epsilon"), (float)cfg->model.norm_eps);
    gguf_kv_u32(g, KEY("vocab_size"), (uint32_t)vocab);
#undef KEY
}

void gguf_mlp(Gguf *g, const ParamStore *ps, int l, GgufType type) {
    static const struct {
        const char *gguf, *ours;
    } dense[] = {{"ffn_gate", "mlp.w1"}, {"ffn_up", "mlp.w3"}, {"ffn_down", "mlp.w2"}};
    for (size_t k = 0; k < sizeof dense / sizeof dense[0]; k++) {
        char name[96], ours[96];
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, dense[k].gguf);
        snprintf(ours, sizeof ours, "layers.%%d.%s", dense[k].ours);
        gguf_matrix(g, name, gguf_param(ps, ours, l), true, type);
    }
}

void gguf_attn_plain(Gguf *g, const ParamStore *ps, int l, GgufType type) {
    static const struct {
        const char *gguf, *ours;
    } dense[] = {{"attn_q", "mixer.wq"}, {"attn_k", "mixer.wk"}, {"attn_v", "mixer.wv"}, {"attn_output", "mixer.wo"}};
    for (size_t k = 0; k < sizeof dense / sizeof dense[0]; k++) {
        char name[96], ours[96];
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, dense[k].gguf);
        snprintf(ours, sizeof ours, "layers.%%d.%s", dense[k].ours);
        gguf_matrix(g, name, gguf_param(ps, ours, l), true, type);
    }
}

static void llama_layers(Gguf *g, const TrainConfig *cfg, const ParamStore *ps, GgufType type) {
    for (int l = 0; l < cfg->model.layers.n; l++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        gguf_vector(g, name, gguf_param(ps, "layers.%d.norm1", l));
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        gguf_vector(g, name, gguf_param(ps, "layers.%d.norm2", l));
        gguf_attn_plain(g, ps, l, type);
        gguf_mlp(g, ps, l, type);
    }
}

Status export_gguf_bytes(const TrainConfig *cfg, const ParamStore *ps, const Tokenizer *tok, GgufType type,
                         uint8_t **bytes, size_t *n) {
    Status s = export_gguf_check(cfg, tok);
    if (!s.ok) return s;
    Gguf *g = gguf_new();
    const char *arch = architecture(cfg);
    gguf_common_metadata(g, arch, cfg, tok->vocab);
    gguf_vocabulary(g, tok);
    gguf_matrix(g, "token_embd.weight", gguf_param(ps, "embed", 0), false, type);
    gguf_vector(g, "output_norm.weight", gguf_param(ps, "norm_f", 0));
    // kimi-linear requires the output projection: a tied model writes the embedding again as it.
    if (!cfg->model.tied_embeddings)
        gguf_matrix(g, "output.weight", gguf_param(ps, "lm_head", 0), true, type);
    else if (strcmp(arch, "kimi-linear") == 0)
        gguf_matrix(g, "output.weight", gguf_param(ps, "embed", 0), false, type);
    if (strcmp(arch, "granitehybrid") == 0)
        gguf_granite(g, cfg, ps, type);
    else if (strcmp(arch, "kimi-linear") == 0)
        gguf_kimi(g, cfg, ps, type);
    else if (strcmp(arch, "llama") == 0)
        llama_layers(g, cfg, ps, type);
    else
        gguf_qwen35(g, cfg, ps, type);
    *bytes = gguf_bytes(g, n);
    gguf_free(g);
    return status_ok();
}
