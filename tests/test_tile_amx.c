// The AMX tile products (tile_amx.c) against tile_mm_bf16.h's AVX512_BF16
// products and against a float64 product of the same bf16 operands, at the
// attention's shapes: partial tiles (M, K not multiples of 16 or 32), a
// causal band that starts or ends inside a tile, both orientations of A, C
// written and added to. Both kinds round the same operands, so they may
// differ only in how they sum in float32: each is held to float32's
// summation bound, (K + 3) u (|alpha| sum_k |a_k b_k| + |C|), u = 2^-24
// (K products, the scale and the add), and to twice that from the other.
// The order each instruction sums in is checked bit for bit against Intel's
// pseudo-code (tile_amx.h).
//
// Skipped, with the reason, where the build or the CPU has no AMX.
#include <math.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernel.h"
#include "blas.h"
#include "config.h"
#include "model_setup.h"
#include "test_util.h"
#include "tile_amx.h"

#ifdef AG_TILE_AMX
static bfpair pair_of(float a, float b) { return (bfpair)bf16_from_float(a) | (bfpair)bf16_from_float(b) << 16; }
static double lo_of(bfpair p) { return bf16_to_float((bf16)(p & 0xffff)); }
static double hi_of(bfpair p) { return bf16_to_float((bf16)(p >> 16)); }

typedef struct {
    int M, N, K, lo, hi;
    bool ta;   // A's pairs along i (A(i, p) at A[i + p ak], as the attention's P^T and dS^T), else along k
} Shape;

// Operands of one product, as the kernels take them: A (M x K) zero outside
// the band, in pairs, with NaN in the padding of its rows and, in `junk`, in
// every pair wholly outside a row's band (which tile_mm_bf16_band may not
// read either, past its 8-row blocks); B (K x N) in pairs of rows with NaN
// in the rows past (K + 1) / 2 and in the padding of each row.
typedef struct {
    int KP, lda, ak, ldb, ldc;
    bfpair *A, *junk, *B;
    float *C0;   // C before the product
} Operands;

static Operands operands(const Shape *s, uint64_t seed) {
    Operands o;
    o.KP = (s->K + 1) / 2;
    o.lda = s->ta ? 1 : o.KP + 3;
    o.ak = s->ta ? s->M + 3 : 1;
    o.ldb = s->N + 16;
    o.ldc = s->N + 32;
    size_t na = s->ta ? (size_t)o.KP * o.ak : (size_t)s->M * o.lda, nb = (size_t)(o.KP + 16) * o.ldb;
    real *a = test_randn((int64_t)s->M * s->K + 1, seed), *b = test_randn((int64_t)s->K * s->N + 1, seed + 1);
    o.A = xaligned(na * sizeof(bfpair));
    o.junk = xaligned(na * sizeof(bfpair));
    o.B = xaligned(nb * sizeof(bfpair));
    o.C0 = (float *)test_randn((int64_t)s->M * o.ldc, seed + 2);
    const bfpair nan2 = 0x7fc07fc0u;
    for (size_t i = 0; i < na; i++) o.A[i] = o.junk[i] = nan2;
    for (size_t i = 0; i < nb; i++) o.B[i] = nan2;
    for (int i = 0; i < s->M; i++)
        for (int p = 0; p < o.KP; p++) {
            float e[2];
            for (int h = 0; h < 2; h++) {
                int k = 2 * p + h;
                e[h] = k < s->K && k >= i + s->lo && k <= i + s->hi ? a[(int64_t)i * s->K + k] : 0;
            }
            int64_t at = s->ta ? i + (int64_t)p * o.ak : (int64_t)i * o.lda + p;
            o.A[at] = pair_of(e[0], e[1]);
            bool outside = 2 * p + 1 < i + s->lo || 2 * p > i + s->hi;   // both elements outside the band
            o.junk[at] = outside ? nan2 : o.A[at];
        }
    for (int p = 0; p < o.KP; p++)
        for (int j = 0; j < s->N; j++) {
            float lo = b[(int64_t)(2 * p) * s->N + j], hi = 2 * p + 1 < s->K ? b[(int64_t)(2 * p + 1) * s->N + j] : 0;
            o.B[(int64_t)p * o.ldb + j] = pair_of(lo, hi);
        }
    free(a);
    free(b);
    return o;
}

static void operands_free(Operands *o) {
    free(o->A);
    free(o->junk);
    free(o->B);
    free(o->C0);
}

