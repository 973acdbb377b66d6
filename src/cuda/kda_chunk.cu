// kda_chunk.cu: the chunked (WY) forward of op_kda (Kimi Delta Attention) on
// the GPU, following kda_chunk.c (whose header, and docs/kda.md, state the
// math): per chunk of L <= C positions with the state S0 entering it and
// Gamma_i = sum_{j<=i} g_j per key channel (in double),
//   A_ij  = beta_i sum_c k_ic k_jc exp(Gamma_ic - Gamma_jc)   j < i
//   P_ij  =        sum_c q_ic k_jc exp(Gamma_ic - Gamma_jc)   j <= i
//   Tm = (I + A)^-1,  W = Tm Xw (Xw_i = beta_i m_i exp(Gamma_i) * k_i),  U = Tm diag(beta) V,
//   Delta = U - W S0,  O = Qg S0 + P Delta (Qg_i = m_i exp(Gamma_i) * q_i),
//   S_C = Diag(bl) S0 + Kd^T Delta (Kd_j = exp(Gamma_{L-1} - Gamma_j) * k_j, bl = m_{L-1} exp(Gamma_{L-1})),
// m_i = [row i reads S0] (documents). It is gdn_chunk.cu's plan in three
// launches, with the decay per channel:
//   1. per chunk (k_kda_fwd_prep): Gamma, the factors, A and P, Tm by
//      solve_warps, W and U; written to per-op rows (W, U, Qg, Kd, P) and bl;
//   2. per (batch, head, block of 4, 8 or 16 state columns), chunks in order
//      (k_kda_fwd_scan): keeps the state entering each chunk (n->saved, or
//      scratch when the node is not recorded), Delta over U's rows, S_C; the
//      block's slice of the state and of Delta stay in shared memory, and
//      the chunk's rows of W and Kd are copied there first when they fit;
//   3. per chunk (k_kda_fwd_out): O = Qg S0 + P Delta.
// gdn_scan.cu's scan is not reused: its bl and ek are one scalar per chunk
// and per row, KDA's one per channel.
//
// The decays inside A and P: every term takes the exp of its own
// Gamma_ic - Gamma_jc <= 0 (docs/kda.md's per-element route, which the CPU
// takes for channels that forget fast), for every channel. On the CPU the
// reference-point split exists so that the products can be tile products;
// here a warp forms a pair's two sums over the channels at once, one exp
// serving both, so the split would save no exps and add a bound to check. No
// exponent is positive anywhere, for any g <= 0 however negative, and a term's
// decay has the error of one exp ((|x| + 2) u), which is within the CPU
// route's bound. The terms are summed in double (a warp's lanes in order,
// then warp_sum), the same whichever block takes the chunk.
//
// Precision: float32 (float64 in that build), except under [train]
// precision = bf16 in the float32 build (cu_bf16_products, kept in the
// node's KDA_ARG_BF16 for the backward): then the kernels' instances with
// BF = true run the products the CPU's bf16 path rounds (kda_chunk.c's
// header), under its conditions, with bf16 operands and float32 sums
// (blk_mm<true>, gdn_bf16.cuh): P and KKE of a chunk whose length is a
// multiple of KDA_SUB through the sub-blocks' reference points as the CPU
// forms them (kda_prep_sub_bf16; other chunks take the per-element route
// above, in float32), and O = Qg S0 + P Delta for dv a multiple of 16.
// W = Tm Xw and U = Tm Xu (the CPU's substitution has no bf16 product), the
// solve, the scans and every exp stay float32.
//
// The backward is kda_chunk_backward.cu's; step 2 saves the states entering
// each chunk of C positions exactly where the recurrent forward does, so the
// recurrence's backward can take the chunked forward's node as well
// (ATTNLAB_KDA_CHUNK_BWD=recurrent, for the tests).
#include "kda_chunk.cuh"

