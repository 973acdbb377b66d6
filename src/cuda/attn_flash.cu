// attn_flash.cu: causal softmax attention on the GPU: op_attention
// (attn_flash.c, FlashAttention-2 style, O(T) memory) and its reference
// op_attention_naive (attn_naive.c, the full P saved).
//
// Flash. One thread block per (query tile of FA_BQ rows, batch x head):
//   forward: the tile's Q in shared memory; for each key tile that some
//     query of the tile sees, K_j and V_j in shared memory, S = scale Q K_j^T
//     (masked: s <= t and s >= lo(t), lo(t) where t's document begins), the
//     online softmax (m, l, alpha per row, one warp per row) and
//     A = diag(alpha) A + P V_j. Then o = A / l and lse = m + log l (saved).
//   backward: D_t = dO_t . O_t first (double, as the CPU), then two kernels
//     that each recompute P = exp(scale Q K^T - lse) block by block:
//     dQ per query tile (looping over key tiles: dS = P (dO V^T - D),
//     dQ += dS K), and dK, dV per key tile (looping over the query tiles that
//     see it: dV += P^T dO, dK += dS^T Q). Every gradient row is written by
//     one block, so there are no atomics, and the loops run in a fixed order:
//     a run repeats bit for bit.
// Accumulators and tiles live in dynamic shared memory (over 48 KB at head
// dims 128, so the kernels opt in with cudaFuncSetAttribute). K and V are
// stored with rows padded by one element where threads of a warp read
// different rows (the score and dP products), so those reads do not
// conflict in banks; elsewhere a warp reads along a row or one broadcast.
//
// Naive. One block per row (b, h, t) with the row in shared memory, in
// double as attn_naive.c; P (B, H, T, T) saved. The backward: one block per
// query row (dS row, dq), then one per key row (dk, dv from the columns of dS
// and P), dS kept (B, H, T, T) in double in between.
#include <math.h>

#include "cuda_internal.cuh"

// Tile sizes: queries and keys per block. Float64 tiles take twice the
// bytes, so they are halved to fit the shared memory at head dims 128.
#ifdef AG_DOUBLE
#define FA_BQ 32
#define FA_BK 32
#else
#define FA_BQ 64
#define FA_BK 64
#endif
#define FA_THREADS 256
#define FA_WARPS (FA_THREADS / 32)
#define NA_THREADS 128

typedef struct FaDims {
    int B, T, H, dk, dv;
    real scale;
} FaDims;

// The largest dynamic shared memory a block may opt in to (227 KB on Hopper).
static size_t cu_smem_optin(void) {
    static int bytes = 0;
    if (!bytes) {
        int dev = 0;
        CU_CHECK(cudaGetDevice(&dev));
        CU_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    }
    return (size_t)bytes;
}

