// gla_backward.cu: the backward of op_gla_dt (the linear and mamba mixers) on
// the GPU, every form, following gla_backward.c (its header and gla.h state
// the math): per chunk, from the state entering it S_c and the gradient of
// the state leaving it dS_{c+1},
//   dS_c = λ_c dS_{c+1} + (diag(exp(G)) Q)ᵀ dO  (a scan over chunks, in reverse),
//   dV = Aᵀ dO + diag(exp(G_L − G)) K̃ dS_{c+1},
//   dP = (dO Vᵀ) ⊙ M ⊙ [exp(G_i − G_j)],  dQ = dP K̃ + diag(exp(G)) dO S_cᵀ,
//   dK̃ = dPᵀ Q + diag(exp(G_L − G)) V dS_{c+1}ᵀ,  dk = dt dK̃,  ddt = k·dK̃,
//   dg_i = Σ_{t ≥ i in the chunk} dG_t (dG: gla_backward.c's header).
// gla_common.cuh has the plan of both passes.
// k_gla_grad is 213 lines, over the house's 120: it is one chunk's
// gradients in gla_backward.c's order, each step reading the shared-memory
// rows and sums the previous one left; cut into device functions, the
// pieces would pass a dozen of its pointers and sums between them.
#include "gla_common.cuh"

// Per state element, the chunks in reverse from the final state's gradient
// (zeros when NULL): slot NC of dstates gets it, slot c (holding ΔdS_c when
// parts) becomes dS_c = λ_c dS_{c+1} + ΔdS_c, the gradient of the state
// entering chunk c; dS_0 goes to ds0 (= when fresh, else +=).
__global__ void k_gla_scan_back(Dims d, const real *dSf, real *dstates, const real *lam, bool parts, real *ds0,
                                bool fresh) {
    int64_t SZ = (int64_t)d.dk * d.dv, n = (int64_t)d.B * d.H * SZ;
    CU_FOR(idx, n) {
        int64_t bh = idx / SZ, e = idx % SZ;
        real *p = dstates + bh * (d.nc + 1) * SZ + e;
        const real *lv = lam + bh * d.nc;
        real dS = dSf ? dSf[idx] : (real)0;
        bool nz = dSf != NULL;
        p[d.nc * SZ] = dS;
        for (int c = d.nc - 1; c >= 0; c--) {
            real part = parts ? p[c * SZ] : (real)0;
            dS = nz ? lv[c] * dS + part : part;
            nz = nz || parts;
            p[c * SZ] = dS;
        }
        if (ds0) put(ds0 + idx, dS, fresh);
    }
}

// The gradient buffers of the chunk kernel; NULL: not wanted. f*: fresh
// (written whole, =) rather than added to.
typedef struct {
    real *dq, *dk, *dv, *dg, *ddt;
    bool fq, fk, fv, fg, fdt;
} GlaGrads;

#ifndef AG_DOUBLE
// k_gla_grad's first step for a whole chunk on the tensor cores (its BF
// instance's roundings; gla_common.cuh's mma_tile): A and dA = (dO Vᵀ) ⊙ M,
// warp w the (16, 8) tiles w, w + 8, ... of (64, 64), those above the
// diagonal masked whole.
static __device__ void grad_scores_mma(const Dims &d, const Rows &r, const real *Q, const real *K, const real *V,
                                       const real *DO, bool gated, real *A, real *dA) {
    int64_t ldk = (int64_t)d.H * d.dk, ldv = (int64_t)d.H * d.dv;
    for (int t = threadIdx.x >> 5; t < 32; t += GLA_THREADS / 32) {
        int m0 = 16 * (t / 8), n0 = 8 * (t % 8);
        float a[4] = {0, 0, 0, 0}, da[4] = {0, 0, 0, 0};
        if (n0 <= m0 + 15) {
            mma_tile(a, Q + m0 * ldk, ldk, 1, NULL, K + n0 * ldk, 1, ldk, r.dt + n0, NULL, 0, d.dk);
            mma_tile(da, DO + m0 * ldv, ldv, 1, NULL, V + n0 * ldv, 1, ldv, NULL, NULL, 0, d.dv);
        }
        for (int e = 0; e < 4; e++) {
            int i = m0 + tile_row(e), s = n0 + tile_col(e);
            bool in = reads(&r, i, s);
            A[i * GLA_C + s] = !in ? (real)0 : gated ? a[e] * d_decay(r.G[i] - r.G[s]) : a[e];
            dA[i * GLA_C + s] = in ? da[e] : (real)0;
        }
    }
}

