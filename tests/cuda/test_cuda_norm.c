// test_cuda_norm.c: rmsnorm (whole rows, per group, with and without a gain),
// add_rmsnorm, rmsnorm_gate and l2norm_heads on the GPU against the CPU:
// odd and wide rows (more than one column tile of the gain's reduction),
// many rows (many row blocks), inputs without gradients, one tensor passed
// twice, gradients that add to another op's, and the gain's gradient
// repeating bit for bit.
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "device.h"
#include "ops.h"

// A gain in [0.5, 1.5] (keeps the rows near their normalised scale).
static Tensor *gain(bool grad, uint64_t seed, int n) {
    Tensor *g = tensor_new(1, &n, grad);
    fill_uniform(g, seed, 0.5, 1.5);
    return g;
}

// Row shapes (rows, D) and the group normalised: small and odd, per head,
// wider than one 256-column tile, and many rows (many row blocks for dg);
// then the float32 build's vector kernels (ops_norm_vec.cuh: groups of 32,
// 64, 128, 256 and 1024; gated groups of 32 and 64 with the gain's partials
// over many blocks, an odd number of rows for the teams of 8 and 16 lanes).
static const struct {
    int rows, D, group;
} SHAPES[] = {
    {1, 7, 7}, {6, 5, 5}, {28, 48, 16}, {28, 48, 8}, {9, 300, 300}, {3, 1030, 1030}, {20000, 24, 24}, {3000, 64, 8},
    {37, 1024, 1024}, {45, 256, 256}, {13, 128, 128}, {9001, 64, 64}, {901, 96, 32}, {3, 512, 64},
};
#define N_SHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])

// ---------------------------------------------------------------- rmsnorm

typedef struct {
    int group;
    double eps;
    bool with_g, twice;   // twice: a second norm of x with g, so both gradients add
} RmsCtx;

static int f_rmsnorm(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    RmsCtx *c = ctx;
    Tensor *g = c->with_g ? x[1] : NULL;
    outs[0] = op_rmsnorm_groups(tp, x[0], g, c->group, c->eps);
    if (!c->twice) return 1;
    outs[1] = op_rmsnorm_groups(tp, x[0], g, c->group, 0.1);
    return 2;
}

Test(cuda_norm, rmsnorm_every_shape_and_form) {
    for (int s = 0; s < N_SHAPES; s++)
        for (int form = 0; form < 4; form++) {
            RmsCtx c = {SHAPES[s].group, 1e-5, form & 1, form >> 1};
            Tensor *x = cuda_input(true, 10 + s, 2, SHAPES[s].rows, SHAPES[s].D), *g = gain(true, 30 + s, c.group);
            char label[96];
            snprintf(label, sizeof label, "rmsnorm (%d, %d) group %d%s%s", SHAPES[s].rows, SHAPES[s].D, c.group,
                     c.with_g ? " with g" : " without g", c.twice ? ", twice" : "");
            cuda_check_op(label, f_rmsnorm, (Tensor *[]){x, g}, c.with_g ? 2 : 1, &c);
            tensor_free(x);
            tensor_free(g);
        }
}

Test(cuda_norm, rmsnorm_inputs_without_gradients) {
    // x only, g only, and neither (nothing recorded: the forward saves nothing).
    for (int k = 0; k < 3; k++) {
        RmsCtx c = {16, 0.1, true, false};
        Tensor *x = cuda_input(k == 0, 3, 3, 2, 9, 48), *g = gain(k == 1, 4, 16);
        char label[48];
        snprintf(label, sizeof label, "rmsnorm, gradient case %d", k);
        cuda_check_op(label, f_rmsnorm, (Tensor *[]){x, g}, 2, &c);
        tensor_free(x);
        tensor_free(g);
    }
}

static int f_rmsnorm_self(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    outs[0] = op_rmsnorm(tp, x[0], x[0], 1e-5);   // dx is written, then dg adds to the same buffer
    return 1;
}

