// tensor.h: contiguous, row-major tensors of up to 4 dimensions.
//
// Dimensions are outermost first (PyTorch order): shape (B, T, D) means
// data[(b*T + t)*D + d]. A tensor either lives in a ParamStore (parameters:
// data and grad point into one contiguous block each) or in a Tape's arena
// (activations, reset after every step).
#ifndef AG_TENSOR_H
#define AG_TENSOR_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TENSOR_MAX_DIMS 4

enum {
    TENSOR_PARAM = 1u << 0,   // lives in a ParamStore
    TENSOR_NO_DECAY = 1u << 1,// AdamW applies no weight decay (norm gains, biases, A_log, dt_bias, D)
    TENSOR_FROZEN = 1u << 2,  // a parameter that takes no gradient
    TENSOR_ON_GPU = 1u << 3,  // data (and grad) live in GPU memory: a GPU tape's tensors, parameters moved
                              // with params_to_device, tensor_new_on(DEVICE_CUDA); ops check it (tape_op)
};

typedef struct Tensor {
    real *data;                  // (numel) contiguous, row-major
    real *grad;                  // (numel) or NULL: not yet allocated / not needed
    int ndim;
    int shape[TENSOR_MAX_DIMS];
    int64_t numel;
    bool requires_grad;          // a gradient must flow into this tensor
    unsigned flags;              // TENSOR_*
    const char *name;            // parameters: the checkpoint name; activations: the op
} Tensor;

// Shape helpers. shape_str writes "(2, 3, 4)" into buf and returns it.
int64_t shape_numel(int ndim, const int *shape);
const char *tensor_shape_str(const Tensor *t, char *buf, size_t n);
bool tensor_same_shape(const Tensor *a, const Tensor *b);
// Size of dimension d, counting negative d from the end (-1 = last).
int tensor_dim(const Tensor *t, int d);
// Product of all dimensions but the last (the "rows" of a row-broadcast op).
int64_t tensor_rows(const Tensor *t);

// A short-lived printable shape: SHAPE(t) is valid until the end of the
// full expression that uses it.
#define SHAPE(t) tensor_shape_str((t), (char[64]){0}, 64)

#ifdef __cplusplus
}
#endif
#endif
