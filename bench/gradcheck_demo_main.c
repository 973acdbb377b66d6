// gradcheck_demo: checks a small two-layer graph's gradients against central
// differences and prints the worst element per input. The library's own
// check, as a user would run it on their op.
#include <stdio.h>

#include "gradcheck.h"
#include "ops.h"

static int f_mlp(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    Tensor *h = op_matmul(tp, in[0], in[1], false, false);     // (4, 8) @ (8, 16)
    h = op_mul(tp, op_add(tp, h, in[2]), h);                   // (h + b) * h
    out[0] = op_mean(tp, op_matmul(tp, h, in[3], false, true));// @ (3, 16)^T
    return 1;
}

int main(void) {
    Tensor *x = tensor_newv(true, 2, 4, 8), *w1 = tensor_newv(true, 2, 8, 16);
    Tensor *b = tensor_newv(true, 1, 16), *w2 = tensor_newv(true, 2, 3, 16);
    Tensor *all[] = {x, w1, b, w2};
    const char *names[] = {"x", "w1", "b", "w2"};
    Rng r;
    rng_seed(&r, 1);
    for (int k = 0; k < 4; k++) {
        all[k]->name = names[k];
        for (int64_t i = 0; i < all[k]->numel; i++) all[k]->data[i] = (real)rng_normal(&r);
    }
    GradcheckOptions o = gradcheck_defaults();
    o.verbose = true;
    GradcheckResult res = gradcheck("demo", f_mlp, all, 4, NULL, &o);
    printf("gradcheck demo (%s): %lld checks, max relative error %.3e (tolerance %.1e): %s\n", REAL_NAME,
           (long long)res.n_checked, res.max_rel, o.tol, res.passed ? "PASS" : "FAIL");
    for (int k = 0; k < 4; k++) tensor_free(all[k]);
    return res.passed ? 0 : 1;
}
