// dsa_sparse.cu: causal softmax attention over a selection (B, T, K) on the
// GPU: op_sparse_attention (dsa_sparse.c), and the selection's checks and
// transpose that dsa_sel_kl.cu uses too. The selection is device memory
// (the node's aux on a GPU tape). Per (b, h, t) with selection Sel_t:
//   a_s = scale q_t . k_s,  lse_t = logsumexp(a),  o_t = sum_s exp(a_s - lse_t) v_s;
//   backward dS_s = P_s do_t . (v_s - o_t),  dq_t = scale sum_s dS_s k_s,
//   dk_s += scale dS_s q_t,  dv_s += P_s do_t.
//
// Sparse attention. Forward: a block per (row, head): a warp per selected
// key for the scores (lanes over the head dim, a fixed shuffle tree), the
// row's max and sum of exponentials (double, fixed trees), then each warp
// sums the values of every 4th selected key (lanes over the columns) and
// the warps' sums add in warp order. Each warp keeps 4 keys' scattered
// loads in flight.
// Backward: (1) a block per (row, head) recomputes P = exp(scale q.k - lse),
// dS = scale P dO.(v - o), keeps both (B, T, H, K) and writes dq_t = sum_j
// dS_j k_sj; (2) the selection transposed: every entry (b, t, j) sorted by
// the key row b*T + sel it reads (a stable radix sort, so each key's entries
// stay in ascending t); (3) a block per key row gathers dk_s = sum dS q_t and
// dv_s = sum P dO_t over its entries in that order. No atomics, every
// gradient element summed by one thread in a fixed order: a run repeats
// bit for bit.
//
// An invalid selection (a row selecting nothing, or a later position)
// stops the forward kernel with a printed message (the next CUDA call then
// fails): the selection is never copied to the host.
#include <cub/device/device_radix_sort.cuh>
#include <limits.h>
#include <math.h>

#include "dsa_common.cuh"

// ---------------------------------------------------------------- the selection

// Stop when a row of sel (rows, K) selects nothing or a position after its own.
__global__ void k_sel_check(const int *sel, int64_t rows, int T, int K, int op) {
    const char *name = op == 0 ? "sparse_attention" : "dsa_sel_kl";
    CU_FOR(r, rows) {
        int t = (int)(r % T);
        const int *sr = sel + r * K;
        if (sr[0] < 0) {
            printf("%s: row (b %d, t %d) of the selection selects nothing\n", name, (int)(r / T), t);
            __trap();
        }
        for (int j = 0; j < K && sr[j] >= 0; j++)
            if (sr[j] > t) {
                printf("%s: row (b %d, t %d) selects the future position %d\n", name, (int)(r / T), t, sr[j]);
                __trap();
            }
    }
}

void sel_check(const int *sel, int B, int T, int K, int op) {
    int64_t rows = (int64_t)B * T;
    if (rows == 0) return;
    k_sel_check<<<cu_grid(rows), CU_THREADS, 0, cu_stream>>>(sel, rows, T, K, op);
    CU_LAUNCHED();
}

// keys[e] = the key row b*T + s that entry e = (b*T + t)*K + j reads, or
// n_keys (after every key) for a -1; vals[e] = e.
__global__ void k_sel_keys(const int *sel, int64_t n, int T, int K, unsigned n_keys, unsigned *keys, int *vals) {
    CU_FOR(e, n) {
        int s = sel[e];
        int64_t b = e / ((int64_t)T * K);
        keys[e] = s >= 0 ? (unsigned)(b * T + s) : n_keys;
        vals[e] = (int)e;
    }
}

// start[k] = the first index of sorted keys >= k, k = 0 .. n_keys (binary search).
__global__ void k_run_starts(const unsigned *keys, int64_t n, unsigned n_keys, int *start) {
    CU_FOR(k, (int64_t)n_keys + 1) {
        int64_t lo = 0, hi = n;
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (keys[mid] < (unsigned)k) lo = mid + 1;
            else hi = mid;
        }
        start[k] = (int)lo;
    }
}

