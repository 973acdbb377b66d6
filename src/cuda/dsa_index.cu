// dsa_index.cu: the DeepSeek sparse-attention indexer on the GPU
// (dsa_kernel.h): op_dsa_index_scores, the top-k selection (from the score
// matrix, or fused with the scores in row blocks of bounded memory), the
// distillation target, op_dsa_kl and the kept attention mass.
//
// Scores. Tiles of 32 queries x 32 keys, a block of 256 threads: lane tx
// owns key s0 + tx, warp ty the query rows ty + 8 r (r < 4). Per index head
// j, Z = qI_j . kI is summed over dI in chunks of 32 through shared memory
// (one thread per score, the dimensions in order), then
// I += c w_tj ReLU(Z), the heads in order. Backward (Z recomputed per tile):
//   dQ kernel, a block per query tile: per head, per key tile, dZ = c g w [Z > 0]
//   in shared memory, dw_tj += c sum_s g Z [Z > 0] (a warp's fixed tree per
//   tile, the tiles in order, in double as the CPU), dqI_tj += dZ K (one
//   thread per element, the keys in order);
//   dK kernel, a block per key tile: per query tile that sees it, per head,
//   dkI += dZ^T Q.
// Every gradient element is written by one thread in a fixed order: no atomics.
//
// Top-k. A block per row over its candidates [lo(t), t] (the CPU's order:
// larger score, on a tie the later position): the scores as unsigned keys in
// the same order (-0 as +0), the K-th largest key found a digit of 8 bits
// at a time from the top (a radix select: a shared-memory histogram of the
// digit over the keys that share the higher digits, 4 passes over the row in
// float32, where a bit at a time took up to 32), then one ordered pass
// (block scans of each thread's counts) keeps every key above it and, of the
// keys equal to it, the latest ones; positions come out ascending, -1
// padded. The same set as dsa_topk_row, exactly. The passes read the row in
// vectors of 16 bytes, several in flight per thread. Decoding's few rows get
// blocks of 1024 threads, and a long one (16,384 keys or more) segments of
// 4,096 keys, a block each, whose picks one block then narrows to K.
#include <math.h>

#include "dsa_common.cuh"

#define IX_T 32          // queries and keys per tile
#define IX_THREADS 256   // 8 warps
#define IX_ROWS (IX_T / (IX_THREADS / 32))   // query rows per thread: 4
#define TK_THREADS 256       // a block per row of the training's top-k and a window's rows
#define TK_DEC_THREADS 1024  // a block per row of a decoding step (a few rows: few blocks)
#define TK_DIGIT 8           // the top-k's radix: bits of a digit, and its histogram's bins
#define TK_BINS (1 << TK_DIGIT)
#define SMEM_CACHE_BYTES (40 * 1024)          // a row kept in shared memory up to this size (with the
                                              // kernels' static arrays, under the default 48 KB)
#define SELECT_CHUNK ((int64_t)1 << 24)       // reals of scores per block of rows in dsa_index_select

typedef struct IxDims {
    int T, HI, dI;
    real c;   // 1 / sqrt(dI)
} IxDims;

// ---------------------------------------------------------------- scores

// z[r] = qI_(t, j) . kI_s for the thread's rows t = tq0 + ty + 8 r and key
// s = s0 + tx of the tile (0 outside nq x ns). All threads; begins with a barrier.
__device__ __forceinline__ void ix_tile_z(real z[IX_ROWS], const real *qI, const real *kI, int64_t rb, int tq0,
                                          int nq, int s0, int ns, int j, const IxDims &d, real (*Qs)[IX_T + 1],
                                          real (*Ks)[IX_T + 1]) {
    int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < IX_ROWS; r++) z[r] = 0;
    for (int d0 = 0; d0 < d.dI; d0 += IX_T) {
        int nd = min(IX_T, d.dI - d0);
        __syncthreads();   // the previous chunk (or the caller's use of the tiles) is done
        for (int e = threadIdx.x; e < IX_T * IX_T; e += IX_THREADS) {
            int i = e / IX_T, x = e % IX_T;
            Qs[i][x] = i < nq && x < nd ? qI[((rb + tq0 + i) * d.HI + j) * d.dI + d0 + x] : (real)0;
            Ks[i][x] = i < ns && x < nd ? kI[(rb + s0 + i) * d.dI + d0 + x] : (real)0;
        }
        __syncthreads();
        for (int x = 0; x < nd; x++) {
            real kv = Ks[tx][x];
#pragma unroll
            for (int r = 0; r < IX_ROWS; r++) z[r] = fma(Qs[ty + 8 * r][x], kv, z[r]);
        }
    }
}

// grid (key tiles, query tiles of rows t_begin .. t_begin+nt, nb batch rows
// from b0). out: (nb, nt, T). full: every entry of the rows is written (0
// outside [lo(t), t]); else only the tiles that hold candidates are (the
// top-k reads [lo(t), t] only).
__global__ void __launch_bounds__(IX_THREADS)
    k_ix_scores(IxDims d, const real *qI, const real *kI, const real *w, const int *first, real *out, int b0,
                int t_begin, int nt, bool full) {
    __shared__ real Qs[IX_T][IX_T + 1], Ks[IX_T][IX_T + 1];
    int b = b0 + blockIdx.z, tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    int tq0 = t_begin + blockIdx.y * IX_T, nq = min(IX_T, t_begin + nt - tq0);
    int s0 = blockIdx.x * IX_T, ns = min(IX_T, d.T - s0);
    int64_t rb = (int64_t)b * d.T;
    real *ob = out + ((int64_t)blockIdx.z * nt + (tq0 - t_begin)) * d.T;
    // Documents begin in order, so the tile's first row has the earliest lo.
    bool skip = s0 > tq0 + nq - 1 || s0 + ns <= dsa_lo(first, rb + tq0);
    if (skip && !full) return;
    real acc[IX_ROWS];
#pragma unroll
    for (int r = 0; r < IX_ROWS; r++) acc[r] = 0;
    if (!skip)
        for (int j = 0; j < d.HI; j++) {
            real z[IX_ROWS];
            ix_tile_z(z, qI, kI, rb, tq0, nq, s0, ns, j, d, Qs, Ks);
#pragma unroll
            for (int r = 0; r < IX_ROWS; r++) {
                int i = ty + 8 * r;
                if (i < nq) {
                    real wt = w[(rb + tq0 + i) * d.HI + j];
                    acc[r] += z[r] > 0 ? d.c * wt * z[r] : (real)0;
                }
            }
        }
#pragma unroll
    for (int r = 0; r < IX_ROWS; r++) {
        int i = ty + 8 * r, t = tq0 + i, s = s0 + tx;
        if (i >= nq || tx >= ns) continue;
        bool in = dsa_seen(first, rb, t, s);
        if (in || full) ob[(int64_t)i * d.T + s] = in ? acc[r] : (real)0;
    }
}

