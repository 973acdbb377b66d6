// kda_chunk_backward.cu: the backward of op_kda's chunked (WY) form on the
// GPU, following kda_chunk_backward.c (docs/kda.md, "Its backward") in
// gdn_chunk_backward.cu's plan, with the decay per key channel:
//   1. per chunk: kda_chunk.cu's step 1 again (W, U, Qg, Kd, P, bl, and here
//      KKE and Tm = (I + A)^-1 kept in per-op rows), then the parts of dDelta
//      and of the entering state's gradient that do not go through the state,
//      P^T dO and Qg^T dO (k_kda_bwd_pre);
//   2. per (batch, head, 4, 8 or 16 state columns), chunks in reverse (k_kda_bwd_scan):
//      dDelta = Kd dS + P^T dO, dS0 = Diag(bl) dS + Qg^T dO - W^T dDelta,
//      keeping the gradient of the state leaving each chunk and dDelta; s0's
//      is the last;
//   3. per chunk (k_kda_bwd_chunk): Delta = U - W S0 again, dR = Tm^T dDelta,
//      dXw = -dR S0^T, dA = -dR Delta^T, dP = dO Delta^T, dQg = dO S0^T,
//      dKd = Delta dS^T, and from them every input gradient of the chunk.
// The decayed products' gradients go pair by pair, as the forward formed
// them: for M_ij = sum_c X_ic Y_jc E_ijc (P: X = Q, Y = K; KKE: X = Y = K),
//   dX_i += sum_j dM_ij Y_j E_ij,  dY_j += sum_i dM_ij X_i E_ij,
//   dGamma_i += dM_ij X_i Y_j E_ij,  dGamma_j -= the same     (j < i),
// each E_ijc the exp of its own Gamma_ic - Gamma_jc <= 0; the diagonal of P
// adds nothing to dGamma (its terms would cancel only to their rounding,
// far above dg under a strong decay: docs/kda.md). A thread owns (row m,
// channel c) and sums m's terms as a row and as a column, in double, in a
// fixed order; dg_m = sum_{i >= m} dGamma_i by a thread per channel. No
// atomics: the same bits whichever block takes a chunk.
// In the bf16 instances (the node's KDA_ARG_BF16, kda_chunk.cu's header)
// the products kda_chunk_backward.c rounds are rounded under its
// conditions: P^T dO and Qg^T dO (dv a multiple of 16), dP and dA (a chunk
// length a multiple of 16), dQg (dk a multiple of 16), and for dk a
// multiple of 16 the pairs' terms go through the sub-blocks' products as on
// the CPU (kda_grad_sub_bf16) instead of pair by pair. The scans, dR, dXw,
// dKd, Delta's recompute and every sum stay float32 (or double).
#include "kda_chunk.cuh"

// 1b. Per chunk, when o has a gradient: P^T dO into kr.PtdO, Qg^T dO into
// kr.QtdO (bf16 in the bf16 instance for dv a multiple of 16, as on the CPU).
template <bool BF> __global__ void __launch_bounds__(GDN_NT, GDN_MINB) k_kda_bwd_pre(GdnArgs a, KdaRows kr) {
    __shared__ Tiles sh;
    int64_t SS = (int64_t)a.dk * a.dv;
    bool bf = a.dv % 16 == 0;
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int64_t r = m.bh * a.T + m.t0;
        const real *dO = a.dout + ((int64_t)m.b * a.T + m.t0) * a.ldv + (int64_t)m.h * a.dv;
        kda_mm<BF>(bf, &sh, true, false, m.L, a.dv, m.L, 1, kr.P + r * a.Cw, a.Cw, dO, a.ldv, 0, kr.PtdO + r * a.dv,
                   a.dv);
        kda_mm<BF>(bf, &sh, true, false, a.dk, a.dv, m.L, 1, kr.Qg + r * a.dk, a.dk, dO, a.ldv, 0,
                   kr.QtdO + (m.bh * a.NC + m.c) * SS, a.dv);
    }
}

