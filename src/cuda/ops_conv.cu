// ops_conv.cu: op_conv1d_causal and op_conv1d_causal_silu on the GPU
// (ops_conv.c has the math and the document rules).
//
// A thread takes one channel and a segment of consecutive rows (the rows of
// the B sequences one after another) and walks it in order, holding the
// channel's W taps and a window of the last W inputs in registers: each
// input is read once (plus W - 1 rows before the segment), with no division
// per element. Rows are loaded CONV_U at a time ahead of their use, so that
// a thread has several loads in flight. Segments are as long as it takes to
// give the GPU about 2^18 threads (8 rows at least), a function of the
// shapes only.
//
// The backward is one pass: per row it recomputes z (conv1d_silu saves
// nothing, as on the CPU), gz = dL/dz, adds gz times the window to the
// weight gradient's per-segment partials (double), and from a window of the
// last W gz values writes dx of the row W - 1 back. The segment walks W - 1
// rows past its end for those (recomputing their gz). The partials are then
// added in a fixed order (cu_sum_parts).
// Every sum has the CPU's order of terms; no atomics: a run repeats bit for
// bit.
//
// Window slots: slot i (0 <= i < WM, WM a compile-time bound on W) holds the
// value of row r - d, d = WM - 1 - i, for the row r being walked; tap j
// reads row r - W + 1 + j, so d = W - 1 - j and j rises with i.
//
// Documents: aux is first (B*T) on the host (docs.h); the forward copies it
// to the device and saves the copy. A row at position t of its document
// (t = r mod T - first) reads the taps with d <= t; a row's dx takes the gz
// of the later rows r' = r + W - 1 - j whose document began at or before r,
// i.e. whose own position t' >= W - 1 - j.
#include "cuda_internal.cuh"

// Channels per thread block; rows loaded ahead; threads to aim for.
#define CONV_CH 128
#define CONV_U 4
#define CONV_THREADS_AIM ((int64_t)1 << 18)
// Blocks per multiprocessor the kernels are compiled for: the more loads in
// flight, the nearer the copy bandwidth. The forward at 8 (64 registers),
// the backward at 6 (85: its three windows and the double partials take 80
// in float32 at W <= 4, with no spill).
#define CONV_MINB 8
#define CONV_BWD_MINB 6
// A cap on the weight gradient's partials (segments x W x C doubles).
#define CONV_PART_MAX ((int64_t)1 << 22)
// The widest window the kernels hold ([model] conv_size is at most 64).
#define CONV_WMAX 64

typedef struct CuConvSaved {
    const int *first;   // (B*T) on the device, or NULL
} CuConvSaved;

// Rows per segment for (rows, C, W): about CONV_THREADS_AIM threads, at
// least 8 rows, at most 65535 segments (the grid's y) and CONV_PART_MAX
// partials.
static int64_t conv_per(int64_t rows, int C, int W) {
    int64_t per = rows * C / CONV_THREADS_AIM;
    if (per < 8) per = 8;
    int64_t cap = CONV_PART_MAX / ((int64_t)W * C);
    if (cap < 1) cap = 1;
    if (cap > 65535) cap = 65535;
    if ((rows + per - 1) / per > cap) per = (rows + cap - 1) / cap;
    return per;
}

// The position of row r in its document, given tt = r mod T and first[r]
// (the first row of the document that the window holds, docs_begin).
__device__ __forceinline__ int conv_pos(int tt, int f) { return tt - (f > 0 ? f : 0); }

template <int WM> __device__ __forceinline__ void conv_push(real (&win)[WM], real v) {
#pragma unroll
    for (int i = 0; i + 1 < WM; i++) win[i] = win[i + 1];
    win[WM - 1] = v;
}

// z of the row whose window is xw, at document position t: the taps
// j >= max(0, W - 1 - t) in the order of j (conv_row's order).
template <int WM>
__device__ __forceinline__ real conv_z(const real (&wr)[WM], const real (&xw)[WM], int t, int W) {
    real z = 0;
#pragma unroll
    for (int i = 0; i < WM; i++) {
        int d = WM - 1 - i;
        if (d < W && d <= t) z += wr[i] * xw[i];
    }
    return z;
}

// The channel's taps into window slots (wr, 0 below W) and the window of the
// rows before r0 (rows before 0 read as 0: a row never takes them).
template <int WM>
__device__ __forceinline__ void conv_start(const real *x, const real *w, int64_t r0, int C, int W, int c,
                                           real (&wr)[WM], real (&xw)[WM]) {
#pragma unroll
    for (int i = 0; i < WM; i++) {
        int j = i - (WM - W);
        int64_t rr = r0 - WM + i;   // slot i before the walk's first push
        wr[i] = j >= 0 ? w[(int64_t)c * W + j] : (real)0;
        xw[i] = j >= 0 && rr >= 0 && x ? x[rr * C + c] : (real)0;
    }
}

