// GGUF export: the half-precision rounding, Q8_0 blocks, and the file read
// back by a reader written from the format (test_gguf_util.c): every key,
// tensor name, shape and value as written (the llama.cpp comparison is
// tests/test_llama.sh; models without attention: test_gguf_pass.c).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "export_gguf.h"
#include "lm.h"
#include "test_gguf_util.h"

Test(gguf, half_precision_rounds_to_nearest_even) {
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;   // NaNs
        float f = gguf_f16_to_f32((uint16_t)h);
        cr_assert_eq(gguf_f32_to_f16(f), h, "half %04x -> %g -> %04x", h, f, gguf_f32_to_f16(f));
    }
    cr_assert_eq(gguf_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00, "a tie rounds to the even 1");
    cr_assert_eq(gguf_f32_to_f16(1.0f + 3 * ldexpf(1, -11)), 0x3c02, "a tie rounds to the even 1 + 2^-9");
    cr_assert_eq(gguf_f32_to_f16(1.0f + ldexpf(1, -11) + ldexpf(1, -20)), 0x3c01, "past the tie rounds up");
    cr_assert_eq(gguf_f32_to_f16(65519.0f), 0x7bff, "65519 rounds to the largest half, 65504");
    cr_assert_eq(gguf_f32_to_f16(65520.0f), 0x7c00, "65520 rounds to infinity");
    cr_assert_eq(gguf_f32_to_f16(ldexpf(1, -25)), 0x0000, "half the smallest subnormal ties to zero");
    cr_assert_eq(gguf_f32_to_f16(3 * ldexpf(1, -26)), 0x0001, "three quarters of it rounds up");
    cr_assert_eq(gguf_f32_to_f16(-ldexpf(1, -24)), 0x8001);
    cr_assert_eq(gguf_f32_to_f16(ldexpf(1, -14) - ldexpf(1, -26)), 0x0400, "rounds up into the normals");
    cr_assert_eq(gguf_f32_to_f16(-INFINITY), 0xfc00);
    cr_assert_eq(gguf_f32_to_f16(NAN) & 0x7e00, 0x7e00);
}

// Rows of 32: Q8_0 blocks fit every matrix.
static LMConfig attn_config(void) {
    LMConfig c = test_tiny_lm_config("attn,attn");
    c.d_model = 32;
    c.d_ff = 64;
    c.mixer = mixer_config_default(32, 2, 16, 16);
    return c;
}

Test(gguf, a_model_reads_back_transposed_and_exact) {
    LMConfig c = attn_config();
    c.tied = false;
    c.vocab_size = TOKENIZER_BYTE_VOCAB;
    ParamStore ps;
    LM lm;
    gguf_test_model(&c, &ps, &lm);
    TrainConfig tc;
    gguf_test_config(&tc, &c, false);
    for (int type = 0; type < 3; type++) {
        GgufType t = type == 0 ? GGUF_F32 : type == 1 ? GGUF_F16 : GGUF_Q8_0;
        size_t n;
        uint8_t *bytes = gguf_test_file(&tc, &ps, t, &n);
        Found f;
        uint32_t layers = 0;
        cr_assert(gguf_find(bytes, n, "blk.1.attn_q.weight", &f, "llama.block_count", &layers));
        cr_assert_eq(layers, 2u);
        const Tensor *wq = params_find(&ps, "layers.1.mixer.wq");   // (D, H dk), applied as u W
        cr_assert(f.ndim == 2 && f.ne[0] == wq->shape[0] && f.ne[1] == wq->shape[1], "ggml rows are the outputs");
        cr_assert_eq(f.type, (int)t);
        int rows = wq->shape[1], cols = wq->shape[0];
        for (int o = 0; o < rows; o++)
            for (int i = 0; i < cols; i++) {
                // (float32 files hold the parameter rounded to float: exact in
                // the float32 build, the nearest float in the float64 one)
                double want = wq->data[(size_t)i * rows + o], got;
                if (t == GGUF_F32) want = (float)want;
                if (t == GGUF_F32) got = ((const float *)f.data)[(size_t)o * cols + i];
                else if (t == GGUF_F16) got = gguf_f16_to_f32(((const uint16_t *)f.data)[(size_t)o * cols + i]);
                else {
                    size_t k = (size_t)o * cols + i, blk = k / 32;
                    const uint8_t *b = f.data + blk * 34;
                    uint16_t d;
                    memcpy(&d, b, 2);
                    got = gguf_f16_to_f32(d) * (int8_t)b[2 + k % 32];
                }
                double tol = t == GGUF_F32 ? 0 : t == GGUF_F16 ? 1e-3 * fabs(want) + 1e-7 : 0.01;
                cr_assert(fabs(got - want) <= tol, "%s: wq[%d][%d] %g, read %g", t == GGUF_F32 ? "f32" : "lossy", i,
                          o, want, got);
            }
        cr_assert(gguf_find(bytes, n, "output.weight", &f, NULL, NULL), "an untied head is written");
        cr_assert(gguf_find(bytes, n, "blk.0.ffn_norm.weight", &f, NULL, NULL) && f.type == GGUF_F32,
                  "norms stay float32");
        cr_assert(!gguf_find(bytes, n, "blk.2.attn_q.weight", &f, NULL, NULL));
        free(bytes);
    }
    lm_destroy(&lm);
    params_free(&ps);
}

