// ops_norm.c: RMSNorm over the last dimension and per-head L2 normalisation.
//
// Both scale each row (or head group) z by a factor r(z) = (c sum z^2 + eps)^-1/2
// and save r per row for the backward (derived next to each kernel).
// The GPU pairs (the same saved state) are in src/cuda/ops_norm.cu.
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "ops.h"
#include "ops_math.h"
#include "ops_vexp.h"

// Columns of dg each thread owns when reducing over rows.
#define NORM_ROWS_PER_BLOCK 256   // rows per partial sum of the weight gradient
#define NORM_MAX_BLOCKS 64

// ---- RMSNorm ----

typedef struct RmsSaved {
    real *rinv;     // (rows) 1 / sqrt(mean(x^2) + eps)
} RmsSaved;

// The rinv array of a recorded node (n->saved), or NULL when not recorded.
static real *rms_save(Node *n, int64_t rows) {
    if (!n->recorded) return NULL;
    RmsSaved *sv = tape_alloc(n->tape, sizeof *sv);
    sv->rinv = tape_dalloc(n->tape, (size_t)(rows ? rows : 1) * sizeof(real));
    n->saved = sv;
    return sv->rinv;
}

// One row of D: y = x r g (g NULL: 1), r = 1 / sqrt(mean(x^2) + eps); returns r.
static inline real rms_row(real *y, const real *x, const real *g, int D, double eps) {
    double ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < D; j++) ss += (double)x[j] * x[j];
    real r = (real)(1.0 / sqrt(ss / D + eps));
    if (g)
        for (int j = 0; j < D; j++) y[j] = x[j] * r * g[j];
    else
        for (int j = 0; j < D; j++) y[j] = x[j] * r;
    return r;
}

// One row's input gradient, with xh = x r and dxh = dy g (g NULL: 1):
// d = r (dxh - xh mean(dxh xh)), written, or added when `add`.
static inline void rms_row_grad(real *d, const real *x, const real *dy, const real *g, real r, int D, bool add) {
    double dot = 0;   // sum_j dxh_j xh_j
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j < D; j++) dot += (double)dy[j] * (g ? g[j] : 1) * x[j] * r;
    real c = (real)(dot / D);
    if (add)
        for (int j = 0; j < D; j++) d[j] += r * (dy[j] * (g ? g[j] : 1) - x[j] * r * c);
    else
        for (int j = 0; j < D; j++) d[j] = r * (dy[j] * (g ? g[j] : 1) - x[j] * r * c);
}

// in: x viewed as (rows, D), D = iarg[0] (the last dimension or a divisor of
// it: per-head norms), g (D) or NULL. farg[0]: eps.
static void rmsnorm_forward(Node *n) {
    const Tensor *x = n->in[0], *g = n->in[1];
    int D = n->iarg[0];
    int64_t rows = x->numel / D;
    real *y = n->out[0]->data, *rinv = rms_save(n, rows);
    const real *gd = g ? g->data : NULL;
    double eps = n->farg[0];
#pragma omp parallel for if (x->numel > OPS_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        real ri = rms_row(y + r * D, x->data + r * D, gd, D, eps);
        if (rinv) rinv[r] = ri;
    }
}

// dg += sum over rows of dy x / rms: a fixed number of row blocks (not the
// thread count) each sum a partial row in double, then the partials are
// added in block order, so the result is the same on any threads. The
// backwards fill the partials in the same pass as their dx rows (one read of
// x and dy instead of two).
static int64_t rms_blocks(int64_t rows) {
    int64_t nblk = rows / NORM_ROWS_PER_BLOCK;
    return nblk < 1 ? 1 : nblk > NORM_MAX_BLOCKS ? NORM_MAX_BLOCKS : nblk;
}

// acc (D) += dy x r over one row.
static inline void rms_dg_row(double *acc, const real *x, const real *dy, real r, int D) {
    for (int j = 0; j < D; j++) acc[j] += (double)(dy[j] * x[j] * r);
}

