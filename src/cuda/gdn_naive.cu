// gdn_naive.cu: the recurrent (reference) form of op_gdn (Gated DeltaNet) on
// the GPU, token by token, following gdn_naive.c (whose header states the
// math): with S' = gamma S_{t-1},
//   p = S'^T k,  delta = beta (v - p),  S_t = S' + k delta^T,  o = S_t^T q;
// the backward the same lines in reverse from dS, the gradient of S_t.
// One block per (batch, head); a thread owns a column of S, so the forward
// needs no barrier. The backward replays a stretch of `chunk` tokens from
// its saved state and walks it in reverse, per token a column phase then a
// row phase.
#include "gdn_common.cuh"

// gamma_t: 0 where a document begins at t.
__device__ __forceinline__ real naive_gamma(const GdnArgs &a, int b, int t, real g) {
    return a.first && a.first[(int64_t)b * a.T + t] == t ? (real)0 : exp(g);
}

// naive_step of gdn_naive.c on column j of S (dk, dv): S_{t-1} -> S_t.
// Returns o_j = S_t[:, j] . q, or 0 when q is NULL.
__device__ real naive_col_step(real *S, int dk, int dv, int j, const real *q, const real *k, real vj, real bt,
                               real gamma) {
    double p = 0;
    for (int i = 0; i < dk; i++) {
        real s = S[(int64_t)i * dv + j] * gamma;
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

// Threads of a recurrent-form block: one per column (forward), per column or
// row (backward), whole warps, at most 256 (then each takes several).
static int naive_threads(int n) {
    int t = (n + 31) / 32 * 32;
    return t > 256 ? 256 : t;
}

// A thread owns column j of the state, S_T in place: no barrier.
__global__ void k_gdn_naive_fwd(GdnArgs a) {
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
            a.o[ov + j] = naive_col_step(S, dk, dv, j, a.q + ok, a.k + ok, a.v[ov + j], a.beta[oh],
                                         naive_gamma(a, b, t, a.g[oh]));
        }
    }
}

// The recurrent backward's per-block buffers.
struct NaiveWs {
    real *states;          // (Cw, dk, dv): S_{t-1} for each token of a stretch
    real *dS;              // (dk, dv) dLoss/dS_t
    real *delta, *dp;      // (dv)
    double *dbc, *rowdg;   // (dv) dbeta's terms by column, (dk) dg's by row
};

static __host__ __device__ size_t naive_ws_layout(NaiveWs *w, unsigned char *base, int Cw, int dk, int dv) {
    size_t at = 0, SS = (size_t)dk * dv;
    size_t ost = ws_take(&at, (size_t)Cw * SS, sizeof(real)), odS = ws_take(&at, SS, sizeof(real));
    size_t ode = ws_take(&at, dv, sizeof(real)), odp = ws_take(&at, dv, sizeof(real));
    size_t odb = ws_take(&at, dv, sizeof(double)), org = ws_take(&at, dk, sizeof(double));
    if (w) {
        w->states = (real *)(base + ost), w->dS = (real *)(base + odS);
        w->delta = (real *)(base + ode), w->dp = (real *)(base + odp);
        w->dbc = (double *)(base + odb), w->rowdg = (double *)(base + org);
    }
    return (at + 255) & ~(size_t)255;
}

