// kda_chunk.cuh: what the chunked form of op_kda on the GPU shares between
// its forward (kda_chunk.cu) and its backward (kda_chunk_backward.cu): the
// per-op rows, the per-chunk step that recomputes Gamma, and the launch of
// the per-chunk preparation (kda_chunk.cu's step 1), which the backward runs
// again to get W, U, Qg, Kd, P, bl and, for itself, KKE and Tm.
// Included by those two files only.
#ifndef AG_KDA_CHUNK_CUH
#define AG_KDA_CHUNK_CUH

#include "gdn_chunk.cuh"
#include "kda_node.h"

#define KDA_NVB 16   // state columns per block of the scans

// The per-op rows of the chunked form beyond GdnArgs' Wb, Ub and states.
// A chunk's L x L matrices sit at its first row, r Cw (r = bh T + t0), L
// rows of pitch L (inside the chunk's L Cw reals).
struct KdaRows {
    real *Qg, *Kd;   // (B H, T, dk)
    real *P;         // (B H, T, Cw): row t of its chunk's P (pitch Cw; the chunk's L columns used)
    real *bl;        // (B H, NC, dk)
    real *KK, *Tm;   // (B H, T, Cw) or NULL: KKE (A / beta, strictly lower) and (I + A)^-1, L x L each
    real *PtdO;      // backward (B H, T, dv): P^T dO, then dDelta
    real *QtdO;      // backward (B H, NC, dk, dv): Qg^T dO per chunk
};

// Per-block workspace of step 1, chunks of up to C positions.
struct KdaPrepWs {
    double *G;             // (C, dk) Gamma
    real *A, *Tm;          // (C, C)
    real *Xw, *Xu;         // (C, dk), (C, dv)
    real *bet;             // (C)
    int *db;               // (C) where row i's document begins in the chunk, -1: before it
};

static __host__ __device__ size_t kda_prep_layout(KdaPrepWs *w, unsigned char *base, int C, int dk, int dv) {
    size_t at = 0, CC = (size_t)C * C;
    size_t oG = ws_take(&at, (size_t)C * dk, sizeof(double));
    size_t oA = ws_take(&at, CC, sizeof(real)), oTm = ws_take(&at, CC, sizeof(real));
    size_t oXw = ws_take(&at, (size_t)C * dk, sizeof(real)), oXu = ws_take(&at, (size_t)C * dv, sizeof(real));
    size_t ob = ws_take(&at, C, sizeof(real)), odb = ws_take(&at, C, sizeof(int));
    if (w) {
        w->G = (double *)(base + oG);
        w->A = (real *)(base + oA), w->Tm = (real *)(base + oTm);
        w->Xw = (real *)(base + oXw), w->Xu = (real *)(base + oXu);
        w->bet = (real *)(base + ob), w->db = (int *)(base + odb);
    }
    return (at + 255) & ~(size_t)255;
}

// Gamma (L, dk) of chunk m (a thread's running sum per channel in double,
// in order: the CPU's), its beta and documents (db[i]: where row i's
// document begins in the chunk, -1 before it). Ends with a barrier.
static __device__ void kda_prep_gamma(const GdnArgs &a, const Item &m, double *G, real *bet, int *db) {
    int tid = threadIdx.x, dk = a.dk, L = m.L;
    int64_t ok = ((int64_t)m.b * a.T + m.t0) * a.ldk + (int64_t)m.h * dk;
    int64_t oh = ((int64_t)m.b * a.T + m.t0) * a.H + m.h;
    for (int i = tid; i < L; i += GDN_NT) {
        bet[i] = a.beta[oh + (int64_t)i * a.H];
        int f = a.first ? a.first[(int64_t)m.b * a.T + m.t0 + i] : -1;
        db[i] = f >= m.t0 ? f - m.t0 : -1;
    }
    for (int c = tid; c < dk; c += GDN_NT) {
        double s = 0;
        for (int i = 0; i < L; i++) {
            s += a.g[ok + (int64_t)i * a.ldk + c];
            G[(size_t)i * dk + c] = s;
        }
    }
    __syncthreads();
}

// kda_chunk.cu: the per-op rows (a's Wb, Ub, items, NV; kr's Qg, Kd, P, bl;
// KK and Tm too when keep), and step 1 over every chunk into them.
void kda_rows_alloc(Node *n, GdnArgs *a, KdaRows *kr, bool keep);
void kda_prep_launch(Node *n, GdnArgs &a, const KdaRows &kr);
// The dynamic shared memory of a scan kernel (checked, and asked for past 48 KiB).
size_t kda_scan_smem(const GdnArgs &a, const void *kernel);

#endif