static float *run_kind(const Shape *s, const Operands *o, bool amx, const bfpair *A, float alpha, bool add) {
    float *C = xaligned((size_t)s->M * o->ldc * sizeof(float));
    memcpy(C, o->C0, (size_t)s->M * o->ldc * sizeof(float));
    if (amx) {
        amx_tiles_begin();
        bool ran = amx_mm_bf16_band(s->M, s->N, s->K, s->lo, s->hi, alpha, A, o->lda, o->ak, o->B, o->ldb, C, o->ldc,
                                    add);
        amx_tiles_end();
        cr_assert(ran);
    } else
        tile_mm_bf16_band(s->M, s->N, s->K, s->lo, s->hi, alpha, A, o->lda, o->ak, o->B, o->ldb, C, o->ldc, add);
    return C;
}

static const char *why_no_amx(void) {
    static char why[200];
    return amx_bf16_usable(why, sizeof why) ? NULL : why;
}
#endif

Test(tile_amx, products_within_float32_sums_of_the_bf16_product) {
#ifndef AG_TILE_AMX
    cr_skip_test("this build has no AMX tiles (float64, no AVX512_BF16 target, or not GCC 11+ on x86-64 Linux)");
#else
    if (why_no_amx()) cr_skip_test("%s", why_no_amx());
    // The attention's products (attn_flash.c): S = K_j Q^T (M keys, 32
    // queries, K the head), P V (band -nr .. lag, lag < 0 on the diagonal),
    // the backward's P and dP (16 rows), dV and dK (A along i, band -cut ..
    // nr), dQ (band -nr .. cut); then edges: single rows, one column tile,
    // odd K, the largest K the AMX path takes.
    const Shape shapes[] = {
        {64, 32, 64, -64, 64, false},  {37, 32, 32, -37, 32, false}, {64, 32, 128, -64, 128, false},
        {32, 64, 64, -32, 0, false},   {32, 128, 64, -32, -20, false}, {5, 64, 37, -5, 31, false},
        {16, 64, 64, -16, 64, false},  {13, 48, 128, -13, 128, false}, {64, 64, 64, 0, 64, true},
        {64, 128, 37, -21, 37, true},  {40, 32, 64, -7, 64, true},     {64, 64, 64, -64, 0, false},
        {50, 64, 64, -50, 13, false},  {1, 16, 1, -1, 1, false},       {1, 16, 2, -1, 2, true},
        {33, 16, 33, -33, 33, false},  {17, 80, 512, -17, 512, false}, {20, 32, 511, -20, 300, true},
    };
    const double u = 0x1p-24;
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        const Shape *s = &shapes[t];
        Operands o = operands(s, 100 + 7 * t);
        for (int mode = 0; mode < 2; mode++) {
            bool add = mode == 1;
            float alpha = add ? 0.125f : 1.0f;
            float *amx = run_kind(s, &o, true, o.A, alpha, add), *avx = run_kind(s, &o, false, o.A, alpha, add);
            float *junk = run_kind(s, &o, true, o.junk, alpha, add);
            int64_t differ = 0;
            double worst = 0;
            for (int i = 0; i < s->M; i++)
                for (int j = 0; j < o.ldc; j++) {
                    int64_t at = (int64_t)i * o.ldc + j;
                    if (j >= s->N) {   // past N: untouched
                        cr_assert(amx[at] == o.C0[at] || (isnan(amx[at]) && isnan(o.C0[at])),
                                  "shape %zu: C[%d][%d] past N written", t, i, j);
                        continue;
                    }
                    double ref = 0, mag = 0;
                    for (int p = 0; p < o.KP; p++) {
                        bfpair a = s->ta ? o.A[i + (int64_t)p * o.ak] : o.A[(int64_t)i * o.lda + p];
                        bfpair b = o.B[(int64_t)p * o.ldb + j];
                        ref += lo_of(a) * lo_of(b) + hi_of(a) * hi_of(b);
                        mag += fabs(lo_of(a) * lo_of(b)) + fabs(hi_of(a) * hi_of(b));
                    }
                    double c0 = add ? o.C0[at] : 0;
                    ref = alpha * ref + c0;
                    double bound = (s->K + 3) * u * (fabs(alpha) * mag + fabs(c0));
                    cr_assert(fabs(amx[at] - ref) <= bound,
                              "shape %zu (M %d N %d K %d, band %d..%d, %s, add %d): AMX C[%d][%d] = %.9g, reference "
                              "%.9g, beyond float32 sums (%.3g)",
                              t, s->M, s->N, s->K, s->lo, s->hi, s->ta ? "A along i" : "A along k", add, i, j,
                              (double)amx[at], ref, bound);
                    cr_assert(fabs(avx[at] - ref) <= bound, "shape %zu: AVX512_BF16 C[%d][%d] = %.9g, ref %.9g",
                              t, i, j, (double)avx[at], ref);
                    cr_assert(fabs(amx[at] - avx[at]) <= 2 * bound, "shape %zu: C[%d][%d] AMX %.9g, AVX512 %.9g", t,
                              i, j, (double)amx[at], (double)avx[at]);
                    cr_assert(memcmp(&junk[at], &amx[at], sizeof(float)) == 0,
                              "shape %zu: C[%d][%d] = %.9g with NaN outside the rows' band, %.9g with zeros", t, i, j,
                              (double)junk[at], (double)amx[at]);
                    differ += amx[at] != avx[at];
                    if (bound > 0) worst = fmax(worst, fabs(amx[at] - ref) / bound);
                }
            cr_log_info("shape %zu add %d: %lld of %d elements differ from AVX512_BF16's; at most %.3f of the bound",
                        t, add, (long long)differ, s->M * s->N, worst);
            free(amx);
            free(avx);
            free(junk);
        }
        operands_free(&o);
    }
