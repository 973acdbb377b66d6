// The chunk kernels' products (gla, gdn: tile_gemm_rows_bf16_on,
// tile_mm_bf16.h) on AMX tiles against the same products on AVX512_BF16 and
// against a float64 product of the same bf16 operands: every option the
// kernels use (op(A), op(B) transposed or not, row scales, the lower blocks
// of C, causal bands either way, C written or added to) at their shapes and
// at partial tiles (M, N, K not multiples of 16 or 32, odd K). Both kinds
// round the same operands, so they may differ only in how they sum in
// float32: each is held to float32's summation bound (K + 3) u (|alpha s_i|
// sum_k |a_k b_k| + |C|), u = 2^-24, as in test_tile_amx.c, and to twice
// that from the other. What the product must leave alone (the blocks above
// the diagonal under lower, C past N) stays bit for bit.
//
// Skipped, with the reason, where the build or the CPU has no AMX.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "gdn_kernel.h"
#include "gla.h"
#include "test_util.h"
#include "tile_amx.h"

#ifdef AG_TILE_AMX
static const char *why_no_amx(void) {
    static char why[200];
    return amx_bf16_usable(why, sizeof why) ? NULL : why;
}

typedef struct {
    int M, N, K;
    bool ta, tb, add, scaled, lower;
    int band;   // 0 none, 1 causal (k <= i), 2 anti-causal (k >= i)
} Case;

typedef struct {
    int lda, ldb, ldc, lo, hi;
    real *A, *B, *rs, *C0;
    bfpair *pa, *pb;
} Operands;

static Operands operands(const Case *c, uint64_t seed) {
    Operands o;
    o.lo = c->band == 2 ? 0 : -c->M, o.hi = c->band == 1 ? 0 : c->K;
    o.lda = c->ta ? c->M + 3 : c->K + 1, o.ldb = c->tb ? c->K + 5 : c->N + 16, o.ldc = c->N + 32;
    o.A = test_randn((int64_t)(c->ta ? c->K : c->M) * o.lda, seed);
    o.B = test_randn((int64_t)(c->tb ? c->N : c->K) * o.ldb, seed + 1);
    o.rs = test_randn(c->M, seed + 2);
    o.C0 = test_randn((int64_t)c->M * o.ldc, seed + 3);
    for (int i = 0; i < c->M; i++)   // outside the band: large numbers the product must not read
        for (int k = 0; k < c->K; k++)
            if (k < i + o.lo || k > i + o.hi) o.A[c->ta ? (int64_t)k * o.lda + i : (int64_t)i * o.lda + k] = 1e6f;
    o.pa = xaligned((size_t)imax(c->M, c->N) * (c->K + 1) * sizeof(bfpair));   // N rows: tb's scratch
    o.pb = xaligned((size_t)(c->K + 1) * c->N * sizeof(bfpair));
    return o;
}

static void operands_free(Operands *o) { free(o->A), free(o->B), free(o->rs), free(o->C0), free(o->pa), free(o->pb); }

// C after the product on AMX (amx) or AVX512_BF16, from C0.
static real *product(const Case *c, const Operands *o, bool amx, real alpha) {
    real *C = xaligned((size_t)c->M * o->ldc * sizeof(real));
    memcpy(C, o->C0, (size_t)c->M * o->ldc * sizeof(real));
    if (amx) amx_tiles_begin();
    bool ran = tile_gemm_rows_bf16_on(amx, c->ta, c->tb, c->lower, c->M, c->N, c->K, alpha, c->scaled ? o->rs : NULL,
                                      o->A, o->lda, o->B, o->ldb, c->add ? 1 : 0, C, o->ldc, o->lo, o->hi, o->pa,
                                      o->pb);
    if (amx) amx_tiles_end();
    cr_assert(ran);
    return C;
}

// Whether the product writes C[i][j]: every element of N columns, under
// lower only those in the 16 x 16 blocks on or below the diagonal.
static bool written(const Case *c, int i, int j) { return j < c->N && (!c->lower || j / 16 <= i / 16); }

