// ops_matmul.cu: op_matmul on the GPU through cuBLAS (strided-batched and
// transposed forms), strict IEEE float32 or float64; under precision = bf16
// (float32 build) the rows-times-a-weight form in bf16 on the tensor cores.
//
// cuBLAS is column-major: a row-major (M, N) matrix is its (N, M) transpose,
// so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T with the operands
// swapped and the transposition flags kept.
#include "cuda_internal.cuh"
#include "ops.h"

#ifndef AG_DOUBLE
#include <cuda_bf16.h>

// bf16 products (device_set_bf16): the forms the CPU runs in bf16 (blas.h's
// gemm_rows and gemm_sum_rows: a weight shared by every row, not narrow)
// take their operands rounded to bf16 here, round to nearest, ties to even,
// by an explicit pass into a copy, then a cuBLAS product of bf16 operands
// with float32 sums and a float32 output. Not CUBLAS_COMPUTE_32F_FAST_16BF
// on the float32 operands: cuBLAS does not document how that mode rounds
// them, so its products could not be tested against the CPU's rounding.
// The copy costs a pass over memory (docs/cuda.md weighs it), so each
// operand is rounded once per product and shared where it can be.
static bool cu_bf16;

extern "C" void cu_set_bf16(bool on) { cu_bf16 = on; }

// Whether bf16 products are on: the attention's flash kernels and op_gdn's
// chunk products ask too, so that one switch covers every product.
extern "C" bool cu_bf16_products(void) { return cu_bf16; }

__global__ void k_to_bf16(__nv_bfloat16 *dst, const float *src, int64_t n) {
    CU_FOR(i, n) dst[i] = __float2bfloat16_rn(src[i]);   // a NaN stays a NaN
}

// The same, four at a time (src 16-byte and dst 8-byte aligned): n4 groups.
__global__ void k_to_bf16_x4(uint2 *dst, const float4 *src, int64_t n4) {
    CU_FOR(i, n4) {
        float4 x = src[i];
        __nv_bfloat162 lo = __halves2bfloat162(__float2bfloat16_rn(x.x), __float2bfloat16_rn(x.y));
        __nv_bfloat162 hi = __halves2bfloat162(__float2bfloat16_rn(x.z), __float2bfloat16_rn(x.w));
        dst[i] = make_uint2(*reinterpret_cast<unsigned *>(&lo), *reinterpret_cast<unsigned *>(&hi));
    }
}

// n reals rounded to bf16 into d (device memory): groups of four where both
// are aligned for them, the rest one at a time.
static void to_bf16(__nv_bfloat16 *d, const real *src, int64_t n) {
    if (n <= 0) return;
    int64_t n4 = ((uintptr_t)src & 15) == 0 && ((uintptr_t)d & 7) == 0 ? n / 4 : 0;
    if (n4 > 0) {
        k_to_bf16_x4<<<cu_grid(n4), CU_THREADS, 0, cu_stream>>>((uint2 *)d, (const float4 *)src, n4);
        CU_LAUNCHED();
    }
    if (n > 4 * n4) {
        k_to_bf16<<<cu_grid(n - 4 * n4), CU_THREADS, 0, cu_stream>>>(d + 4 * n4, src + 4 * n4, n - 4 * n4);
        CU_LAUNCHED();
    }
}

// The rounded operands of a bf16 product, kept for its backward (n->saved,
// host memory of the tape's arena; the copies are in its device arena).
typedef struct {
    const __nv_bfloat16 *a, *b;
} Bf16Operands;

// A rounded copy of n reals, in the tape's device arena (until its reset).
static const __nv_bfloat16 *bf16_copy(Tape *tp, const real *src, int64_t n) {
    __nv_bfloat16 *d = (__nv_bfloat16 *)tape_dalloc(tp, (size_t)n * sizeof(__nv_bfloat16));
    to_bf16(d, src, n);
    return d;
}

