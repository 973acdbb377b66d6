// optim_common.h: what the optimizer kinds (adamw.c, sgd.c), clip.c and
// optim_device.c share: the slices of the flat block a step updates, and
// the loop over them. Private to src/optim/; optim.c, the table of kinds,
// does not call it.
#ifndef AG_OPTIM_COMMON_H
#define AG_OPTIM_COMMON_H

#include "optim.h"

// The slices of the flat block a step updates: each trainable parameter with
// a gradient, cut to [lo, hi), with its weight decay (0 for TENSOR_NO_DECAY).
typedef struct OptimSlice {
    int64_t a, b;   // elements [a, b) of ps->data and ps->grad
    real decay;
} OptimSlice;
// Calls update(ctx, slice, a, n) for elements [a, a + n) of every slice.
// A host ParamStore: in one parallel region, the elements of all slices
// shared evenly among the threads, one thread's share cut wherever it falls.
// A small model's tensors are each too small to be worth a region of their
// own, and a region per tensor costs 50-70 us on a 2-core KVM guest
// (bench/fork_bench). A GPU ParamStore: each slice whole, in order, from
// this thread (update launches a kernel). The updates are elementwise: the
// same on any threads.
// The slices (in flat order) into *out (xmalloc'd; the caller frees it);
// returns how many.
int optim_slices(const Optimizer *opt, const ParamStore *ps, OptimSlice **out);
// The parameter holding flat element e (e < numel).
int optim_param_of(const ParamStore *ps, int64_t e);
typedef void (*OptimUpdate)(void *ctx, const OptimSlice *s, int64_t a, int64_t n);
void optim_update_slices(const Optimizer *opt, const ParamStore *ps, OptimUpdate update, void *ctx);

#endif
