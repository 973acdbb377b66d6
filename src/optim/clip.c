// clip.c: gradient scaling and global-norm clipping over the grad block.
#include "optim.h"

#include <math.h>
#include <stdlib.h>

// Partial sums over fixed-size chunks, added in chunk order: the norm is the
// same for any thread count.
#define CLIP_CHUNK 65536

double optim_grad_sumsq(const ParamStore *ps, int64_t lo, int64_t hi) {
    ASSERT(0 <= lo && lo <= hi && hi <= ps->numel, "optim_grad_sumsq: [%lld, %lld) outside [0, %lld)", (long long)lo,
           (long long)hi, (long long)ps->numel);
    int64_t n = hi - lo;
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

const Tensor *optim_nonfinite_param(const ParamStore *ps, const Optimizer *opt) {
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
