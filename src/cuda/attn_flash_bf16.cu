// attn_flash_bf16.cu: op_attention's flash kernels (attn_flash.cu,
// attn_flash_backward.cu: the same algorithm, masks, documents and order of
// launches) with their tile products on the bf16 tensor cores, under
// [train] precision = bf16 (device_set_bf16) in the float32 build.
//
// Semantics, the CPU's (attn_flash.c, attn_tiles_bf16): S = Q K^T and
// dP = dO V^T from Q, K, dO, V rounded to bf16, and P V, P^T dO, dS^T Q and
// dS K from P and dS rounded to bf16 (the other operand as before); every
// rounding to nearest, ties to even (__float2bfloat16_rn, bf16.h's rounding);
// every sum, the scores S and dP as summed, the online max and sum (of P
// before its rounding), exp, lse, D and dS = P (dP - D) in float32. A product
// of two bf16 numbers is exact in float32, so the CPU and the GPU differ by
// the order of float32 sums only (and by the exp2 of the GPU's float32
// kernels against the CPU's exp, as the float32 paths do).
//
// Taken for even head dims up to FA_MAXD (the CPU needs them even: the pairs
// of vdpbf16ps); others run the float32 kernels. The kernels are instances
// for a padded head dim FB_D of 32, 64 or 128 (both dk and dv padded to it
// with zeros, which add nothing to a sum).
//
// Tensor cores: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (inline
// PTX). A block is 4 warps over a tile of FB_B = 64 queries (forward, dQ) or
// keys (dK, dV); warp w owns the tile's rows 16 w .. 16 w + 15. The PTX
// ISA's fragments of m16n8k16 with .bf16 inputs, lane = 4 g + c (g the group
// 0..7, c 0..3), two bf16 numbers a 32-bit register, the lower column / row
// index in the low 16 bits:
//   A (16 x 16, row): a0 = A[g][2c, 2c+1], a1 = A[g+8][2c, 2c+1],
//                     a2 = A[g][2c+8, 2c+9], a3 = A[g+8][2c+8, 2c+9]
//   B (16 x 8, col):  b0 = B[2c, 2c+1][g], b1 = B[2c+8, 2c+9][g]
//   C, D (16 x 8, f32): d0 = C[g][2c], d1 = C[g][2c+1], d2 = C[g+8][2c],
//                       d3 = C[g+8][2c+1]
// Two shared-memory layouts of a tile X (FB_B rows x FB_D columns), 32-bit
// words of two bf16 numbers:
//   by rows (fb_ldr):   word [r ldr + p] = (X[r][2p], X[r][2p+1]): A of a
//     product over X's columns (Q in S = Q K^T), or B = X^T (K there);
//   by pairs of rows (fb_ldc): word [p ldc + c] = (X[2p][c], X[2p+1][c]):
//     B of a product over X's rows (V in P V).
// The scores' C fragments of two neighbouring 8-key tiles are the A fragment
// of 16 keys (a0 = d0, d1 of the first, a1 = d2, d3, a2 and a3 the same of
// the second), so P and dS go from the scores' registers to the next product
// rounded, without shared memory. The leading dims' padding (4 words by
// rows, 8 by pairs) puts the 32 lanes' words of each fragment load on 32
// different banks.
#include "attn_flash.cuh"
#include "mma_bf16.cuh"

#ifndef AG_DOUBLE
#include <cuda_bf16.h>
#include <stdint.h>

#define FB_B 64
#define FB_THREADS 128
#define FB_NT (FB_B / 8)   // 8-column tiles of a tile's scores
static_assert(FB_B == FA_B, "the grid's tiles (fa_tiles) are the float32 kernels' FA_B rows");

__host__ __device__ constexpr int fb_ldr(int D) { return D / 2 + 4; }
__host__ __device__ constexpr int fb_ldc(int D) { return D + 8; }

// Rows j0 .. j0 + n - 1 of a head's slice (leading dim ld), columns below d,
// rounded into a tile by rows; zero past n and d. All threads; no barrier.
template <int D>
__device__ __forceinline__ void fb_load_rows(uint32_t *dst, const float *src, int64_t ld, int j0, int n, int d) {
    constexpr int W = D / 2, L = fb_ldr(D);
    for (int e = threadIdx.x; e < FB_B * W; e += FB_THREADS) {
        int j = e / W, c = 2 * (e % W);
        const float *s = src + (int64_t)(j0 + j) * ld + c;
        float x0 = j < n && c < d ? s[0] : 0.f, x1 = j < n && c + 1 < d ? s[1] : 0.f;
        dst[j * L + c / 2] = fb_pack(x0, x1);
    }
}

