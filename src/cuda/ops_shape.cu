// ops_shape.cu: reshape, transpose, slice and concat on the GPU (copies, as
// in ops_shape.c). One thread per element; a gradient is written where it is
// fresh and added to otherwise.
#include "cuda_internal.cuh"
#include "ops_layout.h"

// dst (=, or += when add) src, n elements.
__global__ void k_shape_copy(real *dst, const real *src, int64_t N, bool add) {
    CU_FOR(i, N) dst[i] = add ? dst[i] + src[i] : src[i];
}

static void shape_copy(real *dst, const real *src, int64_t N, bool add) {
    if (N <= 0) return;
    if (!add) {
        CU_CHECK(cudaMemcpyAsync(dst, src, (size_t)N * sizeof(real), cudaMemcpyDeviceToDevice, cu_stream));
        return;
    }
    k_shape_copy<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(dst, src, N, true);
    CU_LAUNCHED();
}

// ---- reshape: a contiguous copy ----

extern "C" void cu_reshape_forward(Node *n) { shape_copy(n->out[0]->data, n->in[0]->data, n->in[0]->numel, false); }

extern "C" void cu_reshape_backward(Node *n) {
    bool fresh;
    real *dx = CU_GRAD_FRESH(n, 0, &fresh);
    if (dx) shape_copy(dx, n->out[0]->grad, n->in[0]->numel, !fresh);
}

// ---- transpose: swap dimensions d0 and d1 ----

// Output element o (row-major in m.shape) is input element i. back: the
// input's gradient at i gets the output's at o (a permutation: each i once,
// so a fresh buffer is written whole).
__global__ void k_transpose(TransposeMap m, const real *src, real *dst, int64_t N, bool back, bool fresh) {
    CU_FOR(o, N) {
        int64_t q = o, i = 0;
        for (int k = 3; k >= 0; k--) {
            i += (q % m.shape[k]) * m.stride[k];
            q /= m.shape[k];
        }
        if (!back) dst[o] = src[i];
        else dst[i] = fresh ? src[o] : dst[i] + src[o];
    }
}

// iarg: 0 d0, 1 d1 (non-negative)
extern "C" void cu_transpose_forward(Node *n) {
    int64_t N = n->in[0]->numel;
    if (N == 0) return;
    TransposeMap m = transpose_map(n->in[0], n->iarg[0], n->iarg[1]);   // (ops_shape.c)
    k_transpose<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(m, n->in[0]->data, n->out[0]->data, N, false, false);
    CU_LAUNCHED();
}

extern "C" void cu_transpose_backward(Node *n) {
    bool fresh;
    real *dx = CU_GRAD_FRESH(n, 0, &fresh);
    int64_t N = n->in[0]->numel;
    if (!dx || N == 0) return;
    TransposeMap m = transpose_map(n->in[0], n->iarg[0], n->iarg[1]);
    k_transpose<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(m, n->out[0]->grad, dx, N, true, fresh);
    CU_LAUNCHED();
}

// ---- slice and concat: (outer, size along dim, inner) views ----

static void cu_dim_split(const Tensor *x, int dim, int64_t *outer, int64_t *inner) {
    *outer = 1;
    *inner = 1;
    for (int i = 0; i < dim; i++) *outer *= x->shape[i];
    for (int i = dim + 1; i < x->ndim; i++) *inner *= x->shape[i];
}

// The part: blk contiguous elements at offset off in each outer row of row
// elements of the whole. Forward (slice) / concat's backward: part[i] (=, or
// += when add) whole[...]; to_whole: whole[...] = part[i] (concat's forward).
__global__ void k_part_copy(real *part, real *whole, int64_t N, int64_t blk, int64_t row, int64_t off, bool to_whole,
                            bool add) {
    CU_FOR(i, N) {
        int64_t w = i / blk * row + off + i % blk;
        if (to_whole) whole[w] = part[i];
        else part[i] = add ? part[i] + whole[w] : whole[w];
    }
}

// The whole's gradient from the part's (slice's backward), one thread per
// element of the whole: fresh writes zeros outside the part, else only the
// part's elements are added to.
__global__ void k_slice_back(real *dx, const real *g, int64_t N, int64_t blk, int64_t row, int64_t off, bool fresh) {
    CU_FOR(i, N) {
        int64_t q = i % row - off;
        bool in = q >= 0 && q < blk;
        if (fresh) dx[i] = in ? g[i / row * blk + q] : (real)0;
        else if (in) dx[i] += g[i / row * blk + q];
    }
}

// iarg: 0 dim, 1 start, 2 len
extern "C" void cu_slice_forward(Node *n) {
    const Tensor *x = n->in[0];
    int64_t outer, inner, N = n->out[0]->numel;
    cu_dim_split(x, n->iarg[0], &outer, &inner);
    int64_t row = x->shape[n->iarg[0]] * inner, blk = n->iarg[2] * inner, off = n->iarg[1] * inner;
    if (N == 0) return;
    k_part_copy<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(n->out[0]->data, x->data, N, blk, row, off, false, false);
    CU_LAUNCHED();
}

extern "C" void cu_slice_backward(Node *n) {
    const Tensor *x = n->in[0];
    bool fresh;
    real *dx = CU_GRAD_FRESH(n, 0, &fresh);
    if (!dx || x->numel == 0) return;
    int64_t outer, inner;
    cu_dim_split(x, n->iarg[0], &outer, &inner);
    int64_t row = x->shape[n->iarg[0]] * inner, blk = n->iarg[2] * inner, off = n->iarg[1] * inner;
    k_slice_back<<<cu_grid(x->numel), CU_THREADS, 0, cu_stream>>>(dx, n->out[0]->grad, x->numel, blk, row, off, fresh);
    CU_LAUNCHED();
}

// iarg: 0 dim. One launch per input.
extern "C" void cu_concat_forward(Node *n) {
    const Tensor *o = n->out[0];
    int64_t outer, inner;
    cu_dim_split(o, n->iarg[0], &outer, &inner);
    int64_t row = o->shape[n->iarg[0]] * inner, off = 0;
    for (int k = 0; k < n->n_in; k++) {
        int64_t blk = n->in[k]->shape[n->iarg[0]] * inner, N = n->in[k]->numel;
        if (N > 0) {
            k_part_copy<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(n->in[k]->data, o->data, N, blk, row, off, true,
                                                                  false);
            CU_LAUNCHED();
        }
        off += blk;
    }
}

// One launch per input, in order: an input given twice has its first part
// written (fresh) and its second added after it.
extern "C" void cu_concat_backward(Node *n) {
    const Tensor *o = n->out[0];
    int64_t outer, inner;
    cu_dim_split(o, n->iarg[0], &outer, &inner);
    int64_t row = o->shape[n->iarg[0]] * inner, off = 0;
    for (int k = 0; k < n->n_in; k++) {
        int64_t blk = n->in[k]->shape[n->iarg[0]] * inner, N = n->in[k]->numel;
        bool fresh;
        real *dx = CU_GRAD_FRESH(n, k, &fresh);
        if (dx && N > 0) {
            k_part_copy<<<cu_grid(N), CU_THREADS, 0, cu_stream>>>(dx, o->grad, N, blk, row, off, false, !fresh);
            CU_LAUNCHED();
        }
        off += blk;
    }
}