// The taps by j (wl[j] = w[c, j], 0 from W on).
template <int WM> __device__ __forceinline__ void conv_taps(const real *w, int W, int c, real (&wl)[WM]) {
#pragma unroll
    for (int j = 0; j < WM; j++) wl[j] = j < W ? w[(int64_t)c * W + j] : (real)0;
}

template <int WM>
__global__ void __launch_bounds__(CONV_CH, CONV_MINB) k_conv_forward(const real *__restrict__ x, const real *__restrict__ w,
                                                         const int *__restrict__ first, real *__restrict__ y,
                                                         int64_t rows, int64_t per, int T, int C, int W, bool silu) {
    int c = blockIdx.x * CONV_CH + threadIdx.x;
    if (c >= C) return;
    int64_t r0 = (int64_t)blockIdx.y * per, r1 = r0 + per < rows ? r0 + per : rows;
    real wr[WM], xw[WM];
    conv_start<WM>(x, w, r0, C, W, c, wr, xw);
    int tt = (int)(r0 % T);
    for (int64_t rb = r0; rb < r1; rb += CONV_U) {
        real xn[CONV_U];
        int fn[CONV_U];
#pragma unroll
        for (int u = 0; u < CONV_U; u++) {
            bool in = rb + u < r1;
            xn[u] = in ? x[(rb + u) * C + c] : (real)0;
            fn[u] = in && first ? first[rb + u] : 0;
        }
#pragma unroll
        for (int u = 0; u < CONV_U; u++) {
            if (rb + u >= r1) break;
            conv_push<WM>(xw, xn[u]);
            real z = conv_z<WM>(wr, xw, conv_pos(tt, fn[u]), W);
            y[(rb + u) * C + c] = silu ? z * d_sigmoid(z) : z;
            if (++tt == T) tt = 0;
        }
    }
}

// The backward of one (channel, segment): dx of the segment's rows (when dx)
// and the weight gradient's partials part[k, j, c] (when part).
template <int WM>
__global__ void __launch_bounds__(CONV_CH, CONV_BWD_MINB)
    k_conv_backward(const real *__restrict__ g, const real *__restrict__ x, const real *__restrict__ w,
                    const int *__restrict__ first, real *__restrict__ dx, bool fresh, double *__restrict__ part,
                    int64_t rows, int64_t per, int T, int C, int W, bool silu) {
    int c = blockIdx.x * CONV_CH + threadIdx.x;
    if (c >= C) return;
    int k = blockIdx.y;
    int64_t r0 = (int64_t)k * per, r1 = r0 + per < rows ? r0 + per : rows, rend = r1 + W - 1;
    real wr[WM], xw[WM], gw[WM], wl[WM];
    int tw[WM];   // document positions of gw's rows (-1: past the last row)
    double acc[WM];
    conv_start<WM>(silu || part ? x : NULL, w, r0, C, W, c, wr, xw);
    conv_taps<WM>(w, W, c, wl);
#pragma unroll
    for (int i = 0; i < WM; i++) gw[i] = 0, tw[i] = -1, acc[i] = 0;
    int tt = (int)(r0 % T);
    for (int64_t rb = r0; rb < rend; rb += CONV_U) {
        real xn[CONV_U], gn[CONV_U];
        int fn[CONV_U];
#pragma unroll
        for (int u = 0; u < CONV_U; u++) {
            bool in = rb + u < rows && rb + u < rend;
            xn[u] = in && (silu || part) ? x[(rb + u) * C + c] : (real)0;
            gn[u] = in ? g[(rb + u) * C + c] : (real)0;
            fn[u] = in && first ? first[rb + u] : 0;
        }
#pragma unroll
        for (int u = 0; u < CONV_U; u++) {
            int64_t r = rb + u;   // the row walked: its gz, then dx of row r - (W - 1)
            if (r >= rend) break;
            int t = r < rows ? conv_pos(tt, fn[u]) : -1;
            conv_push<WM>(xw, xn[u]);
            real gz = gn[u];
            if (silu && t >= 0) {
                real z = conv_z<WM>(wr, xw, t, W), s = d_sigmoid(z);
                gz = gz * s * ((real)1 + z * ((real)1 - s));
            }
            conv_push<WM>(gw, gz);
#pragma unroll
            for (int i = 0; i + 1 < WM; i++) tw[i] = tw[i + 1];
            tw[WM - 1] = t;
            if (part && r < r1) {
#pragma unroll
                for (int i = 0; i < WM; i++) {
                    int d = WM - 1 - i;
                    if (d < W && d <= t) acc[i] += (double)gz * xw[i];
                }
            }
            if (dx && r >= r0 + W - 1) {
                // dx[r - W + 1] = sum over taps j of w[j] gz[r - j], for the
                // rows r - j whose document began at or before r - W + 1.
                real a = 0;
#pragma unroll
                for (int j = 0; j < WM; j++) {
                    int i = WM - 1 - j;   // gz[r - j]'s slot
                    if (j < W && tw[i] >= W - 1 - j) a += wl[j] * gw[i];
                }
                int64_t e = (r - W + 1) * C + c;
                dx[e] = fresh ? a : dx[e] + a;
            }
            if (++tt == T) tt = 0;
        }
    }
    if (part)
#pragma unroll
        for (int i = 0; i < WM; i++) {
            int j = i - (WM - W);
            if (j >= 0) part[((int64_t)k * W + j) * C + c] = acc[i];
        }
}

