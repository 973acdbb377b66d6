// blk_mm_kernel.cu: one of the per-chunk kernels' block-wide products
// (gdn_chunk.cuh's blk_gemm_s, gdn_bf16.cuh's blk_gemm_bf16_s) run on one
// block of GDN_NT threads, for test_cuda_blk_mm.c: the products alone, at
// the shapes, transposes and leading dimensions the ops reach seldom.
#include "gdn_chunk.cuh"

__global__ void k_blk_mm(bool bf, bool ta, bool tb, int M, int N, int K, real alpha, const real *A, int lda,
                         const real *B, int ldb, real beta, real *C, int ldc) {
    __shared__ Tiles sh;
#ifndef AG_DOUBLE
    if (bf) {
        blk_gemm_bf16_s(&sh, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#endif
    blk_gemm_s(&sh, ta, tb, M, N, K, alpha, A, lda, NULL, B, ldb, beta, C, ldc);
}

// C = alpha op(A) op(B) + beta C on the GPU from host arrays of nA, nB, nC
// reals, each placed `off` reals past a fresh allocation (off 1: no 16-byte
// alignment); C is copied back. bf: the bf16 form, refused (false) in the
// float64 build, which has none.
extern "C" bool cu_test_blk_mm(bool bf, bool ta, bool tb, int M, int N, int K, real alpha, const real *A,
                               int64_t nA, int lda, const real *B, int64_t nB, int ldb, real beta, real *C,
                               int64_t nC, int ldc, int off) {
#ifdef AG_DOUBLE
    if (bf) return false;
#endif
    real *d[3];
    const real *h[3] = {A, B, C};
    int64_t n[3] = {nA, nB, nC};
    for (int i = 0; i < 3; i++) {
        CU_CHECK(cudaMalloc(&d[i], (size_t)(n[i] + off + 1) * sizeof(real)));
        CU_CHECK(cudaMemcpy(d[i] + off, h[i], (size_t)n[i] * sizeof(real), cudaMemcpyHostToDevice));
    }
    k_blk_mm<<<1, GDN_NT>>>(bf, ta, tb, M, N, K, alpha, d[0] + off, lda, d[1] + off, ldb, beta, d[2] + off, ldc);
    CU_CHECK(cudaGetLastError());
    CU_CHECK(cudaMemcpy(C, d[2] + off, (size_t)nC * sizeof(real), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 3; i++) CU_CHECK(cudaFree(d[i]));
    return true;
}
