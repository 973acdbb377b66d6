// attn_flash_backward.cu: the backward of op_attention's flash kernels on
// the GPU (attn_flash.c; the tiles and products are attn_flash.cuh's): with
// P = exp(scale Q K^T - lse) recomputed tile by tile,
//   D_t = dO_t . O_t,  dP = dO V^T,  dS = P (dP - D),
//   dQ = scale dS K,  dK = scale dS^T Q,  dV = P^T dO.
//
//   backward: D_t = dO_t . O_t first (double, as the CPU), then two kernels
//     that each recompute P = exp(scale Q K^T - lse) tile by tile (the
//     exponentials in float32 by exp2, log2(e) folded into the scale and
//     lse: fa_exp):
//     dQ per query tile (Q, dO held; looping over key tiles: K, V, dS =
//     P (dO V^T - D) in registers, dS^T to shared memory, dQ += dS K), and
//     dK, dV per key tile (K, V held; looping over the query tiles that see
//     it: Q, dO, S^T and dP^T with the keys as rows, P^T and dS^T to two
//     buffers, one barrier, dV += P^T dO, dK += dS^T Q). Every gradient row
//     is written by one block, so there are no atomics, and every sum runs
//     in a fixed order: a run repeats bit for bit.
#include "attn_flash.cuh"

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

// dQ kernel, shared memory: Q, dO (the block's queries), K, V (the key
// tile's) by rows, dS^T (keys as rows).
static size_t dq_smem(int dk, int dv) {
    return (size_t)FA_B * (2 * fa_ldr(dk) + 2 * fa_ldr(dv) + FA_LDT) * sizeof(real);
}

// grid (B*H, query tiles): dq rows of the tile = scale sum_j dS K_j, written
// (fresh) or added. Scores: queries ra + r, keys tx + c FA_TX.
template <int NG>
__global__ void __launch_bounds__(FA_THREADS, FA_MINB(NG))
    k_flash_dq(FaDims d, const real *q, const real *k, const real *v, const real *dO, const real *lse,
               const real *D, const int *first, real *dq, bool fresh) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    int bh = blockIdx.x, b = bh / d.H, h = bh % d.H;
    int ty = threadIdx.x / FA_TX, tx = threadIdx.x % FA_TX, ra = ty * FA_RM, cb = tx * FA_R;
    int dk = d.dk, dv = d.dv, ngk = fa_groups(dk), ldk_s = fa_ldr(dk), ldv_s = fa_ldr(dv);
    real sc2 = d.scale * FA_LOG2E;   // the scale in fa_exp's units
    int t0 = (gridDim.y - 1 - blockIdx.y) * FA_B, nq = min(FA_B, d.T - t0);
    int64_t ldq = (int64_t)d.H * dk, ldv = (int64_t)d.H * dv, row0 = (int64_t)b * d.T;
    const real *qh = q + row0 * ldq + h * dk, *kh = k + row0 * ldq + h * dk;
    const real *vh = v + row0 * ldv + h * dv, *dOh = dO + row0 * ldv + h * dv;
    const int *fr = first ? first + row0 : NULL;
    real *Qs = (real *)fa_smem, *dOs = Qs + FA_B * ldk_s, *Ks = dOs + FA_B * ldv_s, *Vs = Ks + FA_B * ldk_s;
    real *dST = Vs + FA_B * ldv_s;

    fa_load_rows(Qs, ldk_s, qh, ldq, t0, nq, dk);
    fa_load_rows(dOs, ldv_s, dOh, ldv, t0, nq, dv);
    real acc[NG][FA_RM][FA_R], L[FA_RM], Dr[FA_RM];
    int lo[FA_RM];
