// optim.c: what every optimizer shares: dispatch, names, freeing, sharding.
#include "optim.h"

#include <stdlib.h>
#include <string.h>

void optim_step(Optimizer *opt, ParamStore *ps, double lr) {
    switch (opt->kind) {
    case OPTIM_ADAMW: adamw_step(opt, ps, lr); break;
    case OPTIM_SGD: sgd_step(opt, ps, lr); break;
    default: FAIL("optim_step: unknown optimizer kind %d", opt->kind);
    }
}

void optim_free(Optimizer *opt) {
    free(opt->m);
    free(opt->v);
    memset(opt, 0, sizeof *opt);
}

const char *optim_name(OptimKind kind) {
    static const char *names[OPTIM_COUNT] = {"adamw", "sgd"};
    return (kind >= 0 && kind < OPTIM_COUNT) ? names[kind] : "?";
}

void optim_set_shard(Optimizer *opt, int64_t lo, int64_t hi) {
    ASSERT(0 <= lo && lo <= hi && hi <= opt->numel, "optim_set_shard: [%lld, %lld) outside [0, %lld)", (long long)lo,
           (long long)hi, (long long)opt->numel);
    size_t bytes = (size_t)(hi > lo ? hi - lo : 1) * sizeof(real);
    bool has_v = opt->v != NULL;
    free(opt->m);
    free(opt->v);
    opt->m = xaligned(bytes);
    memset(opt->m, 0, bytes);
    opt->v = has_v ? xaligned(bytes) : NULL;
    if (has_v) memset(opt->v, 0, bytes);
    opt->lo = lo;
    opt->hi = hi;
}