// Gamma, beta and the documents of the chunk (kda_prep_gamma); then the
// factors through S0 and to the chunk's end into Qg, Xw, Kd, bl, and Xu =
// diag(beta) V. Ends with a barrier.
static __device__ void kda_prep_factors(const GdnArgs &a, const KdaRows &kr, const KdaPrepWs &w, const Item &m,
                                        int64_t r) {
    int tid = threadIdx.x, dk = a.dk, dv = a.dv, L = m.L;
    int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * dk;
    int64_t ov = ((int64_t)m.b * a.T + m.t0) * a.ldv + (int64_t)m.h * dv;
    kda_prep_gamma(a, m, w.G, w.bet, w.db);
    int jL = w.db[L - 1] > 0 ? w.db[L - 1] : 0;   // Kd is 0 before the chunk's last document
    const double *GL = w.G + (size_t)(L - 1) * dk;
    for (int e = tid; e < L * dk; e += GDN_NT) {
        int i = e / dk, c = e % dk;
        real eG = w.db[i] >= 0 ? (real)0 : d_decay(w.G[e]);
        real ek = i < jL ? (real)0 : d_decay(GL[c] - w.G[e]);
        real qi = a.q[ok + (int64_t)i * a.ldk + c], ki = a.k[ok + (int64_t)i * a.ldk + c];
        kr.Qg[(r + i) * dk + c] = eG * qi;
        w.Xw[e] = w.bet[i] * eG * ki;
        kr.Kd[(r + i) * dk + c] = ek * ki;
        if (i == L - 1) kr.bl[(m.bh * a.NC + m.c) * dk + c] = eG;
    }
    for (int e = tid; e < L * dv; e += GDN_NT) {
        int i = e / dv, c = e % dv;
        w.Xu[e] = w.bet[i] * a.v[ov + (int64_t)i * a.ldv + c];
    }
    __syncthreads();
}

// A (strictly lower, into w.A and, for a chunk of up to 64 positions, A^T
// into At, pitch L + 1, for solve_warps; KKE = A / beta into kr.KK when
// asked) and P (lower, into the op's rows):
// a warp per pair (i, j), its lanes over the channels, one exp of
// Gamma_ic - Gamma_jc <= 0 per term serving both sums. Pairs above the
// diagonal and before row i's document are zeros. Ends with a barrier.
static __device__ void kda_prep_pairs(const GdnArgs &a, const KdaRows &kr, const KdaPrepWs &w, const Item &m,
                                      int64_t r, real *At) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, dk = a.dk, L = m.L;
    int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * dk;
    bool fast = L <= 64;
    for (int e = warp; e < L * L; e += GDN_NW) {
        int i = e / L, j = e % L;
        double sp = 0, sk = 0;
        if (j <= i && j >= w.db[i]) {   // db[i] = -1: no document begins in the chunk at or before i
            const double *Gi = w.G + (size_t)i * dk, *Gj = w.G + (size_t)j * dk;
            const real *qi = a.q + ok + (int64_t)i * a.ldk, *ki = a.k + ok + (int64_t)i * a.ldk;
            const real *kj = a.k + ok + (int64_t)j * a.ldk;
            for (int c = lane; c < dk; c += 32) {
                real kx = kj[c] * d_decay(Gi[c] - Gj[c]);
                sp += (double)qi[c] * kx;
                sk += (double)ki[c] * kx;
            }
            sp = warp_sum(sp);
            sk = warp_sum(sk);
        }
        if (lane == 0) {
            real kk = j < i ? (real)sk : (real)0, x = w.bet[i] * kk;
            if (kr.KK) kr.KK[r * a.Cw + e] = kk;
            w.A[e] = x;
            if (fast) At[j * (L + 1) + i] = x;
            kr.P[(r + i) * a.Cw + j] = (real)sp;
        }
    }
    __syncthreads();
}

