// ops_math.h: scalar math in the build's precision, shared by the op kernels
// (private to src/; not part of the public op interface).
//
// expf/logf in float32 builds are several times faster than their double
// versions; the r_* wrappers pick the one matching `real`.
#ifndef AG_OPS_MATH_H
#define AG_OPS_MATH_H

#include <math.h>

#include "common.h"

// Elementwise and row loops go parallel above this many elements; below it the
// OpenMP fork costs more than the loop.
#define OPS_PAR_MIN 32768

#ifdef AG_DOUBLE
static inline real r_exp(real x) { return exp(x); }
static inline real r_log1p(real x) { return log1p(x); }
static inline real r_sqrt(real x) { return sqrt(x); }
#else
static inline real r_exp(real x) { return expf(x); }
static inline real r_log1p(real x) { return log1pf(x); }
static inline real r_sqrt(real x) { return sqrtf(x); }
#endif

// Logistic sigmoid without overflow: exp of a non-positive number only.
static inline real r_sigmoid(real x) {
    if (x >= 0) return 1 / (1 + r_exp(-x));
    real e = r_exp(x);
    return e / (1 + e);
}

// softplus(x) = log(1 + e^x) = max(x, 0) + log1p(e^-|x|), exact for large |x|.
static inline real r_softplus(real x) {
    return (x > 0 ? x : 0) + r_log1p(r_exp(x > 0 ? -x : x));
}

#endif
