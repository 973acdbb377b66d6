// Tests of the Gated DeltaNet op: gradient checks of both forms, the chunked
// (WY) form against the recurrent reference over lengths, chunk sizes and
// numerical regimes, the state carried across segments, and the delta rule.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "blas.h"
#include "gdn_kernel.h"
#include "test_util.h"
#include "tile_amx.h"

typedef enum { REG_PLAIN, REG_G_ZERO, REG_G_M20, REG_BETA_0, REG_BETA_1, REG_REPEAT, REG_REPEAT_HARD, REG_COUNT } Regime;
static const char *const REG_NAMES[REG_COUNT] = {"plain",   "g=0",          "g~-20",           "beta~1e-4",
                                                 "beta~1-1e-4", "repeated keys", "repeated keys, beta~1, g=0"};

typedef struct GdnInputs {
    Tensor *q, *k, *v, *beta, *g, *s0;   // s0 may be NULL
    int B, T, H, dk, dv;
} GdnInputs;


static GdnInputs make_inputs(int B, int T, int H, int dk, int dv, Regime reg, bool with_s0, uint64_t seed) {
    GdnInputs in = {.B = B, .T = T, .H = H, .dk = dk, .dv = dv};
    in.q = tensor_newv(true, 3, B, T, H * dk);
    in.k = tensor_newv(true, 3, B, T, H * dk);
    in.v = tensor_newv(true, 3, B, T, H * dv);
    in.beta = tensor_newv(true, 3, B, T, H);
    in.g = tensor_newv(true, 3, B, T, H);
    in.s0 = with_s0 ? tensor_newv(true, 4, B, H, dk, dv) : NULL;
    fill_normal(in.q, seed + 1, 1.0);
    fill_normal(in.k, seed + 2, 1.0);
    fill_normal(in.v, seed + 3, 1.0);
    if (in.s0) fill_normal(in.s0, seed + 4, 0.5);
    if (reg == REG_REPEAT || reg == REG_REPEAT_HARD) {
        // Every third position writes the same key as position 0 (per batch, head),
        // and positions 1, 2 share another one.
        for (int b = 0; b < B; b++)
            for (int t = 1; t < T; t++) {
                int src = t % 3 == 0 ? 0 : t == 2 ? 1 : -1;
                if (src < 0) continue;
                memcpy(in.k->data + ((int64_t)b * T + t) * H * dk, in.k->data + ((int64_t)b * T + src) * H * dk,
                       H * dk * sizeof(real));
            }
    }
    test_l2norm_rows(in.q, dk, 1.0 / sqrt(dk));
    test_l2norm_rows(in.k, dk, 1.0);
    Rng r;
    rng_seed(&r, seed + 5);
    for (int64_t i = 0; i < in.beta->numel; i++) {
        double u = rng_uniform(&r);
        double bt = 1.0 / (1.0 + exp(-rng_normal(&r)));
        double gt = -rng_range(&r, 0.01, 1.0);
        switch (reg) {
        case REG_G_ZERO: gt = 0; break;
        case REG_G_M20: gt = -20 + u; break;
        case REG_BETA_0: bt = 1e-4 * (0.5 + u); break;
        case REG_BETA_1: bt = 1 - 1e-4 * (0.5 + u); break;
        case REG_REPEAT_HARD: bt = 1 - 1e-4 * (0.5 + u), gt = 0; break;
        default: break;
        }
        in.beta->data[i] = (real)bt;
        in.g->data[i] = (real)gt;
    }
    return in;
}

static void free_inputs(GdnInputs *in) {
    tensor_free(in->q);
    tensor_free(in->k);
    tensor_free(in->v);
    tensor_free(in->beta);
    tensor_free(in->g);
    tensor_free(in->s0);
}

// ---- gradient checks ----

typedef struct {
    int H, chunk;
    MixerForm form;
} GdnCtx;

static int f_gdn(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    GdnCtx *c = ctx;
    out[0] = op_gdn(tp, in[0], in[1], in[2], in[3], in[4], n > 5 ? in[5] : NULL, NULL, c->H, c->form, c->chunk,
                    &out[1]);
    return 2;
}

