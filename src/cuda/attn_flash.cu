// attn_flash.cu: causal softmax attention on the GPU: op_attention
// (attn_flash.c, FlashAttention-2 style, O(T) memory) and its reference
// op_attention_naive (attn_naive.c, the full P saved).
//
// Flash. One thread block per (tile of FA_B queries or keys, batch x head),
// 128 threads as an 8 x 16 grid; thread (ty, tx) owns an FA_RM x FA_R
// (8 x 4; 4 x 2 in float64) register tile of every FA_B x FA_B block of
// scores (rows ty FA_RM + r, columns tx + c 16: strided) and the matching
// rows of its accumulators, whose columns it owns in groups of FA_B
// (tx FA_R + c + g FA_B). Q, K, V and dO tiles live in shared memory by rows
// (loaded as they lie in global memory, 16 bytes a load where the head dim
// allows), with the head dim's column groups and FA_R more as leading dim,
// zero past the head dim and past the last row. Products are outer products
// in registers:
//   scores (fa_tile_rows): per FA_R steps of the head dim a thread loads
//     FA_R values of each of its FA_RM + FA_R rows of either side (16-byte
//     loads: its own rows ty FA_RM + r, one word for the 16 threads of a row
//     of threads; its strided rows tx + c 16, conflict-free since a tile row
//     is an odd number of 16-byte words) and does FA_RM FA_R^2 fused
//     multiply-adds.
//   accumulations (fa_tile_acc): the scores go to shared memory transposed
//     (P^T, dS^T: the 16 threads' strided columns become rows, two 16-byte
//     stores a column), then per row x of the inner dimension a thread loads
//     FA_RM values of P^T (its rows) and FA_R of the tile by rows (its
//     columns) and does FA_RM FA_R multiply-adds per column group. In tiles
//     across the causal diagonal it skips the inner rows where all of its
//     P^T / dS^T rows are causally masked (zero).
// Scalar float32 (or float64) FMA: no tensor cores, so the products are
// strict IEEE as the CPU's. The kernels are instantiated for NG column
// groups of accumulator: 1 when both head dims are at most FA_B (64 in
// float32: 3 forward blocks or 2 backward blocks per SM, as the shared
// memory allows), else FA_NG (head dims up to FA_MAXD, one block per SM).
//   forward: Q of the tile; for each key tile some query of the tile sees,
//     K and V; S = scale Q K^T in registers (masked: s <= t and s >= lo(t),
//     lo(t) where t's document begins), the online softmax (row max across
//     the 16 threads of a row by shuffles; each thread keeps its part of the
//     row sum l, added up at the end), P^T to shared memory and
//     A = diag(alpha) A + P V. Then o = A / l and lse = m + log l (saved).
//   backward: D_t = dO_t . O_t first (double, as the CPU), then two kernels
//     that each recompute P = exp(scale Q K^T - lse) tile by tile (the
//     exponentials in float32 by exp2, log2(e) folded into the scale and
//     lse: fa_exp):
//     dQ per query tile (Q, dO held; looping over key tiles: K, V, dS =
//     P (dO V^T - D) in registers, dS^T to shared memory, dQ += dS K), and
//     dK, dV per key tile (K, V held; looping over the query tiles that see
//     it: Q, dO, S^T and dP^T with the keys as rows, P^T and dS^T to two
//     buffers, one barrier, dV += P^T dO, dK += dS^T Q). Every gradient row
//     is written by one block, so there are no atomics, and every sum runs
//     in a fixed order: a run repeats bit for bit.
// Head dims up to FA_MAXD (128). Tiles live in dynamic shared memory (over
// 48 KB, so the kernels opt in with cudaFuncSetAttribute). In float32 with
// head dims 64 a block takes 68 KB (forward), 85 KB (dQ), 103 KB (dK, dV).
//
// Naive. One block per row (b, h, t) with the row in shared memory, in
// double as attn_naive.c; P (B, H, T, T) saved. The backward: one block per
// query row (dS row, dq), then one per key row (dk, dv from the columns of dS
// and P), dS kept (B, H, T, T) in double in between.
#include <math.h>

#include "cuda_internal.cuh"

// A thread's register tile is FA_RM x FA_R: FA_R reals are 16 bytes, one
// vector load; FA_RM = 2 FA_R rows (two loads of a transposed column), so
// that a 16-byte shared-memory load feeds a third more multiply-adds than
// with a square FA_R tile (float32: 128 FMAs per 12 loads in the scores,
// 32 per 3 in the accumulations, against 64 per 8 and 16 per 2), and the
// rows' loads, the same word for 16 threads, are a smaller share. Tiles are
// 16 FA_R wide (64 in float32, 32 in float64), by FA_TY x FA_TX = 8 x 16
// threads.
#ifdef AG_DOUBLE
#define FA_R 2
#else
#define FA_R 4
#endif
#define FA_RM (2 * FA_R)
#define FA_TX 16
#define FA_TY 8
#define FA_THREADS (FA_TX * FA_TY)
#define FA_B (FA_TX * FA_R)
#define FA_LDT (FA_B + FA_R)        // leading dim of a transposed tile (P^T, dS^T)
#define FA_MAXD 128                 // largest head dim
#define FA_NG (FA_MAXD / FA_B)      // column groups of an accumulator row, at most
#define NA_THREADS 128

// Blocks per SM a kernel instance's registers are bounded for: with one
// column group (head dims up to FA_B) the shared memory lets 3 forward
// blocks share an SM (168 registers a thread), 2 of dQ or dK/dV (255, no
// bound); with more, one block.
#define FA_MINB_FWD(ng) ((ng) == 1 ? 3 : 1)
#define FA_MINB(ng) ((ng) == 1 ? 2 : 1)

typedef struct FaDims {
    int B, T, H, dk, dv;
    real scale;
    // The forward of a prefill window (cu_attn_prefix_forward): the T
    // queries of a row sit at slots qoff .. qoff+T-1 of its keys, which are
    // Tk rows a batch row (a decoding cache), and row b's document begins at
    // key0[b] (device memory). op_attention: qoff 0, Tk = T, key0 NULL.
    int Tk, qoff;
    const int *key0;
} FaDims;

// The largest dynamic shared memory a block may opt in to (227 KB on Hopper).
static size_t cu_smem_optin(void) {
    static int bytes = 0;
    if (!bytes) {
        int dev = 0;
        CU_CHECK(cudaGetDevice(&dev));
        CU_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    }
    return (size_t)bytes;
}

