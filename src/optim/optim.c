// optim.c: what every optimizer shares: dispatch, names, freeing, sharding.
#include "optim.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

void optim_step(Optimizer *opt, ParamStore *ps, double lr) {
    switch (opt->kind) {
    case OPTIM_ADAMW: adamw_step(opt, ps, lr); break;
    case OPTIM_SGD: sgd_step(opt, ps, lr); break;
    default: FAIL("optim_step: unknown optimizer kind %d", opt->kind);
    }
}

void optim_update_slices(const Optimizer *opt, const ParamStore *ps, OptimUpdate update, void *ctx) {
    OptimSlice *sl = xmalloc((size_t)(ps->n ? ps->n : 1) * sizeof *sl);
    int ns = 0;
    int64_t total = 0;
    for (int i = 0; i < ps->n; i++) {
        const Tensor *p = ps->params[i];
        int64_t a, b;
        if (!p->grad || (p->flags & TENSOR_FROZEN) || !optim_owned(opt, ps->offsets[i], p->numel, &a, &b)) continue;
        sl[ns++] = (OptimSlice){a, b, (p->flags & TENSOR_NO_DECAY) ? 0 : (real)opt->weight_decay};
        total += b - a;
    }
#pragma omp parallel if (total > 65536)
    {
        int nt = omp_get_num_threads(), t = omp_get_thread_num();
        int64_t lo = total * t / nt, hi = total * (t + 1) / nt, at = 0;   // this thread's share, and
        for (int s = 0; s < ns && at < hi; s++) {                           // where slice s starts in it all
            int64_t len = sl[s].b - sl[s].a, x0 = lo > at ? lo : at, x1 = hi < at + len ? hi : at + len;
            if (x0 < x1) update(ctx, &sl[s], sl[s].a + (x0 - at), x1 - x0);
            at += len;
        }
    }
    free(sl);
}

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

const char *optim_name(OptimKind kind) {
    static const char *names[OPTIM_COUNT] = {"adamw", "sgd"};
    return (kind >= 0 && kind < OPTIM_COUNT) ? names[kind] : "?";
}

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
