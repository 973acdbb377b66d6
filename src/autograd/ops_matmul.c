// ops_matmul.c: batched matrix product with either operand transposed.
#include "blas.h"
#include "ops.h"
#include "ops_math.h"

// ---- narrow products: rows (R, K) times a weight (K, N) with N <= NARROW_N ----
//
// A projection to a handful of outputs (dt and beta: one per head) is a
// product OpenBLAS runs at a tenth of its usual speed (its kernels are built
// for wide tiles); these loops run over rows with the K-loop vectorised.
// Rows are split into a fixed number of blocks for the weight gradient, so
// the result does not depend on the thread count.
#define NARROW_N MATMUL_NARROW_N
#define NARROW_ROW_BLOCK 256

// c (R, N) = x (R, K) w (K, N), wt = w transposed (N, K).
static void narrow_forward(const real *x, const real *w, real *c, int R, int N, int K, real *wt) {
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) wt[(int64_t)j * K + k] = w[(int64_t)k * N + j];
#pragma omp parallel for if ((int64_t)R * K * N > OPS_PAR_MIN) schedule(static)
    for (int r = 0; r < R; r++) {
        const real *xr = x + (int64_t)r * K;
        for (int j = 0; j < N; j++) {
            const real *wj = wt + (int64_t)j * K;
            real s = 0;
#pragma omp simd reduction(+ : s)   // without it the sum runs in order, one add at a time
            for (int k = 0; k < K; k++) s += xr[k] * wj[k];
            c[(int64_t)r * N + j] = s;
        }
    }
}

// dx (R, K) (=, when fresh, else +=) dc (R, N) w^T; wt: (N, K) scratch for w transposed.
static void narrow_backward_x(const real *dc, const real *w, real *dx, bool fresh, int R, int N, int K, real *wt) {
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) wt[(int64_t)j * K + k] = w[(int64_t)k * N + j];
#pragma omp parallel for if ((int64_t)R * K * N > OPS_PAR_MIN) schedule(static)
    for (int r = 0; r < R; r++) {
        real *d = dx + (int64_t)r * K;
        const real *g = dc + (int64_t)r * N;
        if (fresh)
            for (int k = 0; k < K; k++) d[k] = 0;
        for (int j = 0; j < N; j++) {
            real gj = g[j];
            const real *wj = wt + (int64_t)j * K;
            for (int k = 0; k < K; k++) d[k] += gj * wj[k];
        }
    }
}

// dw (K, N) (= or +=) x^T dc: per row block a (N, K) partial, summed in block order.
static void narrow_backward_w(const real *x, const real *dc, real *dw, bool fresh, int R, int N, int K,
                              real *part) {
    int nblk = (R + NARROW_ROW_BLOCK - 1) / NARROW_ROW_BLOCK;
#pragma omp parallel for if ((int64_t)R * K * N > OPS_PAR_MIN) schedule(static)
    for (int bi = 0; bi < nblk; bi++) {
        real *p = part + (int64_t)bi * N * K;   // (N, K)
        for (int64_t i = 0; i < (int64_t)N * K; i++) p[i] = 0;
        for (int r = bi * NARROW_ROW_BLOCK; r < imin(R, (bi + 1) * NARROW_ROW_BLOCK); r++) {
            const real *xr = x + (int64_t)r * K, *g = dc + (int64_t)r * N;
            for (int j = 0; j < N; j++) {
                real gj = g[j];
                real *pj = p + (int64_t)j * K;
                for (int k = 0; k < K; k++) pj[k] += gj * xr[k];
            }
        }
    }
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) {
            real s = 0;
            for (int bi = 0; bi < nblk; bi++) s += part[((int64_t)bi * N + j) * K + k];
            dw[(int64_t)k * N + j] = (fresh ? 0 : dw[(int64_t)k * N + j]) + s;
        }
}

// iarg: 0 ta, 1 tb, 2 M, 3 N, 4 K, 5 batches, 6 b batched
static void matmul_forward(Node *n) {
    Tensor *a = n->in[0], *b = n->in[1], *c = n->out[0];
    bool ta = n->iarg[0], tb = n->iarg[1], bb = n->iarg[6];
    int M = n->iarg[2], N = n->iarg[3], K = n->iarg[4], nb = n->iarg[5];
    int lda = ta ? M : K, ldb = tb ? K : N;
    if (!ta && !tb && !bb && N <= NARROW_N) {
        narrow_forward(a->data, b->data, c->data, nb * M, N, K, tape_alloc(n->tape, (size_t)N * K * sizeof(real)));
        return;
    }
    if (!ta && !bb) {   // a weight shared by every row: one big product
        gemm_rows(tb, nb * M, N, K, a->data, lda, b->data, ldb, 0, c->data, N);
        return;
    }
    for (int i = 0; i < nb; i++)
        gemm(ta, tb, M, N, K, 1, a->data + (int64_t)i * M * K, lda,
             b->data + (bb ? (int64_t)i * K * N : 0), ldb, 0, c->data + (int64_t)i * M * N, N);
}