// C (M x N) = op(A) op(B) + beta C, row-major, bf16 operands, float32 sums
// and C. The handle's math mode is strict IEEE (CUBLAS_PEDANTIC_MATH) for the
// float32 products; this product asks for the default mode, which lets
// cuBLAS use the tensor cores, and puts the handle's mode back after.
static void cu_gemm_bf16(bool ta, bool tb, int M, int N, int K, const __nv_bfloat16 *A, int lda,
                         const __nv_bfloat16 *B, int ldb, float beta, float *C, int ldc) {
    if (M == 0 || N == 0) return;
    cublasOperation_t opA = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opB = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const float alpha = 1;
    cublasMath_t mode;
    CUBLAS_CHECK(cublasGetMathMode(cu_blas, &mode));
    CUBLAS_CHECK(cublasSetMathMode(cu_blas, CUBLAS_DEFAULT_MATH));
    CUBLAS_CHECK(cublasGemmEx(cu_blas, opB, opA, N, M, K, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta,
                              C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CUBLAS_CHECK(cublasSetMathMode(cu_blas, mode));
}

extern "C" void cu_matmul_forward(Node *n);

// The rounded copy of n's a that a product just before n made, or NULL: the
// products of one input that op_matmul_multi builds one after another on a
// GPU tape (q, k, v and the gate; the MLP's two) round it once. Sound because
// every node on the tape before n was built after its last reset, and a
// tensor is not written once made, so such a copy is a's rounding now.
static const __nv_bfloat16 *earlier_copy(const Node *n) {
    const Tape *tp = n->tape;
    if (!n->recorded || tp->n_nodes < 2 || tp->nodes[tp->n_nodes - 1] != n) return NULL;
    for (int i = tp->n_nodes - 2; i >= 0 && i > tp->n_nodes - 1 - MATMUL_MULTI_MAX; i--) {
        const Node *p = tp->nodes[i];
        if (p->op->cuda_forward != cu_matmul_forward) break;
        if (p->in[0] == n->in[0] && p->saved) return ((const Bf16Operands *)p->saved)->a;
    }
    return NULL;
}

// Does node n's forward run in bf16? The forms the CPU runs in bf16: a
// weight shared by every row of a (not a^T), except the narrow products
// (N <= MATMUL_NARROW_N, b not transposed), which the CPU runs in float32
// loops of their own. The backward follows its forward (n->saved).
static bool products_bf16(const Node *n) {
    bool ta = n->iarg[0], tb = n->iarg[1], bb = n->iarg[6];
    bool narrow = !tb && n->iarg[3] <= MATMUL_NARROW_N;
    return cu_bf16 && !ta && !bb && !narrow;
}
#else
extern "C" void cu_set_bf16(bool on) {
    ASSERT(!on, "bf16 products need the float32 build (model_set_products refuses them in this one)");
}

extern "C" bool cu_bf16_products(void) { return false; }
#endif

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
#ifndef AG_DOUBLE
    if (products_bf16(n)) {
        // A and B rounded, kept for the backward (n->saved), whose dA and dB
        // read the same rounded operands without a second pass.
        Bf16Operands *r = (Bf16Operands *)tape_alloc(n->tape, sizeof *r);
        r->a = earlier_copy(n);
        if (!r->a) r->a = bf16_copy(n->tape, a->data, a->numel);
        r->b = bf16_copy(n->tape, b->data, b->numel);
        cu_gemm_bf16(false, tb, nb * M, N, K, r->a, lda, r->b, ldb, 0, c->data, N);
        n->saved = r;
        return;
    }
#endif
    if (!ta && !bb)   // a weight shared by every row: one product over all rows
        cu_gemm(false, tb, nb * M, N, K, 1, a->data, lda, 0, b->data, ldb, 0, 0, c->data, N, 0, 1);
    else
        cu_gemm(ta, tb, M, N, K, 1, a->data, lda, (int64_t)M * K, b->data, ldb, bb ? (int64_t)K * N : 0, 0,
                c->data, N, (int64_t)M * N, nb);
}

#ifndef AG_DOUBLE
// The backward of the shared-weight form in bf16: rows R = batches x M,
// dA (R, K) = dC op(B)^T, dB = the rows' sum of A^T dC (or its transpose when
// tb), from the forward's rounded A and B (n->saved) and dC rounded once
// for both, as blas.h's gemm_multi_backward does.
static void backward_bf16(Node *n, real *da, real ba, real *db, real bbeta) {
    Tensor *c = n->out[0];
    bool tb = n->iarg[1];
    int N = n->iarg[3], K = n->iarg[4], R = n->iarg[5] * n->iarg[2];
    int ldb = tb ? K : N;
    const Bf16Operands *r = (const Bf16Operands *)n->saved;
    const __nv_bfloat16 *ah = r->a, *bh = r->b, *dch = bf16_copy(n->tape, c->grad, c->numel);
    if (da) cu_gemm_bf16(false, !tb, R, K, N, dch, N, bh, ldb, ba, da, K);
    if (db) {
        if (!tb) cu_gemm_bf16(true, false, K, N, R, ah, K, dch, N, bbeta, db, ldb);
        else cu_gemm_bf16(true, false, N, K, R, dch, N, ah, K, bbeta, db, ldb);
    }
}
#endif

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
#ifndef AG_DOUBLE
    if (n->saved) {   // the forward's products were bf16
        backward_bf16(n, da, ba, db, bbeta);
        return;
    }
#endif
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
