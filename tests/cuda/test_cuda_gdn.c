// test_cuda_gdn.c: op_gdn (Gated DeltaNet) on the GPU against the CPU, both
// forms (chunked WY and recurrent): with and without s0, documents, T not a
// multiple of the chunk and T = 1, chunks of 16 and 64, dk = dv and dk != dv,
// decay regimes, one output at a time, one tensor as several inputs,
// gradients accumulated over two nodes with the state carried between them,
// and the GPU's two forms against each other. The chunked form's
// decomposition (chunks side by side, the state scanned by blocks of its
// columns, a chunk by tiles of its rows): rows of many chunks with documents
// at and between chunk edges, dv off the column block, chunks of several
// tiles, head sizes off the 16-byte copies, each column block width against
// the CPU and against each other bit for bit, and repeat runs bit for bit.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "cuda_ops.h"
#include "device.h"
#include "gdn_kernel.h"
#include "test_cuda_gdn.h"

const char *const GDN_GRAD_NAMES[N_IN] = {"dq", "dk", "dv", "dbeta", "dg", "ds0"};

void gdn_test_inputs(Tensor **x, int B, int T, int H, int dk, int dv, Regime reg, bool with_s0, bool grad,
                        uint64_t seed) {
    x[IQ] = tensor_newv(grad, 3, B, T, H * dk);
    x[IK] = tensor_newv(grad, 3, B, T, H * dk);
    x[IV] = tensor_newv(grad, 3, B, T, H * dv);
    x[IBETA] = tensor_newv(grad, 3, B, T, H);
    x[IG] = tensor_newv(grad, 3, B, T, H);
    x[IS0] = with_s0 ? tensor_newv(grad, 4, B, H, dk, dv) : NULL;
    fill_normal(x[IQ], seed + 1, 1.0);
    fill_normal(x[IK], seed + 2, 1.0);
    fill_normal(x[IV], seed + 3, 1.0);
    if (x[IS0]) fill_normal(x[IS0], seed + 4, 0.5);
    test_l2norm_rows(x[IQ], dk, 1.0 / sqrt(dk));
    test_l2norm_rows(x[IK], dk, 1.0);
    Rng r;
    rng_seed(&r, seed + 5);
    for (int64_t i = 0; i < x[IBETA]->numel; i++) {
        double u = rng_uniform(&r);
        double bt = 1.0 / (1.0 + exp(-rng_normal(&r))), gt = -rng_range(&r, 0.01, 1.0);
        if (reg == REG_G_ZERO) gt = 0;
        if (reg == REG_G_M20) gt = -20 + u;
        if (reg == REG_BETA_1) bt = 1 - 1e-4 * (0.5 + u);
        x[IBETA]->data[i] = (real)bt;
        x[IG]->data[i] = (real)gt;
    }
}

void gdn_free_inputs(Tensor **x) {
    for (int i = 0; i < N_IN; i++) tensor_free(x[i]);
}

int gdn_test_op(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const GdnCtx *c = ctx;
    Tensor *sT = NULL;
    Tensor *o = op_gdn(tp, x[IQ], x[IK], x[IV], x[IBETA], x[IG], n > IS0 ? x[IS0] : NULL, c->doc_start, c->H, c->form,
                       c->chunk, &sT);
    int m = 0;
    if (c->outs & 1) outs[m++] = o;
    if (c->outs & 2) outs[m++] = sT;
    return m;
}

static const char *form_name(MixerForm f) { return f == MIXER_FORM_CHUNKED ? "chunked" : "recurrent"; }

// One cuda_check_op of op_gdn on fresh inputs.
static void check_gdn(MixerForm form, int B, int T, int H, int dk, int dv, int chunk, Regime reg, bool with_s0,
                      const int *doc_start, int outs, uint64_t seed) {
    Tensor *x[N_IN];
    gdn_test_inputs(x, B, T, H, dk, dv, reg, with_s0, true, seed);
    GdnCtx c = {H, chunk, form, doc_start, outs};
    char label[160];
    snprintf(label, sizeof label, "gdn %s B=%d T=%d H=%d dk=%d dv=%d C=%d regime %d%s%s outs %d", form_name(form), B,
             T, H, dk, dv, chunk, (int)reg, with_s0 ? " +s0" : "", doc_start ? " +docs" : "", outs);
    cuda_check_op(label, gdn_test_op, x, with_s0 ? N_IN : IS0, &c);
    gdn_free_inputs(x);
}

static const MixerForm FORMS[2] = {MIXER_FORM_CHUNKED, MIXER_FORM_RECURRENT};

Test(cuda_gdn, both_forms_every_shape) {
    // T: one token (decoding), odd, a whole number of chunks, a partial last chunk.
    static const int Ts[] = {1, 37, 64, 100}, Cs[] = {16, 64}, dks[] = {32, 16};
    for (int f = 0; f < 2; f++)
        for (int d = 0; d < 2; d++)
            for (int c = 0; c < 2; c++)
                for (int t = 0; t < 4; t++)
                    for (int s = 0; s < 2; s++)
                        check_gdn(FORMS[f], 2, Ts[t], 2, dks[d], 32, Cs[c], REG_PLAIN, s, NULL, 3,
                                  100 + 10 * t + c + 3 * d);
}

