// gla.cu: the forward of op_gla_dt (the linear and mamba mixers) on the GPU,
// every form, following gla.c (math: gla.h); the backward is
// gla_backward.cu. Per chunk of L positions with chunk-local cumulative log
// decay G, entry state S_c and keys K̃ = diag(dt) K:
//   O = ((Q K̃ᵀ) ⊙ M ⊙ [exp(G_i − G_j)]) V + diag(exp(G)) Q S_c,
//   S_{c+1} = λ_c S_c + ΔS_c,  ΔS_c = (diag(exp(G_L − G)) K̃)ᵀ V,  λ_c = exp(G_L).
// gla_common.cuh has the plan of both passes.
#include "gla_common.cuh"
#include "mixer.h"

// Σ_i w_i x_i y_iᵀ (dk, dv) over one chunk, a thread per element:
//  - forward (bwd false): x = k, y = v, w = β exp(G_L − G) over the last
//    document: ΔS_c, into slot c+1 of the states (the scan replaces it), or
//    the final state for the last chunk; and λ_c;
//  - backward: x = q, y = dO, w = exp(G) over the rows that read the
//    entering state: ΔdS_c, into slot c of the state gradients.
#ifndef AG_DOUBLE
// k_gla_outer's sum with bf16 products on the tensor cores (mma_bf16.cuh):
// dst (dk, dv) = Xᵀ Y over the chunk's rows, X's rows e (β k) (forward) or
// exp(G) q (backward) rounded as formed, as the CPU's, and Y's rounded; rows
// of zero weight and those past L (the k steps are 16 rows) add zeros. Warp
// w owns the (16, 8) tiles w, w + 8, ... of dst.
static __device__ void outer_mma(const Dims &d, const Rows &r, int L, bool bwd, const real *X, const real *Y,
                                 real *dst) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gq = lane >> 2, c = lane & 3;
    int64_t ldx = (int64_t)d.H * d.dk, ldy = (int64_t)d.H * d.dv;
    int nt = d.dv / 8;
    auto x = [&](int i, int a) -> float {   // row i's weighted operand, before its rounding
        if (i >= L) return 0;
        real v = X[i * ldx + a];
        return bwd ? r.eS[i] * v : r.eL[i] * (r.dt[i] * v);
    };
    auto y = [&](int i, int j) -> float { return i < L ? Y[i * ldy + j] : (real)0; };
    for (int t = w; t < d.dk / 16 * nt; t += GLA_THREADS / 32) {
        int m0 = 16 * (t / nt), n0 = 8 * (t % nt), ma = m0 + gq, mb = ma + 8, n = n0 + gq;
        float acc[4] = {0, 0, 0, 0};
        for (int kb = 0; kb < L; kb += 16) {   // (every lane: mma.sync is warp-wide)
            int k0 = kb + 2 * c;               // this lane's first row of the step
            fb_mma(acc, fb_pack(x(k0, ma), x(k0 + 1, ma)), fb_pack(x(k0, mb), x(k0 + 1, mb)),
                   fb_pack(x(k0 + 8, ma), x(k0 + 9, ma)), fb_pack(x(k0 + 8, mb), x(k0 + 9, mb)),
                   fb_pack(y(k0, n), y(k0 + 1, n)), fb_pack(y(k0 + 8, n), y(k0 + 9, n)));
        }
        for (int e = 0; e < 4; e++) dst[(int64_t)(ma + 8 * (e >> 1)) * d.dv + n0 + 2 * c + (e & 1)] = acc[e];
    }
}
#endif

