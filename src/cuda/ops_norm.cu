// ops_norm.cu: RMSNorm (whole rows and per group), the fused residual add +
// RMSNorm, RMSNorm times a SiLU gate and per-head L2 normalisation on the GPU,
// the same formulas as ops_norm.c.
//
// Every row (or group) of D is one warp's: the lanes take the columns j =
// lane, lane + 32, ... and the row's sums (of x^2, of dy g x r) are reduced in
// double by a fixed butterfly, so a row's result does not depend on timing.
// The gain's gradient is a sum over rows: a fixed grid of row blocks writes
// double partials, then cu_sum_parts adds them in a fixed order (no atomics).
#include "cuda_internal.cuh"

// n->saved of every op here, as RmsSaved and L2Saved in ops_norm.c: the host
// struct, its array in device memory.
typedef struct {
    real *rinv;   // (rows) 1 / sqrt(c sum x^2 + eps)
} NormSaved;

#define NORM_WARPS 8   // rows (warps) per block of the row kernels
#define NORM_THREADS (NORM_WARPS * 32)
#define NORM_DG_THREADS 256
#define NORM_DG_MAX_BLOCKS 1024
#define L2NORM_EPS 1e-6   // as ops_norm.c

// The rinv array of a recorded node (n->saved), or NULL when not recorded.
static real *norm_save(Node *n, int64_t rows) {
    if (!n->recorded) return NULL;
    NormSaved *sv = (NormSaved *)tape_alloc(n->tape, sizeof *sv);
    sv->rinv = (real *)tape_dalloc(n->tape, (size_t)(rows ? rows : 1) * sizeof(real));
    n->saved = sv;
    return sv->rinv;
}

// A grid of whole warps over `rows` rows, each warp looping row += its stride.
static unsigned norm_grid(int64_t rows) {
    int64_t b = (rows + NORM_WARPS - 1) / NORM_WARPS;
    if (b < 1) b = 1;
    return (unsigned)(b > 65535 * 8 ? 65535 * 8 : b);
}

// The row loop of a warp. Every lane of a warp runs the same rows, so the
// whole warp is there for each shuffle.
#define ROW_FOR(r, rows)                                                                        \
    for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; r < (rows);         \
         r += ((int64_t)gridDim.x * blockDim.x) >> 5)

#include "ops_norm_vec.cuh"   // float32 rows of 32, 64, 128, ..., 1024 (vec_shape)

// ---- RMSNorm ----

// y = x r g (g NULL: 1), r = 1 / sqrt(mean(x^2) + eps) per row of D; rinv
// (rows) or NULL.
__global__ void k_rms_fwd(const real *x, const real *g, real *y, real *rinv, int64_t rows, int D, double eps) {
    int lane = threadIdx.x & 31;
    ROW_FOR(r, rows) {
        const real *xr = x + r * D;
        double ss = 0;
        for (int j = lane; j < D; j += 32) ss += (double)xr[j] * xr[j];
        ss = warp_sum(ss);
        real ri = (real)(1.0 / sqrt(ss / D + eps));
        real *yr = y + r * D;
        for (int j = lane; j < D; j += 32) yr[j] = g ? xr[j] * ri * g[j] : xr[j] * ri;
        if (rinv && lane == 0) rinv[r] = ri;
    }
}

// One row's input gradient, the warp's lanes together, with xh = x r and dxh
// = dy g (g NULL: 1): d = r (dxh - xh mean(dxh xh)), written (fresh) or added.
__device__ __forceinline__ void rms_row_grad(real *d, bool fresh, const real *x, const real *dy, const real *g,
                                             real r, int D, int lane) {
    double dot = 0;
    for (int j = lane; j < D; j += 32) dot += (double)dy[j] * (g ? g[j] : (real)1) * x[j] * r;
    real c = (real)(warp_sum(dot) / D);
    for (int j = lane; j < D; j += 32) {
        real e = r * (dy[j] * (g ? g[j] : (real)1) - x[j] * r * c);
        d[j] = fresh ? e : d[j] + e;
    }
}

