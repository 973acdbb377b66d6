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
__device__ __forceinline__ real silu_mul1(real g, real x) { return g * d_sigmoid(g) * x; }

// dg = dy x silu'(g), dx = dy silu(g); either may be NULL. same: g and x are
// one tensor, whose one gradient is dy (g silu'(g) + silu(g)).
__device__ __forceinline__ void silu_mul_back1(real g, real x, real d, real *dg, bool fg, real *dx, bool fx,
                                               bool same) {
    real s = d_sigmoid(g);
    if (same) {
        real e = d * (g * (s * ((real)1 + g * ((real)1 - s))) + g * s);
        *dg = fg ? e : *dg + e;
        return;
    }
    if (dg) {
        real e = d * x * (s * ((real)1 + g * ((real)1 - s)));
        *dg = fg ? e : *dg + e;
    }
    if (dx) {
        real e = d * g * s;
        *dx = fx ? e : *dx + e;
    }
}

__global__ void k_silu_mul(const real *g, const real *x, real *y, int64_t N) {
    CU_FOR(i, N) y[i] = silu_mul1(g[i], x[i]);
}

__global__ void k_silu_mul_back(const real *g, const real *x, const real *dy, real *dg, bool fg, real *dx,
                                bool fx, bool same, int64_t N) {
    CU_FOR(i, N) silu_mul_back1(g[i], x[i], dy[i], dg ? dg + i : NULL, fg, dx ? dx + i : NULL, fx, same);
}

// The same two, four elements a thread (float32, every array 16-byte
// aligned, N a multiple of 4): N4 = N / 4 groups, each element as above.
#ifndef AG_DOUBLE
__global__ void k_silu_mul_x4(const float4 *g, const float4 *x, float4 *y, int64_t N4) {
    CU_FOR(i, N4) {
        float4 a = g[i], b = x[i];
        y[i] = make_float4(silu_mul1(a.x, b.x), silu_mul1(a.y, b.y), silu_mul1(a.z, b.z), silu_mul1(a.w, b.w));
    }
}

__global__ void k_silu_mul_back_x4(const float4 *g, const float4 *x, const float4 *dy, float4 *dg, bool fg,
                                   float4 *dx, bool fx, bool same, int64_t N4) {
    CU_FOR(i, N4) {
        float4 a = g[i], b = same ? a : x[i], d = dy[i], eg = dg && !fg ? dg[i] : a, ex = dx && !fx ? dx[i] : a;
        silu_mul_back1(a.x, b.x, d.x, dg ? &eg.x : NULL, fg, dx ? &ex.x : NULL, fx, same);
        silu_mul_back1(a.y, b.y, d.y, dg ? &eg.y : NULL, fg, dx ? &ex.y : NULL, fx, same);
        silu_mul_back1(a.z, b.z, d.z, dg ? &eg.z : NULL, fg, dx ? &ex.z : NULL, fx, same);
        silu_mul_back1(a.w, b.w, d.w, dg ? &eg.w : NULL, fg, dx ? &ex.w : NULL, fx, same);
        if (dg) dg[i] = eg;
        if (dx) dx[i] = ex;
    }
}
#endif

extern "C" void cu_silu_mul_forward(Node *n) {
    int64_t N = n->in[0]->numel;
    if (N == 0) return;
    const real *g = n->in[0]->data, *x = n->in[1]->data;
    real *y = n->out[0]->data;
#ifndef AG_DOUBLE
    const real *all[] = {g, x, y};
    if (cu_x4_fits(all, 3, N)) {
        k_silu_mul_x4<<<cu_grid(N / 4), CU_THREADS, 0, cu_stream>>>((const float4 *)g, (const float4 *)x,
                                                                    (float4 *)y, N / 4);
        CU_LAUNCHED();
        return;
    }
#endif
    k_silu_mul<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(g, x, y, N);
    CU_LAUNCHED();
}

extern "C" void cu_silu_mul_backward(Node *n) {
    int64_t N = n->in[0]->numel;
    bool same = n->in[0] == n->in[1], fg = false, fx = false;
    real *dg = CU_GRAD_FRESH(n, 0, &fg);
    real *dx = same ? NULL : CU_GRAD_FRESH(n, 1, &fx);
    if ((!dg && !dx) || N == 0) return;
    const real *g = n->in[0]->data, *x = n->in[1]->data, *dy = n->out[0]->grad;
#ifndef AG_DOUBLE
    const real *all[] = {g, x, dy, dg ? dg : g, dx ? dx : g};
    if (cu_x4_fits(all, 5, N)) {
        k_silu_mul_back_x4<<<cu_grid(N / 4), CU_THREADS, 0, cu_stream>>>(
            (const float4 *)g, (const float4 *)x, (const float4 *)dy, (float4 *)dg, fg, (float4 *)dx, fx, same, N / 4);
        CU_LAUNCHED();
        return;
    }
#endif
    k_silu_mul_back<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(g, x, dy, dg, fg, dx, fx, same, N);
    CU_LAUNCHED();
}
