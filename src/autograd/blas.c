// blas.c: the two ways matmul splits large products among threads (blas.h).
//
// A threaded OpenBLAS call first scales its whole output by beta (zeroes it
// for beta 0) in one pass and only then runs its kernels over it. A training
// step's outputs are fresh arena memory of a few MiB each, so that pass and
// the kernels' later read of the output both go to memory. On the tiny
// configs' projections, with memory used as in a training step, the splits
// below run 1.04-1.18x faster than one call (bench/gemm_bench prints both).
// With OpenBLAS neither split changes the result with the thread count:
// each output element of gemm_rows is the same dot product in any slab.
// oneDNN may block a sum differently for another row count, so its
// gemm_rows agrees across thread counts to rounding. gemm_sum_rows's fixed
// blocks make it bit for bit on both backends.
//
// oneDNN (float32) makes no beta pass; gemm_rows gives it larger slabs
// (rows_slab says why), and gemm_sum_rows the same fixed blocks as OpenBLAS,
// so that its result stays the same bits on any thread count.
//
// With blas_precision bf16 (float32 builds) the same splits round their
// operands to bf16 where they are used: a weight once per product, rows of
// activations slab by slab into a per-thread buffer that stays in cache, then
// a bf16 product with float32 sums (oneDNN). Rounding whole operands first
// would add a pass over memory as long as the product itself at these sizes.
#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

#include "blas.h"
#include "ops_math.h"

#define SLAB_BYTES (256 * 1024)                 // output per one-thread slab product (OpenBLAS)
#define ONEDNN_SLAB_BYTES (1024 * 1024)         // the same on oneDNN (rows_slab says why)
#define SUM_ROWS 512                            // rows per partial product of X^T Y
#define SUM_MAX_BYTES ((size_t)32 << 20)        // larger partials: one OpenBLAS call instead
// Rows per bf16 slab: its operand rounded to bf16 stays in cache (64-176 KiB
// at widths 128-704), and a slab is enough work for a oneDNN call (64-512
// rows measured alike per CPU-second under load; 64 slower).
#define BF16_SLAB_ROWS 256

static bool run_alone(void) { return omp_get_max_threads() < 2 || omp_in_parallel(); }

// ---- float32 / float64 ----

// Rows per slab of rows_real. OpenBLAS: slabs whose output stays in cache
// (SLAB_BYTES), where its beta pass costs nothing. oneDNN has no beta pass,
// and its single-thread kernels run short products slower: slabs of
// ONEDNN_SLAB_BYTES of output, but no larger than the rows per thread
// (rounded up to 16), so that every thread gets a slab. Measured
// (2 threads, d_model 512, tiny_linear's step, 6 alternating
// runs): the step's products took 5 % less CPU time than with 256 KiB slabs
// (median 2069 against 2184 ms), and the step ran 4.7 % more tokens per
// CPU-second; one slab per thread varied more and did not beat either.
//
// Either way a split's slab count is then rounded up to a multiple of the
// thread count and the rows shared evenly among the slabs, so that each
// thread of the static schedule gets the same rows. Without that, 4096
// rows of an MLP up product (N 384 at d_model 128) make 6 slabs of 682 rows
// and one of 4: one thread runs 2728 rows, the other 1368, and the product
// runs at ~150 against ~190 GFLOP/s as one call (bench/gemm_bench, "MLP up").
static int rows_slab(int R, int N) {
    int nt = imax(1, omp_get_max_threads()), rows;
    if (blas_backend == GEMM_ONEDNN) {
        int64_t per_thread = (((int64_t)R + nt - 1) / nt + 15) & ~(int64_t)15;
        rows = imax(16, imin(4096, ONEDNN_SLAB_BYTES / (int)sizeof(real) / imax(N, 1)));
        if (per_thread < rows) rows = (int)per_thread;
    } else {
        rows = imax(16, imin(1024, SLAB_BYTES / (int)sizeof(real) / imax(N, 1)));
    }
    int64_t ns = ((int64_t)R + rows - 1) / rows;
    if (ns < 2) return rows;   // one slab: one product (a few rows, e.g. decoding, fork no region)
    ns = (ns + nt - 1) / nt * nt;
    return (int)(((int64_t)R + ns - 1) / ns);
}