Test(cuda_gdn, head_sizes_off_the_tile) {
    // Head sizes that are not multiples of the 32-wide tiles, tiny ones and
    // large ones; chunks of odd length; three heads.
    for (int f = 0; f < 2; f++) {
        check_gdn(FORMS[f], 1, 50, 3, 8, 8, 7, REG_PLAIN, true, NULL, 3, 11);
        check_gdn(FORMS[f], 2, 45, 1, 64, 48, 32, REG_PLAIN, true, NULL, 3, 12);
        check_gdn(FORMS[f], 1, 70, 2, 40, 24, 33, REG_PLAIN, false, NULL, 3, 13);
        check_gdn(FORMS[f], 1, 130, 2, 128, 128, 64, REG_PLAIN, true, NULL, 3, 14);
    }
}

Test(cuda_gdn, decay_regimes) {
    // No decay (the state sums the whole history), strong decay (-20 a step:
    // factors near exp(-1300) must be exact zeros, not NaN) and beta near 1.
    static const Regime regs[] = {REG_G_ZERO, REG_G_M20, REG_BETA_1};
    for (int f = 0; f < 2; f++)
        for (int r = 0; r < 3; r++)
            for (int c = 0; c < 2; c++)
                check_gdn(FORMS[f], 2, 100, 2, 32, 32, c ? 64 : 16, regs[r], true, NULL, 3, 40 + r);
}

Test(cuda_gdn, documents) {
    // Row 0: documents starting at 0, inside the first chunk, at a chunk edge
    // of 16, just after it, two inside one chunk, at the last position; row 1:
    // one document starting mid-chunk (the state before it carries s0).
    enum { B = 2, T = 67 };
    int doc[B * T];
    memset(doc, 0, sizeof doc);
    int starts0[] = {0, 5, 16, 17, 40, 43, 64, T - 1};
    for (size_t i = 0; i < sizeof starts0 / sizeof starts0[0]; i++) doc[starts0[i]] = 1;
    doc[T + 30] = 1;
    for (int f = 0; f < 2; f++)
        for (int c = 0; c < 2; c++)
            for (int s = 0; s < 2; s++) {
                check_gdn(FORMS[f], B, T, 2, 32, 32, c ? 64 : 16, REG_PLAIN, s, doc, 3, 60 + c);
                check_gdn(FORMS[f], B, T, 2, 16, 32, c ? 64 : 16, REG_G_M20, s, doc, 3, 62 + c);
            }
    // A document at the last position of a chunk (its S_C reads no S0) and T = 1 starting one.
    int doc2[2 * 32] = {0};
    doc2[15] = doc2[32 + 31] = 1;
    for (int f = 0; f < 2; f++) {
        check_gdn(FORMS[f], 2, 32, 1, 16, 16, 16, REG_PLAIN, true, doc2, 3, 70);
        int one[2] = {1, 1};
        check_gdn(FORMS[f], 2, 1, 2, 32, 32, 16, REG_PLAIN, true, one, 3, 71);
    }
}

Test(cuda_gdn, chunks_side_by_side_long_rows) {
    // The chunked form runs the chunks side by side and scans the state by
    // blocks of 32 of its dv columns (gdn_scan.cu). One row of many chunks (66 of
    // 16, the last partial), documents beginning at the first token, at chunk
    // edges, just after one, inside chunks, at a chunk's last position and at
    // the last token; dv = 40 (a whole column block and a partial one).
    enum { T = 1050 };
    static int doc[T];
    static const int starts[] = {0, 16, 37, 63, 64, 200, 415, 416, 417, 700, 701, 1023, T - 1};
    memset(doc, 0, sizeof doc);
    for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++) doc[starts[i]] = 1;
    for (int s = 0; s < 2; s++) {
        check_gdn(MIXER_FORM_CHUNKED, 1, T, 2, 16, 40, 16, REG_PLAIN, s, NULL, 3, 400 + s);
        check_gdn(MIXER_FORM_CHUNKED, 1, T, 2, 16, 40, 16, REG_PLAIN, s, doc, 3, 402 + s);
    }
    check_gdn(MIXER_FORM_CHUNKED, 1, T, 1, 32, 32, 64, REG_G_M20, true, doc, 3, 404);
}

