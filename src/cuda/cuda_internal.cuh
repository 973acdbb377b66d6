// cuda_internal.cuh: what the CUDA kernels share: the one stream, the
// cuBLAS handle, error checks, launch shapes, device math in `real`, the
// block- and warp-wide sums in a fixed order, workspace offsets, the
// documents' index on the device and the shared-memory opt-in. The one
// header of device helpers: a helper two .cu files need goes here.
// Included by src/cuda/*.cu only.
#ifndef AG_CUDA_INTERNAL_CUH
#define AG_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_ops.h"
#include "tape.h"

// Every kernel, copy and cuBLAS call of the library goes on this stream, in
// program order, so the arena's memory can be reused after a reset without
// waiting (a later kernel runs after every earlier one).
extern cudaStream_t cu_stream;
extern cublasHandle_t cu_blas;

// While a CUDA graph is captured (graph_cuda.cu), a call that would break
// the capture (a copy to the host, a synchronisation, an allocation) or
// fails is recorded as the capture's failure instead of stopping the
// program: cu_capture_absorb returns true then, and the caller runs the
// work eagerly after the capture ends.
extern bool cu_capturing;
extern "C" bool cu_capture_absorb(const char *what, const char *err);
extern "C" void *cu_capture_stage(const void *src, size_t bytes);

