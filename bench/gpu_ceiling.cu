// gpu_ceiling.cu: the GPU's measured ceilings, against which bench/gpu_bench.sh's
// training steps are read (issue 17; not a test):
//  - float32 products: cublasSgemm, N x N x N, strict IEEE (the library's
//    default math mode) and TF32 on the tensor cores;
//  - memory: a device-to-device copy of B bytes (2 B moved: read + write).
// Each figure is the best of R timed repetitions after one untimed, timed
// with CUDA events on one stream. Prints one RESULT line.
//
//   gpu_ceiling [N=8192] [MiB=1024] [R=10]
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                              \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "gpu_ceiling: %s: %s\n", #call, cudaGetErrorString(e_));             \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)
#define CHECK_BLAS(call)                                                                         \
    do {                                                                                         \
        cublasStatus_t s_ = (call);                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                       \
            fprintf(stderr, "gpu_ceiling: %s: %s\n", #call, cublasGetStatusString(s_));          \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

__global__ void fill(float *p, size_t n, float v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = v * (float)(i % 97);
}

// Best milliseconds of reps calls of f after one untimed call.
template <typename F> static float best_ms(cudaStream_t s, int reps, F f) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    f();
    float best = 1e30f;
    for (int r = 0; r < reps; r++) {
        CHECK(cudaEventRecord(a, s));
        f();
        CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        if (ms < best) best = ms;
    }
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return best;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 8192;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    int reps = argc > 3 ? atoi(argv[3]) : 10;
    if (n < 256 || n > 32768 || mib < 1 || mib > 65536 || reps < 1 || reps > 1000) {
        fprintf(stderr, "usage: gpu_ceiling [N 256..32768] [MiB 1..65536] [R 1..1000]\n");
        return 2;
    }
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cublasHandle_t h;
    CHECK_BLAS(cublasCreate(&h));
    CHECK_BLAS(cublasSetStream(h, s));
    size_t nn = (size_t)n * n;
    float *A, *B, *C;
    CHECK(cudaMalloc(&A, nn * sizeof(float)));
    CHECK(cudaMalloc(&B, nn * sizeof(float)));
    CHECK(cudaMalloc(&C, nn * sizeof(float)));
    fill<<<1024, 256, 0, s>>>(A, nn, 1e-3f);
    fill<<<1024, 256, 0, s>>>(B, nn, 2e-3f);
    const float one = 1, zero = 0;
    double flops = 2.0 * n * (double)n * n;
    double tf[2];
    for (int tf32 = 0; tf32 < 2; tf32++) {
        CHECK_BLAS(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
        float ms = best_ms(s, reps, [&] {
            CHECK_BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, n, B, n, &zero, C, n));
        });
        tf[tf32] = flops / (ms * 1e-3) * 1e-12;
    }
    CHECK(cudaFree(A));
    CHECK(cudaFree(B));
    CHECK(cudaFree(C));
    size_t bytes = mib << 20;
    void *x, *y;
    CHECK(cudaMalloc(&x, bytes));
    CHECK(cudaMalloc(&y, bytes));
    CHECK(cudaMemsetAsync(x, 1, bytes, s));
    float ms = best_ms(s, reps, [&] { CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, s)); });
    double gbs = 2.0 * (double)bytes / (ms * 1e-3) * 1e-9;
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    printf("RESULT gpu=\"%s\" sms=%d sgemm_n=%d sgemm_fp32_tflops=%.1f sgemm_tf32_tflops=%.1f copy_mib=%zu "
           "copy_gbps=%.0f\n",
           p.name, p.multiProcessorCount, n, tf[0], tf[1], mib, gbs);
    cublasDestroy(h);
    cudaStreamDestroy(s);
    return 0;
}
