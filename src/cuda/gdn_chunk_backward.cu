// gdn_chunk_backward.cu: the backward of op_gdn's chunked (WY) form on the
// GPU, following gdn_chunk_backward.c (whose header states the math):
// chunks in reverse, each from the state S0 that entered it, with dS the
// gradient of the state leaving it; through the solve Tm = (I + A)^-1,
// Delta = Tm R, R = Xu - Xw S0:
//   dR = Tm^T dDelta,  dXw = -dR S0^T,  dS0 -= Xw^T dR,  dA = -dR Delta^T,
// every decay factor's derivative on dGamma, dg_m = sum_{i >= m} dGamma_i.
// Three launches: 1. per chunk, W and the terms that do not go through the
// state (k_gdn_bwd_prep); 2. the scan across chunks in reverse (gdn_scan.cu),
// dDelta and the states' gradients; 3. per chunk, the input gradients
// (k_gdn_bwd_chunk, chunk_back). Also where every GDN backward's gradients
// go (GdnGrads). gdn_common.cuh has the plan of both passes.
// chunk_back is 129 lines, over the house's 120: it is gdn_chunk_backward.c's
// chunk step line for line, whose order the comments follow; cut in two, the
// halves would pass most of ChunkWs's pointers and the chunk's state between
// them (the kernel already spills those, see GDN_CHUNK_MINB).
#include "gdn_chunk.cuh"

#ifndef GDN_STAGE_IN
#define GDN_STAGE_IN 1
#endif

// ---------------------------------------------------------------- chunked form: backward

// 1. Per chunk: ek and bl as in the forward; P into its rows for step 3;
// with dO, the terms of dDelta and of the entering state's gradient that do
// not go through the state: P^T dO into the op's dDelta rows, Q^T diag(b) dO
// into the chunk's dS slot.
// (SM: the workspace's first a.ws_shared bytes in shared memory, gdn_chunk.cuh.)
template <bool BF, bool SM> __global__ void __launch_bounds__(GDN_NT, SM ? 1 : GDN_MINB) k_gdn_bwd_prep(GdnArgs a) {
    __shared__ Tiles sh;
    extern __shared__ __align__(16) unsigned char ws_sh[];
    int tid = threadIdx.x, dk = a.dk, dv = a.dv;
    int64_t SS = (int64_t)dk * dv;
    ChunkWs w;
    chunk_ws_layout(&w, a.ws + (size_t)blockIdx.x * a.ws_stride, a.Cw, dk, dv, true, ws_sh, SM ? a.ws_shared : 0);
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int L = m.L;
        int64_t r = m.bh * a.T + m.t0;
        w.P = a.Pb ? a.Pb + r * a.Cw : NULL;   // (no P without dO)
        chunk_prepare<BF>(a, w, &sh, chunk_in(a, m.b, m.h, m.t0), m.b, m.h, m.t0, L, a.dout ? PREP_P : 0);
        for (int i = tid; i < L; i += GDN_NT) a.ekb[r + i] = w.ek[i];
        if (tid == 0) a.blb[m.bh * a.NC + m.c] = w.bm[L - 1];
        if (a.dout) {
            int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * dk;
            const real *dO = a.dout + ((int64_t)m.b * a.T + m.t0) * a.ldv + (int64_t)m.h * dv;
            blk_mm<BF>(&sh, true, false, L, dv, L, 1, w.P, L, dO, a.ldv, 0, a.Ub + r * dv, dv);   // P^T dO
            scale_rows(w.Y, dO, a.ldv, L, dv, [&](int i) { return w.bm[i]; });   // dY = diag(b) dO
            __syncthreads();
            blk_mm<BF>(&sh, true, false, dk, dv, L, 1, a.q + ok, a.ldk, w.Y, dv, 0, a.dsb + (m.bh * a.NC + m.c) * SS,
                     dv);   // Q^T dY
        }
        __syncthreads();   // the next chunk rewrites ek and bm
    }
}