// Check a kernel's shared memory fits, and opt in above the default 48 KB.
static void cu_smem_prepare(const void *kernel, size_t bytes, const char *what, int dk, int dv) {
    ASSERT(bytes <= cu_smem_optin(), "%s: head dims dk %d, dv %d need %zu bytes of shared memory, the GPU has %zu",
           what, dk, dv, bytes, cu_smem_optin());
    if (bytes > 48 * 1024)
        CU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

// Where row r's document begins (docs_begin of docs.h), first in device memory.
__device__ __forceinline__ int fa_lo(const int *first, int64_t r) {
    int f = first ? first[r] : 0;
    return f > 0 ? f : 0;
}

__device__ __forceinline__ real fa_max(real a, real b) { return b > a ? b : a; }

// The documents' index (docs.h, host memory in aux) copied to the device, or NULL.
static const int *fa_first_on_device(Node *n, int B, int T) {
    if (!n->aux) return NULL;
    size_t bytes = (size_t)B * T * sizeof(int);
    int *d = (int *)tape_dalloc(n->tape, bytes);
    cu_from_host(d, n->aux, bytes);
    return d;
}

static FaDims fa_dims(const Node *n) {
    FaDims d = {n->iarg[0], n->iarg[1], n->iarg[2], n->iarg[3], n->iarg[4], (real)n->farg[0]};
    return d;
}

// ---------------------------------------------------------------- flash forward

// Shared memory: Q (BQ x dk), K (BK x dk+1), V (BK x dv), S/P (BQ x BK),
// A (BQ x dv), m, l, alpha (BQ); then lo (BQ ints).
static size_t fwd_smem(int dk, int dv) {
    return ((size_t)FA_BQ * dk + (size_t)FA_BK * (dk + 1) + (size_t)FA_BK * dv + (size_t)FA_BQ * FA_BK +
            (size_t)FA_BQ * dv + 3 * FA_BQ) * sizeof(real) + FA_BQ * sizeof(int);
}

// grid (query tiles, B*H). lse (B, H, T) or NULL.
__global__ void __launch_bounds__(FA_THREADS)
    k_flash_fwd(FaDims d, const real *q, const real *k, const real *v, const int *first, real *o, real *lse) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    int bh = blockIdx.y, b = bh / d.H, h = bh % d.H, tid = threadIdx.x;
    int dk = d.dk, dv = d.dv, ldks = dk + 1;
    int t0 = blockIdx.x * FA_BQ, nq = min(FA_BQ, d.T - t0);
    int64_t ldq = (int64_t)d.H * dk, ldv = (int64_t)d.H * dv, row0 = (int64_t)b * d.T;
    const real *qh = q + row0 * ldq + h * dk, *kh = k + row0 * ldq + h * dk, *vh = v + row0 * ldv + h * dv;
    const int *fr = first ? first + row0 : NULL;
    real *Qs = (real *)fa_smem, *Ks = Qs + FA_BQ * dk, *Vs = Ks + FA_BK * ldks, *Ss = Vs + FA_BK * dv;
    real *Acc = Ss + FA_BQ * FA_BK, *m = Acc + FA_BQ * dv, *l = m + FA_BQ, *alpha = l + FA_BQ;
    int *lo = (int *)(alpha + FA_BQ);

    for (int e = tid; e < FA_BQ * dk; e += FA_THREADS) {
        int i = e / dk, c = e % dk;
        Qs[e] = i < nq ? qh[(t0 + i) * ldq + c] : (real)0;
    }
    for (int e = tid; e < FA_BQ * dv; e += FA_THREADS) Acc[e] = 0;
    for (int i = tid; i < FA_BQ; i += FA_THREADS) {
        m[i] = -INFINITY;
        l[i] = 0;
        lo[i] = i < nq ? fa_lo(fr, t0 + i) : 0;
    }
    __syncthreads();
    // Keys from the start of the tile's first query's document (the earliest
    // any query of the tile sees) to its last query.
    int s_end = t0 + nq;
    for (int s0 = fa_lo(fr, t0); s0 < s_end; s0 += FA_BK) {
        int nk = min(FA_BK, s_end - s0);
        for (int e = tid; e < FA_BK * dk; e += FA_THREADS) {
            int j = e / dk, c = e % dk;
            Ks[j * ldks + c] = j < nk ? kh[(s0 + j) * ldq + c] : (real)0;
        }
        for (int e = tid; e < FA_BK * dv; e += FA_THREADS) {
            int j = e / dv, c = e % dv;
            Vs[e] = j < nk ? vh[(s0 + j) * ldv + c] : (real)0;
        }
        __syncthreads();
        // S: -inf where query i does not see key j (exp gives weight 0).
        for (int e = tid; e < FA_BQ * FA_BK; e += FA_THREADS) {
            int i = e / FA_BK, j = e % FA_BK, s = s0 + j;
            real x = -INFINITY;
            if (i < nq && j < nk && s <= t0 + i && s >= lo[i]) {
                const real *qi = Qs + i * dk, *kj = Ks + j * ldks;
                real acc = 0;
                for (int c = 0; c < dk; c++) acc = fma(qi[c], kj[c], acc);
                x = d.scale * acc;
            }
            Ss[e] = x;
        }
        __syncthreads();
        // The online softmax, one warp per row: m' = max(m, rowmax S),
        // P = exp(S - m'), alpha = exp(m - m') (1 when the max did not move,
        // also while the row has seen no key: m = m' = -inf).
        int warp = tid >> 5, lane = tid & 31;
        for (int i = warp; i < FA_BQ; i += FA_WARPS) {
            real *Si = Ss + i * FA_BK, mx = m[i], sum = 0;
            for (int j = lane; j < FA_BK; j += 32) mx = fa_max(mx, Si[j]);
            for (int off = 16; off > 0; off >>= 1) mx = fa_max(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            for (int j = lane; j < FA_BK; j += 32) {
                real p = Si[j] == -INFINITY ? (real)0 : exp(Si[j] - mx);
                Si[j] = p;
                sum += p;
            }
            for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            if (lane == 0) {
                real a = m[i] == mx ? (real)1 : exp(m[i] - mx);
                alpha[i] = a;
                l[i] = a * l[i] + sum;
                m[i] = mx;
            }
        }
        __syncthreads();
        // A = diag(alpha) A + P V_j
        for (int e = tid; e < FA_BQ * dv; e += FA_THREADS) {
            int i = e / dv, c = e % dv;
            const real *Pi = Ss + i * FA_BK;
            real acc = 0;
            for (int j = 0; j < nk; j++) acc = fma(Pi[j], Vs[j * dv + c], acc);
            Acc[e] = alpha[i] * Acc[e] + acc;
        }
        __syncthreads();   // K, V, S are overwritten by the next key tile
    }
    // Every query sees itself, so l > 0.
    for (int e = tid; e < nq * dv; e += FA_THREADS) {
        int i = e / dv, c = e % dv;
        o[(row0 + t0 + i) * ldv + h * dv + c] = Acc[e] / l[i];
    }
    if (lse)
        for (int i = tid; i < nq; i += FA_THREADS) lse[(int64_t)bh * d.T + t0 + i] = m[i] + log(l[i]);
}

// iarg: 0 B, 1 T, 2 H, 3 dk, 4 dv (5, 6: the CPU's tiles); farg[0] scale;
// aux: first (B*T, docs.h) or NULL; saved: lse (B, H, T) or NULL.
extern "C" void cu_flash_forward(Node *n) {
    FaDims d = fa_dims(n);
    if ((int64_t)d.B * d.H * d.T == 0) return;
    ASSERT(d.B * d.H <= 65535, "attention: %d x %d batch x heads exceed the GPU grid", d.B, d.H);
    size_t smem = fwd_smem(d.dk, d.dv);
    cu_smem_prepare((const void *)k_flash_fwd, smem, "attention", d.dk, d.dv);
    const int *first = fa_first_on_device(n, d.B, d.T);
    dim3 grid((unsigned)((d.T + FA_BQ - 1) / FA_BQ), (unsigned)(d.B * d.H));
    k_flash_fwd<<<grid, FA_THREADS, smem, cu_stream>>>(d, n->in[0]->data, n->in[1]->data, n->in[2]->data, first,
                                                       n->out[0]->data, (real *)n->saved);
    CU_LAUNCHED();
}

// ---------------------------------------------------------------- flash backward

// D (B, H, T): D_t = dO_t . O_t per head, summed in double.
__global__ void k_flash_rowdot(FaDims d, const real *o, const real *dO, real *D) {
    int64_t rows = (int64_t)d.B * d.H * d.T, ldv = (int64_t)d.H * d.dv;
    CU_FOR(r, rows) {
        int t = (int)(r % d.T);
        int64_t bh = r / d.T;
        int b = (int)(bh / d.H), h = (int)(bh % d.H);
        int64_t off = ((int64_t)b * d.T + t) * ldv + (int64_t)h * d.dv;
        double s = 0;
        for (int c = 0; c < d.dv; c++) s += (double)dO[off + c] * o[off + c];
        D[r] = (real)s;
    }
}

// dQ kernel, shared memory: Q (BQ x dk), dO (BQ x dv), K (BK x dk+1),
// V (BK x dv+1), dS (BQ x BK), dQ (BQ x dk), lse, D (BQ); then lo (BQ ints).
static size_t dq_smem(int dk, int dv) {
    return ((size_t)FA_BQ * dk + (size_t)FA_BQ * dv + (size_t)FA_BK * (dk + 1) + (size_t)FA_BK * (dv + 1) +
            (size_t)FA_BQ * FA_BK + (size_t)FA_BQ * dk + 2 * FA_BQ) * sizeof(real) + FA_BQ * sizeof(int);
}

// grid (query tiles, B*H): dq rows of the tile = scale sum_j dS K_j, written
// (fresh) or added.
__global__ void __launch_bounds__(FA_THREADS)
    k_flash_dq(FaDims d, const real *q, const real *k, const real *v, const real *dO, const real *lse,
               const real *D, const int *first, real *dq, bool fresh) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    int bh = blockIdx.y, b = bh / d.H, h = bh % d.H, tid = threadIdx.x;
    int dk = d.dk, dv = d.dv, ldks = dk + 1, ldvs = dv + 1;
    int t0 = blockIdx.x * FA_BQ, nq = min(FA_BQ, d.T - t0);
    int64_t ldq = (int64_t)d.H * dk, ldv = (int64_t)d.H * dv, row0 = (int64_t)b * d.T;
    const real *qh = q + row0 * ldq + h * dk, *kh = k + row0 * ldq + h * dk;
    const real *vh = v + row0 * ldv + h * dv, *dOh = dO + row0 * ldv + h * dv;
    const int *fr = first ? first + row0 : NULL;
    real *Qs = (real *)fa_smem, *dOs = Qs + FA_BQ * dk, *Ks = dOs + FA_BQ * dv, *Vs = Ks + FA_BK * ldks;
    real *dSs = Vs + FA_BK * ldvs, *dQa = dSs + FA_BQ * FA_BK, *Ls = dQa + FA_BQ * dk, *Ds = Ls + FA_BQ;
    int *lo = (int *)(Ds + FA_BQ);

    for (int e = tid; e < FA_BQ * dk; e += FA_THREADS) {
        int i = e / dk, c = e % dk;
        Qs[e] = i < nq ? qh[(t0 + i) * ldq + c] : (real)0;
        dQa[e] = 0;
    }
    for (int e = tid; e < FA_BQ * dv; e += FA_THREADS) {
        int i = e / dv, c = e % dv;
        dOs[e] = i < nq ? dOh[(t0 + i) * ldv + c] : (real)0;
    }
    for (int i = tid; i < FA_BQ; i += FA_THREADS) {
        int64_t r = (int64_t)bh * d.T + t0 + i;
        Ls[i] = i < nq ? lse[r] : (real)0;
        Ds[i] = i < nq ? D[r] : (real)0;
        lo[i] = i < nq ? fa_lo(fr, t0 + i) : 0;
    }
    __syncthreads();
    int s_end = t0 + nq;
    for (int s0 = fa_lo(fr, t0); s0 < s_end; s0 += FA_BK) {
        int nk = min(FA_BK, s_end - s0);
        for (int e = tid; e < FA_BK * dk; e += FA_THREADS) {
            int j = e / dk, c = e % dk;
            Ks[j * ldks + c] = j < nk ? kh[(s0 + j) * ldq + c] : (real)0;
        }
        for (int e = tid; e < FA_BK * dv; e += FA_THREADS) {
            int j = e / dv, c = e % dv;
            Vs[j * ldvs + c] = j < nk ? vh[(s0 + j) * ldv + c] : (real)0;
        }
        __syncthreads();
        // dS = P (dP - D), P = exp(scale q.k - lse), dP = dO . v; 0 where unseen.
        for (int e = tid; e < FA_BQ * FA_BK; e += FA_THREADS) {
            int i = e / FA_BK, j = e % FA_BK, s = s0 + j;
            real ds = 0;
            if (i < nq && j < nk && s <= t0 + i && s >= lo[i]) {
                const real *qi = Qs + i * dk, *kj = Ks + j * ldks, *gi = dOs + i * dv, *vj = Vs + j * ldvs;
                real sc = 0, dp = 0;
                for (int c = 0; c < dk; c++) sc = fma(qi[c], kj[c], sc);
                for (int c = 0; c < dv; c++) dp = fma(gi[c], vj[c], dp);
                ds = exp(d.scale * sc - Ls[i]) * (dp - Ds[i]);
            }
            dSs[e] = ds;
        }
        __syncthreads();
        for (int e = tid; e < FA_BQ * dk; e += FA_THREADS) {
            int i = e / dk, c = e % dk;
            const real *dSi = dSs + i * FA_BK;
            real acc = 0;
            for (int j = 0; j < nk; j++) acc = fma(dSi[j], Ks[j * ldks + c], acc);
            dQa[e] += acc;
        }
        __syncthreads();   // K, V, dS are overwritten by the next key tile
    }
    for (int e = tid; e < nq * dk; e += FA_THREADS) {
        int i = e / dk, c = e % dk;
        real *p = dq + (row0 + t0 + i) * ldq + h * dk + c, g = d.scale * dQa[e];
        *p = fresh ? g : *p + g;
    }
}

