// gdn_bf16.cuh: blk_gemm's bf16 form on the tensor cores, for op_gdn's
// per-chunk products under [train] precision = bf16 (GdnArgs.bf16, float32
// build only). Included by gdn_chunk.cuh after blk_gemm_s.
//
// What it computes, exactly: C = alpha op(A) op(B) + beta C as blk_gemm_s,
// except that every element of op(A) and op(B) is rounded to bf16 (round to
// nearest, ties to even: __float2bfloat16_rn; a NaN stays a NaN) as it is
// loaded. The products of two bf16 numbers (16 significant bits at most) are
// exact in float32; they are summed in float32 by the tensor cores
// (mma.sync m16n8k16, in the hardware's order within each step of 16, the
// steps of K in ascending order), then alpha acc is rounded (mul_rn) and,
// with beta, fma(C, beta, that): the float32 epilogue of blk_tiles. So the
// error of an output against the exact product of the rounded operands is a
// float32 summation error; against the float32 product, each operand adds
// at most 2^-8 of its magnitude.
//
// Layout. C is walked in tiles of 64 x 64 and K in slices of 64. For a
// tile and slice, the block of op(A)'s and op(B)'s stored matrices that the
// slice reads (64 x 64 of the matrix as it lies in memory: A's rows when A
// is not transposed, its columns when it is, and so for B) is read along
// its contiguous dimension, four floats a load where the matrix is 16-byte
// aligned with a leading dimension that keeps it so, else one at a time,
// zeros outside the matrix; rounded; and kept in shared memory as bf16 rows
// of pitch BF_PITCH (144 bytes: the 8 rows that one ldmatrix reads fall on
// distinct banks). Each warp owns 16 rows by 32 columns of the tile (warp w:
// rows 16 (w % 4), columns 32 (w / 4)), four m16n8 accumulators, and takes
// its fragments with ldmatrix, transposing (.trans) where the stored block
// runs the other way from the fragment, then one mma.sync m16n8k16 per
// accumulator and step of 16 along K; steps past the last multiple of 16
// that K reaches are not taken (mma_bf16.cuh has the fragments' layouts).
// The epilogue writes each accumulator element from its register: alpha acc
// rounded, and with beta, fma(C, beta, that). One barrier after a slice is
// in, one before the next slice overwrites it, and the closing one.
#ifndef AG_GDN_BF16_CUH
#define AG_GDN_BF16_CUH

#ifndef AG_DOUBLE
#include <cuda_bf16.h>

#include "mma_bf16.cuh"

#define BF_TILE 64               // C's tile (rows and columns) and K's slice
#define BF_PITCH (BF_TILE + 8)   // bf16 row pitch of a staged block
static_assert(2 * BF_TILE * BF_PITCH * 2 <= (int)sizeof(Tiles), "blk_gemm_bf16_s: two staged blocks in the Tiles");

// Rows r0 .. r0 + 63 and columns c0 .. c0 + 63 of the row-major R x Cn
// matrix X (leading dimension ld) into dst (64 rows of BF_PITCH bf16),
// rounded to nearest even, zeros outside X. vec: X and ld keep every
// fourth element 16-byte aligned (one float4 load per four).
__device__ __forceinline__ void bf_stage(__nv_bfloat16 *dst, const float *X, int ld, int R, int Cn, int r0, int c0,
                                         bool vec) {
    constexpr int Q = BF_TILE / 4;   // groups of four along a row
#pragma unroll 4
    for (int e = threadIdx.x; e < BF_TILE * Q; e += GDN_NT) {
        int r = e / Q, c = e % Q * 4, gr = r0 + r, gc = c0 + c;
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
        if (gr < R && gc < Cn) {
            const float *p = X + (int64_t)gr * ld + gc;
            if (vec && gc + 3 < Cn) x = *reinterpret_cast<const float4 *>(p);
            else {
                x.x = p[0];
                if (gc + 1 < Cn) x.y = p[1];
                if (gc + 2 < Cn) x.z = p[2];
                if (gc + 3 < Cn) x.w = p[3];
            }
        }
        uint2 u = make_uint2(fb_pack(x.x, x.y), fb_pack(x.z, x.w));
        *reinterpret_cast<uint2 *>(dst + r * BF_PITCH + c) = u;
    }
}