// The kernels for the window bound WM >= W.
template <int WM> static void conv_fwd_launch(dim3 grid, const real *x, const real *w, const int *first, real *y,
                                              int64_t rows, int64_t per, int T, int C, int W, bool silu) {
    k_conv_forward<WM><<<grid, CONV_CH, 0, cu_stream>>>(x, w, first, y, rows, per, T, C, W, silu);
}
template <int WM>
static void conv_bwd_launch(dim3 grid, const real *g, const real *x, const real *w, const int *first, real *dx,
                            bool fresh, double *part, int64_t rows, int64_t per, int T, int C, int W, bool silu) {
    k_conv_backward<WM><<<grid, CONV_CH, 0, cu_stream>>>(g, x, w, first, dx, fresh, part, rows, per, T, C, W, silu);
}

static dim3 conv_grid(int64_t rows, int64_t per, int C) {
    return dim3((unsigned)((C + CONV_CH - 1) / CONV_CH), (unsigned)((rows + per - 1) / per));
}

// iarg[0]: silu. aux: first (B*T, host) or NULL. x, y (B, T, C); w (C, W).
extern "C" void cu_conv_forward(Node *n) {
    const Tensor *x = n->in[0], *w = n->in[1];
    int T = x->shape[1], C = x->shape[2], W = w->shape[1];
    ASSERT(W <= CONV_WMAX, "conv1d (GPU): a window of %d taps; the GPU kernels hold at most %d", W, CONV_WMAX);
    int64_t rows = (int64_t)x->shape[0] * T;
    int *first = NULL;
    if (n->aux && rows > 0) {
        first = (int *)tape_dalloc(n->tape, (size_t)rows * sizeof(int));
        cu_from_host(first, n->aux, (size_t)rows * sizeof(int));
    }
    if (x->numel > 0) {
        bool silu = n->iarg[0] != 0;
        int64_t per = conv_per(rows, C, W);
        dim3 grid = conv_grid(rows, per, C);
        real *y = n->out[0]->data;
        if (W <= 4) conv_fwd_launch<4>(grid, x->data, w->data, first, y, rows, per, T, C, W, silu);
        else if (W <= 8) conv_fwd_launch<8>(grid, x->data, w->data, first, y, rows, per, T, C, W, silu);
        else if (W <= 16) conv_fwd_launch<16>(grid, x->data, w->data, first, y, rows, per, T, C, W, silu);
        else conv_fwd_launch<CONV_WMAX>(grid, x->data, w->data, first, y, rows, per, T, C, W, silu);
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
    bool fx, fw;
    real *dx = CU_GRAD_FRESH(n, 0, &fx);
    real *dw = CU_GRAD_FRESH(n, 1, &fw);
    if ((!dx && !dw) || x->numel == 0) {
        if (dw && fw) dev_zero(DEVICE_CUDA, dw, (size_t)w->numel * sizeof(real));   // no rows: dw = 0
        return;
    }
    int64_t per = conv_per(rows, C, W), nseg = (rows + per - 1) / per;
    double *part = dw ? (double *)tape_dalloc(n->tape, (size_t)nseg * W * C * sizeof(double)) : NULL;
    dim3 grid = conv_grid(rows, per, C);
    const real *G = n->out[0]->grad, *X = x->data, *Wt = w->data;
    if (W <= 4) conv_bwd_launch<4>(grid, G, X, Wt, first, dx, fx, part, rows, per, T, C, W, silu);
    else if (W <= 8) conv_bwd_launch<8>(grid, G, X, Wt, first, dx, fx, part, rows, per, T, C, W, silu);
    else if (W <= 16) conv_bwd_launch<16>(grid, G, X, Wt, first, dx, fx, part, rows, per, T, C, W, silu);
    else conv_bwd_launch<CONV_WMAX>(grid, G, X, Wt, first, dx, fx, part, rows, per, T, C, W, silu);
    CU_LAUNCHED();
    if (dw) cu_sum_parts(part, (int64_t)C * W, (int)nseg, dw, fw, C);   // partials (nseg, W, C), dw (C, W)
}