// dK, dV kernel, shared memory: K (BK x dk+1), V (BK x dv+1), Q (BQ x dk),
// dO (BQ x dv), P/dS (BQ x BK), dK (BK x dk), dV (BK x dv), lse, D (BQ);
// then lo (BQ ints).
static size_t dkv_smem(int dk, int dv) {
    return ((size_t)FA_BK * (dk + 1) + (size_t)FA_BK * (dv + 1) + (size_t)FA_BQ * dk + (size_t)FA_BQ * dv +
            (size_t)FA_BQ * FA_BK + (size_t)FA_BK * dk + (size_t)FA_BK * dv + 2 * FA_BQ) * sizeof(real) +
           FA_BQ * sizeof(int);
}

// grid (key tiles, B*H): dk rows of the tile = scale sum_i dS^T Q_i and dv
// rows = sum_i P^T dO_i over the query tiles from the key tile on, up to the
// end of the last key's document. dk or dv may be NULL (no gradient); a
// tensor passed as both k and v gets dk written first, then dv added.
__global__ void __launch_bounds__(FA_THREADS)
    k_flash_dkv(FaDims d, const real *q, const real *k, const real *v, const real *dO, const real *lse,
                const real *D, const int *first, real *gk, bool fresh_k, real *gv, bool fresh_v) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    int bh = blockIdx.y, b = bh / d.H, h = bh % d.H, tid = threadIdx.x;
    int dk = d.dk, dv = d.dv, ldks = dk + 1, ldvs = dv + 1;
    int s0 = blockIdx.x * FA_BK, nk = min(FA_BK, d.T - s0), s_last = s0 + nk - 1;
    int64_t ldq = (int64_t)d.H * dk, ldv = (int64_t)d.H * dv, row0 = (int64_t)b * d.T;
    const real *qh = q + row0 * ldq + h * dk, *kh = k + row0 * ldq + h * dk;
    const real *vh = v + row0 * ldv + h * dv, *dOh = dO + row0 * ldv + h * dv;
    const int *fr = first ? first + row0 : NULL;
    real *Ks = (real *)fa_smem, *Vs = Ks + FA_BK * ldks, *Qs = Vs + FA_BK * ldvs, *dOs = Qs + FA_BQ * dk;
    real *Ps = dOs + FA_BQ * dv, *dKa = Ps + FA_BQ * FA_BK, *dVa = dKa + FA_BK * dk, *Ls = dVa + FA_BK * dv;
    real *Ds = Ls + FA_BQ;
    int *lo = (int *)(Ds + FA_BQ);

    for (int e = tid; e < FA_BK * dk; e += FA_THREADS) {
        int j = e / dk, c = e % dk;
        Ks[j * ldks + c] = j < nk ? kh[(s0 + j) * ldq + c] : (real)0;
        dKa[e] = 0;
    }
    for (int e = tid; e < FA_BK * dv; e += FA_THREADS) {
        int j = e / dv, c = e % dv;
        Vs[j * ldvs + c] = j < nk ? vh[(s0 + j) * ldv + c] : (real)0;
        dVa[e] = 0;
    }
    // The query tiles start at s0 (earlier queries see none of these keys).
    // The document start lo(t) does not decrease with t: once a tile's first
    // query begins its document after the last key, no later query sees any
    // key of the tile. (fr[...] is the same for every thread: the loop and
    // its barriers are uniform.)
    for (int t0 = s0; t0 < d.T && fa_lo(fr, t0) <= s_last; t0 += FA_BQ) {
        int nq = min(FA_BQ, d.T - t0);
        for (int e = tid; e < FA_BQ * dk; e += FA_THREADS) {
            int i = e / dk, c = e % dk;
            Qs[e] = i < nq ? qh[(t0 + i) * ldq + c] : (real)0;
        }
        for (int e = tid; e < FA_BQ * dv; e += FA_THREADS) {
            int i = e / dv, c = e % dv;
            dOs[e] = i < nq ? dOh[(t0 + i) * ldv + c] : (real)0;
        }
        for (int i = tid; i < FA_BQ; i += FA_THREADS) {
            int64_t r = (int64_t)bh * d.T + t0 + i;
            Ls[i] = i < nq ? lse[r] : (real)0;
            Ds[i] = i < nq && D ? D[r] : (real)0;
            lo[i] = i < nq ? fa_lo(fr, t0 + i) : 0;
        }
        __syncthreads();
        // P = exp(scale q.k - lse), 0 where query i does not see key j.
        for (int e = tid; e < FA_BQ * FA_BK; e += FA_THREADS) {
            int i = e / FA_BK, j = e % FA_BK, s = s0 + j;
            real p = 0;
            if (i < nq && j < nk && s <= t0 + i && s >= lo[i]) {
                const real *qi = Qs + i * dk, *kj = Ks + j * ldks;
                real sc = 0;
                for (int c = 0; c < dk; c++) sc = fma(qi[c], kj[c], sc);
                p = exp(d.scale * sc - Ls[i]);
            }
            Ps[e] = p;
        }
        __syncthreads();
        if (gv)   // dV_j += P^T dO
            for (int e = tid; e < FA_BK * dv; e += FA_THREADS) {
                int j = e / dv, c = e % dv;
                real acc = 0;
                for (int i = 0; i < nq; i++) acc = fma(Ps[i * FA_BK + j], dOs[i * dv + c], acc);
                dVa[e] += acc;
            }
        if (gk) {
            __syncthreads();   // the dV product has read P; dS replaces it
            for (int e = tid; e < FA_BQ * FA_BK; e += FA_THREADS) {
                int i = e / FA_BK, j = e % FA_BK;
                real p = Ps[e], ds = 0;
                if (p != 0) {   // else dS = 0 (unseen, or a weight below the smallest real)
                    const real *gi = dOs + i * dv, *vj = Vs + j * ldvs;
                    real dp = 0;
                    for (int c = 0; c < dv; c++) dp = fma(gi[c], vj[c], dp);
                    ds = p * (dp - Ds[i]);
                }
                Ps[e] = ds;
            }
            __syncthreads();
            // dK_j += dS^T Q (the scale at the end)
            for (int e = tid; e < FA_BK * dk; e += FA_THREADS) {
                int j = e / dk, c = e % dk;
                real acc = 0;
                for (int i = 0; i < nq; i++) acc = fma(Ps[i * FA_BK + j], Qs[i * dk + c], acc);
                dKa[e] += acc;
            }
        }
        __syncthreads();   // Q, dO, P are overwritten by the next query tile
    }
    if (gk)
        for (int e = tid; e < nk * dk; e += FA_THREADS) {
            int j = e / dk, c = e % dk;
            real *p = gk + (row0 + s0 + j) * ldq + h * dk + c, g = d.scale * dKa[e];
            *p = fresh_k ? g : *p + g;
        }
    __syncthreads();   // gk and gv may be one buffer (k and v one tensor): dk first
    if (gv)
        for (int e = tid; e < nk * dv; e += FA_THREADS) {
            int j = e / dv, c = e % dv;
            real *p = gv + (row0 + s0 + j) * ldv + h * dv + c;
            *p = fresh_v ? dVa[e] : *p + dVa[e];
        }
}

