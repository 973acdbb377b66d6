// Document boundaries (docs.h) in the DeepSeek sparse-attention indexer
// (dsa_kernel.h): the selection, the distillation target and the KL run
// over each row's own document. Checked packed against one call per
// document, and the KL through the indexer by finite differences with
// boundaries.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "docs.h"
#include "dsa_kernel.h"
#include "test_docs_util.h"

typedef struct Indexer {
    Tensor *qI, *kI, *w;
    int HI, dI;
} Indexer;

static Indexer indexer_new(int B, int T, int HI, int dI, uint64_t seed, bool grad) {
    Indexer x = {tensor_newv(grad, 3, B, T, HI * dI), tensor_newv(grad, 3, B, T, dI), tensor_newv(grad, 3, B, T, HI),
                 HI, dI};
    fill_normal(x.qI, seed, 1.0);
    fill_normal(x.kI, seed + 1, 1.0);
    fill_normal(x.w, seed + 2, 1.0);
    return x;
}

static void indexer_free(Indexer *x) {
    tensor_free(x->qI);
    tensor_free(x->kI);
    tensor_free(x->w);
}

// The positions each document of row b holds: [s, e), e = the next flag or T.
static int doc_end(const int *docs, int b, int T, int s) {
    int e = s + 1;
    while (e < T && !docs[(int64_t)b * T + e]) e++;
    return e;
}

// The fused scoring + top-k and the two-step one (full scores, then top-k)
// with documents equal one call per document, the positions shifted by the
// document's start. T = 300 crosses the 256-key blocks and the 64-query
// tiles; K = 8 leaves rows with fewer candidates than K at every start.
Test(docs_dsa, selection_stays_in_the_document) {
    int B = 2, T = 300, HI = 2, dI = 8, K = 8;
    int *docs = xcalloc((size_t)B * T, sizeof(int));
    int row0[] = {0, 3, 4, 60, 64, 200, 257, 299}, row1[] = {1, 128, 250, 298};
    for (size_t i = 0; i < sizeof row0 / sizeof row0[0]; i++) docs[row0[i]] = 1;
    for (size_t i = 0; i < sizeof row1 / sizeof row1[0]; i++) docs[T + row1[i]] = 1;
    Indexer x = indexer_new(B, T, HI, dI, 10, false);
    int *fused = xmalloc((size_t)B * T * K * sizeof(int)), *two = xmalloc((size_t)B * T * K * sizeof(int));
    dsa_index_select(fused, x.qI->data, x.kI->data, x.w->data, B, T, HI, dI, K, docs);
    Tape tp;
    tape_init(&tp);
    Tensor *Isc = op_dsa_index_scores(&tp, x.qI, x.kI, x.w, HI, docs);
    dsa_topk(two, Isc->data, B, T, K, docs);
    int first[2 * 300];
    docs_first_fill(first, docs, B, T);
    for (int64_t r = 0; r < (int64_t)B * T; r++)   // scores of other documents are zeros
        for (int s = 0; s < T; s++)
            if (s < docs_begin(first, r) || s > r % T) cr_assert_eq(Isc->data[r * T + s], 0);
    cr_assert_eq(memcmp(fused, two, (size_t)B * T * K * sizeof(int)), 0, "fused and two-step selections differ");
    int *sep = xmalloc((size_t)T * K * sizeof(int));
    for (int b = 0; b < B; b++)
        for (int s = 0, e; s < T; s = e) {
            e = doc_end(docs, b, T, s);
            Tensor *q = docs_time_slice(x.qI, b, s, e - s), *k = docs_time_slice(x.kI, b, s, e - s);
            Tensor *w = docs_time_slice(x.w, b, s, e - s);
            dsa_index_select(sep, q->data, k->data, w->data, 1, e - s, HI, dI, K, NULL);
            for (int t = s; t < e; t++)
                for (int j = 0; j < K; j++) {
                    int want = sep[(t - s) * K + j], got = fused[((int64_t)b * T + t) * K + j];
                    cr_assert_eq(got, want < 0 ? -1 : want + s, "row %d, t %d, pick %d: %d, want %d", b, t, j, got,
                                 want < 0 ? -1 : want + s);
                }
            tensor_free(q), tensor_free(k), tensor_free(w);
        }
    free(sep), free(fused), free(two), free(docs);
    tape_free(&tp);
    indexer_free(&x);
}

