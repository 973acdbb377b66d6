// test_cuda_loss.c: the embedding, softmax and cross-entropy on the GPU
// against the CPU: odd widths, a GPT-2-sized vocabulary, repeated and
// skewed ids, ignored targets, gradients written fresh and accumulated, the
// table tied to the LM head, and runs that repeat bit for bit.
#include <criterion/criterion.h>
#include <stdarg.h>
#include <string.h>

#include "cuda_check.h"
#include "device.h"
#include "ops.h"
#include "rng.h"

#define GPT2_VOCAB 50257

// n ids in [0, V): with probability 1/skew the id `hot`, else uniform
// (skew 0: uniform only).
static int *random_ids(int64_t n, int V, uint64_t seed, int skew, int hot) {
    int *ids = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    Rng r;
    rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++)
        ids[i] = skew && rng_below(&r, (uint64_t)skew) == 0 ? hot : (int)rng_below(&r, (uint64_t)V);
    return ids;
}

// n targets in [0, V), every `every`-th one ignored (-1, or -100 on odd rows).
static int *random_targets(int64_t n, int V, uint64_t seed, int every) {
    int *tg = random_ids(n, V, seed, 0, 0);
    for (int64_t i = 0; every && i < n; i++)
        if (i % every == every - 1) tg[i] = i % 2 ? -100 : -1;
    return tg;
}

// ---------------------------------------------------------------- embedding

typedef struct {
    const int *ids, *ids2;   // ids2: a second lookup in the same table (NULL: none)
    int ndim;
    int shape[3];
    bool scaled;             // also E * 0.5, built last: its gradient is written first
} EmbCtx;

static int f_embedding(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    EmbCtx *c = ctx;
    int k = 0;
    outs[k++] = op_embedding(tp, x[0], c->ids, c->ndim, c->shape);
    if (c->ids2) outs[k++] = op_embedding(tp, x[0], c->ids2, c->ndim, c->shape);
    if (c->scaled) outs[k++] = op_scale(tp, x[0], 0.5);
    return k;
}

Test(cuda_loss, embedding_odd_widths_and_id_shapes) {
    // D below, at and above the backward's 128-column blocks; ids of 1 to 3
    // dimensions from a small vocabulary, so ids repeat and rows go unused.
    int widths[] = {1, 5, 37, 128, 130, 300};
    int shapes[3][3] = {{29}, {3, 11}, {2, 3, 7}};
    for (int w = 0; w < 6; w++)
        for (int s = 0; s < 3; s++) {
            int D = widths[w], V = 13;
            EmbCtx c = {NULL, NULL, s + 1, {0}, false};
            int64_t rows = 1;
            for (int i = 0; i <= s; i++) rows *= (c.shape[i] = shapes[s][i]);
            int *ids = random_ids(rows, V, 100 + w * 3 + s, 0, 0);
            ids[0] = ids[rows - 1] = 4;   // repeated for sure
            c.ids = ids;
            Tensor *E = cuda_input_std(true, 10 + w, 1.0, 2, V, D);
            char label[64];
            snprintf(label, sizeof label, "embedding D %d, ids of %d dims", D, s + 1);
            cuda_check_op(label, f_embedding, &E, 1, &c);
            tensor_free(E);
            free(ids);
        }
}

Test(cuda_loss, embedding_gradient_accumulates) {
    // Two lookups in one table and E * 0.5 built after them: the scale's
    // backward writes dE fresh, then each lookup adds its rows. Without the
    // scale the second lookup's backward finds dE fresh (zeroes it) and the
    // first adds.
    int V = 23, D = 45;
    int *ids = random_ids(35, V, 7, 3, 2), *ids2 = random_ids(35, V, 8, 3, 2);
    for (int scaled = 0; scaled < 2; scaled++) {
        EmbCtx c = {ids, ids2, 2, {5, 7}, scaled};
        Tensor *E = cuda_input_std(true, 3, 1.0, 2, V, D);
        cuda_check_op(scaled ? "two lookups and a scale" : "two lookups", f_embedding, &E, 1, &c);
        tensor_free(E);
    }
    free(ids);
    free(ids2);
}