__global__ void k_rms_dx(const real *x, const real *dy, const real *g, const real *rinv, real *dx, bool fresh,
                         int64_t rows, int D) {
    int lane = threadIdx.x & 31;
    ROW_FOR(r, rows) rms_row_grad(dx + r * D, fresh, x + r * D, dy + r * D, g, rinv[r], D, lane);
}

// The gain's gradient, dg = sum over rows of dn x r, with dn = dy, or for the
// gated norm dn = dy z sigmoid(z) (z non-NULL). Block (tile, k) sums the rows
// [rows k / nblk, rows (k + 1) / nblk) of cw columns: thread t takes column
// t % cw and every S-th row from t / cw, then the S sums of a column are
// added in order. part: (nblk, D).
__global__ void k_rms_dg_part(const real *x, const real *dy, const real *z, const real *rinv, double *part,
                              int64_t rows, int D, int nblk) {
    __shared__ double sh[NORM_DG_THREADS];
    int cw = D < NORM_DG_THREADS ? D : NORM_DG_THREADS, S = NORM_DG_THREADS / cw;
    int t = threadIdx.x, c = t % cw, s = t / cw, k = blockIdx.y;
    int64_t j = (int64_t)blockIdx.x * cw + c;
    int64_t r0 = rows * k / nblk, r1 = rows * (k + 1) / nblk;
    double acc = 0;
    if (s < S && j < D) {
        for (int64_t r = r0 + s; r < r1; r += S) {
            int64_t i = r * D + j;
            real dn = z ? dy[i] * z[i] * d_sigmoid(z[i]) : dy[i];
            acc += (double)(dn * x[i] * rinv[r]);
        }
    }
    sh[t] = acc;
    __syncthreads();
    if (s == 0 && j < D) {
        double tot = 0;
        for (int q = 0; q < S; q++) tot += sh[q * cw + c];
        part[(int64_t)k * D + j] = tot;
    }
}

// dg from rows (rows, D) of x, dy (and z): partials over a fixed number of row
// blocks, a function of the shape only, then their sum in a fixed order.
static void rms_dg(Node *n, const real *x, const real *dy, const real *z, const real *rinv, int64_t rows, int D,
                   real *dg, bool fresh) {
    int cw = D < NORM_DG_THREADS ? D : NORM_DG_THREADS, S = NORM_DG_THREADS / cw;
    int64_t want = (int64_t)2048 * NORM_DG_THREADS / (D < NORM_DG_THREADS ? NORM_DG_THREADS : D);
    int64_t nb = (rows + S - 1) / S;   // about one row per thread at least
    if (nb > want) nb = want;
    if (nb > NORM_DG_MAX_BLOCKS) nb = NORM_DG_MAX_BLOCKS;
    if (nb < 1) nb = 1;
    int nblk = (int)nb;
    double *part = (double *)tape_dalloc(n->tape, (size_t)nblk * D * sizeof(double));
    dim3 grid((unsigned)((D + cw - 1) / cw), (unsigned)nblk);
    k_rms_dg_part<<<grid, NORM_DG_THREADS, 0, cu_stream>>>(x, dy, z, rinv, part, rows, D, nblk);
    CU_LAUNCHED();
    cu_sum_parts(part, D, nblk, dg, fresh, 0);   // dg = or += the nblk partials
}

// in: x viewed as (rows, D), D = iarg[0], g (D) or NULL; farg[0]: eps.
extern "C" void cu_rmsnorm_forward(Node *n) {
    const Tensor *x = n->in[0], *g = n->in[1];
    int D = n->iarg[0];
    int64_t rows = x->numel / D;
    real *rinv = norm_save(n, rows);
    if (rows == 0) return;
    k_rms_fwd<<<norm_grid(rows), NORM_THREADS, 0, cu_stream>>>(x->data, g ? g->data : NULL, n->out[0]->data, rinv,
                                                               rows, D, n->farg[0]);
    CU_LAUNCHED();
}

