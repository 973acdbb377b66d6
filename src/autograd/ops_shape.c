// ops_shape.c: reshape, transpose, slice, concat.
#include <string.h>

#include "ops.h"

// Reshape shares nothing: a contiguous copy keeps every tensor owning its data.
static void reshape_forward(Node *n) {
    memcpy(n->out[0]->data, n->in[0]->data, (size_t)n->in[0]->numel * sizeof(real));
}

static void reshape_backward(Node *n) {
    real *dx = NODE_GRAD_IN(n, 0);
    const real *g = n->out[0]->grad;
    for (int64_t i = 0; i < n->in[0]->numel; i++) dx[i] += g[i];
}

static const OpDef OP_RESHAPE = {"reshape", reshape_forward, reshape_backward};

Tensor *op_reshape(Tape *tp, Tensor *x, int ndim, const int *shape) {
    ASSERT(ndim >= 1 && ndim <= TENSOR_MAX_DIMS, "reshape: %d dimensions", ndim);
    int64_t numel = shape_numel(ndim, shape);
    ASSERT(numel == x->numel, "reshape: %s has %lld elements, the new shape %lld", SHAPE(x),
           (long long)x->numel, (long long)numel);
    Tensor *o = tape_tensor(tp, ndim, shape);
    tape_run(tp, &OP_RESHAPE, &x, 1, &o, 1);
    return o;
}
