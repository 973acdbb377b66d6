// test_cuda_kda_bf16.c: op_kda's chunked form on the GPU under precision =
// bf16 (device_set_bf16; float32 build): the products the CPU's bf16 path
// rounds (kda_chunk.c's header, docs/kda.md "bf16") take bf16 operands with
// float32 sums on the tensor cores (kda_chunk.cu, kda_chunk_backward.cu).
//   1. o, S_T and every input gradient against the same op in float32 on
//      the GPU, on shapes with documents, s0, a partial last chunk, dk 64
//      and dk 40 (not a multiple of 16), and decays mild, none, strong and a
//      channel near 0 beside one past the span bound, within a derived bound;
//      each array must differ from float32 somewhere (else nothing rounded).
//   2. The same against the CPU's bf16 op where this build and CPU have it
//      (else skipped, saying why).
//   3. The node keeps its forward's precision for its backward.
// The float32 path's own tests are test_cuda_kda.c's; the bf16 model step
// with a kda layer test_cuda_bf16.c's.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "cuda_check.h"
#include "device.h"
#include "kda_kernel.h"

enum { IQ, IK, IV, IBETA, IG, IS0, N_IN };
enum { N_RES = 2 + N_IN };   // o, S_T, then the inputs' gradients
enum { B = 2, H = 2 };

typedef struct {
    int dk, dv, C, T;
} Shape;

// q, k L2-normalised per head (q scaled by 1/sqrt(dk)) as the layer feeds
// them, v ~ N(0, 1), beta a sigmoid of N(0, 1), s0 ~ N(0, 0.5^2); g per
// channel uniform in [-1, -0.01] (mild), 0, in [-31, -29] (every channel past
// the span bound inside a sub-block: the per-element route, and the products
// hold only e^-30 small terms), or mild with channel 0 near 0 (in (-1e-3,
// 0]: it keeps its whole past) and channel 1 at -40 (past the span bound
// beside the products' channels).
typedef enum { DEC_MILD, DEC_ZERO, DEC_STRONG, DEC_SLOW_FAST, DEC_COUNT } DecayKind;

static void make_inputs(Tensor **x, Shape s, DecayKind dec, uint64_t seed) {
    test_kda_inputs(x, B, s.T, H, s.dk, s.dv, seed);
    Rng r;
    rng_seed(&r, seed + 99);
    for (int64_t i = 0; i < x[IG]->numel; i++) {
        double g = -rng_range(&r, 0.01, 1.0);
        if (dec == DEC_ZERO) g = 0;
        if (dec == DEC_STRONG) g = -rng_range(&r, 29, 31);
        if (dec == DEC_SLOW_FAST && i % s.dk == 0) g = -1e-3 * rng_uniform(&r);
        if (dec == DEC_SLOW_FAST && i % s.dk == 1) g = -40;
        x[IG]->data[i] = (real)g;
    }
}

static void free_inputs(Tensor **x) {
    for (int i = 0; i < N_IN; i++) tensor_free(x[i]);
}

static const Shape SHAPES[] = {{64, 64, 64, 130}, {32, 16, 32, 100}, {40, 24, 32, 77}, {16, 32, 16, 77}};
enum { N_SHAPES = sizeof SHAPES / sizeof SHAPES[0] };

#ifndef AG_DOUBLE
static const char *const RES_NAMES[N_RES] = {"o", "S_T", "dq", "dk", "dv", "dbeta", "dg", "ds0"};
static const char *const DEC_NAMES[DEC_COUNT] = {"mild", "g=0", "g~-30", "channel 0 near 0, channel 1 at -40"};

// Documents beginning inside a chunk of each row (37: row 0; T - 23: row 1).
static int *make_docs(int T) {
    int *d = calloc((size_t)B * T, sizeof(int));
    d[37] = d[T + T - 23] = 1;
    return d;
}

typedef struct {
    real *r[N_RES];
    int64_t n[N_RES];
} Res;