// dx per row; dg over row blocks. dg is asked for last and added after dx is
// written: when g is x (one (D) tensor) dx's write comes first.
extern "C" void cu_rmsnorm_backward(Node *n) {
    const Tensor *x = n->in[0], *gt = n->in[1];
    const NormSaved *sv = (const NormSaved *)n->saved;
    int D = n->iarg[0];
    int64_t rows = x->numel / D;
    const real *dy = n->out[0]->grad, *g = gt ? gt->data : NULL;
    bool fx, fg;
    real *dx = CU_GRAD_FRESH(n, 0, &fx);
    real *dg = CU_GRAD_FRESH(n, 1, &fg);
    if (dx && rows > 0) {
        k_rms_dx<<<norm_grid(rows), NORM_THREADS, 0, cu_stream>>>(x->data, dy, g, sv->rinv, dx, fx, rows, D);
        CU_LAUNCHED();
    }
    if (dg) rms_dg(n, x->data, dy, NULL, sv->rinv, rows, D, dg, fg);
}

// ---- residual add + RMSNorm ----

// h = a + b, y = RMSNorm(h) g per row of D.
__global__ void k_add_rms_fwd(const real *a, const real *b, const real *g, real *y, real *h, real *rinv,
                              int64_t rows, int D, double eps) {
    int lane = threadIdx.x & 31;
    ROW_FOR(r, rows) {
        int64_t o = r * D;
        double ss = 0;
        for (int j = lane; j < D; j += 32) {
            real v = a[o + j] + b[o + j];
            h[o + j] = v;
            ss += (double)v * v;
        }
        ss = warp_sum(ss);
        real ri = (real)(1.0 / sqrt(ss / D + eps));
        for (int j = lane; j < D; j += 32) y[o + j] = h[o + j] * ri * g[j];   // this lane wrote h[o + j]
        if (rinv && lane == 0) rinv[r] = ri;
    }
}

// Per row t = dh (NULL: 0) + the norm's dx of dy (NULL: none), then da = t
// and db = t, each written (fresh) or added. a == b: da was written first
// (fresh), db then adds to it, element by element in one thread.
__global__ void k_add_rms_back(const real *h, const real *dy, const real *dh, const real *g, const real *rinv,
                               real *da, bool fa, real *db, bool fb, int64_t rows, int D) {
    int lane = threadIdx.x & 31;
    ROW_FOR(r, rows) {
        int64_t o = r * D;
        real ri = 0, c = 0;
        if (dy) {
            ri = rinv[r];
            double dot = 0;
            for (int j = lane; j < D; j += 32) dot += (double)dy[o + j] * g[j] * h[o + j] * ri;
            c = (real)(warp_sum(dot) / D);
        }
        for (int j = lane; j < D; j += 32) {
            real t = dh ? dh[o + j] : (real)0;
            if (dy) t += ri * (dy[o + j] * g[j] - h[o + j] * ri * c);
            if (da) da[o + j] = fa ? t : da[o + j] + t;
            if (db) db[o + j] = fb ? t : db[o + j] + t;
        }
    }
}

// in: a, b (one shape), g (D); out: y, h; iarg[0]: D; farg[0]: eps.
extern "C" void cu_add_rmsnorm_forward(Node *n) {
    const Tensor *a = n->in[0], *b = n->in[1], *g = n->in[2];
    int D = n->iarg[0];
    int64_t rows = a->numel / D;
    real *rinv = norm_save(n, rows);
    if (rows == 0) return;
#ifndef AG_DOUBLE
    int ts, nv;
    real *y = n->out[0]->data, *h = n->out[1]->data;
    if (vec_ok(D, &ts, &nv, {a->data, b->data, g->data, y, h}))
        vec_launch(ts, nv, [&](auto TS, auto NV) {
            k_add_rms_fwd_v<TS, NV><<<vec_grid(rows, TS, 65535 * 8), NORM_THREADS, 0, cu_stream>>>(
                (const float4 *)a->data, (const float4 *)b->data, (const float4 *)g->data, (float4 *)y, (float4 *)h,
                rinv, rows, n->farg[0]);
        });
    else
#endif
        k_add_rms_fwd<<<norm_grid(rows), NORM_THREADS, 0, cu_stream>>>(a->data, b->data, g->data, n->out[0]->data,
                                                                       n->out[1]->data, rinv, rows, D, n->farg[0]);
    CU_LAUNCHED();
}