// The same rows into a tile by pairs of rows (2p, 2p + 1 of the tile).
template <int D>
__device__ __forceinline__ void fb_load_pairs(uint32_t *dst, const float *src, int64_t ld, int j0, int n, int d) {
    constexpr int L = fb_ldc(D);
    for (int e = threadIdx.x; e < FB_B / 2 * D; e += FB_THREADS) {
        int p = e / D, c = e % D, j = 2 * p;
        const float *s = src + (int64_t)(j0 + j) * ld + c;
        float x0 = j < n && c < d ? s[0] : 0.f, x1 = j + 1 < n && c < d ? s[ld] : 0.f;
        dst[p * L + c] = fb_pack(x0, x1);
    }
}

// acc[nt] = the warp's 16 x 64 scores A Bt^T over the padded head dim: A the
// warp's first row of a tile by rows, Bt a whole tile by rows (its row
// 8 nt + g is score column 8 nt + g).
template <int D>
__device__ __forceinline__ void fb_scores(float acc[FB_NT][4], const uint32_t *A, const uint32_t *Bt) {
    constexpr int L = fb_ldr(D);
    int g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < FB_NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        int p = 8 * kk + c;   // the pair of columns 16 kk + 2c, + 1
        uint32_t a0 = A[g * L + p], a1 = A[(g + 8) * L + p], a2 = A[g * L + p + 4], a3 = A[(g + 8) * L + p + 4];
#pragma unroll
        for (int nt = 0; nt < FB_NT; nt++) {
            const uint32_t *b = Bt + (8 * nt + g) * L + p;
            fb_mma(acc[nt], a0, a1, a2, a3, b[0], b[4]);
        }
    }
}

// acc[nt] += P Y over the tile's 64 rows of Y (a tile by pairs of rows): P
// the warp's 16 x 64 scores in C fragments (float32), rounded here.
template <int D>
__device__ __forceinline__ void fb_acc(float acc[D / 8][4], const float p[FB_NT][4], const uint32_t *Y) {
    constexpr int L = fb_ldc(D);
    int g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3;
#pragma unroll
    for (int kk = 0; kk < FB_B / 16; kk++) {
        uint32_t a0 = fb_pack(p[2 * kk][0], p[2 * kk][1]), a1 = fb_pack(p[2 * kk][2], p[2 * kk][3]);
        uint32_t a2 = fb_pack(p[2 * kk + 1][0], p[2 * kk + 1][1]), a3 = fb_pack(p[2 * kk + 1][2], p[2 * kk + 1][3]);
        const uint32_t *y = Y + (8 * kk + c) * L + g;   // the pair of rows 16 kk + 2c, + 1
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) fb_mma(acc[nt], a0, a1, a2, a3, y[8 * nt], y[4 * L + 8 * nt]);
    }
}

template <int D> __device__ __forceinline__ void fb_zero(float acc[D / 8][4]) {
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
}

// The warp's rows (r0 + g, r0 + g + 8 of dst) of an accumulator, columns
// below d, rows below n, times scale, written or added. The product is
// rounded on its own (__fmul_rn: no fused multiply-add into the sum), so a
// gradient added to another is their float32 sum, the bits of each alone.
template <int D>
__device__ __forceinline__ void fb_write(float *dst, int64_t ld, const float acc[D / 8][4], int r0, int n, int d,
                                         float scale, bool fresh) {
    int g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = r0 + g + 8 * h;
        if (r >= n) continue;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int col = 8 * nt + 2 * c + e;
                if (col >= d) continue;
                float v = __fmul_rn(scale, acc[nt][2 * h + e]), *p = dst + (int64_t)r * ld + col;
                *p = fresh ? v : *p + v;
            }
    }
}

