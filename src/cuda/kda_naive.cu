// kda_naive.cu: op_kda (Kimi Delta Attention) on the GPU, token by token,
// following the CPU's recurrent form (kda_naive.c). It is gdn_naive.cu with
// the scalar decay gamma_t replaced by one per key channel: with
// alpha_t = exp(g_t) (dk of them; 0 where a document begins at t) and
// S' = Diag(alpha_t) S_{t-1} (row i of S scaled by alpha_t[i]),
//   p = S'^T k,  delta = beta (v - p),  S_t = S' + k delta^T,  o = S_t^T q;
// the backward the same lines in reverse from dS, the gradient of S_t, with
//   dg[i] = alpha[i] <dS'[i,:], S_{t-1}[i,:]>,  dS_{t-1}[i,:] = alpha[i] dS'[i,:].
// It is the recurrent form's forward and backward (the chunked form has its
// own, kda_chunk.cu and kda_chunk_backward.cu; the saved states, the state
// entering each chunk of `chunk` positions, are the same, so this backward
// can also take a chunked node: ATTNLAB_KDA_CHUNK_BWD=recurrent).
//
// The plan is gdn_naive.cu's: one block per (batch, head); a thread owns a
// column of S, so the forward and the backward's replay need no barrier; the
// backward replays a stretch of `chunk` tokens from its saved state and walks
// it in reverse, per token a column phase then a row phase. The decays
// alpha (B, T, H*dk) are one elementwise kernel's before the recurrence
// (k_kda_alpha), so a column's thread reads the row factors as it reads k,
// and dk exps a token are not made again by each of dv threads. The row
// phase owns row i, so dg[i] is that thread's own sum (gdn sums one scalar
// over the rows). No atomics; every sum is one thread's, in a fixed order.
// Sizes: as gdn_naive.cu, any dk and dv (threads take several columns or
// rows past 256; the state and the replay's states live in device memory).
#include "gdn_common.cuh"
#include "kda_node.h"

// The node layout is op_gdn's but for g's shape (kda_node.h), so gdn_args,
// gdn_grads_plan and gdn_grads_finish (which index the node by GDN_*) serve
// op_kda too; g's numel comes from its tensor.
// (kda_node.h asserts that every index is op_gdn's.)

// alpha[e] = exp(g[e]), 0 where a document begins at e's position (the
// state before it is not read): e over (B, T, H*dk), row r = b T + t.
__global__ void k_kda_alpha(real *alpha, const real *g, const int *first, int64_t n, int T, int ldk) {
    CU_FOR(e, n) {
        int64_t r = e / ldk;
        alpha[e] = first && first[r] == (int)(r % T) ? (real)0 : exp(g[e]);
    }
}

// The decays of every position and key channel, in the tape's device memory.
static const real *kda_alpha(Node *n, const GdnArgs &a) {
    int64_t cnt = (int64_t)a.B * a.T * a.ldk;
    real *alpha = (real *)tape_dalloc(n->tape, (size_t)cnt * sizeof(real));
    k_kda_alpha<<<cu_grid(cnt), CU_THREADS, 0, cu_stream>>>(alpha, a.g, a.first, cnt, a.T, a.ldk);
    CU_LAUNCHED();
    return alpha;
}

// One token on column j of S (dk, dv): S_{t-1} -> S_t, al the token's dk
// decays. Returns o_j = S_t[:, j] . q, or 0 when q is NULL.
__device__ real kda_col_step(real *S, int dk, int dv, int j, const real *q, const real *k, const real *al, real vj,
                             real bt) {
    double p = 0;
    for (int i = 0; i < dk; i++) {
        real s = S[(int64_t)i * dv + j] * al[i];
        S[(int64_t)i * dv + j] = s;
        p += (double)s * k[i];
    }
    real dj = bt * (vj - (real)p);
    double o = 0;
    for (int i = 0; i < dk; i++) {
        real s = S[(int64_t)i * dv + j] + k[i] * dj;
        S[(int64_t)i * dv + j] = s;
        if (q) o += (double)s * q[i];
    }
    return (real)o;
}

// Threads of a block: one per column (forward), per column or row
// (backward), whole warps, at most 256 (then each takes several).
static int kda_threads(int n) {
    int t = (n + 31) / 32 * 32;
    return t > 256 ? 256 : t;
}