static void matmul_backward(Node *n) {
    Tensor *a = n->in[0], *b = n->in[1], *c = n->out[0];
    bool ta = n->iarg[0], tb = n->iarg[1], bb = n->iarg[6];
    int M = n->iarg[2], N = n->iarg[3], K = n->iarg[4], nb = n->iarg[5];
    int lda = ta ? M : K, ldb = tb ? K : N;
    // A first contribution is written (beta 0), a later one added (beta 1).
    // da before db: when a and b are one tensor, db then adds to da's write.
    bool fa, fb;
    real *da = NODE_GRAD_FRESH(n, 0, &fa);
    real *db = NODE_GRAD_FRESH(n, 1, &fb);
    real ba = fa ? 0 : 1, bb_ = fb ? 0 : 1;
    const real *dc = c->grad;
    if (!ta && !tb && !bb && N <= NARROW_N && a != b) {
        int R = nb * M;
        if (da) narrow_backward_x(dc, b->data, da, fa, R, N, K, tape_alloc(n->tape, (size_t)N * K * sizeof(real)));
        if (db) {
            int nblk = (R + NARROW_ROW_BLOCK - 1) / NARROW_ROW_BLOCK;
            narrow_backward_w(a->data, dc, db, fb, R, N, K,
                              tape_alloc(n->tape, (size_t)nblk * N * K * sizeof(real)));
        }
        return;
    }
    if (!ta && !tb && !bb) {   // a weight (K, N) shared by every row: one parallel region for both gradients
        int R = nb * M;
        size_t np = db ? gemm_multi_scratch(1, K, &N, R) : 0;
        real *part = np ? tape_alloc(n->tape, np * sizeof(real)) : NULL;
        gemm_multi_backward(1, R, K, a->data, (const real *[]){b->data}, &N, (const real *[]){dc}, da, ba,
                            (real *[]){db}, &bb_, part);
        return;
    }
    if (!ta && !bb) {   // flattened rows, b stored (N, K) (tb: a tied LM head)
        int R = nb * M;
        // d A = dC B (R, K); dB = dC^T A (N, K)
        if (da) gemm_rows(false, R, K, N, dc, N, b->data, ldb, ba, da, lda);
        if (db) {
            size_t np = gemm_sum_rows_scratch(N, K, R);
            real *part = np ? tape_alloc(n->tape, np * sizeof(real)) : NULL;
            gemm_sum_rows(N, K, R, dc, N, a->data, lda, bb_, db, ldb, part);
        }
        return;
    }
    for (int i = 0; i < nb; i++) {
        const real *ai = a->data + (int64_t)i * M * K;
        const real *bi = b->data + (bb ? (int64_t)i * K * N : 0);
        const real *dci = dc + (int64_t)i * M * N;
        if (da) {
            real *dai = da + (int64_t)i * M * K;
            if (!ta) gemm(false, !tb, M, K, N, 1, dci, N, bi, ldb, ba, dai, lda);   // dC op(B)^T
            else gemm(tb, true, K, M, N, 1, bi, ldb, dci, N, ba, dai, lda);        // op(B) dC^T
        }
        if (db) {
            real *dbi = db + (bb ? (int64_t)i * K * N : 0);
            real beta = bb || i == 0 ? bb_ : 1;   // a shared b sums over the batches
            if (!tb) gemm(!ta, false, K, N, M, 1, ai, lda, dci, N, beta, dbi, ldb);  // op(A)^T dC
            else gemm(true, ta, N, K, M, 1, dci, N, ai, lda, beta, dbi, ldb);        // dC^T op(A)
        }
    }
}

static const OpDef OP_MATMUL = {"matmul", matmul_forward, matmul_backward,
                                 CUDA_PAIR(cu_matmul_forward, cu_matmul_backward)};

Tensor *op_matmul(Tape *tp, Tensor *a, Tensor *b, bool ta, bool tb) {
    ASSERT(a->ndim >= 2 && b->ndim >= 2, "matmul: operands need 2 or more dimensions, got a %s, b %s",
           SHAPE(a), SHAPE(b));
    int M = ta ? a->shape[a->ndim - 1] : a->shape[a->ndim - 2];
    int Ka = ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
    int Kb = tb ? b->shape[b->ndim - 1] : b->shape[b->ndim - 2];
    int N = tb ? b->shape[b->ndim - 2] : b->shape[b->ndim - 1];
    ASSERT(Ka == Kb, "matmul: inner dimensions differ: a %s%s, b %s%s (%d vs %d)", SHAPE(a),
           ta ? "^T" : "", SHAPE(b), tb ? "^T" : "", Ka, Kb);
    bool batched_b = b->ndim > 2;
    if (batched_b) {
        ASSERT(b->ndim == a->ndim, "matmul: batched b %s needs the same leading dimensions as a %s",
               SHAPE(b), SHAPE(a));
        for (int i = 0; i < a->ndim - 2; i++)
            ASSERT(a->shape[i] == b->shape[i], "matmul: leading dimensions differ: a %s, b %s", SHAPE(a),
                   SHAPE(b));
    }
    int shape[TENSOR_MAX_DIMS];
    for (int i = 0; i < a->ndim - 2; i++) shape[i] = a->shape[i];
    shape[a->ndim - 2] = M;
    shape[a->ndim - 1] = N;
    Tensor *c = tape_tensor(tp, a->ndim, shape);
    Node *n = tape_op(tp, &OP_MATMUL, (Tensor *[]){a, b}, 2, &c, 1);
    n->iarg[0] = ta;
    n->iarg[1] = tb;
    n->iarg[2] = M;
    n->iarg[3] = N;
    n->iarg[4] = Ka;
    n->iarg[5] = (int)(a->numel / ((int64_t)M * Ka));
    n->iarg[6] = batched_b;
    tape_forward(n);
    return c;
}