Test(cuda_norm, rmsnorm_of_a_tensor_with_itself_as_gain) {
    for (int D = 37; D <= 300; D += 263) {
        Tensor *x = cuda_input(true, 5, 1, D);
        cuda_check_op("rmsnorm(x, x)", f_rmsnorm_self, &x, 1, NULL);
        tensor_free(x);
    }
}

// ---------------------------------------------------------------- add_rmsnorm

typedef struct {
    int outs;     // 0: y and the sum h, 1: y only, 2: h only
    bool twice;   // a second add_rmsnorm of the same a, b, g (every gradient adds)
} AddCtx;

static int f_add_rmsnorm(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    AddCtx *c = ctx;
    int k = 0;
    for (int rep = 0; rep < (c->twice ? 2 : 1); rep++) {
        Tensor *h, *y = op_add_rmsnorm(tp, x[0], x[1], x[2], rep ? 0.1 : 1e-5, &h);
        if (c->outs != 2) outs[k++] = y;
        if (c->outs != 1) outs[k++] = h;
    }
    return k;
}

Test(cuda_norm, add_rmsnorm_every_shape_and_output) {
    for (int s = 0; s < N_SHAPES; s++) {
        if (SHAPES[s].group != SHAPES[s].D) continue;   // the norm is over whole rows
        for (int form = 0; form < 6; form++) {
            AddCtx c = {form % 3, form >= 3};
            int R = SHAPES[s].rows, D = SHAPES[s].D;
            Tensor *a = cuda_input(true, 40 + s, 2, R, D), *b = cuda_input(true, 50 + s, 2, R, D), *g = gain(true, 60 + s, D);
            char label[96];
            snprintf(label, sizeof label, "add_rmsnorm (%d, %d) outputs %d%s", R, D, c.outs, c.twice ? ", twice" : "");
            cuda_check_op(label, f_add_rmsnorm, (Tensor *[]){a, b, g}, 3, &c);
            tensor_free(a);
            tensor_free(b);
            tensor_free(g);
        }
    }
}

Test(cuda_norm, add_rmsnorm_inputs_without_gradients) {
    // Each of a, b, g alone without a gradient, then none at all; rows of 33
    // (the scalar kernels) and of 64 (the float32 build's vector kernels).
    for (int k = 0; k < 8; k++) {
        AddCtx c = {0, false};
        int D = k < 4 ? 33 : 64, q = k % 4;
        Tensor *a = cuda_input(q != 0 && q != 3, 1, 3, 2, 7, D), *b = cuda_input(q != 1 && q != 3, 2, 3, 2, 7, D);
        Tensor *g = gain(q != 2 && q != 3, 3, D);
        char label[48];
        snprintf(label, sizeof label, "add_rmsnorm (D %d), gradient case %d", D, q);
        cuda_check_op(label, f_add_rmsnorm, (Tensor *[]){a, b, g}, 3, &c);
        tensor_free(a);
        tensor_free(b);
        tensor_free(g);
    }
}

// One (D) tensor as a and b, as a and g, and as all three.
static int f_add_rmsnorm_alias(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    int k = *(int *)ctx;
    Tensor *a = x[0], *b = k == 1 ? x[1] : x[0], *g = k == 0 ? x[1] : x[0];
    outs[0] = op_add_rmsnorm(tp, a, b, g, 1e-5, &outs[1]);
    return 2;
}

Test(cuda_norm, add_rmsnorm_with_one_tensor_twice) {
    for (int k = 0; k < 3; k++) {
        Tensor *a = cuda_input(true, 7, 1, 45), *o = cuda_input(true, 8, 1, 45);
        char label[48];
        snprintf(label, sizeof label, "add_rmsnorm, aliasing case %d", k);
        cuda_check_op(label, f_add_rmsnorm_alias, (Tensor *[]){a, o}, 2, &k);
        tensor_free(a);
        tensor_free(o);
    }
}

