// The attention kernel's vector exp (attn_exp.h): r_exp's bits lane by lane
// (so the kernel's float32 results do not depend on which of the two it
// ran), within float32 rounding of the exact exp, 0 below -87.3 and for
// -inf, exp(88.7) above 88.7, NaN kept, and the lane masks. Only float32 builds for AVX-512 have
// it; elsewhere the kernel uses r_exp itself and there is nothing to test.
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attn_exp.h"
#include "ops_math.h"
#include "test_util.h"

#ifdef ATTN_VEXP
// attn_vexp of 16 values with every lane kept, into y.
static void vexp16(float *y, const float *x) { _mm512_storeu_ps(y, attn_vexp(_mm512_loadu_ps(x), 0xffff)); }

// Every 61st bit pattern of the whole float range with x <= 88 (negative and
// positive, normal and subnormal inputs, the infinities, NaNs): r_exp's
// bits, in optimised builds (attn_exp.h). Above 88, r_exp's 2^n overflows at n = 128 (x > 88.03) while
// vscalefps gives the finite value: the kernel's arguments are s - max <= 0.
Test(attn_exp, bits_of_r_exp) {
    float x[16], y[16];
    int64_t checked = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 16 * 61) {
        for (int i = 0; i < 16; i++) x[i] = bits_float((uint32_t)(u + (uint64_t)i * 61));
        vexp16(y, x);
        for (int i = 0; i < 16; i++) {
            if (x[i] > 88.0f) continue;
            float want = r_exp(x[i]);
            if (isnan(want)) {
                cr_assert(isnan(y[i]), "exp(NaN %08x) = %g, not NaN", float_bits(x[i]), y[i]);
                continue;
            }
#ifdef __OPTIMIZE__
            cr_assert(float_bits(y[i]) == float_bits(want), "exp(%.9g): %.9g (%08x), r_exp %.9g (%08x)", x[i], y[i],
                      float_bits(y[i]), want, float_bits(want));
#else   // unoptimised, GCC does not fuse r_exp's multiply-adds: one rounding more, at most one ulp apart
            cr_assert(fabsf(y[i] - want) <= nextafterf(want, INFINITY) - want, "exp(%.9g): %.9g, r_exp %.9g", x[i],
                      y[i], want);
#endif
            checked++;
        }
    }
    cr_assert(checked > 30000000, "only %lld values checked", (long long)checked);
}

// Within float32 rounding of the exact value: a dense walk of [-87.3, 88]
// (every 97th float), against exp in double; worst 1.01 ulp of the result
// over every float of that range (measured once, exhaustively).
Test(attn_exp, accurate_to_float_rounding) {
    float x[16], y[16];
    double worst = 0, worst_x = 0;
    uint32_t a = float_bits(-87.3f), b = float_bits(88.0f);
    // negative floats: bit patterns from a down to 0x80000000 (-0), then 0 up to b
    for (int64_t k = -(int64_t)(a - 0x80000000u); k <= (int64_t)b; k += 16 * 97) {
        for (int i = 0; i < 16; i++) {
            int64_t j = k + (int64_t)i * 97;
            x[i] = j < 0 ? bits_float(0x80000000u + (uint32_t)(-j)) : bits_float((uint32_t)j);
            if (j > (int64_t)b) x[i] = 88.0f;
        }
        vexp16(y, x);
        for (int i = 0; i < 16; i++) {
            double e = exp((double)x[i]), ulp = nextafterf((float)e, INFINITY) - (float)e;
            double err = fabs(y[i] - e) / ulp;
            if (err > worst) worst = err, worst_x = x[i];
        }
    }
    cr_assert(worst <= 1.02, "worst error %.3f ulp at exp(%.9g)", worst, worst_x);
}

// Below -87.3 the result is 0, not a subnormal (e^-87.3 = 1.2e-38, the
// bottom of the normal range; a subnormal P would slow the products that
// read it); -inf gives 0, +inf exp(88.7); NaN stays NaN; masked
// lanes are 0 whatever they hold.
Test(attn_exp, edges_and_masks) {
    float x[16] = {-INFINITY, -1e30f, -104.0f, -87.31f, -87.3f, -87.29f, -0.0f, 0.0f,
                   1e-40f,    -1e-40f, 1.0f,   INFINITY, NAN,   -NAN,   88.7f, -5.0f};
    float y[16];
    vexp16(y, x);
    for (int i = 0; i < 4; i++) cr_assert(y[i] == 0 && !signbit(y[i]), "exp(%g) = %g, not +0", x[i], y[i]);
    double e4 = exp((double)-87.3f);   // 1.219e-38, just above FLT_MIN: still a normal float
    cr_assert(y[4] >= FLT_MIN && fabs(y[4] - e4) <= 1.2e-7 * e4, "exp(-87.3) = %g, exactly %g", y[4], e4);
    cr_assert(y[5] > y[4], "exp(-87.29) = %g <= exp(-87.3) = %g", y[5], y[4]);
    for (int i = 6; i < 10; i++) cr_assert(y[i] == 1.0f, "exp(%g) = %.9g, not 1", x[i], y[i]);
    cr_assert(fabs(y[10] - (float)M_E) <= 2.4e-7f, "exp(1) = %.9g", y[10]);
    double e14 = exp((double)88.7f);   // the clamp: finite (r_exp's own 2^128 overflows to inf here)
    cr_assert(isfinite(y[14]) && fabs(y[14] - e14) <= 1.2e-7 * e14, "exp(88.7) = %g, exactly %g", y[14], e14);
    cr_assert(float_bits(y[11]) == float_bits(y[14]), "exp(inf) = %g, not exp(88.7) = %g", y[11], y[14]);
    cr_assert(isnan(y[12]) && isnan(y[13]), "exp(NaN) = %g, %g", y[12], y[13]);

    // the mask: only lanes 3..9 kept
    _mm512_storeu_ps(y, attn_vexp(_mm512_loadu_ps(x), attn_lanes_in(0, 3, 10)));
    for (int i = 0; i < 16; i++) {
        float want = i < 3 || i >= 10 ? 0.0f : r_exp(x[i]);
        cr_assert(float_bits(y[i]) == float_bits(want), "lane %d: %g, want %g", i, y[i], want);
    }
}

// attn_lanes_in(base, lo, hi): lane i iff lo <= base + i < hi, with empty
// and negative ranges and bounds outside the vector.
Test(attn_exp, lanes_in) {
    int cases[][3] = {{0, 0, 16}, {0, 3, 10}, {16, 20, 100}, {0, -5, 2}, {32, 0, 32}, {-8, -3, 4}, {0, 7, 7},
                      {0, 9, 4},  {5, 0, 6},  {0, INT32_MIN, INT32_MAX}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int base = cases[c][0], lo = cases[c][1], hi = cases[c][2];
        __mmask16 m = attn_lanes_in(base, lo, hi);
        for (int i = 0; i < 16; i++) {
            bool want = (int64_t)base + i >= lo && (int64_t)base + i < hi;
            cr_assert(((m >> i) & 1) == want, "attn_lanes_in(%d, %d, %d): lane %d is %d", base, lo, hi, i,
                      (m >> i) & 1);
        }
    }
}
#endif