// ---- several products of one input: out_i = x w_i (gemm_rows_multi) ----
//
// in: x (..., K), then w_0 .. w_{m-1}, each (K, N_i); out_i (..., N_i).
// iarg: 0 m, 1 rows R (x's elements / K), 2 K.

static void multi_args(const Node *n, const real **B, int *N) {
    for (int i = 0; i < n->iarg[0]; i++) {
        B[i] = n->in[1 + i]->data;
        N[i] = n->in[1 + i]->shape[1];
    }
}

static void matmul_multi_forward(Node *n) {
    int m = n->iarg[0];
    const real *B[GEMM_MULTI_MAX];
    int N[GEMM_MULTI_MAX];
    real *C[GEMM_MULTI_MAX];
    multi_args(n, B, N);
    for (int i = 0; i < m; i++) C[i] = n->out[i]->data;
    gemm_rows_multi(m, n->iarg[1], n->iarg[2], n->in[0]->data, B, N, C);
}

static void matmul_multi_backward(Node *n) {
    int m = n->iarg[0], R = n->iarg[1], K = n->iarg[2];
    const real *B[GEMM_MULTI_MAX], *dC[GEMM_MULTI_MAX];
    int N[GEMM_MULTI_MAX];
    real *dB[GEMM_MULTI_MAX], beta_b[GEMM_MULTI_MAX];
    multi_args(n, B, N);
    for (int i = 0; i < m; i++) {   // an output nobody used has no gradient and adds nothing
        dC[i] = n->out[i]->grad;
        bool f = false;
        dB[i] = dC[i] ? NODE_GRAD_FRESH(n, 1 + i, &f) : NULL;
        beta_b[i] = f ? 0 : 1;
    }
    bool fx;
    real *dx = NODE_GRAD_FRESH(n, 0, &fx);
    size_t np = gemm_multi_scratch(m, K, N, R);
    real *part = np ? tape_alloc(n->tape, np * sizeof(real)) : NULL;
    gemm_multi_backward(m, R, K, n->in[0]->data, B, N, dC, dx, fx ? 0 : 1, dB, beta_b, part);
}

static const OpDef OP_MATMUL_MULTI = {"matmul_multi", matmul_multi_forward, matmul_multi_backward, NULL, NULL};

void op_matmul_multi(Tape *tp, Tensor *x, Tensor *const *w, int m, Tensor **out) {
    _Static_assert(MATMUL_MULTI_MAX == GEMM_MULTI_MAX, "ops.h and blas.h disagree on the products per call");
    ASSERT(m >= 1 && m <= MATMUL_MULTI_MAX, "matmul_multi: %d weights, 1 to %d", m, MATMUL_MULTI_MAX);
    ASSERT(x->ndim >= 2, "matmul_multi: x %s needs 2 or more dimensions", SHAPE(x));
    int K = x->shape[x->ndim - 1];
    ASSERT(K > 0, "matmul_multi: x %s has an empty last dimension", SHAPE(x));
    bool fused = m > 1 && tp->device == DEVICE_CPU;   // a GPU tape: op_matmul's kernels
    for (int i = 0; i < m; i++) {
        ASSERT(w[i] && w[i]->ndim == 2 && w[i]->shape[0] == K, "matmul_multi: weight %d %s must be (%d, N)", i,
               w[i] ? SHAPE(w[i]) : "(none)", K);
        ASSERT(w[i] != x, "matmul_multi: weight %d is x itself", i);
        for (int j = 0; j < i; j++) ASSERT(w[j] != w[i], "matmul_multi: weights %d and %d are one tensor", j, i);
        if (w[i]->shape[1] <= NARROW_N) fused = false;   // narrow products have loops of their own
    }
    if (!fused) {
        for (int i = 0; i < m; i++) out[i] = op_matmul(tp, x, w[i], false, false);
        return;
    }
    int shape[TENSOR_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) shape[d] = x->shape[d];
    for (int i = 0; i < m; i++) {
        shape[x->ndim - 1] = w[i]->shape[1];
        out[i] = tape_tensor(tp, x->ndim, shape);
    }
    Tensor *in[1 + MATMUL_MULTI_MAX] = {x};
    for (int i = 0; i < m; i++) in[1 + i] = w[i];
    Node *n = tape_op(tp, &OP_MATMUL_MULTI, in, 1 + m, out, m);
    n->iarg[0] = m;
    n->iarg[1] = (int)(x->numel / K);
    n->iarg[2] = K;
    tape_forward(n);
}
