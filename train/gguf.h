// gguf.h: a GGUF file (llama.cpp's model format, version 3) built in memory.
//
// A file is: the magic "GGUF", the version, the tensor and key counts; the
// key-value metadata (typed values and arrays); per tensor its name, its
// dimensions innermost first (ggml's ne[0] is the length of a row), its
// element type and its data's offset; then the data, each tensor aligned to
// GGUF_ALIGNMENT bytes. Everything is little-endian.
//
// Tensors come in as float32 rows and are stored as float32, float16 or
// Q8_0 (blocks of 32 values: a float16 scale d = max|x| / 127 and 32 signed
// bytes round(x / d)), the element types llama.cpp users expect.
#ifndef TRAIN_GGUF_H
#define TRAIN_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

#define GGUF_ALIGNMENT 32

typedef enum { GGUF_F32 = 0, GGUF_F16 = 1, GGUF_Q8_0 = 8 } GgufType;   // ggml_type values

typedef struct Gguf Gguf;

Gguf *gguf_new(void);
void gguf_free(Gguf *g);

void gguf_kv_str(Gguf *g, const char *key, const char *value);
void gguf_kv_u32(Gguf *g, const char *key, uint32_t value);
void gguf_kv_f32(Gguf *g, const char *key, float value);
void gguf_kv_bool(Gguf *g, const char *key, bool value);
// An array of n strings, each given with its length (a token may hold any bytes).
void gguf_kv_strs(Gguf *g, const char *key, const char *const *values, const size_t *lens, size_t n);
void gguf_kv_i32s(Gguf *g, const char *key, const int32_t *values, size_t n);

// A tensor of ne[0] x ne[1] x ... (ne[0] the row length) from float32 values
// in row-major order, stored as `type` (Q8_0 needs ne[0] % 32 == 0).
void gguf_tensor(Gguf *g, const char *name, int ndim, const int64_t *ne, GgufType type, const float *data);

// The whole file's bytes (malloc'd; *n its size).
uint8_t *gguf_bytes(const Gguf *g, size_t *n);

// IEEE half precision, rounded to nearest even (and back).
uint16_t gguf_f32_to_f16(float x);
float gguf_f16_to_f32(uint16_t h);

#endif