Test(gguf, what_llama_cpp_cannot_compute_is_refused_by_name) {
    LMConfig c = attn_config();
    TrainConfig tc;
    gguf_test_config(&tc, &c, true);
    Tokenizer tok;
    tokenizer_bytes(&tok);
    cr_assert(export_gguf_check(&tc, &tok).ok);
    snprintf(tc.model.layers.name[1], CONFIG_NAME_MAX, "mamba");
    Status s = export_gguf_check(&tc, &tok);
    cr_assert(!s.ok && strstr(s.msg, "layer 1 is 'mamba'"), "%s", s.msg);
    snprintf(tc.model.layers.name[1], CONFIG_NAME_MAX, "attn");
    tc.model.d_v = tc.model.d_k * 2;
    s = export_gguf_check(&tc, &tok);
    cr_assert(!s.ok && strstr(s.msg, "d_k = ") && strstr(s.msg, "one head size"), "%s", s.msg);
}

// A gdn,attn hybrid in qwen35's form (q/k norm and gate on), and its config
// as the exporter reads it.
static LMConfig hybrid_config(TrainConfig *tc) {
    LMConfig c = test_tiny_lm_config("gdn,attn");
    c.d_model = 32;
    c.d_ff = 64;
    c.vocab_size = TOKENIZER_BYTE_VOCAB;
    c.mixer = mixer_config_default(32, 2, 16, 16);
    c.mixer.qk_norm = c.mixer.attn_gate = true;
    gguf_test_config(tc, &c, true);
    snprintf(tc->model.layers.name[0], CONFIG_NAME_MAX, "gdn");
    tc->model.conv_size = c.mixer.conv_size;
    tc->model.qk_norm = tc->model.attn_gate = true;
    return c;
}

static void qwen35_mutate(TrainConfig *t, int i) {
    if (i == 0) t->model.qk_norm = false;
    if (i == 1) t->model.attn_gate = false;
    if (i == 2) t->model.d_v = 2 * t->model.d_k;
    if (i == 3) t->model.conv_size = 0;
    if (i == 4) t->model.norm_eps = 1e-5;
    if (i == 5) snprintf(t->model.layers.name[0], CONFIG_NAME_MAX, "attn");
}

Test(gguf, a_hybrid_that_qwen35_cannot_compute_is_refused_with_what_to_change) {
    TrainConfig tc;
    hybrid_config(&tc);
    static const char *const says[] = {"qk_norm = true",   "attn_gate = true",          "one head size",
                                       "conv_size >= 1",   "norm_eps = 1e-06",          "fails without a gdn layer"};
    gguf_test_refusals(&tc, qwen35_mutate, says, (int)(sizeof says / sizeof says[0]));
}