// A thread owns column j of the state, S_T in place: no barrier.
__global__ void k_kda_naive_fwd(GdnArgs a, const real *alpha) {
    int bh = blockIdx.x, b = bh / a.H, h = bh % a.H, dk = a.dk, dv = a.dv;
    int64_t SS = (int64_t)dk * dv;
    real *S = a.sT + (int64_t)bh * SS;
    for (int j = threadIdx.x; j < dv; j += blockDim.x) {
        for (int i = 0; i < dk; i++)
            S[(int64_t)i * dv + j] = a.s0 ? a.s0[(int64_t)bh * SS + (int64_t)i * dv + j] : (real)0;
        for (int t = 0; t < a.T; t++) {
            if (a.saved && t % a.C == 0) {
                real *sv = a.saved + ((int64_t)bh * a.NC + t / a.C) * SS;
                for (int i = 0; i < dk; i++) sv[(int64_t)i * dv + j] = S[(int64_t)i * dv + j];
            }
            int64_t ok = ((int64_t)b * a.T + t) * a.ldk + (int64_t)h * dk;
            int64_t ov = ((int64_t)b * a.T + t) * a.ldv + (int64_t)h * dv;
            int64_t oh = ((int64_t)b * a.T + t) * a.H + h;
            a.o[ov + j] = kda_col_step(S, dk, dv, j, a.q + ok, a.k + ok, alpha + ok, a.v[ov + j], a.beta[oh]);
        }
    }
}

// The backward's per-block buffers.
struct KdaWs {
    real *states;       // (Cw, dk, dv): S_{t-1} for each token of a stretch
    real *dS;           // (dk, dv) dLoss/dS_t
    real *delta, *dp;   // (dv)
    double *dbc;        // (dv) dbeta's terms by column
};

static __host__ __device__ size_t kda_ws_layout(KdaWs *w, unsigned char *base, int Cw, int dk, int dv) {
    size_t at = 0, SS = (size_t)dk * dv;
    size_t ost = ws_take(&at, (size_t)Cw * SS, sizeof(real)), odS = ws_take(&at, SS, sizeof(real));
    size_t ode = ws_take(&at, dv, sizeof(real)), odp = ws_take(&at, dv, sizeof(real));
    size_t odb = ws_take(&at, dv, sizeof(double));
    if (w) {
        w->states = (real *)(base + ost), w->dS = (real *)(base + odS);
        w->delta = (real *)(base + ode), w->dp = (real *)(base + odp);
        w->dbc = (double *)(base + odb);
    }
    return (at + 255) & ~(size_t)255;
}

// Replay the stretch [t0, t0 + L) from its saved state Sc, a thread per
// column: states[s] = S_{t0+s-1}. No barrier inside; the caller's follows.
__device__ __forceinline__ void kda_replay(const GdnArgs &a, const real *alpha, const KdaWs &w, const real *Sc, int b,
                                           int h, int t0, int L) {
    int dk = a.dk, dv = a.dv;
    int64_t SS = (int64_t)dk * dv;
    for (int j = threadIdx.x; j < dv; j += blockDim.x) {
        for (int i = 0; i < dk; i++) w.states[(int64_t)i * dv + j] = Sc[(int64_t)i * dv + j];
        for (int s = 0; s + 1 < L; s++) {
            const real *Sp = w.states + (int64_t)s * SS;
            real *Sn = w.states + (int64_t)(s + 1) * SS;
            for (int i = 0; i < dk; i++) Sn[(int64_t)i * dv + j] = Sp[(int64_t)i * dv + j];
            int t = t0 + s;
            int64_t ok = ((int64_t)b * a.T + t) * a.ldk + (int64_t)h * dk;
            int64_t ov = ((int64_t)b * a.T + t) * a.ldv + (int64_t)h * dv;
            int64_t oh = ((int64_t)b * a.T + t) * a.H + h;
            kda_col_step(Sn, dk, dv, j, NULL, a.k + ok, alpha + ok, a.v[ov + j], a.beta[oh]);
        }
    }
}

