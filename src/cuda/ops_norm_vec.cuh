// ops_norm_vec.cuh: the row kernels of ops_norm.cu in float32 for rows (or
// groups) of 32, 64, 128, 256, 512 or 1024 reals with every array 16-byte
// aligned, the shapes of the models' norms (d_model, heads of 64). Included
// by ops_norm.cu only, after its helpers.
//
// A team of TS lanes (8, 16 or 32 of a warp) takes a row; lane l holds the
// NV float4 at l, l + TS, ... of it (so a warp's loads are whole lines) from
// the load to the store, so each input is read once. The row's sums are in
// double, each lane's terms in column order, then the team's by a fixed
// butterfly: a row's result does not depend on timing. Every warp runs the
// same number of row steps (a team past the last row adds nothing), so the
// shuffles have all 32 lanes.
//
// rmsnorm_gate's backward at rows up to 256 also sums the gain's gradient as
// it goes: each lane its columns over its team's rows, then the block's teams
// in order into one partial row per block (a grid that is a function of the
// shape), then cu_sum_parts: no second pass over x, z and dy.
#ifndef AG_DOUBLE
#include <initializer_list>
#include <type_traits>

#define VEC_DG_BLOCKS 1024   // rmsnorm_gate's backward with the gain's partials: at most this many blocks

// Rows of D (TS lanes a row, NV float4 a lane), or false where the scalar kernels take them.
static bool vec_shape(int D, int *ts, int *nv) {
    if (D == 32 || D == 64) {
        *ts = D / 4, *nv = 1;
        return true;
    }
    if (D % 128 || D > 1024 || ((D / 128) & (D / 128 - 1))) return false;   // 128 x 1, 2, 4, 8
    *ts = 32, *nv = D / 128;
    return true;
}

// Whether rows of D take the kernels here: a shape of vec_shape and every
// array of ps (NULL or not) 16-byte aligned.
static bool vec_ok(int D, int *ts, int *nv, std::initializer_list<const void *> ps) {
    for (const void *p : ps)
        if ((uintptr_t)p & 15) return false;
    return vec_shape(D, ts, nv);
}

// Calls f(integral_constant TS, integral_constant NV) for the (ts, nv) of vec_shape.
template <typename F> static void vec_launch(int ts, int nv, F f) {
    using std::integral_constant;
    if (ts == 8) f(integral_constant<int, 8>(), integral_constant<int, 1>());
    else if (ts == 16) f(integral_constant<int, 16>(), integral_constant<int, 1>());
    else if (nv == 1) f(integral_constant<int, 32>(), integral_constant<int, 1>());
    else if (nv == 2) f(integral_constant<int, 32>(), integral_constant<int, 2>());
    else if (nv == 4) f(integral_constant<int, 32>(), integral_constant<int, 4>());
    else f(integral_constant<int, 32>(), integral_constant<int, 8>());
}

// Blocks of NORM_THREADS for `rows` rows at 32 / ts rows a warp, at most cap.
static unsigned vec_grid(int64_t rows, int ts, int64_t cap) {
    int64_t tpw = 32 / ts, warps = (rows + tpw - 1) / tpw, b = (warps + NORM_WARPS - 1) / NORM_WARPS;
    if (b < 1) b = 1;
    return (unsigned)(b > cap ? cap : b);
}

// The row steps of a team: w runs over the warp's steps, the same for all its
// lanes; at step w the team's row is TEAM_ROW(w, TS), if below the rows.
#define TEAM_FOR(w, rows, TS)                                                                                       \
    for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5,                                          \
                 w##_end = ((rows) + 32 / (TS) - 1) / (32 / (TS));                                                   \
         w < w##_end; w += ((int64_t)gridDim.x * blockDim.x) >> 5)
#define TEAM_ROW(w, TS) ((w) * (32 / (TS)) + (int64_t)(threadIdx.x & 31) / (TS))

