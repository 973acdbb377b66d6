// The `attn_dsa` mixer: sparse forward, decoding, distillation gradients.
#include <math.h>
#include <string.h>

#include "attn_dsa.h"
#include "mixer.h"
#include "test_util.h"

static const char *const PREFIX = "layers.1.mixer.";

static Mixer *dsa_new(const char *kind, ParamStore *ps, int D, int topk, uint64_t seed) {
    params_init(ps);
    MixerConfig cfg = mixer_config_default(D, 2, 4, 4);
    cfg.out_std = 0.3;
    cfg.index_heads = 2;
    cfg.index_dim = 4;
    cfg.topk = topk;
    Mixer *m = mixer_create(kind, &cfg, ps, PREFIX);
    params_finalize(ps, seed);
    return m;
}

static Tensor *param(ParamStore *ps, const char *name) {
    char full[64];
    snprintf(full, sizeof full, "%s%s", PREFIX, name);
    Tensor *p = params_find(ps, full);
    cr_assert_not_null(p, "parameter %s", full);
    return p;
}

// Decode token by token and compare with the parallel forward at every
// position, on device_default() (AG_DEVICE=cuda: the GPU).
static void check_decode(Mixer *m, ParamStore *ps, int B, int T, int D, uint64_t seed) {
    Tensor *u = tensor_newv(false, 3, B, T, D);
    fill_normal(u, seed, 1.0);
    int t = -1, b = -1;
    double d = test_mixer_decode_docs_diff(m, ps, u, NULL, &t, &b);
    cr_assert_leq(d, DECODE_TOL, "topk %d, position %d, batch %d: step vs forward %.3e", m->cfg.topk, t, b, d);
    tensor_free(u);
}

Test(attn_dsa, decode_equals_parallel_forward) {
    ParamStore ps;
    Mixer *m = dsa_new("attn_dsa", &ps, 16, 8, 1);   // T = 40 > topk: the sparse path
    check_decode(m, &ps, 2, 40, 16, 2);
    mixer_destroy(m);
    params_free(&ps);
    m = dsa_new("attn_dsa", &ps, 16, 64, 3);          // topk >= T: dense forward, sparse decode
    check_decode(m, &ps, 2, 20, 16, 4);
    mixer_destroy(m);
    params_free(&ps);
}

// attn and attn_dsa over the same input (inputs: u, then a's and d's
// parameters, moved to device_default() for the call): attn_dsa at its
// topk, then at topk = T.
typedef struct PairCtx {
    Mixer *a, *d;
    int topk_T;
} PairCtx;

static int f_pair(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)n;
    PairCtx *c = ctx;
    out[0] = c->a->kind->forward(tp, c->a, in[0], NULL, NULL, NULL);
    out[1] = c->d->kind->forward(tp, c->d, in[0], NULL, NULL, NULL);
    int topk = c->d->cfg.topk;
    c->d->cfg.topk = c->topk_T;
    out[2] = c->d->kind->forward(tp, c->d, in[0], NULL, NULL, NULL);
    c->d->cfg.topk = topk;
    return 3;
}

Test(attn_dsa, topk_at_least_T_equals_attn) {
    ParamStore pa, pd;
    Mixer *a = dsa_new("attn", &pa, 16, 64, 5), *d = dsa_new("attn_dsa", &pd, 16, 64, 6);
    const char *names[] = {"wq", "wk", "wv", "wo"};
    for (int i = 0; i < 4; i++)
        memcpy(param(&pd, names[i])->data, param(&pa, names[i])->data, param(&pa, names[i])->numel * sizeof(real));
    Tensor *u = tensor_newv(false, 3, 2, 30, 16);
    fill_normal(u, 7, 1.0);
    int n = 1 + pa.n + pd.n;
    Tensor **in = xcalloc((size_t)n, sizeof *in);
    in[0] = u;
    memcpy(in + 1, pa.params, (size_t)pa.n * sizeof *in);
    memcpy(in + 1 + pa.n, pd.params, (size_t)pd.n * sizeof *in);
    // topk 64 >= T: the dense forward; with topk = 30 = T the indexer runs in
    // the sparse op and must give the same.
    PairCtx c = {a, d, 30};
    real *y[3];
    int64_t ny[3];
    gradcheck_run_seeds(f_pair, in, n, &c, (const real *[]){NULL, NULL, NULL}, y, ny);
    cr_assert(ny[1] == ny[0] && ny[2] == ny[0]);
    cr_assert_leq(max_rel_diff(y[0], y[1], ny[0]), FORM_TOL);
    cr_assert_leq(max_rel_diff(y[0], y[2], ny[0]), FORM_TOL);
    for (int k = 0; k < 3; k++) free(y[k]);
    free(in);
    tensor_free(u);
    mixer_destroy(a);
    mixer_destroy(d);
    params_free(&pa);
    params_free(&pd);
}