// The max of the 4 lanes of a row's group.
__device__ __forceinline__ float fb_rowmax(float x) {
    x = fa_max(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fa_max(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

template <int D> static size_t fb_fwd_smem(void) {
    return (size_t)(2 * FB_B * fb_ldr(D) + FB_B / 2 * fb_ldc(D)) * sizeof(uint32_t);
}

// The forward, grid (B*H, query tiles) as k_flash_fwd: Q by rows; per key
// tile K by rows, V by pairs of rows; S = Q K^T, the online softmax on the
// C fragments (a row's max across its group's 4 lanes, each lane keeping its
// part of l, summed at the end), A = diag(alpha) A + P V.
template <int D>
__global__ void __launch_bounds__(FB_THREADS)
    k_fb_fwd(FaDims d, const float *q, const float *k, const float *v, const int *first, float *o, float *lse) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    uint32_t *Qs = (uint32_t *)fa_smem, *Ks = Qs + FB_B * fb_ldr(D), *Vs = Ks + FB_B * fb_ldr(D);
    int bh = blockIdx.x, b = bh / d.H, h = bh % d.H;
    int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3, rw = 16 * w;
    float sc2 = d.scale * FA_LOG2E;
    int t0 = (gridDim.y - 1 - blockIdx.y) * FB_B, nq = min(FB_B, d.T - t0), ta = d.qoff + t0;
    int64_t ldq = (int64_t)d.H * d.dk, ldv = (int64_t)d.H * d.dv, row0 = (int64_t)b * d.T, row0k = (int64_t)b * d.Tk;
    const float *qh = q + row0 * ldq + h * d.dk, *kh = k + row0k * ldq + h * d.dk, *vh = v + row0k * ldv + h * d.dv;
    const int *fr = first ? first + row0 : NULL;

    fb_load_rows<D>(Qs, qh, ldq, t0, nq, d.dk);
    float acc[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    int lo[2];
    fb_zero<D>(acc);
    for (int hh = 0; hh < 2; hh++) {
        int i = rw + g + 8 * hh;
        lo[hh] = i >= nq ? 0 : d.key0 ? d.key0[b] : fa_lo(fr, t0 + i);
    }
    // The key tiles start at a multiple of FB_B, as the CPU's (ATTN_TILE_K):
    // P is rounded at the running max, the max over the keys of the tiles so
    // far, so the tiles' edges are part of the semantics. (A prefill window,
    // key0: from its first key, as attn_prefix_forward.)
    int s_end = ta + nq, s_first = d.key0 ? d.key0[b] : fa_lo(fr, t0) / FB_B * FB_B;
    for (int s0 = s_first; s0 < s_end; s0 += FB_B) {
        int nk = min(FB_B, s_end - s0);
        __syncthreads();   // the previous tile's K and V are read
        fb_load_rows<D>(Ks, kh, ldq, s0, nk, d.dk);
        fb_load_pairs<D>(Vs, vh, ldv, s0, nk, d.dv);
        __syncthreads();
        float s[FB_NT][4];
        fb_scores<D>(s, Qs + rw * fb_ldr(D), Ks);
        // As k_flash_fwd: -inf where unseen, m' = max(m, rowmax S), P =
        // exp(S - m'), alpha = exp(m - m') (1 when the max did not move).
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            int i = rw + g + 8 * hh;
            float mx = m[hh];
#pragma unroll
            for (int nt = 0; nt < FB_NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float &x = s[nt][2 * hh + e];
                    x = fa_seen(i, 8 * nt + 2 * c + e, nq, nk, ta, s0, lo[hh]) ? sc2 * x : -INFINITY;
                    mx = fa_max(mx, x);
                }
            mx = fb_rowmax(mx);
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < FB_NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float &x = s[nt][2 * hh + e];
                    x = x == -INFINITY ? 0.f : fa_exp(x - mx);
                    sum += x;
                }
            float a = m[hh] == mx ? 1.f : fa_exp(m[hh] - mx);
            l[hh] = a * l[hh] + sum;
            m[hh] = mx;
#pragma unroll
            for (int nt = 0; nt < D / 8; nt++) acc[nt][2 * hh] *= a, acc[nt][2 * hh + 1] *= a;
        }
        fb_acc<D>(acc, s, Vs);   // P rounded to bf16 here; l took it unrounded
    }
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {   // l: the sum of the group's 4 parts (every lane, before any leaves)
        l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 1);
        l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 2);
    }
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        int i = rw + g + 8 * hh;
        if (i >= nq) continue;
        float *orow = o + (row0 + t0 + i) * ldv + h * d.dv;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int col = 8 * nt + 2 * c + e;
                if (col < d.dv) orow[col] = acc[nt][2 * hh + e] / l[hh];
            }
        if (lse && c == 0) lse[(int64_t)bh * d.T + t0 + i] = m[hh] * FA_LN2 + logf(l[hh]);
    }
}

// A backward block's head (b, h): the leading dims, its first row, its
// slices of q, k, v and dO, and its row's documents' index (or NULL).
struct FbHead {
    int64_t ldq, ldv, row0;
    const float *q, *k, *v, *dO;
    const int *fr;
};

