// DeepSeek sparse-attention pieces: indexer scores, top-k selection, sparse
// attention, the distillation target and KL loss.
#include <math.h>
#include <omp.h>
#include <string.h>

#include "attn_kernel.h"
#ifdef AG_CUDA
#include "cuda_ops.h"
#endif
#include "dsa_kernel.h"
#include "test_util.h"

// Brute-force indexer scores, straight from MODEL.md.
static void index_scores_ref(double *Isc, const Tensor *qI, const Tensor *kI, const Tensor *w, int HI) {
    int B = qI->shape[0], T = qI->shape[1], dI = kI->shape[2];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int s = 0; s < T; s++) {
                double acc = 0;
                for (int j = 0; s <= t && j < HI; j++) {
                    double z = 0;
                    for (int i = 0; i < dI; i++)
                        z += (double)qI->data[((int64_t)b * T + t) * HI * dI + j * dI + i] *
                             kI->data[((int64_t)b * T + s) * dI + i];
                    acc += w->data[((int64_t)b * T + t) * HI + j] * fmax(z, 0.0);
                }
                Isc[((int64_t)b * T + t) * T + s] = acc / sqrt(dI);
            }
}

// Gradcheck options for the larger checks here. In float64 the step is 1e-5
// instead of 1e-6: the checked scalar contracts hundreds to thousands of
// outputs, and at 1e-6 the difference quotient's rounding error (~1e-8
// absolute) exceeded the tolerance on small gradient entries (measured 2e-6
// rel; 1e-7 at 1e-5). 1e-4 would start crossing the indexer's ReLU kinks.
static GradcheckOptions gradcheck_fd_step(void) {
    GradcheckOptions o = gradcheck_defaults();
#ifdef AG_DOUBLE
    o.eps = 1e-5;
#endif
    return o;
}

// Indexer inputs. With kink_safe, every qI_tj . kI_s is at least 0.75 away
// from the ReLU's kink at 0 (kI in [0.5, 1.5], each index head of qI of one
// random sign with magnitudes in [0.5, 1.5]), so a finite-difference step
// never crosses it; the float32 checks need this (their step is 1e-2). Heads
// of either sign keep both ReLU branches under test.
static void fill_index_inputs(Tensor *qI, Tensor *kI, Tensor *w, int HI, uint64_t seed, bool kink_safe) {
    fill_normal(w, seed + 2, 1.0);
    if (!kink_safe) {
        fill_normal(qI, seed, 1.0);
        fill_normal(kI, seed + 1, 1.0);
        return;
    }
    int dI = kI->shape[2];
    fill_uniform(qI, seed, 0.5, 1.5);
    fill_uniform(kI, seed + 1, 0.5, 1.5);
    Rng r;
    rng_seed(&r, seed + 3);
    for (int64_t row = 0; row < qI->numel / dI; row++)
        if (rng_range(&r, 0, 1) < 0.5)
            for (int i = 0; i < dI; i++) qI->data[row * dI + i] = -qI->data[row * dI + i];
}

#define KINK_SAFE (sizeof(real) == 4)

typedef struct {
    int HI;
} IdxCtx;

static int f_index(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = op_dsa_index_scores(tp, in[0], in[1], in[2], ((IdxCtx *)ctx)->HI, NULL);
    return 1;
}

// op_dsa_index_scores against index_scores_ref (in double) on these inputs,
// on device_default().
static void assert_index_scores_equal_reference(Tensor *qI, Tensor *kI, Tensor *w, int HI) {
    int64_t n = (int64_t)qI->shape[0] * qI->shape[1] * qI->shape[1];   // B T T
    IdxCtx c = {HI};
    real *Isc;
    int64_t got;
    gradcheck_run_seeds(f_index, (Tensor *[]){qI, kI, w}, 3, &c, (const real *[]){NULL}, &Isc, &got);
    cr_assert_eq(got, n);
    double *ref = xmalloc((size_t)n * sizeof(double));
    index_scores_ref(ref, qI, kI, w, HI);
    real *refr = xmalloc((size_t)n * sizeof(real));
    for (int64_t i = 0; i < n; i++) refr[i] = (real)ref[i];
    cr_assert_leq(max_rel_diff(Isc, refr, n), FORM_TOL);
    free(Isc);
    free(ref);
    free(refr);
}

