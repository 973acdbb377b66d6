// The attention kernel's bf16 tile products ([train] precision = bf16,
// attn_flash.c, tile_mm_bf16.h) against references that round exactly where
// the kernel says it does, at lengths that cut the tiles unevenly, with and
// without documents, head sizes in place and padded.
//
// Backward: every product's operands are rounded to bf16 (Q, K, V, dO, P,
// dS) and nothing else is, so a float64 reference that rounds the same
// operands (of its own P and dS, computed in float64) agrees up to float32
// sums and the rare operand that float32 and float64 round to neighbouring
// bf16 numbers: measured 3e-8 to 6e-6 normwise, allowed 1e-4. The float32 kernel
// is ~1e-3 away from that reference (bf16's own error), so the test also
// fails if the products were not bf16.
// Forward: the kernel rounds P at the running max of the online softmax,
// which a reference cannot replay without replaying the tiles; it is held to
// the bound that rounding gives instead: each weight moves by at most 2^-8
// of itself (bf16's unit roundoff), so o moves by at most 2^-8 sum_s w_s |v_s|
// (plus float32 sums).
//
// Each bf16 kind of tiles (tile_amx.h) is held to both: AVX512_BF16's and,
// where the CPU has AMX, AMX's (else skipped with the reason). The two round
// the same operands and differ in the order of their float32 sums, which
// also moves an operand that is rounded after a product (P, dS) to the
// neighbouring bf16 number now and then: they are held to the same bounds
// from each other (twice the forward's, 1e-4 normwise for the gradients).
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernel.h"
#include "blas.h"
#include "test_util.h"
#include "tile_amx.h"

#ifndef AG_DOUBLE
typedef struct {
    int B, T, H, dk, dv, tq, tk;
    const int *doc_start;
} Case;

static int f_attn(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)n;
    const Case *c = ctx;
    out[0] = op_attention_tiled(tp, in[0], in[1], in[2], c->H, 1.0 / sqrt(c->dk), c->doc_start, c->tq, c->tk);
    return 1;
}

static double rb(real x) { return bf16_round(x); }

// Runs the kernel (forward, then backward seeded with dO) at precision prec
// on tiles of kind `tiles`, on `threads` threads; o and the gradients of q,
// k, v into r[0..3] (free()).
static void run(const Case *c, Tensor **in, const real *dO, GemmPrecision prec, Bf16Tiles tiles, int threads,
                real *r[4]) {
    char err[256];
    cr_assert(blas_select(GEMM_ONEDNN, prec, err, sizeof err), "%s", err);
    cr_assert(bf16_tiles_select(tiles, err, sizeof err), "%s", err);
    Bf16Tiles want = prec == PRECISION_BF16 ? tiles : BF16_TILES_FP32;
    cr_assert_eq(attn_tiles_kind(c->dk, c->dv, c->tq, c->tk), want, "the tiles run %s, not %s",
                 bf16_tiles_name(attn_tiles_kind(c->dk, c->dv, c->tq, c->tk)), bf16_tiles_name(want));
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    const real *seeds[1] = {dO};
    cr_assert_eq(gradcheck_run_seeds(f_attn, in, 3, (void *)c, seeds, &r[0], NULL), 1);
    omp_set_num_threads(saved);
    for (int i = 0; i < 3; i++) {
        r[i + 1] = xmalloc((size_t)in[i]->numel * sizeof(real));
        memcpy(r[i + 1], in[i]->grad, (size_t)in[i]->numel * sizeof(real));
    }
    cr_assert(blas_select(GEMM_ONEDNN, PRECISION_FP32, err, sizeof err), "%s", err);
    cr_assert(bf16_tiles_select(BF16_TILES_AUTO, err, sizeof err), "%s", err);
}

// lo(b, t): the first key query t of row b may see.
static int key_lo(const Case *c, int b, int t) {
    int lo = 0;
    for (int s = 0; c->doc_start && s <= t; s++)
        if (c->doc_start[b * c->T + s]) lo = s;
    return lo;
}

typedef struct {
    double *o, *dq, *dk, *dv;   // the reference output and gradients
    double *bound;              // the forward's per-element bound: 2^-8 sum_s w_s |bf(v_s)|
} Ref;

