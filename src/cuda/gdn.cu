// gdn.cu: op_gdn (Gated DeltaNet) on the GPU, the chunked (WY) and the
// recurrent form (gdn_kernel.h; the CPU twins are gdn_chunk.c,
// gdn_chunk_backward.c and gdn_naive.c, whose lines these kernels follow).
//
// Chunked form: the chunks of every (batch, head) run side by side; only the
// state's recurrence across chunks is sequential, and it is split by blocks
// of NVB columns of the state (the delta rule's columns over dv evolve
// independently: S_C[:, J] = bl S0[:, J] + Kd^T (U[:, J] - W S0[:, J])).
//   forward   1. per chunk (k_gdn_fwd_prep): the decays, (I + A)^-1 and
//                W = Tm diag(beta b) K, U = Tm diag(beta) V, written to
//                per-op rows (B*H, T, dk | dv), with ek (B*H, T) and bl (B*H, NC);
//             2. per (batch, head, column block), chunks in order
//                (k_gdn_fwd_scan): keeps the state entering each chunk (n->saved,
//                or scratch when the node is not recorded), Delta = U - W S0
//                over U's rows, S_C = bl S0 + Kd^T Delta; S_T is the last;
//             3. per chunk (k_gdn_fwd_out): O = diag(b) Q S0 + P Delta.
//   backward  1. per chunk (k_gdn_bwd_prep): W again, and the parts of
//                dDelta and of the entering state's gradient that do not go
//                through the state: P^T dO and Q^T diag(b) dO;
//             2. per (batch, head, column block), chunks in reverse
//                (k_gdn_bwd_scan): dDelta = Kd dS + P^T dO, dS0 = bl dS +
//                Q^T dY - W^T dDelta, keeping the gradient of the state leaving
//                each chunk (B*H, NC, dk, dv) and dDelta (B*H, T, dv); s0's is the last;
//             3. per chunk (k_gdn_bwd_chunk): everything of the chunk again
//                (gdn_chunk_prepare) and its input gradients from S0, dS and dDelta.
// The per-chunk kernels run a fixed grid of blocks (as many as the GPU keeps
// resident), each walking the chunks gridDim.x apart with its workspace in
// device memory (tape_dalloc); every line of a chunk is a block-wide step.
// Products go through blk_gemm (register tiles of 4 x 4 per thread, 64 x 64
// per block, slices of K in shared memory). Elementwise steps spread (row,
// column) over all the threads; a row's dot products are one warp's (lanes
// over the row, then a butterfly of shuffles in double); the running sums
// over a chunk's positions (Gamma, dg) are warp 0's scans (warp0_cumsum).
// (I + A)^-1 is a forward substitution: for chunks of up to 64 positions by
// warps, two columns each, with A^T in shared memory and the columns in
// registers, no barrier (solve_warps); longer ones row by row, one barrier
// per row.
// The scans (the section "the scans" says more) are latency-bound when there
// are few (batch, head) pairs and many chunks (T = 65,536 at B = 1: 1,024
// chunks in a row), so a block keeps its slice of the state (dk x NVB) in
// shared memory for the whole walk, and per chunk only streams its operands
// in (W, K, U or P^T dO: cp.async, the next chunk's while it computes this
// one) and runs two block-wide steps of its own, each ended by one barrier:
// the chunk's rows of Delta (dDelta) from the state, then the state's rows
// from Delta (dDelta). NVB, 32 when there are (batch, head) pairs enough to
// fill the GPU, is 16 or 8 when there are few (chosen on the host, per launch:
// more blocks walk side by side, each with less work per chunk); a column's
// arithmetic is the same whichever, so the results are too. When even that
// leaves most of the GPU idle for a long walk (B = 1, T = 65,536: 1,024
// chunks), the scan takes two levels (scan_groups): the chunks in groups,
// each group walked alone from 0 (and from the identity, for its transition
// Phi, the product of its chunks' bl I - Kd^T W: a state is affine in the
// state entering the group), a short walk across the groups
// (k_gdn_scan_join: S <- Phi S + L), then each group again from its
// entering state, writing what the one-level walk writes. The backward the
// same in reverse, with the transposed transitions.
// Recurrent form: one block per (batch, head); a thread owns a column of S,
// so the forward needs no barrier. The backward replays a stretch of `chunk`
// tokens from its saved state and walks it in reverse, per token a column
// phase then a row phase.
// Gradients go to scratch (or straight into a fresh buffer that no other
// input shares) and are then added to the inputs' buffers in input order, so
// inputs that are one tensor get the sum. No atomics: every sum is made in a
// fixed order (one thread's chain, or a warp's lanes and shuffles in a fixed
// pattern, then the groups in order), the same whichever block takes a chunk.
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.cuh"
#include "gdn_node.h"


#define GDN_NT 256   // threads of a block of the chunked form (blk_gemm's layout needs exactly this)
// Blocks per multiprocessor that the per-chunk kernels are compiled for (at
// most 65536 / (256 GDN_MINB) registers a thread): 2 for k_gdn_fwd_prep,
// k_gdn_fwd_out and k_gdn_bwd_prep (blk_gemm's register tiles would take them
// to one block otherwise); GDN_CHUNK_MINB for k_gdn_bwd_chunk, 2 as well:
// a block waiting at one of its barriers (blk_gemm's per-slice ones, the
// row steps') then leaves the multiprocessor to the other. In 128
// registers it spills about 420 bytes (stores) / 1,150 (loads) a thread,
// mostly the workspace pointers around the calls of the non-inlined
// blk_gemm_s, and is still faster: gpu_d1024_gdn 486.1 -> 474.4 ms a step
// on the H200 (one device call, A/B; 1: 254 registers, no spill).
// (Keeping those pointers in shared memory instead, written by thread 0,
// spilled less but gave wrong dK and dbeta at 2 blocks per SM, right ones
// at 1: see docs/cuda.md, "Not yet".)
#ifndef GDN_MINB
#define GDN_MINB 2
#endif
#ifndef GDN_CHUNK_MINB
#define GDN_CHUNK_MINB 2
#endif

// Everything a kernel reads, by value.
struct GdnArgs {
    const real *q, *k, *v, *beta, *g, *s0;   // s0 may be NULL (zeros)
    const int *first;                        // (B, T) document starts (docs.h), device copy, or NULL
    real *o, *sT, *saved;                    // saved: NULL when the node is not recorded
    const real *dout, *dsT;                  // backward: the outputs' gradients, either may be NULL
    real *gq, *gk, *gv, *gbeta, *gg, *gs0;   // backward: where the gradients go (written whole), NULL: not wanted
    unsigned char *ws;                       // per-block workspace, ws_stride bytes each
    size_t ws_stride;
    int B, T, H, dk, dv, C, NC, ldk, ldv;
    int Cw;                                  // min(C, T): the longest chunk, what workspaces hold
    // The chunked form's per-op rows, head-major: row t of head bh at (bh T + t).
    int64_t items;                           // B H NC: the chunks
    int NV;                                  // the scans' column blocks per head: ceil(dv / NVB)
    int scanR, scanNS, scanP, scan_vec;      // the scans' tile rows, stages, W/K row pitch, SCAN_VEC_*
    bool scan_acc;                           // the scans' chunks span several tiles (step 2 carries sums)
    // The two-level scan (the section "the scans"): SCAN_WHOLE walks every
    // chunk in one go; else groups of scanG chunks (scanNG of them), first
    // each group alone (SCAN_LOCAL, with NVt column blocks more for the
    // transition), then k_gdn_scan_join across groups, then each group
    // again from its entering state (SCAN_SEEDED).
    int scan_mode, scanG, scanNG, NVt;
    real *scan_grp;                          // (B H, scanNG, dk, dv + dk) per group: its local end state | transition
    real *scan_E;                            // (B H, scanNG, dk, dv) per group: forward the state entering it,
                                             // backward the gradient of the state leaving it
    real *Wb;                                // (B H, T, dk) W of every chunk
    real *Ub;                                // (B H, T, dv) forward: U, then Delta; backward: P^T dO, then dDelta
    real *ekb;                               // (B H, T) ek of every chunk
    real *blb;                               // (B H, NC) bl of every chunk
    real *states;                            // (B H, NC, dk, dv) the state entering each chunk (saved or scratch)
    real *dsb;                               // backward (B H, NC, dk, dv): Q^T dY, then dLoss/d(state leaving the chunk)
};

static GdnArgs gdn_args(const Node *n) {
    GdnArgs a;
    memset(&a, 0, sizeof a);
    a.B = n->iarg[GDN_ARG_B];
    a.T = n->iarg[GDN_ARG_T];
    a.H = n->iarg[GDN_ARG_H];
    a.dk = n->iarg[GDN_ARG_DK];
    a.dv = n->iarg[GDN_ARG_DV];
    a.C = n->iarg[GDN_ARG_C];
    a.NC = (a.T + a.C - 1) / a.C;
    a.Cw = a.C < a.T ? a.C : a.T;
    a.ldk = a.H * a.dk;
    a.ldv = a.H * a.dv;
    a.q = n->in[GDN_IN_Q]->data;
    a.k = n->in[GDN_IN_K]->data;
    a.v = n->in[GDN_IN_V]->data;
    a.beta = n->in[GDN_IN_BETA]->data;
    a.g = n->in[GDN_IN_G]->data;
    a.s0 = n->in[GDN_IN_S0] ? n->in[GDN_IN_S0]->data : NULL;
    a.o = n->out[0]->data;
    a.sT = n->out[1]->data;
    a.saved = (real *)n->saved;
    // n->aux is host memory: the kernels read a device copy.
    if (n->aux) {
        size_t bytes = (size_t)a.B * a.T * sizeof(int);
        int *f = (int *)tape_dalloc(n->tape, bytes);
        cu_from_host(f, n->aux, bytes);
        a.first = f;
    }
    return a;
}

// Byte offsets of a per-block workspace: `take` advances by n elements of
// `size` bytes, every offset 16-aligned.
static __host__ __device__ inline size_t ws_take(size_t *at, size_t n, size_t size) {
    size_t o = *at;
    *at += (n * size + 15) & ~(size_t)15;
    return o;
}

// ---------------------------------------------------------------- block-wide products

// blk_gemm's register tiles: a thread computes a 4 x 4 block of C; the
// block's 256 threads a tile of TM x TN (64 x 64, or 128 x 32 / 32 x 128
// when that takes fewer tiles), walking K in slices of BK. A slice of op(A)
// is held k-major (BK rows of TM, pitch TM + BPAD) and op(B) likewise (BK
// rows of TN), so a thread's 4 values of each are one 16-byte load apiece;
// two buffers of each, the next slice being loaded from global memory into
// registers while the current one is computed. A tile's C goes through
// shared memory (over the slices' buffers) so that its global reads and
// writes are coalesced.
#define BK 16                            // K slice
#define BPAD (16 / (int)sizeof(real))    // a slice row's pad: 16 bytes
// Reals of shared memory: the largest of the three shapes' two buffers of
// A and B slices (BK (TM + TN + 2 BPAD) each) and the C stage (TM TN).
#define BLK_SMEM (2 * BK * (160 + 2 * BPAD))

struct Tiles {
    __align__(16) real s[BLK_SMEM];
};

// Four consecutive reals of shared memory, 16-byte aligned.
struct R4 {
    real v[4];
};
__device__ __forceinline__ R4 ld4(const real *p) {
    R4 r;
#ifdef AG_DOUBLE
    double2 x = reinterpret_cast<const double2 *>(p)[0], y = reinterpret_cast<const double2 *>(p)[1];
    r.v[0] = x.x, r.v[1] = x.y, r.v[2] = y.x, r.v[3] = y.y;
#else
    float4 x = *reinterpret_cast<const float4 *>(p);
    r.v[0] = x.x, r.v[1] = x.y, r.v[2] = x.z, r.v[3] = x.w;
#endif
    return r;
}
__device__ __forceinline__ void st4(real *p, const real *v) {
#ifdef AG_DOUBLE
    reinterpret_cast<double2 *>(p)[0] = make_double2(v[0], v[1]);
    reinterpret_cast<double2 *>(p)[1] = make_double2(v[2], v[3]);
#else
    *reinterpret_cast<float4 *>(p) = make_float4(v[0], v[1], v[2], v[3]);
#endif
}

// The slice of op(A) (TM x BK from (i0, k0)) and of op(B) (BK x TN from
// (k0, j0)) into registers, zeros outside the matrices: element e = tid +
// 256 p of each, numbered along the stored rows (consecutive threads read
// consecutive addresses).
template <int TM, int TN>
__device__ __forceinline__ void blk_fetch(real *ra, real *rb, bool ta, bool tb, int M, int N, int K, int i0, int j0,
                                          int k0, const real *A, int lda, const real *as, const real *B, int ldb) {
    int tid = threadIdx.x;
    // Element p of A's: (i + p si, k + p sk), at pa + p step.
    int si = ta ? 0 : GDN_NT / BK, sk = ta ? GDN_NT / TM : 0;
    int i = i0 + (ta ? tid % TM : tid / BK), k = k0 + (ta ? tid / TM : tid % BK);
    const real *pa = A + (ta ? (int64_t)k * lda + i : (int64_t)i * lda + k);
    int64_t step = (int64_t)lda * (si + sk);
#pragma unroll
    for (int p = 0; p < TM * BK / GDN_NT; p++) {
        int ip = i + p * si, kp = k + p * sk;
        real v = 0;
        if (ip < M && kp < K) {
            v = pa[p * step];
            if (as) v = mul_rn(as[ta ? kp : ip], v);   // as: by A's stored row
        }
        ra[p] = v;
    }
    // B's: (k + p sk, j + p sj).
    int sj = tb ? GDN_NT / BK : 0;
    sk = tb ? 0 : GDN_NT / TN;
    int j = j0 + (tb ? tid / BK : tid % TN);
    k = k0 + (tb ? tid % BK : tid / TN);
    const real *pb = B + (tb ? (int64_t)j * ldb + k : (int64_t)k * ldb + j);
    step = (int64_t)ldb * (sj + sk);
#pragma unroll
    for (int p = 0; p < TN * BK / GDN_NT; p++) rb[p] = j + p * sj < N && k + p * sk < K ? pb[p * step] : (real)0;
}

