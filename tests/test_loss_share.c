// test_loss_share.c: a loss over a share of a larger batch (Tape.loss_rows),
// as an MPI rank builds its training loss. For cross_entropy, dsa_kl and
// dsa_sel_kl: the shares' losses sum to the whole batch's loss, and every
// row's gradient has the same bits as with the whole batch on one tape (so
// bf16 products round a rank's gradients as one process rounds them).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsa_kernel.h"
#include "dsa_sel_kl.h"
#include "test_util.h"

typedef struct Share Share;
// The loss of rows [lo, hi) of the batch: in[] and fixed hold those rows only.
typedef Tensor *(*ShareLoss)(Tape *tp, Tensor *const *in, const Tensor *fixed, int lo, const Share *s);

struct Share {
    const char *name;
    int B;               // rows of the whole batch (dim 0)
    int n_in;            // inputs taking a gradient, (B, ...)
    Tensor *in[3];
    Tensor *fixed;       // an input without gradient (a KL's target), (B, ...), or NULL
    ShareLoss loss;
    const int *ids;      // the targets or the selection: ids_per_row per row of dim 0
    int ids_per_row;
    int K, HI;           // dsa_sel_kl's
};

// Rows [lo, hi) of t (dim 0) in a tensor of their own.
static Tensor *rows_of(const Tensor *t, int lo, int hi) {
    int shape[TENSOR_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = hi - lo;
    Tensor *r = tensor_new(t->ndim, shape, t->requires_grad);
    int64_t per = t->numel / t->shape[0];
    memcpy(r->data, t->data + lo * per, (size_t)(r->numel * (int64_t)sizeof(real)));
    return r;
}

// Runs the loss over the shares cut at cuts[] (0 < cut < B, increasing) with
// loss_rows = B and compares them with the whole batch on one tape.
static void check_shares(const Share *s, const int *cuts, int n_cuts) {
    Tape tp;
    tape_init(&tp);
    for (int i = 0; i < s->n_in; i++) memset(s->in[i]->grad, 0, (size_t)s->in[i]->numel * sizeof(real));
    Tensor *whole = s->loss(&tp, s->in, s->fixed, 0, s);
    double whole_loss = whole->data[0], sum = 0;
    tape_backward(&tp, whole);
    tape_reset(&tp);
    int lo = 0;
    for (int c = 0; c <= n_cuts; c++) {
        int hi = c < n_cuts ? cuts[c] : s->B;
        Tensor *in[3], *fixed = s->fixed ? rows_of(s->fixed, lo, hi) : NULL;
        for (int i = 0; i < s->n_in; i++) {
            in[i] = rows_of(s->in[i], lo, hi);
            memset(in[i]->grad, 0, (size_t)in[i]->numel * sizeof(real));
        }
        tp.loss_rows = s->B;
        Tensor *l = s->loss(&tp, in, fixed, lo, s);
        sum += l->data[0];
        tape_backward(&tp, l);
        tape_reset(&tp);
        for (int i = 0; i < s->n_in; i++) {
            int64_t per = in[i]->numel / in[i]->shape[0];
            const real *want = s->in[i]->grad + lo * per;
            for (int64_t j = 0; j < in[i]->numel; j++)
                cr_assert(in[i]->grad[j] == want[j], "%s: rows %d..%d, input %d, [%lld]: %.9g, the whole batch %.9g",
                          s->name, lo, hi - 1, i, (long long)j, (double)in[i]->grad[j], (double)want[j]);
        }
        // Without loss_rows the share is a mean of its own: its gradient is B / (hi - lo) times larger.
        tp.loss_rows = 0;
        memset(in[0]->grad, 0, (size_t)in[0]->numel * sizeof(real));
        l = s->loss(&tp, in, fixed, lo, s);
        tape_backward(&tp, l);
        tape_reset(&tp);
        double own = 0, share = 0;
        const real *want = s->in[0]->grad + lo * (in[0]->numel / in[0]->shape[0]);
        for (int64_t j = 0; j < in[0]->numel; j++) own += fabs(in[0]->grad[j]), share += fabs(want[j]);
        cr_assert(share > 0 && fabs(own / share - (double)s->B / (hi - lo)) < 1e-4, "%s: own mean / share %g, want %g",
                  s->name, own / share, (double)s->B / (hi - lo));
        for (int i = 0; i < s->n_in; i++) tensor_free(in[i]);
        tensor_free(fixed);
        lo = hi;
    }
    cr_assert(fabs(sum - whole_loss) <= 8 * REAL_EPS * fabs(whole_loss), "%s: the shares sum to %.9g, the batch %.9g",
              s->name, sum, whole_loss);
    tape_free(&tp);
}

static Tensor *ce_loss(Tape *tp, Tensor *const *in, const Tensor *fixed, int lo, const Share *s) {
    (void)fixed;
    return op_cross_entropy(tp, in[0], s->ids + (int64_t)lo * s->ids_per_row);
}

static Tensor *kl_loss(Tape *tp, Tensor *const *in, const Tensor *fixed, int lo, const Share *s) {
    (void)lo, (void)s;
    return op_dsa_kl(tp, in[0], (Tensor *)fixed, NULL);
}

static Tensor *sel_kl_loss(Tape *tp, Tensor *const *in, const Tensor *fixed, int lo, const Share *s) {
    return op_dsa_sel_kl(tp, in[0], in[1], in[2], s->ids + (int64_t)lo * s->ids_per_row, s->K, (Tensor *)fixed, s->HI);
}

Test(loss_share, cross_entropy_shares_have_the_whole_batchs_row_gradients) {
    int B = 5, T = 6, V = 17;
    Tensor *x = tensor_newv(true, 3, B, T, V);
    fill_normal(x, 11, 2.0);
    int *tg = malloc((size_t)B * T * sizeof(int));
    for (int r = 0; r < B * T; r++) tg[r] = (r * 7 + 3) % V;
    Share s = {"cross_entropy", B, 1, {x}, NULL, ce_loss, tg, T, 0, 0};
    check_shares(&s, (int[]){3}, 1);      // 3, 2 (2 ranks)
    check_shares(&s, (int[]){2, 4}, 2);   // 2, 2, 1 (3 ranks)
    // A tape whose batch is smaller than the loss's rows is refused.
    Tape tp;
    tape_init(&tp);
    tp.loss_rows = 4;
    cr_assert(EXPECT_FAILURE(op_cross_entropy(&tp, x, tg)));
    cr_assert(strstr(ag_last_error(), "cross_entropy") && strstr(ag_last_error(), "4 rows"), "%s", ag_last_error());
    tape_free(&tp);
    free(tg);
    tensor_free(x);
}

Test(loss_share, dsa_kl_shares_have_the_whole_batchs_row_gradients) {
    int B = 4, T = 9, H = 2, dk = 4;
    Tensor *q = tensor_newv(false, 3, B, T, H * dk), *k = tensor_newv(false, 3, B, T, H * dk);
    fill_normal(q, 21, 1.0);
    fill_normal(k, 22, 1.0);
    Tensor *p = tensor_newv(false, 3, B, T, T), *Isc = tensor_newv(true, 3, B, T, T);
    dsa_attn_target(p->data, q->data, k->data, B, T, H, dk, 0.5, NULL);
    fill_normal(Isc, 23, 1.0);
    Share s = {"dsa_kl", B, 1, {Isc}, p, kl_loss, NULL, 0, 0, 0};
    check_shares(&s, (int[]){1}, 1);
    check_shares(&s, (int[]){1, 3}, 2);
    tensor_free(q);
    tensor_free(k);
    tensor_free(p);
    tensor_free(Isc);
}

Test(loss_share, dsa_sel_kl_shares_have_the_whole_batchs_row_gradients) {
    int B = 3, T = 8, H = 2, dk = 4, HI = 2, dI = 4, K = 4;
    Tensor *q = tensor_newv(false, 3, B, T, H * dk), *k = tensor_newv(false, 3, B, T, H * dk);
    fill_normal(q, 31, 1.0);
    fill_normal(k, 32, 1.0);
    Tensor *qI = tensor_newv(true, 3, B, T, HI * dI), *kI = tensor_newv(true, 3, B, T, dI);
    Tensor *w = tensor_newv(true, 3, B, T, HI);
    fill_normal(qI, 33, 1.0);
    fill_normal(kI, 34, 1.0);
    fill_normal(w, 35, 1.0);
    int *sel = malloc((size_t)B * T * K * sizeof(int));   // the last K positions up to t
    for (int r = 0; r < B * T; r++)
        for (int j = 0; j < K; j++) {
            int t = r % T, s0 = t - j;
            sel[r * K + j] = s0 >= 0 ? s0 : -1;
        }
    Tensor *p = tensor_newv(false, 3, B, T, K);
    dsa_sparse_target(p->data, q->data, k->data, sel, B, T, K, H, dk, 0.5);
    Share s = {"dsa_sel_kl", B, 3, {qI, kI, w}, p, sel_kl_loss, sel, T * K, K, HI};
    check_shares(&s, (int[]){2}, 1);
    check_shares(&s, (int[]){1, 2}, 2);
    free(sel);
    tensor_free(q);
    tensor_free(k);
    tensor_free(qI);
    tensor_free(kI);
    tensor_free(w);
    tensor_free(p);
}
