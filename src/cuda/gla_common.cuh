// gla_common.cuh: what the GPU files of op_gla_dt (the linear and mamba
// mixers, every form) share: gla.cu (the forward) and gla_backward.cu. The
// chunk's rows (cumulative log decay G, documents, decay factors) as every
// kernel needs them, the chunk of a block, and the per-chunk outer product
// that both passes launch (gla_outer).
//
// The three forms compute one function (src/layers/gla.h), so the GPU runs
// one algorithm for all of them: chunks of GLA_C positions (the mixers'
// default chunk; T need not be a multiple, T = 1 is one chunk of one row),
// the masked form inside a chunk and the state across chunks, with the
// formulas of gla.c / gla_backward.c. Where the CPU walks each (b, h)
// through its chunks in order, here the chunks run side by side and only a
// scan per state element is sequential:
//   forward   1. per chunk c: its own part of the state leaving it,
//                ΔS_c = (diag(exp(G_L − G)) K̃)ᵀ V over its last document, and
//                λ_c = exp(G_L) (0 when a document begins in the chunk);
//             2. per state element: S_{c+1} = λ_c S_c + ΔS_c from s0;
//             3. per chunk: O = A V + diag(exp(G)) Q S_c.
//   backward  1. per chunk: ΔdS_c = (diag(exp(G)) Q)ᵀ dO over the rows that read S_c;
//             2. per state element, in reverse: dS_c = λ_c dS_{c+1} + ΔdS_c
//                from the final state's gradient; dS_0 is s0's;
//             3. per chunk: dq, dk, dv, dg, ddt from S_c and dS_{c+1}.
// Saved (n->saved, tape_dalloc): the states entering each chunk (B, H, NC,
// dk, dv), then λ (B, H, NC). Every sum has a fixed order (no atomics).
//
// Under [train] precision = bf16 (cu_bf16_products, the float32 build) the
// chunk products take bf16 operands and sum in float32, with the CPU's
// semantics (gla.c, gla_backward.c, gdn_chunk.c's header): the kernels'
// instances BF = true round to bf16 (nearest even) exactly the operands the
// CPU's tile products round, after the same float32 scalings: the scores
// Q K̃ᵀ and dO Vᵀ from Q, K̃ = diag(dt) K, dO, V; A V, Aᵀ dO from A (decayed,
// masked); dP K̃, dPᵀ Q from dP; Q S_c, dO S_cᵀ from the state (the scan's
// float32 value) and Q, dO; K̃ dS, V dSᵀ from the state's gradient; the
// states' parts from diag(exp(G_L − G)) K̃ (rounded as formed: e (β k)) and
// V, and from diag(exp(G)) Q and dO. Everything else stays float32 as there:
// the states and their scans, the decays, the products' outputs, dG's sums.
// The CPU rounds the scores' operands only where L, the products' width, is
// a multiple of 16 (tile_gemm_rows_bf16 takes whole vectors), so a partial
// chunk's scores here neither. Taken for the chunked and parallel forms with
// dk and dv multiples of 16 (gla_bf16_takes; the CPU's other products then
// round too); the recurrent form, as the CPU's, and other sizes run float32.
// On the tensor cores (mma_bf16.cuh, mma_tile below): the output of a whole
// chunk and every chunk's state part (gla.cu's out_mma, outer_mma), and
// every product of a whole chunk's backward (gla_backward.cu's
// grad_scores_mma, grad_v_mma, grad_qk_mma; the last for dk up to
// GLA_MMA_DK, its buffers in shared memory); a partial chunk's products
// round the same operands in the scalar loops, which also form the row sums
// (dG's terms, ddt) from the products.
#ifndef AG_GLA_COMMON_CUH
#define AG_GLA_COMMON_CUH

#include "cuda_internal.cuh"

#ifndef AG_DOUBLE
#include <cuda_bf16.h>

#include "mma_bf16.cuh"
#endif

#define GLA_C 64          // positions per chunk, every form
#define GLA_THREADS 256   // per chunk block: 8 warps
#define GLA_MMA_DK 128    // the bf16 backward's dq, dK̃ products on the tensor cores up to this dk (shared memory)

enum { IN_Q, IN_K, IN_V, IN_G, IN_DT, IN_S0, N_IN };   // as gla_internal.h

typedef struct {
    int B, T, H, dk, dv;
    int nc;   // chunks per row, ceil(T / GLA_C)
} Dims;

// The rows of one chunk as every kernel needs them (shared memory).
typedef struct {
    double G[GLA_C];   // chunk-local cumulative log decay (zeros without g)
    int db[GLA_C];     // where row i's document begins in the chunk, -1: before it (gla_chunk_docs)
    real dt[GLA_C];    // β (1 without dt)
    real eS[GLA_C];    // exp(G_i) for the rows that read the entering state, else 0
    real eL[GLA_C];    // exp(G_L − G_i) for the rows of the last document (they reach the leaving state), else 0
} Rows;

// The chunk of a block: blocks are (b, h) major, chunk minor.
typedef struct {
    int b, h, c, t0, L;
    int64_t bh;
} Chunk;

__device__ __forceinline__ Chunk chunk_of(const Dims &d) {
    Chunk k;
    k.c = (int)(blockIdx.x % d.nc);
    k.bh = blockIdx.x / d.nc;
    k.b = (int)(k.bh / d.H);
    k.h = (int)(k.bh % d.H);
    k.t0 = k.c * GLA_C;
    k.L = min(GLA_C, d.T - k.t0);
    return k;
}

__device__ __forceinline__ void put(real *p, real v, bool fresh) { *p = fresh ? v : *p + v; }

