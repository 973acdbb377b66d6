// The activation ops' 512-bit exp (ops_vexp.h): v_exp and v_sigmoid are
// r_exp's and r_sigmoid's bits for every input; the ops that run on them
// (silu, sigmoid, exp, silu_mul, rmsnorm_gate) give the scalar loops' bits,
// roundings and fused multiply-adds as written below; and every one of them
// gives the same bits on 1 and 2 threads (that part in both builds).
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops_math.h"
#include "ops_vexp.h"
#include "test_util.h"

// n values: normal of scale 4, one in 16 an edge (the clamps, the overflow
// of r_exp's 2^n, huge, zero) so that the vector lanes meet them.
static void fill_edges(Tensor *t, uint64_t seed) {
    static const float edge[] = {0.0f, -0.0f, 87.3f, -87.3f, 88.2f, -88.2f, 88.5f, -88.5f,
                                 89.0f, -89.0f, 1000.0f, -1000.0f, 30.0f, -30.0f, 1e-30f, 17.0f};
    fill_normal(t, seed, 4.0);
    for (int64_t i = 0; i < t->numel; i += 16) t->data[i] = (real)edge[(i / 16 + seed) % 16];
}

#ifdef OPS_VEXP
// The products and sums of the reference formulas, each rounded on its own
// (a function boundary: GCC fuses a * b + c only inside one function).
__attribute__((noinline)) static float mul(float a, float b) { return a * b; }
__attribute__((noinline)) static float add(float a, float b) { return a + b; }

// v_sigmoid and v_exp of one value: the references below take the vector
// exp's bits (r_exp's in optimised builds, see the first test) so that they
// check the ops' own roundings in any build.
static float vsig(float x) { return _mm512_cvtss_f32(v_sigmoid(_mm512_set1_ps(x))); }
static float vexp(float x) { return _mm512_cvtss_f32(v_exp(_mm512_set1_ps(x))); }

// a and b equal bit for bit, or both NaN.
static bool same(float a, float b) { return float_bits(a) == float_bits(b) || (isnan(a) && isnan(b)); }

// Every 61st bit pattern of the whole float range: the normal and subnormal
// numbers of both signs, above 88.38 (where r_exp's 2^128 is inf), the
// infinities and NaNs.
Test(ops_vexp, exp_and_sigmoid_are_r_exp_bits) {
    float x[16], e[16], s[16];
    int64_t checked = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 16 * 61) {
        for (int i = 0; i < 16; i++) x[i] = bits_float((uint32_t)(u + (uint64_t)i * 61));
        __m512 v = _mm512_loadu_ps(x);
        _mm512_storeu_ps(e, v_exp(v));
        _mm512_storeu_ps(s, v_sigmoid(v));
        for (int i = 0; i < 16; i++) {
            float we = r_exp(x[i]), ws = r_sigmoid(x[i]);
#ifdef __OPTIMIZE__
            cr_assert(same(e[i], we), "exp(%.9g): %.9g (%08x), r_exp %.9g (%08x)", x[i], e[i], float_bits(e[i]), we,
                      float_bits(we));
            cr_assert(same(s[i], ws), "sigmoid(%.9g): %.9g (%08x), r_sigmoid %.9g (%08x)", x[i], s[i],
                      float_bits(s[i]), ws, float_bits(ws));
#else   // unoptimised, GCC does not fuse r_exp's multiply-adds: exp one ulp apart (2^-23 of it at most), which
        // 1 / (1 + e) keeps as a relative error, plus each side's own roundings of the sum and the quotient
        // (2^-24 each, four in all): 3 x 2^-23 of the sigmoid
            cr_assert(same(e[i], we) || fabsf(e[i] - we) <= nextafterf(we, INFINITY) - we,
                      "exp(%.9g): %.9g, r_exp %.9g", x[i], e[i], we);
            cr_assert(same(s[i], ws) || fabsf(s[i] - ws) <= 0x3p-23f * ws, "sigmoid(%.9g): %.9g, r_sigmoid %.9g",
                      x[i], s[i], ws);
#endif
            checked++;
        }
    }
    cr_assert(checked > 70000000, "only %lld values checked", (long long)checked);
    // the edges named: r_exp's own overflow and clamps
    cr_assert(isinf(r_exp(88.5f)) && isinf(r_exp(INFINITY)) && r_exp(-88.0f) == 0, "r_exp's edges moved");
}

