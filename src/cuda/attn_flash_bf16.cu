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
// PTX; mma_bf16.cuh has the fragments' layouts). First a pass per operand
// (k_fb_pack) rounds Q, K, V and dO to bf16 into a copy by head (B H rows of
// T x FB_D, zero columns from dk or dv on) in the tape's device arena; the
// kernels then copy 64-row tiles of it into shared memory with cp.async
// (16 bytes a copy, zero rows past the tile's end), two stages: the next
// key (forward, dQ) or query tile (dK, dV) is in flight while the block
// works on this one. A block is 4 warps over a tile of FB_B = 64 queries
// (forward, dQ) or keys (dK, dV); warp w owns the tile's rows 16 w ..
// 16 w + 15. A tile lies in shared memory by rows, a row of FB_D bf16 and
// 8 more (16 bytes: the 8 rows of one ldmatrix fall on distinct banks);
// every fragment comes from it by ldmatrix .x4: plain where the product
// runs along the tile's rows' columns (Q and K in S = Q K^T), transposed
// where it runs along its rows (V in P V, K in dS K). The scores' C
// fragments of two neighbouring 8-key tiles are the A fragment of 16 keys
// (a0 = d0, d1 of the first, a1 = d2, d3, a2 and a3 the same of the
// second), so P and dS go from the scores' registers to the next product
// rounded, without shared memory. Each accumulator takes its products in
// ascending order along the summed dimension.
#include "attn_flash.cuh"
#include "mma_bf16.cuh"

#ifndef AG_DOUBLE
#include <cuda_bf16.h>
#include <stdint.h>

#define FB_B 64
#define FB_THREADS 128
#define FB_NT (FB_B / 8)   // 8-column tiles of a tile's scores
static_assert(FB_B == FA_B, "the grid's tiles (fa_tiles) are the float32 kernels' FA_B rows");

typedef __nv_bfloat16 bf16;

// Blocks a multiprocessor that the forward's and the backward's kernels of
// head dim D are compiled for (a register cap: 64 K registers over
// FB_THREADS times it): 4 and 3 were the fastest pair of those timed on an
// H100 at heads of 64 (docs/bench/attn_bf16_caps_h100.txt; a cap of 4 in
// the backward spills).
#ifndef FB_MINB_FWD
#define FB_MINB_FWD 4
#endif
#ifndef FB_MINB_BWD
#define FB_MINB_BWD 3
#endif
__host__ __device__ constexpr int fb_minb_fwd(int D) { return D <= 64 ? FB_MINB_FWD : 1; }
__host__ __device__ constexpr int fb_minb_bwd(int D) { return D <= 64 ? FB_MINB_BWD : 1; }

// A tile in shared memory: FB_B rows of D bf16 and 8 more.
__host__ __device__ constexpr int fb_pitch(int D) { return D + 8; }
__host__ __device__ constexpr int fb_tile(int D) { return FB_B * fb_pitch(D); }

// The copy by head: dst row (b H + h) n + t = X's row b n + t, its columns
// h d .. h d + d - 1 (ld the leading dim), rounded, zeros to D. Pairs of
// columns, one a thread of the grid's stride.
template <int D>
__global__ void k_fb_pack(uint32_t *dst, const float *x, int64_t ld, int B, int n, int H, int d) {
    int64_t total = (int64_t)B * H * n * (D / 2);
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int col = 2 * (int)(e % (D / 2));
        int64_t r = e / (D / 2), bh = r / n;
        int t = (int)(r % n), h = (int)(bh % H);
        const float *s = x + (bh / H * n + t) * ld + (int64_t)h * d + col;
        dst[e] = fb_pack(col < d ? s[0] : 0.f, col + 1 < d ? s[1] : 0.f);
    }
}

// Rows j0 .. j0 + 63 of a head's copy (src its row 0) into a tile, rows
// from n on zero. cp.async; the caller commits.
template <int D> __device__ __forceinline__ void fb_cp_tile(bf16 *dst, const bf16 *src, int j0, int n) {
    constexpr int CH = D / 8, P = fb_pitch(D);
    for (int e = threadIdx.x; e < FB_B * CH; e += FB_THREADS) {
        int j = e / CH, ch = 8 * (e % CH);
        bool in = j < n;
        cu_cp16(dst + j * P + ch, src + (int64_t)(in ? j0 + j : j0) * D + ch, in ? 16 : 0);
    }
}

