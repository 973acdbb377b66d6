// custom_op.c: define your own op outside the library, with its forward and
// backward side by side, and check its gradient against central finite
// differences. Built against the installed library:
//
//   cc custom_op.c $(pkg-config --cflags --libs attnlab) -o custom_op && ./custom_op
//
// The op: y = x^3 elementwise (dy/dx = 3 x^2), used in f(x, w) = sum(cube(x w)).
#include <attnlab/gradcheck.h>
#include <attnlab/ops.h>
#include <attnlab/tape.h>
#include <stdio.h>

// Forward: fills the output from the input (and could save state in n->saved).
static void cube_forward(Node *n) {
    const Tensor *x = n->in[0];
    Tensor *y = n->out[0];
    for (int64_t i = 0; i < x->numel; i++) y->data[i] = x->data[i] * x->data[i] * x->data[i];
}

// Backward: ADDS dL/dx = dL/dy * 3 x^2 into the input's gradient.
static void cube_backward(Node *n) {
    const Tensor *x = n->in[0];
    const real *dy = n->out[0]->grad;
    real *dx = NODE_GRAD_IN(n, 0);
    if (!dx) return;   // the input takes no gradient
    for (int64_t i = 0; i < x->numel; i++) dx[i] += dy[i] * 3 * x->data[i] * x->data[i];
}

static const OpDef CUBE = {"cube", cube_forward, cube_backward};

// The builder: an output of the input's shape, recorded on the tape and run.
static Tensor *op_cube(Tape *tp, Tensor *x) {
    Tensor *y = tape_tensor(tp, x->ndim, x->shape);
    tape_run(tp, &CUBE, &x, 1, &y, 1);
    return y;
}

static int f(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)n, (void)ctx;
    out[0] = op_sum(tp, op_cube(tp, op_matmul(tp, in[0], in[1], false, false)));
    return 1;
}

int main(void) {
    Tensor *x = tensor_newv(true, 2, 3, 4), *w = tensor_newv(true, 2, 4, 2);
    for (int64_t i = 0; i < x->numel; i++) x->data[i] = (real)(0.1 * (double)(i % 7) - 0.3);
    for (int64_t i = 0; i < w->numel; i++) w->data[i] = (real)(0.2 * (double)(i % 5) - 0.4);
    GradcheckResult r = gradcheck("cube(x w)", f, (Tensor *[]){x, w}, 2, NULL, NULL);
    printf("custom op 'cube': gradcheck %s in %s, max relative error %.3e over %lld checks\n",
           r.passed ? "passed" : "FAILED", REAL_NAME, r.max_rel, (long long)r.n_checked);
    tensor_free(x);
    tensor_free(w);
    return r.passed ? 0 : 1;
}