// The float64 reference described at the top, with o_kernel (the kernel's
// output) in D_t = dO_t . O_t as the kernel has it.
static Ref reference(const Case *c, Tensor **in, const real *dO, const real *o_kernel) {
    int B = c->B, T = c->T, H = c->H, dk = c->dk, dv = c->dv, ldq = H * dk, ldv = H * dv;
    double scale = 1.0 / sqrt(dk);
    const real *q = in[0]->data, *k = in[1]->data, *v = in[2]->data;
    Ref r = {xcalloc((size_t)B * T * ldv, sizeof(double)), xcalloc((size_t)B * T * ldq, sizeof(double)),
             xcalloc((size_t)B * T * ldq, sizeof(double)), xcalloc((size_t)B * T * ldv, sizeof(double)),
             xcalloc((size_t)B * T * ldv, sizeof(double))};
    double *P = xmalloc((size_t)T * sizeof(double)), *dS = xmalloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                int lo = key_lo(c, b, t);
                const real *qt = q + ((int64_t)b * T + t) * ldq + h * dk;
                double m = -INFINITY, l = 0;
                for (int s = lo; s <= t; s++) {
                    const real *ks = k + ((int64_t)b * T + s) * ldq + h * dk;
                    double acc = 0;
                    for (int j = 0; j < dk; j++) acc += rb(qt[j]) * rb(ks[j]);
                    P[s] = scale * acc;
                    m = fmax(m, P[s]);
                }
                for (int s = lo; s <= t; s++) l += exp(P[s] - m);
                for (int s = lo; s <= t; s++) P[s] = exp(P[s] - m) / l;   // the weights
                int64_t ro = ((int64_t)b * T + t) * ldv + h * dv, rq = ((int64_t)b * T + t) * ldq + h * dk;
                double Dt = 0;
                for (int j = 0; j < dv; j++) Dt += (double)dO[ro + j] * o_kernel[ro + j];
                for (int s = lo; s <= t; s++) {
                    const real *vs = v + ((int64_t)b * T + s) * ldv + h * dv;
                    double dP = 0;
                    for (int j = 0; j < dv; j++) {
                        r.o[ro + j] += P[s] * rb(vs[j]);
                        r.bound[ro + j] += P[s] * fabs(rb(vs[j]));
                        dP += rb(dO[ro + j]) * rb(vs[j]);
                    }
                    dS[s] = P[s] * (dP - Dt);
                    int64_t so = ((int64_t)b * T + s) * ldv + h * dv, sk = ((int64_t)b * T + s) * ldq + h * dk;
                    for (int j = 0; j < dv; j++) r.dv[so + j] += rb(P[s]) * rb(dO[ro + j]);
                    for (int j = 0; j < dk; j++) {
                        r.dq[rq + j] += scale * rb(dS[s]) * rb(k[sk + j]);
                        r.dk[sk + j] += scale * rb(dS[s]) * rb(qt[j]);
                    }
                }
                for (int j = 0; j < dv; j++) r.bound[ro + j] = 0x1p-8 * r.bound[ro + j] * (1 + 1e-4) + 1e-6;
            }
    free(P);
    free(dS);
    return r;
}

static void ref_free(Ref *r) {
    free(r->o);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->bound);
}

// ||x - y|| / ||y||
static double rel_err(const real *x, const double *y, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) d += (x[i] - y[i]) * (x[i] - y[i]), s += y[i] * y[i];
    return sqrt(d / s);
}

// One bf16 kind's output h and gradients against the reference, the float32
// kernel's f as the proof that the reference can tell bf16 from float32.
static void check_against_reference(const Case *c, Tensor **in, const real *dO, real *const h[4], real *const f[4],
                                    const char *kind) {
    int64_t no = (int64_t)c->B * c->T * c->H * c->dv, nq = (int64_t)c->B * c->T * c->H * c->dk;
    int64_t sizes[4] = {no, nq, nq, no};
    Ref r = reference(c, in, dO, h[0]);
    double worst = 0;   // the forward against its bound
    for (int64_t i = 0; i < no; i++) {
        double e = fabs(h[0][i] - r.o[i]);
        cr_assert_leq(e, r.bound[i], "%s: o[%lld]: %.9g vs %.9g, beyond rounding P to bf16 (%.3g)", kind,
                      (long long)i, (double)h[0][i], r.o[i], r.bound[i]);
        worst = fmax(worst, e / r.bound[i]);
    }
    const char *names[3] = {"dq", "dk", "dv"};
    const double *refs[3] = {r.dq, r.dk, r.dv};
    for (int i = 0; i < 3; i++) {
        double eh = rel_err(h[i + 1], refs[i], sizes[i + 1]), ef = rel_err(f[i + 1], refs[i], sizes[i + 1]);
        cr_assert_leq(eh, 1e-4, "%s: %s: bf16 kernel %.3g from the bf16 reference (float32 kernel: %.3g)", kind,
                      names[i], eh, ef);
        cr_assert_gt(ef, 1e-4, "%s: the float32 kernel is as close (%.3g): the reference cannot tell", names[i], ef);
        cr_log_info("%s: %s: bf16 kernel %.3g, float32 kernel %.3g from the bf16 reference", kind, names[i], eh, ef);
    }
    cr_log_info("%s: o: at most %.2f of the rounding bound", kind, worst);
    ref_free(&r);
}