// The sum of v over the team's TS lanes (a butterfly inside the team).
template <int TS> __device__ __forceinline__ double team_sum(double v) {
#pragma unroll
    for (int o = TS / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float4 f4_zero() { return make_float4(0.f, 0.f, 0.f, 0.f); }

// d = e (fresh) or d + e, element by element.
__device__ __forceinline__ void f4_put(float4 *d, float4 e, bool fresh) {
    if (!fresh) {
        float4 o = *d;
        e = make_float4(o.x + e.x, o.y + e.y, o.z + e.z, o.w + e.w);
    }
    *d = e;
}

// Column c of a float4 (the loops below take c = 0..3, unrolled: registers).
__device__ __forceinline__ float &f4_at(float4 &v, int c) { return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w; }
__device__ __forceinline__ float f4_at(const float4 &v, int c) {
    return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

// ---- residual add + RMSNorm

template <int TS, int NV>
__global__ void __launch_bounds__(NORM_THREADS)
    k_add_rms_fwd_v(const float4 *a, const float4 *b, const float4 *g, float4 *y, float4 *h, float *rinv,
                    int64_t rows, double eps) {
    constexpr int D4 = TS * NV;
    int l = threadIdx.x % TS;
    TEAM_FOR(w, rows, TS) {
        int64_t r = TEAM_ROW(w, TS);
        bool ok = r < rows;
        float4 v[NV];
        double ss = 0;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            v[i] = f4_zero();
            if (!ok) continue;
            int64_t e = r * D4 + l + TS * i;
            float4 p = a[e], q = b[e];
            v[i] = make_float4(p.x + q.x, p.y + q.y, p.z + q.z, p.w + q.w);
            h[e] = v[i];
#pragma unroll
            for (int c = 0; c < 4; c++) ss += (double)f4_at(v[i], c) * f4_at(v[i], c);
        }
        ss = team_sum<TS>(ss);
        float ri = (float)(1.0 / sqrt(ss / (4 * D4) + eps));
        if (!ok) continue;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            float4 gg = __ldg(g + l + TS * i), o = f4_zero();
#pragma unroll
            for (int c = 0; c < 4; c++) f4_at(o, c) = f4_at(v[i], c) * ri * f4_at(gg, c);
            y[r * D4 + l + TS * i] = o;
        }
        if (rinv && l == 0) rinv[r] = ri;
    }
}

// k_add_rms_back's rows: t = dh (NULL: 0) + the norm's dx of dy (NULL:
// none), da and db each written (fresh) or added (a == b: da first, then db
// adds to it in the same thread).
template <int TS, int NV>
__global__ void __launch_bounds__(NORM_THREADS)
    k_add_rms_back_v(const float4 *h, const float4 *dy, const float4 *dh, const float4 *g, const float *rinv,
                     float4 *da, bool fa, float4 *db, bool fb, int64_t rows) {
    constexpr int D4 = TS * NV;
    int l = threadIdx.x % TS;
    TEAM_FOR(w, rows, TS) {
        int64_t r = TEAM_ROW(w, TS);
        bool ok = r < rows;
        float4 hv[NV], dv[NV];
        float ri = 0, cc = 0;
#pragma unroll
        for (int i = 0; i < NV; i++) hv[i] = dv[i] = f4_zero();
        if (dy) {
            double dot = 0;
            if (ok) ri = rinv[r];
#pragma unroll
            for (int i = 0; i < NV; i++) {
                if (!ok) continue;
                int64_t e = r * D4 + l + TS * i;
                hv[i] = h[e], dv[i] = dy[e];
                float4 gg = __ldg(g + l + TS * i);
#pragma unroll
                for (int c = 0; c < 4; c++) dot += (double)f4_at(dv[i], c) * f4_at(gg, c) * f4_at(hv[i], c) * ri;
            }
            cc = (float)(team_sum<TS>(dot) / (4 * D4));
        }
        if (!ok) continue;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            int64_t e = r * D4 + l + TS * i;
            float4 t = dh ? dh[e] : f4_zero();
            if (dy) {
                float4 gg = __ldg(g + l + TS * i);
#pragma unroll
                for (int c = 0; c < 4; c++)
                    f4_at(t, c) = f4_at(t, c) + ri * (f4_at(dv[i], c) * f4_at(gg, c) - f4_at(hv[i], c) * ri * cc);
            }
            if (da) f4_put(da + e, t, fa);
            if (db) f4_put(db + e, t, fb);
        }
    }
}

