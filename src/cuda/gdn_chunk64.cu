// gdn_chunk64.cu: op_gdn's per-chunk steps around the scans for bf16
// products at heads of 64 (dk = dv = 64) and chunks of at most 64
// positions, the shape of the models that train on GPUs: the forward's
// first step (what k_gdn_fwd_prep<true> computes: the decays, A, Tm =
// (I + A)^-1, W and U), its output step (k_gdn_fwd_out<true>: O) and the
// backward's first step (k_gdn_bwd_prep<true>: P, P^T dO, Q^T diag(b) dO).
//
// The general kernels take any head size and chunk: a block of 8 warps
// passes each matrix through a workspace from one block-wide step to the
// next, and each product stages its float32 operands into bf16 tiles again.
// Here a block of 4 warps keeps a chunk in shared memory (46-71 KB, 3 or 4
// blocks a multiprocessor): each operand rounded once into a tile of 64
// rows, every product from those tiles into registers (warp w: rows 16 w ..
// 16 w + 15 of its output), its elementwise step applied there (A from
// K K^T, P from Q K^T, diag(b) on Q S0), and written once: to the op's rows,
// or rounded into the tile the next product reads.
//
// Same operands, same order: every operand element is the float32 value the
// general kernel rounds at that place, rounded the same way; each product
// runs the same mma.sync m16n8k16 steps in the same order from zero (and
// skips the same steps past ceil(K / 16)); the elementwise steps are the
// same float32 expressions. So the outputs are the general kernels' bit for
// bit: cuda_gdn_bf16/chunk64_gives_the_same_bits compares them, with
// ATTNLAB_GDN_CHUNK64=off (the general kernels) against the default.
#include "gdn_chunk.cuh"

static int gdn_chunk64_launches;   // (cu_gdn_chunk64_launches)

extern "C" int cu_gdn_chunk64_launches(void) { return gdn_chunk64_launches; }

#ifndef AG_DOUBLE

#define P64_NT 128                // threads: 4 warps
#define P64_P BF_PITCH            // bf16 row pitch of a tile of 64 columns (gdn_bf16.cuh)
static_assert(BF_TILE == 64, "gdn_chunk64: BF_PITCH is a pitch for rows of 64");

typedef __nv_bfloat16 bf16;

// Rows 0 .. 63 of a tile from L rows of 64 reals at x (leading dim ld, x and
// ld keeping every fourth real 16-byte aligned), row i scaled by f(i) and
// then rounded; zero rows from L on. No barrier.
template <typename F> __device__ __forceinline__ void stage64(bf16 *dst, const real *x, int64_t ld, int L, F f) {
    for (int e = threadIdx.x; e < 64 * 16; e += P64_NT) {
        int i = e / 16, c = e % 16 * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < L) {
            v = *reinterpret_cast<const float4 *>(x + i * ld + c);
            real s = f(i);
            v.x = s * v.x, v.y = s * v.y, v.z = s * v.z, v.w = s * v.w;
        }
        *reinterpret_cast<uint2 *>(dst + i * P64_P + c) = make_uint2(fb_pack(v.x, v.y), fb_pack(v.z, v.w));
    }
}

// acc[t] += the calling warp's rows 16 w .. 16 w + 15 of op(A) times
// columns 8 t .. 8 t + 7 of op(B), over nk steps of 16 along K, from tiles:
// at, A^T lies in its tile (row k is op(A)'s column k), else A (row i);
// bt, B^T (row n is op(B)'s column n), else B (row k). The fragments, steps
// and order of blk_gemm_bf16_s (gdn_bf16.cuh).
__device__ __forceinline__ void mma64(float acc[8][4], const bf16 *A, bool at, const bf16 *B, bool bt, int nk) {
    int lane = threadIdx.x % 32, wm = threadIdx.x / 32 * 16, q = lane / 8, lr = lane % 8;
    int ar = at ? lr + 8 * (q >> 1) : wm + lr + 8 * (q & 1), ac = at ? wm + 8 * (q & 1) : 8 * (q >> 1);
    int br = bt ? lr + 8 * (q >> 1) : lr + 8 * (q & 1), bc = bt ? 8 * (q & 1) : 8 * (q >> 1);
    for (int kk = 0; kk < nk; kk++) {
        int k = 16 * kk;
        uint32_t a[4];
        fb_ldsm4(a, at ? A + (k + ar) * P64_P + ac : A + ar * P64_P + k + ac, at);
#pragma unroll
        for (int p = 0; p < 4; p++) {
            uint32_t b[4];
            int n = 16 * p;
            fb_ldsm4(b, bt ? B + (n + br) * P64_P + k + bc : B + (k + br) * P64_P + n + bc, !bt);
            fb_mma(acc[2 * p], a[0], a[1], a[2], a[3], b[0], b[1]);
            fb_mma(acc[2 * p + 1], a[0], a[1], a[2], a[3], b[2], b[3]);
        }
    }
}

