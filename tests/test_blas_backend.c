// The product backends of blas.h: oneDNN against OpenBLAS, the bf16
// products against a reference product of bf16-rounded operands, the bf16
// rounding itself, and what blas_select accepts and refuses.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blas.h"
#include "device.h"
#include "model_setup.h"
#include "test_util.h"

static void use(GemmBackend b, GemmPrecision p) {
    char err[256];
    cr_assert(blas_select(b, p, err, sizeof err), "blas_select(%s, %s): %s", blas_backend_name(b),
              blas_precision_name(p), err);
}

#ifndef AG_DOUBLE
static bool have_onednn(void) { return onednn_built(); }
static bool have_bf16(void) { return onednn_built() && onednn_has_bf16(); }
#endif

// ---- oneDNN against OpenBLAS ----

#ifndef AG_DOUBLE
// C = alpha op(A) op(B) + beta C of shape (M, N, K) on both backends, with
// leading dimensions wider than the matrices: the same to float32 rounding.
// Normwise 2e-5: both sum K <= 129 products in float32 in different orders,
// each within K u |a||b| (u = 6e-8) of the exact sum, i.e. 8e-6 of the
// largest |C| at worst.
static void compare_backends(bool ta, bool tb, int M, int N, int K, float alpha, float beta) {
    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
    int64_t na = (int64_t)(ta ? K : M) * lda, nb = (int64_t)(tb ? N : K) * ldb, nc = (int64_t)M * ldc;
    real *A = test_randn(na, 11), *B = test_randn(nb, 12), *C0 = test_randn(nc, 13);
    real *C[2] = {xmalloc((size_t)nc * sizeof(real)), xmalloc((size_t)nc * sizeof(real))};
    for (int b = 0; b < 2; b++) {
        use(b ? GEMM_ONEDNN : GEMM_OPENBLAS, PRECISION_FP32);
        memcpy(C[b], C0, (size_t)nc * sizeof(real));
        gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C[b], ldc);
    }
    double d = max_rel_diff(C[0], C[1], nc);
    cr_assert_leq(d, 2e-5, "ta %d tb %d %dx%dx%d alpha %g beta %g: oneDNN vs OpenBLAS %.3g", ta, tb, M, N, K,
                  (double)alpha, (double)beta, d);
    free(A), free(B), free(C0), free(C[0]), free(C[1]);
}
#endif

Test(blas_backend, onednn_equals_openblas_to_float32_rounding) {
#ifdef AG_DOUBLE
    cr_skip_test("the float64 build has only OpenBLAS");
#else
    if (!have_onednn()) cr_skip_test("built without oneDNN");
    const int shapes[][3] = {{3, 5, 4}, {1, 256, 128}, {67, 45, 129}, {300, 40, 24}, {64, 64, 32}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                compare_backends(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], 1, 0);
                compare_backends(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], 0.37f, 1);
                compare_backends(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], -1.5f, 0.5f);
            }
#endif
}

// A product inside a parallel region runs on the calling thread: two threads
// at once, each its own product, each as on its own.
Test(blas_backend, onednn_products_inside_a_parallel_region) {
#ifdef AG_DOUBLE
    cr_skip_test("the float64 build has only OpenBLAS");
#else
    if (!have_onednn()) cr_skip_test("built without oneDNN");
    enum { M = 96, N = 80, K = 72, P = 4 };
    real *A = test_randn((int64_t)P * M * K, 21), *B = test_randn((int64_t)K * N, 22);
    real *want = xmalloc((size_t)P * M * N * sizeof(real)), *got = xmalloc((size_t)P * M * N * sizeof(real));
    use(GEMM_ONEDNN, PRECISION_FP32);
    for (int p = 0; p < P; p++)
        gemm(false, false, M, N, K, 1, A + (int64_t)p * M * K, K, B, N, 0, want + (int64_t)p * M * N, N);
    omp_set_num_threads(2);
#pragma omp parallel for schedule(static)
    for (int p = 0; p < P; p++)
        gemm(false, false, M, N, K, 1, A + (int64_t)p * M * K, K, B, N, 0, got + (int64_t)p * M * N, N);
    cr_assert_leq(max_rel_diff(want, got, (int64_t)P * M * N), 1e-6);
    free(A), free(B), free(want), free(got);
#endif
}

// ---- bf16 ----