static int f_layer(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    Mixer *m = ctx;
    out[0] = m->kind->forward(tp, m, in[0], NULL, NULL, NULL);
    return 1;
}

Test(attn_dsa, sparse_layer_gradcheck) {
    // The selection is piecewise constant in u. The weights wq..wo do not move
    // it, so they are checked in both precisions; u moves the indexer scores,
    // and a float32 step (1e-2) could swap two nearly tied positions: u is
    // checked in float64 only. The indexer weights get no gradient here.
    ParamStore ps;
    Mixer *m = dsa_new("attn_dsa", &ps, 8, 3, 8);
    Tensor *u = tensor_newv(sizeof(real) == 8, 3, 2, 9, 8);
    fill_normal(u, 9, 1.0);
    Tensor *in[] = {u, param(&ps, "wq"), param(&ps, "wk"), param(&ps, "wv"), param(&ps, "wo")};
    GradcheckOptions o = gradcheck_defaults();
    o.fixed = ps.params;   // the indexer's weights too (on the GPU they move with the inputs)
    o.n_fixed = ps.n;
    GradcheckResult r = gradcheck("attn_dsa layer", f_layer, in, 5, m, &o);
    ASSERT_GRADCHECK(r, "attn_dsa layer");
    for (const char *nm[] = {"wq_idx", "wk_idx", "ww_idx"}, **p = nm; p < nm + 3; p++) {
        Tensor *w = param(&ps, *p);
        for (int64_t i = 0; i < w->numel; i++) cr_assert_eq(w->grad[i], 0, "%s", *p);
    }
    tensor_free(u);
    mixer_destroy(m);
    params_free(&ps);
}

#ifdef AG_DOUBLE
static int f_kl(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    Mixer *m = ctx;
    m->kind->forward(tp, m, in[0], NULL, NULL, NULL);
    out[0] = attn_dsa_last_kl(m);
    return 1;
}
#endif

Test(attn_dsa, distillation_moves_only_the_indexer) {
    ParamStore ps;
    Mixer *m = dsa_new("attn_dsa", &ps, 8, 3, 10);
    attn_dsa_set_distill(m, true);
    Tensor *u = tensor_newv(true, 3, 2, 9, 8);
    fill_normal(u, 11, 1.0);
    Tape tp;
    tape_init(&tp);
    params_zero_grad(&ps);
    m->kind->forward(&tp, m, u, NULL, NULL, NULL);
    Tensor *kl = attn_dsa_last_kl(m);
    cr_assert_not_null(kl);
    cr_assert_gt(kl->data[0], 0);
    double mass = attn_dsa_last_mass(m);
    cr_assert(mass > 0 && mass < 1, "kept mass %.4f", mass);
    tape_backward(&tp, kl);
    for (const char *nm[] = {"wq", "wk", "wv", "wo"}, **p = nm; p < nm + 4; p++) {
        Tensor *w = param(&ps, *p);
        for (int64_t i = 0; i < w->numel; i++) cr_assert_eq(w->grad[i], 0, "%s", *p);
    }
    for (int64_t i = 0; i < u->numel; i++) cr_assert_eq(u->grad[i], 0, "stop_gradient(u)");
    for (const char *nm[] = {"wq_idx", "wk_idx", "ww_idx"}, **p = nm; p < nm + 3; p++) {
        Tensor *w = param(&ps, *p);
        double ss = 0;
        for (int64_t i = 0; i < w->numel; i++) ss += (double)w->grad[i] * w->grad[i];
        cr_assert_gt(ss, 0, "%s gets a gradient", *p);
    }
    tape_free(&tp);
#ifdef AG_DOUBLE
    // The KL's gradient to the indexer weights, through RoPE and the ReLU
    // scores. Float64 only: a float32 step would cross the ReLU kinks (the
    // kernel-level check in test_dsa.c covers float32 with kink-safe inputs).
    u->requires_grad = false;
    Tensor *in[] = {u, param(&ps, "wq_idx"), param(&ps, "wk_idx"), param(&ps, "ww_idx")};
    GradcheckOptions o = gradcheck_defaults();
    o.fixed = ps.params;
    o.n_fixed = ps.n;
    GradcheckResult r = gradcheck("attn_dsa kl", f_kl, in, 4, m, &o);
    ASSERT_GRADCHECK(r, "attn_dsa kl");
#endif
    tensor_free(u);
    mixer_destroy(m);
    params_free(&ps);
}

#include "lm.h"

// max |a - b| / max |b|: the logits' difference relative to their scale. The
// elementwise max_rel_diff floors at 1e-3 of the scale, where one float32
// rounding of the largest logit (6e-8 of it) already reads as 6e-5 on a logit
// near zero: measured up to 1.2e-4 for this two-layer model, i.e. 2 ulps.
static double diff_to_scale(const real *a, const real *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return num / den;
}

