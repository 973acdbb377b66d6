// dsa_topk.cu: the DeepSeek sparse-attention indexer's top-k selection on
// the GPU (dsa_kernel.h; the CPU's dsa_topk_row of dsa_kernel.c): per query
// row t, the K positions s in [lo(t), t] of the largest scores I_ts (on a
// tie the later position), from the score matrix (cu_dsa_topk; the fused
// form cu_dsa_index_select is dsa_index.cu's) and for decoding and prefill
// windows from the cached keys (the scores c sum_j w_tj ReLU(qI_tj . kI_s)
// computed here, in double).
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

#define TK_THREADS 256       // a block per row of the training's top-k and a window's rows
#define TK_DEC_THREADS 1024  // a block per row of a decoding step (a few rows: few blocks)
#define TK_DIGIT 8           // the top-k's radix: bits of a digit, and its histogram's bins
#define TK_BINS (1 << TK_DIGIT)

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

void topk_rows(int *sel, const real *S, int64_t lds, int T, int K, const int *first, int b0, int nb,
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
