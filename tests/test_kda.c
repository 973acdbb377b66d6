// Tests of op_kda (Kimi Delta Attention's mixing op, kda_kernel.h): gradient
// checks of both forms with and without documents, initial state and final
// state; op_gdn as the case of a decay equal over the key channels; the
// chunked (WY) form against the recurrent reference over lengths, chunk
// sizes, documents and extreme decays; threads.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "gdn_kernel.h"
#include "kda_kernel.h"
#include "test_docs_util.h"

enum { IQ, IK, IV, IBETA, IG, IS0, N_IN };
static const DocsInKind KDA_KINDS[N_IN] = {DOCS_SEQ, DOCS_SEQ, DOCS_SEQ, DOCS_SEQ, DOCS_SEQ, DOCS_ROW};
static const char *const NAMES[N_IN] = {"dq", "dk", "dv", "dbeta", "dg", "ds0"};
static const MixerForm FORMS[2] = {MIXER_FORM_RECURRENT, MIXER_FORM_CHUNKED};

// The decays of g (per key channel): uniform in [lo, hi].
typedef struct Decay {
    const char *name;
    double lo, hi;
} Decay;
static const Decay MILD = {"mild", -1.0, -0.01}, ZERO = {"g=0", 0, 0}, STRONG = {"g~-30", -31, -29};

// x[IQ..IS0]: q, k L2-normalised per head (q scaled by 1/sqrt(dk)) as the
// layer feeds them, v ~ N(0, 1), beta a sigmoid of N(0, 1), g per channel
// from `decay`, s0 ~ N(0, 0.5^2) (NULL without it). All take gradients.
static void kda_inputs(Tensor **x, int B, int T, int H, int dk, int dv, Decay decay, bool with_s0, uint64_t seed) {
    x[IQ] = tensor_newv(true, 3, B, T, H * dk);
    x[IK] = tensor_newv(true, 3, B, T, H * dk);
    x[IV] = tensor_newv(true, 3, B, T, H * dv);
    x[IBETA] = tensor_newv(true, 3, B, T, H);
    x[IG] = tensor_newv(true, 3, B, T, H * dk);
    x[IS0] = with_s0 ? tensor_newv(true, 4, B, H, dk, dv) : NULL;
    fill_normal(x[IQ], seed + 1, 1.0);
    fill_normal(x[IK], seed + 2, 1.0);
    fill_normal(x[IV], seed + 3, 1.0);
    if (with_s0) fill_normal(x[IS0], seed + 4, 0.5);
    test_l2norm_rows(x[IQ], dk, 1.0 / sqrt(dk));
    test_l2norm_rows(x[IK], dk, 1.0);
    Rng r;
    rng_seed(&r, seed + 5);
    for (int64_t i = 0; i < x[IBETA]->numel; i++) x[IBETA]->data[i] = (real)(1.0 / (1.0 + exp(-rng_normal(&r))));
    for (int64_t i = 0; i < x[IG]->numel; i++) x[IG]->data[i] = (real)rng_range(&r, decay.lo, decay.hi);
}

static void free_inputs(Tensor **x) {
    for (int i = 0; i < N_IN; i++) tensor_free(x[i]);
}

typedef struct KdaCtx {
    int H, chunk;
    MixerForm form;
    const int *doc_start;   // (B, T) or NULL
    bool state_only;        // output S_T alone (o's gradient never seeded)
} KdaCtx;

static int f_kda(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    const KdaCtx *c = ctx;
    Tensor *sT = NULL;
    Tensor *o = op_kda(tp, in[IQ], in[IK], in[IV], in[IBETA], in[IG], n > IS0 ? in[IS0] : NULL, c->doc_start, c->H,
                       c->form, c->chunk, &sT);
    if (c->state_only) {
        out[0] = sT;
        return 1;
    }
    out[0] = o;
    out[1] = sT;
    return 2;
}