extern "C" void cu_flash_backward(Node *n) {
    FaDims d = fa_dims(n);
    // In input order: a tensor passed twice gets fresh on its first use only.
    bool fq = false, fk = false, fv = false;
    real *gq = CU_GRAD_FRESH(n, 0, &fq), *gk = CU_GRAD_FRESH(n, 1, &fk), *gv = CU_GRAD_FRESH(n, 2, &fv);
    if ((!gq && !gk && !gv) || (int64_t)d.B * d.H * d.T == 0) return;
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    const real *o = n->out[0]->data, *dO = n->out[0]->grad, *lse = (const real *)n->saved;
    const int *first = fa_first_on_device(n, d.B, d.T);
    int64_t rows = (int64_t)d.B * d.H * d.T;
    real *D = NULL;
    if (gq || gk) {
        D = (real *)tape_dalloc(n->tape, (size_t)rows * sizeof(real));
        k_flash_rowdot<<<cu_grid(rows), CU_THREADS, 0, cu_stream>>>(d, o, dO, D);
        CU_LAUNCHED();
    }
    // dq before dk and dv: when q is also k or v, its gradient is written here
    // (fresh) and added to below.
    if (gq) {
        size_t smem = dq_smem(d.dk, d.dv);
        cu_smem_prepare((const void *)k_flash_dq, smem, "attention backward", d.dk, d.dv);
        dim3 grid((unsigned)((d.T + FA_BQ - 1) / FA_BQ), (unsigned)(d.B * d.H));
        k_flash_dq<<<grid, FA_THREADS, smem, cu_stream>>>(d, q, k, v, dO, lse, D, first, gq, fq);
        CU_LAUNCHED();
    }
    if (gk || gv) {
        size_t smem = dkv_smem(d.dk, d.dv);
        cu_smem_prepare((const void *)k_flash_dkv, smem, "attention backward", d.dk, d.dv);
        dim3 grid((unsigned)((d.T + FA_BK - 1) / FA_BK), (unsigned)(d.B * d.H));
        k_flash_dkv<<<grid, FA_THREADS, smem, cu_stream>>>(d, q, k, v, dO, lse, D, first, gk, fk, gv, fv);
        CU_LAUNCHED();
    }
}

