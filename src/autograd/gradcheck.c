#include "gradcheck.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

GradcheckOptions gradcheck_defaults(void) {
    GradcheckOptions o = {0};   // every field set: a new one starts at zero / false / NULL
#ifdef AG_DOUBLE
    o.eps = 1e-6;
    o.tol = 1e-6;
    o.floor_frac = 1e-3;
#else
    o.eps = 1e-2;
    o.tol = 3e-2;
    o.floor_frac = 1e-2;
#endif
    o.max_elems = 2048;
    o.n_directions = 2;
    o.seed = 1234;
    o.verbose = false;
    o.quiet = false;
    o.fixed = NULL;
    o.n_fixed = 0;
    return o;
}

typedef struct Probe {
    GradcheckFn f;
    Tensor *const *inputs;
    int n_inputs;
    void *ctx;
    Tape *tp;
    real *R[GRADCHECK_MAX_OUT];   // the contraction tensors
    int64_t R_n[GRADCHECK_MAX_OUT];
    real *out[GRADCHECK_MAX_OUT]; // a GPU tape's outputs, read back (NULL on the CPU)
    int n_out;
} Probe;

// f(x) = sum_k <out_k, R_k>, evaluated in no-grad mode, accumulated in double.
static double probe_eval(Probe *p) {
    Tensor *outs[GRADCHECK_MAX_OUT] = {0};
    tape_reset(p->tp);
    tape_no_grad_push(p->tp);
    int n = p->f(p->tp, p->inputs, p->n_inputs, p->ctx, outs);
    tape_no_grad_pop(p->tp);
    ASSERT(n == p->n_out, "gradcheck: the function returned %d outputs, then %d", p->n_out, n);
    double s = 0;
    for (int k = 0; k < n; k++) {
        ASSERT(outs[k]->numel == p->R_n[k], "gradcheck: output %d changed size", k);
        const real *o = outs[k]->data;
        if (p->tp->device != DEVICE_CPU) {
            dev_to_host(p->out[k], o, (size_t)outs[k]->numel * sizeof(real), p->tp->device);
            o = p->out[k];
        }
        for (int64_t i = 0; i < outs[k]->numel; i++) s += (double)o[i] * (double)p->R[k][i];
    }
    return s;
}

// On a GPU (device_default(): AG_DEVICE=cuda) the inputs themselves move for
// the check: each input's data and gradient are swapped for device copies
// and flagged TENSOR_ON_GPU, so a function that reaches them through its ctx
// (a layer's parameters) reads the same tensors on the device. The host
// copy stays the one perturbed; each perturbation is copied up before an
// evaluation. At the end the tensors get their host buffers back, with the
// analytic gradient in x->grad as on the CPU.
typedef struct Moved {
    real *host_data, *host_grad;
    real *dev_data, *dev_grad;   // what was allocated for the check
    unsigned flags;
    int same_as;   // an earlier input that is this tensor, or -1
} Moved;

static Moved *inputs_to_device(Tensor *const *inputs, int n, Device d) {
    Moved *mv = xcalloc((size_t)(n > 0 ? n : 1), sizeof *mv);
    for (int i = 0; i < n; i++) {
        Tensor *x = inputs[i];
        mv[i].same_as = -1;
        for (int j = 0; j < i; j++)
            if (inputs[j] == x) mv[i].same_as = j;
        if (!x || mv[i].same_as >= 0) continue;   // (an optional input left out, or one met before)
        ASSERT(!(x->flags & TENSOR_ON_GPU), "gradcheck: input %d '%s' is on the GPU already; pass host tensors", i,
               x->name ? x->name : "?");
        size_t bytes = (size_t)x->numel * sizeof(real);
        mv[i].host_data = x->data;
        mv[i].host_grad = x->grad;
        mv[i].flags = x->flags;
        x->data = mv[i].dev_data = dev_alloc(d, bytes ? bytes : sizeof(real));
        dev_from_host(x->data, d, mv[i].host_data, bytes);
        x->grad = NULL;
        if (x->requires_grad && mv[i].host_grad) {
            x->grad = mv[i].dev_grad = dev_alloc(d, bytes ? bytes : sizeof(real));
            dev_zero(d, x->grad, bytes);
        }
        x->flags |= TENSOR_ON_GPU;
    }
    return mv;
}