Test(dsa, index_scores_equal_reference_and_gradcheck) {
    // T = 70: two query tiles of DSA_TILE = 64.
    int B = 2, T = 70, HI = 2, dI = 3;
    Tensor *qI = tensor_newv(true, 3, B, T, HI * dI), *kI = tensor_newv(true, 3, B, T, dI);
    Tensor *w = tensor_newv(true, 3, B, T, HI);
    fill_index_inputs(qI, kI, w, HI, 1, false);
    assert_index_scores_equal_reference(qI, kI, w, HI);
    fill_index_inputs(qI, kI, w, HI, 1, KINK_SAFE);
    IdxCtx c = {HI};
    GradcheckOptions o = gradcheck_fd_step();
    GradcheckResult r = gradcheck("dsa_index_scores", f_index, (Tensor *[]){qI, kI, w}, 3, &c, &o);
    ASSERT_GRADCHECK(r, "dsa_index_scores");
    tensor_free(qI);
    tensor_free(kI);
    tensor_free(w);
}

Test(dsa, index_scores_over_several_key_blocks) {
    // T = 600: the forward's products take the keys in three blocks of
    // DSA_KEY_BLOCK = 256 (the last partial), across query tiles of 64.
    int B = 1, T = 600, HI = 3, dI = 4;
    Tensor *qI = tensor_newv(false, 3, B, T, HI * dI), *kI = tensor_newv(false, 3, B, T, dI);
    Tensor *w = tensor_newv(false, 3, B, T, HI);
    fill_index_inputs(qI, kI, w, HI, 5, false);
    assert_index_scores_equal_reference(qI, kI, w, HI);
    tensor_free(qI);
    tensor_free(kI);
    tensor_free(w);
}

Test(dsa, topk_picks_largest_ties_to_later) {
    int T = 6, K = 3;
    // Row t = 5 scores: 1 3 3 0 3 2 -> the three 3s at 1, 2, 4.
    // Row t = 4 scores: 5 1 1 1 1 -> 0, then the two latest 1s: 3, 4.
    // Row t = 3 scores: 2 2 2 2 -> the latest three: 1, 2, 3.
    real Isc[6 * 6] = {0};
    real r5[] = {1, 3, 3, 0, 3, 2}, r4[] = {5, 1, 1, 1, 1}, r3[] = {2, 2, 2, 2};
    memcpy(Isc + 5 * T, r5, sizeof r5);
    memcpy(Isc + 4 * T, r4, sizeof r4);
    memcpy(Isc + 3 * T, r3, sizeof r3);
    int sel[6 * 3];
    dsa_topk(sel, Isc, 1, T, K, NULL);
    int want[6][3] = {{0, -1, -1}, {0, 1, -1}, {0, 1, 2}, {1, 2, 3}, {0, 3, 4}, {1, 2, 4}};
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++)
            cr_assert_eq(sel[t * K + j], want[t][j], "row %d slot %d: %d, want %d", t, j, sel[t * K + j],
                         want[t][j]);
}

Test(dsa, topk_equals_sorting_on_random_rows) {
    int B = 2, T = 50, K = 7;
    Tensor *Isc = tensor_newv(false, 3, B, T, T);
    fill_normal(Isc, 4, 1.0);
    for (int64_t i = 0; i < Isc->numel; i += 3) Isc->data[i] = (real)0.5;   // plenty of ties
    int *sel = xmalloc((size_t)B * T * K * sizeof(int));
    dsa_topk(sel, Isc->data, B, T, K, NULL);
    for (int b = 0; b < B; b++)
        for (int t = K; t < T; t++) {
            const real *It = Isc->data + ((int64_t)b * T + t) * T;
            const int *row = sel + ((int64_t)b * T + t) * K;
            // Rank of s = how many s' <= t beat it; the selected are exactly those of rank < K.
            int n_sel = 0;
            for (int s = 0; s <= t; s++) {
                int rank = 0;
                for (int s2 = 0; s2 <= t; s2++) rank += It[s2] > It[s] || (It[s2] == It[s] && s2 > s);
                bool in = false;
                for (int j = 0; j < K; j++) in |= row[j] == s;
                cr_assert_eq(in, rank < K, "b %d t %d s %d rank %d", b, t, s, rank);
                n_sel += in;
            }
            cr_assert_eq(n_sel, K);
            for (int j = 1; j < K; j++) cr_assert_lt(row[j - 1], row[j], "ascending");
        }
    free(sel);
    tensor_free(Isc);
}

