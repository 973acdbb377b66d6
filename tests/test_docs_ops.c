// Document boundaries (docs.h) in the ops that read across positions: the
// short convolution, RoPE and flash attention. Each is checked packed against separate rows
// (outputs and every gradient) and by finite differences with boundaries at
// position 0, at chunk edges, inside chunks (several in one), and at the last
// position (docs_pattern).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernel.h"
#include "docs.h"
#include "test_docs_util.h"

// ---- the index ----

Test(docs_ops, index_first_end_positions) {
    int T = 7, start[14] = {0, 0, 1, 0, 0, 1, 1, /* row 1 */ 1, 0, 0, 0, 0, 0, 0};
    int first[14], end[14], pos[14];
    cr_assert(docs_first_fill(first, start, 2, T));
    int want_first[14] = {-1, -1, 2, 2, 2, 5, 6, 0, 0, 0, 0, 0, 0, 0};
    int want_end[14] = {2, 2, 5, 5, 5, 6, 7, 7, 7, 7, 7, 7, 7, 7};
    int want_pos[14] = {0, 1, 0, 1, 2, 0, 0, 0, 1, 2, 3, 4, 5, 6};
    Tape tp;
    tape_init(&tp);
    memcpy(end, docs_end(&tp, first, 2, T), sizeof end);
    docs_positions(pos, first, 2, T);
    for (int i = 0; i < 14; i++) {
        cr_assert_eq(first[i], want_first[i], "first[%d] = %d, want %d", i, first[i], want_first[i]);
        cr_assert_eq(end[i], want_end[i], "end[%d] = %d, want %d", i, end[i], want_end[i]);
        cr_assert_eq(pos[i], want_pos[i], "pos[%d] = %d, want %d", i, pos[i], want_pos[i]);
    }
    int none[14] = {0};
    cr_assert_null(docs_first(&tp, none, 2, T), "no flag: no index (the computation without documents)");
    cr_assert_null(docs_first(&tp, NULL, 2, T));
    tape_free(&tp);
}

// ---- short convolution ----

typedef struct ConvCtx {
    bool silu;
} ConvCtx;

static int f_conv(Tape *tp, Tensor *const *in, const int *doc_start, void *ctx, Tensor **out) {
    const ConvCtx *c = ctx;
    out[0] = c->silu ? op_conv1d_causal_silu(tp, in[0], in[1], doc_start)
                     : op_conv1d_causal(tp, in[0], in[1], doc_start);
    return 1;
}

static const DocsInKind CONV_KINDS[] = {DOCS_SEQ, DOCS_SHARED};

Test(docs_ops, conv_packed_equals_separate_and_gradcheck) {
    int B = 2, T = 11, C = 5;
    int *docs = docs_pattern(T, 4);
    for (int silu = 0; silu < 2; silu++)
        for (int W = 1; W <= 5; W += 2) {   // 1: no history; 3; 5: longer than some documents
            Tensor *x = tensor_newv(true, 3, B, T, C), *w = tensor_newv(true, 2, C, W);
            fill_normal(x, 10 + W, 1.0);
            fill_normal(w, 20 + W, 0.7);
            ConvCtx ctx = {silu};
            DocsFn f = {f_conv, &ctx, 2, CONV_KINDS};
            char label[64];
            snprintf(label, sizeof label, "conv%s W=%d", silu ? "+silu" : "", W);
            docs_check_packed(&f, (Tensor *[]){x, w}, docs, B, T, FORM_TOL, label);
            docs_gradcheck(&f, (Tensor *[]){x, w}, docs, NULL, label);
            tensor_free(x);
            tensor_free(w);
        }
    free(docs);
}

// A long row through the backward's tiles and row blocks (T = 300 > the
// 64-row tile and block), boundaries every 7 positions and one in the middle
// of a tile's halo.
Test(docs_ops, conv_long_rows_packed_equals_separate) {
    int B = 2, T = 300, C = 16, W = 4;
    int *docs = xcalloc((size_t)B * T, sizeof(int));
    for (int t = 0; t < T; t += 7) docs[t] = 1;
    docs[T + 63] = docs[T + 64] = docs[T + 130] = 1;
    Tensor *x = tensor_newv(true, 3, B, T, C), *w = tensor_newv(true, 2, C, W);
    fill_normal(x, 31, 1.0);
    fill_normal(w, 32, 0.7);
    ConvCtx ctx = {true};
    DocsFn f = {f_conv, &ctx, 2, CONV_KINDS};
    docs_check_packed(&f, (Tensor *[]){x, w}, docs, B, T, FORM_TOL, "conv+silu long rows");
    tensor_free(x);
    tensor_free(w);
    free(docs);
}

// ---- RoPE ----

static int f_rope(Tape *tp, Tensor *const *in, const int *doc_start, void *ctx, Tensor **out) {
    int B = in[0]->shape[0], T = in[0]->shape[1];
    const int *first = docs_first(tp, doc_start, B, T);
    if (!first) {
        out[0] = op_rope(tp, in[0], 4, 0, 10000.0);
        return 1;
    }
    int *pos = tape_alloc(tp, (size_t)B * T * sizeof(int));
    docs_positions(pos, first, B, T);
    out[0] = op_rope_pos(tp, in[0], 4, pos, 10000.0);
    return 1;
}