static int f_kda_docs(Tape *tp, Tensor *const *in, const int *doc_start, void *ctx, Tensor **out) {
    KdaCtx c = *(const KdaCtx *)ctx;
    c.doc_start = doc_start;
    return f_kda(tp, in, N_IN, &c, out);
}

// ---- gradient checks ----

static void gradcheck_kda(MixerForm form, int T, int chunk, Decay decay, bool with_s0, const int *docs,
                          bool state_only) {
    Tensor *x[N_IN];
    kda_inputs(x, 2, T, 2, 4, 3, decay, with_s0, 100 + T + chunk);
    KdaCtx c = {2, chunk, form, docs, state_only};
    char label[128];
    snprintf(label, sizeof label, "kda %s T=%d C=%d %s%s%s%s", mixer_form_name(form), T, chunk, decay.name,
             with_s0 ? " +s0" : "", docs ? " +docs" : "", state_only ? " S_T only" : "");
    // float64: a step of 1e-5, not the default 1e-6. With a decay per channel
    // a dg element is about 1/dk of op_gdn's, and at 1e-6 the central
    // difference's rounding (1e-16 |f| / eps) reached 1.7e-6 of the smaller
    // ones (a Debug build); at 1e-5 its truncation error (eps^2 f''' / 6) is
    // still far below, and every check measures 1e-8 .. 1e-7 (tol stays 1e-6).
    // (quiet set: gradcheck_defaults leaves it unset.)
    GradcheckOptions opt = gradcheck_defaults();
    opt.quiet = false;
#ifdef AG_DOUBLE
    opt.eps = 1e-5;
#endif
    GradcheckResult r = gradcheck(label, f_kda, x, with_s0 ? N_IN : N_IN - 1, &c, &opt);
    ASSERT_GRADCHECK(r, label);
    cr_assert_gt(r.n_checked, 0);
    free_inputs(x);
}

static void gradcheck_form(MixerForm form) {
    gradcheck_kda(form, 7, 3, MILD, true, NULL, false);    // 3 chunks, the last partial
    gradcheck_kda(form, 5, 8, MILD, true, NULL, false);    // one chunk longer than T
    gradcheck_kda(form, 6, 2, MILD, false, NULL, false);   // no initial state
    gradcheck_kda(form, 6, 4, ZERO, true, NULL, false);    // no decay
    gradcheck_kda(form, 7, 3, MILD, true, NULL, true);     // through the final state alone
    int *docs = docs_pattern(11, 4);
    gradcheck_kda(form, 11, 4, MILD, true, docs, false);
    gradcheck_kda(form, 11, 4, MILD, true, docs, true);
    free(docs);
}

Test(kda, gradcheck_recurrent) { gradcheck_form(MIXER_FORM_RECURRENT); }
Test(kda, gradcheck_chunked) { gradcheck_form(MIXER_FORM_CHUNKED); }

// ---- documents: packed rows equal one call per document ----

Test(kda, packed_documents_equal_separate_calls) {
    int B = 2, T = 11, C = 4, H = 2;
    int *docs = docs_pattern(T, C);
    const Decay decays[] = {MILD, ZERO, STRONG};
    for (int f = 0; f < 2; f++)
        for (int r = 0; r < 3; r++) {
            Tensor *x[N_IN];
            kda_inputs(x, B, T, H, 4, 3, decays[r], true, 300 + r);
            KdaCtx c = {H, C, FORMS[f], NULL, false};
            DocsFn fn = {f_kda_docs, &c, N_IN, KDA_KINDS};
            char label[64];
            snprintf(label, sizeof label, "kda %s %s", mixer_form_name(FORMS[f]), decays[r].name);
            docs_check_packed(&fn, x, docs, B, T, FORM_TOL, label);
            free_inputs(x);
        }
    free(docs);
}