static void check_case(Case c) {
    if (!(onednn_built() && onednn_has_bf16())) cr_skip_test("this CPU has no AVX512_BF16 (or no oneDNN)");
    char err[256];
    cr_assert(blas_select(GEMM_ONEDNN, PRECISION_BF16, err, sizeof err), "%s", err);
    if (!attn_tiles_bf16(c.dk, c.dv, c.tq, c.tk))
        cr_skip_test("this build's attention tiles have no bf16 products (no AVX512_BF16 target: AG_NATIVE=OFF?)");
    cr_assert(blas_select(GEMM_ONEDNN, PRECISION_FP32, err, sizeof err), "%s", err);
    cr_assert(!attn_tiles_bf16(c.dk, c.dv, c.tq, c.tk), "float32 products, yet bf16 tiles");
    Tensor *in[3] = {tensor_newv(true, 3, c.B, c.T, c.H * c.dk), tensor_newv(true, 3, c.B, c.T, c.H * c.dk),
                     tensor_newv(true, 3, c.B, c.T, c.H * c.dv)};
    fill_normal(in[0], 11, 1.0);
    fill_normal(in[1], 12, 1.0);
    fill_normal(in[2], 13, 1.0);
    int64_t no = (int64_t)c.B * c.T * c.H * c.dv, nq = (int64_t)c.B * c.T * c.H * c.dk;
    real *dO = test_randn(no, 14);
    int64_t sizes[4] = {no, nq, nq, no};
    real *f[4], *kind[2][4] = {{NULL}};
    run(&c, in, dO, PRECISION_FP32, BF16_TILES_AUTO, 2, f);
    const Bf16Tiles kinds[2] = {BF16_TILES_AVX512BF16, BF16_TILES_AMX};
    char why[200];
    for (int ki = 0; ki < 2; ki++) {
        if (kinds[ki] == BF16_TILES_AMX && !amx_bf16_usable(why, sizeof why)) {
            cr_log_info("AMX tiles not tested: %s", why);   // (a warning would make Criterion exit 1)
            continue;
        }
        real *h[4], *h1[4];
        run(&c, in, dO, PRECISION_BF16, kinds[ki], 2, h);
        run(&c, in, dO, PRECISION_BF16, kinds[ki], 1, h1);
        // The bf16 kernel does not depend on the thread count.
        for (int i = 0; i < 4; i++)
            cr_assert(memcmp(h[i], h1[i], (size_t)sizes[i] * sizeof(real)) == 0, "%s: output %d differs with 1 thread",
                      bf16_tiles_name(kinds[ki]), i);
        check_against_reference(&c, in, dO, h, f, bf16_tiles_name(kinds[ki]));
        for (int i = 0; i < 4; i++) kind[ki][i] = h[i], free(h1[i]);
    }
    if (kind[1][0]) {   // AMX against AVX512_BF16
        Ref r = reference(&c, in, dO, kind[0][0]);
        int64_t differ = 0;
        for (int64_t i = 0; i < no; i++) {
            double e = fabs(kind[1][0][i] - kind[0][0][i]);
            cr_assert_leq(e, 2 * r.bound[i], "o[%lld]: AMX %.9g, AVX512_BF16 %.9g", (long long)i,
                          (double)kind[1][0][i], (double)kind[0][0][i]);
            differ += e != 0;
        }
        for (int i = 1; i < 4; i++) {
            double d = 0, n = 0;
            for (int64_t j = 0; j < sizes[i]; j++)
                d += ((double)kind[1][i][j] - kind[0][i][j]) * ((double)kind[1][i][j] - kind[0][i][j]),
                    n += (double)kind[0][i][j] * kind[0][i][j];
            cr_assert_leq(sqrt(d / n), 1e-4, "gradient %d: AMX %.3g from AVX512_BF16", i, sqrt(d / n));
            cr_log_info("gradient %d: AMX %.3g from AVX512_BF16 normwise", i, sqrt(d / n));
        }
        cr_log_info("o: %lld of %lld elements differ between AMX and AVX512_BF16", (long long)differ, (long long)no);
        ref_free(&r);
    }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++) free(kind[k][i]);
    for (int i = 0; i < 4; i++) free(f[i]);
    free(dO);
    for (int i = 0; i < 3; i++) tensor_free(in[i]);
}
#endif

