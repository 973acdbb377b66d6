// ops_conv.c: causal depthwise 1-D convolution over time, no bias, alone or
// followed by SiLU as one op.
//
//   z[b,t,c] = sum_{j<W} w[c,j] * x[b, t-W+1+j, c]     (x = 0 before t = 0)
//   conv1d_causal: y = z          conv1d_silu: y = silu(z) = z sigmoid(z)
//
// The last weight column multiplies the current token. Rows (b, t) are
// flattened to r = b*T + t and every loop runs over channels innermost, so
// each access is contiguous and vectorises; wt (W, C) is w transposed for that.
//
// Backward, with gz = dL/dz (dy itself, or dy * silu'(z)):
//   dx[b,s,c] += sum_j w[c,j] gz[b, s+W-1-j, c]   (for s+W-1-j < T)
//   dw[c,j]   += sum_{b,t} gz[b,t,c] x[b, t-W+1+j, c]
// dx is a gather (each row written by one thread). dw is a reduction over all
// rows: they are cut into blocks whose number depends on the row count alone,
// never on the thread count; each block sums its rows into a partial (W, C)
// in `real`, and the partials are added in block order in double. The result
// is therefore the same for any number of threads.
//
// conv1d_silu saves nothing: its backward recomputes z from x and w (W
// multiply-adds per element) a tile of rows at a time, into per-thread
// scratch that stays in cache, instead of keeping z (or y) for the backward.
//
// Documents (docs.h): a position reads only inputs of its own document, as
// if its document were a sequence of its own: row (b, t) of a document that
// begins at f is computed as position t - f of a fresh sequence (x = 0
// before f), and the dx of row s sums the outputs t < end(s) of its
// document only. Forward and dx are then the same operations, in the same
// order, as on the documents cut into separate rows.
#include <omp.h>

#include "docs.h"
#include "ops.h"
#include "ops_math.h"
#include "ops_vexp.h"

// The dw reduction: at most CONV_MAX_BLOCKS row blocks of at least
// CONV_MIN_BLOCK_ROWS rows (fewer blocks for short inputs).
#define CONV_MAX_BLOCKS 32
#define CONV_MIN_BLOCK_ROWS 64
// Rows of gz the fused backward recomputes at once (plus W-1 rows of halo).
#define CONV_TILE_ROWS 64

// w (C, W) -> wt (W, C), from the tape's arena.
static real *conv_wt(Tape *tp, const Tensor *w) {
    int C = w->shape[0], W = w->shape[1];
    real *wt = tape_alloc(tp, (size_t)W * C * sizeof(real));
    for (int c = 0; c < C; c++)
        for (int j = 0; j < W; j++) wt[(int64_t)j * C + c] = w->data[(int64_t)c * W + j];
    return wt;
}

// z (C) = the convolution at one row: xr points at x's row (b, t), whose
// earlier rows of the same sequence sit at xr - C, xr - 2C, ...
static inline void conv_row(real *restrict z, const real *restrict xr, const real *restrict wt, int t, int C,
                            int W) {
    int j0 = imax(0, W - 1 - t);
    const real *restrict x0 = xr + (int64_t)(j0 - W + 1) * C, *restrict w0 = wt + (int64_t)j0 * C;
#pragma omp simd
    for (int c = 0; c < C; c++) z[c] = w0[c] * x0[c];
    for (int j = j0 + 1; j < W; j++) {
        const real *restrict xs = xr + (int64_t)(j - W + 1) * C, *restrict wj = wt + (int64_t)j * C;
#pragma omp simd
        for (int c = 0; c < C; c++) z[c] += wj[c] * xs[c];
    }
}

// The position of row r inside its document (docs.h; first may be NULL).
static inline int conv_pos(const int *first, int64_t r, int T) { return (int)(r % T) - docs_begin(first, r); }