static void rows_real(bool tb, int R, int N, int K, const real *A, int lda, const real *B, int ldb, real beta,
                      real *C, int ldc) {
    // With OpenBLAS each output element is the same dot product as in one big
    // call, so the slab size changes nothing but speed; with oneDNN the
    // slabs, whose size depends on the thread count, agree to rounding.
    int slab = rows_slab(R, N);
    int ns = (R + slab - 1) / slab;
    if (ns < 2 || run_alone()) {
        gemm(false, tb, R, N, K, 1, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int s = 0; s < ns; s++) {
        int r0 = s * slab;
        gemm(false, tb, imin(slab, R - r0), N, K, 1, A + (int64_t)r0 * lda, lda, B, ldb, beta,
             C + (int64_t)r0 * ldc, ldc);
    }
}

static bool products_bf16(void);

// A weight gradient X^T Y (M, N) over R rows with oneDNN in float32 splits
// into fixed blocks of its own rows rather than of the R rows: each block is
// one product over all R rows, written where it belongs, so there are no
// partials to write and sum again, and each product sums R terms rather than
// SUM_ROWS. Measured on a Zen 5 (2 threads, oneDNN 2.6, 4096 rows,
// median of 21 alternating runs each, blocks of 64 rows): (M, N) (512, 512)
// 402 against 388 GFLOP/s, (512, 1408) 413 against 392, (1408, 512) 401
// against 378; (704, 256) 353-363 against 339-376. Blocks of 48 rows ran
// 0-11 % slower than 64. With fewer than 8 blocks there would be fewer
// tasks than the 8 row blocks give at R = 4096, so M under GRAD_MIN_M keeps
// the row blocks (at M 128 and 256, a grid of both kinds of blocks measured
// no faster than the row blocks).
// OpenBLAS ran these products slower than its row blocks (180-190 against
// 190-200), and bf16 would round every R row once per block: both keep the
// row blocks. The blocks depend on M alone, so the result is the same bits
// on any thread count.
#define GRAD_BLOCK_ROWS 64
#define GRAD_MIN_M (8 * GRAD_BLOCK_ROWS)

// How gemm_sum_rows computes X^T Y (M, N) over R rows: as one product (0),
// by partials over blocks of SUM_ROWS rows of X and Y (-1), or by blocks of
// this many rows of M (> 0).
static int sum_split(int M, int N, int R) {
    size_t nb = (size_t)(R + SUM_ROWS - 1) / SUM_ROWS;
    if (nb < 2 || nb * M * N * sizeof(real) > SUM_MAX_BYTES) return 0;
    return M < GRAD_MIN_M || blas_backend != GEMM_ONEDNN || products_bf16() ? -1 : GRAD_BLOCK_ROWS;
}

size_t gemm_sum_rows_scratch(int M, int N, int R) {
    return sum_split(M, N, R) < 0 ? (size_t)((R + SUM_ROWS - 1) / SUM_ROWS) * M * N : 0;
}

// Block b of mb rows of C (M, N) = beta C + X^T Y (sum_split > 0).
static void grad_block(int b, int mb, int M, int N, int R, const real *X, int ldx, const real *Y, int ldy,
                       real beta, real *C, int ldc) {
    int k0 = b * mb;
    gemm(true, false, imin(mb, M - k0), N, R, 1, X + k0, ldx, Y, ldy, beta, C + (int64_t)k0 * ldc, ldc);
}

// One row c (N) (= or +=, beta 0 or 1) of the nb partials whose first row
// is p0, part_n elements apart, in block order.
static inline void sum_partial_row(int N, int nb, size_t part_n, const real *p0, real beta, real *c) {
    if (beta == 0)
        for (int j = 0; j < N; j++) c[j] = p0[j];
    else
        for (int j = 0; j < N; j++) c[j] += p0[j];
    for (int b = 1; b < nb; b++) {
        const real *pb = p0 + b * part_n;
        for (int j = 0; j < N; j++) c[j] += pb[j];
    }
}

// C (M, N) (= or +=, beta 0 or 1) the nb partials (M, N) of part, in block order.
static void sum_partials(int M, int N, int nb, const real *part, real beta, real *C, int ldc) {
    size_t part_n = (size_t)M * N;
#pragma omp parallel for schedule(static) if (!run_alone() && (int64_t)part_n * nb > OPS_PAR_MIN)
    for (int i = 0; i < M; i++) sum_partial_row(N, nb, part_n, part + (size_t)i * N, beta, C + (int64_t)i * ldc);
}

// ---- bf16 (float32 builds) ----

#ifndef AG_DOUBLE
// Per-thread bf16 buffers, grown as needed: slot 0 for a whole operand (on
// the calling thread), 1 and 2 for the rows a thread rounds, BF16_SLOT_W + i
// for weight i of the multi products (on the calling thread).
#define BF16_SLOT_W 3
static _Thread_local struct {
    bf16 *p;
    size_t n;
} bf16_buf[BF16_SLOT_W + GEMM_MULTI_MAX];

// A thread that ends (an OpenMP team made smaller) frees its buffers: a
// key whose destructor runs on the thread's way out, set once the thread
// has a buffer (otherwise a run on 8 then 2 threads leaks them).
static pthread_key_t bf16_key;
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;

static void bf16_thread_end(void *unused) {
    (void)unused;
    for (int i = 0; i < BF16_SLOT_W + GEMM_MULTI_MAX; i++) {
        free(bf16_buf[i].p);
        bf16_buf[i].p = NULL;
        bf16_buf[i].n = 0;
    }
}

static void bf16_key_make(void) {
    ASSERT(pthread_key_create(&bf16_key, bf16_thread_end) == 0, "bf16 buffers: no thread key");
}

static bf16 *bf16_scratch(int slot, size_t n) {
    if (n > bf16_buf[slot].n) {
        pthread_once(&bf16_once, bf16_key_make);
        pthread_setspecific(bf16_key, bf16_buf);   // non-NULL: the destructor runs
        free(bf16_buf[slot].p);
        bf16_buf[slot].n = (n + 2047) & ~(size_t)2047;
        bf16_buf[slot].p = xaligned(bf16_buf[slot].n * sizeof(bf16));
    }
    return bf16_buf[slot].p;
}

// bf16_from_rows with AVX512_BF16's conversion instruction (vcvtneps2bf16),
// 1.5-2x as fast (0.08 against 0.13-0.16 ns per element, rows of 256-704
// read from L3): the bf16 products only run on CPUs that have it. It rounds
// as bf16_from_rows does, except that it flushes subnormal inputs to zero,
// which changes no product: the bf16 dot-product instruction treats subnormal
// inputs as zero anyway.
__attribute__((target("avx512bf16,avx512vl,avx512bw,avx512f"))) static void
bf16_from_rows_avx512(bf16 *dst, int64_t ldd, const float *src, int64_t lds, int n, int w) {
    __mmask16 tail = (__mmask16)((1u << (w % 16)) - 1);
    for (int i = 0; i < n; i++) {
        const float *s = src + i * lds;
        bf16 *d = dst + i * ldd;
        int j = 0;
        for (; j + 16 <= w; j += 16)
            _mm256_storeu_si256((__m256i *)(d + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + j)));
        if (j < w)
            _mm256_mask_storeu_epi16(d + j, tail, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(tail, s + j)));
    }
}