// attnlab's RoPE turns pairs (2i, 2i+1); llama.cpp's qwen35 turns (i, i + dk/2)
// with the same angles: on a head whose dims are reordered 0, 2, 4, ..., 1,
// 3, 5, ... (the exporter's order) the two give the same numbers.
Test(gguf, rope_on_halves_of_the_reordered_head_is_attnlab_rope) {
    Tape tp;
    tape_init(&tp);
    int hd = 16, pos = 37;
    Tensor *x = tensor_newv(false, 3, 1, 1, hd);
    fill_normal(x, 5, 1.0);
    Tensor *y = op_rope(&tp, x, hd, pos, 10000.0);
    for (int i = 0; i < hd / 2; i++) {
        double th = pos * pow(10000.0, -2.0 * i / hd), a = x->data[2 * i], b = x->data[2 * i + 1];
        // ggml's NEOX rotation of the reordered head: its dims i and i + hd/2 are ours 2i and 2i + 1
        double lo = a * cos(th) - b * sin(th), hi = b * cos(th) + a * sin(th);
        cr_assert_float_eq(y->data[2 * i], lo, 1e-6 * (1 + fabs(lo)));
        cr_assert_float_eq(y->data[2 * i + 1], hi, 1e-6 * (1 + fabs(hi)));
    }
    tensor_free(x);
    tape_free(&tp);
}

Test(gguf, a_hybrid_is_written_in_qwen35s_layout) {
    TrainConfig tc;
    LMConfig c = hybrid_config(&tc);
    ParamStore ps;
    LM lm;
    gguf_test_model(&c, &ps, &lm);
    size_t n;
    uint8_t *bytes = gguf_test_file(&tc, &ps, GGUF_F32, &n);
    int D = 32, H = 2, dk = 16, K = c.mixer.conv_size;
    Found f;
    uint32_t u = 0;
    // attention: per head its q columns (RoPE pairs as halves), then its gate's
    cr_assert(gguf_find(bytes, n, "blk.1.attn_q.weight", &f, "qwen35.block_count", &u) && u == 2);
    cr_assert(f.ne[0] == D && f.ne[1] == 2 * H * dk);
    const Tensor *wq = params_find(&ps, "layers.1.mixer.wq"), *wg = params_find(&ps, "layers.1.mixer.w_gate");
    for (int o = 0; o < 2 * H * dk; o++) {
        int h = o / (2 * dk), j = o % (2 * dk);
        const Tensor *w = j < dk ? wq : wg;
        int col = j >= dk ? h * dk + j - dk : h * dk + (j < dk / 2 ? 2 * j : 2 * (j - dk / 2) + 1);
        for (int i = 0; i < D; i++)
            cr_assert_eq(gguf_f32_at(&f, (int64_t)o * D + i), (float)w->data[i * H * dk + col], "attn_q row %d", o);
    }
    cr_assert(gguf_find(bytes, n, "blk.1.attn_k_norm.weight", &f, NULL, NULL));
    const Tensor *kn = params_find(&ps, "layers.1.mixer.k_norm");
    for (int j = 0; j < dk; j++)
        cr_assert_eq(gguf_f32_at(&f, j), (float)kn->data[j < dk / 2 ? 2 * j : 2 * (j - dk / 2) + 1]);
    // gdn: q, k, v projections and their convolutions stacked; ssm_a = -exp(A_log)
    cr_assert(gguf_find(bytes, n, "blk.0.attn_qkv.weight", &f, "qwen35.ssm.conv_kernel", &u) && u == (uint32_t)K);
    cr_assert(f.ne[0] == D && f.ne[1] == 3 * H * dk);
    const char *proj[3] = {"layers.0.mixer.wq", "layers.0.mixer.wk", "layers.0.mixer.wv"};
    for (int o = 0; o < 3 * H * dk; o++)
        for (int i = 0; i < D; i++)
            cr_assert_eq(gguf_f32_at(&f, (int64_t)o * D + i),
                         (float)params_find(&ps, proj[o / (H * dk)])->data[i * H * dk + o % (H * dk)]);
    cr_assert(gguf_find(bytes, n, "blk.0.ssm_conv1d.weight", &f, NULL, NULL));
    cr_assert(f.ne[0] == K && f.ne[1] == 3 * H * dk && f.type == GGUF_F32, "float32 taps, one row per channel");
    const char *conv[3] = {"layers.0.mixer.conv_q", "layers.0.mixer.conv_k", "layers.0.mixer.conv_v"};
    for (int ch = 0; ch < 3 * H * dk; ch++)
        for (int i = 0; i < K; i++)
            cr_assert_eq(gguf_f32_at(&f, (int64_t)ch * K + i),
                         (float)params_find(&ps, conv[ch / (H * dk)])->data[(ch % (H * dk)) * K + i]);
    cr_assert(gguf_find(bytes, n, "blk.0.ssm_a", &f, NULL, NULL) && f.ne[0] == H);
    const Tensor *A = params_find(&ps, "layers.0.mixer.A_log");
    for (int h = 0; h < H; h++) cr_assert_float_eq(gguf_f32_at(&f, h), -exp(A->data[h]), 1e-6 * exp(A->data[h]));
    cr_assert(gguf_find(bytes, n, "blk.0.post_attention_norm.weight", &f, NULL, NULL));
    cr_assert(!gguf_find(bytes, n, "blk.0.attn_q.weight", &f, NULL, NULL));
    cr_assert(!gguf_find(bytes, n, "blk.1.ssm_a", &f, NULL, NULL));
    free(bytes);
    lm_destroy(&lm);
    params_free(&ps);
}