// Either output's gradient may be NULL (no contribution). dg (only with dy)
// is asked for last and added after da and db are written: g may be a or b.
extern "C" void cu_add_rmsnorm_backward(Node *n) {
    const Tensor *a = n->in[0];
    const NormSaved *sv = (const NormSaved *)n->saved;
    const real *g = n->in[2]->data, *h = n->out[1]->data;
    int D = n->iarg[0];
    int64_t rows = a->numel / D;
    const real *dy = n->out[0]->grad, *dh = n->out[1]->grad;
    bool fa, fb, fg = false;
    real *da = CU_GRAD_FRESH(n, 0, &fa);
    real *db = CU_GRAD_FRESH(n, 1, &fb);
    real *dg = dy ? CU_GRAD_FRESH(n, 2, &fg) : NULL;
    if ((da || db) && rows > 0) {
#ifndef AG_DOUBLE
        int ts, nv;
        if (vec_ok(D, &ts, &nv, {h, dy, dh, g, da, db}))
            vec_launch(ts, nv, [&](auto TS, auto NV) {
                k_add_rms_back_v<TS, NV><<<vec_grid(rows, TS, 65535 * 8), NORM_THREADS, 0, cu_stream>>>(
                    (const float4 *)h, (const float4 *)dy, (const float4 *)dh, (const float4 *)g, sv->rinv,
                    (float4 *)da, fa, (float4 *)db, fb, rows);
            });
        else
#endif
            k_add_rms_back<<<norm_grid(rows), NORM_THREADS, 0, cu_stream>>>(h, dy, dh, g, sv->rinv, da, fa, db, fb,
                                                                            rows, D);
        CU_LAUNCHED();
    }
    if (dg) rms_dg(n, h, dy, NULL, sv->rinv, rows, D, dg, fg);
}

// ---- RMSNorm times a SiLU gate ----

// y = x r g silu(z) per group of D.
__global__ void k_rms_gate_fwd(const real *x, const real *g, const real *z, real *y, real *rinv, int64_t rows,
                               int D, double eps) {
    int lane = threadIdx.x & 31;
    ROW_FOR(r, rows) {
        int64_t o = r * D;
        double ss = 0;
        for (int j = lane; j < D; j += 32) ss += (double)x[o + j] * x[o + j];
        ss = warp_sum(ss);
        real ri = (real)(1.0 / sqrt(ss / D + eps));
        for (int j = lane; j < D; j += 32) {
            real zv = z[o + j];
            y[o + j] = x[o + j] * ri * g[j] * (zv * d_sigmoid(zv));
        }
        if (rinv && lane == 0) rinv[r] = ri;
    }
}

// With s = sigmoid(z), dn = dy z s: dz = dy x r g silu'(z) and dx = rmsnorm's
// dx of dn, each written (fresh) or added.
__global__ void k_rms_gate_back(const real *x, const real *g, const real *z, const real *dy, const real *rinv,
                                real *dx, bool fx, real *dz, bool fz, int64_t rows, int D) {
    int lane = threadIdx.x & 31;
    ROW_FOR(r, rows) {
        int64_t o = r * D;
        real ri = rinv[r];
        double dot = 0;   // sum_j dn_j g_j x_j r
        for (int j = lane; j < D; j += 32) {
            real zv = z[o + j], s = d_sigmoid(zv), dn = dy[o + j] * zv * s;
            if (dz) {
                real e = dy[o + j] * x[o + j] * ri * g[j] * (s * ((real)1 + zv * ((real)1 - s)));
                dz[o + j] = fz ? e : dz[o + j] + e;
            }
            dot += (double)dn * g[j] * x[o + j] * ri;
        }
        real c = (real)(warp_sum(dot) / D);
        if (!dx) continue;   // the whole warp skips together
        for (int j = lane; j < D; j += 32) {
            real zv = z[o + j], dn = dy[o + j] * zv * d_sigmoid(zv);
            real e = ri * (dn * g[j] - x[o + j] * ri * c);
            dx[o + j] = fx ? e : dx[o + j] + e;
        }
    }
}

