// optim.cu: the optimizers' per-element loops (src/optim/) on device blocks,
// in the same arithmetic as the CPU's, and the two reductions the training
// step reads back: the gradients' sum of squares and a finite check.
#include <limits.h>

#include "cuda_internal.cuh"

__global__ void k_adamw(real *p, const real *g, real *m, real *v, int64_t n, real lr, real decay, real b1, real b2,
                        real bc1, real bc2, real eps) {
    CU_FOR(i, n) {
        real gi = g[i];
        real pi = p[i] - lr * decay * p[i];
        real mi = b1 * m[i] + (1 - b1) * gi;
        real vi = b2 * v[i] + (1 - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
    }
}

extern "C" void cu_adamw_update(real *p, const real *g, real *m, real *v, int64_t n, real lr, real decay, real b1,
                                real b2, real bc1, real bc2, real eps) {
    if (n <= 0) return;
    k_adamw<<<cu_grid(n), CU_THREADS, 0, cu_stream>>>(p, g, m, v, n, lr, decay, b1, b2, bc1, bc2, eps);
    CU_LAUNCHED();
}

__global__ void k_sgd(real *p, const real *g, real *m, int64_t n, real lr, real decay, real mu) {
    CU_FOR(i, n) {
        real mi = mu * m[i] + g[i];
        m[i] = mi;
        p[i] = p[i] - lr * decay * p[i] - lr * mi;
    }
}

extern "C" void cu_sgd_update(real *p, const real *g, real *m, int64_t n, real lr, real decay, real mu) {
    if (n <= 0) return;
    k_sgd<<<cu_grid(n), CU_THREADS, 0, cu_stream>>>(p, g, m, n, lr, decay, mu);
    CU_LAUNCHED();
}

__global__ void k_scale_inplace(real *x, int64_t n, real f) {
    CU_FOR(i, n) x[i] *= f;
}

extern "C" void cu_scale_inplace(real *x, int64_t n, real f) {
    if (n <= 0) return;
    k_scale_inplace<<<cu_grid(n), CU_THREADS, 0, cu_stream>>>(x, n, f);
    CU_LAUNCHED();
}

// Reductions over a fixed grid (so the result does not depend on timing),
// their partials in a small buffer kept between calls.
#define OPT_BLOCKS 512
static double *red_part;    // (OPT_BLOCKS + 1) doubles
static long long *red_idx;  // (OPT_BLOCKS + 1)

static void red_buffers(void) {
    if (!red_part) red_part = (double *)cu_alloc((OPT_BLOCKS + 1) * sizeof(double));
    if (!red_idx) red_idx = (long long *)cu_alloc((OPT_BLOCKS + 1) * sizeof(long long));
}

__global__ void k_sumsq_part(const real *x, int64_t n, double *part) {
    __shared__ double shm[32];
    double s = 0;
    CU_FOR(i, n) s += (double)x[i] * (double)x[i];
    s = cu_block_sum(s, shm);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void k_sum_parts(double *part, int nparts) {
    __shared__ double shm[32];
    double s = 0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];
    s = cu_block_sum(s, shm);
    if (threadIdx.x == 0) part[nparts] = s;
}

extern "C" double cu_sumsq(const real *x, int64_t n) {
    if (n <= 0) return 0;
    red_buffers();
    k_sumsq_part<<<OPT_BLOCKS, CU_THREADS, 0, cu_stream>>>(x, n, red_part);
    CU_LAUNCHED();
    k_sum_parts<<<1, CU_THREADS, 0, cu_stream>>>(red_part, OPT_BLOCKS);
    CU_LAUNCHED();
    double total;
    cu_to_host(&total, red_part + OPT_BLOCKS, sizeof total);
    return total;
}

// The smallest index whose value is NaN or infinite, per block, then overall.
__global__ void k_nonfinite_part(const real *x, int64_t n, long long *idx) {
    __shared__ long long shm[CU_THREADS];
    long long best = LLONG_MAX;
    CU_FOR(i, n) {
        if (!isfinite(x[i])) {
            best = i;   // a thread's indices rise: its first hit is its smallest
            break;
        }
    }
    shm[threadIdx.x] = best;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s && shm[threadIdx.x + s] < shm[threadIdx.x]) shm[threadIdx.x] = shm[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) idx[blockIdx.x] = shm[0];
}

__global__ void k_min_parts(long long *idx, int nparts) {
    if (threadIdx.x != 0) return;
    long long best = LLONG_MAX;
    for (int i = 0; i < nparts; i++)
        if (idx[i] < best) best = idx[i];
    idx[nparts] = best;
}

extern "C" int64_t cu_first_nonfinite(const real *x, int64_t n) {
    if (n <= 0) return -1;
    red_buffers();
    k_nonfinite_part<<<OPT_BLOCKS, CU_THREADS, 0, cu_stream>>>(x, n, red_idx);
    CU_LAUNCHED();
    k_min_parts<<<1, 32, 0, cu_stream>>>(red_idx, OPT_BLOCKS);
    CU_LAUNCHED();
    long long best;
    cu_to_host(&best, red_idx + OPT_BLOCKS, sizeof best);
    return best == LLONG_MAX ? -1 : (int64_t)best;
}