// The registers of blk_fetch into a slice buffer (sa: BK x (TM + BPAD), sb:
// BK x (TN + BPAD)), k-major.
template <int TM, int TN>
__device__ __forceinline__ void blk_put(real *sa, real *sb, const real *ra, const real *rb, bool ta, bool tb) {
    int tid = threadIdx.x;
#pragma unroll
    for (int p = 0; p < TM * BK / GDN_NT; p++) {
        int e = tid + p * GDN_NT;
        sa[(ta ? e / TM : e % BK) * (TM + BPAD) + (ta ? e % TM : e / BK)] = ra[p];
    }
#pragma unroll
    for (int p = 0; p < TN * BK / GDN_NT; p++) {
        int e = tid + p * GDN_NT;
        sb[(tb ? e % BK : e / TN) * (TN + BPAD) + (tb ? e / BK : e % TN)] = rb[p];
    }
}

// blk_gemm_s in tiles of TM x TN. Threads: warp w, lane l compute rows
// 4 ty .. 4 ty + 3 and columns 4 tx .. 4 tx + 3 of a tile, ty = 4 (w / WX) +
// l / 8, tx = 8 (w % WX) + l % 8 (WX = TN / 32 warps across): a warp's
// 16-byte loads of a slice row are then 4 of A and 8 of B, one pass each.
// Every C element is one thread's fma chain from 0 over k = 0, 1, ..., K - 1
// (zeros past K: the last slice is filled with them, and the 32-wide slices
// of the products before these did as much, so acc + 0 once when K is not a
// multiple of 32: -0 becomes +0 as it did then), then alpha acc rounded, and
// with beta, fma(C, beta, that) (what the products before these compiled to).
template <int TM, int TN>
__device__ __forceinline__ void blk_tiles(Tiles *sh, bool ta, bool tb, int M, int N, int K, real alpha,
                                          const real *A, int lda, const real *as, const real *B, int ldb, real beta,
                                          real *C, int ldc) {
    constexpr int NA = TM * BK / GDN_NT, NB = TN * BK / GDN_NT, WX = TN / 32;
    constexpr int AP = TM + BPAD, BP = TN + BPAD, ASZ = BK * AP, BSZ = BK * BP;
    static_assert(TM * TN == 16 * GDN_NT && NA * GDN_NT == TM * BK && NB * GDN_NT == TN * BK, "blk_tiles");
    static_assert(2 * (ASZ + BSZ) <= BLK_SMEM && TM * TN <= BLK_SMEM, "blk_tiles: Tiles");
    real *sa = sh->s, *sb = sh->s + 2 * ASZ, *sc = sh->s;   // sc: the C stage, over the buffers
    int tid = threadIdx.x, w = tid / 32, l = tid % 32;
    int ty = w / WX * 4 + l / 8, tx = w % WX * 8 + l % 8;
    int tn = (N + TN - 1) / TN, nt = (M + TM - 1) / TM * tn, ns = (K + BK - 1) / BK;
    for (int tile = 0; tile < nt; tile++) {
        int i0 = tile / tn * TM, j0 = tile % tn * TN;
        real acc[4][4], ra[NA], rb[NB];
#pragma unroll
        for (int r = 0; r < 4; r++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[r][c] = 0;
        if (ns > 0) {
            blk_fetch<TM, TN>(ra, rb, ta, tb, M, N, K, i0, j0, 0, A, lda, as, B, ldb);
            blk_put<TM, TN>(sa, sb, ra, rb, ta, tb);
        }
        __syncthreads();   // slice 0 is in
        for (int s = 0; s < ns; s++) {
            int cur = s & 1;
            if (s + 1 < ns) blk_fetch<TM, TN>(ra, rb, ta, tb, M, N, K, i0, j0, (s + 1) * BK, A, lda, as, B, ldb);
            const real *pa = sa + cur * ASZ + ty * 4, *pb = sb + cur * BSZ + tx * 4;
#pragma unroll
            for (int kk = 0; kk < BK; kk++) {
                R4 a = ld4(pa + kk * AP), b = ld4(pb + kk * BP);
#pragma unroll
                for (int r = 0; r < 4; r++)
#pragma unroll
                    for (int c = 0; c < 4; c++) acc[r][c] = fma(a.v[r], b.v[c], acc[r][c]);
            }
            // The other buffer was last read before the previous barrier.
            if (s + 1 < ns) blk_put<TM, TN>(sa + (1 - cur) * ASZ, sb + (1 - cur) * BSZ, ra, rb, ta, tb);
            __syncthreads();   // slice s + 1 is in; slice s is no longer read
        }
        // No thread reads the slices any more (the barrier above): the stage.
        bool pad = (K & 31) != 0;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            if (pad)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[r][c] = add_rn(acc[r][c], 0);
            st4(sc + (ty * 4 + r) * TN + tx * 4, acc[r]);
        }
        __syncthreads();   // the stage is in
        int mr = min(TM, M - i0), nc = min(TN, N - j0), jj = tid % TN;
        if (jj < nc)
#pragma unroll 4
            for (int ii = tid / TN; ii < mr; ii += GDN_NT / TN) {
                real *c = C + (int64_t)(i0 + ii) * ldc + j0 + jj, v = mul_rn(alpha, sc[ii * TN + jj]);
                *c = beta == 0 ? v : fma(*c, beta, v);
            }
        __syncthreads();   // the stage is read (the next tile's slice 0 goes over it); C is written
    }
    if (nt == 0) __syncthreads();
}

// C (M x N) = alpha op(A) op(B) + beta C, row-major with leading dimensions
// lda, ldb, ldc; op(A) is M x K, op(B) K x N. as: NULL, or a factor for each
// row of A as stored (as[r] A[r][.], so diag(as) A when A is not transposed,
// (diag(as) A)^T when it is), applied as A's elements are loaded. Every
// thread of the block calls it with the same arguments. beta == 0 never
// reads C (fresh buffers hold NaN in float64). C must not overlap A or B.
// Ends with a barrier: C is then ready for every thread, and A, B may be
// overwritten. Not inlined: one copy for the two dozen calls. Tiles of
// 64 x 64 unless 128 x 32 or 32 x 128 takes fewer (a short or a narrow C).
__device__ __noinline__ void blk_gemm_s(Tiles *sh, bool ta, bool tb, int M, int N, int K, real alpha, const real *A,
                                        int lda, const real *as, const real *B, int ldb, real beta, real *C,
                                        int ldc) {
    int sq = (M + 63) / 64 * ((N + 63) / 64), tall = (M + 127) / 128 * ((N + 31) / 32);
    int wide = (M + 31) / 32 * ((N + 127) / 128);
    if (tall < sq && tall <= wide) blk_tiles<128, 32>(sh, ta, tb, M, N, K, alpha, A, lda, as, B, ldb, beta, C, ldc);
    else if (wide < sq) blk_tiles<32, 128>(sh, ta, tb, M, N, K, alpha, A, lda, as, B, ldb, beta, C, ldc);
    else blk_tiles<64, 64>(sh, ta, tb, M, N, K, alpha, A, lda, as, B, ldb, beta, C, ldc);
}

__device__ __forceinline__ void blk_gemm(Tiles *sh, bool ta, bool tb, int M, int N, int K, real alpha, const real *A,
                                         int lda, const real *B, int ldb, real beta, real *C, int ldc) {
    blk_gemm_s(sh, ta, tb, M, N, K, alpha, A, lda, NULL, B, ldb, beta, C, ldc);
}

// ---------------------------------------------------------------- warp-wide sums

#define GDN_NW (GDN_NT / 32)   // warps of a block of the chunked form

// The sum over a warp's lanes of one double each: a butterfly of shuffles,
// the same order every time, the same bits in every lane (x + y = y + x).
__device__ __forceinline__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// sum_c x_c y_c over c < n in double by the calling warp (lane l takes c =
// l, l + 32, ... in order, then warp_sum), returned to every lane: the CPU's
// dot, in another fixed order.
__device__ __forceinline__ double warp_dot(const real *__restrict__ x, const real *__restrict__ y, int n) {
    double s = 0;
    for (int c = threadIdx.x % 32; c < n; c += 32) s += (double)x[c] * y[c];
    return warp_sum(s);
}

// Inclusive prefix sums of v[0..n) in place (reverse: suffix sums, v[i] =
// v[i] + ... + v[n-1]) by warp 0 of the block; the other warps return at
// once (the caller's barriers order it). Lane l sums a run of ceil(n / 32)
// consecutive entries in order; the runs' totals are scanned across the
// lanes (Hillis-Steele, a fixed order); each lane then adds the total of the
// runs before its own to its entries. In double, as the CPU's running sum.
__device__ void warp0_cumsum(double *v, int n, bool reverse) {
    if (threadIdx.x >= 32) return;
    int l = threadIdx.x, run = (n + 31) / 32, i0 = l * run, i1 = min(n, i0 + run);
    double tot = 0;
    for (int i = i0; i < i1; i++) {
        int p = reverse ? n - 1 - i : i;
        tot += v[p];
        v[p] = tot;
    }
    double inc = tot;
    for (int o = 1; o < 32; o <<= 1) {
        double u = __shfl_up_sync(0xffffffffu, inc, o);
        if (l >= o) inc += u;
    }
    double before = __shfl_up_sync(0xffffffffu, inc, 1);   // the runs of lanes 0 .. l - 1
    if (l > 0)
        for (int i = i0; i < i1; i++) {
            int p = reverse ? n - 1 - i : i;
            v[p] = before + v[p];
        }
}

// ---------------------------------------------------------------- chunked form: workspace

// The per-block buffers of gdn_chunk.c's GdnChunk and gdn_chunk_backward.c's
// GdnChunkGrad, chunks of up to C positions; the gradient part only in the
// backward's workspace. W (and U, Delta, dDelta where the kernel says) are
// the op's rows of the chunk (GdnArgs), set per chunk.
struct ChunkWs {
    double *G;                        // (C) Gamma_i
    real *E, *KK, *A, *Tm, *P;        // (C, C)
    real *Xw, *W;                     // (C, dk); W: the op's rows
    real *Xu, *U, *Dl;                // (C, dv)
    real *bet, *bm, *ek;              // (C)
    int *db;                          // (C) the chunk's documents, -1: before the chunk
    // backward
    double *dG, *dbeta, *rsum;   // (C); rsum: a step's row sums
    real *dA;                           // (C, C) dP -> dQK, then dA -> dKK
    real *dK, *dW, *dXw;                // (C, dk)
    real *dXu, *Y;                      // (C, dv)
    real *dDl;                          // (C, dv) the op's dDelta rows
    const real *dS;                     // (dk, dv) the gradient of the state leaving the chunk (the op's)
};

static __host__ __device__ size_t chunk_ws_layout(ChunkWs *w, unsigned char *base, int C, int dk, int dv,
                                                  bool grad) {
    size_t at = 0, CC = (size_t)C * C, Ck = (size_t)C * dk, Cv = (size_t)C * dv;
    size_t oG = ws_take(&at, C, sizeof(double));
    size_t oE = ws_take(&at, CC, sizeof(real)), oKK = ws_take(&at, CC, sizeof(real));
    size_t oA = ws_take(&at, CC, sizeof(real)), oTm = ws_take(&at, CC, sizeof(real));
    size_t oP = ws_take(&at, CC, sizeof(real));
    size_t oXw = ws_take(&at, Ck, sizeof(real));
    size_t oXu = ws_take(&at, Cv, sizeof(real)), oU = ws_take(&at, Cv, sizeof(real));
    size_t oDl = ws_take(&at, Cv, sizeof(real));
    size_t obet = ws_take(&at, C, sizeof(real)), obm = ws_take(&at, C, sizeof(real));
    size_t oek = ws_take(&at, C, sizeof(real)), odb = ws_take(&at, C, sizeof(int));
    size_t odG = 0, odbeta = 0, orsum = 0, odA = 0, odK = 0, odW = 0, odXw = 0, odXu = 0, oY = 0;
    if (grad) {
        odG = ws_take(&at, C, sizeof(double)), odbeta = ws_take(&at, C, sizeof(double));
        orsum = ws_take(&at, C, sizeof(double));
        odA = ws_take(&at, CC, sizeof(real));
        odK = ws_take(&at, Ck, sizeof(real)), odW = ws_take(&at, Ck, sizeof(real));
        odXw = ws_take(&at, Ck, sizeof(real));
        odXu = ws_take(&at, Cv, sizeof(real)), oY = ws_take(&at, Cv, sizeof(real));
    }
    if (w) {
        w->G = (double *)(base + oG);
        w->E = (real *)(base + oE), w->KK = (real *)(base + oKK), w->A = (real *)(base + oA);
        w->Tm = (real *)(base + oTm), w->P = (real *)(base + oP);
        w->Xw = (real *)(base + oXw), w->W = NULL;
        w->Xu = (real *)(base + oXu), w->U = (real *)(base + oU), w->Dl = (real *)(base + oDl);
        w->bet = (real *)(base + obet), w->bm = (real *)(base + obm), w->ek = (real *)(base + oek);
        w->db = (int *)(base + odb);
        w->dG = (double *)(base + odG), w->dbeta = (double *)(base + odbeta);
        w->rsum = (double *)(base + orsum);
        w->dA = (real *)(base + odA);
        w->dK = (real *)(base + odK), w->dW = (real *)(base + odW), w->dXw = (real *)(base + odXw);
        w->dXu = (real *)(base + odXu), w->Y = (real *)(base + oY);
        w->dDl = NULL, w->dS = NULL;
    }
    return (at + 255) & ~(size_t)255;
}