static void gradcheck_form(MixerForm form, int T, int chunk, Regime reg, bool with_s0) {
    GdnInputs in = make_inputs(2, T, 2, 4, 3, reg, with_s0, 100 + T);
    GdnCtx c = {2, chunk, form};
    Tensor *ts[] = {in.q, in.k, in.v, in.beta, in.g, in.s0};
    char label[128];
    snprintf(label, sizeof label, "gdn %s T=%d C=%d %s%s", mixer_form_name(form), T, chunk, REG_NAMES[reg],
             with_s0 ? " +s0" : "");
    GradcheckResult r = gradcheck(label, f_gdn, ts, with_s0 ? 6 : 5, &c, NULL);
    ASSERT_GRADCHECK(r, label);
    cr_assert_gt(r.n_checked, 0);
    free_inputs(&in);
}

Test(gdn, gradcheck_chunked) {
    gradcheck_form(MIXER_FORM_CHUNKED, 7, 3, REG_PLAIN, true);    // 3 chunks, the last partial
    gradcheck_form(MIXER_FORM_CHUNKED, 5, 8, REG_PLAIN, true);    // one partial chunk
    gradcheck_form(MIXER_FORM_CHUNKED, 6, 2, REG_REPEAT, false);  // no initial state
    gradcheck_form(MIXER_FORM_CHUNKED, 6, 3, REG_G_ZERO, true);
}

Test(gdn, gradcheck_recurrent) {
    gradcheck_form(MIXER_FORM_RECURRENT, 7, 3, REG_PLAIN, true);
    gradcheck_form(MIXER_FORM_RECURRENT, 6, 4, REG_REPEAT, false);
}

// ---- chunked against recurrent ----

typedef struct FormRun {
    real *o, *sT, *grads[6];   // heap copies
} FormRun;

// Forward + backward of one form with fixed random seeds on o and S_T, on
// device_default() (AG_DEVICE=cuda: the GPU).
static FormRun run_form(GdnInputs *in, MixerForm form, int chunk) {
    GdnCtx c = {in->H, chunk, form};
    Tensor *ts[] = {in->q, in->k, in->v, in->beta, in->g, in->s0};
    real *out[2];
    cr_assert_eq(gradcheck_run(f_gdn, ts, in->s0 ? 6 : 5, &c, 7, out, NULL), 2);
    FormRun fr;
    fr.o = out[0];
    fr.sT = out[1];
    for (int i = 0; i < 6; i++) {
        fr.grads[i] = NULL;
        if (!ts[i]) continue;
        fr.grads[i] = xmalloc(ts[i]->numel * sizeof(real));
        memcpy(fr.grads[i], ts[i]->grad, ts[i]->numel * sizeof(real));
    }
    return fr;
}

static void free_run(FormRun *fr) {
    free(fr->o);
    free(fr->sT);
    for (int i = 0; i < 6; i++) free(fr->grads[i]);
}

// The tolerance of chunked vs recurrent. FORM_TOL, except in float32 without
// decay (g = 0): there the state sums the whole history, each form carries
// 1-4 float32 ulps of the largest |o| (measured against the float64 build:
// recurrent ~1.2e-7 max|o|, chunked C=64 ~3-4e-7 max|o|), and max_rel_diff
// measures elements below 1e-3 max on that floor, where one ulp of the max
// is already 1.2e-4 > FORM_TOL. Observed up to 4e-4; 1e-3 (~8 ulps of the max).
static double forms_tol(Regime reg) {
#ifdef AG_DOUBLE
    (void)reg;
    return FORM_TOL;
#else
    (void)reg;
    return FORM_TOL;
#endif
}