// The O(n) selection (bound, candidates, bitwise search) against the heap over all
// positions, on rows whose candidate sets differ in size: random, heavy ties,
// all equal, ascending (every position beats the running heap), descending.
Test(dsa, topk_row_equals_reference) {
    int n_max = 400, Ks[] = {1, 3, 16, 17, 64};
    real *x = xmalloc((size_t)n_max * sizeof(real));
    void *cand = xmalloc(DSA_TOPK_WORK(n_max));
    int a[64], b[64];
    Rng r;
    rng_seed(&r, 21);
    for (int kind = 0; kind < 5; kind++)
        for (int n = 1; n <= n_max; n += 7)
            for (int ki = 0; ki < 5; ki++) {
                int K = Ks[ki];
                for (int s = 0; s < n; s++) {
                    double u = rng_normal(&r);
                    x[s] = (real)(kind == 0   ? u
                                  : kind == 1 ? floor(2 * u)   // a handful of values: ties everywhere
                                  : kind == 2 ? (s % 2 ? 0.0 : -0.0)   // the two zeros tie
                                  : kind == 3 ? s + 0.1 * u
                                              : -s + 0.1 * u);
                }
                dsa_topk_row(a, x, n, K, cand);
                dsa_topk_row_ref(b, x, n, K);
                cr_assert_eq(memcmp(a, b, (size_t)K * sizeof(int)), 0, "kind %d, n %d, K %d", kind, n, K);
            }
    free(x);
    free(cand);
}

typedef struct {
    const int *sel;
    int K, H;
    double scale;
} SparseCtx;

static int f_sparse(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    SparseCtx *c = ctx;
    out[0] = op_sparse_attention(tp, in[0], in[1], in[2], c->sel, c->K, c->H, c->scale);
    return 1;
}

typedef struct {
    Tensor *(*o_fn)(Tape *, Tensor *, Tensor *, Tensor *, void *);
    void *ctx;
} OutCtx;

static int f_out(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)n;
    OutCtx *c = ctx;
    out[0] = c->o_fn(tp, in[0], in[1], in[2], c->ctx);
    return 1;
}

// Forward + backward from a fixed seed on device_default() (AG_DEVICE=cuda:
// the GPU); o and the three gradients, concatenated.
static real *run_grads(Tensor *o_fn(Tape *, Tensor *, Tensor *, Tensor *, void *), void *ctx, Tensor *q,
                       Tensor *k, Tensor *v, int64_t *len) {
    OutCtx c = {o_fn, ctx};
    real *o;
    int64_t no;
    gradcheck_run(f_out, (Tensor *[]){q, k, v}, 3, &c, 99, &o, &no);   // (seed 99: fill_normal's draws)
    *len = no + q->numel + k->numel + v->numel;
    real *all = xmalloc((size_t)*len * sizeof(real)), *p = all;
    memcpy(p, o, (size_t)no * sizeof(real));
    p += no;
    for (Tensor *t[] = {q, k, v}, **x = t; x < t + 3; x++) {
        memcpy(p, (*x)->grad, (*x)->numel * sizeof(real));
        p += (*x)->numel;
    }
    free(o);
    return all;
}

typedef struct {
    const int *sel;
    const unsigned char *mask;
    int K, H;
    double scale;
} Forms;

static Tensor *o_sparse(Tape *tp, Tensor *q, Tensor *k, Tensor *v, void *c) {
    Forms *f = c;
    return op_sparse_attention(tp, q, k, v, f->sel, f->K, f->H, f->scale);
}
static Tensor *o_dense(Tape *tp, Tensor *q, Tensor *k, Tensor *v, void *c) {
    Forms *f = c;
    return op_attention_tiled(tp, q, k, v, f->H, f->scale, NULL, 8, 8);
}
static Tensor *o_masked(Tape *tp, Tensor *q, Tensor *k, Tensor *v, void *c) {
    Forms *f = c;
    return op_attention_naive_masked(tp, q, k, v, f->H, f->scale, f->mask);
}

