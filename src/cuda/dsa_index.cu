// dsa_index.cu: the DeepSeek sparse-attention indexer on the GPU
// (dsa_kernel.h; the CPU's dsa_kernel.c): op_dsa_index_scores, the top-k
// selection fused with the scores in row blocks of bounded memory (the
// top-k itself is dsa_topk.cu's), the distillation target, op_dsa_kl and
// the kept attention mass.
//
// Scores. Tiles of 32 queries x 32 keys, a block of 256 threads: lane tx
// owns key s0 + tx, warp ty the query rows ty + 8 r (r < 4). Per index head
// j, Z = qI_j . kI is summed over dI in chunks of 32 through shared memory
// (one thread per score, the dimensions in order), then
// I += c w_tj ReLU(Z), the heads in order. Backward (Z recomputed per tile):
//   dQ kernel, a block per query tile: per head, per key tile, dZ = c g w [Z > 0]
//   in shared memory, dw_tj += c sum_s g Z [Z > 0] (a warp's fixed tree per
//   tile, the tiles in order, in double as the CPU), dqI_tj += dZ K (one
//   thread per element, the keys in order);
//   dK kernel, a block per key tile: per query tile that sees it, per head,
//   dkI += dZ^T Q.
// Every gradient element is written by one thread in a fixed order: no atomics.
//
// Distillation target. A block per row: p_t. = the heads' mean of
// softmax_s(scale q_t.k_s) over s in [lo(t), t] (the row's scores kept in
// shared memory when they fit), KL(p_t || softmax(I_t)) per row and its
// mean, and the attention mass the selection keeps.
#include <math.h>

#include "dsa_common.cuh"

#define IX_T 32          // queries and keys per tile
#define IX_THREADS 256   // 8 warps
#define IX_ROWS (IX_T / (IX_THREADS / 32))   // query rows per thread: 4

typedef struct IxDims {
    int T, HI, dI;
    real c;   // 1 / sqrt(dI)
} IxDims;

// ---------------------------------------------------------------- scores

// z[r] = qI_(t, j) . kI_s for the thread's rows t = tq0 + ty + 8 r and key
// s = s0 + tx of the tile (0 outside nq x ns). All threads; begins with a barrier.
__device__ __forceinline__ void ix_tile_z(real z[IX_ROWS], const real *qI, const real *kI, int64_t rb, int tq0,
                                          int nq, int s0, int ns, int j, const IxDims &d, real (*Qs)[IX_T + 1],
                                          real (*Ks)[IX_T + 1]) {
    int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < IX_ROWS; r++) z[r] = 0;
    for (int d0 = 0; d0 < d.dI; d0 += IX_T) {
        int nd = min(IX_T, d.dI - d0);
        __syncthreads();   // the previous chunk (or the caller's use of the tiles) is done
        for (int e = threadIdx.x; e < IX_T * IX_T; e += IX_THREADS) {
            int i = e / IX_T, x = e % IX_T;
            Qs[i][x] = i < nq && x < nd ? qI[((rb + tq0 + i) * d.HI + j) * d.dI + d0 + x] : (real)0;
            Ks[i][x] = i < ns && x < nd ? kI[(rb + s0 + i) * d.dI + d0 + x] : (real)0;
        }
        __syncthreads();
        for (int x = 0; x < nd; x++) {
            real kv = Ks[tx][x];
#pragma unroll
            for (int r = 0; r < IX_ROWS; r++) z[r] = fma(Qs[ty + 8 * r][x], kv, z[r]);
        }
    }
}

