// Tests of op_kda's chunked form under [train] precision = bf16, whose chunk
// products (kda_chunk.c's header lists which) take bf16 operands and sum in
// float32: the whole op against its float32 self, on one and two threads,
// on AMX against AVX512_BF16, and a node keeping its kind of products for
// its backward. Skipped, with the reason, where the build or the CPU has no
// bf16 products (float64 builds always).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "blas.h"
#include "kda_kernel.h"
#include "test_util.h"
#include "tile_amx.h"

#ifdef AG_TILE_BF16
enum { IQ, IK, IV, IBETA, IG, IS0, N_IN };
enum { N_RES = 2 + N_IN };   // o, S_T, then the inputs' gradients
static const char *const RES_NAMES[N_RES] = {"o", "S_T", "dq", "dk", "dv", "dbeta", "dg", "ds0"};

// The decays of g: per channel uniform in [-1, -0.01]; none; g ~ -30 (every
// channel past the span bound inside a sub-block, so the products hold
// only the terms from earlier sub-blocks, e^-30 small, and the rest is the
// float32 per-element path); mild but channel 0 at -40 per step (one slow
// channel beside the products').
typedef enum { DEC_MILD, DEC_ZERO, DEC_STRONG, DEC_ONE_SLOW, DEC_COUNT } DecayKind;
static const char *const DEC_NAMES[DEC_COUNT] = {"mild", "g=0", "g~-30", "channel 0 at -40"};

// Heads of whole vectors (the bf16 products need N a multiple of 16);
// T leaves a partial last chunk each time (of 4, 36, 2 and 13 rows, none
// a multiple of 16: its L x L products stay float32, the rest do not).
typedef struct {
    int dk, dv, C, T;
} Shape;
static const Shape SHAPES[] = {{16, 32, 32, 100}, {32, 16, 64, 100}, {64, 64, 64, 130}, {32, 32, 16, 77}};
enum { N_SHAPES = sizeof SHAPES / sizeof SHAPES[0], B = 2, H = 2 };

// q, k L2-normalised per head (q scaled by 1/sqrt(dk)) as the layer feeds
// them, v ~ N(0, 1), beta a sigmoid of N(0, 1), s0 ~ N(0, 0.5^2).
static void make_inputs(Tensor **x, Shape s, DecayKind dec, uint64_t seed) {
    test_kda_inputs(x, B, s.T, H, s.dk, s.dv, seed);
    Rng r;
    rng_seed(&r, seed + 99);
    for (int64_t i = 0; i < x[IG]->numel; i++) {
        double g = -rng_range(&r, 0.01, 1.0);
        if (dec == DEC_ZERO) g = 0;
        if (dec == DEC_STRONG) g = -rng_range(&r, 29, 31);
        if (dec == DEC_ONE_SLOW && i % s.dk == 0) g = -40;
        x[IG]->data[i] = (real)g;
    }
}

// Documents beginning inside a chunk of each row (37: row 0; T - 23: row 1,
// in its last chunk or the one before).
static int *make_docs(int T) {
    int *d = xcalloc((size_t)B * T, sizeof(int));
    d[37] = d[T + T - 23] = 1;
    return d;
}

typedef struct {
    int chunk;
    const int *docs;
} Ctx;

static int f_kda(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    const Ctx *c = ctx;
    (void)n;
    out[0] = op_kda(tp, in[IQ], in[IK], in[IV], in[IBETA], in[IG], in[IS0], c->docs, H, MIXER_FORM_CHUNKED, c->chunk,
                    &out[1]);
    return 2;
}

// The outputs and gradients (res, n: their sizes) under the products
// selected now, on `threads` threads.
static void run(Tensor **x, const Ctx *c, int threads, real *res[N_RES], int64_t n[N_RES]) {
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    cr_assert_eq(gradcheck_run(f_kda, x, N_IN, (void *)c, 7, res, n), 2);
    omp_set_num_threads(saved);
    for (int i = 0; i < N_IN; i++) {
        n[2 + i] = x[i]->numel;
        res[2 + i] = xmalloc((size_t)x[i]->numel * sizeof(real));
        memcpy(res[2 + i], x[i]->grad, (size_t)x[i]->numel * sizeof(real));
    }
}

