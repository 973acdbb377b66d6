// The split products of blas.h (gemm_rows, gemm_sum_rows) and the matmul
// paths that use them, at row counts large enough to split: values against a
// direct loop in double, and the same result on 1 and 2 threads. Each test
// runs on every product backend of the build (test_n_backends).
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "test_util.h"

#ifdef AG_DOUBLE
#define SPLIT_TOL 1e-12
#else
#define SPLIT_TOL 1e-4
#endif

static void assert_close(const real *got, const double *want, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabs(got[i] - want[i]) <= SPLIT_TOL * (1 + fabs(want[i])), "%s[%lld]: %.10g, want %.10g", what,
                  (long long)i, (double)got[i], want[i]);
}

// R is not a multiple of any slab or block, so the last ones are partial.
// Weight gradients with KW rows split into blocks of their own rows on
// oneDNN in float32 (blas.c, sum_split), the last one partial too.
enum { R = 2600, K = 24, N = 40, KW = 520 };

// Does a gradient of k rows take blocks of its own rows (no partials) on the backend now selected?
static bool grads_by_own_rows(int k) {
    return k >= KW && blas_backend == GEMM_ONEDNN && blas_precision == PRECISION_FP32;
}

static void gemm_rows_case(const char *backend) {
    real *A = test_randn((int64_t)R * K, 1), *B = test_randn((int64_t)K * N, 2), *C0 = test_randn((int64_t)R * N, 3);
    double *want = xmalloc((size_t)R * N * sizeof(double));
    real *C = xmalloc((size_t)R * N * sizeof(real)), *C1 = xmalloc((size_t)R * N * sizeof(real));
    int saved = omp_get_max_threads();
    for (int tb = 0; tb < 2; tb++)
        for (int beta = 0; beta < 2; beta++) {
            // op(B) (K, N): B as stored is (K, N), or (N, K) when tb; the same numbers serve both.
            for (int r = 0; r < R; r++)
                for (int j = 0; j < N; j++) {
                    double s = beta ? C0[(int64_t)r * N + j] : 0;
                    for (int k = 0; k < K; k++) s += (double)A[(int64_t)r * K + k] * (tb ? B[j * K + k] : B[k * N + j]);
                    want[(int64_t)r * N + j] = s;
                }
            real *out[2] = {C1, C};
            for (int th = 1; th <= 2; th++) {
                omp_set_num_threads(th);
                memcpy(out[th - 1], C0, (size_t)R * N * sizeof(real));
                gemm_rows(tb, R, N, K, A, K, B, tb ? K : N, beta, out[th - 1], N);
            }
            omp_set_num_threads(saved);
            assert_close(C, want, (int64_t)R * N, tb ? "C (tb)" : "C");
            for (int64_t i = 0; i < (int64_t)R * N; i++)
                cr_assert(fabs(C[i] - C1[i]) <= SPLIT_TOL * (1 + fabs(C1[i])), "%s: threads 1 vs 2 at %lld", backend,
                          (long long)i);
        }
    free(A), free(B), free(C0), free(C), free(C1), free(want);
}

Test(blas_split, gemm_rows_equals_direct_loop_and_any_thread_count) {
    for (int i = 0; i < test_n_backends(); i++) gemm_rows_case(test_use_backend(i));
}