// k_gla_grad's dV = Aᵀ dO + diag(exp(G_L − G)) K̃ dS for a whole chunk on the
// tensor cores, into dvo (the chunk's rows; = when fresh, else +=); warp w
// the (16, 8) tiles w, w + 8, ... of (64, dv). Aᵀ's rows s take A's rows
// i >= s only (the rest are zeros); j0: the rows from j0 reach dS.
static __device__ void grad_v_mma(const Dims &d, const Rows &r, int j0, const real *K, const real *DO,
                                  const real *dS, const real *A, real *dvo, bool fresh) {
    int nt = d.dv / 8;
    int64_t ldk = (int64_t)d.H * d.dk, ldv = (int64_t)d.H * d.dv;
    for (int t = threadIdx.x >> 5; t < 4 * nt; t += GLA_THREADS / 32) {
        int m0 = 16 * (t / nt), n0 = 8 * (t % nt);
        float o1[4] = {0, 0, 0, 0}, o2[4] = {0, 0, 0, 0};
        if (DO) mma_tile(o1, A + m0, 1, GLA_C, NULL, DO + n0, ldv, 1, NULL, NULL, m0, GLA_C);
        if (m0 + 15 >= j0) mma_tile(o2, K + m0 * ldk, ldk, 1, r.dt + m0, dS + n0, d.dv, 1, NULL, NULL, 0, d.dk);
        for (int e = 0; e < 4; e++) {
            int s = m0 + tile_row(e), j = n0 + tile_col(e);
            real acc = o1[e];
            if (s >= j0) acc += r.eL[s] * o2[e];
            put(dvo + s * ldv + j, acc, fresh);
        }
    }
}

// The products of k_gla_grad's dq and dK̃ steps for a whole chunk on the
// tensor cores, into (64, dk) shared-memory buffers (row stride dk), each
// only where not NULL: PK = dP K̃, U = dO S_cᵀ, PQ = dPᵀ Q, W = V dSᵀ. dP is
// zero above the diagonal, so PK sums s <= i and PQ i >= s only. Warp w the
// (16, 8) tiles w, w + 8, ... of each.
static __device__ void grad_qk_mma(const Dims &d, const Rows &r, const real *Q, const real *K, const real *V,
                                   const real *DO, const real *S, const real *dS, const real *dP, real *PK,
                                   real *U, real *PQ, real *W) {
    int nt = d.dk / 8;
    int64_t ldk = (int64_t)d.H * d.dk, ldv = (int64_t)d.H * d.dv;
    for (int t = threadIdx.x >> 5; t < 4 * nt; t += GLA_THREADS / 32) {
        int m0 = 16 * (t / nt), n0 = 8 * (t % nt);
        float pk[4] = {0, 0, 0, 0}, u[4] = {0, 0, 0, 0}, pq[4] = {0, 0, 0, 0}, w[4] = {0, 0, 0, 0};
        if (PK) mma_tile(pk, dP + m0 * GLA_C, GLA_C, 1, NULL, K + n0, ldk, 1, NULL, r.dt, 0, m0 + 16);
        if (U) mma_tile(u, DO + m0 * ldv, ldv, 1, NULL, S + n0 * d.dv, 1, d.dv, NULL, NULL, 0, d.dv);
        if (PQ) mma_tile(pq, dP + m0, 1, GLA_C, NULL, Q + n0, ldk, 1, NULL, NULL, m0, GLA_C);
        if (W) mma_tile(w, V + m0 * ldv, ldv, 1, NULL, dS + n0 * d.dv, 1, d.dv, NULL, NULL, 0, d.dv);
        for (int e = 0; e < 4; e++) {
            int x = (m0 + tile_row(e)) * d.dk + n0 + tile_col(e);
            if (PK) PK[x] = pk[e];
            if (U) U[x] = u[e];
            if (PQ) PQ[x] = pq[e];
            if (W) W[x] = w[e];
        }
    }
}
#endif