// One case: AMX and AVX512_BF16 against the reference; the number of
// elements where the two kinds differ (in *differ).
static void check_case(const Case *c, uint64_t seed, int64_t *differ) {
    Operands o = operands(c, seed);
    real alpha = (real)-0.75;
    real *amx = product(c, &o, true, alpha), *avx = product(c, &o, false, alpha);
    const double u = 0x1p-24;
    for (int i = 0; i < c->M; i++)
        for (int j = 0; j < o.ldc; j++) {
            int64_t at = (int64_t)i * o.ldc + j;
            if (!written(c, i, j)) {
                cr_assert(memcmp(&amx[at], &o.C0[at], sizeof(real)) == 0 &&
                              memcmp(&avx[at], &o.C0[at], sizeof(real)) == 0,
                          "M %d N %d K %d lower %d: C[%d][%d] written (AMX %.9g, AVX512 %.9g, before %.9g)", c->M,
                          c->N, c->K, c->lower, i, j, (double)amx[at], (double)avx[at], (double)o.C0[at]);
                continue;
            }
            double s = 0, mag = 0;
            for (int k = imax(0, i + o.lo); k <= imin(c->K - 1, i + o.hi); k++) {
                double a = bf16_round(o.A[c->ta ? (int64_t)k * o.lda + i : (int64_t)i * o.lda + k]);
                double b = bf16_round(o.B[c->tb ? (int64_t)j * o.ldb + k : (int64_t)k * o.ldb + j]);
                s += a * b;
                mag += fabs(a * b);
            }
            double f = (double)alpha * (c->scaled ? o.rs[i] : 1);
            double c0 = c->add ? o.C0[at] : 0, want = f * s + c0;
            double bound = (c->K + 3) * u * (fabs(f) * mag + fabs(c0));
            cr_assert(fabs(amx[at] - want) <= bound,
                      "M %d N %d K %d ta %d tb %d add %d rs %d lower %d band %d: AMX C[%d][%d] = %.9g, reference "
                      "%.9g, beyond float32 sums (%.3g)",
                      c->M, c->N, c->K, c->ta, c->tb, c->add, c->scaled, c->lower, c->band, i, j, (double)amx[at],
                      want, bound);
            cr_assert(fabs(avx[at] - want) <= bound, "AVX512_BF16 C[%d][%d] = %.9g, reference %.9g (%.3g)", i, j,
                      (double)avx[at], want, bound);
            cr_assert(fabs(amx[at] - avx[at]) <= 2 * bound, "C[%d][%d]: AMX %.9g, AVX512_BF16 %.9g", i, j,
                      (double)amx[at], (double)avx[at]);
            *differ += amx[at] != avx[at];
        }
    free(amx), free(avx);
    operands_free(&o);
}
#endif

Test(tile_amx_chunk, products_within_float32_sums_of_the_bf16_product) {
#ifndef AG_TILE_AMX
    cr_skip_test("this build has no AMX tiles (float64, no AVX512_BF16 target, or not GCC 11+ on x86-64 Linux)");
#else
    if (why_no_amx()) cr_skip_test("%s", why_no_amx());
    // M, N, K: the chunk kernels' shapes (chunk 64, heads 32 and 64), then
    // partial tiles: M, K odd or past a tile, N one or three vectors.
    const int sizes[][3] = {{64, 64, 64}, {64, 32, 32}, {32, 64, 64}, {2 * MR + 3, 32, 21}, {5, 16, 17},
                            {48, 48, 48}, {37, 48, 37}, {33, 16, 33}, {64, 64, 100}};
    int64_t differ = 0, cases = 0;
    for (size_t sz = 0; sz < sizeof sizes / sizeof sizes[0]; sz++)
        for (int variant = 0; variant < 96; variant++) {
            Case c = {sizes[sz][0], sizes[sz][1], sizes[sz][2], variant & 1, variant & 2, variant & 4, variant & 8,
                      variant & 16, variant / 32};
            if (c.lower && c.M != c.N) continue;
            check_case(&c, 700 + 97 * sz + variant, &differ);
            cases++;
        }
    // The two kinds sum in different orders: were AMX not taken, no element would differ.
    cr_assert_gt(differ, 0, "AMX and AVX512_BF16 agree bit for bit in all %lld cases: did AMX run?", (long long)cases);
    cr_log_info("%lld cases, %lld elements differ between AMX and AVX512_BF16", (long long)cases, (long long)differ);
#endif
}

// The lower product with no band (tile_ctx_gemm_lower's form) leaves every
// block above the diagonal as it was, and TileCtx routes to AMX only when
// its amx flag says so: with amx false the products are AVX512_BF16's, bit
// for bit.
Test(tile_amx_chunk, the_context_routes_by_its_flag) {
#ifndef AG_TILE_AMX
    cr_skip_test("this build has no AMX tiles");
#else
    if (why_no_amx()) cr_skip_test("%s", why_no_amx());
    enum { M = 64, K = 48, LD = 64 };
    real *A = test_randn(M * K, 11), *B = test_randn(K * LD, 12);
    real *C[3];
    bfpair *pa = xaligned(M * (K + 1) * sizeof(bfpair)), *pb = xaligned(M * (K + 1) * sizeof(bfpair));
    for (int r = 0; r < 3; r++) {   // 0: AVX512_BF16 directly; 1: through tc, amx off; 2: through tc, amx on
        C[r] = xaligned(M * LD * sizeof(real));
        for (int i = 0; i < M * LD; i++) C[r][i] = 9;
        TileCtx tc = {true, pa, pb, r == 2};
        if (r == 0) cr_assert(tile_gemm_rows_bf16(false, false, true, M, M, K, 1, NULL, A, K, B, LD, 0, C[r], LD, -M,
                                                  K, pa, pb));
        else {
            if (tc.amx) amx_tiles_begin();
            tile_ctx_gemm_lower(&tc, M, K, 1, A, K, B, LD, 0, C[r], LD);
            if (tc.amx) amx_tiles_end();
        }
    }
    cr_assert_eq(memcmp(C[0], C[1], M * LD * sizeof(real)), 0, "amx off: not AVX512_BF16's products");
    int64_t differ = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < M; j++) {
            if (j / 16 > i / 16) cr_assert_eq(C[2][i * LD + j], 9, "C[%d][%d] above the diagonal blocks written", i, j);
            differ += C[2][i * LD + j] != C[0][i * LD + j];
        }
    cr_assert_gt(differ, 0, "amx on: the products are AVX512_BF16's bit for bit");
    free(A), free(B), free(pa), free(pb), free(C[0]), free(C[1]), free(C[2]);