static void gemm_sum_rows_case(const char *backend, int K) {
    // C (K, N) = X^T Y + beta C, X (R, K), Y (R, N)
    real *X = test_randn((int64_t)R * K, 4), *Y = test_randn((int64_t)R * N, 5), *C0 = test_randn((int64_t)K * N, 6);
    size_t np = gemm_sum_rows_scratch(K, N, R);
    // Partials over blocks of R's rows, or none where the blocks are the gradient's own rows (oneDNN, float32).
    cr_assert_eq(np == 0, grads_by_own_rows(K), "%s, %d x %d over R = %d rows: %zu elements of partials", backend, K, N,
                 R, np);
    real *part = xmalloc((np ? np : 1) * sizeof(real));
    double *want = xmalloc((size_t)K * N * sizeof(double));
    real *C[2] = {xmalloc((size_t)K * N * sizeof(real)), xmalloc((size_t)K * N * sizeof(real))};
    int saved = omp_get_max_threads();
    for (int beta = 0; beta < 2; beta++) {
        for (int i = 0; i < K; i++)
            for (int j = 0; j < N; j++) {
                double s = beta ? C0[i * N + j] : 0;
                for (int r = 0; r < R; r++) s += (double)X[(int64_t)r * K + i] * Y[(int64_t)r * N + j];
                want[i * N + j] = s;
            }
        for (int th = 1; th <= 2; th++) {
            omp_set_num_threads(th);
            memcpy(C[th - 1], C0, (size_t)K * N * sizeof(real));
            gemm_sum_rows(K, N, R, X, K, Y, N, beta, C[th - 1], N, part);
        }
        omp_set_num_threads(saved);
        assert_close(C[1], want, (int64_t)K * N, "X^T Y");
        // fixed blocks summed in a fixed order: bit for bit the same
        cr_assert_eq(memcmp(C[0], C[1], (size_t)K * N * sizeof(real)), 0, "%s, beta %d: 1 and 2 threads differ",
                     backend, beta);
    }
    // Too few rows to split: one gemm() call, no scratch.
    cr_assert_eq(gemm_sum_rows_scratch(K, N, 300), 0);
    free(X), free(Y), free(C0), free(part), free(want), free(C[0]), free(C[1]);
}

Test(blas_split, gemm_sum_rows_equals_direct_loop_and_is_thread_independent) {
    for (int i = 0; i < test_n_backends(); i++) {
        const char *backend = test_use_backend(i);
        gemm_sum_rows_case(backend, K);
        gemm_sum_rows_case(backend, KW);
    }
}

// Through op_matmul: the forward and both gradients, written fresh (an
// intermediate a) and added to existing ones (leaf b, twice used), both
// transposes of b.
static void matmul_case(void) {
    for (int tb = 0; tb < 2; tb++) {
        Tape tp;
        tape_init(&tp);
        Tensor *x = tensor_newv(true, 3, 2, R / 2, K);
        Tensor *b = tb ? tensor_newv(true, 2, N, K) : tensor_newv(true, 2, K, N);
        fill_normal(x, 7, 1.0);
        fill_normal(b, 8, 0.5);
        Tensor *a = op_scale(&tp, x, 1.0);   // its gradient buffer is fresh when matmul's backward runs
        Tensor *c = op_matmul(&tp, a, b, false, tb);
        Tensor *c2 = op_matmul(&tp, a, b, false, tb);   // b's and a's gradients then add
        real *seed = test_randn((int64_t)R * N, 9);
        double *want = xmalloc((size_t)R * N * sizeof(double));
        for (int r = 0; r < R; r++)
            for (int j = 0; j < N; j++) {
                double s = 0;
                for (int k = 0; k < K; k++)
                    s += (double)x->data[(int64_t)r * K + k] * (tb ? b->data[j * K + k] : b->data[k * N + j]);
                want[(int64_t)r * N + j] = s;
            }
        assert_close(c->data, want, (int64_t)R * N, "forward");
        tape_backward_multi(&tp, (Tensor *[]){c, c2}, (const real *[]){seed, seed}, 2);
        // dx = 2 seed op(b)^T; db = 2 x^T seed (stored transposed when tb)
        double *wx = xmalloc((size_t)R * K * sizeof(double)), *wb = xmalloc((size_t)K * N * sizeof(double));
        for (int r = 0; r < R; r++)
            for (int k = 0; k < K; k++) {
                double s = 0;
                for (int j = 0; j < N; j++)
                    s += (double)seed[(int64_t)r * N + j] * (tb ? b->data[j * K + k] : b->data[k * N + j]);
                wx[(int64_t)r * K + k] = 2 * s;
            }
        for (int k = 0; k < K; k++)
            for (int j = 0; j < N; j++) {
                double s = 0;
                for (int r = 0; r < R; r++) s += (double)x->data[(int64_t)r * K + k] * seed[(int64_t)r * N + j];
                wb[tb ? j * K + k : k * N + j] = 2 * s;
            }
        assert_close(x->grad, wx, (int64_t)R * K, "dx");
        assert_close(b->grad, wb, (int64_t)K * N, "db");
        free(seed), free(want), free(wx), free(wb);
        tensor_free(x);
        tensor_free(b);
        tape_free(&tp);
    }
}