// Fills r for chunk k. Every thread of the block must call it (barriers).
static __device__ void rows_load(Rows *r, const Dims &d, const Chunk &k, const real *g, const real *dt,
                                 const int *first) {
    int64_t gb = (int64_t)k.b * d.T * d.H + k.h;   // (b, t = 0, h) of a (B, T, H) tensor
    if (threadIdx.x == 0) {
        double acc = 0;
        for (int i = 0; i < k.L; i++) {
            if (g) acc += (double)g[gb + (int64_t)(k.t0 + i) * d.H];
            r->G[i] = acc;
        }
    }
    for (int i = threadIdx.x; i < k.L; i += blockDim.x) {
        int f = first ? first[(int64_t)k.b * d.T + k.t0 + i] : -1;
        r->db[i] = f >= k.t0 ? f - k.t0 : -1;
        r->dt[i] = dt ? dt[gb + (int64_t)(k.t0 + i) * d.H] : (real)1;
    }
    __syncthreads();
    int j0 = max(r->db[k.L - 1], 0);
    double gL = r->G[k.L - 1];
    for (int i = threadIdx.x; i < k.L; i += blockDim.x) {
        r->eS[i] = r->db[i] >= 0 ? (real)0 : g ? d_decay(r->G[i]) : (real)1;
        r->eL[i] = i < j0 ? (real)0 : g ? d_decay(gL - r->G[i]) : (real)1;
    }
    __syncthreads();
}

// Whether row i reads row s of its chunk (causal, same document).
__device__ __forceinline__ bool reads(const Rows *r, int i, int s) { return s <= i && s >= r->db[i]; }

// x rounded to bf16 (nearest even, bf16.h's rounding) in an instance with
// bf16 products (BF) where `on`, else x itself.
template <bool BF>
__device__ __forceinline__ real bfr(real x, bool on = true) {
#ifndef AG_DOUBLE
    if (BF && on) return __bfloat162float(__float2bfloat16_rn(x));
#endif
    return x;
}

#ifndef AG_DOUBLE
// acc += X Y over k in [k0, k1) (multiples of 16), a warp's (16, 8) tile on
// the tensor cores, every operand rounded to bf16 as read: X(m, k) =
// xs[m] X[m sm + k sk], Y(k, n) = ys[n] yk[k] Y[k tk + n tn] (xs, ys, yk
// NULL: no scale, at most one of ys, yk; X, xs from the tile's row, Y, ys
// from its column, yk from k = 0). A scale is one float32 product before the
// rounding, as the CPU forms β k. All 32 lanes.
static __device__ __forceinline__ void mma_tile(float acc[4], const real *X, int64_t sm, int64_t sk, const real *xs,
                                                const real *Y, int64_t tk, int64_t tn, const real *ys,
                                                const real *yk, int k0, int k1) {
    int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const real *xa = X + g * sm, *xb = xa + 8 * sm, *yg = Y + g * tn;
    real sa = xs ? xs[g] : (real)1, sb = xs ? xs[g + 8] : (real)1, sy = ys ? ys[g] : (real)1;
    bool scx = xs != NULL, scy = ys != NULL, sck = yk != NULL;
    for (int kb = k0; kb < k1; kb += 16) {
        int64_t k = kb + 2 * c;
        auto xa_ = [&](int64_t kk) { return scx ? sa * xa[kk * sk] : xa[kk * sk]; };
        auto xb_ = [&](int64_t kk) { return scx ? sb * xb[kk * sk] : xb[kk * sk]; };
        auto y_ = [&](int64_t kk) { return scy ? sy * yg[kk * tk] : sck ? yk[kk] * yg[kk * tk] : yg[kk * tk]; };
        fb_mma(acc, fb_pack(xa_(k), xa_(k + 1)), fb_pack(xb_(k), xb_(k + 1)), fb_pack(xa_(k + 8), xa_(k + 9)),
               fb_pack(xb_(k + 8), xb_(k + 9)), fb_pack(y_(k), y_(k + 1)), fb_pack(y_(k + 8), y_(k + 9)));
    }
}

// Row and column of element e (0..3) of lane's accumulator in a (16, 8)
// tile (mma_bf16.cuh's C layout).
__device__ __forceinline__ int tile_row(int e) { return ((threadIdx.x & 31) >> 2) + 8 * (e >> 1); }
__device__ __forceinline__ int tile_col(int e) { return 2 * (threadIdx.x & 3) + (e & 1); }
#endif

static inline Dims dims_of(const Node *n) {
    Dims d = {n->iarg[0], n->iarg[1], n->iarg[2], n->iarg[3], n->iarg[4], (n->iarg[1] + GLA_C - 1) / GLA_C};
    ASSERT((int64_t)d.B * d.H * d.nc < (int64_t)1 << 31, "gla: %d x %d x %d chunks are too many blocks", d.B, d.H,
           d.nc);
    return d;
}

static inline const real *data_or_null(const Tensor *t) { return t ? t->data : NULL; }

// Whether node n (op_gla_dt) runs its products in bf16 (above): decided by
// the forward (gla.cu) into n->farg[0], which the backward follows.
bool gla_bf16_takes(const Node *n);
extern "C" bool cu_bf16_products(void);   // ops_matmul.cu

// gla.cu: k_gla_outer (below, there) on `blocks` blocks of GLA_THREADS; bf:
// its instance with bf16 products.
void gla_outer(unsigned blocks, Dims d, bool bwd, bool bf, const real *x, const real *y, const real *g,
               const real *dt, const int *first, real *states, real *sfinal, real *lam);

#endif
