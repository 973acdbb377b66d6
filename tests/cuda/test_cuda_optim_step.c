// test_cuda_optim_step.c: the optimizer's step queued as one stretch of GPU
// work (optim_device.h), run eagerly and replayed from a CUDA graph, against
// the calls of optim.h it stands for (optim_scale_grads, optim_clip_grad_norm,
// optim_step, optim_nonfinite_param) on the same GPU: the same bits in every
// norm, parameter and moment, for AdamW and SGD, accum_steps 1 and 3, with
// and without clipping (the gradients' size makes it engage on some steps
// only), a learning rate that changes every step, a ZeRO-1 shard, a step
// whose gradient is NaN or infinite (no update, the step count held) and a
// parameter made non-finite (the same parameter named).
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "cuda_check.h"
#include "optim_device.h"

#define STEPS 7

// A decayed matrix, a no-decay gain, a frozen vector and a large decayed one
// (many chunks, one cut short).
static void make_params(ParamStore *ps) {
    params_init(ps);
    params_add(ps, "w", 2, (int[]){37, 53}, init_normal(0.5), 0);
    params_add(ps, "gain", 1, (int[]){53}, init_ones(), TENSOR_NO_DECAY);
    params_add(ps, "frozen", 1, (int[]){3001}, init_normal(1.0), TENSOR_FROZEN);
    params_add(ps, "big", 1, (int[]){20003}, init_normal(0.1), 0);
    params_finalize(ps, 7);
    params_to_device(ps, DEVICE_CUDA);
}

typedef struct {
    OptimKind kind;
    int accum;
    double max_norm;
    bool shard;
    int nan_step, inf_step;   // a gradient element NaN / infinite at this step (-1: none)
    int bad_step;             // a parameter made infinite before this step (-1: none)
} StepCase;

typedef enum { WAY_CALLS, WAY_QUEUED, WAY_GRAPH } Way;
static const char *const WAY[] = {"optim.h's calls", "queued eagerly", "replayed from a graph"};

typedef struct {
    double norm[STEPS];
    bool stepped[STEPS];
    char bad[STEPS][64];    // the parameter named non-finite ("" none)
    int64_t numel, span, opt_steps;
    real *values, *m, *v;   // host copies at the end
    OptimDevice od;         // counters (pointers cleared)
} StepRun;

// Step s's gradients, the same on every run: normal values scaled so that
// the norm (about 150 s_f) crosses 1 back and forth; frozen ones zero.
static void set_grads(ParamStore *ps, const StepCase *sc, int s) {
    static const double f[STEPS] = {0.001, 0.02, 0.0005, 0.05, 0.004, 0.3, 0.002};
    real *g = test_randn(ps->numel, 300 + s);
    for (int64_t i = 0; i < ps->numel; i++) g[i] *= (real)f[s];
    for (int i = 0; i < ps->n; i++)
        if (ps->params[i]->flags & TENSOR_FROZEN)
            memset(g + ps->offsets[i], 0, (size_t)ps->params[i]->numel * sizeof(real));
    if (s == sc->nan_step) g[ps->offsets[3] + 17] = (real)NAN;
    if (s == sc->inf_step) g[ps->offsets[0] + 5] = (real)INFINITY;
    dev_from_host(ps->grad, ps->device, g, (size_t)ps->numel * sizeof(real));
    free(g);
}

static void step_calls(ParamStore *ps, Optimizer *opt, const StepCase *sc, double lr, StepRun *r, int s) {
    if (sc->accum > 1) optim_scale_grads(ps, 1.0 / sc->accum);
    r->norm[s] = optim_clip_grad_norm(ps, sc->max_norm);
    r->stepped[s] = isfinite(r->norm[s]);
    if (r->stepped[s]) optim_step(opt, ps, lr);
    const Tensor *bad = optim_nonfinite_param(ps, opt);
    snprintf(r->bad[s], sizeof r->bad[s], "%s", bad ? bad->name : "");
}