// v_recip_ge1 against vdivps: every significand at exponents 0, 1, 60 and
// 125 (the steps scale exactly with the exponent below 2^126, so these stand
// for all of [1, 2^126)), then 2^126 and up, inf and NaN (the division).
Test(ops_vexp, reciprocal_is_the_division) {
    int exps[] = {0, 1, 60, 125};
    int64_t bad = 0;
    uint32_t first_bad = 0;
    for (int k = 0; k < 4; k++)
        for (uint32_t m = 0; m < (1u << 23); m += 16) {
            float d[16], got[16], want[16];
            for (int i = 0; i < 16; i++) d[i] = bits_float((uint32_t)(127 + exps[k]) << 23 | (m + i));
            __m512 v = _mm512_loadu_ps(d);
            _mm512_storeu_ps(got, v_recip_ge1(v));
            _mm512_storeu_ps(want, _mm512_div_ps(_mm512_set1_ps(1.0f), v));
            for (int i = 0; i < 16; i++)
                if (float_bits(got[i]) != float_bits(want[i]) && !bad++) first_bad = float_bits(d[i]);
        }
    cr_assert(bad == 0, "%lld reciprocals differ from the division, the first of %08x", (long long)bad, first_bad);
    float d[16] = {0x1p126f, 0x1.fffffep126f, 0x1p127f, 0x1.fffffep127f, INFINITY, NAN, 1.0f, 1.5f,
                   3.0f,     0x1.fffffep0f, 0x1.fffffep125f, 7.0f, 1e30f, 1e38f, 2.0f, 1.0f};
    float got[16];
    _mm512_storeu_ps(got, v_recip_ge1(_mm512_loadu_ps(d)));
    for (int i = 0; i < 16; i++)
        cr_assert(same(got[i], 1.0f / d[i]), "1 / %a: %a, want %a", d[i], got[i], 1.0f / d[i]);
}

// silu, sigmoid, exp forward and silu backward; silu_mul forward and both
// gradients, written fresh and then added (each input feeds two nodes).
// Lengths 1, 15, 16, 17, 1000 and one above OPS_PAR_MIN: every tail of a
// vector and the parallel loop. (silu's added gradient is fused, silu_mul's
// are not: the scalar loops' roundings.)
Test(ops_vexp, activations_are_the_scalar_loops_bits) {
    int lens[] = {1, 15, 16, 17, 1000, OPS_PAR_MIN + 37};
    for (int c = 0; c < 6; c++) {
        int n = lens[c];
        Tensor *g = tensor_newv(true, 1, n), *x = tensor_newv(true, 1, n), *dy1 = tensor_newv(false, 1, n),
               *dy2 = tensor_newv(false, 1, n);
        fill_edges(g, 1 + c);
        fill_edges(x, 20 + c);
        fill_normal(dy1, 40 + c, 1.0);
        fill_normal(dy2, 60 + c, 1.0);
        Tape tp, tq;
        tape_init(&tp);
        tape_init(&tq);
        // gs, xs: g and x on the tape, so the first gradient is written fresh, the second added
        Tensor *gs = op_scale(&tp, g, 1), *xs = op_scale(&tp, x, 1);
        Tensor *y1 = op_silu_mul(&tp, gs, xs), *y2 = op_silu_mul(&tp, gs, xs);
        Tensor *si1 = op_silu(&tp, xs), *si2 = op_silu(&tp, xs), *sg = op_sigmoid(&tq, g), *ex = op_exp(&tq, g);
        // backward in reverse: si2 writes dx, si1 adds; y2 writes dg and adds to dx, y1 adds to both
        tape_backward_multi(&tp, (Tensor *[]){y1, y2, si1, si2},
                            (const real *[]){dy1->data, dy2->data, dy1->data, dy2->data}, 4);
        for (int i = 0; i < n; i++) {
            float gi = g->data[i], xi = x->data[i], a = dy1->data[i], b = dy2->data[i];
            float s = vsig(gi), sx = vsig(xi);
            float sgr = mul(s, fmaf(gi, 1 - s, 1)), sxg = mul(sx, fmaf(xi, 1 - sx, 1));
            float want_y = mul(mul(gi, s), xi);
            float dg = add(mul(mul(b, xi), sgr), mul(mul(a, xi), sgr));
            float dx = fmaf(a, sxg, mul(b, sxg));
            dx = add(add(dx, mul(mul(b, gi), s)), mul(mul(a, gi), s));
            cr_assert(same(y1->data[i], want_y), "n %d, silu_mul(%.9g, %.9g) = %.9g, want %.9g", n, gi, xi,
                      y1->data[i], want_y);
            cr_assert(same(si1->data[i], mul(xi, sx)), "silu(%.9g) = %.9g", xi, si1->data[i]);
            cr_assert(same(sg->data[i], s) && same(ex->data[i], vexp(gi)), "sigmoid, exp(%.9g)", gi);
            cr_assert(same(gs->grad[i], dg), "n %d, i %d: dg %.9g, want %.9g", n, i, gs->grad[i], dg);
            cr_assert(same(xs->grad[i], dx), "n %d, i %d: dx %.9g, want %.9g", n, i, xs->grad[i], dx);
        }
        tape_free(&tq);
        tape_free(&tp);
        tensor_free(g);
        tensor_free(x);
        tensor_free(dy1);
        tensor_free(dy2);
    }
}