// 2. The scan: k_gdn_bwd_scan (gdn_scan.cu).

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
// its workspace filled by chunk_prepare (the decays, KK, A) and w's W, U, Dl,
// Tm and P bound to the op's rows, less what the scan did (dDelta and the
// entering state's gradient): from w.dS (the gradient of the state
// leaving the chunk), w.dDl and the chunk's rows of dO, writes the chunk's
// rows of the wanted gradients. All threads; ends with a barrier. `red`:
// GDN_NT doubles of shared memory. Elementwise steps spread (row, column)
// over the threads; a row's dot products are one warp's (warp_dot's order),
// and a row's dGamma and dbeta terms are added by the lane 0 of the warp
// that owns the row (x mod GDN_NW), in the CPU's order of the terms; the
// (L, L) dGamma terms are summed by rows (lower_row_sums) and by columns
// (lower_col_sums); dg is the suffix sum of dGamma (warp0_cumsum).
template <bool BF>
__device__ void chunk_back(const GdnArgs &a, ChunkWs &w, Tiles *sh, double *red, const ChunkIn &in, int b, int h,
                           int t0, int L, const real *S0) {
    int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, dk = a.dk, dv = a.dv, H = a.H, ldk = a.ldk,
        ldv = a.ldv, ik = in.ldk, iv = in.ldv;   // ldk, ldv: the gradients'; ik, iv: in's rows'
    int64_t SS = (int64_t)dk * dv;
    int64_t ok = ((int64_t)b * a.T + t0) * ldk + (int64_t)h * dk;
    int64_t ov = ((int64_t)b * a.T + t0) * ldv + (int64_t)h * dv;
    int64_t oh = ((int64_t)b * a.T + t0) * H + h;
    const real *q = in.q, *k = in.k, *v = in.v, *dO = in.dO;
    real *gq = a.gq ? a.gq + ok : NULL;
    real bl = w.bm[L - 1];

    // S_C = b_{L-1} S0 + Kd^T Delta.
    double s = 0;
    for (int64_t e = tid; e < SS; e += GDN_NT) s += (double)w.dS[e] * S0[e];
    s = cu_block_sum(s, red);
    // dKd = Delta dS^T (in dW); dK = diag(ek) dKd.
    // (float32 under bf16 too, with dW below: the scan's products' counterparts.)
    blk_gemm(sh, false, true, L, dk, dv, 1, w.Dl, dv, w.dS, dv, 0, w.dW, dk);
    for (int e = tid; e < L * dk; e += GDN_NT) w.dK[e] = w.ek[e / dk] * w.dW[e];
    // dGamma_j -= ek_j dKd_j . k_j, and those terms add to dGamma_{L-1}
    // (exp(Gamma_{L-1} - Gamma_{L-1}) = 1 has no derivative): after
    // b_{L-1} S0 . dS, in the order of j, below.
    for (int j = warp; j < L; j += GDN_NW) {
        double sj = j == L - 1 ? 0 : (double)(w.ek[j] * (real)warp_dot(w.dW + j * dk, k + (int64_t)j * ik, dk));
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
        blk_mm<BF>(sh, false, false, L, dv, dk, 1, q, ik, S0, dv, 0, w.Y, dv);   // Y = Q S0
        for (int i = warp; i < L; i += GDN_NW) {   // dGamma_i += b_i dO_i . Y_i; then Y = dY = diag(b) dO
            real bi = w.bm[i], *yi = w.Y + i * dv;
            const real *doi = dO + (int64_t)i * iv;
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
        if (gq) blk_mm<BF>(sh, false, true, L, dk, dv, 1, w.Y, dv, S0, dv, 0, gq, ldk);   // dQ = dY S0^T
        blk_mm<BF>(sh, false, true, L, L, dv, 1, dO, iv, w.Dl, dv, 0, w.dA, L);          // dP = dO Delta^T
        // f_ij = dP_ij P_ij (j < i) adds to dG_i and leaves dG_j.
        lower_row_sums(w.dA, w.P, NULL, NULL, L, w.rsum, NULL);
        lower_col_sums(w.dA, w.P, L, w.rsum, w.dG, red);
        for (int e = tid; e < L * L; e += GDN_NT) {   // dQK = dP * E, lower with the diagonal
            int i = e / L, j = e % L;
            w.dA[e] = j <= i ? w.dA[e] * w.E[e] : (real)0;
        }
        __syncthreads();
        if (gq) blk_mm<BF>(sh, false, false, L, dk, L, 1, w.dA, L, k, ik, 1, gq, ldk);   // dQ += dQK K
        blk_mm<BF>(sh, true, false, L, dk, L, 1, w.dA, L, q, ik, 1, w.dK, dk);            // dK += dQK^T Q
    } else if (gq) {
        for (int e = tid; e < L * dk; e += GDN_NT) gq[(int64_t)(e / dk) * ldk + e % dk] = 0;
    }

    // Delta = U - W S0: dU = dDelta, dW = -dDelta S0^T.
    blk_gemm(sh, false, true, L, dk, dv, -1, w.dDl, dv, S0, dv, 0, w.dW, dk);
    // W = Tm Xw, U = Tm Xu: dXw = Tm^T dW, dXu = Tm^T dU, dA = -(dXw W^T + dXu U^T).
    blk_mm<BF>(sh, true, false, L, dk, L, 1, w.Tm, L, w.dW, dk, 0, w.dXw, dk);
    blk_mm<BF>(sh, true, false, L, dv, L, 1, w.Tm, L, w.dDl, dv, 0, w.dXu, dv);
    blk_mm<BF>(sh, false, true, L, L, dk, -1, w.dXw, dk, w.W, dk, 0, w.dA, L);
    blk_mm<BF>(sh, false, true, L, L, dv, -1, w.dXu, dv, w.U, dv, 1, w.dA, L);

    // Xw_i = beta_i b_i k_i, Xu_i = beta_i v_i (a warp per row).
    for (int i = warp; i < L; i += GDN_NW) {
        real bi = w.bm[i], bt = w.bet[i], sw = bt * bi;
        const real *dxw = w.dXw + i * dk, *dxu = w.dXu + i * dv, *ki = k + (int64_t)i * ik;
        const real *vi = v + (int64_t)i * iv;
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
    blk_mm<BF>(sh, false, false, L, dk, L, 1, w.dA, L, k, ik, 1, w.dK, dk);   // dK += dKK K
    blk_mm<BF>(sh, true, false, L, dk, L, 1, w.dA, L, k, ik, 1, w.dK, dk);    // dK += dKK^T K

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

// The chunk's rows of k, q, v and dO (in: where they lie in the op's
// inputs) into shared memory at buf (Cw dk reals of k, then of q, then Cw
// dv of v, then of dO), by cp.async, 16 bytes a copy where every row starts
// 16-byte aligned, else a real a copy; returns in with its pointers there.
// Waits for the copies and ends with a barrier (the caller's previous chunk
// is done with buf).
__device__ ChunkIn stage_in(const GdnArgs &a, const ChunkIn &in, real *buf, int L) {
    int dk = a.dk, dv = a.dv;
    ChunkIn s = in;
    real *ks = buf, *qs = buf + (size_t)a.Cw * dk, *vs = qs + (size_t)a.Cw * dk, *ds = vs + (size_t)a.Cw * dv;
    const real *src[4] = {in.k, in.q, in.v, in.dO};
    real *dst[4] = {ks, qs, vs, ds};
    int n = in.dO ? 4 : 3;
    for (int x = 0; x < n; x++) {
        int d = x < 2 ? dk : dv, ld = x < 2 ? in.ldk : in.ldv;
        bool vec = (((uintptr_t)src[x] | (uintptr_t)ld * sizeof(real) | (uintptr_t)d * sizeof(real)) & 15) == 0;
        if (vec) {
            int per = d * (int)sizeof(real) / 16;   // 16-byte pieces a row
            for (int e = threadIdx.x; e < L * per; e += GDN_NT) {
                int i = e / per, c = e % per;
                cu_cp16((unsigned char *)(dst[x] + (size_t)i * d) + 16 * c,
                        (const unsigned char *)(src[x] + (int64_t)i * ld) + 16 * c, 16);
            }
        } else {
            for (int e = threadIdx.x; e < L * d; e += GDN_NT)
                cu_cp1(dst[x] + e, src[x] + (int64_t)(e / d) * ld + e % d);
        }
    }
    cu_cp_commit();
    cu_cp_wait<0>();
    __syncthreads();
    s.k = ks, s.q = qs, s.v = vs, s.dO = in.dO ? ds : NULL;
    s.ldk = dk, s.ldv = dv;
    return s;
}

// 3. Per chunk: the decays, K K^T and A again (W, U, Delta and Tm from the
// forward's rows, P from step 1's) and its input gradients from S0, dS (the
// scan's slot) and dDelta (the scan's rows). With a.in_shared, the chunk's
// rows of k, q, v and dO are read from a copy in shared memory after the
// workspace's part there (stage_in): the same values, the same arithmetic.
template <bool BF, bool SM>
__global__ void __launch_bounds__(GDN_NT, SM ? 1 : GDN_CHUNK_MINB) k_gdn_bwd_chunk(GdnArgs a) {
    __shared__ Tiles sh;
    __shared__ double red[GDN_NT];
    extern __shared__ __align__(16) unsigned char ws_sh[];
    int64_t SS = (int64_t)a.dk * a.dv;
    ChunkWs w;
    chunk_ws_layout(&w, a.ws + (size_t)blockIdx.x * a.ws_stride, a.Cw, a.dk, a.dv, true, ws_sh, SM ? a.ws_shared : 0);
    real *buf = SM && a.in_shared ? (real *)(ws_sh + a.ws_shared) : NULL;
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        ChunkIn in = chunk_in(a, m.b, m.h, m.t0);
        if (buf) in = stage_in(a, in, buf, m.L);
        int64_t r = m.bh * a.T + m.t0;
        w.W = a.Wb + r * a.dk, w.U = a.Usv + r * a.dv, w.Dl = a.Dsv + r * a.dv;
        w.Tm = a.Tmb + r * a.Cw, w.P = a.Pb ? a.Pb + r * a.Cw : NULL;
        w.dDl = a.Ub + r * a.dv;
        w.dS = a.dsb + (m.bh * a.NC + m.c) * SS;
        const real *S0 = a.states + (m.bh * a.NC + m.c) * SS;
        chunk_prepare<BF>(a, w, &sh, in, m.b, m.h, m.t0, m.L, PREP_A);
        chunk_back<BF>(a, w, &sh, red, in, m.b, m.h, m.t0, m.L, S0);
    }
}

// ---------------------------------------------------------------- gradients out

// (GdnGrads, gdn_common.cuh.)

void gdn_grads_plan(Node *n, GdnGrads *gr, GdnArgs *a) {
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

void gdn_grads_finish(const GdnGrads *gr) {
    for (int i = 0; i < GDN_N_IN; i++) {
        if (!gr->tmp[i] || gr->n[i] == 0) continue;
        k_gdn_put<<<cu_grid(gr->n[i]), CU_THREADS, 0, cu_stream>>>(gr->dst[i], gr->tmp[i], gr->n[i], gr->fresh[i]);
        CU_LAUNCHED();
    }
}

// The backward's kernels of one precision (BF: bf16 products, as the
// forward's) and workspace (SMP for the first, SMC for the chunk kernel;
// gdn_ws_shared_on).
template <bool BF, bool SMP, bool SMC> static void bwd_launch_ws(Node *n, GdnArgs &a) {
    static WsGrids grids;
    int gp, gc;
    // The chunk kernel's copy of k, q, v and dO (stage_in), where it fits
    // after the whole workspace (GDN_STAGE_IN 0: never, for comparisons).
    size_t in_bytes = GDN_STAGE_IN ? (size_t)a.Cw * (2 * a.dk + (a.dout ? 2 : 1) * a.dv) * sizeof(real) : 0;
    ws_plan<SMP, SMC>(n, a, true, k_gdn_bwd_prep<BF, SMP>, k_gdn_bwd_chunk<BF, SMC>, grids, &gp, &gc, in_bytes);
#ifndef AG_DOUBLE
    if (BF && gdn_chunk64_takes(a)) gdn_bwd_prep64(a);   // the same bits (gdn_chunk64.cu)
    else
#endif
    {
        k_gdn_bwd_prep<BF, SMP><<<gp, GDN_NT, SMP ? a.ws_shared : 0, cu_stream>>>(a);
        CU_LAUNCHED();
    }
    gdn_scan(n, a, true);
    k_gdn_bwd_chunk<BF, SMC><<<gc, GDN_NT, SMC ? a.ws_shared + a.in_shared : 0, cu_stream>>>(a);
    CU_LAUNCHED();
}

template <bool BF> static void bwd_launch(Node *n, GdnArgs &a) {
    bool sp = gdn_ws_shared_on(WS_BWD_PREP), sc = gdn_ws_shared_on(WS_BWD_CHUNK);
    if (sp && sc) bwd_launch_ws<BF, true, true>(n, a);
    else if (sc) bwd_launch_ws<BF, false, true>(n, a);
    else bwd_launch_ws<BF, false, false>(n, a);   // (the first kernel alone is no setting)
}

extern "C" void cu_gdn_chunk_backward(Node *n) {
    GdnArgs a = gdn_args(n);
    a.dout = n->out[0]->grad;
    a.dsT = n->out[1]->grad;
    GdnGrads gr;
    gdn_grads_plan(n, &gr, &a);
    chunk_rows(n, &a, true);
    int64_t SS = (int64_t)a.dk * a.dv;
    a.states = a.saved;
    a.dsb = (real *)tape_dalloc(n->tape, (size_t)(a.items * SS) * sizeof(real));
#ifndef AG_DOUBLE
    if (n->iarg[GDN_ARG_BF16]) bwd_launch<true>(n, a);   // as the forward's products (cu_gdn_chunk_forward)
    else
#endif
        bwd_launch<false>(n, a);
    gdn_grads_finish(&gr);
}