#endif
}

Test(tile_amx, longer_products_are_left_to_avx512bf16) {
#ifndef AG_TILE_AMX
    cr_skip_test("this build has no AMX tiles");
#else
    if (why_no_amx()) cr_skip_test("%s", why_no_amx());
    alignas(64) float C[16] = {7};
    alignas(64) bfpair X[16] = {0};
    amx_tiles_begin();
    bool ran = amx_mm_bf16_band(1, 16, AMX_MAX_K + 1, -1, AMX_MAX_K + 1, 1, X, 1, 1, X, 16, C, 16, false);
    amx_tiles_end();
    cr_assert(!ran);
    cr_assert_eq(C[0], 7, "nothing written when AMX declines");
#endif
}

#ifdef AG_TILE_AMX
// c = the sum the instruction's pseudo-code computes (SDM): vdpbf16ps per
// pair, odd element first, each a fused add; tdpbf16ps per 16 pairs, the even
// and odd products summed apart from zero, then added to c as one sum.
static float emulate(const Operands *o, const Shape *s, int i, int j, bool amx) {
    float c = 0;
    for (int p0 = 0; p0 < o->KP; p0 += 16) {
        float e = 0, d = 0;
        for (int p = p0; p < imin(o->KP, p0 + 16); p++) {
            bfpair a = o->A[(int64_t)i * o->lda + p], b = o->B[(int64_t)p * o->ldb + j];
            if (amx) {
                e = fmaf((float)lo_of(a), (float)lo_of(b), e);
                d = fmaf((float)hi_of(a), (float)hi_of(b), d);
            } else {
                c = fmaf((float)hi_of(a), (float)hi_of(b), c);
                c = fmaf((float)lo_of(a), (float)lo_of(b), c);
            }
        }
        if (amx) c = c + (e + d);
    }
    return c;
}
#endif

Test(tile_amx, both_instructions_sum_as_intels_pseudocode_says) {
#ifndef AG_TILE_AMX
    cr_skip_test("this build has no AMX tiles");
#else
    if (why_no_amx()) cr_skip_test("%s", why_no_amx());
    const Shape shapes[] = {{32, 32, 64, -32, 64, false}, {17, 48, 101, -17, 101, false}};
    for (size_t t = 0; t < 2; t++) {
        const Shape *s = &shapes[t];
        Operands o = operands(s, 300 + t);
        float *amx = run_kind(s, &o, true, o.A, 1, false), *avx = run_kind(s, &o, false, o.A, 1, false);
        int64_t differ = 0;
        for (int i = 0; i < s->M; i++)
            for (int j = 0; j < s->N; j++) {
                float ea = emulate(&o, s, i, j, true), ev = emulate(&o, s, i, j, false);
                int64_t at = (int64_t)i * o.ldc + j;
                cr_assert(memcmp(&ea, &amx[at], 4) == 0, "shape %zu: AMX C[%d][%d] = %a, its pseudo-code %a", t, i, j,
                          (double)amx[at], (double)ea);
                cr_assert(memcmp(&ev, &avx[at], 4) == 0, "shape %zu: vdpbf16ps C[%d][%d] = %a, its pseudo-code %a",
                          t, i, j, (double)avx[at], (double)ev);
                differ += ea != ev;
            }
        cr_assert_gt(differ, 0, "shape %zu: the two orders gave the same bits everywhere: the test cannot tell", t);
        free(amx);
        free(avx);
        operands_free(&o);
    }
#endif
}