static void check_forms_agree_dims(int T, int chunk, Regime reg, int dk, int dv) {
    double tol = forms_tol(reg);
    GdnInputs in = make_inputs(2, T, 2, dk, dv, reg, true, 1000 + T * 7 + reg);
    FormRun a = run_form(&in, MIXER_FORM_RECURRENT, chunk), c = run_form(&in, MIXER_FORM_CHUNKED, chunk);
    static const char *const names[6] = {"dq", "dk", "dv", "dbeta", "dg", "ds0"};
    Tensor *ts[] = {in.q, in.k, in.v, in.beta, in.g, in.s0};
    double e = max_rel_diff(a.o, c.o, in.q->shape[0] * (int64_t)T * in.H * in.dv);
    cr_assert_leq(e, tol, "T=%d C=%d %s: o differs by %.3e", T, chunk, REG_NAMES[reg], e);
    e = max_rel_diff(a.sT, c.sT, in.s0->numel);
    cr_assert_leq(e, tol, "T=%d C=%d %s: S_T differs by %.3e", T, chunk, REG_NAMES[reg], e);
    for (int i = 0; i < 6; i++) {
        e = max_rel_diff(a.grads[i], c.grads[i], ts[i]->numel);
        cr_assert_leq(e, tol, "T=%d C=%d %s: %s differs by %.3e", T, chunk, REG_NAMES[reg], names[i], e);
        bool finite = true;
        for (int64_t j = 0; j < ts[i]->numel; j++) finite = finite && isfinite(c.grads[i][j]);
        cr_assert(finite, "T=%d C=%d %s: %s not finite", T, chunk, REG_NAMES[reg], names[i]);
    }
    free_run(&a);
    free_run(&c);
    free_inputs(&in);
}

static void check_forms_agree(int T, int chunk, Regime reg) { check_forms_agree_dims(T, chunk, reg, 8, 8); }

static void forms_agree_regime(Regime reg) {
    static const int Ts[] = {1, 63, 64, 65, 300}, Cs[] = {16, 32, 64};
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 3; j++) check_forms_agree(Ts[i], Cs[j], reg);
}

Test(gdn, chunked_equals_recurrent_plain) { forms_agree_regime(REG_PLAIN); }
Test(gdn, chunked_equals_recurrent_g_zero) { forms_agree_regime(REG_G_ZERO); }
Test(gdn, chunked_equals_recurrent_g_minus20) { forms_agree_regime(REG_G_M20); }
Test(gdn, chunked_equals_recurrent_beta_near_0) { forms_agree_regime(REG_BETA_0); }
Test(gdn, chunked_equals_recurrent_beta_near_1) { forms_agree_regime(REG_BETA_1); }
Test(gdn, chunked_equals_recurrent_repeated_keys) {
    forms_agree_regime(REG_REPEAT);
    forms_agree_regime(REG_REPEAT_HARD);
}

// Heads of whole vectors in both builds (16, 32): every chunk product with
// N = dk or dv runs through tile_gemm's register-blocked path, which dk = 8
// reaches only in float64; T = 100 leaves a partial last chunk.
Test(gdn, chunked_equals_recurrent_tile_sized_heads) {
    for (int r = 0; r < 3; r++) {
        Regime reg = r == 0 ? REG_PLAIN : r == 1 ? REG_G_M20 : REG_REPEAT;
        check_forms_agree_dims(100, 32, reg, 16, 32);
        check_forms_agree_dims(100, 64, reg, 32, 16);
    }
}

// ---- bf16 chunk products (precision = bf16) ----

#ifdef AG_TILE_BF16
typedef struct {
    int H, chunk;
    const int *doc_start;   // (B, T) or NULL
} GdnDocsCtx;

static int f_gdn_docs(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    GdnDocsCtx *c = ctx;
    out[0] = op_gdn(tp, in[0], in[1], in[2], in[3], in[4], n > 5 ? in[5] : NULL, c->doc_start, c->H,
                    MIXER_FORM_CHUNKED, c->chunk, &out[1]);
    return 2;
}

// The chunked form's outputs and gradients (o, S_T, dq, dk, dv, dbeta, dg,
// ds0) under the products selected now, on `threads` threads.
static void run_chunked(GdnInputs *in, int chunk, const int *doc_start, int threads, real *res[8]) {
    GdnDocsCtx c = {in->H, chunk, doc_start};
    Tensor *ts[] = {in->q, in->k, in->v, in->beta, in->g, in->s0};
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    cr_assert_eq(gradcheck_run(f_gdn_docs, ts, 6, &c, 7, res, NULL), 2);
    omp_set_num_threads(saved);
    for (int i = 0; i < 6; i++) {
        res[2 + i] = xmalloc(ts[i]->numel * sizeof(real));
        memcpy(res[2 + i], ts[i]->grad, ts[i]->numel * sizeof(real));
    }
}
#endif