// The gradients of one chunk (gla_backward.c's formulas) given the state
// entering it S_c (states) and the gradient of the state leaving it dS_{c+1}
// (dstates); dO may be NULL (only the final state is seeded). Dynamic shared
// memory: A and dP, (GLA_C, GLA_C) each. dv: a thread per element; dq and
// dK̃: a warp per row (lanes over dk), whose sums give dG's terms through
// S_c and dS, and ddt. BF: the products' operands rounded (gla_common.cuh);
// a whole chunk's A, dA and dV on the tensor cores.
template <bool BF>
__global__ void k_gla_grad(Dims d, const real *q, const real *kk, const real *v, const real *g, const real *dt,
                           const int *first, const real *dO, const real *states, const real *dstates, bool has_s0,
                           GlaGrads go) {
    extern __shared__ double gla_dyn[];
    real *A = (real *)gla_dyn, *dP = A + GLA_C * GLA_C;
    __shared__ Rows r;
    // dG_i = rowZ_i − colZ_i + sq_i − cst_i (+ Σ cst + ss at the last row)
    __shared__ double rowZ[GLA_C], colZ[GLA_C], sq[GLA_C], cst[GLA_C], red[32];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    for (int i = tid; i < GLA_C; i += blockDim.x) rowZ[i] = colZ[i] = sq[i] = cst[i] = 0;
    Chunk k = chunk_of(d);
    rows_load(&r, d, k, g, dt, first);   // (its barriers also order the zeroing)
    int L = k.L, dk = d.dk, dv = d.dv, ldk = d.H * dk, ldv = d.H * dv, H = d.H;
    int64_t SZ = (int64_t)dk * dv;
    int64_t rk = ((int64_t)k.b * d.T + k.t0) * ldk + (int64_t)k.h * dk;
    int64_t rv = ((int64_t)k.b * d.T + k.t0) * ldv + (int64_t)k.h * dv;
    int64_t rg = ((int64_t)k.b * d.T + k.t0) * H + k.h;
    const real *Q = q + rk, *K = kk + rk, *V = v + rv, *DO = dO ? dO + rv : NULL;
    const real *S = states + (k.bh * d.nc + k.c) * SZ;
    const real *dS = dstates + (k.bh * (d.nc + 1) + k.c + 1) * SZ;
    bool need_k = go.dk || go.ddt, need_g = go.dg != NULL;
    bool sin = (k.c > 0 || has_s0) && r.db[0] < 0;   // some row reads a non-zero S_c
    bool keep = r.db[L - 1] < 0;                      // S_c reaches the leaving state
    int j0 = max(r.db[L - 1], 0);                     // rows from j0 reach it
    bool rl = L % 16 == 0;                            // the scores' operands rounded (as the CPU's)
    // (BF) a whole chunk's dq and dK̃ products on the tensor cores, into
    // shared memory after A and dP (the launch sized it: GLA_MMA_DK)
#ifndef AG_DOUBLE
    bool mm = BF && L == GLA_C && dk <= GLA_MMA_DK;
#else
    bool mm = false;
#endif
    real *PK = dP + GLA_C * GLA_C, *U = PK + GLA_C * dk, *PQ = U + GLA_C * dk, *W = PQ + GLA_C * dk;

    if (DO) {
        // A, and dA = (dO Vᵀ) ⊙ M in dP's place
#ifndef AG_DOUBLE
        if (BF && L == GLA_C)   // (block-uniform)
            grad_scores_mma(d, r, Q, K, V, DO, g != NULL, A, dP);
        else
#endif
        for (int x = tid; x < L * L; x += blockDim.x) {
            int i = x / L, s = x % L;
            real av = 0, da = 0;
            if (BF && reads(&r, i, s)) {
                real qk = 0;
                for (int a = 0; a < dk; a++)
                    qk += bfr<BF>(Q[(int64_t)i * ldk + a], rl) * bfr<BF>(r.dt[s] * K[(int64_t)s * ldk + a], rl);
                av = g ? qk * d_decay(r.G[i] - r.G[s]) : qk;
                for (int j = 0; j < dv; j++)
                    da += bfr<BF>(DO[(int64_t)i * ldv + j], rl) * bfr<BF>(V[(int64_t)s * ldv + j], rl);
            } else if (reads(&r, i, s)) {
                real qk = 0;
                for (int a = 0; a < dk; a++) qk += Q[(int64_t)i * ldk + a] * K[(int64_t)s * ldk + a];
                av = qk * r.dt[s] * (g ? d_decay(r.G[i] - r.G[s]) : (real)1);
                for (int j = 0; j < dv; j++) da += DO[(int64_t)i * ldv + j] * V[(int64_t)s * ldv + j];
            }
            A[i * GLA_C + s] = av;
            dP[i * GLA_C + s] = da;
        }
        __syncthreads();
        // Z = dA ⊙ A (products exact in double): row sums into dG_i, column
        // sums out of dG_s; the diagonal cancels and is skipped.
        if (need_g)
            for (int x = tid; x < 2 * L; x += blockDim.x) {
                double t = 0;
                if (x < L) {
                    for (int s = max(r.db[x], 0); s < x; s++)
                        t += (double)dP[x * GLA_C + s] * (double)A[x * GLA_C + s];
                    rowZ[x] = t;
                } else {
                    int s = x - L;
                    for (int i = s + 1; i < L; i++) t += (double)dP[i * GLA_C + s] * (double)A[i * GLA_C + s];
                    colZ[s] = t;
                }
            }
        __syncthreads();
        if (g) {   // dP = dA ⊙ [exp(G_i − G_s)] (entries outside M are zeros already)
            for (int x = tid; x < L * L; x += blockDim.x) {
                int i = x / L, s = x % L;
                if (reads(&r, i, s)) dP[i * GLA_C + s] *= d_decay(r.G[i] - r.G[s]);
            }
            __syncthreads();
        }
    }

    // dV = Aᵀ dO + diag(exp(G_L − G)) K̃ dS
#ifndef AG_DOUBLE
    if (BF && L == GLA_C) {
        if (go.dv) grad_v_mma(d, r, j0, K, DO, dS, A, go.dv + rv, go.fv);
    } else
#endif
    if (go.dv)
        for (int64_t x = tid; x < (int64_t)L * dv; x += blockDim.x) {
            int s = (int)(x / dv), j = (int)(x % dv);
            real acc = 0;
            if (DO)
                for (int i = s; i < L; i++) acc += bfr<BF>(A[i * GLA_C + s]) * bfr<BF>(DO[(int64_t)i * ldv + j]);
            if (BF && s >= j0) {   // e (K̃ dS), K̃ = β k rounded
                real u = 0;
                for (int a = 0; a < dk; a++)
                    u += bfr<BF>(r.dt[s] * K[(int64_t)s * ldk + a]) * bfr<BF>(dS[(int64_t)a * dv + j]);
                acc += r.eL[s] * u;
            } else if (s >= j0) {
                real u = 0;
                for (int a = 0; a < dk; a++) u += K[(int64_t)s * ldk + a] * dS[(int64_t)a * dv + j];
                acc += r.eL[s] * r.dt[s] * u;
            }
            put(go.dv + rv + (int64_t)s * ldv + j, acc, go.fv);
        }

#ifndef AG_DOUBLE
    if (mm) {   // (block-uniform)
        grad_qk_mma(d, r, Q, K, V, DO, S, dS, dP, DO && go.dq ? PK : NULL,
                    sin && DO && (go.dq || need_g) ? U : NULL, DO && need_k ? PQ : NULL, need_k || need_g ? W : NULL);
        __syncthreads();
    }
#endif

    // dQ = dP K̃ + diag(exp(G)) dO S_cᵀ; sq_i = exp(G_i) q_i·(S_c dO_i)
    if (go.dq || (need_g && sin && DO))
        for (int i = warp; i < L; i += nw) {
            bool rs = sin && DO && r.db[i] < 0;   // row i reads S_c
            double part = 0;
            for (int a = lane; a < dk; a += 32) {
                real acc = 0;
                if (DO && go.dq) {
                    if (BF && mm) acc = PK[i * dk + a];
                    else
                        for (int s = max(r.db[i], 0); s <= i; s++) {
                            if (BF)
                                acc += bfr<BF>(dP[i * GLA_C + s]) * bfr<BF>(r.dt[s] * K[(int64_t)s * ldk + a]);
                            else
                                acc += dP[i * GLA_C + s] * r.dt[s] * K[(int64_t)s * ldk + a];
                        }
                }
                if (rs) {
                    real u = 0;
                    if (BF && mm) u = U[i * dk + a];
                    else
                        for (int j = 0; j < dv; j++)
                            u += bfr<BF>(DO[(int64_t)i * ldv + j]) * bfr<BF>(S[(int64_t)a * dv + j]);
                    acc += r.eS[i] * u;
                    part += (double)Q[(int64_t)i * ldk + a] * u;
                }
                if (go.dq) put(go.dq + rk + (int64_t)i * ldk + a, acc, go.fq);
            }
            if (need_g && rs) {   // (warp-uniform)
                part = warp_sum(part);
                if (lane == 0) sq[i] = (double)r.eS[i] * part;
            }
        }

    // dK̃ = dPᵀ Q + diag(exp(G_L − G)) V dSᵀ; dk = β dK̃, ddt = k·dK̃;
    // cst_s = exp(G_L − G_s) k̃_s·(dS v_s) (the last row's cancels)
    if (need_k || need_g)
        for (int s = warp; s < L; s += nw) {
            bool last = s >= j0;   // row s reaches the leaving state
            double pk = 0, pc = 0;
            for (int a = lane; a < dk; a += 32) {
                real acc = 0;
                if (DO && need_k) {
                    if (BF && mm) acc = PQ[s * dk + a];
                    else
                        for (int i = s; i < L; i++)
                            acc += bfr<BF>(dP[i * GLA_C + s]) * bfr<BF>(Q[(int64_t)i * ldk + a]);
                }
                if (last) {
                    real u = 0;
                    if (BF && mm) u = W[s * dk + a];
                    else
                        for (int j = 0; j < dv; j++)
                            u += bfr<BF>(V[(int64_t)s * ldv + j]) * bfr<BF>(dS[(int64_t)a * dv + j]);
                    acc += r.eL[s] * u;
                    pc += (double)(r.dt[s] * K[(int64_t)s * ldk + a]) * u;
                }
                if (need_k) {
                    pk += (double)K[(int64_t)s * ldk + a] * acc;
                    if (go.dk) put(go.dk + rk + (int64_t)s * ldk + a, r.dt[s] * acc, go.fk);
                }
            }
            if (go.ddt) {   // (block-uniform)
                pk = warp_sum(pk);
                if (lane == 0) put(go.ddt + rg + (int64_t)s * H, (real)pk, go.fdt);
            }
            if (need_g && last && s < L - 1) {   // (warp-uniform)
                pc = warp_sum(pc);
                if (lane == 0) cst[s] = (double)r.eL[s] * pc;
            }
        }
    __syncthreads();

    // dG_L += exp(G_L) <dS, S_c> when S_c reaches the leaving state; then
    // dg = the reverse cumulative sum of dG inside the chunk.
    if (need_g) {
        double ss = 0;
        if (sin && keep) {   // (block-uniform: cu_block_sum has barriers)
            double p = 0;
            for (int64_t e = tid; e < SZ; e += blockDim.x) p += (double)dS[e] * (double)S[e];
            ss = cu_block_sum(p, red) * exp(r.G[L - 1]);
        }
        if (tid == 0) {
            double sc = 0, acc = 0;
            for (int s = 0; s < L - 1; s++) sc += cst[s];
            for (int i = L - 1; i >= 0; i--) {
                double dG = rowZ[i] - colZ[i] + sq[i] - cst[i];
                if (i == L - 1) dG += sc + ss;
                acc += dG;
                put(go.dg + rg + (int64_t)i * H, (real)acc, go.fg);
            }
        }
    }
}