// One chunk of one head: the work item `it` (0 <= it < B H NC) of a
// per-chunk kernel, heads major.
struct Item {
    int b, h, c, t0, L;
    int64_t bh;
};

__device__ __forceinline__ Item item_of(const GdnArgs &a, int64_t it) {
    Item m;
    m.bh = it / a.NC;
    m.c = (int)(it % a.NC);
    m.b = (int)(m.bh / a.H);
    m.h = (int)(m.bh % a.H);
    m.t0 = m.c * a.C;
    m.L = min(a.C, a.T - m.t0);
    return m;
}

// exp of a non-positive log decay difference (gdn_exp), in `real`.
__device__ __forceinline__ real gdn_dexp(double x) { return exp((real)x); }

// What chunk_prepare computes beyond the decays (G, bet, db, E, bm, ek).
enum {
    PREP_SOLVE = 1,   // KK, A, Tm
    PREP_W = 2,       // W = Tm diag(beta b) K into w.W (needs PREP_SOLVE)
    PREP_U = 4,       // U = Tm diag(beta) V into w.U (needs PREP_SOLVE)
    PREP_DL = 8,      // Delta = U - W S0 into w.Dl (reads w.U, w.W)
    PREP_P = 16,      // P = (Q K^T) * E
};

// Tm = (I + A)^-1 (A strictly lower, L x L, L <= 32 R) by warps, from At =
// A^T in shared memory (pitch L + 1); no barrier. A column of Tm is the
// solution of (I + A) x = e_j: a warp takes the columns j, j + 1 of a pair
// (pairs dealt to the warps back and forth, so that the long and the short
// columns even out), lane l holds rows l + 32 r of both in registers, and
// for m = j, j + 1, ..., L - 2 broadcasts x_m (final after step m - 1) and
// updates the rows below: x_i -= A_im x_m. Each x_i is then, as in the
// row-by-row substitution, e_ij minus its terms m = j .. i - 1 in ascending
// order, one fma each (column j + 1 at m = j subtracts A_im 0: x_i stays).
// Writes Tm whole (zeros above the diagonal).
static_assert(64 * (64 + 1) <= BLK_SMEM, "solve_warps: A^T of 64 positions over the Tiles");
template <int R> __device__ void solve_warps(real *Tm, const real *At, int L) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, ap = L + 1, np = (L + 1) / 2;
    for (int q = 0; q * GDN_NW < np; q++) {
        int p = q * GDN_NW + (q & 1 ? GDN_NW - 1 - warp : warp), j = 2 * p;
        if (p >= np) continue;
        real x0[R], x1[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = lane + 32 * r;
            x0[r] = i == j ? (real)1 : (real)0;
            x1[r] = i == j + 1 ? (real)1 : (real)0;
        }
        for (int m = j; m < L - 1; m++) {
            real s0 = x0[0], s1 = x1[0];
#pragma unroll
            for (int r = 1; r < R; r++)
                if (m >> 5 == r) s0 = x0[r], s1 = x1[r];
            s0 = __shfl_sync(0xffffffffu, s0, m & 31);
            s1 = __shfl_sync(0xffffffffu, s1, m & 31);
            const real *am = At + m * ap;
#pragma unroll
            for (int r = 0; r < R; r++) {
                int i = lane + 32 * r;
                if (i > m && i < L) {
                    real av = am[i];
                    x0[r] -= av * s0;
                    x1[r] -= av * s1;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            int i = lane + 32 * r;
            if (i < L) {
                Tm[i * L + j] = x0[r];
                if (j + 1 < L) Tm[i * L + j + 1] = x1[r];
            }
        }
    }
}

// gdn_chunk_prepare (the parts `what` asks for): the chunk of L positions
// starting at t0 of head (b, h), entering state S0 (read for PREP_DL only).
// All threads, `what` the same in all; ends with a barrier.
__device__ void chunk_prepare(const GdnArgs &a, ChunkWs &w, Tiles *sh, int b, int h, int t0, int L, const real *S0,
                              unsigned what) {
    int tid = threadIdx.x, dk = a.dk, dv = a.dv, H = a.H;
    int64_t ok = ((int64_t)b * a.T + t0) * a.ldk + (int64_t)h * dk;
    int64_t ov = ((int64_t)b * a.T + t0) * a.ldv + (int64_t)h * dv;
    int64_t oh = ((int64_t)b * a.T + t0) * H + h;
    const real *q = a.q + ok, *k = a.k + ok, *v = a.v + ov, *beta = a.beta + oh, *g = a.g + oh;
    bool docs = a.first != NULL;
    // Gamma: the running sum of g (warp0_cumsum).
    for (int i = tid; i < L; i += GDN_NT) {
        w.G[i] = g[(int64_t)i * H];
        w.bet[i] = beta[(int64_t)i * H];
        int f = docs ? a.first[(int64_t)b * a.T + t0 + i] : -1;
        w.db[i] = f >= t0 ? f - t0 : -1;
    }
    __syncthreads();
    warp0_cumsum(w.G, L, false);
    __syncthreads();
    // E_ij = exp(Gamma_i - Gamma_j) inside row i's document (j >= db[i]), j <= i.
    for (int e = tid; e < L * L; e += GDN_NT) {
        int i = e / L, j = e % L;
        int j0 = docs && w.db[i] > 0 ? w.db[i] : 0;
        w.E[e] = j >= j0 && j <= i ? gdn_dexp(w.G[i] - w.G[j]) : (real)0;
    }
    // The factors through S0 and to the end of the chunk (gdn_kernel.h).
    int jL = docs && w.db[L - 1] > 0 ? w.db[L - 1] : 0;
    for (int i = tid; i < L; i += GDN_NT) {
        w.bm[i] = docs && w.db[i] >= 0 ? (real)0 : gdn_dexp(w.G[i]);
        w.ek[i] = i < jL ? (real)0 : gdn_dexp(w.G[L - 1] - w.G[i]);
    }
    __syncthreads();
    if (what & PREP_SOLVE) {
        // A = strictly-lower (beta_i E_ij k_i.k_j).
        blk_gemm(sh, false, true, L, L, dk, 1, k, a.ldk, k, a.ldk, 0, w.KK, L);
        // A short chunk's A^T also goes to shared memory (over the Tiles,
        // free between products; pitch L + 1: no bank conflicts) for solve_warps.
        bool fast = L <= 2 * 32;
        real *At = sh->s;
        for (int e = tid; e < L * L; e += GDN_NT) {
            int i = e / L, j = e % L;
            real x = j < i ? w.bet[i] * w.E[e] * w.KK[e] : (real)0;
            w.A[e] = x;
            if (fast) At[j * (L + 1) + i] = x;
        }
        __syncthreads();
        // Tm = (I + A)^-1, row i = e_i - sum_{m<i} A_im Tm_m, m in the CPU's order.
        if (fast) {
            if (L <= 32) solve_warps<1>(w.Tm, At, L);
            else solve_warps<2>(w.Tm, At, L);
            // The barrier after Xw, Xu below ends it (Tm is written, At no longer read).
        } else {
            for (int i = 0; i < L; i++) {
                for (int j = tid; j < L; j += GDN_NT) {
                    real t = j == i ? (real)1 : (real)0;
                    for (int m = j; m < i; m++) t -= w.A[i * L + m] * w.Tm[m * L + j];
                    w.Tm[i * L + j] = t;
                }
                __syncthreads();
            }
        }
    }
    // W = Tm diag(beta b) K, U = Tm diag(beta) V, Delta = U - W S0.
    if (what & PREP_W)
        for (int e = tid; e < L * dk; e += GDN_NT) {
            int i = e / dk, c = e % dk;
            w.Xw[e] = w.bet[i] * w.bm[i] * k[(int64_t)i * a.ldk + c];
        }
    if (what & PREP_U)
        for (int e = tid; e < L * dv; e += GDN_NT) {
            int i = e / dv, c = e % dv;
            w.Xu[e] = w.bet[i] * v[(int64_t)i * a.ldv + c];
        }
    __syncthreads();
    if (what & PREP_W) blk_gemm(sh, false, false, L, dk, L, 1, w.Tm, L, w.Xw, dk, 0, w.W, dk);
    if (what & PREP_U) blk_gemm(sh, false, false, L, dv, L, 1, w.Tm, L, w.Xu, dv, 0, w.U, dv);
    if (what & PREP_DL) {
        for (int e = tid; e < L * dv; e += GDN_NT) w.Dl[e] = w.U[e];
        __syncthreads();
        blk_gemm(sh, false, false, L, dv, dk, -1, w.W, dk, S0, dv, 1, w.Dl, dv);
    }
    // P = (Q K^T) * E. (Kd = diag(ek) K is applied as K is loaded: blk_gemm_s.)
    if (what & PREP_P) {
        blk_gemm(sh, false, true, L, L, dk, 1, q, a.ldk, k, a.ldk, 0, w.P, L);
        for (int e = tid; e < L * L; e += GDN_NT) w.P[e] *= w.E[e];
    }
    __syncthreads();
}

// The per-chunk kernels' grids: as many blocks as the GPU keeps resident
// (each walks the chunks gridDim.x apart), at most one per chunk.
template <typename K> static int resident_blocks(K kernel) {
    int dev = 0, sms = 0, per = 0;
    CU_CHECK(cudaGetDevice(&dev));
    CU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, GDN_NT, 0));
    return sms * (per > 0 ? per : 1);
}

static int chunk_grid(int64_t items, int resident) { return (int)(items < resident ? items : resident); }

// ---------------------------------------------------------------- chunked form: the scans

// The scans (k_gdn_fwd_scan, k_gdn_bwd_scan): one block per (batch, head,
// block of NVB columns of the state), walking the chunks in order (forward)
// or in reverse (backward). The block's slice of the state, dk x NVB, stays
// in shared memory for the whole walk. A chunk is walked in tiles of up to R
// of its rows (R = the chunk when it fits); a tile's operands (W and K rows,
// dk wide; U or P^T dO rows, the block's columns; ek; the chunk's bl) go to
// one of NS stages of shared memory by cp.async, NS - 1 tiles ahead of the
// one being computed. Threads: GDN_NT = 256, thread tid takes the block's
// columns jj .. jj + 3, jj = 4 (tid mod NVB/4), and the rows
// tid / (NVB/4) + m 256 / (NVB/4) of each step (two at a time, for reuse of
// the shared-memory loads); a thread whose columns are all past dv idles
// (all reach the barriers). A tile is two steps, each ended by a barrier:
//   1. rows t of the tile:
//      forward  Delta_t = U_t - sum_k W_tk S_k
//      backward dDelta_t = sum_k (ek_t K_tk) dS_k (+ (P^T dO)_t)
//      into shared memory and over the op's rows (Ub);
//   2. rows k of the state:
//      forward  acc_k += sum_t (ek_t K_tk) Delta_t
//      backward acc_k += sum_t W_tk dDelta_t
//      carried from tile to tile of a chunk (in shared memory, each entry by
//      its thread); at the chunk's last tile the thread that owns an entry
//      ends it: forward S = bl S + acc (bl = 0: S is not read), written to
//      the next chunk's saved slot (S_T after the last); backward it keeps dS
//      in the chunk's dS slot (whose Q^T dY came with the chunk's last tile,
//      into its stage) and dS = (bl dS + Q^T dY) - acc (s0's gradient after
//      chunk 0).
// Every sum is one thread's fma chain from 0 in ascending k or t (the tiles
// of a chunk in order), the order of blk_gemm's K loop that these scans used
// before: over k for step 1, over the chunk's rows for step 2; ek_t K_tk is
// rounded before it multiplies, as blk_gemm_s's loads did; then one more
// rounding each for U - sum, sum + (P^T dO), fma(bl, S, sum) and
// fma(bl, dS, Q^T dY) - sum. (The CPU's tile_gemm, or its BLAS, may
// add in another order: the GPU-vs-CPU tolerance covers that.) A column's arithmetic
// does not depend on NVB, NS or R: results are the same bits whichever the
// host picks.
// Two levels (scan_groups decides, from B H, dv, dk and the chunks): the
// forward state after a group of chunks is Phi S + L, S the state entering
// it, L the group's end walked from 0, Phi the product of its chunks'
// transitions bl I - Kd^T W (the backward: the gradient entering, from the
// one leaving, through Phi^T, walked in reverse). So:
//   1. SCAN_LOCAL: each group walked alone, its real columns from 0 and
//      dk more columns from the identity with U (P^T dO, Q^T dY) taken as
//      0, which the same steps turn into Phi's columns; only the group's end
//      is written (scan_grp). The group whose end nothing needs is left out.
//   2. k_gdn_scan_join: across the groups in order, S <- Phi S + L.
//   3. SCAN_SEEDED: each group again from its entering state (scan_E),
//      writing what the one-level walk writes, except the state leaving a
//      group that is not the last: the next group's walk writes that one,
//      from the join.
// The two-level results differ from the one-level ones by rounding (the
// sums over chunks are made in another order); with the group fixed, a
// column's arithmetic still does not depend on NVB, NS or R.
#define SCAN_RMAX 64   // most rows of a tile

