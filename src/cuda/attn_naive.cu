// attn_naive.cu: the readable reference for op_attention on the GPU
// (attn_naive.c), sums in double, the full probability matrix P saved:
//   forward:  P_ts = exp(scale q_t.k_s - max) / sum   (s <= t, else 0)
//             o_t  = sum_s P_ts v_s
//   backward: dS_ts = P_ts (dP_ts - sum_s' P_ts' dP_ts'),  dP_ts = do_t . v_s,
//             dq_t = scale sum_s dS_ts k_s,  dk_s = scale sum_t dS_ts q_t,
//             dv_s = sum_t P_ts do_t.
//
// Naive. One block per row (b, h, t) with the row in shared memory, in
// double as attn_naive.c; P (B, H, T, T) saved. The backward: one block per
// query row (dS row, dq), then one per key row (dk, dv from the columns of dS
// and P), dS kept (B, H, T, T) in double in between.
#include <math.h>

#include "cuda_internal.cuh"

#define NA_THREADS 128

// Block-wide max of one double per thread (as cu_block_sum; shm 32 doubles).
__device__ __forceinline__ double na_block_max(double v, double *shm) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();   // shm may still be read by a previous call
    if (lane == 0) shm[warp] = v;
    __syncthreads();
    v = lane < nw ? shm[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Shared memory of the per-row kernels: the row (T doubles) and 32 for the reductions.
static size_t na_smem(int T) { return ((size_t)T + 32) * sizeof(double); }

// One block per row r = (b H + h) T + t: P_t. = softmax over the allowed
// s <= t of scale q_t.k_s (double), o_t = sum_s P_ts v_s. P (B, H, T, T) or
// NULL; allow (B, T, T) or NULL.
__global__ void __launch_bounds__(NA_THREADS)
    k_naive_fwd(int T, int H, int dk, int dv, double scale, const unsigned char *allow, const real *q,
                const real *k, const real *v, real *o, real *P) {
    extern __shared__ double na_row[];
    double *p = na_row, *red = na_row + T;
    int64_t r = blockIdx.x, bh = r / T;
    int t = (int)(r % T), b = (int)(bh / H), h = (int)(bh % H), tid = threadIdx.x;
    int64_t ldq = (int64_t)H * dk, ldv = (int64_t)H * dv, row0 = (int64_t)b * T;
    const real *qt = q + (row0 + t) * ldq + h * dk;
    double mx = -INFINITY;
    for (int s = tid; s <= t; s += NA_THREADS) {
        double x = -INFINITY;   // masked out: exp gives 0
        if (!allow || allow[(row0 + t) * T + s]) {
            const real *ks = k + (row0 + s) * ldq + h * dk;
            double dot = 0;
            for (int i = 0; i < dk; i++) dot += (double)qt[i] * ks[i];
            x = scale * dot;
        }
        p[s] = x;
        mx = fmax(mx, x);
    }
    mx = na_block_max(mx, red);   // finite: the builder checked every row allows some s <= t
    double sum = 0;
    for (int s = tid; s <= t; s += NA_THREADS) {
        p[s] = exp(p[s] - mx);
        sum += p[s];
    }
    sum = cu_block_sum(sum, red);
    real *Pt = P ? P + r * T : NULL;
    for (int s = tid; s < T; s += NA_THREADS) {
        if (s <= t) p[s] /= sum;
        if (Pt) Pt[s] = s <= t ? (real)p[s] : (real)0;
    }
    __syncthreads();
    for (int j = tid; j < dv; j += NA_THREADS) {
        double acc = 0;
        for (int s = 0; s <= t; s++) acc += p[s] * v[(row0 + s) * ldv + h * dv + j];
        o[(row0 + t) * ldv + h * dv + j] = (real)acc;
    }
}

// iarg: 0 B, 1 T, 2 H, 3 dk, 4 dv; farg[0] scale; aux: allow (B, T, T) or
// NULL (host memory); saved: P (B, H, T, T) or NULL.
extern "C" void cu_naive_attn_forward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], H = n->iarg[2], dk = n->iarg[3], dv = n->iarg[4];
    int64_t rows = (int64_t)B * H * T;
    if (rows == 0) return;
    size_t smem = na_smem(T);
    cu_smem_prepare((const void *)k_naive_fwd, smem, "attention_naive", dk, dv);
    unsigned char *allow = NULL;
    if (n->aux) {
        size_t bytes = (size_t)B * T * T;
        allow = (unsigned char *)tape_dalloc(n->tape, bytes);
        cu_from_host(allow, n->aux, bytes);
    }
    k_naive_fwd<<<(unsigned)rows, NA_THREADS, smem, cu_stream>>>(T, H, dk, dv, n->farg[0], allow, n->in[0]->data,
                                                                 n->in[1]->data, n->in[2]->data, n->out[0]->data,
                                                                 (real *)n->saved);
    CU_LAUNCHED();
}

