// adamw.c: Adam with decoupled weight decay over a ParamStore.
#include "optim.h"
#include "cuda_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef AG_DOUBLE
#define SQRT_REAL sqrt
#else
#define SQRT_REAL sqrtf
#endif

void adamw_init(Optimizer *opt, const ParamStore *ps, double beta1, double beta2, double eps,
                double weight_decay) {
    ASSERT(ps->finalized, "adamw_init before params_finalize");
    ASSERT(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "adamw_init: betas (%g, %g) must be in [0, 1)",
           beta1, beta2);
    memset(opt, 0, sizeof *opt);
    opt->kind = OPTIM_ADAMW;
    opt->numel = ps->numel;
    opt->hi = ps->numel;
    size_t bytes = (size_t)(ps->numel ? ps->numel : 1) * sizeof(real);
    opt->device = ps->device;
    opt->m = dev_alloc(opt->device, bytes);
    opt->v = dev_alloc(opt->device, bytes);
    dev_zero(opt->device, opt->m, bytes);
    dev_zero(opt->device, opt->v, bytes);
    opt->beta1 = beta1;
    opt->beta2 = beta2;
    opt->eps = eps;
    opt->weight_decay = weight_decay;
}

// One piece of a parameter: p, g, m, v of length n (one thread's).
static void adamw_update(real *restrict p, const real *restrict g, real *restrict m, real *restrict v,
                         int64_t n, real lr, real decay, real b1, real b2, real bc1, real bc2, real eps) {
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

typedef struct AdamwStep {
    Optimizer *opt;
    ParamStore *ps;
    real lr, bc1, bc2;
} AdamwStep;

static void adamw_piece(void *ctx, const OptimSlice *s, int64_t a, int64_t n) {
    AdamwStep *st = ctx;
    Optimizer *o = st->opt;
    adamw_update(st->ps->data + a, st->ps->grad + a, o->m + (a - o->lo), o->v + (a - o->lo), n, st->lr, s->decay,
                 (real)o->beta1, (real)o->beta2, st->bc1, st->bc2, (real)o->eps);
}

void adamw_step(Optimizer *opt, ParamStore *ps, double lr) {
    ASSERT(opt->kind == OPTIM_ADAMW, "adamw_step on a %s optimizer", optim_name(opt->kind));
    ASSERT(opt->numel == ps->numel, "adamw_step: optimizer made for %lld elements, ParamStore has %lld",
           (long long)opt->numel, (long long)ps->numel);
    ASSERT(opt->device == ps->device, "adamw_step: moments on %s, parameters on %s", device_name(opt->device),
           device_name(ps->device));
    int64_t t = opt->step + 1;
    real bc1 = (real)(1.0 - pow(opt->beta1, (double)t));
    real bc2 = (real)(1.0 - pow(opt->beta2, (double)t));
    if (ps->device == DEVICE_CPU) {
        optim_update_slices(opt, ps, adamw_piece, &(AdamwStep){opt, ps, (real)lr, bc1, bc2});
        opt->step = t;
        return;
    }
    for (int i = 0; i < ps->n; i++) {   // a GPU ParamStore: a kernel per parameter
        Tensor *p = ps->params[i];
        int64_t a, b;
        if (!p->grad || (p->flags & TENSOR_FROZEN) || !optim_owned(opt, ps->offsets[i], p->numel, &a, &b)) continue;
        real decay = (p->flags & TENSOR_NO_DECAY) ? 0 : (real)opt->weight_decay;
#ifdef AG_CUDA
        cu_adamw_update(ps->data + a, ps->grad + a, opt->m + (a - opt->lo), opt->v + (a - opt->lo), b - a, (real)lr,
                        decay, (real)opt->beta1, (real)opt->beta2, bc1, bc2, (real)opt->eps);
#else
        (void)a, (void)b, (void)decay;
        FAIL("adamw_step: a %s ParamStore in a build without CUDA", device_name(ps->device));
#endif
    }
    opt->step = t;
}
