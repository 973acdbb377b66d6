// ops_embed.cu: the token embedding lookup on the GPU.
//
// The table's gradient is a scatter-add over rows (several positions may
// share an id). Instead of float atomics, the backward groups the positions
// by id on the host (the ids are host memory, aux): a stable counting sort
// gives, for each id used, its positions in increasing order. One thread per
// (id, column) then adds them in that order, as the CPU does, so the result
// does not depend on timing (it is the CPU's sum, element for element).
// On a tape a CUDA graph may replay (Tape.graphable) the grouping is made on
// the device instead (a replay's ids are another batch's): the same groups,
// the same sums.
#include <string.h>

#include <cub/cub.cuh>

#include "cuda_internal.cuh"

// Columns per block of the backward (one thread each).
#define EMB_COLS 128

// y[r, j] = E[ids[r], j]
__global__ void k_embed(const int *ids, const real *E, real *y, int64_t rows, int D) {
    CU_FOR(i, rows * D) {
        int64_t r = i / D;
        int j = (int)(i - r * D);
        y[i] = E[(int64_t)ids[r] * D + j];
    }
}

// aux: the ids (numel rows), host memory. out: (rows, D)
extern "C" void cu_embedding_forward(Node *n) {
    int D = n->in[0]->shape[1];
    int64_t rows = D ? n->out[0]->numel / D : 0;
    if (rows == 0 || D == 0) return;
    int *ids = (int *)tape_dalloc(n->tape, (size_t)rows * sizeof(int));
    cu_from_host(ids, n->aux, (size_t)rows * sizeof(int));
    k_embed<<<cu_grid(rows * D), CU_THREADS, 0, cu_stream>>>(ids, n->in[0]->data, n->out[0]->data, rows, D);
    CU_LAUNCHED();
}

// Block (k, c): id uniq[k], columns c * EMB_COLS + threadIdx.x. Its positions
// are pos[start[k] .. start[k + 1]), increasing, so the sum is the CPU's
// dE[v, j] += g[r, j] over r in order.
__global__ void k_embed_back(const int *uniq, const int *start, const int *pos, const real *g, real *dE, int D) {
    int j = blockIdx.y * EMB_COLS + threadIdx.x;
    if (j >= D) return;
    int k = blockIdx.x;
    int64_t v = uniq[k];
    real acc = dE[v * D + j];
    int p1 = start[k + 1];
#pragma unroll 8
    for (int p = start[k]; p < p1; p++) acc += g[(int64_t)pos[p] * D + j];
    dE[v * D + j] = acc;
}

__global__ void k_iota(int *p, int64_t n) {
    CU_FOR(i, n) p[i] = (int)i;
}

// k_embed_back with the groups made on the device: run k of the sorted ids
// is id uniq[k], positions pos[start[k] .. start[k] + cnt[k]) increasing;
// blocks past the number of runs have nothing to do.
__global__ void k_embed_back_runs(const int *uniq, const int *cnt, const int *start, const int *nruns, const int *pos,
                                  const real *g, real *dE, int D) {
    int j = blockIdx.y * EMB_COLS + threadIdx.x;
    int k = blockIdx.x;
    if (j >= D || k >= *nruns) return;
    int64_t v = uniq[k];
    real acc = dE[v * D + j];
    int p0 = start[k], p1 = p0 + cnt[k];
#pragma unroll 8
    for (int p = p0; p < p1; p++) acc += g[(int64_t)pos[p] * D + j];
    dE[v * D + j] = acc;
}

