// attn_exp.h: exp of a whole AVX-512 vector of floats for the attention
// kernel's softmax (attn_flash.c), with a lane mask that zeroes the lanes a
// query does not see.
//
// It computes r_exp (ops_math.h) lane by lane, bit for bit up to x = 88: the
// same range reduction, polynomial and fused multiply-adds (those GCC makes
// of r_exp's a * b + c when it optimises; unoptimised, r_exp rounds the
// products apart and the two may differ in the last bit), so the float32
// results of the kernel do not depend on which of the two ran (its arguments
// are s - max <= 0). Above 88.03, r_exp's 2^n overflows to inf (n = 128);
// vscalefps gives the finite value, up to exp(88.7) at the clamp.
// GCC vectorises a loop over r_exp at 256 bits (-march=native prefers ymm on
// AVX-512 CPUs) and, to if-convert r_exp's NaN test, evaluates the polynomial
// twice; here one 512-bit pass, 2^n applied by vscalefps (exact: p 2^n for an
// integral n is p times r_exp's power of two, one rounding either way), and
// the zeroing below -87.3 and of the masked lanes folded into that one
// instruction's mask. exp took 18 % of the kernel's time (perf, 1 thread,
// D 256, T 256) in that form.
//
// Also the forward's online softmax of a block in those vectors
// (attn_block_softmax32), and attn_block_softmax, which runs it where
// these exist (ATTN_VEXP: float32 builds for AVX-512) and loops over r_exp
// elsewhere.
#ifndef ATTN_EXP_H
#define ATTN_EXP_H

#if defined(__AVX512F__) && !defined(AG_DOUBLE)
#include <immintrin.h>
#include <stdint.h>

#include "ops_math.h"   // r_exp
#include "ops_vexp.h"   // v_exp_reduced

#define ATTN_VEXP 1

// exp(x) lane by lane where keep is set, 0 elsewhere: r_exp's value, so 0
// below -87.3 (and for -inf), NaN for NaN; exp(88.7) above 88.7.
static inline __m512 attn_vexp(__m512 x, __mmask16 keep) {
    // not below -87.3: true for NaN too, which then stays NaN as in r_exp
    keep &= _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_NLT_UQ);
    x = _mm512_min_ps(_mm512_set1_ps(88.7f), x);   // (min_ps returns its second operand, x, when x is NaN)
    __m512 n;
    __m512 p = v_exp_reduced(x, &n);   // r_exp's reduction and polynomial (ops_vexp.h)
    return _mm512_maskz_scalef_ps(keep, p, n);
}

