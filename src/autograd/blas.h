// blas.h: row-major GEMM over `real`, through one of two backends:
// OpenBLAS's cblas (always built; the only one in the float64 build) or
// oneDNN (float32 builds with libdnnl-dev), chosen once at start-up by
// blas_select (blas_select.c). The dense layers' products (gemm_rows,
// gemm_sum_rows: op_matmul with a shared weight) can also run in bf16 with
// float32 accumulation (docs/cpu_perf.md says which parts stay float32).
#ifndef AG_BLAS_H
#define AG_BLAS_H

#include <cblas.h>

#include "bf16.h"
#include "common.h"

// The backends, in the order of the config key [train] gemm = auto|openblas|onednn.
typedef enum { GEMM_AUTO, GEMM_OPENBLAS, GEMM_ONEDNN, GEMM_BACKEND_COUNT } GemmBackend;
// The dense layers' products, in the order of [train] precision = fp32|bf16|tf32
// (tf32: the GPU's products on tensor cores, docs/cuda.md; the CPU refuses it).
typedef enum { PRECISION_FP32, PRECISION_BF16, PRECISION_TF32, PRECISION_COUNT } GemmPrecision;

// The backend gemm() runs now: GEMM_OPENBLAS (the default) or GEMM_ONEDNN.
extern GemmBackend blas_backend;
// The precision of gemm_rows / gemm_sum_rows now: PRECISION_FP32 (default) or PRECISION_BF16.
extern GemmPrecision blas_precision;

// The oneDNN backend (blas_onednn.c); without oneDNN, onednn_built() is false
// and the products are never called.
bool onednn_built(void);
const char *onednn_isa_name(void);   // the instruction set oneDNN's kernels use ("avx512_core_bf16")
const char *onednn_version(void);    // the library's version ("2.6.3"; "none" without oneDNN)
bool onednn_has_bf16(void);          // the CPU runs bf16 products (AVX512_BF16)
void onednn_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc);
// C (M x N) (= or +=, beta 0 or 1) op(A) op(B), bf16 operands, float32 sums and C.
void onednn_gemm_bf16(bool ta, bool tb, int M, int N, int K, const bf16 *A, int lda, const bf16 *B, int ldb,
                      float beta, float *C, int ldc);
// Free the cached primitives and scratch (leak checkers; not needed otherwise).
void onednn_release(void);

// C (M x N) = alpha * op(A) * op(B) + beta * C, all row-major, float32 or float64 as `real`.
// op(A) is M x K (A stored K x M when ta); op(B) is K x N (B stored N x K when tb).
static inline void gemm(bool ta, bool tb, int M, int N, int K, real alpha, const real *A, int lda,
                        const real *B, int ldb, real beta, real *C, int ldc) {
    if (M == 0 || N == 0) return;
#ifdef AG_DOUBLE
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
                alpha, A, lda, B, ldb, beta, C, ldc);
#else
    if (blas_backend == GEMM_ONEDNN)
        onednn_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
                    alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

// Products over many rows, split among the OpenMP threads by hand (blas.c
// says why); both fall back to one product inside a parallel region or on
// one thread, and neither result depends on the thread count. With
// blas_precision bf16 both round A and B to bf16 and sum in float32.
//
// C (R, N) = A (R, K) op(B) + beta C: per-thread slabs of rows.
void gemm_rows(bool tb, int R, int N, int K, const real *A, int lda, const real *B, int ldb, real beta, real *C,
               int ldc);
// C (M, N) = X^T Y + beta C with X (R, M), Y (R, N), beta 0 or 1 (a weight
// gradient summed over R rows): a partial product per fixed block of rows,
// summed in block order, or with oneDNN in float32 and M >= 512 a product
// per fixed block of C's rows (blas.c, sum_split). part:
// gemm_sum_rows_scratch(M, N, R) elements of scratch (0: no partials, and
// part may be NULL).
size_t gemm_sum_rows_scratch(int M, int N, int R);
void gemm_sum_rows(int M, int N, int R, const real *X, int ldx, const real *Y, int ldy, real beta, real *C,
                   int ldc, real *part);