// The distillation target (head-averaged dense attention) of a packed row
// is each document's own, placed at its positions; the KL over documents is
// the mean of the per-document KLs weighted by their lengths.
Test(docs_dsa, target_and_kl_equal_separate_documents) {
    int B = 2, T = 11, H = 2, dk = 4, HI = 2, dI = 3;
    int *docs = docs_pattern(T, 4);
    Tensor *q = tensor_newv(false, 3, B, T, H * dk), *k = tensor_newv(false, 3, B, T, H * dk);
    fill_normal(q, 20, 1.0);
    fill_normal(k, 21, 1.0);
    Tensor *p = tensor_newv(false, 3, B, T, T);
    dsa_attn_target(p->data, q->data, k->data, B, T, H, dk, 0.5, docs);
    Indexer x = indexer_new(B, T, HI, dI, 22, false);
    Tape tp;
    tape_init(&tp);
    double packed = op_dsa_kl(&tp, op_dsa_index_scores(&tp, x.qI, x.kI, x.w, HI, docs), p, docs)->data[0];
    double sum = 0;
    for (int b = 0; b < B; b++)
        for (int s = 0, e; s < T; s = e) {
            e = doc_end(docs, b, T, s);
            int n = e - s;
            Tensor *qs = docs_time_slice(q, b, s, n), *ks = docs_time_slice(k, b, s, n);
            Tensor *ps = tensor_newv(false, 3, 1, n, n);
            dsa_attn_target(ps->data, qs->data, ks->data, 1, n, H, dk, 0.5, NULL);
            for (int t = 0; t < n; t++)
                for (int u = 0; u < T; u++) {
                    real want = u >= s && u < e ? ps->data[t * n + u - s] : 0;
                    real got = p->data[((int64_t)b * T + s + t) * T + u];
                    cr_assert_float_eq(got, want, 10 * REAL_EPS, "target row %d, t %d, s %d", b, s + t, u);
                }
            Tensor *qi = docs_time_slice(x.qI, b, s, n), *ki = docs_time_slice(x.kI, b, s, n);
            Tensor *wi = docs_time_slice(x.w, b, s, n);
            sum += n * op_dsa_kl(&tp, op_dsa_index_scores(&tp, qi, ki, wi, HI, NULL), ps, NULL)->data[0];
            tensor_free(qs), tensor_free(ks), tensor_free(ps), tensor_free(qi), tensor_free(ki), tensor_free(wi);
        }
    cr_assert_float_eq(packed, sum / (B * T), FORM_TOL * fabs(packed), "KL packed %.12g, documents %.12g", packed,
                       sum / (B * T));
    tape_free(&tp);
    tensor_free(q), tensor_free(k), tensor_free(p);
    indexer_free(&x);
    free(docs);
}

typedef struct KlCtx {
    int HI;
    Tensor *p;
    const int *docs;
} KlCtx;

static int f_kl(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    KlCtx *c = ctx;
    out[0] = op_dsa_kl(tp, op_dsa_index_scores(tp, in[0], in[1], in[2], c->HI, c->docs), c->p, c->docs);
    return 1;
}

static int f_scores(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    KlCtx *c = ctx;
    out[0] = op_dsa_index_scores(tp, in[0], in[1], in[2], c->HI, c->docs);
    return 1;
}

static int f_kl_of_scores(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    KlCtx *c = ctx;
    out[0] = op_dsa_kl(tp, in[0], c->p, c->docs);
    return 1;
}

// The scores alone (every entry seeded, those of other documents included:
// they are constant zeros), the KL alone w.r.t. all scores (it reads none of
// another document), and the two composed, by finite differences.
Test(docs_dsa, kl_gradcheck_with_boundaries) {
    int B = 2, T = 11, H = 2, dk = 4, HI = 2, dI = 3;
    int *docs = docs_pattern(T, 4);
    Tensor *q = tensor_newv(false, 3, B, T, H * dk), *k = tensor_newv(false, 3, B, T, H * dk);
    fill_normal(q, 30, 1.0);
    fill_normal(k, 31, 1.0);
    Tensor *p = tensor_newv(false, 3, B, T, T);
    dsa_attn_target(p->data, q->data, k->data, B, T, H, dk, 0.5, docs);
    Indexer x = indexer_new(B, T, HI, dI, 32, true);
    // Away from the ReLU's kink as in test_dsa.c (float32's step would cross it).
    fill_uniform(x.qI, 33, 0.5, 1.5);
    fill_uniform(x.kI, 34, 0.5, 1.5);
    for (int64_t r = 0; r < x.qI->numel / dI; r += 2)
        for (int i = 0; i < dI; i++) x.qI->data[r * dI + i] *= -1;
    KlCtx c = {HI, p, docs};
    GradcheckOptions o = gradcheck_defaults();
#ifdef AG_DOUBLE
    o.eps = 1e-5;   // as test_dsa.c
#endif
    o.fixed = &p;   // the target (on the GPU it moves with the inputs)
    o.n_fixed = 1;
    GradcheckResult r = gradcheck("dsa_kl with documents", f_kl, (Tensor *[]){x.qI, x.kI, x.w}, 3, &c, &o);
    ASSERT_GRADCHECK(r, "dsa_kl with documents");
    r = gradcheck("dsa index scores with documents", f_scores, (Tensor *[]){x.qI, x.kI, x.w}, 3, &c, &o);
    ASSERT_GRADCHECK(r, "dsa index scores with documents");
    Tensor *Isc = tensor_newv(true, 3, B, T, T);
    fill_normal(Isc, 35, 1.0);
    r = gradcheck("dsa_kl of scores with documents", f_kl_of_scores, &Isc, 1, &c, &o);
    ASSERT_GRADCHECK(r, "dsa_kl of scores with documents");
    tensor_free(Isc);
    tensor_free(q), tensor_free(k), tensor_free(p);
    indexer_free(&x);
    free(docs);
}
