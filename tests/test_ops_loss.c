// embedding, softmax, cross-entropy: gradients, values, errors, determinism.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

// ---- embedding ----

typedef struct {
    const int *ids;
    int ndim;
    int shape[3];
} EmbCtx;

static int f_embedding(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    EmbCtx *c = ctx;
    out[0] = op_embedding(tp, in[0], c->ids, c->ndim, c->shape);
    return 1;
}

Test(ops_loss, embedding_gradcheck_with_repeated_ids) {
    Tensor *E = tensor_newv(true, 2, 7, 5);
    fill_normal(E, 1, 1.0);
    // (2, 3, 2) ids, several repeated (3 four times), and row 6 never used.
    int ids[] = {3, 0, 3, 5, 1, 3, 2, 4, 3, 0, 5, 1};
    EmbCtx c = {ids, 3, {2, 3, 2}};
    GradcheckResult r = gradcheck("embedding", f_embedding, &E, 1, &c, NULL);
    ASSERT_GRADCHECK(r, "embedding");
    tensor_free(E);
}

Test(ops_loss, embedding_values_and_grad_of_unused_rows) {
    Tape tp;
    tape_init(&tp);
    Tensor *E = tensor_newv(true, 2, 4, 3);
    for (int i = 0; i < 12; i++) E->data[i] = (real)i;
    int ids[] = {2, 0, 2};
    Tensor *y = op_embedding(&tp, E, ids, 1, (int[]){3});
    cr_assert(y->ndim == 2 && y->shape[0] == 3 && y->shape[1] == 3);
    real want[] = {6, 7, 8, 0, 1, 2, 6, 7, 8};
    for (int i = 0; i < 9; i++) cr_assert_eq(y->data[i], want[i]);
    tape_backward(&tp, op_sum(&tp, y));
    real want_g[] = {1, 1, 1, 0, 0, 0, 2, 2, 2, 0, 0, 0};
    for (int i = 0; i < 12; i++) cr_assert_eq(E->grad[i], want_g[i], "dE[%d] = %g", i, (double)E->grad[i]);
    tensor_free(E);
    tape_free(&tp);
}

Test(ops_loss, embedding_out_of_range_id_is_reported) {
    Tape tp;
    tape_init(&tp);
    Tensor *E = tensor_newv(false, 2, 10, 4);
    int ids[] = {1, 2, 10, 3};
    cr_assert(EXPECT_FAILURE(op_embedding(&tp, E, ids, 2, (int[]){2, 2})));
    cr_assert(strstr(ag_last_error(), "embedding") && strstr(ag_last_error(), "10") &&
                  strstr(ag_last_error(), "position 2") && strstr(ag_last_error(), "(10, 4)"),
              "got: %s", ag_last_error());
    int neg[] = {-1};
    cr_assert(EXPECT_FAILURE(op_embedding(&tp, E, neg, 1, (int[]){1})));
    cr_assert(strstr(ag_last_error(), "-1"), "got: %s", ag_last_error());
    Tensor *bad = tensor_newv(false, 3, 2, 10, 4);
    cr_assert(EXPECT_FAILURE(op_embedding(&tp, bad, ids, 1, (int[]){1})));
    cr_assert(strstr(ag_last_error(), "embedding") && strstr(ag_last_error(), "(2, 10, 4)"), "got: %s",
              ag_last_error());
    tensor_free(E);
    tensor_free(bad);
    tape_free(&tp);
}

// ---- softmax ----

static int f_softmax(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = op_softmax(tp, in[0]);
    return 1;
}

Test(ops_loss, softmax_gradcheck_3d_and_4d) {
    Tensor *x = tensor_newv(true, 3, 2, 3, 7);
    fill_normal(x, 2, 2.0);
    GradcheckResult r = gradcheck("softmax", f_softmax, &x, 1, NULL, NULL);
    ASSERT_GRADCHECK(r, "softmax 3-d");
    Tensor *x4 = tensor_newv(true, 4, 2, 2, 3, 5);
    fill_normal(x4, 3, 1.0);
    r = gradcheck("softmax", f_softmax, &x4, 1, NULL, NULL);
    ASSERT_GRADCHECK(r, "softmax 4-d");
    tensor_free(x);
    tensor_free(x4);
}

