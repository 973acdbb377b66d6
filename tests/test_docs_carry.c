// State carried across windows (MixerKind.forward_carry, lm_forward_carry):
// consecutive windows that carry the recurrent state and the short
// convolutions' last inputs equal one window over the whole stream, in every
// recurrent mixer and form, with and without document boundaries (inside a
// window, at a window's first position, and within the convolution's reach
// of a window's end); the carry then continues as a decoding cache.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lm.h"
#include "test_docs_util.h"

enum { D = 8, H = 2, DK = 4, DV = 4, CHUNK = 4, B = 2 };

// Windows of 6, 2 (shorter than the convolution's history of 3) and 6
// positions, then 3 decoded ones.
static const int WINDOWS[] = {6, 2, 6};
enum { N_WIN = 3, T_WIN = 14, T_ALL = 17 };

// Boundaries: row 0 at 0, inside window 0, at the first position of window 1
// and window 2's position 3; row 1 at position 4 (within the convolution's
// reach of window 0's end: the carried inputs before it must be dropped),
// inside window 2 and at the first decoded position.
static void make_docs(int *d) {
    memset(d, 0, (size_t)B * T_ALL * sizeof(int));
    int row0[] = {0, 3, 6, 11}, row1[] = {4, 12, 14};
    for (size_t i = 0; i < sizeof row0 / sizeof row0[0]; i++) d[row0[i]] = 1;
    for (size_t i = 0; i < sizeof row1 / sizeof row1[0]; i++) d[T_ALL + row1[i]] = 1;
}

static Mixer *mixer_make(ParamStore *ps, const char *kind, MixerForm form, int conv, uint64_t seed) {
    MixerConfig c = mixer_config_default(D, H, DK, DV);
    c.chunk_size = CHUNK;
    c.conv_size = conv;
    c.form = form;
    c.out_std = 0.3;
    params_init(ps);
    Mixer *m = mixer_create(kind, &c, ps, "mix.");
    params_finalize(ps, seed);
    Tensor *bias = params_find(ps, "mix.dt_bias");   // decay ~0.5 per step: the state carries history
    for (int h = 0; bias && h < H; h++) bias->data[h] = (real)(0.2 + 0.5 * h);
    return m;
}

// Positions [t0, t0+len) of flags (B, T) as (B, len).
static void slice_flags(int *dst, const int *src, int T, int t0, int len) {
    for (int b = 0; b < B; b++) memcpy(dst + b * len, src + b * T + t0, (size_t)len * sizeof(int));
}

static void check_mixer(const char *kind, MixerForm form, int conv, bool docs) {
    ParamStore ps;
    Mixer *m = mixer_make(&ps, kind, form, conv, 5);
    Tensor *u = tensor_newv(false, 3, B, T_ALL, D);
    fill_normal(u, 6, 1.0);
    int flags[B * T_ALL], wflags[B * T_ALL];
    make_docs(flags);
    char label[96];
    snprintf(label, sizeof label, "%s %s conv %d%s", kind, mixer_form_name(form), conv, docs ? " documents" : "");
    Tape tp;
    tape_init(&tp);
    tape_no_grad_push(&tp);
    Tensor *s_all;
    Tensor *y = m->kind->forward(&tp, m, u, docs ? flags : NULL, NULL, &s_all);   // one pass over everything
    Tensor *s_win = NULL;   // the state after the windows, from a pass over them alone
    Tensor *uw = tensor_newv(false, 3, B, T_WIN, D);
    for (int b = 0; b < B; b++)
        memcpy(uw->data + b * T_WIN * D, u->data + b * T_ALL * D, (size_t)T_WIN * D * sizeof(real));
    slice_flags(wflags, flags, T_ALL, 0, T_WIN);
    m->kind->forward(&tp, m, uw, docs ? wflags : NULL, NULL, &s_win);
    void *cache = m->kind->cache_new(m, B, 1, DEVICE_CPU);
    Tape tw;
    tape_init(&tw);
    for (int w = 0, t0 = 0; w < N_WIN; t0 += WINDOWS[w++]) {
        int n = WINDOWS[w];
        Tensor *u_w = tensor_newv(true, 3, B, n, D);   // (requires_grad: the windows train)
        for (int b = 0; b < B; b++)
            memcpy(u_w->data + b * n * D, u->data + ((int64_t)b * T_ALL + t0) * D, (size_t)n * D * sizeof(real));
        slice_flags(wflags, flags, T_ALL, t0, n);
        Tensor *y_w = m->kind->forward_carry(&tw, m, u_w, docs ? wflags : NULL, cache);
        for (int b = 0; b < B; b++) {
            double d = max_rel_diff(y_w->data + b * n * D, y->data + ((int64_t)b * T_ALL + t0) * D, (int64_t)n * D);
            cr_assert_leq(d, FORM_TOL, "%s: window %d, row %d differs from one pass by %.3e", label, w, b, d);
        }
        tape_backward(&tw, op_sum(&tw, y_w));   // a window's backward stays in the window
        tape_reset(&tw);
        tensor_free(u_w);
    }
    real *bufs[4];
    int64_t sizes[4];
    m->kind->cache_state(m, cache, bufs, sizes);
    double d = max_rel_diff(bufs[0], s_win->data, s_win->numel);
    cr_assert_leq(d, FORM_TOL, "%s: carried state after the windows differs by %.3e", label, d);
    // The carry is a decoding cache: the next positions step on from it.
    tape_no_grad_push(&tw);
    for (int t = T_WIN; t < T_ALL; t++) {
        Tensor *ut = tape_tensorv(&tw, 3, B, 1, D);
        for (int b = 0; b < B; b++) {
            if (docs && flags[b * T_ALL + t]) m->kind->cache_reset(m, cache, b);
            memcpy(ut->data + b * D, u->data + ((int64_t)b * T_ALL + t) * D, D * sizeof(real));
        }
        Tensor *yt = m->kind->step(&tw, m, cache, ut);
        for (int b = 0; b < B; b++) {
            d = max_rel_diff(yt->data + b * D, y->data + ((int64_t)b * T_ALL + t) * D, D);
            cr_assert_leq(d, DECODE_TOL, "%s: decoded position %d, row %d differs by %.3e", label, t, b, d);
        }
        tape_reset(&tw);
    }
    d = max_rel_diff(bufs[0], s_all->data, s_all->numel);
    cr_assert_leq(d, FORM_TOL, "%s: state after decoding differs by %.3e", label, d);
    m->kind->cache_free(cache);
    tape_free(&tw);
    tape_free(&tp);
    tensor_free(u);
    tensor_free(uw);
    mixer_destroy(m);
    params_free(&ps);
}

