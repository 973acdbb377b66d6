// GGUF export of models without attention layers: gdn layers only as
// llama.cpp's qwen35 and mamba2 layers only as its granitehybrid, each file
// with the pass-through block after the model's layers (an attention block
// whose weights are all zero but its norm gains: export_gguf_internal.h),
// read back with test_gguf_util.c's reader; what such a model still cannot
// export; and no such block where the model has an attention layer.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_gguf_util.h"

// A model of `layers` (D wide, H heads of dk and dv, d_ff 2D, bytes) and its
// config as the exporter reads it, its layers named as they are.
static LMConfig pass_config(TrainConfig *tc, const char *layers, int D, int H, int dk, int dv) {
    LMConfig c = test_tiny_lm_config(layers);
    c.d_model = D;
    c.d_ff = 2 * D;
    c.vocab_size = TOKENIZER_BYTE_VOCAB;
    c.mixer = mixer_config_default(D, H, dk, dv);
    gguf_test_config(tc, &c, true);
    char names[256];
    snprintf(names, sizeof names, "%s", layers);
    int l = 0;
    for (char *s = strtok(names, ","); s; s = strtok(NULL, ","))
        snprintf(tc->model.layers.name[l++], CONFIG_NAME_MAX, "%s", s);
    cr_assert_eq(l, c.n_layers);
    tc->model.conv_size = c.mixer.conv_size;
    return c;
}

// The integer key (or array) `key` holds exactly want[0..n).
static void assert_ints(const uint8_t *bytes, size_t size, const char *key, const int64_t *want, int n) {
    int64_t got[16];
    int m = gguf_key_ints(bytes, size, key, got, 16);
    cr_assert_eq(m, n, "%s: %d values, want %d", key, m, n);
    for (int i = 0; i < n; i++)
        cr_assert_eq(got[i], want[i], "%s[%d] = %lld, want %lld", key, i, (long long)got[i], (long long)want[i]);
}

// Integer keys and their values.
typedef struct KeyInt {
    const char *key;
    int64_t want;
} KeyInt;

static void assert_keys(const uint8_t *bytes, size_t size, const KeyInt *keys, int n) {
    for (int i = 0; i < n; i++) assert_ints(bytes, size, keys[i].key, &keys[i].want, 1);
}

typedef struct Expected {
    const char *name;
    int64_t ne[2];   // ne[1] = 0: a vector
    float value;
} Expected;

// Block l's tensors are exactly `want` (every value as listed: gains
// float32, matrices of zeros Q8_0 where their rows are a multiple of 32
// long, else float16) and block l + 1 does not exist.
static void assert_block(const uint8_t *bytes, size_t size, int l, const Expected *want, int n) {
    Found f;
    char name[96];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, want[i].name);
        cr_assert(gguf_find(bytes, size, name, &f, NULL, NULL), "%s is missing", name);
        int ndim = want[i].ne[1] ? 2 : 1;
        int type = ndim == 1 ? GGUF_F32 : want[i].ne[0] % 32 == 0 ? GGUF_Q8_0 : GGUF_F16;
        cr_assert(f.type == type && f.ndim == ndim && f.ne[0] == want[i].ne[0] &&
                      (ndim == 1 || f.ne[1] == want[i].ne[1]),
                  "%s: type %d, {%lld, %lld}", name, f.type, (long long)f.ne[0], (long long)f.ne[1]);
        if (ndim == 2) cr_assert(want[i].value == 0 && gguf_all_zero(&f), "%s is not all 0", name);
        for (int64_t j = 0; ndim == 1 && j < f.ne[0]; j++)
            cr_assert_eq(gguf_f32_at(&f, j), want[i].value, "%s[%lld]", name, (long long)j);
    }
    snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l + 1);
    cr_assert(!gguf_find(bytes, size, name, &f, NULL, NULL), "one block more than the model, not two");
}

