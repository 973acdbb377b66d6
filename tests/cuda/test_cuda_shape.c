// test_cuda_shape.c: RoPE (both ops, with document positions and per-row
// decoding positions), the causal convolution (plain and with SiLU, with and
// without documents) and reshape, transpose, slice, concat on the GPU
// against the CPU. Inputs used twice check that a second backward adds to
// what the first wrote.
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "device.h"
#include "docs.h"
#include "ops.h"

// doc_start (B*T) with flags at the given positions of each row (-1 ends a
// row's list); malloc'd.
static int *doc_flags(int B, int T, const int *flags) {
    int *ds = calloc((size_t)B * T, sizeof(int));
    for (int b = 0, k = 0; b < B; b++, k++)
        for (; flags[k] >= 0; k++)
            if (flags[k] < T) ds[(int64_t)b * T + flags[k]] = 1;
    return ds;
}

// ---------------------------------------------------------------- RoPE

typedef struct {
    int hd, pos0;
    double base;
    const int *pos;   // (B, T): op_rope_pos; NULL: op_rope at pos0
    bool twice;       // x also rotated at pos0 + 7 (its gradient accumulates)
} RopeCtx;

static int f_rope(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const RopeCtx *c = ctx;
    outs[0] = c->pos ? op_rope_pos(tp, x[0], c->hd, c->pos, c->base) : op_rope(tp, x[0], c->hd, c->pos0, c->base);
    if (!c->twice) return 1;
    outs[1] = op_rope(tp, x[0], c->hd, c->pos0 + 7, c->base);
    return 2;
}

Test(cuda_shape, rope_every_head_dim_and_offset) {
    int hds[] = {2, 6, 8, 16, 64, 128}, heads[] = {3, 5, 2, 3, 2, 1};
    for (int k = 0; k < 6; k++)
        for (int v = 0; v < 4; v++) {
            Tensor *x = cuda_input(true, 10 + k, 3, 2, 13, heads[k] * hds[k]);
            RopeCtx c = {hds[k], v & 1 ? 5 : 0, v & 2 ? 500000.0 : 10000.0, NULL, v == 3};
            char label[80];
            snprintf(label, sizeof label, "rope hd %d pos0 %d base %g%s", c.hd, c.pos0, c.base,
                     c.twice ? ", twice" : "");
            cuda_check_op(label, f_rope, &x, 1, &c);
            tensor_free(x);
        }
}

Test(cuda_shape, rope_positions_of_documents) {
    // Positions restarting at each document (flags at 0, inside, a document
    // of one position, the last position; a row without a flag): the table
    // of positions 0 .. max.
    int B = 3, T = 19;
    int flags[] = {0, 4, 5, 12, 18, -1, -1, 1, 3, 5, 7, 9, 11, 13, 15, 17, -1};
    int *ds = doc_flags(B, T, flags);
    int first[3 * 19], pos[3 * 19];
    cr_assert(docs_first_fill(first, ds, B, T));
    docs_positions(pos, first, B, T);
    for (int twice = 0; twice < 2; twice++) {
        Tensor *x = cuda_input(true, 21, 3, B, T, 4 * 8);
        RopeCtx c = {8, 0, 10000.0, pos, twice};
        cuda_check_op(twice ? "rope_pos documents, twice" : "rope_pos documents", f_rope, &x, 1, &c);
        tensor_free(x);
    }
    free(ds);
}

Test(cuda_shape, rope_per_row_positions) {
    // Positions beyond the row count: a table entry per row (decoding at
    // long positions, one position per row, and a short window).
    int dec[4] = {1000, 3, 70000, 12};
    Tensor *x = cuda_input(true, 31, 3, 4, 1, 2 * 16);
    RopeCtx c = {16, 0, 10000.0, dec, false};
    cuda_check_op("rope_pos decoding", f_rope, &x, 1, &c);
    tensor_free(x);
    int win[10];
    for (int r = 0; r < 10; r++) win[r] = 500 + 3 * r - (r % 4);
    x = cuda_input(true, 32, 3, 2, 5, 3 * 6);
    c = (RopeCtx){6, 0, 10000.0, win, true};
    cuda_check_op("rope_pos window, twice", f_rope, &x, 1, &c);
    tensor_free(x);
}

Test(cuda_shape, rope_of_a_constant) {
    // Nothing requires a gradient: the forward runs unrecorded.
    Tensor *x = cuda_input(false, 33, 3, 2, 9, 24);
    RopeCtx c = {8, 2, 10000.0, NULL, false};
    cuda_check_op("rope of a constant", f_rope, &x, 1, &c);
    tensor_free(x);
}

// ---------------------------------------------------------------- causal convolution

typedef struct {
    bool silu, both;        // both: the other kind on the same x, w too (gradients accumulate)
    const int *doc_start;   // (B, T) or NULL
} ConvCtx;