#endif
}

// A gdn or gla node keeps the kind of products it was built with
// (chunk_tiles_kind), so that its backward sums as its forward did even
// when bf16_tiles changes in between: the gradients of a forward on AMX are
// the same bits whichever kind is set at the backward, and differ from
// those of a forward on AVX512_BF16 (so the test can tell the kinds apart).
#ifdef AG_TILE_AMX
enum { KB = 1, KT = 128, KH = 2, KD = 32, KC = 64 };

static Tensor *filled(int F, double scale, double shift, uint64_t seed) {
    Tensor *t = tensor_newv(true, 3, KB, KT, F);
    real *r = test_randn(t->numel, seed);
    for (int64_t i = 0; i < t->numel; i++) t->data[i] = (real)(shift + scale * r[i]);
    free(r);
    return t;
}

// The gradients of q, k, v (concatenated) of one forward under `fwd` and
// its backward under `bwd`.
static real *grads_of(int op, Bf16Tiles fwd, Bf16Tiles bwd, int64_t *n) {
    char err[256];
    Tensor *x[5] = {filled(KH * KD, 0.18, 0, 1), filled(KH * KD, 0.18, 0, 2), filled(KH * KD, 1, 0, 3),
                    filled(KH, 0.1, 0.5, 4), filled(KH, 0.02, -0.05, 5)};
    real *seed = test_randn(x[2]->numel, 6);
    Tape tp;
    tape_init(&tp);
    cr_assert(bf16_tiles_select(fwd, err, sizeof err), "%s", err);
    Tensor *o = op ? op_gla(&tp, x[0], x[1], x[2], x[4], NULL, NULL, KH, MIXER_FORM_CHUNKED, KC, NULL)
                   : op_gdn(&tp, x[0], x[1], x[2], x[3], x[4], NULL, NULL, KH, MIXER_FORM_CHUNKED, KC, NULL);
    cr_assert(bf16_tiles_select(bwd, err, sizeof err), "%s", err);
    tape_backward_from(&tp, o, seed);
    *n = 3 * x[0]->numel;
    real *g = xmalloc((size_t)*n * sizeof(real));
    for (int i = 0; i < 3; i++) memcpy(g + i * x[0]->numel, x[i]->grad, x[0]->numel * sizeof(real));
    tape_free(&tp);
    free(seed);
    for (int i = 0; i < 5; i++) tensor_free(x[i]);
    return g;
}
#endif

Test(tile_amx_chunk, a_node_keeps_its_kind_for_the_backward) {
#ifndef AG_TILE_AMX
    cr_skip_test("this build has no AMX tiles");
#else
    if (why_no_amx()) cr_skip_test("%s", why_no_amx());
    if (!(onednn_built() && onednn_has_bf16())) cr_skip_test("this CPU has no AVX512_BF16 (or no oneDNN)");
    char err[256];
    cr_assert(blas_select(GEMM_ONEDNN, PRECISION_BF16, err, sizeof err), "%s", err);
    for (int op = 0; op < 2; op++) {
        int64_t n;
        real *amx = grads_of(op, BF16_TILES_AMX, BF16_TILES_AMX, &n);
        real *switched = grads_of(op, BF16_TILES_AMX, BF16_TILES_AVX512BF16, &n);
        real *avx = grads_of(op, BF16_TILES_AVX512BF16, BF16_TILES_AVX512BF16, &n);
        cr_assert_eq(memcmp(amx, switched, (size_t)n * sizeof(real)), 0,
                     "%s: the backward of an AMX forward ran other products when bf16_tiles changed",
                     op ? "gla" : "gdn");
        cr_assert_neq(memcmp(amx, avx, (size_t)n * sizeof(real)), 0,
                      "%s: AMX and AVX512_BF16 gradients agree bit for bit: the test cannot tell", op ? "gla" : "gdn");
        free(amx), free(switched), free(avx);
    }
    cr_assert(bf16_tiles_select(BF16_TILES_AUTO, err, sizeof err), "%s", err);
    test_use_backend(0);
#endif
}