// grid (query tiles, B): dqI and dw of the tile's rows (written when fresh, else added).
__global__ void __launch_bounds__(IX_THREADS)
    k_ix_dq(IxDims d, const real *qI, const real *kI, const real *w, const real *g, const int *first, real *gq,
            bool fq, real *gw, bool fw) {
    __shared__ real Qs[IX_T][IX_T + 1], Ks[IX_T][IX_T + 1], DZ[IX_T][IX_T + 1];
    int b = blockIdx.y, tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    int tq0 = blockIdx.x * IX_T, nq = min(IX_T, d.T - tq0);
    int64_t rb = (int64_t)b * d.T;
    int s_begin = dsa_lo(first, rb + tq0) / IX_T * IX_T, s_end = tq0 + nq;
    for (int j = 0; j < d.HI; j++) {
        double dw[IX_ROWS];
#pragma unroll
        for (int r = 0; r < IX_ROWS; r++) dw[r] = 0;
        for (int s0 = s_begin; s0 < s_end; s0 += IX_T) {
            int ns = min(IX_T, d.T - s0);
            real z[IX_ROWS];
            ix_tile_z(z, qI, kI, rb, tq0, nq, s0, ns, j, d, Qs, Ks);
#pragma unroll
            for (int r = 0; r < IX_ROWS; r++) {
                int i = ty + 8 * r, t = tq0 + i, s = s0 + tx;
                bool in = i < nq && tx < ns && dsa_seen(first, rb, t, s);
                real gv = in ? g[(rb + t) * d.T + s] : (real)0;
                bool on = in && z[r] > 0;
                double part = on ? (double)gv * z[r] : 0.0;
                for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
                dw[r] += part;
                DZ[i][tx] = on ? d.c * w[(rb + t) * d.HI + j] * gv : (real)0;
            }
            __syncthreads();
            if (gq)
                for (int e = threadIdx.x; e < IX_T * d.dI; e += IX_THREADS) {
                    int i = e / d.dI, x = e % d.dI;
                    if (i >= nq) continue;
                    real acc = 0;
                    for (int c = 0; c < ns; c++) acc = fma(DZ[i][c], kI[(rb + s0 + c) * d.dI + x], acc);
                    real *p = gq + ((rb + tq0 + i) * d.HI + j) * d.dI + x;
                    *p = s0 == s_begin && fq ? acc : *p + acc;
                }
            // (the next ix_tile_z begins with a barrier: DZ is read before it is rewritten)
        }
        if (gw && tx == 0)
#pragma unroll
            for (int r = 0; r < IX_ROWS; r++) {
                int i = ty + 8 * r;
                if (i >= nq) continue;
                real *p = gw + (rb + tq0 + i) * d.HI + j, v = (real)(d.c * dw[r]);
                *p = fw ? v : *p + v;
            }
    }
}

// grid (key tiles, B): dkI of the tile's keys, over every query tile that
// sees one of them, the query tiles and the heads in order.
__global__ void __launch_bounds__(IX_THREADS)
    k_ix_dk(IxDims d, const real *qI, const real *kI, const real *w, const real *g, const int *first, real *gk,
            bool fk) {
    __shared__ real Qs[IX_T][IX_T + 1], Ks[IX_T][IX_T + 1], DZ[IX_T][IX_T + 1];
    int b = blockIdx.y, tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    int s0 = blockIdx.x * IX_T, ns = min(IX_T, d.T - s0);
    int64_t rb = (int64_t)b * d.T;
    bool first_pass = true;
    for (int tq0 = s0; tq0 < d.T; tq0 += IX_T) {
        // Every later row's document begins at or after this row's: none sees the tile.
        if (dsa_lo(first, rb + tq0) > s0 + ns - 1) break;
        int nq = min(IX_T, d.T - tq0);
        for (int j = 0; j < d.HI; j++) {
            real z[IX_ROWS];
            ix_tile_z(z, qI, kI, rb, tq0, nq, s0, ns, j, d, Qs, Ks);
#pragma unroll
            for (int r = 0; r < IX_ROWS; r++) {
                int i = ty + 8 * r, t = tq0 + i, s = s0 + tx;
                bool in = i < nq && tx < ns && dsa_seen(first, rb, t, s);
                real gv = in ? g[(rb + t) * d.T + s] : (real)0;
                DZ[i][tx] = in && z[r] > 0 ? d.c * w[(rb + t) * d.HI + j] * gv : (real)0;
            }
            __syncthreads();
            for (int e = threadIdx.x; e < IX_T * d.dI; e += IX_THREADS) {
                int c = e / d.dI, x = e % d.dI;
                if (c >= ns) continue;
                real acc = 0;
                for (int i = 0; i < nq; i++) acc = fma(DZ[i][c], qI[((rb + tq0 + i) * d.HI + j) * d.dI + x], acc);
                real *p = gk + (rb + s0 + c) * d.dI + x;
                *p = first_pass && fk ? acc : *p + acc;
            }
            first_pass = false;
        }
    }
}

