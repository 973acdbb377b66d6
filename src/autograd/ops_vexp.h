// ops_vexp.h: r_exp and r_sigmoid (ops_math.h) on 16 floats at once, for the
// activation loops of float32 builds on AVX-512 CPUs (silu, sigmoid, exp, the
// SiLU gates of silu_mul and rmsnorm_gate, conv1d_silu, the cross-entropy's
// backward). Defines OPS_VEXP where it exists; other builds keep the loops
// over r_exp.
//
// GCC vectorises a loop over r_exp at 256 bits (-march=native prefers ymm on
// AVX-512 CPUs), with a vdivps for every sigmoid; here 512 bits, and the
// sigmoid's reciprocal without the divider (v_recip_ge1). The result is r_exp's
// lane by lane, bit for bit, for every input, in optimised builds: the same
// range reduction and polynomial with the fused multiply-adds GCC makes of
// r_exp's a * b + c, and 2^n built from its exponent bits as r_exp builds it
// (so n = 128, x above ~88.38, overflows to inf as there; 0 below -87.3; NaN
// stays NaN). Unoptimised, GCC does not fuse r_exp's multiply-adds and the two
// may differ in the last bit. tests/test_ops_vexp.c holds them to r_exp's bits.
//
// The polynomial core is shared with the attention kernel's exp (attn_exp.h),
// which applies 2^n by vscalefps and masks lanes.
#ifndef AG_OPS_VEXP_H
#define AG_OPS_VEXP_H

#if defined(__AVX512F__) && !defined(AG_DOUBLE)
#include <immintrin.h>
#include <stdint.h>

#include "ops_math.h"

#define OPS_VEXP 1

// x = n ln2 + r (n integral, as a float; ln2 in two parts), returns e^r by
// r_exp's degree-6 polynomial. x is already clamped to at most 88.7.
static inline __m512 v_exp_reduced(__m512 x, __m512 *n_out) {
    const __m512 magic = _mm512_set1_ps(12582912.0f);   // 1.5 * 2^23: adding it rounds to an integer
    __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic), magic);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 r2 = _mm512_mul_ps(r, r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    *n_out = n;
    return _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
}

// r_exp(x) in each lane.
static inline __m512 v_exp(__m512 x) {
    // x < -87.3 gives 0; NaN compares unordered, is kept and stays NaN through p
    __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_NLT_UQ);
    x = _mm512_min_ps(_mm512_set1_ps(88.7f), x);   // (returns its second operand, x, when x is NaN)
    __m512 n;
    __m512 p = v_exp_reduced(x, &n);
    // 2^n as r_exp makes it: (n + 127) << 23, which is inf at n = 128 (lanes
    // where n is NaN get some pattern; p is NaN there)
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(e));
}

// 1 / d, rounded as vdivps rounds it, for d >= 1 (the sigmoid's 1 + e).
// vdivps takes 10 times the cycles of a multiply-add on 16 lanes and was
// half of silu_mul's backward (perf). Newton's steps from vrcp14ps, then
// y + y (1 - d y) with the residual exact (fused): the rounded reciprocal for
// every d in [1, 2^126) but where d's significand is all ones, whose
// reciprocal is 1 ulp above (tested over every significand:
// tests/test_ops_vexp.c). From 2^126 up (subnormal reciprocals), inf and
// NaN: the division.
static inline __m512 v_recip_ge1(__m512 d) {
    const __m512 one = _mm512_set1_ps(1.0f);
    if (_mm512_cmp_ps_mask(d, _mm512_set1_ps(0x1p126f), _CMP_NLT_UQ)) return _mm512_div_ps(one, d);
    __m512 y = _mm512_rcp14_ps(d);                          // 2^-14 relative
    y = _mm512_fmadd_ps(y, _mm512_fnmadd_ps(d, y, one), y);   // 2^-28
    y = _mm512_fmadd_ps(_mm512_fnmadd_ps(d, y, one), y, y);
    const __m512i sig = _mm512_set1_epi32(0x7fffff);
    __m512i yb = _mm512_castps_si512(y);
    __mmask16 ones = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(d), sig), sig);
    return _mm512_castsi512_ps(_mm512_mask_add_epi32(yb, ones, yb, _mm512_set1_epi32(1)));
}

// r_sigmoid(x) = 1 / (1 + r_exp(-x)) in each lane.
static inline __m512 v_sigmoid(__m512 x) {
    __m512 e = v_exp(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))));
    return v_recip_ge1(_mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

// The lanes of a vector at i of an array of n floats (all 16 but at the end).
static inline __mmask16 v_lanes(int64_t i, int64_t n) {
    return n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
}

// for (i = 0; i < N; i += 16) with m the lanes of the vector at i, in
// parallel above OPS_PAR_MIN elements as the scalar loops.
#define V_LOOP(N, i, m, ...)                                                           \
    do {                                                                               \
        const int64_t vl_n = (N);                                                      \
        _Pragma("omp parallel for if (vl_n > OPS_PAR_MIN) schedule(static)")           \
        for (int64_t i = 0; i < vl_n; i += 16) {                                       \
            const __mmask16 m = v_lanes(i, vl_n);                                      \
            __VA_ARGS__                                                                \
        }                                                                              \
    } while (0)

// a b and a + b each rounded on its own: GCC fuses _mm512_mul_ps into a
// following _mm512_add_ps (they are plain vector operators to it) as it fuses
// scalar code; the rounding-mode forms are builtins it leaves alone, so the
// code says which products round.
static inline __m512 v_mul_r(__m512 a, __m512 b) { return _mm512_mul_round_ps(a, b, _MM_FROUND_CUR_DIRECTION); }
static inline __m512 v_add_r(__m512 a, __m512 b) { return _mm512_add_round_ps(a, b, _MM_FROUND_CUR_DIRECTION); }

static inline __m512 v_load(const float *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
static inline void v_store(float *p, __mmask16 m, __m512 v) { _mm512_mask_storeu_ps(p, m, v); }

// A gradient's lanes: d = a b when fresh, else d += a b, fused into one
// rounding when `fused` (as GCC makes some of the scalar loops' d[i] += a * b
// and not others; tests/test_ops_vexp.c pins each).
static inline void v_grad(float *d, __mmask16 m, __m512 a, __m512 b, bool fresh, bool fused) {
    __m512 p = v_mul_r(a, b);
    if (!fresh) p = fused ? _mm512_fmadd_ps(a, b, v_load(d, m)) : v_add_r(v_load(d, m), p);
    v_store(d, m, p);
}

// silu'(z) = s (1 + z (1 - s)) with s = r_sigmoid(z), as GCC computes
// r_silu_grad: the inner multiply-add fused.
static inline __m512 v_silu_grad_s(__m512 z, __m512 s) {
    const __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_mul_ps(s, _mm512_fmadd_ps(z, _mm512_sub_ps(one, s), one));
}
#endif

#endif