// BF: the products' operands rounded (gla_common.cuh), on the tensor cores
// (outer_mma).
template <bool BF>
__global__ void k_gla_outer(Dims d, bool bwd, const real *x, const real *y, const real *g, const real *dt,
                            const int *first, real *states, real *sfinal, real *lam) {
    __shared__ Rows r;
    Chunk k = chunk_of(d);
    rows_load(&r, d, k, g, dt, first);
    int64_t SZ = (int64_t)d.dk * d.dv;
    int ldx = d.H * d.dk, ldy = d.H * d.dv;
    const real *X = x + ((int64_t)k.b * d.T + k.t0) * ldx + (int64_t)k.h * d.dk;
    const real *Y = y + ((int64_t)k.b * d.T + k.t0) * ldy + (int64_t)k.h * d.dv;
    real *dst;
    int i0 = 0, i1 = 0;   // the rows [i0, i1) whose weight may be non-zero
    if (!bwd) {
        dst = k.c + 1 < d.nc ? states + (k.bh * d.nc + k.c + 1) * SZ : sfinal + k.bh * SZ;
        i0 = max(r.db[k.L - 1], 0);
        i1 = k.L;
        if (threadIdx.x == 0)
            lam[k.bh * d.nc + k.c] = r.db[k.L - 1] >= 0 ? (real)0 : g ? d_decay(r.G[k.L - 1]) : (real)1;
    } else {
        dst = states + (k.bh * (d.nc + 1) + k.c) * SZ;
        while (i1 < k.L && r.db[i1] < 0) i1++;   // (they come first: first[] never decreases)
    }
#ifndef AG_DOUBLE
    if (BF)
        outer_mma(d, r, k.L, bwd, X, Y, dst);
    else
#endif
        for (int64_t e = threadIdx.x; e < SZ; e += blockDim.x) {
            int a = (int)(e / d.dv), j = (int)(e % d.dv);
            real acc = 0;
            for (int i = i0; i < i1; i++) {
                real w = bwd ? r.eS[i] : r.eL[i] * r.dt[i];
                acc += w * X[(int64_t)i * ldx + a] * Y[(int64_t)i * ldy + j];
            }
            dst[e] = acc;
        }
}

// Per state element, the chunks in order from s0 (zeros when NULL): slot 0
// gets S_0, and slot c+1 (the final state after the last chunk), which holds
// ΔS_c, becomes S_{c+1} = λ_c S_c + ΔS_c. A zero state is not multiplied
// (as on the CPU: λ is finite only for g ≤ 0).
__global__ void k_gla_scan(Dims d, const real *s0, real *states, real *sfinal, const real *lam) {
    int64_t SZ = (int64_t)d.dk * d.dv, n = (int64_t)d.B * d.H * SZ;
    CU_FOR(idx, n) {
        int64_t bh = idx / SZ, e = idx % SZ;
        real *sv = states + bh * d.nc * SZ + e;
        const real *lv = lam + bh * d.nc;
        real S = s0 ? s0[idx] : (real)0;
        bool nz = s0 != NULL;
        sv[0] = S;
        for (int c = 0; c < d.nc; c++) {
            real *next = c + 1 < d.nc ? sv + (c + 1) * SZ : sfinal + idx;
            S = nz ? lv[c] * S + *next : *next;
            *next = S;
            nz = true;
        }
    }
}