// 2. Per (batch, head, NVB columns of the state), chunks in reverse:
// a.dsb gets the gradient of the state leaving each chunk, kr.PtdO's rows
// dDelta. Shared memory (KdaScan): dS's slice (dk x NVB), dDelta's (Cw x
// NVB) and, STAGE, the chunk's rows of Kd and W. Every element is one
// thread's fma chain in a fixed order, the same whatever NVB and STAGE.
template <int NVB, bool STAGE> __global__ void __launch_bounds__(GDN_NT) k_kda_bwd_scan(GdnArgs a, KdaRows kr) {
    extern __shared__ __align__(16) unsigned char kda_smem[];
    real *dS = (real *)kda_smem, *D = dS + (size_t)a.dk * NVB;
    real *Ks = D + (size_t)a.Cw * NVB, *Ws = Ks + (size_t)a.Cw * (a.dk + 1);   // STAGE only
    int tid = threadIdx.x, dk = a.dk, dv = a.dv, pk = STAGE ? dk + 1 : dk;
    int64_t bh = blockIdx.x / a.NV, SS = (int64_t)dk * dv;
    int j0 = (int)(blockIdx.x % a.NV) * NVB, nc = min(NVB, dv - j0);
    bool dout = a.dout != NULL;
    for (int e = tid; e < dk * NVB; e += GDN_NT) {
        int i = e / NVB, j = e % NVB;
        dS[e] = a.dsT && j < nc ? a.dsT[bh * SS + (int64_t)i * dv + j0 + j] : (real)0;
    }
    __syncthreads();
    for (int c = a.NC - 1; c >= 0; c--) {
        int t0 = c * a.C, L = min(a.C, a.T - t0);
        int64_t r = bh * a.T + t0, cs = (bh * a.NC + c) * SS;
        const real *bl = kr.bl + (bh * a.NC + c) * dk;
        const real *Kc = kr.Kd + r * dk, *Wc = a.Wb + r * dk;
        if (STAGE) {
            kda_scan_rows(Ks, Kc, Ws, Wc, L, dk);
            Kc = Ks, Wc = Ws;
            __syncthreads();
        }
        for (int e = tid; e < dk * NVB; e += GDN_NT) {
            int i = e / NVB, j = e % NVB;
            if (j < nc) a.dsb[cs + (int64_t)i * dv + j0 + j] = dS[e];
        }
        // dDelta = Kd dS + P^T dO
        for (int e = tid; e < L * NVB; e += GDN_NT) {
            int i = e / NVB, j = e % NVB;
            if (j >= nc) continue;
            const real *Kd = Kc + i * pk;
            real *Y = kr.PtdO + (r + i) * dv + j0 + j;
            real acc = dout ? *Y : (real)0;
            for (int q = 0; q < dk; q++) acc = fma(Kd[q], dS[q * NVB + j], acc);
            D[e] = acc;
            *Y = acc;
        }
        __syncthreads();   // dDelta is in; dS is no longer read
        // dS0 = Diag(bl) dS + Qg^T dO - W^T dDelta
        for (int e = tid; e < dk * NVB; e += GDN_NT) {
            int i = e / NVB, j = e % NVB;
            if (j >= nc) continue;
            real s = bl[i] * dS[e];
            if (dout) s += kr.QtdO[cs + (int64_t)i * dv + j0 + j];
            const real *W = Wc + i;
            for (int p = 0; p < L; p++) s = fma(-W[p * pk], D[p * NVB + j], s);
            dS[e] = s;
        }
        __syncthreads();   // dS0 is in; dDelta, Kd and W are no longer read
    }
    if (a.gs0)
        for (int e = tid; e < dk * NVB; e += GDN_NT) {
            int i = e / NVB, j = e % NVB;
            if (j < nc) a.gs0[bh * SS + (int64_t)i * dv + j0 + j] = dS[e];
        }
}

static void (*bwd_scan_kernel(const KdaScan &p))(GdnArgs, KdaRows) {
    if (p.stage) return p.nvb == 4 ? k_kda_bwd_scan<4, true> : p.nvb == 8 ? k_kda_bwd_scan<8, true> : k_kda_bwd_scan<16, true>;
    return p.nvb == 4 ? k_kda_bwd_scan<4, false> : p.nvb == 8 ? k_kda_bwd_scan<8, false> : k_kda_bwd_scan<16, false>;
}

