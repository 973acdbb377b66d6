// ops_loss.c: softmax over the last dimension and the fused log-softmax +
// cross-entropy loss.
//
// Both are row loops (a row = the last dimension), parallel over rows when
// the input is large; each row is stabilised by subtracting its maximum and
// sums its exponentials in double.
#include <string.h>

#include "ops.h"
#include "ops_math.h"
#include "ops_vexp.h"

// ---- softmax ----

// x, y: (rows, V)
static void softmax_forward(Node *n) {
    const Tensor *x = n->in[0];
    int V = x->shape[x->ndim - 1];
    int64_t rows = tensor_rows(x);
    real *y = n->out[0]->data;
#pragma omp parallel for if (x->numel > OPS_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const real *xr = x->data + r * V;
        real *yr = y + r * V;
        real m = xr[0];
        for (int j = 1; j < V; j++) m = xr[j] > m ? xr[j] : m;
        double s = 0;
        for (int j = 0; j < V; j++) {
            yr[j] = r_exp(xr[j] - m);
            s += yr[j];
        }
        real inv = (real)(1.0 / s);
        for (int j = 0; j < V; j++) yr[j] *= inv;
    }
}

// dx = y * (dy - <dy, y>) per row.
static void softmax_backward(Node *n) {
    real *dx = NODE_GRAD_IN(n, 0);
    if (!dx) return;
    const Tensor *yt = n->out[0];
    int V = yt->shape[yt->ndim - 1];
    int64_t rows = tensor_rows(yt);
#pragma omp parallel for if (yt->numel > OPS_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const real *y = yt->data + r * V, *g = yt->grad + r * V;
        double dot = 0;
        for (int j = 0; j < V; j++) dot += (double)g[j] * y[j];
        for (int j = 0; j < V; j++) dx[r * V + j] += y[j] * (g[j] - (real)dot);
    }
}

static const OpDef OP_SOFTMAX = {"softmax", softmax_forward, softmax_backward,
                                 CUDA_PAIR(cu_softmax_forward, cu_softmax_backward)};

Tensor *op_softmax(Tape *tp, Tensor *x) {
    ASSERT(x->shape[x->ndim - 1] > 0, "softmax: empty last dimension in %s", SHAPE(x));
    Tensor *y = tape_tensor(tp, x->ndim, x->shape);
    tape_run(tp, &OP_SOFTMAX, &x, 1, &y, 1);
    return y;
}

// ---- cross-entropy ----

typedef struct CeSaved {
    real *lse;      // (rows) log-sum-exp of each row
    double denom;   // what the sum is divided by: the rows with a target >= 0, scaled to the whole
                    // batch (Tape.loss_rows); 0 when every target is ignored
} CeSaved;

// aux: targets (rows). iarg: 0 the logits' dim 0 (B), 1 the whole batch's
// (Tape.loss_rows; B in one process). out: (1), the sum over counted rows of
// lse - x[target] divided by count x iarg[1] / iarg[0]: the mean over counted
// rows, or this share's part of the whole batch's mean (exact when every row
// of the batch counts as many targets). 0, with a zero gradient, when every
// target is ignored.
static void ce_forward(Node *n) {
    const Tensor *x = n->in[0];
    const int *tg = n->aux;
    int V = x->shape[x->ndim - 1];
    int64_t rows = tensor_rows(x);
    Tape *tp = n->tape;
    double *loss = tape_alloc(tp, (size_t)(rows ? rows : 1) * sizeof(double));   // (rows)
    real *lse = n->recorded ? tape_alloc(tp, (size_t)(rows ? rows : 1) * sizeof(real)) : NULL;
#pragma omp parallel for if (x->numel > OPS_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const real *xr = x->data + r * V;
        real m = xr[0];
#pragma omp simd reduction(max : m)
        for (int j = 1; j < V; j++) m = xr[j] > m ? xr[j] : m;
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (int j = 0; j < V; j++) s += r_exp(xr[j] - m);
        double l = (double)m + log(s);
        if (lse) lse[r] = (real)l;
        loss[r] = tg[r] >= 0 ? l - (double)xr[tg[r]] : 0.0;
    }
    // The reduction in a fixed order: the same value for any thread count.
    double sum = 0;
    int count = 0;
    for (int64_t r = 0; r < rows; r++) {
        sum += loss[r];
        count += tg[r] >= 0;
    }
    double denom = (double)count * n->iarg[1] / n->iarg[0];
    n->out[0]->data[0] = (real)(count ? sum / denom : 0.0);
    if (n->recorded) {
        CeSaved *sv = tape_alloc(tp, sizeof *sv);
        sv->lse = lse;
        sv->denom = denom;
        n->saved = sv;
    }
}

