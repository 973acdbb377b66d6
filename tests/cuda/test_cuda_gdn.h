// test_cuda_gdn.h: what test_cuda_gdn.c lends the other GPU tests of op_gdn
// (test_cuda_gdn_bf16.c): the inputs of the decay regimes, the op as a
// GradcheckFn, and the check that a setting's unknown value is refused.
#ifndef TEST_CUDA_GDN_H
#define TEST_CUDA_GDN_H

#include "gdn_kernel.h"

typedef enum { REG_PLAIN, REG_G_ZERO, REG_G_M20, REG_BETA_1 } Regime;

enum { IQ, IK, IV, IBETA, IG, IS0, N_IN };
extern const char *const GDN_GRAD_NAMES[N_IN];   // "dq" .. "ds0"

// x[IQ..IS0] (B, T, H heads of dk | dv): normal q, k, v (rows of q at norm
// 1/sqrt(dk), of k at 1), beta and g of the regime, s0 normal (x[IS0] NULL
// without it); grad: whether they take gradients.
void gdn_test_inputs(Tensor **x, int B, int T, int H, int dk, int dv, Regime reg, bool with_s0, bool grad,
                     uint64_t seed);
void gdn_free_inputs(Tensor **x);

typedef struct {
    int H, chunk;
    MixerForm form;
    const int *doc_start;   // (B, T) or NULL
    int outs;               // the outputs the loss sees: 1 o, 2 S_T, 3 both
} GdnCtx;

// op_gdn of x (n inputs: IS0 or N_IN) with ctx a GdnCtx: the outputs its
// outs asks for (a GradcheckFn, cuda_check.h).
int gdn_test_op(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs);

// op_gdn's chunked forward (one head of dk = dv, chunk C, bf16 products or
// not) with the environment's `var` set to `value` must fail before any
// launch, its message naming var, 'value' and `takes` (what var takes).
void gdn_expect_setting_refused(const char *var, const char *value, const char *takes, int dk, int C, bool bf16);

#endif
