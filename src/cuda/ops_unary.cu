// ops_unary.cu: SiLU, sigmoid, softplus, exp, ReLU and the fused silu_mul on
// the GPU (the same formulas as ops_unary.c, in the build's precision).
#include "cuda_internal.cuh"

enum { UN_SILU, UN_SIGMOID, UN_SOFTPLUS, UN_EXP, UN_RELU };   // iarg[0], as ops_unary.c

__global__ void k_unary(int kind, const real *x, real *y, int64_t N) {
    CU_FOR(i, N) {
        real v = x[i];
        y[i] = kind == UN_SILU       ? v * d_sigmoid(v)
               : kind == UN_SIGMOID  ? d_sigmoid(v)
               : kind == UN_SOFTPLUS ? d_softplus(v)
               : kind == UN_EXP      ? d_exp(v)
                                     : (v > 0 ? v : (real)0);
    }
}

__global__ void k_unary_back(int kind, const real *x, const real *y, const real *g, real *dx, bool fresh,
                             int64_t N) {
    CU_FOR(i, N) {
        real v = x[i];
        real e = kind == UN_SILU       ? g[i] * d_silu_grad(v)
                 : kind == UN_SIGMOID  ? g[i] * y[i] * ((real)1 - y[i])
                 : kind == UN_SOFTPLUS ? g[i] * d_sigmoid(v)
                 : kind == UN_EXP      ? g[i] * y[i]
                                       : (v > 0 ? g[i] : (real)0);
        dx[i] = fresh ? e : dx[i] + e;
    }
}

extern "C" void cu_unary_forward(Node *n) {
    int64_t N = n->in[0]->numel;
    if (N == 0) return;
    k_unary<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(n->iarg[0], n->in[0]->data, n->out[0]->data, N);
    CU_LAUNCHED();
}

extern "C" void cu_unary_backward(Node *n) {
    bool fresh;
    real *dx = CU_GRAD_FRESH(n, 0, &fresh);
    int64_t N = n->in[0]->numel;
    if (!dx || N == 0) return;
    k_unary_back<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(n->iarg[0], n->in[0]->data, n->out[0]->data,
                                                           n->out[0]->grad, dx, fresh, N);
    CU_LAUNCHED();
}

// y = silu(g) * x
__global__ void k_silu_mul(const real *g, const real *x, real *y, int64_t N) {
    CU_FOR(i, N) y[i] = g[i] * d_sigmoid(g[i]) * x[i];
}

// dg = dy x silu'(g), dx = dy silu(g); either may be NULL. same: g and x are
// one tensor, whose one gradient is dy (g silu'(g) + silu(g)).
__global__ void k_silu_mul_back(const real *g, const real *x, const real *dy, real *dg, bool fg, real *dx,
                                bool fx, bool same, int64_t N) {
    CU_FOR(i, N) {
        real s = d_sigmoid(g[i]), d = dy[i];
        if (same) {
            real e = d * (g[i] * (s * ((real)1 + g[i] * ((real)1 - s))) + g[i] * s);
            dg[i] = fg ? e : dg[i] + e;
            continue;
        }
        if (dg) {
            real e = d * x[i] * (s * ((real)1 + g[i] * ((real)1 - s)));
            dg[i] = fg ? e : dg[i] + e;
        }
        if (dx) {
            real e = d * g[i] * s;
            dx[i] = fx ? e : dx[i] + e;
        }
    }
}

extern "C" void cu_silu_mul_forward(Node *n) {
    int64_t N = n->in[0]->numel;
    if (N == 0) return;
    k_silu_mul<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(n->in[0]->data, n->in[1]->data, n->out[0]->data, N);
    CU_LAUNCHED();
}

extern "C" void cu_silu_mul_backward(Node *n) {
    int64_t N = n->in[0]->numel;
    bool same = n->in[0] == n->in[1], fg = false, fx = false;
    real *dg = CU_GRAD_FRESH(n, 0, &fg);
    real *dx = same ? NULL : CU_GRAD_FRESH(n, 1, &fx);
    if ((!dg && !dx) || N == 0) return;
    k_silu_mul_back<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(n->in[0]->data, n->in[1]->data, n->out[0]->grad, dg,
                                                              fg, dx, fx, same, N);
    CU_LAUNCHED();
}