// dg (D) += the nblk partials (nblk, D), in block order.
static void rms_dg_sum(const double *part, int64_t nblk, int D, real *dg) {
    for (int j = 0; j < D; j++) {
        double s = 0;
        for (int64_t k = 0; k < nblk; k++) s += part[k * D + j];
        dg[j] += (real)s;
    }
}

// With xh = x r and dxh = dy * g:  dx = r (dxh - xh * mean(dxh * xh)),
// dg = sum over rows of dy * xh (rows visited in order per block).
static void rmsnorm_backward(Node *n) {
    const Tensor *x = n->in[0], *gt = n->in[1];
    const RmsSaved *sv = n->saved;
    int D = n->iarg[0];
    int64_t rows = x->numel / D;
    const real *dy = n->out[0]->grad, *X = x->data;
    const real *g = gt ? gt->data : NULL;
    bool fresh;
    real *dx = NODE_GRAD_FRESH(n, 0, &fresh), *dg = NODE_GRAD_IN(n, 1);
    if (!dg) {
        if (dx) {
#pragma omp parallel for if (x->numel > OPS_PAR_MIN) schedule(static)
            for (int64_t r = 0; r < rows; r++)
                rms_row_grad(dx + r * D, X + r * D, dy + r * D, g, sv->rinv[r], D, !fresh);
        }
        return;
    }
    int64_t nblk = rms_blocks(rows);
    double *part = tape_alloc(n->tape, (size_t)(nblk * D) * sizeof(double));   // (nblk, D)
#pragma omp parallel for if (rows * D > OPS_PAR_MIN && nblk > 1) schedule(static)
    for (int64_t k = 0; k < nblk; k++) {
        double *acc = part + k * D;
        for (int j = 0; j < D; j++) acc[j] = 0;
        for (int64_t r = rows * k / nblk; r < rows * (k + 1) / nblk; r++) {
            if (dx) rms_row_grad(dx + r * D, X + r * D, dy + r * D, g, sv->rinv[r], D, !fresh);
            rms_dg_row(acc, X + r * D, dy + r * D, sv->rinv[r], D);
        }
    }
    rms_dg_sum(part, nblk, D, dg);
}

static const OpDef OP_RMSNORM = {"rmsnorm", rmsnorm_forward, rmsnorm_backward,
                                 CUDA_PAIR(cu_rmsnorm_forward, cu_rmsnorm_backward)};

Tensor *op_rmsnorm_groups(Tape *tp, Tensor *x, Tensor *g, int group, double eps) {
    int D = x->shape[x->ndim - 1];
    ASSERT(D > 0, "rmsnorm: empty last dimension in %s", SHAPE(x));
    ASSERT(group > 0 && D % group == 0, "rmsnorm: group %d does not divide the last dimension of %s", group,
           SHAPE(x));
    ASSERT(eps >= 0, "rmsnorm: eps %g must be >= 0", eps);
    if (g)
        ASSERT(g->ndim == 1 && g->shape[0] == group, "rmsnorm: weight %s must be (%d), the normalised size in x %s",
               SHAPE(g), group, SHAPE(x));
    Tensor *y = tape_tensor(tp, x->ndim, x->shape);
    Node *n = tape_op(tp, &OP_RMSNORM, (Tensor *[]){x, g}, 2, &y, 1);
    n->iarg[0] = group;
    n->farg[0] = eps;
    tape_forward(n);
    return y;
}

Tensor *op_rmsnorm(Tape *tp, Tensor *x, Tensor *g, double eps) {
    return op_rmsnorm_groups(tp, x, g, x->shape[x->ndim - 1], eps);
}

// ---- residual add + RMSNorm ----
//
// h = a + b and y = RMSNorm(h) g in one pass: a pre-norm block's residual
// sum and the norm of the next sublayer. Backward: dh_total = dh + the norm's
// dx (rmsnorm above, with x = h), then da = db = dh_total.

