// gdn_scan.cu: step 2 of op_gdn's chunked form on the GPU, forward and
// backward (gdn_common.cuh has the plan of the passes): the recurrence of
// the state across chunks, split by blocks of NVB columns of the state,
//   forward   Delta = U - W S0,  S_C = bl S0 + Kd^T Delta
//   backward  dDelta = Kd dS + P^T dO,  dS0 = bl dS + Q^T dY - W^T dDelta
// (gdn_chunk.c and gdn_chunk_backward.c state the chunk's math).
//
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

#include "gdn_scan.cuh"

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
        cu_cp_commit();
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
        if (NS == 3) cu_cp_wait<1>();
        else cu_cp_wait<0>();
        __syncthreads();   // the tile's stage is in; the previous tile's steps are done
        if (scan_in(lo, hi, ahead)) {
            scan_load<BWD, NVB>(a, scan_stage(sm, (i + NS - 1) % NS), bh, b, h, j0, nv, ahead, has_x);
            ahead = scan_next<BWD>(a, ahead);
        }
        cu_cp_commit();
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
    static int s = 0;
    if (!s) {
        int dev = 0;
        CU_CHECK(cudaGetDevice(&dev));
        CU_CHECK(cudaDeviceGetAttribute(&s, cudaDevAttrMultiProcessorCount, dev));
    }
    *sms = s, *optin = cu_smem_optin();
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
    if (aligned16(a.Uin) && a.dv * rs % 16 == 0) a.scan_vec |= SCAN_VEC_U;
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

void gdn_scan(Node *n, GdnArgs &a, bool bwd) {
    if (bwd) scan_launch<true>(n, a);
    else scan_launch<false>(n, a);
}