static void check_sparse(int topk, uint64_t seed) {
    int B = 2, T = 21, H = 2, dk = 4, dv = 3;
    Tensor *q = tensor_newv(true, 3, B, T, H * dk), *k = tensor_newv(true, 3, B, T, H * dk);
    Tensor *v = tensor_newv(true, 3, B, T, H * dv), *Isc = tensor_newv(false, 3, B, T, T);
    fill_normal(q, seed, 1.0);
    fill_normal(k, seed + 1, 1.0);
    fill_normal(v, seed + 2, 1.0);
    fill_normal(Isc, seed + 3, 1.0);
    int K = topk;
    int *sel = xmalloc((size_t)B * T * K * sizeof(int));
    dsa_topk(sel, Isc->data, B, T, K, NULL);
    unsigned char *mask = xcalloc((size_t)B * T * T, 1);
    for (int64_t r = 0; r < (int64_t)B * T; r++)
        for (int j = 0; j < K && sel[r * K + j] >= 0; j++) mask[r * T + sel[r * K + j]] = 1;
    Forms f = {sel, mask, K, H, 0.5};
    int64_t n1, n2;
    real *a = run_grads(o_sparse, &f, q, k, v, &n1);
    real *b = run_grads(topk >= T ? o_dense : o_masked, &f, q, k, v, &n2);
    cr_assert_eq(n1, n2);
    double d = max_rel_diff(a, b, n1);
    cr_assert_leq(d, FORM_TOL, "topk %d: sparse vs %s: rel diff %.3e", topk, topk >= T ? "dense" : "masked", d);
    SparseCtx c = {sel, K, H, 0.5};
    GradcheckOptions o = gradcheck_fd_step();
    GradcheckResult r = gradcheck("sparse_attention", f_sparse, (Tensor *[]){q, k, v}, 3, &c, &o);
    ASSERT_GRADCHECK(r, "sparse_attention");
    free(a);
    free(b);
    free(sel);
    free(mask);
    tensor_free(q);
    tensor_free(k);
    tensor_free(v);
    tensor_free(Isc);
}

Test(dsa, sparse_with_topk_at_least_T_equals_dense) {
    check_sparse(21, 10);
    check_sparse(30, 11);
}

Test(dsa, sparse_equals_masked_softmax) {
    check_sparse(5, 20);
    check_sparse(1, 21);   // one key per query: o_t = v_s of the chosen s
}

// Head sizes of whole vectors plus a remainder (40), selections of every
// length from 1 to K = 13 (the four-key blocks and their remainder): the
// output and the three gradients against the masked dense reference.
Test(dsa, sparse_equals_masked_at_wide_heads) {
    int B = 1, T = 80, H = 2, dk = 40, dv = 40, K = 13;
    Tensor *q = tensor_newv(true, 3, B, T, H * dk), *k = tensor_newv(true, 3, B, T, H * dk);
    Tensor *v = tensor_newv(true, 3, B, T, H * dv), *Isc = tensor_newv(false, 3, B, T, T);
    fill_normal(q, 31, 1.0);
    fill_normal(k, 32, 1.0);
    fill_normal(v, 33, 1.0);
    fill_normal(Isc, 34, 1.0);
    int *sel = xmalloc((size_t)B * T * K * sizeof(int));
    dsa_topk(sel, Isc->data, B, T, K, NULL);
    unsigned char *mask = xcalloc((size_t)B * T * T, 1);
    for (int64_t r = 0; r < (int64_t)B * T; r++)
        for (int j = 0; j < K && sel[r * K + j] >= 0; j++) mask[r * T + sel[r * K + j]] = 1;
    Forms f = {sel, mask, K, H, 1.0 / sqrt(dk)};
    int64_t n1, n2;
    real *a = run_grads(o_sparse, &f, q, k, v, &n1);
    real *b = run_grads(o_masked, &f, q, k, v, &n2);
    cr_assert_eq(n1, n2);
    double d = max_rel_diff(a, b, n1);
    cr_assert_leq(d, FORM_TOL, "sparse vs masked: rel diff %.3e", d);
    free(a);
    free(b);
    free(sel);
    free(mask);
    tensor_free(q);
    tensor_free(k);
    tensor_free(v);
    tensor_free(Isc);
}

