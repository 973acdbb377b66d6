// attn_decode.cu: one decoding step of softmax attention over a KV cache on
// the GPU (attn_decode_forward in attn_flash.c is the CPU twin, whose
// arithmetic this follows: scores in `real`, the max, exp, their sum in
// double, then the weighted sum of the values scaled by 1 / sum).
//
// Two kernels, no atomics:
//  - scores: a warp per (row, head, key), lanes over d_k, the lanes' partial
//    sums combined by a fixed butterfly;
//  - output: a block per (row, head): the max and the sum over the row's keys
//    (fixed-order block reductions), then per 32 value columns each warp sums
//    its share of the keys and warp 0 adds the 8 shares in order.
// The scores go to a scratch buffer of the tape's device arena.
#include <math.h>

#include "cuda_internal.cuh"

#define DEC_WARPS 8
#define DEC_THREADS (32 * DEC_WARPS)

// s[(b H + h) n_keys + j - s0] = scale q_bh . k_{b, j, h} for j in [s0, n_keys).
__global__ void __launch_bounds__(DEC_THREADS)
    k_attn_decode_scores(real *s, const real *q, const real *kc, int max_T, int n_keys, const int *key0, int H,
                         int dk, real scale) {
    int bh = blockIdx.x, b = bh / H, h = bh % H, lane = threadIdx.x & 31;
    int s0 = key0 ? key0[b] : 0;
    int j = s0 + blockIdx.y * DEC_WARPS + (threadIdx.x >> 5);
    if (j >= n_keys) return;   // whole warps leave together: no barrier below
    int64_t ld = (int64_t)H * dk;
    const real *qv = q + (int64_t)b * ld + (int64_t)h * dk;
    const real *kv = kc + ((int64_t)b * max_T + j) * ld + (int64_t)h * dk;
    real acc = 0;
    for (int d = lane; d < dk; d += 32) acc += qv[d] * kv[d];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) s[(int64_t)bh * n_keys + (j - s0)] = scale * acc;
}

__device__ __forceinline__ real block_max(real v, real *shm) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    v = shm[0];
    for (int w = 1; w < DEC_WARPS; w++) v = fmax(v, shm[w]);
    return v;
}

// o[b, h] = sum_j w_j v_j / sum_j w_j, w_j = exp(s_j - max s).
__global__ void __launch_bounds__(DEC_THREADS)
    k_attn_decode_out(real *o, real *s, const real *vc, int max_T, int n_keys, const int *key0, int H, int dv) {
    __shared__ real rmax[DEC_WARPS];
    __shared__ double rsum[32];
    __shared__ real part[DEC_WARPS][32];
    int bh = blockIdx.x, b = bh / H, h = bh % H, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int s0 = key0 ? key0[b] : 0, n = n_keys - s0;
    real *w = s + (int64_t)bh * n_keys;
    real mx = -INFINITY;
    for (int j = threadIdx.x; j < n; j += DEC_THREADS) mx = fmax(mx, w[j]);
    mx = block_max(mx, rmax);
    double sum = 0;
    for (int j = threadIdx.x; j < n; j += DEC_THREADS) {
        real e = d_exp(w[j] - mx);
        w[j] = e;
        sum += e;
    }
    sum = cu_block_sum(sum, rsum);   // ends with every w[j] written (its barriers)
    real inv = (real)(1.0 / sum);
    int64_t ld = (int64_t)H * dv;
    const real *V = vc + ((int64_t)b * max_T + s0) * ld + (int64_t)h * dv;
    int per = (n + DEC_WARPS - 1) / DEC_WARPS, j0 = warp * per, j1 = min(n, j0 + per);
    for (int c0 = 0; c0 < dv; c0 += 32) {
        int c = c0 + lane;
        real acc = 0;
        if (c < dv)
            for (int j = j0; j < j1; j++) acc += w[j] * V[(int64_t)j * ld + c];
        part[warp][lane] = acc;
        __syncthreads();
        if (warp == 0 && c < dv) {
            real t = part[0][lane];
            for (int k = 1; k < DEC_WARPS; k++) t += part[k][lane];
            o[(int64_t)b * ld + (int64_t)h * dv + c] = inv * t;
        }
        __syncthreads();   // part is rewritten by the next columns
    }
}

extern "C" void cu_attn_decode(Tape *tp, real *o, const real *q, const real *kc, const real *vc, int B, int max_T,
                               int n_keys, const int *key0, const int *key0_dev, int H, int dk, int dv,
                               double scale) {
    ASSERT(n_keys >= 1 && n_keys <= max_T, "attn decode (GPU): %d keys in a cache of %d", n_keys, max_T);
    int n_max = 0;   // the longest row: the grid's extent over keys
    for (int b = 0; b < B; b++) {
        int s0 = key0 ? key0[b] : 0;
        ASSERT(s0 >= 0 && s0 < n_keys, "attn decode (GPU): row %d starts at key %d of %d", b, s0, n_keys);
        if (n_keys - s0 > n_max) n_max = n_keys - s0;
    }
    ASSERT((n_max + DEC_WARPS - 1) / DEC_WARPS <= 65535, "attn decode (GPU): %d keys: more than the grid holds", n_max);
    real *s = (real *)tape_dalloc(tp, (size_t)B * H * n_keys * sizeof(real));
    dim3 g((unsigned)(B * H), (unsigned)((n_max + DEC_WARPS - 1) / DEC_WARPS));
    k_attn_decode_scores<<<g, DEC_THREADS, 0, cu_stream>>>(s, q, kc, max_T, n_keys, key0_dev, H, dk, (real)scale);
    CU_LAUNCHED();
    k_attn_decode_out<<<B * H, DEC_THREADS, 0, cu_stream>>>(o, s, vc, max_T, n_keys, key0_dev, H, dv);
    CU_LAUNCHED();
}