static void inputs_to_host(Moved *mv, Tensor *const *inputs, int n, Device d) {
    for (int i = 0; i < n; i++) {
        if (!inputs[i] || mv[i].same_as >= 0) continue;
        Tensor *x = inputs[i];
        if (mv[i].dev_grad) {
            dev_to_host(mv[i].host_grad, mv[i].dev_grad, (size_t)x->numel * sizeof(real), d);
            dev_free(d, mv[i].dev_grad);
        }
        dev_free(d, mv[i].dev_data);
        x->data = mv[i].host_data;
        x->grad = mv[i].host_grad;
        x->flags = mv[i].flags;
    }
    free(mv);
}

// Input i's values as the check perturbs them: x->data on the CPU, the host
// copy on a GPU.
static real *host_values(Tensor *const *inputs, const Moved *mv, int i) {
    if (!mv) return inputs[i]->data;
    int j = mv[i].same_as >= 0 ? mv[i].same_as : i;
    return mv[j].host_data;
}

// After host values [at, at + n) of input i changed: copy them to the device.
static void push_values(Tensor *x, const real *host, int64_t at, int64_t n, Device d) {
    if (d == DEVICE_CPU) return;
    dev_from_host(x->data + at, d, host + at, (size_t)n * sizeof(real));
}

static double rel_err(double a, double n, double floor) {
    double d = fabs(a - n);
    double den = fmax(fmax(fabs(a), fabs(n)), floor);
    return den > 0 ? d / den : d;
}

// The elements of input i (x, its host values hx, its analytic gradient an)
// against central differences: all of them, or opt->max_elems drawn at
// random. Each error goes into res (the worst one's place and values) and
// *worst_here; returns how many were checked.
static int64_t check_elements(Probe *p, const GradcheckOptions *opt, Rng *rng, Tensor *x, real *hx, const real *an,
                              int i, GradcheckResult *res, double *worst_here) {
    Device dev = p->tp->device;
    int64_t n = x->numel;
    bool all = n <= opt->max_elems;
    int64_t count = all ? n : opt->max_elems;
    int64_t *idx = xmalloc((size_t)count * sizeof *idx);
    for (int64_t j = 0; j < count; j++) idx[j] = all ? j : (int64_t)rng_below(rng, (uint64_t)n);
    double *num = xmalloc((size_t)count * sizeof *num);
    double scale = 0;
    for (int64_t j = 0; j < count; j++) {
        real saved = hx[idx[j]];
        hx[idx[j]] = (real)(saved + opt->eps);
        push_values(x, hx, idx[j], 1, dev);
        double fp = probe_eval(p);
        hx[idx[j]] = (real)(saved - opt->eps);
        push_values(x, hx, idx[j], 1, dev);
        double fm = probe_eval(p);
        hx[idx[j]] = saved;
        push_values(x, hx, idx[j], 1, dev);
        num[j] = (fp - fm) / (2 * opt->eps);
        scale = fmax(scale, fabs(num[j]));
    }
    for (int64_t j = 0; j < count; j++) scale = fmax(scale, fabs((double)an[idx[j]]));
    double floor = fmax(opt->floor_frac * scale, 1e-12);
    for (int64_t j = 0; j < count; j++) {
        double e = rel_err(an[idx[j]], num[j], floor);
        res->n_checked++;
        if (e > *worst_here) *worst_here = e;
        if (e > res->max_rel || res->worst_input < 0) {
            res->max_rel = fmax(res->max_rel, e);
            res->worst_input = i;
            res->worst_index = idx[j];
            res->analytic = an[idx[j]];
            res->numeric = num[j];
        }
    }
    free(idx);
    free(num);
    return count;
}