// Check a kernel's shared memory fits, and opt in above the default 48 KB.
static void cu_smem_prepare(const void *kernel, size_t bytes, const char *what, int dk, int dv) {
    ASSERT(bytes <= cu_smem_optin(), "%s: head dims dk %d, dv %d need %zu bytes of shared memory, the GPU has %zu",
           what, dk, dv, bytes, cu_smem_optin());
    if (bytes > 48 * 1024)
        CU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// Where row r's document begins (docs_begin of docs.h), first in device memory.
__device__ __forceinline__ int fa_lo(const int *first, int64_t r) {
    int f = first ? first[r] : 0;
    return f > 0 ? f : 0;
}

__device__ __forceinline__ real fa_max(real a, real b) { return b > a ? b : a; }

// The softmax's exponentials. float32: base 2 (exp2f, a few instructions
// fewer than expf), its arguments in log2 units: scores times
// scale log2(e), the log-sum-exp (saved in natural log) times log2(e);
// the argument's rounding (relative 2^-24 of its size) stays far below the
// float32 tests' 1e-4. float64: base e, the factors 1, the very
// expressions of the CPU.
#ifdef AG_DOUBLE
#define FA_LOG2E ((real)1)
#define FA_LN2 ((real)1)
__device__ __forceinline__ real fa_exp(real x) { return exp(x); }
#else
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f
__device__ __forceinline__ real fa_exp(real x) { return exp2f(x); }
#endif

// Whether query i (t0 + i) of a tile of nq sees key j (s0 + j) of a tile of
// nk: causal, and not before lo, where the query's document begins.
__device__ __forceinline__ bool fa_seen(int i, int j, int nq, int nk, int t0, int s0, int lo) {
    int sj = s0 + j;
    return i < nq && j < nk && sj <= t0 + i && sj >= lo;
}

// Column groups of a head dim (FA_B columns each), and the leading dim of a
// tile held by rows: its groups and FA_R more. The FA_R (16 bytes) make rows
// FA_TX apart fall on different banks: a row is an odd number of 16-byte
// words long, so the 8 rows tx .. tx + 7 that a quarter warp reads at one
// column are 8 different words of the 32 banks.
__host__ __device__ __forceinline__ int fa_groups(int d) { return (d + FA_B - 1) / FA_B; }
__host__ __device__ __forceinline__ int fa_ldr(int d) { return fa_groups(d) * FA_B + FA_R; }

// FA_R consecutive reals at p (16-byte aligned) into x, and back.
__device__ __forceinline__ void fa_ld(real *x, const real *p) {
#ifdef AG_DOUBLE
    double2 t = *(const double2 *)p;
    x[0] = t.x, x[1] = t.y;
#else
    float4 t = *(const float4 *)p;
    x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
#endif
}

__device__ __forceinline__ void fa_st(real *p, const real *x) {
#ifdef AG_DOUBLE
    *(double2 *)p = make_double2(x[0], x[1]);
#else
    *(float4 *)p = make_float4(x[0], x[1], x[2], x[3]);
#endif
}

// cp.async (sm_80 on): 16 bytes to shared memory, of which the first
// `bytes` (16 or 0) are read from src and the rest zero; or one real. Then
// the wait until all of this thread's copies have landed (visible to the
// others after a barrier).
__device__ __forceinline__ void fa_cp16(real *dst, const real *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void fa_cp1(real *dst, const real *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "n"((int)sizeof(real))
                 : "memory");
}

__device__ __forceinline__ void fa_cp_wait(void) {
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

// Rows j0 .. j0 + n of a head's (rows, d) slice (leading dim ld) into shared
// memory by rows (dst[j * ldd + c]), zero past n and in columns d .. ldd, by
// cp.async: 16 bytes a copy where d, ld and src allow (every row then starts
// 16-byte aligned), else one real a copy (and plain stores of the zeros).
// All threads; no wait, no barrier: fa_cp_wait, then __syncthreads.
__device__ __forceinline__ void fa_load_rows(real *dst, int ldd, const real *src, int64_t ld, int j0, int n, int d) {
    if (d % FA_R == 0 && ld % FA_R == 0 && ((size_t)src & 15) == 0) {
        int w = ldd / FA_R;   // 16-byte words a row
        for (int e = threadIdx.x; e < FA_B * w; e += FA_THREADS) {
            int j = e / w, c = e % w * FA_R;
            bool in = j < n && c < d;
            fa_cp16(dst + j * ldd + c, in ? src + (int64_t)(j0 + j) * ld + c : src, in ? 16 : 0);
        }
    } else
        for (int e = threadIdx.x; e < FA_B * ldd; e += FA_THREADS) {
            int j = e / ldd, c = e % ldd;
            if (j < n && c < d)
                fa_cp1(dst + e, src + (int64_t)(j0 + j) * ld + c);
            else
                dst[e] = 0;
        }
}

// acc[r][c] = sum_x A[r lda + x] Bm[c FA_TX ldb + x] over x < n rounded up to
// FA_R (the tiles are zero there): scores from two tiles held by rows, A at
// this thread's FA_RM rows (ra + r, one word for all 16 threads of a row of
// threads), Bm at its FA_R strided rows (tx + c FA_TX, conflict-free as
// fa_ldr says). Per FA_R columns: FA_RM + FA_R 16-byte loads, FA_RM FA_R^2
// FMAs, x ascending.
__device__ __forceinline__ void fa_tile_rows(real acc[FA_RM][FA_R], const real *A, int lda, const real *Bm, int ldb,
                                             int n) {
#pragma unroll
    for (int r = 0; r < FA_RM; r++)
#pragma unroll
        for (int c = 0; c < FA_R; c++) acc[r][c] = 0;
#pragma unroll 1
    for (int x = 0; x < n; x += FA_R) {
        real b[FA_R][FA_R];
#pragma unroll
        for (int c = 0; c < FA_R; c++) fa_ld(b[c], Bm + c * FA_TX * ldb + x);
#pragma unroll
        for (int r = 0; r < FA_RM; r++) {
            real a[FA_R];
            fa_ld(a, A + r * lda + x);
#pragma unroll
            for (int u = 0; u < FA_R; u++)
#pragma unroll
                for (int c = 0; c < FA_R; c++) acc[r][c] = fma(a[u], b[c][u], acc[r][c]);
        }
    }
}

// acc[g][r][c] += sum_x PT[x][r] Bm[x][g FA_B + c] over x0 <= x < n and
// column groups g < ng: PT a transposed tile (FA_LDT apart per x) at this
// thread's FA_RM rows (two 16-byte loads), Bm a tile by rows (ldb apart) at
// this thread's FA_R columns (one per group). The terms skipped below x0 or
// from n on are those of PT's zeros (masked scores), x ascending.
template <int NG>
__device__ __forceinline__ void fa_tile_acc(real acc[NG][FA_RM][FA_R], const real *PT, const real *Bm, int ldb,
                                            int x0, int n, int ng) {
#pragma unroll 2
    for (int x = x0; x < n; x++) {
        real p[FA_RM];
        fa_ld(p, PT + x * FA_LDT);
        fa_ld(p + FA_R, PT + x * FA_LDT + FA_R);
#pragma unroll
        for (int g = 0; g < NG; g++) {
            if (g < ng) {
                real b[FA_R];
                fa_ld(b, Bm + x * ldb + g * FA_B);
#pragma unroll
                for (int r = 0; r < FA_RM; r++)
#pragma unroll
                    for (int c = 0; c < FA_R; c++) acc[g][r][c] = fma(p[r], b[c], acc[g][r][c]);
            }
        }
    }
}

// A register tile of fa_tile_rows to a transposed tile, two 16-byte stores
// per column: T[(tx + c FA_TX) FA_LDT + ra + r] = x[r][c] (T passed at
// tx FA_LDT + ra; FA_LDT is an odd number of words, so conflict-free).
__device__ __forceinline__ void fa_store_t(real *T, real x[FA_RM][FA_R]) {
#pragma unroll
    for (int c = 0; c < FA_R; c++) {
        real col[FA_RM];
#pragma unroll
        for (int r = 0; r < FA_RM; r++) col[r] = x[r][c];
        fa_st(T + c * FA_TX * FA_LDT, col);
        fa_st(T + c * FA_TX * FA_LDT + FA_R, col + FA_R);
    }
}

// An accumulator's rows to a head's slice: dst row (t0 + ra + r), columns
// g FA_B + cb + c below d, times `scale`, written or added.
template <int NG>
__device__ __forceinline__ void fa_write_acc(real *dst, int64_t ld, real acc[NG][FA_RM][FA_R], int ra, int cb, int n,
                                             int d, int ng, real scale, bool fresh) {
#pragma unroll
    for (int r = 0; r < FA_RM; r++) {
        if (ra + r >= n) continue;
#pragma unroll
        for (int g = 0; g < NG; g++) {
            if (g >= ng) continue;
#pragma unroll
            for (int c = 0; c < FA_R; c++) {
                int col = g * FA_B + cb + c;
                if (col >= d) continue;
                real v = scale * acc[g][r][c];
                real *p = dst + (int64_t)(ra + r) * ld + col;
                *p = fresh ? v : *p + v;
            }
        }
    }
}

// The documents' index (docs.h, host memory in aux) copied to the device, or NULL.
static const int *fa_first_on_device(Node *n, int B, int T) {
    if (!n->aux) return NULL;
    size_t bytes = (size_t)B * T * sizeof(int);
    int *d = (int *)tape_dalloc(n->tape, bytes);
    cu_from_host(d, n->aux, bytes);
    return d;
}

static FaDims fa_dims(const Node *n) {
    FaDims d = {n->iarg[0], n->iarg[1], n->iarg[2], n->iarg[3], n->iarg[4], (real)n->farg[0], n->iarg[1], 0, NULL};
    ASSERT(d.dk <= FA_MAXD && d.dv <= FA_MAXD,
           "attention on the GPU: head dims dk %d, dv %d; the flash kernels take up to %d", d.dk, d.dv, FA_MAXD);
    return d;
}

// The kernels' instance for the head dims: NG column groups in the
// accumulators, 1 when both dims fit one group, else FA_NG.
static bool fa_one_group(const FaDims *d) { return fa_groups(d->dk) == 1 && fa_groups(d->dv) == 1; }

// Tiles of FA_B rows, the grid's y: grid (B*H, tiles), batch x head
// fastest, so that the blocks start (in order of their linear index) with
// the tiles of most work for every head: the last query tile (it sees every
// key tile; forward, dQ: tile gridDim.y - 1 - blockIdx.y) or the first key
// tile (every query tile sees it; dK, dV: tile blockIdx.y). Longest first,
// the last wave of blocks is of short ones.
static int fa_tiles(const FaDims *d) {
    int n = (d->T + FA_B - 1) / FA_B;
    ASSERT(n <= 65535, "attention: T %d is over %d tiles of the GPU grid's y", d->T, 65535);
    return n;
}

// ---------------------------------------------------------------- flash forward

// Shared memory: Q (the block's queries), K, V (the key tile's) by rows,
// P^T (keys as rows).
static size_t fwd_smem(int dk, int dv) {
    return (size_t)FA_B * (2 * fa_ldr(dk) + fa_ldr(dv) + FA_LDT) * sizeof(real);
}

// grid (B*H, query tiles). lse (B, H, T) or NULL. Scores: queries ra + r,
// keys tx + c FA_TX.
template <int NG>
__global__ void __launch_bounds__(FA_THREADS, FA_MINB_FWD(NG))
    k_flash_fwd(FaDims d, const real *q, const real *k, const real *v, const int *first, real *o, real *lse) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    int bh = blockIdx.x, b = bh / d.H, h = bh % d.H;
    int ty = threadIdx.x / FA_TX, tx = threadIdx.x % FA_TX, ra = ty * FA_RM, cb = tx * FA_R;
    int dk = d.dk, dv = d.dv, ngv = fa_groups(dv), ldk_s = fa_ldr(dk), ldv_s = fa_ldr(dv);
    real sc2 = d.scale * FA_LOG2E;   // the scale in fa_exp's units
    int t0 = (gridDim.y - 1 - blockIdx.y) * FA_B, nq = min(FA_B, d.T - t0);
    int ta = d.qoff + t0;   // the key slot of the tile's first query
    int64_t ldq = (int64_t)d.H * dk, ldv = (int64_t)d.H * dv, row0 = (int64_t)b * d.T, row0k = (int64_t)b * d.Tk;
    const real *qh = q + row0 * ldq + h * dk, *kh = k + row0k * ldq + h * dk, *vh = v + row0k * ldv + h * dv;
    const int *fr = first ? first + row0 : NULL;
    real *Qs = (real *)fa_smem, *Ks = Qs + FA_B * ldk_s, *Vs = Ks + FA_B * ldk_s, *PT = Vs + FA_B * ldv_s;

    fa_load_rows(Qs, ldk_s, qh, ldq, t0, nq, dk);
    real acc[NG][FA_RM][FA_R], m[FA_RM], l[FA_RM];
    int lo[FA_RM];
#pragma unroll
    for (int r = 0; r < FA_RM; r++) {
        m[r] = -INFINITY;
        l[r] = 0;
        lo[r] = ra + r >= nq ? 0 : d.key0 ? d.key0[b] : fa_lo(fr, t0 + ra + r);
#pragma unroll
        for (int g = 0; g < NG; g++)
#pragma unroll
            for (int c = 0; c < FA_R; c++) acc[g][r][c] = 0;
    }
    // Keys from the start of the tile's first query's document (the earliest
    // any query of the tile sees) to its last query.
    // K of a key tile is loaded behind the previous tile's P V (which reads
    // P^T and V only), V at the start of its own.
    int s_end = ta + nq, s_first = d.key0 ? d.key0[b] : fa_lo(fr, t0);
    fa_load_rows(Ks, ldk_s, kh, ldq, s_first, min(FA_B, s_end - s_first), dk);
    for (int s0 = s_first; s0 < s_end; s0 += FA_B) {
        int nk = min(FA_B, s_end - s0);
        __syncthreads();   // the previous tile's V, P are read
        fa_load_rows(Vs, ldv_s, vh, ldv, s0, nk, dv);
        fa_cp_wait();
        __syncthreads();
        real s[FA_RM][FA_R];
        fa_tile_rows(s, Qs + ra * ldk_s, ldk_s, Ks + tx * ldk_s, ldk_s, dk);
        // S (in fa_exp's units: log2 in float32): -inf where query i does not
        // see key j (exp gives weight 0). The online softmax: m' = max(m,
        // rowmax S) over the row's 16 threads, P = exp(S - m'), alpha =
        // exp(m - m') (1 when the max did not move, also while the row has
        // seen no key: m = m' = -inf).
#pragma unroll
        for (int r = 0; r < FA_RM; r++) {
            int i = ra + r;
            real mx = m[r];
#pragma unroll
            for (int c = 0; c < FA_R; c++) {
                bool seen = fa_seen(i, tx + c * FA_TX, nq, nk, ta, s0, lo[r]);
                s[r][c] = seen ? sc2 * s[r][c] : (real)-INFINITY;
                mx = fa_max(mx, s[r][c]);
            }
#pragma unroll
            for (int off = FA_TX / 2; off > 0; off >>= 1) mx = fa_max(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            real sum = 0;
#pragma unroll
            for (int c = 0; c < FA_R; c++) {
                s[r][c] = s[r][c] == -INFINITY ? (real)0 : fa_exp(s[r][c] - mx);
                sum += s[r][c];
            }
            real a = m[r] == mx ? (real)1 : fa_exp(m[r] - mx);
            l[r] = a * l[r] + sum;
            m[r] = mx;
#pragma unroll
            for (int g = 0; g < NG; g++)
#pragma unroll
                for (int c = 0; c < FA_R; c++) acc[g][r][c] *= a;
        }
        fa_store_t(PT + tx * FA_LDT + ra, s);
        __syncthreads();   // K is read: the next tile's may come
        if (s0 + FA_B < s_end) fa_load_rows(Ks, ldk_s, kh, ldq, s0 + FA_B, min(FA_B, s_end - s0 - FA_B), dk);
        // A += P V, over the keys this thread's last query sees (causal:
        // P is 0 from key t0 + ra + FA_RM - 1 - s0 on).
        fa_tile_acc<NG>(acc, PT + ra, Vs + cb, ldv_s, 0, min(nk, ta - s0 + ra + FA_RM), ngv);
    }
    // l: the row's 16 parts; every query sees itself, so l > 0.
#pragma unroll
    for (int r = 0; r < FA_RM; r++)
#pragma unroll
        for (int off = FA_TX / 2; off > 0; off >>= 1) l[r] += __shfl_xor_sync(0xffffffffu, l[r], off);
    // o = A / l, as the CPU: a division per element.
#pragma unroll
    for (int r = 0; r < FA_RM; r++) {
        if (ra + r >= nq) continue;
        real *orow = o + (row0 + t0 + ra + r) * ldv + h * dv;
#pragma unroll
        for (int g = 0; g < NG; g++)
#pragma unroll
            for (int c = 0; c < FA_R; c++) {
                int col = g * FA_B + cb + c;
                if (g < ngv && col < dv) orow[col] = acc[g][r][c] / l[r];
            }
        if (lse && tx == 0) lse[(int64_t)bh * d.T + t0 + ra + r] = m[r] * FA_LN2 + log(l[r]);
    }
}

template <int NG> static void fwd_launch(const FaDims &d, const real *q, const real *k, const real *v,
                                         const int *first, real *o, real *lse) {
    size_t smem = fwd_smem(d.dk, d.dv);
    cu_smem_prepare((const void *)k_flash_fwd<NG>, smem, "attention", d.dk, d.dv);
    dim3 grid((unsigned)(d.B * d.H), (unsigned)fa_tiles(&d));
    k_flash_fwd<NG><<<grid, FA_THREADS, smem, cu_stream>>>(d, q, k, v, first, o, lse);
    CU_LAUNCHED();
}

// iarg: 0 B, 1 T, 2 H, 3 dk, 4 dv (5, 6: the CPU's tiles); farg[0] scale;
// aux: first (B*T, docs.h) or NULL; saved: lse (B, H, T) or NULL.
extern "C" void cu_flash_forward(Node *n) {
    FaDims d = fa_dims(n);
    if ((int64_t)d.B * d.H * d.T == 0) return;
    const int *first = fa_first_on_device(n, d.B, d.T);
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    if (fa_one_group(&d))
        fwd_launch<1>(d, q, k, v, first, n->out[0]->data, (real *)n->saved);
    else
        fwd_launch<FA_NG>(d, q, k, v, first, n->out[0]->data, (real *)n->saved);
}

// A prefill window (attn_prefix_forward's GPU twin): the forward above with
// the window's queries at slots pos .. pos+T0-1 of a decoding cache (kc, vc:
// (B, max_T, H*dk / H*dv)) whose keys and values are there already, row b
// from slot key0[b] on. No autograd.
extern "C" void cu_attn_prefix_forward(real *o, const real *q, const real *kc, const real *vc, int B, int max_T,
                                       int pos, int T0, const int *key0, const int *key0_dev, int H, int dk, int dv,
                                       double scale) {
    ASSERT(B >= 1 && T0 >= 1 && pos >= 0 && pos + T0 <= max_T && (key0 == NULL) == (key0_dev == NULL),
           "attn prefill (GPU): %d rows, a window of %d after %d of %d slots", B, T0, pos, max_T);
    for (int b = 0; key0 && b < B; b++)
        ASSERT(key0[b] >= 0 && key0[b] <= pos, "attn prefill (GPU): row %d starts at slot %d, after the window's %d",
               b, key0[b], pos);
    FaDims d = {B, T0, H, dk, dv, (real)scale, max_T, pos, key0_dev};
    ASSERT(d.dk <= FA_MAXD && d.dv <= FA_MAXD,
           "attention on the GPU: head dims dk %d, dv %d; the flash kernels take up to %d", d.dk, d.dv, FA_MAXD);
    if (fa_one_group(&d))
        fwd_launch<1>(d, q, kc, vc, NULL, o, NULL);
    else
        fwd_launch<FA_NG>(d, q, kc, vc, NULL, o, NULL);
}

// ---------------------------------------------------------------- flash backward

// D (B, H, T): D_t = dO_t . O_t per head, summed in double.
__global__ void k_flash_rowdot(FaDims d, const real *o, const real *dO, real *D) {
    int64_t rows = (int64_t)d.B * d.H * d.T, ldv = (int64_t)d.H * d.dv;
    CU_FOR(r, rows) {
        int t = (int)(r % d.T);
        int64_t bh = r / d.T;
        int b = (int)(bh / d.H), h = (int)(bh % d.H);
        int64_t off = ((int64_t)b * d.T + t) * ldv + (int64_t)h * d.dv;
        double s = 0;
        for (int c = 0; c < d.dv; c++) s += (double)dO[off + c] * o[off + c];
        D[r] = (real)s;
    }
}

// dQ kernel, shared memory: Q, dO (the block's queries), K, V (the key
// tile's) by rows, dS^T (keys as rows).
static size_t dq_smem(int dk, int dv) {
    return (size_t)FA_B * (2 * fa_ldr(dk) + 2 * fa_ldr(dv) + FA_LDT) * sizeof(real);
}

// grid (B*H, query tiles): dq rows of the tile = scale sum_j dS K_j, written
// (fresh) or added. Scores: queries ra + r, keys tx + c FA_TX.
template <int NG>
__global__ void __launch_bounds__(FA_THREADS, FA_MINB(NG))
    k_flash_dq(FaDims d, const real *q, const real *k, const real *v, const real *dO, const real *lse,
               const real *D, const int *first, real *dq, bool fresh) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    int bh = blockIdx.x, b = bh / d.H, h = bh % d.H;
    int ty = threadIdx.x / FA_TX, tx = threadIdx.x % FA_TX, ra = ty * FA_RM, cb = tx * FA_R;
    int dk = d.dk, dv = d.dv, ngk = fa_groups(dk), ldk_s = fa_ldr(dk), ldv_s = fa_ldr(dv);
    real sc2 = d.scale * FA_LOG2E;   // the scale in fa_exp's units
    int t0 = (gridDim.y - 1 - blockIdx.y) * FA_B, nq = min(FA_B, d.T - t0);
    int64_t ldq = (int64_t)d.H * dk, ldv = (int64_t)d.H * dv, row0 = (int64_t)b * d.T;
    const real *qh = q + row0 * ldq + h * dk, *kh = k + row0 * ldq + h * dk;
    const real *vh = v + row0 * ldv + h * dv, *dOh = dO + row0 * ldv + h * dv;
    const int *fr = first ? first + row0 : NULL;
    real *Qs = (real *)fa_smem, *dOs = Qs + FA_B * ldk_s, *Ks = dOs + FA_B * ldv_s, *Vs = Ks + FA_B * ldk_s;
    real *dST = Vs + FA_B * ldv_s;

    fa_load_rows(Qs, ldk_s, qh, ldq, t0, nq, dk);
    fa_load_rows(dOs, ldv_s, dOh, ldv, t0, nq, dv);
    real acc[NG][FA_RM][FA_R], L[FA_RM], Dr[FA_RM];
    int lo[FA_RM];
#pragma unroll
    for (int r = 0; r < FA_RM; r++) {
        int i = ra + r;
        int64_t row = (int64_t)bh * d.T + t0 + i;
        L[r] = i < nq ? lse[row] * FA_LOG2E : (real)0;   // fa_exp's units
        Dr[r] = i < nq ? D[row] : (real)0;
        lo[r] = i < nq ? fa_lo(fr, t0 + i) : 0;
#pragma unroll
        for (int g = 0; g < NG; g++)
#pragma unroll
            for (int c = 0; c < FA_R; c++) acc[g][r][c] = 0;
    }
    // V of a key tile is loaded behind the previous tile's dS K (which reads
    // dS^T and K only), K at the start of its own.
    int s_end = t0 + nq, s_first = fa_lo(fr, t0);
    fa_load_rows(Vs, ldv_s, vh, ldv, s_first, min(FA_B, s_end - s_first), dv);
    for (int s0 = s_first; s0 < s_end; s0 += FA_B) {
        int nk = min(FA_B, s_end - s0);
        __syncthreads();   // the previous tile's K, dS are read
        fa_load_rows(Ks, ldk_s, kh, ldq, s0, nk, dk);
        fa_cp_wait();
        __syncthreads();
        // dS = P (dP - D), P = exp(scale q.k - lse), dP = dO . v; 0 where unseen.
        real s[FA_RM][FA_R], dp[FA_RM][FA_R];
        fa_tile_rows(s, Qs + ra * ldk_s, ldk_s, Ks + tx * ldk_s, ldk_s, dk);
        fa_tile_rows(dp, dOs + ra * ldv_s, ldv_s, Vs + tx * ldv_s, ldv_s, dv);
#pragma unroll
        for (int r = 0; r < FA_RM; r++)
#pragma unroll
            for (int c = 0; c < FA_R; c++) {
                bool seen = fa_seen(ra + r, tx + c * FA_TX, nq, nk, t0, s0, lo[r]);
                s[r][c] = seen ? fa_exp(sc2 * s[r][c] - L[r]) * (dp[r][c] - Dr[r]) : (real)0;
            }
        fa_store_t(dST + tx * FA_LDT + ra, s);
        __syncthreads();   // V is read: the next tile's may come
        if (s0 + FA_B < s_end) fa_load_rows(Vs, ldv_s, vh, ldv, s0 + FA_B, min(FA_B, s_end - s0 - FA_B), dv);
        // dQ += dS K over the keys this thread's last query sees (as the forward).
        fa_tile_acc<NG>(acc, dST + ra, Ks + cb, ldk_s, 0, min(nk, t0 - s0 + ra + FA_RM), ngk);
    }
    fa_write_acc<NG>(dq + (row0 + t0) * ldq + h * dk, ldq, acc, ra, cb, nq, dk, ngk, d.scale, fresh);
}

// dK, dV kernel, shared memory: K, V (the block's keys), Q, dO (the query
// tile's) by rows, P^T and dS^T (queries as rows); lse, D (FA_B) and lo
// (FA_B ints) of the query tile.
static size_t dkv_smem(int dk, int dv) {
    return ((size_t)FA_B * (2 * fa_ldr(dk) + 2 * fa_ldr(dv) + 2 * FA_LDT) + 2 * FA_B) * sizeof(real) +
           FA_B * sizeof(int);
}

// grid (B*H, key tiles): dk rows of the tile = scale sum_i dS^T Q_i and dv
// rows = sum_i P^T dO_i over the query tiles from the key tile on, up to the
// end of the last key's document. Here a thread's register tile of scores
// has keys as rows (ra + r) and queries as columns (tx + c FA_TX); its
// accumulators have keys ra + r, columns g FA_B + cb + c. dk or dv may be
// NULL (no gradient; D may be NULL when dk is); a tensor passed as both k
// and v gets dk written first, then dv added.
template <int NG>
__global__ void __launch_bounds__(FA_THREADS, FA_MINB(NG))
    k_flash_dkv(FaDims d, const real *q, const real *k, const real *v, const real *dO, const real *lse,
                const real *D, const int *first, real *gk, bool fresh_k, real *gv, bool fresh_v) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    int bh = blockIdx.x, b = bh / d.H, h = bh % d.H;
    int ty = threadIdx.x / FA_TX, tx = threadIdx.x % FA_TX, ra = ty * FA_RM, cb = tx * FA_R;
    int dk = d.dk, dv = d.dv, ngk = fa_groups(dk), ngv = fa_groups(dv), ldk_s = fa_ldr(dk), ldv_s = fa_ldr(dv);
    real sc2 = d.scale * FA_LOG2E;   // the scale in fa_exp's units
    int s0 = blockIdx.y * FA_B, nk = min(FA_B, d.T - s0), s_last = s0 + nk - 1;
    int64_t ldq = (int64_t)d.H * dk, ldv = (int64_t)d.H * dv, row0 = (int64_t)b * d.T;
    const real *qh = q + row0 * ldq + h * dk, *kh = k + row0 * ldq + h * dk;
    const real *vh = v + row0 * ldv + h * dv, *dOh = dO + row0 * ldv + h * dv;
    const int *fr = first ? first + row0 : NULL;
    real *Ks = (real *)fa_smem, *Vs = Ks + FA_B * ldk_s, *Qs = Vs + FA_B * ldv_s, *dOs = Qs + FA_B * ldk_s;
    real *PT = dOs + FA_B * ldv_s, *dST = PT + FA_B * FA_LDT, *Ls = dST + FA_B * FA_LDT, *Ds = Ls + FA_B;
    int *lo = (int *)(Ds + FA_B);

    fa_load_rows(Ks, ldk_s, kh, ldq, s0, nk, dk);
    fa_load_rows(Vs, ldv_s, vh, ldv, s0, nk, dv);
    real ak[NG][FA_RM][FA_R], av[NG][FA_RM][FA_R];
#pragma unroll
    for (int g = 0; g < NG; g++)
#pragma unroll
        for (int r = 0; r < FA_RM; r++)
#pragma unroll
            for (int c = 0; c < FA_R; c++) ak[g][r][c] = av[g][r][c] = 0;
    // The query tiles start at s0 (earlier queries see none of these keys).
    // The document start lo(t) does not decrease with t: once a tile's first
    // query begins its document after the last key, no later query sees any
    // key of the tile. (fr[...] is the same for every thread: the loop and
    // its barriers are uniform.)
    for (int t0 = s0; t0 < d.T && fa_lo(fr, t0) <= s_last; t0 += FA_B) {
        int nq = min(FA_B, d.T - t0);
        __syncthreads();   // the previous query tile is read
        fa_load_rows(Qs, ldk_s, qh, ldq, t0, nq, dk);
        fa_load_rows(dOs, ldv_s, dOh, ldv, t0, nq, dv);
        for (int i = threadIdx.x; i < FA_B; i += FA_THREADS) {
            int64_t row = (int64_t)bh * d.T + t0 + i;
            Ls[i] = i < nq ? lse[row] * FA_LOG2E : (real)0;   // fa_exp's units
            Ds[i] = i < nq && D ? D[row] : (real)0;
            lo[i] = i < nq ? fa_lo(fr, t0 + i) : 0;
        }
        fa_cp_wait();
        __syncthreads();
        // P^T = exp(scale k.q - lse), 0 where query i does not see key j.
        real p[FA_RM][FA_R];
        fa_tile_rows(p, Ks + ra * ldk_s, ldk_s, Qs + tx * ldk_s, ldk_s, dk);
#pragma unroll
        for (int c = 0; c < FA_R; c++) {
            int i = tx + c * FA_TX;
#pragma unroll
            for (int r = 0; r < FA_RM; r++) {
                bool seen = fa_seen(i, ra + r, nq, nk, t0, s0, lo[i]);
                p[r][c] = seen ? fa_exp(sc2 * p[r][c] - Ls[i]) : (real)0;
            }
        }
        if (gv) fa_store_t(PT + tx * FA_LDT + ra, p);
        if (gk) {   // dS^T = P^T (dP^T - D)
            real dp[FA_RM][FA_R];
            fa_tile_rows(dp, Vs + ra * ldv_s, ldv_s, dOs + tx * ldv_s, ldv_s, dv);
#pragma unroll
            for (int c = 0; c < FA_R; c++) {
                real Di = Ds[tx + c * FA_TX];
#pragma unroll
                for (int r = 0; r < FA_RM; r++) p[r][c] = p[r][c] * (dp[r][c] - Di);
            }
            fa_store_t(dST + tx * FA_LDT + ra, p);
        }
        __syncthreads();
        // Over the queries that see this thread's first key (causal: P^T and
        // dS^T are 0 before query s0 + ra - t0, which is past 0 only in the
        // diagonal tile t0 = s0):
        int x0 = max(0, s0 - t0 + ra);
        if (gv) fa_tile_acc<NG>(av, PT + ra, dOs + cb, ldv_s, x0, nq, ngv);    // dV_j += P^T dO
        if (gk) fa_tile_acc<NG>(ak, dST + ra, Qs + cb, ldk_s, x0, nq, ngk);   // dK_j += dS^T Q (the scale at the end)
    }
    if (gk) fa_write_acc<NG>(gk + (row0 + s0) * ldq + h * dk, ldq, ak, ra, cb, nk, dk, ngk, d.scale, fresh_k);
    __syncthreads();   // gk and gv may be one buffer (k and v one tensor): dk first
    if (gv) fa_write_acc<NG>(gv + (row0 + s0) * ldv + h * dv, ldv, av, ra, cb, nk, dv, ngv, (real)1, fresh_v);
}

