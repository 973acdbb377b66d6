// ops_unary.c: elementwise activations: SiLU, sigmoid, softplus, exp, ReLU.
//
// One forward and one backward serve all five; the activation is picked once
// per call (a switch outside the loops), never per element.
#include "ops.h"
#include "ops_math.h"
#include "ops_vexp.h"

enum { UN_SILU, UN_SIGMOID, UN_SOFTPLUS, UN_EXP, UN_RELU };

#ifdef OPS_VEXP
// The kinds whose exp runs in 512-bit vectors (ops_vexp.h), r_exp's bits:
// silu, sigmoid and exp forward, silu backward. Returns false for the others
// (the loops below; softplus takes log1pf, and its backward's sigmoid is of
// (B, T, H) gates only, too few to gain).
static bool unary_forward_v(int kind, const float *x, float *y, int64_t N) {
    switch (kind) {
    case UN_SILU:
        V_LOOP(N, i, m, __m512 v = v_load(x + i, m); v_store(y + i, m, _mm512_mul_ps(v, v_sigmoid(v))););
        return true;
    case UN_SIGMOID: V_LOOP(N, i, m, v_store(y + i, m, v_sigmoid(v_load(x + i, m)));); return true;
    case UN_EXP: V_LOOP(N, i, m, v_store(y + i, m, v_exp(v_load(x + i, m)));); return true;
    default: return false;
    }
}

static bool unary_backward_v(int kind, const float *x, const float *g, float *dx, int64_t N, bool fresh) {
    switch (kind) {
    case UN_SILU:   // g silu'(x)
        V_LOOP(N, i, m, __m512 v = v_load(x + i, m);
               v_grad(dx + i, m, v_load(g + i, m), v_silu_grad_s(v, v_sigmoid(v)), fresh, true););
        return true;
    default: return false;
    }
}
#endif

// iarg[0]: the UN_* kind
static void unary_forward(Node *n) {
    const real *x = n->in[0]->data;   // (numel)
    real *y = n->out[0]->data;        // (numel)
    int64_t N = n->in[0]->numel;
#ifdef OPS_VEXP
    if (unary_forward_v(n->iarg[0], x, y, N)) return;
#endif
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
// A fresh dx is written, not added to (GRAD_WRITE_LOOP).
static void unary_backward(Node *n) {
    bool fresh;
    real *dx = NODE_GRAD_FRESH(n, 0, &fresh);
    if (!dx) return;
    const real *x = n->in[0]->data, *y = n->out[0]->data, *g = n->out[0]->grad;
    int64_t N = n->in[0]->numel;
#ifdef OPS_VEXP
    if (unary_backward_v(n->iarg[0], x, g, dx, N, fresh)) return;
#endif
    switch (n->iarg[0]) {
    case UN_SILU: GRAD_WRITE_LOOP(fresh, N, dx, g[i] * r_silu_grad(x[i])); break;
    case UN_SIGMOID: GRAD_WRITE_LOOP(fresh, N, dx, g[i] * y[i] * (1 - y[i])); break;
    case UN_SOFTPLUS: GRAD_WRITE_LOOP(fresh, N, dx, g[i] * r_sigmoid(x[i])); break;
    case UN_EXP: GRAD_WRITE_LOOP(fresh, N, dx, g[i] * y[i]); break;
    default: GRAD_WRITE_LOOP(fresh, N, dx, x[i] > 0 ? g[i] : 0); break;
    }
}

static const OpDef OP_SILU = {"silu", unary_forward, unary_backward,
                                CUDA_PAIR(cu_unary_forward, cu_unary_backward)};
static const OpDef OP_SIGMOID = {"sigmoid", unary_forward, unary_backward,
                                CUDA_PAIR(cu_unary_forward, cu_unary_backward)};
static const OpDef OP_SOFTPLUS = {"softplus", unary_forward, unary_backward,
                                CUDA_PAIR(cu_unary_forward, cu_unary_backward)};
static const OpDef OP_EXP = {"exp", unary_forward, unary_backward,
                                CUDA_PAIR(cu_unary_forward, cu_unary_backward)};
static const OpDef OP_RELU = {"relu", unary_forward, unary_backward,
                                CUDA_PAIR(cu_unary_forward, cu_unary_backward)};

static Tensor *unary_build(Tape *tp, const OpDef *op, int kind, Tensor *x) {
    ASSERT(x != NULL, "%s: input is NULL", op->name);
    Tensor *y = tape_tensor(tp, x->ndim, x->shape);
    Node *n = tape_op(tp, op, &x, 1, &y, 1);
    n->iarg[0] = kind;
    tape_forward(n);
    return y;
}

Tensor *op_silu(Tape *tp, Tensor *x) { return unary_build(tp, &OP_SILU, UN_SILU, x); }
Tensor *op_sigmoid(Tape *tp, Tensor *x) { return unary_build(tp, &OP_SIGMOID, UN_SIGMOID, x); }
Tensor *op_softplus(Tape *tp, Tensor *x) { return unary_build(tp, &OP_SOFTPLUS, UN_SOFTPLUS, x); }
Tensor *op_exp(Tape *tp, Tensor *x) { return unary_build(tp, &OP_EXP, UN_EXP, x); }
Tensor *op_relu(Tape *tp, Tensor *x) { return unary_build(tp, &OP_RELU, UN_RELU, x); }

// silu_mul: y = silu(g) * x, g and x of one shape (the SwiGLU product of the
// MLP and the output gate of the linear-family mixers), in one pass instead
// of silu then mul: no silu(g) activation is stored or re-read.
//   dg = dy * x * silu'(g),  dx = dy * silu(g),  silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
static void silu_mul_forward(Node *n) {
    const real *g = n->in[0]->data, *x = n->in[1]->data;   // (numel) each
    real *y = n->out[0]->data;                            // (numel)
    int64_t N = n->in[0]->numel;
#ifdef OPS_VEXP
    V_LOOP(N, i, m, __m512 gv = v_load(g + i, m);
           v_store(y + i, m, _mm512_mul_ps(_mm512_mul_ps(gv, v_sigmoid(gv)), v_load(x + i, m))););
#else
#pragma omp parallel for if (N > OPS_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < N; i++) y[i] = g[i] * r_sigmoid(g[i]) * x[i];
#endif
}

// dg and dx of distinct tensors in one pass over g, x and dy, which two
// passes read twice (the op's CPU time per tiny_mamba step at d_model 256:
// 21 -> 17-20 ms); each of the four write/add combinations is its own loop,
// so each vectorises.
static inline __attribute__((always_inline)) void silu_mul_grads(const real *g, const real *x, const real *dy,
                                                                 real *dg, real *dx, int64_t N, const bool add_g,
                                                                 const bool add_x) {
#ifdef OPS_VEXP
    V_LOOP(N, i, m, __m512 gv = v_load(g + i, m), s = v_sigmoid(gv), d = v_load(dy + i, m);
           v_grad(dg + i, m, _mm512_mul_ps(d, v_load(x + i, m)), v_silu_grad_s(gv, s), !add_g, false);
           v_grad(dx + i, m, _mm512_mul_ps(d, gv), s, !add_x, false););
#else
#pragma omp parallel for if (N > OPS_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < N; i++) {
        real s = r_sigmoid(g[i]), d = dy[i];
        real eg = d * x[i] * (s * (1 + g[i] * (1 - s))), ex = d * g[i] * s;
        dg[i] = add_g ? dg[i] + eg : eg;
        dx[i] = add_x ? dx[i] + ex : ex;
    }
#endif
}