__device__ __forceinline__ void acc_zero(float acc[8][4]) {
#pragma unroll
    for (int t = 0; t < 8; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
}

// Accumulator element e of acc[t] of the calling thread: its row and column.
__device__ __forceinline__ int acc_row(int e) { return threadIdx.x / 32 * 16 + threadIdx.x % 32 / 4 + 8 * (e / 2); }
__device__ __forceinline__ int acc_col(int t, int e) { return 8 * t + threadIdx.x % 4 * 2 + e % 2; }

// Rows i < M, columns j < N of the warp's accumulators to C (leading dim ld).
__device__ __forceinline__ void put64(real *C, int64_t ld, const float acc[8][4], int M, int N) {
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = acc_row(e), j = acc_col(t, e);
            if (i < M && j < N) C[i * ld + j] = acc[t][e];
        }
}

// A chunk's decays as chunk_prepare makes them: Gamma (the running sum of
// g, in double), beta, db (where row i's document starts in the chunk, -1:
// before it), bm = exp(Gamma_i) (0 where db >= 0: no state reaches the row),
// ek = exp(Gamma_{L-1} - Gamma_i) (0 before the last row's document start).
struct Decay64 {
    double G[64];
    real bet[64], bm[64], ek[64];
    int db[64];
};

// d of chunk m (L positions), all threads; ends with a barrier (so a tile
// staged before the call is in after it).
__device__ void decays64(const GdnArgs &a, const Item &m, Decay64 &d) {
    int H = a.H, L = m.L;
    int64_t rt = (int64_t)m.b * a.T + m.t0, oh = rt * H + m.h;
    bool docs = a.first != NULL;
    for (int i = threadIdx.x; i < L; i += P64_NT) {
        d.G[i] = a.g[oh + (int64_t)i * H];
        d.bet[i] = a.beta[oh + (int64_t)i * H];
        int f = docs ? a.first[rt + i] : -1;
        d.db[i] = f >= m.t0 ? f - m.t0 : -1;
    }
    __syncthreads();
    warp0_cumsum(d.G, L, false);
    __syncthreads();
    int jL = docs && d.db[L - 1] > 0 ? d.db[L - 1] : 0;
    for (int i = threadIdx.x; i < L; i += P64_NT) {
        d.bm[i] = docs && d.db[i] >= 0 ? (real)0 : d_decay(d.G[i]);
        d.ek[i] = i < jL ? (real)0 : d_decay(d.G[L - 1] - d.G[i]);
    }
    __syncthreads();
}

// Chunk m's ek into the op's rows (from row r) and its b_{L-1} into its slot,
// for the backward's chunk kernel. No barrier.
__device__ __forceinline__ void decays_out64(const GdnArgs &a, const Item &m, int64_t r, const Decay64 &d) {
    for (int i = threadIdx.x; i < m.L; i += P64_NT) a.ekb[r + i] = d.ek[i];
    if (threadIdx.x == 0) a.blb[m.bh * a.NC + m.c] = d.bm[m.L - 1];
}

// E_ij = exp(Gamma_i - Gamma_j) inside row i's document (j >= db[i]), j <= i; else 0.
__device__ __forceinline__ real decay64(const Decay64 &d, bool docs, int i, int j) {
    int j0 = docs && d.db[i] > 0 ? d.db[i] : 0;
    return j >= j0 && j <= i ? d_decay(d.G[i] - d.G[j]) : (real)0;
}

__device__ __forceinline__ real one64(int) { return (real)1; }

// P = (Q K^T) * E from the q and k tiles into acc (rows i < L, columns j < L
// valid; E's zeros elsewhere make the rest P's zeros or -0s, as the general
// kernel's P * E does).
__device__ __forceinline__ void scores64(float acc[8][4], const bf16 *q, const bf16 *k, const Decay64 &d, bool docs,
                                         int L) {
    acc_zero(acc);
    mma64(acc, q, false, k, true, 4);
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = acc_row(e), j = acc_col(t, e);
            acc[t][e] = i < L && j < L ? acc[t][e] * decay64(d, docs, i, j) : 0.f;
        }
}

// The warp's accumulators rounded into a tile (rows and columns past L zero, as staged).
__device__ __forceinline__ void tile64(bf16 *dst, const float acc[8][4], int L) {
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int i = acc_row(e), j = acc_col(t, e);
            dst[i * P64_P + j] = __float2bfloat16_rn(i < L && j < L ? acc[t][e] : 0.f);
        }
}

// ---------------------------------------------------------------- 1. the forward's first step