// At g ~ -30 per step, documents restarting inside chunks: every value is
// finite, a document's first output is exactly its own term beta (q.k) v
// (delta = beta v: the state before it is not read), and row 0, whose
// position 0 begins a document, reads nothing of s0.
Test(kda, strong_decay_restart_is_exact) {
    int B = 2, T = 11, H = 1, dk = 2, dv = 2;
    int *docs = docs_pattern(T, 4);
    real *ones = test_ones((int64_t)B * T * H * dv);   // the seeds of sum(o) + sum(S_T)
    for (int f = 0; f < 2; f++) {
        Tensor *x[N_IN];
        kda_inputs(x, B, T, H, dk, dv, STRONG, true, 200);
        KdaCtx c = {H, 8, FORMS[f], NULL, false};
        DocsFn fn = {f_kda_docs, &c, N_IN, KDA_KINDS};
        real *out[2];
        docs_run(&fn, x, docs, (const real *[]){ones, ones}, out, NULL);   // (S_T: B H dk dv <= B T H dv)
        const char *form = mixer_form_name(FORMS[f]);
        for (int i = 0; i < N_IN; i++)
            for (int64_t e = 0; e < x[i]->numel; e++)
                cr_assert(isfinite(x[i]->grad[e]), "%s: gradient of input %d not finite", form, i);
        for (int64_t r = 0; r < (int64_t)B * T; r++) {
            if (!docs[r]) continue;
            const real *q = x[IQ]->data + r * dk, *k = x[IK]->data + r * dk, *v = x[IV]->data + r * dv;
            double want = x[IBETA]->data[r] * (q[0] * k[0] + q[1] * k[1]);
            for (int j = 0; j < dv; j++)
                cr_assert_float_eq(out[0][r * dv + j], want * v[j], 1e3 * REAL_EPS * (1 + fabs(want * v[j])),
                                   "%s: row %lld, a document's first output", form, (long long)r);
        }
        for (int64_t e = 0; e < x[IS0]->numel / B; e++) cr_assert_eq(x[IS0]->grad[e], 0);
        free(out[0]), free(out[1]);
        free_inputs(x);
    }
    free(ones);
    free(docs);
}

// ---- op_gdn: the decay equal over the key channels ----

typedef struct GdnCtx {
    int H, chunk;
    MixerForm form;
    const int *doc_start;
} GdnCtx;

static int f_gdn(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    const GdnCtx *c = ctx;
    out[0] = op_gdn(tp, in[IQ], in[IK], in[IV], in[IBETA], in[IG], in[IS0], c->doc_start, c->H, c->form, c->chunk,
                    &out[1]);
    return 2;
}

// The outputs (o, S_T) and gradients of one run, seeded from seed 7 + k.
typedef struct Run {
    real *out[2], *grad[N_IN];
    int64_t n_out[2], n_grad[N_IN];
} Run;

static Run run_fn(GradcheckFn f, Tensor *const *x, void *ctx) {
    Run r;
    cr_assert_eq(gradcheck_run(f, x, N_IN, ctx, 7, r.out, r.n_out), 2);
    for (int i = 0; i < N_IN; i++) {
        r.n_grad[i] = x[i]->numel;
        r.grad[i] = xmalloc((size_t)x[i]->numel * sizeof(real));
        memcpy(r.grad[i], x[i]->grad, (size_t)x[i]->numel * sizeof(real));
    }
    return r;
}

static void free_run(Run *r) {
    free(r->out[0]), free(r->out[1]);
    for (int i = 0; i < N_IN; i++) free(r->grad[i]);
}

static void free_runs(Run *a, Run *b) {
    free_run(a);
    free_run(b);
}

