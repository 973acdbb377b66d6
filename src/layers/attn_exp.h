// attn_exp.h: exp of a whole AVX-512 vector of floats for the attention
// kernel's softmax (attn_flash.c), with a lane mask that zeroes the lanes a
// query does not see.
//
// It computes r_exp (ops_math.h) lane by lane, bit for bit up to x = 88: the
// same range reduction, polynomial and fused multiply-adds (those GCC makes
// of r_exp's a * b + c when it optimises; unoptimised, r_exp rounds the
// products apart and the two may differ in the last bit), so the float32
// results of the kernel do not depend on which of the two ran (its arguments
// are s - max <= 0). Above 88.03, r_exp's 2^n overflows to inf (n = 128);
// vscalefps gives the finite value, up to exp(88.7) at the clamp.
// GCC vectorises a loop over r_exp at 256 bits (-march=native prefers ymm on
// AVX-512 CPUs) and, to if-convert r_exp's NaN test, evaluates the polynomial
// twice; here one 512-bit pass, 2^n applied by vscalefps (exact: p 2^n for an
// integral n is p times r_exp's power of two, one rounding either way), and
// the zeroing below -87.3 and of the masked lanes folded into that one
// instruction's mask. exp took 18 % of the kernel's time (perf, 1 thread,
// D 256, T 256) in that form.
//
// Defines ATTN_VEXP where it exists (float32 builds for AVX-512); other
// builds keep the scalar loops over r_exp.
#ifndef ATTN_EXP_H
#define ATTN_EXP_H

#if defined(__AVX512F__) && !defined(AG_DOUBLE)
#include <immintrin.h>

#define ATTN_VEXP 1

// exp(x) lane by lane where keep is set, 0 elsewhere: r_exp's value, so 0
// below -87.3 (and for -inf), NaN for NaN; exp(88.7) above 88.7.
static inline __m512 attn_vexp(__m512 x, __mmask16 keep) {
    // not below -87.3: true for NaN too, which then stays NaN as in r_exp
    keep &= _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_NLT_UQ);
    x = _mm512_min_ps(_mm512_set1_ps(88.7f), x);   // (min_ps returns its second operand, x, when x is NaN)
    const __m512 magic = _mm512_set1_ps(12582912.0f);
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
    p = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

// Lanes i of a vector whose index base + i lies in [lo, hi).
static inline __mmask16 attn_lanes_in(int base, int lo, int hi) {
    __m512i i = _mm512_add_epi32(_mm512_set1_epi32(base),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    return _mm512_cmp_epi32_mask(i, _mm512_set1_epi32(lo), _MM_CMPINT_NLT) &
           _mm512_cmp_epi32_mask(i, _mm512_set1_epi32(hi), _MM_CMPINT_LT);
}
#endif

#endif