// Per-block workspace of step 3, chunks of up to C positions.
struct KdaGradWs {
    double *G, *dG;              // (C, dk) Gamma, dGamma
    double *dbl, *kds;           // (dk) <dS, S0> per row of the state; sum_{j < L-1} Kd_j dKd_j
    real *bet;                   // (C)
    int *db;                     // (C)
    real *Dl, *dR;               // (C, dv) Delta, dR
    real *dXw, *dQg, *dKd;       // (C, dk)
    real *dA, *dP;               // (C, C)
    // The bf16 instances' only (kda_grad_sub_bf16), else empty:
    KdaSubWs sub;
    real *T1k, *T1p;             // (KDA_SUB, dk) dKKE Ys, dP Ys of a sub-block's rows
    real *T2;                    // (C, dk) dKKE^T Ks + dP^T Qs of its columns
    real *dQp, *dKp;             // (C, dk) dq, dk through KKE and P
};

static __host__ __device__ size_t kda_grad_layout(KdaGradWs *w, unsigned char *base, int C, int dk, int dv,
                                                  bool bf) {
    size_t at = 0, CC = (size_t)C * C, Ck = (size_t)C * dk, Cv = (size_t)C * dv;
    size_t oG = ws_take(&at, Ck, sizeof(double)), odG = ws_take(&at, Ck, sizeof(double));
    size_t obl = ws_take(&at, dk, sizeof(double)), oks = ws_take(&at, dk, sizeof(double));
    size_t ob = ws_take(&at, C, sizeof(real)), odb = ws_take(&at, C, sizeof(int));
    size_t oDl = ws_take(&at, Cv, sizeof(real)), odR = ws_take(&at, Cv, sizeof(real));
    size_t odXw = ws_take(&at, Ck, sizeof(real)), odQg = ws_take(&at, Ck, sizeof(real));
    size_t odKd = ws_take(&at, Ck, sizeof(real));
    size_t odA = ws_take(&at, CC, sizeof(real)), odP = ws_take(&at, CC, sizeof(real));
    kda_sub_layout(w ? &w->sub : NULL, base, &at, C, dk, bf);
    size_t Sk = bf ? (size_t)KDA_SUB * dk : 0, Bk = bf ? Ck : 0;
    size_t oT1k = ws_take(&at, Sk, sizeof(real)), oT1p = ws_take(&at, Sk, sizeof(real));
    size_t oT2 = ws_take(&at, Bk, sizeof(real)), odQp = ws_take(&at, Bk, sizeof(real));
    size_t odKp = ws_take(&at, Bk, sizeof(real));
    if (w) {
        w->T1k = (real *)(base + oT1k), w->T1p = (real *)(base + oT1p), w->T2 = (real *)(base + oT2);
        w->dQp = (real *)(base + odQp), w->dKp = (real *)(base + odKp);
        w->G = (double *)(base + oG), w->dG = (double *)(base + odG);
        w->dbl = (double *)(base + obl), w->kds = (double *)(base + oks);
        w->bet = (real *)(base + ob), w->db = (int *)(base + odb);
        w->Dl = (real *)(base + oDl), w->dR = (real *)(base + odR);
        w->dXw = (real *)(base + odXw), w->dQg = (real *)(base + odQg), w->dKd = (real *)(base + odKd);
        w->dA = (real *)(base + odA), w->dP = (real *)(base + odP);
    }
    return (at + 255) & ~(size_t)255;
}

// Step 3's products: Delta, dR, dXw, dA, and with dO dP, dQg; dKd. In the
// bf16 instance dA and dP (for a chunk whose length is a multiple of 16)
// and dQg (dk a multiple of 16) take bf16 operands, as on the CPU; the
// state's (Delta, dXw, dKd) and the solve's (dR) stay float32. Ends with a barrier.
template <bool BF>
static __device__ void kda_grad_products(const GdnArgs &a, const KdaRows &kr, const KdaGradWs &w, Tiles *sh,
                                         const Item &m, int64_t r, const real *S0, const real *dS, const real *dO) {
    int L = m.L, dk = a.dk, dv = a.dv;
    for (int e = threadIdx.x; e < L * dv; e += GDN_NT) w.Dl[e] = a.Ub[r * dv + e];
    __syncthreads();
    blk_gemm(sh, false, false, L, dv, dk, -1, a.Wb + r * dk, dk, S0, dv, 1, w.Dl, dv);
    blk_gemm(sh, true, false, L, dv, L, 1, kr.Tm + r * a.Cw, L, kr.PtdO + r * dv, dv, 0, w.dR, dv);
    blk_gemm(sh, false, true, L, dk, dv, -1, w.dR, dv, S0, dv, 0, w.dXw, dk);
    bool bl = L % 16 == 0, bk = dk % 16 == 0;
    kda_mm<BF>(bl, sh, false, true, L, L, dv, -1, w.dR, dv, w.Dl, dv, 0, w.dA, L);
    if (dO) {
        kda_mm<BF>(bl, sh, false, true, L, L, dv, 1, dO, a.ldv, w.Dl, dv, 0, w.dP, L);
        kda_mm<BF>(bk, sh, false, true, L, dk, dv, 1, dO, a.ldv, S0, dv, 0, w.dQg, dk);
    }
    blk_gemm(sh, false, true, L, dk, dv, 1, w.Dl, dv, dS, dv, 0, w.dKd, dk);
}