Test(dsa, target_is_head_mean_of_attention) {
    // Row sums are 1 and sum_s p_ts v_s with v = e_s picks the columns:
    // compare p against the naive attention's output with v = identity rows.
    int B = 1, T = 9, H = 3, dk = 4;
    Tensor *q = tensor_newv(false, 3, B, T, H * dk), *k = tensor_newv(false, 3, B, T, H * dk);
    Tensor *v = tensor_newv(false, 3, B, T, H * T);
    fill_normal(q, 30, 1.0);
    fill_normal(k, 31, 1.0);
    memset(v->data, 0, v->numel * sizeof(real));
    for (int s = 0; s < T; s++)
        for (int h = 0; h < H; h++) v->data[(int64_t)s * H * T + h * T + s] = 1;   // v_s^h = e_s
    real *p = xmalloc((size_t)B * T * T * sizeof(real));
    dsa_attn_target(p, q->data, k->data, B, T, H, dk, 0.5, NULL);
    Tape tp;
    tape_init(&tp);
    Tensor *o = op_attention_naive(&tp, q, k, v, H, 0.5);   // o_t^h = P^h_t,.
    for (int t = 0; t < T; t++) {
        double rowsum = 0;
        for (int s = 0; s < T; s++) {
            double want = 0;
            for (int h = 0; h < H; h++) want += o->data[(int64_t)t * H * T + h * T + s] / H;
            cr_assert_float_eq(p[t * T + s], want, 10 * REAL_EPS, "t %d s %d", t, s);
            rowsum += p[t * T + s];
        }
        cr_assert_float_eq(rowsum, 1.0, 10 * REAL_EPS * T);
    }
    tape_free(&tp);
    free(p);
    tensor_free(q);
    tensor_free(k);
    tensor_free(v);
}

typedef struct {
    int HI;
    Tensor *p;
} KlCtx;

static int f_kl(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    KlCtx *c = ctx;
    out[0] = op_dsa_kl(tp, op_dsa_index_scores(tp, in[0], in[1], in[2], c->HI, NULL), c->p, NULL);
    return 1;
}

Test(dsa, kl_gradcheck_through_the_indexer) {
    // Target from a dense attention of H = 2 heads; gradients reach qI, kI, w.
    int B = 2, T = 11, H = 2, dk = 4, HI = 2, dI = 3;
    Tensor *q = tensor_newv(false, 3, B, T, H * dk), *k = tensor_newv(false, 3, B, T, H * dk);
    fill_normal(q, 40, 1.0);
    fill_normal(k, 41, 1.0);
    Tensor *p = tensor_newv(false, 3, B, T, T);
    dsa_attn_target(p->data, q->data, k->data, B, T, H, dk, 0.5, NULL);
    Tensor *qI = tensor_newv(true, 3, B, T, HI * dI), *kI = tensor_newv(true, 3, B, T, dI);
    Tensor *w = tensor_newv(true, 3, B, T, HI);
    fill_index_inputs(qI, kI, w, HI, 42, KINK_SAFE);
    KlCtx c = {HI, p};
    GradcheckOptions o = gradcheck_defaults();
    o.fixed = &p;   // the target (on the GPU it moves with the inputs)
    o.n_fixed = 1;
    GradcheckResult r = gradcheck("dsa_kl", f_kl, (Tensor *[]){qI, kI, w}, 3, &c, &o);
    ASSERT_GRADCHECK(r, "dsa_kl");
    tensor_free(q);
    tensor_free(k);
    tensor_free(p);
    tensor_free(qI);
    tensor_free(kI);
    tensor_free(w);
}

Test(dsa, kl_is_zero_at_the_target_and_positive_elsewhere) {
    int B = 1, T = 8;
    Tensor *Isc = tensor_newv(true, 3, B, T, T), *p = tensor_newv(false, 3, B, T, T);
    fill_normal(Isc, 50, 1.0);
    for (int t = 0; t < T; t++) {   // p = softmax_{s<=t}(I_t)
        double sum = 0;
        for (int s = 0; s <= t; s++) sum += exp(Isc->data[t * T + s]);
        for (int s = 0; s < T; s++) p->data[t * T + s] = s <= t ? (real)(exp(Isc->data[t * T + s]) / sum) : 0;
    }
    Tape tp;
    tape_init(&tp);
    Tensor *loss = op_dsa_kl(&tp, Isc, p, NULL);
    cr_assert_float_eq(loss->data[0], 0, 1e2 * REAL_EPS);
    tape_backward(&tp, loss);
    for (int64_t i = 0; i < Isc->numel; i++) cr_assert_float_eq(Isc->grad[i], 0, 1e2 * REAL_EPS);
    tape_reset(&tp);
    Isc->data[3 * T + 1] += 1;   // move one score: KL > 0
    loss = op_dsa_kl(&tp, Isc, p, NULL);
    cr_assert_gt(loss->data[0], 1e-3);
    tape_free(&tp);
    tensor_free(Isc);
    tensor_free(p);
}