static int f_conv(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const ConvCtx *c = ctx;
    outs[0] = c->silu ? op_conv1d_causal_silu(tp, x[0], x[1], c->doc_start)
                      : op_conv1d_causal(tp, x[0], x[1], c->doc_start);
    if (!c->both) return 1;
    outs[1] = c->silu ? op_conv1d_causal(tp, x[0], x[1], c->doc_start)
                      : op_conv1d_causal_silu(tp, x[0], x[1], c->doc_start);
    return 2;
}

// Every kind and form of one shape: plain, SiLU, both; without documents and
// with `flags`; x or w without a gradient.
static void check_conv_shape(int B, int T, int C, int W, const int *flags) {
    int *ds = flags ? doc_flags(B, T, flags) : NULL;
    for (int docs = 0; docs < (ds ? 2 : 1); docs++)
        for (int form = 0; form < 5; form++) {
            // form: 0 plain, 1 silu, 2 both, 3 silu with x constant, 4 plain with w constant
            bool gx = form != 3, gw = form != 4;
            Tensor *x = cuda_input(gx, 40 + T, 3, B, T, C), *w = tensor_newv(gw, 2, C, W);
            fill_normal(w, 50 + W, 0.7);
            ConvCtx c = {form == 1 || form == 3, form == 2, docs ? ds : NULL};
            char label[96];
            snprintf(label, sizeof label, "conv (%d, %d, %d) W %d form %d%s", B, T, C, W, form,
                     docs ? " documents" : "");
            cuda_check_op(label, f_conv, (Tensor *[]){x, w}, 2, &c);
            tensor_free(x);
            tensor_free(w);
        }
    free(ds);
}

Test(cuda_shape, conv_odd_shapes_and_documents) {
    // Flags: at 0, a document of one position, documents shorter than W, the
    // last position; a row without a flag; a flag at every other position.
    int flags[] = {0, 3, 4, 6, 12, -1, -1, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, -1};
    check_conv_shape(2, 13, 5, 1, flags);
    check_conv_shape(2, 13, 37, 3, flags);
    check_conv_shape(3, 11, 8, 4, flags);
    check_conv_shape(3, 21, 33, 7, flags);
    check_conv_shape(2, 6, 3, 9, flags);   // W > T
    check_conv_shape(1, 45, 130, 4, NULL); // channels over one block of the weight gradient
}

Test(cuda_shape, conv_long_rows) {
    // 4000 rows: many row blocks of the weight gradient; documents every 7
    // positions in one row, a long one in the other.
    int B = 4, T = 1000, C = 40, W = 4;
    int *ds = calloc((size_t)B * T, sizeof(int));
    for (int t = 0; t < T; t += 7) ds[t] = 1;
    ds[T + 500] = ds[2 * T + 31] = ds[2 * T + 32] = 1;
    for (int silu = 0; silu < 2; silu++)
        for (int docs = 0; docs < 2; docs++) {
            Tensor *x = cuda_input(true, 61, 3, B, T, C), *w = tensor_newv(true, 2, C, W);
            fill_normal(w, 62, 0.5);
            ConvCtx c = {silu, false, docs ? ds : NULL};
            char label[64];
            snprintf(label, sizeof label, "conv long rows%s%s", silu ? " silu" : "", docs ? " documents" : "");
            cuda_check_op(label, f_conv, (Tensor *[]){x, w}, 2, &c);
            tensor_free(x);
            tensor_free(w);
        }
    free(ds);
}

Test(cuda_shape, conv_weight_gradient_repeats_bit_for_bit) {
    cuda_require();
    int B = 3, T = 700, C = 24, W = 4;
    Tensor *x = cuda_input(false, 71, 3, B, T, C), *w = cuda_input(true, 72, 2, C, W);
    real *seed = test_randn((int64_t)B * T * C, 73);
    real dw[2][24 * 4];
    for (int s = 0; s < 2; s++) {
        Tape tp;
        tape_init_on(&tp, DEVICE_CUDA);
        Tensor *xs = tape_tensor_copy(&tp, 3, x->shape, x->data);
        Tensor *ws = tape_tensor_copy(&tp, 2, w->shape, w->data);
        ws->requires_grad = true;
        Tensor *y = op_conv1d_causal_silu(&tp, xs, ws, NULL);
        tape_backward_from(&tp, y, seed);
        dev_to_host(dw[s], ws->grad, sizeof dw[s], DEVICE_CUDA);
        tape_free(&tp);
    }
    cr_assert_eq(memcmp(dw[0], dw[1], sizeof dw[0]), 0, "two runs of the weight gradient differ");
    free(seed);
    tensor_free(x);
    tensor_free(w);
}

// ---------------------------------------------------------------- shape ops

static int f_reshape(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    outs[0] = op_reshape(tp, x[0], 2, (int[]){7, 15});
    outs[1] = op_mul(tp, op_reshape(tp, x[0], 1, (int[]){105}), op_reshape(tp, x[1], 1, (int[]){105}));
    return 2;
}

