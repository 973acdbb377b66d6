// adamw.c: the `adamw` optimizer kind, Adam with decoupled weight decay over
// a ParamStore (its update: optim_kernels.c and its GPU twin).
#include "optim_common.h"

#include <math.h>
#include <string.h>

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

typedef struct AdamwStep {
    Optimizer *opt;
    ParamStore *ps;
    const DeviceKernels *dk;
    real lr, bc1, bc2;
} AdamwStep;

static void adamw_piece(void *ctx, const OptimSlice *s, int64_t a, int64_t n) {
    AdamwStep *st = ctx;
    Optimizer *o = st->opt;
    st->dk->adamw_update(st->ps->data + a, st->ps->grad + a, o->m + (a - o->lo), o->v + (a - o->lo), n, st->lr,
                         s->decay, (real)o->beta1, (real)o->beta2, st->bc1, st->bc2, (real)o->eps);
}

static void adamw_step(Optimizer *opt, ParamStore *ps, double lr) {
    ASSERT(opt->kind == OPTIM_ADAMW, "adamw_step on an optimizer of kind %d", (int)opt->kind);
    ASSERT(opt->numel == ps->numel, "adamw_step: optimizer made for %lld elements, ParamStore has %lld",
           (long long)opt->numel, (long long)ps->numel);
    ASSERT(opt->device == ps->device, "adamw_step: moments on %s, parameters on %s", device_name(opt->device),
           device_name(ps->device));
    int64_t t = opt->step + 1;
    real bc1 = (real)(1.0 - pow(opt->beta1, (double)t));
    real bc2 = (real)(1.0 - pow(opt->beta2, (double)t));
    optim_update_slices(opt, ps, adamw_piece, &(AdamwStep){opt, ps, device_kernels(ps->device), (real)lr, bc1, bc2});
    opt->step = t;
}

const OptimizerKind OPTIMIZER_ADAMW = {.name = "adamw", .step = adamw_step};