Test(blas_split, matmul_split_paths_equal_direct_loops) {
    for (int i = 0; i < test_n_backends(); i++) {
        test_use_backend(i);
        matmul_case();
    }
}

// gemm_rows_multi and gemm_multi_backward (op_matmul_multi) against the
// single products they stand for: three weights of one input, the second
// output without a gradient, dB_0 and dB_2 written fresh and added to. The
// weight gradients use gemm_sum_rows's blocks (the same bits as it, on any
// thread count); bf16 rounds the same slabs as gemm_rows (the same bits).
// 8 threads are more than R's 6 blocks: bf16's backward then takes its
// general path (slabs of dA, a task per block and weight), 1 and 2 threads
// its task per block (multi_backward_bf16_blocks).
static void multi_case(const char *what, bool bf16, int K) {
    enum { M3 = 3, NTH = 3 };
    const int threads[NTH] = {1, 2, 8};
    const int Nm[M3] = {40, 24, 40};
    real *A = test_randn((int64_t)R * K, 21), *Bw[M3], *dC[M3], *C[NTH][M3], *ref[M3], *dB[NTH][M3], *dB0[M3];
    for (int i = 0; i < M3; i++) {
        Bw[i] = test_randn((int64_t)K * Nm[i], 22 + i);
        dC[i] = i == 1 ? NULL : test_randn((int64_t)R * Nm[i], 25 + i);
        dB0[i] = test_randn((int64_t)K * Nm[i], 28 + i);
        ref[i] = xmalloc((size_t)R * Nm[i] * sizeof(real));
        for (int t = 0; t < NTH; t++) {
            C[t][i] = xmalloc((size_t)R * Nm[i] * sizeof(real));
            dB[t][i] = xmalloc((size_t)K * Nm[i] * sizeof(real));
        }
    }
    real *dA[NTH];
    for (int t = 0; t < NTH; t++) dA[t] = xmalloc((size_t)R * K * sizeof(real));
    real *dAref = xmalloc((size_t)R * K * sizeof(real)), *dA0 = test_randn((int64_t)R * K, 31);
    real *dBref = xmalloc((size_t)K * 40 * sizeof(real));
    size_t np = gemm_multi_scratch(M3, K, Nm, R), np1 = gemm_sum_rows_scratch(K, 40, R);
    cr_assert_eq(np == 0, grads_by_own_rows(K), "%s, K %d over R = %d rows: %zu elements of partials", what, K, R, np);
    real *part = xmalloc((np ? np : 1) * sizeof(real)), *part1 = xmalloc((np1 ? np1 : 1) * sizeof(real));
    const real beta_b[M3] = {0, 1, 1};
    int saved = omp_get_max_threads();
    for (int t = 0; t < NTH; t++) {
        omp_set_num_threads(threads[t]);
        gemm_rows_multi(M3, R, K, A, (const real *const *)Bw, Nm, C[t]);
        memcpy(dA[t], dA0, (size_t)R * K * sizeof(real));
        for (int i = 0; i < M3; i++) memcpy(dB[t][i], dB0[i], (size_t)K * Nm[i] * sizeof(real));
        gemm_multi_backward(M3, R, K, A, (const real *const *)Bw, Nm, (const real *const *)dC, dA[t], 1, dB[t],
                            beta_b, part);
    }
    omp_set_num_threads(saved);
    memcpy(dAref, dA0, (size_t)R * K * sizeof(real));
    for (int i = 0; i < M3; i++) {
        gemm_rows(false, R, Nm[i], K, A, K, Bw[i], Nm[i], 0, ref[i], Nm[i]);
        int64_t n = (int64_t)R * Nm[i];
        for (int t = 0; t < NTH; t++)
            for (int64_t e = 0; e < n; e++)
                cr_assert(fabs(C[t][i][e] - ref[i][e]) <= SPLIT_TOL * (1 + fabs(ref[i][e])),
                          "%s: C_%d[%lld] %g on %d threads, gemm_rows %g", what, i, (long long)e,
                          (double)C[t][i][e], threads[t], (double)ref[i][e]);
        for (int t = 0; bf16 && t < NTH; t++)
            cr_assert_eq(memcmp(C[t][i], ref[i], (size_t)n * sizeof(real)), 0,
                         "%s: C_%d on %d threads not gemm_rows's bits", what, i, threads[t]);
        if (!dC[i]) {   // no gradient: dB_1 untouched
            cr_assert_eq(memcmp(dB[1][i], dB0[i], (size_t)K * Nm[i] * sizeof(real)), 0, "%s: dB_1 was written", what);
            continue;
        }
        gemm_rows(true, R, K, Nm[i], dC[i], Nm[i], Bw[i], Nm[i], 1, dAref, K);
        memcpy(dBref, dB0[i], (size_t)K * Nm[i] * sizeof(real));
        gemm_sum_rows(K, Nm[i], R, A, K, dC[i], Nm[i], beta_b[i], dBref, Nm[i], part1);
        for (int t = 0; t < NTH; t++)
            cr_assert_eq(memcmp(dB[t][i], dBref, (size_t)K * Nm[i] * sizeof(real)), 0,
                         "%s: dB_%d on %d threads is not gemm_sum_rows's bits", what, i, threads[t]);
    }
    for (int t = 0; t < NTH; t++)
        for (int64_t e = 0; e < (int64_t)R * K; e++)
            cr_assert(fabs(dA[t][e] - dAref[e]) <= SPLIT_TOL * (1 + fabs(dAref[e])),
                      "%s: dA[%lld] %g on %d threads, the single products %g", what, (long long)e, (double)dA[t][e],
                      threads[t], (double)dAref[e]);
    for (int i = 0; i < M3; i++) {
        free(Bw[i]), free(dC[i]), free(dB0[i]), free(ref[i]);
        for (int t = 0; t < NTH; t++) free(C[t][i]), free(dB[t][i]);
    }
    for (int t = 0; t < NTH; t++) free(dA[t]);
    free(A), free(dAref), free(dA0), free(dBref), free(part), free(part1);
}