Test(gguf_pass, gdn_layers_only_are_qwen35_with_a_pass_through_attention_block) {
    TrainConfig tc;
    LMConfig c = pass_config(&tc, "gdn,gdn", 32, 2, 16, 16);
    ParamStore ps;
    LM lm;
    gguf_test_model(&c, &ps, &lm);
    int64_t D = 32, F = 64, H = 2, dk = 16;
    for (int type = 0; type < 2; type++) {
        GgufType t = type == 0 ? GGUF_F32 : GGUF_Q8_0;
        size_t n;
        uint8_t *bytes = gguf_test_file(&tc, &ps, t, &n);
        static const KeyInt keys[] = {{"qwen35.block_count", 3},           {"qwen35.attention.head_count", 1},
                                      {"qwen35.attention.head_count_kv", 1}, {"qwen35.attention.key_length", 2},
                                      {"qwen35.attention.value_length", 2},  {"qwen35.rope.dimension_count", 2},
                                      {"qwen35.ssm.state_size", 16},         {"qwen35.ssm.inner_size", 32},
                                      {"qwen35.ssm.group_count", 2},         {"qwen35.ssm.time_step_rank", 2}};
        assert_keys(bytes, n, keys, (int)(sizeof keys / sizeof keys[0]));
        assert_ints(bytes, n, "qwen35.attention.recurrent_layers", (int64_t[]){1, 1, 0}, 3);
        assert_ints(bytes, n, "qwen35.rope.dimension_sections", (int64_t[]){1, 0, 0, 0}, 4);
        // The model's layers as in a hybrid (in the asked type), the block after them.
        Found f;
        cr_assert(gguf_find(bytes, n, "blk.1.attn_qkv.weight", &f, NULL, NULL));
        cr_assert(f.ne[0] == D && f.ne[1] == 3 * H * dk && f.type == (int)t);
        cr_assert(gguf_find(bytes, n, "blk.1.ssm_a", &f, NULL, NULL));
        const Expected block[] = {{"attn_norm", {D, 0}, 1},   {"post_attention_norm", {D, 0}, 1},
                                  {"attn_q", {D, 4}, 0},      {"attn_k", {D, 2}, 0},
                                  {"attn_v", {D, 2}, 0},      {"attn_output", {2, D}, 0},
                                  {"attn_q_norm", {2, 0}, 1}, {"attn_k_norm", {2, 0}, 1},
                                  {"ffn_gate", {D, F}, 0},    {"ffn_up", {D, F}, 0},
                                  {"ffn_down", {F, D}, 0}};
        assert_block(bytes, n, 2, block, (int)(sizeof block / sizeof block[0]));
        cr_assert(!gguf_find(bytes, n, "blk.2.attn_qkv.weight", &f, NULL, NULL), "the block is no gdn layer");
        cr_assert(!gguf_find(bytes, n, "blk.2.ssm_a", &f, NULL, NULL));
        free(bytes);
    }
    lm_destroy(&lm);
    params_free(&ps);
}

// Also with a state wider than a head (d_k = 2 d_v): the block's head size
// is its own, so the model's d_k need not equal d_v.
Test(gguf_pass, mamba2_layers_only_are_granitehybrid_with_a_pass_through_attention_block) {
    TrainConfig tc;
    LMConfig c = pass_config(&tc, "mamba2,mamba2", 16, 4, 16, 8);
    ParamStore ps;
    LM lm;
    gguf_test_model(&c, &ps, &lm);
    size_t n;
    uint8_t *bytes = gguf_test_file(&tc, &ps, GGUF_F32, &n);
    int64_t D = 16, F = 32, H = 4, dk = 16, dv = 8;
    static const KeyInt keys[] = {{"granitehybrid.block_count", 3},
                                  {"granitehybrid.attention.head_count", 1},
                                  {"granitehybrid.attention.key_length", 2},
                                  {"granitehybrid.attention.value_length", 2},
                                  {"granitehybrid.rope.dimension_count", 2},
                                  {"granitehybrid.ssm.state_size", 16},
                                  {"granitehybrid.ssm.inner_size", 32},
                                  {"granitehybrid.ssm.group_count", 4}};
    assert_keys(bytes, n, keys, (int)(sizeof keys / sizeof keys[0]));
    // A layer is recurrent where its key/value head count is 0; the block has one head.
    assert_ints(bytes, n, "granitehybrid.attention.head_count_kv", (int64_t[]){0, 0, 1}, 3);
    Found f;
    cr_assert(gguf_find(bytes, n, "blk.1.ssm_in.weight", &f, NULL, NULL));
    cr_assert(f.ne[0] == D && f.ne[1] == 2 * H * dv + 2 * H * dk + H);
    const Expected block[] = {{"attn_norm", {D, 0}, 1}, {"ffn_norm", {D, 0}, 1}, {"attn_q", {D, 2}, 0},
                              {"attn_k", {D, 2}, 0},    {"attn_v", {D, 2}, 0},   {"attn_output", {2, D}, 0},
                              {"ffn_gate", {D, F}, 0},  {"ffn_up", {D, F}, 0},   {"ffn_down", {F, D}, 0}};
    assert_block(bytes, n, 2, block, (int)(sizeof block / sizeof block[0]));
    cr_assert(!gguf_find(bytes, n, "blk.2.ssm_in.weight", &f, NULL, NULL), "the block is no mamba2 layer");
    free(bytes);
    lm_destroy(&lm);
    params_free(&ps);
}

