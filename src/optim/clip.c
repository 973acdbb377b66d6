// clip.c: gradient scaling and global-norm clipping over the grad block.
#include "optim.h"
#include "cuda_ops.h"

#include <math.h>
#include <stdlib.h>

// Partial sums over fixed-size chunks, added in chunk order: the norm is the
// same for any thread count.
#define CLIP_CHUNK 65536

double optim_grad_sumsq(const ParamStore *ps, int64_t lo, int64_t hi) {
    ASSERT(0 <= lo && lo <= hi && hi <= ps->numel, "optim_grad_sumsq: [%lld, %lld) outside [0, %lld)", (long long)lo,
           (long long)hi, (long long)ps->numel);
    int64_t n = hi - lo;
#ifdef AG_CUDA
    if (ps->device == DEVICE_CUDA) return cu_sumsq(ps->grad + lo, n);
#endif
    int64_t nchunks = (n + CLIP_CHUNK - 1) / CLIP_CHUNK;
    if (nchunks == 0) return 0;
    double *part = xmalloc((size_t)nchunks * sizeof *part);
    const real *g = ps->grad + lo;
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t lo = c * CLIP_CHUNK, hi = lo + CLIP_CHUNK < n ? lo + CLIP_CHUNK : n;
        double s = 0;
#pragma omp simd reduction(+ : s)   // without it the sum runs one add at a time
        for (int64_t i = lo; i < hi; i++) s += (double)g[i] * (double)g[i];
        part[c] = s;
    }
    double total = 0;
    for (int64_t c = 0; c < nchunks; c++) total += part[c];
    free(part);
    return total;
}

double optim_grad_norm(const ParamStore *ps) { return sqrt(optim_grad_sumsq(ps, 0, ps->numel)); }

void optim_scale_grads(ParamStore *ps, double factor) {
    real f = (real)factor;
    real *g = ps->grad;
    int64_t n = ps->numel;
#ifdef AG_CUDA
    if (ps->device == DEVICE_CUDA) {
        cu_scale_inplace(g, n, f);
        return;
    }
#endif
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) g[i] *= f;
}

double optim_clip_grad_norm(ParamStore *ps, double max_norm) {
    double norm = optim_grad_norm(ps);
    if (max_norm > 0 && norm > max_norm) optim_scale_grads(ps, max_norm / (norm + 1e-6));
    return norm;
}

// Finite check of one block; a NaN or inf anywhere makes the sum non-finite
// (x - x is 0 for every finite x), so the loop vectorises and exits once.
static bool all_finite(const real *x, int64_t n) {
    real acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; i++) acc += x[i] - x[i];
    return acc == 0;
}

#ifdef AG_CUDA
// The parameter holding flat element e (e < numel).
static int param_of(const ParamStore *ps, int64_t e) {
    int i = 0;
    while (i + 1 < ps->n && ps->offsets[i + 1] <= e) i++;
    return i;
}
#endif

const Tensor *optim_nonfinite_param(const ParamStore *ps, const Optimizer *opt) {
#ifdef AG_CUDA
    if (ps->device == DEVICE_CUDA) {   // one pass over each block, then which parameter it was
        int64_t e = cu_first_nonfinite(ps->data, ps->numel);
        int64_t best = e < 0 ? INT64_MAX : e;
        if (opt && opt->m) {
            int64_t em = cu_first_nonfinite(opt->m, opt->hi - opt->lo);
            if (em >= 0 && em + opt->lo < best) best = em + opt->lo;
        }
        if (opt && opt->v) {
            int64_t ev = cu_first_nonfinite(opt->v, opt->hi - opt->lo);
            if (ev >= 0 && ev + opt->lo < best) best = ev + opt->lo;
        }
        return best == INT64_MAX ? NULL : ps->params[param_of(ps, best)];
    }
#endif
    for (int i = 0; i < ps->n; i++) {
        int64_t off = ps->offsets[i], n = ps->params[i]->numel;
        if (!all_finite(ps->data + off, n)) return ps->params[i];
        int64_t a, b;
        if (!opt || !optim_owned(opt, off, n, &a, &b)) continue;
        if (opt->m && !all_finite(opt->m + (a - opt->lo), b - a)) return ps->params[i];
        if (opt->v && !all_finite(opt->v + (a - opt->lo), b - a)) return ps->params[i];
    }
    return NULL;
}