// Under precision = bf16 the chunk products take bf16 operands and sum in
// float32 (gdn_chunk.c; each product is held to the exact product of its
// rounded operands in tile_mm/tile_gemm_rows_bf16_*). Here the whole op
// against its float32 self: heads of whole vectors (16, 32), chunks of 32
// and 64, T = 100 (a last chunk of 36 or 4 rows: its L x L products are
// not whole vectors and stay float32), documents, an initial state, and four
// regimes (the last, repeated keys with beta ~ 1 and no decay, makes I + A
// nearly singular, so Tm's entries are large and rounding them counts
// most; FLA's kernels round Tm too). Rounding an operand moves it by up to 2^-9 of
// itself, a product by about 2^-9 of its terms' size, and the chunk's
// outputs go through two to four products in a row (K K^T, the solve, R,
// Tm R, P Delta): normwise (largest difference over largest value, per
// array) measured 1.5e-3..9.2e-3 (the largest: dq with repeated keys,
// dbeta and dg under g ~ -20), allowed 2e-2. Were the products
// not bf16, both runs would be one float32 computation: every array must
// differ by more than 1e-4. Bit for bit on 1 and 2 threads.
Test(gdn, bf16_chunk_products_follow_float32) {
#ifndef AG_TILE_BF16
    cr_skip_test("this build has no bf16 tile products (float64, or no AVX512_BF16 target)");
#else
    if (!(onednn_built() && onednn_has_bf16())) cr_skip_test("this CPU has no AVX512_BF16 (or no oneDNN)");
    static const char *const names[8] = {"o", "S_T", "dq", "dk", "dv", "dbeta", "dg", "ds0"};
    enum { B = 2, T = 100, H = 2 };
    int doc_start[B * T] = {0};
    doc_start[40] = doc_start[T + 77] = 1;   // a document inside a chunk of each row
    char err[256];
    double lo = INFINITY, hi = 0;
    for (int r = 0; r < 4; r++) {
        Regime reg = r == 0 ? REG_PLAIN : r == 1 ? REG_G_M20 : r == 2 ? REG_REPEAT : REG_REPEAT_HARD;
        for (int shape = 0; shape < 2; shape++) {
            int dk = shape ? 16 : 32, dv = shape ? 32 : 16, chunk = shape ? 32 : 64;
            GdnInputs in = make_inputs(B, T, H, dk, dv, reg, true, 2000 + 10 * r + shape);
            real *f[8], *h[8], *h1[8];
            cr_assert(blas_select(GEMM_ONEDNN, PRECISION_FP32, err, sizeof err), "%s", err);
            cr_assert(!tile_products_bf16());
            run_chunked(&in, chunk, doc_start, 2, f);
            cr_assert(blas_select(GEMM_ONEDNN, PRECISION_BF16, err, sizeof err), "%s", err);
            cr_assert(tile_products_bf16());
            run_chunked(&in, chunk, doc_start, 2, h);
            run_chunked(&in, chunk, doc_start, 1, h1);
            int64_t n[8] = {(int64_t)B * T * H * dv, in.s0->numel, in.q->numel, in.k->numel, in.v->numel,
                            in.beta->numel, in.g->numel, in.s0->numel};
            for (int i = 0; i < 8; i++) {
                double e = max_rel_diff(f[i], h[i], n[i]);
                cr_assert_leq(e, 2e-2, "%s dk %d dv %d C %d: bf16 %s differs from float32 by %.3g", REG_NAMES[reg],
                              dk, dv, chunk, names[i], e);
                lo = fmin(lo, e), hi = fmax(hi, e);
                cr_assert_eq(memcmp(h[i], h1[i], (size_t)n[i] * sizeof(real)), 0,
                             "%s dk %d dv %d C %d: bf16 %s differs on 1 and 2 threads", REG_NAMES[reg], dk, dv, chunk,
                             names[i]);
                free(f[i]), free(h[i]), free(h1[i]);
            }
            free_inputs(&in);
        }
    }
    cr_assert_gt(lo, 1e-4, "an array is within %.3g of float32: were the chunk products bf16?", lo);
    cr_log_info("gdn bf16 against float32, normwise: %.3g .. %.3g", lo, hi);
    test_use_backend(0);
#endif
}

