// gdn_bf16.cuh: blk_gemm's bf16 form on the tensor cores, for op_gdn's
// per-chunk products under [train] precision = bf16 (GdnArgs.bf16, float32
// build only). Included by gdn_chunk.cuh after blk_gemm_s.
//
// What it computes, exactly: C = alpha op(A) op(B) + beta C as blk_gemm_s,
// except that every element of op(A) and op(B) is rounded to bf16 (round to
// nearest, ties to even: __float2bfloat16_rn; a NaN stays a NaN) as it is
// loaded: an element of A with the row factor `as` is rnd(as[r] * A[r][k]),
// the float32 product (mul_rn) rounded, as blk_fetch forms it. The products
// of two bf16 numbers (16 significant bits at most) are exact in float32;
// they are summed in float32 by the tensor cores (mma.sync m16n8k16 through
// nvcuda::wmma, in the hardware's order within each slice of 16, the slices
// of K in ascending order), then alpha acc is rounded (mul_rn) and, with
// beta, fma(C, beta, that): the float32 epilogue of blk_tiles. So the error
// of an output against the exact product of the rounded operands is a
// float32 summation error; against the float32 product, each operand adds
// at most 2^-8 of its magnitude.
//
// Layout. The block's 256 threads (8 warps) compute a tile of TM x TN of C
// (64 x 64, 128 x 32 or 32 x 128, chosen as blk_gemm_s chooses) as 16
// fragments of 16 x 16: fragment f = (f / FC, f % FC), FC = TN / 16 across;
// warp w owns the fragments 2w and 2w + 1, which lie in one row of
// fragments (FC is even), so it loads one A fragment and two B fragments
// per slice. K is walked in slices of BK = 16 (one mma per fragment and
// slice). A slice is fetched by blk_fetch (zeros outside the matrices:
// partial tiles, K not a multiple of 16, transposed operands and `as` are
// its business), rounded, and stored row-major: op(A)'s TM x 16 with a row
// pitch of BF_AP = 24 bf16 (48 bytes), op(B)'s 16 x TN with a pitch of TN + 8
// (both pitches multiples of 8 elements, as wmma's ldm must be for 16-bit
// types; the pads spread the rows over the banks). Two buffers of each: the
// next slice is fetched into registers while the current one is multiplied.
// Every fragment's first element sits on a 32-byte boundary (the pitches in
// bytes times 16 rows are multiples of 32, Tiles is 32-byte aligned), as
// load_matrix_sync and store_matrix_sync require. After the last slice the
// accumulators go to shared memory (row-major TM x TN floats over the slice
// buffers) and the tile is written out as blk_tiles writes it (coalesced).
#ifndef AG_GDN_BF16_CUH
#define AG_GDN_BF16_CUH

#ifndef AG_DOUBLE
#include <cuda_bf16.h>
#include <mma.h>

#define BF_AP (BK + 8)   // bf16 row pitch of an op(A) slice

template <int TM, int TN>
__device__ __forceinline__ void blk_put_bf16(__nv_bfloat16 *sa, __nv_bfloat16 *sb, const float *ra, const float *rb,
                                             bool ta, bool tb) {
    int tid = threadIdx.x;
    // Element e = tid + 256 p of blk_fetch's registers is op(A)'s (i, k) and
    // op(B)'s (k, j), numbered as blk_put numbers them.
#pragma unroll
    for (int p = 0; p < TM * BK / GDN_NT; p++) {
        int e = tid + p * GDN_NT, k = ta ? e / TM : e % BK, i = ta ? e % TM : e / BK;
        sa[i * BF_AP + k] = __float2bfloat16_rn(ra[p]);
    }
#pragma unroll
    for (int p = 0; p < TN * BK / GDN_NT; p++) {
        int e = tid + p * GDN_NT, k = tb ? e % BK : e / TN, j = tb ? e / BK : e % TN;
        sb[k * (TN + 8) + j] = __float2bfloat16_rn(rb[p]);
    }
}