static void step_run(const StepCase *sc, Way way, StepRun *r) {
    memset(r, 0, sizeof *r);
    ParamStore ps;
    make_params(&ps);
    Optimizer opt;
    if (sc->kind == OPTIM_ADAMW) adamw_init(&opt, &ps, 0.9, 0.95, 1e-8, 0.1);
    else sgd_init(&opt, &ps, 0.9, 0.1);
    if (sc->shard) optim_set_shard(&opt, 1000, ps.numel - 7000);   // inside "w" to inside "big"
    OptimDevice od;
    if (way != WAY_CALLS) {
        optim_device_init(&od, DEVICE_CUDA, way == WAY_GRAPH);
        od.quiet = true;
    }
    for (int s = 0; s < STEPS; s++) {
        params_zero_grad(&ps);
        set_grads(&ps, sc, s);
        if (s == sc->bad_step) {
            real inf = (real)INFINITY;
            dev_from_host(ps.data + ps.offsets[1] + 3, DEVICE_CUDA, &inf, sizeof inf);
        }
        double lr = lr_cosine(s, 2, STEPS, 1e-2, 1e-3);
        if (way == WAY_CALLS) {
            step_calls(&ps, &opt, sc, lr, r, s);
            continue;
        }
        OptimDeviceResult o;
        optim_device_step(&od, &opt, &ps, sc->accum, sc->max_norm, lr, &o);
        r->norm[s] = o.norm;
        r->stepped[s] = o.stepped;
        snprintf(r->bad[s], sizeof r->bad[s], "%s", o.bad ? o.bad->name : "");
    }
    r->numel = ps.numel;
    r->span = opt.hi - opt.lo;
    r->opt_steps = opt.step;
    r->values = malloc((size_t)ps.numel * sizeof(real));
    memcpy(r->values, params_pull(&ps), (size_t)ps.numel * sizeof(real));
    r->m = malloc((size_t)r->span * sizeof(real));
    r->v = opt.v ? malloc((size_t)r->span * sizeof(real)) : NULL;
    optim_pull_moments(&opt, r->m, r->v);
    if (way != WAY_CALLS) {
        r->od = od;
        optim_device_free(&od);
    }
    optim_free(&opt);
    params_free(&ps);
}

// Asserts a and b have the same bits, naming the first element that differs.
static void same_bits(const char *what, Way way, const real *a, const real *b, int64_t n) {
    if (!a && !b) return;
    int64_t first = -1, count = 0;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(real)) != 0) {
            if (first < 0) first = i;
            count++;
        }
    cr_assert(first < 0, "%s: %lld of %lld elements differ %s; the first, [%lld]: %.17g by optim.h's calls, %.17g",
              what, (long long)count, (long long)n, WAY[way], (long long)first, (double)a[first], (double)b[first]);
}

static void compare(StepCase sc) {
    cuda_require();
    StepRun ref, run;
    step_run(&sc, WAY_CALLS, &ref);
    for (Way way = WAY_QUEUED; way <= WAY_GRAPH; way++) {
        step_run(&sc, way, &run);
        for (int s = 0; s < STEPS; s++) {
            cr_assert(memcmp(&ref.norm[s], &run.norm[s], sizeof(double)) == 0 || (isnan(ref.norm[s]) && isnan(run.norm[s])),
                      "step %d: norm %.17g by optim.h's calls, %.17g %s", s, ref.norm[s], run.norm[s], WAY[way]);
            cr_assert(ref.stepped[s] == run.stepped[s], "step %d: stepped %d by the calls, %d %s", s, ref.stepped[s],
                      run.stepped[s], WAY[way]);
            cr_assert(!strcmp(ref.bad[s], run.bad[s]), "step %d: non-finite parameter '%s' by the calls, '%s' %s", s,
                      ref.bad[s], run.bad[s], WAY[way]);
        }
        cr_assert_eq(ref.opt_steps, run.opt_steps, "%lld steps counted by the calls, %lld %s", (long long)ref.opt_steps,
                     (long long)run.opt_steps, WAY[way]);
        same_bits("the parameters", way, ref.values, run.values, ref.numel);
        same_bits("the first moments", way, ref.m, run.m, ref.span);
        same_bits("the second moments", way, ref.v, run.v, ref.span);
        const OptimDevice *od = &run.od;
        if (way == WAY_GRAPH)
            cr_assert(!od->off && od->captures == 1 && od->replays == STEPS && od->eager == 0,
                      "graph: %lld captures, %lld replays, %lld eager (%s); expected 1, %d, 0", (long long)od->captures,
                      (long long)od->replays, (long long)od->eager, od->why, STEPS);
        else
            cr_assert(od->captures == 0 && od->replays == 0 && od->eager == STEPS, "queued eagerly: %lld replays",
                      (long long)od->replays);
        free(run.values), free(run.m), free(run.v);
    }
    free(ref.values), free(ref.m), free(ref.v);
}