// The selection's entries grouped by the key row they read: entries
// order[start[k] .. start[k+1]) read key row k = b*T + s, in ascending t
// (the sort is stable). Scratch on the tape's device arena; no wait.
void sel_transpose(Tape *tp, const int *sel, int B, int T, int K, const int **order, const int **start) {
    int64_t n = (int64_t)B * T * K;
    ASSERT(n < INT_MAX && (int64_t)B * T < INT_MAX, "the selection (%d, %d, %d) is too large for the GPU sort", B,
           T, K);
    unsigned n_keys = (unsigned)((int64_t)B * T);
    unsigned *keys = (unsigned *)tape_dalloc(tp, (size_t)n * sizeof(unsigned));
    unsigned *keys_sorted = (unsigned *)tape_dalloc(tp, (size_t)n * sizeof(unsigned));
    int *vals = (int *)tape_dalloc(tp, (size_t)n * sizeof(int));
    int *vals_sorted = (int *)tape_dalloc(tp, (size_t)n * sizeof(int));
    int *st = (int *)tape_dalloc(tp, ((size_t)n_keys + 1) * sizeof(int));
    k_sel_keys<<<cu_grid(n), CU_THREADS, 0, cu_stream>>>(sel, n, T, K, n_keys, keys, vals);
    CU_LAUNCHED();
    int end_bit = 32 - __builtin_clz(n_keys);   // the keys are <= n_keys
    size_t temp = 0;
    CU_CHECK(cub::DeviceRadixSort::SortPairs(NULL, temp, keys, keys_sorted, vals, vals_sorted, (int)n, 0, end_bit,
                                             cu_stream));
    void *tmp = tape_dalloc(tp, temp > 0 ? temp : 1);
    CU_CHECK(cub::DeviceRadixSort::SortPairs(tmp, temp, keys, keys_sorted, vals, vals_sorted, (int)n, 0, end_bit,
                                             cu_stream));
    k_run_starts<<<cu_grid((int64_t)n_keys + 1), CU_THREADS, 0, cu_stream>>>(keys_sorted, n, n_keys, st);
    CU_LAUNCHED();
    *order = vals_sorted;
    *start = st;
}

// ---------------------------------------------------------------- sparse attention

typedef struct SpDims {
    int B, T, H, dk, dv, K;
    real scale;
    int Tk;   // key and value rows per batch row: T, or a decode cache's max_T
} SpDims;

static SpDims sp_dims(const Node *n) {
    SpDims d = {n->iarg[0], n->iarg[1], n->iarg[2], n->iarg[3], n->iarg[4], n->iarg[5], (real)n->farg[0],
                n->iarg[1]};
    return d;
}

// Dynamic shared memory of the per-(row, head) kernels: nr rows of K reals,
// nv vectors of up to max(dk, dv) reals, then K ints rounded up to whole
// 16-byte vectors. The padding may be read but is never used. In float64 the
// ints sit on an 8-byte boundary, and the compiled k_sparse_fwd reads the
// last entry of an odd K with one 8-byte load that takes the 4 bytes after
// it too: compute-sanitizer's memcheck reports those reads past the end
// without the padding.
static size_t sp_smem(const SpDims &d, int nr, int nv) {
    size_t ints = ((size_t)d.K + 3) & ~(size_t)3;
    return ((size_t)nr * d.K + (size_t)nv * (d.dk > d.dv ? d.dk : d.dv)) * sizeof(real) + ints * sizeof(int);
}

#define SP_WARPS (DSA_THREADS / 32)
#define SP_INFLIGHT 4   // scattered loads a warp keeps in flight in k_sparse_fwd

