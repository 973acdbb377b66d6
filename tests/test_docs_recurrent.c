// Document boundaries (docs.h) in the recurrent ops: op_gla (linear, mamba)
// in its three forms and op_gdn in its two. Packed rows against one call per
// document (outputs, final state, and the gradients of q, k, v, g, dt or
// beta, s0), in the decay regimes of test_gla.c / test_gdn.c, and gradient
// checks with boundaries at position 0, at chunk edges, inside chunks
// (several in one) and at the last position (docs_pattern).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gdn_kernel.h"
#include "gla.h"
#include "test_docs_util.h"

static const MixerForm GLA_FORMS[] = {MIXER_FORM_PARALLEL, MIXER_FORM_CHUNKED, MIXER_FORM_RECURRENT};

typedef struct Regime {
    const char *name;
    double lo, hi;   // g uniform in [lo, hi]
} Regime;
static const Regime REGIMES[] = {{"mild", -0.7, -0.05}, {"zero", 0, 0}, {"strong", -21, -19}};

// ---- op_gla ----

enum { GQ, GK, GV, GG, GDT, GS0, G_N };
static const DocsInKind GLA_KINDS[G_N] = {DOCS_SEQ, DOCS_SEQ, DOCS_SEQ, DOCS_SEQ, DOCS_SEQ, DOCS_ROW};

typedef struct GlaCtx {
    int H, chunk;
    MixerForm form;
    bool gated;   // mamba's call (g and dt), else linear's (neither)
} GlaCtx;

static int f_gla(Tape *tp, Tensor *const *in, const int *doc_start, void *ctx, Tensor **out) {
    const GlaCtx *c = ctx;
    out[0] = op_gla_dt(tp, in[GQ], in[GK], in[GV], c->gated ? in[GG] : NULL, c->gated ? in[GDT] : NULL, in[GS0],
                       doc_start, c->H, c->form, c->chunk, &out[1]);
    return 2;
}

static void gla_inputs(Tensor **x, int B, int T, int H, int dk, int dv, Regime r, bool gated, uint64_t seed) {
    test_gla_inputs(x, B, T, H, dk, dv, gated, gated, true, r.lo, r.hi, seed);
}

static void free_all(Tensor **x, int n) {
    for (int i = 0; i < n; i++) tensor_free(x[i]);
}

Test(docs_recurrent, gla_packed_equals_separate_every_form_and_regime) {
    int B = 2, T = 11, C = 4, H = 2;
    int *docs = docs_pattern(T, C);
    for (int gated = 0; gated < 2; gated++)
        for (size_t r = 0; r < (gated ? 3 : 1); r++)
            for (size_t f = 0; f < 3; f++) {
                Tensor *x[G_N];
                gla_inputs(x, B, T, H, 3, 4, REGIMES[r], gated, 100 + r);
                GlaCtx ctx = {H, C, GLA_FORMS[f], gated};
                DocsFn fn = {f_gla, &ctx, G_N, GLA_KINDS};
                char label[96];
                snprintf(label, sizeof label, "gla %s %s%s", mixer_form_name(GLA_FORMS[f]),
                         gated ? "gated " : "plain", gated ? REGIMES[r].name : "");
                docs_check_packed(&fn, x, docs, B, T, FORM_TOL, label);
                free_all(x, G_N);
            }
    free(docs);
}

// Heads and chunks of whole vectors (the chunks' products through tile_mm),
// a partial last chunk, and a boundary in every chunk.
Test(docs_recurrent, gla_packed_equals_separate_tile_sized) {
    int B = 2, T = 37, C = 16, H = 2;
    int *docs = docs_pattern(T, C);
    for (size_t f = 0; f < 3; f++) {
        Tensor *x[G_N];
        gla_inputs(x, B, T, H, 16, 32, REGIMES[0], true, 200);
        GlaCtx ctx = {H, C, GLA_FORMS[f], true};
        DocsFn fn = {f_gla, &ctx, G_N, GLA_KINDS};
        char label[64];
        snprintf(label, sizeof label, "gla tile-sized %s", mixer_form_name(GLA_FORMS[f]));
        docs_check_packed(&fn, x, docs, B, T, FORM_TOL, label);
        free_all(x, G_N);
    }
    free(docs);
}

