// ops_conv.cu: op_conv1d_causal and op_conv1d_causal_silu on the GPU
// (ops_conv.c has the math and the document rules).
//
// Forward and dx: one thread per element (row, channel); a thread reads its
// channel's W taps over W rows (neighbouring threads read neighbouring
// channels, so the loads coalesce). conv1d_silu saves nothing, as on the
// CPU: its backward recomputes z where it needs gz = dy silu'(z), W taps
// per value. dw[c, j] is a sum over all rows: a fixed number of row blocks
// (a function of the row count only), each summed in double by one thread
// per channel into a partial (W, C), then the partials added in a fixed
// order (cu_sum_parts).
// No atomics: a run repeats bit for bit.
//
// Documents: aux is first (B*T) on the host (docs.h); the forward copies it
// to the device and saves the copy. The backward derives end (one past the
// last row of each row's document) on the device: first is non-decreasing
// along a row, so end is the first later position whose first is larger, a
// binary search.
#include "cuda_internal.cuh"

// Rows per dw block (at least), and a cap on the blocks' partials (W*C each).
#define CONV_BLOCK_ROWS 32
#define CONV_MAX_BLOCKS 1024
#define CONV_PART_MAX ((int64_t)1 << 22)
// Taps a dw thread accumulates at once (registers, unrolled; more taps take
// several passes).
#define CONV_TAPS 8
// Channels per dw thread block.
#define CONV_DW_THREADS 128

typedef struct CuConvSaved {
    const int *first;   // (B*T) on the device, or NULL
} CuConvSaved;

// The first row of (b, t)'s document that the window holds (docs_begin).
__device__ __forceinline__ int conv_begin(const int *first, int64_t r) {
    return first && first[r] > 0 ? first[r] : 0;
}

// z at row r, channel c: sum over taps j >= j0 of w[c, j] x[r - W + 1 + j, c],
// j0 leaving out the rows before the document (or the sequence) begins. The
// same order of terms as conv_row.
__device__ __forceinline__ real conv_z(const real *x, const real *w, const int *first, int64_t r, int c, int T,
                                       int C, int W) {
    int t = (int)(r % T) - conv_begin(first, r);
    int j0 = W - 1 - t > 0 ? W - 1 - t : 0;
    const real *wc = w + (int64_t)c * W;
    const real *xs = x + (r - W + 1) * C + c;
    real z = wc[j0] * xs[(int64_t)j0 * C];
    for (int j = j0 + 1; j < W; j++) z += wc[j] * xs[(int64_t)j * C];
    return z;
}

// dL/dz at (r, c): dy itself, or dy silu'(z) with z recomputed.
__device__ __forceinline__ real conv_gz(const real *g, const real *x, const real *w, const int *first, int64_t r,
                                        int c, int T, int C, int W, bool silu) {
    real gv = g[r * C + c];
    if (!silu) return gv;
    real z = conv_z(x, w, first, r, c, T, C, W), s = d_sigmoid(z);
    return gv * s * ((real)1 + z * ((real)1 - s));
}

__global__ void k_conv_forward(const real *x, const real *w, const int *first, real *y, int64_t N, int T, int C,
                               int W, bool silu) {
    CU_FOR(i, N) {
        int64_t r = i / C;
        int c = (int)(i % C);
        real z = conv_z(x, w, first, r, c, T, C, W);
        y[i] = silu ? z * d_sigmoid(z) : z;
    }
}

// end[r]: the first position t' > t of r's row with first[t'] > first[t]
// (a document begins there), else T.
__global__ void k_conv_end(const int *first, int *end, int64_t rows, int T) {
    CU_FOR(r, rows) {
        int t = (int)(r % T), f = first[r];
        const int *row = first + (r - t);
        int lo = t + 1, hi = T;   // the answer lies in [lo, hi]; row[t'] > f is monotone in t'
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            if (row[mid] > f) hi = mid;
            else lo = mid + 1;
        }
        end[r] = lo;
    }
}

// gz (B*T, C) = dL/dz at every element, once (the taps of dx and dw read it
// W times each: recomputing z and its sigmoid there was most of the backward).
__global__ void k_conv_gz(const real *g, const real *x, const real *w, const int *first, real *gz, int64_t N, int T,
                          int C, int W, bool silu) {
    CU_FOR(i, N) gz[i] = conv_gz(g, x, w, first, i / C, (int)(i % C), T, C, W, silu);
}

// dx[r, c] (=, or += unless fresh) sum over taps j of w[c, j] gz[r + W-1-j, c],
// for the outputs r + W-1-j before the end of r's document.
__global__ void k_conv_dx(const real *gz, const real *w, const int *end, real *dx, bool fresh, int64_t N, int T,
                          int C, int W) {
    CU_FOR(i, N) {
        int64_t r = i / C;
        int c = (int)(i % C);
        int t = (int)(r % T), te = end ? end[r] : T;
        int jlo = t + W - te > 0 ? t + W - te : 0;
        const real *wc = w + (int64_t)c * W;
        real acc = 0;
        for (int j = jlo; j < W; j++) acc += wc[j] * gz[(r + W - 1 - j) * C + c];
        dx[i] = fresh ? acc : dx[i] + acc;
    }
}