// op_kda with g[b, t, h*dk + c] = g_gdn[b, t, h] for every c is op_gdn:
// outputs and every gradient, dg summed over the channels, each form against
// the same form of op_gdn, with and without documents.
Test(kda, equals_gdn_when_the_decay_is_shared_by_the_channels) {
    int B = 2, T = 37, H = 2, dk = 8, dv = 8, C = 16;
    int *docs = docs_pattern(T, C);
    for (int withdocs = 0; withdocs < 2; withdocs++)
        for (int f = 0; f < 2; f++) {
            Tensor *x[N_IN], *y[N_IN];
            kda_inputs(x, B, T, H, dk, dv, MILD, true, 400 + f);
            for (int i = 0; i < N_IN; i++) y[i] = x[i];
            y[IG] = tensor_newv(true, 3, B, T, H);   // op_gdn's g: channel 0 of each head
            for (int64_t r = 0; r < (int64_t)B * T * H; r++) {
                y[IG]->data[r] = x[IG]->data[r * dk];
                for (int c = 1; c < dk; c++) x[IG]->data[r * dk + c] = y[IG]->data[r];
            }
            const int *ds = withdocs ? docs : NULL;
            KdaCtx kc = {H, C, FORMS[f], ds, false};
            GdnCtx gc = {H, C, FORMS[f], ds};
            Run a = run_fn(f_kda, x, &kc), b = run_fn(f_gdn, y, &gc);
            const char *form = mixer_form_name(FORMS[f]);
            for (int k = 0; k < 2; k++) {
                double e = max_rel_diff(a.out[k], b.out[k], a.n_out[k]);
                cr_assert_leq(e, FORM_TOL, "%s docs %d: output %d differs from op_gdn's by %.3e", form, withdocs, k, e);
            }
            real *dg = xcalloc((size_t)B * T * H, sizeof(real));   // kda's dg summed over the channels
            for (int64_t r = 0; r < (int64_t)B * T * H; r++)
                for (int c = 0; c < dk; c++) dg[r] += a.grad[IG][r * dk + c];
            for (int i = 0; i < N_IN; i++) {
                double e = i == IG ? max_rel_diff(dg, b.grad[IG], B * T * H)
                                   : max_rel_diff(a.grad[i], b.grad[i], a.n_grad[i]);
                cr_assert_leq(e, FORM_TOL, "%s docs %d: %s differs from op_gdn's by %.3e", form, withdocs, NAMES[i],
                              e);
            }
            cr_log_info("kda %s docs %d against gdn: o %.3g, dg %.3g", form, withdocs,
                        max_rel_diff(a.out[0], b.out[0], a.n_out[0]), max_rel_diff(dg, b.grad[IG], B * T * H));
            free(dg);
            free_runs(&a, &b);
            tensor_free(y[IG]);
            free_inputs(x);
        }
    free(docs);
}

// ---- the chunked form against the recurrent one ----

// Documents at random positions (about one position in eight) of B rows of
// T, row 0 also at position 0 (its s0 not read): a heap array (B*T).
static int *random_docs(int B, int T, uint64_t seed) {
    int *d = xcalloc((size_t)B * T, sizeof(int));
    Rng r;
    rng_seed(&r, seed);
    for (int64_t i = 0; i < (int64_t)B * T; i++) d[i] = rng_uniform(&r) < 0.125;
    d[0] = 1;
    return d;
}

// The largest difference check_forms_agree has seen in this test (each test
// runs in a process of its own), for the log.
static double worst_seen;

// Both forms on the same inputs (H heads): outputs and gradients agree within
// FORM_TOL (normwise), and the chunked form's are finite.
static void check_forms_agree(Tensor **x, int H, int T, int C, const int *docs, const char *label) {
    double tol = FORM_TOL;
    KdaCtx rc = {H, C, MIXER_FORM_RECURRENT, docs, false};
    KdaCtx cc = rc;
    cc.form = MIXER_FORM_CHUNKED;
    Run a = run_fn(f_kda, x, &rc), c = run_fn(f_kda, x, &cc);
    for (int k = 0; k < 2; k++) {
        double e = max_rel_diff(a.out[k], c.out[k], a.n_out[k]);
        cr_assert_leq(e, tol, "%s T=%d C=%d: %s differs by %.3e", label, T, C, k ? "S_T" : "o", e);
        worst_seen = fmax(worst_seen, e);
        for (int64_t j = 0; j < c.n_out[k]; j++) cr_assert(isfinite(c.out[k][j]), "%s: output not finite", label);
    }
    for (int i = 0; i < N_IN; i++) {
        double e = max_rel_diff(a.grad[i], c.grad[i], a.n_grad[i]);
        cr_assert_leq(e, tol, "%s T=%d C=%d: %s differs by %.3e", label, T, C, NAMES[i], e);
        worst_seen = fmax(worst_seen, e);
        for (int64_t j = 0; j < c.n_grad[i]; j++)
            cr_assert(isfinite(c.grad[i][j]), "%s T=%d C=%d: %s not finite", label, T, C, NAMES[i]);
    }
    free_runs(&a, &c);
}