// ---------------------------------------------------------------- naive (the reference)

// Block-wide max of one double per thread (as cu_block_sum; shm 32 doubles).
__device__ __forceinline__ double na_block_max(double v, double *shm) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();   // shm may still be read by a previous call
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    v = lane < nw ? shm[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Shared memory of the per-row kernels: the row (T doubles) and 32 for the reductions.
static size_t na_smem(int T) { return ((size_t)T + 32) * sizeof(double); }

// One block per row r = (b H + h) T + t: P_t. = softmax over the allowed
// s <= t of scale q_t.k_s (double), o_t = sum_s P_ts v_s. P (B, H, T, T) or
// NULL; allow (B, T, T) or NULL.
__global__ void __launch_bounds__(NA_THREADS)
    k_naive_fwd(int T, int H, int dk, int dv, double scale, const unsigned char *allow, const real *q,
                const real *k, const real *v, real *o, real *P) {
    extern __shared__ double na_row[];
    double *p = na_row, *red = na_row + T;
    int64_t r = blockIdx.x, bh = r / T;
    int t = (int)(r % T), b = (int)(bh / H), h = (int)(bh % H), tid = threadIdx.x;
    int64_t ldq = (int64_t)H * dk, ldv = (int64_t)H * dv, row0 = (int64_t)b * T;
    const real *qt = q + (row0 + t) * ldq + h * dk;
    double mx = -INFINITY;
    for (int s = tid; s <= t; s += NA_THREADS) {
        double x = -INFINITY;   // masked out: exp gives 0
        if (!allow || allow[(row0 + t) * T + s]) {
            const real *ks = k + (row0 + s) * ldq + h * dk;
            double dot = 0;
            for (int i = 0; i < dk; i++) dot += (double)qt[i] * ks[i];
            x = scale * dot;
        }
        p[s] = x;
        mx = fmax(mx, x);
    }
    mx = na_block_max(mx, red);   // finite: the builder checked every row allows some s <= t
    double sum = 0;
    for (int s = tid; s <= t; s += NA_THREADS) {
        p[s] = exp(p[s] - mx);
        sum += p[s];
    }
    sum = cu_block_sum(sum, red);
    real *Pt = P ? P + r * T : NULL;
    for (int s = tid; s < T; s += NA_THREADS) {
        if (s <= t) p[s] /= sum;
        if (Pt) Pt[s] = s <= t ? (real)p[s] : (real)0;
    }
    __syncthreads();
    for (int j = tid; j < dv; j += NA_THREADS) {
        double acc = 0;
        for (int s = 0; s <= t; s++) acc += p[s] * v[(row0 + s) * ldv + h * dv + j];
        o[(row0 + t) * ldv + h * dv + j] = (real)acc;
    }
}

// iarg: 0 B, 1 T, 2 H, 3 dk, 4 dv; farg[0] scale; aux: allow (B, T, T) or
// NULL (host memory); saved: P (B, H, T, T) or NULL.
extern "C" void cu_naive_attn_forward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], H = n->iarg[2], dk = n->iarg[3], dv = n->iarg[4];
    int64_t rows = (int64_t)B * H * T;
    if (rows == 0) return;
    size_t smem = na_smem(T);
    cu_smem_prepare((const void *)k_naive_fwd, smem, "attention_naive", dk, dv);
    unsigned char *allow = NULL;
    if (n->aux) {
        size_t bytes = (size_t)B * T * T;
        allow = (unsigned char *)tape_dalloc(n->tape, bytes);
        cu_from_host(allow, n->aux, bytes);
    }
    k_naive_fwd<<<(unsigned)rows, NA_THREADS, smem, cu_stream>>>(T, H, dk, dv, n->farg[0], allow, n->in[0]->data,
                                                                 n->in[1]->data, n->in[2]->data, n->out[0]->data,
                                                                 (real *)n->saved);
    CU_LAUNCHED();
}