// src (rows x cols, stride ld) rounded to bf16 into a slot, packed (stride cols).
static const bf16 *bf16_pack(int slot, const float *src, int rows, int cols, int ld) {
    bf16 *h = bf16_scratch(slot, (size_t)rows * cols);
    bf16_from_rows_avx512(h, cols, src, ld, rows, cols);
    return h;
}

static void rows_bf16(bool tb, int R, int N, int K, const float *A, int lda, const float *B, int ldb, float beta,
                      float *C, int ldc) {
    int ns = (R + BF16_SLAB_ROWS - 1) / BF16_SLAB_ROWS;
    const bf16 *Bh = bf16_pack(0, B, tb ? N : K, tb ? K : N, ldb);
    // Fixed slabs on any thread count: the same products, the same result.
#pragma omp parallel for schedule(static) if (ns > 1 && !run_alone())
    for (int s = 0; s < ns; s++) {
        int r0 = s * BF16_SLAB_ROWS, n = imin(BF16_SLAB_ROWS, R - r0);
        const bf16 *Ah = bf16_pack(1, A + (int64_t)r0 * lda, n, K, lda);
        onednn_gemm_bf16(false, tb, n, N, K, Ah, K, Bh, tb ? K : N, beta, C + (int64_t)r0 * ldc, ldc);
    }
}