// rmsnorm_gate's gate, forward and dz: y = (x r g) (z s), dz = dy x r g
// silu'(z) with silu' = s (1 + z (1 - s)) in two roundings (as GCC makes the
// scalar loop), groups of 24 (a vector and a tail), written then added.
Test(ops_vexp, rmsnorm_gate_is_the_scalar_loops_bits) {
    int rows = 37, D = 24;
    Tensor *x = tensor_newv(true, 2, rows, D), *z = tensor_newv(true, 2, rows, D), *w = tensor_newv(true, 1, D);
    Tensor *dy1 = tensor_newv(false, 2, rows, D), *dy2 = tensor_newv(false, 2, rows, D);
    fill_normal(x, 3, 1.0);
    fill_edges(z, 4);
    fill_normal(w, 5, 1.0);
    fill_normal(dy1, 6, 1.0);
    fill_normal(dy2, 7, 1.0);
    Tape tp;
    tape_init(&tp);
    Tensor *zs = op_scale(&tp, z, 1);   // on the tape: y2's dz is written fresh, y1's added
    Tensor *y1 = op_rmsnorm_gate(&tp, x, w, zs, D, 1e-5), *y2 = op_rmsnorm_gate(&tp, x, w, zs, D, 1e-5);
    tape_backward_multi(&tp, (Tensor *[]){y1, y2}, (const real *[]){dy1->data, dy2->data}, 2);
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int j = 0; j < D; j++) ss += (double)x->data[r * D + j] * x->data[r * D + j];
        float ri = (float)(1.0 / sqrt(ss / D + 1e-5));
        for (int j = 0; j < D; j++) {
            int i = r * D + j;
            float xi = x->data[i], zi = z->data[i], s = vsig(zi), gj = w->data[j];
            float sg = mul(s, add(1, mul(zi, 1 - s)));
            float want_y = mul(mul(mul(xi, ri), gj), mul(zi, s));
            float e1 = mul(mul(mul(mul(dy1->data[i], xi), ri), gj), sg);
            float e2 = mul(mul(mul(mul(dy2->data[i], xi), ri), gj), sg);
            cr_assert(same(y1->data[i], want_y), "row %d col %d: y %.9g, want %.9g", r, j, y1->data[i], want_y);
            cr_assert(same(zs->grad[i], add(e2, e1)), "row %d col %d: dz %.9g, want %.9g", r, j, zs->grad[i],
                      add(e2, e1));
        }
    }
    tape_free(&tp);
    tensor_free(x);
    tensor_free(z);
    tensor_free(w);
    tensor_free(dy1);
    tensor_free(dy2);
}
#endif

// Outputs and gradients of the activation ops and the cross-entropy (whose
// backward takes v_exp) on 1 and 2 threads (above OPS_PAR_MIN elements, an
// odd length): the same bits, in both builds.
static void run_acts(int threads, Tensor *const *in, const real *seed, real *out) {
    omp_set_num_threads(threads);
    Tensor *g = in[0], *x = in[1], *w = in[2];
    int64_t n = g->numel;
    for (int k = 0; k < 3; k++) memset(in[k]->grad, 0, (size_t)in[k]->numel * sizeof(real));
    Tape tp;
    tape_init(&tp);
    int64_t rows = n / w->numel;
    int *tg = malloc((size_t)rows * sizeof(int));
    for (int64_t r = 0; r < rows; r++) tg[r] = r % 5 == 2 ? -1 : (int)((r * 7) % w->numel);
    Tensor *ys[] = {op_silu_mul(&tp, g, x), op_silu(&tp, x), op_sigmoid(&tp, g), op_exp(&tp, g),
                    op_rmsnorm_gate(&tp, x, w, g, w->numel, 1e-5), op_cross_entropy(&tp, x, tg)};
    real one = 1;
    tape_backward_multi(&tp, ys, (const real *[]){seed, seed, seed, seed, seed, &one}, 6);
    for (int k = 0; k < 5; k++) memcpy(out + k * n, ys[k]->data, (size_t)n * sizeof(real));
    memcpy(out + 5 * n, g->grad, (size_t)n * sizeof(real));
    memcpy(out + 6 * n, x->grad, (size_t)n * sizeof(real));
    memcpy(out + 7 * n, w->grad, (size_t)w->numel * sizeof(real));
    out[7 * n + w->numel] = ys[5]->data[0];
    free(tg);
    tape_free(&tp);
}

Test(ops_vexp, deterministic_across_thread_counts) {
    int rows = 1031, D = 40;   // 41240 elements
    Tensor *g = tensor_newv(true, 2, rows, D), *x = tensor_newv(true, 2, rows, D), *w = tensor_newv(true, 1, D);
    Tensor *seed = tensor_newv(false, 2, rows, D);
    fill_edges(g, 8);
    fill_edges(x, 9);
    fill_normal(w, 10, 1.0);
    fill_normal(seed, 11, 1.0);
    size_t bytes = (size_t)(8 * g->numel + 1) * sizeof(real);
    real *o1 = calloc(1, bytes), *o2 = calloc(1, bytes);
    int saved = omp_get_max_threads();
    run_acts(1, (Tensor *[]){g, x, w}, seed->data, o1);
    run_acts(2, (Tensor *[]){g, x, w}, seed->data, o2);
    omp_set_num_threads(saved);
    cr_assert(g->numel > OPS_PAR_MIN, "too small to run in parallel");
    cr_assert(memcmp(o1, o2, bytes) == 0, "1 and 2 threads differ");
    free(o1);
    free(o2);
    tensor_free(g);
    tensor_free(x);
    tensor_free(w);
    tensor_free(seed);
}