static void forms_agree(Decay decay, int dk, int dv) {
    static const int Ts[] = {1, 17, 63, 64, 65, 150}, Cs[] = {16, 32, 64};
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 3; j++)
            for (int withdocs = 0; withdocs < 2; withdocs++) {
                int B = 2, H = 2, T = Ts[i];
                Tensor *x[N_IN];
                kda_inputs(x, B, T, H, dk, dv, decay, true, 500 + 10 * i + j);
                int *docs = withdocs ? random_docs(B, T, 600 + i) : NULL;
                char label[96];
                snprintf(label, sizeof label, "kda %s dk %d dv %d%s", decay.name, dk, dv, withdocs ? " +docs" : "");
                check_forms_agree(x, H, T, Cs[j], docs, label);
                free(docs);
                free_inputs(x);
            }
    cr_log_info("kda %s dk %d dv %d: chunked against recurrent, worst %.3g", decay.name, dk, dv, worst_seen);
}

Test(kda, chunked_equals_recurrent_mild) { forms_agree(MILD, 8, 8); }
Test(kda, chunked_equals_recurrent_g_zero) { forms_agree(ZERO, 8, 8); }
Test(kda, chunked_equals_recurrent_g_minus30) { forms_agree(STRONG, 8, 8); }
// Heads of whole vectors in both builds (16, 32): the products between
// sub-blocks and the chunk products run through tile_mm's register blocks.
Test(kda, chunked_equals_recurrent_tile_sized_heads) {
    forms_agree(MILD, 16, 32);
    forms_agree(STRONG, 32, 16);
}

// Per channel the decays differ by thirty orders of magnitude per step:
// half the channels keep everything (g = 0 exactly), half forget at once (g ~
// -30), or g ~ -1000 (exp(g) = 0 in both builds). Every value is finite and
// the forms agree; beta near 1 makes I + A nearly singular on top.
Test(kda, chunked_equals_recurrent_channels_of_opposite_decays) {
    int B = 2, T = 100, H = 2, dk = 16, dv = 8;
    const double strong[] = {-30, -1000};
    for (int s = 0; s < 2; s++)
        for (int beta_one = 0; beta_one < 2; beta_one++) {
            Tensor *x[N_IN];
            kda_inputs(x, B, T, H, dk, dv, MILD, true, 700 + s);
            for (int64_t i = 0; i < x[IG]->numel; i++) x[IG]->data[i] = i % 2 ? 0 : (real)strong[s];
            if (beta_one)
                for (int64_t i = 0; i < x[IBETA]->numel; i++) x[IBETA]->data[i] = (real)(1 - 1e-4 * (1 + i % 3));
            int *docs = random_docs(B, T, 800 + s);
            char label[96];
            snprintf(label, sizeof label, "kda g in {0, %g}%s", strong[s], beta_one ? " beta~1" : "");
            check_forms_agree(x, H, T, 32, NULL, label);
            check_forms_agree(x, H, T, 64, docs, label);
            free(docs);
            free_inputs(x);
        }
    cr_log_info("kda opposite decays: chunked against recurrent, worst %.3g", worst_seen);
}