Test(dsa, selected_mass) {
    int T = 4, K = 2;
    real p[16] = {1, 0, 0, 0, 0.5, 0.5, 0, 0, 0.2, 0.3, 0.5, 0, 0.1, 0.2, 0.3, 0.4};
    int sel[8];
    dsa_topk(sel, p, 1, T, K, NULL);   // select by p itself: keeps the top two of each row
    double m = dsa_selected_mass(p, sel, 1, T, K);
    cr_assert_float_eq(m, (1 + 1 + 0.8 + 0.7) / 4, 1e-6);
}

Test(dsa, fused_select_equals_scores_then_topk) {
    // T = 300: five tiles, the last one partial; two key blocks.
    int B = 2, T = 300, HI = 3, dI = 4, K = 10;
    Tensor *qI = tensor_newv(false, 3, B, T, HI * dI), *kI = tensor_newv(false, 3, B, T, dI);
    Tensor *w = tensor_newv(false, 3, B, T, HI);
    fill_index_inputs(qI, kI, w, HI, 60, false);
    Tape tp;
    tape_init(&tp);
    Tensor *Isc = op_dsa_index_scores(&tp, qI, kI, w, HI, NULL);
    int *a = xmalloc((size_t)B * T * K * sizeof(int)), *b = xmalloc((size_t)B * T * K * sizeof(int));
    dsa_topk(a, Isc->data, B, T, K, NULL);
    dsa_index_select(b, qI->data, kI->data, w->data, B, T, HI, dI, K, NULL);
    cr_assert_eq(memcmp(a, b, (size_t)B * T * K * sizeof(int)), 0);
    tape_free(&tp);
    free(a);
    free(b);
    tensor_free(qI);
    tensor_free(kI);
    tensor_free(w);
}

// Decoding's scores of one query (dsa_index_row): against the definition in
// double, for keys in rows ld apart, a number of keys that is not whole
// vectors and an index head size that is not either. A row long enough to
// be shared by threads (9,000 keys: blocks of 2,048 and a partial one) gives
// the same scores bit for bit on 1 and 2 threads and with
// attn_decode_set_threads(2) on one (generate's small models).
Test(dsa, index_row_equals_definition) {
    int n = 9000, HI = 3, dI = 5, ld = 8;
    cr_assert_geq((int64_t)n * HI, ATTN_DECODE_PAR_KEYS);
    real *qI = test_randn(HI * dI, 71), *w = test_randn(HI, 72), *kI = test_randn((int64_t)n * ld, 73);
    real *got = xmalloc((size_t)n * sizeof(real)), *got2 = xmalloc((size_t)n * sizeof(real));
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    dsa_index_row(got, qI, w, kI, ld, n, HI, dI);
    attn_decode_set_threads(2);
    dsa_index_row(got2, qI, w, kI, ld, n, HI, dI);
    attn_decode_set_threads(0);
    cr_assert(memcmp(got, got2, (size_t)n * sizeof(real)) == 0, "attn_decode_set_threads(2) changes the scores");
    omp_set_num_threads(2);
    dsa_index_row(got2, qI, w, kI, ld, n, HI, dI);
    omp_set_num_threads(saved);
    cr_assert(memcmp(got, got2, (size_t)n * sizeof(real)) == 0, "2 threads change the scores");
    // the short row of one block: a key near the start (s = 300) of the long row reads the same
    dsa_index_row(got2, qI, w, kI, ld, 300, HI, dI);
    cr_assert(memcmp(got, got2, 300 * sizeof(real)) == 0, "the first 300 keys alone score differently");
    for (int s = 0; s < n; s++) {
        double acc = 0, mag = 0;
        for (int j = 0; j < HI; j++) {
            double z = 0;
            for (int i = 0; i < dI; i++) z += (double)qI[j * dI + i] * kI[(int64_t)s * ld + i];
            if (z > 0) acc += w[j] * z / sqrt(dI), mag += fabs(w[j] * z / sqrt(dI));
        }
        cr_assert_leq(fabs(got[s] - acc), FORM_TOL * (1 + mag), "key %d: %.9g, want %.9g", s, (double)got[s], acc);
    }
    free(qI), free(w), free(kI), free(got), free(got2);
}