Test(blas_backend, bf16_rounds_to_nearest_even) {
    // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even one (1);
    // 1 + 3 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6.
    cr_assert_eq(bf16_round(1.0f + 0x1p-8f), 1.0f);
    cr_assert_eq(bf16_round(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
    cr_assert_eq(bf16_round(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);   // above the tie: up
    cr_assert_eq(bf16_round(-2.5f), -2.5f);                                 // exact
    cr_assert_eq(bf16_from_float(-0.0f), 0x8000);
    cr_assert(isinf(bf16_round(INFINITY)) && bf16_round(-INFINITY) < 0);
    cr_assert(isinf(bf16_round(3.4e38f)), "the largest floats round up to infinity");
    cr_assert(isnan(bf16_round(NAN)));
    uint32_t snan_bits = 0x7f800001u;   // a NaN whose payload is only in the low bits stays a NaN
    float snan;
    memcpy(&snan, &snan_bits, sizeof snan);
    cr_assert(isnan(bf16_round(snan)));
    cr_assert_eq(bf16_round(1e-40f) != 0, true, "a subnormal keeps its top bits");
    // The vectorised row conversion is the scalar one, NaN included.
    enum { N = 1000 };
    float src[N];
    bf16 dst[N];
    for (int i = 0; i < N; i++) src[i] = (float)((i * 7919 % 1000) - 500) * 1.37e-3f * (float)(1 + i % 13);
    src[17] = NAN;
    src[18] = INFINITY;
    src[19] = snan;
    bf16_from_rows(dst, 500, src, 500, 2, 500);
    for (int i = 0; i < N; i++) {
        bf16 want = bf16_from_float(src[i]);
        cr_assert(dst[i] == want || (isnan(src[i]) && isnan(bf16_to_float(dst[i]))), "element %d: %04x vs %04x", i,
                  dst[i], want);
    }
}

#ifndef AG_DOUBLE
// The bound on a float32 sum of K exact terms in any order: (K - 1) u sum |t|,
// u = 2^-24. The terms are exact: a product of two bf16 numbers (8-bit
// significands) has at most 16 significant bits, which a float32 holds.
static void assert_bf16_product(const float *got, const double *want, const double *abs_sum, int64_t n, int K,
                                const char *what) {
    double u = 0x1p-24;
    for (int64_t i = 0; i < n; i++)
        cr_assert_leq(fabs(got[i] - want[i]), (K - 1) * u * abs_sum[i] + 1e-30, "%s[%lld]: %.9g, want %.9g", what,
                      (long long)i, (double)got[i], want[i]);
}
#endif

// gemm_rows and gemm_sum_rows at bf16: equal to the product of the operands
// rounded to bf16, summed exactly, within float32 summation; the same on 1 and
// 2 threads, bit for bit (fixed slabs and blocks); and not the float32 product.
Test(blas_backend, bf16_products_equal_the_product_of_rounded_operands) {
#ifdef AG_DOUBLE
    cr_skip_test("bf16 products are float32 builds only");
#else
    if (!have_bf16()) cr_skip_test("this CPU has no AVX512_BF16 (or no oneDNN)");
    enum { R = 2600, K = 40, N = 48 };   // R: several slabs and blocks, the last ones partial
    real *A = test_randn((int64_t)R * K, 31), *B = test_randn((int64_t)K * N, 32), *Y = test_randn((int64_t)R * N, 33);
    real *C0 = test_randn((int64_t)R * N, 34);
    double *want = xmalloc((size_t)R * N * sizeof(double)), *abs_sum = xmalloc((size_t)R * N * sizeof(double));
    real *C[2] = {xmalloc((size_t)R * N * sizeof(real)), xmalloc((size_t)R * N * sizeof(real))};
    real *F = xmalloc((size_t)R * N * sizeof(real));
    for (int tb = 0; tb < 2; tb++)
        for (int beta = 0; beta < 2; beta++) {
            // op(B) (K, N): B stored (K, N), or (N, K) when tb; the same numbers serve both.
            for (int r = 0; r < R; r++)
                for (int j = 0; j < N; j++) {
                    double s = beta ? C0[(int64_t)r * N + j] : 0, a = fabs(s);
                    for (int k = 0; k < K; k++) {
                        double t = (double)bf16_round(A[(int64_t)r * K + k]) *
                                   bf16_round(tb ? B[j * K + k] : B[k * N + j]);
                        s += t;
                        a += fabs(t);
                    }
                    want[(int64_t)r * N + j] = s;
                    abs_sum[(int64_t)r * N + j] = a;
                }
            for (int th = 1; th <= 2; th++) {
                omp_set_num_threads(th);
                use(GEMM_ONEDNN, PRECISION_BF16);
                memcpy(C[th - 1], C0, (size_t)R * N * sizeof(real));
                gemm_rows(tb, R, N, K, A, K, B, tb ? K : N, beta, C[th - 1], N);
            }
            assert_bf16_product(C[1], want, abs_sum, (int64_t)R * N, K + beta, "gemm_rows");
            cr_assert_eq(memcmp(C[0], C[1], (size_t)R * N * sizeof(real)), 0, "gemm_rows: 1 and 2 threads differ");
            use(GEMM_ONEDNN, PRECISION_FP32);
            memcpy(F, C0, (size_t)R * N * sizeof(real));
            gemm_rows(tb, R, N, K, A, K, B, tb ? K : N, beta, F, N);
            cr_assert_gt(max_rel_diff(F, C[1], (int64_t)R * N), 1e-4, "bf16 products equal float32 ones: not bf16?");
        }
    // dW (K, N) = A^T Y over R rows, in blocks summed in float32: per block the
    // bound above, then the block sums' own float32 sum.
    size_t np = gemm_sum_rows_scratch(K, N, R);
    cr_assert(np > 0);
    real *part = xmalloc(np * sizeof(real));
    for (int i = 0; i < K; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, a = 0;
            for (int r = 0; r < R; r++) {
                double t = (double)bf16_round(A[(int64_t)r * K + i]) * bf16_round(Y[(int64_t)r * N + j]);
                s += t;
                a += fabs(t);
            }
            want[i * N + j] = s;
            abs_sum[i * N + j] = a;
        }
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        use(GEMM_ONEDNN, PRECISION_BF16);
        gemm_sum_rows(K, N, R, A, K, Y, N, 0, C[th - 1], N, part);
    }
    assert_bf16_product(C[1], want, abs_sum, (int64_t)K * N, R, "gemm_sum_rows");
    cr_assert_eq(memcmp(C[0], C[1], (size_t)K * N * sizeof(real)), 0, "gemm_sum_rows: 1 and 2 threads differ");
    free(part);
    free(A), free(B), free(Y), free(C0), free(want), free(abs_sum), free(C[0]), free(C[1]), free(F);
#endif
}

// ---- selection ----

Test(blas_backend, select_refuses_what_cannot_run_here) {
    char err[256];
    // TF32 is the GPU's (cuBLAS on tensor cores): the CPU refuses it, saying so.
    GemmBackend was = blas_backend;
    cr_assert_not(blas_select(GEMM_AUTO, PRECISION_TF32, err, sizeof err));
    cr_assert(strstr(err, "precision = tf32") && strstr(err, "GPU"), "%s", err);
    cr_assert_eq(blas_backend, was, "a refused selection changes nothing");
#ifdef AG_DOUBLE
    cr_assert_not(blas_select(GEMM_OPENBLAS, PRECISION_BF16, err, sizeof err));
    cr_assert(strstr(err, "float32 build"), "%s", err);
    cr_assert_not(blas_select(GEMM_ONEDNN, PRECISION_FP32, err, sizeof err));
    cr_assert(strstr(err, "float64"), "%s", err);
    use(GEMM_AUTO, PRECISION_FP32);
    cr_assert_eq(blas_backend, GEMM_OPENBLAS);
#else
    if (!have_onednn()) {
        cr_assert_not(blas_select(GEMM_ONEDNN, PRECISION_FP32, err, sizeof err));
        cr_assert(strstr(err, "libdnnl-dev"), "%s", err);
        cr_assert_not(blas_select(GEMM_AUTO, PRECISION_BF16, err, sizeof err));
    } else if (!onednn_has_bf16()) {
        cr_assert_not(blas_select(GEMM_AUTO, PRECISION_BF16, err, sizeof err));
        cr_assert(strstr(err, "AVX512_BF16"), "%s", err);
    } else {
        use(GEMM_OPENBLAS, PRECISION_BF16);   // float32 products on OpenBLAS, bf16 ones on oneDNN
        cr_assert(strstr(blas_describe(), "bf16"), "%s", blas_describe());
    }
#endif
    // A refused request changes nothing.
    use(GEMM_OPENBLAS, PRECISION_FP32);
    cr_assert_not(blas_select((GemmBackend)7, PRECISION_FP32, err, sizeof err));
    cr_assert_eq(blas_backend, GEMM_OPENBLAS);
    cr_assert_eq(blas_precision, PRECISION_FP32);
    cr_assert_eq(blas_backend_parse("onednn"), GEMM_ONEDNN);
    cr_assert_eq(blas_backend_parse("mkl"), -1);
}

// auto: oneDNN when OpenBLAS's kernels are below the CPU's instruction set
// (this project's machines: Haswell kernels on AVX-512), said in the description.
Test(blas_backend, auto_prefers_onednn_when_openblas_kernels_lag_the_cpu) {
    use(GEMM_AUTO, PRECISION_FP32);
    cr_assert(strstr(blas_describe(), "auto:"), "%s", blas_describe());
#ifndef AG_DOUBLE
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    const char *core = blas_core_name();
    bool below = !strcmp(core, "Haswell") || !strcmp(core, "Zen") || !strcmp(core, "Sandybridge") ||
                 !strcmp(core, "Prescott") || !strcmp(core, "Nehalem") || !strcmp(core, "Core2");
    if (have_onednn() && avx512 && below) {
        cr_assert_eq(blas_backend, GEMM_ONEDNN, "%s", blas_describe());
        cr_assert(strstr(blas_describe(), "AVX-512 CPU"), "%s", blas_describe());
    }
#endif
}

#ifndef AG_DOUBLE
// auto's kept measurement (blas.h): the file is read as hostile (lines too
// long, fields missing or out of range, NUL bytes are skipped), a line written
// reads back as written, an update replaces the machine's line and keeps the
// others, and the file keeps at most 64 machines.
Test(blas_backend, auto_cache_file_reads_back_and_survives_garbage) {
    char path[600];
    snprintf(path, sizeof path, "%s/gemm_auto", test_tmpdir("gemm_cache"));
    double r = 0;
    GemmBackend b = GEMM_AUTO;
    cr_assert_not(blas_auto_cache_lookup(path, "k", &r, &b), "no file, no verdict");
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 3000; i++) fputc('x', f);   // too long, and a valid line's text at its end
    fputs("\tk\t0.1\tonednn\n", f);
    fputs("no tabs\n\t0.5\tonednn\nk\tnan\tonednn\nk\t-1\tonednn\nk\t0.5\tmkl\nk\t0.5x\tonednn\n", f);
    fputs("k\t0.5\tauto\nk\t1e999\topenblas\n", f);
    static const char nul[] = "k\t0.3\to\0nednn\n";   // a NUL byte: the whole line is skipped
    fwrite(nul, 1, sizeof nul - 1, f);
    fputs("other\t1.2\topenblas\nk\t0.5\tonednn\n", f);
    fclose(f);
    cr_assert(blas_auto_cache_lookup(path, "k", &r, &b));
    cr_assert(r == 0.5 && b == GEMM_ONEDNN, "%g %d", r, (int)b);
    cr_assert(blas_auto_cache_lookup(path, "other", &r, &b));
    cr_assert(r == 1.2 && b == GEMM_OPENBLAS, "%g %d", r, (int)b);
    cr_assert_not(blas_auto_cache_lookup(path, "x", &r, &b));
    // An update: the garbage goes, the other machine stays, k's line is replaced.
    cr_assert(blas_auto_cache_store(path, "k", 1.3, GEMM_OPENBLAS));
    char *text = test_read_file(path);
    cr_assert_str_eq(text, "other\t1.2000\topenblas\nk\t1.3000\topenblas\n");
    free(text);
    cr_assert(blas_auto_cache_lookup(path, "k", &r, &b));
    cr_assert(r == 1.3 && b == GEMM_OPENBLAS, "%g %d", r, (int)b);
    // Keys that would break the format, and a backend that is not one, are refused; nothing changes.
    cr_assert_not(blas_auto_cache_store(path, "a\tb", 1, GEMM_ONEDNN));
    cr_assert_not(blas_auto_cache_store(path, "a\nb", 1, GEMM_ONEDNN));
    cr_assert_not(blas_auto_cache_store(path, "a", 1, GEMM_AUTO));
    text = test_read_file(path);
    cr_assert_str_eq(text, "other\t1.2000\topenblas\nk\t1.3000\topenblas\n");
    free(text);
    // At most 64 machines: the oldest go.
    for (int i = 0; i < 70; i++) {
        char key[32];
        snprintf(key, sizeof key, "m%d", i);
        cr_assert(blas_auto_cache_store(path, key, 0.5 + i, GEMM_ONEDNN));
    }
    cr_assert_not(blas_auto_cache_lookup(path, "other", &r, &b));
    cr_assert_not(blas_auto_cache_lookup(path, "m5", &r, &b));
    cr_assert(blas_auto_cache_lookup(path, "m6", &r, &b) && r == 6.5);
    cr_assert(blas_auto_cache_lookup(path, "m69", &r, &b) && r == 69.5);
    text = test_read_file(path);
    int lines = 0;
    for (const char *p = text; *p; p++) lines += *p == '\n';
    cr_assert_eq(lines, 64);
    free(text);
    // A FIFO in the file's place is not waited on: no verdict.
    char fifo[700];
    snprintf(fifo, sizeof fifo, "%s/fifo", test_dir_of(path));
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_assert_not(blas_auto_cache_lookup(fifo, "k", &r, &b));
    // A folder that does not exist: refused, nothing made.
    char missing[700];
    snprintf(missing, sizeof missing, "%s/none/gemm_auto", test_dir_of(path));
    cr_assert_not(blas_auto_cache_store(missing, "k", 1, GEMM_ONEDNN));
}

// The kept measurement is written like every output (fileio.h): a link or a
// FIFO at its path is refused, not followed or replaced.
Test(blas_backend, auto_cache_file_is_never_written_through_a_link) {
    const char *dir = test_tmpdir("gemm_cache_link");
    char path[600], victim[600], fifo[600];
    snprintf(path, sizeof path, "%s/gemm_auto", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    test_write_file(victim, "precious");
    cr_assert_eq(symlink(victim, path), 0);
    cr_assert_not(blas_auto_cache_store(path, "k", 1.3, GEMM_OPENBLAS));
    char *text = test_read_file(victim);
    cr_assert_str_eq(text, "precious");
    free(text);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_assert_not(blas_auto_cache_store(fifo, "k", 1.3, GEMM_OPENBLAS));
    struct stat sb;
    cr_assert(lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode));
    cr_assert(lstat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode));
}