// kda_prep_pairs in the bf16 instances, for a chunk whose length is a
// multiple of KDA_SUB (the CPU's condition for these products in bf16), as
// kda_chunk.c's kda_sub_products forms KKE and P: per sub-block of rows i0
// .. i0+15 through its reference point (kda_sub_operands), the products Qs
// Ys^T (P's rows, pitch Cw) and Ks Ys^T (KKE's, into w.A) over the columns
// before the sub-block's end, bf16 operands and float32 sums (blk_mm<true>);
// the slow channels' terms inside the sub-block an exp per element
// (exponent <= 0), summed in float32 and added, a thread per pair; then the
// masks (above the diagonal, before row i's document), A = diag(beta) KKE,
// A^T and KK as kda_prep_pairs leaves them. Ends with a barrier.
template <bool BF>
static __device__ void kda_prep_sub_bf16(const GdnArgs &a, const KdaRows &kr, const KdaPrepWs &w, Tiles *sh,
                                         const Item &m, int64_t r) {
    int tid = threadIdx.x, dk = a.dk, L = m.L, Cw = a.Cw;
    int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * dk;
    const KdaSubWs &s = w.sub;
    real *P = kr.P + r * Cw;
    for (int i0 = 0; i0 < L; i0 += KDA_SUB) {
        int n = min(KDA_SUB, L - i0), f = kda_sub_operands(a, m, w.G, s, i0, n);
        int N = f & 1 ? i0 + n : i0;   // every channel slow: the sub-block's own columns are theirs alone
        if (N > 0) {
            blk_mm<BF>(sh, false, true, n, N, dk, 1, s.Qs, dk, s.Ys, dk, 0, P + (size_t)i0 * Cw, Cw);
            blk_mm<BF>(sh, false, true, n, N, dk, 1, s.Ks, dk, s.Ys, dk, 0, w.A + (size_t)i0 * L, L);
        }
        if (f & 2)
            for (int e = tid; e < n * n; e += GDN_NT) {
                int i = i0 + e / n, j = i0 + e % n;
                if (j > i) continue;
                const real *qi = a.q + ok + (int64_t)i * a.ldk, *ki = a.k + ok + (int64_t)i * a.ldk;
                const real *kj = a.k + ok + (int64_t)j * a.ldk;
                const double *Gi = w.G + (size_t)i * dk, *Gj = w.G + (size_t)j * dk;
                real sp = 0, sk = 0;
                for (int c = 0; c < dk; c++) {
                    if (s.keep[c]) continue;
                    real x = kj[c] * d_decay(Gi[c] - Gj[c]);
                    sp += qi[c] * x;
                    sk += ki[c] * x;
                }
                real *pe = P + (size_t)i * Cw + j, *ae = w.A + (size_t)i * L + j;
                *pe = (N > i0 ? *pe : (real)0) + sp;
                *ae = (N > i0 ? *ae : (real)0) + sk;
            }
        __syncthreads();   // the next sub-block rewrites the operands
    }
    bool fast = L <= 64;
    for (int e = tid; e < L * L; e += GDN_NT) {   // each thread its own elements of P and A
        int i = e / L, j = e % L;
        bool in = j >= w.db[i];   // db[i] = -1: no document begins in the chunk at or before i
        real kk = j < i && in ? w.A[e] : (real)0, x = w.bet[i] * kk;
        if (kr.KK) kr.KK[r * Cw + e] = kk;
        w.A[e] = x;
        if (fast) sh->s[j * (L + 1) + i] = x;
        real *pe = P + (size_t)i * Cw + j;
        *pe = j <= i && in ? *pe : (real)0;
    }
    __syncthreads();
}

// 1. Per chunk: the factors, A, P, Tm, and W = Tm Xw, U = Tm Xu into the op's rows.
template <bool BF>
__global__ void __launch_bounds__(GDN_NT, GDN_MINB) k_kda_fwd_prep(GdnArgs a, KdaRows kr) {
    __shared__ Tiles sh;
    int tid = threadIdx.x;
    KdaPrepWs w;
    kda_prep_layout(&w, a.ws + (size_t)blockIdx.x * a.ws_stride, a.Cw, a.dk, a.dv, BF);
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int L = m.L;
        int64_t r = m.bh * a.T + m.t0;   // the chunk's first row of the op's rows
        kda_prep_factors(a, kr, w, m, r);
        if (BF && L % KDA_SUB == 0) kda_prep_sub_bf16<BF>(a, kr, w, &sh, m, r);
        else kda_prep_pairs(a, kr, w, m, r, sh.s);
        // Tm = (I + A)^-1 (into the op's rows when the backward keeps it): by
        // warps from A^T in shared memory for up to 64 positions, else row by
        // row (gdn_chunk.cuh's chunk_prepare does the same).
        real *Tm = kr.Tm ? kr.Tm + r * a.Cw : w.Tm;
        if (L <= 32) solve_warps<1>(Tm, sh.s, L);
        else if (L <= 64) solve_warps<2>(Tm, sh.s, L);
        else
            for (int i = 0; i < L; i++) {
                for (int j = tid; j < L; j += GDN_NT) {
                    real t = j == i ? (real)1 : (real)0;
                    for (int q = j; q < i; q++) t -= w.A[i * L + q] * Tm[q * L + j];
                    Tm[i * L + j] = t;
                }
                __syncthreads();
            }
        __syncthreads();   // Tm is written; A^T (over the Tiles) is no longer read
        blk_gemm(&sh, false, false, L, a.dk, L, 1, Tm, L, w.Xw, a.dk, 0, a.Wb + r * a.dk, a.dk);
        blk_gemm(&sh, false, false, L, a.dv, L, 1, Tm, L, w.Xu, a.dv, 0, a.Ub + r * a.dv, a.dv);
        // blk_gemm ends with a barrier: the next chunk may rewrite the workspace.
    }
}

