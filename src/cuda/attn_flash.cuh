// attn_flash.cuh: the tiles and register products that the flash kernels of
// op_attention (attn_flash.c, FlashAttention-2 style, O(T) memory) share:
// attn_flash.cu (the forward) and attn_flash_backward.cu. Included by those
// two files only.
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
// Head dims up to FA_MAXD (128). Tiles live in dynamic shared memory (over
// 48 KB, so the kernels opt in with cudaFuncSetAttribute). In float32 with
// head dims 64 a block takes 68 KB (forward), 85 KB (dQ), 103 KB (dK, dV).
#ifndef AG_ATTN_FLASH_CUH
#define AG_ATTN_FLASH_CUH

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
__device__ __forceinline__ real fa_exp(real x) { return d_exp(x); }
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

// All of this thread's cp.async copies committed and landed (visible to
// the others after a barrier).
__device__ __forceinline__ void fa_cp_wait(void) {
    cu_cp_commit();
    cu_cp_wait<0>();
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
            cu_cp16(dst + j * ldd + c, in ? src + (int64_t)(j0 + j) * ld + c : src, in ? 16 : 0);
        }
    } else
        for (int e = threadIdx.x; e < FA_B * ldd; e += FA_THREADS) {
            int j = e / ldd, c = e % ldd;
            if (j < n && c < d)
                cu_cp1(dst + e, src + (int64_t)(j0 + j) * ld + c);
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

// bf16 tile products (attn_flash_bf16.cu, float32 build): whether the flash
// kernels take head dims dk, dv in bf16 now (cu_bf16_products, cuda_ops.h, is
// the switch), and the bf16 kernels, called in place of the float32 ones with
// the same arguments and a tape for their bf16 copies of the operands.
#ifndef AG_DOUBLE
extern "C" bool cu_flash_bf16_takes(int dk, int dv);
void cu_flash_bf16_forward(Tape *tp, const FaDims &d, const float *q, const float *k, const float *v,
                           const int *first, float *o, float *lse);
void cu_flash_bf16_backward(Tape *tp, const FaDims &d, const float *q, const float *k, const float *v,
                            const float *dO, const float *lse, const float *D, const int *first, float *gq, bool fq,
                            float *gk, bool fk, float *gv, bool fv);
#endif

#endif