#endif

static bool products_bf16(void) {
#ifndef AG_DOUBLE
    return blas_precision == PRECISION_BF16;
#else
    return false;
#endif
}

// C (M, N) = beta C + X^T Y over n rows, X (n, M) and Y (n, N) with row
// strides ldx, ldy; with h both rounded to bf16 (slots 1, 2), float32 sums.
// gemm_sum_rows's blocks and gemm_multi_backward's weight gradients.
static void xty(bool h, int n, int M, int N, const real *X, int ldx, const real *Y, int ldy, real beta, real *C,
                int ldc) {
#ifndef AG_DOUBLE
    if (h) {
        const bf16 *Xh = bf16_pack(1, X, n, M, ldx), *Yh = bf16_pack(2, Y, n, N, ldy);
        onednn_gemm_bf16(true, false, M, N, n, Xh, M, Yh, N, beta, C, ldc);
        return;
    }
#endif
    (void)h;
    gemm(true, false, M, N, n, 1, X, ldx, Y, ldy, beta, C, ldc);
}

// gemm_sum_rows (blas.h): a partial product per fixed block of rows, summed
// in block order, or a product per fixed block of C's rows (sum_split); too
// few rows (or too large partials): one product.
static void sum_rows(int M, int N, int R, const real *X, int ldx, const real *Y, int ldy, real beta, real *C,
                     int ldc, real *part) {
    bool h = products_bf16();
    int split = sum_split(M, N, R);
    if (split == 0) {
        xty(h, R, M, N, X, ldx, Y, ldy, beta, C, ldc);
        return;
    }
    if (split > 0) {
        int nk = (M + split - 1) / split;
#pragma omp parallel for schedule(static) if (!run_alone())
        for (int b = 0; b < nk; b++) grad_block(b, split, M, N, R, X, ldx, Y, ldy, beta, C, ldc);
        return;
    }
    int nb = (R + SUM_ROWS - 1) / SUM_ROWS;
#pragma omp parallel for schedule(static) if (!run_alone())
    for (int b = 0; b < nb; b++) {
        int r0 = b * SUM_ROWS;
        xty(h, imin(SUM_ROWS, R - r0), M, N, X + (int64_t)r0 * ldx, ldx, Y + (int64_t)r0 * ldy, ldy, 0,
            part + (size_t)b * M * N, N);
    }
    sum_partials(M, N, nb, part, beta, C, ldc);
}