Test(blas_split, multi_products_equal_the_single_ones_on_any_thread_count) {
    for (int i = 0; i < test_n_backends(); i++) {
        const char *backend = test_use_backend(i);
        multi_case(backend, false, K);
        multi_case(backend, false, KW);
    }
#ifndef AG_DOUBLE
    if (onednn_built() && onednn_has_bf16()) {
        char err[256];
        cr_assert(blas_select(GEMM_ONEDNN, PRECISION_BF16, err, sizeof err), "%s", err);
        multi_case("onednn bf16", true, K);
        test_use_backend(0);
    }
#endif
}

// X X of a square X with enough rows to split the weight gradient: both
// gradients land in X's one buffer, so op_matmul's backward writes them one
// after the other (not in the one region it uses for a weight): dX = G X^T +
// X^T G, against two plain products.
Test(blas_split, matmul_of_a_tensor_with_itself_sums_both_gradients) {
    enum { S = 1040 };
    for (int bi = 0; bi < test_n_backends(); bi++) {
        const char *backend = test_use_backend(bi);
        Tape tp;
        tape_init(&tp);
        Tensor *x = tensor_newv(true, 2, S, S);
        fill_normal(x, 41, 0.1);
        Tensor *y = op_matmul(&tp, x, x, false, false);
        real *seed = test_randn((int64_t)S * S, 42);
        tape_backward_multi(&tp, &y, (const real *[]){seed}, 1);
        real *want = xmalloc((size_t)S * S * sizeof(real));
        gemm(false, true, S, S, S, 1, seed, S, x->data, S, 0, want, S);   // G X^T
        gemm(true, false, S, S, S, 1, x->data, S, seed, S, 1, want, S);   // + X^T G
        for (int64_t e = 0; e < (int64_t)S * S; e++)
            cr_assert(fabs(x->grad[e] - want[e]) <= SPLIT_TOL * (1 + fabs(want[e])), "%s: dX[%lld] %g, want %g",
                      backend, (long long)e, (double)x->grad[e], (double)want[e]);
        free(seed), free(want);
        tensor_free(x);
        tape_free(&tp);
    }
}
