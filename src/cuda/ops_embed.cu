// ops_embed.cu: the token embedding lookup on the GPU.
//
// The table's gradient is a scatter-add over rows (several positions may
// share an id). Instead of float atomics, the backward groups the positions
// by id on the host (the ids are host memory, aux): a stable counting sort
// gives, for each id used, its positions in increasing order. One thread per
// (id, column) then adds them in that order, as the CPU does, so the result
// does not depend on timing (it is the CPU's sum, element for element).
#include <string.h>

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