// What bf16_tiles_select takes in each build, on each CPU: what cannot run
// here is refused with the reason and changes nothing; auto resolves to the
// best kind that can (and the float64 build, which has no bf16, to fp32).
Test(tile_amx, the_choice_refuses_what_cannot_run_here) {
    for (int k = 0; k < BF16_TILES_COUNT; k++) cr_assert_eq(bf16_tiles_parse(bf16_tiles_name((Bf16Tiles)k)), k);
    cr_assert_eq(bf16_tiles_parse("amx512"), -1);
    cr_assert_eq(bf16_tiles_parse(NULL), -1);
    char err[256], why[200];
    bool amx = amx_bf16_usable(why, sizeof why);
    cr_assert(bf16_tiles_select(BF16_TILES_FP32, err, sizeof err), "%s", err);
    cr_assert_eq(bf16_tiles_current(), BF16_TILES_FP32);
#ifdef AG_TILE_BF16
    cr_assert(bf16_tiles_select(BF16_TILES_AVX512BF16, err, sizeof err), "%s", err);
    cr_assert_eq(bf16_tiles_current(), BF16_TILES_AVX512BF16);
    Bf16Tiles best = amx ? BF16_TILES_AMX : BF16_TILES_AVX512BF16;
#else
    cr_assert(!amx, "AMX usable in a build without bf16 tiles");
    cr_assert(!bf16_tiles_select(BF16_TILES_AVX512BF16, err, sizeof err));
    cr_assert(strstr(err, "bf16_tiles = avx512bf16") && strstr(err, "no bf16 tiles"), "%s", err);
    Bf16Tiles best = BF16_TILES_FP32;
#endif
    Bf16Tiles before = bf16_tiles_current();
    if (amx) {
        cr_assert(bf16_tiles_select(BF16_TILES_AMX, err, sizeof err), "%s", err);
        cr_assert_eq(bf16_tiles_current(), BF16_TILES_AMX);
    } else {
        cr_log_info("AMX not usable here: %s", why);
        cr_assert(!bf16_tiles_select(BF16_TILES_AMX, err, sizeof err));
        cr_assert(strstr(err, "bf16_tiles = amx") && strstr(err, "use bf16_tiles = auto"), "%s", err);
        cr_assert_eq(bf16_tiles_current(), before, "a refused kind changed the choice");
    }
    cr_assert(!bf16_tiles_select(BF16_TILES_COUNT, err, sizeof err));
    cr_assert(bf16_tiles_select(BF16_TILES_AUTO, err, sizeof err), "%s", err);
    cr_assert_eq(bf16_tiles_current(), best, "auto gave %s", bf16_tiles_name(bf16_tiles_current()));
#ifdef AG_DOUBLE
    cr_assert_eq(attn_tiles_kind(64, 64, 64, 64), BF16_TILES_FP32, "the float64 build's attention is float64");
#endif
}

// [train] bf16_tiles through model_set_products, as train and train_bench
// set it: each kind the attention then runs, or, for one that cannot run
// here, an error that names the key and the value.
Test(tile_amx, the_config_key_sets_the_attention_tiles) {
#ifndef AG_TILE_BF16
    cr_skip_test("this build has no bf16 tiles (float64, or no AVX512_BF16 target)");
#else
    if (!(onednn_built() && onednn_has_bf16())) cr_skip_test("this CPU has no AVX512_BF16 (or no oneDNN)");
    TrainConfig c;
    config_defaults(&c, model_mixer_known);
    cr_assert(config_set(&c, "train.precision=bf16").ok);
    const char *kinds[] = {"fp32", "avx512bf16", "amx", "auto"};
    char why[200];
    bool amx = amx_bf16_usable(why, sizeof why);
    for (int i = 0; i < 4; i++) {
        char set[64];
        snprintf(set, sizeof set, "train.bf16_tiles=%s", kinds[i]);
        cr_assert(config_set(&c, set).ok);
        Status s = model_set_products(&c);
        Bf16Tiles want = i == 3 ? (amx ? BF16_TILES_AMX : BF16_TILES_AVX512BF16) : (Bf16Tiles)bf16_tiles_parse(kinds[i]);
        if (want == BF16_TILES_AMX && !amx) {
            cr_assert(!s.ok && strstr(s.msg, "[train] bf16_tiles = amx"), "%s", s.ok ? "taken" : s.msg);
            continue;
        }
        cr_assert(s.ok, "%s: %s", set, s.msg);
        cr_assert_eq(attn_tiles_kind(64, 64, ATTN_TILE_Q, ATTN_TILE_K), want, "%s: the attention runs %s", set,
                     bf16_tiles_name(attn_tiles_kind(64, 64, ATTN_TILE_Q, ATTN_TILE_K)));
        cr_assert_eq(attn_tiles_kind(63, 64, ATTN_TILE_Q, ATTN_TILE_K), BF16_TILES_FP32, "odd heads take no pairs");
    }
    cr_assert(config_set(&c, "train.precision=fp32").ok && model_set_products(&c).ok);
    cr_assert_eq(attn_tiles_kind(64, 64, ATTN_TILE_Q, ATTN_TILE_K), BF16_TILES_FP32, "fp32 runs float32 tiles");
    config_free(&c);
#endif
}