#ifndef AG_DOUBLE
// O of a whole chunk (L = GLA_C) with bf16 products on the tensor cores
// (mma_bf16.cuh), the roundings of k_gla_out's BF instance: warp w owns the
// rows 16 (w / 2) .. + 15, and of them the scores' columns 32 (w % 2) .. + 31,
// then O's 8-column tiles from 8 (w % 2) in steps of 16. Fragments are read
// and rounded from global memory (the chunk's rows stay in L1) and A from
// shared memory (float32, as the scalar path keeps it). sin: some row reads
// a non-zero S_c (block-uniform).
static __device__ void out_mma(const Dims &d, const Rows &r, const real *Q, const real *K, const real *V,
                               const real *S, bool sin, bool gated, real *A, real *O) {
    int w = threadIdx.x >> 5, dk = d.dk, dv = d.dv;
    int64_t ldk = (int64_t)d.H * dk, ldv = (int64_t)d.H * dv;
    int r0 = 16 * (w >> 1);
    // A = (Q K̃ᵀ) ⊙ M ⊙ [exp(G_i − G_s)], K̃ = β k rounded as formed
    for (int t = 0; t < 4; t++) {
        int n0 = 32 * (w & 1) + 8 * t;
        float acc[4] = {0, 0, 0, 0};
        if (n0 <= r0 + 15)   // (tiles above the diagonal are masked whole)
            mma_tile(acc, Q + r0 * ldk, ldk, 1, NULL, K + n0 * ldk, 1, ldk, r.dt + n0, NULL, 0, dk);
        for (int e = 0; e < 4; e++) {
            int i = r0 + tile_row(e), s = n0 + tile_col(e);
            A[i * GLA_C + s] = !reads(&r, i, s) ? (real)0 : gated ? acc[e] * d_decay(r.G[i] - r.G[s]) : acc[e];
        }
    }
    __syncthreads();
    // O = A V + diag(exp(G)) (Q S_c); A's columns past the warp's rows are zeros
    for (int n0 = 8 * (w & 1); n0 < dv; n0 += 16) {
        float o1[4] = {0, 0, 0, 0}, o2[4] = {0, 0, 0, 0};
        mma_tile(o1, A + r0 * GLA_C, GLA_C, 1, NULL, V + n0, ldv, 1, NULL, NULL, 0, r0 + 16);
        if (sin) mma_tile(o2, Q + r0 * ldk, ldk, 1, NULL, S + n0, dv, 1, NULL, NULL, 0, dk);
        for (int e = 0; e < 4; e++) {
            int i = r0 + tile_row(e), j = n0 + tile_col(e);
            real acc = o1[e];
            if (sin && r.db[i] < 0) acc += r.eS[i] * o2[e];
            O[i * ldv + j] = acc;
        }
    }
}
#endif

// O of one chunk: A V + diag(exp(G)) Q S_c over the rows that read S_c,
// A = (Q K̃ᵀ) ⊙ M ⊙ [exp(G_i − G_s)] in shared memory. BF: the products'
// operands rounded (gla_common.cuh): Q and K̃ = β k (where the chunk is whole
// vectors of 16), A and V, Q and S_c; a whole chunk on the tensor cores
// (out_mma), a partial one here.
template <bool BF>
__global__ void k_gla_out(Dims d, const real *q, const real *kk, const real *v, const real *g, const real *dt,
                          const int *first, const real *states, bool has_s0, real *o) {
    __shared__ Rows r;
    __shared__ real A[GLA_C * GLA_C];
    Chunk k = chunk_of(d);
    rows_load(&r, d, k, g, dt, first);
    int L = k.L, dk = d.dk, dv = d.dv, ldk = d.H * dk, ldv = d.H * dv;
    int64_t rk = ((int64_t)k.b * d.T + k.t0) * ldk + (int64_t)k.h * dk;
    int64_t rv = ((int64_t)k.b * d.T + k.t0) * ldv + (int64_t)k.h * dv;
    const real *Q = q + rk, *K = kk + rk, *V = v + rv;
    real *O = o + rv;
#ifndef AG_DOUBLE
    if (BF && L == GLA_C) {   // (block-uniform)
        const real *Sc = states + (k.bh * d.nc + k.c) * (int64_t)dk * dv;
        out_mma(d, r, Q, K, V, Sc, (k.c > 0 || has_s0) && r.db[0] < 0, g != NULL, A, O);
        return;
    }
#endif
    bool rl = L % 16 == 0;   // the scores' operands rounded (as the CPU's)
    for (int x = threadIdx.x; x < L * L; x += blockDim.x) {
        int i = x / L, s = x % L;
        real val = 0;
        if (BF && reads(&r, i, s)) {
            real qk = 0;
            for (int a = 0; a < dk; a++)
                qk += bfr<BF>(Q[(int64_t)i * ldk + a], rl) * bfr<BF>(r.dt[s] * K[(int64_t)s * ldk + a], rl);
            val = g ? qk * d_decay(r.G[i] - r.G[s]) : qk;
        } else if (reads(&r, i, s)) {
            real qk = 0;
            for (int a = 0; a < dk; a++) qk += Q[(int64_t)i * ldk + a] * K[(int64_t)s * ldk + a];
            val = qk * r.dt[s] * (g ? d_decay(r.G[i] - r.G[s]) : (real)1);
        }
        A[i * GLA_C + s] = val;
    }
    __syncthreads();
    const real *S = states + (k.bh * d.nc + k.c) * (int64_t)dk * dv;
    bool sin = (k.c > 0 || has_s0) && r.db[0] < 0;   // some row reads a non-zero S_c
    for (int64_t x = threadIdx.x; x < (int64_t)L * dv; x += blockDim.x) {
        int i = (int)(x / dv), j = (int)(x % dv);
        real acc = 0;
        for (int s = max(r.db[i], 0); s <= i; s++)
            acc += bfr<BF>(A[i * GLA_C + s]) * bfr<BF>(V[(int64_t)s * ldv + j]);
        if (sin && r.db[i] < 0) {
            real u = 0;
            for (int a = 0; a < dk; a++) u += bfr<BF>(Q[(int64_t)i * ldk + a]) * bfr<BF>(S[(int64_t)a * dv + j]);
            acc += r.eS[i] * u;
        }
        O[(int64_t)i * ldv + j] = acc;
    }
}

