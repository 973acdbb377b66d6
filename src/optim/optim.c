// optim.c: the table of optimizer kinds, and what every optimizer has
// whatever its kind: its moments' memory (freeing, moving, sharding).
// What the kinds' steps share is optim_common.c's.
#include "optim.h"

#include <stdlib.h>
#include <string.h>

// One line per optimizer kind (each defined in its own file), in the order of OptimKind.
extern const OptimizerKind OPTIMIZER_ADAMW;   // adamw.c
extern const OptimizerKind OPTIMIZER_SGD;     // sgd.c
static const OptimizerKind *const KINDS[OPTIM_COUNT] = {
    [OPTIM_ADAMW] = &OPTIMIZER_ADAMW,
    [OPTIM_SGD] = &OPTIMIZER_SGD,
};

const OptimizerKind *optim_kind(OptimKind kind) {
    ASSERT(kind >= 0 && kind < OPTIM_COUNT, "optim_kind: unknown optimizer kind %d", (int)kind);
    return KINDS[kind];
}

void optim_step(Optimizer *opt, ParamStore *ps, double lr) { optim_kind(opt->kind)->step(opt, ps, lr); }

void optim_free(Optimizer *opt) {
    dev_free(opt->device, opt->m);
    dev_free(opt->device, opt->v);
    memset(opt, 0, sizeof *opt);
}

void optim_to_device(Optimizer *opt, Device device) {
    if (device == opt->device) return;
    ASSERT(opt->device == DEVICE_CPU, "optim_to_device: the moments are on %s already", device_name(opt->device));
    size_t bytes = (size_t)(opt->hi > opt->lo ? opt->hi - opt->lo : 1) * sizeof(real);
    real *m = dev_alloc(device, bytes), *v = opt->v ? dev_alloc(device, bytes) : NULL;
    dev_from_host(m, device, opt->m, bytes);
    if (v) dev_from_host(v, device, opt->v, bytes);
    free(opt->m);
    free(opt->v);
    opt->m = m;
    opt->v = v;
    opt->device = device;
}

void optim_pull_moments(const Optimizer *opt, real *m, real *v) {
    size_t bytes = (size_t)(opt->hi - opt->lo) * sizeof(real);
    dev_to_host(m, opt->m, bytes, opt->device);
    if (v && opt->v) dev_to_host(v, opt->v, bytes, opt->device);
}

const char *optim_name(OptimKind kind) { return (kind >= 0 && kind < OPTIM_COUNT) ? KINDS[kind]->name : "?"; }

void optim_set_shard(Optimizer *opt, int64_t lo, int64_t hi) {
    ASSERT(0 <= lo && lo <= hi && hi <= opt->numel, "optim_set_shard: [%lld, %lld) outside [0, %lld)", (long long)lo,
           (long long)hi, (long long)opt->numel);
    size_t bytes = (size_t)(hi > lo ? hi - lo : 1) * sizeof(real);
    bool has_v = opt->v != NULL;
    dev_free(opt->device, opt->m);
    dev_free(opt->device, opt->v);
    opt->m = dev_alloc(opt->device, bytes);
    dev_zero(opt->device, opt->m, bytes);
    opt->v = has_v ? dev_alloc(opt->device, bytes) : NULL;
    if (has_v) dev_zero(opt->device, opt->v, bytes);
    opt->lo = lo;
    opt->hi = hi;
}
