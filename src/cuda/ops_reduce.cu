// ops_reduce.cu: sum and mean of all elements on the GPU, in double: a fixed
// grid of partial sums, then one block adds them in order (the result does
// not depend on timing).
#include "cuda_internal.cuh"

#define RED_BLOCKS 256

__global__ void k_sum_part(const real *x, int64_t N, double *part) {
    __shared__ double shm[32];
    double s = 0;
    CU_FOR(i, N) s += x[i];
    s = cu_block_sum(s, shm);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_sum_final(const double *part, int nparts, double factor, real *out) {
    __shared__ double shm[32];
    double s = 0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];
    s = cu_block_sum(s, shm);
    if (threadIdx.x == 0) out[0] = (real)(s * factor);
}

// farg[0]: the factor (1 for sum, 1/numel for mean)
extern "C" void cu_reduce_forward(Node *n) {
    int64_t N = n->in[0]->numel;
    double *part = (double *)tape_dalloc(n->tape, RED_BLOCKS * sizeof(double));
    k_sum_part<<<RED_BLOCKS, CU_THREADS, 0, cu_stream>>>(n->in[0]->data, N, part);
    CU_LAUNCHED();
    k_sum_final<<<1, CU_THREADS, 0, cu_stream>>>(part, RED_BLOCKS, n->farg[0], n->out[0]->data);
    CU_LAUNCHED();
}

__global__ void k_sum_parts(const double *part, int64_t n, int nblk, real *out, bool fresh, int C) {
    int lane = threadIdx.x % 32;
    for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; i < n;
         i += (int64_t)gridDim.x * blockDim.x / 32) {
        double t = 0;
        for (int k = lane; k < nblk; k += 32) t += part[(int64_t)k * n + i];
        t = warp_sum(t);
        if (lane == 0) {
            int64_t at = C > 0 ? (i % C) * (n / C) + i / C : i;
            out[at] = fresh ? (real)t : out[at] + (real)t;
        }
    }
}

void cu_sum_parts(const double *part, int64_t n, int nblk, real *out, bool fresh, int C) {
    if (n <= 0) return;
    k_sum_parts<<<cu_grid(n * 32), CU_THREADS, 0, cu_stream>>>(part, n, nblk, out, fresh, C);
    CU_LAUNCHED();
}

__global__ void k_reduce_back(const real *g, double factor, real *dx, int64_t N) {
    real v = (real)(g[0] * factor);
    CU_FOR(i, N) dx[i] += v;
}

extern "C" void cu_reduce_backward(Node *n) {
    real *dx = tensor_grad(n->tape, n->in[0]);
    int64_t N = n->in[0]->numel;
    if (!dx || N == 0) return;
    k_reduce_back<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(n->out[0]->grad, n->farg[0], dx, N);
    CU_LAUNCHED();
}