// A mamba2,attn hybrid exportable as granitehybrid (n_heads * d_v = 2 *
// d_model), and its config as the exporter reads it.
static LMConfig mamba2_config(TrainConfig *tc) {
    LMConfig c = test_tiny_lm_config("mamba2,attn");
    c.d_model = 16;
    c.d_ff = 32;
    c.vocab_size = TOKENIZER_BYTE_VOCAB;
    c.mixer = mixer_config_default(16, 4, 8, 8);
    gguf_test_config(tc, &c, true);
    snprintf(tc->model.layers.name[0], CONFIG_NAME_MAX, "mamba2");
    tc->model.conv_size = c.mixer.conv_size;
    return c;
}

static void mamba2_mutate(TrainConfig *t, int i) {
    static const char *const second[] = {"gdn", "mamba"};
    if (i < 2) snprintf(t->model.layers.name[1], CONFIG_NAME_MAX, "%s", second[i]);
    if (i == 2) t->model.n_heads = 2;
    if (i == 3) t->model.conv_size = 0;
    if (i == 4) t->model.qk_norm = true;
    if (i == 5) t->model.attn_gate = true;
    if (i == 6) t->model.d_k = 2 * t->model.d_v;
}

Test(gguf, a_mamba2_model_that_granitehybrid_cannot_compute_is_refused_with_what_to_change) {
    TrainConfig tc;
    mamba2_config(&tc);
    static const char *const says[] = {"layer 1 is 'gdn'", "layer 1 is 'mamba'", "n_heads * d_v = 2 * d_model",
                                       "conv_size >= 1",   "qk_norm = true",     "attn_gate = true",
                                       "one head size"};
    gguf_test_refusals(&tc, mamba2_mutate, says, (int)(sizeof says / sizeof says[0]));
}