// The same op under bf16 with its chunk products on AMX (bf16_tiles = amx)
// and on AVX512_BF16: the same rounded operands, float32 sums in another
// order (test_tile_amx_chunk.c holds each product to float32's bound, about
// 64 2^-24 = 4e-6 of its terms at these sizes). The chunk's outputs pass
// through up to four products and the solve, and a sum that lands on the
// other side of a bf16 rounding boundary moves the next product's operand
// by 2^-9 of itself, but rarely: normwise (largest difference over largest
// value) measured up to 3.1e-6 in the regimes whose I + A is well
// conditioned, allowed 1e-4, far below bf16 from float32 (1.5e-3 at least,
// the test above). With repeated keys, beta ~ 1 and no decay, I + A is
// nearly singular and one such flip in Tm is amplified as bf16's own
// rounding is: measured 1.5e-6 in the Release build but 1.2e-3 (o) in the
// Debug one, whose float32 code around the products rounds differently;
// allowed there what bf16 itself is allowed, 2e-2. Some array must differ
// at all (else AMX did not run), and AMX is bit for bit on 1 and 2 threads.
#define AMX_GAP_SEEN "3.1e-6"
Test(gdn, amx_chunk_products_follow_avx512bf16) {
#ifndef AG_TILE_AMX
    cr_skip_test("this build has no AMX tiles (float64, no AVX512_BF16 target, or not GCC 11+ on x86-64 Linux)");
#else
    char why[200], err[256];
    if (!amx_bf16_usable(why, sizeof why)) cr_skip_test("%s", why);
    static const char *const names[8] = {"o", "S_T", "dq", "dk", "dv", "dbeta", "dg", "ds0"};
    enum { B = 2, T = 100, H = 2 };
    int doc_start[B * T] = {0};
    doc_start[40] = doc_start[T + 77] = 1;
    cr_assert(blas_select(GEMM_ONEDNN, PRECISION_BF16, err, sizeof err), "%s", err);
    double hi = 0;
    for (int r = 0; r < 4; r++) {
        Regime reg = r == 0 ? REG_PLAIN : r == 1 ? REG_G_M20 : r == 2 ? REG_REPEAT : REG_REPEAT_HARD;
        for (int shape = 0; shape < 2; shape++) {
            int dk = shape ? 16 : 32, dv = shape ? 32 : 16, chunk = shape ? 32 : 64;
            GdnInputs in = make_inputs(B, T, H, dk, dv, reg, true, 2100 + 10 * r + shape);
            real *v[8], *a[8], *a1[8];
            cr_assert(bf16_tiles_select(BF16_TILES_AVX512BF16, err, sizeof err), "%s", err);
            run_chunked(&in, chunk, doc_start, 2, v);
            cr_assert(bf16_tiles_select(BF16_TILES_AMX, err, sizeof err), "%s", err);
            run_chunked(&in, chunk, doc_start, 2, a);
            run_chunked(&in, chunk, doc_start, 1, a1);
            int64_t n[8] = {(int64_t)B * T * H * dv, in.s0->numel, in.q->numel, in.k->numel, in.v->numel,
                            in.beta->numel, in.g->numel, in.s0->numel};
            for (int i = 0; i < 8; i++) {
                double e = max_rel_diff(v[i], a[i], n[i]);
                bool hard = reg == REG_REPEAT_HARD;
                cr_assert_leq(e, hard ? 2e-2 : 1e-4, "%s dk %d dv %d C %d: %s on AMX differs from AVX512_BF16 by %.3g",
                              REG_NAMES[reg], dk, dv, chunk, names[i], e);
                if (!hard) hi = fmax(hi, e);
                cr_assert_eq(memcmp(a[i], a1[i], (size_t)n[i] * sizeof(real)), 0,
                             "%s dk %d dv %d C %d: %s on AMX differs on 1 and 2 threads", REG_NAMES[reg], dk, dv,
                             chunk, names[i]);
                free(v[i]), free(a[i]), free(a1[i]);
            }
            free_inputs(&in);
        }
    }
    cr_assert_gt(hi, 0, "AMX and AVX512_BF16 gave the same bits everywhere: did AMX run?");
    cr_log_info("gdn AMX against AVX512_BF16, normwise, well conditioned: up to %.3g (seen " AMX_GAP_SEEN ")", hi);
    cr_assert(bf16_tiles_select(BF16_TILES_AUTO, err, sizeof err), "%s", err);
    test_use_backend(0);
#endif
}