// in: x, g (D), z (x's shape, not x); iarg[0]: D (the group); farg[0]: eps.
extern "C" void cu_rms_gate_forward(Node *n) {
    const Tensor *x = n->in[0];
    int D = n->iarg[0];
    int64_t rows = x->numel / D;
    real *rinv = norm_save(n, rows);
    if (rows == 0) return;
    const real *g = n->in[1]->data, *z = n->in[2]->data;
    real *y = n->out[0]->data;
#ifndef AG_DOUBLE
    int ts, nv;
    if (vec_ok(D, &ts, &nv, {x->data, g, z, y}))
        vec_launch(ts, nv, [&](auto TS, auto NV) {
            k_rms_gate_fwd_v<TS, NV><<<vec_grid(rows, TS, 65535 * 8), NORM_THREADS, 0, cu_stream>>>(
                (const float4 *)x->data, (const float4 *)g, (const float4 *)z, (float4 *)y, rinv, rows, n->farg[0]);
        });
    else
#endif
        k_rms_gate_fwd<<<norm_grid(rows), NORM_THREADS, 0, cu_stream>>>(x->data, g, z, y, rinv, rows, D, n->farg[0]);
    CU_LAUNCHED();
}

// dx and dz are asked for first and written by one kernel (x != z); dg last,
// added after them: g may be x or z.
extern "C" void cu_rms_gate_backward(Node *n) {
    const Tensor *x = n->in[0];
    const NormSaved *sv = (const NormSaved *)n->saved;
    const real *g = n->in[1]->data, *z = n->in[2]->data, *dy = n->out[0]->grad;
    int D = n->iarg[0];
    int64_t rows = x->numel / D;
    bool fx, fz, fg;
    real *dx = CU_GRAD_FRESH(n, 0, &fx);
    real *dz = CU_GRAD_FRESH(n, 2, &fz);
    real *dg = CU_GRAD_FRESH(n, 1, &fg);
#ifndef AG_DOUBLE
    int ts, nv;
    if (rows > 0 && vec_ok(D, &ts, &nv, {x->data, g, z, dy, dx, dz})) {
        bool fuse = dg && D <= 256;   // the gain's partials in the same pass (k_rms_gate_back_v)
        unsigned nb = vec_grid(rows, ts, fuse ? VEC_DG_BLOCKS : 65535 * 8);
        double *part = fuse ? (double *)tape_dalloc(n->tape, (size_t)nb * D * sizeof(double)) : NULL;
        if (dx || dz || fuse) {
            vec_launch(ts, nv, [&](auto TS, auto NV) {
                k_rms_gate_back_v<TS, NV><<<nb, NORM_THREADS, 0, cu_stream>>>(
                    (const float4 *)x->data, (const float4 *)g, (const float4 *)z, (const float4 *)dy, sv->rinv,
                    (float4 *)dx, fx, (float4 *)dz, fz, part, rows);
            });
            CU_LAUNCHED();
        }
        if (fuse) cu_sum_parts(part, D, (int)nb, dg, fg, 0);
        else if (dg) rms_dg(n, x->data, dy, z, sv->rinv, rows, D, dg, fg);
        return;
    }
#endif
    if ((dx || dz) && rows > 0) {
        k_rms_gate_back<<<norm_grid(rows), NORM_THREADS, 0, cu_stream>>>(x->data, g, z, dy, sv->rinv, dx, fx, dz,
                                                                         fz, rows, D);
        CU_LAUNCHED();
    }
    if (dg) rms_dg(n, x->data, dy, z, sv->rinv, rows, D, dg, fg);
}