static void add_rmsnorm_forward(Node *n) {
    const Tensor *a = n->in[0], *b = n->in[1], *g = n->in[2];
    int D = n->iarg[0];
    int64_t rows = a->numel / D;
    real *y = n->out[0]->data, *h = n->out[1]->data, *rinv = rms_save(n, rows);
    double eps = n->farg[0];
#pragma omp parallel for if (a->numel > OPS_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const real *ar = a->data + r * D, *br = b->data + r * D;
        real *hr = h + r * D;
        for (int j = 0; j < D; j++) hr[j] = ar[j] + br[j];
        real ri = rms_row(y + r * D, hr, g->data, D, eps);
        if (rinv) rinv[r] = ri;
    }
}

static void add_rmsnorm_backward(Node *n) {
    const Tensor *a = n->in[0];
    const real *g = n->in[2]->data, *h = n->out[1]->data;
    const RmsSaved *sv = n->saved;
    int D = n->iarg[0];
    int64_t rows = a->numel / D;
    const real *dy = n->out[0]->grad, *dh = n->out[1]->grad;   // either may be NULL: no contribution
    bool fa, fb;
    real *da = NODE_GRAD_FRESH(n, 0, &fa);
    real *db = NODE_GRAD_FRESH(n, 1, &fb);
    real *dg = dy ? NODE_GRAD_IN(n, 2) : NULL;
    if (!da && !db && !dg) return;
    // Blocks of rows as rms_dg_sum wants (one block when there is no dg): per
    // row, dh_total = dh + the norm's dx into t, stored to da and db, and the
    // row's dg terms.
    int64_t nblk = dg ? rms_blocks(rows) : 1;
    double *part = dg ? tape_alloc(n->tape, (size_t)(nblk * D) * sizeof(double)) : NULL;   // (nblk, D)
    size_t stride;
    unsigned char *slots = tape_thread_slots(n->tape, (size_t)D * sizeof(real), &stride);   // (no malloc per call)
#pragma omp parallel if (a->numel > OPS_PAR_MIN && (nblk > 1 || !dg))
    {
        real *t = (real *)(slots + (size_t)omp_get_thread_num() * stride);   // one row of dh_total
        if (dg) {
#pragma omp for schedule(static)
            for (int64_t k = 0; k < nblk; k++) {
                double *acc = part + k * D;
                for (int j = 0; j < D; j++) acc[j] = 0;
                for (int64_t r = rows * k / nblk; r < rows * (k + 1) / nblk; r++) {
                    if (da || db) {
                        for (int j = 0; j < D; j++) t[j] = dh ? dh[r * D + j] : 0;
                        rms_row_grad(t, h + r * D, dy + r * D, g, sv->rinv[r], D, true);
                        if (da) grad_store(da + r * D, t, D, fa);   // a == b: da was written, db adds to it
                        if (db) grad_store(db + r * D, t, D, fb);
                    }
                    rms_dg_row(acc, h + r * D, dy + r * D, sv->rinv[r], D);
                }
            }
        } else {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++) {
                for (int j = 0; j < D; j++) t[j] = dh ? dh[r * D + j] : 0;
                if (dy) rms_row_grad(t, h + r * D, dy + r * D, g, sv->rinv[r], D, true);
                if (da) grad_store(da + r * D, t, D, fa);
                if (db) grad_store(db + r * D, t, D, fb);
            }
        }
    }
    if (dg) rms_dg_sum(part, nblk, D, dg);
}

static const OpDef OP_ADD_RMSNORM = {"add_rmsnorm", add_rmsnorm_forward, add_rmsnorm_backward,
                                     CUDA_PAIR(cu_add_rmsnorm_forward, cu_add_rmsnorm_backward)};

