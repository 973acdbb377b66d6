// test_cuda_check.c: the harness of cuda_check.h, and the tape machinery on
// the GPU: arena reuse, fresh-gradient poisoning, seeds, the message for an
// op without a kernel, and the first ops (products, elementwise, unary,
// reductions) against the CPU.
#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "blas.h"
#include "cuda_check.h"
#include "device.h"
#include "ops.h"
#include "optim.h"

void cuda_require(void) {
    char err[512];
    cr_assert(device_cuda_built(), "this build has no CUDA backend");
    cr_assert(device_cuda_init(err, sizeof err), "no usable GPU: %s", err);
}

void cuda_set_products(Device d, bool bf16) {
    char err[256];
    if (d == DEVICE_CPU)
        cr_assert(blas_select(GEMM_ONEDNN, bf16 ? PRECISION_BF16 : PRECISION_FP32, err, sizeof err), "%s", err);
    else
        device_set_bf16(d, bf16);
}

void cuda_reset_products(Device d) {
    char err[256];
    if (d == DEVICE_CPU) blas_select(GEMM_OPENBLAS, PRECISION_FP32, err, sizeof err);
    else device_set_bf16(d, false);
}

// The outputs (host copies, concatenated) and the inputs' gradients of f on
// one device. seeds: one array per output, made on the first call.
typedef struct {
    int n_out;
    int64_t out_n[GRADCHECK_MAX_OUT];
    real *out[GRADCHECK_MAX_OUT];
    real *grad[NODE_MAX_IN];
} Run;

static void run_on(Device d, GradcheckFn f, Tensor *const *inputs, int n_in, void *ctx, real **seeds, Run *r) {
    Tape tp;
    tape_init_on(&tp, d);
    Tensor *x[NODE_MAX_IN];
    for (int i = 0; i < n_in; i++) {
        x[i] = tape_tensor_copy(&tp, inputs[i]->ndim, inputs[i]->shape, inputs[i]->data);
        x[i]->requires_grad = inputs[i]->requires_grad;
    }
    Tensor *outs[GRADCHECK_MAX_OUT];
    r->n_out = f(&tp, x, n_in, ctx, outs);
    bool any = false;
    for (int k = 0; k < r->n_out; k++) {
        r->out_n[k] = outs[k]->numel;
        r->out[k] = malloc((size_t)outs[k]->numel * sizeof(real) + 1);
        dev_to_host(r->out[k], outs[k]->data, (size_t)outs[k]->numel * sizeof(real), d);
        if (!seeds[k]) seeds[k] = test_randn(outs[k]->numel, 1000 + k);
        any |= outs[k]->requires_grad;
    }
    if (any) tape_backward_multi(&tp, outs, (const real *const *)seeds, r->n_out);
    for (int i = 0; i < n_in; i++) {
        int64_t n = inputs[i]->numel;
        r->grad[i] = calloc((size_t)n + 1, sizeof(real));
        if (x[i]->grad) dev_to_host(r->grad[i], x[i]->grad, (size_t)n * sizeof(real), d);
    }
    dev_sync(d);
    tape_free(&tp);
}

static void run_free(Run *r, int n_in) {
    for (int k = 0; k < r->n_out; k++) free(r->out[k]);
    for (int i = 0; i < n_in; i++) free(r->grad[i]);
}