Test(cuda_gdn, state_column_blocks) {
    // dv of one column block plus one column, of two and a quarter blocks,
    // and under one block; each output alone (the scans with no dO, no dS_T);
    // documents in some rows only.
    enum { B = 2, T = 300 };
    static int doc[B * T];
    memset(doc, 0, sizeof doc);
    doc[64] = doc[100] = doc[T + 128] = doc[T + 129] = doc[T + 191] = 1;
    for (int outs = 1; outs <= 3; outs++) {
        check_gdn(MIXER_FORM_CHUNKED, B, T, 1, 24, 33, 64, REG_PLAIN, true, doc, outs, 420 + outs);
        check_gdn(MIXER_FORM_CHUNKED, B, T, 2, 16, 72, 16, REG_PLAIN, outs != 2, NULL, outs, 424 + outs);
    }
    check_gdn(MIXER_FORM_CHUNKED, B, T, 3, 40, 20, 32, REG_G_ZERO, true, doc, 3, 428);
}

Test(cuda_gdn, scan_tiles_within_a_chunk) {
    // Chunks longer than the scans' tile (64 rows): two or three tiles per
    // chunk, the last one partial, the state's sums carried between them;
    // documents at a tile edge inside a chunk (64), inside tiles and at a
    // chunk edge; each output alone (the backward scan with no dO, no dS_T).
    enum { T = 350 };
    static int doc[T];
    memset(doc, 0, sizeof doc);
    doc[0] = doc[64] = doc[100] = doc[150] = doc[229] = doc[300] = 1;
    check_gdn(MIXER_FORM_CHUNKED, 1, T, 2, 48, 40, 100, REG_PLAIN, true, doc, 3, 500);
    check_gdn(MIXER_FORM_CHUNKED, 1, T, 2, 32, 32, 128, REG_PLAIN, false, NULL, 3, 501);
    for (int outs = 1; outs <= 2; outs++)
        check_gdn(MIXER_FORM_CHUNKED, 2, 270, 1, 24, 20, 130, REG_PLAIN, true, NULL, outs, 502 + outs);
    check_gdn(MIXER_FORM_CHUNKED, 1, T, 1, 16, 16, 100, REG_G_ZERO, true, doc, 3, 505);
}

Test(cuda_gdn, head_sizes_off_the_vector) {
    // dk and dv not multiples of 4 (rows of W, K, U and the state's slots not
    // 16-byte aligned: the scans copy one element at a time), tiny ones, a
    // column block of one column.
    check_gdn(MIXER_FORM_CHUNKED, 1, 90, 2, 9, 7, 16, REG_PLAIN, true, NULL, 3, 510);
    check_gdn(MIXER_FORM_CHUNKED, 2, 70, 1, 13, 33, 32, REG_PLAIN, true, NULL, 3, 511);
    check_gdn(MIXER_FORM_CHUNKED, 1, 45, 3, 5, 6, 64, REG_PLAIN, false, NULL, 3, 512);
    check_gdn(MIXER_FORM_CHUNKED, 1, 130, 2, 66, 10, 70, REG_PLAIN, true, NULL, 3, 513);
}

Test(cuda_gdn, one_output_at_a_time) {
    // Only o takes a gradient (no dS_T), or only S_T (no dO).
    for (int f = 0; f < 2; f++)
        for (int outs = 1; outs <= 2; outs++) {
            check_gdn(FORMS[f], 2, 37, 2, 16, 32, 16, REG_PLAIN, true, NULL, outs, 80 + outs);
            check_gdn(FORMS[f], 1, 1, 2, 32, 32, 64, REG_PLAIN, false, NULL, outs, 82 + outs);
        }
}

Test(cuda_gdn, forward_only_and_decoding) {
    // Inputs without gradients: the node is not recorded (no saved states).
    // T = 1 with chunk 1 is the decoding step (the recurrent form, s0 the cache).
    for (int f = 0; f < 2; f++)
        for (int t = 0; t < 2; t++) {
            int T = t ? 41 : 1, C = t ? 16 : 1;
            Tensor *x[N_IN];
            gdn_test_inputs(x, 3, T, 2, 32, 16, REG_PLAIN, true, false, 90 + t);
            GdnCtx c = {2, C, FORMS[f], NULL, 3};
            char label[64];
            snprintf(label, sizeof label, "gdn %s forward only T=%d", form_name(FORMS[f]), T);
            cuda_check_op(label, gdn_test_op, x, N_IN, &c);
            gdn_free_inputs(x);
        }
}

// q, k and v one tensor (dk = dv); beta and g one tensor (values in (-1, 0):
// then e^g (1 - beta |k|^2) <= 1 and the state stays bounded).
static int f_gdn_shared(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const GdnCtx *c = ctx;
    outs[0] = op_gdn(tp, x[0], x[0], x[0], x[1], x[1], x[2], c->doc_start, c->H, c->form, c->chunk, &outs[1]);
    return 2;
}