enum { SCAN_VEC_W = 1, SCAN_VEC_K = 2, SCAN_VEC_U = 4, SCAN_VEC_DS = 8 };   // GdnArgs.scan_vec
enum { SCAN_WHOLE, SCAN_LOCAL, SCAN_SEEDED };                                  // GdnArgs.scan_mode

// Pitch (in reals) of a W or K row in shared memory: dk rounded up to 128
// bytes, plus 16, so that the 16-byte loads of 8 consecutive rows at one k
// hit all 32 banks; a multiple of 16 bytes.
static __host__ __device__ inline int scan_pitch(int dk) {
    int r128 = 128 / (int)sizeof(real), r16 = 16 / (int)sizeof(real);
    return (dk + r128 - 1) / r128 * r128 + r16;
}

struct ScanStage {
    real *W, *K;    // (R, pitch) the tile's rows of W and K
    real *X;        // (R, NVB) forward U, backward P^T dO (with dO only), the block's columns
    real *ek, *bl;  // (R) ek of the rows, (1) bl of the chunk
    real *Y;        // backward (dk, NVB): the chunk's Q^T dY (with dO only, at the chunk's last tile)
};

struct ScanSmem {
    ScanStage st0;          // stage 0; stage s is `stride` bytes further each
    size_t stride;
    real *S;     // (dk, NVB) forward the state, backward its gradient
    real *D;     // (R, NVB) the tile's Delta (dDelta)
    real *Acc;   // (dk, NVB) step 2's sums between tiles of a chunk; NULL when chunks are one tile
};

static __host__ __device__ size_t scan_layout(ScanSmem *m, unsigned char *base, int ns, int R, int dk, int nvb,
                                              bool bwd, bool acc) {
    size_t at = 0, P = (size_t)scan_pitch(dk), Sn = (size_t)dk * nvb;
    size_t oW = ws_take(&at, R * P, sizeof(real)), oK = ws_take(&at, R * P, sizeof(real));
    size_t oX = ws_take(&at, (size_t)R * nvb, sizeof(real));
    size_t oe = ws_take(&at, R, sizeof(real)), ob = ws_take(&at, 1, sizeof(real));
    size_t oY = bwd ? ws_take(&at, Sn, sizeof(real)) : 0;
    size_t stride = at;
    at = stride * ns;
    size_t oS = ws_take(&at, Sn, sizeof(real)), oD = ws_take(&at, (size_t)R * nvb, sizeof(real));
    size_t oA = acc ? ws_take(&at, Sn, sizeof(real)) : 0;
    if (m) {
        ScanStage &t = m->st0;
        t.W = (real *)(base + oW), t.K = (real *)(base + oK), t.X = (real *)(base + oX);
        t.ek = (real *)(base + oe), t.bl = (real *)(base + ob);
        t.Y = bwd ? (real *)(base + oY) : NULL;
        m->stride = stride;
        m->S = (real *)(base + oS), m->D = (real *)(base + oD);
        m->Acc = acc ? (real *)(base + oA) : NULL;
    }
    return at;
}

// cp.async (sm_80 on): 16 bytes of which the first `bytes` are read and the
// rest zero, or one real; a group per commit; wait until at most N groups of
// this thread are in flight (its copies are then visible to it; to others
// after a barrier).
__device__ __forceinline__ unsigned smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(real *dst, const real *src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async1(real *dst, const real *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "n"((int)sizeof(real))
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four reals to shared memory (dst 16-byte aligned) from src, of which the
// first `valid` (1..4) exist; the others become 0. vec: src is 16-byte
// aligned (whole 16-byte copies), else one real at a time.
__device__ __forceinline__ void copy4(real *dst, const real *src, int valid, bool vec) {
    if (vec) {
        const int per = 16 / (int)sizeof(real);
        for (int h = 0; h < 4; h += per) {
            int n = min(max(valid - h, 0), per);
            cp_async16(dst + h, n ? src + h : src, n * (int)sizeof(real));
        }
    } else {
        for (int u = 0; u < 4; u++)
            if (u < valid) cp_async1(dst + u, src + u);
            else dst[u] = 0;
    }
}

__device__ __forceinline__ ScanStage scan_stage(const ScanSmem &m, int s) {
    size_t o = m.stride * s;
    ScanStage t;
    t.W = (real *)((unsigned char *)m.st0.W + o), t.K = (real *)((unsigned char *)m.st0.K + o);
    t.X = (real *)((unsigned char *)m.st0.X + o);
    t.ek = (real *)((unsigned char *)m.st0.ek + o), t.bl = (real *)((unsigned char *)m.st0.bl + o);
    t.Y = m.st0.Y ? (real *)((unsigned char *)m.st0.Y + o) : NULL;
    return t;
}

// Where a walk stands: chunk c, the tile of its rows from r0.
struct ScanPos {
    int c, r0;
};

template <bool BWD> __device__ __forceinline__ ScanPos scan_next(const GdnArgs &a, ScanPos p) {
    int L = min(a.C, a.T - p.c * a.C);
    if (p.r0 + a.scanR < L) return {p.c, p.r0 + a.scanR};
    return {BWD ? p.c - 1 : p.c + 1, 0};
}

// Whether p lies in the walk's chunks [lo, hi).
__device__ __forceinline__ bool scan_in(int lo, int hi, ScanPos p) { return p.c >= lo && p.c < hi; }

// A tile's operands into a stage (cp.async, not committed). All threads.
template <bool BWD, int NVB>
__device__ void scan_load(const GdnArgs &a, const ScanStage &st, int64_t bh, int b, int h, int j0, int nv,
                          ScanPos p, bool has_x) {
    int tid = threadIdx.x, dk = a.dk, P = a.scanP, g4 = (dk + 3) / 4;
    int t0 = p.c * a.C + p.r0, n = min(a.scanR, min(a.C, a.T - p.c * a.C) - p.r0);
    int64_t row0 = bh * a.T + t0;   // the op's rows
    const real *W = a.Wb + row0 * a.dk, *K = a.k + ((int64_t)b * a.T + t0) * a.ldk + (int64_t)h * dk;
    bool vW = a.scan_vec & SCAN_VEC_W, vK = a.scan_vec & SCAN_VEC_K, vU = a.scan_vec & SCAN_VEC_U;
    for (int e = tid; e < n * g4; e += GDN_NT) {
        int t = e / g4, c4 = e % g4 * 4, m = min(4, dk - c4);
        copy4(st.W + t * P + c4, W + (int64_t)t * dk + c4, m, vW);
        copy4(st.K + t * P + c4, K + (int64_t)t * a.ldk + c4, m, vK);
    }
    if (has_x) {
        int x4 = (nv + 3) / 4;
        for (int e = tid; e < n * x4; e += GDN_NT) {
            int t = e / x4, c4 = e % x4 * 4;
            copy4(st.X + t * NVB + c4, a.Ub + (row0 + t) * a.dv + j0 + c4, min(4, nv - c4), vU);
        }
    }
    for (int t = tid; t < n; t += GDN_NT) cp_async1(st.ek + t, a.ekb + row0 + t);
    if (tid == 0) cp_async1(st.bl, a.blb + bh * a.NC + p.c);
    if (BWD && has_x && p.r0 + a.scanR >= min(a.C, a.T - p.c * a.C)) {   // the chunk's last tile: its Q^T dY
        const real *Y = a.dsb + (bh * a.NC + p.c) * (int64_t)dk * a.dv + j0;
        int x4 = (nv + 3) / 4;
        for (int e = tid; e < dk * x4; e += GDN_NT) {
            int k = e / x4, c4 = e % x4 * 4;
            copy4(st.Y + k * NVB + c4, Y + (int64_t)k * a.dv + c4, min(4, nv - c4), a.scan_vec & SCAN_VEC_DS);
        }
    }
}

// What the steps of a tile read and write, for one thread (columns jj .. jj + 3 of the block's).
struct ScanCtx {
    int dk, dv, P, nv, jj, n;   // n: the tile's rows
    bool first, last, has_x;    // first, last tile of its chunk; X holds U or P^T dO
    bool wrD;                   // Delta (dDelta) goes to Ub
    ScanStage st;
    real *S, *D, *Acc;
    real *gD;    // the tile's first row of Ub, column j0
    real *gS;    // backward: the chunk's dS slot (column j0), where dS before the chunk's step goes, or NULL
    real *gR;    // where the state (its gradient) after the chunk's step goes (rows ldR apart), or NULL:
                 // forward the next chunk's slot or S_T, backward s0's gradient, or a group's end (SCAN_LOCAL)
    int ldR;
};

// Step 1 for rows t, t + RG, ..., MR of them.
template <bool BWD, int NVB, int MR> __device__ __forceinline__ void scan_rows(const ScanCtx &x, int t) {
    constexpr int RG = GDN_NT / (NVB / 4);
    real acc[MR][4], e[MR];
    const real *ar[MR];
#pragma unroll
    for (int m = 0; m < MR; m++) {
        ar[m] = (BWD ? x.st.K : x.st.W) + (t + m * RG) * x.P;
        e[m] = BWD ? x.st.ek[t + m * RG] : (real)1;
#pragma unroll
        for (int q = 0; q < 4; q++) acc[m][q] = 0;
    }
    int k = 0;
#pragma unroll 2
    for (; k + 4 <= x.dk; k += 4) {
        R4 s[4];
#pragma unroll
        for (int u = 0; u < 4; u++) s[u] = ld4(x.S + (k + u) * NVB + x.jj);
#pragma unroll
        for (int m = 0; m < MR; m++) {
            R4 w = ld4(ar[m] + k);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                real av = BWD ? e[m] * w.v[u] : w.v[u];
#pragma unroll
                for (int q = 0; q < 4; q++) acc[m][q] = fma(av, s[u].v[q], acc[m][q]);
            }
        }
    }
    for (; k < x.dk; k++) {
        R4 s = ld4(x.S + k * NVB + x.jj);
#pragma unroll
        for (int m = 0; m < MR; m++) {
            real av = BWD ? e[m] * ar[m][k] : ar[m][k];
#pragma unroll
            for (int q = 0; q < 4; q++) acc[m][q] = fma(av, s.v[q], acc[m][q]);
        }
    }
#pragma unroll
    for (int m = 0; m < MR; m++) {
        int tt = t + m * RG;
        R4 xv = {};
        if (x.has_x) xv = ld4(x.st.X + tt * NVB + x.jj);
        real d[4];
#pragma unroll
        for (int q = 0; q < 4; q++)
            d[q] = BWD ? (x.has_x ? acc[m][q] + xv.v[q] : acc[m][q]) : xv.v[q] - acc[m][q];
        st4(x.D + tt * NVB + x.jj, d);
        if (!x.wrD) continue;
        real *g = x.gD + (int64_t)tt * x.dv + x.jj;
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (x.jj + q < x.nv) g[q] = d[q];
    }
}

// Step 2 for rows k, k + RG, ..., MR of them, and at the chunk's last tile its end.
template <bool BWD, int NVB, int MR> __device__ __forceinline__ void scan_cols(const ScanCtx &x, int k) {
    constexpr int RG = GDN_NT / (NVB / 4);
    real acc[MR][4];
#pragma unroll
    for (int m = 0; m < MR; m++) {
        if (x.first) {
#pragma unroll
            for (int q = 0; q < 4; q++) acc[m][q] = 0;
        } else {
            R4 v = ld4(x.Acc + (k + m * RG) * NVB + x.jj);
#pragma unroll
            for (int q = 0; q < 4; q++) acc[m][q] = v.v[q];
        }
    }
    const real *A = (BWD ? x.st.W : x.st.K) + k;
#pragma unroll 4
    for (int t = 0; t < x.n; t++) {
        R4 d = ld4(x.D + t * NVB + x.jj);
        real e = BWD ? (real)1 : x.st.ek[t];
#pragma unroll
        for (int m = 0; m < MR; m++) {
            real av = A[t * x.P + m * RG];
            if (!BWD) av = e * av;
#pragma unroll
            for (int q = 0; q < 4; q++) acc[m][q] = fma(av, d.v[q], acc[m][q]);
        }
    }
#pragma unroll
    for (int m = 0; m < MR; m++) {
        int kk = k + m * RG;
        if (!x.last) {
            st4(x.Acc + kk * NVB + x.jj, acc[m]);
            continue;
        }
        real *sp = x.S + kk * NVB + x.jj, bl = *x.st.bl, r[4];
        R4 s = ld4(sp);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            if (BWD) {
                real y = x.has_x ? x.st.Y[kk * NVB + x.jj + q] : (real)0;
                r[q] = fma(bl, s.v[q], y) - acc[m][q];
            } else {
                r[q] = bl == 0 ? acc[m][q] : fma(bl, s.v[q], acc[m][q]);
            }
        }
        st4(sp, r);
        int64_t o = (int64_t)kk * x.dv + x.jj, oR = (int64_t)kk * x.ldR + x.jj;
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (x.jj + q < x.nv) {
                if (BWD && x.gS) x.gS[o + q] = s.v[q];
                if (x.gR) x.gR[oR + q] = r[q];
            }
    }
}

