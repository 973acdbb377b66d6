// ops_elementwise.c: add, sub, mul with suffix broadcasting; scale.
#include "ops.h"
#include "ops_math.h"

enum { EW_ADD, EW_SUB, EW_MUL };

// The reduction of a broadcast operand's gradient: blocks of at least
// EW_ROWS_PER_BLOCK rows, at most EW_MAX_BLOCKS of them and EW_PART_MAX
// partial sums in all.
#define EW_ROWS_PER_BLOCK 256
#define EW_MAX_BLOCKS 64
#define EW_PART_MAX ((int64_t)1 << 22)

// b's numel divides a's; element i of a meets element i % nb of b.
static void ew_forward(Node *n) {
    const Tensor *a = n->in[0], *b = n->in[1];
    real *o = n->out[0]->data;
    const real *x = a->data, *y = b->data;
    int64_t na = a->numel, nb = b->numel;
    int kind = n->iarg[0];
#pragma omp parallel for if (na > 65536) schedule(static)
    for (int64_t r = 0; r < na / nb; r++) {
        const real *xr = x + r * nb;
        real *orow = o + r * nb;
        switch (kind) {
        case EW_ADD: for (int64_t j = 0; j < nb; j++) orow[j] = xr[j] + y[j]; break;
        case EW_SUB: for (int64_t j = 0; j < nb; j++) orow[j] = xr[j] - y[j]; break;
        default: for (int64_t j = 0; j < nb; j++) orow[j] = xr[j] * y[j]; break;
        }
    }
}

// A fresh gradient is written, not added to (GRAD_WRITE_LOOP). da before db:
// when a and b are one tensor, db adds to what da wrote.
static void ew_backward(Node *n) {
    const Tensor *a = n->in[0], *b = n->in[1];
    const real *g = n->out[0]->grad, *x = a->data, *y = b->data;
    bool fa, fb;
    real *da = NODE_GRAD_FRESH(n, 0, &fa);
    real *db = NODE_GRAD_FRESH(n, 1, &fb);
    int64_t na = a->numel, nb = b->numel, rows = na / nb;
    int kind = n->iarg[0];
    if (da) {
        if (kind == EW_MUL && rows == 1) {
            GRAD_WRITE_LOOP(fa, na, da, g[i] * y[i]);
        } else if (kind == EW_MUL) {
#pragma omp parallel for if (na > 65536) schedule(static)
            for (int64_t r = 0; r < rows; r++) {
                const real *gr = g + r * nb;
                real *dr = da + r * nb;
                if (fa)
                    for (int64_t j = 0; j < nb; j++) dr[j] = gr[j] * y[j];
                else
                    for (int64_t j = 0; j < nb; j++) dr[j] += gr[j] * y[j];
            }
        } else {
            GRAD_WRITE_LOOP(fa, na, da, g[i]);
        }
    }
    if (db && rows == 1) {   // same shapes: elementwise, in parallel
        real sg = kind == EW_SUB ? -1 : 1;
        if (kind == EW_MUL) GRAD_WRITE_LOOP(fb, na, db, g[i] * x[i]);
        else GRAD_WRITE_LOOP(fb, na, db, sg * g[i]);
    } else if (db) {
        // Reduce over the broadcast rows: fixed blocks of rows (their number
        // depends on the shapes only, so the result does not depend on the
        // thread count), each summed in double into a partial, then the
        // partials in block order. (It ran on one thread: the mul op, mostly
        // mamba's D skip, took 1% of a mamba step's CPU time at d_model 256.)
        int64_t nblk = rows / EW_ROWS_PER_BLOCK;
        int64_t cap = EW_PART_MAX / nb;
        nblk = nblk > EW_MAX_BLOCKS ? EW_MAX_BLOCKS : nblk;
        nblk = nblk > cap ? cap : nblk;
        nblk = nblk < 1 ? 1 : nblk;
        double *part = tape_alloc(n->tape, (size_t)(nblk * nb) * sizeof(double));   // (nblk, nb)
        real sg = kind == EW_SUB ? -1 : 1;
#pragma omp parallel for if (na > OPS_PAR_MIN && nblk > 1) schedule(static)
        for (int64_t k = 0; k < nblk; k++) {
            double *acc = part + k * nb;
            for (int64_t j = 0; j < nb; j++) acc[j] = 0;
            for (int64_t r = rows * k / nblk; r < rows * (k + 1) / nblk; r++) {
                const real *gr = g + r * nb, *xr = x + r * nb;
                if (kind == EW_MUL)
                    for (int64_t j = 0; j < nb; j++) acc[j] += (double)gr[j] * xr[j];
                else
                    for (int64_t j = 0; j < nb; j++) acc[j] += sg * gr[j];
            }
        }
        for (int64_t j = 0; j < nb; j++) {
            double t = 0;
            for (int64_t k = 0; k < nblk; k++) t += part[k * nb + j];
            db[j] = fb ? (real)t : db[j] + (real)t;
        }
    }
}

static const OpDef OP_ADD = {"add", ew_forward, ew_backward, CUDA_PAIR(cu_ew_forward, cu_ew_backward)};
static const OpDef OP_SUB = {"sub", ew_forward, ew_backward, CUDA_PAIR(cu_ew_forward, cu_ew_backward)};
static const OpDef OP_MUL = {"mul", ew_forward, ew_backward, CUDA_PAIR(cu_ew_forward, cu_ew_backward)};

static Tensor *ew_build(Tape *tp, const OpDef *op, int kind, Tensor *a, Tensor *b) {
    bool ok = b->ndim <= a->ndim;
    for (int i = 0; ok && i < b->ndim; i++)
        ok = b->shape[b->ndim - 1 - i] == a->shape[a->ndim - 1 - i];
    ASSERT(ok, "%s: b %s must have a's shape %s or its trailing dimensions", op->name, SHAPE(b), SHAPE(a));
    Tensor *o = tape_tensor(tp, a->ndim, a->shape);
    Node *n = tape_op(tp, op, (Tensor *[]){a, b}, 2, &o, 1);
    n->iarg[0] = kind;
    tape_forward(n);
    return o;
}

Tensor *op_add(Tape *tp, Tensor *a, Tensor *b) { return ew_build(tp, &OP_ADD, EW_ADD, a, b); }
Tensor *op_sub(Tape *tp, Tensor *a, Tensor *b) { return ew_build(tp, &OP_SUB, EW_SUB, a, b); }
Tensor *op_mul(Tape *tp, Tensor *a, Tensor *b) { return ew_build(tp, &OP_MUL, EW_MUL, a, b); }

static void scale_forward(Node *n) {
    real s = (real)n->farg[0];
    const real *x = n->in[0]->data;
    real *o = n->out[0]->data;
    int64_t N = n->in[0]->numel;
#pragma omp parallel for if (N > OPS_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < N; i++) o[i] = s * x[i];
}

static void scale_backward(Node *n) {
    real s = (real)n->farg[0];
    bool fresh;
    real *dx = NODE_GRAD_FRESH(n, 0, &fresh);
    const real *g = n->out[0]->grad;
    GRAD_WRITE_LOOP(fresh, n->in[0]->numel, dx, s * g[i]);
}

static const OpDef OP_SCALE = {"scale", scale_forward, scale_backward,
                                CUDA_PAIR(cu_scale_forward, cu_scale_backward)};

Tensor *op_scale(Tape *tp, Tensor *a, double s) {
    Tensor *o = tape_tensor(tp, a->ndim, a->shape);
    Node *n = tape_op(tp, &OP_SCALE, &a, 1, &o, 1);
    n->farg[0] = s;
    tape_forward(n);
    return o;
}