// dbeta (a warp per row: dR . v, eG k . dXw, dA . KKE over the row's
// document, in double) and dv = beta dR; dbl and kds per channel. Ends with a barrier.
static __device__ void kda_grad_rows(const GdnArgs &a, const KdaRows &kr, const KdaGradWs &w, const Item &m,
                                     int64_t r, const real *S0, const real *dS) {
    int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, L = m.L, dk = a.dk, dv = a.dv;
    int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * dk;
    int64_t ov = ((int64_t)m.b * a.T + m.t0) * a.ldv + (int64_t)m.h * dv;
    int64_t oh = ((int64_t)m.b * a.T + m.t0) * a.H + m.h;
    if (a.gbeta)
        for (int i = warp; i < L; i += GDN_NW) {
            const real *vi = a.v + ov + (int64_t)i * a.ldv, *ki = a.k + ok + (int64_t)i * a.ldk;
            double s = 0;
            for (int c = lane; c < dv; c += 32) s += (double)w.dR[i * dv + c] * vi[c];
            if (w.db[i] < 0)
                for (int c = lane; c < dk; c += 32)
                    s += (double)(d_decay(w.G[(size_t)i * dk + c]) * ki[c]) * w.dXw[i * dk + c];
            for (int j = max(w.db[i], 0) + lane; j < i; j += 32)
                s += (double)w.dA[i * L + j] * kr.KK[r * a.Cw + i * L + j];
            s = warp_sum(s);
            if (lane == 0) a.gbeta[oh + (int64_t)i * a.H] = (real)s;
        }
    if (a.gv)
        for (int e = tid; e < L * dv; e += GDN_NT) {
            int i = e / dv, c = e % dv;
            a.gv[ov + (int64_t)i * a.ldv + c] = w.bet[i] * w.dR[e];
        }
    for (int c = warp; c < dk; c += GDN_NW) {
        double s = warp_dot(dS + (int64_t)c * dv, S0 + (int64_t)c * dv, dv);
        if (lane == 0) w.dbl[c] = s;
    }
    for (int c = tid; c < dk; c += GDN_NT) {
        double s = 0;
        for (int j = 0; j < L - 1; j++) s += (double)kr.Kd[(r + j) * dk + c] * w.dKd[j * dk + c];
        w.kds[c] = s;
    }
    __syncthreads();
}