// 2. Per (batch, head, NVB columns of the state), chunks in order: the
// state entering the chunk into a.states, Delta = U - W S0 (over U's rows),
// S_C = Diag(bl) S0 + Kd^T Delta. Shared memory (KdaScan): the state's
// slice (dk x NVB), Delta's (Cw x NVB) and, STAGE, the chunk's rows of W
// and Kd. Every element is one thread's fma chain in a fixed order, the
// same whatever NVB and STAGE.
template <int NVB, bool STAGE> __global__ void __launch_bounds__(GDN_NT) k_kda_fwd_scan(GdnArgs a, KdaRows kr) {
    extern __shared__ __align__(16) unsigned char kda_smem[];
    real *S = (real *)kda_smem, *D = S + (size_t)a.dk * NVB;
    real *Ws = D + (size_t)a.Cw * NVB, *Ks = Ws + (size_t)a.Cw * (a.dk + 1);   // STAGE only
    int tid = threadIdx.x, dk = a.dk, dv = a.dv, pk = STAGE ? dk + 1 : dk;
    int64_t bh = blockIdx.x / a.NV, SS = (int64_t)dk * dv;
    int j0 = (int)(blockIdx.x % a.NV) * NVB, nc = min(NVB, dv - j0);
    for (int e = tid; e < dk * NVB; e += GDN_NT) {
        int i = e / NVB, j = e % NVB;
        S[e] = a.s0 && j < nc ? a.s0[bh * SS + (int64_t)i * dv + j0 + j] : (real)0;
    }
    __syncthreads();
    for (int c = 0; c < a.NC; c++) {
        int t0 = c * a.C, L = min(a.C, a.T - t0);
        int64_t r = bh * a.T + t0;
        real *st = a.states + (bh * a.NC + c) * SS;
        const real *bl = kr.bl + (bh * a.NC + c) * dk;
        const real *Wc = a.Wb + r * dk, *Kc = kr.Kd + r * dk;
        if (STAGE) {
            kda_scan_rows(Ws, Wc, Ks, Kc, L, dk);
            Wc = Ws, Kc = Ks;
            __syncthreads();
        }
        for (int e = tid; e < dk * NVB; e += GDN_NT) {
            int i = e / NVB, j = e % NVB;
            if (j < nc) st[(int64_t)i * dv + j0 + j] = S[e];
        }
        for (int e = tid; e < L * NVB; e += GDN_NT) {
            int i = e / NVB, j = e % NVB;
            if (j >= nc) continue;
            const real *Wi = Wc + i * pk;
            real *Ui = a.Ub + (r + i) * dv + j0 + j;
            real acc = *Ui;
            for (int q = 0; q < dk; q++) acc = fma(-Wi[q], S[q * NVB + j], acc);
            D[e] = acc;
            *Ui = acc;
        }
        __syncthreads();   // Delta is in; S is no longer read
        for (int e = tid; e < dk * NVB; e += GDN_NT) {
            int i = e / NVB, j = e % NVB;
            if (j >= nc) continue;
            const real *Kd = Kc + i;
            real s = bl[i] * S[e];
            for (int p = 0; p < L; p++) s = fma(Kd[p * pk], D[p * NVB + j], s);
            S[e] = s;
        }
        __syncthreads();   // S_C is in; Delta, W and Kd are no longer read
    }
    for (int e = tid; e < dk * NVB; e += GDN_NT) {
        int i = e / NVB, j = e % NVB;
        if (j < nc) a.sT[bh * SS + (int64_t)i * dv + j0 + j] = S[e];
    }
}

