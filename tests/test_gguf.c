// GGUF export: the half-precision rounding, Q8_0 blocks, and the file read
// back by a reader written here from the format: every key, tensor name,
// shape and value as written (the llama.cpp comparison is tests/test_llama.sh).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "export_gguf.h"
#include "lm.h"
#include "test_util.h"

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

// ---------------------------------------------------------------- a reader

typedef struct Rd {
    const uint8_t *p;
    size_t n, at;
} Rd;

static uint64_t rd(Rd *r, int bytes) {
    cr_assert_leq(r->at + (size_t)bytes, r->n, "the file ends inside a field");
    uint64_t v = 0;
    memcpy(&v, r->p + r->at, (size_t)bytes);
    r->at += (size_t)bytes;
    return v;
}

static const char *rd_str(Rd *r, size_t *len) {
    *len = rd(r, 8);
    cr_assert_leq(r->at + *len, r->n);
    const char *s = (const char *)r->p + r->at;
    r->at += *len;
    return s;
}

static void skip_value(Rd *r, uint32_t type) {
    static const int size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    size_t len;
    if (type == 8) rd_str(r, &len);
    else if (type == 9) {
        uint32_t t = (uint32_t)rd(r, 4);
        uint64_t n = rd(r, 8);
        for (uint64_t i = 0; i < n; i++) skip_value(r, t);
    } else {
        cr_assert_lt(type, 13u);
        rd(r, size[type]);
    }
}

typedef struct Found {
    int64_t ne[4];
    int ndim, type;
    const uint8_t *data;
} Found;

// Walk the whole file; find tensor `name` and the u32 key `key` (value into *u32).
static bool gguf_find(const uint8_t *p, size_t n, const char *name, Found *f, const char *key, uint32_t *u32) {
    Rd r = {p, n, 0};
    cr_assert_eq(rd(&r, 4), 0x46554747u, "magic");
    cr_assert_eq(rd(&r, 4), 3u, "version");
    uint64_t nt = rd(&r, 8), nkv = rd(&r, 8);
    for (uint64_t i = 0; i < nkv; i++) {
        size_t len;
        const char *k = rd_str(&r, &len);
        uint32_t type = (uint32_t)rd(&r, 4);
        if (key && len == strlen(key) && !memcmp(k, key, len) && type == 4) *u32 = (uint32_t)rd(&r, 4);
        else skip_value(&r, type);
    }
    bool found = false;
    uint64_t offset = 0;
    for (uint64_t i = 0; i < nt; i++) {
        size_t len;
        const char *tn = rd_str(&r, &len);
        int nd = (int)rd(&r, 4);
        int64_t ne[4] = {1, 1, 1, 1};
        for (int k = 0; k < nd; k++) ne[k] = (int64_t)rd(&r, 8);
        int type = (int)rd(&r, 4);
        uint64_t off = rd(&r, 8);
        cr_assert_eq(off % GGUF_ALIGNMENT, 0u);
        if (len == strlen(name) && !memcmp(tn, name, len)) {
            found = true, offset = off, f->ndim = nd, f->type = type;
            memcpy(f->ne, ne, sizeof ne);
        }
    }
    size_t data = (r.at + GGUF_ALIGNMENT - 1) / GGUF_ALIGNMENT * GGUF_ALIGNMENT;
    if (found) {
        cr_assert_leq(data + offset, n);
        f->data = p + data + offset;
    }
    return found;
}

// Rows of 32: Q8_0 blocks fit every matrix.
static LMConfig attn_config(void) {
    LMConfig c = test_tiny_lm_config("attn,attn");
    c.d_model = 32;
    c.d_ff = 64;
    c.mixer = mixer_config_default(32, 2, 16, 16);
    return c;
}

// A config as TrainConfig, for the exporter: the fields it reads.
static void train_config_of(TrainConfig *tc, const LMConfig *c, bool tied) {
    memset(tc, 0, sizeof *tc);
    tc->model.layers.n = c->n_layers;
    for (int l = 0; l < c->n_layers; l++) snprintf(tc->model.layers.name[l], CONFIG_NAME_MAX, "attn");
    tc->model.d_model = c->d_model, tc->model.n_heads = c->mixer.n_heads;
    tc->model.d_k = c->mixer.d_k, tc->model.d_v = c->mixer.d_v, tc->model.d_ff = c->d_ff;
    tc->model.tied_embeddings = tied, tc->model.norm_eps = 1e-6, tc->model.rope_base = 10000;
    tc->data.seq_len = 64;
}

Test(gguf, a_model_reads_back_transposed_and_exact) {
    LMConfig c = attn_config();
    c.tied = false;
    c.vocab_size = TOKENIZER_BYTE_VOCAB;
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &c, &ps);
    params_finalize(&ps, 3);
    TrainConfig tc;
    train_config_of(&tc, &c, false);
    Tokenizer tok;
    tokenizer_bytes(&tok);
    for (int type = 0; type < 3; type++) {
        GgufType t = type == 0 ? GGUF_F32 : type == 1 ? GGUF_F16 : GGUF_Q8_0;
        uint8_t *bytes;
        size_t n;
        Status s = export_gguf_bytes(&tc, &ps, &tok, t, &bytes, &n);
        cr_assert(s.ok, "%s", s.msg);
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
    train_config_of(&tc, &c, true);
    Tokenizer tok;
    tokenizer_bytes(&tok);
    cr_assert(export_gguf_check(&tc, &tok).ok);
    snprintf(tc.model.layers.name[1], CONFIG_NAME_MAX, "gdn");
    Status s = export_gguf_check(&tc, &tok);
    cr_assert(!s.ok && strstr(s.msg, "layer 1 is 'gdn'"), "%s", s.msg);
    snprintf(tc.model.layers.name[1], CONFIG_NAME_MAX, "attn");
    tc.model.d_v = tc.model.d_k * 2;
    s = export_gguf_check(&tc, &tok);
    cr_assert(!s.ok && strstr(s.msg, "d_k = ") && strstr(s.msg, "one head size"), "%s", s.msg);
}