#pragma unroll
    for (int r = 0; r < FA_RM; r++) {
        int i = ra + r;
        int64_t row = (int64_t)bh * d.T + t0 + i;
        L[r] = i < nq ? lse[row] * FA_LOG2E : (real)0;   // fa_exp's units
        Dr[r] = i < nq ? D[row] : (real)0;
        lo[r] = i < nq ? fa_lo(fr, t0 + i) : 0;
#pragma unroll
        for (int g = 0; g < NG; g++)
#pragma unroll
            for (int c = 0; c < FA_R; c++) acc[g][r][c] = 0;
    }
    // V of a key tile is loaded behind the previous tile's dS K (which reads
    // dS^T and K only), K at the start of its own.
    int s_end = t0 + nq, s_first = fa_lo(fr, t0);
    fa_load_rows(Vs, ldv_s, vh, ldv, s_first, min(FA_B, s_end - s_first), dv);
    for (int s0 = s_first; s0 < s_end; s0 += FA_B) {
        int nk = min(FA_B, s_end - s0);
        __syncthreads();   // the previous tile's K, dS are read
        fa_load_rows(Ks, ldk_s, kh, ldq, s0, nk, dk);
        fa_cp_wait();
        __syncthreads();
        // dS = P (dP - D), P = exp(scale q.k - lse), dP = dO . v; 0 where unseen.
        real s[FA_RM][FA_R], dp[FA_RM][FA_R];
        fa_tile_rows(s, Qs + ra * ldk_s, ldk_s, Ks + tx * ldk_s, ldk_s, dk);
        fa_tile_rows(dp, dOs + ra * ldv_s, ldv_s, Vs + tx * ldv_s, ldv_s, dv);
#pragma unroll
        for (int r = 0; r < FA_RM; r++)
#pragma unroll
            for (int c = 0; c < FA_R; c++) {
                bool seen = fa_seen(ra + r, tx + c * FA_TX, nq, nk, t0, s0, lo[r]);
                s[r][c] = seen ? fa_exp(sc2 * s[r][c] - L[r]) * (dp[r][c] - Dr[r]) : (real)0;
            }
        fa_store_t(dST + tx * FA_LDT + ra, s);
        __syncthreads();   // V is read: the next tile's may come
        if (s0 + FA_B < s_end) fa_load_rows(Vs, ldv_s, vh, ldv, s0 + FA_B, min(FA_B, s_end - s0 - FA_B), dv);
        // dQ += dS K over the keys this thread's last query sees (as the forward).
        fa_tile_acc<NG>(acc, dST + ra, Ks + cb, ldk_s, 0, min(nk, t0 - s0 + ra + FA_RM), ngk);
    }
    fa_write_acc<NG>(dq + (row0 + t0) * ldq + h * dk, ldq, acc, ra, cb, nq, dk, ngk, d.scale, fresh);
}

// dK, dV kernel, shared memory: K, V (the block's keys), Q, dO (the query
// tile's) by rows, P^T and dS^T (queries as rows); lse, D (FA_B) and lo
// (FA_B ints) of the query tile.
static size_t dkv_smem(int dk, int dv) {
    return ((size_t)FA_B * (2 * fa_ldr(dk) + 2 * fa_ldr(dv) + 2 * FA_LDT) + 2 * FA_B) * sizeof(real) +
           FA_B * sizeof(int);
}