Tensor *op_add_rmsnorm(Tape *tp, Tensor *a, Tensor *b, Tensor *g, double eps, Tensor **sum) {
    ASSERT(tensor_same_shape(a, b), "add_rmsnorm: a %s and b %s differ", SHAPE(a), SHAPE(b));
    int D = a->shape[a->ndim - 1];
    ASSERT(D > 0, "add_rmsnorm: empty last dimension in %s", SHAPE(a));
    ASSERT(eps >= 0, "add_rmsnorm: eps %g must be >= 0", eps);
    ASSERT(g && g->ndim == 1 && g->shape[0] == D,
           "add_rmsnorm: weight %s must be (%d), the last dimension of a %s", g ? SHAPE(g) : "(none)", D,
           SHAPE(a));
    ASSERT(sum, "add_rmsnorm: the sum output pointer is required");
    Tensor *y = tape_tensor(tp, a->ndim, a->shape), *h = tape_tensor(tp, a->ndim, a->shape);
    Node *n = tape_op(tp, &OP_ADD_RMSNORM, (Tensor *[]){a, b, g}, 3, (Tensor *[]){y, h}, 2);
    n->iarg[0] = D;
    n->farg[0] = eps;
    tape_forward(n);
    *sum = h;
    return y;
}

// ---- RMSNorm times a SiLU gate ----
//
// y = RMSNorm_group(x) g ⊙ silu(z): the output stage of the linear-family
// mixers (per-head norm of the mixer's output, gated by silu(u Wg)) in one
// pass, where rmsnorm then silu_mul wrote the normalised x and read it back,
// forward and backward. With xh = x r, n = xh g, s = sigmoid(z):
//   dz = dy n silu'(z),  dn = dy z s,  dx = rmsnorm's dx of dn,  dg += sum dn xh.
// Saves r per group, as rmsnorm does; n is recomputed in the backward.

// in: x, g (group), z (x's shape); iarg[0]: group; farg[0]: eps.
static void rms_gate_forward(Node *n) {
    const Tensor *x = n->in[0];
    const real *gw = n->in[1]->data, *Z = n->in[2]->data;
    int D = n->iarg[0];
    int64_t rows = x->numel / D;
    real *y = n->out[0]->data, *rinv = rms_save(n, rows);
    double eps = n->farg[0];
#pragma omp parallel for if (x->numel > OPS_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        real *yr = y + r * D;
        const real *zr = Z + r * D;
        real ri = rms_row(yr, x->data + r * D, gw, D, eps);
        if (rinv) rinv[r] = ri;
#ifdef OPS_VEXP
        for (int j = 0; j < D; j += 16) {
            __mmask16 m = v_lanes(j, D);
            __m512 z = v_load(zr + j, m);
            v_store(yr + j, m, _mm512_mul_ps(v_load(yr + j, m), _mm512_mul_ps(z, v_sigmoid(z))));
        }
#else
        for (int j = 0; j < D; j++) yr[j] *= zr[j] * r_sigmoid(zr[j]);
#endif
    }
}

#ifdef OPS_VEXP
// One row's dn = dy z s and, when dz, its dz = dy x r g silu'(z) (written
// when fz, else added), s = sigmoid(z): the loop of rms_gate_backward in
// vectors, with its roundings.
static inline void rms_gate_row_grad_v(real *restrict dn, real *dz, bool fz, const real *xr, const real *zr,
                                       const real *dyr, const real *gw, real ri, int D) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int j = 0; j < D; j += 16) {
        __mmask16 m = v_lanes(j, D);
        __m512 z = v_load(zr + j, m), s = v_sigmoid(z), dy = v_load(dyr + j, m);
        v_store(dn + j, m, _mm512_mul_ps(_mm512_mul_ps(dy, z), s));
        if (dz) {
            __m512 a = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(dy, v_load(xr + j, m)), _mm512_set1_ps(ri)),
                                     v_load(gw + j, m));
            // 1 + z (1 - s) in two roundings, as GCC makes the loop's
            __m512 sg = _mm512_mul_ps(s, _mm512_add_ps(one, v_mul_r(z, _mm512_sub_ps(one, s))));
            v_grad(dz + j, m, a, sg, fz, false);
        }
    }
}
#endif