Test(docs_ops, rope_positions_restart_exactly) {
    // Each document is rotated as a row of its own: the same bits (tolerance 0).
    int B = 2, T = 11;
    int *docs = docs_pattern(T, 4);
    Tensor *x = tensor_newv(true, 3, B, T, 8);
    fill_normal(x, 41, 1.0);
    static const DocsInKind kinds[] = {DOCS_SEQ};
    DocsFn f = {f_rope, NULL, 1, kinds};
    docs_check_packed(&f, (Tensor *[]){x}, docs, B, T, 0.0, "rope");
    docs_gradcheck(&f, (Tensor *[]){x}, docs, NULL, "rope");
    tensor_free(x);
    free(docs);
}

static const int ROW_POS[2] = {1000, 3};

static int f_rope_rows(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    (void)n, (void)ctx;
    out[0] = op_rope_pos(tp, in[0], 4, ROW_POS, 10000.0);
    out[1] = op_rope(tp, in[1], 4, ROW_POS[0], 10000.0);
    out[2] = op_rope(tp, in[2], 4, ROW_POS[1], 10000.0);
    return 3;
}

Test(docs_ops, rope_per_row_positions_equal_offsets) {
    // Decoding positions far beyond the row count (a table per row): each
    // row as op_rope at that offset, bit for bit (on device_default()).
    Tensor *x = tensor_newv(false, 3, 2, 1, 8);
    fill_normal(x, 43, 1.0);
    Tensor *in[3] = {x, docs_time_slice(x, 0, 0, 1), docs_time_slice(x, 1, 0, 1)};
    real *y[3];
    cr_assert_eq(gradcheck_run_seeds(f_rope_rows, in, 3, NULL, (const real *[]){NULL, NULL, NULL}, y, NULL), 3);
    Tape tc;   // the CPU's rotation of each row alone, to say which side moved
    tape_init(&tc);
    for (int b = 0; b < 2; b++) {
        if (!memcmp(y[1 + b], y[0] + b * 8, 8 * sizeof(real))) continue;
        Tensor *cpu = op_rope(&tc, in[1 + b], 4, ROW_POS[b], 10000.0);
        for (int j = 0; j < 8; j++)
            fprintf(stderr, "row %d [%d]: per-row positions %a, at the offset %a, CPU %a\n", b, j,
                    (double)y[0][b * 8 + j], (double)y[1 + b][j], (double)cpu->data[j]);
        cr_assert_fail("row %d: per-row positions and the offset differ", b);
    }
    tape_free(&tc);
    for (int k = 0; k < 3; k++) free(y[k]);
    Tape tp;
    tape_init(&tp);
    cr_assert(EXPECT_FAILURE(op_rope_pos(&tp, x, 4, (int[]){0, -1}, 10000.0)));
    tape_free(&tp);
    for (int k = 0; k < 3; k++) tensor_free(in[k]);
}

// ---- flash attention ----

typedef struct AttnCtx {
    int H, tq, tk;   // tq = 0: the naive reference, masked to the documents
} AttnCtx;

static const DocsInKind QKV_KINDS[] = {DOCS_SEQ, DOCS_SEQ, DOCS_SEQ};

static int f_attn(Tape *tp, Tensor *const *in, const int *doc_start, void *ctx, Tensor **out) {
    const AttnCtx *c = ctx;
    int B = in[0]->shape[0], T = in[0]->shape[1];
    double scale = 0.6;
    if (c->tq) {
        out[0] = op_attention_tiled(tp, in[0], in[1], in[2], c->H, scale, doc_start, c->tq, c->tk);
        return 1;
    }
    unsigned char *allow = NULL;   // the block-diagonal causal mask
    const int *first = docs_first(tp, doc_start, B, T);
    if (first) {
        allow = tape_alloc(tp, (size_t)B * T * T);
        for (int64_t r = 0; r < (int64_t)B * T; r++)
            for (int s = 0; s < T; s++) allow[r * T + s] = s >= docs_begin(first, r) && s <= r % T;
    }
    out[0] = op_attention_naive_masked(tp, in[0], in[1], in[2], c->H, scale, allow);
    return 1;
}

static void qkv_make(Tensor **x, int B, int T, int H, int dk, int dv, double qk_std, uint64_t seed) {
    x[0] = tensor_newv(true, 3, B, T, H * dk);
    x[1] = tensor_newv(true, 3, B, T, H * dk);
    x[2] = tensor_newv(true, 3, B, T, H * dv);
    fill_normal(x[0], seed, qk_std);
    fill_normal(x[1], seed + 1, qk_std);
    fill_normal(x[2], seed + 2, 1.0);
}