// One block per query row r: dS_ts = P_ts (dP_ts - sum_s' P_ts' dP_ts'),
// dP_ts = dO_t . v_s (double); the row into dS (B, H, T, T) when not NULL,
// and dq_t = scale sum_s dS_ts k_s into gq when not NULL.
__global__ void __launch_bounds__(NA_THREADS)
    k_naive_dq(int T, int H, int dk, int dv, double scale, const real *k, const real *v, const real *dO,
               const real *P, double *dS, real *gq, bool fresh) {
    extern __shared__ double na_row[];
    double *ds = na_row, *red = na_row + T;
    int64_t r = blockIdx.x, bh = r / T;
    int t = (int)(r % T), b = (int)(bh / H), h = (int)(bh % H), tid = threadIdx.x;
    int64_t ldq = (int64_t)H * dk, ldv = (int64_t)H * dv, row0 = (int64_t)b * T;
    const real *Pt = P + r * T, *dOt = dO + (row0 + t) * ldv + h * dv;
    double rowdot = 0;
    for (int s = tid; s <= t; s += NA_THREADS) {
        double dp = 0;
        if (Pt[s] != 0) {   // else dS_ts = 0 whatever dP_ts
            const real *vs = v + (row0 + s) * ldv + h * dv;
            for (int j = 0; j < dv; j++) dp += (double)dOt[j] * vs[j];
        }
        ds[s] = dp;
        rowdot += Pt[s] * dp;
    }
    rowdot = cu_block_sum(rowdot, red);
    for (int s = tid; s <= t; s += NA_THREADS) {
        ds[s] = Pt[s] * (ds[s] - rowdot);
        if (dS) dS[r * T + s] = ds[s];
    }
    __syncthreads();
    if (!gq) return;
    for (int i = tid; i < dk; i += NA_THREADS) {
        double acc = 0;
        for (int s = 0; s <= t; s++) acc += ds[s] * k[(row0 + s) * ldq + h * dk + i];
        real g = (real)(scale * acc), *p = gq + (row0 + t) * ldq + h * dk + i;
        *p = fresh ? g : *p + g;
    }
}

// One block per key row r = (b H + h) T + s: dk_s = scale sum_{t >= s} dS_ts
// q_t, dv_s = sum_{t >= s} P_ts dO_t (double). gk or gv may be NULL; one
// buffer for both (k and v one tensor) gets dk written first, then dv added.
__global__ void __launch_bounds__(NA_THREADS)
    k_naive_dkv(int T, int H, int dk, int dv, double scale, const real *q, const real *dO, const real *P,
                const double *dS, real *gk, bool fresh_k, real *gv, bool fresh_v) {
    int64_t r = blockIdx.x, bh = r / T;
    int s = (int)(r % T), b = (int)(bh / H), h = (int)(bh % H), tid = threadIdx.x;
    int64_t ldq = (int64_t)H * dk, ldv = (int64_t)H * dv, row0 = (int64_t)b * T;
    const int64_t col = bh * T * T + s;   // (t, s) of this head is col + t T
    if (gk)
        for (int i = tid; i < dk; i += NA_THREADS) {
            double acc = 0;
            for (int t = s; t < T; t++) acc += dS[col + (int64_t)t * T] * q[(row0 + t) * ldq + h * dk + i];
            real g = (real)(scale * acc), *p = gk + (row0 + s) * ldq + h * dk + i;
            *p = fresh_k ? g : *p + g;
        }
    __syncthreads();
    if (gv)
        for (int j = tid; j < dv; j += NA_THREADS) {
            double acc = 0;
            for (int t = s; t < T; t++) acc += (double)P[col + (int64_t)t * T] * dO[(row0 + t) * ldv + h * dv + j];
            real g = (real)acc, *p = gv + (row0 + s) * ldv + h * dv + j;
            *p = fresh_v ? g : *p + g;
        }
}

extern "C" void cu_naive_attn_backward(Node *n) {
    int B = n->iarg[0], T = n->iarg[1], H = n->iarg[2], dk = n->iarg[3], dv = n->iarg[4];
    double scale = n->farg[0];
    bool fq = false, fk = false, fv = false;
    real *gq = CU_GRAD_FRESH(n, 0, &fq), *gk = CU_GRAD_FRESH(n, 1, &fk), *gv = CU_GRAD_FRESH(n, 2, &fv);
    int64_t rows = (int64_t)B * H * T;
    if ((!gq && !gk && !gv) || rows == 0) return;
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    const real *dO = n->out[0]->grad, *P = (const real *)n->saved;
    double *dS = gk ? (double *)tape_dalloc(n->tape, (size_t)rows * T * sizeof(double)) : NULL;
    // dq first: when q is also k or v, its gradient is written here (fresh)
    // and added to below.
    if (gq || gk) {
        size_t smem = na_smem(T);
        cu_smem_prepare((const void *)k_naive_dq, smem, "attention_naive backward", dk, dv);
        k_naive_dq<<<(unsigned)rows, NA_THREADS, smem, cu_stream>>>(T, H, dk, dv, scale, k, v, dO, P, dS, gq, fq);
        CU_LAUNCHED();
    }
    if (gk || gv) {
        k_naive_dkv<<<(unsigned)rows, NA_THREADS, 0, cu_stream>>>(T, H, dk, dv, scale, q, dO, P, dS, gk, fk, gv,
                                                                  fv);
        CU_LAUNCHED();
    }
}