static void silu_mul_backward(Node *n) {
    const real *g = n->in[0]->data, *x = n->in[1]->data, *dy = n->out[0]->grad;
    int64_t N = n->in[0]->numel;
    bool fg, fx;
    if (n->in[0] == n->in[1]) {   // y = silu(g) g: one gradient, dy (g silu'(g) + silu(g))
        real *d = NODE_GRAD_FRESH(n, 0, &fg);
        if (d) GRAD_WRITE_LOOP(fg, N, d, dy[i] * (g[i] * r_silu_grad(g[i]) + g[i] * r_sigmoid(g[i])));
        return;
    }
    real *dg = NODE_GRAD_FRESH(n, 0, &fg);
    real *dx = NODE_GRAD_FRESH(n, 1, &fx);
    if (dg && dx) {
        if (fg && fx) silu_mul_grads(g, x, dy, dg, dx, N, false, false);
        else if (fg) silu_mul_grads(g, x, dy, dg, dx, N, false, true);
        else if (fx) silu_mul_grads(g, x, dy, dg, dx, N, true, false);
        else silu_mul_grads(g, x, dy, dg, dx, N, true, true);
        return;
    }
    if (dg) GRAD_WRITE_LOOP(fg, N, dg, dy[i] * x[i] * r_silu_grad(g[i]));
    if (dx) GRAD_WRITE_LOOP(fx, N, dx, dy[i] * g[i] * r_sigmoid(g[i]));
}

static const OpDef OP_SILU_MUL = {"silu_mul", silu_mul_forward, silu_mul_backward,
                                   CUDA_PAIR(cu_silu_mul_forward, cu_silu_mul_backward)};

Tensor *op_silu_mul(Tape *tp, Tensor *g, Tensor *x) {
    ASSERT(g != NULL && x != NULL && g->ndim == x->ndim && g->numel == x->numel,
           "silu_mul: g %s and x %s must have one shape", g ? SHAPE(g) : "NULL", x ? SHAPE(x) : "NULL");
    for (int i = 0; i < g->ndim; i++)
        ASSERT(g->shape[i] == x->shape[i], "silu_mul: g %s and x %s must have one shape", SHAPE(g), SHAPE(x));
    Tensor *y = tape_tensor(tp, g->ndim, g->shape);
    tape_run(tp, &OP_SILU_MUL, (Tensor *[]){g, x}, 2, &y, 1);
    return y;
}
