// test_cuda_blk_mm.c: the block-wide products inside op_gdn's and op_kda's
// per-chunk kernels, alone (blk_mm_kernel.cu runs one on one block):
// blk_gemm_s (float32, or float64 in that build) and, float32 build only,
// blk_gemm_bf16_s (gdn_bf16.cuh: operands rounded to bf16, tensor-core sums),
// against a host reference in long double over the shapes the ops reach
// seldom: M, N and K past one 64-wide tile or slice and not multiples of 16,
// K = 0, every transpose, leading dimensions that break 16-byte alignment,
// and the alpha / beta forms.
//   The reference sums the exact products of the operands (rounded to bf16
// first for the bf16 form: bf16.h, round to nearest even). A float32 chain
// of K fmas is within K u sum|a b| of it (u = 2^-24; 2^-53 in float64); the
// tensor cores' float32 sums are given twice that (u = 2^-23), as their
// internal rounding is not IEEE's. Then one rounding for alpha and one for
// beta's fma. A wrong fragment, transpose or edge is off by O(sum|a b|).
// The bf16 form must also be off the unrounded reference by more than the
// float32 bound somewhere (it rounds).
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "cuda_check.h"

bool cu_test_blk_mm(bool bf, bool ta, bool tb, int M, int N, int K, real alpha, const real *A, int64_t nA, int lda,
                    const real *B, int64_t nB, int ldb, real beta, real *C, int64_t nC, int ldc, int off);

static real rnd_bf16(real x, bool bf) { return bf ? (real)bf16_round((float)x) : x; }

// op(X)[r][c] of a row-major X with leading dimension ld, transposed or not.
static real at_op(const real *X, int ld, bool t, int r, int c) {
    return t ? X[(int64_t)c * ld + r] : X[(int64_t)r * ld + c];
}

// One product: returns whether some element is off the unrounded reference
// by more than the float32 bound (only looked at for the bf16 form).
// Case ci picks the alpha / beta form (ci % 3) and the scale of A and C
// (2^-40, 1 or 2^40 by ci / 3 % 3).
static bool check_case(bool bf, bool ta, bool tb, int M, int N, int K, int layout, int ci, uint64_t seed) {
    static const double alphas[] = {1, -1, 0.5}, betas[] = {0, 1, -0.25};
    real alpha = (real)alphas[ci % 3], beta = (real)betas[ci % 3];
    int pad = layout == 1 ? 3 : 0, off = layout == 2 ? 1 : 0;
    int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    int lda = ac + pad, ldb = bc + pad, ldc = N + pad;
    int64_t nA = (int64_t)ar * lda, nB = (int64_t)br * ldb, nC = (int64_t)M * ldc;
    double scale = ldexp(1, ci / 3 % 3 * 40 - 40);
    // (one real more than each needs: none is empty)
    real *A = test_randn(nA + 1, seed), *B = test_randn(nB + 1, seed + 1), *C = test_randn(nC + 1, seed + 2);
    for (int64_t i = 0; i < nA; i++) A[i] = (real)(A[i] * scale);
    for (int64_t i = 0; i < nC; i++) C[i] = (real)(C[i] * scale);
    real *C0 = malloc((size_t)(nC + 1) * sizeof(real));
    memcpy(C0, C, (size_t)nC * sizeof(real));
    bool ran = cu_test_blk_mm(bf, ta, tb, M, N, K, alpha, A, nA, lda, B, nB, ldb, beta, C, nC, ldc, off);
    cr_assert(ran, "blk_mm: the bf16 form refused in the float32 build");
#ifdef AG_DOUBLE
    const double u = ldexp(1, -53);
#else
    const double u = ldexp(1, -24);
#endif
    double uk = bf ? 2 * u : u;
    bool rounds = false;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            long double s = 0, s_exact = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                real a = at_op(A, lda, ta, i, k), b = at_op(B, ldb, tb, k, j);
                long double p = (long double)rnd_bf16(a, bf) * rnd_bf16(b, bf);
                s += p;
                s_exact += (long double)a * b;
                mag += fabsl(p);
            }
            real c0 = C0[(int64_t)i * ldc + j], got = C[(int64_t)i * ldc + j];
            long double ref = alpha * s + (beta != 0 ? beta * (long double)c0 : 0);
            double tol = (double)((K + 2) * uk * fabs((double)alpha) * mag +
                                  2 * u * (fabsl(alpha * s) + fabsl(beta * (long double)c0))) + 1e-300;
            double err = fabs((double)((long double)got - ref));
            cr_assert(err <= tol,
                      "blk_mm %s ta=%d tb=%d M=%d N=%d K=%d layout %d alpha %g beta %g: C[%d][%d] = %.17g, reference "
                      "%.17g, error %.3g over the bound %.3g",
                      bf ? "bf16" : "float", ta, tb, M, N, K, layout, (double)alpha, (double)beta, i, j, (double)got,
                      (double)ref, err, tol);
            long double ref_exact = alpha * s_exact + (beta != 0 ? beta * (long double)c0 : 0);
            double tol_exact = (double)((K + 2) * u * fabs((double)alpha) * mag +
                                        2 * u * (fabsl(alpha * s_exact) + fabsl(beta * (long double)c0)));
            rounds |= fabs((double)((long double)got - ref_exact)) > tol_exact;
        }
    for (int64_t i = 0; i < nC; i++)   // the padding of C's rows
        if (i % ldc >= N) cr_assert(C[i] == C0[i], "blk_mm: C[%lld], outside the product, was written", (long long)i);
    free(A), free(B), free(C), free(C0);
    return rounds;
}

Test(cuda_blk_mm, products_against_long_double_reference) {
    cuda_require();
    static const int sizes[] = {1, 16, 33, 64, 100, 128}, ks[] = {0, 1, 17, 64, 65, 128};
    enum { NS = sizeof sizes / sizeof sizes[0], NK = sizeof ks / sizeof ks[0] };
    uint64_t seed = 9000;
    for (int bf = 0; bf < 2; bf++) {
#ifdef AG_DOUBLE
        if (bf) {
            cr_log_info("blk_mm: the bf16 form is the float32 build's; not in this one");
            break;
        }
#endif
        int cases = 0, rounded = 0, long_k = 0, ci = 0;
        for (int mi = 0; mi < NS; mi++)
            for (int ni = 0; ni < NS; ni++)
                for (int ki = 0; ki < NK; ki++)
                    for (int t = 0; t < 4; t++)
                        for (int layout = 0; layout < 3; layout++, seed += 3, ci++) {
                            int M = sizes[mi], N = sizes[ni], K = ks[ki];
                            bool r = check_case(bf, t & 1, t >> 1, M, N, K, layout, ci, seed);
                            cases++;
                            if (K >= 16) long_k++, rounded += r;
                        }
        cr_log_info("blk_mm %s: %d products; %d of the %d with K >= 16 off the unrounded reference",
                    bf ? "bf16" : "float", cases, rounded, long_k);
        if (bf)
            cr_assert(rounded == long_k, "blk_mm bf16: %d of %d products with K >= 16 were not rounded",
                      long_k - rounded, long_k);
    }
}