// Several products of one input (op_matmul_multi): the q, k, v and gate
// projections of a mixer, the two up projections of the MLP. One parallel
// region does what m calls of the above would do in 3 m (with the backward),
// each slab of rows runs all m products while its rows of A are in cache,
// and in bf16 a slab of A is rounded once for all m. m <= GEMM_MULTI_MAX.
#define GEMM_MULTI_MAX 4
// C_i (R, N_i) = A (R, K) B_i (K, N_i), i < m (written: beta 0).
void gemm_rows_multi(int m, int R, int K, const real *A, const real *const *B, const int *N, real *const *C);
// The backward of gemm_rows_multi, given the output gradients dC_i (R, N_i)
// (NULL: that output has none, and contributes nothing):
//   dA (R, K) = beta_a dA + sum_i dC_i B_i^T       (dA NULL: not wanted)
//   dB_i (K, N_i) = beta_b[i] dB_i + A^T dC_i      (dB_i NULL: not wanted)
// with beta 0 or 1. dB_i as gemm_sum_rows computes it, the same bits on any
// thread count; part: gemm_multi_scratch elements (0: not needed, may be NULL).
size_t gemm_multi_scratch(int m, int K, const int *N, int R);
void gemm_multi_backward(int m, int R, int K, const real *A, const real *const *B, const int *N,
                         const real *const *dC, real *dA, real beta_a, real *const *dB, const real *beta_b,
                         real *part);

// ---- choosing the backend (blas_select.c) ----

// Set the backend and the precision for what follows. GEMM_AUTO picks oneDNN
// when OpenBLAS runs a kernel set below the CPU's instruction set (e.g.
// Haswell's AVX2 kernels on an AVX-512 CPU), else the faster of the two on a
// short measurement of a step's kinds of product, split as gemm_rows and
// gemm_sum_rows split them, on the current thread count. Returns false, with
// why in err, when the request cannot run here (oneDNN not built, bf16 in the
// float64 build, a CPU without AVX512_BF16); nothing changes then. Call it
// from the main thread, outside parallel regions.
bool blas_select(GemmBackend want, GemmPrecision prec, char *err, size_t n);
// The same, with the backend from the environment variable ATTNLAB_GEMM
// (auto, openblas or onednn; unset: auto) and float32 products, for the
// programs without a config (benchmarks, generate). On a bad value it says so
// on stderr and keeps OpenBLAS.
void blas_select_from_env(void);
// auto's measurement is made once per machine and thread count, and kept in
// $ATTNLAB_CACHE_DIR/gemm_auto (else $XDG_CACHE_HOME/attnlab/gemm_auto, else
// ~/.cache/attnlab/gemm_auto): one line per machine, "key<TAB>ratio<TAB>backend",
// so that every run on a machine chooses the same backend and rounds alike.
// The key (CPU, instruction sets, kernels, library versions, threads, the
// measurement), and the file's lookup and update (whole or not at all), for
// the tests. Not in the float64 build.
void blas_auto_key(char *key, size_t n);
bool blas_auto_cache_lookup(const char *path, const char *key, double *ratio, GemmBackend *b);
bool blas_auto_cache_store(const char *path, const char *key, double ratio, GemmBackend b);
// Parse a backend / precision name ("auto", "openblas", "onednn" / "fp32",
// "bf16"); -1 when unknown.
int blas_backend_parse(const char *name);
const char *blas_backend_name(GemmBackend b);
const char *blas_precision_name(GemmPrecision p);
// One line for logs and benchmark headers: the backend, its kernels, the
// precision and why auto chose it, e.g. "onednn (avx512_core_bf16 kernels;
// auto: OpenBLAS's Haswell kernels are AVX2 on an AVX-512 CPU), products fp32".
const char *blas_describe(void);

// The kernel set OpenBLAS runs ("Haswell", "SkylakeX", ...), for the headers
// of logs and benchmarks. OpenBLAS picks it once, when it loads, from
// OPENBLAS_CORETYPE if set, else from the CPU; the environment pins Haswell
// on this project's Zen 5 machines and the project keeps that choice (the
// oneDNN backend is how it gets AVX-512 products).
static inline const char *blas_core_name(void) {
    const char *name = openblas_get_corename();
    return name ? name : "?";
}

#endif
