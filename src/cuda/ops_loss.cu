// ops_loss.cu: softmax over the last dimension and the fused log-softmax +
// cross-entropy on the GPU.
//
// One block per row (a row = the last dimension, up to a GPT-2 vocabulary):
// a block reduction for the maximum, then one in double for the sum of
// exponentials, as the CPU sums them. The loss is summed over rows by one
// block in a fixed order, so a run repeats bit for bit.
#include "cuda_internal.cuh"

// Threads per row: a row of V elements is read in strides of LOSS_THREADS.
#define LOSS_THREADS 512

// The maximum of row xr (V >= 1 elements), for every thread of the block.
__device__ __forceinline__ real row_max(const real *xr, int V, real *shm) {
    real m = xr[0];
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = xr[j] > m ? xr[j] : m;
    return cu_block_max(m, shm);
}

// ---- softmax ----

// y = exp(x - max) / sum, the sum in double; each thread rescales the
// elements it wrote itself.
__global__ void k_softmax(const real *x, real *y, int V) {
    __shared__ real shm_r[32];
    __shared__ double shm_d[32];
    int64_t r = blockIdx.x;
    const real *xr = x + r * V;
    real *yr = y + r * V;
    real m = row_max(xr, V, shm_r);
    double s = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        real e = exp(xr[j] - m);
        yr[j] = e;
        s += e;
    }
    s = cu_block_sum(s, shm_d);
    real inv = (real)(1.0 / s);
    for (int j = threadIdx.x; j < V; j += blockDim.x) yr[j] *= inv;
}

// x, y: (rows, V)
extern "C" void cu_softmax_forward(Node *n) {
    const Tensor *x = n->in[0];
    int V = x->shape[x->ndim - 1];
    int64_t rows = tensor_rows(x);
    if (rows == 0) return;
    k_softmax<<<(unsigned)rows, LOSS_THREADS, 0, cu_stream>>>(x->data, n->out[0]->data, V);
    CU_LAUNCHED();
}

// dx = y * (dy - <dy, y>) per row, the dot in double; = when fresh, else +=.
__global__ void k_softmax_back(const real *y, const real *g, real *dx, bool fresh, int V) {
    __shared__ double shm[32];
    int64_t r = blockIdx.x;
    const real *yr = y + r * V, *gr = g + r * V;
    real *d = dx + r * V;
    double dot = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) dot += (double)gr[j] * yr[j];
    real t = (real)cu_block_sum(dot, shm);
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        real e = yr[j] * (gr[j] - t);
        d[j] = fresh ? e : d[j] + e;
    }
}

extern "C" void cu_softmax_backward(Node *n) {
    bool fresh;
    real *dx = CU_GRAD_FRESH(n, 0, &fresh);
    const Tensor *yt = n->out[0];
    int V = yt->shape[yt->ndim - 1];
    int64_t rows = tensor_rows(yt);
    if (!dx || rows == 0) return;
    k_softmax_back<<<(unsigned)rows, LOSS_THREADS, 0, cu_stream>>>(yt->data, yt->grad, dx, fresh, V);
    CU_LAUNCHED();
}

// ---- cross-entropy ----

// The GPU pair's saved state (host memory, read by cu_ce_backward only; the
// CPU pair has its own): device pointers and the count of counted rows.
typedef struct CuCeSaved {
    real *lse;      // (rows) log-sum-exp of each row, device
    int *tg;        // (rows) the targets, device
    int count;      // rows with a target >= 0
} CuCeSaved;

// Row r: lse[r] = max + log(sum exp(x - max)) (when lse is not NULL) and
// loss[r] = lse - x[target], 0 for an ignored row.
__global__ void k_ce_rows(const real *x, const int *tg, real *lse, double *loss, int V) {
    __shared__ real shm_r[32];
    __shared__ double shm_d[32];
    int64_t r = blockIdx.x;
    const real *xr = x + r * V;
    real m = row_max(xr, V, shm_r);
    double s = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += exp(xr[j] - m);
    s = cu_block_sum(s, shm_d);
    if (threadIdx.x == 0) {
        double l = (double)m + log(s);
        if (lse) lse[r] = (real)l;
        int t = tg[r];
        loss[r] = t >= 0 ? l - (double)xr[t] : 0.0;
    }
}