// A block per (row r, head h), blockIdx.x = r H + h. Dynamic shared memory:
// sp_smem(d, 1, 1 + SP_WARPS) (a, qs, the warps' partial outputs, sel's row).
__global__ void __launch_bounds__(DSA_THREADS)
    k_sparse_fwd(SpDims d, const real *q, const real *k, const real *v, const int *sel, real *o, real *lse) {
    extern __shared__ __align__(16) unsigned char sp_smem_[];
    __shared__ real shr[32];
    __shared__ double shd[32];
    __shared__ int shi[32];
    int64_t bid = blockIdx.x, r = bid / d.H, b = r / d.T;
    int h = (int)(bid % d.H), t = (int)(r % d.T), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int64_t ldk = (int64_t)d.H * d.dk, ldv = (int64_t)d.H * d.dv;
    int dm = d.dk > d.dv ? d.dk : d.dv;
    real *a = (real *)sp_smem_, *qs = a + d.K, *part = qs + dm;   // part: SP_WARPS rows of dv
    int *si = (int *)(part + SP_WARPS * dm);
    const int *sr = sel + r * d.K;
    for (int j = tid; j < d.K; j += DSA_THREADS) si[j] = sr[j];
    for (int x = tid; x < d.dk; x += DSA_THREADS) qs[x] = q[r * ldk + h * d.dk + x];
    int n = sel_count(sr, d.K, shi);   // (its barriers publish si and qs)
    const real *kh = k + b * d.Tk * ldk + h * d.dk, *vh = v + b * d.Tk * ldv + h * d.dv;
    // The selected keys are scattered over the cache: each warp takes SP_INFLIGHT of them at a time so that their
    // loads are in flight together (a key's sum is the same fixed tree as one at a time).
    for (int j0 = warp; j0 < n; j0 += SP_INFLIGHT * SP_WARPS) {
        real dot[SP_INFLIGHT];
        const real *ks[SP_INFLIGHT];
        for (int u = 0; u < SP_INFLIGHT; u++) {
            int j = j0 + u * SP_WARPS;
            ks[u] = kh + (int64_t)si[j < n ? j : j0] * ldk;
            dot[u] = 0;
        }
        for (int x = lane; x < d.dk; x += 32)
            for (int u = 0; u < SP_INFLIGHT; u++) dot[u] = fma(qs[x], ks[u][x], dot[u]);
        for (int u = 0; u < SP_INFLIGHT; u++) {
            int j = j0 + u * SP_WARPS;
            dot[u] = warp_sum(dot[u]);
            if (lane == 0 && j < n) a[j] = dot[u] * d.scale;
        }
    }
    __syncthreads();
    real mx = -INFINITY;
    for (int j = tid; j < n; j += DSA_THREADS) mx = a[j] > mx ? a[j] : mx;
    mx = cu_block_max(mx, shr);
    double sum = 0;
    for (int j = tid; j < n; j += DSA_THREADS) {
        real e = exp(a[j] - mx);
        a[j] = e;
        sum += e;
    }
    sum = cu_block_sum(sum, shd);   // (its barriers publish a)
    real rs = (real)sum;
    // o = sum_j a_j v_sj / sum: warp w sums the keys j = w, w + SP_WARPS, ... (lanes over the columns,
    // SP_INFLIGHT keys' loads in flight), then the warps' sums add in warp order. (A thread per column summing
    // all K keys waited for K scattered loads one after the other: 31 us for K = 64 at decoding's 4 blocks.)
    for (int x0 = 0; x0 < d.dv; x0 += 32) {
        int x = x0 + lane;
        if (x >= d.dv) break;
        real acc = 0;
        int j = warp;
        for (; j + (SP_INFLIGHT - 1) * SP_WARPS < n; j += SP_INFLIGHT * SP_WARPS) {
            real vj[SP_INFLIGHT];
            for (int u = 0; u < SP_INFLIGHT; u++) vj[u] = vh[(int64_t)si[j + u * SP_WARPS] * ldv + x];
            for (int u = 0; u < SP_INFLIGHT; u++) acc = fma(a[j + u * SP_WARPS], vj[u], acc);
        }
        for (; j < n; j += SP_WARPS) acc = fma(a[j], vh[(int64_t)si[j] * ldv + x], acc);
        part[warp * d.dv + x] = acc;
    }
    __syncthreads();
    for (int x = tid; x < d.dv; x += DSA_THREADS) {
        real acc = 0;
        for (int w = 0; w < SP_WARPS; w++) acc += part[w * d.dv + x];
        o[r * ldv + h * d.dv + x] = acc / rs;
    }
    if (lse && tid == 0) lse[(b * d.H + h) * d.T + t] = (real)((double)mx + log(sum));
}

