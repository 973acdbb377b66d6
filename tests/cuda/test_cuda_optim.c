// test_cuda_optim.c: parameters on the GPU and the optimizers' steps there,
// against the same steps on the CPU: AdamW and SGD with weight decay, a
// no-decay and a frozen parameter, gradient scaling, the clipped global
// norm, the finite check, and the ZeRO-1 shard form.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "cuda_check.h"
#include "optim.h"

// Three parameters: a decayed matrix, a no-decay gain and a frozen one.
static void make_params(ParamStore *ps) {
    params_init(ps);
    params_add(ps, "w", 2, (int[]){37, 53}, init_normal(0.5), 0);
    params_add(ps, "gain", 1, (int[]){53}, init_ones(), TENSOR_NO_DECAY);
    params_add(ps, "frozen", 1, (int[]){300001}, init_normal(1.0), TENSOR_FROZEN);
    params_add(ps, "big", 1, (int[]){200003}, init_normal(0.1), 0);
    params_finalize(ps, 7);
}

// The same gradients on both: test_randn of the trainable elements, scaled
// so that clipping at 1 engages; frozen gradients stay zero.
static void set_grads(ParamStore *ps, int step) {
    real *g = test_randn(ps->numel, 100 + step);
    for (int i = 0; i < ps->n; i++)
        if (ps->params[i]->flags & TENSOR_FROZEN)
            memset(g + ps->offsets[i], 0, (size_t)ps->params[i]->numel * sizeof(real));
    dev_from_host(ps->grad, ps->device, g, (size_t)ps->numel * sizeof(real));
    free(g);
}

typedef struct {
    double norm[6];
    real *values;     // after the steps
    real *m, *v;      // moments, host copies
} Outcome;

static void run(Device d, OptimKind kind, Outcome *o) {
    ParamStore ps;
    make_params(&ps);
    if (d != DEVICE_CPU) params_to_device(&ps, d);
    Optimizer opt;
    if (kind == OPTIM_ADAMW) adamw_init(&opt, &ps, 0.9, 0.95, 1e-8, 0.1);
    else sgd_init(&opt, &ps, 0.9, 0.1);
    for (int s = 0; s < 6; s++) {
        params_zero_grad(&ps);
        set_grads(&ps, s);
        optim_scale_grads(&ps, 0.5);
        o->norm[s] = optim_clip_grad_norm(&ps, 100.0);
        optim_step(&opt, &ps, 1e-2 * (s + 1));
    }
    size_t bytes = (size_t)ps.numel * sizeof(real);
    o->values = malloc(bytes);
    memcpy(o->values, params_pull(&ps), bytes);
    o->m = malloc(bytes);
    dev_to_host(o->m, opt.m, bytes, opt.device);
    o->v = NULL;
    if (opt.v) {
        o->v = malloc(bytes);
        dev_to_host(o->v, opt.v, bytes, opt.device);
    }
    optim_free(&opt);
    params_free(&ps);
}

static void compare(OptimKind kind) {
    cuda_require();
    Outcome c, g;
    run(DEVICE_CPU, kind, &c);
    run(DEVICE_CUDA, kind, &g);
    for (int s = 0; s < 6; s++)
        cr_assert(fabs(c.norm[s] - g.norm[s]) <= 1e-12 * c.norm[s] + (sizeof(real) == 4 ? 1e-5 * c.norm[s] : 0),
                  "step %d: grad norm %.15g on the CPU, %.15g on the GPU", s, c.norm[s], g.norm[s]);
    ParamStore ps;
    make_params(&ps);
    for (int i = 0; i < ps.n; i++) {
        int64_t off = ps.offsets[i], n = ps.params[i]->numel;
        double e = max_rel_diff(c.values + off, g.values + off, n);
        cr_assert(e <= FORM_TOL, "%s: parameter '%s' differs by %.3e", optim_name(kind), ps.params[i]->name, e);
        e = max_rel_diff(c.m + off, g.m + off, n);
        cr_assert(e <= FORM_TOL, "%s: first moment of '%s' differs by %.3e", optim_name(kind), ps.params[i]->name, e);
        if (c.v) {
            e = max_rel_diff(c.v + off, g.v + off, n);
            cr_assert(e <= FORM_TOL, "second moment of '%s' differs by %.3e", ps.params[i]->name, e);
        }
        if (ps.params[i]->flags & TENSOR_FROZEN)   // untouched: still the initial values, bit for bit
            cr_assert(memcmp(g.values + off, ps.data + off, (size_t)n * sizeof(real)) == 0,
                      "the frozen parameter moved on the GPU");
    }
    params_free(&ps);
    free(c.values), free(c.m), free(c.v), free(g.values), free(g.m), free(g.v);
}

