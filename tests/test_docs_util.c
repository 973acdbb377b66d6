// test_docs_util.c: packed-equals-separate and gradient checks with document
// boundaries, shared by the tests of every op and mixer (test_docs_util.h).
#include "test_docs_util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int *docs_pattern(int T, int C) {
    cr_assert(T >= 2 * C + 3, "docs_pattern: T %d too short for chunks of %d", T, C);
    int *d = xcalloc((size_t)2 * T, sizeof(int));
    int row0[] = {0, C, C + 1, C + 2, 2 * C + 1, T - 1}, row1[] = {2, 3, 2 * C, T - 2};
    for (size_t i = 0; i < sizeof row0 / sizeof row0[0]; i++) d[row0[i]] = 1;
    for (size_t i = 0; i < sizeof row1 / sizeof row1[0]; i++) d[T + row1[i]] = 1;
    return d;
}

Tensor *docs_time_slice(const Tensor *x, int b, int t0, int len) {
    int shape[TENSOR_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    int64_t step = x->numel / ((int64_t)x->shape[0] * x->shape[1]);   // elements per position
    shape[0] = 1;
    shape[1] = len;
    Tensor *y = tensor_new(x->ndim, shape, x->requires_grad);
    memcpy(y->data, x->data + ((int64_t)b * x->shape[1] + t0) * step, (size_t)(len * step) * sizeof(real));
    return y;
}

// Row b of x (B, ...) as a new leaf.
static Tensor *row_slice(const Tensor *x, int b) {
    int shape[TENSOR_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[0] = 1;
    Tensor *y = tensor_new(x->ndim, shape, x->requires_grad);
    int64_t n = x->numel / x->shape[0];
    memcpy(y->data, x->data + b * n, (size_t)n * sizeof(real));
    return y;
}

static real *copy_of(const real *src, int64_t n) {
    real *d = xmalloc((size_t)imax((int)n, 1) * sizeof(real));
    if (src) memcpy(d, src, (size_t)n * sizeof(real));
    else memset(d, 0, (size_t)n * sizeof(real));
    return d;
}

static void compare(const char *label, const char *what, const real *a, const real *b, int64_t n, double tol) {
    for (int64_t i = 0; i < n; i++)
        cr_assert(isfinite(a[i]), "%s: %s[%lld] of the packed run is not finite", label, what, (long long)i);
    double d = max_rel_diff(a, b, n);
    cr_assert(d <= tol, "%s: %s packed vs separate differs by %.3e (tolerance %.0e)", label, what, d, tol);
}

typedef struct GcCtx {
    const DocsFn *f;
    const int *doc_start;
} GcCtx;

static int gc_fn(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    const GcCtx *c = ctx;
    return c->f->fn(tp, in, c->doc_start, c->f->ctx, out);
}

void docs_check_packed(const DocsFn *f, Tensor *const *in, const int *doc_start, int B, int T, double tol,
                       const char *label) {
    int n = f->n_in;
    // Packed, on device_default()'s tape (AG_DEVICE=cuda: the GPU): output k
    // seeded with normal values from seed 7 + k.
    GcCtx packed = {f, doc_start}, separate = {f, NULL};
    real *p[2] = {0};
    int64_t pn[2] = {0};
    int n_out = gradcheck_run(gc_fn, in, n, &packed, 7, p, pn);
    cr_assert(n_out == 1 || n_out == 2, "%s: %d outputs", label, n_out);
    int64_t n0 = pn[0], n1 = n_out > 1 ? pn[1] : 0;
    int64_t step0 = n0 / ((int64_t)B * T), row1 = n1 / B;
    real *R[2] = {test_randn(n0, 7), n1 ? test_randn(n1, 8) : NULL};   // the same seeds, for the slices
    real **pg = xcalloc((size_t)n, sizeof *pg), **sg = xcalloc((size_t)n, sizeof *sg);
    for (int i = 0; i < n; i++)
        if (in[i] && in[i]->requires_grad) {
            pg[i] = copy_of(in[i]->grad, in[i]->numel);
            sg[i] = copy_of(NULL, in[i]->numel);
        }

    // One call per document, each seeded with its slice of R.
    real *s0 = copy_of(NULL, n0), *s1 = copy_of(NULL, n1);
    Tensor **sub = xcalloc((size_t)n, sizeof *sub);
    for (int b = 0; b < B; b++)
        for (int s = 0, e; s < T; s = e) {
            for (e = s + 1; e < T && !doc_start[(int64_t)b * T + e]; e++) {}
            bool reads_row = s == 0 && !doc_start[(int64_t)b * T];
            for (int i = 0; i < n; i++) {
                sub[i] = NULL;
                if (!in[i]) continue;
                if (f->kind[i] == DOCS_SEQ) sub[i] = docs_time_slice(in[i], b, s, e - s);
                else if (f->kind[i] == DOCS_ROW) sub[i] = reads_row ? row_slice(in[i], b) : NULL;
                else sub[i] = in[i];
            }
            bool last = e == T && n_out > 1;
            const real *seeds[2] = {R[0] + ((int64_t)b * T + s) * step0, last ? R[1] + b * row1 : NULL};
            real *o[2] = {0};
            int64_t on[2] = {0};
            int no = gradcheck_run_seeds(gc_fn, sub, n, &separate, seeds, o, on);
            cr_assert_eq(no, n_out, "%s: the per-document call returned %d outputs, the packed one %d", label, no,
                         n_out);
            cr_assert_eq(on[0], (e - s) * step0, "%s: output 0 of a document of %d positions", label, e - s);
            memcpy(s0 + ((int64_t)b * T + s) * step0, o[0], (size_t)on[0] * sizeof(real));
            if (last) memcpy(s1 + b * row1, o[1], (size_t)row1 * sizeof(real));
            for (int i = 0; i < n; i++) {
                if (!sub[i]) continue;
                if (f->kind[i] == DOCS_SHARED) {   // every document's gradient, summed in order
                    for (int64_t x = 0; sg[i] && x < in[i]->numel; x++) sg[i][x] += in[i]->grad[x];
                    continue;
                }
                int64_t at = f->kind[i] == DOCS_SEQ ? ((int64_t)b * T + s) * (in[i]->numel / ((int64_t)B * T))
                                                    : b * sub[i]->numel;
                if (sg[i]) memcpy(sg[i] + at, sub[i]->grad, (size_t)sub[i]->numel * sizeof(real));
                tensor_free(sub[i]);
            }
            free(o[0]), free(o[1]);
        }

    compare(label, "output", p[0], s0, n0, tol);
    if (n1) compare(label, "final state", p[1], s1, n1, tol);
    for (int i = 0; i < n; i++) {
        if (!pg[i]) continue;
        char what[96];
        snprintf(what, sizeof what, "gradient of input %d (%s)", i, in[i]->name ? in[i]->name : "?");
        compare(label, what, pg[i], sg[i], in[i]->numel, tol);
    }
    for (int i = 0; i < n; i++) free(pg[i]), free(sg[i]);
    free(pg), free(sg), free(sub);
    free(p[0]), free(p[1]), free(s0), free(s1), free(R[0]), free(R[1]);
}

int docs_run(const DocsFn *f, Tensor *const *in, const int *doc_start, const real *const *seeds, real **out,
             int64_t *out_n) {
    GcCtx c = {f, doc_start};
    return gradcheck_run_seeds(gc_fn, in, f->n_in, &c, seeds, out, out_n);
}

void docs_gradcheck(const DocsFn *f, Tensor *const *in, const int *doc_start, const GradcheckOptions *opt,
                    const char *label) {
    GcCtx c = {f, doc_start};
    GradcheckResult r = gradcheck(label, gc_fn, in, f->n_in, &c, opt);
    ASSERT_GRADCHECK(r, label);
    cr_assert_gt(r.n_checked, 0);
}

// ---- a recurrent mixer as a DocsFn (the layers' own tests: test_gdp.c, test_kda_layer.c) ----

static int docs_mixer_fn(Tape *tp, Tensor *const *in, const int *doc_start, void *ctx, Tensor **out) {
    Mixer *m = ctx;
    out[0] = m->kind->forward(tp, m, in[0], doc_start, in[1], &out[1]);
    return 2;
}

static Tensor **docs_mixer_inputs(const Mixer *m, const ParamStore *ps, int B, int T, uint64_t seed,
                                  DocsInKind **kind) {
    const MixerConfig *c = &m->cfg;
    Tensor **in = xcalloc((size_t)(2 + ps->n), sizeof *in);
    *kind = xcalloc((size_t)(2 + ps->n), sizeof **kind);
    in[0] = tensor_newv(true, 3, B, T, c->d_model);
    in[1] = tensor_newv(true, 4, B, c->n_heads, c->d_k, c->d_v);
    fill_normal(in[0], seed, 1.0);
    fill_normal(in[1], seed + 1, 0.5);
    (*kind)[0] = DOCS_SEQ;
    (*kind)[1] = DOCS_ROW;
    for (int i = 0; i < ps->n; i++) {
        in[2 + i] = ps->params[i];
        (*kind)[2 + i] = DOCS_SHARED;
    }
    return in;
}

static void docs_mixer_inputs_free(Tensor **in, DocsInKind *kind) {
    tensor_free(in[0]);
    tensor_free(in[1]);
    free(in);
    free(kind);
}

void docs_mixer_gradcheck(Mixer *m, const ParamStore *ps, int B, int T, uint64_t seed, const int *docs,
                          const GradcheckOptions *opt, const char *label) {
    DocsInKind *kind;
    Tensor **in = docs_mixer_inputs(m, ps, B, T, seed, &kind);
    DocsFn f = {docs_mixer_fn, m, 2 + ps->n, kind};
    GradcheckOptions o = opt ? *opt : gradcheck_defaults();
    docs_gradcheck(&f, in, docs, &o, label);
    docs_mixer_inputs_free(in, kind);
}

void docs_mixer_check_packed(Mixer *m, const ParamStore *ps, int B, int T, uint64_t seed, const int *docs,
                             double tol, const char *label) {
    DocsInKind *kind;
    Tensor **in = docs_mixer_inputs(m, ps, B, T, seed, &kind);
    DocsFn f = {docs_mixer_fn, m, 2 + ps->n, kind};
    docs_check_packed(&f, in, docs, B, T, tol, label);
    docs_mixer_inputs_free(in, kind);
}

DocsMixerRun docs_mixer_run(Mixer *m, ParamStore *ps, int B, int T, const int *docs) {
    params_zero_grad(ps);
    DocsInKind *kind;
    Tensor **in = docs_mixer_inputs(m, ps, B, T, 5, &kind);
    Tensor *r0 = tensor_new(in[0]->ndim, in[0]->shape, false), *r1 = tensor_new(in[1]->ndim, in[1]->shape, false);
    fill_normal(r0, 6, 1.0);
    fill_normal(r1, 7, 1.0);
    DocsFn f = {docs_mixer_fn, m, 2 + ps->n, kind};
    DocsMixerRun r;
    cr_assert_eq(docs_run(&f, in, docs, (const real *[]){r0->data, r1->data}, r.out, r.on), 2);
    r.grad = copy_of(ps->grad, ps->numel);
    r.du = copy_of(in[0]->grad, in[0]->numel);
    r.ds0 = copy_of(in[1]->grad, in[1]->numel);
    tensor_free(r0);
    tensor_free(r1);
    docs_mixer_inputs_free(in, kind);
    return r;
}

void docs_mixer_run_free(DocsMixerRun *r) {
    free(r->out[0]);
    free(r->out[1]);
    free(r->grad);
    free(r->du);
    free(r->ds0);
}

void docs_mixer_runs_agree(const DocsMixerRun *a, const DocsMixerRun *b, const ParamStore *ps, double tol,
                           const char *label) {
    for (int k = 0; k < 2; k++) {
        double e = max_rel_diff(a->out[k], b->out[k], a->on[k]);
        cr_assert_leq(e, tol, "%s: output %d differs by %.3e", label, k, e);
    }
    double e = max_rel_diff(a->du, b->du, a->on[0]);
    cr_assert_leq(e, tol, "%s: du differs by %.3e", label, e);
    e = max_rel_diff(a->ds0, b->ds0, a->on[1]);
    cr_assert_leq(e, tol, "%s: ds0 differs by %.3e", label, e);
    for (int i = 0; i < ps->n; i++) {
        e = max_rel_diff(a->grad + ps->offsets[i], b->grad + ps->offsets[i], ps->params[i]->numel);
        cr_assert_leq(e, tol, "%s: the gradient of %s differs by %.3e", label, ps->params[i]->name, e);
    }
}

double docs_mixer_carry_diff(Mixer *m, const Tensor *u, const int *docs, const int *wins, int n, void **cache) {
    int B = u->shape[0], T = u->shape[1], D = u->shape[2];
    real *whole = test_mixer_forward_host(m, u, docs, DEVICE_CPU);
    *cache = m->kind->cache_new(m, B, T, DEVICE_CPU);
    double worst = 0;
    for (int w = 0, t0 = 0; w < n; t0 += wins[w++]) {
        int L = wins[w], flags[16 * 16];
        cr_assert(L <= 16 && B <= 16 && t0 + L <= T, "window %d of %d positions at %d (B %d, T %d)", w, L, t0, B, T);
        Tensor *uw = tensor_newv(false, 3, B, L, D);
        for (int b = 0; b < B; b++) {
            memcpy(uw->data + (int64_t)b * L * D, u->data + ((int64_t)b * T + t0) * D, (size_t)L * D * sizeof(real));
            if (docs) memcpy(flags + b * L, docs + (int64_t)b * T + t0, (size_t)L * sizeof(int));
        }
        Tape tp;
        tape_init(&tp);
        Tensor *y = m->kind->forward_carry(&tp, m, uw, docs ? flags : NULL, *cache);
        for (int b = 0; b < B; b++) {
            double e = max_rel_diff(y->data + (int64_t)b * L * D, whole + ((int64_t)b * T + t0) * D, (int64_t)L * D);
            worst = e > worst ? e : worst;
        }
        tape_free(&tp);
        tensor_free(uw);
    }
    free(whole);
    return worst;
}
