// ops_shape.c: reshape, transpose, slice, concat.
#include <string.h>

#include "ops.h"
#include "ops_layout.h"
#include "ops_math.h"

// Reshape shares nothing: a contiguous copy keeps every tensor owning its data.
static void reshape_forward(Node *n) {
    memcpy(n->out[0]->data, n->in[0]->data, (size_t)n->in[0]->numel * sizeof(real));
}

static void reshape_backward(Node *n) {
    bool fresh;
    real *dx = NODE_GRAD_FRESH(n, 0, &fresh);
    const real *g = n->out[0]->grad;
    if (fresh) {
        memcpy(dx, g, (size_t)n->in[0]->numel * sizeof(real));
        return;
    }
    for (int64_t i = 0; i < n->in[0]->numel; i++) dx[i] += g[i];
}

static const OpDef OP_RESHAPE = {"reshape", reshape_forward, reshape_backward,
                                 CUDA_PAIR(cu_reshape_forward, cu_reshape_backward)};

Tensor *op_reshape(Tape *tp, Tensor *x, int ndim, const int *shape) {
    ASSERT(ndim >= 1 && ndim <= TENSOR_MAX_DIMS, "reshape: %d dimensions", ndim);
    int64_t numel = shape_numel(ndim, shape);
    ASSERT(numel == x->numel, "reshape: %s has %lld elements, the new shape %lld", SHAPE(x),
           (long long)x->numel, (long long)numel);
    Tensor *o = tape_tensor(tp, ndim, shape);
    tape_run(tp, &OP_RESHAPE, &x, 1, &o, 1);
    return o;
}

// ---- transpose: swap dimensions d0 and d1 (a copy) ----

TransposeMap transpose_map(const Tensor *x, int d0, int d1) {
    int pad = 4 - x->ndim;
    int ishape[4] = {1, 1, 1, 1};
    for (int i = 0; i < x->ndim; i++) ishape[pad + i] = x->shape[i];
    int64_t istride[4];
    istride[3] = 1;
    for (int i = 2; i >= 0; i--) istride[i] = istride[i + 1] * ishape[i + 1];
    int perm[4] = {0, 1, 2, 3};
    perm[pad + d0] = pad + d1;
    perm[pad + d1] = pad + d0;
    TransposeMap m;
    for (int k = 0; k < 4; k++) {
        m.shape[k] = ishape[perm[k]];
        m.stride[k] = istride[perm[k]];
    }
    return m;
}

// iarg: 0 d0, 1 d1 (non-negative). dir 0: out = in permuted; dir 1: din += dout permuted back.
static void transpose_apply(Node *n, int dir) {
    TransposeMap m = transpose_map(n->in[0], n->iarg[0], n->iarg[1]);
    const real *src = dir ? n->out[0]->grad : n->in[0]->data;
    real *dst = dir ? NODE_GRAD_IN(n, 0) : n->out[0]->data;
    if (!dst) return;
    int64_t outer = (int64_t)m.shape[0] * m.shape[1];
#pragma omp parallel for if (n->in[0]->numel > OPS_PAR_MIN) schedule(static)
    for (int64_t ab = 0; ab < outer; ab++) {
        int64_t a = ab / m.shape[1], b = ab % m.shape[1];
        int64_t o = ab * m.shape[2] * m.shape[3];
        for (int c = 0; c < m.shape[2]; c++)
            for (int d = 0; d < m.shape[3]; d++, o++) {
                int64_t i = a * m.stride[0] + b * m.stride[1] + c * m.stride[2] + d * m.stride[3];
                if (dir) dst[i] += src[o];   // a permutation: every i written once
                else dst[o] = src[i];
            }
    }
}

static void transpose_forward(Node *n) { transpose_apply(n, 0); }
static void transpose_backward(Node *n) { transpose_apply(n, 1); }

static const OpDef OP_TRANSPOSE = {"transpose", transpose_forward, transpose_backward,
                                   CUDA_PAIR(cu_transpose_forward, cu_transpose_backward)};