// One block's walk. Per tile: wait for its stage, barrier, start the copies
// of the tile NS - 1 ahead (into the stage the previous tile used), step 1,
// barrier, step 2. The prologue commits NS - 1 cp.async groups (the first
// tiles, or empty), each tile one (the tile NS - 1 ahead, or empty): a
// tile's copies are complete when at most NS - 2 groups are pending.
template <bool BWD, int NVB> __device__ void scan_walk(const GdnArgs &a) {
    constexpr int CG = NVB / 4, RG = GDN_NT / CG;   // column groups of 4, row groups
    extern __shared__ __align__(16) unsigned char scan_shared[];
    ScanSmem sm;
    scan_layout(&sm, scan_shared, a.scanNS, a.scanR, a.dk, NVB, BWD, a.scan_acc);
    int tid = threadIdx.x, dk = a.dk, dv = a.dv, NS = a.scanNS, mode = a.scan_mode;
    int jj = tid % CG * 4, rg = tid / CG;
    // The block: (batch, head), its group of chunks [lo, hi) (all of them
    // for SCAN_WHOLE), its column block cb; SCAN_LOCAL's column blocks past
    // NV are the transition's (columns j0.. of the dk x dk identity).
    int ncb = a.NV + (mode == SCAN_LOCAL ? a.NVt : 0);
    int ngb = mode == SCAN_WHOLE ? 1 : mode == SCAN_LOCAL ? a.scanNG - 1 : a.scanNG;
    int64_t blk = blockIdx.x, SS = (int64_t)dk * dv;
    int cb = (int)(blk % ncb), gi = (int)(blk / ncb % ngb);
    int64_t bh = blk / ncb / ngb;
    // SCAN_LOCAL leaves out the group whose end nothing needs: the last
    // (forward), the first (backward).
    int g = mode == SCAN_LOCAL && BWD ? gi + 1 : gi;
    int lo = mode == SCAN_WHOLE ? 0 : g * a.scanG, hi = mode == SCAN_WHOLE ? a.NC : min(a.NC, lo + a.scanG);
    int b = (int)(bh / a.H), h = (int)(bh % a.H);
    bool trans = cb >= a.NV;
    int j0 = (trans ? cb - a.NV : cb) * NVB, nv = min(NVB, (trans ? dk : dv) - j0);
    bool has_x = !trans && (!BWD || a.dout != NULL);
    bool entry = BWD ? hi == a.NC : lo == 0;   // the walk starts from dS_T (s0)
    // The state (its gradient) the walk starts from, 0 in the padding columns:
    // dS_T (s0), or the group's entering one (SCAN_SEEDED), or 0 | identity
    // (SCAN_LOCAL). The forward keeps it as its first chunk's.
    const real *from = mode == SCAN_LOCAL ? NULL
                       : entry            ? (BWD ? a.dsT : a.s0)
                                          : a.scan_E + (bh * a.scanNG + g) * SS;
    for (int e = tid; e < dk * NVB; e += GDN_NT) {
        int i = e / NVB, j = e % NVB;
        real v = 0;
        if (j < nv) {
            if (trans) v = i == j0 + j ? (real)1 : (real)0;
            else if (from) v = from[(entry ? bh * SS : 0) + (int64_t)i * dv + j0 + j];
        }
        sm.S[e] = v;
        if (!BWD && mode != SCAN_LOCAL && j < nv) a.states[(bh * a.NC + lo) * SS + (int64_t)i * dv + j0 + j] = v;
    }
    // Where SCAN_LOCAL leaves its group's end: the real columns, then the transition's.
    real *grp = mode == SCAN_LOCAL ? a.scan_grp + (bh * a.scanNG + g) * (int64_t)dk * (dv + dk) + (trans ? dv : 0) + j0
                                   : NULL;
    ScanPos start = {BWD ? hi - 1 : lo, 0}, pos = start, ahead = start;
    for (int s = 0; s + 1 < NS; s++) {
        if (scan_in(lo, hi, ahead)) {
            scan_load<BWD, NVB>(a, scan_stage(sm, s), bh, b, h, j0, nv, ahead, has_x);
            ahead = scan_next<BWD>(a, ahead);
        }
        cp_async_commit();
    }
    for (int i = 0;; i++) {
        ScanCtx x;
        int L = min(a.C, a.T - pos.c * a.C);
        x.dk = dk, x.dv = dv, x.P = a.scanP, x.nv = nv, x.jj = jj;
        x.n = min(a.scanR, L - pos.r0);
        x.first = pos.r0 == 0, x.last = pos.r0 + a.scanR >= L, x.has_x = has_x;
        x.wrD = mode != SCAN_LOCAL;
        x.st = scan_stage(sm, i % NS);
        x.S = sm.S, x.D = sm.D, x.Acc = sm.Acc;
        x.gD = a.Ub + (bh * a.T + (int64_t)pos.c * a.C + pos.r0) * dv + j0;
        x.gS = NULL, x.gR = NULL, x.ldR = dv;
        bool end = pos.c == (BWD ? lo : hi - 1);   // the walk's last chunk
        if (mode == SCAN_LOCAL) {
            if (end) x.gR = grp, x.ldR = dv + dk;
        } else if (BWD) {
            x.gS = a.dsb + (bh * a.NC + pos.c) * SS + j0;
            if (pos.c == 0 && a.gs0) x.gR = a.gs0 + bh * SS + j0;
        } else if (pos.c + 1 == a.NC) {
            x.gR = a.sT + bh * SS + j0;
        } else if (!end) {   // a group's end is the next group's entering state, which its walk writes
            x.gR = a.states + (bh * a.NC + pos.c + 1) * SS + j0;
        }
        if (NS == 3) cp_async_wait<1>();
        else cp_async_wait<0>();
        __syncthreads();   // the tile's stage is in; the previous tile's steps are done
        if (scan_in(lo, hi, ahead)) {
            scan_load<BWD, NVB>(a, scan_stage(sm, (i + NS - 1) % NS), bh, b, h, j0, nv, ahead, has_x);
            ahead = scan_next<BWD>(a, ahead);
        }
        cp_async_commit();
        if (jj < nv)
            for (int t = rg; t < x.n; t += 2 * RG) {
                if (t + RG < x.n) scan_rows<BWD, NVB, 2>(x, t);
                else scan_rows<BWD, NVB, 1>(x, t);
            }
        __syncthreads();   // the tile's Delta (dDelta) is in; the state is no longer read
        if (jj < nv)
            for (int k = rg; k < dk; k += 2 * RG) {
                if (k + RG < dk) scan_cols<BWD, NVB, 2>(x, k);
                else scan_cols<BWD, NVB, 1>(x, k);
            }
        pos = scan_next<BWD>(a, pos);
        if (!scan_in(lo, hi, pos)) break;
    }
}

// MINB: blocks per multiprocessor the registers are fitted to. One walk
// over all chunks has few blocks and takes 1 (up to 255 registers); the
// two-level scan's passes have many and take SCAN_GROUP_MINB = 2 (at most
// 128 registers, no spills): each block's chunk steps wait on barriers and
// copies, which another block's then fill (tiny_gdn at B = 1, T = 65,536 on
// the H200, one call's sweep: 49.3 ms a step against 51.6 at 1, 48.2 with
// the groups' columns doubled to 16; this final form measured 49.3 in the
// next call).
#define SCAN_GROUP_MINB 2
template <int NVB, int MINB>
__global__ void __launch_bounds__(GDN_NT, MINB) k_gdn_fwd_scan(GdnArgs a) { scan_walk<false, NVB>(a); }
template <int NVB, int MINB>
__global__ void __launch_bounds__(GDN_NT, MINB) k_gdn_bwd_scan(GdnArgs a) { scan_walk<true, NVB>(a); }

// The two-level scan's middle pass: across the groups in order (forward) or
// in reverse (backward), per (batch, head, 32 columns of the state), the
// state entering (the gradient leaving) each group from the one before:
// S <- Phi S + L, Phi and L the group's transition and local end from
// SCAN_LOCAL (scan_grp), into scan_E. Lane l takes column j0 + l, warp w the
// rows w, w + 8, ...; each entry one fma chain over k in ascending order,
// then + L: a column's arithmetic does not depend on the blocks. Shared
// memory: the state's slice and the next one (dk x 32 each).
#define JOIN_COLS 32
template <bool BWD> __global__ void __launch_bounds__(GDN_NT) k_gdn_scan_join(GdnArgs a) {
    extern __shared__ __align__(16) unsigned char join_shared[];
    real *cur = (real *)join_shared, *nxt = cur + (size_t)a.dk * JOIN_COLS;
    int dk = a.dk, dv = a.dv, NG = a.scanNG, ncb = (dv + JOIN_COLS - 1) / JOIN_COLS;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = GDN_NT / 32;
    int64_t bh = blockIdx.x / ncb, SS = (int64_t)dk * dv, ldg = dv + dk;
    int j = (int)(blockIdx.x % ncb) * JOIN_COLS + lane;
    bool in = j < dv;
    const real *from = BWD ? a.dsT : a.s0;
    for (int i = warp; i < dk; i += nw) cur[i * JOIN_COLS + lane] = in && from ? from[bh * SS + (int64_t)i * dv + j] : 0;
    __syncthreads();
    for (int s = 0; s + 1 < NG; s++) {
        int g = BWD ? NG - 1 - s : s, e = BWD ? g - 1 : g + 1;
        const real *G = a.scan_grp + (bh * NG + g) * (int64_t)dk * ldg;
        real *E = a.scan_E + (bh * NG + e) * SS;
        for (int i = warp; i < dk; i += nw) {
            const real *phi = G + (int64_t)i * ldg + dv;
            real acc = 0;
            for (int k = 0; k < dk; k++) acc = fma(phi[k], cur[k * JOIN_COLS + lane], acc);
            real r = in ? acc + G[(int64_t)i * ldg + j] : (real)0;
            nxt[i * JOIN_COLS + lane] = r;
            if (in) E[(int64_t)i * dv + j] = r;
        }
        __syncthreads();   // nxt is whole; cur is no longer read
        real *t = cur;
        cur = nxt, nxt = t;
    }
}