// Input i along opt->n_directions random unit directions over all of it:
// the analytic directional derivative against a central difference, into
// res (worst_index -1) and *worst_here.
static void check_directions(Probe *p, const GradcheckOptions *opt, Rng *rng, Tensor *x, real *hx, const real *an,
                             int i, GradcheckResult *res, double *worst_here) {
    Device dev = p->tp->device;
    int64_t n = x->numel;
    real *dir = xmalloc((size_t)n * sizeof(real));
    real *saved = xmalloc((size_t)n * sizeof(real));
    memcpy(saved, hx, (size_t)n * sizeof(real));
    for (int d = 0; d < opt->n_directions; d++) {
        double norm = 0;
        for (int64_t j = 0; j < n; j++) {
            dir[j] = (real)rng_normal(rng);
            norm += (double)dir[j] * dir[j];
        }
        norm = sqrt(norm);
        double dot = 0;
        for (int64_t j = 0; j < n; j++) {
            dir[j] = (real)(dir[j] / norm);
            dot += (double)an[j] * dir[j];
        }
        for (int64_t j = 0; j < n; j++) hx[j] = (real)(saved[j] + opt->eps * dir[j]);
        push_values(x, hx, 0, n, dev);
        double fp = probe_eval(p);
        for (int64_t j = 0; j < n; j++) hx[j] = (real)(saved[j] - opt->eps * dir[j]);
        push_values(x, hx, 0, n, dev);
        double fm = probe_eval(p);
        memcpy(hx, saved, (size_t)n * sizeof(real));
        push_values(x, hx, 0, n, dev);
        double numd = (fp - fm) / (2 * opt->eps);
        double dscale = 0;
        for (int64_t j = 0; j < n; j++) dscale += (double)an[j] * an[j];
        double e = rel_err(dot, numd, fmax(opt->floor_frac * sqrt(dscale), 1e-12));
        res->n_checked++;
        if (e > *worst_here) *worst_here = e;
        if (e > res->max_rel) {
            res->max_rel = e;
            res->worst_input = i;
            res->worst_index = -1;
            res->analytic = dot;
            res->numeric = numd;
        }
    }
    free(dir);
    free(saved);
}

GradcheckResult gradcheck(const char *label, GradcheckFn f, Tensor *const *inputs, int n_inputs,
                          void *ctx, const GradcheckOptions *opt_in) {
    GradcheckOptions opt = opt_in ? *opt_in : gradcheck_defaults();
    GradcheckResult res = {true, 0.0, -1, -1, 0.0, 0.0, 0};
    Device dev = device_default();
    Tape tp;
    tape_init_on(&tp, dev);
    Rng rng;
    rng_seed(&rng, opt.seed);
    for (int i = 0; i < n_inputs; i++)
        ASSERT(!inputs[i]->requires_grad || inputs[i]->grad,
               "gradcheck '%s': input %d requires a gradient but has no buffer", label, i);
    // On a GPU the fixed tensors move too, after the inputs (so input i is
    // still entry i of the moved list).
    int n_moved = n_inputs + (opt.fixed ? opt.n_fixed : 0);
    Tensor **moved = xcalloc((size_t)(n_moved > 0 ? n_moved : 1), sizeof *moved);
    for (int i = 0; i < n_moved; i++) moved[i] = i < n_inputs ? inputs[i] : opt.fixed[i - n_inputs];
    Moved *mv = dev == DEVICE_CPU ? NULL : inputs_to_device(moved, n_moved, dev);

    // 1. Analytic pass: forward, seed every output with R_k, backward.
    for (int i = 0; i < n_inputs; i++)
        if (inputs[i]->requires_grad && inputs[i]->grad)
            dev_zero(dev, inputs[i]->grad, (size_t)inputs[i]->numel * sizeof(real));
    Probe p = {f, inputs, n_inputs, ctx, &tp, {0}, {0}, {0}, 0};
    Tensor *outs[GRADCHECK_MAX_OUT] = {0};
    p.n_out = f(&tp, inputs, n_inputs, ctx, outs);
    ASSERT(p.n_out >= 1 && p.n_out <= GRADCHECK_MAX_OUT, "gradcheck '%s': %d outputs", label, p.n_out);
    const real *seeds[GRADCHECK_MAX_OUT];
    for (int k = 0; k < p.n_out; k++) {
        p.R_n[k] = outs[k]->numel;
        p.R[k] = xmalloc((size_t)outs[k]->numel * sizeof(real));
        for (int64_t i = 0; i < outs[k]->numel; i++) p.R[k][i] = (real)rng_normal(&rng);
        seeds[k] = p.R[k];
        if (dev != DEVICE_CPU) p.out[k] = xmalloc((size_t)(outs[k]->numel ? outs[k]->numel : 1) * sizeof(real));
    }
    tape_backward_multi(&tp, outs, seeds, p.n_out);
    real **analytic = xcalloc((size_t)n_inputs, sizeof *analytic);
    for (int i = 0; i < n_inputs; i++) {
        Tensor *x = inputs[i];
        if (!x->requires_grad) continue;
        analytic[i] = xmalloc((size_t)x->numel * sizeof(real));
        dev_to_host(analytic[i], x->grad, (size_t)x->numel * sizeof(real), dev);
    }

    // 2. Numeric pass, input by input.
    for (int i = 0; i < n_inputs; i++) {
        Tensor *x = inputs[i];
        if (!x->requires_grad) continue;
        real *hx = host_values(inputs, mv, i);
        double worst_here = 0;
        int64_t count = check_elements(&p, &opt, &rng, x, hx, analytic[i], i, &res, &worst_here);
        check_directions(&p, &opt, &rng, x, hx, analytic[i], i, &res, &worst_here);
        if (opt.verbose)
            fprintf(stderr, "gradcheck %s: input %d '%s' %s: max rel err %.3e over %lld elements\n", label, i,
                    x->name ? x->name : "?", SHAPE(x), worst_here, (long long)count);
    }
    res.passed = res.max_rel <= opt.tol;
    if (!res.passed && !opt.quiet) {
        Tensor *x = inputs[res.worst_input];
        fprintf(stderr,
                "gradcheck %s FAILED: input %d '%s' %s, %s %lld: analytic %.12g, numeric %.12g, "
                "rel err %.3e > tol %.1e\n",
                label, res.worst_input, x->name ? x->name : "?", SHAPE(x),
                res.worst_index >= 0 ? "element" : "random direction", (long long)res.worst_index,
                res.analytic, res.numeric, res.max_rel, opt.tol);
    }
    for (int i = 0; i < n_inputs; i++) free(analytic[i]);
    free(analytic);
    for (int k = 0; k < p.n_out; k++) {
        free(p.R[k]);
        free(p.out[k]);
    }
    tape_free(&tp);
    if (mv) inputs_to_host(mv, moved, n_moved, dev);
    free(moved);
    return res;
}