// ---------------------------------------------------------------- rmsnorm_gate

typedef struct {
    int group;
    bool twice;   // a second gated norm of the same x, g, z (every gradient adds)
} GateCtx;

static int f_gate(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    GateCtx *c = ctx;
    outs[0] = op_rmsnorm_gate(tp, x[0], x[1], x[2], c->group, 1e-5);
    if (!c->twice) return 1;
    outs[1] = op_rmsnorm_gate(tp, x[0], x[1], x[2], c->group, 0.1);
    return 2;
}

Test(cuda_norm, rmsnorm_gate_every_shape) {
    for (int s = 0; s < N_SHAPES; s++)
        for (int twice = 0; twice < 2; twice++) {
            GateCtx c = {SHAPES[s].group, twice};
            int R = SHAPES[s].rows, D = SHAPES[s].D;
            Tensor *x = cuda_input(true, 70 + s, 2, R, D), *z = cuda_input(true, 80 + s, 2, R, D);
            Tensor *g = gain(true, 90 + s, c.group);
            fill_normal(z, 80 + s, 2.0);   // both tails of the sigmoid
            char label[96];
            snprintf(label, sizeof label, "rmsnorm_gate (%d, %d) group %d%s", R, D, c.group, twice ? ", twice" : "");
            cuda_check_op(label, f_gate, (Tensor *[]){x, g, z}, 3, &c);
            tensor_free(x);
            tensor_free(z);
            tensor_free(g);
        }
}

Test(cuda_norm, rmsnorm_gate_inputs_without_gradients) {
    // Each of x, g, z alone without a gradient, none at all, and the gain's
    // alone; groups of 16 (the scalar kernels) and of 64 (the float32 build's
    // vector kernels, which sum the gain's gradient in the same pass).
    for (int k = 0; k < 10; k++) {
        int q = k % 5;
        GateCtx c = {k < 5 ? 16 : 64, false};
        bool gx = q != 0 && q < 3, gg = q != 1 && q != 3, gz = q != 2 && q < 3;
        Tensor *x = cuda_input(gx, 1, 3, 3, 5, 192), *z = cuda_input(gz, 2, 3, 3, 5, 192), *g = gain(gg, 3, c.group);
        char label[48];
        snprintf(label, sizeof label, "rmsnorm_gate (group %d), gradient case %d", c.group, q);
        cuda_check_op(label, f_gate, (Tensor *[]){x, g, z}, 3, &c);
        tensor_free(x);
        tensor_free(z);
        tensor_free(g);
    }
}

// One (D) tensor as x and g, then as z and g (x and z must differ).
static int f_gate_alias(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    int D = x[0]->shape[0];
    outs[0] = *(int *)ctx == 0 ? op_rmsnorm_gate(tp, x[0], x[0], x[1], D, 1e-5)
                               : op_rmsnorm_gate(tp, x[0], x[1], x[1], D, 1e-5);
    return 1;
}

Test(cuda_norm, rmsnorm_gate_with_one_tensor_twice) {
    for (int k = 0; k < 2; k++) {
        Tensor *a = cuda_input(true, 11, 1, 40), *b = cuda_input(true, 12, 1, 40);
        char label[48];
        snprintf(label, sizeof label, "rmsnorm_gate, aliasing case %d", k);
        cuda_check_op(label, f_gate_alias, (Tensor *[]){a, b}, 2, &k);
        tensor_free(a);
        tensor_free(b);
    }
}

// ---------------------------------------------------------------- l2norm_heads

typedef struct {
    int hd;
    bool twice;   // a second use of x (its gradient adds)
} L2Ctx;

static int f_l2(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    L2Ctx *c = ctx;
    outs[0] = op_l2norm_heads(tp, x[0], c->hd);
    if (!c->twice) return 1;
    outs[1] = op_mul(tp, op_l2norm_heads(tp, x[0], c->hd), x[0]);
    return 2;
}

