// transpose, slice, concat: gradients, values, errors.
#include <string.h>

#include "test_util.h"

typedef struct {
    int a, b;
} DimPair;

static int f_transpose(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    DimPair *d = ctx;
    out[0] = op_transpose(tp, in[0], d->a, d->b);
    return 1;
}

Test(ops_shape, transpose_gradcheck_3d_and_4d) {
    Tensor *x4 = tensor_newv(true, 4, 2, 3, 4, 5);
    fill_normal(x4, 1, 1.0);
    DimPair pairs4[] = {{1, 3}, {0, 2}, {2, 3}, {-1, -4}};
    for (int k = 0; k < 4; k++) {
        GradcheckResult r = gradcheck("transpose4", f_transpose, &x4, 1, &pairs4[k], NULL);
        ASSERT_GRADCHECK(r, "transpose 4-d");
    }
    Tensor *x3 = tensor_newv(true, 3, 3, 7, 2);
    fill_normal(x3, 2, 1.0);
    DimPair p3 = {0, -1};
    GradcheckResult r = gradcheck("transpose3", f_transpose, &x3, 1, &p3, NULL);
    ASSERT_GRADCHECK(r, "transpose 3-d");
    tensor_free(x4);
    tensor_free(x3);
}

Test(ops_shape, transpose_values) {
    Tape tp;
    tape_init(&tp);
    int A = 2, B = 3, C = 4, D = 5;
    Tensor *x = tensor_newv(false, 4, A, B, C, D);
    for (int64_t i = 0; i < x->numel; i++) x->data[i] = (real)i;
    Tensor *y = op_transpose(&tp, x, 1, 3);   // (A, D, C, B)
    cr_assert(y->shape[0] == A && y->shape[1] == D && y->shape[2] == C && y->shape[3] == B);
    for (int a = 0; a < A; a++)
        for (int b = 0; b < B; b++)
            for (int c = 0; c < C; c++)
                for (int d = 0; d < D; d++)
                    cr_assert_eq(y->data[((a * D + d) * C + c) * B + b], x->data[((a * B + b) * C + c) * D + d]);
    // A 2-d transpose is the matrix transpose; twice is the identity.
    Tensor *m = tensor_newv(false, 2, 3, 4);
    for (int i = 0; i < 12; i++) m->data[i] = (real)i;
    Tensor *mt = op_transpose(&tp, m, 0, 1);
    cr_assert(mt->shape[0] == 4 && mt->shape[1] == 3);
    cr_assert_eq(mt->data[1], 4);   // mt[0][1] = m[1][0]
    Tensor *mtt = op_transpose(&tp, mt, 1, 0);
    cr_assert_eq(memcmp(mtt->data, m->data, 12 * sizeof(real)), 0);
    tensor_free(x);
    tensor_free(m);
    tape_free(&tp);
}

typedef struct {
    int dim, start, len;
} SliceCtx;

static int f_slice(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    SliceCtx *s = ctx;
    out[0] = op_slice(tp, in[0], s->dim, s->start, s->len);
    return 1;
}

Test(ops_shape, slice_gradcheck_every_dim) {
    Tensor *x = tensor_newv(true, 4, 3, 4, 5, 6);
    fill_normal(x, 3, 1.0);
    SliceCtx cs[] = {{0, 1, 2}, {1, 0, 3}, {2, 2, 3}, {3, 5, 1}, {-1, 1, 4}};
    for (int k = 0; k < 5; k++) {
        GradcheckResult r = gradcheck("slice", f_slice, &x, 1, &cs[k], NULL);
        ASSERT_GRADCHECK(r, "slice");
    }
    tensor_free(x);
}

static int f_concat(Tape *tp, Tensor *const *in, int n, void *ctx, Tensor **out) {
    out[0] = op_concat(tp, in, n, *(int *)ctx);
    return 1;
}

Test(ops_shape, concat_gradcheck_three_inputs) {
    // Along dim 1 of (2, ., 3, 4) with sizes 1, 3, 2; along the last dim of (2, 7, .).
    Tensor *a = tensor_newv(true, 4, 2, 1, 3, 4), *b = tensor_newv(true, 4, 2, 3, 3, 4),
           *c = tensor_newv(true, 4, 2, 2, 3, 4);
    fill_normal(a, 4, 1.0);
    fill_normal(b, 5, 1.0);
    fill_normal(c, 6, 1.0);
    int dim = 1;
    GradcheckResult r = gradcheck("concat", f_concat, (Tensor *[]){a, b, c}, 3, &dim, NULL);
    ASSERT_GRADCHECK(r, "concat dim 1");
    Tensor *p = tensor_newv(true, 3, 2, 7, 2), *q = tensor_newv(false, 3, 2, 7, 5);
    fill_normal(p, 7, 1.0);
    fill_normal(q, 8, 1.0);
    dim = -1;
    r = gradcheck("concat", f_concat, (Tensor *[]){p, q}, 2, &dim, NULL);   // q held fixed
    ASSERT_GRADCHECK(r, "concat last dim");
    tensor_free(a);
    tensor_free(b);
    tensor_free(c);
    tensor_free(p);
    tensor_free(q);
}

Test(ops_shape, slices_concat_back_to_the_input) {
    Tape tp;
    tape_init(&tp);
    Tensor *x = tensor_newv(false, 3, 2, 7, 5);
    fill_normal(x, 9, 1.0);
    for (int dim = 0; dim < 3; dim++) {
        int S = x->shape[dim], cut = S / 2;
        Tensor *parts[] = {op_slice(&tp, x, dim, 0, cut), op_slice(&tp, x, dim, cut, S - cut)};
        Tensor *y = op_concat(&tp, parts, 2, dim);
        cr_assert(tensor_same_shape(x, y));
        cr_assert_eq(memcmp(x->data, y->data, (size_t)x->numel * sizeof(real)), 0, "dim %d", dim);
    }
    // A direct value: x[1, 3:5, 2] from a slice along dim 1.
    Tensor *s = op_slice(&tp, x, 1, 3, 2);
    cr_assert(s->shape[0] == 2 && s->shape[1] == 2 && s->shape[2] == 5);
    cr_assert_eq(s->data[(1 * 2 + 1) * 5 + 2], x->data[(1 * 7 + 4) * 5 + 2]);
    tensor_free(x);
    tape_free(&tp);
}

Test(ops_shape, bad_shapes_name_the_op) {
    Tape tp;
    tape_init(&tp);
    Tensor *a = tensor_newv(false, 3, 2, 3, 4), *b = tensor_newv(false, 3, 2, 5, 6);
    cr_assert(EXPECT_FAILURE(op_concat(&tp, (Tensor *[]){a, b}, 2, 1)));
    cr_assert(strstr(ag_last_error(), "concat") && strstr(ag_last_error(), "(2, 3, 4)") &&
                  strstr(ag_last_error(), "(2, 5, 6)"),
              "got: %s", ag_last_error());
    cr_assert(EXPECT_FAILURE(op_slice(&tp, a, 2, 3, 2)));
    cr_assert(strstr(ag_last_error(), "slice") && strstr(ag_last_error(), "(2, 3, 4)"), "got: %s",
              ag_last_error());
    cr_assert(EXPECT_FAILURE(op_transpose(&tp, a, 0, 3)));
    cr_assert(strstr(ag_last_error(), "transpose") && strstr(ag_last_error(), "(2, 3, 4)"), "got: %s",
              ag_last_error());
    tensor_free(a);
    tensor_free(b);
    tape_free(&tp);
}