// out[0] = the sum of loss over rows (each thread a fixed stride, then the
// block's tree) / count, or 0 when count is 0. One block: a fixed order.
__global__ void k_ce_mean(const double *loss, int64_t rows, int count, real *out) {
    __shared__ double shm[32];
    double s = 0;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) s += loss[r];
    s = cu_block_sum(s, shm);
    if (threadIdx.x == 0) out[0] = (real)(count ? s / count : 0.0);
}

// aux: targets (rows), host memory. out: (1), the mean over counted rows of
// lse - x[target] (0, with a zero gradient, when every target is ignored).
extern "C" void cu_ce_forward(Node *n) {
    const Tensor *x = n->in[0];
    const int *tg = (const int *)n->aux;
    int V = x->shape[x->ndim - 1];
    int64_t rows = tensor_rows(x);
    Tape *tp = n->tape;
    int count = 0;
    for (int64_t r = 0; r < rows; r++) count += tg[r] >= 0;
    size_t nb = (size_t)(rows ? rows : 1);
    int *dtg = (int *)tape_dalloc(tp, nb * sizeof(int));
    double *loss = (double *)tape_dalloc(tp, nb * sizeof(double));
    real *lse = n->recorded ? (real *)tape_dalloc(tp, nb * sizeof(real)) : NULL;
    if (rows > 0) {
        cu_from_host(dtg, tg, (size_t)rows * sizeof(int));
        k_ce_rows<<<(unsigned)rows, LOSS_THREADS, 0, cu_stream>>>(x->data, dtg, lse, loss, V);
        CU_LAUNCHED();
    }
    k_ce_mean<<<1, 1024, 0, cu_stream>>>(loss, rows, count, n->out[0]->data);
    CU_LAUNCHED();
    if (n->recorded) {
        CuCeSaved *sv = (CuCeSaved *)tape_alloc(tp, sizeof *sv);
        sv->lse = lse;
        sv->tg = dtg;
        sv->count = count;
        n->saved = sv;
    }
}

// dx = dloss / count * (softmax - onehot(target)) on counted rows, 0 on
// ignored ones (= when fresh, else += and ignored rows untouched). The
// target's element subtracts c after the add, as the CPU does.
__global__ void k_ce_back(const real *x, const int *tg, const real *lse, const real *dloss, int count, real *dx,
                          bool fresh, int V) {
    int64_t r = blockIdx.x;
    int t = tg[r];
    real *d = dx + r * V;
    if (t < 0) {   // an ignored row: zeros when fresh, else nothing to add
        if (fresh)
            for (int j = threadIdx.x; j < V; j += blockDim.x) d[j] = 0;
        return;
    }
    const real *xr = x + r * V;
    real c = dloss[0] / (real)count, l = lse[r];
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        real e = c * exp(xr[j] - l);
        real v = fresh ? e : d[j] + e;
        d[j] = j == t ? v - c : v;
    }
}

extern "C" void cu_ce_backward(Node *n) {
    bool fresh;
    real *dx = CU_GRAD_FRESH(n, 0, &fresh);
    const CuCeSaved *sv = (const CuCeSaved *)n->saved;
    const Tensor *x = n->in[0];
    if (!dx) return;
    if (sv->count == 0) {   // every target ignored: a zero gradient
        if (fresh) cu_zero(dx, (size_t)x->numel * sizeof(real));
        return;
    }
    int V = x->shape[x->ndim - 1];
    int64_t rows = tensor_rows(x);
    k_ce_back<<<(unsigned)rows, LOSS_THREADS, 0, cu_stream>>>(x->data, sv->tg, sv->lse, n->out[0]->grad, sv->count,
                                                              dx, fresh, V);
    CU_LAUNCHED();
}