// ---- per-head L2 normalisation ----

// y = x r, r = 1 / sqrt(sum x^2 + 1e-6) per group of hd.
__global__ void k_l2_fwd(const real *x, real *y, real *rinv, int64_t groups, int hd) {
    int lane = threadIdx.x & 31;
    ROW_FOR(r, groups) {
        int64_t o = r * hd;
        double ss = 0;
        for (int j = lane; j < hd; j += 32) ss += (double)x[o + j] * x[o + j];
        ss = warp_sum(ss);
        real ri = (real)(1.0 / sqrt(ss + L2NORM_EPS));
        for (int j = lane; j < hd; j += 32) y[o + j] = x[o + j] * ri;
        if (rinv && lane == 0) rinv[r] = ri;
    }
}

// dx = r (dy - y <dy, y>), written (fresh) or added.
__global__ void k_l2_back(const real *y, const real *dy, const real *rinv, real *dx, bool fresh, int64_t groups,
                          int hd) {
    int lane = threadIdx.x & 31;
    ROW_FOR(r, groups) {
        int64_t o = r * hd;
        double dot = 0;
        for (int j = lane; j < hd; j += 32) dot += (double)dy[o + j] * y[o + j];
        real ri = rinv[r], c = (real)warp_sum(dot);
        for (int j = lane; j < hd; j += 32) {
            real e = ri * (dy[o + j] - y[o + j] * c);
            dx[o + j] = fresh ? e : dx[o + j] + e;
        }
    }
}

// x, y: (groups, hd), hd = iarg[0]
extern "C" void cu_l2norm_forward(Node *n) {
    const Tensor *x = n->in[0];
    int hd = n->iarg[0];
    int64_t groups = x->numel / hd;
    real *rinv = norm_save(n, groups);
    if (groups == 0) return;
    real *y = n->out[0]->data;
#ifndef AG_DOUBLE
    int ts, nv;
    if (vec_ok(hd, &ts, &nv, {x->data, y}))
        vec_launch(ts, nv, [&](auto TS, auto NV) {
            k_l2_fwd_v<TS, NV><<<vec_grid(groups, TS, 65535 * 8), NORM_THREADS, 0, cu_stream>>>(
                (const float4 *)x->data, (float4 *)y, rinv, groups);
        });
    else
#endif
        k_l2_fwd<<<norm_grid(groups), NORM_THREADS, 0, cu_stream>>>(x->data, y, rinv, groups, hd);
    CU_LAUNCHED();
}

extern "C" void cu_l2norm_backward(Node *n) {
    bool fresh;
    real *dx = CU_GRAD_FRESH(n, 0, &fresh);
    int hd = n->iarg[0];
    int64_t groups = n->in[0]->numel / hd;
    if (!dx || groups == 0) return;
    const NormSaved *sv = (const NormSaved *)n->saved;
    const real *y = n->out[0]->data, *dy = n->out[0]->grad;
#ifndef AG_DOUBLE
    int ts, nv;
    if (vec_ok(hd, &ts, &nv, {y, dy, dx}))
        vec_launch(ts, nv, [&](auto TS, auto NV) {
            k_l2_back_v<TS, NV><<<vec_grid(groups, TS, 65535 * 8), NORM_THREADS, 0, cu_stream>>>(
                (const float4 *)y, (const float4 *)dy, sv->rinv, (float4 *)dx, fresh, groups);
        });
    else
#endif
        k_l2_back<<<norm_grid(groups), NORM_THREADS, 0, cu_stream>>>(y, dy, sv->rinv, dx, fresh, groups, hd);
    CU_LAUNCHED();
}