// One block per query row r: dS_ts = P_ts (dP_ts - sum_s' P_ts' dP_ts'),
// dP_ts = dO_t . v_s (double); the row into dS (B, H, T, T) when not NULL,
// and dq_t = scale sum_s dS_ts k_s into gq when not NULL.
__global__ void __launch_bounds__(NA_THREADS)
    k_naive_dq(int T, int H, int dk, int dv, double scale, const real *k, const real *v, const real *dO,
               const real *P, double *dS, real *gq, bool fresh) {
    extern __shared__ double na_row[];
    double *ds = na_row, *red = na_row + T;
    int64_t r = blockIdx.x, bh = r / T;
    int t = (int)(r % T), b = (int)(bh / H), h = (int)(bh % H), tid = threadIdx.x;
    int64_t ldq = (int64_t)H * dk, ldv = (int64_t)H * dv, row0 = (int64_t)b * T;
    const real *Pt = P + r * T, *dOt = dO + (row0 + t) * ldv + h * dv;
    double rowdot = 0;
    for (int s = tid; s <= t; s += NA_THREADS) {
        double dp = 0;
        if (Pt[s] != 0) {   // else dS_ts = 0 whatever dP_ts
            const real *vs = v + (row0 + s) * ldv + h * dv;
            for (int j = 0; j < dv; j++) dp += (double)dOt[j] * vs[j];
        }
        ds[s] = dp;
        rowdot += Pt[s] * dp;
    }
    rowdot = cu_block_sum(rowdot, red);
    for (int s = tid; s <= t; s += NA_THREADS) {
        ds[s] = Pt[s] * (ds[s] - rowdot);
        if (dS) dS[r * T + s] = ds[s];
    }
    __syncthreads();
    if (!gq) return;
    for (int i = tid; i < dk; i += NA_THREADS) {
        double acc = 0;
        for (int s = 0; s <= t; s++) acc += ds[s] * k[(row0 + s) * ldq + h * dk + i];
        real g = (real)(scale * acc), *p = gq + (row0 + t) * ldq + h * dk + i;
        *p = fresh ? g : *p + g;
    }
}