Test(docs_carry, windows_equal_one_pass_every_recurrent_mixer_and_form) {
    struct {
        const char *kind;
        MixerForm form;
    } cases[] = {{"linear", MIXER_FORM_PARALLEL}, {"linear", MIXER_FORM_CHUNKED}, {"linear", MIXER_FORM_RECURRENT},
                 {"mamba", MIXER_FORM_PARALLEL},  {"mamba", MIXER_FORM_CHUNKED},  {"mamba", MIXER_FORM_RECURRENT},
                 {"gdn", MIXER_FORM_CHUNKED},     {"gdn", MIXER_FORM_RECURRENT},
                 {"gdp", MIXER_FORM_CHUNKED},     {"gdp", MIXER_FORM_RECURRENT},
                 {"kda", MIXER_FORM_CHUNKED},     {"kda", MIXER_FORM_RECURRENT}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int docs = 0; docs < 2; docs++) check_mixer(cases[i].kind, cases[i].form, 4, docs);
    check_mixer("gdn", MIXER_FORM_CHUNKED, 0, true);   // no convolution: the state alone
    check_mixer("mamba", MIXER_FORM_CHUNKED, 2, true);  // a history of one input
}

// The LM: consecutive windows of an all-recurrent model with a carry equal
// lm_forward_docs over the whole stream; the carry's buffers are listed for
// checkpoints.
Test(docs_carry, lm_windows_equal_one_pass) {
    LMConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab_size = 11;
    cfg.d_model = D;
    cfg.d_ff = 12;
    cfg.tied = true;
    cfg.norm_eps = 1e-6;
    cfg.mixer = mixer_config_default(D, H, DK, DV);
    cfg.mixer.chunk_size = CHUNK;
    cfg.mixer.conv_size = 4;
    cr_assert(lm_parse_layers(&cfg, "gdn,mamba,linear").ok);
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &cfg, &ps);
    params_finalize(&ps, 9);
    int V = cfg.vocab_size, tokens[B * T_WIN], flags[B * T_ALL], wtok[B * T_WIN], wflags[B * T_WIN];
    for (int i = 0; i < B * T_WIN; i++) tokens[i] = (i * 7 + 3) % V;
    make_docs(flags);
    int fw[B * T_WIN];
    slice_flags(fw, flags, T_ALL, 0, T_WIN);
    for (int docs = 0; docs < 2; docs++) {
        Tape tp;
        tape_init(&tp);
        Tensor *all = lm_forward_docs(&tp, &lm, tokens, docs ? fw : NULL, B, T_WIN, NULL, NULL);
        LMCache *carry = lm_cache_new(&lm, B, 1);
        Tape tw;
        tape_init(&tw);
        for (int w = 0, t0 = 0; w < N_WIN; t0 += WINDOWS[w++]) {
            int n = WINDOWS[w];
            for (int b = 0; b < B; b++) memcpy(wtok + b * n, tokens + b * T_WIN + t0, (size_t)n * sizeof(int));
            slice_flags(wflags, fw, T_WIN, t0, n);
            Tensor *lg;
            Tensor *loss = lm_loss_carry(&tw, &lm, wtok, wtok, docs ? wflags : NULL, B, n, carry, &lg);
            for (int b = 0; b < B; b++) {
                double d = max_rel_diff(lg->data + b * n * V, all->data + ((int64_t)b * T_WIN + t0) * V,
                                        (int64_t)n * V);
                cr_assert_leq(d, FORM_TOL, "documents %d: window %d, row %d logits differ by %.3e", docs, w, b, d);
            }
            tape_backward(&tw, loss);
            tape_reset(&tw);
        }
        real *bufs[16];
        int64_t sizes[16];
        cr_assert_eq(lm_carry_buffers(&lm, carry, bufs, sizes, 16), 12, "3 layers x (S, conv q, k, v)");
        cr_assert_eq(sizes[0], (int64_t)B * H * DK * DV);
        cr_assert_eq(sizes[1], (int64_t)B * 3 * H * DK);
        lm_cache_free(&lm, carry);
        tape_free(&tw);
        tape_free(&tp);
    }
    lm_destroy(&lm);
    params_free(&ps);
}