// grid (key tiles, query tiles of rows t_begin .. t_begin+nt, nb batch rows
// from b0). out: (nb, nt, T). full: every entry of the rows is written (0
// outside [lo(t), t]); else only the tiles that hold candidates are (the
// top-k reads [lo(t), t] only).
__global__ void __launch_bounds__(IX_THREADS)
    k_ix_scores(IxDims d, const real *qI, const real *kI, const real *w, const int *first, real *out, int b0,
                int t_begin, int nt, bool full) {
    __shared__ real Qs[IX_T][IX_T + 1], Ks[IX_T][IX_T + 1];
    int b = b0 + blockIdx.z, tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    int tq0 = t_begin + blockIdx.y * IX_T, nq = min(IX_T, t_begin + nt - tq0);
    int s0 = blockIdx.x * IX_T, ns = min(IX_T, d.T - s0);
    int64_t rb = (int64_t)b * d.T;
    real *ob = out + ((int64_t)blockIdx.z * nt + (tq0 - t_begin)) * d.T;
    // Documents begin in order, so the tile's first row has the earliest lo.
    bool skip = s0 > tq0 + nq - 1 || s0 + ns <= dsa_lo(first, rb + tq0);
    if (skip && !full) return;
    real acc[IX_ROWS];
#pragma unroll
    for (int r = 0; r < IX_ROWS; r++) acc[r] = 0;
    if (!skip)
        for (int j = 0; j < d.HI; j++) {
            real z[IX_ROWS];
            ix_tile_z(z, qI, kI, rb, tq0, nq, s0, ns, j, d, Qs, Ks);
#pragma unroll
            for (int r = 0; r < IX_ROWS; r++) {
                int i = ty + 8 * r;
                if (i < nq) {
                    real wt = w[(rb + tq0 + i) * d.HI + j];
                    acc[r] += z[r] > 0 ? d.c * wt * z[r] : (real)0;
                }
            }
        }
#pragma unroll
    for (int r = 0; r < IX_ROWS; r++) {
        int i = ty + 8 * r, t = tq0 + i, s = s0 + tx;
        if (i >= nq || tx >= ns) continue;
        bool in = dsa_seen(first, rb, t, s);
        if (in || full) ob[(int64_t)i * d.T + s] = in ? acc[r] : (real)0;
    }
}

// grid (query tiles, B): dqI and dw of the tile's rows (written when fresh, else added).
__global__ void __launch_bounds__(IX_THREADS)
    k_ix_dq(IxDims d, const real *qI, const real *kI, const real *w, const real *g, const int *first, real *gq,
            bool fq, real *gw, bool fw) {
    __shared__ real Qs[IX_T][IX_T + 1], Ks[IX_T][IX_T + 1], DZ[IX_T][IX_T + 1];
    int b = blockIdx.y, tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    int tq0 = blockIdx.x * IX_T, nq = min(IX_T, d.T - tq0);
    int64_t rb = (int64_t)b * d.T;
    int s_begin = dsa_lo(first, rb + tq0) / IX_T * IX_T, s_end = tq0 + nq;
    for (int j = 0; j < d.HI; j++) {
        double dw[IX_ROWS];
#pragma unroll
        for (int r = 0; r < IX_ROWS; r++) dw[r] = 0;
        for (int s0 = s_begin; s0 < s_end; s0 += IX_T) {
            int ns = min(IX_T, d.T - s0);
            real z[IX_ROWS];
            ix_tile_z(z, qI, kI, rb, tq0, nq, s0, ns, j, d, Qs, Ks);
#pragma unroll
            for (int r = 0; r < IX_ROWS; r++) {
                int i = ty + 8 * r, t = tq0 + i, s = s0 + tx;
                bool in = i < nq && tx < ns && dsa_seen(first, rb, t, s);
                real gv = in ? g[(rb + t) * d.T + s] : (real)0;
                bool on = in && z[r] > 0;
                double part = on ? (double)gv * z[r] : 0.0;
                part = warp_sum(part);
                dw[r] += part;
                DZ[i][tx] = on ? d.c * w[(rb + t) * d.HI + j] * gv : (real)0;
            }
            __syncthreads();
            if (gq)
                for (int e = threadIdx.x; e < IX_T * d.dI; e += IX_THREADS) {
                    int i = e / d.dI, x = e % d.dI;
                    if (i >= nq) continue;
                    real acc = 0;
                    for (int c = 0; c < ns; c++) acc = fma(DZ[i][c], kI[(rb + s0 + c) * d.dI + x], acc);
                    real *p = gq + ((rb + tq0 + i) * d.HI + j) * d.dI + x;
                    *p = s0 == s_begin && fq ? acc : *p + acc;
                }
            // (the next ix_tile_z begins with a barrier: DZ is read before it is rewritten)
        }
        if (gw && tx == 0)
#pragma unroll
            for (int r = 0; r < IX_ROWS; r++) {
                int i = ty + 8 * r;
                if (i >= nq) continue;
                real *p = gw + (rb + tq0 + i) * d.HI + j, v = (real)(d.c * dw[r]);
                *p = fw ? v : *p + v;
            }
    }
}