Test(docs_ops, attention_packed_equals_separate_every_tiling) {
    // Tiles that cut the rows at different places than the documents do,
    // one tile for all, and the default tiles; the naive reference too.
    int B = 2, T = 11, H = 2;
    int *docs = docs_pattern(T, 4);
    int tiles[][2] = {{4, 4}, {4, 3}, {5, 2}, {16, 16}, {ATTN_TILE_Q, ATTN_TILE_K}, {0, 0}};
    for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++) {
        Tensor *x[3];
        qkv_make(x, B, T, H, 3, 4, 1.0, 50 + i);
        AttnCtx ctx = {H, tiles[i][0], tiles[i][1]};
        DocsFn f = {f_attn, &ctx, 3, QKV_KINDS};
        char label[64];
        snprintf(label, sizeof label, "attention tiles %dx%d", tiles[i][0], tiles[i][1]);
        docs_check_packed(&f, x, docs, B, T, FORM_TOL, label);
        for (int j = 0; j < 3; j++) tensor_free(x[j]);
    }
    free(docs);
}

// Output and gradients of q, k, v of f_attn with ctx, seeded with a fixed dO.
static real *attn_all(Tensor **x, AttnCtx *ctx, const int *docs) {
    Tape tp;
    tape_init(&tp);
    for (int j = 0; j < 3; j++) memset(x[j]->grad, 0, (size_t)x[j]->numel * sizeof(real));
    Tensor *o;
    f_attn(&tp, x, docs, ctx, &o);
    Tensor *seed = tensor_new(3, o->shape, false);
    fill_normal(seed, 99, 1.0);
    tape_backward_from(&tp, o, seed->data);
    int64_t n = o->numel + x[0]->numel + x[1]->numel + x[2]->numel;
    real *all = xmalloc((size_t)n * sizeof(real)), *p = all;
    memcpy(p, o->data, (size_t)o->numel * sizeof(real)), p += o->numel;
    for (int j = 0; j < 3; j++) memcpy(p, x[j]->grad, (size_t)x[j]->numel * sizeof(real)), p += x[j]->numel;
    tensor_free(seed);
    tape_free(&tp);
    return all;
}

// Long rows at the default tiles: documents that span several key tiles,
// tiles skipped before and after a document, blocks cut by a boundary in
// their middle, documents of one position, sharp scores (std 3). Packed
// against separate, and the flash kernel against the naive reference masked
// to the documents (output, dq, dk, dv each on its own scale).
Test(docs_ops, attention_long_rows_equal_naive_masked) {
    int B = 2, T = 200, H = 2;
    int *docs = xcalloc((size_t)B * T, sizeof(int));
    int row0[] = {0, 1, 2, 50, 64, 65, 130, 199}, row1[] = {70, 71, 140};
    for (size_t i = 0; i < sizeof row0 / sizeof row0[0]; i++) docs[row0[i]] = 1;
    for (size_t i = 0; i < sizeof row1 / sizeof row1[0]; i++) docs[T + row1[i]] = 1;
    for (int sharp = 0; sharp < 2; sharp++) {
        Tensor *x[3];
        qkv_make(x, B, T, H, 8, 8, sharp ? 3.0 : 1.0, 60 + sharp);
        AttnCtx ctx = {H, ATTN_TILE_Q, ATTN_TILE_K};
        DocsFn f = {f_attn, &ctx, 3, QKV_KINDS};
        docs_check_packed(&f, x, docs, B, T, FORM_TOL, sharp ? "attention long rows, sharp" : "attention long rows");
        AttnCtx naive = {H, 0, 0};
        real *a = attn_all(x, &ctx, docs), *b = attn_all(x, &naive, docs), *pa = a, *pb = b;
        const char *what[4] = {"o", "dq", "dk", "dv"};
        for (int j = 0; j < 4; j++) {
            int64_t n = x[j == 0 ? 2 : j - 1]->numel;   // o, dv: (B, T, H*dv); dq, dk: (B, T, H*dk)
            double d = max_rel_diff(pa, pb, n);
            cr_assert(d <= FORM_TOL, "sharp %d: %s flash vs naive masked differs by %.3e", sharp, what[j], d);
            pa += n, pb += n;
        }
        free(a), free(b);
        for (int j = 0; j < 3; j++) tensor_free(x[j]);
    }
    free(docs);
}

Test(docs_ops, attention_gradcheck_with_boundaries) {
    int B = 2, T = 11, H = 2;
    int *docs = docs_pattern(T, 4);
    GradcheckOptions opt = gradcheck_defaults();
#ifdef AG_DOUBLE
    opt.eps = 1e-5;   // as test_attn.c's flash gradcheck (rounding of f at 1e-6)
#endif
    int tiles[][2] = {{4, 3}, {16, 16}};
    for (int i = 0; i < 2; i++) {
        Tensor *x[3];
        qkv_make(x, B, T, H, 3, 4, 1.0, 70 + i);
        AttnCtx ctx = {H, tiles[i][0], tiles[i][1]};
        DocsFn f = {f_attn, &ctx, 3, QKV_KINDS};
        docs_gradcheck(&f, x, docs, &opt, "attention with documents");
        for (int j = 0; j < 3; j++) tensor_free(x[j]);
    }
    free(docs);
}