template <int NG> static void bwd_launch(const FaDims &d, const real *q, const real *k, const real *v,
                                         const real *dO, const real *lse, const real *D, const int *first, real *gq,
                                         bool fq, real *gk, bool fk, real *gv, bool fv) {
    dim3 grid((unsigned)(d.B * d.H), (unsigned)fa_tiles(&d));
    // dq before dk and dv: when q is also k or v, its gradient is written here
    // (fresh) and added to below.
    if (gq) {
        size_t smem = dq_smem(d.dk, d.dv);
        cu_smem_prepare((const void *)k_flash_dq<NG>, smem, "attention backward", d.dk, d.dv);
        k_flash_dq<NG><<<grid, FA_THREADS, smem, cu_stream>>>(d, q, k, v, dO, lse, D, first, gq, fq);
        CU_LAUNCHED();
    }
    if (gk || gv) {
        size_t smem = dkv_smem(d.dk, d.dv);
        cu_smem_prepare((const void *)k_flash_dkv<NG>, smem, "attention backward", d.dk, d.dv);
        k_flash_dkv<NG><<<grid, FA_THREADS, smem, cu_stream>>>(d, q, k, v, dO, lse, D, first, gk, fk, gv, fv);
        CU_LAUNCHED();
    }
}

extern "C" void cu_flash_backward(Node *n) {
    FaDims d = fa_dims(n);
    // In input order: a tensor passed twice gets fresh on its first use only.
    bool fq = false, fk = false, fv = false;
    real *gq = CU_GRAD_FRESH(n, 0, &fq), *gk = CU_GRAD_FRESH(n, 1, &fk), *gv = CU_GRAD_FRESH(n, 2, &fv);
    if ((!gq && !gk && !gv) || (int64_t)d.B * d.H * d.T == 0) return;
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    const real *o = n->out[0]->data, *dO = n->out[0]->grad, *lse = (const real *)n->saved;
    const int *first = fa_first_on_device(n, d.B, d.T);
    int64_t rows = (int64_t)d.B * d.H * d.T;
    real *D = NULL;
    if (gq || gk) {
        D = (real *)tape_dalloc(n->tape, (size_t)rows * sizeof(real));
        k_flash_rowdot<<<cu_grid(rows), CU_THREADS, 0, cu_stream>>>(d, o, dO, D);
        CU_LAUNCHED();
    }
    if (fa_one_group(&d))
        bwd_launch<1>(d, q, k, v, dO, lse, D, first, gq, fq, gk, fk, gv, fv);
    else
        bwd_launch<FA_NG>(d, q, k, v, dO, lse, D, first, gq, fq, gk, fk, gv, fv);
}