// grid (key tiles, B): dkI of the tile's keys, over every query tile that
// sees one of them, the query tiles and the heads in order.
__global__ void __launch_bounds__(IX_THREADS)
    k_ix_dk(IxDims d, const real *qI, const real *kI, const real *w, const real *g, const int *first, real *gk,
            bool fk) {
    __shared__ real Qs[IX_T][IX_T + 1], Ks[IX_T][IX_T + 1], DZ[IX_T][IX_T + 1];
    int b = blockIdx.y, tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    int s0 = blockIdx.x * IX_T, ns = min(IX_T, d.T - s0);
    int64_t rb = (int64_t)b * d.T;
    bool first_pass = true;
    for (int tq0 = s0; tq0 < d.T; tq0 += IX_T) {
        // Every later row's document begins at or after this row's: none sees the tile.
        if (dsa_lo(first, rb + tq0) > s0 + ns - 1) break;
        int nq = min(IX_T, d.T - tq0);
        for (int j = 0; j < d.HI; j++) {
            real z[IX_ROWS];
            ix_tile_z(z, qI, kI, rb, tq0, nq, s0, ns, j, d, Qs, Ks);
#pragma unroll
            for (int r = 0; r < IX_ROWS; r++) {
                int i = ty + 8 * r, t = tq0 + i, s = s0 + tx;
                bool in = i < nq && tx < ns && dsa_seen(first, rb, t, s);
                real gv = in ? g[(rb + t) * d.T + s] : (real)0;
                DZ[i][tx] = in && z[r] > 0 ? d.c * w[(rb + t) * d.HI + j] * gv : (real)0;
            }
            __syncthreads();
            for (int e = threadIdx.x; e < IX_T * d.dI; e += IX_THREADS) {
                int c = e / d.dI, x = e % d.dI;
                if (c >= ns) continue;
                real acc = 0;
                for (int i = 0; i < nq; i++) acc = fma(DZ[i][c], qI[((rb + tq0 + i) * d.HI + j) * d.dI + x], acc);
                real *p = gk + (rb + s0 + c) * d.dI + x;
                *p = first_pass && fk ? acc : *p + acc;
            }
            first_pass = false;
        }
    }
}

static IxDims ix_dims(int T, int HI, int dI) {
    IxDims d = {T, HI, dI, (real)(1.0 / sqrt((double)dI))};
    return d;
}

// Scores of rows t_begin .. t_begin+nt of nb batch rows from b0 into out (nb, nt, T).
static void ix_scores(real *out, const real *qI, const real *kI, const real *w, const int *first, int b0, int nb,
                      int t_begin, int nt, int T, int HI, int dI, bool full) {
    ASSERT(nb <= 65535, "dsa_index_scores: %d batch rows exceed the GPU grid", nb);
    int key_end = full ? T : t_begin + nt;   // only full rows need the zeros after the last query
    dim3 grid((unsigned)((key_end + IX_T - 1) / IX_T), (unsigned)((nt + IX_T - 1) / IX_T), (unsigned)nb);
    k_ix_scores<<<grid, IX_THREADS, 0, cu_stream>>>(ix_dims(T, HI, dI), qI, kI, w, first, out, b0, t_begin, nt,
                                                    full);
    CU_LAUNCHED();
}

