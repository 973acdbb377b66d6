// ops_elementwise.cu: add, sub, mul with suffix broadcasting, and scale, on
// the GPU. The broadcast operand's gradient is reduced over the rows in a
// fixed number of row blocks (double partial sums, then the blocks in
// order), so it does not depend on timing.
#include "cuda_internal.cuh"

enum { EW_ADD, EW_SUB, EW_MUL };   // iarg[0], as ops_elementwise.c

__global__ void k_ew(int kind, const real *x, const real *y, real *o, int64_t na, int64_t nb) {
    CU_FOR(i, na) {
        real b = y[i % nb];
        o[i] = kind == EW_ADD ? x[i] + b : kind == EW_SUB ? x[i] - b : x[i] * b;
    }
}

extern "C" void cu_ew_forward(Node *n) {
    int64_t na = n->in[0]->numel, nb = n->in[1]->numel;
    if (na == 0) return;
    k_ew<<<cu_grid(na), CU_THREADS, 0, cu_stream>>>(n->iarg[0], n->in[0]->data, n->in[1]->data, n->out[0]->data,
                                                    na, nb);
    CU_LAUNCHED();
}

// da = g (add, sub) or g * y (mul), = when fresh else +=
__global__ void k_ew_da(int kind, const real *g, const real *y, real *da, bool fresh, int64_t na, int64_t nb) {
    CU_FOR(i, na) {
        real e = kind == EW_MUL ? g[i] * y[i % nb] : g[i];
        da[i] = fresh ? e : da[i] + e;
    }
}

// part[k * nb + j] = sum over the rows of block k of s * g[r, j] (* x[r, j] for mul)
__global__ void k_ew_db_part(int kind, const real *g, const real *x, double *part, int64_t rows, int64_t nb,
                             int nblk) {
    int k = blockIdx.y;
    int64_t r0 = rows * k / nblk, r1 = rows * (k + 1) / nblk;
    double sg = kind == EW_SUB ? -1.0 : 1.0;
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < nb; j += (int64_t)gridDim.x * blockDim.x) {
        double acc = 0;
        for (int64_t r = r0; r < r1; r++) {
            int64_t i = r * nb + j;
            acc += kind == EW_MUL ? (double)g[i] * x[i] : sg * g[i];
        }
        part[(int64_t)k * nb + j] = acc;
    }
}

extern "C" void cu_ew_backward(Node *n) {
    const Tensor *a = n->in[0], *b = n->in[1];
    const real *g = n->out[0]->grad;
    bool fa, fb;
    real *da = CU_GRAD_FRESH(n, 0, &fa);
    real *db = CU_GRAD_FRESH(n, 1, &fb);
    int64_t na = a->numel, nb = b->numel, rows = nb ? na / nb : 0;
    int kind = n->iarg[0];
    if (na == 0) return;
    if (da) {
        k_ew_da<<<cu_grid(na), CU_THREADS, 0, cu_stream>>>(kind, g, b->data, da, fa, na, nb);
        CU_LAUNCHED();
    }
    if (db) {
        // Row blocks: enough to fill the GPU when b is narrow (a bias), one
        // when the operands have one shape. A function of the shapes only.
        int64_t want = (int64_t)2048 * 256 / (nb < 256 ? 256 : nb);
        int nblk = (int)(rows < want ? rows : want);
        if (nblk < 1) nblk = 1;
        if (nblk > 1024) nblk = 1024;
        double *part = (double *)tape_dalloc(n->tape, (size_t)nblk * nb * sizeof(double));
        int64_t gx = (nb + CU_THREADS - 1) / CU_THREADS;
        dim3 grid((unsigned)(gx > 4096 ? 4096 : gx), (unsigned)nblk);
        k_ew_db_part<<<grid, CU_THREADS, 0, cu_stream>>>(kind, g, a->data, part, rows, nb, nblk);
        CU_LAUNCHED();
        cu_sum_parts(part, nb, nblk, db, fb, 0);
    }
}

__global__ void k_scale(const real *x, real *o, real s, int64_t N, bool add) {
    CU_FOR(i, N) o[i] = add ? o[i] + s * x[i] : s * x[i];
}

#ifndef AG_DOUBLE
// The same, four at a time: N4 groups of float4.
__global__ void k_scale_x4(const float4 *x, float4 *o, float s, int64_t N4, bool add) {
    CU_FOR(i, N4) {
        float4 a = x[i], b = add ? o[i] : a;   // (k_scale's expressions, element by element)
        o[i] = add ? make_float4(b.x + s * a.x, b.y + s * a.y, b.z + s * a.z, b.w + s * a.w)
                   : make_float4(s * a.x, s * a.y, s * a.z, s * a.w);
    }
}
#endif

// o = s x (add: o += s x) over N reals: four a thread where the arrays allow.
static void scale_into(const real *x, real *o, real s, int64_t N, bool add) {
#ifndef AG_DOUBLE
    const real *all[] = {x, o};
    if (cu_x4_fits(all, 2, N)) {
        k_scale_x4<<<cu_grid(N / 4), CU_THREADS, 0, cu_stream>>>((const float4 *)x, (float4 *)o, s, N / 4, add);
        CU_LAUNCHED();
        return;
    }
#endif
    k_scale<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(x, o, s, N, add);
    CU_LAUNCHED();
}

// farg[0]: the factor
extern "C" void cu_scale_forward(Node *n) {
    int64_t N = n->in[0]->numel;
    if (N == 0) return;
    scale_into(n->in[0]->data, n->out[0]->data, (real)n->farg[0], N, false);
}

extern "C" void cu_scale_backward(Node *n) {
    bool fresh;
    real *dx = CU_GRAD_FRESH(n, 0, &fresh);
    int64_t N = n->in[0]->numel;
    if (!dx || N == 0) return;
    scale_into(n->out[0]->grad, dx, (real)n->farg[0], N, !fresh);
}