Test(ops_loss, softmax_rows_sum_to_one_and_match_direct_formula) {
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(false, 2, 4, 6);
    fill_normal(x, 4, 3.0);
    for (int j = 0; j < 6; j++) x->data[3 * 6 + j] += 1000;   // a row that overflows a naive exp
    Tensor *y = op_softmax(&tp, x);
    for (int r = 0; r < 4; r++) {
        double s = 0, z = 0;
        for (int j = 0; j < 6; j++) s += y->data[r * 6 + j];
        cr_assert_float_eq(s, 1.0, 1e-6, "row %d sums to %g", r, s);
        for (int j = 0; j < 6; j++) z += exp((double)x->data[r * 6 + j] - x->data[r * 6]);
        for (int j = 0; j < 6; j++) {
            double want = exp((double)x->data[r * 6 + j] - x->data[r * 6]) / z;
            cr_assert_float_eq(y->data[r * 6 + j], want, 1e-6 * fmax(1.0, want));
        }
    }
    tensor_free(x);
    tape_free(&tp);
}

// ---- cross-entropy ----

typedef struct {
    const int *targets;
} CeCtx;

static int f_ce(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = op_cross_entropy(tp, in[0], ((CeCtx *)ctx)->targets);
    return 1;
}

// Six rows of 11 logits, rows 1 and 5 ignored: the gradient through f, and
// exactly zero gradient on the ignored rows.
static const int IGNORED_TG[6] = {4, -1, 10, 0, 7, -100};

static void check_ce_ignored_rows(GradcheckFn f, Tensor *x, const char *label) {
    CeCtx c = {IGNORED_TG};
    GradcheckOptions o = gradcheck_defaults();
#ifdef AG_DOUBLE
    // Logits of std 2 give some elements gradients ~1e-4 of the largest, where
    // the central difference at eps 1e-6 is rounding: (delta+ - delta-) / 2eps
    // with delta ~ 1e-15 of a loss ~ 2 is 5e-10, 1.5e-6 of the floor. The
    // GPU's exp and log (1-2 ulp) reach that (AG_DEVICE=cuda); eps 1e-5 cuts
    // the rounding term tenfold while its eps^2 term stays ~1e-10 relative.
    o.eps = 1e-5;
#endif
    GradcheckResult r = gradcheck("cross_entropy", f, &x, 1, &c, &o);
    ASSERT_GRADCHECK(r, label);
    for (int j = 0; j < 11; j++) cr_assert(x->grad[11 + j] == 0 && x->grad[5 * 11 + j] == 0, "%s", label);
}

Test(ops_loss, cross_entropy_gradcheck_with_ignored_rows) {
    Tensor *x = tensor_newv(true, 3, 2, 3, 11);
    fill_normal(x, 5, 2.0);
    check_ce_ignored_rows(f_ce, x, "cross_entropy 3-d");
    Tensor *x4 = tensor_newv(true, 4, 2, 2, 3, 6);
    fill_normal(x4, 6, 1.0);
    int tg4[] = {0, 1, 2, 3, 4, 5, 5, 4, -1, 2, 1, 0};
    CeCtx c = {tg4};
    GradcheckResult r = gradcheck("cross_entropy", f_ce, &x4, 1, &c, NULL);
    ASSERT_GRADCHECK(r, "cross_entropy 4-d");
    tensor_free(x);
    tensor_free(x4);
}

static int f_ce_of_intermediate(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = op_cross_entropy(tp, op_scale(tp, in[0], 1.0), ((CeCtx *)ctx)->targets);
    return 1;
}

// Logits made by another op, as in a model: the backward writes their
// gradient buffer fresh (ignored rows included: zeros), and with every target
// ignored the whole gradient is zero.
Test(ops_loss, cross_entropy_gradient_of_intermediate_logits) {
    Tensor *x = tensor_newv(true, 2, 6, 11);
    fill_normal(x, 8, 2.0);
    check_ce_ignored_rows(f_ce_of_intermediate, x, "cross_entropy of an intermediate");
    int none[] = {-1, -1, -1, -1, -1, -1};
    Tape tp;
    tape_init(&tp);
    memset(x->grad, 0, 66 * sizeof(real));
    Tensor *l = op_cross_entropy(&tp, op_scale(&tp, x, 1.0), none);
    cr_assert(l->data[0] == 0);
    tape_backward(&tp, l);
    for (int i = 0; i < 66; i++) cr_assert(x->grad[i] == 0, "grad[%d] = %g", i, (double)x->grad[i]);
    tape_free(&tp);
    tensor_free(x);
}