Test(docs_recurrent, gla_gradcheck_with_boundaries) {
    int B = 2, T = 11, C = 4, H = 2;
    int *docs = docs_pattern(T, C);
    for (int gated = 0; gated < 2; gated++)
        for (size_t f = 0; f < 3; f++) {
            Tensor *x[G_N];
            gla_inputs(x, B, T, H, 3, 4, REGIMES[0], gated, 300);
            GlaCtx ctx = {H, C, GLA_FORMS[f], gated};
            DocsFn fn = {f_gla, &ctx, G_N, GLA_KINDS};
            char label[64];
            snprintf(label, sizeof label, "gla %s %s", mixer_form_name(GLA_FORMS[f]), gated ? "gated" : "plain");
            docs_gradcheck(&fn, x, docs, NULL, label);
            free_all(x, G_N);
        }
    free(docs);
}

// With g = -20 per step, a chunk's cumulative log decay reaches -80 within
// a few positions and documents restart inside it: every output and gradient
// stays finite (the masked factors are zeros, not exp(-inf - -inf)), and a
// document's first output is exactly its own term dt q.k v (the state before
// it is not read).
Test(docs_recurrent, gla_strong_decay_restart_is_exact) {
    int B = 2, T = 11, C = 8, H = 1, dk = 2, dv = 2;
    int *docs = docs_pattern(T, 4);
    real *ones = test_ones((int64_t)B * T * H * dv);   // the seeds of sum(o) + sum(S_T)
    for (size_t f = 0; f < 3; f++) {
        Tensor *x[G_N];
        gla_inputs(x, B, T, H, dk, dv, (Regime){"", -20, -20}, true, 400);
        GlaCtx ctx = {H, C, GLA_FORMS[f], true};
        DocsFn fn = {f_gla, &ctx, G_N, GLA_KINDS};
        real *out[2];
        docs_run(&fn, x, docs, (const real *[]){ones, ones}, out, NULL);   // (S_T: B H dk dv <= B T H dv)
        const real *o = out[0];
        const char *form = mixer_form_name(GLA_FORMS[f]);
        for (int i = 0; i < G_N; i++)
            for (int64_t e = 0; x[i]->grad && e < x[i]->numel; e++)
                cr_assert(isfinite(x[i]->grad[e]), "%s: gradient of input %d not finite", form, i);
        for (int64_t r = 0; r < (int64_t)B * T; r++) {
            if (!docs[r]) continue;
            const real *q = x[GQ]->data + r * dk, *k = x[GK]->data + r * dk, *v = x[GV]->data + r * dv;
            double qk = q[0] * k[0] + q[1] * k[1], dt = x[GDT]->data[r];
            for (int j = 0; j < dv; j++)
                cr_assert_float_eq(o[r * dv + j], dt * qk * v[j], 1e3 * REAL_EPS * (1 + fabs(dt * qk * v[j])),
                                   "%s: row %lld, a document's first output", form, (long long)r);
            // (The masked forms sum terms that cancel to rounding; so does every
            // form on the GPU, where op_gla runs chunks of 64 whatever the form.)
            if (GLA_FORMS[f] == MIXER_FORM_RECURRENT && device_default() == DEVICE_CPU)
                cr_assert_eq(x[GG]->grad[r], 0, "g at a document start multiplies nothing");
        }
        for (int64_t e = 0; e < x[GS0]->numel / B; e++)   // row 0 flags position 0: s0 not read
            cr_assert_eq(x[GS0]->grad[e], 0);
        free(out[0]), free(out[1]);
        free_all(x, G_N);
    }
    free(ones);
    free(docs);
}

// No flag anywhere is the computation without documents, bit for bit (on
// device_default(), as the tests above).
Test(docs_recurrent, gla_no_flag_equals_null) {
    int B = 2, T = 11, H = 2;
    int none[22] = {0};
    for (size_t f = 0; f < 3; f++) {
        Tensor *x[G_N];
        gla_inputs(x, B, T, H, 3, 4, REGIMES[0], true, 500);
        GlaCtx ctx = {H, 4, GLA_FORMS[f], true};
        DocsFn fn = {f_gla, &ctx, G_N, GLA_KINDS};
        real *a[2], *b[2];
        int64_t n[2];
        docs_run(&fn, x, NULL, (const real *[]){NULL, NULL}, a, n);
        docs_run(&fn, x, none, (const real *[]){NULL, NULL}, b, NULL);
        cr_assert_eq(memcmp(a[0], b[0], (size_t)n[0] * sizeof(real)), 0);
        cr_assert_eq(memcmp(a[1], b[1], (size_t)n[1] * sizeof(real)), 0);
        free(a[0]), free(a[1]), free(b[0]), free(b[1]);
        free_all(x, G_N);
    }
}