// The grouping on the device, in stream order (no host read): cub's radix
// sort of (id, position) pairs is stable, so each id's positions stay
// increasing; run-length encoding lists the ids used and their counts, an
// exclusive sum the runs' starts. The grid covers min(V, rows) runs.
static void embed_back_device(Tape *tp, const int *ids_host, int V, int64_t rows, int D, const real *g, real *dE) {
    int n = (int)rows;
    int cap = rows < V ? (int)rows : V, bits = 1;
    while (bits < 31 && (1 << bits) < V) bits++;
    size_t ib = (size_t)n * sizeof(int), cb = (size_t)cap * sizeof(int);
    int *ids = (int *)tape_dalloc(tp, ib), *iota = (int *)tape_dalloc(tp, ib), *keys = (int *)tape_dalloc(tp, ib);
    int *pos = (int *)tape_dalloc(tp, ib), *uniq = (int *)tape_dalloc(tp, cb), *cnt = (int *)tape_dalloc(tp, cb);
    int *start = (int *)tape_dalloc(tp, cb), *nruns = (int *)tape_dalloc(tp, sizeof(int));
    cu_from_host(ids, ids_host, ib);
    cu_zero(cnt, cb);   // (the sum reads runs past the count: zeros)
    k_iota<<<cu_grid(n), CU_THREADS, 0, cu_stream>>>(iota, n);
    CU_LAUNCHED();
    size_t b1 = 0, b2 = 0, b3 = 0;
    CU_CHECK(cub::DeviceRadixSort::SortPairs(NULL, b1, ids, keys, iota, pos, n, 0, bits, cu_stream));
    CU_CHECK(cub::DeviceRunLengthEncode::Encode(NULL, b2, keys, uniq, cnt, nruns, n, cu_stream));
    CU_CHECK(cub::DeviceScan::ExclusiveSum(NULL, b3, cnt, start, cap, cu_stream));
    size_t tb = b1 > b2 ? b1 : b2;
    tb = tb > b3 ? tb : b3;
    void *tmp = tape_dalloc(tp, tb ? tb : 1);
    CU_CHECK(cub::DeviceRadixSort::SortPairs(tmp, b1, ids, keys, iota, pos, n, 0, bits, cu_stream));
    CU_CHECK(cub::DeviceRunLengthEncode::Encode(tmp, b2, keys, uniq, cnt, nruns, n, cu_stream));
    CU_CHECK(cub::DeviceScan::ExclusiveSum(tmp, b3, cnt, start, cap, cu_stream));
    dim3 grid((unsigned)cap, (unsigned)((D + EMB_COLS - 1) / EMB_COLS));
    int threads = D >= EMB_COLS ? EMB_COLS : (D + 31) / 32 * 32;
    k_embed_back_runs<<<grid, threads, 0, cu_stream>>>(uniq, cnt, start, nruns, pos, g, dE, D);
    CU_LAUNCHED();
}

extern "C" void cu_embedding_backward(Node *n) {
    bool fresh;
    real *dE = CU_GRAD_FRESH(n, 0, &fresh);
    if (!dE) return;
    const int *ids = (const int *)n->aux;
    int V = n->in[0]->shape[0], D = n->in[0]->shape[1];
    int64_t rows = D ? n->out[0]->numel / D : 0;
    // Rows of dE that no position uses get nothing: zero them when fresh,
    // then every used row adds to what is there (0 or earlier gradients).
    if (fresh) cu_zero(dE, (size_t)n->in[0]->numel * sizeof(real));
    if (rows == 0 || D == 0) return;
    // Host scratch: cnt (V + 1) counts, then each id's next slot; buf holds
    // what the kernel reads, in one copy: start (nu + 1), uniq (nu), pos (rows),
    // with nu <= min(V, rows) ids used.
    Tape *tp = n->tape;
    if (tp->graphable || cu_capturing) {
        embed_back_device(tp, ids, V, rows, D, n->out[0]->grad, dE);
        return;
    }
    int *cnt = (int *)tape_alloc(tp, ((size_t)V + 1) * sizeof(int));
    int64_t cap = rows < V ? rows : V;
    int *buf = (int *)tape_alloc(tp, (size_t)(2 * cap + 1 + rows) * sizeof(int));
    memset(cnt, 0, ((size_t)V + 1) * sizeof(int));
    for (int64_t r = 0; r < rows; r++) cnt[ids[r]]++;
    int nu = 0;
    for (int v = 0; v < V; v++) nu += cnt[v] > 0;
    int *start = buf, *uniq = buf + nu + 1, *pos = uniq + nu;
    // cnt[v] becomes the first slot of id v in pos; start/uniq list the used ids.
    int at = 0, k = 0;
    for (int v = 0; v < V; v++) {
        int c = cnt[v];
        cnt[v] = at;
        if (c > 0) {
            start[k] = at;
            uniq[k] = v;
            k++;
        }
        at += c;
    }
    start[nu] = at;   // == rows
    for (int64_t r = 0; r < rows; r++) pos[cnt[ids[r]]++] = (int)r;   // r increasing: stable
    size_t words = (size_t)(2 * nu + 1) + (size_t)rows;
    int *dbuf = (int *)tape_dalloc(tp, words * sizeof(int));
    cu_from_host(dbuf, buf, words * sizeof(int));
    dim3 grid((unsigned)nu, (unsigned)((D + EMB_COLS - 1) / EMB_COLS));
    int threads = D >= EMB_COLS ? EMB_COLS : (D + 31) / 32 * 32;
    k_embed_back<<<grid, threads, 0, cu_stream>>>(dbuf + nu + 1, dbuf, dbuf + 2 * nu + 1, n->out[0]->grad, dE, D);
    CU_LAUNCHED();
}
