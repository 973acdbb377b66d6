// tile_amx.h: which kind of tile products the attention kernel
// (attn_flash.c) and the chunk kernels (gla.c, gdn_chunk.c and their
// backwards, through TileCtx) run under [train] precision = bf16, and the
// AMX form of tile_mm_bf16_band_part (tile_mm_bf16.h).
//
// The kinds, in the order of [train] bf16_tiles = auto|amx|avx512bf16|fp32:
//   amx         AMX's tdpbf16ps on 16 x 16 tiles (Sapphire Rapids on): the
//               same bf16 operands as avx512bf16, summed in another order,
//               for the attention's and the chunk kernels' products;
//   avx512bf16  AVX512_BF16's vdpbf16ps in register blocks (tile_mm_bf16.h),
//               for both;
//   fp32        the float32 tiles (tile_mm.h) for the attention: its
//               operands are not rounded at all; the dense and chunk
//               products stay bf16, the chunk ones on AVX512_BF16 (what a
//               build without bf16 tiles has always done for the attention);
//   auto        amx where the CPU has AMX-BF16 and the OS grants its state,
//               else avx512bf16 where the build has it, else fp32. auto never
//               picks fp32 over a bf16 kind: it keeps the rounding that
//               precision = bf16 documents, and only changes the order of
//               the float32 sums.
//
// Both bf16 kinds take the same operands (rounded to nearest even) and
// exact products, and sum them in float32; they differ in how:
//   vdpbf16ps, per pair of a row of A against a column of B: two fused
//     additions in a row, c = (c + a_odd b_odd) + a_even b_even;
//   tdpbf16ps, per instruction (16 pairs of k): the even and the odd
//     products each summed in k order from zero, then c = c + (even + odd)
//     (Intel's pseudo-code in the SDM; what this CPU does is tested
//     against it, tests/test_tile_amx.c).
// Neither order is more accurate in general; both stay within float32's
// summation bound (K + 3) u (|alpha| sum |a b| + |C|) of C (+)= alpha A B,
// and the tests hold them to it. Results do not depend on the thread count
// either way.
#ifndef AG_TILE_AMX_H
#define AG_TILE_AMX_H

#include <stdbool.h>
#include <stddef.h>

#include "tile_mm_bf16.h"

typedef enum { BF16_TILES_AUTO, BF16_TILES_AMX, BF16_TILES_AVX512BF16, BF16_TILES_FP32, BF16_TILES_COUNT } Bf16Tiles;

// Name <-> kind ("auto", "amx", "avx512bf16", "fp32"); parse: -1 when unknown.
int bf16_tiles_parse(const char *name);
const char *bf16_tiles_name(Bf16Tiles k);

// Whether this process can run AMX-BF16 tiles: the build has them, the CPU
// says AMX-TILE and AMX-BF16 (CPUID 7.0 EDX 24, 22), the OS enabled their
// state (XCR0 bits 17, 18), and Linux granted this process the tile data
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once here,
// before any tile instruction). false with why in why (may be NULL).
bool amx_bf16_usable(char *why, size_t n);

// Set the kind for the bf16 tile products that follow (the default, before
// any call, is auto). Returns false, with why in err naming the value, when
// `want` cannot run here; nothing changes then. Main thread, outside
// parallel regions (as blas_select).
bool bf16_tiles_select(Bf16Tiles want, char *err, size_t n);
// The kind set now, auto resolved (never BF16_TILES_AUTO): what a run
// records so that a resume runs the same products.
Bf16Tiles bf16_tiles_current(void);
// The kind op_attention's tiles run now for these head sizes and tiles:
// bf16_tiles_current() under precision = bf16 in a build with bf16 tiles,
// for even sizes and tiles (the pairs); else fp32. attn_tiles_bf16
// (attn_kernel.h): whether that kind is a bf16 one.
Bf16Tiles attn_tiles_kind(int dk, int dv, int tile_q, int tile_k);

// What the chunk kernels (gla.c, gdn_chunk.c) keep in their nodes for their
// products, so that a backward runs them as its forward did: float32 where
// tile_products_bf16() is false, else bf16 operands on AMX when the kind set
// now is amx, on AVX512_BF16 otherwise (bf16_tiles = fp32 leaves only the
// attention's tiles float32; the chunk products stay bf16 there, as before).
enum { CHUNK_TILES_FP32, CHUNK_TILES_BF16, CHUNK_TILES_AMX };
int chunk_tiles_kind(void);

// The tiles' configuration of the calling thread, around its AMX products:
// loading it and releasing the tiles costs 50 ns together here, as much as a
// 32 x 32 x 64 product, so the attention does it once per thread and op
// (its tasks call nothing else that uses the tiles), gla once per thread and
// op (gla_tiles), gdn once per head, not per product. Both do nothing where
// AMX is not usable.
void amx_tiles_begin(void);
void amx_tiles_end(void);

#ifdef AG_TILE_BF16
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && __GNUC__ >= 11
#define AG_TILE_AMX 1
// tile_mm_bf16_band (tile_mm_bf16.h) on AMX tiles: C (M x N) (+)= alpha A B,
// A(i, p) = A[i lda + p ak] pairs (any strides), B rows of N pairs at
// stride ldb, zero outside the band lo <= k - i <= hi (skipped by 16 x 16
// tiles, and read as zero: A may hold anything outside each row's band, as
// tile_mm_bf16_band reads only what an 8-row block needs). N a multiple of
// 16; C needs no alignment. Returns false (nothing done) when K exceeds
// AMX_MAX_K; the caller then runs tile_mm_bf16_band. Call only between
// amx_tiles_begin and amx_tiles_end on the calling thread, where
// amx_bf16_usable().
#define AMX_MAX_K 512
bool amx_mm_bf16_band(int M, int N, int K, int lo, int hi, float alpha, const bfpair *A, int lda, int ak,
                      const bfpair *B, int ldb, float *C, int ldc, bool add);
#endif

// tile_mm_bf16_band on AMX when amx (and the product fits AMX_MAX_K), else on AVX512_BF16.
static inline void tile_mm_bf16_band_on(bool amx, int M, int N, int K, int lo, int hi, float alpha, const bfpair *A,
                                        int lda, int ak, const bfpair *B, int ldb, float *C, int ldc, bool add) {
#ifdef AG_TILE_AMX
    if (amx && amx_mm_bf16_band(M, N, K, lo, hi, alpha, A, lda, ak, B, ldb, C, ldc, add)) return;
#else
    (void)amx;
#endif
    tile_mm_bf16_band(M, N, K, lo, hi, alpha, A, lda, ak, B, ldb, C, ldc, add);
}
#endif

#endif
