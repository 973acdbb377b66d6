// params.h: parameters, their gradients and optimizer moments, each in one
// contiguous block.
//
// Layers register parameters while the model is built (params_add), then
// params_finalize allocates the blocks, points every Tensor into them and
// initialises the values from a seed. AdamW, zero-grad, global-norm clipping
// and checkpoint I/O are then flat loops over ParamStore.data / .grad.
#ifndef AG_PARAMS_H
#define AG_PARAMS_H

#include "device.h"
#include "rng.h"
#include "tensor.h"

typedef enum {
    INIT_ZEROS,
    INIT_ONES,
    INIT_NORMAL,    // a = std
    INIT_UNIFORM,   // uniform in [a, b)
    INIT_CONST,     // a
    INIT_FN,        // fn(data, numel, rng, a, b)
    INIT_COUNT
} InitKind;

typedef void (*InitFn)(real *data, int64_t numel, Rng *rng, double a, double b);

typedef struct ParamInit {
    InitKind kind;
    double a, b;
    InitFn fn;
} ParamInit;

typedef struct ParamStore {
    Tensor **params;        // (n) in registration order: the checkpoint order
    ParamInit *inits;       // (n)
    int64_t *offsets;       // (n) element offset of each parameter in the blocks
    int n, cap;
    real *data;             // (numel) all parameter values, on `device`
    real *grad;             // (numel) all gradients, on `device`
    int64_t numel;
    bool finalized;
    Device device;          // where data and grad live (params_to_device; the CPU until then)
    real *host;             // on a GPU: (numel) host copy of the values, filled by params_pull
} ParamStore;

void params_init(ParamStore *ps);
void params_free(ParamStore *ps);
// Register a parameter; `name` is copied. flags: TENSOR_NO_DECAY, TENSOR_FROZEN.
Tensor *params_add(ParamStore *ps, const char *name, int ndim, const int *shape, ParamInit init,
                   unsigned flags);
// Allocate the blocks and initialise every parameter, in order, from `seed`.
void params_finalize(ParamStore *ps, uint64_t seed);
void params_zero_grad(ParamStore *ps);
// Move the values to `device` (their gradients start at zero there) and point
// every parameter tensor at them. After params_finalize, before any tape
// reads them. The host block is kept as ps->host.
void params_to_device(ParamStore *ps, Device device);
// The values in host memory: ps->data on the CPU, else ps->host after a copy
// from the device (checkpoints, exports, tests).
const real *params_pull(ParamStore *ps);
// Freeze (no gradient is stored; branches leading only to it do no backward
// work) or unfreeze a parameter. Only after params_finalize.
void params_set_frozen(ParamStore *ps, Tensor *p, bool frozen);
Tensor *params_find(const ParamStore *ps, const char *name);
int64_t params_count(const ParamStore *ps, bool trainable_only);

static inline ParamInit init_zeros(void) { return (ParamInit){INIT_ZEROS, 0, 0, NULL}; }
static inline ParamInit init_ones(void) { return (ParamInit){INIT_ONES, 0, 0, NULL}; }
static inline ParamInit init_normal(double std) { return (ParamInit){INIT_NORMAL, std, 0, NULL}; }
static inline ParamInit init_uniform(double lo, double hi) { return (ParamInit){INIT_UNIFORM, lo, hi, NULL}; }
static inline ParamInit init_const(double c) { return (ParamInit){INIT_CONST, c, 0, NULL}; }
static inline ParamInit init_fn(InitFn fn, double a, double b) { return (ParamInit){INIT_FN, a, b, fn}; }

#endif
