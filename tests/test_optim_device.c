// test_optim_device.c: optim_device.h's step on the CPU (the CPU's table
// runs its work with its loops) against the calls of optim.h it stands for:
// the same bits in the norms, parameters and moments, the same verdicts
// (no update on a NaN gradient, the step count held; the non-finite
// parameter named), for AdamW and SGD, accum_steps 1 and 2, clipping that
// engages on some steps, a shard, and a frozen and a no-decay parameter.
// The GPU's (eager and from a graph) is tests/cuda/test_cuda_optim_step.c's.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "optim_device.h"
#include "test_util.h"

#define STEPS 5

static void make(ParamStore *ps) {
    params_init(ps);
    params_add(ps, "w", 2, (int[]){19, 23}, init_normal(0.5), 0);
    params_add(ps, "gain", 1, (int[]){23}, init_ones(), TENSOR_NO_DECAY);
    params_add(ps, "frozen", 1, (int[]){301}, init_normal(1.0), TENSOR_FROZEN);
    params_add(ps, "big", 1, (int[]){9001}, init_normal(0.1), 0);   // three chunks, the last short
    params_finalize(ps, 3);
}

static void grads(ParamStore *ps, int s, int nan_step) {
    static const double f[STEPS] = {0.002, 0.05, 0.001, 0.2, 0.004};
    real *g = test_randn(ps->numel, 40 + s);
    for (int64_t i = 0; i < ps->numel; i++) g[i] *= (real)f[s];
    memset(g + ps->offsets[2], 0, (size_t)ps->params[2]->numel * sizeof(real));
    if (s == nan_step) g[ps->offsets[3] + 4] = (real)NAN;
    memcpy(ps->grad, g, (size_t)ps->numel * sizeof(real));
    free(g);
}

typedef struct {
    double norm[STEPS];
    bool stepped[STEPS];
    char bad[STEPS][64];   // the parameter named non-finite ("": none)
    real *values, *m, *v;
    int64_t steps, span;
} Run;

static void run(bool queued, OptimKind kind, int accum, bool shard, int nan_step, int bad_step, Run *r) {
    ParamStore ps;
    make(&ps);
    Optimizer opt;
    if (kind == OPTIM_ADAMW) adamw_init(&opt, &ps, 0.9, 0.95, 1e-8, 0.1);
    else sgd_init(&opt, &ps, 0.9, 0.1);
    if (shard) optim_set_shard(&opt, 100, ps.numel - 4000);
    OptimDevice od;
    if (queued) optim_device_init(&od, DEVICE_CPU, true);   // (the CPU has no graphs: eagerly)
    for (int s = 0; s < STEPS; s++) {
        params_zero_grad(&ps);
        grads(&ps, s, nan_step);
        if (s == bad_step) ps.data[ps.offsets[1] + 2] = (real)INFINITY;
        double lr = lr_cosine(s, 2, STEPS, 1e-2, 1e-3);
        const Tensor *bad;
        if (queued) {
            OptimDeviceResult o;
            optim_device_step(&od, &opt, &ps, accum, 1.0, lr, &o);
            r->norm[s] = o.norm, r->stepped[s] = o.stepped, bad = o.bad;
        } else {
            if (accum > 1) optim_scale_grads(&ps, 1.0 / accum);
            r->norm[s] = optim_clip_grad_norm(&ps, 1.0);
            r->stepped[s] = isfinite(r->norm[s]);
            if (r->stepped[s]) optim_step(&opt, &ps, lr);
            bad = optim_nonfinite_param(&ps, &opt);
        }
        snprintf(r->bad[s], sizeof r->bad[s], "%s", bad ? bad->name : "");
    }
    if (queued) {
        cr_assert(od.g == NULL && od.eager == STEPS && od.replays == 0, "the CPU replayed");
        // Nothing the work is built from changed between the steps: its table
        // was built once (on a GPU each rebuild is another capture).
        cr_assert_eq(od.tables, 1, "the step's table was built %lld times in %d steps", (long long)od.tables, STEPS);
        optim_device_free(&od);
    }
    r->span = opt.hi - opt.lo;
    r->steps = opt.step;
    size_t pb = (size_t)ps.numel * sizeof(real), mb = (size_t)r->span * sizeof(real);
    r->values = malloc(pb);
    memcpy(r->values, ps.data, pb);
    r->m = malloc(mb);
    memcpy(r->m, opt.m, mb);
    r->v = opt.v ? malloc(mb) : NULL;
    if (opt.v) memcpy(r->v, opt.v, mb);
    optim_free(&opt);
    params_free(&ps);
}

static void same(const char *what, const real *a, const real *b, int64_t n) {
    if (!a && !b) return;
    for (int64_t i = 0; i < n; i++)
        cr_assert(memcmp(&a[i], &b[i], sizeof(real)) == 0, "%s [%lld]: %.17g by optim.h's calls, %.17g queued", what,
                  (long long)i, (double)a[i], (double)b[i]);
}

static void compare(OptimKind kind, int accum, bool shard, int nan_step, int bad_step) {
    Run c, q;
    run(false, kind, accum, shard, nan_step, bad_step, &c);
    run(true, kind, accum, shard, nan_step, bad_step, &q);
    for (int s = 0; s < STEPS; s++) {
        cr_assert(memcmp(&c.norm[s], &q.norm[s], sizeof(double)) == 0 || (isnan(c.norm[s]) && isnan(q.norm[s])),
                  "step %d: norm %.17g by the calls, %.17g queued", s, c.norm[s], q.norm[s]);
        cr_assert_eq(c.stepped[s], q.stepped[s], "step %d", s);
        cr_assert_str_eq(c.bad[s], q.bad[s], "step %d: non-finite parameter", s);
    }
    cr_assert_eq(c.steps, q.steps);
    if (nan_step >= 0)
        cr_assert(!q.stepped[nan_step] && q.steps == STEPS - 1, "the NaN gradient's step updated (%lld steps)",
                  (long long)q.steps);
    if (bad_step >= 0) cr_assert_str_eq(q.bad[bad_step], "gain", "the infinite parameter is not named");
    ParamStore ps;
    make(&ps);
    same("parameter", c.values, q.values, ps.numel);
    params_free(&ps);
    same("first moment", c.m, q.m, c.span);
    same("second moment", c.v, q.v, c.span);
    free(c.values), free(c.m), free(c.v), free(q.values), free(q.m), free(q.v);
}

Test(optim_device, adamw_equals_the_calls) { compare(OPTIM_ADAMW, 1, false, -1, -1); }
Test(optim_device, sgd_accum_2_equals_the_calls) { compare(OPTIM_SGD, 2, false, -1, -1); }
Test(optim_device, adamw_shard_accum_2) { compare(OPTIM_ADAMW, 2, true, -1, -1); }
Test(optim_device, a_nan_gradient_skips_the_update) { compare(OPTIM_ADAMW, 1, false, 2, -1); }
Test(optim_device, a_nonfinite_parameter_is_named) { compare(OPTIM_SGD, 1, false, -1, 3); }