// The GPU's multiprocessors and the most shared memory a block may opt in to.
static void cu_gpu_limits(int *sms, size_t *optin) {
    static int s = 0, o = 0;
    if (!s) {
        int dev = 0;
        CU_CHECK(cudaGetDevice(&dev));
        CU_CHECK(cudaDeviceGetAttribute(&s, cudaDevAttrMultiProcessorCount, dev));
        CU_CHECK(cudaDeviceGetAttribute(&o, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    }
    *sms = s, *optin = (size_t)o;
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// A scan pass's shape for blocks of nvb columns, `units` (batch, head,
// group) walks each with ceil(dv / nvb) column blocks (and ceil(dk / nvb)
// more for the transition when `trans`): the tile R (the chunk, at most
// SCAN_RMAX rows) and stages NS (3 when the pass's blocks fit on the
// multiprocessors at once, else 2), R halved until the shared memory fits,
// then nvb. Returns the width, its shared memory in *smem.
static int scan_fit(GdnArgs &a, int nvb, bool bwd, int64_t units, bool trans, int sms, size_t optin, size_t *smem) {
    for (;;) {
        int64_t blocks = units * ((a.dv + nvb - 1) / nvb + (trans ? (a.dk + nvb - 1) / nvb : 0));
        for (int R = a.Cw < SCAN_RMAX ? a.Cw : SCAN_RMAX;; R = (R + 1) / 2) {
            for (int ns = blocks <= sms ? 3 : 2; ns >= 2; ns--) {
                size_t need = scan_layout(NULL, NULL, ns, R, a.dk, nvb, bwd, R < a.Cw);
                if (need <= optin) {
                    a.scanR = R, a.scanNS = ns, a.scan_acc = R < a.Cw, *smem = need;
                    return nvb;
                }
            }
            if (R == 1) break;
        }
        ASSERT(nvb > 8, "gdn: dk %d needs more shared memory than the GPU's %zu bytes for the chunked scan", a.dk, optin);
        nvb /= 2;
    }
}

template <bool BWD, int MINB> static void (*scan_kernel_m(int nvb))(GdnArgs) {
    if (BWD) return nvb == 8 ? k_gdn_bwd_scan<8, MINB> : nvb == 16 ? k_gdn_bwd_scan<16, MINB> : k_gdn_bwd_scan<32, MINB>;
    return nvb == 8 ? k_gdn_fwd_scan<8, MINB> : nvb == 16 ? k_gdn_fwd_scan<16, MINB> : k_gdn_fwd_scan<32, MINB>;
}

template <bool BWD> static void (*scan_kernel(int nvb, int minb))(GdnArgs) {
    return minb == 2 ? scan_kernel_m<BWD, 2>(nvb) : scan_kernel_m<BWD, 1>(nvb);
}

// Shared memory past the default 48 KiB needs the kernel's consent, asked
// once per kernel and size.
static void smem_optin(const void *kernel, size_t smem, size_t *opted) {
    if (smem > 48 * 1024 && smem > *opted) {
        CU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        *opted = smem;
    }
}

static size_t scan_opted[2][3][2];   // the largest size each scan kernel (backward?, width, blocks) has opted in to
static size_t *scan_opted_of(bool bwd, int nvb, int minb) {
    return &scan_opted[bwd][nvb == 8 ? 0 : nvb == 16 ? 1 : 2][minb == 2];
}

template <bool BWD> static void scan_run(const GdnArgs &a, int nvb, int minb, int64_t blocks, size_t smem) {
    void (*kernel)(GdnArgs) = scan_kernel<BWD>(nvb, minb);
    smem_optin((const void *)kernel, smem, scan_opted_of(BWD, nvb, minb));
    kernel<<<(unsigned)blocks, GDN_NT, smem, cu_stream>>>(a);
    CU_LAUNCHED();
}

// The two-level scan's group: scanG chunks, or 0 for one walk over all of
// them. A walk's chunks are sequential, so the one-level scan takes
// ceil(B H NV / slots) x NC chunk steps (slots: the blocks the GPU runs at
// once); with groups of G, the local pass ceil(B H (NG - 1)(NV + NVt) /
// slots) x G, the join about one step per group, the seeded pass
// ceil(B H NG NV / slots) x G. Groups are taken when that is under 3/4 of
// the one-level count, G the power of two with the fewest. Decided from
// the width the host would pick (not ATTNLAB_GDN_SCAN_COLS's), so a forced
// width gives the same bits. ATTNLAB_GDN_SCAN_GROUP = G forces G (0: one
// level).
template <bool BWD> static int scan_groups(GdnArgs a, int nvb, int sms, size_t optin) {
    const char *env = getenv("ATTNLAB_GDN_SCAN_GROUP");
    if (env && *env) {
        long g = strtol(env, NULL, 10);
        return g > 0 && g < a.NC ? (int)g : 0;
    }
    if (a.NC < 8) return 0;
    int64_t BH = (int64_t)a.B * a.H;
    size_t smem = 0;
    int w = scan_fit(a, nvb, BWD, BH, false, sms, optin, &smem);
    // Blocks per multiprocessor of the groups' kernel at this width and
    // shared memory, asked of the runtime once per (width, size): this runs
    // at every launch of the op.
    static int per[3];
    static size_t per_smem[3];
    int wi = w == 8 ? 0 : w == 16 ? 1 : 2;
    if (per_smem[wi] != smem) {
        void (*kernel)(GdnArgs) = scan_kernel<BWD>(w, SCAN_GROUP_MINB);
        smem_optin((const void *)kernel, smem, scan_opted_of(BWD, w, SCAN_GROUP_MINB));
        CU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per[wi], kernel, GDN_NT, smem));
        if (per[wi] < 1) per[wi] = 1;
        per_smem[wi] = smem;
    }
    int p = per[wi];
    int64_t slots = (int64_t)sms * p, NV = (a.dv + w - 1) / w, NVt = (a.dk + w - 1) / w;
    auto waves = [slots](int64_t blocks) { return (double)((blocks + slots - 1) / slots); };
    double one = waves(BH * NV) * a.NC, best = 0.75 * one;
    int bestG = 0;
    for (int G = 2; G <= a.NC / 2; G *= 2) {
        int NG = (a.NC + G - 1) / G;
        double t = (waves(BH * (NG - 1) * (NV + NVt)) + waves(BH * NG * NV)) * G + (NG - 1);
        if (t < best) best = t, bestG = G;
    }
    return bestG;
}

// The scan's launch: the column block NVB, 32 unless B H ceil(dv / 32)
// blocks leave most multiprocessors idle: halved (to 8 at least) while the
// halved width's blocks still fit on the GPU's multiprocessors
// (ATTNLAB_GDN_SCAN_COLS = 8, 16 or 32 forces it); then (scan_fit) the
// tiles, stages and, if the shared memory needs it, a narrower width; then
// one walk over all chunks, or the two-level scan's three passes
// (scan_groups), whose blocks take twice the width (at most 32): with the
// groups side by side there are blocks enough, and each does more per
// barrier.
template <bool BWD> static void scan_launch(Node *n, GdnArgs &a) {
    int sms;
    size_t optin;
    cu_gpu_limits(&sms, &optin);
    int64_t BH = (int64_t)a.B * a.H;
    int nvb = 32;
    while (nvb > 8 && BH * ((a.dv + nvb / 2 - 1) / (nvb / 2)) <= sms) nvb /= 2;
    int gw = nvb < 32 ? 2 * nvb : 32;   // the groups' passes: blocks enough to take wider ones
    int G = scan_groups<BWD>(a, gw, sms, optin);
    const char *env = getenv("ATTNLAB_GDN_SCAN_COLS");
    int forced = env ? atoi(env) : 0;
    if (forced == 8 || forced == 16 || forced == 32) nvb = gw = forced;
    a.scanP = scan_pitch(a.dk);
    size_t rs = sizeof(real);
    a.scan_vec = 0;
    if (aligned16(a.Wb) && a.dk * rs % 16 == 0) a.scan_vec |= SCAN_VEC_W;
    if (aligned16(a.k) && a.dk * rs % 16 == 0 && a.ldk * rs % 16 == 0) a.scan_vec |= SCAN_VEC_K;
    if (aligned16(a.Ub) && a.dv * rs % 16 == 0) a.scan_vec |= SCAN_VEC_U;
    if (BWD && aligned16(a.dsb) && a.dv * rs % 16 == 0) a.scan_vec |= SCAN_VEC_DS;
    size_t smem = 0;
    if (!G) {
        a.scan_mode = SCAN_WHOLE;
        int w = scan_fit(a, nvb, BWD, BH, false, sms, optin, &smem);
        a.NV = (a.dv + w - 1) / w;
        scan_run<BWD>(a, w, 1, BH * a.NV, smem);
        return;
    }
    int NG = (a.NC + G - 1) / G;
    a.scanG = G, a.scanNG = NG;
    a.scan_grp = (real *)tape_dalloc(n->tape, (size_t)(BH * NG) * a.dk * (a.dv + a.dk) * rs);
    a.scan_E = (real *)tape_dalloc(n->tape, (size_t)(BH * NG) * a.dk * a.dv * rs);
    // 1. Each group but the one whose end nothing needs, alone.
    a.scan_mode = SCAN_LOCAL;
    int w = scan_fit(a, gw, BWD, BH * (NG - 1), true, sms, optin, &smem);
    a.NV = (a.dv + w - 1) / w, a.NVt = (a.dk + w - 1) / w;
    scan_run<BWD>(a, w, SCAN_GROUP_MINB, BH * (NG - 1) * (a.NV + a.NVt), smem);
    // 2. Across the groups.
    static size_t join_opted[2];
    size_t js = 2 * (size_t)a.dk * JOIN_COLS * rs;
    ASSERT(js <= optin, "gdn: dk %d needs more shared memory than the GPU's %zu bytes for the scan's join", a.dk, optin);
    smem_optin((const void *)k_gdn_scan_join<BWD>, js, &join_opted[BWD]);
    k_gdn_scan_join<BWD><<<(unsigned)(BH * ((a.dv + JOIN_COLS - 1) / JOIN_COLS)), GDN_NT, js, cu_stream>>>(a);
    CU_LAUNCHED();
    // 3. Each group again, from its entering state.
    a.scan_mode = SCAN_SEEDED;
    w = scan_fit(a, gw, BWD, BH * NG, false, sms, optin, &smem);
    a.NV = (a.dv + w - 1) / w;
    scan_run<BWD>(a, w, SCAN_GROUP_MINB, BH * NG * a.NV, smem);
}

// ---------------------------------------------------------------- chunked form: forward

// 1. Per chunk: W and U into the op's rows, ek and bl.
__global__ void __launch_bounds__(GDN_NT, GDN_MINB) k_gdn_fwd_prep(GdnArgs a) {
    __shared__ Tiles sh;
    int tid = threadIdx.x;
    ChunkWs w;
    chunk_ws_layout(&w, a.ws + (size_t)blockIdx.x * a.ws_stride, a.Cw, a.dk, a.dv, false);
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int64_t r = m.bh * a.T + m.t0;   // the chunk's first row of the op's rows
        w.W = a.Wb + r * a.dk;
        w.U = a.Ub + r * a.dv;
        chunk_prepare(a, w, &sh, m.b, m.h, m.t0, m.L, NULL, PREP_SOLVE | PREP_W | PREP_U);
        for (int i = tid; i < m.L; i += GDN_NT) a.ekb[r + i] = w.ek[i];
        if (tid == 0) a.blb[m.bh * a.NC + m.c] = w.bm[m.L - 1];
        __syncthreads();   // the next chunk rewrites ek and bm
    }
}

// 2. The scan: k_gdn_fwd_scan (above).

// 3. Per chunk: O = diag(b) Q S0 + P Delta.
__global__ void __launch_bounds__(GDN_NT, GDN_MINB) k_gdn_fwd_out(GdnArgs a) {
    __shared__ Tiles sh;
    int tid = threadIdx.x, dk = a.dk, dv = a.dv;
    int64_t SS = (int64_t)dk * dv;
    ChunkWs w;
    chunk_ws_layout(&w, a.ws + (size_t)blockIdx.x * a.ws_stride, a.Cw, dk, dv, false);
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int L = m.L;
        w.Dl = a.Ub + (m.bh * a.T + m.t0) * dv;
        chunk_prepare(a, w, &sh, m.b, m.h, m.t0, L, NULL, PREP_P);
        const real *S0 = a.states + (m.bh * a.NC + m.c) * SS;
        int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * dk;
        real *oc = a.o + ((int64_t)m.b * a.T + m.t0) * a.ldv + (int64_t)m.h * dv;
        blk_gemm(&sh, false, false, L, dv, dk, 1, a.q + ok, a.ldk, S0, dv, 0, oc, a.ldv);
        for (int e = tid; e < L * dv; e += GDN_NT) {
            int i = e / dv, j = e % dv;
            oc[(int64_t)i * a.ldv + j] *= w.bm[i];
        }
        __syncthreads();
        blk_gemm(&sh, false, false, L, dv, L, 1, w.P, L, w.Dl, dv, 1, oc, a.ldv);
    }
}

// ---------------------------------------------------------------- chunked form: backward

// 1. Per chunk: W into the op's rows, ek and bl as in the forward; with dO,
// the terms of dDelta and of the entering state's gradient that do not go
// through the state: P^T dO into the op's dDelta rows, Q^T diag(b) dO into
// the chunk's dS slot.
__global__ void __launch_bounds__(GDN_NT, GDN_MINB) k_gdn_bwd_prep(GdnArgs a) {
    __shared__ Tiles sh;
    int tid = threadIdx.x, dk = a.dk, dv = a.dv;
    int64_t SS = (int64_t)dk * dv;
    ChunkWs w;
    chunk_ws_layout(&w, a.ws + (size_t)blockIdx.x * a.ws_stride, a.Cw, dk, dv, true);
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int L = m.L;
        int64_t r = m.bh * a.T + m.t0;
        w.W = a.Wb + r * dk;
        chunk_prepare(a, w, &sh, m.b, m.h, m.t0, L, NULL, PREP_SOLVE | PREP_W | (a.dout ? PREP_P : 0));
        for (int i = tid; i < L; i += GDN_NT) a.ekb[r + i] = w.ek[i];
        if (tid == 0) a.blb[m.bh * a.NC + m.c] = w.bm[L - 1];
        if (a.dout) {
            int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * dk;
            const real *dO = a.dout + ((int64_t)m.b * a.T + m.t0) * a.ldv + (int64_t)m.h * dv;
            blk_gemm(&sh, true, false, L, dv, L, 1, w.P, L, dO, a.ldv, 0, a.Ub + r * dv, dv);   // P^T dO
            for (int e = tid; e < L * dv; e += GDN_NT) {                                      // dY = diag(b) dO
                int i = e / dv, c = e % dv;
                w.Y[e] = w.bm[i] * dO[(int64_t)i * a.ldv + c];
            }
            __syncthreads();
            blk_gemm(&sh, true, false, dk, dv, L, 1, a.q + ok, a.ldk, w.Y, dv, 0, a.dsb + (m.bh * a.NC + m.c) * SS,
                     dv);   // Q^T dY
        }
        __syncthreads();   // the next chunk rewrites ek and bm
    }
}

// 2. The scan: k_gdn_bwd_scan (above).

// The row sums of a chunk's (L, L) dGamma terms, strictly lower: a warp per
// row x (rows x = warp, warp + GDN_NW, ...; lane l takes j = l, l + 32, ...
// below x in order, then warp_sum); rs[x] = sum_{j<x} X_xj Y_xj and, with Z1,
// zb[x] += sum_{j<x} X_xj (Z1_xj Z2_xj). In double; the lane 0 of the warp
// writes (the same warp owns row x in every row step of chunk_back).
__device__ void lower_row_sums(const real *__restrict__ X, const real *__restrict__ Y, const real *__restrict__ Z1,
                               const real *__restrict__ Z2, int L, double *rs, double *zb) {
    int lane = threadIdx.x % 32;
    for (int x = threadIdx.x / 32; x < L; x += GDN_NW) {
        const real *xr = X + x * L, *yr = Y + x * L;
        double r = 0, rz = 0;
        for (int j = lane; j < x; j += 32) {
            real d = xr[j];
            r += (double)d * yr[j];
            if (Z1) rz += (double)d * (Z1[x * L + j] * Z2[x * L + j]);
        }
        r = warp_sum(r);
        if (Z1) rz = warp_sum(rz);
        if (lane == 0) {
            rs[x] = r;
            if (Z1) zb[x] += rz;
        }
    }
}

// The column sums cs_x = sum_{i>x} X_ix Y_ix of the same terms, and then
// dG[x] = (dG[x] + rs[x]) - cs_x (the CPU's two steps): the block's threads
// as 64 columns by GDN_NT / 64 groups, group g summing the rows i = x + 1 +
// g, x + 1 + g + GDN_NT / 64, ... of column x (coalesced loads), the groups'
// sums (in `part`, GDN_NT doubles of shared memory) then added in group
// order. Starts after lower_row_sums with no barrier between (its rs is
// read after the first barrier here); ends with a barrier.
__device__ void lower_col_sums(const real *__restrict__ X, const real *__restrict__ Y, int L, const double *rs,
                               double *dG, double *part) {
    constexpr int NG = GDN_NT / 64;
    int tid = threadIdx.x, xo = tid % 64, g = tid / 64;
    for (int x0 = 0; x0 < L; x0 += 64) {
        int x = x0 + xo;
        double s = 0;
        if (x < L)
            for (int i = x + 1 + g; i < L; i += NG) s += (double)X[i * L + x] * Y[i * L + x];
        part[g * 64 + xo] = s;
        __syncthreads();
        if (g == 0 && x < L) {
            double cs = part[xo];
            for (int u = 1; u < NG; u++) cs += part[u * 64 + xo];
            dG[x] += rs[x];
            dG[x] -= cs;
        }
        __syncthreads();
    }
}

