// ops_matmul.cu: op_matmul on the GPU through cuBLAS (strided-batched and
// transposed forms), strict IEEE float32 or float64.
//
// cuBLAS is column-major: a row-major (M, N) matrix is its (N, M) transpose,
// so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T with the operands
// swapped and the transposition flags kept.
#include "cuda_internal.cuh"

// C_i (M x N) = alpha op(A_i) op(B_i) + beta C_i, row-major, for i < batch,
// with element strides sA, sB, sC between the batch's matrices (0: shared).
static void cu_gemm(bool ta, bool tb, int M, int N, int K, real alpha, const real *A, int lda, int64_t sA,
                    const real *B, int ldb, int64_t sB, real beta, real *C, int ldc, int64_t sC, int batch) {
    if (M == 0 || N == 0 || batch == 0) return;
    cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
#ifdef AG_DOUBLE
    if (batch == 1)
        CUBLAS_CHECK(cublasDgemm(cu_blas, opB, opA, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
    else
        CUBLAS_CHECK(cublasDgemmStridedBatched(cu_blas, opB, opA, N, M, K, &alpha, B, ldb, sB, A, lda, sA, &beta,
                                               C, ldc, sC, batch));
#else
    if (batch == 1)
        CUBLAS_CHECK(cublasSgemm(cu_blas, opB, opA, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
    else
        CUBLAS_CHECK(cublasSgemmStridedBatched(cu_blas, opB, opA, N, M, K, &alpha, B, ldb, sB, A, lda, sA, &beta,
                                               C, ldc, sC, batch));
#endif
}

// iarg: 0 ta, 1 tb, 2 M, 3 N, 4 K, 5 batches, 6 b batched (as ops_matmul.c)
extern "C" void cu_matmul_forward(Node *n) {
    Tensor *a = n->in[0], *b = n->in[1], *c = n->out[0];
    bool ta = n->iarg[0], tb = n->iarg[1], bb = n->iarg[6];
    int M = n->iarg[2], N = n->iarg[3], K = n->iarg[4], nb = n->iarg[5];
    int lda = ta ? M : K, ldb = tb ? K : N;
    if (!ta && !bb)   // a weight shared by every row: one product over all rows
        cu_gemm(false, tb, nb * M, N, K, 1, a->data, lda, 0, b->data, ldb, 0, 0, c->data, N, 0, 1);
    else
        cu_gemm(ta, tb, M, N, K, 1, a->data, lda, (int64_t)M * K, b->data, ldb, bb ? (int64_t)K * N : 0, 0,
                c->data, N, (int64_t)M * N, nb);
}

extern "C" void cu_matmul_backward(Node *n) {
    Tensor *a = n->in[0], *b = n->in[1], *c = n->out[0];
    bool ta = n->iarg[0], tb = n->iarg[1], bb = n->iarg[6];
    int M = n->iarg[2], N = n->iarg[3], K = n->iarg[4], nb = n->iarg[5];
    int lda = ta ? M : K, ldb = tb ? K : N;
    // da before db: when a and b are one tensor, db adds to what da wrote.
    bool fa, fb;
    real *da = CU_GRAD_FRESH(n, 0, &fa);
    real *db = CU_GRAD_FRESH(n, 1, &fb);
    real ba = fa ? 0 : 1, bbeta = fb ? 0 : 1;
    const real *dc = c->grad;
    int64_t sA = (int64_t)M * K, sB = bb ? (int64_t)K * N : 0, sC = (int64_t)M * N;
    if (da) {
        if (!ta && !bb)   // rows (R, K) = dC (R, N) op(B)^T
            cu_gemm(false, !tb, nb * M, K, N, 1, dc, N, 0, b->data, ldb, 0, ba, da, lda, 0, 1);
        else if (!ta)     // dA_i = dC_i op(B_i)^T
            cu_gemm(false, !tb, M, K, N, 1, dc, N, sC, b->data, ldb, sB, ba, da, lda, sA, nb);
        else              // A_i stored (K, M): dA_i = op(B_i) dC_i^T
            cu_gemm(tb, true, K, M, N, 1, b->data, ldb, sB, dc, N, sC, ba, da, lda, sA, nb);
    }
    if (db) {
        if (bb) {
            if (!tb) cu_gemm(!ta, false, K, N, M, 1, a->data, lda, sA, dc, N, sC, bbeta, db, ldb, sB, nb);
            else cu_gemm(true, ta, N, K, M, 1, dc, N, sC, a->data, lda, sA, bbeta, db, ldb, sB, nb);
        } else if (!ta) {   // a shared b: one product over all rows sums the batches
            int R = nb * M;
            if (!tb) cu_gemm(true, false, K, N, R, 1, a->data, K, 0, dc, N, 0, bbeta, db, ldb, 0, 1);
            else cu_gemm(true, false, N, K, R, 1, dc, N, 0, a->data, K, 0, bbeta, db, ldb, 0, 1);
        } else {
            for (int i = 0; i < nb; i++) {
                const real *ai = a->data + (int64_t)i * sA, *dci = dc + (int64_t)i * sC;
                real beta = i == 0 ? bbeta : 1;
                // A_i is stored (K, M) here: dB = A_i dC_i, or dB^T = dC_i^T A_i^T
                if (!tb) cu_gemm(false, false, K, N, M, 1, ai, lda, 0, dci, N, 0, beta, db, ldb, 0, 1);
                else cu_gemm(true, true, N, K, M, 1, dci, N, 0, ai, lda, 0, beta, db, ldb, 0, 1);
            }
        }
    }
}
