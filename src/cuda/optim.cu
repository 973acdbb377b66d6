// optim.cu: the optimizers' per-element loops (src/optim/) on device blocks,
// in the same arithmetic as the CPU's, and the two reductions the training
// step reads back: the gradients' sum of squares and a finite check.
#include <limits.h>

#include "cuda_internal.cuh"

// One element of AdamW's update (optim.h), shared by the per-slice and the
// multi-tensor kernels so that both compute the same bits.
__device__ __forceinline__ void adamw_elem(real *p, const real *g, real *m, real *v, int64_t i, int64_t j, real lr,
                                           real decay, real b1, real b2, real bc1, real bc2, real eps) {
    real gi = g[i];
    real pi = p[i] - lr * decay * p[i];
    real mi = b1 * m[j] + (1 - b1) * gi;
    real vi = b2 * v[j] + (1 - b2) * gi * gi;
    m[j] = mi;
    v[j] = vi;
    p[i] = pi - lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
}

// SGD's (element i of p and g, j of the momentum).
__device__ __forceinline__ void sgd_elem(real *p, const real *g, real *m, int64_t i, int64_t j, real lr, real decay,
                                         real mu) {
    real mi = mu * m[j] + g[i];
    m[j] = mi;
    p[i] = p[i] - lr * decay * p[i] - lr * mi;
}

__global__ void k_adamw(real *p, const real *g, real *m, real *v, int64_t n, real lr, real decay, real b1, real b2,
                        real bc1, real bc2, real eps) {
    CU_FOR(i, n) adamw_elem(p, g, m, v, i, i, lr, decay, b1, b2, bc1, bc2, eps);
}

extern "C" void cu_adamw_update(real *p, const real *g, real *m, real *v, int64_t n, real lr, real decay, real b1,
                                real b2, real bc1, real bc2, real eps) {
    if (n <= 0) return;
    k_adamw<<<cu_grid(n), CU_THREADS, 0, cu_stream>>>(p, g, m, v, n, lr, decay, b1, b2, bc1, bc2, eps);
    CU_LAUNCHED();
}

__global__ void k_sgd(real *p, const real *g, real *m, int64_t n, real lr, real decay, real mu) {
    CU_FOR(i, n) sgd_elem(p, g, m, i, i, lr, decay, mu);
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

__global__ void k_sum_parts(const double *part, int nparts, double *out) {
    __shared__ double shm[32];
    double s = 0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) s += part[i];
    s = cu_block_sum(s, shm);
    if (threadIdx.x == 0) *out = s;
}