// iarg: 0 B, 1 T, 2 H, 3 dk, 4 dv, 5 K; farg[0] scale; aux: sel (B, T, K)
// on the device; saved: lse (B, H, T) or NULL.
extern "C" void cu_sparse_forward(Node *n) {
    SpDims d = sp_dims(n);
    int64_t blocks = (int64_t)d.B * d.T * d.H;
    if (blocks == 0) return;
    ASSERT(blocks <= INT_MAX, "sparse_attention: %lld rows x heads exceed the GPU grid", (long long)blocks);
    const int *sel = (const int *)n->aux;
    sel_check(sel, d.B, d.T, d.K, 0);
    size_t smem = sp_smem(d, 1, 1 + SP_WARPS);
    dsa_smem_prepare((const void *)k_sparse_fwd, smem, "sparse_attention on the GPU");
    k_sparse_fwd<<<(unsigned)blocks, DSA_THREADS, smem, cu_stream>>>(d, n->in[0]->data, n->in[1]->data,
                                                                     n->in[2]->data, sel, n->out[0]->data,
                                                                     (real *)n->saved);
    CU_LAUNCHED();
}

// Decoding: dsa_sparse_decode's twin. T0 queries per batch row (1 when
// decoding, a prefill window's otherwise), q (B, T0, H*dk), each over the
// cache slots in its row of sel (B, T0, K); kc, vc (B, max_T, H*dk / H*dv).
extern "C" void cu_dsa_prefix_sparse(real *o, const real *q, const real *kc, const real *vc, int B, int T0,
                                     int max_T, const int *sel, int K, int H, int dk, int dv, double scale) {
    SpDims d = {B, T0, H, dk, dv, K, (real)scale, max_T};
    int64_t blocks = (int64_t)B * T0 * H;
    if (blocks == 0) return;
    ASSERT(blocks <= INT_MAX, "attn_dsa on the GPU: %lld queries x heads exceed the grid", (long long)blocks);
    size_t smem = sp_smem(d, 1, 1 + SP_WARPS);
    dsa_smem_prepare((const void *)k_sparse_fwd, smem, "attn_dsa step on the GPU");
    k_sparse_fwd<<<(unsigned)blocks, DSA_THREADS, smem, cu_stream>>>(d, q, kc, vc, sel, o, NULL);
    CU_LAUNCHED();
}

extern "C" void cu_dsa_decode_sparse(real *o, const real *q, const real *kc, const real *vc, int B, int max_T,
                                     const int *sel, int K, int H, int dk, int dv, double scale) {
    cu_dsa_prefix_sparse(o, q, kc, vc, B, 1, max_T, sel, K, H, dk, dv, scale);
}

// A block per (row r, head h): P and dS of the row into Pg, dSg (B, T, H, K);
// dq_t = sum_j dS_j k_sj into gq (written when fresh) when gq is not NULL.
__global__ void __launch_bounds__(DSA_THREADS)
    k_sparse_dq(SpDims d, const real *q, const real *k, const real *v, const real *o, const real *dO,
                const real *lse, const int *sel, real *Pg, real *dSg, real *gq, bool fq) {
    extern __shared__ __align__(16) unsigned char sp_smem_[];
    __shared__ int shi[32];
    int64_t bid = blockIdx.x, r = bid / d.H, b = r / d.T;
    int h = (int)(bid % d.H), t = (int)(r % d.T), tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int64_t ldk = (int64_t)d.H * d.dk, ldv = (int64_t)d.H * d.dv;
    int dm = d.dk > d.dv ? d.dk : d.dv;
    real *dS = (real *)sp_smem_, *qs = dS + d.K, *dos = qs + dm, *os = dos + dm;
    int *si = (int *)(os + dm);
    const int *sr = sel + r * d.K;
    for (int j = tid; j < d.K; j += DSA_THREADS) si[j] = sr[j];
    for (int x = tid; x < d.dk; x += DSA_THREADS) qs[x] = q[r * ldk + h * d.dk + x];
    for (int x = tid; x < d.dv; x += DSA_THREADS) {
        dos[x] = dO[r * ldv + h * d.dv + x];
        os[x] = o[r * ldv + h * d.dv + x];
    }
    int n = sel_count(sr, d.K, shi);
    real L = lse[(b * d.H + h) * d.T + t];
    const real *kh = k + b * d.T * ldk + h * d.dk, *vh = v + b * d.T * ldv + h * d.dv;
    int64_t pr = bid * d.K;   // (r H + h) K
    for (int j = warp; j < n; j += DSA_THREADS / 32) {
        const real *ks = kh + (int64_t)si[j] * ldk, *vs = vh + (int64_t)si[j] * ldv;
        real s1 = 0, s2 = 0;
        for (int x = lane; x < d.dk; x += 32) s1 = fma(qs[x], ks[x], s1);
        // dO . v_s - D as dO . (v_s - o): no cancellation (as the CPU)
        for (int x = lane; x < d.dv; x += 32) s2 = fma(dos[x], vs[x] - os[x], s2);
        s1 = warp_sum(s1);
        s2 = warp_sum(s2);
        if (lane == 0) {
            real p = exp(d.scale * s1 - L), ds = d.scale * p * s2;
            dS[j] = ds;
            Pg[pr + j] = p;
            dSg[pr + j] = ds;
        }
    }
    if (!gq) return;
    __syncthreads();
    for (int x = tid; x < d.dk; x += DSA_THREADS) {
        real acc = 0;
        for (int j = 0; j < n; j++) acc = fma(dS[j], kh[(int64_t)si[j] * ldk + x], acc);
        real *g = gq + r * ldk + h * d.dk + x;
        *g = fq ? acc : *g + acc;
    }
}

