// gdn_scan.cuh: the scans' shared-memory layout and per-tile steps (the
// section "the scans" of gdn_scan.cu's header says what they compute):
// the stages that cp.async fills, a tile's rows of Delta (dDelta) from the
// state (scan_rows: Delta_t = U_t - sum_k W_tk S_k, or dDelta_t = sum_k
// (ek_t K_tk) dS_k + (P^T dO)_t) and the state's rows from them (scan_cols:
// acc_k += sum_t (ek_t K_tk) Delta_t, or sum_t W_tk dDelta_t). Included by
// gdn_scan.cu only.
#ifndef AG_GDN_SCAN_CUH
#define AG_GDN_SCAN_CUH

#include "gdn_common.cuh"

#define SCAN_RMAX 64   // most rows of a tile

enum { SCAN_VEC_W = 1, SCAN_VEC_K = 2, SCAN_VEC_U = 4, SCAN_VEC_DS = 8 };   // GdnArgs.scan_vec
enum { SCAN_WHOLE, SCAN_LOCAL, SCAN_SEEDED };                                  // GdnArgs.scan_mode

// Pitch (in reals) of a W or K row in shared memory: dk rounded up to 128
// bytes, plus 16, so that the 16-byte loads of 8 consecutive rows at one k
// hit all 32 banks; a multiple of 16 bytes.
static __host__ __device__ inline int scan_pitch(int dk) {
    int r128 = 128 / (int)sizeof(real), r16 = 16 / (int)sizeof(real);
    return (dk + r128 - 1) / r128 * r128 + r16;
}

struct ScanStage {
    real *W, *K;    // (R, pitch) the tile's rows of W and K
    real *X;        // (R, NVB) forward U, backward P^T dO (with dO only), the block's columns
    real *ek, *bl;  // (R) ek of the rows, (1) bl of the chunk
    real *Y;        // backward (dk, NVB): the chunk's Q^T dY (with dO only, at the chunk's last tile)
};

struct ScanSmem {
    ScanStage st0;          // stage 0; stage s is `stride` bytes further each
    size_t stride;
    real *S;     // (dk, NVB) forward the state, backward its gradient
    real *D;     // (R, NVB) the tile's Delta (dDelta)
    real *Acc;   // (dk, NVB) step 2's sums between tiles of a chunk; NULL when chunks are one tile
};

static __host__ __device__ size_t scan_layout(ScanSmem *m, unsigned char *base, int ns, int R, int dk, int nvb,
                                              bool bwd, bool acc) {
    size_t at = 0, P = (size_t)scan_pitch(dk), Sn = (size_t)dk * nvb;
    size_t oW = ws_take(&at, R * P, sizeof(real)), oK = ws_take(&at, R * P, sizeof(real));
    size_t oX = ws_take(&at, (size_t)R * nvb, sizeof(real));
    size_t oe = ws_take(&at, R, sizeof(real)), ob = ws_take(&at, 1, sizeof(real));
    size_t oY = bwd ? ws_take(&at, Sn, sizeof(real)) : 0;
    size_t stride = at;
    at = stride * ns;
    size_t oS = ws_take(&at, Sn, sizeof(real)), oD = ws_take(&at, (size_t)R * nvb, sizeof(real));
    size_t oA = acc ? ws_take(&at, Sn, sizeof(real)) : 0;
    if (m) {
        ScanStage &t = m->st0;
        t.W = (real *)(base + oW), t.K = (real *)(base + oK), t.X = (real *)(base + oX);
        t.ek = (real *)(base + oe), t.bl = (real *)(base + ob);
        t.Y = bwd ? (real *)(base + oY) : NULL;
        m->stride = stride;
        m->S = (real *)(base + oS), m->D = (real *)(base + oD);
        m->Acc = acc ? (real *)(base + oA) : NULL;
    }
    return at;
}

// Four reals to shared memory (dst 16-byte aligned) from src, of which the
// first `valid` (1..4) exist; the others become 0. vec: src is 16-byte
// aligned (whole 16-byte copies), else one real at a time.
__device__ __forceinline__ void copy4(real *dst, const real *src, int valid, bool vec) {
    if (vec) {
        const int per = 16 / (int)sizeof(real);
        for (int h = 0; h < 4; h += per) {
            int n = min(max(valid - h, 0), per);
            cu_cp16(dst + h, n ? src + h : src, n * (int)sizeof(real));
        }
    } else {
        for (int u = 0; u < 4; u++)
            if (u < valid) cu_cp1(dst + u, src + u);
            else dst[u] = 0;
    }
}