// Mild decays except in channel 3 of head 0, which decays by 40 at a few
// positions: the sub-blocks holding one (after their first row) take that
// channel per element and the others through their reference point, in the
// forward and the backward, next to sub-blocks that take the products alone
// (kda_sub_products reports it, checked on the first chunk); the forms agree.
Test(kda, chunked_equals_recurrent_one_channel_over_the_span_bound) {
    int B = 2, T = 150, H = 2, dk = 16, dv = 8, C = 64;
    Tensor *x[N_IN];
    kda_inputs(x, B, T, H, dk, dv, MILD, true, 950);
    for (int b = 0; b < B; b++)
        for (int t = 20; t < T; t += 60) x[IG]->data[((int64_t)b * T + t) * H * dk + 3] = -40;   // 20, 80, 140
    void *mem = aligned_alloc(64, kda_chunk_bytes(C, dk, dv));
    real *s0 = xcalloc((size_t)dk * dv, sizeof(real));
    KdaChunk ws;
    kda_chunk_bind(&ws, mem, C, dk, dv);
    kda_chunk_prepare(&ws, C, x[IQ]->data, x[IK]->data, x[IV]->data, x[IBETA]->data, x[IG]->data, H * dk, H * dv, H,
                      s0, NULL);
    for (int i0 = 0; i0 < C; i0 += KDA_SUB)
        cr_assert_eq(kda_sub_products(&ws, x[IQ]->data, x[IK]->data, H * dk, i0, KDA_SUB), i0 == 16,
                     "sub-block at %d", i0);
    free(s0);
    free(mem);
    int *docs = random_docs(B, T, 960);
    check_forms_agree(x, H, T, C, NULL, "kda one channel over the span bound");
    check_forms_agree(x, H, T, 32, docs, "kda one channel over the span bound");
    free(docs);
    free_inputs(x);
    cr_log_info("kda one channel over the span bound: chunked against recurrent, worst %.3g", worst_seen);
}

// Each (batch, head) is one thread's work from start to end: the results on
// 1 and 2 threads are the same bits, in both forms.
Test(kda, same_bits_on_one_and_two_threads) {
    int B = 2, T = 70, H = 2, dk = 16, dv = 16;
    int *docs = random_docs(B, T, 900);
    int saved = omp_get_max_threads();
    for (int f = 0; f < 2; f++) {
        Tensor *x[N_IN];
        kda_inputs(x, B, T, H, dk, dv, MILD, true, 910);
        KdaCtx c = {H, 32, FORMS[f], docs, false};
        omp_set_num_threads(1);
        Run a = run_fn(f_kda, x, &c);
        omp_set_num_threads(2);
        Run b = run_fn(f_kda, x, &c);
        omp_set_num_threads(saved);
        for (int k = 0; k < 2; k++)
            cr_assert_eq(memcmp(a.out[k], b.out[k], (size_t)a.n_out[k] * sizeof(real)), 0, "%s: output %d",
                         mixer_form_name(FORMS[f]), k);
        for (int i = 0; i < N_IN; i++)
            cr_assert_eq(memcmp(a.grad[i], b.grad[i], (size_t)a.n_grad[i] * sizeof(real)), 0, "%s: %s",
                         mixer_form_name(FORMS[f]), NAMES[i]);
        free_runs(&a, &b);
        free_inputs(x);
    }
    free(docs);
}

// Two segments on one tape, the first's final state the second's initial
// state: in = q, k, v, beta, g of segment 1, the same of segment 2, s0.
static int f_segments(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    const KdaCtx *c = ctx;
    Tensor *const *a = in, *const *b = in + 5;
    Tensor *s1 = NULL;
    out[0] = op_kda(tp, a[0], a[1], a[2], a[3], a[4], in[10], NULL, c->H, c->form, c->chunk, &s1);
    out[1] = op_kda(tp, b[0], b[1], b[2], b[3], b[4], s1, NULL, c->H, c->form, c->chunk, &out[2]);
    return 3;
}