// ---------------------------------------------------------------- naive (the reference)

// Block-wide max of one double per thread (as cu_block_sum; shm 32 doubles).
__device__ __forceinline__ double na_block_max(double v, double *shm) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();   // shm may still be read by a previous call
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    v = lane < nw ? shm[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Shared memory of the per-row kernels: the row (T doubles) and 32 for the reductions.
static size_t na_smem(int T) { return ((size_t)T + 32) * sizeof(double); }

// One block per row r = (b H + h) T + t: P_t. = softmax over the allowed
// s <= t of scale q_t.k_s (double), o_t = sum_s P_ts v_s. P (B, H, T, T) or
// NULL; allow (B, T, T) or NULL.
__global__ void __launch_bounds__(NA_THREADS)
    k_naive_fwd(int T, int H, int dk, int dv, double scale, const unsigned char *allow, const real *q,
                const real *k, const real *v, real *o, real *P) {
    extern __shared__ double na_row[];
    double *p = na_row, *red = na_row + T;
    int64_t r = blockIdx.x, bh = r / T;
    int t = (int)(r % T), b = (int)(bh / H), h = (int)(bh % H), tid = threadIdx.x;
    int64_t ldq = (int64_t)H * dk, ldv = (int64_t)H * dv, row0 = (int64_t)b * T;
    const real *qt = q + (row0 + t) * ldq + h * dk;
    double mx = -INFINITY;
    for (int s = tid; s <= t; s += NA_THREADS) {
        double x = -INFINITY;   // masked out: exp gives 0
        if (!allow || allow[(row0 + t) * T + s]) {
            const real *ks = k + (row0 + s) * ldq + h * dk;
            double dot = 0;
            for (int i = 0; i < dk; i++) dot += (double)qt[i] * ks[i];
            x = scale * dot;
        }
        p[s] = x;
        mx = fmax(mx, x);
    }
    mx = na_block_max(mx, red);   // finite: the builder checked every row allows some s <= t
    double sum = 0;
    for (int s = tid; s <= t; s += NA_THREADS) {
        p[s] = exp(p[s] - mx);
        sum += p[s];
    }
    sum = cu_block_sum(sum, red);
    real *Pt = P ? P + r * T : NULL;
    for (int s = tid; s < T; s += NA_THREADS) {
        if (s <= t) p[s] /= sum;
        if (Pt) Pt[s] = s <= t ? (real)p[s] : (real)0;
    }
    __syncthreads();
    for (int j = tid; j < dv; j += NA_THREADS) {
        double acc = 0;
        for (int s = 0; s <= t; s++) acc += p[s] * v[(row0 + s) * ldv + h * dv + j];
        o[(row0 + t) * ldv + h * dv + j] = (real)acc;
    }
}

// iarg: 0 B, 1 T, 2 H, 3 dk, 4 dv; farg[0] scale; aux: allow (B, T, T) or
// NULL (host memory); saved: P (B, H, T, T) or NULL.
extern "C" void cu_naive_attn_forward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], H = n->iarg[2], dk = n->iarg[3], dv = n->iarg[4];
    int64_t rows = (int64_t)B * H * T;
    if (rows == 0) return;
    size_t smem = na_smem(T);
    cu_smem_prepare((const void *)k_naive_fwd, smem, "attention_naive", dk, dv);
    unsigned char *allow = NULL;
    if (n->aux) {
        size_t bytes = (size_t)B * T * T;
        allow = (unsigned char *)tape_dalloc(n->tape, bytes);
        cu_from_host(allow, n->aux, bytes);
    }
    k_naive_fwd<<<(unsigned)rows, NA_THREADS, smem, cu_stream>>>(T, H, dk, dv, n->farg[0], allow, n->in[0]->data,
                                                                 n->in[1]->data, n->in[2]->data, n->out[0]->data,
                                                                 (real *)n->saved);
    CU_LAUNCHED();
}

