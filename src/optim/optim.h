// optim.h: optimisers, learning-rate schedule and gradient clipping, as flat
// loops over a ParamStore's contiguous blocks.
//
// A training step, with gradient accumulation done by the caller:
//
//     params_zero_grad(ps);
//     for (int a = 0; a < accum; a++) { forward; tape_backward; }   // grads add up
//     optim_scale_grads(ps, 1.0 / accum);                            // mean over micro-batches
//     double norm = optim_clip_grad_norm(ps, cfg.grad_clip);        // pre-clip norm
//     optim_step(&opt, ps, lr_cosine(step, warmup, total, lr, min_lr));
//
// Frozen parameters (Tensor.grad == NULL or TENSOR_FROZEN) are skipped by
// every step: their values and moments are left untouched. Parameters
// flagged TENSOR_NO_DECAY get no weight decay.
#ifndef AG_OPTIM_H
#define AG_OPTIM_H

#include "params.h"

typedef enum {
    OPTIM_ADAMW,   // Adam with decoupled weight decay (Loshchilov & Hutter)
    OPTIM_SGD,     // SGD with (heavy-ball) momentum and decoupled weight decay
    OPTIM_COUNT
} OptimKind;

typedef struct Optimizer {
    OptimKind kind;
    int64_t numel;        // = ParamStore.numel the moments were made for
    int64_t lo, hi;       // the elements of the flat block this optimizer updates: [0, numel), or a
                          // shard (ZeRO-1: optim_set_shard); the moments cover exactly these
    int64_t step;         // completed steps (AdamW bias correction uses step+1 while stepping)
    real *m;              // (hi - lo) AdamW first moment / SGD momentum buffer, zero-initialised;
                          // m[i - lo] belongs to flat element i
    real *v;              // (hi - lo) AdamW second moment; NULL for SGD
    double beta1, beta2;  // AdamW moment decay rates
    double eps;           // AdamW denominator epsilon (added to sqrt(v_hat))
    double momentum;      // SGD momentum mu
    double weight_decay;  // decoupled: p -= lr * wd * p, except TENSOR_NO_DECAY params
    Device device;        // where m and v live: the ParamStore's device at init (docs/cuda.md)
} Optimizer;

// An optimizer kind, as a mixer kind (mixer.h): defined in its own file
// (adamw.c, sgd.c) with its init, and listed once in optim.c's table, in
// the order of OptimKind.
typedef struct OptimizerKind {
    const char *name;   // the checkpoint's /optim kind
    // One update of the trainable elements [opt->lo, opt->hi) at learning
    // rate lr, on the ParamStore's device; increments opt->step.
    void (*step)(Optimizer *opt, ParamStore *ps, double lr);
} OptimizerKind;
// kind's entry; stops on a kind outside the table.
const OptimizerKind *optim_kind(OptimKind kind);

// AdamW, per trainable element, at step t = opt->step + 1 (1-based):
//   p -= lr * wd * p                                  (unless TENSOR_NO_DECAY)
//   m  = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// (the same update as torch.optim.AdamW.)
void adamw_init(Optimizer *opt, const ParamStore *ps, double beta1, double beta2, double eps,
                double weight_decay);

// SGD with momentum, per trainable element (torch.optim.SGD, dampening 0):
//   p -= lr * wd * p  (unless TENSOR_NO_DECAY);   m = mu m + g;   p -= lr * m
void sgd_init(Optimizer *opt, const ParamStore *ps, double momentum, double weight_decay);

// The step of opt->kind (optim_kind); increments opt->step.
void optim_step(Optimizer *opt, ParamStore *ps, double lr);
void optim_free(Optimizer *opt);
// Move the moments to `device` (after loading them from a checkpoint on the
// host; the ParamStore goes with params_to_device).
void optim_to_device(Optimizer *opt, Device device);
// Host copies of the moments ((hi - lo) elements each; v may be NULL when the
// optimizer has none): for checkpoints of a GPU run.
void optim_pull_moments(const Optimizer *opt, real *m, real *v);
const char *optim_name(OptimKind kind);   // "adamw", "sgd"

// Shard the optimizer (ZeRO-1): from now on it updates, and keeps moments
// for, only the flat elements [lo, hi) (weight-decay flags still apply per
// parameter). Its moments start at zero: call before loading a checkpoint.
void optim_set_shard(Optimizer *opt, int64_t lo, int64_t hi);
// The part [*a, *b) of the flat range [off, off + n) (a parameter) that opt
// updates; false when there is none.
static inline bool optim_owned(const Optimizer *opt, int64_t off, int64_t n, int64_t *a, int64_t *b) {
    *a = off > opt->lo ? off : opt->lo;
    *b = off + n < opt->hi ? off + n : opt->hi;
    return *a < *b;
}

// Gradient helpers over the whole grad block (frozen parameters' gradients
// are zero there, so they do not contribute).
void optim_scale_grads(ParamStore *ps, double factor);   // e.g. 1/accum_steps
// Global L2 norm of all gradients, summed in double in a fixed order (the
// result does not depend on the thread count).
double optim_grad_norm(const ParamStore *ps);
// The sum of squares of the gradients of flat elements [lo, hi), in the same
// fixed order (optim_grad_norm = sqrt(optim_grad_sumsq(ps, 0, numel))); data
// parallel ranks add up their slices' sums.
double optim_grad_sumsq(const ParamStore *ps, int64_t lo, int64_t hi);
// If max_norm > 0 and the norm exceeds it, scale every gradient by
// max_norm / (norm + 1e-6). Returns the norm before clipping.
double optim_clip_grad_norm(ParamStore *ps, double max_norm);

// The first parameter whose value, or (opt non-NULL) optimizer moment (of
// the elements the optimizer owns), is NaN or infinite; NULL when every one
// is finite. O(numel), vectorised.
const Tensor *optim_nonfinite_param(const ParamStore *ps, const Optimizer *opt);

// Learning rate at 0-based step `step` of `total`:
//   step <  warmup:  lr * (step + 1) / warmup          (linear warm-up, reaches lr)
//   warmup <= step:  min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2,
//                    p = (step - warmup) / (total - warmup), clamped to [0, 1]
// so step == warmup gives lr and step >= total gives min_lr.
double lr_cosine(int64_t step, int64_t warmup, int64_t total, double lr, double min_lr);

#endif