// o of two segments (B, T1, F), (B, T2, F) joined along time.
static real *join_segments(const real *o1, const real *o2, int B, int T1, int T2, int F) {
    real *cat = xmalloc((size_t)B * (T1 + T2) * F * sizeof(real));
    for (int b = 0; b < B; b++) {
        memcpy(cat + (int64_t)b * (T1 + T2) * F, o1 + (int64_t)b * T1 * F, (size_t)T1 * F * sizeof(real));
        memcpy(cat + ((int64_t)b * (T1 + T2) + T1) * F, o2 + (int64_t)b * T2 * F, (size_t)T2 * F * sizeof(real));
    }
    return cat;
}

// Two segments carrying the state equal one pass over the whole sequence,
// forward and every gradient, including the one that flows through the
// carried state into the first segment and s0; in both forms.
Test(kda, state_carries_across_segments) {
    int B = 2, T = 50, T1 = 21, H = 2, dk = 8, dv = 8;
    for (int f = 0; f < 2; f++) {
        Tensor *x[N_IN], *seg[11];
        kda_inputs(x, B, T, H, dk, dv, MILD, true, 77);
        KdaCtx c = {H, 16, FORMS[f], NULL, false};
        Run whole = run_fn(f_kda, x, &c);
        for (int i = 0; i < 5; i++) {
            seg[i] = test_time_slice(x[i], 0, T1);
            seg[5 + i] = test_time_slice(x[i], T1, T - T1);
        }
        seg[10] = x[IS0];
        // The seeds run_fn used (gradcheck_run: seed 7 + k), o's split at T1.
        real *ro = test_randn((int64_t)B * T * H * dv, 7), *rs = test_randn(x[IS0]->numel, 8);
        real *ro1 = xmalloc((size_t)B * T1 * H * dv * sizeof(real));
        real *ro2 = xmalloc((size_t)B * (T - T1) * H * dv * sizeof(real));
        for (int b = 0; b < B; b++) {
            memcpy(ro1 + (int64_t)b * T1 * H * dv, ro + (int64_t)b * T * H * dv, (size_t)T1 * H * dv * sizeof(real));
            memcpy(ro2 + (int64_t)b * (T - T1) * H * dv, ro + ((int64_t)b * T + T1) * H * dv,
                   (size_t)(T - T1) * H * dv * sizeof(real));
        }
        real *out[3];
        cr_assert_eq(gradcheck_run_seeds(f_segments, seg, 11, &c, (const real *[]){ro1, ro2, rs}, out, NULL), 3);
        real *o = join_segments(out[0], out[1], B, T1, T - T1, H * dv);
        cr_assert_leq(max_rel_diff(o, whole.out[0], whole.n_out[0]), FORM_TOL);
        cr_assert_leq(max_rel_diff(out[2], whole.out[1], whole.n_out[1]), FORM_TOL);
        for (int i = 0; i < 5; i++) {
            int F = (int)(x[i]->numel / ((int64_t)B * T));
            real *gi = join_segments(seg[i]->grad, seg[5 + i]->grad, B, T1, T - T1, F);
            double e = max_rel_diff(gi, whole.grad[i], whole.n_grad[i]);
            cr_assert_leq(e, FORM_TOL, "%s: %s differs by %.3e", mixer_form_name(FORMS[f]), NAMES[i], e);
            free(gi);
        }
        double e = max_rel_diff(x[IS0]->grad, whole.grad[IS0], whole.n_grad[IS0]);
        cr_assert_leq(e, FORM_TOL, "%s: ds0 differs by %.3e", mixer_form_name(FORMS[f]), e);
        for (int i = 0; i < 10; i++) tensor_free(seg[i]);
        for (int k = 0; k < 3; k++) free(out[k]);
        free(o), free(ro), free(rs), free(ro1), free(ro2);
        free_run(&whole);
        free_inputs(x);
    }
}