Test(cuda_loss, embedding_gpt2_table_many_rows) {
    // B*T = 65536 positions in a GPT-2 table, a third of them one id (a long
    // run for one block of the backward); then every position one id.
    int V = GPT2_VOCAB, D = 40;
    int *ids = random_ids(65536, V, 11, 3, 198);
    EmbCtx c = {ids, NULL, 2, {8, 8192}, false};
    Tensor *E = cuda_input_std(true, 5, 1.0, 2, V, D);
    cuda_check_op("embedding 65536 positions, V 50257", f_embedding, &E, 1, &c);
    tensor_free(E);
    EmbCtx one = {ids, NULL, 1, {20000}, false};
    Tensor *E2 = cuda_input_std(true, 6, 1.0, 2, 300, 33);
    for (int i = 0; i < 20000; i++) ids[i] = 299;
    cuda_check_op("embedding 20000 positions, one id", f_embedding, &E2, 1, &one);
    tensor_free(E2);
    free(ids);
}

// ---------------------------------------------------------------- softmax

static int f_softmax(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    outs[0] = op_softmax(tp, x[0]);
    if (ctx) outs[1] = op_scale(tp, x[0], -0.25);   // built last: dx written first, softmax adds
    return ctx ? 2 : 1;
}

Test(cuda_loss, softmax_rows_of_every_width) {
    struct {
        int nd, s[3];
    } cases[] = {{3, {2, 3, 7}}, {2, {5, 1}}, {2, {3, 1000}}, {2, {6, 513}}, {2, {4, GPT2_VOCAB}}, {3, {2, 2, 33}}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int add = 0; add < 2; add++) {
            Tensor *x = tensor_new(cases[k].nd, cases[k].s, true);
            fill_normal(x, 20 + k, 3.0);
            int V = cases[k].s[cases[k].nd - 1];
            for (int j = 0; j < V; j++) x->data[j] += 1000;   // a row a naive exp overflows
            char label[64];
            snprintf(label, sizeof label, "softmax %s%s", SHAPE(x), add ? ", accumulated" : "");
            cuda_check_op(label, f_softmax, &x, 1, add ? (void *)1 : NULL);
            tensor_free(x);
        }
}

// ---------------------------------------------------------------- cross-entropy

typedef struct {
    const int *targets;
    bool softmax_too;   // also softmax(x), built last: dx written first, the loss adds
} CeCtx;

static int f_ce(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    CeCtx *c = ctx;
    outs[0] = op_cross_entropy(tp, x[0], c->targets);
    if (c->softmax_too) outs[1] = op_softmax(tp, x[0]);
    return c->softmax_too ? 2 : 1;
}

Test(cuda_loss, cross_entropy_small_and_gpt2_vocabularies) {
    struct {
        int nd, s[3];
    } cases[] = {{3, {2, 3, 11}}, {2, {7, 1}}, {2, {9, 700}}, {3, {2, 12, GPT2_VOCAB}}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int add = 0; add < 2; add++) {
            Tensor *x = tensor_new(cases[k].nd, cases[k].s, true);
            fill_normal(x, 30 + k, 3.0);
            int V = cases[k].s[cases[k].nd - 1];
            int64_t rows = x->numel / V;
            int *tg = random_targets(rows, V, 40 + k, 4);
            tg[0] = 0;
            if (rows > 2) tg[2] = V - 1;   // both ends of the row
            CeCtx c = {tg, add};
            char label[64];
            snprintf(label, sizeof label, "cross_entropy %s%s", SHAPE(x), add ? ", accumulated" : "");
            cuda_check_op(label, f_ce, &x, 1, &c);
            tensor_free(x);
            free(tg);
        }
}

Test(cuda_loss, cross_entropy_every_target_ignored) {
    // The CPU's loss is 0 with a zero gradient: the GPU must write those
    // zeros whole when the buffer is fresh (NaN in float64) and leave the
    // softmax's gradient as it is when it adds.
    int none[] = {-1, -100, -1, -1, -7, -1};
    for (int add = 0; add < 2; add++) {
        Tensor *x = cuda_input_std(true, 50, 2.0, 2, 6, 19);
        CeCtx c = {none, add};
        cuda_check_op(add ? "every target ignored, accumulated" : "every target ignored", f_ce, &x, 1, &c);
        tensor_free(x);
    }
}