// kda_naive_backward: per stretch (reverse), replay it, then per token
// (reverse) a column phase (p, delta, dS += q do^T, ddelta = dS^T k, dv, dp)
// and a row phase (dbeta by one thread; dq, dk, dg, dS_{t-1} by row).
__global__ void k_kda_naive_bwd(GdnArgs a, const real *alpha) {
    int bh = blockIdx.x, b = bh / a.H, h = bh % a.H, dk = a.dk, dv = a.dv, tid = threadIdx.x, nt = blockDim.x;
    int64_t SS = (int64_t)dk * dv;
    KdaWs w;
    kda_ws_layout(&w, a.ws + (size_t)bh * a.ws_stride, a.Cw, dk, dv);
    real *dS = w.dS;
    for (int64_t e = tid; e < SS; e += nt) dS[e] = a.dsT ? a.dsT[(int64_t)bh * SS + e] : (real)0;
    for (int c = a.NC - 1; c >= 0; c--) {
        int t0 = c * a.C, L = min(a.C, a.T - t0);
        kda_replay(a, alpha, w, a.saved + ((int64_t)bh * a.NC + c) * SS, b, h, t0, L);
        __syncthreads();   // the states, and dS (set above, or by the last row phase), are complete
        for (int s = L - 1; s >= 0; s--) {
            int t = t0 + s;
            int64_t ok = ((int64_t)b * a.T + t) * a.ldk + (int64_t)h * dk;
            int64_t ov = ((int64_t)b * a.T + t) * a.ldv + (int64_t)h * dv;
            int64_t oh = ((int64_t)b * a.T + t) * a.H + h;
            const real *S = w.states + (int64_t)s * SS, *qt = a.q + ok, *kt = a.k + ok, *vt = a.v + ov;
            const real *al = alpha + ok, *dot_ = a.dout ? a.dout + ov : NULL;
            real bt = a.beta[oh];
            // Columns: p = S'^T k, delta; o = S_t^T q gives dS += q do^T; ddelta = dS^T k.
            for (int j = tid; j < dv; j += nt) {
                double acc = 0;
                for (int i = 0; i < dk; i++) acc += (double)(al[i] * S[(int64_t)i * dv + j]) * kt[i];
                real pj = (real)acc;
                w.delta[j] = bt * (vt[j] - pj);
                if (dot_)
                    for (int i = 0; i < dk; i++) dS[(int64_t)i * dv + j] += qt[i] * dot_[j];
                double dd = 0;
                for (int i = 0; i < dk; i++) dd += (double)dS[(int64_t)i * dv + j] * kt[i];
                w.dbc[j] = dd * (vt[j] - pj);
                real ddr = (real)dd;
                if (a.gv) a.gv[ov + j] = bt * ddr;
                w.dp[j] = -bt * ddr;
            }
            __syncthreads();
            // dbeta: the last thread's (idle in the row loop when dk < nt), columns in order.
            if (tid == nt - 1 && a.gbeta) {
                double dbt = 0;
                for (int j = 0; j < dv; j++) dbt += w.dbc[j];
                a.gbeta[oh] = (real)dbt;
            }
            // Rows: dq = S_t do; dk = dS delta + S' dp; dS' = dS + k dp^T;
            // dg = alpha <dS', S_{t-1}> and dS_{t-1} = alpha dS', row by row.
            for (int i = tid; i < dk; i += nt) {
                const real *Si = S + (int64_t)i * dv;
                real *dSi = dS + (int64_t)i * dv, ki = kt[i], ai = al[i];
                if (a.gq) {
                    double acc = 0;
                    if (dot_)
                        for (int j = 0; j < dv; j++) acc += (double)(ai * Si[j] + ki * w.delta[j]) * dot_[j];
                    a.gq[ok + i] = (real)acc;
                }
                double a1 = 0, a2 = 0, rg = 0;
                for (int j = 0; j < dv; j++) a1 += (double)dSi[j] * w.delta[j];
                for (int j = 0; j < dv; j++) {
                    real d2 = dSi[j] + ki * w.dp[j];
                    a2 += (double)(ai * Si[j]) * w.dp[j];
                    rg += (double)d2 * Si[j];
                    dSi[j] = ai * d2;
                }
                if (a.gk) a.gk[ok + i] = (real)a1 + (real)a2;
                if (a.gg) a.gg[ok + i] = (real)(ai * rg);
            }
            __syncthreads();   // dS is complete; the next token rewrites delta, dp and dbc
        }
    }
    if (a.gs0)
        for (int64_t e = tid; e < SS; e += nt) a.gs0[(int64_t)bh * SS + e] = dS[e];
}

extern "C" void cu_kda_naive_forward(Node *n) {
    GdnArgs a = gdn_args(n);
    const real *alpha = kda_alpha(n, a);
    k_kda_naive_fwd<<<a.B * a.H, kda_threads(a.dv), 0, cu_stream>>>(a, alpha);
    CU_LAUNCHED();
}

extern "C" void cu_kda_naive_backward(Node *n) {
    GdnArgs a = gdn_args(n);
    a.dout = n->out[0]->grad;
    a.dsT = n->out[1]->grad;
    GdnGrads gr;
    gdn_grads_plan(n, &gr, &a);
    const real *alpha = kda_alpha(n, a);
    a.ws_stride = kda_ws_layout(NULL, NULL, a.Cw, a.dk, a.dv);
    a.ws = (unsigned char *)tape_dalloc(n->tape, a.ws_stride * a.B * a.H);
    k_kda_naive_bwd<<<a.B * a.H, kda_threads(a.dk > a.dv ? a.dk : a.dv), 0, cu_stream>>>(a, alpha);
    CU_LAUNCHED();
    gdn_grads_finish(&gr);
}