// chunk_backward of gdn_chunk_backward.c for the chunk of L positions at t0,
// its workspace filled by chunk_prepare, less what the scan did (dDelta and
// the entering state's gradient): from w.dS (the gradient of the state
// leaving the chunk), w.dDl and the chunk's rows of dO, writes the chunk's
// rows of the wanted gradients. All threads; ends with a barrier. `red`:
// GDN_NT doubles of shared memory. Elementwise steps spread (row, column)
// over the threads; a row's dot products are one warp's (warp_dot's order),
// and a row's dGamma and dbeta terms are added by the lane 0 of the warp
// that owns the row (x mod GDN_NW), in the CPU's order of the terms; the
// (L, L) dGamma terms are summed by rows (lower_row_sums) and by columns
// (lower_col_sums); dg is the suffix sum of dGamma (warp0_cumsum).
__device__ void chunk_back(const GdnArgs &a, ChunkWs &w, Tiles *sh, double *red, int b, int h, int t0, int L,
                           const real *S0) {
    int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, dk = a.dk, dv = a.dv, H = a.H, ldk = a.ldk,
        ldv = a.ldv;
    int64_t SS = (int64_t)dk * dv;
    int64_t ok = ((int64_t)b * a.T + t0) * ldk + (int64_t)h * dk;
    int64_t ov = ((int64_t)b * a.T + t0) * ldv + (int64_t)h * dv;
    int64_t oh = ((int64_t)b * a.T + t0) * H + h;
    const real *q = a.q + ok, *k = a.k + ok, *v = a.v + ov;
    const real *dO = a.dout ? a.dout + ov : NULL;
    real *gq = a.gq ? a.gq + ok : NULL;
    real bl = w.bm[L - 1];

    // S_C = b_{L-1} S0 + Kd^T Delta.
    double s = 0;
    for (int64_t e = tid; e < SS; e += GDN_NT) s += (double)w.dS[e] * S0[e];
    s = cu_block_sum(s, red);
    // dKd = Delta dS^T (in dW); dK = diag(ek) dKd.
    blk_gemm(sh, false, true, L, dk, dv, 1, w.Dl, dv, w.dS, dv, 0, w.dW, dk);
    for (int e = tid; e < L * dk; e += GDN_NT) w.dK[e] = w.ek[e / dk] * w.dW[e];
    // dGamma_j -= ek_j dKd_j . k_j, and those terms add to dGamma_{L-1}
    // (exp(Gamma_{L-1} - Gamma_{L-1}) = 1 has no derivative): after
    // b_{L-1} S0 . dS, in the order of j, below.
    for (int j = warp; j < L; j += GDN_NW) {
        double sj = j == L - 1 ? 0 : (double)(w.ek[j] * (real)warp_dot(w.dW + j * dk, k + (int64_t)j * ldk, dk));
        if (lane == 0) {
            w.dG[j] = j == L - 1 ? (double)(bl * (real)s) : -sj;
            w.dbeta[j] = 0;
            w.rsum[j] = sj;
        }
    }
    __syncthreads();
    if (warp == 0) {
        double t = 0;
        for (int j = lane; j < L - 1; j += 32) t += w.rsum[j];
        t = warp_sum(t);
        if (lane == 0) w.dG[L - 1] += t;
    }
    __syncthreads();

    // O = diag(b) Q S0 + P Delta.
    if (dO) {
        blk_gemm(sh, false, false, L, dv, dk, 1, q, ldk, S0, dv, 0, w.Y, dv);   // Y = Q S0
        for (int i = warp; i < L; i += GDN_NW) {   // dGamma_i += b_i dO_i . Y_i; then Y = dY = diag(b) dO
            real bi = w.bm[i], *yi = w.Y + i * dv;
            const real *doi = dO + (int64_t)i * ldv;
            double p = 0;
            for (int c = lane; c < dv; c += 32) {
                real d = doi[c];
                p += (double)d * yi[c];
                yi[c] = bi * d;
            }
            p = warp_sum(p);
            if (lane == 0) w.dG[i] += bi * (real)p;
        }
        __syncthreads();
        if (gq) blk_gemm(sh, false, true, L, dk, dv, 1, w.Y, dv, S0, dv, 0, gq, ldk);   // dQ = dY S0^T
        blk_gemm(sh, false, true, L, L, dv, 1, dO, ldv, w.Dl, dv, 0, w.dA, L);          // dP = dO Delta^T
        // f_ij = dP_ij P_ij (j < i) adds to dG_i and leaves dG_j.
        lower_row_sums(w.dA, w.P, NULL, NULL, L, w.rsum, NULL);
        lower_col_sums(w.dA, w.P, L, w.rsum, w.dG, red);
        for (int e = tid; e < L * L; e += GDN_NT) {   // dQK = dP * E, lower with the diagonal
            int i = e / L, j = e % L;
            w.dA[e] = j <= i ? w.dA[e] * w.E[e] : (real)0;
        }
        __syncthreads();
        if (gq) blk_gemm(sh, false, false, L, dk, L, 1, w.dA, L, k, ldk, 1, gq, ldk);   // dQ += dQK K
        blk_gemm(sh, true, false, L, dk, L, 1, w.dA, L, q, ldk, 1, w.dK, dk);            // dK += dQK^T Q
    } else if (gq) {
        for (int e = tid; e < L * dk; e += GDN_NT) gq[(int64_t)(e / dk) * ldk + e % dk] = 0;
    }

    // Delta = U - W S0: dU = dDelta, dW = -dDelta S0^T.
    blk_gemm(sh, false, true, L, dk, dv, -1, w.dDl, dv, S0, dv, 0, w.dW, dk);
    // W = Tm Xw, U = Tm Xu: dXw = Tm^T dW, dXu = Tm^T dU, dA = -(dXw W^T + dXu U^T).
    blk_gemm(sh, true, false, L, dk, L, 1, w.Tm, L, w.dW, dk, 0, w.dXw, dk);
    blk_gemm(sh, true, false, L, dv, L, 1, w.Tm, L, w.dDl, dv, 0, w.dXu, dv);
    blk_gemm(sh, false, true, L, L, dk, -1, w.dXw, dk, w.W, dk, 0, w.dA, L);
    blk_gemm(sh, false, true, L, L, dv, -1, w.dXu, dv, w.U, dv, 1, w.dA, L);

    // Xw_i = beta_i b_i k_i, Xu_i = beta_i v_i (a warp per row).
    for (int i = warp; i < L; i += GDN_NW) {
        real bi = w.bm[i], bt = w.bet[i], sw = bt * bi;
        const real *dxw = w.dXw + i * dk, *dxu = w.dXu + i * dv, *ki = k + (int64_t)i * ldk;
        const real *vi = v + (int64_t)i * ldv;
        real *dki = w.dK + i * dk, *gvi = a.gv ? a.gv + ov + (int64_t)i * ldv : NULL;
        double sx = 0, su = 0;
        for (int c = lane; c < dk; c += 32) {
            real x = dxw[c];
            dki[c] += sw * x;
            sx += (double)x * ki[c];
        }
        for (int c = lane; c < dv; c += 32) {
            real x = dxu[c];
            if (gvi) gvi[c] = bt * x;
            su += (double)x * vi[c];
        }
        sx = (real)warp_sum(sx);
        su = (real)warp_sum(su);
        if (lane == 0) {
            w.dbeta[i] += bi * sx;
            w.dG[i] += sw * sx;
            w.dbeta[i] += su;
        }
    }
    // A_ij = beta_i E_ij KK_ij (j < i): dbeta_i and dG_i by rows, dG_j by
    // columns (the rows of each warp follow its rows above: no barrier).
    lower_row_sums(w.dA, w.A, w.E, w.KK, L, w.rsum, w.dbeta);
    lower_col_sums(w.dA, w.A, L, w.rsum, w.dG, red);
    for (int e = tid; e < L * L; e += GDN_NT) {   // dKK, strictly lower
        int i = e / L, j = e % L;
        w.dA[e] = j < i ? w.dA[e] * w.bet[i] * w.E[e] : (real)0;
    }
    __syncthreads();
    blk_gemm(sh, false, false, L, dk, L, 1, w.dA, L, k, ldk, 1, w.dK, dk);   // dK += dKK K
    blk_gemm(sh, true, false, L, dk, L, 1, w.dA, L, k, ldk, 1, w.dK, dk);    // dK += dKK^T K

    // The chunk's rows; dg_m = sum_{i >= m} dGamma_i.
    if (a.gk)
        for (int e = tid; e < L * dk; e += GDN_NT) a.gk[ok + (int64_t)(e / dk) * ldk + e % dk] = w.dK[e];
    if (a.gbeta)
        for (int i = tid; i < L; i += GDN_NT) a.gbeta[oh + (int64_t)i * H] = (real)w.dbeta[i];
    if (a.gg) {
        warp0_cumsum(w.dG, L, true);
        __syncthreads();
        for (int i = tid; i < L; i += GDN_NT) a.gg[oh + (int64_t)i * H] = (real)w.dG[i];
    }
    __syncthreads();
}

// 3. Per chunk: everything of the chunk again (W from the op's rows) and its
// input gradients from S0, dS (the scan's slot) and dDelta (the scan's rows).
__global__ void __launch_bounds__(GDN_NT, GDN_CHUNK_MINB) k_gdn_bwd_chunk(GdnArgs a) {
    __shared__ Tiles sh;
    __shared__ double red[GDN_NT];
    int64_t SS = (int64_t)a.dk * a.dv;
    ChunkWs w;
    chunk_ws_layout(&w, a.ws + (size_t)blockIdx.x * a.ws_stride, a.Cw, a.dk, a.dv, true);
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int64_t r = m.bh * a.T + m.t0;
        w.W = a.Wb + r * a.dk;
        w.dDl = a.Ub + r * a.dv;
        w.dS = a.dsb + (m.bh * a.NC + m.c) * SS;
        const real *S0 = a.states + (m.bh * a.NC + m.c) * SS;
        chunk_prepare(a, w, &sh, m.b, m.h, m.t0, m.L, S0, PREP_SOLVE | PREP_U | PREP_DL | (a.dout ? PREP_P : 0));
        chunk_back(a, w, &sh, red, m.b, m.h, m.t0, m.L, S0);
    }
}

// ---------------------------------------------------------------- gradients out

// Where the backward writes each input's gradient: straight into the input's
// buffer when it is fresh and no other input shares it, else into scratch
// that gdn_grads_finish adds in input order (the first of a shared buffer,
// fresh, is written; the later ones add).
struct GdnGrads {
    real *dst[GDN_N_IN], *tmp[GDN_N_IN];
    bool fresh[GDN_N_IN];
    int64_t n[GDN_N_IN];
};

static void gdn_grads_plan(Node *n, GdnGrads *gr, GdnArgs *a) {
    for (int i = 0; i < GDN_N_IN; i++) {
        gr->dst[i] = CU_GRAD_FRESH(n, i, &gr->fresh[i]);   // in input order: a shared buffer is fresh once
        gr->n[i] = n->in[i] ? n->in[i]->numel : 0;
        gr->tmp[i] = NULL;
    }
    real *to[GDN_N_IN];
    for (int i = 0; i < GDN_N_IN; i++) {
        to[i] = gr->dst[i];
        if (!to[i]) continue;
        bool shared = false;
        for (int j = 0; j < GDN_N_IN; j++) shared |= j != i && gr->dst[j] == gr->dst[i];
        if (!gr->fresh[i] || shared) to[i] = gr->tmp[i] = (real *)tape_dalloc(n->tape, (size_t)gr->n[i] * sizeof(real));
    }
    a->gq = to[GDN_IN_Q], a->gk = to[GDN_IN_K], a->gv = to[GDN_IN_V];
    a->gbeta = to[GDN_IN_BETA], a->gg = to[GDN_IN_G], a->gs0 = to[GDN_IN_S0];
}

__global__ void k_gdn_put(real *dst, const real *src, int64_t n, bool fresh) {
    CU_FOR(i, n) dst[i] = fresh ? src[i] : dst[i] + src[i];
}

static void gdn_grads_finish(const GdnGrads *gr) {
    for (int i = 0; i < GDN_N_IN; i++) {
        if (!gr->tmp[i] || gr->n[i] == 0) continue;
        k_gdn_put<<<cu_grid(gr->n[i]), CU_THREADS, 0, cu_stream>>>(gr->dst[i], gr->tmp[i], gr->n[i], gr->fresh[i]);
        CU_LAUNCHED();
    }
}

// ---------------------------------------------------------------- chunked form: the pair

// The op's rows shared by the kernels of a pass (GdnArgs), from the arena.
static void chunk_rows(Node *n, GdnArgs *a) {
    int64_t BH = (int64_t)a->B * a->H, rows = BH * a->T;
    a->items = BH * a->NC;
    a->Wb = (real *)tape_dalloc(n->tape, (size_t)(rows * a->dk) * sizeof(real));
    a->Ub = (real *)tape_dalloc(n->tape, (size_t)(rows * a->dv) * sizeof(real));
    a->ekb = (real *)tape_dalloc(n->tape, (size_t)rows * sizeof(real));
    a->blb = (real *)tape_dalloc(n->tape, (size_t)a->items * sizeof(real));
}

