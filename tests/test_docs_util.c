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