// o, S_T (seeded with fixed random gradients) and every input gradient of
// op_kda's chunked form of x on device d, its products bf16 or not (on the
// CPU through blas_select, which the caller has checked can).
static Res dev_run(Device d, Tensor *const *in, Shape s, const int *docs, bool bf16) {
    Res res;
    memset(&res, 0, sizeof res);
    cuda_set_products(d, bf16);
    Tape tp;
    tape_init_on(&tp, d);
    Tensor *x[N_IN];
    for (int i = 0; i < N_IN; i++) {
        x[i] = tape_tensor_copy(&tp, in[i]->ndim, in[i]->shape, in[i]->data);
        x[i]->requires_grad = true;
    }
    Tensor *sT = NULL;
    Tensor *o = op_kda(&tp, x[IQ], x[IK], x[IV], x[IBETA], x[IG], x[IS0], docs, H, MIXER_FORM_CHUNKED, s.C, &sT);
    Tensor *outs[2] = {o, sT};
    real *seeds[2] = {test_randn(o->numel, 7), test_randn(sT->numel, 8)};
    tape_backward_multi(&tp, outs, (const real *const *)seeds, 2);
    for (int i = 0; i < N_RES; i++) {
        Tensor *t = i < 2 ? outs[i] : x[i - 2];
        const real *src = i < 2 ? t->data : t->grad;
        res.n[i] = t->numel;
        res.r[i] = malloc((size_t)t->numel * sizeof(real));
        dev_to_host(res.r[i], src, (size_t)t->numel * sizeof(real), d);
    }
    dev_sync(d);
    tape_free(&tp);
    free(seeds[0]), free(seeds[1]);
    cuda_reset_products(d);
    return res;
}

static void res_free(Res *r) {
    for (int i = 0; i < N_RES; i++) free(r->r[i]);
}

// Where |a - b| is largest (the element a failure names).
static int64_t where_max(const real *a, const real *b, int64_t n) {
    int64_t at = 0;
    double mx = -1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > mx || isnan(d)) mx = d, at = i;
        if (isnan(d)) break;
    }
    return at;
}

// The bound of 1 (test_kda_bf16.c's for the CPU, which these products
// follow one for one): a bf16 product C = A B rounds each operand to
// nearest (relative error at most u = 2^-9) and multiplies exactly, so
// |C' - C|_ij <= (2u + u^2) sum_k |a_ik b_kj|; the float32 sums add K 2^-24
// of the same (4e-6 at K = 64: nothing beside it). Normwise (max_rel_diff:
// the largest difference over the array's largest element) that is 2u rho,
// rho the ratio of a product's sum of |terms| to the array's largest
// element: about 1 to 2 for these inputs (unit keys, queries of norm
// 1/sqrt(dk), normal values: |x . y| <= sum |x_c y_c| <= |x| |y|, the
// largest elements those of nearly aligned rows). Errors of products in a
// row add, each relative to its own terms, and the longest row of bf16
// products an array goes through on the GPU is the CPU's four (dk, dg,
// dbeta: KKE and P, P^T dO, then through the float32 solve dA = -dR
// Delta^T, then dKKE Ys; o: KKE, P, P Delta). The GPU's solve (Tm = (I +
// A)^-1 in float32, then W = Tm Xw and U = Tm Xu in float32) is well
// conditioned here (beta < 1, A strictly lower), as the CPU's substitution
// is. Bound: 4 products x 2u x rho <= 4 2^-8 2 = 3.1e-2.
#define BF16_CHAIN 4
#define BF16_RHO 2.0
#define BF16_BOUND (BF16_CHAIN * 2 * 0x1p-9 * BF16_RHO)

// Every array of bf16 run h against float32 run f within tol[i] (NULL:
// BF16_BOUND each), naming the case, the array, the error and where it is
// largest; e: the errors.
static void assert_within(const char *what, const char *label, const Res *h, const Res *f, const double *tol,
                          double e[N_RES]) {
    for (int i = 0; i < N_RES; i++) {
        e[i] = max_rel_diff(h->r[i], f->r[i], h->n[i]);
        double t = tol ? tol[i] : BF16_BOUND;
        int64_t at = where_max(h->r[i], f->r[i], h->n[i]);
        cr_log_info("%s %s: %s %.3g (bound %.3g)", what, label, RES_NAMES[i], e[i], t);
        cr_assert(e[i] <= t,
                  "%s %s: %s differs by %.3g normwise, over the bound %.3g; largest at element %lld of %lld "
                  "(%.9g vs %.9g)",
                  what, label, RES_NAMES[i], e[i], t, (long long)at, (long long)h->n[i], (double)h->r[i][at],
                  (double)f->r[i][at]);
    }
}

static void case_label(char *buf, size_t n, Shape s, DecayKind dec) {
    snprintf(buf, n, "B=%d H=%d dk=%d dv=%d C=%d T=%d (%s, docs, s0)", B, H, s.dk, s.dv, s.C, s.T, DEC_NAMES[dec]);
}

