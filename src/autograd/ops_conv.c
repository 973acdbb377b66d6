// ops_conv.c: causal depthwise 1-D convolution over time, no bias.
//
//   y[b,t,c] = sum_{j<W} w[c,j] * x[b, t-W+1+j, c]     (x = 0 before t = 0)
//
// The last weight column multiplies the current token. Every loop is a
// gather (each output element is written by one thread), so no atomics; the
// weight gradient's reduction over (B, T) runs in a fixed order per channel.
#include "ops.h"
#include "ops_math.h"

// Channels of dw each thread owns in the weight-gradient reduction.
#define CONV_COL_BLOCK 32

// x, y: (B, T, C); w: (C, W). Loops run over channels innermost, so every
// access is contiguous; wt (W, C) is w transposed for that.
static void conv_forward(Node *n) {
    const Tensor *x = n->in[0], *w = n->in[1];
    int B = x->shape[0], T = x->shape[1], C = x->shape[2], W = w->shape[1];
    real *wt = tape_alloc(n->tape, (size_t)W * C * sizeof(real));   // (W, C)
    for (int c = 0; c < C; c++)
        for (int j = 0; j < W; j++) wt[(int64_t)j * C + c] = w->data[(int64_t)c * W + j];
    real *Y = n->out[0]->data;
#pragma omp parallel for collapse(2) if (x->numel * W > OPS_PAR_MIN) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            real *y = Y + ((int64_t)b * T + t) * C;
            for (int c = 0; c < C; c++) y[c] = 0;
            for (int j = imax(0, W - 1 - t); j < W; j++) {
                const real *xs = x->data + ((int64_t)b * T + t - W + 1 + j) * C, *wj = wt + (int64_t)j * C;
                for (int c = 0; c < C; c++) y[c] += wj[c] * xs[c];
            }
        }
}

// dx[b,s,c] += sum_j w[c,j] dy[b, s+W-1-j, c]   (for s+W-1-j < T)
// dw[c,j]   += sum_{b,t} dy[b,t,c] x[b, t-W+1+j, c]
static void conv_backward(Node *n) {
    const Tensor *x = n->in[0], *w = n->in[1];
    int B = x->shape[0], T = x->shape[1], C = x->shape[2], W = w->shape[1];
    const real *G = n->out[0]->grad;
    real *dx = NODE_GRAD_IN(n, 0), *dw = NODE_GRAD_IN(n, 1);
    bool par = x->numel * W > OPS_PAR_MIN;
    if (dx) {
        real *wt = tape_alloc(n->tape, (size_t)W * C * sizeof(real));   // (W, C)
        for (int c = 0; c < C; c++)
            for (int j = 0; j < W; j++) wt[(int64_t)j * C + c] = w->data[(int64_t)c * W + j];
#pragma omp parallel for collapse(2) if (par) schedule(static)
        for (int b = 0; b < B; b++)
            for (int s = 0; s < T; s++) {
                real *d = dx + ((int64_t)b * T + s) * C;
                for (int j = 0; j < W; j++) {
                    int t = s + W - 1 - j;
                    if (t >= T) continue;
                    const real *g = G + ((int64_t)b * T + t) * C, *wj = wt + (int64_t)j * C;
                    for (int c = 0; c < C; c++) d[c] += wj[c] * g[c];
                }
            }
    }
    if (dw) {
        int n_blocks = (C + CONV_COL_BLOCK - 1) / CONV_COL_BLOCK;
        double *acc_all = tape_alloc(n->tape, (size_t)W * C * sizeof(double));   // a (W, nc) block per band
#pragma omp parallel for if (par && n_blocks > 1) schedule(static)
        for (int cb = 0; cb < n_blocks; cb++) {
            int c0 = cb * CONV_COL_BLOCK, c1 = imin(C, c0 + CONV_COL_BLOCK), nc = c1 - c0;
            double *acc = acc_all + (int64_t)c0 * W;   // (W, nc)
            for (int64_t i = 0; i < (int64_t)W * nc; i++) acc[i] = 0;
            for (int b = 0; b < B; b++)
                for (int t = 0; t < T; t++) {
                    const real *g = G + ((int64_t)b * T + t) * C;
                    for (int j = imax(0, W - 1 - t); j < W; j++) {
                        const real *xs = x->data + ((int64_t)b * T + t - W + 1 + j) * C;
                        for (int c = c0; c < c1; c++) acc[(int64_t)j * nc + c - c0] += (double)g[c] * xs[c];
                    }
                }
            for (int c = c0; c < c1; c++)
                for (int j = 0; j < W; j++) dw[(int64_t)c * W + j] += (real)acc[(int64_t)j * nc + c - c0];
        }
    }
}

static const OpDef OP_CONV1D_CAUSAL = {"conv1d_causal", conv_forward, conv_backward};

Tensor *op_conv1d_causal(Tape *tp, Tensor *x, Tensor *w) {
    ASSERT(x->ndim == 3 && w->ndim == 2 && w->shape[0] == x->shape[2] && w->shape[1] >= 1,
           "conv1d_causal: x %s must be (B, T, C) and w %s (C, W) with W >= 1", SHAPE(x), SHAPE(w));
    Tensor *y = tape_tensor(tp, 3, x->shape);
    tape_run(tp, &OP_CONV1D_CAUSAL, (Tensor *[]){x, w}, 2, &y, 1);
    return y;
}
