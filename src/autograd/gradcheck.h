// gradcheck.h: check an op's (or a layer's) backward against central finite
// differences. Part of the library, so users check their own ops with it.
//
// The function under test builds up to GRADCHECK_MAX_OUT outputs on the tape
// from `inputs`. The checker contracts every output with a fixed random
// tensor R_k, so the scalar checked is f(x) = sum_k <out_k(x), R_k>; its
// analytic gradient comes from one backward (seeded with R_k), the numeric
// one from (f(x + eps e_i) - f(x - eps e_i)) / (2 eps), in float64 when the
// library is built in float64.
//
// Relative error of an element: |a - n| / max(|a|, |n|, floor), with
// floor = floor_frac * max_i |n_i| over that input, so elements many orders
// of magnitude below the input's largest gradient are compared on the
// input's scale rather than on their own (where finite-difference rounding
// dominates). Inputs larger than max_elems are checked on a random subset of
// elements plus random directions: <grad, d> against (f(x+eps d)-f(x-eps d))/2eps.
//
// Device: the check runs on a tape of device_default() (AG_DEVICE=cuda: the
// GPU). There the inputs (host tensors) are moved to the GPU for the check
// and back after it, so a function that reaches them through ctx (a layer's
// parameters) sees them on the device; anything else it reads must be built
// on the tape (tape_tensor_copy), passed to ops as host arrays they copy, or
// named in GradcheckOptions.fixed.
#ifndef AG_GRADCHECK_H
#define AG_GRADCHECK_H

#include "rng.h"
#include "tape.h"

#define GRADCHECK_MAX_OUT 4

// Build outputs from inputs; write them to outs[], return how many.
typedef int (*GradcheckFn)(Tape *tp, Tensor *const *inputs, int n_inputs, void *ctx, Tensor **outs);

typedef struct GradcheckOptions {
    double eps;          // finite-difference step
    double tol;          // largest relative error that passes
    double floor_frac;   // see above
    int64_t max_elems;   // per input: all elements up to this many, else a random subset this big
    int n_directions;    // random-direction checks per input
    uint64_t seed;
    bool verbose;        // print a line per input
    bool quiet;          // no line for a failure either (a test that expects one asserts on the result)
    // Tensors the function reads besides the inputs (a constant target,
    // parameters it uses but that are not checked): never perturbed nor
    // checked; under AG_DEVICE=cuda moved to the GPU with the inputs.
    Tensor *const *fixed;
    int n_fixed;
} GradcheckOptions;

typedef struct GradcheckResult {
    bool passed;
    double max_rel;          // worst relative error seen
    int worst_input;         // which input (-1 if none checked)
    int64_t worst_index;     // flat element index, or -1 for a direction check
    double analytic, numeric;// the two values at the worst element
    int64_t n_checked;       // elements + directions checked
} GradcheckResult;

// eps 1e-6, tol 1e-6, floor 1e-3 in float64; eps 1e-2, tol 3e-2, floor 1e-2 in float32.
GradcheckOptions gradcheck_defaults(void);
// Checks every input with requires_grad; inputs without it are held fixed.
// Prints the worst element (input, index, both values) when the check fails
// (unless opt->quiet).
GradcheckResult gradcheck(const char *label, GradcheckFn f, Tensor *const *inputs, int n_inputs,
                          void *ctx, const GradcheckOptions *opt);

// One forward and backward of f on device_default()'s tape, the inputs moved
// there as gradcheck moves them (so a test comparing two forms of an op runs
// both on the GPU under AG_DEVICE=cuda). Output k is seeded with normal
// values drawn from an Rng seeded with seed + k (rng_normal per element, in
// order) and copied to out[k] (allocated here, free
// with free(); out_n[k] its numel, out_n may be NULL); the gradient of
// sum_k <out_k, seed_k> lands in the inputs' grad buffers (host), zeroed
// first. Returns the number of outputs.
int gradcheck_run(GradcheckFn f, Tensor *const *inputs, int n_inputs, void *ctx, uint64_t seed,
                  real **out, int64_t *out_n);
// The same with the seeds given: seeds[k] (host, out_k's numel values) for
// output k, or NULL where output k is not seeded at all. Inputs may be NULL
// (an optional input left out) in both.
int gradcheck_run_seeds(GradcheckFn f, Tensor *const *inputs, int n_inputs, void *ctx, const real *const *seeds,
                        real **out, int64_t *out_n);

#endif