// auto takes the kept verdict for this machine (where OpenBLAS's kernels
// match the CPU and it has to measure): whatever the file says, it runs, and
// the start-up line says where it came from.
Test(blas_backend, auto_takes_the_kept_verdict) {
    const char *dir = test_tmpdir("gemm_verdict");
    setenv("ATTNLAB_CACHE_DIR", dir, 1);
    char path[700], key[600];
    snprintf(path, sizeof path, "%s/gemm_auto", dir);
    blas_auto_key(key, sizeof key);
    cr_assert(strstr(key, "|threads ") && !strchr(key, '\t'), "%s", key);
    for (int i = 0; i < test_n_backends(); i++) {
        GemmBackend want = i == 0 ? GEMM_OPENBLAS : GEMM_ONEDNN;
        // (the ratio says the other: the verdict is what counts, e.g. one a user wrote)
        cr_assert(blas_auto_cache_store(path, key, want == GEMM_ONEDNN ? 2.0 : 0.5, want));
        use(GEMM_AUTO, PRECISION_FP32);
        if (strstr(blas_describe(), "measured")) {   // (else OpenBLAS's kernels lag the CPU: the test above)
            cr_assert_eq(blas_backend, want, "%s", blas_describe());
            cr_assert(strstr(blas_describe(), path), "%s", blas_describe());
        } else {
            cr_assert(have_onednn() && blas_backend == GEMM_ONEDNN && strstr(blas_describe(), " CPU"), "%s",
                      blas_describe());
        }
    }
}
#endif

// [train] precision = bf16 with device = cuda: the float64 build refuses it
// before it looks for a GPU, saying that bf16 needs the float32 build (as it
// does on the CPU). The float32 build accepts the precision: without a GPU
// (or without the CUDA backend) what it says is about the device.
Test(blas_backend, bf16_on_the_gpu_needs_the_float32_build) {
    TrainConfig c;
    config_defaults(&c, model_mixer_known);
    Status s = config_set(&c, "train.device=cuda");
    if (s.ok) s = config_set(&c, "train.precision=bf16");
    cr_assert(s.ok, "%s", s.msg);
    s = model_set_products(&c);
#ifdef AG_DOUBLE
    cr_assert_not(s.ok, "the float64 build took precision = bf16 on the GPU");
    cr_assert(strstr(s.msg, "precision = bf16") && strstr(s.msg, "float32 build"), "%s", s.msg);
#else
    if (s.ok) device_set_bf16(DEVICE_CUDA, false);   // a GPU here: it ran; leave the products as they were
    else cr_assert(strstr(s.msg, "device = cuda") && !strstr(s.msg, "bf16"), "%s", s.msg);
#endif
    config_free(&c);
}