// Mamba-2's in_proj [z | x | B | C | dt] = [Wg | Wv | Wk | Wq | w_dt], the
// convolution [conv_v; conv_k; conv_q] with a zero bias, the scalars per head
// and the per-channel norm gain; the attention layer as llama's.
Test(gguf, a_mamba2_hybrid_is_written_in_granitehybrids_layout) {
    TrainConfig tc;
    LMConfig c = mamba2_config(&tc);
    ParamStore ps;
    LM lm;
    gguf_test_model(&c, &ps, &lm);
    for (int64_t i = 0; i < ps.numel; i++) ps.data[i] += (real)(0.01 * (double)(i % 7));   // no two alike
    size_t n;
    uint8_t *bytes = gguf_test_file(&tc, &ps, GGUF_F32, &n);
    int D = 16, H = 4, dk = 8, dv = 8, K = c.mixer.conv_size, width[] = {H * dv, H * dv, H * dk, H * dk, H};
    const char *proj[] = {"wg", "wv", "wk", "wq", "w_dt"};
    Found f;
    uint32_t u = 0;
    cr_assert(gguf_find(bytes, n, "blk.0.ssm_in.weight", &f, "granitehybrid.ssm.group_count", &u) && u == (uint32_t)H);
    cr_assert(f.ne[0] == D && f.ne[1] == 2 * H * dv + 2 * H * dk + H, "ssm_in {%lld, %lld}", (long long)f.ne[0],
              (long long)f.ne[1]);
    int64_t o = 0;
    for (int b = 0; b < 5; b++) {
        char name[64];
        snprintf(name, sizeof name, "layers.0.mixer.%s", proj[b]);
        const Tensor *w = params_find(&ps, name);
        for (int j = 0; j < width[b]; j++, o++)
            for (int i = 0; i < D; i++)
                cr_assert_eq(gguf_f32_at(&f, o * D + i), (float)w->data[i * width[b] + j], "ssm_in row %lld",
                             (long long)o);
    }
    cr_assert(gguf_find(bytes, n, "blk.0.ssm_conv1d.weight", &f, "granitehybrid.ssm.conv_kernel", &u) &&
              u == (uint32_t)K);
    int C = H * dv + 2 * H * dk;
    cr_assert(f.ne[0] == K && f.ne[1] == C && f.type == GGUF_F32);
    const char *conv[] = {"layers.0.mixer.conv_v", "layers.0.mixer.conv_k", "layers.0.mixer.conv_q"};
    for (int ch = 0, at = 0; ch < C; ch++) {
        int b = ch < H * dv ? 0 : ch < H * dv + H * dk ? 1 : 2, start = b == 0 ? 0 : H * dv + (b - 1) * H * dk;
        for (int i = 0; i < K; i++, at++)
            cr_assert_eq(gguf_f32_at(&f, at), (float)params_find(&ps, conv[b])->data[(ch - start) * K + i]);
    }
    cr_assert(gguf_find(bytes, n, "blk.0.ssm_conv1d.bias", &f, NULL, NULL) && f.ne[0] == C);
    for (int ch = 0; ch < C; ch++) cr_assert_eq(gguf_f32_at(&f, ch), 0.0f);
    const Tensor *A = params_find(&ps, "layers.0.mixer.A_log"), *Dh = params_find(&ps, "layers.0.mixer.D");
    cr_assert(gguf_find(bytes, n, "blk.0.ssm_a", &f, NULL, NULL) && f.ne[0] == 1 && f.ne[1] == H);
    for (int h = 0; h < H; h++) cr_assert_float_eq(gguf_f32_at(&f, h), -exp(A->data[h]), 1e-6 * exp(A->data[h]));
    cr_assert(gguf_find(bytes, n, "blk.0.ssm_d", &f, NULL, NULL) && f.ne[0] == 1 && f.ne[1] == H);
    for (int h = 0; h < H; h++) cr_assert_eq(gguf_f32_at(&f, h), (float)Dh->data[h]);
    const Tensor *w = params_find(&ps, "layers.0.mixer.out_norm");
    cr_assert(gguf_find(bytes, n, "blk.0.ssm_norm.weight", &f, NULL, NULL) && f.ne[0] == dv && f.ne[1] == H);
    for (int j = 0; j < H * dv; j++) cr_assert_eq(gguf_f32_at(&f, j), (float)w->data[j]);
    cr_assert(gguf_find(bytes, n, "blk.1.attn_q.weight", &f, NULL, NULL) && f.ne[0] == D && f.ne[1] == H * dk);
    cr_assert(gguf_find(bytes, n, "blk.0.ffn_norm.weight", &f, NULL, NULL));
    cr_assert(!gguf_find(bytes, n, "blk.0.attn_q.weight", &f, NULL, NULL));
    cr_assert(!gguf_find(bytes, n, "blk.1.ssm_in.weight", &f, NULL, NULL));
    free(bytes);
    lm_destroy(&lm);
    params_free(&ps);
}