// One block per query row r: dS_ts = P_ts (dP_ts - sum_s' P_ts' dP_ts'),
// dP_ts = dO_t . v_s (double); the row into dS (B, H, T, T) when not NULL,
// and dq_t = scale sum_s dS_ts k_s into gq when not NULL.
__global__ void __launch_bounds__(NA_THREADS)
    k_naive_dq(int T, int H, int dk, int dv, double scale, const real *k, const real *v, const real *dO,
               const real *P, double *dS, real *gq, bool fresh) {
    extern __shared__ double na_row[];
    double *ds = na_row, *red = na_row + T;
    int64_t r = blockIdx.x, bh = r / T;
    int t = (int)(r % T), b = (int)(bh / H), h = (int)(bh % H), tid = threadIdx.x;
    int64_t ldq = (int64_t)H * dk, ldv = (int64_t)H * dv, row0 = (int64_t)b * T;
    const real *Pt = P + r * T, *dOt = dO + (row0 + t) * ldv + h * dv;
    double rowdot = 0;
    for (int s = tid; s <= t; s += NA_THREADS) {
        double dp = 0;
        if (Pt[s] != 0) {   // else dS_ts = 0 whatever dP_ts
            const real *vs = v + (row0 + s) * ldv + h * dv;
            for (int j = 0; j < dv; j++) dp += (double)dOt[j] * vs[j];
        }
        ds[s] = dp;
        rowdot += Pt[s] * dp;
    }
    rowdot = cu_block_sum(rowdot, red);
    for (int s = tid; s <= t; s += NA_THREADS) {
        ds[s] = Pt[s] * (ds[s] - rowdot);
        if (dS) dS[r * T + s] = ds[s];
    }
    __syncthreads();
    if (!gq) return;
    for (int i = tid; i < dk; i += NA_THREADS) {
        double acc = 0;
        for (int s = 0; s <= t; s++) acc += ds[s] * k[(row0 + s) * ldq + h * dk + i];
        real g = (real)(scale * acc), *p = gq + (row0 + t) * ldq + h * dk + i;
        *p = fresh ? g : *p + g;
    }
}