Test(cuda_gdn, one_tensor_as_several_inputs) {
    for (int f = 0; f < 2; f++) {
        Tensor *qkv = tensor_newv(true, 3, 2, 45, 2 * 16), *bg = tensor_newv(true, 3, 2, 45, 2);
        Tensor *s0 = tensor_newv(true, 4, 2, 2, 16, 16);
        fill_normal(qkv, 1, 1.0);
        test_l2norm_rows(qkv, 16, 1.0);
        fill_uniform(bg, 2, -0.9, -0.05);
        fill_normal(s0, 3, 0.5);
        GdnCtx c = {2, 16, FORMS[f], NULL, 3};
        char label[64];
        snprintf(label, sizeof label, "gdn %s, q = k = v, beta = g", form_name(FORMS[f]));
        cuda_check_op(label, f_gdn_shared, (Tensor *[]){qkv, bg, s0}, 3, &c);
        tensor_free(qkv);
        tensor_free(bg);
        tensor_free(s0);
    }
}

// Two nodes on the same q, k, v, beta, g (each gradient is the sum of two
// backwards: the later node's writes, the earlier one's adds), the second
// starting from the first's final state (its gradient flows into dS_T of the
// first), the forms mixed.
typedef struct {
    MixerForm f1, f2;
    int chunk;
} TwoCtx;

static int f_gdn_two(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const TwoCtx *c = ctx;
    Tensor *s1 = NULL;
    outs[0] = op_gdn(tp, x[IQ], x[IK], x[IV], x[IBETA], x[IG], x[IS0], NULL, 2, c->f1, c->chunk, &s1);
    outs[1] = op_gdn(tp, x[IQ], x[IK], x[IV], x[IBETA], x[IG], s1, NULL, 2, c->f2, c->chunk, &outs[2]);
    return 3;
}

Test(cuda_gdn, accumulated_gradients_and_a_carried_state) {
    for (int f1 = 0; f1 < 2; f1++)
        for (int f2 = 0; f2 < 2; f2++) {
            Tensor *x[N_IN];
            gdn_test_inputs(x, 2, 29, 2, 16, 32, REG_PLAIN, true, true, 120 + 2 * f1 + f2);
            TwoCtx c = {FORMS[f1], FORMS[f2], 16};
            char label[64];
            snprintf(label, sizeof label, "gdn %s then %s", form_name(FORMS[f1]), form_name(FORMS[f2]));
            cuda_check_op(label, f_gdn_two, x, N_IN, &c);
            gdn_free_inputs(x);
        }
}

// ---------------------------------------------------------------- the GPU on its own

// o, S_T and every input gradient of one form on a GPU tape (host copies),
// with seeds fixed by `seed`.
typedef struct {
    real *o, *sT, *grad[N_IN];
    int64_t n_o, n_s;
} GpuRun;

static GpuRun gpu_run(Tensor **in, const GdnCtx *c) {
    cuda_require();
    GpuRun r;
    memset(&r, 0, sizeof r);
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *x[N_IN] = {0};
    for (int i = 0; i < N_IN; i++) {
        if (!in[i]) continue;
        x[i] = tape_tensor_copy(&tp, in[i]->ndim, in[i]->shape, in[i]->data);
        x[i]->requires_grad = true;
    }
    Tensor *sT = NULL;
    Tensor *o = op_gdn(&tp, x[IQ], x[IK], x[IV], x[IBETA], x[IG], x[IS0], c->doc_start, c->H, c->form, c->chunk, &sT);
    r.n_o = o->numel;
    r.n_s = sT->numel;
    real *so = test_randn(r.n_o, 7), *ss = test_randn(r.n_s, 8);
    tape_backward_multi(&tp, (Tensor *[]){o, sT}, (const real *[]){so, ss}, 2);
    r.o = malloc((size_t)r.n_o * sizeof(real));
    r.sT = malloc((size_t)r.n_s * sizeof(real));
    dev_to_host(r.o, o->data, (size_t)r.n_o * sizeof(real), DEVICE_CUDA);
    dev_to_host(r.sT, sT->data, (size_t)r.n_s * sizeof(real), DEVICE_CUDA);
    for (int i = 0; i < N_IN; i++) {
        if (!x[i]) continue;
        r.grad[i] = malloc((size_t)in[i]->numel * sizeof(real));
        dev_to_host(r.grad[i], x[i]->grad, (size_t)in[i]->numel * sizeof(real), DEVICE_CUDA);
    }
    dev_sync(DEVICE_CUDA);
    tape_free(&tp);
    free(so);
    free(ss);
    return r;
}

static void gpu_run_free(GpuRun *r) {
    free(r->o);
    free(r->sT);
    for (int i = 0; i < N_IN; i++) free(r->grad[i]);
}

// Runs a and b of the inputs x gave the same bits: o, S_T and every gradient.
static void assert_same_bits(const GpuRun *a, const GpuRun *b, Tensor *const *x, const char *what) {
    cr_assert(memcmp(a->o, b->o, (size_t)a->n_o * sizeof(real)) == 0, "%s: o differs", what);
    cr_assert(memcmp(a->sT, b->sT, (size_t)a->n_s * sizeof(real)) == 0, "%s: S_T differs", what);
    for (int i = 0; i < N_IN; i++)
        if (x[i])
            cr_assert(memcmp(a->grad[i], b->grad[i], (size_t)x[i]->numel * sizeof(real)) == 0, "%s: %s differs", what,
                      GDN_GRAD_NAMES[i]);
}

