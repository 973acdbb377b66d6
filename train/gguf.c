// gguf.c: the GGUF writer (gguf.h).
#include "gguf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { GGUF_VERSION = 3, QK8_0 = 32 };
enum { T_UINT32 = 4, T_INT32 = 5, T_FLOAT32 = 6, T_BOOL = 7, T_STRING = 8, T_ARRAY = 9 };   // gguf_type values

typedef struct Bytes {
    uint8_t *p;
    size_t n, cap;
} Bytes;

static void put(Bytes *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = xrealloc(b->p, b->cap);
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(Bytes *b, uint32_t x) { put(b, &x, 4); }
static void put_u64(Bytes *b, uint64_t x) { put(b, &x, 8); }
static void put_str(Bytes *b, const char *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}

typedef struct GgufTensor {
    char *name;
    int ndim;
    int64_t ne[4];
    GgufType type;
    Bytes data;
} GgufTensor;

struct Gguf {
    Bytes kv;
    uint64_t n_kv;
    GgufTensor *t;
    int n_t, cap_t;
};

Gguf *gguf_new(void) { return xcalloc(1, sizeof(Gguf)); }

void gguf_free(Gguf *g) {
    if (!g) return;
    for (int i = 0; i < g->n_t; i++) {
        free(g->t[i].name);
        free(g->t[i].data.p);
    }
    free(g->t);
    free(g->kv.p);
    free(g);
}

static void key(Gguf *g, const char *k, uint32_t type) {
    put_str(&g->kv, k, strlen(k));
    put_u32(&g->kv, type);
    g->n_kv++;
}

void gguf_kv_str(Gguf *g, const char *k, const char *value) {
    key(g, k, T_STRING);
    put_str(&g->kv, value, strlen(value));
}

void gguf_kv_u32(Gguf *g, const char *k, uint32_t value) {
    key(g, k, T_UINT32);
    put_u32(&g->kv, value);
}

void gguf_kv_f32(Gguf *g, const char *k, float value) {
    key(g, k, T_FLOAT32);
    put(&g->kv, &value, 4);
}

void gguf_kv_bool(Gguf *g, const char *k, bool value) {
    key(g, k, T_BOOL);
    uint8_t v = value;
    put(&g->kv, &v, 1);
}

void gguf_kv_strs(Gguf *g, const char *k, const char *const *values, const size_t *lens, size_t n) {
    key(g, k, T_ARRAY);
    put_u32(&g->kv, T_STRING);
    put_u64(&g->kv, n);
    for (size_t i = 0; i < n; i++) put_str(&g->kv, values[i], lens[i]);
}

void gguf_kv_i32s(Gguf *g, const char *k, const int32_t *values, size_t n) {
    key(g, k, T_ARRAY);
    put_u32(&g->kv, T_INT32);
    put_u64(&g->kv, n);
    put(&g->kv, values, n * sizeof *values);
}

uint16_t gguf_f32_to_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7fffffffu;
    if (mag >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0));   // inf, nan
    if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   // rounds past 65504: inf
    if (mag < 0x38800000u) {   // a subnormal half (or zero): units of 2^-24, rounded to nearest even
        float a;
        memcpy(&a, &mag, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
    }
    uint32_t h = ((mag - 0x38000000u) >> 13);   // rebias the exponent 127 -> 15, drop 13 bits
    uint32_t rest = mag & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float gguf_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    float out;
    if (e == 0) {
        out = ldexpf((float)m, -24);
        return sign ? -out : out;
    }
    uint32_t u = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    memcpy(&out, &u, 4);
    return out;
}

static void quantize_q8_0(Bytes *out, const float *x, int64_t n) {
    for (int64_t b = 0; b < n; b += QK8_0) {
        float amax = 0;
        for (int j = 0; j < QK8_0; j++) amax = fmaxf(amax, fabsf(x[b + j]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t dh = gguf_f32_to_f16(d);
        put(out, &dh, 2);
        int8_t q[QK8_0];
        for (int j = 0; j < QK8_0; j++) q[j] = (int8_t)roundf(x[b + j] * id);
        put(out, q, QK8_0);
    }
}

void gguf_tensor(Gguf *g, const char *name, int ndim, const int64_t *ne, GgufType type, const float *data) {
    ASSERT(ndim >= 1 && ndim <= 4, "gguf_tensor(%s): %d dimensions", name, ndim);
    ASSERT(type != GGUF_Q8_0 || ne[0] % QK8_0 == 0, "gguf_tensor(%s): Q8_0 rows of %lld", name, (long long)ne[0]);
    if (g->n_t == g->cap_t) {
        g->cap_t = g->cap_t * 2 + 16;
        g->t = xrealloc(g->t, (size_t)g->cap_t * sizeof *g->t);
    }
    GgufTensor *t = &g->t[g->n_t++];
    memset(t, 0, sizeof *t);
    t->name = xmalloc(strlen(name) + 1);
    strcpy(t->name, name);
    t->ndim = ndim;
    t->type = type;
    int64_t n = 1;
    for (int k = 0; k < ndim; k++) n *= (t->ne[k] = ne[k]);
    if (type == GGUF_F32) put(&t->data, data, (size_t)n * 4);
    else if (type == GGUF_F16)
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = gguf_f32_to_f16(data[i]);
            put(&t->data, &h, 2);
        }
    else quantize_q8_0(&t->data, data, n);
}

static size_t aligned(size_t n) { return (n + GGUF_ALIGNMENT - 1) / GGUF_ALIGNMENT * GGUF_ALIGNMENT; }

uint8_t *gguf_bytes(const Gguf *g, size_t *n) {
    Bytes out = {0};
    put_u32(&out, 0x46554747u);   // "GGUF"
    put_u32(&out, GGUF_VERSION);
    put_u64(&out, (uint64_t)g->n_t);
    put_u64(&out, g->n_kv);
    put(&out, g->kv.p, g->kv.n);
    size_t offset = 0;
    for (int i = 0; i < g->n_t; i++) {
        const GgufTensor *t = &g->t[i];
        put_str(&out, t->name, strlen(t->name));
        put_u32(&out, (uint32_t)t->ndim);
        for (int k = 0; k < t->ndim; k++) put_u64(&out, (uint64_t)t->ne[k]);
        put_u32(&out, (uint32_t)t->type);
        put_u64(&out, offset);
        offset = aligned(offset + t->data.n);
    }
    static const uint8_t zeros[GGUF_ALIGNMENT];
    put(&out, zeros, aligned(out.n) - out.n);
    for (int i = 0; i < g->n_t; i++) {
        put(&out, g->t[i].data.p, g->t[i].data.n);
        put(&out, zeros, aligned(out.n) - out.n);
    }
    *n = out.n;
    return out.p;
}
