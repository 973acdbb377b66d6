// gdn_chunk.cu: the chunked (WY) forward of op_gdn (Gated DeltaNet) on the
// GPU, following gdn_chunk.c (whose header states the math): per chunk of
// L <= C positions with the state S0 entering it,
//   Tm = (I + A)^-1,  W = Tm diag(beta b) K,  U = Tm diag(beta) V,
//   Delta = U - W S0,  O = diag(b) Q S0 + P Delta,  S_C = bl S0 + Kd^T Delta,
// in three launches (products in bf16 under precision = bf16: gdn_common.cuh
// says which): 1. per chunk, W, U and the decays (k_gdn_fwd_prep);
// 2. the scan across chunks (gdn_scan.cu), Delta and the states; 3. per
// chunk, O (k_gdn_fwd_out). gdn_common.cuh has the plan of both passes.
#include "gdn_chunk.cuh"

// ---------------------------------------------------------------- chunked form: forward

// 1. Per chunk: W and U into the op's rows, ek and bl (and Tm, when recorded).
// (SM: the workspace's first a.ws_shared bytes in shared memory, gdn_chunk.cuh.)
template <bool BF, bool SM> __global__ void __launch_bounds__(GDN_NT, SM ? 1 : GDN_MINB) k_gdn_fwd_prep(GdnArgs a) {
    __shared__ Tiles sh;
    extern __shared__ __align__(16) unsigned char ws_sh[];
    int tid = threadIdx.x;
    ChunkWs w;
    chunk_ws_layout(&w, a.ws + (size_t)blockIdx.x * a.ws_stride, a.Cw, a.dk, a.dv, false, ws_sh, SM ? a.ws_shared : 0);
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int64_t r = m.bh * a.T + m.t0;   // the chunk's first row of the op's rows
        w.W = a.Wb + r * a.dk;
        w.U = (a.Usv ? a.Usv : a.Ub) + r * a.dv;
        if (a.Tmb) w.Tm = a.Tmb + r * a.Cw;
        chunk_prepare<BF>(a, w, &sh, chunk_in(a, m.b, m.h, m.t0), m.b, m.h, m.t0, m.L, PREP_SOLVE | PREP_W | PREP_U);
        for (int i = tid; i < m.L; i += GDN_NT) a.ekb[r + i] = w.ek[i];
        if (tid == 0) a.blb[m.bh * a.NC + m.c] = w.bm[m.L - 1];
        __syncthreads();   // the next chunk rewrites ek and bm
    }
}

// 2. The scan: k_gdn_fwd_scan (gdn_scan.cu).

// 3. Per chunk: O = diag(b) Q S0 + P Delta.
template <bool BF, bool SM> __global__ void __launch_bounds__(GDN_NT, SM ? 1 : GDN_MINB) k_gdn_fwd_out(GdnArgs a) {
    __shared__ Tiles sh;
    extern __shared__ __align__(16) unsigned char ws_sh[];
    int tid = threadIdx.x, dk = a.dk, dv = a.dv;
    int64_t SS = (int64_t)dk * dv;
    ChunkWs w;
    chunk_ws_layout(&w, a.ws + (size_t)blockIdx.x * a.ws_stride, a.Cw, dk, dv, false, ws_sh, SM ? a.ws_shared : 0);
    for (int64_t it = blockIdx.x; it < a.items; it += gridDim.x) {
        Item m = item_of(a, it);
        int L = m.L;
        w.Dl = a.Ub + (m.bh * a.T + m.t0) * dv;
        chunk_prepare<BF>(a, w, &sh, chunk_in(a, m.b, m.h, m.t0), m.b, m.h, m.t0, L, PREP_P);
        const real *S0 = a.states + (m.bh * a.NC + m.c) * SS;
        int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * dk;
        real *oc = a.o + ((int64_t)m.b * a.T + m.t0) * a.ldv + (int64_t)m.h * dv;
        blk_mm<BF>(&sh, false, false, L, dv, dk, 1, a.q + ok, a.ldk, S0, dv, 0, oc, a.ldv);
        for (int e = tid; e < L * dv; e += GDN_NT) {
            int i = e / dv, j = e % dv;
            oc[(int64_t)i * a.ldv + j] *= w.bm[i];
        }
        __syncthreads();
        blk_mm<BF>(&sh, false, false, L, dv, L, 1, w.P, L, w.Dl, dv, 1, oc, a.ldv);
    }
}

// Whether per-chunk kernel k keeps its workspace in shared memory:
// ATTNLAB_GDN_WS = backward (the default: the backward's chunk kernel only),
// shared (every one) or global (none), read at each launch as the scans'
// ATTNLAB_GDN_SCAN_* are (gdn_scan.cu). The other kernels lose more to one
// block a multiprocessor than they gain (docs/gpu_perf.md).
bool gdn_ws_shared_on(GdnWsKernel k) {
    const char *e = getenv("ATTNLAB_GDN_WS");
    if (!e || !*e) e = "backward";
    ASSERT(!strcmp(e, "global") || !strcmp(e, "shared") || !strcmp(e, "backward"),
           "ATTNLAB_GDN_WS is '%s': say backward (the default), shared or global", e);
    return !strcmp(e, "shared") || (k == WS_BWD_CHUNK && !strcmp(e, "backward"));
}

size_t gdn_ws_last[2], gdn_in_last;

extern "C" size_t cu_gdn_ws_shared_last(bool backward) { return gdn_ws_last[backward]; }
extern "C" size_t cu_gdn_in_shared_last(void) { return gdn_in_last; }

// The forward's kernels of one precision (BF: bf16 products) and workspace (SM).
template <bool BF, bool SM> static void fwd_launch_ws(Node *n, GdnArgs &a) {
    static WsGrids grids;
    int gp, go;
#ifndef AG_DOUBLE
    if (BF && gdn_chunk64_takes(a)) {   // the same bits (gdn_chunk64.cu), without the workspace
        gdn_ws_last[0] = 0;
        gdn_fwd_prep64(a);
        gdn_scan(n, a, false);
        gdn_fwd_out64(a);
        return;
    }
#endif
    ws_plan<SM, SM>(n, a, false, k_gdn_fwd_prep<BF, SM>, k_gdn_fwd_out<BF, SM>, grids, &gp, &go);
    k_gdn_fwd_prep<BF, SM><<<gp, GDN_NT, a.ws_shared, cu_stream>>>(a);
    CU_LAUNCHED();
    gdn_scan(n, a, false);
    k_gdn_fwd_out<BF, SM><<<go, GDN_NT, a.ws_shared, cu_stream>>>(a);
    CU_LAUNCHED();
}

template <bool BF> static void fwd_launch(Node *n, GdnArgs &a) {
    if (gdn_ws_shared_on(WS_FWD)) fwd_launch_ws<BF, true>(n, a);
    else fwd_launch_ws<BF, false>(n, a);
}

extern "C" void cu_gdn_chunk_forward(Node *n) {
    GdnArgs a = gdn_args(n);
    chunk_rows(n, &a, false);
    int64_t SS = (int64_t)a.dk * a.dv;
    a.states = a.saved ? a.saved : (real *)tape_dalloc(n->tape, (size_t)(a.items * SS) * sizeof(real));
    // The node keeps whether its products were bf16 (the builder left 0: the
    // flag's CPU meaning), so that its backward rounds as this forward does.
    n->iarg[GDN_ARG_BF16] = cu_bf16_products();
#ifndef AG_DOUBLE
    if (n->iarg[GDN_ARG_BF16]) {
        fwd_launch<true>(n, a);
        return;
    }
#endif
    fwd_launch<false>(n, a);
}