static IxDims ix_dims(int T, int HI, int dI) {
    IxDims d = {T, HI, dI, (real)(1.0 / sqrt((double)dI))};
    return d;
}

// Scores of rows t_begin .. t_begin+nt of nb batch rows from b0 into out (nb, nt, T).
static void ix_scores(real *out, const real *qI, const real *kI, const real *w, const int *first, int b0, int nb,
                      int t_begin, int nt, int T, int HI, int dI, bool full) {
    ASSERT(nb <= 65535, "dsa_index_scores: %d batch rows exceed the GPU grid", nb);
    int key_end = full ? T : t_begin + nt;   // only full rows need the zeros after the last query
    dim3 grid((unsigned)((key_end + IX_T - 1) / IX_T), (unsigned)((nt + IX_T - 1) / IX_T), (unsigned)nb);
    k_ix_scores<<<grid, IX_THREADS, 0, cu_stream>>>(ix_dims(T, HI, dI), qI, kI, w, first, out, b0, t_begin, nt,
                                                    full);
    CU_LAUNCHED();
}

// iarg: 0 B, 1 T, 2 HI, 3 dI. aux: first (B, T) on the host, or NULL.
extern "C" void cu_dsa_index_forward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], HI = n->iarg[2], dI = n->iarg[3];
    if ((int64_t)B * T == 0) return;
    const int *first = dsa_first_to_device(n->tape, (const int *)n->aux, B, T);
    ix_scores(n->out[0]->data, n->in[0]->data, n->in[1]->data, n->in[2]->data, first, 0, B, 0, T, T, HI, dI, true);
}

extern "C" void cu_dsa_index_backward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], HI = n->iarg[2], dI = n->iarg[3];
    bool fq = false, fk = false, fw = false;
    real *gq = CU_GRAD_FRESH(n, 0, &fq), *gk = CU_GRAD_FRESH(n, 1, &fk), *gw = CU_GRAD_FRESH(n, 2, &fw);
    if ((!gq && !gk && !gw) || (int64_t)B * T == 0) return;
    ASSERT(B <= 65535, "dsa_index_scores backward: %d batch rows exceed the GPU grid", B);
    const int *first = dsa_first_to_device(n->tape, (const int *)n->aux, B, T);
    const real *qI = n->in[0]->data, *kI = n->in[1]->data, *w = n->in[2]->data, *g = n->out[0]->grad;
    IxDims d = ix_dims(T, HI, dI);
    dim3 grid((unsigned)((T + IX_T - 1) / IX_T), (unsigned)B);
    // dq and dw first, then dk: a tensor passed as two inputs gets its fresh
    // write from the first kernel and the add from the second.
    if (gq || gw) {
        k_ix_dq<<<grid, IX_THREADS, 0, cu_stream>>>(d, qI, kI, w, g, first, gq, fq, gw, fw);
        CU_LAUNCHED();
    }
    if (gk) {
        k_ix_dk<<<grid, IX_THREADS, 0, cu_stream>>>(d, qI, kI, w, g, first, gk, fk);
        CU_LAUNCHED();
    }
}

// ---------------------------------------------------------------- top-k

// Scores as unsigned integers in the same order (non-NaN), -0 as +0 (as dsa_kernel.c).
#ifdef AG_DOUBLE
typedef unsigned long long rkey_t;
__device__ __forceinline__ rkey_t tk_key(real x) {
    x += 0;
    rkey_t b = (rkey_t)__double_as_longlong(x), sign = 1ull << 63;
    return b & sign ? ~b : b | sign;
}
#else
typedef unsigned int rkey_t;
__device__ __forceinline__ rkey_t tk_key(real x) {
    x += 0;
    rkey_t b = __float_as_uint(x), sign = 1u << 31;
    return b & sign ? ~b : b | sign;
}
#endif

// The exclusive sum of v over the threads before this one (thread order) and
// the block's total. Begins with a barrier; shm: 32 ints.
__device__ __forceinline__ int tk_scan_count(int v, int *total, int *shm) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int incl = v;   // inclusive sum within the warp
    for (int o = 1; o < 32; o <<= 1) {
        int x = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += x;
    }
    __syncthreads();
    if (lane == 31) shm[warp] = incl;
    __syncthreads();
    int pre = 0, tot = 0;
    for (int w = 0; w < nw; w++) {
        int c = shm[w];
        if (w < warp) pre += c;
        tot += c;
    }
    *total = tot;
    return pre + incl - v;
}

// The digit d of the histogram hist (TK_BINS counts, by digit) where the
// count from the top reaches rest: keys of digits above d < rest <= keys of
// digits >= d. Warp 0 finds it (lane l sums bins 8l .. 8l+7, a suffix scan
// over the lanes) and writes *digit and *above (the keys of digits above d).
// Every thread; ends with a barrier. At least rest keys are counted.
__device__ __forceinline__ void tk_find_digit(const int *hist, int rest, int *digit, int *above) {
    if (threadIdx.x < 32) {
        int lane = threadIdx.x, per = TK_BINS / 32, mine = 0;
        for (int j = 0; j < per; j++) mine += hist[lane * per + j];
        int suffix = mine;   // keys of lanes >= this one
        for (int o = 1; o < 32; o <<= 1) {
            int v = __shfl_down_sync(0xffffffffu, suffix, o);
            if (lane + o < 32) suffix += v;
        }
        int cum = suffix - mine;   // keys of digits above this lane's bins
        if (cum < rest && rest <= suffix)
            for (int j = per - 1; j >= 0; j--) {
                int c = hist[lane * per + j];
                if (cum + c >= rest) {
                    *digit = lane * per + j;
                    *above = cum;
                    break;
                }
                cum += c;
            }
    }
    __syncthreads();
}