double cuda_check_op(const char *label, GradcheckFn f, Tensor *const *inputs, int n_in, void *ctx) {
    cuda_require();
    real *seeds[GRADCHECK_MAX_OUT] = {0};
    Run cpu, gpu;
    run_on(DEVICE_CPU, f, inputs, n_in, ctx, seeds, &cpu);
    run_on(DEVICE_CUDA, f, inputs, n_in, ctx, seeds, &gpu);
    cr_assert_eq(cpu.n_out, gpu.n_out, "%s: %d outputs on the CPU, %d on the GPU", label, cpu.n_out, gpu.n_out);
    double worst = 0;
    for (int k = 0; k < cpu.n_out; k++) {
        cr_assert_eq(cpu.out_n[k], gpu.out_n[k], "%s: output %d sizes differ", label, k);
        double e = max_rel_diff(cpu.out[k], gpu.out[k], cpu.out_n[k]);
        cr_assert(e <= FORM_TOL, "%s: output %d: GPU and CPU differ by %.3e (tolerance %.0e)", label, k, e,
                  FORM_TOL);
        worst = fmax(worst, e);
    }
    for (int i = 0; i < n_in; i++) {
        if (!inputs[i]->requires_grad) continue;
        double e = max_rel_diff(cpu.grad[i], gpu.grad[i], inputs[i]->numel);
        cr_assert(e <= FORM_TOL, "%s: gradient of input %d: GPU and CPU differ by %.3e (tolerance %.0e)", label, i,
                  e, FORM_TOL);
        worst = fmax(worst, e);
    }
    run_free(&cpu, n_in);
    run_free(&gpu, n_in);
    for (int k = 0; k < GRADCHECK_MAX_OUT; k++) free(seeds[k]);
    return worst;
}

// ---------------------------------------------------------------- the first ops

static Tensor *input_va(bool grad, uint64_t seed, double std, int ndim, va_list ap) {
    int shape[TENSOR_MAX_DIMS];
    for (int i = 0; i < ndim && i < TENSOR_MAX_DIMS; i++) shape[i] = va_arg(ap, int);
    Tensor *t = tensor_new(ndim, shape, grad);
    fill_normal(t, seed, std);
    return t;
}

Tensor *cuda_input_std(bool grad, uint64_t seed, double std, int ndim, ...) {
    va_list ap;
    va_start(ap, ndim);
    Tensor *t = input_va(grad, seed, std, ndim, ap);
    va_end(ap);
    return t;
}

Tensor *cuda_input(bool grad, uint64_t seed, int ndim, ...) {
    va_list ap;
    va_start(ap, ndim);
    Tensor *t = input_va(grad, seed, 1.0, ndim, ap);
    va_end(ap);
    return t;
}

typedef struct {
    bool ta, tb;
} MatmulCtx;

static int f_matmul(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    MatmulCtx *c = ctx;
    outs[0] = op_matmul(tp, x[0], x[1], c->ta, c->tb);
    return 1;
}