__device__ __forceinline__ FbHead fb_head(const FaDims &d, int b, int h, const float *q, const float *k,
                                          const float *v, const float *dO, const int *first) {
    FbHead x;
    x.ldq = (int64_t)d.H * d.dk, x.ldv = (int64_t)d.H * d.dv, x.row0 = (int64_t)b * d.T;
    x.q = q + x.row0 * x.ldq + h * d.dk, x.k = k + x.row0 * x.ldq + h * d.dk;
    x.v = v + x.row0 * x.ldv + h * d.dv, x.dO = dO + x.row0 * x.ldv + h * d.dv;
    x.fr = first ? first + x.row0 : NULL;
    return x;
}

template <int D> static size_t fb_dq_smem(void) {
    return (size_t)(4 * FB_B * fb_ldr(D) + FB_B / 2 * fb_ldc(D)) * sizeof(uint32_t);
}

// dQ, grid (B*H, query tiles) as k_flash_dq: Q, dO by rows; per key tile K,
// V by rows and K by pairs of rows; S = Q K^T, dP = dO V^T, dS = P (dP - D)
// in float32 on the fragments, dQ += dS K (dS rounded), times scale at the end.
template <int D>
__global__ void __launch_bounds__(FB_THREADS)
    k_fb_dq(FaDims d, const float *q, const float *k, const float *v, const float *dO, const float *lse,
            const float *Dv, const int *first, float *dq, bool fresh) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int LR = fb_ldr(D);
    uint32_t *Qs = (uint32_t *)fa_smem, *dOs = Qs + FB_B * LR, *Ks = dOs + FB_B * LR, *Vs = Ks + FB_B * LR;
    uint32_t *Kp = Vs + FB_B * LR;
    int bh = blockIdx.x, b = bh / d.H, h = bh % d.H;
    int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3, rw = 16 * w;
    float sc2 = d.scale * FA_LOG2E;
    int t0 = (gridDim.y - 1 - blockIdx.y) * FB_B, nq = min(FB_B, d.T - t0);
    FbHead hd = fb_head(d, b, h, q, k, v, dO, first);

    fb_load_rows<D>(Qs, hd.q, hd.ldq, t0, nq, d.dk);
    fb_load_rows<D>(dOs, hd.dO, hd.ldv, t0, nq, d.dv);
    float acc[D / 8][4], L[2], Dr[2];
    int lo[2];
    fb_zero<D>(acc);
    for (int hh = 0; hh < 2; hh++) {
        int i = rw + g + 8 * hh;
        int64_t row = (int64_t)bh * d.T + t0 + i;
        L[hh] = i < nq ? lse[row] * FA_LOG2E : 0.f;
        Dr[hh] = i < nq ? Dv[row] : 0.f;
        lo[hh] = i < nq ? fa_lo(hd.fr, t0 + i) : 0;
    }
    int s_end = t0 + nq, s_first = fa_lo(hd.fr, t0);
    for (int s0 = s_first; s0 < s_end; s0 += FB_B) {
        int nk = min(FB_B, s_end - s0);
        __syncthreads();   // the previous tile's K and V are read
        fb_load_rows<D>(Ks, hd.k, hd.ldq, s0, nk, d.dk);
        fb_load_rows<D>(Vs, hd.v, hd.ldv, s0, nk, d.dv);
        fb_load_pairs<D>(Kp, hd.k, hd.ldq, s0, nk, d.dk);
        __syncthreads();
        float s[FB_NT][4], dp[FB_NT][4];
        fb_scores<D>(s, Qs + rw * LR, Ks);
        fb_scores<D>(dp, dOs + rw * LR, Vs);
#pragma unroll
        for (int nt = 0; nt < FB_NT; nt++)
#pragma unroll
            for (int x = 0; x < 4; x++) {
                int hh = x / 2, i = rw + g + 8 * hh;
                bool seen = fa_seen(i, 8 * nt + 2 * c + x % 2, nq, nk, t0, s0, lo[hh]);
                s[nt][x] = seen ? fa_exp(sc2 * s[nt][x] - L[hh]) * (dp[nt][x] - Dr[hh]) : 0.f;
            }
        fb_acc<D>(acc, s, Kp);   // dS rounded to bf16 here
    }
    fb_write<D>(dq + (hd.row0 + t0) * hd.ldq + h * d.dk, hd.ldq, acc, rw, nq, d.dk, d.scale, fresh);
}