// A block's chunk in the forward's first step.
struct Prep64 {
    bf16 k[64 * P64_P], xw[64 * P64_P], xu[64 * P64_P], tm[64 * P64_P];
    real At[64 * 65];   // A^T, pitch L + 1 (solve_warps)
    real Tm[64 * 64];   // (I + A)^-1, pitch L
    Decay64 d;
};

__global__ void __launch_bounds__(P64_NT) k_gdn_fwd_prep64(GdnArgs a) {
    extern __shared__ __align__(16) unsigned char smem[];
    Prep64 &s = *reinterpret_cast<Prep64 *>(smem);
    int tid = threadIdx.x;
    bool docs = a.first != NULL;
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int L = m.L;
        int64_t r = m.bh * a.T + m.t0;
        ChunkIn in = chunk_in(a, m.b, m.h, m.t0);
        stage64(s.k, in.k, in.ldk, L, one64);
        decays64(a, m, s.d);
        // KK = K K^T; A_ij = beta_i E_ij KK_ij (j < i), as A^T for the solve.
        float acc[8][4];
        acc_zero(acc);
        mma64(acc, s.k, false, s.k, true, 4);
#pragma unroll
        for (int t = 0; t < 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = acc_row(e), j = acc_col(t, e);
                if (i < L && j < L)
                    s.At[j * (L + 1) + i] = j < i ? s.d.bet[i] * decay64(s.d, docs, i, j) * acc[t][e] : (real)0;
            }
        __syncthreads();
        if (L <= 32) solve_warps<1, P64_NT / 32>(s.Tm, s.At, L);
        else solve_warps<2, P64_NT / 32>(s.Tm, s.At, L);
        // Xw = diag(beta b) K, Xu = diag(beta) V (tiles the solve does not read).
        stage64(s.xw, in.k, in.ldk, L, [&](int i) { return s.d.bet[i] * s.d.bm[i]; });
        stage64(s.xu, in.v, in.ldv, L, [&](int i) { return s.d.bet[i]; });
        __syncthreads();
        // Tm rounded into its tile, and into the op's rows when recorded.
        real *tmo = a.Tmb ? a.Tmb + r * a.Cw : NULL;
        for (int e = tid; e < 64 * 64; e += P64_NT) {
            int i = e / 64, j = e % 64;
            real x = i < L && j < L ? s.Tm[i * L + j] : (real)0;
            s.tm[i * P64_P + j] = __float2bfloat16_rn(x);
            if (tmo && i < L && j < L) tmo[i * L + j] = x;
        }
        __syncthreads();
        // W = Tm Xw, U = Tm Xu.
        int nk = (L + 15) / 16;
        acc_zero(acc);
        mma64(acc, s.tm, false, s.xw, false, nk);
        put64(a.Wb + r * 64, 64, acc, L, 64);
        acc_zero(acc);
        mma64(acc, s.tm, false, s.xu, false, nk);
        put64((a.Usv ? a.Usv : a.Ub) + r * 64, 64, acc, L, 64);
        decays_out64(a, m, r, s.d);
        __syncthreads();   // the next chunk rewrites the tiles
    }
}

// ---------------------------------------------------------------- 3. the forward's output

// O = diag(b) Q S0 + P Delta.
struct Out64 {
    bf16 q[64 * P64_P], k[64 * P64_P], s0[64 * P64_P], dl[64 * P64_P], p[64 * P64_P];
    Decay64 d;
};

__global__ void __launch_bounds__(P64_NT) k_gdn_fwd_out64(GdnArgs a) {
    extern __shared__ __align__(16) unsigned char smem[];
    Out64 &s = *reinterpret_cast<Out64 *>(smem);
    bool docs = a.first != NULL;
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int L = m.L;
        int64_t rt = (int64_t)m.b * a.T + m.t0, r = m.bh * a.T + m.t0;
        // (q, k by hand, not chunk_in: with it ptxas takes 129 registers, one block fewer a multiprocessor)
        stage64(s.q, a.q + rt * a.ldk + (int64_t)m.h * 64, a.ldk, L, one64);
        stage64(s.k, a.k + rt * a.ldk + (int64_t)m.h * 64, a.ldk, L, one64);
        stage64(s.s0, a.states + (m.bh * a.NC + m.c) * 4096, 64, 64, one64);
        stage64(s.dl, a.Ub + r * 64, 64, L, one64);
        decays64(a, m, s.d);
        float o[8][4], acc[8][4];
        acc_zero(o);
        mma64(o, s.q, false, s.s0, false, 4);   // Q S0, then diag(b)
#pragma unroll
        for (int t = 0; t < 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = acc_row(e);
                if (i < L) o[t][e] *= s.d.bm[i];
            }
        scores64(acc, s.q, s.k, s.d, docs, L);
        tile64(s.p, acc, L);
        __syncthreads();
        acc_zero(acc);
        mma64(acc, s.p, false, s.dl, false, (L + 15) / 16);   // + P Delta
#pragma unroll
        for (int t = 0; t < 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[t][e] = fma(o[t][e], (real)1, acc[t][e]);
        put64(a.o + rt * a.ldv + (int64_t)m.h * 64, a.ldv, o, L, 64);
        __syncthreads();   // the next chunk rewrites the tiles
    }
}