// A channel whose decay is -30 per step forgets at once while the others
// remember: with s0 = 0, beta = 1 and unit keys along channels 0 and 1, the
// second token reads back only what channel 1 (g = 0) kept.
Test(kda, each_channel_decays_on_its_own) {
    for (int f = 0; f < 2; f++) {
        int dk = 2, dv = 1;
        Tensor *q = tensor_newv(false, 3, 1, 2, dk), *k = tensor_newv(false, 3, 1, 2, dk);
        Tensor *v = tensor_newv(false, 3, 1, 2, dv), *beta = tensor_newv(false, 3, 1, 2, 1);
        Tensor *g = tensor_newv(false, 3, 1, 2, dk);
        // Token 0 writes v = 3 along channel 0 and reads it; token 1 decays
        // channel 0 by exp(-30), keeps channel 1, writes v = 5 along channel 1
        // and reads both channels.
        k->data[0] = 1, v->data[0] = 3, beta->data[0] = 1, q->data[0] = 1;
        k->data[dk + 1] = 1, v->data[1] = 5, beta->data[1] = 1;
        q->data[dk + 0] = 1, q->data[dk + 1] = 1;
        g->data[dk + 0] = -30, g->data[dk + 1] = 0;
        Tensor *ts[] = {q, k, v, beta, g};
        KdaCtx c = {1, 64, FORMS[f], NULL, false};
        real *out[2];
        cr_assert_eq(gradcheck_run_seeds(f_kda, ts, 5, &c, (const real *[]){NULL, NULL}, out, NULL), 2);
        cr_assert_float_eq(out[0][0], 3, 1e-6);
        // Channel 0 kept 3 exp(-30) ~ 2.8e-13 of the first value; channel 1 holds 5.
        cr_assert_float_eq(out[0][1], 5 + 3 * exp(-30.0), 1e-6, "%s: o_1 = %g", mixer_form_name(FORMS[f]),
                           out[0][1]);
        cr_assert_float_eq(out[1][0], 3 * exp(-30.0), 1e-5 * 3 * exp(-30.0));   // S_T row 0, to 1e-5 of itself
        cr_assert_float_eq(out[1][1], 5, 1e-6);
        for (int i = 0; i < 5; i++) tensor_free(ts[i]);
        free(out[0]), free(out[1]);
    }
}

Test(kda, rejects_bad_shapes) {
    Tape tp;
    tape_init(&tp);
    Tensor *q = tensor_newv(false, 3, 1, 4, 8), *v = tensor_newv(false, 3, 1, 4, 6);
    Tensor *bt = tensor_newv(false, 3, 1, 4, 2);
    cr_assert(EXPECT_FAILURE(op_kda(&tp, q, q, v, bt, bt, NULL, NULL, 2, MIXER_FORM_CHUNKED, 4, NULL)));
    cr_assert(strstr(ag_last_error(), "kda: g"), "message: %s", ag_last_error());
    cr_assert(EXPECT_FAILURE(op_kda(&tp, q, q, v, q, q, NULL, NULL, 2, MIXER_FORM_CHUNKED, 4, NULL)));
    cr_assert(strstr(ag_last_error(), "beta"), "message: %s", ag_last_error());
    cr_assert(EXPECT_FAILURE(op_kda(&tp, q, q, v, bt, q, NULL, NULL, 3, MIXER_FORM_CHUNKED, 4, NULL)));
    cr_assert(EXPECT_FAILURE(op_kda(&tp, q, q, v, bt, q, NULL, NULL, 2, MIXER_FORM_PARALLEL, 4, NULL)));
    cr_assert(EXPECT_FAILURE(op_kda(&tp, q, q, v, bt, q, NULL, NULL, 2, MIXER_FORM_RECURRENT, 0, NULL)));
    cr_assert(!EXPECT_FAILURE(op_kda(&tp, q, q, v, bt, q, NULL, NULL, 2, MIXER_FORM_CHUNKED, 4, NULL)));
    cr_assert(!EXPECT_FAILURE(op_kda(&tp, q, q, v, bt, q, NULL, NULL, 2, MIXER_FORM_RECURRENT, 3, NULL)));
    tensor_free(q);
    tensor_free(v);
    tensor_free(bt);
    tape_free(&tp);
}
