// Tests of op_kda's chunked form inside one chunk (kda_kernel.h): the
// sub-block products KKE and P against a float64 sum with an exp per element,
// on each of the routes kda_sub_products takes (every channel through the
// sub-block's reference point; one channel over KDA_SPAN_MAX per element, the
// others through it; every channel per element), which it reports.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kda_kernel.h"
#include "test_util.h"

enum { C = 64, L = 48, DK = 16, DV = 8, NSUB = L / KDA_SUB };

// One chunk's inputs (one head, rows of DK or DV): q, k of unit length (q
// scaled by 1/sqrt(dk)), beta in (0, 1), g uniform in [lo, hi].
typedef struct ChunkIn {
    real q[L * DK], k[L * DK], v[L * DV], beta[L], g[L * DK], s0[DK * DV];
} ChunkIn;

static void chunk_inputs(ChunkIn *in, double lo, double hi, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < L; i++) {
        double nq = 0, nk = 0;
        for (int c = 0; c < DK; c++) {
            in->q[i * DK + c] = (real)rng_normal(&r);
            in->k[i * DK + c] = (real)rng_normal(&r);
            in->g[i * DK + c] = (real)rng_range(&r, lo, hi);
            nq += (double)in->q[i * DK + c] * in->q[i * DK + c];
            nk += (double)in->k[i * DK + c] * in->k[i * DK + c];
        }
        for (int c = 0; c < DK; c++) {
            in->q[i * DK + c] = (real)(in->q[i * DK + c] / sqrt(nq * DK));
            in->k[i * DK + c] = (real)(in->k[i * DK + c] / sqrt(nk));
        }
        for (int c = 0; c < DV; c++) in->v[i * DV + c] = (real)rng_normal(&r);
        in->beta[i] = (real)rng_range(&r, 0.1, 0.9);
    }
    memset(in->s0, 0, sizeof in->s0);
}

// The largest |M - ref| over the lower triangle (strict: below the diagonal)
// and |M| above it, ref_ij = sum_c x_ic k_jc exp(Gamma_ic - Gamma_jc) in
// float64, Gamma the running sum of g.
static double worst_error(const ChunkIn *in, const real *x, const real *M, bool strict) {
    double G[L * DK], worst = 0;
    for (int i = 0; i < L * DK; i++) G[i] = (i >= DK ? G[i - DK] : 0) + in->g[i];
    for (int i = 0; i < L; i++)
        for (int j = 0; j < L; j++) {
            double ref = 0;
            bool lower = strict ? j < i : j <= i;
            for (int c = 0; lower && c < DK; c++)
                ref += (double)x[i * DK + c] * in->k[j * DK + c] * exp(G[i * DK + c] - G[j * DK + c]);
            cr_assert(isfinite(M[i * L + j]), "M[%d][%d] = %g", i, j, M[i * L + j]);
            worst = fmax(worst, fabs(M[i * L + j] - ref));
        }
    return worst;
}

// Prepare the chunk, then each sub-block's products again (the same values):
// the number of slow channels of each is want[], and KKE, P equal their
// float64 sums. The tolerance: a term's two factors are exps of at most
// KDA_SPAN_MAX whose arguments are rounded to the build's precision
// (float32: a relative error of up to 30 * 2^-24 each), so a term is within
// about 63 eps of itself, and the terms of an entry sum to at most 1 in size
// (unit q, k); 100 eps is above that, and far below a missing or misplaced
// term (~1/dk). Measured: about 1 eps in both builds.
static void check_routes(const ChunkIn *in, const int want[NSUB], const char *label) {
    void *mem = aligned_alloc(64, kda_chunk_bytes(C, DK, DV));
    KdaChunk ws;
    kda_chunk_bind(&ws, mem, C, DK, DV);
    kda_chunk_prepare(&ws, L, in->q, in->k, in->v, in->beta, in->g, DK, DV, 1, in->s0, NULL);
    for (int s = 0; s < NSUB; s++) {
        int ns = kda_sub_products(&ws, in->q, in->k, DK, s * KDA_SUB, KDA_SUB);
        cr_assert_eq(ns, want[s], "%s: sub-block %d has %d slow channels, not %d", label, s, ns, want[s]);
    }
    double ek = worst_error(in, in->k, ws.KKE, true), ep = worst_error(in, in->q, ws.P, false);
    cr_log_info("kda sub-blocks %s: KKE %.3g, P %.3g", label, ek, ep);
    cr_assert_leq(ek, 100 * REAL_EPS, "%s: KKE differs by %.3e", label, ek);
    cr_assert_leq(ep, 100 * REAL_EPS, "%s: P differs by %.3e", label, ep);
    free(mem);
}

// g in [-1, -0.01]: every span below 15, every channel through the reference point.
Test(kda, sub_block_products_mild_decay_take_the_products) {
    ChunkIn in;
    chunk_inputs(&in, -1, -0.01, 11);
    check_routes(&in, (const int[NSUB]){0, 0, 0}, "mild");
    chunk_inputs(&in, 0, 0, 12);
    check_routes(&in, (const int[NSUB]){0, 0, 0}, "g=0");
}

// Channel 3 decays by 40 at row 20 (inside sub-block 1, after its reference
// row 16): its span there is over KDA_SPAN_MAX, so that channel alone of that
// sub-block goes per element; at row 16 itself (the reference row) the -40
// enters no span, and everything takes the products.
Test(kda, sub_block_products_one_channel_over_the_bound) {
    ChunkIn in;
    chunk_inputs(&in, -1, -0.01, 13);
    in.g[20 * DK + 3] = -40;
    check_routes(&in, (const int[NSUB]){0, 1, 0}, "one channel");
    chunk_inputs(&in, -1, -0.01, 13);
    in.g[16 * DK + 3] = -40;
    check_routes(&in, (const int[NSUB]){0, 0, 0}, "at the reference row");
}

// g ~ -30 per step, and -1000 (exp 0 in both builds): every channel's span is
// over the bound, every sub-block per element; g = -2.1 per step: a span of
// 31.5, just over.
Test(kda, sub_block_products_strong_decay_go_per_element) {
    ChunkIn in;
    chunk_inputs(&in, -31, -29, 14);
    check_routes(&in, (const int[NSUB]){DK, DK, DK}, "g~-30");
    chunk_inputs(&in, -1000, -1000, 15);
    check_routes(&in, (const int[NSUB]){DK, DK, DK}, "g=-1000");
    chunk_inputs(&in, -2.1, -2.1, 16);
    check_routes(&in, (const int[NSUB]){DK, DK, DK}, "g=-2.1");
}