__device__ __forceinline__ ScanStage scan_stage(const ScanSmem &m, int s) {
    size_t o = m.stride * s;
    ScanStage t;
    t.W = (real *)((unsigned char *)m.st0.W + o), t.K = (real *)((unsigned char *)m.st0.K + o);
    t.X = (real *)((unsigned char *)m.st0.X + o);
    t.ek = (real *)((unsigned char *)m.st0.ek + o), t.bl = (real *)((unsigned char *)m.st0.bl + o);
    t.Y = m.st0.Y ? (real *)((unsigned char *)m.st0.Y + o) : NULL;
    return t;
}

// Where a walk stands: chunk c, the tile of its rows from r0.
struct ScanPos {
    int c, r0;
};

template <bool BWD> __device__ __forceinline__ ScanPos scan_next(const GdnArgs &a, ScanPos p) {
    int L = min(a.C, a.T - p.c * a.C);
    if (p.r0 + a.scanR < L) return {p.c, p.r0 + a.scanR};
    return {BWD ? p.c - 1 : p.c + 1, 0};
}

// Whether p lies in the walk's chunks [lo, hi).
__device__ __forceinline__ bool scan_in(int lo, int hi, ScanPos p) { return p.c >= lo && p.c < hi; }

// A tile's operands into a stage (cp.async, not committed). All threads.
template <bool BWD, int NVB>
__device__ void scan_load(const GdnArgs &a, const ScanStage &st, int64_t bh, int b, int h, int j0, int nv,
                          ScanPos p, bool has_x) {
    int tid = threadIdx.x, dk = a.dk, P = a.scanP, g4 = (dk + 3) / 4;
    int t0 = p.c * a.C + p.r0, n = min(a.scanR, min(a.C, a.T - p.c * a.C) - p.r0);
    int64_t row0 = bh * a.T + t0;   // the op's rows
    const real *W = a.Wb + row0 * a.dk, *K = a.k + ((int64_t)b * a.T + t0) * a.ldk + (int64_t)h * dk;
    bool vW = a.scan_vec & SCAN_VEC_W, vK = a.scan_vec & SCAN_VEC_K, vU = a.scan_vec & SCAN_VEC_U;
    for (int e = tid; e < n * g4; e += GDN_NT) {
        int t = e / g4, c4 = e % g4 * 4, m = min(4, dk - c4);
        copy4(st.W + t * P + c4, W + (int64_t)t * dk + c4, m, vW);
        copy4(st.K + t * P + c4, K + (int64_t)t * a.ldk + c4, m, vK);
    }
    if (has_x) {
        int x4 = (nv + 3) / 4;
        for (int e = tid; e < n * x4; e += GDN_NT) {
            int t = e / x4, c4 = e % x4 * 4;
            copy4(st.X + t * NVB + c4, a.Uin + (row0 + t) * a.dv + j0 + c4, min(4, nv - c4), vU);
        }
    }
    for (int t = tid; t < n; t += GDN_NT) cu_cp1(st.ek + t, a.ekb + row0 + t);
    if (tid == 0) cu_cp1(st.bl, a.blb + bh * a.NC + p.c);
    if (BWD && has_x && p.r0 + a.scanR >= min(a.C, a.T - p.c * a.C)) {   // the chunk's last tile: its Q^T dY
        const real *Y = a.dsb + (bh * a.NC + p.c) * (int64_t)dk * a.dv + j0;
        int x4 = (nv + 3) / 4;
        for (int e = tid; e < dk * x4; e += GDN_NT) {
            int k = e / x4, c4 = e % x4 * 4;
            copy4(st.Y + k * NVB + c4, Y + (int64_t)k * a.dv + c4, min(4, nv - c4), a.scan_vec & SCAN_VEC_DS);
        }
    }
}

// What the steps of a tile read and write, for one thread (columns jj .. jj + 3 of the block's).
struct ScanCtx {
    int dk, dv, P, nv, jj, n;   // n: the tile's rows
    bool first, last, has_x;    // first, last tile of its chunk; X holds U or P^T dO
    bool wrD;                   // Delta (dDelta) goes to Ub
    ScanStage st;
    real *S, *D, *Acc;
    real *gD;    // the tile's first row of Ub, column j0
    real *gS;    // backward: the chunk's dS slot (column j0), where dS before the chunk's step goes, or NULL
    real *gR;    // where the state (its gradient) after the chunk's step goes (rows ldR apart), or NULL:
                 // forward the next chunk's slot or S_T, backward s0's gradient, or a group's end (SCAN_LOCAL)
    int ldR;
};

