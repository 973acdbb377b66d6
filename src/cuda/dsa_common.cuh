// dsa_common.cuh: what the DSA kernels (dsa_index.cu, dsa_topk.cu,
// dsa_sparse.cu, dsa_sel_kl.cu) share: the documents' index on the device,
// deterministic block reductions, the mean of per-row losses, and the host
// entries one file offers the others (the top-k of rows of scores, the
// selection's checks and transpose). Included by those four files only.
#ifndef AG_DSA_COMMON_CUH
#define AG_DSA_COMMON_CUH

#include "cuda_internal.cuh"

#define DSA_THREADS 128   // threads of the per-row kernels (four warps)
#define SMEM_CACHE_BYTES (40 * 1024)          // a row kept in shared memory up to this size (with the
                                              // kernels' static arrays, under the default 48 KB)
#define SELECT_CHUNK ((int64_t)1 << 24)       // reals of scores per block of rows in dsa_index_select

// Where row r's document begins (docs_begin of docs.h), first on the device or NULL.
__device__ __forceinline__ int dsa_lo(const int *first, int64_t r) {
    int f = first ? first[r] : 0;
    return f > 0 ? f : 0;
}

// Whether query t (row rb + t of first) scores key s: s <= t, inside t's document.
__device__ __forceinline__ bool dsa_seen(const int *first, int64_t rb, int t, int s) {
    return s <= t && s >= dsa_lo(first, rb + t);
}

// Check a kernel's dynamic shared memory fits the GPU (with up to 1 KB of
// static arrays beside it), and opt in to more than the default 48 KB.
static inline void dsa_smem_prepare(const void *kernel, size_t bytes, const char *what) {
    size_t optin = cu_smem_optin();
    ASSERT(bytes + 1024 <= optin, "%s needs %zu bytes of shared memory per block, the GPU has %zu", what,
           bytes + 1024, optin);
    if (bytes + 1024 > 48 * 1024)
        CU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// Block-wide sum of one int per thread; every thread gets it. shm: 32 ints.
__device__ __forceinline__ int dsa_block_count(int v, int *shm) {
    v = warp_sum(v);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    v = lane < nw ? shm[lane] : 0;
    v = warp_sum(v);
    return v;
}

// out[0] = sum of x[0..n) / n, in double: each thread a fixed stride, then
// the block's tree. Launched as one block of 1024 threads: a fixed order.
static __global__ void __launch_bounds__(1024) k_dsa_mean(const double *x, int64_t n, real *out) {
    __shared__ double shm[32];
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
    s = cu_block_sum(s, shm);
    if (threadIdx.x == 0) out[0] = (real)(n > 0 ? s / (double)n : 0.0);
}

// The number of valid entries of a row (K, -1 padded at the end), for every thread.
__device__ __forceinline__ int sel_count(const int *sr, int K, int *shm) {
    int c = 0;
    for (int j = threadIdx.x; j < K; j += blockDim.x) c += sr[j] >= 0;
    return dsa_block_count(c, shm);
}

// dsa_sparse.cu: stop when a row of sel (rows, K) selects nothing or a
// position after its own; and the selection's entries grouped by the key
// row they read (order[start[k] .. start[k+1]) read key row k, in ascending t).
void sel_check(const int *sel, int B, int T, int K, int op);
void sel_transpose(Tape *tp, const int *sel, int B, int T, int K, const int **order, const int **start);

// dsa_topk.cu: the top-k of rows of scores S (a row l lds apart) into sel (B, T, K).
void topk_rows(int *sel, const real *S, int64_t lds, int T, int K, const int *first, int b0, int nb, int t_begin,
               int nt);

#endif
