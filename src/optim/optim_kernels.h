// optim_kernels.h: the CPU loops of the optimizers, of clipping and of the
// finite checks: the CPU's entries of DeviceKernels (device.h), whose GPU
// twins are the cu_* of src/cuda/optim.cu. The optimizers call them through
// their device's table, never by name.
#ifndef AG_OPTIM_KERNELS_H
#define AG_OPTIM_KERNELS_H

#include "common.h"
#include "device.h"

// AdamW's and SGD's updates of n elements (the formulas of optim.h).
void optim_cpu_adamw_update(real *restrict p, const real *restrict g, real *restrict m, real *restrict v, int64_t n,
                            real lr, real decay, real b1, real b2, real bc1, real bc2, real eps);
void optim_cpu_sgd_update(real *restrict p, const real *restrict g, real *restrict m, int64_t n, real lr, real decay,
                          real mu);
void optim_cpu_scale(real *x, int64_t n, real f);
// The sum of squares in double over fixed-size chunks added in chunk order:
// the same for any thread count.
double optim_cpu_sumsq(const real *x, int64_t n);
// The first NaN or inf of x, -1 when every element is finite.
int64_t optim_cpu_first_nonfinite(const real *x, int64_t n);
// device.h's DeviceOptimStep with the loops above (the same bits as
// optim.h's calls on a host ParamStore).
void optim_cpu_queue(const DeviceOptimStep *s);

#endif