static void free_res(real *res[N_RES]) {
    for (int i = 0; i < N_RES; i++) free(res[i]);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Whether b is a's bits, array by array; the first that is not in *which.
static bool same_bits(real *const a[N_RES], real *const b[N_RES], const int64_t n[N_RES], int *which) {
    for (int i = 0; i < N_RES; i++)
        if (memcmp(a[i], b[i], (size_t)n[i] * sizeof(real))) {
            *which = i;
            return false;
        }
    return true;
}

// What a run selects: the products' precision and the bf16 tiles' kind.
typedef struct {
    GemmPrecision prec;
    Bf16Tiles tiles;
} Setting;

static void select_setting(Setting st) {
    char err[256];
    cr_assert(blas_select(GEMM_ONEDNN, st.prec, err, sizeof err), "%s", err);
    cr_assert(bf16_tiles_select(st.tiles, err, sizeof err), "%s", err);
    cr_assert_eq(tile_products_bf16(), st.prec == PRECISION_BF16);
}

// One case (shape sh, decay dec, inputs from seed): every result under
// `test` against the same under `base` (both on two threads), normwise,
// into e; and `test` on one thread must give its two-thread bits.
static void compare_case(int sh, DecayKind dec, uint64_t seed, Setting base, Setting test, double e[N_RES]) {
    Shape s = SHAPES[sh];
    Tensor *x[N_IN];
    make_inputs(x, s, dec, seed);
    int *docs = make_docs(s.T);
    Ctx c = {s.C, docs};
    real *b[N_RES], *t[N_RES], *t1[N_RES];
    int64_t n[N_RES];
    select_setting(base);
    run(x, &c, 2, b, n);
    select_setting(test);
    run(x, &c, 2, t, n);
    run(x, &c, 1, t1, n);
    for (int i = 0; i < N_RES; i++) e[i] = max_rel_diff(b[i], t[i], n[i]);
    int which = 0;
    cr_assert(same_bits(t, t1, n, &which), "%s dk %d dv %d C %d T %d: %s differs on 1 and 2 threads", DEC_NAMES[dec],
              s.dk, s.dv, s.C, s.T, RES_NAMES[which]);
    free_res(b), free_res(t), free_res(t1);
    free(docs);
    for (int i = 0; i < N_IN; i++) tensor_free(x[i]);
}
#endif

#define SKIP_WITHOUT_BF16()                                                                                        \
    if (!(onednn_built() && onednn_has_bf16())) cr_skip_test("this CPU has no AVX512_BF16 (or no oneDNN)")

// Under precision = bf16 against float32, every output and gradient, on
// every shape and decay above, with documents and an initial state. A bf16
// product C = A B rounds each operand to nearest (relative error at most u
// = 2^-9) and multiplies exactly, so |C' - C|_ij <= (2u + u^2) sum_k |a_ik
// b_kj| (the float32 sums add K 2^-24 of the same, 4e-6 at K = 64: nothing
// beside it). Normwise (the largest difference over the largest value of
// the array, max_rel_diff) that is 2u rho, rho the ratio of a product's sum
// of |terms| to the array's largest element: about 1 to 2 for these inputs
// (unit keys, queries of norm 1/sqrt(dk), normal values: |x . y| <= sum
// |x_c y_c| <= |x| |y|, the largest elements those of nearly aligned rows).
// Errors of products in a row add, each relative to its own terms, and the
// longest row of bf16 products an array goes through is four (dk, dg, dbeta:
// P, P^T dO, then after the substitution dA = -dR Delta^T, dKKE Ys; o: KKE,
// P, P Delta; the substitutions are summed in double and are well
// conditioned here, beta < 1). Bound: 4 products x 2u x rho <= 4 2^-8 2 =
// 3.1e-2; each array's worst over the cases measured 1.3e-3 .. 6.4e-3 over
// nine seeds (the largest: o and ds0). Were the products not bf16 both
// runs would be one float32 computation: o (through P Delta and Qg S0
// whatever the decay) must differ by more than 1e-4 in every case, and
// every array in some case (S_T under g ~ -30 is the same bits: every
// product that reaches it holds only e^-30 terms there).
// Bit for bit on 1 and 2 threads.
#define BF16_CHAIN 4          // bf16 products in a row, at most
#define BF16_RHO 2.0          // sum of |terms| over the array's largest element, at most
#define BF16_BOUND (BF16_CHAIN * 2 * 0x1p-9 * BF16_RHO)
#ifdef AG_TILE_BF16
enum { N_CASES = N_SHAPES * DEC_COUNT };

// compare_case over every shape and decay (seeds from seed0), each result
// within BF16_BOUND; e[case][result] the differences.
static void compare_all(uint64_t seed0, Setting base, Setting test, const char *what, double e[N_CASES][N_RES]) {
    for (int sh = 0; sh < N_SHAPES; sh++)
        for (int dec = 0; dec < DEC_COUNT; dec++) {
            double *ec = e[sh * DEC_COUNT + dec];
            Shape s = SHAPES[sh];
            compare_case(sh, dec, seed0 + 100 * sh + 10 * dec, base, test, ec);
            for (int i = 0; i < N_RES; i++)
                cr_assert_leq(ec[i], BF16_BOUND, "%s dk %d dv %d C %d T %d: %s %s by %.3g", DEC_NAMES[dec], s.dk, s.dv,
                              s.C, s.T, RES_NAMES[i], what, ec[i]);
        }
}
#endif

Test(kda_bf16, chunk_products_follow_float32) {
#ifndef AG_TILE_BF16
    cr_skip_test("this build has no bf16 tile products (float64, or no AVX512_BF16 target)");
#else
    SKIP_WITHOUT_BF16();
    Setting fp32 = {PRECISION_FP32, BF16_TILES_AUTO}, bf16 = {PRECISION_BF16, BF16_TILES_AUTO};
    double e[N_CASES][N_RES], worst[N_RES] = {0}, best_o = INFINITY;
    compare_all(3000, fp32, bf16, "under bf16 differs from float32", e);
    for (int c = 0; c < N_CASES; c++) {
        for (int i = 0; i < N_RES; i++) worst[i] = fmax(worst[i], e[c][i]);
        best_o = fmin(best_o, e[c][0]);
    }
    cr_assert_gt(best_o, 1e-4, "o is within %.3g of float32 in some case: were its products bf16?", best_o);
    for (int i = 0; i < N_RES; i++) {
        cr_assert_gt(worst[i], 1e-4, "%s is within %.3g of float32 everywhere: were its products bf16?",
                     RES_NAMES[i], worst[i]);
        cr_log_info("kda bf16 against float32, normwise, worst %s: %.3g", RES_NAMES[i], worst[i]);
    }
    test_use_backend(0);
#endif
}

// The same op under bf16 with its products on AMX (bf16_tiles = amx) and
// on AVX512_BF16: the same rounded operands, float32 sums in another order,
// each product within float32's summation bound of the other, (K + 3)
// 2^-24 of its terms (4e-6 at K = 64; test_tile_amx_chunk.c holds each
// product to it). Where no rounding of an intermediate flips, an array
// differs by at most 4 products x 2 x 67 2^-24 x rho = 3.2e-5 normwise
// (BF16_CHAIN, rho as above), and so must the median over all arrays and
// cases (measured 4e-8 .. 8e-8 over eleven seeds). But a float32 sum within
// 4e-6 of a bf16 rounding boundary rounds to the neighbour on one side and
// not the other: one element of the next product's operand moves by one
// bf16 step, up to 2^-7 of itself, a rounding error as large as bf16's own
// (and with g = 0 it stays in the state to the end). One array in a few
// cases gets such a flip into its largest elements (measured up to 1.6e-3:
// o, g = 0), so each array is allowed what bf16 itself is, BF16_BOUND.
// Some array must differ at all (else AMX did not run), and AMX is bit for
// bit on 1 and 2 threads.
#define AMX_MEDIAN_BOUND (BF16_CHAIN * 2 * 67 * 0x1p-24 * BF16_RHO)
Test(kda_bf16, amx_products_follow_avx512bf16) {
#ifndef AG_TILE_AMX
    cr_skip_test("this build has no AMX tiles (float64, no AVX512_BF16 target, or not GCC 11+ on x86-64 Linux)");
#else
    char why[200], err[256];
    if (!amx_bf16_usable(why, sizeof why)) cr_skip_test("%s", why);
    SKIP_WITHOUT_BF16();
    Setting avx = {PRECISION_BF16, BF16_TILES_AVX512BF16}, amx = {PRECISION_BF16, BF16_TILES_AMX};
    double e[N_CASES][N_RES], hi = 0, all[N_CASES * N_RES];
    compare_all(3500, avx, amx, "on AMX differs from AVX512_BF16", e);
    for (int c = 0; c < N_CASES; c++)
        for (int i = 0; i < N_RES; i++) hi = fmax(hi, e[c][i]), all[c * N_RES + i] = e[c][i];
    int n_all = N_CASES * N_RES;
    cr_assert_gt(hi, 0, "AMX and AVX512_BF16 gave the same bits everywhere: did AMX run?");
    qsort(all, n_all, sizeof all[0], cmp_double);
    double med = all[n_all / 2];
    cr_log_info("kda AMX against AVX512_BF16, normwise: median %.3g, up to %.3g", med, hi);
    cr_assert_leq(med, AMX_MEDIAN_BOUND, "AMX against AVX512_BF16: the median array differs by %.3g, beyond the "
                  "float32 sums' %.3g", med, AMX_MEDIAN_BOUND);
    cr_assert(bf16_tiles_select(BF16_TILES_AUTO, err, sizeof err), "%s", err);
    test_use_backend(0);
#endif
}

#ifdef AG_TILE_BF16
// The gradients of every input (concatenated, *n of them) of one forward
// under `fwd` and its backward under `bwd`, o and S_T seeded.
static real *grads_across(Setting fwd, Setting bwd, int64_t *n) {
    Shape s = SHAPES[2];
    Tensor *x[N_IN];
    make_inputs(x, s, DEC_MILD, 3900);
    int *docs = make_docs(s.T);
    Tape tp;
    tape_init(&tp);
    select_setting(fwd);
    Tensor *sT = NULL;
    Tensor *o = op_kda(&tp, x[IQ], x[IK], x[IV], x[IBETA], x[IG], x[IS0], docs, H, MIXER_FORM_CHUNKED, s.C, &sT);
    Tensor *sum = op_add(&tp, op_sum(&tp, op_mul(&tp, o, o)), op_sum(&tp, op_mul(&tp, sT, sT)));
    select_setting(bwd);
    tape_backward(&tp, sum);
    *n = 0;
    for (int i = 0; i < N_IN; i++) *n += x[i]->numel;
    real *g = xmalloc((size_t)*n * sizeof(real)), *at = g;
    for (int i = 0; i < N_IN; i++) {
        memcpy(at, x[i]->grad, (size_t)x[i]->numel * sizeof(real));
        at += x[i]->numel;
    }
    tape_free(&tp);
    free(docs);
    for (int i = 0; i < N_IN; i++) tensor_free(x[i]);
    return g;
}

// A forward under fwd and its backward under bwd must give the bits of
// both under fwd, and those must not be the bits of both under bwd (else
// the check could not tell the two apart).
static void check_kept(Setting fwd, Setting bwd, const char *what) {
    int64_t n;
    real *kept = grads_across(fwd, fwd, &n), *switched = grads_across(fwd, bwd, &n);
    real *other = grads_across(bwd, bwd, &n);
    cr_assert_eq(memcmp(kept, switched, (size_t)n * sizeof(real)), 0,
                 "%s: the backward ran other products when the selection changed after the forward", what);
    cr_assert_neq(memcmp(kept, other, (size_t)n * sizeof(real)), 0, "%s: both selections give the same bits", what);
    free(kept), free(switched), free(other);
}
#endif

// A node keeps the kind of products it was built with (KDA_ARG_BF16), so
// that its backward rounds and sums as its forward did whatever is selected
// in between: bf16 then fp32, fp32 then bf16, and (where the CPU has AMX)
// AMX then AVX512_BF16; each pair of selections gives other bits when both
// passes run under each (else the check could not tell).
Test(kda_bf16, a_node_keeps_its_kind_for_the_backward) {
#ifndef AG_TILE_BF16
    cr_skip_test("this build has no bf16 tile products (float64, or no AVX512_BF16 target)");
#else
    SKIP_WITHOUT_BF16();
    Setting fp32 = {PRECISION_FP32, BF16_TILES_AVX512BF16}, bf16 = {PRECISION_BF16, BF16_TILES_AVX512BF16};
    check_kept(bf16, fp32, "bf16, then fp32");
    check_kept(fp32, bf16, "fp32, then bf16");
    char why[200], err[256];
    if (amx_bf16_usable(why, sizeof why))
        check_kept((Setting){PRECISION_BF16, BF16_TILES_AMX}, bf16, "AMX, then AVX512_BF16");
    else
        cr_log_info("AMX then AVX512_BF16 not checked: %s", why);
    cr_assert(bf16_tiles_select(BF16_TILES_AUTO, err, sizeof err), "%s", err);
    test_use_backend(0);
#endif
}