Test(cuda_gdn, gpu_chunked_equals_gpu_recurrent) {
    enum { B = 2, T = 75 };
    int doc[B * T] = {0};
    doc[20] = doc[32] = doc[T + 50] = 1;
    for (int cse = 0; cse < 4; cse++) {
        int dk = cse % 2 ? 16 : 32, C = cse < 2 ? 16 : 64;
        const int *docs = cse == 3 ? doc : NULL;
        Tensor *x[N_IN];
        gdn_test_inputs(x, B, T, 2, dk, 32, REG_PLAIN, true, true, 200 + cse);
        GdnCtx cc = {2, C, MIXER_FORM_CHUNKED, docs, 3}, cr = {2, C, MIXER_FORM_RECURRENT, docs, 3};
        GpuRun a = gpu_run(x, &cc), b = gpu_run(x, &cr);
        double e = max_rel_diff(a.o, b.o, a.n_o);
        cr_assert_leq(e, FORM_TOL, "case %d: o differs by %.3e", cse, e);
        e = max_rel_diff(a.sT, b.sT, a.n_s);
        cr_assert_leq(e, FORM_TOL, "case %d: S_T differs by %.3e", cse, e);
        for (int i = 0; i < N_IN; i++) {
            e = max_rel_diff(a.grad[i], b.grad[i], x[i]->numel);
            cr_assert_leq(e, FORM_TOL, "case %d: %s differs by %.3e", cse, GDN_GRAD_NAMES[i], e);
        }
        gpu_run_free(&a);
        gpu_run_free(&b);
        gdn_free_inputs(x);
    }
}

// The scans' choices that gdn_scan.cu lets the environment force: the column
// block (chosen from B H and dv; SCAN_COLS = 8, 16 or 32) and the two-level
// form (groups of chunks, each alone, joined, then each again from its
// entering state; chosen from B H, dv and the chunks; SCAN_GROUP = G chunks
// a group, 0 one walk). value NULL: the host's choice.
#define SCAN_COLS "ATTNLAB_GDN_SCAN_COLS"
#define SCAN_GROUP "ATTNLAB_GDN_SCAN_GROUP"
static void force_scan(const char *name, const char *value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

Test(cuda_gdn, scan_column_blocks_agree_with_the_cpu) {
    // The existing shapes have few (batch, head) pairs: the scans take 8
    // columns a block. Here each width against the CPU: partial column blocks
    // (dv 40, 20, 33), chunks of one and of two tiles, documents, no s0.
    enum { B = 2, T = 200 };
    static int doc[B * T];
    memset(doc, 0, sizeof doc);
    doc[0] = doc[64] = doc[65] = doc[T + 100] = doc[T + 199] = 1;
    static const char *const cols[] = {"8", "16", "32"};
    for (int w = 0; w < 3; w++) {
        force_scan(SCAN_COLS, cols[w]);
        check_gdn(MIXER_FORM_CHUNKED, B, T, 2, 32, 40, 64, REG_PLAIN, true, doc, 3, 520 + w);
        check_gdn(MIXER_FORM_CHUNKED, B, T, 1, 24, 20, 100, REG_PLAIN, false, NULL, 3, 523 + w);
        check_gdn(MIXER_FORM_CHUNKED, 1, 75, 2, 16, 33, 16, REG_PLAIN, true, doc, 1, 526 + w);
        check_gdn(MIXER_FORM_CHUNKED, 1, 75, 2, 16, 33, 16, REG_PLAIN, true, NULL, 2, 529 + w);
        check_gdn(MIXER_FORM_CHUNKED, 1, 130, 2, 128, 128, 64, REG_PLAIN, true, NULL, 3, 532 + w);
    }
    force_scan(SCAN_COLS, NULL);
}

Test(cuda_gdn, scan_column_blocks_give_the_same_bits) {
    // A state column's arithmetic is the same whatever the block width: o,
    // S_T and every gradient the same bits at 8, 16 and 32 columns a block.
    enum { T = 700 };
    static int doc[T];
    memset(doc, 0, sizeof doc);
    doc[0] = doc[63] = doc[64] = doc[333] = doc[699] = 1;
    static const struct {
        int B, T, H, dk, dv, C;
        const int *doc;
    } cases[] = {{1, T, 2, 40, 72, 64, doc}, {2, 300, 1, 24, 22, 100, NULL}, {1, 90, 2, 9, 33, 16, NULL}};
    static const char *const cols[] = {"8", "16", "32"};
    for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
        Tensor *x[N_IN];
        gdn_test_inputs(x, cases[cs].B, cases[cs].T, cases[cs].H, cases[cs].dk, cases[cs].dv, REG_PLAIN, true, true,
                    540 + cs);
        GdnCtx c = {cases[cs].H, cases[cs].C, MIXER_FORM_CHUNKED, cases[cs].doc, 3};
        GpuRun r[3];
        for (int w = 0; w < 3; w++) {
            force_scan(SCAN_COLS, cols[w]);
            r[w] = gpu_run(x, &c);
        }
        force_scan(SCAN_COLS, NULL);
        for (int w = 1; w < 3; w++) {
            char what[64];
            snprintf(what, sizeof what, "case %zu, %s columns", cs, cols[w]);
            assert_same_bits(&r[0], &r[w], x, what);
        }
        for (int w = 0; w < 3; w++) gpu_run_free(&r[w]);
        gdn_free_inputs(x);
    }
}