// gdn_naive_backward: per stretch (reverse), replay it from its saved state
// (a thread per column), then per token (reverse) a column phase (p, delta,
// dS += q do^T, ddelta = dS^T k, dv) and a row phase (dq, dk, dS' and dg's
// row sums), then one thread sums dbeta and dg in a fixed order.
__global__ void k_gdn_naive_bwd(GdnArgs a) {
    int bh = blockIdx.x, b = bh / a.H, h = bh % a.H, dk = a.dk, dv = a.dv, tid = threadIdx.x, nt = blockDim.x;
    int64_t SS = (int64_t)dk * dv;
    NaiveWs w;
    naive_ws_layout(&w, a.ws + (size_t)bh * a.ws_stride, a.Cw, dk, dv);
    real *dS = w.dS;
    for (int64_t e = tid; e < SS; e += nt) dS[e] = a.dsT ? a.dsT[(int64_t)bh * SS + e] : (real)0;
    for (int c = a.NC - 1; c >= 0; c--) {
        int t0 = c * a.C, L = min(a.C, a.T - t0);
        // Replay: states[s] = S_{t0+s-1}, column by column.
        const real *Sc = a.saved + ((int64_t)bh * a.NC + c) * SS;
        for (int j = tid; j < dv; j += nt) {
            for (int i = 0; i < dk; i++) w.states[(int64_t)i * dv + j] = Sc[(int64_t)i * dv + j];
            for (int s = 0; s + 1 < L; s++) {
                const real *Sp = w.states + (int64_t)s * SS;
                real *Sn = w.states + (int64_t)(s + 1) * SS;
                for (int i = 0; i < dk; i++) Sn[(int64_t)i * dv + j] = Sp[(int64_t)i * dv + j];
                int t = t0 + s;
                int64_t ok = ((int64_t)b * a.T + t) * a.ldk + (int64_t)h * dk;
                int64_t ov = ((int64_t)b * a.T + t) * a.ldv + (int64_t)h * dv;
                int64_t oh = ((int64_t)b * a.T + t) * a.H + h;
                naive_col_step(Sn, dk, dv, j, NULL, a.k + ok, a.v[ov + j], a.beta[oh], naive_gamma(a, b, t, a.g[oh]));
            }
        }
        __syncthreads();   // also: dS (set above, or by the last row phase) is complete
        for (int s = L - 1; s >= 0; s--) {
            int t = t0 + s;
            int64_t ok = ((int64_t)b * a.T + t) * a.ldk + (int64_t)h * dk;
            int64_t ov = ((int64_t)b * a.T + t) * a.ldv + (int64_t)h * dv;
            int64_t oh = ((int64_t)b * a.T + t) * a.H + h;
            const real *S = w.states + (int64_t)s * SS, *qt = a.q + ok, *kt = a.k + ok, *vt = a.v + ov;
            const real *dot_ = a.dout ? a.dout + ov : NULL;
            real bt = a.beta[oh], gamma = naive_gamma(a, b, t, a.g[oh]);
            // Columns: p = S'^T k, delta; o = S_t^T q gives dS += q do^T; ddelta = dS^T k.
            for (int j = tid; j < dv; j += nt) {
                double acc = 0;
                for (int i = 0; i < dk; i++) acc += (double)(gamma * S[(int64_t)i * dv + j]) * kt[i];
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
            // Rows: dq = S_t do; dk = dS delta + S' dp; dS' = dS + k dp^T; dS_{t-1} = gamma dS'.
            for (int i = tid; i < dk; i += nt) {
                const real *Si = S + (int64_t)i * dv;
                real *dSi = dS + (int64_t)i * dv, ki = kt[i];
                if (a.gq) {
                    double acc = 0;
                    if (dot_)
                        for (int j = 0; j < dv; j++) acc += (double)(gamma * Si[j] + ki * w.delta[j]) * dot_[j];
                    a.gq[ok + i] = (real)acc;
                }
                double a1 = 0, a2 = 0, rg = 0;
                for (int j = 0; j < dv; j++) a1 += (double)dSi[j] * w.delta[j];
                for (int j = 0; j < dv; j++) {
                    real d2 = dSi[j] + ki * w.dp[j];
                    a2 += (double)(gamma * Si[j]) * w.dp[j];
                    rg += (double)d2 * Si[j];
                    dSi[j] = gamma * d2;
                }
                if (a.gk) a.gk[ok + i] = (real)a1 + (real)a2;
                w.rowdg[i] = rg;
            }
            __syncthreads();
            if (tid == 0) {
                double dbt = 0, dgt = 0;
                for (int j = 0; j < dv; j++) dbt += w.dbc[j];
                for (int i = 0; i < dk; i++) dgt += w.rowdg[i];
                if (a.gbeta) a.gbeta[oh] = (real)dbt;
                if (a.gg) a.gg[oh] = (real)(gamma * dgt);
            }
            __syncthreads();   // the next token rewrites dbc, delta, dp
        }
    }
    if (a.gs0)
        for (int64_t e = tid; e < SS; e += nt) a.gs0[(int64_t)bh * SS + e] = dS[e];
}

extern "C" void cu_gdn_naive_forward(Node *n) {
    GdnArgs a = gdn_args(n);
    k_gdn_naive_fwd<<<a.B * a.H, naive_threads(a.dv), 0, cu_stream>>>(a);
    CU_LAUNCHED();
}

extern "C" void cu_gdn_naive_backward(Node *n) {
    GdnArgs a = gdn_args(n);
    a.dout = n->out[0]->grad;
    a.dsT = n->out[1]->grad;
    GdnGrads gr;
    gdn_grads_plan(n, &gr, &a);
    a.ws_stride = naive_ws_layout(NULL, NULL, a.Cw, a.dk, a.dv);
    a.ws = (unsigned char *)tape_dalloc(n->tape, a.ws_stride * a.B * a.H);
    k_gdn_naive_bwd<<<a.B * a.H, naive_threads(a.dk > a.dv ? a.dk : a.dv), 0, cu_stream>>>(a);
    CU_LAUNCHED();
    gdn_grads_finish(&gr);
}