// A row's keys in vectors of 16 bytes (TK_VEC keys), so that each thread has
// several loads in flight: group g holds keys g*TK_VEC - mis .. + TK_VEC-1 of
// the row, mis (< TK_VEC) the row's offset from a 16-byte boundary; keys
// outside 0 .. n-1 are not valid. From the scores (global memory, read whole
// vectors: no vector crosses an allocation's end) or from the keys kept in
// shared memory at index i + mis.
#define TK_VEC (16 / (int)sizeof(real))
struct __align__(16) TkRealVec {
    real x[TK_VEC];
};
struct __align__(16) TkKeyVec {
    rkey_t x[TK_VEC];
};
struct TkRow {
    const real *base;   // the row's scores minus mis (16-byte aligned)
    const rkey_t *kept;   // the keys in shared memory, or NULL
    int n, mis, groups;
};

__device__ __forceinline__ void tk_group(const TkRow &r, int g, rkey_t k[TK_VEC], bool ok[TK_VEC]) {
    if (r.kept) {
        TkKeyVec v = ((const TkKeyVec *)r.kept)[g];
        for (int u = 0; u < TK_VEC; u++) k[u] = v.x[u];
    } else {
        TkRealVec v = ((const TkRealVec *)r.base)[g];
        for (int u = 0; u < TK_VEC; u++) k[u] = tk_key(v.x[u]);
    }
    for (int u = 0; u < TK_VEC; u++) {
        int i = g * TK_VEC + u - r.mis;
        ok[u] = i >= 0 && i < r.n;
    }
}

// One row's top K, by the whole block: candidates row[0 .. n) at positions
// lo .. lo+n-1, the selection (K, ascending, -1 padded) into out. keys:
// dynamic shared memory for cache_n keys (a multiple of TK_VEC; the row's are
// kept there when they fit with the row's misalignment); shm: 32 ints. Any
// block size of whole warps up to 1024.
__device__ void topk_one(const real *row, int n, int lo, int K, int *out, rkey_t *keys, int cache_n, int *shm) {
    __shared__ int hist[TK_BINS];
    __shared__ int found[2];   // the digit, the keys of digits above it
    int tid = threadIdx.x, nthr = blockDim.x;
    if (n <= K) {   // every candidate
        for (int j = tid; j < K; j += nthr) out[j] = j < n ? lo + j : -1;
        return;
    }
    TkRow r;
    r.mis = (int)(((uintptr_t)row / sizeof(real)) % TK_VEC);
    r.base = row - r.mis;
    r.n = n;
    r.groups = (n + r.mis + TK_VEC - 1) / TK_VEC;
    r.kept = NULL;
    if (r.groups * TK_VEC <= cache_n) {
        for (int g = tid; g < r.groups; g += nthr) {
            TkRealVec v = ((const TkRealVec *)r.base)[g];
            for (int u = 0; u < TK_VEC; u++) keys[g * TK_VEC + u] = tk_key(v.x[u]);
        }
        __syncthreads();
        r.kept = keys;
    }
    // th = the K-th largest key, TK_DIGIT bits at a time from the top: a histogram of the next digit over the keys
    // whose higher digits equal th's, then the digit where the count from the top reaches the keys still wanted.
    // After the last digit, K - rest keys are above th and hist[digit] equal it.
    rkey_t th = 0, mask = 0;
    int rest = K, eq = 0;
    for (int shift = 8 * (int)sizeof(rkey_t) - TK_DIGIT; shift >= 0; shift -= TK_DIGIT) {
        for (int j = tid; j < TK_BINS; j += nthr) hist[j] = 0;
        __syncthreads();
        // Two groups per thread at a time: loads in flight. (Adding once per warp for lanes of the same bin,
        // by __match_any_sync, measured slower on an H200: 0.40 against 0.35 ms per step at 131,072 keys.)
        for (int g0 = tid; g0 < r.groups; g0 += 2 * nthr) {
            rkey_t k[2][TK_VEC];
            bool ok[2][TK_VEC];
            for (int h = 0; h < 2; h++) {
                int g = g0 + h * nthr;
                if (g < r.groups) tk_group(r, g, k[h], ok[h]);
                else
                    for (int u = 0; u < TK_VEC; u++) ok[h][u] = false;
            }
            for (int h = 0; h < 2; h++)
                for (int u = 0; u < TK_VEC; u++)
                    if (ok[h][u] && (k[h][u] & mask) == th)
                        atomicAdd(&hist[(int)(k[h][u] >> shift) & (TK_BINS - 1)], 1);
        }
        __syncthreads();
        tk_find_digit(hist, rest, &found[0], &found[1]);
        int d = found[0];
        rest -= found[1];
        eq = hist[d];
        th |= (rkey_t)d << shift;
        mask |= (rkey_t)(TK_BINS - 1) << shift;
        __syncthreads();   // hist and found are read before the next digit clears them
    }
    // The ordered pass: a tile of nthr groups at a time, thread tid's group its TK_VEC keys in position order, so
    // thread order is position order: a scan of the threads' ties and of their kept keys places each kept key.
    int skip = eq - rest;   // the earliest ties stay out
    int base = 0, ties = 0;
    for (int c0 = 0; c0 < r.groups; c0 += nthr) {
        int g = c0 + tid, my_eq = 0, n_eq, n_keep;
        rkey_t k[TK_VEC];
        bool ok[TK_VEC];
        if (g < r.groups) tk_group(r, g, k, ok);
        else
            for (int u = 0; u < TK_VEC; u++) ok[u] = false;
        for (int u = 0; u < TK_VEC; u++) my_eq += ok[u] && k[u] == th;
        int tie = ties + tk_scan_count(my_eq, &n_eq, shm), my_keep = 0;
        bool keep[TK_VEC];
        for (int u = 0; u < TK_VEC; u++) {
            keep[u] = ok[u] && (k[u] > th || (k[u] == th && tie++ >= skip));
            my_keep += keep[u];
        }
        int at = base + tk_scan_count(my_keep, &n_keep, shm);
        for (int u = 0; u < TK_VEC; u++)
            if (keep[u]) out[at++] = lo + g * TK_VEC + u - r.mis;
        base += n_keep;
        ties += n_eq;
    }
}