Test(cuda_gdn, two_level_scan_agrees_with_the_cpu) {
    // Groups of 1, 2, 3 and 5 chunks: the last group whole or partial, a
    // group of one chunk, two groups only; documents at and between group
    // edges; dv off the column block, dk != dv, dk past the column block
    // (the transition's columns in several blocks); chunks of two tiles;
    // each output alone (the backward with no dO, no dS_T); no s0; the decay
    // regimes (a transition near 0, near the identity, beta near 1).
    enum { B = 2, T = 200 };
    static int doc[B * T];
    memset(doc, 0, sizeof doc);
    doc[0] = doc[32] = doc[48] = doc[49] = doc[T + 100] = doc[T + 199] = 1;
    static const char *const groups[] = {"1", "2", "3", "5"};
    for (int gi = 0; gi < 4; gi++) {
        force_scan(SCAN_GROUP, groups[gi]);
        check_gdn(MIXER_FORM_CHUNKED, B, T, 2, 32, 40, 16, REG_PLAIN, true, doc, 3, 600 + gi);
        check_gdn(MIXER_FORM_CHUNKED, 1, 75, 2, 16, 33, 16, REG_PLAIN, false, NULL, 3, 604 + gi);
        check_gdn(MIXER_FORM_CHUNKED, 1, 150, 1, 40, 24, 16, REG_PLAIN, true, NULL, 1, 608 + gi);
        check_gdn(MIXER_FORM_CHUNKED, 1, 150, 1, 40, 24, 16, REG_PLAIN, true, NULL, 2, 612 + gi);
        check_gdn(MIXER_FORM_CHUNKED, 1, 400, 2, 24, 20, 100, REG_PLAIN, true, doc, 3, 616 + gi);
    }
    force_scan(SCAN_GROUP, "2");
    static const Regime regs[] = {REG_G_ZERO, REG_G_M20, REG_BETA_1};
    for (int r = 0; r < 3; r++) check_gdn(MIXER_FORM_CHUNKED, 2, 160, 2, 32, 32, 16, regs[r], true, NULL, 3, 620 + r);
    check_gdn(MIXER_FORM_CHUNKED, 1, 300, 2, 128, 128, 64, REG_PLAIN, true, NULL, 3, 623);
    force_scan(SCAN_GROUP, NULL);
}

Test(cuda_gdn, two_level_scan_chosen_on_long_rows) {
    // Few (batch, head) pairs and many chunks: the host takes groups by
    // itself (as it does at B = 1 on long rows); against the CPU, and against
    // one walk (ATTNLAB_GDN_SCAN_GROUP = 0) within rounding. Without decay:
    // with it (g < 0) a group's transition underflows to 0 and both ways
    // give the same bits, which would not tell them apart.
    enum { T = 2100 };
    static int doc[T];
    memset(doc, 0, sizeof doc);
    doc[0] = doc[48] = doc[1000] = doc[1001] = doc[2047] = 1;
    force_scan(SCAN_GROUP, NULL);
    check_gdn(MIXER_FORM_CHUNKED, 1, T, 2, 32, 32, 16, REG_PLAIN, true, doc, 3, 630);
    check_gdn(MIXER_FORM_CHUNKED, 1, T, 2, 32, 32, 16, REG_G_ZERO, true, doc, 3, 631);
    Tensor *x[N_IN];
    gdn_test_inputs(x, 1, T, 2, 32, 32, REG_G_ZERO, true, true, 632);
    GdnCtx c = {2, 16, MIXER_FORM_CHUNKED, doc, 3};
    GpuRun a = gpu_run(x, &c);
    force_scan(SCAN_GROUP, "0");
    GpuRun b = gpu_run(x, &c);
    force_scan(SCAN_GROUP, NULL);
    // The two differ in the order of their sums only: not in every bit, and
    // within the forms' tolerance.
    bool same = memcmp(a.o, b.o, (size_t)a.n_o * sizeof(real)) == 0 &&
                memcmp(a.sT, b.sT, (size_t)a.n_s * sizeof(real)) == 0;
    cr_assert(!same, "the host did not take the two-level scan on a row of 132 chunks at B H = 2");
    double e = max_rel_diff(a.o, b.o, a.n_o);
    cr_assert_leq(e, FORM_TOL, "o differs by %.3e", e);
    e = max_rel_diff(a.sT, b.sT, a.n_s);
    cr_assert_leq(e, FORM_TOL, "S_T differs by %.3e", e);
    for (int i = 0; i < N_IN; i++) {
        e = max_rel_diff(a.grad[i], b.grad[i], x[i]->numel);
        cr_assert_leq(e, FORM_TOL, "%s differs by %.3e", GDN_GRAD_NAMES[i], e);
    }
    gpu_run_free(&a);
    gpu_run_free(&b);
    gdn_free_inputs(x);
}