// A failed CUDA call stops with the call, the error and where it was made
// (unless a capture absorbs it).
#define CU_CHECK(call)                                                                            \
    do {                                                                                          \
        cudaError_t cu_e_ = (call);                                                               \
        if (cu_e_ != cudaSuccess && !cu_capture_absorb(#call, cudaGetErrorString(cu_e_)))         \
            ag_fail(__FILE__, __LINE__, "CUDA: %s: %s (%s)", #call, cudaGetErrorString(cu_e_),  \
                    cudaGetErrorName(cu_e_));                                                     \
    } while (0)
#define CUBLAS_CHECK(call)                                                                        \
    do {                                                                                          \
        cublasStatus_t cu_s_ = (call);                                                            \
        if (cu_s_ != CUBLAS_STATUS_SUCCESS && !cu_capture_absorb(#call, cublasGetStatusString(cu_s_))) \
            ag_fail(__FILE__, __LINE__, "cuBLAS: %s: %s", #call, cublasGetStatusString(cu_s_));  \
    } while (0)
// After a launch: a bad configuration shows at once (no synchronisation).
#define CU_LAUNCHED() CU_CHECK(cudaGetLastError())

// Threads per block of the elementwise kernels, and a grid that covers n
// elements with grid-stride loops (capped: each thread then takes several).
#define CU_THREADS 256
static inline unsigned cu_grid(int64_t n) {
    int64_t b = (n + CU_THREADS - 1) / CU_THREADS;
    if (b < 1) b = 1;
    return (unsigned)(b > 65535 * 8 ? 65535 * 8 : b);
}
#define CU_FOR(i, n) for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); \
                          i += (int64_t)gridDim.x * blockDim.x)

// Whether kernels that take four reals a thread (float4: the float32 build)
// can run over the arrays p[0..n) of N reals: N a multiple of 4, every array
// 16-byte aligned.
static inline bool cu_x4_fits(const real *const *p, int n, int64_t N) {
    if (N % 4) return false;
    uintptr_t a = 0;
    for (int i = 0; i < n; i++) a |= (uintptr_t)p[i];
    return (a & 15) == 0;
}

// Device math in the build's precision (the overloads pick float or double).
// x y and x + y rounded, never contracted into an fma (nor simplified): a
// kernel whose result must not depend on how the compiler specialised a
// loop (the same bits from every path) spells its arithmetic with these and fma.
__device__ __forceinline__ real mul_rn(real x, real y) {
#ifdef AG_DOUBLE
    return __dmul_rn(x, y);
#else
    return __fmul_rn(x, y);
#endif
}
__device__ __forceinline__ real add_rn(real x, real y) {
#ifdef AG_DOUBLE
    return __dadd_rn(x, y);
#else
    return __fadd_rn(x, y);
#endif
}
__device__ __forceinline__ real d_exp(real x) { return exp(x); }
__device__ __forceinline__ real d_sigmoid(real x) {
    if (x >= 0) return (real)1 / ((real)1 + exp(-x));
    real e = exp(x);
    return e / ((real)1 + e);
}
__device__ __forceinline__ real d_softplus(real x) { return (x > 0 ? x : (real)0) + log1p(exp(x > 0 ? -x : x)); }
__device__ __forceinline__ real d_silu_grad(real x) {
    real s = d_sigmoid(x);
    return s * ((real)1 + x * ((real)1 - s));
}

// The sum over a warp's lanes of one value each, in T, the type of v
// (double, real or int: a caller's double sum stays double): a butterfly of
// shuffles, the same order every time, the same bits in every lane
// (x + y = y + x).
template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide sum of one double per thread (blockDim.x a multiple of 32, at
// most 1024); every thread gets the total. `shm` holds 32 doubles.
__device__ __forceinline__ double cu_block_sum(double v, double *shm) {
    v = warp_sum(v);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();   // shm may still be read by a previous call
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    v = lane < nw ? shm[lane] : 0.0;
    v = warp_sum(v);
    return v;
}

// Block-wide maximum of one real per thread (blockDim.x a multiple of 32, at
// most 1024); every thread gets it. `shm` holds 32 reals. `w > v ? w : v`,
// as the CPU's row maxima.
__device__ __forceinline__ real cu_block_max(real v, real *shm) {
    for (int o = 16; o > 0; o >>= 1) {
        real w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();   // shm may still be read by a previous call
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    v = shm[lane < nw ? lane : 0];
    for (int o = 16; o > 0; o >>= 1) {
        real w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

// A shared-memory pointer as the 32-bit address PTX's shared-space
// instructions take (cp.async, ldmatrix).
__device__ __forceinline__ unsigned cu_smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

// cp.async (sm_80 on), the kernels' one set: 16 bytes to shared memory of
// which the first `bytes` (0 to 16) are read from src and the rest zero; or
// one real. A group per commit; wait until at most N of this thread's groups
// are in flight (its copies are then visible to it, to the block after a
// barrier).
__device__ __forceinline__ void cu_cp16(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(cu_smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cu_cp1(real *dst, const real *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(cu_smem_addr(dst)), "l"(src),
                 "n"((int)sizeof(real))
                 : "memory");
}
__device__ __forceinline__ void cu_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cu_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// A decay factor exp(x), x a (non-positive) difference of cumulative log
// decays summed in double (r_exp_decay): x rounded to the build's
// precision, then exp in it.
__device__ __forceinline__ real d_decay(double x) { return exp((real)x); }

// Byte offsets of a per-block workspace (or of dynamic shared memory):
// `take` advances by n elements of `size` bytes, every offset 16-aligned.
static __host__ __device__ inline size_t ws_take(size_t *at, size_t n, size_t size) {
    size_t o = *at;
    *at += (n * size + 15) & ~(size_t)15;
    return o;
}

// A documents' index (docs.h's first: B*T ints in host memory, an op's aux)
// copied to the tape's device memory, or NULL when there is none.
static inline const int *cu_first_to_device(Tape *tp, const int *first, int B, int T) {
    if (!first) return NULL;
    size_t bytes = (size_t)B * T * sizeof(int);
    int *d = (int *)tape_dalloc(tp, bytes);
    cu_from_host(d, first, bytes);
    return d;
}

// The largest dynamic shared memory a block may opt in to (227 KB on Hopper).
static inline size_t cu_smem_optin(void) {
    static int bytes = 0;
    if (!bytes) {
        int dev = 0;
        CU_CHECK(cudaGetDevice(&dev));
        CU_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    }
    return (size_t)bytes;
}

// Check a kernel's shared memory fits, and opt in above the default 48 KB.
static inline void cu_smem_prepare(const void *kernel, size_t bytes, const char *what, int dk, int dv) {
    ASSERT(bytes <= cu_smem_optin(), "%s: head dims dk %d, dv %d need %zu bytes of shared memory, the GPU has %zu",
           what, dk, dv, bytes, cu_smem_optin());
    if (bytes > 48 * 1024)
        CU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// The last step of the column sums that several backwards make in two
// passes (a fixed grid of partial sums in double, then their total):
// out[o(i)] = (or +=, unless fresh) sum_{k < nblk} part[k n + i] for i < n,
// o(i) = i, or with C > 0 the transposed place (i mod C) (n / C) + i / C
// (partials laid out (.., C), out (C, ..)). A warp per i: lane l adds k = l,
// l + 32, ... in order, then a fixed butterfly of shuffles, so the total is
// the same bits every run (ops_reduce.cu).
void cu_sum_parts(const double *part, int64_t n, int nblk, real *out, bool fresh, int C);

// The gradient buffer of a node's input on the GPU (tensor_grad_fresh):
// *fresh true means uninitialised, to be written (=) rather than added to.
#define CU_GRAD_FRESH(n, i, fresh) tensor_grad_fresh((n)->tape, (n)->in[i], (fresh))

#endif