// ---- several products of one input (gemm_rows_multi, gemm_multi_backward) ----
//
// The same products as m calls of gemm_rows and gemm_sum_rows, with the same
// slabs and blocks (so dB_i, and with OpenBLAS or in bf16 every C_i, are the
// same bits as theirs; oneDNN's float32 C_i may round otherwise where the
// widest N sets other slabs), but in one parallel region: a region costs 50-70 us on a 2-core
// KVM guest under OMP_WAIT_POLICY=PASSIVE (bench/fork_bench), and a tiny
// config's step forked 228 of them, 132 for its products.

void gemm_rows_multi(int m, int R, int K, const real *A, const real *const *B, const int *N, real *const *C) {
    ASSERT(m >= 1 && m <= GEMM_MULTI_MAX, "gemm_rows_multi: %d products, 1 to %d", m, GEMM_MULTI_MAX);
    bool h = products_bf16();
    int maxN = 1;
    for (int i = 0; i < m; i++) maxN = imax(maxN, N[i]);
    int slab = h ? BF16_SLAB_ROWS : rows_slab(R, maxN), ns = (R + slab - 1) / slab;
    if (!h && (ns < 2 || run_alone())) slab = R, ns = 1;   // as rows_real: one product of all rows each
#ifndef AG_DOUBLE
    const bf16 *Bh[GEMM_MULTI_MAX] = {NULL};
    if (h)
        for (int i = 0; i < m; i++) Bh[i] = bf16_pack(BF16_SLOT_W + i, B[i], K, N[i], N[i]);
#endif
#pragma omp parallel for schedule(static) if (ns > 1 && !run_alone())
    for (int s = 0; s < ns; s++) {
        int r0 = s * slab, n = imin(slab, R - r0);
        const real *a = A + (int64_t)r0 * K;
#ifndef AG_DOUBLE
        if (h) {
            const bf16 *Ah = bf16_pack(1, a, n, K, K);   // once for the m products
            for (int i = 0; i < m; i++)
                onednn_gemm_bf16(false, false, n, N[i], K, Ah, K, Bh[i], N[i], 0, C[i] + (int64_t)r0 * N[i], N[i]);
            continue;
        }
#endif
        for (int i = 0; i < m; i++)
            gemm(false, false, n, N[i], K, 1, a, K, B[i], N[i], 0, C[i] + (int64_t)r0 * N[i], N[i]);
    }
}

size_t gemm_multi_scratch(int m, int K, const int *N, int R) {
    size_t n = 0;
    for (int i = 0; i < m; i++) n += gemm_sum_rows_scratch(K, N[i], R);
    return n;
}

// d (n, K) = beta d + g (n, Ni) B^T, B (K, Ni); Bh: B in bf16 when the products are.
static void multi_dA(bool h, int n, int K, int Ni, const real *g, const real *B, const void *Bh, real beta,
                     real *d) {
#ifndef AG_DOUBLE
    if (h) {
        const bf16 *gh = bf16_pack(1, g, n, Ni, Ni);
        onednn_gemm_bf16(false, true, n, K, Ni, gh, Ni, Bh, Ni, beta, d, K);
        return;
    }
#endif
    (void)h, (void)Bh;
    gemm(false, true, n, K, Ni, 1, g, Ni, B, Ni, beta, d, K);
}

// The weight gradients' partials, (K, N_i) for block b, summed in block
// order into dB_i (= or +=, beta_b), rows k of all nw gradients shared out.
// Inside a parallel region (an orphaned omp for).
static void multi_sum_partials(int K, const int *N, real *const *dB, const real *beta_b, const real *part,
                               const int *wi, int nw, const size_t *off, int nb) {
#pragma omp for schedule(static)
    for (int t = 0; t < nw * K; t++) {
        int i = wi[t / K], k = t % K;
        sum_partial_row(N[i], nb, (size_t)K * N[i], part + off[i] + (size_t)k * N[i], beta_b[i],
                        dB[i] + (int64_t)k * N[i]);
    }
}