Test(attn_bf16, tiles_even_and_cut_heads_in_place) {
#ifdef AG_DOUBLE
    cr_skip_test("bf16 products are float32 builds only");
#else
    check_case((Case){2, 77, 2, 32, 32, 16, 32, NULL});
#endif
}

Test(attn_bf16, padded_heads_unequal_tiles) {
#ifdef AG_DOUBLE
    cr_skip_test("bf16 products are float32 builds only");
#else
    check_case((Case){1, 93, 3, 24, 20, 32, 16, NULL});
#endif
}

Test(attn_bf16, documents) {
#ifdef AG_DOUBLE
    cr_skip_test("bf16 products are float32 builds only");
#else
    enum { B = 2, T = 90 };
    static int doc[B * T];
    doc[0 * T + 0] = doc[0 * T + 17] = doc[0 * T + 50] = doc[0 * T + 51] = 1;   // (row 0: short ones, one of 1)
    doc[1 * T + 33] = doc[1 * T + 64] = 1;                                      // (row 1: begins mid-document)
    check_case((Case){B, T, 2, 32, 32, 16, 16, doc});
#endif
}

// The default tiles (64 x 64) at the model's head sizes, T cutting the last tile.
Test(attn_bf16, heads_of_64_and_128_default_tiles, .timeout = 120) {
#ifdef AG_DOUBLE
    cr_skip_test("bf16 products are float32 builds only");
#else
    check_case((Case){1, 150, 2, 64, 64, ATTN_TILE_Q, ATTN_TILE_K, NULL});
    check_case((Case){1, 100, 1, 128, 128, ATTN_TILE_Q, ATTN_TILE_K, NULL});
#endif
}

// bf16_tiles = fp32 under precision = bf16: the attention runs the float32
// kernel, bit for bit, whatever the dense products do.
Test(attn_bf16, fp32_tiles_under_bf16_are_the_float32_kernel) {
#ifdef AG_DOUBLE
    cr_skip_test("bf16 products are float32 builds only");
#else
    if (!(onednn_built() && onednn_has_bf16())) cr_skip_test("this CPU has no AVX512_BF16 (or no oneDNN)");
    Case c = {2, 77, 2, 32, 32, 16, 32, NULL};
    Tensor *in[3] = {tensor_newv(true, 3, c.B, c.T, c.H * c.dk), tensor_newv(true, 3, c.B, c.T, c.H * c.dk),
                     tensor_newv(true, 3, c.B, c.T, c.H * c.dv)};
    for (int i = 0; i < 3; i++) fill_normal(in[i], 21 + i, 1.0);
    int64_t no = (int64_t)c.B * c.T * c.H * c.dv, nq = (int64_t)c.B * c.T * c.H * c.dk;
    real *dO = test_randn(no, 24), *h[4], *f[4];
    run(&c, in, dO, PRECISION_BF16, BF16_TILES_FP32, 2, h);
    run(&c, in, dO, PRECISION_FP32, BF16_TILES_AUTO, 2, f);
    int64_t sizes[4] = {no, nq, nq, no};
    for (int i = 0; i < 4; i++) {
        cr_assert(memcmp(h[i], f[i], (size_t)sizes[i] * sizeof(real)) == 0, "output %d differs from float32's", i);
        free(h[i]), free(f[i]);
    }
    free(dO);
    for (int i = 0; i < 3; i++) tensor_free(in[i]);
#endif
}