// One block per key row r = (b H + h) T + s: dk_s = scale sum_{t >= s} dS_ts
// q_t, dv_s = sum_{t >= s} P_ts dO_t (double). gk or gv may be NULL; one
// buffer for both (k and v one tensor) gets dk written first, then dv added.
__global__ void __launch_bounds__(NA_THREADS)
    k_naive_dkv(int T, int H, int dk, int dv, double scale, const real *q, const real *dO, const real *P,
                const double *dS, real *gk, bool fresh_k, real *gv, bool fresh_v) {
    int64_t r = blockIdx.x, bh = r / T;
    int s = (int)(r % T), b = (int)(bh / H), h = (int)(bh % H), tid = threadIdx.x;
    int64_t ldq = (int64_t)H * dk, ldv = (int64_t)H * dv, row0 = (int64_t)b * T;
    const int64_t col = bh * T * T + s;   // (t, s) of this head is col + t T
    if (gk)
        for (int i = tid; i < dk; i += NA_THREADS) {
            double acc = 0;
            for (int t = s; t < T; t++) acc += dS[col + (int64_t)t * T] * q[(row0 + t) * ldq + h * dk + i];
            real g = (real)(scale * acc), *p = gk + (row0 + s) * ldq + h * dk + i;
            *p = fresh_k ? g : *p + g;
        }
    __syncthreads();
    if (gv)
        for (int j = tid; j < dv; j += NA_THREADS) {
            double acc = 0;
            for (int t = s; t < T; t++) acc += (double)P[col + (int64_t)t * T] * dO[(row0 + t) * ldv + h * dv + j];
            real g = (real)acc, *p = gv + (row0 + s) * ldv + h * dv + j;
            *p = fresh_v ? g : *p + g;
        }
}