// Lanes i of a vector whose index base + i lies in [lo, hi).
static inline __mmask16 attn_lanes_in(int base, int lo, int hi) {
    __m512i i = _mm512_add_epi32(_mm512_set1_epi32(base),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    return _mm512_cmp_epi32_mask(i, _mm512_set1_epi32(lo), _MM_CMPINT_NLT) &
           _mm512_cmp_epi32_mask(i, _mm512_set1_epi32(hi), _MM_CMPINT_LT);
}

// Which of the 32 queries of a block see key j: query i (lane i - 16 v of
// vector v) iff j - lag <= i and lo[i] <= j (lov: lo, or INT32_MIN).
static inline void attn_seen32(__mmask16 seen[2], int j, int lag, const __m512i lov[2]) {
    for (int v = 0; v < 2; v++)
        seen[v] = attn_lanes_in(16 * v, j - lag, INT32_MAX) &
                  _mm512_cmp_epi32_mask(lov[v], _mm512_set1_epi32(j), _MM_CMPINT_LE);
}

// attn_flash.c's block_softmax for a block of 32 queries, one a lane of two
// vectors: St (kmax keys x 32, rows aligned) becomes exp(S - m') where the
// query sees the key, else 0; mb, lb (32 each) move on; alpha = exp(m - m').
// The lane masks stand for the loops' tests, the exps are r_exp's bits and
// each query's sum adds its keys in the same order, so the results are the
// loops' (float32, optimised builds).
static inline void attn_block_softmax32(float *St, int kmax, int lag, const int *lo, float *mb, float *lb,
                                        float *alpha) {
    __m512 mx[2], sum[2];
    __m512i lov[2];
    __mmask16 seen[2];
    for (int v = 0; v < 2; v++) {
        mx[v] = _mm512_loadu_ps(mb + 16 * v);
        sum[v] = _mm512_setzero_ps();
        lov[v] = lo ? _mm512_loadu_si512(lo + 16 * v) : _mm512_set1_epi32(INT32_MIN);
    }
    for (int j = 0; j < kmax; j++) {
        attn_seen32(seen, j, lag, lov);
        for (int v = 0; v < 2; v++)   // s > mx ? s : mx (NaN s: mx), as the loops
            mx[v] = _mm512_mask_max_ps(mx[v], seen[v], _mm512_load_ps(St + (int64_t)j * 32 + 16 * v), mx[v]);
    }
    for (int j = 0; j < kmax; j++) {
        attn_seen32(seen, j, lag, lov);
        for (int v = 0; v < 2; v++) {
            float *Sj = St + (int64_t)j * 32 + 16 * v;
            __m512 e = attn_vexp(_mm512_sub_ps(_mm512_load_ps(Sj), mx[v]), seen[v]);
            _mm512_store_ps(Sj, e);
            sum[v] = _mm512_add_ps(sum[v], e);
        }
    }
    float mxs[32], sums[32];
    for (int v = 0; v < 2; v++) _mm512_storeu_ps(mxs + 16 * v, mx[v]), _mm512_storeu_ps(sums + 16 * v, sum[v]);
    for (int i = 0; i < 32; i++) {   // alpha: 1 where the max did not move (also -inf = -inf), as the loops
        alpha[i] = mb[i] == mxs[i] ? 1 : r_exp(mb[i] - mxs[i]);
        lb[i] = alpha[i] * lb[i] + sums[i];
        mb[i] = mxs[i];
    }
}
#endif

#include "common.h"     // imin, imax
#include "ops_math.h"   // r_exp
#include "tile_mm.h"    // VL

#define ATTN_QB (2 * VL)   // the queries of one block of the forward, one a vector lane

// The online softmax of one block of attn_flash.c's forward, lane-wise
// over its ATTN_QB queries: St (kmax keys x ATTN_QB queries) holds the block's scores, query i sees
// key j iff j <= lag + i (and j >= lo[i] when a document boundary cuts the
// block; lo NULL: none does). The scores become the weights exp(S - m') (0
// for a key the query does not see), the running max mb and sum lb move on,
// and alpha receives exp(m - m'), the factor of the accumulated output.
#ifdef ATTN_VEXP   // the same in 512-bit vectors, the same results (above)
_Static_assert(ATTN_QB == 32, "attn_block_softmax32 takes blocks of 32 queries");
static inline void attn_block_softmax(real *St, int kmax, int lag, const int *lo, real *mb, real *lb, real *alpha) {
    attn_block_softmax32(St, kmax, lag, lo, mb, lb, alpha);
}
#else
static inline void attn_block_softmax(real *St, int kmax, int lag, const int *lo, real *mb, real *lb, real *alpha) {
    real mx[ATTN_QB], sum[ATTN_QB];
    bool cut = lo != NULL;
#pragma omp simd
    for (int i = 0; i < ATTN_QB; i++) mx[i] = mb[i], sum[i] = 0;
    // Keys j < jall are seen by every query of the block; the rest
    // (the diagonal) by queries i >= j - lag only. A block that a
    // document boundary cuts tests both bounds on every key.
    int jall = cut ? 0 : imax(0, imin(kmax, lag + 1));
    for (int j = 0; j < jall; j++) {
        const real *Sj = St + (int64_t)j * ATTN_QB;
#pragma omp simd
        for (int i = 0; i < ATTN_QB; i++) mx[i] = Sj[i] > mx[i] ? Sj[i] : mx[i];
    }
    if (cut)
        for (int j = 0; j < kmax; j++) {
            const real *Sj = St + (int64_t)j * ATTN_QB;
#pragma omp simd
            for (int i = 0; i < ATTN_QB; i++) mx[i] = j <= lag + i && j >= lo[i] && Sj[i] > mx[i] ? Sj[i] : mx[i];
        }
    for (int j = jall; j < kmax && !cut; j++) {
        const real *Sj = St + (int64_t)j * ATTN_QB;
#pragma omp simd
        for (int i = 0; i < ATTN_QB; i++) mx[i] = j <= lag + i && Sj[i] > mx[i] ? Sj[i] : mx[i];
    }
    for (int j = 0; j < jall; j++) {
        real *Sj = St + (int64_t)j * ATTN_QB;
#pragma omp simd
        for (int i = 0; i < ATTN_QB; i++) {
            Sj[i] = r_exp(Sj[i] - mx[i]);
            sum[i] += Sj[i];
        }
    }
    if (cut)
        for (int j = 0; j < kmax; j++) {
            real *Sj = St + (int64_t)j * ATTN_QB;
#pragma omp simd
            for (int i = 0; i < ATTN_QB; i++) {
                Sj[i] = j <= lag + i && j >= lo[i] ? r_exp(Sj[i] - mx[i]) : 0;
                sum[i] += Sj[i];
            }
        }
    for (int j = jall; j < kmax && !cut; j++) {
        real *Sj = St + (int64_t)j * ATTN_QB;
#pragma omp simd
        for (int i = 0; i < ATTN_QB; i++) {
            Sj[i] = j <= lag + i ? r_exp(Sj[i] - mx[i]) : 0;
            sum[i] += Sj[i];
        }
    }
    // alpha = exp(m - m'): 0 on a query's first keys (m = -inf); 1
    // when the max did not move, also for a query that sees none of
    // these keys yet (m = m' = -inf, where m - m' is not a number).
#pragma omp simd
    for (int i = 0; i < ATTN_QB; i++) {
        alpha[i] = mb[i] == mx[i] ? 1 : r_exp(mb[i] - mx[i]);
        lb[i] = alpha[i] * lb[i] + sum[i];
        mb[i] = mx[i];
    }
}
#endif

#endif