// Keys kept in shared memory for rows of up to n candidates: room for the
// longest row and its misalignment, a whole number of vectors, at most SMEM_CACHE_BYTES.
static int tk_cache_keys(int n) {
    int most = (int)(SMEM_CACHE_BYTES / sizeof(rkey_t)), want = (n + 2 * TK_VEC - 1) / TK_VEC * TK_VEC;
    return want < most ? want : most;
}

// A block per row: row l of nb x nt rows (batch b0 + l / nt, position
// t_begin + l % nt), its scores at S + l lds (position s at [s]); the
// selection into sel (B, T, K). cache_n: the longest row whose keys are kept
// in the dynamic shared memory.
__global__ void __launch_bounds__(TK_THREADS)
    k_topk(const real *S, int64_t lds, int T, int K, const int *first, int b0, int t_begin, int nt, int *sel,
           int cache_n) {
    extern __shared__ __align__(16) unsigned char tk_smem[];
    __shared__ int shm[32];
    int64_t l = blockIdx.x;
    int b = b0 + (int)(l / nt), t = t_begin + (int)(l % nt);
    int64_t r = (int64_t)b * T + t;
    int lo = dsa_lo(first, r);
    topk_one(S + l * lds + lo, t + 1 - lo, lo, K, sel + r * K, (rkey_t *)tk_smem, cache_n, shm);
}

static void topk_rows(int *sel, const real *S, int64_t lds, int T, int K, const int *first, int b0, int nb,
                      int t_begin, int nt) {
    int64_t rows = (int64_t)nb * nt;
    if (rows == 0) return;
    int cache_n = tk_cache_keys(T);
    k_topk<<<(unsigned)rows, TK_THREADS, (size_t)cache_n * sizeof(rkey_t), cu_stream>>>(S, lds, T, K, first, b0,
                                                                                        t_begin, nt, sel, cache_n);
    CU_LAUNCHED();
}

extern "C" void cu_dsa_topk(int *sel, const real *Isc, int B, int T, int K, const int *first) {
    ASSERT(K >= 1, "dsa_topk: K = %d", K);
    topk_rows(sel, Isc, T, T, K, first, 0, B, 0, T);
}

// The scores in blocks of rows (at most SELECT_CHUNK reals of scratch: whole
// batch rows when T^2 fits, else runs of query rows of one batch row), each
// block's top-k after it. The scratch is reused: the stream orders the blocks.
extern "C" void cu_dsa_index_select(Tape *tp, int *sel, const real *qI, const real *kI, const real *w, int B, int T,
                                    int HI, int dI, int K, const int *first) {
    ASSERT(K >= 1, "dsa_index_select: K = %d", K);
    if ((int64_t)B * T == 0) return;
    int64_t per_batch = (int64_t)T * T;
    int nb = per_batch <= SELECT_CHUNK ? (int)imin(B, (int)(SELECT_CHUNK / per_batch)) : 1;
    if (nb > 65535) nb = 65535;
    int nt = nb > 1 || per_batch <= SELECT_CHUNK ? T : (int)imax(IX_T, (int)(SELECT_CHUNK / T / IX_T * IX_T));
    real *scratch = (real *)tape_dalloc(tp, (size_t)nb * nt * T * sizeof(real));
    for (int b0 = 0; b0 < B; b0 += nb) {
        int bn = imin(nb, B - b0);
        for (int t0 = 0; t0 < T; t0 += nt) {
            int tn = imin(nt, T - t0);
            ix_scores(scratch, qI, kI, w, first, b0, bn, t0, tn, T, HI, dI, false);
            topk_rows(sel, scratch, T, T, K, first, b0, bn, t0, tn);
        }
    }
}

// ---------------------------------------------------------------- distillation target, KL, mass

// scale q . k_s over dk (one thread, the dimensions in order).
__device__ __forceinline__ real at_score(const real *qs, const real *ks, int dk, real scale) {
    real acc = 0;
    for (int x = 0; x < dk; x++) acc = fma(qs[x], ks[x], acc);
    return acc * scale;
}

// A block per row r = (b, t): p_t = (1/H) sum_h softmax over [lo(t), t] of
// scale q_t^h . k_s^h, 0 elsewhere; the heads in order, each entry written
// by one thread. Dynamic shared memory: q_t^h (dk), then the row's scores
// (T) when `cached` (else they are recomputed in each pass).
__global__ void __launch_bounds__(DSA_THREADS)
    k_attn_target(const real *q, const real *k, const int *first, int T, int H, int dk, real scale, bool cached,
                  real *p) {
    extern __shared__ __align__(16) unsigned char at_smem[];
    real *qs = (real *)at_smem, *Ss = qs + dk;
    __shared__ real shr[32];
    __shared__ double shd[32];
    int64_t r = blockIdx.x, b = r / T, ld = (int64_t)H * dk;
    int t = (int)(r % T), lo = dsa_lo(first, r), tid = threadIdx.x;
    real *pr = p + r * T;
    for (int h = 0; h < H; h++) {
        __syncthreads();   // qs (and Ss) of the previous head are read
        for (int x = tid; x < dk; x += DSA_THREADS) qs[x] = q[r * ld + h * dk + x];
        __syncthreads();
        const real *kh = k + b * T * ld + h * dk;
        real mx = -INFINITY;
        for (int s = lo + tid; s <= t; s += DSA_THREADS) {
            real acc = at_score(qs, kh + (int64_t)s * ld, dk, scale);
            if (cached) Ss[s] = acc;
            mx = acc > mx ? acc : mx;
        }
        mx = cu_block_max(mx, shr);
#define AT_S(s) (cached ? Ss[s] : at_score(qs, kh + (int64_t)(s) * ld, dk, scale))
        double sum = 0;
        for (int s = lo + tid; s <= t; s += DSA_THREADS) sum += exp((double)AT_S(s) - (double)mx);
        sum = cu_block_sum(sum, shd);
        double inv = 1.0 / (sum * H);
        for (int s = tid; s < T; s += DSA_THREADS) {
            real v = s >= lo && s <= t ? (real)(exp((double)AT_S(s) - (double)mx) * inv) : (real)0;
            pr[s] = h == 0 ? v : pr[s] + v;
        }
#undef AT_S
    }
}