Test(cuda_shape, reshape) {
    Tensor *x = cuda_input(true, 81, 3, 3, 5, 7), *y = cuda_input(true, 82, 2, 15, 7);
    cuda_check_op("reshape", f_reshape, (Tensor *[]){x, y}, 2, NULL);
    tensor_free(x);
    tensor_free(y);
}

typedef struct {
    int d0, d1;
    bool twice;   // also x transposed (0, -1): the gradient accumulates
} TransposeCtx;

static int f_transpose(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const TransposeCtx *c = ctx;
    outs[0] = op_transpose(tp, x[0], c->d0, c->d1);
    if (!c->twice) return 1;
    outs[1] = op_transpose(tp, x[0], 0, -1);
    return 2;
}

Test(cuda_shape, transpose_every_pair) {
    int shapes[4][4] = {{37}, {5, 9}, {3, 4, 7}, {2, 3, 5, 7}};
    for (int nd = 1; nd <= 4; nd++)
        for (int d0 = 0; d0 < nd; d0++)
            for (int d1 = d0; d1 < nd; d1++)
                for (int twice = 0; twice < 2; twice++) {
                    Tensor *x = tensor_new(nd, shapes[nd - 1], true);
                    fill_normal(x, 90 + nd, 1.0);
                    // the second dimension counted from the end once in a while
                    TransposeCtx c = {d0, twice ? d1 - nd : d1, twice};
                    char label[64];
                    snprintf(label, sizeof label, "transpose %s (%d, %d)%s", SHAPE(x), c.d0, c.d1,
                             twice ? ", twice" : "");
                    cuda_check_op(label, f_transpose, &x, 1, &c);
                    tensor_free(x);
                }
}

typedef struct {
    int dim, start, len;
    bool twice;   // also an overlapping slice of x (the gradient accumulates)
} SliceCtx;

static int f_slice(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const SliceCtx *c = ctx;
    outs[0] = op_slice(tp, x[0], c->dim, c->start, c->len);
    if (!c->twice) return 1;
    int d = c->dim < 0 ? c->dim + x[0]->ndim : c->dim;
    outs[1] = op_slice(tp, x[0], c->dim, 0, x[0]->shape[d] - 1);
    return 2;
}

Test(cuda_shape, slice_every_dimension) {
    // A single slice leaves the rest of a fresh gradient at zero (NaN in
    // float64 if missed); two overlapping slices add.
    SliceCtx cs[] = {{0, 1, 2, false}, {0, 0, 4, true}, {1, 3, 5, false}, {1, 8, 1, true},
                     {2, 2, 3, false}, {-1, 0, 6, true}, {-2, 4, 4, false}, {2, 5, 1, true}};
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        Tensor *x = cuda_input(true, 100 + k, 3, 4, 9, 6);
        char label[64];
        snprintf(label, sizeof label, "slice dim %d [%d, %d)%s", cs[k].dim, cs[k].start, cs[k].start + cs[k].len,
                 cs[k].twice ? ", twice" : "");
        cuda_check_op(label, f_slice, &x, 1, &cs[k]);
        tensor_free(x);
    }
}

typedef struct {
    int dim, form;   // form 0: (a, b, c); 1: (a, a, b) (one tensor twice); 2: (a) alone; 3: (c, a) + a slice of a
} ConcatCtx;

static int f_concat(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    const ConcatCtx *c = ctx;
    switch (c->form) {
    case 0: outs[0] = op_concat(tp, (Tensor *[]){x[0], x[1], x[2]}, 3, c->dim); return 1;
    case 1: outs[0] = op_concat(tp, (Tensor *[]){x[0], x[0], x[1]}, 3, c->dim); return 1;
    case 2: outs[0] = op_concat(tp, &x[0], 1, c->dim); return 1;
    default:
        outs[0] = op_concat(tp, (Tensor *[]){x[2], x[0]}, 2, c->dim);
        outs[1] = op_slice(tp, x[0], c->dim, 0, 1);
        return 2;
    }
}

Test(cuda_shape, concat_every_dimension_and_form) {
    // (2, 3, 5) along each dimension; b is one longer there, c one shorter
    // and takes no gradient.
    for (int dim = 0; dim < 3; dim++)
        for (int form = 0; form < 4; form++) {
            int sa[3] = {2, 3, 5}, sb[3] = {2, 3, 5}, sc[3] = {2, 3, 5};
            sb[dim] += 1;
            sc[dim] -= 1;
            Tensor *a = tensor_new(3, sa, true), *b = tensor_new(3, form == 1 ? sa : sb, true);
            Tensor *c = tensor_new(3, sc, false);
            fill_normal(a, 110 + dim, 1.0);
            fill_normal(b, 120 + dim, 1.0);
            fill_normal(c, 130 + dim, 1.0);
            ConcatCtx cc = {form == 3 ? dim - 3 : dim, form};
            char label[48];
            snprintf(label, sizeof label, "concat dim %d form %d", cc.dim, form);
            cuda_check_op(label, f_concat, (Tensor *[]){a, b, c}, 3, &cc);
            tensor_free(a);
            tensor_free(b);
            tensor_free(c);
        }
}