template <int TM, int TN>
__device__ __forceinline__ void blk_tiles_bf16(Tiles *sh, bool ta, bool tb, int M, int N, int K, real alpha,
                                               const real *A, int lda, const real *as, const real *B, int ldb,
                                               real beta, real *C, int ldc) {
    using namespace nvcuda;
    constexpr int NA = TM * BK / GDN_NT, NB = TN * BK / GDN_NT, FC = TN / 16, BP = TN + 8;
    constexpr int ASZ = TM * BF_AP, BSZ = BK * BP;   // bf16 elements of one buffer
    static_assert(TM * TN == 16 * 16 * 2 * (GDN_NT / 32) && FC % 2 == 0, "blk_tiles_bf16: two fragments a warp, one row");
    static_assert(2 * (ASZ + BSZ) * 2 <= BLK_SMEM * (int)sizeof(real) && TM * TN <= BLK_SMEM,
                  "blk_tiles_bf16: Tiles");
    static_assert((16 * BF_AP * 2) % 32 == 0 && (ASZ * 2) % 32 == 0 && (BSZ * 2) % 32 == 0, "32-byte fragments");
    __nv_bfloat16 *sa = reinterpret_cast<__nv_bfloat16 *>(sh->s), *sb = sa + 2 * ASZ;
    float *sc = sh->s;   // the C stage, over the buffers
    int tid = threadIdx.x, w = tid / 32, fr = 2 * w / FC, fc = 2 * w % FC;
    int tn = (N + TN - 1) / TN, nt = (M + TM - 1) / TM * tn, ns = (K + BK - 1) / BK;
    for (int tile = 0; tile < nt; tile++) {
        int i0 = tile / tn * TM, j0 = tile % tn * TN;
        float ra[NA], rb[NB];
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb0, fb1;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc0, acc1;
        wmma::fill_fragment(acc0, 0.0f);
        wmma::fill_fragment(acc1, 0.0f);
        if (ns > 0) {
            blk_fetch<TM, TN>(ra, rb, ta, tb, M, N, K, i0, j0, 0, A, lda, as, B, ldb);
            blk_put_bf16<TM, TN>(sa, sb, ra, rb, ta, tb);
        }
        __syncthreads();   // slice 0 is in
        for (int s = 0; s < ns; s++) {
            int cur = s & 1;
            if (s + 1 < ns) blk_fetch<TM, TN>(ra, rb, ta, tb, M, N, K, i0, j0, (s + 1) * BK, A, lda, as, B, ldb);
            const __nv_bfloat16 *pa = sa + cur * ASZ + fr * 16 * BF_AP, *pb = sb + cur * BSZ + fc * 16;
            wmma::load_matrix_sync(fa, pa, BF_AP);
            wmma::load_matrix_sync(fb0, pb, BP);
            wmma::load_matrix_sync(fb1, pb + 16, BP);
            wmma::mma_sync(acc0, fa, fb0, acc0);
            wmma::mma_sync(acc1, fa, fb1, acc1);
            // The other buffer was last read before the previous barrier.
            if (s + 1 < ns) blk_put_bf16<TM, TN>(sa + (1 - cur) * ASZ, sb + (1 - cur) * BSZ, ra, rb, ta, tb);
            __syncthreads();   // slice s + 1 is in; slice s is no longer read
        }
        // No warp reads the slices any more (the barrier above): the stage.
        wmma::store_matrix_sync(sc + fr * 16 * TN + fc * 16, acc0, TN, wmma::mem_row_major);
        wmma::store_matrix_sync(sc + fr * 16 * TN + fc * 16 + 16, acc1, TN, wmma::mem_row_major);
        __syncthreads();   // the stage is in
        blk_store<TM, TN>(sc, M, N, i0, j0, alpha, beta, C, ldc);
        __syncthreads();   // the stage is read (the next tile's slice 0 goes over it); C is written
    }
    if (nt == 0) __syncthreads();
}

// blk_gemm_s with bf16 operands (the header above); the same arguments, the
// same tile shapes, the same closing barrier.
static __device__ __noinline__ void blk_gemm_bf16_s(Tiles *sh, bool ta, bool tb, int M, int N, int K, real alpha,
                                                    const real *A, int lda, const real *as, const real *B, int ldb,
                                                    real beta, real *C, int ldc) {
    int shape = blk_shape(M, N);   // (blk_gemm_s's choice)
    if (shape == BLK_TALL) blk_tiles_bf16<128, 32>(sh, ta, tb, M, N, K, alpha, A, lda, as, B, ldb, beta, C, ldc);
    else if (shape == BLK_WIDE) blk_tiles_bf16<32, 128>(sh, ta, tb, M, N, K, alpha, A, lda, as, B, ldb, beta, C, ldc);
    else blk_tiles_bf16<64, 64>(sh, ta, tb, M, N, K, alpha, A, lda, as, B, ldb, beta, C, ldc);
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
        blk_gemm_bf16_s(sh, ta, tb, M, N, K, alpha, A, lda, NULL, B, ldb, beta, C, ldc);
        return;
    }
#else
    static_assert(!BF, "bf16 products need the float32 build");
#endif
    blk_gemm_s(sh, ta, tb, M, N, K, alpha, A, lda, NULL, B, ldb, beta, C, ldc);
}

#endif