// iarg: 0 B, 1 T, 2 HI, 3 dI. aux: first (B, T) on the host, or NULL.
extern "C" void cu_dsa_index_forward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], HI = n->iarg[2], dI = n->iarg[3];
    if ((int64_t)B * T == 0) return;
    const int *first = cu_first_to_device(n->tape, (const int *)n->aux, B, T);
    ix_scores(n->out[0]->data, n->in[0]->data, n->in[1]->data, n->in[2]->data, first, 0, B, 0, T, T, HI, dI, true);
}

extern "C" void cu_dsa_index_backward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], HI = n->iarg[2], dI = n->iarg[3];
    bool fq = false, fk = false, fw = false;
    real *gq = CU_GRAD_FRESH(n, 0, &fq), *gk = CU_GRAD_FRESH(n, 1, &fk), *gw = CU_GRAD_FRESH(n, 2, &fw);
    if ((!gq && !gk && !gw) || (int64_t)B * T == 0) return;
    ASSERT(B <= 65535, "dsa_index_scores backward: %d batch rows exceed the GPU grid", B);
    const int *first = cu_first_to_device(n->tape, (const int *)n->aux, B, T);
    const real *qI = n->in[0]->data, *kI = n->in[1]->data, *w = n->in[2]->data, *g = n->out[0]->grad;
    IxDims d = ix_dims(T, HI, dI);
    dim3 grid((unsigned)((T + IX_T - 1) / IX_T), (unsigned)B);
    // dq and dw first, then dk: a tensor passed as two inputs gets its fresh
    // write from the first kernel and the add from the second.
    if (gq || gw) {
        k_ix_dq<<<grid, IX_THREADS, 0, cu_stream>>>(d, qI, kI, w, g, first, gq, fq, gw, fw);
        CU_LAUNCHED();
    }
    if (gk) {
        k_ix_dk<<<grid, IX_THREADS, 0, cu_stream>>>(d, qI, kI, w, g, first, gk, fk);
        CU_LAUNCHED();
    }
}

// The scores in blocks of rows (at most SELECT_CHUNK reals of scratch: whole
// batch rows when T^2 fits, else runs of query rows of one batch row), each
// block's top-k after it. The scratch is reused: the stream orders the blocks.
extern "C" void cu_dsa_index_select(Tape *tp, int *sel, const real *qI, const real *kI, const real *w, int B, int T,
                                    int HI, int dI, int K, const int *first) {
    ASSERT(K >= 1, "dsa_index_select: K = %d", K);
    if ((int64_t)B * T == 0) return;
    int64_t per_batch = (int64_t)T * T;
    int nb = per_batch <= SELECT_CHUNK ? (int)imin(B, (int)(SELECT_CHUNK / per_batch)) : 1;
    if (nb > 65535) nb = 65535;
    int nt = nb > 1 || per_batch <= SELECT_CHUNK ? T : (int)imax(IX_T, (int)(SELECT_CHUNK / T / IX_T * IX_T));
    real *scratch = (real *)tape_dalloc(tp, (size_t)nb * nt * T * sizeof(real));
    for (int b0 = 0; b0 < B; b0 += nb) {
        int bn = imin(nb, B - b0);
        for (int t0 = 0; t0 < T; t0 += nt) {
            int tn = imin(nt, T - t0);
            ix_scores(scratch, qI, kI, w, first, b0, bn, t0, tn, T, HI, dI, false);
            topk_rows(sel, scratch, T, T, K, first, b0, bn, t0, tn);
        }
    }
}

// ---------------------------------------------------------------- distillation target, KL, mass

// scale q . k_s over dk (one thread, the dimensions in order).
__device__ __forceinline__ real at_score(const real *qs, const real *ks, int dk, real scale) {
    real acc = 0;
    for (int x = 0; x < dk; x++) acc = fma(qs[x], ks[x], acc);
    return acc * scale;
}

