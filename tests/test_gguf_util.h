// test_gguf_util.h: what the GGUF exporter's tests share (test_gguf_util.c):
// a reader written here from the format, and the models they export.
#ifndef TEST_GGUF_UTIL_H
#define TEST_GGUF_UTIL_H

#include "export_gguf.h"
#include "lm.h"
#include "test_util.h"

// A tensor found in a file: its shape, ggml type and data.
typedef struct Found {
    int64_t ne[4];
    int ndim, type;
    const uint8_t *data;
} Found;

// Walk the whole file; find tensor `name` (into *f) and the u32 key `key`
// (value into *u32; key may be NULL).
bool gguf_find(const uint8_t *p, size_t n, const char *name, Found *f, const char *key, uint32_t *u32);
// The values of key, a (u)int32 or an array of int32 (at most max of them,
// into v): how many, or -1 where the file has no such key.
int gguf_key_ints(const uint8_t *p, size_t n, const char *key, int64_t *v, int max);
static inline float gguf_f32_at(const Found *f, int64_t i) { return ((const float *)f->data)[i]; }
// Is every value of the tensor (float32, float16 or Q8_0) exactly 0: is
// every byte of it 0 (a Q8_0 block of zeros has the scale 0)?
bool gguf_all_zero(const Found *f);

// c's config as TrainConfig, the fields the exporter reads (every layer
// named 'attn': a test renames the others).
void gguf_test_config(TrainConfig *tc, const LMConfig *c, bool tied);
// A model of config c, its parameters drawn (seed 3).
void gguf_test_model(const LMConfig *c, ParamStore *ps, LM *lm);
// The model's GGUF file as `type`, with the byte tokenizer (it must export).
uint8_t *gguf_test_file(const TrainConfig *tc, const ParamStore *ps, GgufType type, size_t *n);
// tc exports; each change mutate(t, i) makes to a copy of it is refused
// with a message that contains says[i] (what to change).
void gguf_test_refusals(const TrainConfig *tc, void (*mutate)(TrainConfig *t, int i), const char *const *says, int n);
// Element (i, j) of a {rows, cols}-transposed float32 ggml weight is
// attnlab's (i, j) of the (in, out) parameter w: ggml row j holds its column j.
void gguf_assert_transposed(const Found *f, const Tensor *w, const char *name);

#endif