Test(attn_dsa, lm_decode_equals_forward_logits) {
    // A two-layer LM (attn, then attn_dsa with topk 5 < T): logits decoded
    // token by token equal the parallel forward's at every position.
    int B = 2, T = 24, V = 11, D = 16;
    LMConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab_size = V;
    cfg.d_model = D;
    cfg.d_ff = 32;
    cfg.norm_eps = 1e-6;
    cfg.mixer = mixer_config_default(D, 2, 8, 8);
    cfg.mixer.index_heads = 2;
    cfg.mixer.index_dim = 4;
    cfg.mixer.topk = 5;
    Status st = lm_parse_layers(&cfg, "attn,attn_dsa");
    cr_assert(st.ok, "%s", st.msg);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 12);
    int tokens[2 * 24];
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 7 + 3) % V;
    Device dev = device_default();   // AG_DEVICE=cuda: both on the GPU
    params_to_device(&ps, dev);
    real *logits = NULL, *steps = test_lm_decode_logits_docs(&lm, dev, tokens, NULL, B, T, &logits);
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++) {
            double d = diff_to_scale(steps + ((int64_t)t * B + b) * V, logits + ((int64_t)b * T + t) * V, V);
            cr_assert_leq(d, DECODE_TOL, "position %d, batch %d: %.3e", t, b, d);
        }
    free(steps), free(logits);
    lm_destroy(&lm);
    params_free(&ps);
}

// u (1, T, D) through a recording cache, in windows of the given lengths
// (each through the kind's prefill, stepped where the prefill declines; a
// length 1 is a step), the row reset (a document begins) at position
// reset_at (-1: never; a window begins there): the record (T, topk).
static int *record_windows(Mixer *m, const Tensor *u, Device d, const int *len, int n_len, int reset_at) {
    int T = u->shape[1], D = u->shape[2], K = m->cfg.topk;
    int *rec = xmalloc((size_t)T * K * sizeof(int));
    for (int i = 0; i < T * K; i++) rec[i] = DSA_REC_NONE;
    attn_dsa_record(m, rec, T);
    void *cache = m->kind->cache_new(m, 1, T, d);
    Tape tp;
    tape_init_on(&tp, d);
    tape_no_grad_push(&tp);
    int t0 = 0;
    for (int w = 0; w < n_len; w++) {
        int n = len[w];
        if (t0 == reset_at) m->kind->cache_reset(m, cache, 0);
        Tensor *x = tape_tensor_copy(&tp, 3, (int[]){1, n, D}, u->data + (int64_t)t0 * D);
        if (n == 1 || !m->kind->prefill(&tp, m, cache, x))
            for (int t = t0; t < t0 + n; t++)
                m->kind->step(&tp, m, cache, tape_tensor_copy(&tp, 3, (int[]){1, 1, D}, u->data + (int64_t)t * D));
        tape_reset(&tp);
        t0 += n;
    }
    cr_assert_eq(t0, T);
    attn_dsa_record(m, NULL, 0);
    m->kind->cache_free(cache);
    tape_free(&tp);
    return rec;
}