// acc[nt] = the warp's 16 x 64 scores A Bt^T over the padded head dim: A
// the warp's first row of a tile, Bt a whole tile (its row 8 nt + g is
// score column 8 nt + g).
template <int D>
__device__ __forceinline__ void fb_scores(float acc[FB_NT][4], const bf16 *A, const bf16 *Bt) {
    constexpr int P = fb_pitch(D);
    int l = threadIdx.x & 31;
    // The lanes' rows and columns of the .x4 loads: A's four 8 x 8 blocks
    // are a0..a3; Bt's are b0, b1 of an 8-row tile, then of the next.
    int ar = (l & 7) + (l >> 3 & 1) * 8, ac = (l >> 4) * 8, br = (l & 7) + (l >> 4) * 8, bc = (l >> 3 & 1) * 8;
#pragma unroll
    for (int nt = 0; nt < FB_NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[4];
        fb_ldsm4(a, A + ar * P + 16 * kk + ac, false);
#pragma unroll
        for (int np = 0; np < FB_NT / 2; np++) {
            uint32_t b[4];
            fb_ldsm4(b, Bt + (16 * np + br) * P + 16 * kk + bc, false);
            fb_mma(acc[2 * np], a[0], a[1], a[2], a[3], b[0], b[1]);
            fb_mma(acc[2 * np + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
        }
    }
}

// acc[nt] += P Y over the tile's 64 rows of Y: P the warp's 16 x 64 scores
// in C fragments (float32), rounded here.
template <int D>
__device__ __forceinline__ void fb_acc(float acc[D / 8][4], const float p[FB_NT][4], const bf16 *Y) {
    constexpr int P = fb_pitch(D);
    int l = threadIdx.x & 31;
    int yr = (l & 7) + (l >> 3 & 1) * 8, yc = (l >> 4) * 8;   // b0, b1 of 8 columns, then of the next 8
#pragma unroll
    for (int kk = 0; kk < FB_B / 16; kk++) {
        uint32_t a0 = fb_pack(p[2 * kk][0], p[2 * kk][1]), a1 = fb_pack(p[2 * kk][2], p[2 * kk][3]);
        uint32_t a2 = fb_pack(p[2 * kk + 1][0], p[2 * kk + 1][1]), a3 = fb_pack(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
        for (int np = 0; np < D / 16; np++) {
            uint32_t b[4];
            fb_ldsm4(b, Y + (16 * kk + yr) * P + 16 * np + yc, true);
            fb_mma(acc[2 * np], a0, a1, a2, a3, b[0], b[1]);
            fb_mma(acc[2 * np + 1], a0, a1, a2, a3, b[2], b[3]);
        }
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

// Q, then two stages of K and V.
template <int D> static size_t fb_fwd_smem(void) { return (size_t)5 * fb_tile(D) * sizeof(bf16); }

// The forward, grid (B*H, query tiles) as k_flash_fwd: per key tile S = Q K^T,
// the online softmax on the C fragments (a row's max across its group's 4
// lanes, each lane keeping its part of l, summed at the end), A = diag(alpha)
// A + P V. qb, kb, vb: the copies by head (T, Tk, Tk rows a head).
template <int D>
__global__ void __launch_bounds__(FB_THREADS, fb_minb_fwd(D))
    k_fb_fwd(FaDims d, const bf16 *qb, const bf16 *kb, const bf16 *vb, const int *first, float *o, float *lse) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int P = fb_pitch(D), TL = fb_tile(D);
    bf16 *Qs = (bf16 *)fa_smem, *KV = Qs + TL;   // stage s: K at KV + 2 s TL, V after it
    int bh = blockIdx.x, b = bh / d.H, h = bh % d.H;
    int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3, rw = 16 * w;
    float sc2 = d.scale * FA_LOG2E;
    int t0 = (gridDim.y - 1 - blockIdx.y) * FB_B, nq = min(FB_B, d.T - t0), ta = d.qoff + t0;
    int64_t ldv = (int64_t)d.H * d.dv, row0 = (int64_t)b * d.T;
    const bf16 *qh = qb + (int64_t)bh * d.T * D, *kh = kb + (int64_t)bh * d.Tk * D, *vh = vb + (int64_t)bh * d.Tk * D;
    const int *fr = first ? first + row0 : NULL;

    // The key tiles start at a multiple of FB_B, as the CPU's (ATTN_TILE_K):
    // P is rounded at the running max, the max over the keys of the tiles so
    // far, so the tiles' edges are part of the semantics. (A prefill window,
    // key0: from its first key, as attn_prefix_forward.)
    int s_end = ta + nq, s_first = d.key0 ? d.key0[b] : fa_lo(fr, t0) / FB_B * FB_B;
    fb_cp_tile<D>(Qs, qh, t0, nq);
    fb_cp_tile<D>(KV, kh, s_first, min(FB_B, s_end - s_first));
    fb_cp_tile<D>(KV + TL, vh, s_first, min(FB_B, s_end - s_first));
    cu_cp_commit();
    float acc[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    int lo[2];
    fb_zero<D>(acc);
    for (int hh = 0; hh < 2; hh++) {
        int i = rw + g + 8 * hh;
        lo[hh] = i >= nq ? 0 : d.key0 ? d.key0[b] : fa_lo(fr, t0 + i);
    }
    for (int s0 = s_first, it = 0; s0 < s_end; s0 += FB_B, it++) {
        int nk = min(FB_B, s_end - s0), s1 = s0 + FB_B;
        const bf16 *Ks = KV + 2 * (it & 1) * TL, *Vs = Ks + TL;
        if (s1 < s_end) {   // the next tile into the other stage, read last before the previous closing barrier
            bf16 *Kn = KV + 2 * (~it & 1) * TL;
            fb_cp_tile<D>(Kn, kh, s1, min(FB_B, s_end - s1));
            fb_cp_tile<D>(Kn + TL, vh, s1, min(FB_B, s_end - s1));
        }
        cu_cp_commit();
        cu_cp_wait<1>();
        __syncthreads();
        float s[FB_NT][4];
        fb_scores<D>(s, Qs + rw * P, Ks);
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
        __syncthreads();         // this stage is read: the next iteration but one fills it
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

// The backward's operands: the copies by head (T rows a head).
struct FbOps {
    const bf16 *q, *k, *v, *dO;
};

// Q, dO, then two stages of K and V.
template <int D> static size_t fb_dq_smem(void) { return (size_t)6 * fb_tile(D) * sizeof(bf16); }

// dQ, grid (B*H, query tiles) as k_flash_dq: per key tile S = Q K^T, dP =
// dO V^T, dS = P (dP - D) in float32 on the fragments, dQ += dS K (dS
// rounded), times scale at the end.
template <int D>
__global__ void __launch_bounds__(FB_THREADS, fb_minb_bwd(D))
    k_fb_dq(FaDims d, FbOps x, const float *lse, const float *Dv, const int *first, float *dq, bool fresh) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int P = fb_pitch(D), TL = fb_tile(D);
    bf16 *Qs = (bf16 *)fa_smem, *dOs = Qs + TL, *KV = dOs + TL;   // stage s: K at KV + 2 s TL, V after it
    int bh = blockIdx.x, b = bh / d.H, h = bh % d.H;
    int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3, rw = 16 * w;
    float sc2 = d.scale * FA_LOG2E;
    int t0 = (gridDim.y - 1 - blockIdx.y) * FB_B, nq = min(FB_B, d.T - t0);
    int64_t ldq = (int64_t)d.H * d.dk, row0 = (int64_t)b * d.T, hs = (int64_t)bh * d.T * D;
    const bf16 *kh = x.k + hs, *vh = x.v + hs;
    const int *fr = first ? first + row0 : NULL;

    int s_end = t0 + nq, s_first = fa_lo(fr, t0);
    fb_cp_tile<D>(Qs, x.q + hs, t0, nq);
    fb_cp_tile<D>(dOs, x.dO + hs, t0, nq);
    fb_cp_tile<D>(KV, kh, s_first, min(FB_B, s_end - s_first));
    fb_cp_tile<D>(KV + TL, vh, s_first, min(FB_B, s_end - s_first));
    cu_cp_commit();
    float acc[D / 8][4], L[2], Dr[2];
    int lo[2];
    fb_zero<D>(acc);
    for (int hh = 0; hh < 2; hh++) {
        int i = rw + g + 8 * hh;
        int64_t row = (int64_t)bh * d.T + t0 + i;
        L[hh] = i < nq ? lse[row] * FA_LOG2E : 0.f;
        Dr[hh] = i < nq ? Dv[row] : 0.f;
        lo[hh] = i < nq ? fa_lo(fr, t0 + i) : 0;
    }
    for (int s0 = s_first, it = 0; s0 < s_end; s0 += FB_B, it++) {
        int nk = min(FB_B, s_end - s0), s1 = s0 + FB_B;
        const bf16 *Ks = KV + 2 * (it & 1) * TL, *Vs = Ks + TL;
        if (s1 < s_end) {
            bf16 *Kn = KV + 2 * (~it & 1) * TL;
            fb_cp_tile<D>(Kn, kh, s1, min(FB_B, s_end - s1));
            fb_cp_tile<D>(Kn + TL, vh, s1, min(FB_B, s_end - s1));
        }
        cu_cp_commit();
        cu_cp_wait<1>();
        __syncthreads();
        float s[FB_NT][4], dp[FB_NT][4];
        fb_scores<D>(s, Qs + rw * P, Ks);
        fb_scores<D>(dp, dOs + rw * P, Vs);
#pragma unroll
        for (int nt = 0; nt < FB_NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int hh = e / 2, i = rw + g + 8 * hh;
                bool seen = fa_seen(i, 8 * nt + 2 * c + e % 2, nq, nk, t0, s0, lo[hh]);
                s[nt][e] = seen ? fa_exp(sc2 * s[nt][e] - L[hh]) * (dp[nt][e] - Dr[hh]) : 0.f;
            }
        fb_acc<D>(acc, s, Ks);   // dS rounded to bf16 here
        __syncthreads();
    }
    fb_write<D>(dq + (row0 + t0) * ldq + h * d.dk, ldq, acc, rw, nq, d.dk, d.scale, fresh);
}

// A query tile's stage of k_fb_dkv: Q, dO, and the rows' lse (log2 units),
// D and first keys.
template <int D> struct FbStage {
    bf16 *Q, *dO;
    float *L, *Dr;
    int *lo;
};

template <int D> __device__ __forceinline__ FbStage<D> fb_stage(unsigned char *base, int s) {
    constexpr int TL = fb_tile(D);
    FbStage<D> st;
    st.Q = (bf16 *)base + 2 * s * TL, st.dO = st.Q + TL;
    st.L = (float *)((bf16 *)base + 4 * TL) + 3 * FB_B * s, st.Dr = st.L + FB_B, st.lo = (int *)(st.Dr + FB_B);
    return st;
}

// K, V, then two stages of Q, dO and the rows' three numbers.
template <int D> static size_t fb_dkv_smem(void) {
    return (size_t)6 * fb_tile(D) * sizeof(bf16) + 2 * 3 * FB_B * sizeof(float);
}

// Query tile t0 (nq rows) of head bh into a stage: cp.async for Q and dO
// (the caller commits), plain stores for the rows' numbers.
template <int D>
__device__ __forceinline__ void fb_dkv_load(const FbStage<D> &st, const FaDims &d, const FbOps &x, int64_t hs,
                                            int bh, int t0, const float *lse, const float *Dv, const int *fr) {
    int nq = min(FB_B, d.T - t0);
    fb_cp_tile<D>(st.Q, x.q + hs, t0, nq);
    fb_cp_tile<D>(st.dO, x.dO + hs, t0, nq);
    for (int i = threadIdx.x; i < FB_B; i += FB_THREADS) {
        int64_t row = (int64_t)bh * d.T + t0 + i;
        st.L[i] = i < nq ? lse[row] * FA_LOG2E : 0.f;
        st.Dr[i] = i < nq && Dv ? Dv[row] : 0.f;
        st.lo[i] = i < nq ? fa_lo(fr, t0 + i) : 0;
    }
}

// dK, dV, grid (B*H, key tiles) as k_flash_dkv: per query tile the scores
// transposed (keys as rows, queries as columns): P^T = exp(scale K Q^T -
// lse), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q
// (P^T and dS^T rounded), dK times scale at the end. gk or gv may be NULL;
// one buffer as both gets dk written first, then dv added.
template <int D>
__global__ void __launch_bounds__(FB_THREADS, fb_minb_bwd(D))
    k_fb_dkv(FaDims d, FbOps x, const float *lse, const float *Dv, const int *first, float *gk, bool fresh_k,
             float *gv, bool fresh_v) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int P = fb_pitch(D), TL = fb_tile(D);
    bf16 *Ks = (bf16 *)fa_smem, *Vs = Ks + TL;
    unsigned char *stages = (unsigned char *)(Vs + TL);
    int bh = blockIdx.x, b = bh / d.H, h = bh % d.H;
    int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3, rw = 16 * w;
    float sc2 = d.scale * FA_LOG2E;
    int s0 = blockIdx.y * FB_B, nk = min(FB_B, d.T - s0), s_last = s0 + nk - 1;
    int64_t ldq = (int64_t)d.H * d.dk, ldv = (int64_t)d.H * d.dv, row0 = (int64_t)b * d.T, hs = (int64_t)bh * d.T * D;
    const int *fr = first ? first + row0 : NULL;

    fb_cp_tile<D>(Ks, x.k + hs, s0, nk);
    fb_cp_tile<D>(Vs, x.v + hs, s0, nk);
    fb_dkv_load<D>(fb_stage<D>(stages, 0), d, x, hs, bh, s0, lse, Dv, fr);
    cu_cp_commit();
    float ak[D / 8][4], av[D / 8][4];
    fb_zero<D>(ak);
    fb_zero<D>(av);
    // As k_flash_dkv: the query tiles from s0 on, until one whose first
    // query's document begins after the last key (uniform across the block;
    // the first, s0, always runs).
    for (int t0 = s0, it = 0; t0 < d.T; t0 += FB_B, it++) {
        int nq = min(FB_B, d.T - t0), t1 = t0 + FB_B;
        FbStage<D> st = fb_stage<D>(stages, it & 1);
        bool next = t1 < d.T && fa_lo(fr, t1) <= s_last;
        if (next) fb_dkv_load<D>(fb_stage<D>(stages, ~it & 1), d, x, hs, bh, t1, lse, Dv, fr);
        cu_cp_commit();
        cu_cp_wait<1>();
        __syncthreads();
        // P^T: row (key) rw + g + 8 hh, column (query) 8 nt + 2c + e.
        float p[FB_NT][4];
        fb_scores<D>(p, Ks + rw * P, st.Q);
#pragma unroll
        for (int nt = 0; nt < FB_NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = 8 * nt + 2 * c + e % 2, j = rw + g + 8 * (e / 2);
                p[nt][e] = fa_seen(i, j, nq, nk, t0, s0, st.lo[i]) ? fa_exp(sc2 * p[nt][e] - st.L[i]) : 0.f;
            }
        if (gv) fb_acc<D>(av, p, st.dO);   // dV += P^T dO, P^T rounded
        if (gk) {
            float dp[FB_NT][4];
            fb_scores<D>(dp, Vs + rw * P, st.dO);
#pragma unroll
            for (int nt = 0; nt < FB_NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) dp[nt][e] = p[nt][e] * (dp[nt][e] - st.Dr[8 * nt + 2 * c + e % 2]);
            fb_acc<D>(ak, dp, st.Q);   // dK += dS^T Q, dS^T rounded
        }
        __syncthreads();   // this stage is read: the next iteration but one fills it
        if (!next) break;
    }
    if (gk) fb_write<D>(gk + (row0 + s0) * ldq + h * d.dk, ldq, ak, rw, nk, d.dk, d.scale, fresh_k);
    __syncthreads();   // gk and gv may be one buffer: dk first
    if (gv) fb_write<D>(gv + (row0 + s0) * ldv + h * d.dv, ldv, av, rw, nk, d.dv, 1.f, fresh_v);
}

// The padded head dim of the kernels' instance, or 0: the float32 kernels.
static int fb_dim(int dk, int dv) {
    int m = dk > dv ? dk : dv;
    if (dk < 1 || dv < 1 || dk % 2 || dv % 2 || m > FA_MAXD) return 0;
    return m <= 32 ? 32 : m <= 64 ? 64 : 128;
}

extern "C" bool cu_flash_bf16_takes(int dk, int dv) { return cu_bf16_products() && fb_dim(dk, dv) != 0; }

// X (B x n rows of ld = H d) by head, rounded, into the tape's device arena.
template <int D> static const bf16 *fb_by_head(Tape *tp, const float *x, int B, int n, int H, int d) {
    int64_t pairs = (int64_t)B * H * n * (D / 2);
    uint32_t *dst = (uint32_t *)tape_dalloc(tp, (size_t)pairs * sizeof(uint32_t));
    k_fb_pack<D><<<cu_grid(pairs), CU_THREADS, 0, cu_stream>>>(dst, x, (int64_t)H * d, B, n, H, d);
    CU_LAUNCHED();
    return (const bf16 *)dst;
}

template <int D> static void fb_forward(Tape *tp, const FaDims &d, const float *q, const float *k, const float *v,
                                        const int *first, float *o, float *lse) {
    const bf16 *qb = fb_by_head<D>(tp, q, d.B, d.T, d.H, d.dk), *kb = fb_by_head<D>(tp, k, d.B, d.Tk, d.H, d.dk);
    const bf16 *vb = fb_by_head<D>(tp, v, d.B, d.Tk, d.H, d.dv);
    size_t smem = fb_fwd_smem<D>();
    cu_smem_prepare((const void *)k_fb_fwd<D>, smem, "attention (bf16)", d.dk, d.dv);
    dim3 grid((unsigned)(d.B * d.H), (unsigned)fa_tiles(&d));
    k_fb_fwd<D><<<grid, FB_THREADS, smem, cu_stream>>>(d, qb, kb, vb, first, o, lse);
    CU_LAUNCHED();
}

void cu_flash_bf16_forward(Tape *tp, const FaDims &d, const float *q, const float *k, const float *v,
                           const int *first, float *o, float *lse) {
    switch (fb_dim(d.dk, d.dv)) {
    case 32: fb_forward<32>(tp, d, q, k, v, first, o, lse); break;
    case 64: fb_forward<64>(tp, d, q, k, v, first, o, lse); break;
    case 128: fb_forward<128>(tp, d, q, k, v, first, o, lse); break;
    default: ASSERT(false, "attention (bf16): head dims dk %d, dv %d have no bf16 kernels", d.dk, d.dv);
    }
}

template <int D> static void fb_backward(Tape *tp, const FaDims &d, const float *q, const float *k, const float *v,
                                         const float *dO, const float *lse, const float *Dv, const int *first,
                                         float *gq, bool fq, float *gk, bool fk, float *gv, bool fv) {
    FbOps x;
    x.q = fb_by_head<D>(tp, q, d.B, d.T, d.H, d.dk), x.k = fb_by_head<D>(tp, k, d.B, d.T, d.H, d.dk);
    x.v = fb_by_head<D>(tp, v, d.B, d.T, d.H, d.dv), x.dO = fb_by_head<D>(tp, dO, d.B, d.T, d.H, d.dv);
    dim3 grid((unsigned)(d.B * d.H), (unsigned)fa_tiles(&d));
    if (gq) {   // dq first, as bwd_launch: q passed also as k or v gets its gradient written here
        size_t smem = fb_dq_smem<D>();
        cu_smem_prepare((const void *)k_fb_dq<D>, smem, "attention backward (bf16)", d.dk, d.dv);
        k_fb_dq<D><<<grid, FB_THREADS, smem, cu_stream>>>(d, x, lse, Dv, first, gq, fq);
        CU_LAUNCHED();
    }
    if (gk || gv) {
        size_t smem = fb_dkv_smem<D>();
        cu_smem_prepare((const void *)k_fb_dkv<D>, smem, "attention backward (bf16)", d.dk, d.dv);
        k_fb_dkv<D><<<grid, FB_THREADS, smem, cu_stream>>>(d, x, lse, Dv, first, gk, fk, gv, fv);
        CU_LAUNCHED();
    }
}

void cu_flash_bf16_backward(Tape *tp, const FaDims &d, const float *q, const float *k, const float *v,
                            const float *dO, const float *lse, const float *Dv, const int *first, float *gq, bool fq,
                            float *gk, bool fk, float *gv, bool fv) {
    switch (fb_dim(d.dk, d.dv)) {
    case 32: fb_backward<32>(tp, d, q, k, v, dO, lse, Dv, first, gq, fq, gk, fk, gv, fv); break;
    case 64: fb_backward<64>(tp, d, q, k, v, dO, lse, Dv, first, gq, fq, gk, fk, gv, fv); break;
    case 128: fb_backward<128>(tp, d, q, k, v, dO, lse, Dv, first, gq, fq, gk, fk, gv, fv); break;
    default: ASSERT(false, "attention backward (bf16): head dims dk %d, dv %d have no bf16 kernels", d.dk, d.dv);
    }
}
#endif