static void (*fwd_scan_kernel(const KdaScan &p))(GdnArgs, KdaRows) {
    if (p.stage) return p.nvb == 4 ? k_kda_fwd_scan<4, true> : p.nvb == 8 ? k_kda_fwd_scan<8, true> : k_kda_fwd_scan<16, true>;
    return p.nvb == 4 ? k_kda_fwd_scan<4, false> : p.nvb == 8 ? k_kda_fwd_scan<8, false> : k_kda_fwd_scan<16, false>;
}

// 3. Per chunk: O = Qg S0 + P Delta (bf16 in the bf16 instance for heads of
// whole vectors, dv a multiple of 16, as on the CPU).
template <bool BF> __global__ void __launch_bounds__(GDN_NT, GDN_MINB) k_kda_fwd_out(GdnArgs a, KdaRows kr) {
    __shared__ Tiles sh;
    int dk = a.dk, dv = a.dv;
    bool bf = dv % 16 == 0;
    int64_t SS = (int64_t)dk * dv;
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int64_t r = m.bh * a.T + m.t0;
        const real *S0 = a.states + (m.bh * a.NC + m.c) * SS;
        real *oc = a.o + ((int64_t)m.b * a.T + m.t0) * a.ldv + (int64_t)m.h * dv;
        kda_mm<BF>(bf, &sh, false, false, m.L, dv, dk, 1, kr.Qg + r * dk, dk, S0, dv, 0, oc, a.ldv);
        kda_mm<BF>(bf, &sh, false, false, m.L, dv, m.L, 1, kr.P + r * a.Cw, a.Cw, a.Ub + r * dv, dv, 1, oc, a.ldv);
    }
}

void kda_rows_alloc(Node *n, GdnArgs *a, KdaRows *kr, bool keep) {
    int64_t BH = (int64_t)a->B * a->H, rows = BH * a->T;
    a->items = BH * a->NC;
    a->Wb = (real *)tape_dalloc(n->tape, (size_t)(rows * a->dk) * sizeof(real));
    a->Ub = (real *)tape_dalloc(n->tape, (size_t)(rows * a->dv) * sizeof(real));
    memset(kr, 0, sizeof *kr);
    kr->Qg = (real *)tape_dalloc(n->tape, (size_t)(rows * a->dk) * sizeof(real));
    kr->Kd = (real *)tape_dalloc(n->tape, (size_t)(rows * a->dk) * sizeof(real));
    kr->P = (real *)tape_dalloc(n->tape, (size_t)(rows * a->Cw) * sizeof(real));
    kr->bl = (real *)tape_dalloc(n->tape, (size_t)(a->items * a->dk) * sizeof(real));
    if (keep) {
        kr->KK = (real *)tape_dalloc(n->tape, (size_t)(rows * a->Cw) * sizeof(real));
        kr->Tm = (real *)tape_dalloc(n->tape, (size_t)(rows * a->Cw) * sizeof(real));
    }
}

template <bool BF> void kda_prep_launch(Node *n, GdnArgs &a, const KdaRows &kr) {
    static int res_prep = 0;
    if (!res_prep) res_prep = resident_blocks(k_kda_fwd_prep<BF>);
    int gp = chunk_grid(a.items, res_prep);
    a.ws_stride = kda_prep_layout(NULL, NULL, a.Cw, a.dk, a.dv, BF);
    a.ws = (unsigned char *)tape_dalloc(n->tape, a.ws_stride * (size_t)gp);
    k_kda_fwd_prep<BF><<<gp, GDN_NT, 0, cu_stream>>>(a, kr);
    CU_LAUNCHED();
}
template void kda_prep_launch<false>(Node *n, GdnArgs &a, const KdaRows &kr);
#ifndef AG_DOUBLE
template void kda_prep_launch<true>(Node *n, GdnArgs &a, const KdaRows &kr);
#endif