#ifndef AG_DOUBLE
// gemm_multi_backward in bf16 when every weight gradient asked for splits
// into gemm_sum_rows's blocks and there are at least as many blocks as
// threads: one task per block of SUM_ROWS rows rounds A's rows once for all
// m weight gradients, and each dC_i's rows once for both of their products
// (dA's rows and dB_i's partial). The general path rounds A once per weight
// gradient and dC_i twice (5 % of a bf16 step at d_model 256 went to
// rounding that way). The partials are the same products as xty's, so dB_i keeps
// gemm_sum_rows's bits; dA's rows are the same sums in slabs of SUM_ROWS
// rows rather than BF16_SLAB_ROWS. Returns false (nothing done) otherwise.
// Bh: the weights B_i in bf16 (those with dC_i, when dA), as the caller
// rounded them; nb blocks, wi, nw, off: the caller's weight gradients.
static bool multi_backward_bf16_blocks(int m, int R, int K, const real *A, const void *const *Bh, const int *N,
                                       const real *const *dC, real *dA, real beta_a, real *const *dB,
                                       const real *beta_b, real *part, int nb, const int *wi, int nw,
                                       const size_t *off) {
    int with_dB = 0;
    for (int i = 0; i < m; i++) with_dB += dC[i] && dB[i];
    if (nw == 0 || with_dB != nw || nb < imax(1, omp_get_max_threads())) return false;
#pragma omp parallel if (!run_alone() && nb > 1)
    {
#pragma omp for schedule(static)
        for (int b = 0; b < nb; b++) {
            int r0 = b * SUM_ROWS, n = imin(SUM_ROWS, R - r0);
            const bf16 *Ah = bf16_pack(1, A + (int64_t)r0 * K, n, K, K);
            float beta = beta_a;
            for (int i = 0; i < m; i++) {
                if (!dC[i]) continue;
                const bf16 *Gh = bf16_pack(2, dC[i] + (int64_t)r0 * N[i], n, N[i], N[i]);
                if (dA) {
                    onednn_gemm_bf16(false, true, n, K, N[i], Gh, N[i], (const bf16 *)Bh[i], N[i], beta,
                                     dA + (int64_t)r0 * K, K);
                    beta = 1;
                }
                if (dB[i])
                    onednn_gemm_bf16(true, false, K, N[i], n, Ah, K, Gh, N[i], 0, part + off[i] + (size_t)b * K * N[i],
                                     N[i]);
            }
        }
        // The barrier ending the loop above also orders dA before dB_i (X X).
        multi_sum_partials(K, N, dB, beta_b, part, wi, nw, off, nb);
    }
    return true;
}
#endif

