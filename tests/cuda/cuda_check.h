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

#include <math.h>

#include "gradcheck.h"
#include "test_util.h"

// Stop the test unless a GPU is there (cuda_tests is never run without one).
void cuda_require(void);
// The products of device d's next tapes bf16 or float32: on the CPU through
// blas_select with oneDNN (asserted to succeed: the caller has checked the
// build and CPU can), on the GPU through device_set_bf16.
void cuda_set_products(Device d, bool bf16);
// Back to the default afterwards: OpenBLAS float32 on the CPU, no bf16 on the GPU.
void cuda_reset_products(Device d);
// A heap tensor of `ndim` dimensions (the sizes follow), filled with
// normal(0, std) values from `seed`; free with tensor_free.
Tensor *cuda_input_std(bool grad, uint64_t seed, double std, int ndim, ...);
Tensor *cuda_input(bool grad, uint64_t seed, int ndim, ...);   // std 1
// Returns the worst error seen (also asserted), for tests that report it.
double cuda_check_op(const char *label, GradcheckFn f, Tensor *const *inputs, int n_inputs, void *ctx);

// test_tiny_lm_config widened for the GPU's LM tests (vocabulary 97, d_model
// 32, d_ff 64, 2 heads of 16, chunks of 8, convolutions of 4) with `layers`.
LMConfig cuda_small_lm_config(const char *layers);

// A training step's loss for cuda_train_steps (the test's choice), built on tp.
typedef Tensor *(*CudaLossFn)(Tape *tp, LM *lm, int step, void *ctx);
// `steps` AdamW steps (betas 0.9, 0.95, eps 1e-8, decay 0.1; clip 1, lr 3e-3)
// of lm, whose parameters ps are on d already, with loss_fn's loss: its value
// at each step into losses[s], and the whole gradient block after the first
// backward into *grad (malloc, on the host).
void cuda_train_steps(LM *lm, ParamStore *ps, Device d, int steps, CudaLossFn loss_fn, void *ctx, double *losses,
                      real **grad);

// The bf16 kernels' element-wise checks: the worst |got - ref| / tol[e] over
// n elements and where it is (a NaN is the worst); the same for double got.
static inline double cuda_worst_ratio(const real *got, const double *ref, const double *tol, int64_t n,
                                      int64_t *where) {
    double w = 0;
    *where = 0;
    for (int64_t e = 0; e < n; e++) {
        double x = fabs((double)got[e] - ref[e]) / tol[e];
        if (!(x <= w)) w = x, *where = e;
    }
    return w;
}
static inline double cuda_worst_ratio_d(const double *got, const double *ref, const double *tol, int64_t n) {
    double w = 0;
    for (int64_t e = 0; e < n; e++) w = fmax(w, fabs(got[e] - ref[e]) / tol[e]);
    return w;
}

// Makes tp's settled device arena grow (more than its block: a second
// block, then, at the reset, one block of the new high water, which CUDA
// often places at the freed block's address) and returns the old block's
// address; asserts that the arena had settled (before `what` `at`).
const void *cuda_arena_made_again(Tape *tp, const char *what, int at);

// The decoding tests' token at row b, position t (ids below 61).
int cuda_decode_token(int b, int t);
// test_lm_decode_logits (test_util.h) over B rows of T cuda_decode_token ids.
real *cuda_decode_logits(LM *lm, Device d, int B, int T, int reset_at, real **parallel);

#endif