__global__ void k_gla_add(real *dst, const real *src, int64_t n) {
    CU_FOR(i, n) dst[i] += src[i];
}

extern "C" void cu_gla_backward(Node *n) {
    Dims d = dims_of(n);
    Tensor *const *in = n->in;
    const real *g = data_or_null(in[IN_G]), *dt = data_or_null(in[IN_DT]);
    const real *dO = n->out[0]->grad, *dSf = n->out[1]->grad;
    const real *states = (const real *)n->saved;
    ASSERT(states, "gla backward: no saved states");
    int64_t BH = (int64_t)d.B * d.H, SZ = (int64_t)d.dk * d.dv;
    const real *lam = states + BH * d.nc * SZ;
    // Gradient buffers in input order. An input that is an earlier one's
    // tensor (q = k, g = dt, ...) gets a scratch buffer, written by the
    // kernels and added into the shared one after them.
    real *gb[N_IN], *into[N_IN];
    bool fr[N_IN];
    bool any = false;
    for (int i = 0; i < N_IN; i++) {
        gb[i] = into[i] = NULL;
        fr[i] = false;
        const Tensor *t = in[i];
        if (!t || !t->requires_grad) continue;
        int j = 0;
        while (j < i && in[j] != t) j++;
        if (j < i) {
            gb[i] = (real *)tape_dalloc(n->tape, (size_t)t->numel * sizeof(real));
            fr[i] = true;
            into[i] = gb[j];
        } else {
            gb[i] = CU_GRAD_FRESH(n, i, &fr[i]);
        }
        any = true;
    }
    if (!any) return;
    const int *first = cu_first_to_device(n->tape, (const int *)n->aux, d.B, d.T);
    real *dstates = (real *)tape_dalloc(n->tape, (size_t)(BH * (d.nc + 1) * SZ) * sizeof(real));
    unsigned blocks = (unsigned)(BH * d.nc);
    bool bf = n->farg[0] != 0;   // the forward's choice (gla_bf16_takes)
    if (dO) {
        gla_outer(blocks, d, true, bf, in[IN_Q]->data, dO, g, dt, first, dstates, NULL, NULL);
    }
    k_gla_scan_back<<<cu_grid(BH * SZ), CU_THREADS, 0, cu_stream>>>(d, dSf, dstates, lam, dO != NULL, gb[IN_S0],
                                                                    fr[IN_S0]);
    CU_LAUNCHED();
    GlaGrads go = {gb[IN_Q], gb[IN_K], gb[IN_V], gb[IN_G], gb[IN_DT], fr[IN_Q], fr[IN_K], fr[IN_V], fr[IN_G],
                   fr[IN_DT]};
    if (go.dq || go.dk || go.dv || go.dg || go.ddt) {
        size_t smem = 2 * GLA_C * GLA_C * sizeof(real);   // A and dP: 64 KiB in float64
        if (bf && d.dk <= GLA_MMA_DK) smem += 4 * GLA_C * (size_t)d.dk * sizeof(real);   // (k_gla_grad's mm)
        auto kern = bf ? k_gla_grad<true> : k_gla_grad<false>;
        CU_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        kern<<<blocks, GLA_THREADS, smem, cu_stream>>>(d, in[IN_Q]->data, in[IN_K]->data, in[IN_V]->data, g, dt,
                                                       first, dO, states, dstates, in[IN_S0] != NULL, go);
        CU_LAUNCHED();
    }
    for (int i = 0; i < N_IN; i++)
        if (into[i]) {
            int64_t m = in[i]->numel;
            k_gla_add<<<cu_grid(m), CU_THREADS, 0, cu_stream>>>(into[i], gb[i], m);
            CU_LAUNCHED();
        }
}