Test(cuda_optim, adamw_matches_the_cpu) { compare(OPTIM_ADAMW); }
Test(cuda_optim, sgd_matches_the_cpu) { compare(OPTIM_SGD); }

Test(cuda_optim, clipping_engages_and_the_norm_is_the_cpus) {
    cuda_require();
    ParamStore a, b;
    make_params(&a);
    make_params(&b);
    params_to_device(&b, DEVICE_CUDA);
    set_grads(&a, 0);
    set_grads(&b, 0);
    double na = optim_clip_grad_norm(&a, 1.0), nb = optim_clip_grad_norm(&b, 1.0);
    cr_assert(na > 1.0, "the test's gradients must be clipped (norm %g)", na);
    cr_assert(fabs(na - nb) <= 1e-6 * na, "norm %.15g on the CPU, %.15g on the GPU", na, nb);
    real *gb = malloc((size_t)b.numel * sizeof(real));
    dev_to_host(gb, b.grad, (size_t)b.numel * sizeof(real), DEVICE_CUDA);
    double e = max_rel_diff(a.grad, gb, a.numel);
    cr_assert(e <= FORM_TOL, "clipped gradients differ by %.3e", e);
    double after = optim_grad_norm(&b);
    cr_assert(fabs(after - 1.0) < 1e-4, "after clipping the norm is %.9g, not 1", after);
    free(gb);
    params_free(&a);
    params_free(&b);
}

Test(cuda_optim, the_finite_check_names_the_parameter) {
    cuda_require();
    ParamStore ps;
    make_params(&ps);
    params_to_device(&ps, DEVICE_CUDA);
    Optimizer opt;
    adamw_init(&opt, &ps, 0.9, 0.95, 1e-8, 0.1);
    cr_assert_null(optim_nonfinite_param(&ps, &opt));
    // A NaN in 'big' (last parameter), then an inf in the second moment of 'gain'.
    real bad = NAN;
    Tensor *big = params_find(&ps, "big"), *gain = params_find(&ps, "gain");
    dev_from_host(big->data + 12345, DEVICE_CUDA, &bad, sizeof bad);
    const Tensor *t = optim_nonfinite_param(&ps, &opt);
    cr_assert(t == big, "found '%s', expected 'big'", t ? t->name : "nothing");
    bad = INFINITY;
    int64_t off = gain->data - ps.data;
    dev_from_host(opt.v + off + 3, DEVICE_CUDA, &bad, sizeof bad);
    t = optim_nonfinite_param(&ps, &opt);
    cr_assert(t == gain, "found '%s', expected 'gain' (the earlier one)", t ? t->name : "nothing");
    optim_free(&opt);
    params_free(&ps);
}

Test(cuda_optim, a_shard_updates_only_its_elements) {
    cuda_require();
    ParamStore a, b;
    make_params(&a);
    make_params(&b);
    params_to_device(&b, DEVICE_CUDA);
    Optimizer oa, ob;
    adamw_init(&oa, &a, 0.9, 0.95, 1e-8, 0.1);
    adamw_init(&ob, &b, 0.9, 0.95, 1e-8, 0.1);
    int64_t lo = 1000, hi = a.numel - 5000;
    optim_set_shard(&oa, lo, hi);
    optim_set_shard(&ob, lo, hi);
    set_grads(&a, 3);
    set_grads(&b, 3);
    optim_step(&oa, &a, 1e-2);
    optim_step(&ob, &b, 1e-2);
    double e = max_rel_diff(a.data, params_pull(&b), a.numel);
    cr_assert(e <= FORM_TOL, "sharded AdamW: values differ by %.3e", e);
    ParamStore init;
    make_params(&init);
    cr_assert(memcmp(b.host, init.data, (size_t)lo * sizeof(real)) == 0, "elements below the shard moved");
    params_free(&init);
    optim_free(&oa);
    optim_free(&ob);
    params_free(&a);
    params_free(&b);
}