// ---- RMSNorm times a SiLU gate

template <int TS, int NV>
__global__ void __launch_bounds__(NORM_THREADS)
    k_rms_gate_fwd_v(const float4 *x, const float4 *g, const float4 *z, float4 *y, float *rinv, int64_t rows,
                     double eps) {
    constexpr int D4 = TS * NV;
    int l = threadIdx.x % TS;
    TEAM_FOR(w, rows, TS) {
        int64_t r = TEAM_ROW(w, TS);
        bool ok = r < rows;
        float4 xv[NV], zv[NV];
        double ss = 0;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            xv[i] = zv[i] = f4_zero();
            if (!ok) continue;
            int64_t e = r * D4 + l + TS * i;
            xv[i] = x[e], zv[i] = z[e];
#pragma unroll
            for (int c = 0; c < 4; c++) ss += (double)f4_at(xv[i], c) * f4_at(xv[i], c);
        }
        ss = team_sum<TS>(ss);
        float ri = (float)(1.0 / sqrt(ss / (4 * D4) + eps));
        if (!ok) continue;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            float4 gg = __ldg(g + l + TS * i), o = f4_zero();
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float zc = f4_at(zv[i], c);
                f4_at(o, c) = f4_at(xv[i], c) * ri * f4_at(gg, c) * (zc * d_sigmoid(zc));
            }
            y[r * D4 + l + TS * i] = o;
        }
        if (rinv && l == 0) rinv[r] = ri;
    }
}

// k_rms_gate_back's rows (dn = dy z sigmoid(z); dz = dy x r g silu'(z), dx
// = rmsnorm's dx of dn; either NULL), and with part (D <= 256) the gain's
// gradient dg = sum over rows of dn x r: the block's partial row into
// part[blockIdx.x] (D doubles).
template <int TS, int NV>
__global__ void __launch_bounds__(NORM_THREADS)
    k_rms_gate_back_v(const float4 *x, const float4 *g, const float4 *z, const float4 *dy, const float *rinv,
                      float4 *dx, bool fx, float4 *dz, bool fz, double *part, int64_t rows) {
    constexpr int D4 = TS * NV, D = 4 * D4, TEAMS = NORM_THREADS / TS;
    constexpr bool DG = D <= 256;   // the gain's partials here (else rms_dg's pass)
    constexpr int RED = DG ? TEAMS * D : 1;
    __shared__ double red[RED];
    int l = threadIdx.x % TS;
    double acc[NV][4];
#pragma unroll
    for (int i = 0; i < NV; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[i][c] = 0;
    TEAM_FOR(w, rows, TS) {
        int64_t r = TEAM_ROW(w, TS);
        bool ok = r < rows;
        float4 xv[NV], dn[NV];
        float ri = ok ? rinv[r] : 0.f;
        double dot = 0;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            xv[i] = dn[i] = f4_zero();
            if (!ok) continue;
            int64_t e = r * D4 + l + TS * i;
            float4 zv = z[e], dv = dy[e], gg = __ldg(g + l + TS * i), ez = f4_zero();
            xv[i] = x[e];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float zc = f4_at(zv, c), s = d_sigmoid(zc), d = f4_at(dv, c) * zc * s, xc = f4_at(xv[i], c);
                f4_at(dn[i], c) = d;
                f4_at(ez, c) = f4_at(dv, c) * xc * ri * f4_at(gg, c) * (s * (1.f + zc * (1.f - s)));
                dot += (double)d * f4_at(gg, c) * xc * ri;
                if (DG && part) acc[i][c] += (double)(d * xc * ri);
            }
            if (dz) f4_put(dz + e, ez, fz);
        }
        float cc = (float)(team_sum<TS>(dot) / D);
        if (!ok || !dx) continue;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            float4 gg = __ldg(g + l + TS * i), e = f4_zero();
#pragma unroll
            for (int c = 0; c < 4; c++) f4_at(e, c) = ri * (f4_at(dn[i], c) * f4_at(gg, c) - f4_at(xv[i], c) * ri * cc);
            f4_put(dx + r * D4 + l + TS * i, e, fx);
        }
    }
    if (!DG || !part) return;   // (the same in every thread)
    int team = threadIdx.x / TS;