// ---- op_gdn ----

static const MixerForm GDN_FORMS[] = {MIXER_FORM_CHUNKED, MIXER_FORM_RECURRENT};
enum { DQ, DK, DV, DBETA, DG, DS0, D_N };
static const DocsInKind GDN_KINDS[D_N] = {DOCS_SEQ, DOCS_SEQ, DOCS_SEQ, DOCS_SEQ, DOCS_SEQ, DOCS_ROW};

typedef struct GdnCtx {
    int H, chunk;
    MixerForm form;
} GdnCtx;

static int f_gdn(Tape *tp, Tensor *const *in, const int *doc_start, void *ctx, Tensor **out) {
    const GdnCtx *c = ctx;
    out[0] = op_gdn(tp, in[DQ], in[DK], in[DV], in[DBETA], in[DG], in[DS0], doc_start, c->H, c->form, c->chunk,
                    &out[1]);
    return 2;
}

typedef enum { GDN_PLAIN, GDN_G_ZERO, GDN_G_M20, GDN_BETA_1, GDN_N_REGIMES } GdnRegime;
static const char *const GDN_REGIME_NAMES[] = {"plain", "g=0", "g~-20", "beta~1"};

// As test_gdn.c: q, k L2-normalised per head (q scaled by 1/sqrt(dk)).
static void gdn_inputs(Tensor **x, int B, int T, int H, int dk, int dv, GdnRegime reg, uint64_t seed) {
    x[DQ] = tensor_newv(true, 3, B, T, H * dk);
    x[DK] = tensor_newv(true, 3, B, T, H * dk);
    x[DV] = tensor_newv(true, 3, B, T, H * dv);
    x[DBETA] = tensor_newv(true, 3, B, T, H);
    x[DG] = tensor_newv(true, 3, B, T, H);
    x[DS0] = tensor_newv(true, 4, B, H, dk, dv);
    fill_normal(x[DQ], seed + 1, 1.0);
    fill_normal(x[DK], seed + 2, 1.0);
    fill_normal(x[DV], seed + 3, 1.0);
    fill_normal(x[DS0], seed + 4, 0.5);
    for (int i = DQ; i <= DK; i++)
        for (int64_t r = 0; r < x[i]->numel / dk; r++) {
            real *z = x[i]->data + r * dk;
            double ss = 0;
            for (int c = 0; c < dk; c++) ss += (double)z[c] * z[c];
            double sc = (i == DQ ? 1.0 / sqrt(dk) : 1.0) / sqrt(ss + 1e-6);
            for (int c = 0; c < dk; c++) z[c] = (real)(z[c] * sc);
        }
    Rng r;
    rng_seed(&r, seed + 5);
    for (int64_t i = 0; i < x[DBETA]->numel; i++) {
        double u = rng_uniform(&r), bt = 1.0 / (1.0 + exp(-rng_normal(&r))), gt = -rng_range(&r, 0.01, 1.0);
        if (reg == GDN_G_ZERO) gt = 0;
        if (reg == GDN_G_M20) gt = -20 + u;
        if (reg == GDN_BETA_1) bt = 1 - 1e-4 * (0.5 + u);
        x[DBETA]->data[i] = (real)bt;
        x[DG]->data[i] = (real)gt;
    }
}

Test(docs_recurrent, gdn_packed_equals_separate_every_form_and_regime) {
    int B = 2, T = 11, C = 4, H = 2;
    int *docs = docs_pattern(T, C);
    for (int reg = 0; reg < GDN_N_REGIMES; reg++)
        for (size_t f = 0; f < 2; f++) {
            Tensor *x[D_N];
            gdn_inputs(x, B, T, H, 4, 3, reg, 600 + reg);
            GdnCtx ctx = {H, C, GDN_FORMS[f]};
            DocsFn fn = {f_gdn, &ctx, D_N, GDN_KINDS};
            char label[64];
            snprintf(label, sizeof label, "gdn %s %s", mixer_form_name(GDN_FORMS[f]), GDN_REGIME_NAMES[reg]);
            docs_check_packed(&fn, x, docs, B, T, FORM_TOL, label);
            free_all(x, D_N);
        }
    free(docs);
}