extern "C" double cu_sumsq(const real *x, int64_t n) {
    if (n <= 0) return 0;
    red_buffers();
    k_sumsq_part<<<OPT_BLOCKS, CU_THREADS, 0, cu_stream>>>(x, n, red_part);
    CU_LAUNCHED();
    k_sum_parts<<<1, CU_THREADS, 0, cu_stream>>>(red_part, OPT_BLOCKS, red_part + OPT_BLOCKS);
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

__global__ void k_min_parts(const long long *idx, int nparts, long long *out) {
    if (threadIdx.x != 0) return;
    long long best = LLONG_MAX;
    for (int i = 0; i < nparts; i++)
        if (idx[i] < best) best = idx[i];
    *out = best;
}

extern "C" int64_t cu_first_nonfinite(const real *x, int64_t n) {
    if (n <= 0) return -1;
    red_buffers();
    k_nonfinite_part<<<OPT_BLOCKS, CU_THREADS, 0, cu_stream>>>(x, n, red_idx);
    CU_LAUNCHED();
    k_min_parts<<<1, 32, 0, cu_stream>>>(red_idx, OPT_BLOCKS, red_idx + OPT_BLOCKS);
    CU_LAUNCHED();
    long long best;
    cu_to_host(&best, red_idx + OPT_BLOCKS, sizeof best);
    return best == LLONG_MAX ? -1 : (int64_t)best;
}

// ---- the queued step (device.h's DeviceOptimStep) ----
static_assert(2 * (OPT_BLOCKS + 1) * sizeof(double) <= DEVICE_OPTIM_SCRATCH, "the step's scratch is too small");

// Clipping with the scale computed from the sum on the device: each thread
// makes the host's decision (optim_clip_grad_norm) in the same double
// arithmetic, then multiplies as k_scale_inplace does.
__global__ void k_clip(real *g, int64_t n, const double *sumsq, double max_norm) {
    double norm = sqrt(*sumsq);
    if (!(max_norm > 0 && norm > max_norm)) return;
    real f = (real)(max_norm / (norm + 1e-6));
    CU_FOR(i, n) g[i] *= f;
}

// The update over the chunk table, one launch for every parameter: a block
// per chunk (striding over the table), its threads over the chunk's
// elements. Nothing changes when the gradients' sum is not finite (the
// trainer stops there without stepping).
__global__ void k_update_chunks(DeviceOptimStep s, const double *sumsq) {
    if (!isfinite(*sumsq)) return;
    real lr = s.hyper[0], bc1 = s.hyper[1], bc2 = s.hyper[2];
    for (int c = blockIdx.x; c < s.n_chunks; c += gridDim.x) {
        DeviceOptimChunk ch = s.chunks[c];
        for (int64_t k = threadIdx.x; k < ch.n; k += blockDim.x) {
            int64_t i = ch.a + k;
            if (s.adamw) adamw_elem(s.p, s.g, s.m, s.v, i, i - s.lo, lr, ch.decay, s.b1, s.b2, bc1, bc2, s.eps);
            else sgd_elem(s.p, s.g, s.m, i, i - s.lo, lr, ch.decay, s.mu);
        }
    }
}

static void first_nonfinite_to(const real *x, int64_t n, long long *part, long long *out) {
    if (n > 0) {
        k_nonfinite_part<<<OPT_BLOCKS, CU_THREADS, 0, cu_stream>>>(x, n, part);
        CU_LAUNCHED();
    }
    k_min_parts<<<1, 32, 0, cu_stream>>>(part, n > 0 ? OPT_BLOCKS : 0, out);   // (no element: LLONG_MAX)
    CU_LAUNCHED();
}

extern "C" void cu_optim_queue(const DeviceOptimStep *s) {
    double *part = (double *)s->scratch;
    long long *ipart = (long long *)(part + OPT_BLOCKS + 1);
    double *sumsq = &s->stat->sumsq;
    if (s->scale_first && s->numel > 0) cu_scale_inplace(s->g, s->numel, s->inv_accum);
    if (s->numel > 0) {
        k_sumsq_part<<<OPT_BLOCKS, CU_THREADS, 0, cu_stream>>>(s->g, s->numel, part);
        CU_LAUNCHED();
        k_sum_parts<<<1, CU_THREADS, 0, cu_stream>>>(part, OPT_BLOCKS, sumsq);
        CU_LAUNCHED();
        k_clip<<<cu_grid(s->numel), CU_THREADS, 0, cu_stream>>>(s->g, s->numel, sumsq, s->max_norm);
        CU_LAUNCHED();
    } else {
        CU_CHECK(cudaMemsetAsync(sumsq, 0, sizeof *sumsq, cu_stream));
    }
    if (s->n_chunks > 0) {
        int blocks = s->n_chunks < 4096 ? s->n_chunks : 4096;
        k_update_chunks<<<blocks, CU_THREADS, 0, cu_stream>>>(*s, sumsq);
        CU_LAUNCHED();
    }
    first_nonfinite_to(s->p, s->numel, ipart, &s->stat->bad[0]);
    first_nonfinite_to(s->m, s->hi - s->lo, ipart, &s->stat->bad[1]);
    if (s->v) first_nonfinite_to(s->v, s->hi - s->lo, ipart, &s->stat->bad[2]);
    else first_nonfinite_to(NULL, 0, ipart, &s->stat->bad[2]);
}