// iarg[0]: 1 to apply SiLU (conv1d_silu), 0 for the bare convolution.
// aux: first (B*T) of the documents (docs.h), or NULL.
// x, y: (B, T, C); w: (C, W).
static void conv_forward(Node *n) {
    const Tensor *x = n->in[0], *w = n->in[1];
    int T = x->shape[1], C = x->shape[2], W = w->shape[1];
    int64_t rows = (int64_t)x->shape[0] * T;
    bool silu = n->iarg[0];
    const int *first = n->aux;
    const real *wt = conv_wt(n->tape, w), *X = x->data;
    real *Y = n->out[0]->data;
#pragma omp parallel for if (x->numel * W > OPS_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        real *restrict y = Y + r * C;
        conv_row(y, X + r * C, wt, conv_pos(first, r, T), C, W);
        if (silu) {
#ifdef OPS_VEXP
            for (int c = 0; c < C; c += 16) {
                __mmask16 m = v_lanes(c, C);
                __m512 z = v_load(y + c, m);
                v_store(y + c, m, _mm512_mul_ps(z, v_sigmoid(z)));
            }
#else
#pragma omp simd
            for (int c = 0; c < C; c++) y[c] = y[c] * r_sigmoid(y[c]);
#endif
        }
    }
}

// gz (C) = g * silu'(z) at one row, z recomputed; silu' = s (1 + z (1 - s)).
static inline void conv_silu_grad_row(real *restrict gz, const real *restrict g, const real *restrict xr,
                                      const real *restrict wt, int t, int C, int W) {
    conv_row(gz, xr, wt, t, C, W);
#ifdef OPS_VEXP
    for (int c = 0; c < C; c += 16) {
        __mmask16 m = v_lanes(c, C);
        __m512 z = v_load(gz + c, m), s = v_sigmoid(z), one = _mm512_set1_ps(1.0f);
        __m512 f = _mm512_fmadd_ps(z, _mm512_sub_ps(one, s), one);   // 1 + z (1 - s), fused as GCC makes it
        v_store(gz + c, m, _mm512_mul_ps(_mm512_mul_ps(v_load(g + c, m), s), f));
    }
#else
#pragma omp simd
    for (int c = 0; c < C; c++) {
        real z = gz[c], s = r_sigmoid(z);
        gz[c] = g[c] * s * (1 + z * (1 - s));
    }
#endif
}

// Rows [a, a1) of one sequence, whose row a sits at time t0: their dx (when
// dx) and their terms of the partial dw (when part, (W, C)). gz holds the
// rows [a, a1 + W - 1) that belong to the sequence, row r at gz + (r - a) * C.
// first, end: the documents (docs.h), or NULL.
// A fresh dx (tensor_grad_fresh) is zeroed row by row here, in cache, rather
// than by a separate pass over the whole buffer.
static void conv_backward_rows(real *dx, bool dx_fresh, real *part, const real *gz, const real *X, const real *wt,
                               const int *first, const int *end, int64_t a, int64_t a1, int t0, int T, int C, int W) {
    for (int64_t r = a; r < a1; r++) {
        int t = t0 + (int)(r - a), te = end ? end[r] : T;
        if (dx) {
            real *restrict d = dx + r * C;
            if (dx_fresh)
                for (int c = 0; c < C; c++) d[c] = 0;
            for (int j = imax(0, t + W - te); j < W; j++) {   // the outputs t + W-1-j < te this row fed
                const real *restrict g = gz + (r - a + W - 1 - j) * C, *restrict wj = wt + (int64_t)j * C;
#pragma omp simd
                for (int c = 0; c < C; c++) d[c] += wj[c] * g[c];
            }
        }
        if (part) {
            const real *restrict g = gz + (r - a) * C;
            for (int j = imax(0, W - 1 - (t - docs_begin(first, r))); j < W; j++) {
                const real *restrict xs = X + (r - W + 1 + j) * C;
                real *restrict pj = part + (int64_t)j * C;
#pragma omp simd
                for (int c = 0; c < C; c++) pj[c] += g[c] * xs[c];
            }
        }
    }
}