Tensor *op_transpose(Tape *tp, Tensor *x, int d0, int d1) {
    int a = d0 < 0 ? d0 + x->ndim : d0, b = d1 < 0 ? d1 + x->ndim : d1;
    ASSERT(a >= 0 && a < x->ndim && b >= 0 && b < x->ndim, "transpose: dimensions %d, %d out of range for %s",
           d0, d1, SHAPE(x));
    int shape[TENSOR_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[a] = x->shape[b];
    shape[b] = x->shape[a];
    Tensor *o = tape_tensor(tp, x->ndim, shape);
    Node *n = tape_op(tp, &OP_TRANSPOSE, &x, 1, &o, 1);
    n->iarg[0] = a;
    n->iarg[1] = b;
    tape_forward(n);
    return o;
}

// ---- slice and concat along one dimension ----
//
// Both view a tensor as (outer, size along dim, inner): a slice or a part of
// a concat is a block of len*inner contiguous elements in each outer row.

static void dim_split(const Tensor *x, int dim, int64_t *outer, int64_t *inner) {
    *outer = 1;
    *inner = 1;
    for (int i = 0; i < dim; i++) *outer *= x->shape[i];
    for (int i = dim + 1; i < x->ndim; i++) *inner *= x->shape[i];
}

// iarg: 0 dim, 1 start, 2 len
static void slice_forward(Node *n) {
    const Tensor *x = n->in[0];
    int64_t outer, inner;
    dim_split(x, n->iarg[0], &outer, &inner);
    int64_t S = x->shape[n->iarg[0]], blk = n->iarg[2] * inner, off = n->iarg[1] * inner;
    for (int64_t r = 0; r < outer; r++)
        memcpy(n->out[0]->data + r * blk, x->data + r * S * inner + off, (size_t)blk * sizeof(real));
}

static void slice_backward(Node *n) {
    const Tensor *x = n->in[0];
    real *dx = NODE_GRAD_IN(n, 0);
    const real *g = n->out[0]->grad;
    int64_t outer, inner;
    dim_split(x, n->iarg[0], &outer, &inner);
    int64_t S = x->shape[n->iarg[0]], blk = n->iarg[2] * inner, off = n->iarg[1] * inner;
    for (int64_t r = 0; r < outer; r++) {
        real *d = dx + r * S * inner + off;
        const real *s = g + r * blk;
        for (int64_t j = 0; j < blk; j++) d[j] += s[j];
    }
}

static const OpDef OP_SLICE = {"slice", slice_forward, slice_backward,
                               CUDA_PAIR(cu_slice_forward, cu_slice_backward)};

Tensor *op_slice(Tape *tp, Tensor *x, int dim, int start, int len) {
    int d = dim < 0 ? dim + x->ndim : dim;
    ASSERT(d >= 0 && d < x->ndim, "slice: dimension %d out of range for %s", dim, SHAPE(x));
    ASSERT(start >= 0 && len >= 0 && start + len <= x->shape[d],
           "slice: [%d, %d) out of range for dimension %d of %s", start, start + len, d, SHAPE(x));
    int shape[TENSOR_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[d] = len;
    Tensor *o = tape_tensor(tp, x->ndim, shape);
    Node *n = tape_op(tp, &OP_SLICE, &x, 1, &o, 1);
    n->iarg[0] = d;
    n->iarg[1] = start;
    n->iarg[2] = len;
    tape_forward(n);
    return o;
}

// iarg: 0 dim
static void concat_forward(Node *n) {
    const Tensor *o = n->out[0];
    int64_t outer, inner;
    dim_split(o, n->iarg[0], &outer, &inner);
    int64_t row = o->shape[n->iarg[0]] * inner;   // one outer row of the output
    for (int64_t r = 0; r < outer; r++) {
        int64_t off = 0;
        for (int k = 0; k < n->n_in; k++) {
            int64_t blk = n->in[k]->shape[n->iarg[0]] * inner;
            memcpy(o->data + r * row + off, n->in[k]->data + r * blk, (size_t)blk * sizeof(real));
            off += blk;
        }
    }
}

static void concat_backward(Node *n) {
    const Tensor *o = n->out[0];
    int64_t outer, inner;
    dim_split(o, n->iarg[0], &outer, &inner);
    int64_t row = o->shape[n->iarg[0]] * inner, off = 0;
    for (int k = 0; k < n->n_in; k++) {
        int64_t blk = n->in[k]->shape[n->iarg[0]] * inner;
        real *dx = NODE_GRAD_IN(n, k);
        if (dx)
            for (int64_t r = 0; r < outer; r++) {
                const real *s = o->grad + r * row + off;
                for (int64_t j = 0; j < blk; j++) dx[r * blk + j] += s[j];
            }
        off += blk;
    }
}

static const OpDef OP_CONCAT = {"concat", concat_forward, concat_backward,
                                CUDA_PAIR(cu_concat_forward, cu_concat_backward)};

Tensor *op_concat(Tape *tp, Tensor *const *xs, int n, int dim) {
    ASSERT(n >= 1 && n <= NODE_MAX_IN, "concat: %d inputs, 1 to %d", n, NODE_MAX_IN);
    ASSERT(xs[0] != NULL, "concat: input 0 is NULL");
    const Tensor *x0 = xs[0];
    int d = dim < 0 ? dim + x0->ndim : dim;
    ASSERT(d >= 0 && d < x0->ndim, "concat: dimension %d out of range for %s", dim, SHAPE(x0));
    int shape[TENSOR_MAX_DIMS];
    for (int i = 0; i < x0->ndim; i++) shape[i] = x0->shape[i];
    shape[d] = 0;
    for (int k = 0; k < n; k++) {
        ASSERT(xs[k] != NULL, "concat: input %d is NULL", k);
        bool ok = xs[k]->ndim == x0->ndim;
        for (int i = 0; ok && i < x0->ndim; i++) ok = i == d || xs[k]->shape[i] == x0->shape[i];
        ASSERT(ok, "concat: input %d %s does not match input 0 %s outside dimension %d", k, SHAPE(xs[k]),
               SHAPE(x0), d);
        shape[d] += xs[k]->shape[d];
    }
    Tensor *o = tape_tensor(tp, x0->ndim, shape);
    Node *nd = tape_op(tp, &OP_CONCAT, xs, n, &o, 1);
    nd->iarg[0] = d;
    tape_forward(nd);
    return o;
}