// ATTNLAB_KDA_SCAN_COLS / ATTNLAB_KDA_SCAN_STAGE, if set, and refused by
// name unless one of the values they may take.
static int scan_env(const char *name, const char *const *vals, int nval, int dflt) {
    const char *env = getenv(name);
    if (!env || !*env) return dflt;
    for (int i = 0; i < nval; i++)
        if (!strcmp(env, vals[i])) return atoi(vals[i]);
    FAIL("%s is '%.32s': it must be %s", name, env,
         nval == 3 ? "4, 8 or 16" : "0 (W and Kd read from device memory) or 1 (staged where they fit)");
}

// The width: KDA_NVB_MAX, halved (to KDA_NVB_MIN at least) while the halved
// width's B H ceil(dv / w) blocks still fit on the GPU's multiprocessors, as
// gdn's scans choose: a long row at B = 1 has few (batch, head) walks, and
// each walk's chunks are sequential. Staged when the operands fit beside the
// slices in the shared memory a block may take.
KdaScan kda_scan_plan(GdnArgs &a) {
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        CU_CHECK(cudaGetDevice(&dev));
        CU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    }
    static const char *const cols[] = {"4", "8", "16"}, *const stage[] = {"0", "1"};
    int64_t BH = (int64_t)a.B * a.H;
    KdaScan p;
    p.nvb = KDA_NVB_MAX;
    while (p.nvb > KDA_NVB_MIN && BH * ((a.dv + p.nvb / 2 - 1) / (p.nvb / 2)) <= sms) p.nvb /= 2;
    p.nvb = scan_env("ATTNLAB_KDA_SCAN_COLS", cols, 3, p.nvb);
    a.NV = (a.dv + p.nvb - 1) / p.nvb;
    size_t slices = (size_t)(a.dk + a.Cw) * p.nvb * sizeof(real);
    size_t rows = 2 * (size_t)a.Cw * (a.dk + 1) * sizeof(real);
    p.stage = scan_env("ATTNLAB_KDA_SCAN_STAGE", stage, 2, 1) && slices + rows <= cu_smem_optin();
    p.smem = slices + (p.stage ? rows : 0);
    return p;
}

void kda_scan_run(void (*kernel)(GdnArgs, KdaRows), const GdnArgs &a, const KdaRows &kr, const KdaScan &plan) {
    cu_smem_prepare((const void *)kernel, plan.smem, "op_kda (GPU, chunked form)", a.dk, a.dv);
    kernel<<<(unsigned)(a.items / a.NC * a.NV), GDN_NT, plan.smem, cu_stream>>>(a, kr);
    CU_LAUNCHED();
}

template <bool BF> static void kda_forward(Node *n) {
    static int res_out = 0;
    if (!res_out) res_out = resident_blocks(k_kda_fwd_out<BF>);
    GdnArgs a = gdn_args(n);
    KdaRows kr;
    kda_rows_alloc(n, &a, &kr, false);
    int64_t SS = (int64_t)a.dk * a.dv;
    a.states = a.saved ? a.saved : (real *)tape_dalloc(n->tape, (size_t)(a.items * SS) * sizeof(real));
    kda_prep_launch<BF>(n, a, kr);
    KdaScan plan = kda_scan_plan(a);
    kda_scan_run(fwd_scan_kernel(plan), a, kr, plan);
    k_kda_fwd_out<BF><<<chunk_grid(a.items, res_out), GDN_NT, 0, cu_stream>>>(a, kr);
    CU_LAUNCHED();
}

extern "C" void cu_kda_chunk_forward(Node *n) {
    // The node keeps whether its products were bf16 (the builder left
    // CHUNK_TILES_FP32 on a GPU tape), so that its backward rounds as this
    // forward does, as cu_gdn_chunk_forward does.
    n->iarg[KDA_ARG_BF16] = cu_bf16_products();
#ifndef AG_DOUBLE
    if (n->iarg[KDA_ARG_BF16]) {
        kda_forward<true>(n);
        return;
    }
#endif
    kda_forward<false>(n);
}