// One block per key row r = (b H + h) T + s: dk_s = scale sum_{t >= s} dS_ts
// q_t, dv_s = sum_{t >= s} P_ts dO_t (double). gk or gv may be NULL; one
// buffer for both (k and v one tensor) gets dk written first, then dv added.
__global__ void __launch_bounds__(NA_THREADS)
    k_naive_dkv(int T, int H, int dk, int dv, double scale, const real *q, const real *dO, const real *P,
                const double *dS, real *gk, bool fresh_k, real *gv, bool fresh_v) {
    int64_t r = blockIdx.x, bh = r / T;
    int s = (int)(r % T), b = (int)(bh / H), h = (int)(bh % H), tid = threadIdx.x;
    int64_t ldq = (int64_t)H * dk, ldv = (int64_t)H * dv, row0 = (int64_t)b * T;
    const int64_t col = bh * T * T + s;   // (t, s) of this head is col + t T
    if (gk)
        for (int i = tid; i < dk; i += NA_THREADS) {
            double acc = 0;
            for (int t = s; t < T; t++) acc += dS[col + (int64_t)t * T] * q[(row0 + t) * ldq + h * dk + i];
            real g = (real)(scale * acc), *p = gk + (row0 + s) * ldq + h * dk + i;
            *p = fresh_k ? g : *p + g;
        }
    __syncthreads();
    if (gv)
        for (int j = tid; j < dv; j += NA_THREADS) {
            double acc = 0;
            for (int t = s; t < T; t++) acc += (double)P[col + (int64_t)t * T] * dO[(row0 + t) * ldv + h * dv + j];
            real g = (real)acc, *p = gv + (row0 + s) * ldv + h * dv + j;
            *p = fresh_v ? g : *p + g;
        }
}