// ---------------------------------------------------------------- the backward's first step

// ek and bl; with dO, P into its rows, P^T dO into the op's dDelta rows, Q^T diag(b) dO into the chunk's dS slot.
struct Bprep64 {
    bf16 q[64 * P64_P], k[64 * P64_P], p[64 * P64_P], dO[64 * P64_P], y[64 * P64_P];
    Decay64 d;
};

__global__ void __launch_bounds__(P64_NT) k_gdn_bwd_prep64(GdnArgs a) {
    extern __shared__ __align__(16) unsigned char smem[];
    Bprep64 &s = *reinterpret_cast<Bprep64 *>(smem);
    bool docs = a.first != NULL;
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int L = m.L;
        int64_t r = m.bh * a.T + m.t0;
        ChunkIn in = chunk_in(a, m.b, m.h, m.t0);
        const real *dO = in.dO;
        if (dO) {
            stage64(s.q, in.q, in.ldk, L, one64);
            stage64(s.k, in.k, in.ldk, L, one64);
            stage64(s.dO, dO, in.ldv, L, one64);
        }
        decays64(a, m, s.d);
        decays_out64(a, m, r, s.d);
        if (dO) {
            stage64(s.y, dO, in.ldv, L, [&](int i) { return s.d.bm[i]; });   // dY = diag(b) dO
            float acc[8][4];
            scores64(acc, s.q, s.k, s.d, docs, L);
            put64(a.Pb + r * a.Cw, L, acc, L, L);
            tile64(s.p, acc, L);
            __syncthreads();
            int nk = (L + 15) / 16;
            acc_zero(acc);
            mma64(acc, s.p, true, s.dO, false, nk);   // P^T dO
            put64(a.Ub + r * 64, 64, acc, L, 64);
            acc_zero(acc);
            mma64(acc, s.q, true, s.y, false, nk);   // Q^T dY
            put64(a.dsb + (m.bh * a.NC + m.c) * 4096, 64, acc, 64, 64);
        }
        __syncthreads();   // the next chunk rewrites the tiles
    }
}

// ---------------------------------------------------------------- launches

// Whether these kernels take a's pass (the shape, the rows' alignment for
// their 16-byte loads, ATTNLAB_GDN_CHUNK64: on, the default, or off: the
// general kernels, for comparisons; read at each launch).
bool gdn_chunk64_takes(const GdnArgs &a) {
    const char *e = getenv("ATTNLAB_GDN_CHUNK64");
    if (!e || !*e) e = "on";
    ASSERT(!strcmp(e, "on") || !strcmp(e, "off"), "ATTNLAB_GDN_CHUNK64 is '%s': say on (the default) or off", e);
    uintptr_t p = (uintptr_t)a.q | (uintptr_t)a.k | (uintptr_t)a.v | (uintptr_t)a.dout | (uintptr_t)a.states |
                  (uintptr_t)a.Ub;
    bool aligned = (p & 15) == 0 && a.ldk % 4 == 0 && a.ldv % 4 == 0;
    return !strcmp(e, "on") && a.dk == 64 && a.dv == 64 && a.Cw <= 64 && aligned;
}

// Kernel k with `bytes` of dynamic shared memory over a's chunks, as many
// blocks as stay resident (asked once per kernel: `grid`).
template <typename K> static void launch64(K kernel, size_t bytes, int *grid, const GdnArgs &a) {
    if (!*grid) {
        int dev = 0, sms = 0, per = 0;
        CU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
        CU_CHECK(cudaGetDevice(&dev));
        CU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        CU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, P64_NT, bytes));
        *grid = sms * (per > 0 ? per : 1);
    }
    kernel<<<chunk_grid(a.items, *grid), P64_NT, bytes, cu_stream>>>(a);
    CU_LAUNCHED();
    gdn_chunk64_launches++;
}

void gdn_fwd_prep64(const GdnArgs &a) {
    static int grid;
    launch64(k_gdn_fwd_prep64, sizeof(Prep64), &grid, a);
}

void gdn_fwd_out64(const GdnArgs &a) {
    static int grid;
    launch64(k_gdn_fwd_out64, sizeof(Out64), &grid, a);
}

void gdn_bwd_prep64(const GdnArgs &a) {
    static int grid;
    launch64(k_gdn_bwd_prep64, sizeof(Bprep64), &grid, a);
}

#endif