Test(cuda_gdn, two_level_scan_gives_the_same_bits_at_every_width) {
    // With the groups fixed, a state column's arithmetic is the same whatever
    // the column block: o, S_T and every gradient the same bits at 8, 16 and
    // 32 columns a block, and run again.
    static const char *const cols[] = {"8", "16", "32"};
    Tensor *x[N_IN];
    gdn_test_inputs(x, 1, 700, 2, 40, 72, REG_PLAIN, true, true, 640);
    GdnCtx c = {2, 16, MIXER_FORM_CHUNKED, NULL, 3};
    force_scan(SCAN_GROUP, "3");
    GpuRun r[4];
    for (int w = 0; w < 3; w++) {
        force_scan(SCAN_COLS, cols[w]);
        r[w] = gpu_run(x, &c);
    }
    r[3] = gpu_run(x, &c);
    force_scan(SCAN_COLS, NULL);
    force_scan(SCAN_GROUP, NULL);
    static const char *const runs[] = {"", "16 columns", "32 columns", "32 columns again"};
    for (int w = 1; w < 4; w++) assert_same_bits(&r[0], &r[w], x, runs[w]);
    for (int w = 0; w < 4; w++) gpu_run_free(&r[w]);
    gdn_free_inputs(x);
}

Test(cuda_gdn, a_run_repeats_bit_for_bit) {
    Tensor *x[N_IN];
    gdn_test_inputs(x, 2, 100, 2, 32, 32, REG_PLAIN, true, true, 300);
    for (int f = 0; f < 2; f++) {
        GdnCtx c = {2, 16, FORMS[f], NULL, 3};
        GpuRun a = gpu_run(x, &c), b = gpu_run(x, &c);
        assert_same_bits(&a, &b, x, form_name(FORMS[f]));
        gpu_run_free(&a);
        gpu_run_free(&b);
    }
    gdn_free_inputs(x);
    // The chunked form on a row of many chunks with documents: more chunks
    // than the per-chunk kernels have blocks on a small GPU share, and the
    // scans' column blocks.
    enum { T = 2100 };
    static int doc[T];
    memset(doc, 0, sizeof doc);
    doc[0] = doc[48] = doc[1000] = doc[1001] = doc[2047] = 1;
    gdn_test_inputs(x, 1, T, 3, 16, 40, REG_PLAIN, true, true, 301);
    GdnCtx c = {3, 16, MIXER_FORM_CHUNKED, doc, 3};
    GpuRun a = gpu_run(x, &c), b = gpu_run(x, &c);
    assert_same_bits(&a, &b, x, "long row");
    gpu_run_free(&a);
    gpu_run_free(&b);
    gdn_free_inputs(x);
}