extern "C" void cu_gdn_chunk_forward(Node *n) {
    static int res_prep = 0, res_out = 0;
    if (!res_prep) res_prep = resident_blocks(k_gdn_fwd_prep);
    if (!res_out) res_out = resident_blocks(k_gdn_fwd_out);
    GdnArgs a = gdn_args(n);
    chunk_rows(n, &a);
    int64_t SS = (int64_t)a.dk * a.dv;
    a.states = a.saved ? a.saved : (real *)tape_dalloc(n->tape, (size_t)(a.items * SS) * sizeof(real));
    int gp = chunk_grid(a.items, res_prep), go = chunk_grid(a.items, res_out);
    a.ws_stride = chunk_ws_layout(NULL, NULL, a.Cw, a.dk, a.dv, false);
    a.ws = (unsigned char *)tape_dalloc(n->tape, a.ws_stride * (size_t)(gp > go ? gp : go));
    k_gdn_fwd_prep<<<gp, GDN_NT, 0, cu_stream>>>(a);
    CU_LAUNCHED();
    scan_launch<false>(n, a);
    k_gdn_fwd_out<<<go, GDN_NT, 0, cu_stream>>>(a);
    CU_LAUNCHED();
}

extern "C" void cu_gdn_chunk_backward(Node *n) {
    static int res_prep = 0, res_chunk = 0;
    if (!res_prep) res_prep = resident_blocks(k_gdn_bwd_prep);
    if (!res_chunk) res_chunk = resident_blocks(k_gdn_bwd_chunk);
    GdnArgs a = gdn_args(n);
    a.dout = n->out[0]->grad;
    a.dsT = n->out[1]->grad;
    GdnGrads gr;
    gdn_grads_plan(n, &gr, &a);
    chunk_rows(n, &a);
    int64_t SS = (int64_t)a.dk * a.dv;
    a.states = a.saved;
    a.dsb = (real *)tape_dalloc(n->tape, (size_t)(a.items * SS) * sizeof(real));
    int gp = chunk_grid(a.items, res_prep), gc = chunk_grid(a.items, res_chunk);
    a.ws_stride = chunk_ws_layout(NULL, NULL, a.Cw, a.dk, a.dv, true);
    a.ws = (unsigned char *)tape_dalloc(n->tape, a.ws_stride * (size_t)(gp > gc ? gp : gc));
    k_gdn_bwd_prep<<<gp, GDN_NT, 0, cu_stream>>>(a);
    CU_LAUNCHED();
    scan_launch<true>(n, a);
    k_gdn_bwd_chunk<<<gc, GDN_NT, 0, cu_stream>>>(a);
    CU_LAUNCHED();
    gdn_grads_finish(&gr);
}

// ---------------------------------------------------------------- recurrent form

// gamma_t: 0 where a document begins at t.
__device__ __forceinline__ real naive_gamma(const GdnArgs &a, int b, int t, real g) {
    return a.first && a.first[(int64_t)b * a.T + t] == t ? (real)0 : exp(g);
}

// naive_step of gdn_naive.c on column j of S (dk, dv): S_{t-1} -> S_t.
// Returns o_j = S_t[:, j] . q, or 0 when q is NULL.
__device__ real naive_col_step(real *S, int dk, int dv, int j, const real *q, const real *k, real vj, real bt,
                               real gamma) {
    double p = 0;
    for (int i = 0; i < dk; i++) {
        real s = S[(int64_t)i * dv + j] * gamma;
        S[(int64_t)i * dv + j] = s;
        p += (double)s * k[i];
    }
    real dj = bt * (vj - (real)p);
    double o = 0;
    for (int i = 0; i < dk; i++) {
        real s = S[(int64_t)i * dv + j] + k[i] * dj;
        S[(int64_t)i * dv + j] = s;
        if (q) o += (double)s * q[i];
    }
    return (real)o;
}

// Threads of a recurrent-form block: one per column (forward), per column or
// row (backward), whole warps, at most 256 (then each takes several).
static int naive_threads(int n) {
    int t = (n + 31) / 32 * 32;
    return t > 256 ? 256 : t;
}

// A thread owns column j of the state, S_T in place: no barrier.
__global__ void k_gdn_naive_fwd(GdnArgs a) {
    int bh = blockIdx.x, b = bh / a.H, h = bh % a.H, dk = a.dk, dv = a.dv;
    int64_t SS = (int64_t)dk * dv;
    real *S = a.sT + (int64_t)bh * SS;
    for (int j = threadIdx.x; j < dv; j += blockDim.x) {
        for (int i = 0; i < dk; i++)
            S[(int64_t)i * dv + j] = a.s0 ? a.s0[(int64_t)bh * SS + (int64_t)i * dv + j] : (real)0;
        for (int t = 0; t < a.T; t++) {
            if (a.saved && t % a.C == 0) {
                real *sv = a.saved + ((int64_t)bh * a.NC + t / a.C) * SS;
                for (int i = 0; i < dk; i++) sv[(int64_t)i * dv + j] = S[(int64_t)i * dv + j];
            }
            int64_t ok = ((int64_t)b * a.T + t) * a.ldk + (int64_t)h * dk;
            int64_t ov = ((int64_t)b * a.T + t) * a.ldv + (int64_t)h * dv;
            int64_t oh = ((int64_t)b * a.T + t) * a.H + h;
            a.o[ov + j] = naive_col_step(S, dk, dv, j, a.q + ok, a.k + ok, a.v[ov + j], a.beta[oh],
                                         naive_gamma(a, b, t, a.g[oh]));
        }
    }
}

// The recurrent backward's per-block buffers.
struct NaiveWs {
    real *states;          // (Cw, dk, dv): S_{t-1} for each token of a stretch
    real *dS;              // (dk, dv) dLoss/dS_t
    real *delta, *dp;      // (dv)
    double *dbc, *rowdg;   // (dv) dbeta's terms by column, (dk) dg's by row
};

static __host__ __device__ size_t naive_ws_layout(NaiveWs *w, unsigned char *base, int Cw, int dk, int dv) {
    size_t at = 0, SS = (size_t)dk * dv;
    size_t ost = ws_take(&at, (size_t)Cw * SS, sizeof(real)), odS = ws_take(&at, SS, sizeof(real));
    size_t ode = ws_take(&at, dv, sizeof(real)), odp = ws_take(&at, dv, sizeof(real));
    size_t odb = ws_take(&at, dv, sizeof(double)), org = ws_take(&at, dk, sizeof(double));
    if (w) {
        w->states = (real *)(base + ost), w->dS = (real *)(base + odS);
        w->delta = (real *)(base + ode), w->dp = (real *)(base + odp);
        w->dbc = (double *)(base + odb), w->rowdg = (double *)(base + org);
    }
    return (at + 255) & ~(size_t)255;
}

// gdn_naive_backward: per stretch (reverse), replay it from its saved state
// (a thread per column), then per token (reverse) a column phase (p, delta,
// dS += q do^T, ddelta = dS^T k, dv) and a row phase (dq, dk, dS' and dg's
// row sums), then one thread sums dbeta and dg in a fixed order.
__global__ void k_gdn_naive_bwd(GdnArgs a) {
    int bh = blockIdx.x, b = bh / a.H, h = bh % a.H, dk = a.dk, dv = a.dv, tid = threadIdx.x, nt = blockDim.x;
    int64_t SS = (int64_t)dk * dv;
    NaiveWs w;
    naive_ws_layout(&w, a.ws + (size_t)bh * a.ws_stride, a.Cw, dk, dv);
    real *dS = w.dS;
    for (int64_t e = tid; e < SS; e += nt) dS[e] = a.dsT ? a.dsT[(int64_t)bh * SS + e] : (real)0;
    for (int c = a.NC - 1; c >= 0; c--) {
        int t0 = c * a.C, L = min(a.C, a.T - t0);
        // Replay: states[s] = S_{t0+s-1}, column by column.
        const real *Sc = a.saved + ((int64_t)bh * a.NC + c) * SS;
        for (int j = tid; j < dv; j += nt) {
            for (int i = 0; i < dk; i++) w.states[(int64_t)i * dv + j] = Sc[(int64_t)i * dv + j];
            for (int s = 0; s + 1 < L; s++) {
                const real *Sp = w.states + (int64_t)s * SS;
                real *Sn = w.states + (int64_t)(s + 1) * SS;
                for (int i = 0; i < dk; i++) Sn[(int64_t)i * dv + j] = Sp[(int64_t)i * dv + j];
                int t = t0 + s;
                int64_t ok = ((int64_t)b * a.T + t) * a.ldk + (int64_t)h * dk;
                int64_t ov = ((int64_t)b * a.T + t) * a.ldv + (int64_t)h * dv;
                int64_t oh = ((int64_t)b * a.T + t) * a.H + h;
                naive_col_step(Sn, dk, dv, j, NULL, a.k + ok, a.v[ov + j], a.beta[oh], naive_gamma(a, b, t, a.g[oh]));
            }
        }
        __syncthreads();   // also: dS (set above, or by the last row phase) is complete
        for (int s = L - 1; s >= 0; s--) {
            int t = t0 + s;
            int64_t ok = ((int64_t)b * a.T + t) * a.ldk + (int64_t)h * dk;
            int64_t ov = ((int64_t)b * a.T + t) * a.ldv + (int64_t)h * dv;
            int64_t oh = ((int64_t)b * a.T + t) * a.H + h;
            const real *S = w.states + (int64_t)s * SS, *qt = a.q + ok, *kt = a.k + ok, *vt = a.v + ov;
            const real *dot_ = a.dout ? a.dout + ov : NULL;
            real bt = a.beta[oh], gamma = naive_gamma(a, b, t, a.g[oh]);
            // Columns: p = S'^T k, delta; o = S_t^T q gives dS += q do^T; ddelta = dS^T k.
            for (int j = tid; j < dv; j += nt) {
                double acc = 0;
                for (int i = 0; i < dk; i++) acc += (double)(gamma * S[(int64_t)i * dv + j]) * kt[i];
                real pj = (real)acc;
                w.delta[j] = bt * (vt[j] - pj);
                if (dot_)
                    for (int i = 0; i < dk; i++) dS[(int64_t)i * dv + j] += qt[i] * dot_[j];
                double dd = 0;
                for (int i = 0; i < dk; i++) dd += (double)dS[(int64_t)i * dv + j] * kt[i];
                w.dbc[j] = dd * (vt[j] - pj);
                real ddr = (real)dd;
                if (a.gv) a.gv[ov + j] = bt * ddr;
                w.dp[j] = -bt * ddr;
            }
            __syncthreads();
            // Rows: dq = S_t do; dk = dS delta + S' dp; dS' = dS + k dp^T; dS_{t-1} = gamma dS'.
            for (int i = tid; i < dk; i += nt) {
                const real *Si = S + (int64_t)i * dv;
                real *dSi = dS + (int64_t)i * dv, ki = kt[i];
                if (a.gq) {
                    double acc = 0;
                    if (dot_)
                        for (int j = 0; j < dv; j++) acc += (double)(gamma * Si[j] + ki * w.delta[j]) * dot_[j];
                    a.gq[ok + i] = (real)acc;
                }
                double a1 = 0, a2 = 0, rg = 0;
                for (int j = 0; j < dv; j++) a1 += (double)dSi[j] * w.delta[j];
                for (int j = 0; j < dv; j++) {
                    real d2 = dSi[j] + ki * w.dp[j];
                    a2 += (double)(gamma * Si[j]) * w.dp[j];
                    rg += (double)d2 * Si[j];
                    dSi[j] = gamma * d2;
                }
                if (a.gk) a.gk[ok + i] = (real)a1 + (real)a2;
                w.rowdg[i] = rg;
            }
            __syncthreads();
            if (tid == 0) {
                double dbt = 0, dgt = 0;
                for (int j = 0; j < dv; j++) dbt += w.dbc[j];
                for (int i = 0; i < dk; i++) dgt += w.rowdg[i];
                if (a.gbeta) a.gbeta[oh] = (real)dbt;
                if (a.gg) a.gg[oh] = (real)(gamma * dgt);
            }
            __syncthreads();   // the next token rewrites dbc, delta, dp
        }
    }
    if (a.gs0)
        for (int64_t e = tid; e < SS; e += nt) a.gs0[(int64_t)bh * SS + e] = dS[e];
}

extern "C" void cu_gdn_naive_forward(Node *n) {
    GdnArgs a = gdn_args(n);
    k_gdn_naive_fwd<<<a.B * a.H, naive_threads(a.dv), 0, cu_stream>>>(a);
    CU_LAUNCHED();
}

extern "C" void cu_gdn_naive_backward(Node *n) {
    GdnArgs a = gdn_args(n);
    a.dout = n->out[0]->grad;
    a.dsT = n->out[1]->grad;
    GdnGrads gr;
    gdn_grads_plan(n, &gr, &a);
    a.ws_stride = naive_ws_layout(NULL, NULL, a.Cw, a.dk, a.dv);
    a.ws = (unsigned char *)tape_dalloc(n->tape, a.ws_stride * a.B * a.H);
    k_gdn_naive_bwd<<<a.B * a.H, naive_threads(a.dk > a.dv ? a.dk : a.dv), 0, cu_stream>>>(a);
    CU_LAUNCHED();
    gdn_grads_finish(&gr);
}