extern "C" void cu_naive_attn_backward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], H = n->iarg[2], dk = n->iarg[3], dv = n->iarg[4];
    double scale = n->farg[0];
    bool fq = false, fk = false, fv = false;
    real *gq = CU_GRAD_FRESH(n, 0, &fq), *gk = CU_GRAD_FRESH(n, 1, &fk), *gv = CU_GRAD_FRESH(n, 2, &fv);
    int64_t rows = (int64_t)B * H * T;
    if ((!gq && !gk && !gv) || rows == 0) return;
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    const real *dO = n->out[0]->grad, *P = (const real *)n->saved;
    double *dS = gk ? (double *)tape_dalloc(n->tape, (size_t)rows * T * sizeof(double)) : NULL;
    // dq first: when q is also k or v, its gradient is written here (fresh)
    // and added to below.
    if (gq || gk) {
        size_t smem = na_smem(T);
        cu_smem_prepare((const void *)k_naive_dq, smem, "attention_naive backward", dk, dv);
        k_naive_dq<<<(unsigned)rows, NA_THREADS, smem, cu_stream>>>(T, H, dk, dv, scale, k, v, dO, P, dS, gq, fq);
        CU_LAUNCHED();
    }
    if (gk || gv) {
        k_naive_dkv<<<(unsigned)rows, NA_THREADS, 0, cu_stream>>>(T, H, dk, dv, scale, q, dO, P, dS, gk, fk, gv,
                                                                  fv);
        CU_LAUNCHED();
    }
}