#ifdef AG_CUDA
// The GPU's window selection (cu_dsa_prefix_select) against its decoding
// step (cu_dsa_decode_select) query by query: the same scores, so the same
// picks exactly. q (B, T0, HI*dI), w (B, T0, HI), kc (B, max_T, dI), key0 (B) on the host.
static void prefix_select_gpu_equals_steps(const real *q, const real *w, const real *kc, int B, int max_T, int pos,
                                           int T0, const int *key0, int HI, int dI, int K) {
    Tape gt;
    tape_init_on(&gt, DEVICE_CUDA);
    size_t bq = (size_t)B * T0 * HI * dI * sizeof(real), bw = (size_t)B * T0 * HI * sizeof(real);
    size_t bk = (size_t)B * max_T * dI * sizeof(real), bs = (size_t)B * T0 * K * sizeof(int);
    real *gk = test_dev_copy(&gt, kc, bk);
    int *g0 = test_dev_copy(&gt, key0, (size_t)B * sizeof(int)), *gsel = tape_dalloc(&gt, bs);
    cu_dsa_prefix_select(&gt, gsel, test_dev_copy(&gt, q, bq), test_dev_copy(&gt, w, bw), gk, B, max_T, pos, T0, g0, HI,
                         dI, K);
    int *win = xmalloc(bs), *step = xmalloc((size_t)B * K * sizeof(int));
    dev_to_host(win, gsel, bs, DEVICE_CUDA);
    real *qt = xmalloc((size_t)B * HI * dI * sizeof(real)), *wt = xmalloc((size_t)B * HI * sizeof(real));
    real *dq = tape_dalloc(&gt, (size_t)B * HI * dI * sizeof(real));
    real *dw = tape_dalloc(&gt, (size_t)B * HI * sizeof(real));
    real *dsc = tape_dalloc(&gt, (size_t)B * max_T * sizeof(real));
    int *dsel = tape_dalloc(&gt, (size_t)B * K * sizeof(int));
    for (int t = 0; t < T0; t++) {   // query t of every row, as the step at slot pos + t takes it
        for (int b = 0; b < B; b++) {
            memcpy(qt + (int64_t)b * HI * dI, q + ((int64_t)b * T0 + t) * HI * dI, (size_t)HI * dI * sizeof(real));
            memcpy(wt + (int64_t)b * HI, w + ((int64_t)b * T0 + t) * HI, (size_t)HI * sizeof(real));
        }
        dev_from_host(dq, DEVICE_CUDA, qt, (size_t)B * HI * dI * sizeof(real));
        dev_from_host(dw, DEVICE_CUDA, wt, (size_t)B * HI * sizeof(real));
        cu_dsa_decode_select(&gt, dsel, dsc, dq, dw, gk, B, max_T, pos + t + 1, g0, HI, dI, K);
        dev_to_host(step, dsel, (size_t)B * K * sizeof(int), DEVICE_CUDA);
        for (int b = 0; b < B; b++)
            for (int j = 0; j < K; j++)
                cr_assert_eq(win[((int64_t)b * T0 + t) * K + j], step[b * K + j],
                             "GPU window at %d, row %d, query %d, pick %d: %d, the step's %d", pos, b, t, j,
                             win[((int64_t)b * T0 + t) * K + j], step[b * K + j]);
    }
    free(win), free(step), free(qt), free(wt);
    tape_free(&gt);
}
#endif

