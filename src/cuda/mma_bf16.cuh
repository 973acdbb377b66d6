// mma_bf16.cuh: the bf16 tensor-core helpers that the float32 build's bf16
// kernels share (attn_flash_bf16.cu, gla.cu, gdn_bf16.cuh): a pair of
// float32 numbers rounded into one 32-bit register, one m16n8k16 product,
// ldmatrix of four 8 x 8 blocks (cp.async is cuda_internal.cuh's). The PTX
// fragment layouts of m16n8k16 with .bf16 inputs (lane = 4 g + c, g the
// group 0..7, c 0..3; two bf16 numbers a register, the lower column / row
// index in the low 16 bits):
//   A (16 x 16, row): a0 = A[g][2c, 2c+1], a1 = A[g+8][2c, 2c+1],
//                     a2 = A[g][2c+8, 2c+9], a3 = A[g+8][2c+8, 2c+9]
//   B (16 x 8, col):  b0 = B[2c, 2c+1][g], b1 = B[2c+8, 2c+9][g]
//   C, D (16 x 8, f32): d0 = C[g][2c], d1 = C[g][2c+1], d2 = C[g+8][2c],
//                       d3 = C[g+8][2c+1]
#ifndef AG_MMA_BF16_CUH
#define AG_MMA_BF16_CUH

#ifndef AG_DOUBLE
#include <cuda_bf16.h>
#include <stdint.h>

#include "cuda_internal.cuh"

// (lo, hi) rounded to bf16, nearest even, lo in the low 16 bits.
__device__ __forceinline__ uint32_t fb_pack(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}

// d += A B, one m16n8k16 (fragments as above).
__device__ __forceinline__ void fb_mma(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four 8 x 8 bf16 matrices from shared memory (ldmatrix .x4; trans: each
// transposed); lane l gives the address of row l % 8 of matrix l / 8, and
// register i gets matrix i: row g, columns 2c and 2c + 1 (trans: rows 2c
// and 2c + 1 of column g).
__device__ __forceinline__ void fb_ldsm4(uint32_t r[4], const void *p, bool trans) {
    uint32_t a = cu_smem_addr(p);
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
}

#endif

#endif