void gla_outer(unsigned blocks, Dims d, bool bwd, bool bf, const real *x, const real *y, const real *g,
               const real *dt, const int *first, real *states, real *sfinal, real *lam) {
    auto kern = bf ? k_gla_outer<true> : k_gla_outer<false>;
    kern<<<blocks, GLA_THREADS, 0, cu_stream>>>(d, bwd, x, y, g, dt, first, states, sfinal, lam);
    CU_LAUNCHED();
}

bool gla_bf16_takes(const Node *n) {
    return cu_bf16_products() && n->iarg[5] != MIXER_FORM_RECURRENT && n->iarg[3] % 16 == 0 && n->iarg[4] % 16 == 0;
}

extern "C" void cu_gla_forward(Node *n) {
    Dims d = dims_of(n);
    Tensor *const *in = n->in;
    const real *g = data_or_null(in[IN_G]), *dt = data_or_null(in[IN_DT]), *s0 = data_or_null(in[IN_S0]);
    const int *first = cu_first_to_device(n->tape, (const int *)n->aux, d.B, d.T);
    int64_t BH = (int64_t)d.B * d.H, SZ = (int64_t)d.dk * d.dv;
    // The scan's slots are the saved states, so they are kept recorded or not.
    real *states = (real *)tape_dalloc(n->tape, (size_t)(BH * d.nc * (SZ + 1)) * sizeof(real));
    real *lam = states + BH * d.nc * SZ;
    n->saved = states;
    real *sfinal = n->out[1]->data;
    unsigned blocks = (unsigned)(BH * d.nc);
    // farg[0], the CPU's choice of bf16 tiles (0 on a GPU tape), becomes the
    // GPU's here; the backward follows it.
    bool bf = gla_bf16_takes(n);
    n->farg[0] = bf;
    gla_outer(blocks, d, false, bf, in[IN_K]->data, in[IN_V]->data, g, dt, first, states, sfinal, lam);
    k_gla_scan<<<cu_grid(BH * SZ), CU_THREADS, 0, cu_stream>>>(d, s0, states, sfinal, lam);
    CU_LAUNCHED();
    auto out = bf ? k_gla_out<true> : k_gla_out<false>;
    out<<<blocks, GLA_THREADS, 0, cu_stream>>>(d, in[IN_Q]->data, in[IN_K]->data, in[IN_V]->data, g, dt, first,
                                               states, s0 != NULL, n->out[0]->data);
    CU_LAUNCHED();
}