static void gdn_mutate(TrainConfig *t, int i) {
    if (i == 0) t->model.d_v = 2 * t->model.d_k;
    if (i == 1) t->model.conv_size = 0;
    if (i == 2) t->model.norm_eps = 1e-5;
    if (i == 3) snprintf(t->model.layers.name[1], CONFIG_NAME_MAX, "mamba");
}

static void mamba2_mutate(TrainConfig *t, int i) {
    if (i == 0) t->model.n_heads = 2;
    if (i == 1) t->model.conv_size = 0;
    if (i == 2) snprintf(t->model.layers.name[1], CONFIG_NAME_MAX, "gdn");
    if (i == 3) snprintf(t->model.layers.name[1], CONFIG_NAME_MAX, "mamba");
}

// The block lifts only the need for an attention layer: the recurrent
// layers' own conditions stay, each refused with what to change.
Test(gguf_pass, what_the_recurrent_layers_need_is_still_refused_with_what_to_change) {
    TrainConfig tc;
    pass_config(&tc, "gdn,gdn", 32, 2, 16, 16);
    static const char *const gdn_says[] = {"d_k = 16 and d_v = 32: llama.cpp's 'qwen35' architecture has one head size",
                                           "conv_size = 0", "norm_eps = 1e-05", "layer 1 is 'mamba'"};
    gguf_test_refusals(&tc, gdn_mutate, gdn_says, 4);
    pass_config(&tc, "mamba2,mamba2", 16, 4, 16, 8);
    static const char *const mamba2_says[] = {"n_heads * d_v = 2 * 8 = 16", "conv_size = 0", "layer 1 is 'gdn'",
                                              "layer 1 is 'mamba'"};
    gguf_test_refusals(&tc, mamba2_mutate, mamba2_says, 4);
}

// With an attention layer the file has the model's blocks only, and its
// attention sizes are the model's.
Test(gguf_pass, a_model_with_an_attention_layer_has_no_pass_through_block) {
    for (int arch = 0; arch < 2; arch++) {
        TrainConfig tc;
        LMConfig c = arch == 0 ? pass_config(&tc, "gdn,attn", 32, 2, 16, 16)
                               : pass_config(&tc, "mamba2,attn", 16, 4, 8, 8);
        c.mixer.qk_norm = c.mixer.attn_gate = tc.model.qk_norm = tc.model.attn_gate = arch == 0;
        ParamStore ps;
        LM lm;
        gguf_test_model(&c, &ps, &lm);
        size_t n;
        uint8_t *bytes = gguf_test_file(&tc, &ps, GGUF_F32, &n);
        const char *a = arch == 0 ? "qwen35" : "granitehybrid";
        char key[96];
        snprintf(key, sizeof key, "%s.block_count", a);
        assert_ints(bytes, n, key, (int64_t[]){2}, 1);
        snprintf(key, sizeof key, "%s.attention.head_count", a);
        assert_ints(bytes, n, key, (int64_t[]){c.mixer.n_heads}, 1);
        snprintf(key, sizeof key, "%s.attention.key_length", a);
        assert_ints(bytes, n, key, (int64_t[]){c.mixer.d_k}, 1);
        if (arch == 0) assert_ints(bytes, n, "qwen35.attention.recurrent_layers", (int64_t[]){1, 0}, 2);
        else assert_ints(bytes, n, "granitehybrid.attention.head_count_kv", (int64_t[]){0, 4}, 2);
        Found f;
        cr_assert(gguf_find(bytes, n, "blk.1.attn_q.weight", &f, NULL, NULL) && f.ne[1] > 2, "the model's attention");
        cr_assert(!gguf_find(bytes, n, "blk.2.attn_norm.weight", &f, NULL, NULL), "no block after the model's");
        free(bytes);
        lm_destroy(&lm);
        params_free(&ps);
    }
}