// Step 1 for rows t, t + RG, ..., MR of them.
template <bool BWD, int NVB, int MR> __device__ __forceinline__ void scan_rows(const ScanCtx &x, int t) {
    constexpr int RG = GDN_NT / (NVB / 4);
    real acc[MR][4], e[MR];
    const real *ar[MR];
#pragma unroll
    for (int m = 0; m < MR; m++) {
        ar[m] = (BWD ? x.st.K : x.st.W) + (t + m * RG) * x.P;
        e[m] = BWD ? x.st.ek[t + m * RG] : (real)1;
#pragma unroll
        for (int q = 0; q < 4; q++) acc[m][q] = 0;
    }
    int k = 0;
#pragma unroll 2
    for (; k + 4 <= x.dk; k += 4) {
        R4 s[4];
#pragma unroll
        for (int u = 0; u < 4; u++) s[u] = ld4(x.S + (k + u) * NVB + x.jj);
#pragma unroll
        for (int m = 0; m < MR; m++) {
            R4 w = ld4(ar[m] + k);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                real av = BWD ? e[m] * w.v[u] : w.v[u];
#pragma unroll
                for (int q = 0; q < 4; q++) acc[m][q] = fma(av, s[u].v[q], acc[m][q]);
            }
        }
    }
    for (; k < x.dk; k++) {
        R4 s = ld4(x.S + k * NVB + x.jj);
#pragma unroll
        for (int m = 0; m < MR; m++) {
            real av = BWD ? e[m] * ar[m][k] : ar[m][k];
#pragma unroll
            for (int q = 0; q < 4; q++) acc[m][q] = fma(av, s.v[q], acc[m][q]);
        }
    }
#pragma unroll
    for (int m = 0; m < MR; m++) {
        int tt = t + m * RG;
        R4 xv = {};
        if (x.has_x) xv = ld4(x.st.X + tt * NVB + x.jj);
        real d[4];
#pragma unroll
        for (int q = 0; q < 4; q++)
            d[q] = BWD ? (x.has_x ? acc[m][q] + xv.v[q] : acc[m][q]) : xv.v[q] - acc[m][q];
        st4(x.D + tt * NVB + x.jj, d);
        if (!x.wrD) continue;
        real *g = x.gD + (int64_t)tt * x.dv + x.jj;
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (x.jj + q < x.nv) g[q] = d[q];
    }
}

// Step 2 for rows k, k + RG, ..., MR of them, and at the chunk's last tile its end.
template <bool BWD, int NVB, int MR> __device__ __forceinline__ void scan_cols(const ScanCtx &x, int k) {
    constexpr int RG = GDN_NT / (NVB / 4);
    real acc[MR][4];
#pragma unroll
    for (int m = 0; m < MR; m++) {
        if (x.first) {
#pragma unroll
            for (int q = 0; q < 4; q++) acc[m][q] = 0;
        } else {
            R4 v = ld4(x.Acc + (k + m * RG) * NVB + x.jj);
#pragma unroll
            for (int q = 0; q < 4; q++) acc[m][q] = v.v[q];
        }
    }
    const real *A = (BWD ? x.st.W : x.st.K) + k;
#pragma unroll 4
    for (int t = 0; t < x.n; t++) {
        R4 d = ld4(x.D + t * NVB + x.jj);
        real e = BWD ? (real)1 : x.st.ek[t];
#pragma unroll
        for (int m = 0; m < MR; m++) {
            real av = A[t * x.P + m * RG];
            if (!BWD) av = e * av;
#pragma unroll
            for (int q = 0; q < 4; q++) acc[m][q] = fma(av, d.v[q], acc[m][q]);
        }
    }
#pragma unroll
    for (int m = 0; m < MR; m++) {
        int kk = k + m * RG;
        if (!x.last) {
            st4(x.Acc + kk * NVB + x.jj, acc[m]);
            continue;
        }
        real *sp = x.S + kk * NVB + x.jj, bl = *x.st.bl, r[4];
        R4 s = ld4(sp);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            if (BWD) {
                real y = x.has_x ? x.st.Y[kk * NVB + x.jj + q] : (real)0;
                r[q] = fma(bl, s.v[q], y) - acc[m][q];
            } else {
                r[q] = bl == 0 ? acc[m][q] : fma(bl, s.v[q], acc[m][q]);
            }
        }
        st4(sp, r);
        int64_t o = (int64_t)kk * x.dv + x.jj, oR = (int64_t)kk * x.ldR + x.jj;
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (x.jj + q < x.nv) {
                if (BWD && x.gS) x.gS[o + q] = s.v[q];
                if (x.gR) x.gR[oR + q] = r[q];
            }
    }
}

#endif