// blk_gemm_s with bf16 operands (the header above): the same arguments
// (without a row factor), the same closing barrier.
static __device__ __noinline__ void blk_gemm_bf16_s(Tiles *sh, bool ta, bool tb, int M, int N, int K, real alpha,
                                                    const real *A, int lda, const real *B, int ldb, real beta,
                                                    real *C, int ldc) {
    __nv_bfloat16 *sa = reinterpret_cast<__nv_bfloat16 *>(sh->s), *sb = sa + BF_TILE * BF_PITCH;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wm = warp % 4 * 16, wn = warp / 4 * 32;
    int q = lane / 8, lr = lane % 8, g = lane / 4, c2 = lane % 4 * 2;
    bool va = (((uintptr_t)A | (uintptr_t)lda * sizeof(float)) & 15) == 0;
    bool vb = (((uintptr_t)B | (uintptr_t)ldb * sizeof(float)) & 15) == 0;
    // Lane's ldmatrix row and column within a 16 x 16 step: A's fragment
    // (matrices: rows +0/+8 of op(A) first, then k +8), B's pair of n8
    // fragments (k +0/+8 first, then n +8).
    int ar = ta ? lr + 8 * (q >> 1) : wm + lr + 8 * (q & 1), ac = ta ? wm + 8 * (q & 1) : 8 * (q >> 1);
    int br = tb ? lr + 8 * (q >> 1) : lr + 8 * (q & 1), bc = tb ? 8 * (q & 1) : 8 * (q >> 1);
    int tn = (N + BF_TILE - 1) / BF_TILE, nt = (M + BF_TILE - 1) / BF_TILE * tn;
    int ns = (K + BF_TILE - 1) / BF_TILE;
    for (int tile = 0; tile < nt; tile++) {
        int i0 = tile / tn * BF_TILE, j0 = tile % tn * BF_TILE;
        float acc[4][4];
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[t][e] = 0.f;
        for (int s = 0; s < ns; s++) {
            int k0 = s * BF_TILE, nk = (min(BF_TILE, K - k0) + 15) / 16;
            if (ta) bf_stage(sa, A, lda, K, M, k0, i0, va);
            else bf_stage(sa, A, lda, M, K, i0, k0, va);
            if (tb) bf_stage(sb, B, ldb, N, K, j0, k0, vb);
            else bf_stage(sb, B, ldb, K, N, k0, j0, vb);
            __syncthreads();   // the slice is in
            for (int kk = 0; kk < nk; kk++) {
                uint32_t a[4], b[2][4];
                int k = 16 * kk;
                fb_ldsm4(a, ta ? sa + (k + ar) * BF_PITCH + ac : sa + ar * BF_PITCH + k + ac, ta);
#pragma unroll
                for (int p = 0; p < 2; p++) {
                    int n = wn + 16 * p;
                    fb_ldsm4(b[p], tb ? sb + (n + br) * BF_PITCH + k + bc : sb + (k + br) * BF_PITCH + n + bc, !tb);
                }
#pragma unroll
                for (int t = 0; t < 4; t++)
                    fb_mma(acc[t], a[0], a[1], a[2], a[3], b[t / 2][t % 2 * 2], b[t / 2][t % 2 * 2 + 1]);
            }
            if (s + 1 < ns || tile + 1 < nt) __syncthreads();   // the slice is no longer read
        }
        // Accumulator t of the warp: rows i0 + wm + g (+8), columns j0 + wn + 8 t + c2 (+1).
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = i0 + wm + g + 8 * (e / 2), j = j0 + wn + 8 * t + c2 + e % 2;
                if (i < M && j < N) {
                    real *cp = C + (int64_t)i * ldc + j, v = mul_rn(alpha, acc[t][e]);
                    *cp = beta == 0 ? v : fma(*cp, beta, v);
                }
            }
    }
    __syncthreads();   // C is written
}
#endif

// A per-chunk product at the op's precision: bf16 (blk_gemm_bf16_s) in the
// kernels' bf16 instances (BF: the node's GDN_ARG_BF16, float32 build only),
// else blk_gemm. A template, so that the float32 and float64 instances are
// the code they were: the same products, the same registers.
template <bool BF>
__device__ __forceinline__ void blk_mm(Tiles *sh, bool ta, bool tb, int M, int N, int K, real alpha, const real *A,
                                       int lda, const real *B, int ldb, real beta, real *C, int ldc) {
#ifndef AG_DOUBLE
    if constexpr (BF) {
        blk_gemm_bf16_s(sh, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#else
    static_assert(!BF, "bf16 products need the float32 build");
#endif
    blk_gemm_s(sh, ta, tb, M, N, K, alpha, A, lda, NULL, B, ldb, beta, C, ldc);
}

#endif