Test(cuda_ops, matmul_every_form) {
    // (a, b) shapes for: rows x weight, batched, shared weight with a^T, narrow N.
    struct {
        int an, a[4], bn, b[4];
    } cases[] = {
        {3, {2, 37, 48}, 2, {48, 29}},     {4, {2, 3, 17, 24}, 4, {2, 3, 24, 19}},
        {3, {3, 21, 16}, 2, {16, 5}},      {3, {4, 33, 20}, 3, {4, 20, 33}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int an = cases[c].an, bn = cases[c].bn;
                int as[4], bs[4];
                memcpy(as, cases[c].a, sizeof as);
                memcpy(bs, cases[c].b, sizeof bs);
                // op(a) is (M, K) and op(b) (K, N): store the transposes when asked.
                if (ta) { int t = as[an - 1]; as[an - 1] = as[an - 2]; as[an - 2] = t; }
                if (tb) { int t = bs[bn - 1]; bs[bn - 1] = bs[bn - 2]; bs[bn - 2] = t; }
                Tensor *a = tensor_new(an, as, true), *b = tensor_new(bn, bs, true);
                fill_normal(a, 10 + c, 1.0);
                fill_normal(b, 20 + c, 1.0);
                MatmulCtx ctx = {ta, tb};
                char label[64];
                snprintf(label, sizeof label, "matmul case %zu ta %d tb %d", c, ta, tb);
                cuda_check_op(label, f_matmul, (Tensor *[]){a, b}, 2, &ctx);
                tensor_free(a);
                tensor_free(b);
            }
}

static int f_self_product(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    outs[0] = op_matmul(tp, x[0], x[0], false, true);   // a a^T: both gradients land in one buffer
    outs[1] = op_matmul(tp, x[0], x[0], true, false);   // a^T a
    return 2;
}

Test(cuda_ops, matmul_of_a_tensor_with_itself) {
    Tensor *a = cuda_input(true, 3, 2, 13, 21);
    cuda_check_op("a a^T and a^T a", f_self_product, &a, 1, NULL);
    tensor_free(a);
}

static int f_ew(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    outs[0] = op_add(tp, x[0], x[1]);
    outs[1] = op_sub(tp, x[0], x[1]);
    outs[2] = op_mul(tp, x[0], x[1]);
    outs[3] = op_scale(tp, x[0], -0.37);
    return 4;
}

Test(cuda_ops, elementwise_with_broadcasting) {
    // b: a's shape, a bias (D), a (7, D) suffix; D 33, then 32 (the scale's
    // four-a-thread kernel in the float32 build)
    for (int c = 0; c < 6; c++) {
        int D = c < 3 ? 33 : 32;
        Tensor *a = cuda_input(true, 1, 3, 5, 7, D);
        Tensor *b = c % 3 == 0   ? cuda_input(true, 2, 3, 5, 7, D)
                    : c % 3 == 1 ? cuda_input(true, 2, 1, D)
                                 : cuda_input(true, 2, 2, 7, D);
        char label[48];
        snprintf(label, sizeof label, "elementwise, b %s", SHAPE(b));
        cuda_check_op(label, f_ew, (Tensor *[]){a, b}, 2, NULL);
        tensor_free(a);
        tensor_free(b);
    }
    // A long broadcast (many rows, a narrow b): the row-block reduction.
    Tensor *a = cuda_input(true, 5, 2, 20000, 24), *b = cuda_input(true, 6, 1, 24);
    cuda_check_op("elementwise, 20000 rows", f_ew, (Tensor *[]){a, b}, 2, NULL);
    tensor_free(a);
    tensor_free(b);
}

static int f_unary(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    outs[0] = op_silu(tp, x[0]);
    outs[1] = op_add(tp, op_sigmoid(tp, x[0]), op_softplus(tp, x[0]));
    outs[2] = op_exp(tp, x[0]);
    outs[3] = op_add(tp, op_relu(tp, x[0]), op_silu_mul(tp, x[0], x[1]));
    return 4;
}

// 70001 elements: one a thread; 70000: silu_mul's four a thread (float32).
Test(cuda_ops, unary_activations) {
    for (int n = 70001; n >= 70000; n--) {
        Tensor *x = tensor_new(1, (int[]){n}, true), *y = cuda_input(true, 8, 1, n);
        fill_uniform(x, 7, -30, 30);   // both tails of sigmoid and softplus
        cuda_check_op(n % 4 ? "unary" : "unary, n % 4 == 0", f_unary, (Tensor *[]){x, y}, 2, NULL);
        tensor_free(x);
        tensor_free(y);
    }
}

static int f_silu_self(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    outs[0] = op_silu_mul(tp, x[0], x[0]);
    return 1;
}

Test(cuda_ops, silu_mul_of_a_tensor_with_itself) {
    for (int c = 0; c < 2; c++) {
        Tensor *x = c ? cuda_input(true, 9, 2, 32, 16) : cuda_input(true, 9, 2, 31, 17);
        cuda_check_op(c ? "silu_mul(x, x), 32 x 16" : "silu_mul(x, x), 31 x 17", f_silu_self, &x, 1, NULL);
        tensor_free(x);
    }
}

static int f_reduce(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    outs[0] = op_sum(tp, x[0]);
    outs[1] = op_mean(tp, op_mul(tp, x[0], x[0]));
    return 2;
}

Test(cuda_ops, sum_and_mean) {
    int sizes[] = {1, 255, 257, 1 << 20};
    for (int c = 0; c < 4; c++) {
        Tensor *x = cuda_input(true, 11 + c, 1, sizes[c]);
        char label[32];
        snprintf(label, sizeof label, "reduce %d", sizes[c]);
        cuda_check_op(label, f_reduce, &x, 1, NULL);
        tensor_free(x);
    }
}

// ---------------------------------------------------------------- the tape on the GPU

// A small network of the ops above: x W + b -> silu -> * x2 -> mean.
static int f_net(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    Tensor *h = op_add(tp, op_matmul(tp, x[0], x[1], false, false), x[2]);
    outs[0] = op_mean(tp, op_mul(tp, op_silu(tp, h), h));
    return 1;
}

Test(cuda_tape, a_network_and_a_reused_arena) {
    Tensor *x = cuda_input(false, 1, 3, 4, 64, 96), *w = cuda_input(true, 2, 2, 96, 80), *b = cuda_input(true, 3, 1, 80);
    Tensor *in[] = {x, w, b};
    cuda_check_op("network", f_net, in, 3, NULL);
    // The same step three times on one GPU tape, reset in between (the arena
    // consolidates into one block after the first): the same loss and
    // gradients, bit for bit.
    cuda_require();
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    real loss[3], gw[3];
    for (int s = 0; s < 3; s++) {
        Tensor *xs[3];
        for (int i = 0; i < 3; i++) {
            xs[i] = tape_tensor_copy(&tp, in[i]->ndim, in[i]->shape, in[i]->data);
            xs[i]->requires_grad = in[i]->requires_grad;
        }
        Tensor *out;
        f_net(&tp, xs, 3, NULL, &out);
        tape_backward(&tp, out);
        dev_to_host(&loss[s], out->data, sizeof(real), DEVICE_CUDA);
        dev_to_host(&gw[s], xs[1]->grad + 17, sizeof(real), DEVICE_CUDA);
        tape_reset(&tp);
    }
    cr_assert(tp.data.head && !tp.data.head->next, "after a reset the GPU arena is one block");
    for (int s = 1; s < 3; s++) {
        cr_assert(loss[s] == loss[0] && gw[s] == gw[0], "step %d: loss %.9g grad %.9g, step 0: %.9g %.9g", s,
                  (double)loss[s], (double)gw[s], (double)loss[0], (double)gw[0]);
    }
    tape_free(&tp);
    tensor_free(x);
    tensor_free(w);
    tensor_free(b);
}

Test(cuda_tape, an_op_without_a_kernel_names_itself) {
    cuda_require();
    // An op with no GPU pair must stop with its name when built on a GPU
    // tape, not run CPU code on device pointers.
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *x = tape_tensor_zeros(&tp, 1, (int[]){8});
    x->requires_grad = true;
    extern const OpDef *test_cpu_only_op(void);
    const OpDef *op = test_cpu_only_op();
    Tensor *y = tape_tensor(&tp, 1, (int[]){8});
    cr_assert(EXPECT_FAILURE(tape_run(&tp, op, &x, 1, &y, 1)));
    cr_assert(strstr(ag_last_error(), "has no CUDA kernel") && strstr(ag_last_error(), op->name), "message: %s",
              ag_last_error());
    tape_free(&tp);
}

Test(cuda_tape, an_input_on_the_wrong_device_is_refused) {
    cuda_require();
    // A host tensor on a GPU tape (and a GPU tensor on a CPU tape) must stop
    // with a message naming the op and the input, not fault in a kernel.
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *host = tensor_newv(false, 1, 8);
    Tensor *dev = tape_tensor_zeros(&tp, 1, (int[]){8});
    cr_assert(EXPECT_FAILURE(op_add(&tp, dev, host)));
    cr_assert(strstr(ag_last_error(), "op 'add': input 1") && strstr(ag_last_error(), "host memory") &&
                  strstr(ag_last_error(), "params_to_device"),
              "message: %s", ag_last_error());
    Tape cpu;
    tape_init(&cpu);
    cr_assert(EXPECT_FAILURE(op_add(&cpu, host, dev)));
    cr_assert(strstr(ag_last_error(), "input 1") && strstr(ag_last_error(), "GPU memory"), "message: %s",
              ag_last_error());
    // A state made with tensor_new_on is a GPU tensor: accepted.
    Tensor *s = tensor_new_on(DEVICE_CUDA, 1, (int[]){8});
    Tensor *y = op_add(&tp, dev, s);
    real h[8];
    dev_to_host(h, y->data, sizeof h, DEVICE_CUDA);
    for (int i = 0; i < 8; i++) cr_assert_eq(h[i], 0);
    tensor_free_on(DEVICE_CUDA, s);
    tape_free(&cpu);
    tape_free(&tp);
    tensor_free(host);
}

// An op with a CPU pair only (as a user's custom op starts out).
static void cpu_only_forward(Node *n) { (void)n; }
static void cpu_only_backward(Node *n) { (void)n; }
static const OpDef OP_CPU_ONLY = {"my_cpu_only_op", cpu_only_forward, cpu_only_backward};
const OpDef *test_cpu_only_op(void) { return &OP_CPU_ONLY; }

Test(cuda_tape, fresh_gradients_are_written_whole) {
    // In float64 fresh GPU buffers are NaN: an op that leaves part of a
    // gradient unwritten fails cuda_check_op. Here the check itself: a
    // poisoned buffer read back is NaN in float64, and a seeded backward of
    // sum gives exactly ones.
    cuda_require();
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *x = tape_tensor_zeros(&tp, 1, (int[]){1000});
    x->requires_grad = true;
    Tensor *s = op_sum(&tp, x);
    tape_backward(&tp, s);
    real g[1000];
    dev_to_host(g, x->grad, sizeof g, DEVICE_CUDA);
    for (int i = 0; i < 1000; i++) cr_assert(g[i] == 1, "d sum / dx[%d] = %g", i, (double)g[i]);
#ifdef AG_DOUBLE
    Tensor *p = tape_tensor(&tp, 1, (int[]){64});
    real v[64];
    dev_to_host(v, p->data, sizeof v, DEVICE_CUDA);
    for (int i = 0; i < 64; i++) cr_assert(isnan(v[i]), "fresh GPU buffers are NaN in float64");
#endif
    tape_free(&tp);
}

const void *cuda_arena_made_again(Tape *tp, const char *what, int at) {
    const ArenaBlock *old = arena_settled(&tp->data);
    cr_assert(old, "the arena has settled before %s %d", what, at);
    const void *mem = old->mem;
    tape_dalloc(tp, old->cap + 1);
    tape_reset(tp);
    return mem;
}

int cuda_decode_token(int b, int t) { return (b * 131 + t * 37 + 7) % 61; }

real *cuda_decode_logits(LM *lm, Device d, int B, int T, int reset_at, real **parallel) {
    int *tokens = malloc((size_t)B * T * sizeof(int));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) tokens[b * T + t] = cuda_decode_token(b, t);
    real *out = test_lm_decode_logits(lm, d, tokens, B, T, reset_at, parallel);
    free(tokens);
    return out;
}

LMConfig cuda_small_lm_config(const char *layers) { return test_lm_config(layers, 97, 32, 64, 16, 8, 4); }

void cuda_train_steps(LM *lm, ParamStore *ps, Device d, int steps, CudaLossFn loss_fn, void *ctx, double *losses,
                      real **grad) {
    Optimizer opt;
    adamw_init(&opt, ps, 0.9, 0.95, 1e-8, 0.1);
    Tape tp;
    tape_init_on(&tp, d);
    *grad = NULL;
    for (int s = 0; s < steps; s++) {
        params_zero_grad(ps);
        Tensor *loss = loss_fn(&tp, lm, s, ctx);
        tape_backward(&tp, loss);
        losses[s] = tape_item(&tp, loss);
        tape_reset(&tp);
        if (s == 0) {
            *grad = malloc((size_t)ps->numel * sizeof(real));
            dev_to_host(*grad, ps->grad, (size_t)ps->numel * sizeof(real), d);
        }
        optim_clip_grad_norm(ps, 1.0);
        optim_step(&opt, ps, 3e-3);
    }
    tape_free(&tp);
    optim_free(&opt);
}
