// Document boundaries (docs.h) in the ops that read across positions: the
// short convolution and RoPE. Each is checked packed against separate rows
// (outputs and every gradient) and by finite differences with boundaries at
// position 0, at chunk edges, inside chunks (several in one), and at the last
// position (docs_pattern).
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    out[0] = c->silu ? op_conv1d_causal_silu(tp, in[0], in[1], doc_start) : op_conv1d_causal(tp, in[0], in[1], doc_start);
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

Test(docs_ops, rope_per_row_positions_equal_offsets) {
    // Decoding positions far beyond the row count (a table per row): each
    // row as op_rope at that offset, bit for bit.
    Tensor *x = tensor_newv(false, 3, 2, 1, 8);
    fill_normal(x, 43, 1.0);
    Tape tp;
    tape_init(&tp);
    int pos[2] = {1000, 3};
    Tensor *y = op_rope_pos(&tp, x, 4, pos, 10000.0);
    for (int b = 0; b < 2; b++) {
        Tensor *xb = docs_time_slice(x, b, 0, 1);
        Tensor *yb = op_rope(&tp, xb, 4, pos[b], 10000.0);
        cr_assert_eq(memcmp(yb->data, y->data + b * 8, 8 * sizeof(real)), 0, "row %d", b);
        tensor_free(xb);
    }
    cr_assert(EXPECT_FAILURE(op_rope_pos(&tp, x, 4, (int[]){0, -1}, 10000.0)));
    tape_free(&tp);
    tensor_free(x);
}