template <int D> static size_t fb_dkv_smem(void) {
    return (size_t)(4 * FB_B * fb_ldr(D) + 2 * (FB_B / 2) * fb_ldc(D)) * sizeof(uint32_t) +
           2 * FB_B * sizeof(float) + FB_B * sizeof(int);
}

// dK, dV, grid (B*H, key tiles) as k_flash_dkv: K, V by rows; per query tile
// Q and dO by rows and by pairs of rows; the scores transposed (keys as rows,
// queries as columns): P^T = exp(scale K Q^T - lse), dV += P^T dO, dP^T =
// V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q (P^T and dS^T rounded), dK
// times scale at the end. gk or gv may be NULL; one buffer as both gets dk
// written first, then dv added.
template <int D>
__global__ void __launch_bounds__(FB_THREADS)
    k_fb_dkv(FaDims d, const float *q, const float *k, const float *v, const float *dO, const float *lse,
             const float *Dv, const int *first, float *gk, bool fresh_k, float *gv, bool fresh_v) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int LR = fb_ldr(D), LC = fb_ldc(D);
    uint32_t *Ks = (uint32_t *)fa_smem, *Vs = Ks + FB_B * LR, *Qs = Vs + FB_B * LR, *dOs = Qs + FB_B * LR;
    uint32_t *Qp = dOs + FB_B * LR, *dOp = Qp + FB_B / 2 * LC;
    float *Ls = (float *)(dOp + FB_B / 2 * LC), *Ds = Ls + FB_B;
    int *lo = (int *)(Ds + FB_B);
    int bh = blockIdx.x, b = bh / d.H, h = bh % d.H;
    int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3, rw = 16 * w;
    float sc2 = d.scale * FA_LOG2E;
    int s0 = blockIdx.y * FB_B, nk = min(FB_B, d.T - s0), s_last = s0 + nk - 1;
    FbHead hd = fb_head(d, b, h, q, k, v, dO, first);

    fb_load_rows<D>(Ks, hd.k, hd.ldq, s0, nk, d.dk);
    fb_load_rows<D>(Vs, hd.v, hd.ldv, s0, nk, d.dv);
    float ak[D / 8][4], av[D / 8][4];
    fb_zero<D>(ak);
    fb_zero<D>(av);
    // As k_flash_dkv: the query tiles from s0 on, until one whose first
    // query's document begins after the last key (uniform across the block).
    for (int t0 = s0; t0 < d.T && fa_lo(hd.fr, t0) <= s_last; t0 += FB_B) {
        int nq = min(FB_B, d.T - t0);
        __syncthreads();   // the previous query tile is read
        fb_load_rows<D>(Qs, hd.q, hd.ldq, t0, nq, d.dk);
        fb_load_rows<D>(dOs, hd.dO, hd.ldv, t0, nq, d.dv);
        if (gk) fb_load_pairs<D>(Qp, hd.q, hd.ldq, t0, nq, d.dk);
        if (gv) fb_load_pairs<D>(dOp, hd.dO, hd.ldv, t0, nq, d.dv);
        for (int i = threadIdx.x; i < FB_B; i += FB_THREADS) {
            int64_t row = (int64_t)bh * d.T + t0 + i;
            Ls[i] = i < nq ? lse[row] * FA_LOG2E : 0.f;
            Ds[i] = i < nq && Dv ? Dv[row] : 0.f;
            lo[i] = i < nq ? fa_lo(hd.fr, t0 + i) : 0;
        }
        __syncthreads();
        // P^T: row (key) rw + g + 8 hh, column (query) 8 nt + 2c + e.
        float p[FB_NT][4];
        fb_scores<D>(p, Ks + rw * LR, Qs);
#pragma unroll
        for (int nt = 0; nt < FB_NT; nt++)
#pragma unroll
            for (int x = 0; x < 4; x++) {
                int i = 8 * nt + 2 * c + x % 2, j = rw + g + 8 * (x / 2);
                p[nt][x] = fa_seen(i, j, nq, nk, t0, s0, lo[i]) ? fa_exp(sc2 * p[nt][x] - Ls[i]) : 0.f;
            }
        if (gv) fb_acc<D>(av, p, dOp);   // dV += P^T dO, P^T rounded
        if (gk) {
            float dp[FB_NT][4];
            fb_scores<D>(dp, Vs + rw * LR, dOs);
#pragma unroll
            for (int nt = 0; nt < FB_NT; nt++)
#pragma unroll
                for (int x = 0; x < 4; x++) dp[nt][x] = p[nt][x] * (dp[nt][x] - Ds[8 * nt + 2 * c + x % 2]);
            fb_acc<D>(ak, dp, Qp);   // dK += dS^T Q, dS^T rounded
        }
    }
    if (gk) fb_write<D>(gk + (hd.row0 + s0) * hd.ldq + h * d.dk, hd.ldq, ak, rw, nk, d.dk, d.scale, fresh_k);
    __syncthreads();   // gk and gv may be one buffer: dk first
    if (gv) fb_write<D>(gv + (hd.row0 + s0) * hd.ldv + h * d.dv, hd.ldv, av, rw, nk, d.dv, 1.f, fresh_v);
}

