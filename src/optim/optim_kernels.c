// optim_kernels.c: the CPU loops of optim_kernels.h.
#include "optim_kernels.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#ifdef AG_DOUBLE
#define SQRT_REAL sqrt
#else
#define SQRT_REAL sqrtf
#endif

void optim_cpu_adamw_update(real *restrict p, const real *restrict g, real *restrict m, real *restrict v, int64_t n,
                            real lr, real decay, real b1, real b2, real bc1, real bc2, real eps) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        real gi = g[i];
        real pi = p[i] - lr * decay * p[i];
        real mi = b1 * m[i] + (1 - b1) * gi;
        real vi = b2 * v[i] + (1 - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - lr * (mi / bc1) / (SQRT_REAL(vi / bc2) + eps);
    }
}

void optim_cpu_sgd_update(real *restrict p, const real *restrict g, real *restrict m, int64_t n, real lr, real decay,
                          real mu) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        real mi = mu * m[i] + g[i];
        m[i] = mi;
        p[i] = p[i] - lr * decay * p[i] - lr * mi;
    }
}

void optim_cpu_scale(real *x, int64_t n, real f) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) x[i] *= f;
}

// The chunks of optim_cpu_sumsq: its partial sums, added in chunk order, do
// not depend on the thread count.
#define SUMSQ_CHUNK 65536

double optim_cpu_sumsq(const real *x, int64_t n) {
    int64_t nchunks = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    if (nchunks == 0) return 0;
    double *part = xmalloc((size_t)nchunks * sizeof *part);
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t lo = c * SUMSQ_CHUNK, hi = lo + SUMSQ_CHUNK < n ? lo + SUMSQ_CHUNK : n;
        double s = 0;
#pragma omp simd reduction(+ : s)   // without it the sum runs one add at a time
        for (int64_t i = lo; i < hi; i++) s += (double)x[i] * (double)x[i];
        part[c] = s;
    }
    double total = 0;
    for (int64_t c = 0; c < nchunks; c++) total += part[c];
    free(part);
    return total;
}

// Finite check of one block; a NaN or inf anywhere makes the sum non-finite
// (x - x is 0 for every finite x), so the loop vectorises and exits once.
static bool all_finite(const real *x, int64_t n) {
    real acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; i++) acc += x[i] - x[i];
    return acc == 0;
}

// Blocks checked at once, the threads taking them in order: a vectorised
// pass over each, and the element by element search only in a block that
// fails. The least failing index over the threads, whatever their number
// (a thread skips the blocks past its own first failure).
#define FINITE_BLOCK 4096

int64_t optim_cpu_first_nonfinite(const real *x, int64_t n) {
    int64_t nb = (n + FINITE_BLOCK - 1) / FINITE_BLOCK, first = INT64_MAX;
#pragma omp parallel for schedule(static) reduction(min : first) if (nb > 16)
    for (int64_t b = 0; b < nb; b++) {
        int64_t a = b * FINITE_BLOCK, len = n - a < FINITE_BLOCK ? n - a : FINITE_BLOCK;
        if (a >= first || all_finite(x + a, len)) continue;
        for (int64_t i = a; i < a + len; i++)
            if (x[i] - x[i] != 0) {
                first = i;
                break;
            }
    }
    return first == INT64_MAX ? -1 : first;
}

static long long first_or_max(const real *x, int64_t n) {
    int64_t e = n > 0 ? optim_cpu_first_nonfinite(x, n) : -1;
    return e < 0 ? LLONG_MAX : (long long)e;
}

void optim_cpu_queue(const DeviceOptimStep *s) {
    if (s->scale_first) optim_cpu_scale(s->g, s->numel, s->inv_accum);
    double sumsq = optim_cpu_sumsq(s->g, s->numel), norm = sqrt(sumsq);
    s->stat->sumsq = sumsq;
    if (s->max_norm > 0 && norm > s->max_norm) optim_cpu_scale(s->g, s->numel, (real)(s->max_norm / (norm + 1e-6)));
    real lr = s->hyper[0], bc1 = s->hyper[1], bc2 = s->hyper[2];
    for (int c = 0; isfinite(sumsq) && c < s->n_chunks; c++) {
        const DeviceOptimChunk *ch = &s->chunks[c];
        real *p = s->p + ch->a, *m = s->m + (ch->a - s->lo);
        if (s->adamw)
            optim_cpu_adamw_update(p, s->g + ch->a, m, s->v + (ch->a - s->lo), ch->n, lr, ch->decay, s->b1, s->b2, bc1,
                                   bc2, s->eps);
        else
            optim_cpu_sgd_update(p, s->g + ch->a, m, ch->n, lr, ch->decay, s->mu);
    }
    s->stat->bad[0] = first_or_max(s->p, s->numel);
    s->stat->bad[1] = first_or_max(s->m, s->hi - s->lo);
    s->stat->bad[2] = s->v ? first_or_max(s->v, s->hi - s->lo) : LLONG_MAX;
}