#pragma unroll
    for (int i = 0; i < NV; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) red[team * D + 4 * (l + TS * i) + c] = acc[i][c];
    __syncthreads();
    for (int j = threadIdx.x; j < D; j += NORM_THREADS) {
        double s = 0;
        for (int k = 0; k < TEAMS; k++) s += red[k * D + j];
        part[(int64_t)blockIdx.x * D + j] = s;
    }
}

// ---- per-head L2 normalisation

template <int TS, int NV>
__global__ void __launch_bounds__(NORM_THREADS)
    k_l2_fwd_v(const float4 *x, float4 *y, float *rinv, int64_t groups) {
    constexpr int D4 = TS * NV;
    int l = threadIdx.x % TS;
    TEAM_FOR(w, groups, TS) {
        int64_t r = TEAM_ROW(w, TS);
        bool ok = r < groups;
        float4 xv[NV];
        double ss = 0;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            xv[i] = ok ? x[r * D4 + l + TS * i] : f4_zero();
#pragma unroll
            for (int c = 0; c < 4; c++) ss += (double)f4_at(xv[i], c) * f4_at(xv[i], c);
        }
        ss = team_sum<TS>(ss);
        float ri = (float)(1.0 / sqrt(ss + L2NORM_EPS));
        if (!ok) continue;
#pragma unroll
        for (int i = 0; i < NV; i++)
            y[r * D4 + l + TS * i] = make_float4(xv[i].x * ri, xv[i].y * ri, xv[i].z * ri, xv[i].w * ri);
        if (rinv && l == 0) rinv[r] = ri;
    }
}

template <int TS, int NV>
__global__ void __launch_bounds__(NORM_THREADS)
    k_l2_back_v(const float4 *y, const float4 *dy, const float *rinv, float4 *dx, bool fresh, int64_t groups) {
    constexpr int D4 = TS * NV;
    int l = threadIdx.x % TS;
    TEAM_FOR(w, groups, TS) {
        int64_t r = TEAM_ROW(w, TS);
        bool ok = r < groups;
        float4 yv[NV], dv[NV];
        double dot = 0;
#pragma unroll
        for (int i = 0; i < NV; i++) {
            yv[i] = dv[i] = f4_zero();
            if (!ok) continue;
            int64_t e = r * D4 + l + TS * i;
            yv[i] = y[e], dv[i] = dy[e];
#pragma unroll
            for (int c = 0; c < 4; c++) dot += (double)f4_at(dv[i], c) * f4_at(yv[i], c);
        }
        float cc = (float)team_sum<TS>(dot);
        if (!ok) continue;
        float ri = rinv[r];
#pragma unroll
        for (int i = 0; i < NV; i++) {
            float4 e = f4_zero();
#pragma unroll
            for (int c = 0; c < 4; c++) f4_at(e, c) = ri * (f4_at(dv[i], c) - f4_at(yv[i], c) * cc);
            f4_put(dx + r * D4 + l + TS * i, e, fresh);
        }
    }
}

#undef TEAM_FOR
#undef TEAM_ROW
#endif