void gemm_multi_backward(int m, int R, int K, const real *A, const real *const *B, const int *N,
                         const real *const *dC, real *dA, real beta_a, real *const *dB, const real *beta_b,
                         real *part) {
    ASSERT(m >= 1 && m <= GEMM_MULTI_MAX, "gemm_multi_backward: %d products, 1 to %d", m, GEMM_MULTI_MAX);
    bool h = products_bf16();
    // The weight gradients split into row blocks of A and dC_i (wi: partials),
    // or into blocks of their own rows (gi: a product per block, task gt[j]
    // the first of gi[j]'s), as gemm_sum_rows splits them; the rest: one
    // product each, after.
    int wi[GEMM_MULTI_MAX], nw = 0, nb = (R + SUM_ROWS - 1) / SUM_ROWS;
    int gi[GEMM_MULTI_MAX], gmb[GEMM_MULTI_MAX], gt[GEMM_MULTI_MAX + 1] = {0}, ng = 0;
    size_t off[GEMM_MULTI_MAX] = {0}, used = 0;
    for (int i = 0; i < m; i++) {
        int split = dC[i] && dB[i] ? sum_split(K, N[i], R) : 0;
        if (split < 0) {
            wi[nw++] = i;
            off[i] = used;
            used += (size_t)nb * K * N[i];   // its partials (gemm_sum_rows_scratch)
        } else if (split > 0) {
            gi[ng] = i;
            gmb[ng] = split;
            gt[ng + 1] = gt[ng] + (K + split - 1) / split;
            ng++;
        }
    }
    ASSERT(!nw || part, "gemm_multi_backward: the weight gradients need gemm_multi_scratch elements of part");
    const void *Bh[GEMM_MULTI_MAX] = {NULL};
#ifndef AG_DOUBLE
    if (h && dA)
        for (int i = 0; i < m; i++)
            if (dC[i]) Bh[i] = bf16_pack(BF16_SLOT_W + i, B[i], K, N[i], N[i]);
    if (h && multi_backward_bf16_blocks(m, R, K, A, Bh, N, dC, dA, beta_a, dB, beta_b, part, nb, wi, nw, off))
        return;
#endif
    int slab = h ? BF16_SLAB_ROWS : rows_slab(R, K), ns = dA ? (R + slab - 1) / slab : 0;
    if (dA && !h && (ns < 2 || run_alone())) slab = R, ns = 1;   // as rows_real: one product of all rows each
#pragma omp parallel if (!run_alone() && ns + nb * nw + gt[ng] > 1)
    {
        // dA by slabs of rows, each summing the m products in order.
#pragma omp for schedule(static) nowait
        for (int s = 0; s < ns; s++) {
            int r0 = s * slab, n = imin(slab, R - r0);
            real beta = beta_a;
            for (int i = 0; i < m; i++)
                if (dC[i]) {
                    multi_dA(h, n, K, N[i], dC[i] + (int64_t)r0 * N[i], B[i], Bh[i], beta, dA + (int64_t)r0 * K);
                    beta = 1;
                }
        }
        if (nw) {
            // The partials of every weight gradient, block by block ...
#pragma omp for schedule(static)
            for (int t = 0; t < nb * nw; t++) {
                int b = t / nw, i = wi[t % nw], r0 = b * SUM_ROWS, n = imin(SUM_ROWS, R - r0);
                xty(h, n, K, N[i], A + (int64_t)r0 * K, K, dC[i] + (int64_t)r0 * N[i], N[i], 0,
                    part + off[i] + (size_t)b * K * N[i], N[i]);
            }
            // ... then summed in block order, as gemm_sum_rows sums them. The
            // barrier before this loop also ends the dA loop (nowait): when A
            // and a B_i are one tensor (X X), dB_i adds to dA's finished rows.
            multi_sum_partials(K, N, dB, beta_b, part, wi, nw, off, nb);
        } else if (ng) {
#pragma omp barrier
            // (dA first, as above)
        }
        // The gradients by blocks of their own rows, as gemm_sum_rows runs them.
#pragma omp for schedule(static)
        for (int t = 0; t < gt[ng]; t++) {
            int j = 0;
            while (t >= gt[j + 1]) j++;
            int i = gi[j];
            grad_block(t - gt[j], gmb[j], K, N[i], R, A, K, dC[i], N[i], beta_b[i], dB[i], N[i]);
        }
    }
    for (int i = 0; i < m; i++)   // too few rows to split (or too large partials): one product each
        if (dC[i] && dB[i] && sum_split(K, N[i], R) == 0)
            gemm_sum_rows(K, N[i], R, A, K, dC[i], N[i], beta_b[i], dB[i], N[i], NULL);
}

// ---- the entry points ----

void gemm_rows(bool tb, int R, int N, int K, const real *A, int lda, const real *B, int ldb, real beta, real *C,
               int ldc) {
#ifndef AG_DOUBLE
    if (blas_precision == PRECISION_BF16) {
        rows_bf16(tb, R, N, K, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#endif
    rows_real(tb, R, N, K, A, lda, B, ldb, beta, C, ldc);
}

void gemm_sum_rows(int M, int N, int R, const real *X, int ldx, const real *Y, int ldy, real beta, real *C,
                   int ldc, real *part) {
    sum_rows(M, N, R, X, ldx, Y, ldy, beta, C, ldc, part);
}
