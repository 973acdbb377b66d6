// attn_decode.cu: one decoding step of softmax attention over a KV cache on
// the GPU (attn_decode_forward in attn_decode.c is the CPU twin, whose
// arithmetic this follows: scores in `real`, the max, exp, their sum in
// double, then the weighted sum of the values scaled by 1 / sum).
//
// Three kernels, no atomics:
//  - scores: a warp per (row, head, key), lanes over d_k, the lanes' partial
//    sums combined by a fixed butterfly;
//  - parts: the row's keys cut into parts of DEC_PART, as the CPU cuts them
//    (flash-decoding), a block per (row, head, part): the part's max and sum
//    (fixed-order block reductions), then per 32 value columns each warp
//    sums its share of the part's keys and warp 0 adds the 8 shares in order:
//    the part's unnormalised output;
//  - merge: a block per (row, head) merges the parts in order, m = max m_p,
//    o = sum_p exp(m_p - m) o_p / sum_p exp(m_p - m) l_p.
// Parts, not one block per (row, head) walking every key: that is 4 blocks
// for tiny_attn's one sequence, 98 tokens/s after a 100k prompt on the H200.
// The scores and the parts go to scratch in the tape's device arena.
#include <math.h>

#include "cuda_internal.cuh"

#define DEC_WARPS 8
#define DEC_THREADS (32 * DEC_WARPS)
#define DEC_PART 256   // keys a part (attn_decode.c's DECODE_PART)