// dlogits = dloss * (softmax - onehot(target)) / denom on counted rows.
static void ce_backward(Node *n) {
    bool fresh;
    real *dx = NODE_GRAD_FRESH(n, 0, &fresh);
    const CeSaved *sv = n->saved;
    const Tensor *x = n->in[0];
    if (!dx) return;
    if (sv->denom == 0) {   // every target ignored: a zero gradient
        if (fresh) memset(dx, 0, (size_t)x->numel * sizeof(real));
        return;
    }
    const int *tg = n->aux;
    int V = x->shape[x->ndim - 1];
    int64_t rows = tensor_rows(x);
    real c = n->out[0]->grad[0] / (real)sv->denom;
#pragma omp parallel for if (x->numel > OPS_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        real *d = dx + r * V;
        if (tg[r] < 0) {
            if (fresh) memset(d, 0, (size_t)V * sizeof(real));
            continue;
        }
        const real *xr = x->data + r * V;
        real l = sv->lse[r];
#ifdef OPS_VEXP
        for (int j = 0; j < V; j += 16) {
            __mmask16 m = v_lanes(j, V);
            __m512 e = v_exp(_mm512_sub_ps(v_load(xr + j, m), _mm512_set1_ps(l)));
            v_grad(d + j, m, _mm512_set1_ps(c), e, fresh, true);
        }
#else
        if (fresh)
            for (int j = 0; j < V; j++) d[j] = c * r_exp(xr[j] - l);
        else
            for (int j = 0; j < V; j++) d[j] += c * r_exp(xr[j] - l);
#endif
        d[tg[r]] -= c;
    }
}

static const OpDef OP_CROSS_ENTROPY = {"cross_entropy", ce_forward, ce_backward,
                                       CUDA_PAIR(cu_ce_forward, cu_ce_backward)};

Tensor *op_cross_entropy(Tape *tp, Tensor *logits, const int *targets) {
    int V = logits->shape[logits->ndim - 1];
    ASSERT(V > 0, "cross_entropy: empty class dimension in logits %s", SHAPE(logits));
    int64_t rows = tensor_rows(logits);
    int *copy = tape_alloc(tp, (size_t)(rows ? rows : 1) * sizeof(int));
    for (int64_t r = 0; r < rows; r++) {
        ASSERT(targets[r] < V, "cross_entropy: target %d at row %lld is outside [0, %d) of logits %s",
               targets[r], (long long)r, V, SHAPE(logits));
        copy[r] = targets[r];
    }
    dev_note_copy(copy, targets, (size_t)rows * sizeof(int));   // (a graph's capture traces them to the batch)
    Tensor *loss = tape_tensor(tp, 1, (int[]){1});
    Node *n = tape_op(tp, &OP_CROSS_ENTROPY, &logits, 1, &loss, 1);
    n->aux = copy;
    n->iarg[0] = logits->ndim > 1 ? logits->shape[0] : 1;
    n->iarg[1] = tape_loss_rows(tp, n->iarg[0], "cross_entropy");
    tape_forward(n);
    return loss;
}