// A block per row r = (b, t): p_t = (1/H) sum_h softmax over [lo(t), t] of
// scale q_t^h . k_s^h, 0 elsewhere; the heads in order, each entry written
// by one thread. Dynamic shared memory: q_t^h (dk), then the row's scores
// (T) when `cached` (else they are recomputed in each pass).
__global__ void __launch_bounds__(DSA_THREADS)
    k_attn_target(const real *q, const real *k, const int *first, int T, int H, int dk, real scale, bool cached,
                  real *p) {
    extern __shared__ __align__(16) unsigned char at_smem[];
    real *qs = (real *)at_smem, *Ss = qs + dk;
    __shared__ real shr[32];
    __shared__ double shd[32];
    int64_t r = blockIdx.x, b = r / T, ld = (int64_t)H * dk;
    int t = (int)(r % T), lo = dsa_lo(first, r), tid = threadIdx.x;
    real *pr = p + r * T;
    for (int h = 0; h < H; h++) {
        __syncthreads();   // qs (and Ss) of the previous head are read
        for (int x = tid; x < dk; x += DSA_THREADS) qs[x] = q[r * ld + h * dk + x];
        __syncthreads();
        const real *kh = k + b * T * ld + h * dk;
        real mx = -INFINITY;
        for (int s = lo + tid; s <= t; s += DSA_THREADS) {
            real acc = at_score(qs, kh + (int64_t)s * ld, dk, scale);
            if (cached) Ss[s] = acc;
            mx = acc > mx ? acc : mx;
        }
        mx = cu_block_max(mx, shr);
#define AT_S(s) (cached ? Ss[s] : at_score(qs, kh + (int64_t)(s) * ld, dk, scale))
        double sum = 0;
        for (int s = lo + tid; s <= t; s += DSA_THREADS) sum += exp((double)AT_S(s) - (double)mx);
        sum = cu_block_sum(sum, shd);
        double inv = 1.0 / (sum * H);
        for (int s = tid; s < T; s += DSA_THREADS) {
            real v = s >= lo && s <= t ? (real)(exp((double)AT_S(s) - (double)mx) * inv) : (real)0;
            pr[s] = h == 0 ? v : pr[s] + v;
        }
#undef AT_S
    }
}

extern "C" void cu_dsa_attn_target(real *p, const real *q, const real *k, int B, int T, int H, int dk, double scale,
                                   const int *first) {
    int64_t rows = (int64_t)B * T;
    if (rows == 0) return;
    size_t smem = (size_t)(dk + T) * sizeof(real);
    bool cached = smem <= SMEM_CACHE_BYTES;
    if (!cached) smem = (size_t)dk * sizeof(real);
    ASSERT(smem <= SMEM_CACHE_BYTES, "dsa_attn_target: head dim dk %d is too large for the GPU kernel", dk);
    k_attn_target<<<(unsigned)rows, DSA_THREADS, smem, cu_stream>>>(q, k, first, T, H, dk, (real)scale, cached, p);
    CU_LAUNCHED();
}

// A block per row: the row's KL over [lo(t), t] (double) into row_loss, its
// log-sum-exp into lse (when not NULL).
__global__ void __launch_bounds__(DSA_THREADS)
    k_kl_fwd(const real *I, const real *p, const int *first, int T, double *row_loss, real *lse_out) {
    __shared__ real shr[32];
    __shared__ double shd[32];
    int64_t r = blockIdx.x;
    int t = (int)(r % T), lo = dsa_lo(first, r), tid = threadIdx.x;
    const real *Ir = I + r * T, *pr = p + r * T;
    real mx = -INFINITY;
    for (int s = lo + tid; s <= t; s += DSA_THREADS) mx = Ir[s] > mx ? Ir[s] : mx;
    mx = cu_block_max(mx, shr);
    double sum = 0;
    for (int s = lo + tid; s <= t; s += DSA_THREADS) sum += exp((double)Ir[s] - (double)mx);
    sum = cu_block_sum(sum, shd);
    double lse = (double)mx + log(sum), kl = 0;
    for (int s = lo + tid; s <= t; s += DSA_THREADS)
        if (pr[s] > 0) kl += (double)pr[s] * (log((double)pr[s]) - ((double)Ir[s] - lse));
    kl = cu_block_sum(kl, shd);
    if (tid == 0) {
        row_loss[r] = kl;
        if (lse_out) lse_out[r] = (real)lse;
    }
}