extern "C" void cu_naive_attn_backward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], H = n->iarg[2], dk = n->iarg[3], dv = n->iarg[4];
    double scale = n->farg[0];
    bool fq = false, fk = false, fv = false;
    real *gq = CU_GRAD_FRESH(n, 0, &fq), *gk = CU_GRAD_FRESH(n, 1, &fk), *gv = CU_GRAD_FRESH(n, 2, &fv);
    int64_t rows = (int64_t)B * H * T;
    if ((!gq && !gk && !gv) || rows == 0) return;
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    const real *dO = n->out[0]->grad, *P = (const real *)n->saved;
    double *dS = gk ? (double *)tape_dalloc(n->tape, (size_t)rows * T * sizeof(double)) : NULL;
    // dq first: when q is also k or v, its gradient is written here (fresh)
    // and added to below.
    if (gq || gk) {
        size_t smem = na_smem(T);
        cu_smem_prepare((const void *)k_naive_dq, smem, "attention_naive backward", dk, dv);
        k_naive_dq<<<(unsigned)rows, NA_THREADS, smem, cu_stream>>>(T, H, dk, dv, scale, k, v, dO, P, dS, gq, fq);
        CU_LAUNCHED();
    }
    if (gk || gv) {
        k_naive_dkv<<<(unsigned)rows, NA_THREADS, 0, cu_stream>>>(T, H, dk, dv, scale, q, dO, P, dS, gk, fk, gv,
                                                                  fv);
        CU_LAUNCHED();
    }
}
