// sgd.c: SGD with heavy-ball momentum over a ParamStore.
#include "optim.h"
#include "cuda_ops.h"

#include <string.h>

void sgd_init(Optimizer *opt, const ParamStore *ps, double momentum, double weight_decay) {
    ASSERT(ps->finalized, "sgd_init before params_finalize");
    ASSERT(momentum >= 0 && momentum < 1, "sgd_init: momentum %g must be in [0, 1)", momentum);
    memset(opt, 0, sizeof *opt);
    opt->kind = OPTIM_SGD;
    opt->numel = ps->numel;
    opt->hi = ps->numel;
    size_t bytes = (size_t)(ps->numel ? ps->numel : 1) * sizeof(real);
    opt->device = ps->device;
    opt->m = dev_alloc(opt->device, bytes);
    dev_zero(opt->device, opt->m, bytes);
    opt->momentum = momentum;
    opt->weight_decay = weight_decay;
}

static void sgd_update(real *restrict p, const real *restrict g, real *restrict m, int64_t n, real lr,
                       real decay, real mu) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        real mi = mu * m[i] + g[i];
        m[i] = mi;
        p[i] = p[i] - lr * decay * p[i] - lr * mi;
    }
}

typedef struct SgdStep {
    Optimizer *opt;
    ParamStore *ps;
    real lr;
} SgdStep;

static void sgd_piece(void *ctx, const OptimSlice *s, int64_t a, int64_t n) {
    SgdStep *st = ctx;
    sgd_update(st->ps->data + a, st->ps->grad + a, st->opt->m + (a - st->opt->lo), n, st->lr, s->decay,
               (real)st->opt->momentum);
}

void sgd_step(Optimizer *opt, ParamStore *ps, double lr) {
    ASSERT(opt->kind == OPTIM_SGD, "sgd_step on a %s optimizer", optim_name(opt->kind));
    ASSERT(opt->numel == ps->numel, "sgd_step: optimizer made for %lld elements, ParamStore has %lld",
           (long long)opt->numel, (long long)ps->numel);
    ASSERT(opt->device == ps->device, "sgd_step: momentum on %s, parameters on %s", device_name(opt->device),
           device_name(ps->device));
    if (ps->device == DEVICE_CPU) {
        optim_update_slices(opt, ps, sgd_piece, &(SgdStep){opt, ps, (real)lr});
        opt->step++;
        return;
    }
    for (int i = 0; i < ps->n; i++) {   // a GPU ParamStore: a kernel per parameter
        Tensor *p = ps->params[i];
        int64_t a, b;
        if (!p->grad || (p->flags & TENSOR_FROZEN) || !optim_owned(opt, ps->offsets[i], p->numel, &a, &b)) continue;
        real decay = (p->flags & TENSOR_NO_DECAY) ? 0 : (real)opt->weight_decay;
#ifdef AG_CUDA
        cu_sgd_update(ps->data + a, ps->grad + a, opt->m + (a - opt->lo), b - a, (real)lr, decay, (real)opt->momentum);
#else
        (void)a, (void)b, (void)decay;
        FAIL("sgd_step: a %s ParamStore in a build without CUDA", device_name(ps->device));
#endif
    }
    opt->step++;
}