Test(ops_loss, cross_entropy_values) {
    Tape tp;
    tape_init(&tp);
    int V = 13;
    // A uniform row (any constant) has loss log V, whatever the target.
    Tensor *u = tensor_newv(false, 2, 2, V);
    for (int i = 0; i < 2 * V; i++) u->data[i] = 3.25;
    Tensor *l = op_cross_entropy(&tp, u, (int[]){0, 12});
    cr_assert_float_eq(l->data[0], log((double)V), 1e-6);
    // Against -log softmax computed from op_softmax, mean over the counted rows.
    Tensor *x = tensor_newv(false, 3, 2, 4, 9);
    fill_normal(x, 7, 2.0);
    int tg[] = {3, -1, 8, 0, -1, 5, 2, 2};
    Tensor *p = op_softmax(&tp, x);
    double want = 0;
    int count = 0;
    for (int r = 0; r < 8; r++)
        if (tg[r] >= 0) {
            want -= log((double)p->data[r * 9 + tg[r]]);
            count++;
        }
    want /= count;
    l = op_cross_entropy(&tp, x, tg);
    cr_assert_float_eq(l->data[0], want, 1e-5 * want);
    // Huge logits stay finite: row (1000, 0) with target 0 -> ~0, target 1 -> 1000.
    Tensor *h = tensor_newv(false, 2, 2, 2);
    real hv[] = {1000, 0, 1000, 0};
    memcpy(h->data, hv, sizeof hv);
    l = op_cross_entropy(&tp, h, (int[]){0, 1});
    cr_assert_float_eq(l->data[0], 500.0, 1e-3, "got %g", (double)l->data[0]);
    // Every target ignored: loss 0 (no NaN).
    l = op_cross_entropy(&tp, h, (int[]){-1, -1});
    cr_assert_eq(l->data[0], 0);
    tensor_free(u);
    tensor_free(x);
    tensor_free(h);
    tape_free(&tp);
}

Test(ops_loss, cross_entropy_bad_target_and_shape) {
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(false, 3, 2, 3, 5);
    int tg[] = {0, 1, 2, 5, 0, 0};
    cr_assert(EXPECT_FAILURE(op_cross_entropy(&tp, x, tg)));
    cr_assert(strstr(ag_last_error(), "cross_entropy") && strstr(ag_last_error(), "target 5") &&
                  strstr(ag_last_error(), "row 3") && strstr(ag_last_error(), "(2, 3, 5)"),
              "got: %s", ag_last_error());
    Tensor *e = tensor_newv(false, 2, 3, 0);
    cr_assert(EXPECT_FAILURE(op_softmax(&tp, e)));
    cr_assert(strstr(ag_last_error(), "softmax") && strstr(ag_last_error(), "(3, 0)"), "got: %s",
              ag_last_error());
    tensor_free(x);
    tensor_free(e);
    tape_free(&tp);
}

// The parallel row loops and the reductions into shared gradients give
// bit-identical results with 1 and 2 threads (inputs big enough to go
// parallel). The embedding rows are used directly as logits over D classes.
static void run_embed_ce(int threads, real *loss, real *dE, Tensor *E, const int *ids, const int *tg, int N) {
    omp_set_num_threads(threads);
    Tape tp;
    tape_init(&tp);
    memset(E->grad, 0, (size_t)E->numel * sizeof(real));
    Tensor *logits = op_embedding(&tp, E, ids, 1, (int[]){N});
    Tensor *l = op_cross_entropy(&tp, logits, tg);
    tape_backward(&tp, l);
    *loss = l->data[0];
    memcpy(dE, E->grad, (size_t)E->numel * sizeof(real));
    tape_free(&tp);
}

Test(ops_loss, embedding_and_ce_are_deterministic_across_thread_counts) {
    int V = 20, D = 300, N = 400;
    Tensor *E = tensor_newv(true, 2, V, D);
    fill_normal(E, 8, 1.0);
    int ids[400], tg[400];
    Rng r;
    rng_seed(&r, 10);
    for (int i = 0; i < N; i++) ids[i] = (int)rng_below(&r, V), tg[i] = i % 7 == 0 ? -1 : (int)rng_below(&r, D);
    real l1, l2;
    real *g1 = xmalloc((size_t)V * D * sizeof(real)), *g2 = xmalloc((size_t)V * D * sizeof(real));
    run_embed_ce(1, &l1, g1, E, ids, tg, N);
    run_embed_ce(2, &l2, g2, E, ids, tg, N);
    cr_assert_eq(l1, l2);
    cr_assert_eq(memcmp(g1, g2, (size_t)V * D * sizeof(real)), 0, "dE differs between 1 and 2 threads");
    double gn = 0;
    for (int i = 0; i < V * D; i++) gn += fabs((double)g1[i]);
    cr_assert_gt(gn, 0);
    free(g1);
    free(g2);
    tensor_free(E);
}