// grid (B*H, key tiles): dk rows of the tile = scale sum_i dS^T Q_i and dv
// rows = sum_i P^T dO_i over the query tiles from the key tile on, up to the
// end of the last key's document. Here a thread's register tile of scores
// has keys as rows (ra + r) and queries as columns (tx + c FA_TX); its
// accumulators have keys ra + r, columns g FA_B + cb + c. dk or dv may be
// NULL (no gradient; D may be NULL when dk is); a tensor passed as both k
// and v gets dk written first, then dv added.
template <int NG>
__global__ void __launch_bounds__(FA_THREADS, FA_MINB(NG))
    k_flash_dkv(FaDims d, const real *q, const real *k, const real *v, const real *dO, const real *lse,
                const real *D, const int *first, real *gk, bool fresh_k, real *gv, bool fresh_v) {
    extern __shared__ __align__(16) unsigned char fa_smem[];
    int bh = blockIdx.x, b = bh / d.H, h = bh % d.H;
    int ty = threadIdx.x / FA_TX, tx = threadIdx.x % FA_TX, ra = ty * FA_RM, cb = tx * FA_R;
    int dk = d.dk, dv = d.dv, ngk = fa_groups(dk), ngv = fa_groups(dv), ldk_s = fa_ldr(dk), ldv_s = fa_ldr(dv);
    real sc2 = d.scale * FA_LOG2E;   // the scale in fa_exp's units
    int s0 = blockIdx.y * FA_B, nk = min(FA_B, d.T - s0), s_last = s0 + nk - 1;
    int64_t ldq = (int64_t)d.H * dk, ldv = (int64_t)d.H * dv, row0 = (int64_t)b * d.T;
    const real *qh = q + row0 * ldq + h * dk, *kh = k + row0 * ldq + h * dk;
    const real *vh = v + row0 * ldv + h * dv, *dOh = dO + row0 * ldv + h * dv;
    const int *fr = first ? first + row0 : NULL;
    real *Ks = (real *)fa_smem, *Vs = Ks + FA_B * ldk_s, *Qs = Vs + FA_B * ldv_s, *dOs = Qs + FA_B * ldk_s;
    real *PT = dOs + FA_B * ldv_s, *dST = PT + FA_B * FA_LDT, *Ls = dST + FA_B * FA_LDT, *Ds = Ls + FA_B;
    int *lo = (int *)(Ds + FA_B);

    fa_load_rows(Ks, ldk_s, kh, ldq, s0, nk, dk);
    fa_load_rows(Vs, ldv_s, vh, ldv, s0, nk, dv);
    real ak[NG][FA_RM][FA_R], av[NG][FA_RM][FA_R];
#pragma unroll
    for (int g = 0; g < NG; g++)
#pragma unroll
        for (int r = 0; r < FA_RM; r++)
#pragma unroll
            for (int c = 0; c < FA_R; c++) ak[g][r][c] = av[g][r][c] = 0;
    // The query tiles start at s0 (earlier queries see none of these keys).
    // The document start lo(t) does not decrease with t: once a tile's first
    // query begins its document after the last key, no later query sees any
    // key of the tile. (fr[...] is the same for every thread: the loop and
    // its barriers are uniform.)
    for (int t0 = s0; t0 < d.T && fa_lo(fr, t0) <= s_last; t0 += FA_B) {
        int nq = min(FA_B, d.T - t0);
        __syncthreads();   // the previous query tile is read
        fa_load_rows(Qs, ldk_s, qh, ldq, t0, nq, dk);
        fa_load_rows(dOs, ldv_s, dOh, ldv, t0, nq, dv);
        for (int i = threadIdx.x; i < FA_B; i += FA_THREADS) {
            int64_t row = (int64_t)bh * d.T + t0 + i;
            Ls[i] = i < nq ? lse[row] * FA_LOG2E : (real)0;   // fa_exp's units
            Ds[i] = i < nq && D ? D[row] : (real)0;
            lo[i] = i < nq ? fa_lo(fr, t0 + i) : 0;
        }
        fa_cp_wait();
        __syncthreads();
        // P^T = exp(scale k.q - lse), 0 where query i does not see key j.
        real p[FA_RM][FA_R];
        fa_tile_rows(p, Ks + ra * ldk_s, ldk_s, Qs + tx * ldk_s, ldk_s, dk);
#pragma unroll
        for (int c = 0; c < FA_R; c++) {
            int i = tx + c * FA_TX;
#pragma unroll
            for (int r = 0; r < FA_RM; r++) {
                bool seen = fa_seen(i, ra + r, nq, nk, t0, s0, lo[i]);
                p[r][c] = seen ? fa_exp(sc2 * p[r][c] - Ls[i]) : (real)0;
            }
        }
        if (gv) fa_store_t(PT + tx * FA_LDT + ra, p);
        if (gk) {   // dS^T = P^T (dP^T - D)
            real dp[FA_RM][FA_R];
            fa_tile_rows(dp, Vs + ra * ldv_s, ldv_s, dOs + tx * ldv_s, ldv_s, dv);
#pragma unroll
            for (int c = 0; c < FA_R; c++) {
                real Di = Ds[tx + c * FA_TX];
#pragma unroll
                for (int r = 0; r < FA_RM; r++) p[r][c] = p[r][c] * (dp[r][c] - Di);
            }
            fa_store_t(dST + tx * FA_LDT + ra, p);
        }
        __syncthreads();
        // Over the queries that see this thread's first key (causal: P^T and
        // dS^T are 0 before query s0 + ra - t0, which is past 0 only in the
        // diagonal tile t0 = s0):
        int x0 = max(0, s0 - t0 + ra);
        if (gv) fa_tile_acc<NG>(av, PT + ra, dOs + cb, ldv_s, x0, nq, ngv);    // dV_j += P^T dO
        if (gk) fa_tile_acc<NG>(ak, dST + ra, Qs + cb, ldk_s, x0, nq, ngk);   // dK_j += dS^T Q (the scale at the end)
    }
    if (gk) fa_write_acc<NG>(gk + (row0 + s0) * ldq + h * dk, ldq, ak, ra, cb, nk, dk, ngk, d.scale, fresh_k);
    __syncthreads();   // gk and gv may be one buffer (k and v one tensor): dk first
    if (gv) fa_write_acc<NG>(gv + (row0 + s0) * ldv + h * dv, ldv, av, ra, cb, nk, dv, ngv, (real)1, fresh_v);
}