// ---- semantics ----

// Writing the same key twice with beta = 1, g = 0 replaces the first value
// (the delta rule), where plain linear attention would add them. On
// device_default() (AG_DEVICE=cuda: the GPU).
Test(gdn, delta_rule_overwrites_a_repeated_key) {
    for (int form = 0; form < 2; form++) {
        MixerForm f = form ? MIXER_FORM_CHUNKED : MIXER_FORM_RECURRENT;
        int dk = 4, dv = 2;
        Tensor *q = tensor_newv(false, 3, 1, 2, dk), *k = tensor_newv(false, 3, 1, 2, dk);
        Tensor *v = tensor_newv(false, 3, 1, 2, dv), *beta = tensor_newv(false, 3, 1, 2, 1);
        Tensor *g = tensor_newv(false, 3, 1, 2, 1);
        for (int t = 0; t < 2; t++) q->data[t * dk + 1] = k->data[t * dk + 1] = 1, beta->data[t] = 1;
        v->data[0] = 3, v->data[1] = -1, v->data[2] = 5, v->data[3] = 7;
        Tensor *ts[] = {q, k, v, beta, g};
        GdnCtx c = {1, 64, f};
        real *out[2];   // o, S_T: a forward alone (no output seeded)
        cr_assert_eq(gradcheck_run_seeds(f_gdn, ts, 5, &c, (const real *[]){NULL, NULL}, out, NULL), 2);
        const real *o = out[0], *sT = out[1];
        cr_assert_float_eq(o[0], 3, 1e-6);
        cr_assert_float_eq(o[1], -1, 1e-6);
        cr_assert_float_eq(o[2], 5, 1e-6, "%s: o_1 = %g, want 5", mixer_form_name(f), o[2]);
        cr_assert_float_eq(o[3], 7, 1e-6);
        cr_assert_float_eq(sT[1 * dv + 0], 5, 1e-6);   // S = e_1 [5, 7]^T
        cr_assert_float_eq(sT[0], 0, 1e-6);
        for (int i = 0; i < 5; i++) tensor_free(ts[i]);
        free(out[0]);
        free(out[1]);
    }
}

// max_rel_diff of a (B, T, F) array against two segments (B, T1, F), (B, T-T1, F) of it.
static double diff_two_segments(const real *whole, const Tensor *s1, const Tensor *s2, const real *d1,
                                const real *d2) {
    int B = s1->shape[0], T1 = s1->shape[1], T2 = s2->shape[1], F = s1->shape[2];
    real *cat = xmalloc((size_t)B * (T1 + T2) * F * sizeof(real));
    for (int b = 0; b < B; b++) {
        memcpy(cat + (int64_t)b * (T1 + T2) * F, d1 + (int64_t)b * T1 * F, (size_t)T1 * F * sizeof(real));
        memcpy(cat + ((int64_t)b * (T1 + T2) + T1) * F, d2 + (int64_t)b * T2 * F, (size_t)T2 * F * sizeof(real));
    }
    double e = max_rel_diff(whole, cat, (int64_t)B * (T1 + T2) * F);
    free(cat);
    return e;
}

// Two chunked segments on one tape, the first's final state the second's
// initial state: in = q, k, v, beta, g of segment 1, the same of segment 2,
// s0; outputs o1, o2 and the second segment's final state.
static int f_segments(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    GdnCtx *c = ctx;
    Tensor *const *a = in, *const *b = in + 5;
    Tensor *s1 = NULL;
    out[0] = op_gdn(tp, a[0], a[1], a[2], a[3], a[4], in[10], NULL, c->H, c->form, c->chunk, &s1);
    out[1] = op_gdn(tp, b[0], b[1], b[2], b[3], b[4], s1, NULL, c->H, c->form, c->chunk, &out[2]);
    return 3;
}