// A kda,kda model exportable as kimi-linear (no gate bias, d_k = d_v), and
// its config as the exporter reads it.
static LMConfig kimi_config(TrainConfig *tc) {
    LMConfig c = test_tiny_lm_config("kda,kda");
    c.d_model = 32;
    c.d_ff = 64;
    c.vocab_size = TOKENIZER_BYTE_VOCAB;
    c.mixer = mixer_config_default(32, 2, 16, 16);
    c.mixer.kda_gate_bias = false;
    gguf_test_config(tc, &c, true);
    for (int l = 0; l < 2; l++) snprintf(tc->model.layers.name[l], CONFIG_NAME_MAX, "kda");
    tc->model.conv_size = c.mixer.conv_size;
    tc->model.kda_gate_bias = false;
    return c;
}

static void kimi_mutate(TrainConfig *t, int i) {
    if (i == 0) t->model.kda_gate_bias = true;
    if (i == 1) t->model.d_v = 2 * t->model.d_k;
    if (i == 2) t->model.conv_size = 0;
    if (i == 3) t->model.norm_eps = 1e-5;
    if (i == 4) snprintf(t->model.layers.name[1], CONFIG_NAME_MAX, "attn");
    if (i == 5) snprintf(t->model.layers.name[0], CONFIG_NAME_MAX, "gdn");
}

Test(gguf, a_kda_model_that_kimi_linear_cannot_compute_is_refused_with_what_to_change) {
    TrainConfig tc;
    kimi_config(&tc);
    static const char *const says[] = {
        "kda_gate_bias = true: the kda output gate has a bias b_g2, and llama.cpp's 'kimi-linear' architecture "
        "gates with sigmoid((u W_g1) W_g2) without one; train with [model] kda_gate_bias = false to export",
        "d_k = 16 and d_v = 32: llama.cpp's 'kimi-linear' architecture has one head size",
        "conv_size = 0: kda then has no short convolution and no SiLU",
        "norm_eps = 1e-05: llama.cpp's 'kimi-linear' architecture adds the RMSNorm epsilon inside kda's L2 norm of q "
        "and k, where attnlab adds 1e-06; train with norm_eps = 1e-06 to export",
        "layer 1 is 'attn' in a model with 'kda' layers",
        "layer 0 is 'gdn' in a model with 'kda' layers"};
    gguf_test_refusals(&tc, kimi_mutate, says, (int)(sizeof says / sizeof says[0]));
}