Test(docs_recurrent, gdn_packed_equals_separate_tile_sized) {
    int B = 2, T = 37, C = 16, H = 2;
    int *docs = docs_pattern(T, C);
    for (size_t f = 0; f < 2; f++) {
        Tensor *x[D_N];
        gdn_inputs(x, B, T, H, 16, 32, GDN_PLAIN, 700);
        GdnCtx ctx = {H, C, GDN_FORMS[f]};
        DocsFn fn = {f_gdn, &ctx, D_N, GDN_KINDS};
        char label[64];
        snprintf(label, sizeof label, "gdn tile-sized %s", mixer_form_name(GDN_FORMS[f]));
        docs_check_packed(&fn, x, docs, B, T, FORM_TOL, label);
        free_all(x, D_N);
    }
    free(docs);
}

Test(docs_recurrent, gdn_gradcheck_with_boundaries) {
    int B = 2, T = 11, C = 4, H = 2;
    int *docs = docs_pattern(T, C);
    for (size_t f = 0; f < 2; f++) {
        Tensor *x[D_N];
        gdn_inputs(x, B, T, H, 4, 3, GDN_PLAIN, 800);
        GdnCtx ctx = {H, C, GDN_FORMS[f]};
        DocsFn fn = {f_gdn, &ctx, D_N, GDN_KINDS};
        char label[64];
        snprintf(label, sizeof label, "gdn %s", mixer_form_name(GDN_FORMS[f]));
        docs_gradcheck(&fn, x, docs, NULL, label);
        free_all(x, D_N);
    }
    free(docs);
}

// As for gla: at g = -20 every value stays finite and a document's first
// output is its own term, beta (q.k) v (delta = beta v: nothing to subtract).
Test(docs_recurrent, gdn_strong_decay_restart_is_exact) {
    int B = 2, T = 11, H = 1, dk = 2, dv = 2;
    int *docs = docs_pattern(T, 4);
    real *ones = test_ones((int64_t)B * T * H * dv);   // the seeds of sum(o) + sum(S_T)
    for (size_t f = 0; f < 2; f++) {
        Tensor *x[D_N];
        gdn_inputs(x, B, T, H, dk, dv, GDN_G_M20, 900);
        GdnCtx ctx = {H, 8, GDN_FORMS[f]};
        DocsFn fn = {f_gdn, &ctx, D_N, GDN_KINDS};
        real *out[2];
        docs_run(&fn, x, docs, (const real *[]){ones, ones}, out, NULL);   // (S_T: B H dk dv <= B T H dv)
        const real *o = out[0];
        const char *form = mixer_form_name(GDN_FORMS[f]);
        for (int i = 0; i < D_N; i++)
            for (int64_t e = 0; e < x[i]->numel; e++)
                cr_assert(isfinite(x[i]->grad[e]), "%s: gradient of input %d not finite", form, i);
        for (int64_t r = 0; r < (int64_t)B * T; r++) {
            if (!docs[r]) continue;
            const real *q = x[DQ]->data + r * dk, *k = x[DK]->data + r * dk, *v = x[DV]->data + r * dv;
            double want_s = x[DBETA]->data[r] * (q[0] * k[0] + q[1] * k[1]);
            for (int j = 0; j < dv; j++)
                cr_assert_float_eq(o[r * dv + j], want_s * v[j], 1e3 * REAL_EPS * (1 + fabs(want_s * v[j])),
                                   "%s: row %lld, a document's first output", form, (long long)r);
            if (GDN_FORMS[f] == MIXER_FORM_RECURRENT) cr_assert_eq(x[DG]->grad[r], 0);
        }
        for (int64_t e = 0; e < x[DS0]->numel / B; e++) cr_assert_eq(x[DS0]->grad[e], 0);
        free(out[0]), free(out[1]);
        free_all(x, D_N);
    }
    free(ones);
    free(docs);
}