// The backward of KKE and P through the sub-blocks' products, in the bf16
// instance for dk a multiple of 16 (the CPU's condition for these products
// in bf16), as kda_chunk_backward.c's mask_products and sub_backward: dKKE
// = diag(beta) dA and dP masked as the forward formed them (into w.dA,
// w.dP), P's diagonal (exponent 0) into dq and dk apart (no dGamma); then
// per sub-block (kda_sub_operands) T1 = dM Ys (rows) and T2 = dM^T Xs
// (columns) for (X, M) = (K, KKE), (Q, P), bf16 operands and float32 sums,
//   dX_i += Ef_i T1_i, dGamma_i += Xs_i T1_i, dK_j += Ec_j T2_j, dGamma_j -= Ys_j T2_j,
// and the slow channels' pairs inside it an exp per element, a thread per
// (row, channel) summing its terms as a row and as a column. Leaves the
// sums in w.dQp, w.dKp (float32) and w.dG (double). Ends with a barrier.
template <bool BF>
static __device__ void kda_grad_sub_bf16(const GdnArgs &a, const KdaGradWs &w, Tiles *sh, const Item &m, bool dout) {
    int tid = threadIdx.x, L = m.L, dk = a.dk;
    int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * dk;
    const real *q = a.q + ok, *k = a.k + ok;
    const KdaSubWs &s = w.sub;
    for (int e = tid; e < L * dk; e += GDN_NT) {
        int i = e / dk, c = e % dk;
        real d = dout ? w.dP[i * L + i] : (real)0;
        w.dQp[e] = d * k[(int64_t)i * a.ldk + c];
        w.dKp[e] = d * q[(int64_t)i * a.ldk + c];
        w.dG[e] = 0;
    }
    __syncthreads();   // P's diagonal is read
    for (int e = tid; e < L * L; e += GDN_NT) {
        int i = e / L, j = e % L;
        bool in = j < i && j >= w.db[i];
        w.dA[e] = in ? w.bet[i] * w.dA[e] : (real)0;
        if (dout) w.dP[e] = in ? w.dP[e] : (real)0;
    }
    __syncthreads();
    for (int i0 = 0; i0 < L; i0 += KDA_SUB) {
        int n = min(KDA_SUB, L - i0), f = kda_sub_operands(a, m, w.G, s, i0, n);
        int N = f & 1 ? i0 + n : i0;
        if (N > 0) {
            const real *dK = w.dA + (size_t)i0 * L, *dP = w.dP + (size_t)i0 * L;
            blk_mm<BF>(sh, false, false, n, dk, N, 1, dK, L, s.Ys, dk, 0, w.T1k, dk);
            blk_mm<BF>(sh, true, false, N, dk, n, 1, dK, L, s.Ks, dk, 0, w.T2, dk);
            if (dout) {
                blk_mm<BF>(sh, false, false, n, dk, N, 1, dP, L, s.Ys, dk, 0, w.T1p, dk);
                blk_mm<BF>(sh, true, false, N, dk, n, 1, dP, L, s.Qs, dk, 1, w.T2, dk);
            }
            for (int e = tid; e < n * dk; e += GDN_NT) {   // the rows
                size_t x = (size_t)i0 * dk + e;
                real t = w.T1k[e];
                w.dKp[x] += s.Ef[e] * t;
                w.dG[x] += (double)s.Ks[e] * t;
                if (!dout) continue;
                t = w.T1p[e];
                w.dQp[x] += s.Ef[e] * t;
                w.dG[x] += (double)s.Qs[e] * t;
            }
            __syncthreads();   // the columns hold the rows
            for (int e = tid; e < N * dk; e += GDN_NT) {   // the columns
                real t = w.T2[e];
                w.dKp[e] += s.Ec[e] * t;
                w.dG[e] -= (double)s.Ys[e] * t;
            }
            __syncthreads();
        }
        if (f & 2)
            for (int e = tid; e < n * dk; e += GDN_NT) {
                int p = i0 + e / dk, c = e % dk;
                if (s.keep[c]) continue;
                real qp = q[(int64_t)p * a.ldk + c], kp = k[(int64_t)p * a.ldk + c], dq = 0, dkk = 0;
                double Gp = w.G[(size_t)p * dk + c], dG = 0;
                for (int j = i0; j < p; j++) {   // p as the row i
                    real x = d_decay(Gp - w.G[(size_t)j * dk + c]), kj = k[(int64_t)j * a.ldk + c];
                    real ea = (dout ? w.dP[p * L + j] : (real)0) * x, eb = w.dA[p * L + j] * x;
                    dq += ea * kj;
                    dkk += eb * kj;
                    dG += (double)(ea * kj) * qp + (double)(eb * kj) * kp;
                }
                for (int i = p + 1; i < i0 + n; i++) {   // p as the column j
                    real x = d_decay(w.G[(size_t)i * dk + c] - Gp);
                    real qi = q[(int64_t)i * a.ldk + c], ki = k[(int64_t)i * a.ldk + c];
                    real ea = (dout ? w.dP[i * L + p] : (real)0) * x, eb = w.dA[i * L + p] * x;
                    dkk += ea * qi + eb * ki;
                    dG -= (double)(ea * kp) * qi + (double)(eb * kp) * ki;
                }
                size_t x = (size_t)p * dk + c;
                w.dQp[x] += dq;
                w.dKp[x] += dkk;
                w.dG[x] += dG;
            }
        __syncthreads();   // the next sub-block rewrites the operands
    }
}