Test(cuda_loss, cross_entropy_without_gradient) {
    // Logits that take no gradient: nothing is recorded (no log-sum-exp
    // saved), the loss alone must agree.
    Tensor *x = cuda_input_std(false, 51, 2.0, 2, 10, 257);
    int *tg = random_targets(10, 257, 52, 3);
    CeCtx c = {tg, false};
    cuda_check_op("cross_entropy, no gradient", f_ce, &x, 1, &c);
    tensor_free(x);
    free(tg);
}

// ---------------------------------------------------------------- a tied LM head

typedef struct {
    const int *ids, *targets;
    int B, T;
} LmCtx;

// Embedding -> silu -> the same table as the output head -> cross-entropy.
// The head's product is built last, so its backward writes dE and the
// lookup adds its rows to it.
static int f_tied_lm(Tape *tp, Tensor *const *x, int n, void *ctx, Tensor **outs) {
    LmCtx *c = ctx;
    Tensor *h = op_silu(tp, op_embedding(tp, x[0], c->ids, 2, (int[]){c->B, c->T}));
    outs[0] = op_cross_entropy(tp, op_matmul(tp, h, x[0], false, true), c->targets);
    return 1;
}

Test(cuda_loss, tied_lm_head) {
    int vocab[] = {37, GPT2_VOCAB}, dims[] = {16, 24};
    for (int k = 0; k < 2; k++) {
        int V = vocab[k], D = dims[k], B = 2, T = 13;
        int *ids = random_ids(B * T, V, 60 + k, 4, 5), *tg = random_targets(B * T, V, 62 + k, 5);
        LmCtx c = {ids, tg, B, T};
        Tensor *E = cuda_input_std(true, 64 + k, 0.5, 2, V, D);
        char label[48];
        snprintf(label, sizeof label, "tied LM head, V %d", V);
        cuda_check_op(label, f_tied_lm, &E, 1, &c);
        tensor_free(E);
        free(ids);
        free(tg);
    }
}

Test(cuda_loss, a_tied_step_repeats_bit_for_bit) {
    // The tied LM three times on one GPU tape: the same loss and the same
    // whole table gradient, bit for bit (no timing-dependent sums).
    cuda_require();
    int V = 4099, D = 48, B = 4, T = 512;
    int *ids = random_ids(B * T, V, 70, 5, 11), *tg = random_targets(B * T, V, 71, 9);
    LmCtx c = {ids, tg, B, T};
    Tensor *E = cuda_input_std(true, 72, 0.5, 2, V, D);
    size_t bytes = (size_t)E->numel * sizeof(real);
    real loss[3], *dE[3];
    Tape tp;
    tape_init_on(&tp, DEVICE_CUDA);
    for (int s = 0; s < 3; s++) {
        Tensor *e = tape_tensor_copy(&tp, 2, E->shape, E->data);
        e->requires_grad = true;
        Tensor *out;
        f_tied_lm(&tp, &e, 1, &c, &out);
        tape_backward(&tp, out);
        dE[s] = xmalloc(bytes);
        dev_to_host(&loss[s], out->data, sizeof(real), DEVICE_CUDA);
        dev_to_host(dE[s], e->grad, bytes, DEVICE_CUDA);
        tape_reset(&tp);
    }
    for (int s = 1; s < 3; s++) {
        cr_assert(loss[s] == loss[0], "step %d: loss %.9g, step 0: %.9g", s, (double)loss[s], (double)loss[0]);
        cr_assert(memcmp(dE[s], dE[0], bytes) == 0, "step %d: the table's gradient differs from step 0's", s);
    }
    for (int s = 0; s < 3; s++) free(dE[s]);
    tape_free(&tp);
    tensor_free(E);
    free(ids);
    free(tg);
}
