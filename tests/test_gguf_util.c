// test_gguf_util.c: a GGUF reader written from the format, and the models
// the GGUF tests export (test_gguf_util.h).
#include <stdlib.h>
#include <string.h>

#include "test_gguf_util.h"

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

bool gguf_find(const uint8_t *p, size_t n, const char *name, Found *f, const char *key, uint32_t *u32) {
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

int gguf_key_ints(const uint8_t *p, size_t n, const char *key, int64_t *v, int max) {
    Rd r = {p, n, 0};
    cr_assert_eq(rd(&r, 4), 0x46554747u, "magic");
    cr_assert_eq(rd(&r, 4), 3u, "version");
    rd(&r, 8);
    uint64_t nkv = rd(&r, 8);
    for (uint64_t i = 0; i < nkv; i++) {
        size_t len;
        const char *k = rd_str(&r, &len);
        uint32_t type = (uint32_t)rd(&r, 4);
        if (len != strlen(key) || memcmp(k, key, len) != 0) {
            skip_value(&r, type);
            continue;
        }
        if (type == 4 || type == 5) {   // uint32, int32
            uint32_t u = (uint32_t)rd(&r, 4);
            cr_assert_geq(max, 1);
            v[0] = type == 4 ? (int64_t)u : (int64_t)(int32_t)u;
            return 1;
        }
        cr_assert_eq(type, 9u, "%s is neither a 32-bit integer nor an array", key);
        cr_assert_eq(rd(&r, 4), 5u, "%s is not an array of int32", key);
        uint64_t count = rd(&r, 8);
        cr_assert_leq(count, (uint64_t)max, "%s has %llu values", key, (unsigned long long)count);
        for (uint64_t j = 0; j < count; j++) v[j] = (int32_t)(uint32_t)rd(&r, 4);
        return (int)count;
    }
    return -1;
}

bool gguf_all_zero(const Found *f) {
    int64_t n = f->ne[0] * f->ne[1] * f->ne[2] * f->ne[3];
    int64_t bytes = f->type == GGUF_F32 ? 4 * n : f->type == GGUF_F16 ? 2 * n : n / 32 * 34;
    cr_assert(f->type == GGUF_F32 || f->type == GGUF_F16 || (f->type == GGUF_Q8_0 && f->ne[0] % 32 == 0),
              "type %d", f->type);
    for (int64_t i = 0; i < bytes; i++)
        if (f->data[i]) return false;
    return true;
}

void gguf_test_config(TrainConfig *tc, const LMConfig *c, bool tied) {
    memset(tc, 0, sizeof *tc);
    tc->model.layers.n = c->n_layers;
    for (int l = 0; l < c->n_layers; l++) snprintf(tc->model.layers.name[l], CONFIG_NAME_MAX, "attn");
    tc->model.d_model = c->d_model, tc->model.n_heads = c->mixer.n_heads;
    tc->model.d_k = c->mixer.d_k, tc->model.d_v = c->mixer.d_v, tc->model.d_ff = c->d_ff;
    tc->model.tied_embeddings = tied, tc->model.norm_eps = 1e-6, tc->model.rope_base = 10000;
    tc->data.seq_len = 64;
}

void gguf_test_model(const LMConfig *c, ParamStore *ps, LM *lm) {
    params_init(ps);
    lm_create(lm, c, ps);
    params_finalize(ps, 3);
}

uint8_t *gguf_test_file(const TrainConfig *tc, const ParamStore *ps, GgufType type, size_t *n) {
    Tokenizer tok;
    tokenizer_bytes(&tok);
    uint8_t *bytes = NULL;
    Status s = export_gguf_bytes(tc, ps, &tok, type, &bytes, n);
    cr_assert(s.ok, "%s", s.msg);
    return bytes;
}

void gguf_test_refusals(const TrainConfig *tc, void (*mutate)(TrainConfig *t, int i), const char *const *says, int n) {
    Tokenizer tok;
    tokenizer_bytes(&tok);
    Status s = export_gguf_check(tc, &tok);
    cr_assert(s.ok, "%s", s.msg);
    for (int i = 0; i < n; i++) {
        TrainConfig t = *tc;
        mutate(&t, i);
        s = export_gguf_check(&t, &tok);
        cr_assert(!s.ok && strstr(s.msg, says[i]), "change %d: %s", i, s.ok ? "exported" : s.msg);
    }
}

void gguf_assert_transposed(const Found *f, const Tensor *w, const char *name) {
    int64_t in = w->shape[0], out = w->shape[1];
    cr_assert(f->type == GGUF_F32 && f->ne[0] == in && f->ne[1] == out, "%s {%lld, %lld}", name, (long long)f->ne[0],
              (long long)f->ne[1]);
    for (int64_t j = 0; j < out; j++)
        for (int64_t i = 0; i < in; i++)
            cr_assert_eq(gguf_f32_at(f, j * in + i), (float)w->data[i * out + j], "%s (%lld, %lld)", name, (long long)i,
                         (long long)j);
}