// The per-chunk kernels with their workspace in shared memory
// (ATTNLAB_GDN_WS=backward, the default: the backward's chunk kernel;
// =shared: every one; src/cuda/gdn_chunk.cuh) against =global (none): the same
// buffers, the same arithmetic in the same order, so o, S_T and every
// gradient are the same bits, in both precisions and (float32 build) under
// bf16 products. The cases: a workspace that fits whole (small heads) and
// one that does not (heads of 128 at C 64: the buffers past the room stay
// in device memory), a chunk longer than 64 positions (the row-by-row
// solve), documents, several heads and rows, short last chunks. Where the
// whole workspace fits with room to spare, the backward's chunk kernel also
// copies each chunk's k, q, v, dO rows into shared memory (16 bytes a copy,
// or a real a copy for rows of 18 and 22 reals); some case must do so.
// Under bf16 at heads of 64 and C <= 64 the forward's kernels are
// gdn_chunk64.cu's, which need no workspace: none is planned there.
Test(cuda_gdn, workspace_in_shared_memory_gives_the_same_bits) {
    enum { T = 300 };
    static int doc[2 * T];
    memset(doc, 0, sizeof doc);
    doc[0] = doc[63] = doc[64] = doc[200] = doc[T + 17] = 1;
    static const struct {
        int B, T, H, dk, dv, C;
        const int *doc;
    } cases[] = {{2, T, 2, 16, 24, 16, doc},     {1, T, 2, 64, 64, 64, doc},  {2, 130, 1, 128, 128, 64, NULL},
                 {1, 150, 2, 40, 72, 100, NULL}, {2, 100, 3, 32, 32, 32, NULL}, {1, 90, 2, 18, 22, 32, NULL}};
    // each setting (NULL: unset, the default) and whether it keeps the
    // forward's and the backward's workspace in shared memory
    static const struct {
        const char *ws;
        bool fwd, bwd;
    } settings[] = {{"shared", true, true}, {"backward", false, true}, {NULL, false, true}};
    for (int bf = 0; bf < 2; bf++) {
#ifdef AG_DOUBLE
        if (bf) break;   // (bf16 products need the float32 build)
#endif
        device_set_bf16(DEVICE_CUDA, bf);
        bool staged = false;
        for (size_t cs = 0; cs < sizeof cases / sizeof cases[0]; cs++) {
            Tensor *x[N_IN];
            gdn_test_inputs(x, cases[cs].B, cases[cs].T, cases[cs].H, cases[cs].dk, cases[cs].dv, REG_PLAIN, true, true,
                            560 + cs);
            GdnCtx c = {cases[cs].H, cases[cs].C, MIXER_FORM_CHUNKED, cases[cs].doc, 3};
            setenv("ATTNLAB_GDN_WS", "global", 1);
            GpuRun g = gpu_run(x, &c);
            unsetenv("ATTNLAB_GDN_WS");
            cr_assert(cu_gdn_ws_shared_last(false) == 0 && cu_gdn_ws_shared_last(true) == 0,
                      "case %zu: ATTNLAB_GDN_WS=global kept workspace in shared memory", cs);
            bool c64 = bf && cases[cs].dk == 64 && cases[cs].dv == 64 && cases[cs].C <= 64;
            for (int st = 0; st < 3; st++) {
                const char *name = settings[st].ws ? settings[st].ws : "(unset)";
                if (settings[st].ws) setenv("ATTNLAB_GDN_WS", settings[st].ws, 1);
                int before = cu_gdn_chunk64_launches();
                GpuRun sh = gpu_run(x, &c);
                size_t fwd = cu_gdn_ws_shared_last(false), bwd = cu_gdn_ws_shared_last(true);
                staged |= cu_gdn_in_shared_last() > 0;
                unsetenv("ATTNLAB_GDN_WS");
                cr_assert(c64 == (cu_gdn_chunk64_launches() > before), "case %zu: gdn_chunk64 %s", cs,
                          c64 ? "did not take the pass" : "took the pass");
                cr_assert(settings[st].bwd == (bwd > 0) && (settings[st].fwd && !c64) == (fwd > 0),
                          "case %zu: ATTNLAB_GDN_WS=%s kept %zu bytes of the forward's and %zu of the backward's "
                          "workspace in shared memory",
                          cs, name, fwd, bwd);
                char what[96];
                snprintf(what, sizeof what, "case %zu%s, ATTNLAB_GDN_WS=%s (%zu, %zu bytes)", cs, bf ? " bf16" : "",
                         name, fwd, bwd);
                assert_same_bits(&g, &sh, x, what);
                gpu_run_free(&sh);
            }
            gpu_run_free(&g);
            gdn_free_inputs(x);
        }
        cr_assert(staged, "%s: no case copied k, q, v, dO into shared memory: that path went untested",
                  bf ? "bf16" : sizeof(real) == 8 ? "float64" : "float32");
    }
    device_set_bf16(DEVICE_CUDA, false);
}

// op_gdn's chunked forward (one head, dk = dv, chunk C, bf16 products or
// not) with the environment's `var` set to `value`: it must fail before any
// launch, its message naming var, 'value' and `takes` (what var takes).
void gdn_expect_setting_refused(const char *var, const char *value, const char *takes, int dk, int C, bool bf16) {
    cuda_require();
    Tensor *x[N_IN];
    gdn_test_inputs(x, 1, 20, 1, dk, dk, REG_PLAIN, false, false, 590);
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    Tensor *d[IS0];
    for (int i = 0; i < IS0; i++) d[i] = tape_tensor_copy(&tp, x[i]->ndim, x[i]->shape, x[i]->data);
    device_set_bf16(DEVICE_CUDA, bf16);
    setenv(var, value, 1);
    Tensor *sT = NULL;
    bool failed = EXPECT_FAILURE(
        op_gdn(&tp, d[IQ], d[IK], d[IV], d[IBETA], d[IG], NULL, NULL, 1, MIXER_FORM_CHUNKED, C, &sT));
    unsetenv(var);
    device_set_bf16(DEVICE_CUDA, false);
    cr_assert(failed, "%s = %s was taken", var, value);
    const char *msg = ag_last_error();
    char quoted[64];
    snprintf(quoted, sizeof quoted, "'%s'", value);
    cr_assert(strstr(msg, var) && strstr(msg, quoted) && strstr(msg, takes), "message: %s", msg);
    dev_sync(DEVICE_CUDA);
    tape_free(&tp);
    gdn_free_inputs(x);
}

// An ATTNLAB_GDN_WS the kernels do not know is refused by name, with the
// values they take, before any launch.
Test(cuda_gdn, workspace_setting_refuses_unknown_values) {
    gdn_expect_setting_refused("ATTNLAB_GDN_WS", "forward", "backward (the default), shared or global", 16, 16, false);
}
