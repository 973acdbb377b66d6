// test_cuda_gla.c: op_gla_dt (the linear and mamba mixers) on the GPU
// against the CPU, every form: with and without g, dt and s0, the three
// decay regimes, document starts, T = 1 and T not a multiple of the GPU's
// chunk (64) or the node's, head sizes 5/6, 16/32 and 64/64, both outputs
// seeded or one, one tensor passed twice, gradients accumulated over two
// ops, and a run repeated bit for bit.
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "device.h"
#include "gla.h"

enum { IN_Q, IN_K, IN_V, IN_G, IN_DT, IN_S0, N_IN };
enum { OUT_BOTH, OUT_O, OUT_STATE };   // what f returns (each returned output is seeded)

static const MixerForm FORMS[] = {MIXER_FORM_PARALLEL, MIXER_FORM_CHUNKED, MIXER_FORM_RECURRENT};

typedef struct {
    const char *name;
    double lo, hi;   // g uniform in [lo, hi]
} Regime;
static const Regime MILD = {"mild", -0.7, -0.05}, ZERO = {"zero", 0, 0}, STRONG = {"strong", -21, -19};

typedef struct {
    int B, T, H, dk, dv, chunk;
    MixerForm form;
    bool g, dt, s0;
    const int *docs;   // (B, T) document starts, or NULL
    int outs;          // OUT_*
} Case;

static int f_gla(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const Case *c = ctx;
    Tensor *s;
    Tensor *o = op_gla_dt(tp, x[IN_Q], x[IN_K], x[IN_V], c->g ? x[IN_G] : NULL, c->dt ? x[IN_DT] : NULL,
                          c->s0 ? x[IN_S0] : NULL, c->docs, c->H, c->form, c->chunk, &s);
    int m = 0;
    if (c->outs != OUT_STATE) outs[m++] = o;
    if (c->outs != OUT_O) outs[m++] = s;
    return m;
}

// Inputs as test_gla.c makes them; an unused optional input takes no gradient.
static void make(Tensor **x, const Case *c, Regime r, uint64_t seed) {
    test_gla_inputs(x, c->B, c->T, c->H, c->dk, c->dv, c->g, c->dt, c->s0, r.lo, r.hi, seed);
}

static void free_all(Tensor **x, int n) {
    for (int i = 0; i < n; i++) tensor_free(x[i]);
}

static void check(Case c, Regime r, const char *what) {
    Tensor *x[N_IN];
    make(x, &c, r, 100 + (uint64_t)c.T);
    char label[192];
    snprintf(label, sizeof label, "gla %s: %s B %d T %d H %d dk %d dv %d chunk %d g %s dt %d s0 %d docs %d outs %d",
             what, mixer_form_name(c.form), c.B, c.T, c.H, c.dk, c.dv, c.chunk, c.g ? r.name : "none", c.dt, c.s0,
             c.docs != NULL, c.outs);
    cuda_check_op(label, f_gla, x, N_IN, &c);
    free_all(x, N_IN);
}

// Each form, with each of g, dt and s0 alone, none and all; T = 37 with
// chunks of 8 (a partial last chunk; the GPU's one chunk is partial too).
Test(cuda_gla, every_form_with_and_without_g_dt_s0) {
    bool opts[][3] = {{false, false, false}, {true, false, false}, {false, true, false},
                      {false, false, true},  {true, true, true}};
    for (size_t f = 0; f < 3; f++)
        for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++) {
            Case c = {2, 37, 3, 5, 6, 8, FORMS[f], opts[o][0], opts[o][1], opts[o][2], NULL, OUT_BOTH};
            check(c, MILD, "options");
        }
}

// The decay regimes (g = 0 and ≈ −20 per step) with every input present.
Test(cuda_gla, decay_regimes) {
    Regime rs[] = {ZERO, STRONG};
    for (size_t f = 0; f < 3; f++)
        for (size_t r = 0; r < 2; r++) {
            Case c = {2, 37, 3, 5, 6, 8, FORMS[f], true, true, true, NULL, OUT_BOTH};
            check(c, rs[r], "regime");
        }
}

