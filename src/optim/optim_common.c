// optim_common.c: the loop over a step's slices (optim_common.h).
#include "optim_common.h"

#include <omp.h>
#include <stdlib.h>

int optim_slices(const Optimizer *opt, const ParamStore *ps, OptimSlice **out) {
    OptimSlice *sl = xmalloc((size_t)(ps->n ? ps->n : 1) * sizeof *sl);
    int ns = 0;
    for (int i = 0; i < ps->n; i++) {
        const Tensor *p = ps->params[i];
        int64_t a, b;
        if (!p->grad || (p->flags & TENSOR_FROZEN) || !optim_owned(opt, ps->offsets[i], p->numel, &a, &b)) continue;
        sl[ns++] = (OptimSlice){a, b, (p->flags & TENSOR_NO_DECAY) ? 0 : (real)opt->weight_decay};
    }
    *out = sl;
    return ns;
}

int optim_param_of(const ParamStore *ps, int64_t e) {
    int i = 0;
    while (i + 1 < ps->n && ps->offsets[i + 1] <= e) i++;
    return i;
}

void optim_update_slices(const Optimizer *opt, const ParamStore *ps, OptimUpdate update, void *ctx) {
    OptimSlice *sl;
    int ns = optim_slices(opt, ps, &sl);
    int64_t total = 0;
    for (int s = 0; s < ns; s++) total += sl[s].b - sl[s].a;
    if (ps->device != DEVICE_CPU) {   // a kernel per slice
        for (int s = 0; s < ns; s++) update(ctx, &sl[s], sl[s].a, sl[s].b - sl[s].a);
        free(sl);
        return;
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
