// ops_unary.c: elementwise activations: SiLU, sigmoid, softplus, exp, ReLU.
//
// One forward and one backward serve all five; the activation is picked once
// per call (a switch outside the loops), never per element.
#include "ops.h"
#include "ops_math.h"

enum { UN_SILU, UN_SIGMOID, UN_SOFTPLUS, UN_EXP, UN_RELU };

// iarg[0]: the UN_* kind
static void unary_forward(Node *n) {
    const real *x = n->in[0]->data;   // (numel)
    real *y = n->out[0]->data;        // (numel)
    int64_t N = n->in[0]->numel;
    switch (n->iarg[0]) {
    case UN_SILU:
#pragma omp parallel for if (N > OPS_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < N; i++) y[i] = x[i] * r_sigmoid(x[i]);
        break;
    case UN_SIGMOID:
#pragma omp parallel for if (N > OPS_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < N; i++) y[i] = r_sigmoid(x[i]);
        break;
    case UN_SOFTPLUS:
#pragma omp parallel for if (N > OPS_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < N; i++) y[i] = r_softplus(x[i]);
        break;
    case UN_EXP:
#pragma omp parallel for if (N > OPS_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < N; i++) y[i] = r_exp(x[i]);
        break;
    default:
#pragma omp parallel for if (N > OPS_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < N; i++) y[i] = x[i] > 0 ? x[i] : 0;
        break;
    }
}

// The local derivatives: silu' = s (1 + x (1 - s)), sigmoid' = y (1 - y),
// softplus' = sigmoid(x), exp' = y, relu' = [x > 0].
static void unary_backward(Node *n) {
    real *dx = NODE_GRAD_IN(n, 0);
    if (!dx) return;
    const real *x = n->in[0]->data, *y = n->out[0]->data, *g = n->out[0]->grad;
    int64_t N = n->in[0]->numel;
    switch (n->iarg[0]) {
    case UN_SILU:
#pragma omp parallel for if (N > OPS_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < N; i++) {
            real s = r_sigmoid(x[i]);
            dx[i] += g[i] * s * (1 + x[i] * (1 - s));
        }
        break;
    case UN_SIGMOID:
#pragma omp parallel for if (N > OPS_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < N; i++) dx[i] += g[i] * y[i] * (1 - y[i]);
        break;
    case UN_SOFTPLUS:
#pragma omp parallel for if (N > OPS_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < N; i++) dx[i] += g[i] * r_sigmoid(x[i]);
        break;
    case UN_EXP:
#pragma omp parallel for if (N > OPS_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < N; i++) dx[i] += g[i] * y[i];
        break;
    default:
#pragma omp parallel for if (N > OPS_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < N; i++) dx[i] += x[i] > 0 ? g[i] : 0;
        break;
    }
}

static const OpDef OP_SILU = {"silu", unary_forward, unary_backward};
static const OpDef OP_SIGMOID = {"sigmoid", unary_forward, unary_backward};
static const OpDef OP_SOFTPLUS = {"softplus", unary_forward, unary_backward};
static const OpDef OP_EXP = {"exp", unary_forward, unary_backward};
static const OpDef OP_RELU = {"relu", unary_forward, unary_backward};

static Tensor *unary_build(Tape *tp, const OpDef *op, int kind, Tensor *x) {
    ASSERT(x != NULL, "%s: input is NULL", op->name);
    Tensor *y = tape_tensor(tp, x->ndim, x->shape);
    Node *n = tape_op(tp, op, &x, 1, &y, 1);
    n->iarg[0] = kind;
    unary_forward(n);
    return y;
}

Tensor *op_silu(Tape *tp, Tensor *x) { return unary_build(tp, &OP_SILU, UN_SILU, x); }
Tensor *op_sigmoid(Tape *tp, Tensor *x) { return unary_build(tp, &OP_SIGMOID, UN_SIGMOID, x); }
Tensor *op_softplus(Tape *tp, Tensor *x) { return unary_build(tp, &OP_SOFTPLUS, UN_SOFTPLUS, x); }
Tensor *op_exp(Tape *tp, Tensor *x) { return unary_build(tp, &OP_EXP, UN_EXP, x); }
Tensor *op_relu(Tape *tp, Tensor *x) { return unary_build(tp, &OP_RELU, UN_RELU, x); }