// Head sizes of the mixers: dk 16 / dv 32 over 150 positions (three GPU
// chunks, the last of 22) and dk = dv = 64 over 129 (64 + 64 + 1), with
// the node's chunk 64, 32 and 16.
Test(cuda_gla, head_sizes_16_32_and_64_64) {
    Regime rs[] = {MILD, STRONG};
    for (size_t f = 0; f < 3; f++)
        for (size_t r = 0; r < 2; r++) {
            Case a = {2, 150, 2, 16, 32, 64, FORMS[f], true, true, true, NULL, OUT_BOTH};
            check(a, rs[r], "16/32");
            Case b = {1, 129, 2, 64, 64, 32, FORMS[f], true, true, true, NULL, OUT_BOTH};
            check(b, rs[r], "64/64");
        }
    // linear's call (no g, no dt, no s0) at these sizes
    Case p = {2, 150, 2, 16, 32, 16, MIXER_FORM_CHUNKED, false, false, false, NULL, OUT_BOTH};
    check(p, MILD, "16/32 plain");
    Case q = {1, 129, 2, 64, 64, 64, MIXER_FORM_RECURRENT, false, false, false, NULL, OUT_BOTH};
    check(q, MILD, "64/64 plain");
}

// Decoding: T = 1 (and 2, 3) from a state, B x H = 6.
Test(cuda_gla, decoding_steps) {
    for (int T = 1; T <= 3; T++)
        for (size_t f = 0; f < 3; f++)
            for (int gated = 0; gated < 2; gated++) {
                Case c = {3, T, 2, 16, 32, 64, FORMS[f], gated, gated, true, NULL, OUT_BOTH};
                check(c, MILD, "decoding");
            }
    Case z = {3, 1, 2, 16, 32, 64, MIXER_FORM_RECURRENT, false, false, false, NULL, OUT_BOTH};
    check(z, MILD, "decoding from zeros");
}

// Document starts: row 0 at 0 (s0 never read), at the GPU's chunk edges
// (63, 64, 65), several inside one chunk, the last position; row 1 inside
// chunks and at the node's chunk edge; row 2 none (it reads s0 throughout).
static int *docs_make(int B, int T) {
    int *d = calloc((size_t)B * T, sizeof(int));
    int r0[] = {0, 5, 6, 7, 63, 64, 65, 100, T - 1}, r1[] = {3, 16, 31, 70, 128, T - 2};
    for (size_t i = 0; i < sizeof r0 / sizeof r0[0]; i++)
        if (r0[i] < T) d[r0[i]] = 1;
    for (size_t i = 0; i < sizeof r1 / sizeof r1[0]; i++)
        if (B > 1 && r1[i] < T) d[T + r1[i]] = 1;
    return d;
}

Test(cuda_gla, document_starts) {
    int B = 3, T = 150;
    int *docs = docs_make(B, T);
    for (size_t f = 0; f < 3; f++)
        for (int gated = 0; gated < 2; gated++) {
            Case c = {B, T, 2, 8, 12, 16, FORMS[f], gated, gated, true, docs, OUT_BOTH};
            check(c, MILD, "docs");
            if (gated) check(c, STRONG, "docs");
            Case z = {B, T, 1, 16, 32, 64, FORMS[f], gated, gated, false, docs, OUT_BOTH};
            check(z, MILD, "docs, no s0");
        }
    free(docs);
}

// One output seeded: o alone (no gradient reaches the final state) and the
// final state alone (dO is NULL).
Test(cuda_gla, one_output_seeded) {
    int B = 2, T = 70;
    int *docs = docs_make(B, T);
    for (size_t f = 0; f < 3; f++)
        for (int outs = OUT_O; outs <= OUT_STATE; outs++) {
            Case c = {B, T, 2, 8, 12, 16, FORMS[f], true, true, true, NULL, outs};
            check(c, MILD, "one output");
            c.docs = docs;
            check(c, MILD, "one output");
        }
    free(docs);
}

// One tensor passed twice: q = k, q = k = v (dk = dv), g = dt. Their
// gradients land in one buffer (the second contribution added).
typedef struct {
    int H, chunk;
    MixerForm form;
    int which;   // 0: q = k; 1: q = k = v; 2: g = dt
} SameCtx;

static int f_same(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const SameCtx *c = ctx;
    Tensor *q = x[0], *k = c->which == 2 ? x[1] : x[0], *v = c->which == 1 ? x[0] : x[2];
    Tensor *g = x[3], *dt = c->which == 2 ? x[3] : x[4];
    outs[0] = op_gla_dt(tp, q, k, v, g, dt, x[5], NULL, c->H, c->form, c->chunk, &outs[1]);
    return 2;
}