// A case of kind k: accum 1, clipping at 1, every gradient and parameter finite.
static StepCase plain(OptimKind k) {
    return (StepCase){.kind = k, .accum = 1, .max_norm = 1.0, .nan_step = -1, .inf_step = -1, .bad_step = -1};
}
static StepCase with(StepCase sc, int accum, double max_norm) {
    sc.accum = accum;
    sc.max_norm = max_norm;
    return sc;
}

Test(cuda_optim_step, adamw) { compare(plain(OPTIM_ADAMW)); }
Test(cuda_optim_step, sgd) { compare(plain(OPTIM_SGD)); }
Test(cuda_optim_step, adamw_accum_3) { compare(with(plain(OPTIM_ADAMW), 3, 1.0)); }
Test(cuda_optim_step, sgd_accum_3_no_clipping) { compare(with(plain(OPTIM_SGD), 3, 0)); }
Test(cuda_optim_step, adamw_no_clipping) { compare(with(plain(OPTIM_ADAMW), 1, 0)); }
Test(cuda_optim_step, adamw_shard) {
    StepCase sc = with(plain(OPTIM_ADAMW), 2, 1.0);
    sc.shard = true;
    compare(sc);
}
Test(cuda_optim_step, nan_gradient_skips_the_update) {
    StepCase sc = plain(OPTIM_ADAMW);
    sc.nan_step = 2;
    compare(sc);
}
Test(cuda_optim_step, inf_gradient_skips_the_update) {
    StepCase sc = plain(OPTIM_ADAMW);
    sc.inf_step = 3;
    compare(sc);
}
Test(cuda_optim_step, a_nonfinite_parameter_is_named) {
    StepCase sc = plain(OPTIM_SGD);
    sc.bad_step = 4;
    compare(sc);
}

// Changing what the work was built for (a parameter frozen, so the table
// changes) builds it again and captures afresh: the same bits as the calls.
Test(cuda_optim_step, a_new_table_captures_again) {
    cuda_require();
    ParamStore ps[2];
    Optimizer opt[2];
    OptimDevice od;
    optim_device_init(&od, DEVICE_CUDA, true);
    od.quiet = true;
    StepCase sc = plain(OPTIM_ADAMW);
    for (int k = 0; k < 2; k++) {
        make_params(&ps[k]);
        adamw_init(&opt[k], &ps[k], 0.9, 0.95, 1e-8, 0.1);
    }
    StepRun ref;
    memset(&ref, 0, sizeof ref);
    for (int s = 0; s < 4; s++) {
        if (s == 2)
            for (int k = 0; k < 2; k++) params_set_frozen(&ps[k], ps[k].params[0], true);
        double lr = 1e-2 * (s + 1);
        for (int k = 0; k < 2; k++) {
            params_zero_grad(&ps[k]);
            set_grads(&ps[k], &sc, s);
        }
        step_calls(&ps[0], &opt[0], &sc, lr, &ref, s);
        OptimDeviceResult o;
        optim_device_step(&od, &opt[1], &ps[1], 1, 1.0, lr, &o);
        cr_assert(memcmp(&o.norm, &ref.norm[s], sizeof(double)) == 0, "step %d: norm %.17g, %.17g by the calls", s,
                  o.norm, ref.norm[s]);
    }
    cr_assert(od.captures == 2 && od.replays == 4, "%lld captures, %lld replays (%s); expected 2, 4",
              (long long)od.captures, (long long)od.replays, od.why);
    same_bits("the parameters", WAY_GRAPH, params_pull(&ps[0]), params_pull(&ps[1]), ps[0].numel);
    optim_device_free(&od);
    for (int k = 0; k < 2; k++) {
        optim_free(&opt[k]);
        params_free(&ps[k]);
    }
}
