// ops_math.h: scalar math in the build's precision, shared by the op kernels
// (private to src/; not part of the public op interface).
//
// expf/logf in float32 builds are several times faster than their double
// versions; the r_* wrappers pick the one matching `real`.
#ifndef AG_OPS_MATH_H
#define AG_OPS_MATH_H

#include <math.h>

#include "common.h"
#include "cuda_ops.h"

// Elementwise and row loops go parallel above this many elements; below it the
// OpenMP fork costs more than the loop.
#define OPS_PAR_MIN 32768

// Backward loops that write a fresh gradient (tensor_grad_fresh) or add to
// one: d[i] = e when `fresh`, else d[i] += e, for i in [0, n), in parallel
// above OPS_PAR_MIN elements. Two loops rather than a test of `fresh` per
// element: GCC does not vectorise the latter. `e` is an expression in i.
#define GRAD_WRITE_LOOP(fresh, n, d, e)                                                \
    do {                                                                               \
        const int64_t gwl_n = (n);                                                     \
        real *const gwl_d = (d);                                                       \
        if (fresh) {                                                                   \
            _Pragma("omp parallel for if (gwl_n > OPS_PAR_MIN) schedule(static)")      \
            for (int64_t i = 0; i < gwl_n; i++) gwl_d[i] = (e);                        \
        } else {                                                                       \
            _Pragma("omp parallel for if (gwl_n > OPS_PAR_MIN) schedule(static)")      \
            for (int64_t i = 0; i < gwl_n; i++) gwl_d[i] += (e);                       \
        }                                                                              \
    } while (0)

// The same for one row inside a loop that is already parallel: d = src
// (fresh) or d += src, n elements.
static inline void grad_store(real *d, const real *src, int64_t n, bool fresh) {
    if (fresh)
        for (int64_t i = 0; i < n; i++) d[i] = src[i];
    else
        for (int64_t i = 0; i < n; i++) d[i] += src[i];
}

// sum_{j<n} x_j y_j in double, each term also added to col[j]: one row's
// total and its share of the column totals of a triangle of (L, L) terms, in
// one vectorised pass (the chunk backwards' dG sums). Subtracting a column
// total inside the row loop instead chains every step through memory.
static inline double dot_into_cols(const real *x, const real *y, int n, double *col) {
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n; j++) {
        double z = (double)x[j] * y[j];
        s += z;
        col[j] += z;
    }
    return s;
}

#ifdef AG_DOUBLE
static inline real r_exp(real x) { return exp(x); }
static inline real r_log1p(real x) { return log1p(x); }
static inline real r_sqrt(real x) { return sqrt(x); }

// Logistic sigmoid without overflow: exp of a non-positive number only.
static inline real r_sigmoid(real x) {
    if (x >= 0) return 1 / (1 + r_exp(-x));
    real e = r_exp(x);
    return e / (1 + e);
}
#else
#include <stdint.h>
#include <string.h>
// float32 exp without a library call, so activation loops vectorise (the
// library's expf is a scalar call per element and took a quarter of a
// training step). Range reduction x = n ln2 + r with ln2 split in two
// (Cody-Waite), |r| <= ln2/2, then a degree-6 minimax polynomial for e^r
// (Cephes' coefficients): within 2 ulp of expf over the clamped range.
// Inputs above 88.7 are clamped (the result stays finite, ~3.3e38); below
// -87.3 the result is 0 (expf would go subnormal there, then 0).
// On AVX-512 the activation ops take ops_vexp.h's 16-lane form of it, with
// these bits.
static inline float r_exp(float x_in) {
    float x = x_in < -87.3f ? -87.3f : x_in;   // ternaries, not fminf/fmaxf: these vectorise
    x = x > 88.7f ? 88.7f : x;
    // n = round(x / ln2) by the 1.5 * 2^23 trick (exact for |x / ln2| < 2^22).
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    n = n == n ? n : 0.0f;   // NaN: it stays in r (NaN out), and no NaN goes to the int conversion below
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float r2 = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r2 + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;   // 2^n
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x_in < -87.3f ? 0.0f : p * scale;   // below e^-87.3 ~ 1.2e-38: 0 (no subnormals)
}
static inline real r_log1p(real x) { return log1pf(x); }
static inline real r_sqrt(real x) { return sqrtf(x); }
// Branch-free (vectorisable): r_exp is clamped, so 1 + e^-x never overflows.
static inline real r_sigmoid(real x) { return 1.0f / (1.0f + r_exp(-x)); }
#endif

// exp of a non-positive difference of cumulative log decays, taken in double
// (the decay factors of the gated mixers: gla_internal.h, gdn_kernel.h),
// evaluated in the build's precision. float32: the inline r_exp, not libm's
// expf, so the loops over a chunk's (L, L) decay matrix vectorise.
static inline real r_exp_decay(double x) {
#ifdef AG_DOUBLE
    return exp(x);
#else
    return r_exp((float)x);
#endif
}

// d silu / dx = s (1 + x (1 - s)), s = sigmoid(x).
static inline real r_silu_grad(real x) {
    real s = r_sigmoid(x);
    return s * (1 + x * (1 - s));
}

// softplus(x) = log(1 + e^x) = max(x, 0) + log1p(e^-|x|), exact for large |x|.
static inline real r_softplus(real x) {
    return (x > 0 ? x : 0) + r_log1p(r_exp(x > 0 ? -x : x));
}

#endif
