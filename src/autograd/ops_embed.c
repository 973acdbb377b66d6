// ops_embed.c: token embedding lookup.
#include <string.h>

#include "ops.h"
#include "ops_math.h"

// Columns of dE each thread owns in the backward.
#define EMBED_COL_BLOCK 64

// aux: the ids (numel rows), arena copy. out: (rows, D)
static void embedding_forward(Node *n) {
    const Tensor *E = n->in[0];
    const int *ids = n->aux;
    int D = E->shape[1];
    int64_t rows = n->out[0]->numel / D;
    real *y = n->out[0]->data;
#pragma omp parallel for if (n->out[0]->numel > OPS_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        memcpy(y + r * D, E->data + (int64_t)ids[r] * D, (size_t)D * sizeof(real));
}

// dE[ids[r], :] += dy[r, :]. Several rows may share an id, so threads split
// the D columns instead of the rows: each thread owns a band of columns of
// every row of dE and visits the rows in order, so no two threads touch the
// same element and the sum order is fixed (independent of the thread count).
static void embedding_backward(Node *n) {
    real *dE = NODE_GRAD_IN(n, 0);
    if (!dE) return;
    const int *ids = n->aux;
    int D = n->in[0]->shape[1];
    int64_t rows = n->out[0]->numel / D;
    const real *g = n->out[0]->grad;
    int n_blocks = (D + EMBED_COL_BLOCK - 1) / EMBED_COL_BLOCK;
#pragma omp parallel for if (n->out[0]->numel > OPS_PAR_MIN && n_blocks > 1) schedule(static)
    for (int cb = 0; cb < n_blocks; cb++) {
        int j0 = cb * EMBED_COL_BLOCK, j1 = imin(D, j0 + EMBED_COL_BLOCK);
        for (int64_t r = 0; r < rows; r++) {
            real *dst = dE + (int64_t)ids[r] * D;
            const real *src = g + r * D;
            for (int j = j0; j < j1; j++) dst[j] += src[j];
        }
    }
}

static const OpDef OP_EMBEDDING = {"embedding", embedding_forward, embedding_backward,
                                   CUDA_PAIR(cu_embedding_forward, cu_embedding_backward)};

Tensor *op_embedding(Tape *tp, Tensor *E, const int *ids, int ndim, const int *shape) {
    ASSERT(E->ndim == 2, "embedding: the table must be (V, D), got %s", SHAPE(E));
    ASSERT(ndim >= 1 && ndim < TENSOR_MAX_DIMS, "embedding: ids have %d dimensions, 1 to %d", ndim,
           TENSOR_MAX_DIMS - 1);
    int V = E->shape[0], D = E->shape[1];
    int oshape[TENSOR_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        ASSERT(shape[i] >= 0, "embedding: ids dimension %d is %d", i, shape[i]);
        oshape[i] = shape[i];
    }
    oshape[ndim] = D;
    int64_t rows = shape_numel(ndim, shape);
    int *copy = tape_alloc(tp, (size_t)(rows ? rows : 1) * sizeof(int));
    for (int64_t r = 0; r < rows; r++) {
        ASSERT(ids[r] >= 0 && ids[r] < V, "embedding: token id %d at position %lld is outside [0, %d) of table %s",
               ids[r], (long long)r, V, SHAPE(E));
        copy[r] = ids[r];
    }
    dev_note_copy(copy, ids, (size_t)rows * sizeof(int));   // (a graph's capture traces the ids to the batch)
    Tensor *y = tape_tensor(tp, ndim + 1, oshape);
    Node *n = tape_op(tp, &OP_EMBEDDING, &E, 1, &y, 1);
    n->aux = copy;
    tape_forward(n);
    return y;
}