extern "C" void cu_dsa_attn_target(real *p, const real *q, const real *k, int B, int T, int H, int dk, double scale,
                                   const int *first) {
    int64_t rows = (int64_t)B * T;
    if (rows == 0) return;
    size_t smem = (size_t)(dk + T) * sizeof(real);
    bool cached = smem <= SMEM_CACHE_BYTES;
    if (!cached) smem = (size_t)dk * sizeof(real);
    ASSERT(smem <= SMEM_CACHE_BYTES, "dsa_attn_target: head dim dk %d is too large for the GPU kernel", dk);
    k_attn_target<<<(unsigned)rows, DSA_THREADS, smem, cu_stream>>>(q, k, first, T, H, dk, (real)scale, cached, p);
    CU_LAUNCHED();
}

// A block per row: the row's KL over [lo(t), t] (double) into row_loss, its
// log-sum-exp into lse (when not NULL).
__global__ void __launch_bounds__(DSA_THREADS)
    k_kl_fwd(const real *I, const real *p, const int *first, int T, double *row_loss, real *lse_out) {
    __shared__ real shr[32];
    __shared__ double shd[32];
    int64_t r = blockIdx.x;
    int t = (int)(r % T), lo = dsa_lo(first, r), tid = threadIdx.x;
    const real *Ir = I + r * T, *pr = p + r * T;
    real mx = -INFINITY;
    for (int s = lo + tid; s <= t; s += DSA_THREADS) mx = Ir[s] > mx ? Ir[s] : mx;
    mx = cu_block_max(mx, shr);
    double sum = 0;
    for (int s = lo + tid; s <= t; s += DSA_THREADS) sum += exp((double)Ir[s] - (double)mx);
    sum = cu_block_sum(sum, shd);
    double lse = (double)mx + log(sum), kl = 0;
    for (int s = lo + tid; s <= t; s += DSA_THREADS)
        if (pr[s] > 0) kl += (double)pr[s] * (log((double)pr[s]) - ((double)Ir[s] - lse));
    kl = cu_block_sum(kl, shd);
    if (tid == 0) {
        row_loss[r] = kl;
        if (lse_out) lse_out[r] = (real)lse;
    }
}

// iarg: 0 B, 1 T; aux: first (host) or NULL; saved: lse (B*T) or NULL.
extern "C" void cu_dsa_kl_forward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1];
    int64_t rows = (int64_t)B * T;
    double *row_loss = (double *)tape_dalloc(n->tape, (size_t)(rows > 0 ? rows : 1) * sizeof(double));
    if (rows > 0) {
        const int *first = dsa_first_to_device(n->tape, (const int *)n->aux, B, T);
        k_kl_fwd<<<(unsigned)rows, DSA_THREADS, 0, cu_stream>>>(n->in[0]->data, n->in[1]->data, first, T, row_loss,
                                                               (real *)n->saved);
        CU_LAUNCHED();
    }
    k_dsa_mean<<<1, 1024, 0, cu_stream>>>(row_loss, rows, n->out[0]->data);
    CU_LAUNCHED();
}

// A block per row: gI_ts = g (softmax(I_t)_s m_t - p_ts) on [lo(t), t], m_t = sum_s p_ts;
// 0 elsewhere when fresh (else nothing is added there).
__global__ void __launch_bounds__(DSA_THREADS)
    k_kl_bwd(const real *I, const real *p, const real *lse, const int *first, int T, double inv_rows,
             const real *gout, real *gI, bool fresh) {
    __shared__ double shd[32];
    int64_t r = blockIdx.x;
    int t = (int)(r % T), lo = dsa_lo(first, r), tid = threadIdx.x;
    const real *Ir = I + r * T, *pr = p + r * T;
    double g = (double)gout[0] * inv_rows, mass = 0;
    for (int s = lo + tid; s <= t; s += DSA_THREADS) mass += pr[s];
    mass = cu_block_sum(mass, shd);
    real *gr = gI + r * T;
    for (int s = tid; s < T; s += DSA_THREADS) {
        if (s >= lo && s <= t) {
            real v = (real)(g * (exp((double)(Ir[s] - lse[r])) * mass - pr[s]));
            gr[s] = fresh ? v : gr[s] + v;
        } else if (fresh) {
            gr[s] = 0;
        }
    }
}

extern "C" void cu_dsa_kl_backward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1];
    bool fresh = false;
    real *gI = CU_GRAD_FRESH(n, 0, &fresh);
    int64_t rows = (int64_t)B * T;
    if (!gI || rows == 0) return;
    const int *first = dsa_first_to_device(n->tape, (const int *)n->aux, B, T);
    k_kl_bwd<<<(unsigned)rows, DSA_THREADS, 0, cu_stream>>>(n->in[0]->data, n->in[1]->data, (const real *)n->saved,
                                                           first, T, 1.0 / (double)rows, n->out[0]->grad, gI, fresh);
    CU_LAUNCHED();
}

