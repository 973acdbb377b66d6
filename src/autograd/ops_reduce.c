// ops_reduce.c: sum and mean of all elements (accumulated in double).
#include "ops.h"
#include "cuda_ops.h"

// farg[0]: the factor (1 for sum, 1/numel for mean)
static void reduce_forward(Node *n) {
    const Tensor *x = n->in[0];
    double s = 0;
    for (int64_t i = 0; i < x->numel; i++) s += x->data[i];
    n->out[0]->data[0] = (real)(s * n->farg[0]);
}

static void reduce_backward(Node *n) {
    real *dx = NODE_GRAD_IN(n, 0);
    real g = (real)(n->out[0]->grad[0] * n->farg[0]);
    for (int64_t i = 0; i < n->in[0]->numel; i++) dx[i] += g;
}

static const OpDef OP_SUM = {"sum", reduce_forward, reduce_backward,
                              CUDA_PAIR(cu_reduce_forward, cu_reduce_backward)};
static const OpDef OP_MEAN = {"mean", reduce_forward, reduce_backward,
                              CUDA_PAIR(cu_reduce_forward, cu_reduce_backward)};

static Tensor *reduce_build(Tape *tp, const OpDef *op, Tensor *x, double factor) {
    Tensor *o = tape_tensor(tp, 1, (int[]){1});
    Node *n = tape_op(tp, op, &x, 1, &o, 1);
    n->farg[0] = factor;
    tape_forward(n);
    return o;
}

Tensor *op_sum(Tape *tp, Tensor *x) { return reduce_build(tp, &OP_SUM, x, 1.0); }
Tensor *op_mean(Tape *tp, Tensor *x) {
    ASSERT(x->numel > 0, "mean: empty tensor %s", SHAPE(x));
    return reduce_build(tp, &OP_MEAN, x, 1.0 / (double)x->numel);
}