// A block per key row kr = b*T + s, threads over the columns of every head:
// dk_s = sum dS q_t, dv_s = sum P dO_t over the entries that read s, in
// ascending t; written when fresh (0 for a key no query selected).
__global__ void __launch_bounds__(DSA_THREADS)
    k_sparse_dkv(SpDims d, const real *q, const real *dO, const int *order, const int *start, const real *Pg,
                 const real *dSg, real *gk, bool fk, real *gv, bool fv) {
    int64_t kr = blockIdx.x;
    int e0 = start[kr], e1 = start[kr + 1];
    int ck = d.H * d.dk, cv = d.H * d.dv, cm = ck > cv ? ck : cv;
    for (int c = threadIdx.x; c < cm; c += DSA_THREADS) {
        int hk = c / d.dk, hv = c / d.dv;
        real ak = 0, av = 0;
        for (int e = e0; e < e1; e++) {
            int ent = order[e];
            int64_t rr = ent / d.K;
            int j = ent % d.K;
            if (gk && c < ck) ak = fma(dSg[(rr * d.H + hk) * d.K + j], q[rr * ck + c], ak);
            if (gv && c < cv) av = fma(Pg[(rr * d.H + hv) * d.K + j], dO[rr * cv + c], av);
        }
        // k first, then v: one tensor as both gets its fresh write, then the add.
        if (gk && c < ck) {
            real *g = gk + kr * ck + c;
            *g = fk ? ak : *g + ak;
        }
        if (gv && c < cv) {
            real *g = gv + kr * cv + c;
            *g = fv ? av : *g + av;
        }
    }
}

extern "C" void cu_sparse_backward(Node *n) {
    SpDims d = sp_dims(n);
    bool fq = false, fk = false, fv = false;
    real *gq = CU_GRAD_FRESH(n, 0, &fq), *gk = CU_GRAD_FRESH(n, 1, &fk), *gv = CU_GRAD_FRESH(n, 2, &fv);
    int64_t blocks = (int64_t)d.B * d.T * d.H;
    if ((!gq && !gk && !gv) || blocks == 0) return;
    const int *sel = (const int *)n->aux;
    const real *q = n->in[0]->data, *k = n->in[1]->data, *v = n->in[2]->data;
    const real *o = n->out[0]->data, *dO = n->out[0]->grad, *lse = (const real *)n->saved;
    size_t pk = (size_t)blocks * d.K * sizeof(real);
    real *Pg = (real *)tape_dalloc(n->tape, pk), *dSg = (real *)tape_dalloc(n->tape, pk);
    // dq first: when q is also k or v, its gradient is written here (fresh) and added to below.
    size_t smem = sp_smem(d, 1, 3);
    dsa_smem_prepare((const void *)k_sparse_dq, smem, "sparse_attention backward on the GPU");
    k_sparse_dq<<<(unsigned)blocks, DSA_THREADS, smem, cu_stream>>>(d, q, k, v, o, dO, lse, sel, Pg, dSg, gq, fq);
    CU_LAUNCHED();
    if (!gk && !gv) return;
    const int *order, *start;
    sel_transpose(n->tape, sel, d.B, d.T, d.K, &order, &start);
    k_sparse_dkv<<<(unsigned)((int64_t)d.B * d.T), DSA_THREADS, 0, cu_stream>>>(d, q, dO, order, start, Pg, dSg, gk,
                                                                              fk, gv, fv);
    CU_LAUNCHED();
}