Test(cuda_kda_bf16, forward_and_gradients_close_to_float32) {
    cuda_require();
    double worst[N_RES] = {0};
    for (int sh = 0; sh < N_SHAPES; sh++)
        for (int dec = 0; dec < DEC_COUNT; dec++) {
            Shape s = SHAPES[sh];
            Tensor *x[N_IN];
            make_inputs(x, s, (DecayKind)dec, 5000 + 100 * sh + 10 * dec);
            int *docs = make_docs(s.T);
            Res h = dev_run(DEVICE_CUDA, x, s, docs, true), f = dev_run(DEVICE_CUDA, x, s, docs, false);
            char label[160];
            case_label(label, sizeof label, s, (DecayKind)dec);
            double e[N_RES];
            assert_within("GPU bf16 vs GPU float32", label, &h, &f, NULL, e);
            for (int i = 0; i < N_RES; i++) worst[i] = fmax(worst[i], e[i]);
            // O = Qg S0 + P Delta rounds its operands when dv is a multiple of
            // 16 (whatever the decay: P's diagonal is q . k): o must move.
            if (s.dv % 16 == 0)
                cr_assert_gt(e[0], 1e-4, "%s: o is within %.3g of float32: were its products bf16?", label, e[0]);
            res_free(&h), res_free(&f);
            free(docs);
            free_inputs(x);
        }
    for (int i = 0; i < N_RES; i++) {
        cr_log_info("kda GPU bf16 against GPU float32, normwise, worst %s: %.3g", RES_NAMES[i], worst[i]);
        cr_assert_gt(worst[i], 1e-4, "%s is within %.3g of float32 in every case: were its products bf16?",
                     RES_NAMES[i], worst[i]);
    }
}

// The GPU's bf16 op against the CPU's. Both round the same operands (the
// products listed in kda_chunk.c's header, each where its shape allows, the
// same conditions on both) to nearest even and multiply them exactly, so
// they differ by their float32 parts: sums in other orders, float32 exps
// of their own, the GPU's solve through Tm against the CPU's substitution
// in double, P and KKE of a partial chunk per element against through the
// reference points. Those differences are those of the two float32 runs
// (measured: f32), unless one of them moves an operand across a bf16
// rounding boundary: then that element rounds to the neighbour on one side
// and not the other, one bf16 step apart, an error no larger than the
// rounding's own, which BF16_BOUND bounds whichever operands it hits (as
// test_kda_bf16.c argues for AMX against AVX512_BF16). Bound: BF16_BOUND +
// f32 per array. The CPU's bf16 run must differ from its float32 run (else
// the CPU rounded nothing and this compares nothing).
static void check_against_cpu(int sh, DecayKind dec, uint64_t seed) {
    Shape s = SHAPES[sh];
    Tensor *x[N_IN];
    make_inputs(x, s, dec, seed);
    int *docs = make_docs(s.T);
    Res gh = dev_run(DEVICE_CUDA, x, s, docs, true), gf = dev_run(DEVICE_CUDA, x, s, docs, false);
    Res ch = dev_run(DEVICE_CPU, x, s, docs, true), cf = dev_run(DEVICE_CPU, x, s, docs, false);
    char label[160];
    case_label(label, sizeof label, s, dec);
    double tol[N_RES], e[N_RES], cpu_moved = 0;
    for (int i = 0; i < N_RES; i++) {
        tol[i] = BF16_BOUND + max_rel_diff(gf.r[i], cf.r[i], gf.n[i]);
        cpu_moved = fmax(cpu_moved, max_rel_diff(ch.r[i], cf.r[i], ch.n[i]));
    }
    assert_within("GPU bf16 vs CPU bf16", label, &gh, &ch, tol, e);
    cr_assert_gt(cpu_moved, 0, "%s: the CPU's bf16 run is its float32 run to the bit: were its products bf16?",
                 label);
    res_free(&gh), res_free(&gf), res_free(&ch), res_free(&cf);
    free(docs);
    free_inputs(x);
}