// dq, dk and dGamma of (row m, channel c) for every (m, c) of the chunk:
// m's pair terms as a row (j <= m in its document) and as a column (i >= m
// whose document holds m), or in the bf16 instance for dk a multiple of 16
// those kda_grad_sub_bf16 left in dQp, dKp and dG; then the factors Qg, Xw,
// Kd (and at the last row bl and the Kd sum). Ends with a barrier.
template <bool BF>
static __device__ void kda_grad_elems(const GdnArgs &a, const KdaRows &kr, const KdaGradWs &w, const Item &m,
                                      int64_t r, bool dout) {
    bool sub = BF && a.dk % 16 == 0;
    int L = m.L, dk = a.dk;
    int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * dk;
    const real *q = a.q + ok, *k = a.k + ok;
    int jL = w.db[L - 1] > 0 ? w.db[L - 1] : 0;
    for (int e = threadIdx.x; e < L * dk; e += GDN_NT) {
        int p = e / dk, c = e % dk;
        int64_t pc = (int64_t)p * a.ldk + c;
        real qp = q[pc], kp = k[pc];
        double Gp = w.G[e], dq = 0, dkk = 0, dG = 0;
        if (sub) {
            dq = w.dQp[e], dkk = w.dKp[e], dG = w.dG[e];
        } else {
            for (int j = max(w.db[p], 0); j <= p; j++) {   // p as the row i
                real x = dout ? w.dP[p * L + j] : (real)0, y = j < p ? w.bet[p] * w.dA[p * L + j] : (real)0;
                real kx = k[(int64_t)j * a.ldk + c] * d_decay(Gp - w.G[(size_t)j * dk + c]);
                dq += (double)x * kx;
                dkk += (double)y * kx;
                if (j < p) dG += (double)(x * qp + y * kp) * kx;
            }
            for (int i = p; i < L; i++) {   // p as the column j
                if (p < w.db[i]) continue;
                real x = dout ? w.dP[i * L + p] : (real)0, y = i > p ? w.bet[i] * w.dA[i * L + p] : (real)0;
                int64_t ic = (int64_t)i * a.ldk + c;
                real t = (x * q[ic] + y * k[ic]) * d_decay(w.G[(size_t)i * dk + c] - Gp);
                dkk += t;
                if (i > p) dG -= (double)t * kp;
            }
        }
        real eG = w.db[p] >= 0 ? (real)0 : d_decay(Gp);
        real ek = p < jL ? (real)0 : d_decay(w.G[(size_t)(L - 1) * dk + c] - Gp);
        if (dout) {
            dq += (double)eG * w.dQg[e];
            dG += (double)kr.Qg[(r + p) * dk + c] * w.dQg[e];
        }
        real xw = w.bet[p] * eG * kp;
        dkk += (double)(w.bet[p] * eG) * w.dXw[e];
        dG += (double)xw * w.dXw[e];
        dkk += (double)ek * w.dKd[e];
        if (p < L - 1) dG -= (double)kr.Kd[(r + p) * dk + c] * w.dKd[e];
        else dG += w.kds[c] + (double)kr.bl[(m.bh * a.NC + m.c) * dk + c] * w.dbl[c];
        if (a.gq) a.gq[ok + pc] = (real)dq;
        if (a.gk) a.gk[ok + pc] = (real)dkk;
        w.dG[e] = dG;
    }
    __syncthreads();
}