// generate --check's replay (attn_dsa.h): decoding records each position's
// picks, through steps and through prefill windows alike; the parallel
// forward replaying them is the forward itself when they are its own; a
// pick changed by hand moves that row's output alone and is reported with a
// positive score gap; a pick that is no candidate is reported as infinite
// and not replayed.
Test(attn_dsa, replay_of_decoding_picks) {
    ParamStore ps;
    int T = 40, D = 16, K = 8;
    Mixer *m = dsa_new("attn_dsa", &ps, D, K, 21);
    Device d = device_default();
    if (d != DEVICE_CPU) params_to_device(&ps, d);
    Tensor *u = tensor_newv(false, 3, 1, T, D);
    fill_normal(u, 22, 1.0);
    int steps[40];
    for (int i = 0; i < T; i++) steps[i] = 1;
    int *rec = record_windows(m, u, d, steps, T, -1);
    int *win = record_windows(m, u, d, (int[]){24, 16}, 2, -1);   // a fresh window, then one after cached keys
    for (int t = 0; t < T; t++) {
        cr_assert_neq(rec[t * K], DSA_REC_NONE, "position %d not recorded", t);
        for (int i = 0; i < K; i++)
            cr_assert_eq(rec[t * K + i], win[t * K + i], "position %d pick %d: steps %d, windows %d", t, i,
                         rec[t * K + i], win[t * K + i]);
        for (int i = 0; i < K; i++)   // the first rows: every candidate, then -1
            if (t < K) cr_assert_eq(rec[t * K + i], i <= t ? i : -1, "position %d pick %d", t, i);
    }
    real *y0 = test_mixer_forward_host(m, u, NULL, d);
    attn_dsa_replay(m, rec, T);
    real *y1 = test_mixer_forward_host(m, u, NULL, d);
    DsaReplayReport r = attn_dsa_replay_report(m);
    cr_assert(r.rows == T && r.differ == 0, "rows %lld, differ %lld", (long long)r.rows, (long long)r.differ);
    cr_assert(!memcmp(y0, y1, (size_t)T * D * sizeof(real)), "replaying the forward's own picks changed it");
    // Row 30 takes the first candidate it lacks in place of its first pick.
    int t = 30, *row = rec + t * K, s = 0;
    for (int i = 0; i < K && row[i] == s; i++) s++;   // the picks are ascending
    int changed[8], n = 0;
    for (int i = 1; i < K; i++) changed[n++] = row[i];
    int at = 0;
    while (at < n && changed[at] < s) at++;
    memmove(changed + at + 1, changed + at, (size_t)(n - at) * sizeof(int));
    changed[at] = s;
    memcpy(row, changed, sizeof changed);
    attn_dsa_replay(m, rec, T);
    real *y2 = test_mixer_forward_host(m, u, NULL, d);
    r = attn_dsa_replay_report(m);
    cr_assert(r.rows == T && r.differ == 1 && r.worst_row == t, "rows %lld, differ %lld at %lld", (long long)r.rows,
              (long long)r.differ, (long long)r.worst_row);
    cr_assert(r.worst > 0 && isfinite(r.worst), "gap %g", r.worst);
    for (int p = 0; p < T; p++) {
        bool same = !memcmp(y0 + p * D, y2 + p * D, (size_t)D * sizeof(real));
        cr_assert(p == t ? !same : same, "position %d: %s", p, same ? "unchanged" : "changed");
    }
    row[K - 1] = t + 1;   // a key after the query: no selection
    attn_dsa_replay(m, rec, T);
    real *y3 = test_mixer_forward_host(m, u, NULL, d);
    r = attn_dsa_replay_report(m);
    cr_assert(r.differ == 1 && r.worst_row == t && isinf(r.worst), "differ %lld, gap %g", (long long)r.differ,
              r.worst);
    cr_assert(!memcmp(y0, y3, (size_t)T * D * sizeof(real)), "a pick that is no candidate was replayed");
    attn_dsa_replay(m, NULL, 0);
    free(y0), free(y1), free(y2), free(y3), free(rec), free(win);
    tensor_free(u);
    mixer_destroy(m);
    params_free(&ps);
}

// The user's path through documents: generate resets the row where a
// document begins (after an end-of-text token) and its parallel forward
// flags the same position. The record keeps the cache's slots, a query
// after the start picks only keys of its own document, and the forward over
// the same documents replays the picks as its own, through steps and
// through windows (fresh, fresh after the reset, after cached keys) alike.
Test(attn_dsa, replay_across_a_document_start) {
    ParamStore ps;
    int T = 40, D = 16, K = 8, f = 20;
    Mixer *m = dsa_new("attn_dsa", &ps, D, K, 31);
    Device d = device_default();
    if (d != DEVICE_CPU) params_to_device(&ps, d);
    Tensor *u = tensor_newv(false, 3, 1, T, D);
    fill_normal(u, 32, 1.0);
    int steps[40], docs[40] = {0};
    for (int i = 0; i < T; i++) steps[i] = 1;
    docs[f] = 1;
    int *rec = record_windows(m, u, d, steps, T, f);
    int *win = record_windows(m, u, d, (int[]){f, 12, 8}, 3, f);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < K; i++) {
            int p = rec[t * K + i];
            cr_assert_eq(p, win[t * K + i], "position %d pick %d: steps %d, windows %d", t, i, p, win[t * K + i]);
            if (t >= f) cr_assert(p == -1 || (p >= f && p <= t), "position %d picks %d outside its document", t, p);
            if (t >= f && t - f < K) cr_assert_eq(p, i <= t - f ? f + i : -1, "position %d pick %d", t, i);
        }
    real *y0 = test_mixer_forward_host(m, u, docs, d);
    attn_dsa_replay(m, rec, T);
    real *y1 = test_mixer_forward_host(m, u, docs, d);
    DsaReplayReport r = attn_dsa_replay_report(m);
    attn_dsa_replay(m, NULL, 0);
    cr_assert(r.rows == T && r.differ == 0, "rows %lld, differ %lld (row %lld, gap %g)", (long long)r.rows,
              (long long)r.differ, (long long)r.worst_row, r.worst);
    cr_assert(!memcmp(y0, y1, (size_t)T * D * sizeof(real)), "replaying the forward's own picks changed it");
    free(y0), free(y1), free(rec), free(win);
    tensor_free(u);
    mixer_destroy(m);
    params_free(&ps);
}