// gradcheck_run and gradcheck_run_seeds: output k seeded with `given[k]`
// when given, else with normal values drawn from seed + k.
static int run_on_default(GradcheckFn f, Tensor *const *inputs, int n_inputs, void *ctx, uint64_t seed,
                          const real *const *given, real **out, int64_t *out_n) {
    Device dev = device_default();
    Tape tp;
    tape_init_on(&tp, dev);
    Moved *mv = dev == DEVICE_CPU ? NULL : inputs_to_device(inputs, n_inputs, dev);
    for (int i = 0; i < n_inputs; i++)
        if (inputs[i] && inputs[i]->requires_grad && inputs[i]->grad)
            dev_zero(dev, inputs[i]->grad, (size_t)inputs[i]->numel * sizeof(real));
    Tensor *outs[GRADCHECK_MAX_OUT] = {0}, *seeded[GRADCHECK_MAX_OUT];
    int n_out = f(&tp, inputs, n_inputs, ctx, outs);
    ASSERT(n_out >= 1 && n_out <= GRADCHECK_MAX_OUT, "gradcheck_run: %d outputs", n_out);
    real *drawn[GRADCHECK_MAX_OUT] = {0};
    const real *seeds[GRADCHECK_MAX_OUT];
    int n_seeded = 0;
    bool any = false;
    for (int k = 0; k < n_out; k++) {
        int64_t n = outs[k]->numel;
        const real *s = given ? given[k] : NULL;
        if (!given) {
            Rng rng;
            rng_seed(&rng, seed + (uint64_t)k);
            s = drawn[k] = xmalloc((size_t)(n ? n : 1) * sizeof(real));
            for (int64_t i = 0; i < n; i++) drawn[k][i] = (real)rng_normal(&rng);
        }
        out[k] = xmalloc((size_t)(n ? n : 1) * sizeof(real));
        dev_to_host(out[k], outs[k]->data, (size_t)n * sizeof(real), dev);
        if (out_n) out_n[k] = n;
        if (s) {
            seeded[n_seeded] = outs[k];
            seeds[n_seeded++] = s;
            any = any || outs[k]->requires_grad;
        }
    }
    if (any) tape_backward_multi(&tp, seeded, seeds, n_seeded);
    for (int k = 0; k < n_out; k++) free(drawn[k]);
    tape_free(&tp);
    if (mv) inputs_to_host(mv, inputs, n_inputs, dev);
    return n_out;
}

int gradcheck_run(GradcheckFn f, Tensor *const *inputs, int n_inputs, void *ctx, uint64_t seed,
                  real **out, int64_t *out_n) {
    return run_on_default(f, inputs, n_inputs, ctx, seed, NULL, out, out_n);
}

int gradcheck_run_seeds(GradcheckFn f, Tensor *const *inputs, int n_inputs, void *ctx, const real *const *seeds,
                        real **out, int64_t *out_n) {
    ASSERT(seeds, "gradcheck_run_seeds: no seeds");
    return run_on_default(f, inputs, n_inputs, ctx, 0, seeds, out, out_n);
}