// 3. Per chunk: every input gradient of its rows (dg_m = sum_{i >= m}
// dGamma_i per channel, from the last row back).
template <bool BF> __global__ void __launch_bounds__(GDN_NT, GDN_CHUNK_MINB) k_kda_bwd_chunk(GdnArgs a, KdaRows kr) {
    __shared__ Tiles sh;
    int64_t SS = (int64_t)a.dk * a.dv;
    KdaGradWs w;
    kda_grad_layout(&w, a.ws + (size_t)blockIdx.x * a.ws_stride, a.Cw, a.dk, a.dv, BF);
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int64_t r = m.bh * a.T + m.t0, cs = (m.bh * a.NC + m.c) * SS;
        const real *S0 = a.states + cs, *dS = a.dsb + cs;
        int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * a.dk;
        const real *dO = a.dout ? a.dout + ((int64_t)m.b * a.T + m.t0) * a.ldv + (int64_t)m.h * a.dv : NULL;
        kda_prep_gamma(a, m, w.G, w.bet, w.db);
        kda_grad_products<BF>(a, kr, w, &sh, m, r, S0, dS, dO);
        kda_grad_rows(a, kr, w, m, r, S0, dS);
        if (BF && a.dk % 16 == 0) kda_grad_sub_bf16<BF>(a, w, &sh, m, dO != NULL);
        kda_grad_elems<BF>(a, kr, w, m, r, dO != NULL);
        if (a.gg)
            for (int c = threadIdx.x; c < a.dk; c += GDN_NT) {
                double s = 0;
                for (int i = m.L - 1; i >= 0; i--) {
                    s += w.dG[(size_t)i * a.dk + c];
                    a.gg[ok + (int64_t)i * a.ldk + c] = (real)s;
                }
            }
        __syncthreads();   // the next chunk rewrites the workspace
    }
}

// ATTNLAB_KDA_CHUNK_BWD=recurrent runs the recurrence's backward instead
// (cu_kda_naive_backward: it reads only the states entering each chunk,
// which the chunked forward saves as the recurrent one does), so that the
// tests can hold the two backwards to each other and to the CPU.
static bool kda_backward_recurrent(void) {
    const char *env = getenv("ATTNLAB_KDA_CHUNK_BWD");
    if (!env || !*env || !strcmp(env, "chunked")) return false;
    ASSERT(!strcmp(env, "recurrent"), "ATTNLAB_KDA_CHUNK_BWD is '%.32s': it must be 'chunked' or 'recurrent'", env);
    return true;
}

template <bool BF> static void kda_backward(Node *n) {
    static int res_pre = 0, res_chunk = 0;
    if (!res_pre) res_pre = resident_blocks(k_kda_bwd_pre<BF>);
    if (!res_chunk) res_chunk = resident_blocks(k_kda_bwd_chunk<BF>);
    GdnArgs a = gdn_args(n);
    a.dout = n->out[0]->grad;
    a.dsT = n->out[1]->grad;
    GdnGrads gr;
    gdn_grads_plan(n, &gr, &a);
    KdaRows kr;
    kda_rows_alloc(n, &a, &kr, true);
    int64_t SS = (int64_t)a.dk * a.dv, rows = (int64_t)a.B * a.H * a.T;
    a.states = a.saved;
    a.dsb = (real *)tape_dalloc(n->tape, (size_t)(a.items * SS) * sizeof(real));
    kr.PtdO = (real *)tape_dalloc(n->tape, (size_t)(rows * a.dv) * sizeof(real));
    kr.QtdO = (real *)tape_dalloc(n->tape, (size_t)(a.items * SS) * sizeof(real));
    kda_prep_launch<BF>(n, a, kr);
    if (a.dout) {
        k_kda_bwd_pre<BF><<<chunk_grid(a.items, res_pre), GDN_NT, 0, cu_stream>>>(a, kr);
        CU_LAUNCHED();
    }
    KdaScan plan = kda_scan_plan(a);
    kda_scan_run(bwd_scan_kernel(plan), a, kr, plan);
    int gc = chunk_grid(a.items, res_chunk);
    a.ws_stride = kda_grad_layout(NULL, NULL, a.Cw, a.dk, a.dv, BF);
    a.ws = (unsigned char *)tape_dalloc(n->tape, a.ws_stride * (size_t)gc);
    k_kda_bwd_chunk<BF><<<gc, GDN_NT, 0, cu_stream>>>(a, kr);
    CU_LAUNCHED();
    gdn_grads_finish(&gr);
}

extern "C" void cu_kda_chunk_backward(Node *n) {
    if (kda_backward_recurrent()) {
        cu_kda_naive_backward(n);
        return;
    }
#ifndef AG_DOUBLE
    if (n->iarg[KDA_ARG_BF16]) {   // as the forward's products (cu_kda_chunk_forward)
        kda_backward<true>(n);
        return;
    }
#endif
    kda_backward<false>(n);
}