// The padded head dim of the kernels' instance, or 0: the float32 kernels.
static int fb_dim(int dk, int dv) {
    int m = dk > dv ? dk : dv;
    if (dk < 1 || dv < 1 || dk % 2 || dv % 2 || m > FA_MAXD) return 0;
    return m <= 32 ? 32 : m <= 64 ? 64 : 128;
}

extern "C" bool cu_flash_bf16_takes(int dk, int dv) { return cu_bf16_products() && fb_dim(dk, dv) != 0; }

template <int D> static void fb_forward(const FaDims &d, const float *q, const float *k, const float *v,
                                        const int *first, float *o, float *lse) {
    size_t smem = fb_fwd_smem<D>();
    cu_smem_prepare((const void *)k_fb_fwd<D>, smem, "attention (bf16)", d.dk, d.dv);
    dim3 grid((unsigned)(d.B * d.H), (unsigned)fa_tiles(&d));
    k_fb_fwd<D><<<grid, FB_THREADS, smem, cu_stream>>>(d, q, k, v, first, o, lse);
    CU_LAUNCHED();
}

void cu_flash_bf16_forward(const FaDims &d, const float *q, const float *k, const float *v, const int *first,
                           float *o, float *lse) {
    switch (fb_dim(d.dk, d.dv)) {
    case 32: fb_forward<32>(d, q, k, v, first, o, lse); break;
    case 64: fb_forward<64>(d, q, k, v, first, o, lse); break;
    case 128: fb_forward<128>(d, q, k, v, first, o, lse); break;
    default: ASSERT(false, "attention (bf16): head dims dk %d, dv %d have no bf16 kernels", d.dk, d.dv);
    }
}

template <int D> static void fb_backward(const FaDims &d, const float *q, const float *k, const float *v,
                                         const float *dO, const float *lse, const float *Dv, const int *first,
                                         float *gq, bool fq, float *gk, bool fk, float *gv, bool fv) {
    dim3 grid((unsigned)(d.B * d.H), (unsigned)fa_tiles(&d));
    if (gq) {   // dq first, as bwd_launch: q passed also as k or v gets its gradient written here
        size_t smem = fb_dq_smem<D>();
        cu_smem_prepare((const void *)k_fb_dq<D>, smem, "attention backward (bf16)", d.dk, d.dv);
        k_fb_dq<D><<<grid, FB_THREADS, smem, cu_stream>>>(d, q, k, v, dO, lse, Dv, first, gq, fq);
        CU_LAUNCHED();
    }
    if (gk || gv) {
        size_t smem = fb_dkv_smem<D>();
        cu_smem_prepare((const void *)k_fb_dkv<D>, smem, "attention backward (bf16)", d.dk, d.dv);
        k_fb_dkv<D><<<grid, FB_THREADS, smem, cu_stream>>>(d, q, k, v, dO, lse, Dv, first, gk, fk, gv, fv);
        CU_LAUNCHED();
    }
}

void cu_flash_bf16_backward(const FaDims &d, const float *q, const float *k, const float *v, const float *dO,
                            const float *lse, const float *Dv, const int *first, float *gq, bool fq, float *gk,
                            bool fk, float *gv, bool fv) {
    switch (fb_dim(d.dk, d.dv)) {
    case 32: fb_backward<32>(d, q, k, v, dO, lse, Dv, first, gq, fq, gk, fk, gv, fv); break;
    case 64: fb_backward<64>(d, q, k, v, dO, lse, Dv, first, gq, fq, gk, fk, gv, fv); break;
    case 128: fb_backward<128>(d, q, k, v, dO, lse, Dv, first, gq, fq, gk, fk, gv, fv); break;
    default: ASSERT(false, "attention backward (bf16): head dims dk %d, dv %d have no bf16 kernels", d.dk, d.dv);
    }
}
#endif