// The kda layers' tensors under kimi-linear's names and shapes, with their
// values; the required output projection as the tied embedding; the
// pass-through block after the model's layers, zero but its gains.
Test(gguf, a_kda_model_is_written_in_kimi_linears_layout) {
    TrainConfig tc;
    LMConfig c = kimi_config(&tc);
    ParamStore ps;
    LM lm;
    gguf_test_model(&c, &ps, &lm);
    cr_assert_null(params_find(&ps, "layers.0.mixer.b_g2"), "kda_gate_bias = false: no b_g2");
    for (int64_t i = 0; i < ps.numel; i++) ps.data[i] += (real)(0.01 * (double)(i % 7));   // no two alike
    size_t n;
    uint8_t *bytes = gguf_test_file(&tc, &ps, GGUF_F32, &n);
    int D = 32, H = 2, dk = 16, K = c.mixer.conv_size, V = TOKENIZER_BYTE_VOCAB;
    static const struct {
        const char *key;
        uint32_t want;
    } keys[] = {{"kimi-linear.block_count", 3},       {"kimi-linear.leading_dense_block_count", 3},
                {"kimi-linear.kda.head_dim", 16},     {"kimi-linear.ssm.conv_kernel", 4},
                {"kimi-linear.attention.head_count", 2}, {"kimi-linear.attention.key_length_mla", 0}};
    Found f;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        uint32_t u = 12345;
        cr_assert(gguf_find(bytes, n, "token_embd.weight", &f, keys[i].key, &u));
        cr_assert_eq(u, keys[i].want, "%s = %u, want %u", keys[i].key, u, keys[i].want);
    }
    static const char *const dense[][2] = {{"attn_q", "wq"},     {"attn_k", "wk"},     {"attn_v", "wv"},
                                           {"attn_output", "wo"}, {"ssm_f_a", "w_f1"}, {"ssm_f_b", "w_f2"},
                                           {"ssm_beta", "w_beta"}, {"ssm_g_a", "w_g1"}, {"ssm_g_b", "w_g2"}};
    for (int l = 0; l < 2; l++) {
        char name[64], ours[64];
        for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, dense[i][0]);
            snprintf(ours, sizeof ours, "layers.%d.mixer.%s", l, dense[i][1]);
            cr_assert(gguf_find(bytes, n, name, &f, NULL, NULL), "%s", name);
            gguf_assert_transposed(&f, params_find(&ps, ours), name);
        }
        static const char *const conv[] = {"q", "k", "v"};
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof name, "blk.%d.ssm_conv1d_%s.weight", l, conv[i]);
            snprintf(ours, sizeof ours, "layers.%d.mixer.conv_%s", l, conv[i]);
            cr_assert(gguf_find(bytes, n, name, &f, NULL, NULL), "%s", name);
            cr_assert(f.ndim == 3 && f.ne[0] == K && f.ne[1] == 1 && f.ne[2] == H * dk && f.type == GGUF_F32, "%s",
                      name);
            const Tensor *w = params_find(&ps, ours);   // (H dk, K): the same order
            for (int64_t j = 0; j < w->numel; j++)
                cr_assert_eq(gguf_f32_at(&f, j), (float)w->data[j], "%s %lld", name, (long long)j);
        }
        snprintf(ours, sizeof ours, "layers.%d.mixer.A_log", l);
        const Tensor *A = params_find(&ps, ours);
        snprintf(name, sizeof name, "blk.%d.ssm_a", l);
        cr_assert(gguf_find(bytes, n, name, &f, NULL, NULL) && f.ndim == 2 && f.ne[0] == 1 && f.ne[1] == H);
        for (int h = 0; h < H; h++) cr_assert_float_eq(gguf_f32_at(&f, h), -exp(A->data[h]), 1e-6 * exp(A->data[h]));
        static const char *const vec[][2] = {{"ssm_dt.bias", "dt_bias"}, {"ssm_norm.weight", "out_norm"}};
        for (int i = 0; i < 2; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, vec[i][0]);
            snprintf(ours, sizeof ours, "layers.%d.mixer.%s", l, vec[i][1]);
            const Tensor *w = params_find(&ps, ours);
            cr_assert(gguf_find(bytes, n, name, &f, NULL, NULL) && f.ndim == 1 && f.ne[0] == w->numel, "%s", name);
            for (int64_t j = 0; j < w->numel; j++) cr_assert_eq(gguf_f32_at(&f, j), (float)w->data[j], "%s", name);
        }
    }
    const Tensor *E = params_find(&ps, "embed");   // (V, D): ggml's {D, V} as stored
    cr_assert(gguf_find(bytes, n, "output.weight", &f, NULL, NULL) && f.ne[0] == D && f.ne[1] == V);
    for (int64_t j = 0; j < E->numel; j++)
        cr_assert_eq(gguf_f32_at(&f, j), (float)E->data[j], "output %lld", (long long)j);
    static const char *const zero[] = {"attn_q", "attn_kv_a_mqa", "attn_kv_b", "attn_output", "ffn_gate", "ffn_up",
                                       "ffn_down"};
    for (size_t i = 0; i < sizeof zero / sizeof zero[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.2.%s.weight", zero[i]);
        cr_assert(gguf_find(bytes, n, name, &f, NULL, NULL), "%s", name);
        cr_assert(gguf_all_zero(&f), "%s is not all 0", name);
    }
    cr_assert(gguf_find(bytes, n, "blk.2.ffn_down.weight", &f, NULL, NULL) && f.ne[0] == 64 && f.ne[1] == D);
    cr_assert(gguf_find(bytes, n, "blk.2.attn_output.weight", &f, NULL, NULL) && f.ne[1] == D);
    cr_assert(!gguf_find(bytes, n, "blk.2.ssm_a", &f, NULL, NULL), "the pass-through block is not kda");
    cr_assert(!gguf_find(bytes, n, "blk.3.attn_norm.weight", &f, NULL, NULL), "one block more, not two");
    free(bytes);
    lm_destroy(&lm);
    params_free(&ps);
}