// part[k, j, c] = sum over the rows of block k of gz[r, c] x[r - W + 1 + j, c]
// (rows whose tap j reads inside their document). Thread: one channel, taps
// [j0, j0 + CONV_TAPS) per pass, in double registers (indices fixed by the
// unrolled loops).
__global__ void k_conv_dw_part(const real *gzs, const real *x, const int *first, double *part, int64_t rows,
                               int64_t per, int T, int C, int W) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int k = blockIdx.y;
    if (c >= C) return;   // no block-wide synchronisation below
    int64_t r0 = (int64_t)k * per, r1 = r0 + per < rows ? r0 + per : rows;
    for (int j0 = 0; j0 < W; j0 += CONV_TAPS) {
        double acc[CONV_TAPS];
#pragma unroll
        for (int u = 0; u < CONV_TAPS; u++) acc[u] = 0;
        for (int64_t r = r0; r < r1; r++) {
            double gz = gzs[r * C + c];
            int t = (int)(r % T) - conv_begin(first, r);
            int jmin = W - 1 - t;   // taps below read before the document
            const real *xs = x + (r - W + 1) * C + c;
#pragma unroll
            for (int u = 0; u < CONV_TAPS; u++) {
                int j = j0 + u;
                if (j < W && j >= jmin) acc[u] += gz * xs[(int64_t)j * C];
            }
        }
#pragma unroll
        for (int u = 0; u < CONV_TAPS; u++)
            if (j0 + u < W) part[((int64_t)k * W + j0 + u) * C + c] = acc[u];
    }
}

// iarg[0]: silu. aux: first (B*T, host) or NULL. x, y (B, T, C); w (C, W).
extern "C" void cu_conv_forward(Node *n) {
    const Tensor *x = n->in[0], *w = n->in[1];
    int T = x->shape[1], C = x->shape[2], W = w->shape[1];
    int64_t rows = (int64_t)x->shape[0] * T;
    int *first = NULL;
    if (n->aux && rows > 0) {
        first = (int *)tape_dalloc(n->tape, (size_t)rows * sizeof(int));
        cu_from_host(first, n->aux, (size_t)rows * sizeof(int));
    }
    if (x->numel > 0) {
        k_conv_forward<<<cu_grid(x->numel), CU_THREADS, 0, cu_stream>>>(x->data, w->data, first, n->out[0]->data,
                                                                        x->numel, T, C, W, n->iarg[0] != 0);
        CU_LAUNCHED();
    }
    if (n->recorded) {
        CuConvSaved *sv = (CuConvSaved *)tape_alloc(n->tape, sizeof *sv);
        sv->first = first;
        n->saved = sv;
    }
}

extern "C" void cu_conv_backward(Node *n) {
    const Tensor *x = n->in[0], *w = n->in[1];
    int T = x->shape[1], C = x->shape[2], W = w->shape[1];
    int64_t rows = (int64_t)x->shape[0] * T;
    bool silu = n->iarg[0] != 0;
    const int *first = ((const CuConvSaved *)n->saved)->first;
    const real *G = n->out[0]->grad;
    bool fx, fw;
    real *dx = CU_GRAD_FRESH(n, 0, &fx);
    real *dw = CU_GRAD_FRESH(n, 1, &fw);
    if ((!dx && !dw) || x->numel == 0) {
        if (dw && fw) dev_zero(DEVICE_CUDA, dw, (size_t)w->numel * sizeof(real));   // no rows: dw = 0
        return;
    }
    real *gz = (real *)tape_dalloc(n->tape, (size_t)x->numel * sizeof(real));
    k_conv_gz<<<cu_grid(x->numel), CU_THREADS, 0, cu_stream>>>(G, x->data, w->data, first, gz, x->numel, T, C, W,
                                                               silu);
    CU_LAUNCHED();
    if (dx) {
        int *end = NULL;
        if (first) {
            end = (int *)tape_dalloc(n->tape, (size_t)rows * sizeof(int));
            k_conv_end<<<cu_grid(rows), CU_THREADS, 0, cu_stream>>>(first, end, rows, T);
            CU_LAUNCHED();
        }
        k_conv_dx<<<cu_grid(x->numel), CU_THREADS, 0, cu_stream>>>(gz, w->data, end, dx, fx, x->numel, T, C, W);
        CU_LAUNCHED();
    }
    if (dw) {
        // Row blocks: a function of the shapes only.
        int64_t nblk = (rows + CONV_BLOCK_ROWS - 1) / CONV_BLOCK_ROWS;
        int64_t cap = CONV_PART_MAX / ((int64_t)W * (C > 0 ? C : 1));
        if (nblk > CONV_MAX_BLOCKS) nblk = CONV_MAX_BLOCKS;
        if (nblk > cap) nblk = cap;
        if (nblk < 1) nblk = 1;
        int64_t per = (rows + nblk - 1) / nblk;
        if (per < 1) per = 1;
        nblk = (rows + per - 1) / per;   // no empty block; 0 when there are no rows
        double *part = (double *)tape_dalloc(n->tape, (size_t)(nblk > 0 ? nblk : 1) * W * C * sizeof(double));
        if (nblk > 0 && C > 0) {
            dim3 grid((unsigned)((C + CONV_DW_THREADS - 1) / CONV_DW_THREADS), (unsigned)nblk);
            k_conv_dw_part<<<grid, CONV_DW_THREADS, 0, cu_stream>>>(gz, x->data, first, part, rows, per, T, C, W);
            CU_LAUNCHED();
        }
        // With no rows dw gets zeros (or is left as it is).
        cu_sum_parts(part, (int64_t)C * W, (int)nblk, dw, fw, C);   // partials (nblk, W, C), dw (C, W)
    }
}