Test(cuda_kda_bf16, against_cpu_bf16) {
    cuda_require();
    if (!onednn_built() || !onednn_has_bf16())
        cr_skip_test("this build has no oneDNN or this CPU no AVX512_BF16: no bf16 kda on the CPU here, the GPU's "
                     "bf16 kda NOT compared with it");
    char err[256];
    cr_assert(blas_select(GEMM_ONEDNN, PRECISION_BF16, err, sizeof err), "%s", err);
    bool tiles = tile_products_bf16();
    blas_select(GEMM_OPENBLAS, PRECISION_FP32, err, sizeof err);
    if (!tiles)
        cr_skip_test("this build's CPU chunk kernels have no bf16 products (AG_NATIVE=OFF, or no AVX512_BF16 "
                     "target): the GPU's bf16 kda NOT compared with the CPU's");
    for (int sh = 0; sh < N_SHAPES; sh++) {
        check_against_cpu(sh, DEC_MILD, 6000 + 10 * sh);
        check_against_cpu(sh, DEC_SLOW_FAST, 6001 + 10 * sh);
    }
}

// The node keeps the forward's precision: a backward after bf16 was turned
// off rounds as its forward did, so its gradients are those of a run with
// bf16 on throughout, to the bit; and those are not float32's.
Test(cuda_kda_bf16, backward_follows_its_forward) {
    cuda_require();
    Shape s = SHAPES[0];
    Tensor *x[N_IN];
    make_inputs(x, s, DEC_MILD, 6500);
    int *docs = make_docs(s.T);
    Res h = dev_run(DEVICE_CUDA, x, s, docs, true), f = dev_run(DEVICE_CUDA, x, s, docs, false);
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *xs[N_IN];
    for (int i = 0; i < N_IN; i++) {
        xs[i] = tape_tensor_copy(&tp, x[i]->ndim, x[i]->shape, x[i]->data);
        xs[i]->requires_grad = true;
    }
    device_set_bf16(DEVICE_CUDA, true);
    Tensor *sT = NULL;
    Tensor *o = op_kda(&tp, xs[IQ], xs[IK], xs[IV], xs[IBETA], xs[IG], xs[IS0], docs, H, MIXER_FORM_CHUNKED, s.C, &sT);
    device_set_bf16(DEVICE_CUDA, false);   // between forward and backward
    real *seeds[2] = {test_randn(o->numel, 7), test_randn(sT->numel, 8)};
    tape_backward_multi(&tp, (Tensor *[]){o, sT}, (const real *const *)seeds, 2);
    for (int i = 0; i < N_IN; i++) {
        real *g = malloc((size_t)x[i]->numel * sizeof(real));
        dev_to_host(g, xs[i]->grad, (size_t)x[i]->numel * sizeof(real), DEVICE_CUDA);
        dev_sync(DEVICE_CUDA);
        int64_t at = where_max(g, h.r[2 + i], x[i]->numel);
        cr_assert(memcmp(g, h.r[2 + i], (size_t)x[i]->numel * sizeof(real)) == 0,
                  "%s: bf16 turned off between forward and backward gives other gradients than bf16 throughout "
                  "(largest difference at element %lld: %.9g vs %.9g)",
                  RES_NAMES[2 + i], (long long)at, (double)g[at], (double)h.r[2 + i][at]);
        free(g);
    }
    cr_assert_neq(memcmp(h.r[2], f.r[2], (size_t)h.n[2] * sizeof(real)), 0,
                  "dq under bf16 is float32's to the bit: the check above could not tell the two apart");
    free(seeds[0]), free(seeds[1]);
    tape_free(&tp);
    res_free(&h), res_free(&f);
    free(docs);
    free_inputs(x);
}

#else
// The float64 build has no bf16 products: op_kda's node records none.
Test(cuda_kda_bf16, float64_build_keeps_float64) {
    cuda_require();
    Shape s = SHAPES[3];
    Tensor *x[N_IN];
    make_inputs(x, s, DEC_MILD, 6900);
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *xs[N_IN];
    for (int i = 0; i < N_IN; i++) {
        xs[i] = tape_tensor_copy(&tp, x[i]->ndim, x[i]->shape, x[i]->data);
        xs[i]->requires_grad = true;   // a recorded node
    }
    Tensor *sT = NULL;
    op_kda(&tp, xs[IQ], xs[IK], xs[IV], xs[IBETA], xs[IG], xs[IS0], NULL, H, MIXER_FORM_CHUNKED, s.C, &sT);
    dev_sync(DEVICE_CUDA);
    cr_assert_eq(test_only_node(&tp, "kda_chunked")->iarg[KDA_ARG_BF16], 0, "the float64 build's kda node says bf16");
    tape_free(&tp);
    free_inputs(x);
}
#endif