Test(cuda_norm, l2norm_heads_every_head_dim) {
    int hds[] = {1, 5, 8, 16, 32, 33, 64, 128, 256, 300, 512, 1024};
    for (int h = 0; h < (int)(sizeof hds / sizeof hds[0]); h++)
        for (int twice = 0; twice < 2; twice++) {
            L2Ctx c = {hds[h], twice};
            Tensor *x = cuda_input(true, 100 + h, 3, 3, 7, 4 * hds[h]);
            char label[64];
            snprintf(label, sizeof label, "l2norm_heads hd %d%s", hds[h], twice ? ", twice" : "");
            cuda_check_op(label, f_l2, &x, 1, &c);
            tensor_free(x);
        }
    // Many heads, and a forward with nothing recorded.
    L2Ctx c = {16, false};
    Tensor *x = cuda_input(true, 120, 2, 5000, 64), *y = cuda_input(false, 121, 3, 2, 9, 32);
    cuda_check_op("l2norm_heads 20000 heads", f_l2, &x, 1, &c);
    cuda_check_op("l2norm_heads without gradients", f_l2, &y, 1, &c);
    tensor_free(x);
    tensor_free(y);
}

// ---------------------------------------------------------------- determinism

// The inputs' gradients of f on a fresh GPU tape (host copies), from one seed per output.
static void gpu_grads(GradcheckFn f, Tensor *const *in, int n_in, void *ctx, real **grads) {
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *x[NODE_MAX_IN], *outs[GRADCHECK_MAX_OUT];
    for (int i = 0; i < n_in; i++) {
        x[i] = tape_tensor_copy(&tp, in[i]->ndim, in[i]->shape, in[i]->data);
        x[i]->requires_grad = true;
    }
    int n_out = f(&tp, x, n_in, ctx, outs);
    real *seeds[GRADCHECK_MAX_OUT];
    for (int k = 0; k < n_out; k++) seeds[k] = test_randn(outs[k]->numel, 500 + k);
    tape_backward_multi(&tp, outs, (const real *const *)seeds, n_out);
    for (int i = 0; i < n_in; i++) {
        grads[i] = malloc((size_t)in[i]->numel * sizeof(real));
        dev_to_host(grads[i], x[i]->grad, (size_t)in[i]->numel * sizeof(real), DEVICE_CUDA);
    }
    dev_sync(DEVICE_CUDA);
    for (int k = 0; k < n_out; k++) free(seeds[k]);
    tape_free(&tp);
}

Test(cuda_norm, gradients_repeat_bit_for_bit) {
    cuda_require();
    Tensor *x = cuda_input(true, 1, 2, 30000, 64), *z = cuda_input(true, 2, 2, 30000, 64), *g = gain(true, 3, 64);
    Tensor *g8 = gain(true, 4, 8);
    AddCtx ac = {0, false};
    GateCtx gc = {8, false}, gc64 = {64, false};   // 64: the float32 build's per-block partials of dg
    struct {
        const char *name;
        GradcheckFn f;
        Tensor *in[3];
        void *ctx;
    } runs[] = {
        {"add_rmsnorm", f_add_rmsnorm, {x, z, g}, &ac},
        {"rmsnorm_gate", f_gate, {x, g8, z}, &gc},
        {"rmsnorm_gate (groups of 64)", f_gate, {x, g, z}, &gc64},
    };
    for (int r = 0; r < 3; r++) {
        real *first[3], *again[3];
        gpu_grads(runs[r].f, runs[r].in, 3, runs[r].ctx, first);
        gpu_grads(runs[r].f, runs[r].in, 3, runs[r].ctx, again);
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(memcmp(first[i], again[i], (size_t)runs[r].in[i]->numel * sizeof(real)), 0,
                         "%s: the gradient of input %d differs between two runs", runs[r].name, i);
            free(first[i]);
            free(again[i]);
        }
    }
    tensor_free(x);
    tensor_free(z);
    tensor_free(g);
    tensor_free(g8);
}