static void rms_gate_backward(Node *n) {
    const Tensor *x = n->in[0];
    const real *X = x->data, *gw = n->in[1]->data, *Z = n->in[2]->data, *dy = n->out[0]->grad;
    const RmsSaved *sv = n->saved;
    int D = n->iarg[0];
    int64_t rows = x->numel / D;
    bool fx, fz;
    real *dx = NODE_GRAD_FRESH(n, 0, &fx), *dg = NODE_GRAD_IN(n, 1), *dz = NODE_GRAD_FRESH(n, 2, &fz);
    if (!dx && !dg && !dz) return;
    int64_t nblk = dg ? rms_blocks(rows) : 1;
    double *part = dg ? tape_alloc(n->tape, (size_t)(nblk * D) * sizeof(double)) : NULL;   // (nblk, D)
    size_t stride;
    unsigned char *slots = tape_thread_slots(n->tape, (size_t)D * sizeof(real), &stride);
#pragma omp parallel if (x->numel > OPS_PAR_MIN && (nblk > 1 || !dg))
    {
        real *dn = (real *)(slots + (size_t)omp_get_thread_num() * stride);   // one row of dL/dn
        // With dg: the fixed blocks of rms_dg_sum; without, rows split evenly.
        int64_t units = dg ? nblk : rows;
#pragma omp for schedule(static)
        for (int64_t k = 0; k < units; k++) {
            double *acc = dg ? part + k * D : NULL;
            if (acc)
                for (int j = 0; j < D; j++) acc[j] = 0;
            int64_t r0 = dg ? rows * k / nblk : k, r1 = dg ? rows * (k + 1) / nblk : k + 1;
            for (int64_t r = r0; r < r1; r++) {
                const real *xr = X + r * D, *zr = Z + r * D, *dyr = dy + r * D;
                real ri = sv->rinv[r];
#ifdef OPS_VEXP
                rms_gate_row_grad_v(dn, dz ? dz + r * D : NULL, fz, xr, zr, dyr, gw, ri, D);
#else
                for (int j = 0; j < D; j++) {
                    real s = r_sigmoid(zr[j]);
                    dn[j] = dyr[j] * zr[j] * s;
                    if (dz) {
                        real e = dyr[j] * xr[j] * ri * gw[j] * (s * (1 + zr[j] * (1 - s)));
                        dz[r * D + j] = fz ? e : dz[r * D + j] + e;
                    }
                }
#endif
                if (dx) rms_row_grad(dx + r * D, xr, dn, gw, ri, D, !fx);
                if (acc) rms_dg_row(acc, xr, dn, ri, D);
            }
        }
    }
    if (dg) rms_dg_sum(part, nblk, D, dg);
}

static const OpDef OP_RMSNORM_GATE = {"rmsnorm_gate", rms_gate_forward, rms_gate_backward,
                                      CUDA_PAIR(cu_rms_gate_forward, cu_rms_gate_backward)};

Tensor *op_rmsnorm_gate(Tape *tp, Tensor *x, Tensor *g, Tensor *z, int group, double eps) {
    int D = x->shape[x->ndim - 1];
    ASSERT(D > 0 && group > 0 && D % group == 0,
           "rmsnorm_gate: group %d must divide the last dimension of x %s", group, SHAPE(x));
    ASSERT(eps >= 0, "rmsnorm_gate: eps %g must be >= 0", eps);
    ASSERT(g && g->ndim == 1 && g->shape[0] == group, "rmsnorm_gate: weight %s must be (%d)", g ? SHAPE(g) : "NULL",
           group);
    ASSERT(z && tensor_same_shape(x, z), "rmsnorm_gate: gate z %s must have x's shape %s", z ? SHAPE(z) : "NULL",
           SHAPE(x));
    ASSERT(z != x, "rmsnorm_gate: x and z must be different tensors");
    Tensor *y = tape_tensor(tp, x->ndim, x->shape);
    Node *n = tape_op(tp, &OP_RMSNORM_GATE, (Tensor *[]){x, g, z}, 3, &y, 1);
    n->iarg[0] = group;
    n->farg[0] = eps;
    tape_forward(n);
    return y;
}

