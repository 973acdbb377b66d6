// clip.c: gradient scaling and global-norm clipping over the grad block, and
// the finite check of parameters and moments, on the ParamStore's device
// (its DeviceKernels: optim_kernels.c on the CPU).
#include "optim_common.h"

#include <math.h>
#include <stdint.h>

double optim_grad_sumsq(const ParamStore *ps, int64_t lo, int64_t hi) {
    ASSERT(0 <= lo && lo <= hi && hi <= ps->numel, "optim_grad_sumsq: [%lld, %lld) outside [0, %lld)", (long long)lo,
           (long long)hi, (long long)ps->numel);
    return device_kernels(ps->device)->sumsq(ps->grad + lo, hi - lo);
}

double optim_grad_norm(const ParamStore *ps) { return sqrt(optim_grad_sumsq(ps, 0, ps->numel)); }

void optim_scale_grads(ParamStore *ps, double factor) {
    device_kernels(ps->device)->scale(ps->grad, ps->numel, (real)factor);
}

double optim_clip_grad_norm(ParamStore *ps, double max_norm) {
    double norm = optim_grad_norm(ps);
    if (max_norm > 0 && norm > max_norm) optim_scale_grads(ps, max_norm / (norm + 1e-6));
    return norm;
}

// The parameters tile the flat block in order, and the moments cover its
// elements [lo, hi): the first parameter with a non-finite value or moment
// holds the least flat index of one. So one pass over each block, then
// which parameter that index is in.
const Tensor *optim_nonfinite_param(const ParamStore *ps, const Optimizer *opt) {
    const DeviceKernels *dk = device_kernels(ps->device);
    int64_t e = dk->first_nonfinite(ps->data, ps->numel);
    int64_t best = e < 0 ? INT64_MAX : e;
    if (opt && opt->m) {
        int64_t em = dk->first_nonfinite(opt->m, opt->hi - opt->lo);
        if (em >= 0 && em + opt->lo < best) best = em + opt->lo;
    }
    if (opt && opt->v) {
        int64_t ev = dk->first_nonfinite(opt->v, opt->hi - opt->lo);
        if (ev >= 0 && ev + opt->lo < best) best = ev + opt->lo;
    }
    return best == INT64_MAX ? NULL : ps->params[optim_param_of(ps, best)];
}
