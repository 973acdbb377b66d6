// sgd.c: the `sgd` optimizer kind, SGD with heavy-ball momentum over a
// ParamStore (its update: optim_kernels.c and its GPU twin).
#include "optim_common.h"

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

typedef struct SgdStep {
    Optimizer *opt;
    ParamStore *ps;
    const DeviceKernels *dk;
    real lr;
} SgdStep;

static void sgd_piece(void *ctx, const OptimSlice *s, int64_t a, int64_t n) {
    SgdStep *st = ctx;
    st->dk->sgd_update(st->ps->data + a, st->ps->grad + a, st->opt->m + (a - st->opt->lo), n, st->lr, s->decay,
                       (real)st->opt->momentum);
}

static void sgd_step(Optimizer *opt, ParamStore *ps, double lr) {
    ASSERT(opt->kind == OPTIM_SGD, "sgd_step on an optimizer of kind %d", (int)opt->kind);
    ASSERT(opt->numel == ps->numel, "sgd_step: optimizer made for %lld elements, ParamStore has %lld",
           (long long)opt->numel, (long long)ps->numel);
    ASSERT(opt->device == ps->device, "sgd_step: momentum on %s, parameters on %s", device_name(opt->device),
           device_name(ps->device));
    optim_update_slices(opt, ps, sgd_piece, &(SgdStep){opt, ps, device_kernels(ps->device), (real)lr});
    opt->step++;
}

const OptimizerKind OPTIMIZER_SGD = {.name = "sgd", .step = sgd_step};