Test(cuda_gla, one_tensor_passed_twice) {
    int B = 2, T = 75, H = 2, d = 8;
    for (size_t f = 0; f < 3; f++)
        for (int which = 0; which < 3; which++) {
            Tensor *x[6];   // g in [-0.7, -0.05] (also dt when g = dt: the math takes any sign)
            test_gla_inputs(x, B, T, H, d, d, true, true, true, -0.7, -0.05, 10);
            SameCtx c = {H, 16, FORMS[f], which};
            char label[64];
            snprintf(label, sizeof label, "gla %s, same tensor case %d", mixer_form_name(FORMS[f]), which);
            cuda_check_op(label, f_same, x, 6, &c);
            free_all(x, 6);
        }
}

// Gradients accumulated over two ops: q, v, g, s0 feed two gla calls (the
// second in other roles: q as k), and v also an add, so the backward that
// runs second adds into buffers the first wrote.
typedef struct {
    MixerForm f1, f2;
} TwoCtx;

static int f_two(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const TwoCtx *c = ctx;
    Tensor *s1, *s2;
    Tensor *o1 = op_gla_dt(tp, x[IN_Q], x[IN_K], x[IN_V], x[IN_G], x[IN_DT], x[IN_S0], NULL, 2, c->f1, 16, &s1);
    Tensor *o2 = op_gla_dt(tp, x[IN_K], x[IN_Q], x[IN_V], x[IN_G], NULL, x[IN_S0], NULL, 2, c->f2, 8, &s2);
    outs[0] = op_add(tp, o1, x[IN_V]);
    outs[1] = o2;
    outs[2] = op_add(tp, s1, s2);
    return 3;
}

Test(cuda_gla, gradients_accumulated_over_two_ops) {
    for (size_t f = 0; f < 3; f++) {
        Case c = {2, 90, 2, 6, 6, 16, FORMS[f], true, true, true, NULL, OUT_BOTH};
        Tensor *x[N_IN];
        make(x, &c, MILD, 7);
        TwoCtx t = {FORMS[f], FORMS[(f + 1) % 3]};
        char label[64];
        snprintf(label, sizeof label, "gla twice, %s then %s", mixer_form_name(t.f1), mixer_form_name(t.f2));
        cuda_check_op(label, f_two, x, N_IN, &t);
        free_all(x, N_IN);
    }
}

// The same graph twice on the GPU: outputs and gradients bit for bit
// (fixed-order sums, no atomics).
Test(cuda_gla, repeats_bit_for_bit) {
    cuda_require();
    int B = 2, T = 200, H = 3;
    int *docs = docs_make(B, T);
    Case c = {B, T, H, 16, 32, 64, MIXER_FORM_CHUNKED, true, true, true, docs, OUT_BOTH};
    Tensor *x[N_IN];
    make(x, &c, MILD, 9);
    real *seed[2] = {test_randn((int64_t)B * T * H * 32, 1), test_randn((int64_t)B * H * 16 * 32, 2)};
    real *got[2][N_IN + 2];
    for (int run = 0; run < 2; run++) {
        Tape tp;
        tape_init_on(&tp, DEVICE_CUDA);
        Tensor *xs[N_IN];
        for (int i = 0; i < N_IN; i++) {
            xs[i] = tape_tensor_copy(&tp, x[i]->ndim, x[i]->shape, x[i]->data);
            xs[i]->requires_grad = x[i]->requires_grad;
        }
        Tensor *outs[2];
        f_gla(&tp, xs, N_IN, &c, outs);
        tape_backward_multi(&tp, outs, (const real *const *)seed, 2);
        for (int i = 0; i < N_IN + 2; i++) {
            const Tensor *t = i < N_IN ? xs[i] : outs[i - N_IN];
            const real *src = i < N_IN ? t->grad : t->data;
            got[run][i] = malloc((size_t)t->numel * sizeof(real));
            dev_to_host(got[run][i], src, (size_t)t->numel * sizeof(real), DEVICE_CUDA);
        }
        tape_free(&tp);
    }
    for (int i = 0; i < N_IN + 2; i++) {
        int64_t m = i < N_IN ? x[i]->numel : i == N_IN ? (int64_t)B * T * H * 32 : (int64_t)B * H * 16 * 32;
        cr_assert(memcmp(got[0][i], got[1][i], (size_t)m * sizeof(real)) == 0, "gla: run 2 differs in %s %d",
                  i < N_IN ? "the gradient of input" : "output", i < N_IN ? i : i - N_IN);
        free(got[0][i]);
        free(got[1][i]);
    }
    free(seed[0]);
    free(seed[1]);
    free(docs);
    free_all(x, N_IN);
}
