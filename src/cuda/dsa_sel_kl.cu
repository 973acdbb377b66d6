// dsa_sel_kl.cu: op_dsa_sel_kl, the KL of the indexer against the sparse
// attention over the selected positions only, and its target
// dsa_sparse_target, on the GPU (dsa_sel_kl.c): per query row, the indexer
// scores I_j of the K selected positions, their log-sum-exp, the KL; the
// backward with gI_j = g (softmax(I_t)_j m_t - p_t,j), m_t = sum_j p_t,j,
// z = qI_t,i . kI_s recomputed:
//   dw_t,i += c sum_j gI_j ReLU(z),  dqI_t,i += c gI_j w_t,i [z > 0] kI_s,
//   dkI_s += c gI_j w_t,i [z > 0] qI_t,i.
//
// Selection KL. Forward: a block per row, a thread per selected entry
// (indexer score in double, as the CPU), the row's log-sum-exp and KL;
// their mean in one block. Backward: a block per row keeps gI_j and
// z_ij = qI_ti . kI_sj (per-op scratch) and writes dw_t, dqI_t (a thread
// per element, the entries in order); then dkI by key row over the same
// transposed selection.
//
#include <math.h>

#include "dsa_common.cuh"
#include "dsa_sel_kl.h"

// scale q_t^h . k_s^h in double (as dsa_sel_kl.c), one thread.
__device__ __forceinline__ double st_dot(const real *a, const real *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

// A block per row: p_t,j = (1/H) sum_h softmax over the valid j of scale
// q_t^h . k_sj^h (0 at -1 entries); each entry written by one thread, the
// heads in order (the scores recomputed in each pass).
__global__ void __launch_bounds__(DSA_THREADS)
    k_sparse_target(const real *q, const real *k, const int *sel, int T, int K, int H, int dk, double scale,
                    real *p) {
    __shared__ double shd[32];
    __shared__ int shi[32];
    int64_t r = blockIdx.x, b = r / T, ld = (int64_t)H * dk;
    int tid = threadIdx.x;
    const int *sr = sel + r * K;
    real *pr = p + r * K;
    int n = sel_count(sr, K, shi);
    for (int h = 0; h < H; h++) {
        const real *qt = q + r * ld + h * dk, *kh = k + b * T * ld + h * dk;
        double mx = -INFINITY;
        for (int j = tid; j < n; j += DSA_THREADS) mx = fmax(mx, scale * st_dot(qt, kh + (int64_t)sr[j] * ld, dk));
        for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        __syncthreads();
        if ((tid & 31) == 0) shd[tid >> 5] = mx;
        __syncthreads();
        mx = shd[0];
        for (int w = 1; w < DSA_THREADS / 32; w++) mx = fmax(mx, shd[w]);
        double sum = 0;
        for (int j = tid; j < n; j += DSA_THREADS) sum += exp(scale * st_dot(qt, kh + (int64_t)sr[j] * ld, dk) - mx);
        sum = cu_block_sum(sum, shd);
        for (int j = tid; j < K; j += DSA_THREADS) {
            real v = j < n ? (real)(exp(scale * st_dot(qt, kh + (int64_t)sr[j] * ld, dk) - mx) / (sum * H)) : (real)0;
            pr[j] = h == 0 ? v : pr[j] + v;
        }
    }
}

extern "C" void cu_dsa_sparse_target(real *p, const real *q, const real *k, const int *sel, int B, int T, int K,
                                     int H, int dk, double scale) {
    int64_t rows = (int64_t)B * T;
    if (rows == 0) return;
    k_sparse_target<<<(unsigned)rows, DSA_THREADS, 0, cu_stream>>>(q, k, sel, T, K, H, dk, scale, p);
    CU_LAUNCHED();
}

typedef struct SkDims {
    int B, T, K, HI, dI;
    double c;
} SkDims;

static SkDims sk_dims(const Node *n) {
    SkDims d = {n->iarg[0], n->iarg[1], n->iarg[2], n->iarg[3], n->iarg[4], 1.0 / sqrt((double)n->iarg[4])};
    return d;
}

// A block per row: the indexer scores of its selected entries into Ir
// (B, T, K), their log-sum-exp into lse (or not, when NULL) and the row's KL.
__global__ void __launch_bounds__(DSA_THREADS)
    k_sel_kl_fwd(SkDims d, const real *qI, const real *kI, const real *w, const real *p, const int *sel, real *Isc,
                 real *lse, double *row_loss) {
    __shared__ real shr[32];
    __shared__ double shd[32];
    __shared__ int shi[32];
    int64_t r = blockIdx.x, b = r / d.T;
    int tid = threadIdx.x;
    const int *sr = sel + r * d.K;
    const real *pr = p + r * d.K, *qt = qI + r * d.HI * d.dI, *wt = w + r * d.HI;
    real *Ir = Isc + r * d.K;
    int n = sel_count(sr, d.K, shi);
    real mx = -INFINITY;
    for (int j = tid; j < n; j += DSA_THREADS) {
        const real *ks = kI + (b * d.T + sr[j]) * d.dI;
        double acc = 0;
        for (int i = 0; i < d.HI; i++) {
            double z = st_dot(qt + (int64_t)i * d.dI, ks, d.dI);
            if (z > 0) acc += wt[i] * z;
        }
        Ir[j] = (real)(d.c * acc);
        mx = Ir[j] > mx ? Ir[j] : mx;
    }
    mx = cu_block_max(mx, shr);
    double sum = 0;
    for (int j = tid; j < n; j += DSA_THREADS) sum += exp((double)Ir[j] - (double)mx);
    sum = cu_block_sum(sum, shd);
    double l = (double)mx + log(sum), kl = 0;
    for (int j = tid; j < n; j += DSA_THREADS)
        if (pr[j] > 0) kl += (double)pr[j] * (log((double)pr[j]) - ((double)Ir[j] - l));
    kl = cu_block_sum(kl, shd);
    if (tid == 0) {
        row_loss[r] = kl;
        if (lse) lse[r] = (real)l;
    }
}

// iarg: 0 B, 1 T, 2 K, 3 HI, 4 dI; in: qI, kI, w, p; aux: sel (device);
// saved: SelKlSaved (host struct, device arrays) or NULL.
extern "C" void cu_sel_kl_forward(Node *n) {
    SkDims d = sk_dims(n);
    int64_t rows = (int64_t)d.B * d.T;
    const int *sel = (const int *)n->aux;
    SelKlSaved *sv = (SelKlSaved *)n->saved;
    double *row_loss = (double *)tape_dalloc(n->tape, (size_t)(rows > 0 ? rows : 1) * sizeof(double));
    if (rows > 0) {
        sel_check(sel, d.B, d.T, d.K, 1);
        real *Isc = sv ? sv->Isc : (real *)tape_dalloc(n->tape, (size_t)rows * d.K * sizeof(real));
        k_sel_kl_fwd<<<(unsigned)rows, DSA_THREADS, 0, cu_stream>>>(d, n->in[0]->data, n->in[1]->data,
                                                                    n->in[2]->data, n->in[3]->data, sel, Isc,
                                                                    sv ? sv->lse : NULL, row_loss);
        CU_LAUNCHED();
    }
    k_dsa_mean<<<1, 1024, 0, cu_stream>>>(row_loss, rows, n->out[0]->data);
    CU_LAUNCHED();
}

// A block per row: gI_j = g (softmax(I_t)_j m_t - p_t,j) into gIg (B, T, K)
// and z_ij into Zg (B, T, K, HI); then dw_t,i (a thread per head) and dqI_t
// (a thread per element), the entries in order, written when fresh.
__global__ void __launch_bounds__(DSA_THREADS)
    k_sel_kl_bwd_rows(SkDims d, const real *qI, const real *kI, const real *w, const real *p, const int *sel,
                      const real *Isc, const real *lse, const real *gout, double *gIg, real *Zg, real *gq, bool fq,
                      real *gw, bool fw) {
    __shared__ double shd[32];
    __shared__ int shi[32];
    int64_t r = blockIdx.x, b = r / d.T;
    int tid = threadIdx.x;
    const int *sr = sel + r * d.K;
    const real *pr = p + r * d.K, *Ir = Isc + r * d.K, *qt = qI + r * d.HI * d.dI, *wt = w + r * d.HI;
    double g = (double)gout[0] / ((double)d.B * d.T);
    int n = sel_count(sr, d.K, shi);
    double mass = 0;
    for (int j = tid; j < n; j += DSA_THREADS) mass += pr[j];
    mass = cu_block_sum(mass, shd);
    double *gIr = gIg + r * d.K;
    real *Zr = Zg + r * d.K * d.HI;
    for (int j = tid; j < n; j += DSA_THREADS) {
        gIr[j] = g * (exp((double)(Ir[j] - lse[r])) * mass - pr[j]);
        const real *ks = kI + (b * d.T + sr[j]) * d.dI;
        for (int i = 0; i < d.HI; i++) Zr[(int64_t)j * d.HI + i] = (real)st_dot(qt + (int64_t)i * d.dI, ks, d.dI);
    }
    __syncthreads();
    if (gw)
        for (int i = tid; i < d.HI; i += DSA_THREADS) {
            double acc = 0;
            for (int j = 0; j < n; j++) {
                real z = Zr[(int64_t)j * d.HI + i];
                if (z > 0) acc += gIr[j] * z;
            }
            real v = (real)(d.c * acc), *o = gw + r * d.HI + i;
            *o = fw ? v : *o + v;
        }
    if (gq)
        for (int e = tid; e < d.HI * d.dI; e += DSA_THREADS) {
            int i = e / d.dI, x = e % d.dI;
            double acc = 0, cw = d.c * wt[i];
            for (int j = 0; j < n; j++)
                if (Zr[(int64_t)j * d.HI + i] > 0) acc += cw * gIr[j] * kI[(b * d.T + sr[j]) * d.dI + x];
            real *o = gq + r * d.HI * d.dI + e;
            *o = fq ? (real)acc : *o + (real)acc;
        }
}

// A block per key row kr: dkI_s = sum over the entries (t, j) that read it
// (ascending t) of sum_i c gI_j w_t,i [z_ij > 0] qI_t,i; written when fresh.
__global__ void __launch_bounds__(DSA_THREADS)
    k_sel_kl_dk(SkDims d, const real *qI, const real *w, const int *order, const int *start, const double *gIg,
                const real *Zg, real *gk, bool fk) {
    int64_t kr = blockIdx.x;
    int e0 = start[kr], e1 = start[kr + 1];
    for (int x = threadIdx.x; x < d.dI; x += blockDim.x) {
        double acc = 0;
        for (int e = e0; e < e1; e++) {
            int ent = order[e];
            int64_t rr = ent / d.K;
            double a = d.c * gIg[ent];
            for (int i = 0; i < d.HI; i++)
                if (Zg[(int64_t)ent * d.HI + i] > 0) acc += a * w[rr * d.HI + i] * qI[(rr * d.HI + i) * d.dI + x];
        }
        real *o = gk + kr * d.dI + x;
        *o = fk ? (real)acc : *o + (real)acc;
    }
}

extern "C" void cu_sel_kl_backward(Node *n) {
    SkDims d = sk_dims(n);
    bool fq = false, fk = false, fw = false;
    real *gq = CU_GRAD_FRESH(n, 0, &fq), *gk = CU_GRAD_FRESH(n, 1, &fk), *gw = CU_GRAD_FRESH(n, 2, &fw);
    int64_t rows = (int64_t)d.B * d.T;
    if ((!gq && !gk && !gw) || rows == 0) return;
    const SelKlSaved *sv = (const SelKlSaved *)n->saved;
    const int *sel = (const int *)n->aux;
    const real *qI = n->in[0]->data, *kI = n->in[1]->data, *w = n->in[2]->data, *p = n->in[3]->data;
    double *gIg = (double *)tape_dalloc(n->tape, (size_t)rows * d.K * sizeof(double));
    real *Zg = (real *)tape_dalloc(n->tape, (size_t)rows * d.K * d.HI * sizeof(real));
    // Rows (dqI, dw) first, then the keys (dkI): one tensor as two inputs gets its fresh write first.
    k_sel_kl_bwd_rows<<<(unsigned)rows, DSA_THREADS, 0, cu_stream>>>(d, qI, kI, w, p, sel, sv->Isc, sv->lse,
                                                                     n->out[0]->grad, gIg, Zg, gq, fq, gw, fw);
    CU_LAUNCHED();
    if (!gk) return;
    const int *order, *start;
    sel_transpose(n->tape, sel, d.B, d.T, d.K, &order, &start);
    int threads = d.dI >= 128 ? 128 : (d.dI + 31) / 32 * 32;
    k_sel_kl_dk<<<(unsigned)rows, threads, 0, cu_stream>>>(d, qI, w, order, start, gIg, Zg, gk, fk);
    CU_LAUNCHED();
}