// iarg: 0 B, 1 T; aux: first (host) or NULL; saved: lse (B*T) or NULL.
extern "C" void cu_dsa_kl_forward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1];
    int64_t rows = (int64_t)B * T;
    double *row_loss = (double *)tape_dalloc(n->tape, (size_t)(rows > 0 ? rows : 1) * sizeof(double));
    if (rows > 0) {
        const int *first = cu_first_to_device(n->tape, (const int *)n->aux, B, T);
        k_kl_fwd<<<(unsigned)rows, DSA_THREADS, 0, cu_stream>>>(n->in[0]->data, n->in[1]->data, first, T, row_loss,
                                                               (real *)n->saved);
        CU_LAUNCHED();
    }
    k_dsa_mean<<<1, 1024, 0, cu_stream>>>(row_loss, rows, n->out[0]->data);
    CU_LAUNCHED();
}

// A block per row: gI_ts = g (softmax(I_t)_s m_t - p_ts) on [lo(t), t], m_t = sum_s p_ts;
// 0 elsewhere when fresh (else nothing is added there).
__global__ void __launch_bounds__(DSA_THREADS)
    k_kl_bwd(const real *I, const real *p, const real *lse, const int *first, int T, double inv_rows,
             const real *gout, real *gI, bool fresh) {
    __shared__ double shd[32];
    int64_t r = blockIdx.x;
    int t = (int)(r % T), lo = dsa_lo(first, r), tid = threadIdx.x;
    const real *Ir = I + r * T, *pr = p + r * T;
    double g = (double)gout[0] * inv_rows, mass = 0;
    for (int s = lo + tid; s <= t; s += DSA_THREADS) mass += pr[s];
    mass = cu_block_sum(mass, shd);
    real *gr = gI + r * T;
    for (int s = tid; s < T; s += DSA_THREADS) {
        if (s >= lo && s <= t) {
            real v = (real)(g * (exp((double)(Ir[s] - lse[r])) * mass - pr[s]));
            gr[s] = fresh ? v : gr[s] + v;
        } else if (fresh) {
            gr[s] = 0;
        }
    }
}

extern "C" void cu_dsa_kl_backward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1];
    bool fresh = false;
    real *gI = CU_GRAD_FRESH(n, 0, &fresh);
    int64_t rows = (int64_t)B * T;
    if (!gI || rows == 0) return;
    const int *first = cu_first_to_device(n->tape, (const int *)n->aux, B, T);
    k_kl_bwd<<<(unsigned)rows, DSA_THREADS, 0, cu_stream>>>(n->in[0]->data, n->in[1]->data, (const real *)n->saved,
                                                           first, T, 1.0 / (double)rows, n->out[0]->grad, gI, fresh);
    CU_LAUNCHED();
}

// out[0] = mean over rows of sum_j p[r, sel_rj] (one block, a fixed order).
__global__ void __launch_bounds__(1024) k_sel_mass(const real *p, const int *sel, int64_t rows, int T, int K,
                                                   double *out) {
    __shared__ double shd[32];
    double acc = 0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
        for (int j = 0; j < K; j++) {
            int s = sel[r * K + j];
            if (s >= 0) acc += p[r * T + s];
        }
    acc = cu_block_sum(acc, shd);
    if (threadIdx.x == 0) out[0] = rows > 0 ? acc / (double)rows : 0.0;
}

extern "C" void cu_dsa_selected_mass(double *out, const real *p, const int *sel, int B, int T, int K) {
    k_sel_mass<<<1, 1024, 0, cu_stream>>>(p, sel, (int64_t)B * T, T, K, out);
    CU_LAUNCHED();
}