// out[0] = mean over rows of sum_j p[r, sel_rj] (one block, a fixed order).
__global__ void __launch_bounds__(1024) k_sel_mass(const real *p, const int *sel, int64_t rows, int T, int K,
                                                   double *out) {
    __shared__ double shd[32];
    double acc = 0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
        for (int j = 0; j < K; j++) {
            int s = sel[r * K + j];
            if (s >= 0) acc += p[r * T + s];
        }
    acc = cu_block_sum(acc, shd);
    if (threadIdx.x == 0) out[0] = rows > 0 ? acc / (double)rows : 0.0;
}

extern "C" void cu_dsa_selected_mass(double *out, const real *p, const int *sel, int B, int T, int K) {
    k_sel_mass<<<1, 1024, 0, cu_stream>>>(p, sel, (int64_t)B * T, T, K, out);
    CU_LAUNCHED();
}

// ---------------------------------------------------------------- decoding

// Queries r0 + blockIdx.y of a window of T0 per batch row (r = b T0 + t,
// slot pos + t, qI (., HI*dI) and w (., HI) by r), DEC_LANES lanes per cached
// key s of row b in [start_b, pos + t]: scores[blockIdx.y, s] = c sum_j w_rj
// ReLU(qI_rj . kI_bs), in double. Lane l of a key sums dimensions l, l + 8,
// ..., then the key's lanes add theirs (a fixed tree), so that a warp's load
// reads 4 keys' consecutive dimensions, not one dimension of 32 keys' rows.
// kIc: (B, max_T, dI). Decoding is the window of one query at slot
// pos = n_keys - 1.
#define DEC_LANES 8
__global__ void k_dec_scores(const real *qI, const real *w, const real *kIc, const int *start, int max_T, int pos,
                             int T0, int64_t r0, int HI, int dI, double c, real *scores) {
    int64_t r = r0 + blockIdx.y;
    int b = (int)(r / T0), t = (int)(r % T0), lane = threadIdx.x & 31, sub = lane & (DEC_LANES - 1);
    int s = start[b] + (int)((blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / DEC_LANES);
    if (s > pos + t) return;   // the key's lanes leave together: the shuffles below are within a key's lanes
    unsigned lanes = ((1u << DEC_LANES) - 1) << (lane - sub);
    const real *ks = kIc + ((int64_t)b * max_T + s) * dI, *q = qI + r * HI * dI, *wb = w + r * HI;
    double acc = 0;
    for (int j = 0; j < HI; j++) {
        double z = 0;
        for (int i = sub; i < dI; i += DEC_LANES) z += (double)q[j * dI + i] * ks[i];
        for (int o = DEC_LANES / 2; o > 0; o >>= 1) z += __shfl_xor_sync(lanes, z, o, DEC_LANES);
        if (z > 0) acc += wb[j] * z;
    }
    if (sub == 0) scores[(int64_t)blockIdx.y * max_T + s] = (real)(c * acc);
}

// Query r = r0 + l of a window of T0 per batch row (slot pos + t): its candidates are slots lo .. lo + n - 1.
__device__ __forceinline__ void dec_row(const int *start, int pos, int T0, int64_t r, int *lo, int *n) {
    int b = (int)(r / T0), t = (int)(r % T0);
    *lo = start[b];
    *n = pos + t + 1 - *lo;
}

// A block per query of k_dec_scores' rows: its top K of slots [start_b, pos + t] into sel (rows of K, by r).
__global__ void __launch_bounds__(TK_DEC_THREADS)
    k_dec_topk(const real *scores, const int *start, int max_T, int pos, int T0, int64_t r0, int K, int *sel,
               int cache_n) {
    extern __shared__ __align__(16) unsigned char tk_smem[];
    __shared__ int shm[32];
    int64_t r = r0 + blockIdx.x;
    int lo, n;
    dec_row(start, pos, T0, r, &lo, &n);
    topk_one(scores + (int64_t)blockIdx.x * max_T + lo, n, lo, K, sel + r * K, (rkey_t *)tk_smem, cache_n, shm);
}

// A decoding step's long rows split over several blocks (dec_topk_split):
// segments of seg keys, each's top K by a block (k_dec_topk_seg), then a
// block per row picks the top K of the segments' picks (k_dec_topk_merge).
// One block per row left the GPU's other SMs idle: at 131,072 keys its
// top-64 took ~40 us of a 0.29 ms step.
#define TK_SPLIT_MIN 16384   // rows at least this long split
#define TK_SPLIT_SEG 4096    // keys per segment (at least K, a multiple of TK_VEC)

// Row l's segment blockIdx.x: its top K (positions ascending, -1 padded: only
// a segment shorter than K pads) into cand + (l * nseg + blockIdx.x) K.
__global__ void __launch_bounds__(TK_THREADS)
    k_dec_topk_seg(const real *scores, const int *start, int max_T, int pos, int T0, int64_t r0, int K, int seg,
                   int nseg, int *cand, int cache_n) {
    extern __shared__ __align__(16) unsigned char tk_smem[];
    __shared__ int shm[32];
    int64_t l = blockIdx.y;
    int lo, n, a = blockIdx.x * seg;
    dec_row(start, pos, T0, r0 + l, &lo, &n);
    if (a >= n) return;
    int m = n - a < seg ? n - a : seg;
    topk_one(scores + l * max_T + lo + a, m, lo + a, K, cand + (l * nseg + blockIdx.x) * K, (rkey_t *)tk_smem,
             cache_n, shm);
}

// Row l: the top K of its segments' picks into sel. The picks are in position
// order (segments in order, each ascending) and only the last segment may
// pad, so they are a prefix of cand's row; their scores go to vals, and the
// top K of those, by topk_one over the picks' indices (idx), is the top K of
// the row: a key in the row's top K is in its segment's, and the ties' rule
// (the later position) is the later index among the picks. The same set as
// one block over the row.
__global__ void __launch_bounds__(TK_DEC_THREADS)
    k_dec_topk_merge(const real *scores, const int *start, int max_T, int pos, int T0, int64_t r0, int K, int seg,
                     int nseg, const int *cand, real *vals, int *idx, int *sel, int cache_n) {
    extern __shared__ __align__(16) unsigned char tk_smem[];
    __shared__ int shm[32];
    int64_t l = blockIdx.x, r = r0 + l;
    int lo, n;
    dec_row(start, pos, T0, r, &lo, &n);
    int full = n / seg, rest = n - full * seg, m = full * K + (rest < K ? rest : K);
    const int *c = cand + l * nseg * K;
    real *v = vals + l * nseg * K;
    int *ix = idx + l * K;
    for (int i = threadIdx.x; i < m; i += blockDim.x) v[i] = scores[l * max_T + c[i]];
    __syncthreads();
    topk_one(v, m, 0, K, ix, (rkey_t *)tk_smem, cache_n, shm);
    __syncthreads();
    for (int j = threadIdx.x; j < K; j += blockDim.x) sel[r * K + j] = ix[j] >= 0 ? c[ix[j]] : -1;
}

// The top K of rows [r0, r0 + n) of a decoding step (scores (n, max_T)) whose
// longest row has n_max keys, by segments (the kernels above); scratch from tp.
static void dec_topk_split(Tape *tp, int *sel, const real *scores, const int *start, int max_T, int pos, int T0,
                           int64_t r0, int n, int n_max, int K) {
    int seg = (int)imax(TK_SPLIT_SEG, (K + TK_VEC - 1) / TK_VEC * TK_VEC), nseg = (n_max + seg - 1) / seg;
    size_t picks = (size_t)n * nseg * K;
    int *cand = (int *)tape_dalloc(tp, picks * sizeof(int)), *idx = (int *)tape_dalloc(tp, (size_t)n * K * sizeof(int));
    real *vals = (real *)tape_dalloc(tp, picks * sizeof(real));
    int cache_seg = tk_cache_keys(seg), cache_merge = tk_cache_keys(nseg * K);
    k_dec_topk_seg<<<dim3((unsigned)nseg, (unsigned)n), TK_THREADS, (size_t)cache_seg * sizeof(rkey_t), cu_stream>>>(
        scores, start, max_T, pos, T0, r0, K, seg, nseg, cand, cache_seg);
    CU_LAUNCHED();
    k_dec_topk_merge<<<(unsigned)n, TK_DEC_THREADS, (size_t)cache_merge * sizeof(rkey_t), cu_stream>>>(
        scores, start, max_T, pos, T0, r0, K, seg, nseg, cand, vals, idx, sel, cache_merge);
    CU_LAUNCHED();
}

// Rows [r0, r0 + n) of a window: their scores into scores (n, max_T), then their top K.
// tp: scratch for a decoding step's long rows (NULL: one block per row always).
static void dec_select_rows(Tape *tp, int *sel, real *scores, const real *qI, const real *w, const real *kIc,
                            int max_T, int pos, int T0, int64_t r0, int n, int n_max, const int *start, int HI, int dI,
                            int K) {
    dim3 grid((unsigned)(((int64_t)n_max * DEC_LANES + DSA_THREADS - 1) / DSA_THREADS), (unsigned)n);
    k_dec_scores<<<grid, DSA_THREADS, 0, cu_stream>>>(qI, w, kIc, start, max_T, pos, T0, r0, HI, dI,
                                                      1.0 / sqrt((double)dI), scores);
    CU_LAUNCHED();
    if (tp && n <= 32 && n_max >= TK_SPLIT_MIN && n_max > K) {
        dec_topk_split(tp, sel, scores, start, max_T, pos, T0, r0, n, n_max, K);
        return;
    }
    int cache_n = tk_cache_keys(max_T);
    // A step's few rows: large blocks (the rows are the only parallelism); a window's many rows: blocks of 256.
    int threads = n <= 32 ? TK_DEC_THREADS : TK_THREADS;
    k_dec_topk<<<(unsigned)n, threads, (size_t)cache_n * sizeof(rkey_t), cu_stream>>>(scores, start, max_T, pos, T0,
                                                                                      r0, K, sel, cache_n);
    CU_LAUNCHED();
}

extern "C" void cu_dsa_decode_select(Tape *tp, int *sel, real *scores, const real *qI, const real *w,
                                     const real *kIc, int B, int max_T, int n_keys, const int *start, int HI, int dI,
                                     int K) {
    ASSERT(K >= 1 && n_keys >= 1 && n_keys <= max_T && B <= 65535,
           "attn_dsa step on the GPU: K %d, %d cached keys of %d, %d rows", K, n_keys, max_T, B);
    dec_select_rows(tp, sel, scores, qI, w, kIc, max_T, n_keys - 1, 1, 0, B, n_keys, start, HI, dI, K);
}

extern "C" void cu_dsa_prefix_select(Tape *tp, int *sel, const real *qI, const real *w, const real *kIc, int B,
                                     int max_T, int pos, int T0, const int *start, int HI, int dI, int K) {
    ASSERT(K >= 1 && T0 >= 1 && pos >= 0 && pos + T0 <= max_T,
           "attn_dsa prefill on the GPU: K %d, a window of %d after %d of %d slots", K, T0, pos, max_T);
    int64_t rows = (int64_t)B * T0;
    // Rows of scores at a time: at most SELECT_CHUNK reals of scratch and 65535 blocks of the grid's y.
    int chunk = (int)imin(65535, (int)imax(1, (int)(SELECT_CHUNK / max_T)));
    if (rows < chunk) chunk = (int)rows;
    real *scores = (real *)tape_dalloc(tp, (size_t)chunk * max_T * sizeof(real));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int n = (int)(rows - r0 < chunk ? rows - r0 : chunk);
        dec_select_rows(NULL, sel, scores, qI, w, kIc, max_T, pos, T0, r0, n, pos + T0, start, HI, dI, K);
    }
}