template <int NG> static void bwd_launch(const FaDims &d, const real *q, const real *k, const real *v,
                                         const real *dO, const real *lse, const real *D, const int *first, real *gq,
                                         bool fq, real *gk, bool fk, real *gv, bool fv) {
    dim3 grid((unsigned)(d.B * d.H), (unsigned)fa_tiles(&d));
    // dq before dk and dv: when q is also k or v, its gradient is written here
    // (fresh) and added to below.
    if (gq) {
        size_t smem = dq_smem(d.dk, d.dv);
        cu_smem_prepare((const void *)k_flash_dq<NG>, smem, "attention backward", d.dk, d.dv);
        k_flash_dq<NG><<<grid, FA_THREADS, smem, cu_stream>>>(d, q, k, v, dO, lse, D, first, gq, fq);
        CU_LAUNCHED();
    }
    if (gk || gv) {
        size_t smem = dkv_smem(d.dk, d.dv);
        cu_smem_prepare((const void *)k_flash_dkv<NG>, smem, "attention backward", d.dk, d.dv);
        k_flash_dkv<NG><<<grid, FA_THREADS, smem, cu_stream>>>(d, q, k, v, dO, lse, D, first, gk, fk, gv, fv);
        CU_LAUNCHED();
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
    const int *first = cu_first_to_device(n->tape, (const int *)n->aux, d.B, d.T);
    int64_t rows = (int64_t)d.B * d.H * d.T;
    real *D = NULL;
    if (gq || gk) {
        D = (real *)tape_dalloc(n->tape, (size_t)rows * sizeof(real));
        k_flash_rowdot<<<cu_grid(rows), CU_THREADS, 0, cu_stream>>>(d, o, dO, D);
        CU_LAUNCHED();
    }
#ifndef AG_DOUBLE
    if (n->iarg[7]) {   // the forward ran the bf16 kernels (cu_flash_forward)
        cu_flash_bf16_backward(n->tape, d, q, k, v, dO, lse, D, first, gq, fq, gk, fk, gv, fv);
        return;
    }
#endif
    if (fa_one_group(&d))
        bwd_launch<1>(d, q, k, v, dO, lse, D, first, gq, fq, gk, fk, gv, fv);
    else
        bwd_launch<FA_NG>(d, q, k, v, dO, lse, D, first, gq, fq, gk, fk, gv, fv);
}