// ---- per-head L2 normalisation ----

#define L2NORM_EPS 1e-6

typedef struct L2Saved {
    real *rinv;     // (groups) 1 / sqrt(sum z^2 + 1e-6)
} L2Saved;

// x, y: (groups, hd) with hd = iarg[0]; y = s z r with s = farg[0] (1 but
// for op_l2norm_heads_scaled).
static void l2norm_forward(Node *n) {
    const Tensor *x = n->in[0];
    int hd = n->iarg[0];
    real s = (real)n->farg[0];
    int64_t groups = x->numel / hd;
    real *rinv = NULL;
    if (n->recorded) {
        L2Saved *sv = tape_alloc(n->tape, sizeof *sv);
        sv->rinv = rinv = tape_dalloc(n->tape, (size_t)(groups ? groups : 1) * sizeof(real));
        n->saved = sv;
    }
#pragma omp parallel for if (x->numel > OPS_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < groups; r++) {
        const real *z = x->data + r * hd;
        real *y = n->out[0]->data + r * hd;
        double ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int j = 0; j < hd; j++) ss += (double)z[j] * z[j];
        real ri = (real)(1.0 / sqrt(ss + L2NORM_EPS));
        if (rinv) rinv[r] = ri;
        if (s == 1)
            for (int j = 0; j < hd; j++) y[j] = z[j] * ri;
        else
            for (int j = 0; j < hd; j++) y[j] = z[j] * ri * s;
    }
}

// With yh = z r = y / s and dyh = s dy:  dz = r (dyh - yh <dyh, yh>)
// = r (s dy - y <dy, y> / s), written when dz is fresh, else added.
static void l2norm_backward(Node *n) {
    bool fresh;
    real *dx = NODE_GRAD_FRESH(n, 0, &fresh);
    if (!dx) return;
    const L2Saved *sv = n->saved;
    int hd = n->iarg[0];
    real s = (real)n->farg[0];
    int64_t groups = n->in[0]->numel / hd;
    const real *Y = n->out[0]->data, *G = n->out[0]->grad;
#pragma omp parallel for if (n->in[0]->numel > OPS_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < groups; r++) {
        const real *y = Y + r * hd, *g = G + r * hd;
        real *d = dx + r * hd;
        double dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j < hd; j++) dot += (double)g[j] * y[j];
        real ri = sv->rinv[r], c = (real)(dot / s);
        if (fresh)
            for (int j = 0; j < hd; j++) d[j] = ri * (s * g[j] - y[j] * c);
        else
            for (int j = 0; j < hd; j++) d[j] += ri * (s * g[j] - y[j] * c);
    }
}

static const OpDef OP_L2NORM_HEADS = {"l2norm_heads", l2norm_forward, l2norm_backward,
                                      CUDA_PAIR(cu_l2norm_forward, cu_l2norm_backward)};

Tensor *op_l2norm_heads_scaled(Tape *tp, Tensor *x, int head_dim, double scale) {
    int D = x->shape[x->ndim - 1];
    ASSERT(head_dim > 0 && D % head_dim == 0,
           "l2norm_heads: the last dimension of %s is not a multiple of head_dim %d", SHAPE(x), head_dim);
    ASSERT(scale > 0 && isfinite(scale), "l2norm_heads: scale %g must be positive and finite", scale);
    if (scale != 1 && tp->device != DEVICE_CPU)   // the GPU kernels have no scale: two nodes
        return op_scale(tp, op_l2norm_heads_scaled(tp, x, head_dim, 1), scale);
    Tensor *y = tape_tensor(tp, x->ndim, x->shape);
    Node *n = tape_op(tp, &OP_L2NORM_HEADS, &x, 1, &y, 1);
    n->iarg[0] = head_dim;
    n->farg[0] = scale;
    tape_forward(n);
    return y;
}

Tensor *op_l2norm_heads(Tape *tp, Tensor *x, int head_dim) { return op_l2norm_heads_scaled(tp, x, head_dim, 1); }