// Two segments carrying the state equal one pass over the whole sequence,
// forward and every gradient (including the one that flows through the
// carried state into the first segment and s0). Both on device_default()
// (AG_DEVICE=cuda: the GPU), the two segments on one tape.
Test(gdn, state_carries_across_segments) {
    int T = 50, T1 = 21, H = 2, dk = 8, dv = 8;
    GdnInputs in = make_inputs(2, T, H, dk, dv, REG_PLAIN, true, 77);
    FormRun whole = run_form(&in, MIXER_FORM_CHUNKED, 16);
    Tensor *full[5] = {in.q, in.k, in.v, in.beta, in.g}, *seg[11];
    for (int i = 0; i < 5; i++) {
        seg[i] = test_time_slice(full[i], 0, T1);
        seg[5 + i] = test_time_slice(full[i], T1, T - T1);
    }
    seg[10] = in.s0;
    // The seeds run_form used, split at T1.
    Tensor *ro = tensor_newv(false, 3, 2, T, H * dv), *rs = tensor_new(in.s0->ndim, in.s0->shape, false);
    fill_normal(ro, 7, 1.0);
    fill_normal(rs, 8, 1.0);
    Tensor *ro1 = test_time_slice(ro, 0, T1), *ro2 = test_time_slice(ro, T1, T - T1);
    GdnCtx c = {H, 16, MIXER_FORM_CHUNKED};
    real *out[3];
    cr_assert_eq(
        gradcheck_run_seeds(f_segments, seg, 11, &c, (const real *[]){ro1->data, ro2->data, rs->data}, out, NULL), 3);
    // o1, o2 have the shapes of v's segments.
    cr_assert_leq(diff_two_segments(whole.o, seg[2], seg[7], out[0], out[1]), FORM_TOL);
    cr_assert_leq(max_rel_diff(out[2], whole.sT, in.s0->numel), FORM_TOL);
    for (int i = 0; i < 5; i++) {
        double e = diff_two_segments(whole.grads[i], seg[i], seg[5 + i], seg[i]->grad, seg[5 + i]->grad);
        cr_assert_leq(e, FORM_TOL, "input %d differs by %.3e", i, e);
    }
    double e = max_rel_diff(in.s0->grad, whole.grads[5], in.s0->numel);
    cr_assert_leq(e, FORM_TOL, "ds0 differs by %.3e", e);
    for (int i = 0; i < 10; i++) tensor_free(seg[i]);
    for (int k = 0; k < 3; k++) free(out[k]);
    tensor_free(ro);
    tensor_free(ro1);
    tensor_free(ro2);
    tensor_free(rs);
    free_run(&whole);
    free_inputs(&in);
}

Test(gdn, rejects_bad_shapes) {
    Tape tp;
    tape_init(&tp);
    Tensor *q = tensor_newv(false, 3, 1, 4, 8), *v = tensor_newv(false, 3, 1, 4, 6);
    Tensor *bt = tensor_newv(false, 3, 1, 4, 2), *bad = tensor_newv(false, 3, 1, 4, 3);
    cr_assert(EXPECT_FAILURE(op_gdn(&tp, q, q, v, bad, bt, NULL, NULL, 2, MIXER_FORM_CHUNKED, 4, NULL)));
    cr_assert(strstr(ag_last_error(), "beta"), "message: %s", ag_last_error());
    cr_assert(EXPECT_FAILURE(op_gdn(&tp, q, q, v, bt, bt, NULL, NULL, 3, MIXER_FORM_CHUNKED, 4, NULL)));
    cr_assert(EXPECT_FAILURE(op_gdn(&tp, q, q, v, bt, bt, NULL, NULL, 2, MIXER_FORM_PARALLEL, 4, NULL)));
    cr_assert(!EXPECT_FAILURE(op_gdn(&tp, q, q, v, bt, bt, NULL, NULL, 2, MIXER_FORM_CHUNKED, 4, NULL)));
    tensor_free(q);
    tensor_free(v);
    tensor_free(bt);
    tensor_free(bad);
    tape_free(&tp);
}
