// bf16.h: bfloat16 numbers (the top 16 bits of a float32: 8 exponent bits,
// 7 mantissa bits) for the mixed-precision products of blas.h.
//
// float32 -> bf16 rounds to nearest, ties to even (what AVX512_BF16's
// vcvtne2ps2bf16 and oneDNN's reorders do); a NaN stays a NaN (quiet). The
// conversion loops are plain integer arithmetic that GCC vectorises, so they
// need no intrinsics and run on any CPU (only the products need AVX512_BF16).
#ifndef AG_BF16_H
#define AG_BF16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t bf16;
typedef uint32_t __attribute__((may_alias)) bf16_bits32;   // a float's bits, read in place

// The bf16 bits of a float's 32 bits u (in the low 16 bits), rounded half to
// even; a NaN stays a NaN, quiet. A select, not a branch, so loops over it
// vectorise.
static inline uint32_t bf16_bits(uint32_t u) {
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40 : r;
}

static inline bf16 bf16_from_float(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (bf16)bf16_bits(u);
}

static inline float bf16_to_float(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// float32 rounded to the nearest bf16, as a float32 (the reference products
// of the tests multiply these).
static inline float bf16_round(float f) { return bf16_to_float(bf16_from_float(f)); }

// dst (n x w, row stride ldd) = src (n x w, row stride lds) rounded to bf16.
static inline void bf16_from_rows(bf16 *dst, int64_t ldd, const float *src, int64_t lds, int n, int w) {
    for (int i = 0; i < n; i++) {
        const bf16_bits32 *s = (const bf16_bits32 *)(src + i * lds);
        bf16 *d = dst + i * ldd;
#pragma omp simd
        for (int j = 0; j < w; j++) d[j] = (bf16)bf16_bits(s[j]);
    }
}

#endif