// s[(b H + h) n_keys + j - s0] = scale q_bh . k_{b, j, h} for j in [s0, n_keys).
__global__ void __launch_bounds__(DEC_THREADS)
    k_attn_decode_scores(real *s, const real *q, const real *kc, int max_T, int n_keys, const int *cnt,
                         const int *key0, int H, int dk, real scale) {
    if (cnt) n_keys = *cnt + 1;   // (the cache's length on the device: cu_attn_step)
    int bh = blockIdx.x, b = bh / H, h = bh % H, lane = threadIdx.x & 31;
    int s0 = key0 ? key0[b] : 0;
    int j = s0 + blockIdx.y * DEC_WARPS + (threadIdx.x >> 5);
    if (j >= n_keys) return;   // whole warps leave together: no barrier below
    int64_t ld = (int64_t)H * dk;
    const real *qv = q + (int64_t)b * ld + (int64_t)h * dk;
    const real *kv = kc + ((int64_t)b * max_T + j) * ld + (int64_t)h * dk;
    real acc = 0;
    for (int d = lane; d < dk; d += 32) acc += qv[d] * kv[d];
    acc = warp_sum(acc);
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

// Part p (blockIdx.y) of row b's keys: m_p = max s_j, l_p = sum_j exp(s_j -
// m_p) (double), o_p = sum_j exp(s_j - m_p) v_j, into pm, pl, po at (b H + h)
// np + p. s: the scores (overwritten by their exp).
__global__ void __launch_bounds__(DEC_THREADS)
    k_attn_decode_part(real *pm, double *pl, real *po, real *s, const real *vc, int max_T, int n_keys,
                       const int *cnt, const int *key0, int H, int dv, int np) {
    if (cnt) n_keys = *cnt + 1;
    __shared__ real rmax[DEC_WARPS];
    __shared__ double rsum[32];
    __shared__ real part[DEC_WARPS][32];
    int bh = blockIdx.x, b = bh / H, h = bh % H, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int s0 = key0 ? key0[b] : 0, j0 = blockIdx.y * DEC_PART, n = min(DEC_PART, n_keys - s0 - j0);
    if (n <= 0) return;   // a row whose document starts later has fewer parts (the whole block leaves)
    real *w = s + (int64_t)bh * n_keys + j0;
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
    int64_t at = (int64_t)bh * np + blockIdx.y, ld = (int64_t)H * dv;
    if (threadIdx.x == 0) pm[at] = mx, pl[at] = sum;
    const real *V = vc + ((int64_t)b * max_T + s0 + j0) * ld + (int64_t)h * dv;
    int per = (n + DEC_WARPS - 1) / DEC_WARPS, a = warp * per, a1 = min(n, a + per);
    for (int c0 = 0; c0 < dv; c0 += 32) {
        int c = c0 + lane;
        real acc = 0;
        if (c < dv)
            for (int j = a; j < a1; j++) acc += w[j] * V[(int64_t)j * ld + c];
        part[warp][lane] = acc;
        __syncthreads();
        if (warp == 0 && c < dv) {
            real t = part[0][lane];
            for (int k = 1; k < DEC_WARPS; k++) t += part[k][lane];
            po[at * dv + c] = t;
        }
        __syncthreads();   // part is rewritten by the next columns
    }
}

// o[b, h] from row b's parts, merged in order (a thread per value column).
__global__ void k_attn_decode_merge(real *o, const real *pm, const double *pl, const real *po, int n_keys,
                                    const int *cnt, const int *key0, int H, int dv, int np) {
    if (cnt) n_keys = *cnt + 1;
    int bh = blockIdx.x, b = bh / H, h = bh % H;
    int parts = (n_keys - (key0 ? key0[b] : 0) + DEC_PART - 1) / DEC_PART;
    int64_t at = (int64_t)bh * np;
    real mx = pm[at];
    for (int p = 1; p < parts; p++) mx = fmax(mx, pm[at + p]);
    for (int c = threadIdx.x; c < dv; c += blockDim.x) {
        double l = 0;
        real acc = 0;
        for (int p = 0; p < parts; p++) {
            real f = d_exp(pm[at + p] - mx);
            l += f * pl[at + p];
            acc += f * po[(at + p) * dv + c];
        }
        o[(int64_t)b * H * dv + (int64_t)h * dv + c] = (real)(acc / l);
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
    k_attn_decode_scores<<<g, DEC_THREADS, 0, cu_stream>>>(s, q, kc, max_T, n_keys, NULL, key0_dev, H, dk,
                                                            (real)scale);
    CU_LAUNCHED();
    int np = (n_max + DEC_PART - 1) / DEC_PART;   // parts of the longest row
    size_t nr = (size_t)B * H * np;
    real *pm = (real *)tape_dalloc(tp, nr * sizeof(real)), *po = (real *)tape_dalloc(tp, nr * dv * sizeof(real));
    double *pl = (double *)tape_dalloc(tp, nr * sizeof(double));
    k_attn_decode_part<<<dim3((unsigned)(B * H), (unsigned)np), DEC_THREADS, 0, cu_stream>>>(
        pm, pl, po, s, vc, max_T, n_keys, NULL, key0_dev, H, dv, np);
    CU_LAUNCHED();
    k_attn_decode_merge<<<B * H, 128, 0, cu_stream>>>(o, pm, pl, po, n_keys, NULL, key0_dev, H, dv, np);
    CU_LAUNCHED();
}

// ---- a step whose cache length is read from the device (cu_attn_step) ----

// Row b's query rotated into qr, its key rotated and its value copied into
// the cache's slot *cnt, at RoPE position *cnt - key0[b]: op_rope's angle
// and rotation (ops_rope.cu's k_rope_table, k_rope_apply), the same bits.
// One thread per pair of q and k (i < B*H*dk/2), then per value of v.
__global__ void k_attn_step_put(real *qr, real *kc, real *vc, const real *q, const real *k, const real *v,
                                const int *cnt, const int *key0, const double *invf, int max_T, int H, int dk,
                                int dv, int B) {
    int slot = *cnt, half = dk / 2;
    int64_t row_pairs = (int64_t)H * half, ldk = (int64_t)H * dk, ldv = (int64_t)H * dv;
    CU_FOR(k2, (int64_t)B * row_pairs) {
        int b = (int)(k2 / row_pairs);
        int64_t kk = k2 % row_pairs;
        int p = slot - key0[b];
        double a = __dmul_rn((double)p, invf[kk % half]);
        real c = (real)cos(a), sn = (real)sin(a);
        real x0 = q[2 * k2], x1 = q[2 * k2 + 1];
        qr[2 * k2] = fma(x0, c, -mul_rn(x1, sn));
        qr[2 * k2 + 1] = fma(x0, sn, mul_rn(x1, c));
        real *kd = kc + ((int64_t)b * max_T + slot) * ldk + 2 * kk;
        x0 = k[2 * k2], x1 = k[2 * k2 + 1];
        kd[0] = fma(x0, c, -mul_rn(x1, sn));
        kd[1] = fma(x0, sn, mul_rn(x1, c));
    }
    CU_FOR(i, (int64_t)B * ldv) {
        int64_t b = i / ldv;
        vc[(b * max_T + slot) * ldv + i % ldv] = v[i];
    }
}

__global__ void k_attn_step_count(int *cnt) { *cnt += 1; }

extern "C" void cu_attn_step(Tape *tp, real *o, const real *q, const real *k, const real *v, real *kc, real *vc,
                             int *cnt, const int *key0_dev, const double *invf, int B, int max_T, int H, int dk,
                             int dv, double scale) {
    ASSERT(cu_attn_step_fits(max_T), "attn step (GPU): a cache of %d positions: more than the grid holds", max_T);
    ASSERT(dk % 2 == 0, "attn step (GPU): d_k %d is odd", dk);
    real *qr = (real *)tape_dalloc(tp, (size_t)B * H * dk * sizeof(real));
    k_attn_step_put<<<cu_grid((int64_t)B * H * (dk > dv ? dk : dv)), CU_THREADS, 0, cu_stream>>>(
        qr, kc, vc, q, k, v, cnt, key0_dev, invf, max_T, H, dk, dv, B);
    CU_LAUNCHED();
    // Everything sized for the whole cache, the blocks past a row's keys returning at once: the same
    // launches at every length (a graph's), the same parts and sums as cu_attn_decode's.
    real *s = (real *)tape_dalloc(tp, (size_t)B * H * max_T * sizeof(real));
    dim3 g((unsigned)(B * H), (unsigned)((max_T + DEC_WARPS - 1) / DEC_WARPS));
    k_attn_decode_scores<<<g, DEC_THREADS, 0, cu_stream>>>(s, qr, kc, max_T, 0, cnt, key0_dev, H, dk, (real)scale);
    CU_LAUNCHED();
    int np = (max_T + DEC_PART - 1) / DEC_PART;
    size_t nr = (size_t)B * H * np;
    real *pm = (real *)tape_dalloc(tp, nr * sizeof(real)), *po = (real *)tape_dalloc(tp, nr * dv * sizeof(real));
    double *pl = (double *)tape_dalloc(tp, nr * sizeof(double));
    k_attn_decode_part<<<dim3((unsigned)(B * H), (unsigned)np), DEC_THREADS, 0, cu_stream>>>(
        pm, pl, po, s, vc, max_T, 0, cnt, key0_dev, H, dv, np);
    CU_LAUNCHED();
    k_attn_decode_merge<<<B * H, 128, 0, cu_stream>>>(o, pm, pl, po, 0, cnt, key0_dev, H, dv, np);
    CU_LAUNCHED();
    k_attn_step_count<<<1, 1, 0, cu_stream>>>(cnt);
    CU_LAUNCHED();
}

extern "C" bool cu_attn_step_fits(int max_T) { return (max_T + DEC_WARPS - 1) / DEC_WARPS <= 65535; }