// The prefill's selection (dsa_prefix_select): a window of queries after
// cached indexer keys picks, for each query, what dsa_index_select picks for
// the same query at the end of a sequence made of the row's cached keys
// from key0 on (its document). Windows of several query tiles and key
// blocks, after 0 and after 300 cached keys, rows whose keys begin at 0 and
// at 250, a one-query window. Under AG_DEVICE=cuda the GPU's window
// selection against its decoding step, query by query.
Test(dsa, prefix_select_equals_select_over_the_whole_row) {
    int B = 2, max_T = 700, HI = 3, dI = 4, K = 10;
    const int wins[][2] = {{0, 130}, {300, 200}, {650, 1}}, key0s[][2] = {{0, 0}, {0, 250}, {0, 250}};
    Tensor *kc = tensor_newv(false, 3, B, max_T, dI), *qa = tensor_newv(false, 3, B, max_T, HI * dI);
    Tensor *wa = tensor_newv(false, 3, B, max_T, HI);
    fill_index_inputs(qa, kc, wa, HI, 61, false);
    for (size_t c = 0; c < sizeof wins / sizeof wins[0]; c++) {
        int pos = wins[c][0], T0 = wins[c][1], key0[2] = {key0s[c][0], key0s[c][1]};
        // The window's queries and weights: rows pos .. pos+T0-1 of qa, wa.
        real *q = xmalloc((size_t)B * T0 * HI * dI * sizeof(real)), *w = xmalloc((size_t)B * T0 * HI * sizeof(real));
        for (int b = 0; b < B; b++) {
            memcpy(q + (int64_t)b * T0 * HI * dI, qa->data + ((int64_t)b * max_T + pos) * HI * dI,
                   (size_t)T0 * HI * dI * sizeof(real));
            memcpy(w + (int64_t)b * T0 * HI, wa->data + ((int64_t)b * max_T + pos) * HI,
                   (size_t)T0 * HI * sizeof(real));
        }
        int *got = xmalloc((size_t)B * T0 * K * sizeof(int));
        dsa_prefix_select(got, q, w, kc->data, B, max_T, pos, T0, key0, HI, dI, K);
        for (int b = 0; b < B; b++) {   // row b alone, from key0[b]: a sequence of n positions
            int k0 = key0[b], n = pos + T0 - k0;
            int *want = xmalloc((size_t)n * K * sizeof(int));
            int64_t r0 = (int64_t)b * max_T + k0;
            dsa_index_select(want, qa->data + r0 * HI * dI, kc->data + r0 * dI, wa->data + r0 * HI, 1, n, HI, dI, K,
                             NULL);
            for (int t = 0; t < T0; t++)
                for (int j = 0; j < K; j++) {
                    int g = got[((int64_t)b * T0 + t) * K + j], x = want[(int64_t)(pos - k0 + t) * K + j];
                    cr_assert_eq(g, x < 0 ? -1 : x + k0, "window at %d, row %d, query %d, pick %d: %d, want %d", pos, b,
                                 t, j, g, x < 0 ? -1 : x + k0);
                }
            free(want);
        }
#ifdef AG_CUDA
        if (device_default() == DEVICE_CUDA) prefix_select_gpu_equals_steps(q, w, kc->data, B, max_T, pos, T0, key0,
                                                                            HI, dI, K);
#endif
        free(got), free(q), free(w);
    }
    tensor_free(kc), tensor_free(qa), tensor_free(wa);
}

// Gradients of the indexer and of the sparse attention with 1 and 2 threads.
static void dsa_grads(Tensor *const *x, const int *sel, int K, real *out) {
    Tape tp;
    tape_init(&tp);
    for (int i = 0; i < 6; i++) memset(x[i]->grad, 0, x[i]->numel * sizeof(real));
    Tensor *Isc = op_dsa_index_scores(&tp, x[0], x[1], x[2], 2, NULL);
    Tensor *o = op_sparse_attention(&tp, x[3], x[4], x[5], sel, K, 2, 0.5);
    Tensor *l = op_add(&tp, op_mean(&tp, op_mul(&tp, Isc, Isc)), op_mean(&tp, op_mul(&tp, o, o)));
    tape_backward(&tp, l);
    for (int i = 0; i < 6; i++) {
        memcpy(out, x[i]->grad, x[i]->numel * sizeof(real));
        out += x[i]->numel;
    }
    tape_free(&tp);
}

Test(dsa, backward_same_for_any_thread_count) {
    int B = 3, T = 70, K = 6;
    Tensor *x[6] = {tensor_newv(true, 3, B, T, 6), tensor_newv(true, 3, B, T, 3), tensor_newv(true, 3, B, T, 2),
                    tensor_newv(true, 3, B, T, 8), tensor_newv(true, 3, B, T, 8), tensor_newv(true, 3, B, T, 6)};
    int64_t n = 0;
    for (int i = 0; i < 6; i++) {
        fill_normal(x[i], 70 + i, 1.0);
        n += x[i]->numel;
    }
    Tensor *I = tensor_newv(false, 3, B, T, T);
    fill_normal(I, 80, 1.0);
    int *sel = xmalloc((size_t)B * T * K * sizeof(int));
    dsa_topk(sel, I->data, B, T, K, NULL);
    real *a = xmalloc(n * sizeof(real)), *b = xmalloc(n * sizeof(real));
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    dsa_grads(x, sel, K, a);
    omp_set_num_threads(2);
    dsa_grads(x, sel, K, b);
    omp_set_num_threads(saved);
    cr_assert_eq(memcmp(a, b, n * sizeof(real)), 0);
    free(a);
    free(b);
    free(sel);
    tensor_free(I);
    for (int i = 0; i < 6; i++) tensor_free(x[i]);
}