static void conv_backward(Node *n) {
    const Tensor *x = n->in[0], *w = n->in[1];
    int T = x->shape[1], C = x->shape[2], W = w->shape[1];
    int64_t rows = (int64_t)x->shape[0] * T;
    bool silu = n->iarg[0];
    const int *first = n->aux;
    const real *G = n->out[0]->grad, *X = x->data;
    bool dx_fresh;
    real *dx = NODE_GRAD_FRESH(n, 0, &dx_fresh), *dw = NODE_GRAD_IN(n, 1);
    if ((!dx && !dw) || rows == 0) return;
    const real *wt = conv_wt(n->tape, w);
    const int *end = first && dx ? docs_end(n->tape, first, x->shape[0], T) : NULL;

    // Row blocks: a function of `rows` only (see the top of the file).
    int64_t n_blocks = (rows + CONV_MIN_BLOCK_ROWS - 1) / CONV_MIN_BLOCK_ROWS;
    if (n_blocks > CONV_MAX_BLOCKS) n_blocks = CONV_MAX_BLOCKS;
    int64_t per = (rows + n_blocks - 1) / n_blocks;
    n_blocks = (rows + per - 1) / per;
    size_t wc = (size_t)W * C;
    real *part = dw ? tape_alloc(n->tape, (size_t)n_blocks * wc * sizeof(real)) : NULL;   // (n_blocks, W, C)
    size_t stride = 0;
    unsigned char *slots =
        silu ? tape_thread_slots(n->tape, (size_t)(CONV_TILE_ROWS + W - 1) * C * sizeof(real), &stride) : NULL;
#pragma omp parallel for if (x->numel * W > OPS_PAR_MIN && n_blocks > 1) schedule(static)
    for (int64_t k = 0; k < n_blocks; k++) {
        int64_t r0 = k * per, r1 = r0 + per < rows ? r0 + per : rows;
        real *pk = part ? part + k * wc : NULL;
        if (pk)
            for (size_t i = 0; i < wc; i++) pk[i] = 0;
        real *buf = silu ? (real *)(slots + (size_t)omp_get_thread_num() * stride) : NULL;   // (TILE+W-1, C)
        // Tiles of at most CONV_TILE_ROWS rows, never across a sequence's end.
        for (int64_t a = r0, a1; a < r1; a = a1) {
            int t0 = (int)(a % T);
            int64_t seq_end = a + (T - t0);
            a1 = a + CONV_TILE_ROWS;
            if (a1 > r1) a1 = r1;
            if (a1 > seq_end) a1 = seq_end;
            const real *gz = G + a * C;
            if (silu) {
                int64_t e = a1 + W - 1 < seq_end ? a1 + W - 1 : seq_end;   // the halo feeds dx only
                for (int64_t r = a; r < (dx ? e : a1); r++)
                    conv_silu_grad_row(buf + (r - a) * C, G + r * C, X + r * C, wt, conv_pos(first, r, T), C, W);
                gz = buf;
            }
            conv_backward_rows(dx, dx_fresh, pk, gz, X, wt, first, end, a, a1, t0, T, C, W);
        }
    }
    if (dw) {
        double *acc = tape_alloc(n->tape, wc * sizeof(double));   // (W, C)
        for (size_t i = 0; i < wc; i++) acc[i] = 0;
        for (int64_t k = 0; k < n_blocks; k++) {
            const real *pk = part + k * wc;
#pragma omp simd
            for (size_t i = 0; i < wc; i++) acc[i] += pk[i];
        }
        for (int c = 0; c < C; c++)
            for (int j = 0; j < W; j++) dw[(int64_t)c * W + j] += (real)acc[(int64_t)j * C + c];
    }
}

static const OpDef OP_CONV1D_CAUSAL = {"conv1d_causal", conv_forward, conv_backward,
                                       CUDA_PAIR(cu_conv_forward, cu_conv_backward)};
static const OpDef OP_CONV1D_SILU = {"conv1d_silu", conv_forward, conv_backward,
                                     CUDA_PAIR(cu_conv_forward, cu_conv_backward)};

static Tensor *conv_build(Tape *tp, const OpDef *op, bool silu, Tensor *x, Tensor *w, const int *doc_start) {
    ASSERT(x->ndim == 3 && w->ndim == 2 && w->shape[0] == x->shape[2] && w->shape[1] >= 1,
           "%s: x %s must be (B, T, C) and w %s (C, W) with W >= 1", op->name, SHAPE(x), SHAPE(w));
    Tensor *y = tape_tensor(tp, 3, x->shape);
    Node *n = tape_op(tp, op, (Tensor *[]){x, w}, 2, &y, 1);
    n->iarg[0] = silu;
    n->aux = docs_first(tp, doc_start, x->shape[0], x->shape[1]);
    tape_forward(n);
    return y;
}

Tensor *op_conv1d_causal(Tape *tp, Tensor *x, Tensor *w, const int *doc_start) {
    return conv_build(tp, &OP_CONV1D_CAUSAL, false, x, w, doc_start);
}

Tensor *op_conv1d_causal_silu(Tape *tp, Tensor *x, Tensor *w, const int *doc_start) {
    return conv_build(tp, &OP_CONV1D_SILU, true, x, w, doc_start);
}
