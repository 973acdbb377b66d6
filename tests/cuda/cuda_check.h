// cuda_check.h: GPU-against-CPU checks for the CUDA backend's tests
// (tests/cuda/test_*.c, the cuda_tests binary; run on a machine with a GPU).
//
// cuda_check_op builds the same graph twice from the same inputs, on a CPU
// tape and on a GPU tape, seeds every output with the same random gradient,
// runs both backwards and asserts that every output and every input gradient
// agree to FORM_TOL normwise (max_rel_diff: 1e-4 in float32, 1e-10 in
// float64). With the CPU's gradient checks (tests/test_*.c, float64) this
// proves the GPU's gradients too.
#ifndef CUDA_CHECK_H
#define CUDA_CHECK_H

#include "gradcheck.h"
#include "test_util.h"

// Stop the test unless a GPU is there (cuda_tests is never run without one).
void cuda_require(void);
// A heap tensor of `ndim` dimensions (the sizes follow), filled with
// normal(0, std) values from `seed`; free with tensor_free.
Tensor *cuda_input_std(bool grad, uint64_t seed, double std, int ndim, ...);
Tensor *cuda_input(bool grad, uint64_t seed, int ndim, ...);   // std 1
// Returns the worst error seen (also asserted), for tests that report it.
double cuda_check_op(const char *label, GradcheckFn f, Tensor *const *inputs, int n_inputs, void *ctx);

#endif
