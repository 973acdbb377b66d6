// attn_decode.c: one decoding step of softmax attention over a KV cache on
// the CPU: one query per (row, head) against the cached keys, cut into parts
// (flash-decoding) whose results are merged in order. The GPU twin is
// src/cuda/attn_decode.cu; the training kernel is attn_flash.c.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernel.h"
#include "ops_math.h"
#include "tile_mm.h"

// Decoding: one query per (row b, head h) against the cached keys s0 ..
// n_keys-1 of its row (flash-decoding). The keys are cut into parts of
// DECODE_PART, the same cut for any thread count. A part takes every head
// at once, so that the cache's rows (H heads side by side) are read in
// order and once: its scores, its max m_p, its sum l_p and its unnormalised
// output o_p = sum_j exp(s_j - m_p) V_j. The parts are then merged in
// order: m = max_p m_p, o = sum_p exp(m_p - m) o_p / sum_p exp(m_p - m) l_p.
// Not one pass per head through gemm(): a one-row product packs all of K
// before its first sum, and a head's pass reads the cache at a stride
// (tiny_attn decoded 96 tokens/s at 16k keys that way).
#define DECODE_PART 256
// Scores DECODE_KB keys at a time: transposed into Kt (dk x DECODE_KB), so
// that each key's sum runs along a vector lane, not across one. One vector
// of keys (16 rows of all heads, 8 KB at tiny_attn's shape) rather than four
// (32 KB, the size of L1, read once per head): from memory the kernel read
// 13.3-15.5 GB/s on one thread against 10.3-12.0, on two 20.2-25.8 against
// 16.4-20.7 (bench/decode_kernel_bench; prefetching 2 or 4 blocks ahead
// instead of one changed nothing beyond the noise).
#define DECODE_KB VL
_Static_assert(DECODE_PART % DECODE_KB == 0, "a part is whole blocks of keys (decode_part stores whole vectors)");
// Rows of V asked for ahead of their use (prefetch_rows; addresses past the
// cache are never read, a prefetch does not fault).
#define DECODE_AHEAD 32

typedef struct DecodePart {
    real *m;     // (H) the part's max score per head
    double *l;   // (H) sum_j exp(s_j - m)
    real *o;     // (H, dv) sum_j exp(s_j - m) V_j
} DecodePart;

// One part of n <= DECODE_PART keys: K, V point at its first key's row (all
// heads; row strides ldk = H dk, ldv = H dv). Scratch: s (H x DECODE_PART),
// Kt (dk x DECODE_KB).
static void decode_part(DecodePart r, const real *q, const real *K, const real *V, int n, int H, int dk, int dv,
                        real scale, real *s, real *Kt) {
    int ldk = H * dk, ldv = H * dv;
    for (int j0 = 0; j0 < n; j0 += DECODE_KB) {
        int nk = imin(DECODE_KB, n - j0);
        for (int h = 0; h < H; h++) {
            // The next block's rows, a share per head, not all in one burst.
            int p0 = h * DECODE_KB / H, p1 = (h + 1) * DECODE_KB / H;
            prefetch_rows(K + (int64_t)(j0 + DECODE_KB + p0) * ldk, ldk, p1 - p0, ldk, 0);
            pack_transposed(Kt, DECODE_KB, K + (int64_t)j0 * ldk + h * dk, ldk, nk, dk);
            const real *qh = q + h * dk;
            vreal acc = {0};
            for (int c = 0; c < dk; c++) acc += qh[c] * *(const vreal *)(Kt + (int64_t)c * DECODE_KB);
            *(vreal *)(s + (int64_t)h * DECODE_PART + j0) = scale * acc;
        }
    }
    for (int h = 0; h < H; h++) {
        real *sh = s + (int64_t)h * DECODE_PART, mx = sh[0];
#pragma omp simd reduction(max : mx)
        for (int j = 1; j < n; j++) mx = sh[j] > mx ? sh[j] : mx;
#pragma omp simd
        for (int j = 0; j < n; j++) sh[j] = r_exp(sh[j] - mx);
        double sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < n; j++) sum += sh[j];
        r.m[h] = mx;
        r.l[h] = sum;
    }
    memset(r.o, 0, (size_t)H * dv * sizeof(real));
    int j = 0;
    for (; j + 4 <= n; j += 4) {   // four rows a pass: o is loaded and stored once per four
        const real *v0 = V + (int64_t)j * ldv;
        prefetch_rows(v0 + (int64_t)DECODE_AHEAD * ldv, ldv, 4, ldv, 0);
        for (int h = 0; h < H; h++) {
            const real *w = s + (int64_t)h * DECODE_PART + j, *vh = v0 + h * dv;
            real *oh = r.o + (int64_t)h * dv;
#pragma omp simd
            for (int c = 0; c < dv; c++)
                oh[c] += (w[0] * vh[c] + w[1] * vh[ldv + c]) + (w[2] * vh[2 * ldv + c] + w[3] * vh[3 * ldv + c]);
        }
    }
    for (; j < n; j++)
        for (int h = 0; h < H; h++) {
            real w = s[(int64_t)h * DECODE_PART + j], *oh = r.o + (int64_t)h * dv;
            const real *vh = V + (int64_t)j * ldv + h * dv;
#pragma omp simd
            for (int c = 0; c < dv; c++) oh[c] += w * vh[c];
        }
}

static int decode_threads;   // attn_decode_set_threads (attn_kernel.h); 0: the team's size

void attn_decode_set_threads(int threads) { decode_threads = threads > 0 ? threads : 0; }

int attn_decode_team(int64_t work) {
    int team = omp_get_max_threads();
    return decode_threads > team && work >= ATTN_DECODE_PAR_KEYS ? decode_threads : team;
}

void attn_decode_forward(real *o, const real *q, const real *kc, const real *vc, int B, int max_T,
                         int n_keys, const int *key0, int H, int dk, int dv, double scale) {
    ASSERT(n_keys >= 1 && n_keys <= max_T, "attn_decode_forward: %d keys in a cache of %d", n_keys, max_T);
    for (int b = 0; key0 && b < B; b++)
        ASSERT(key0[b] >= 0 && key0[b] < n_keys, "attn_decode_forward: row %d starts at key %d of %d", b, key0[b],
               n_keys);
    int ldq = H * dk, ldv = H * dv, np = (n_keys + DECODE_PART - 1) / DECODE_PART;   // parts of the longest row
    size_t nr = (size_t)B * np * H;                                                  // (b, part, head) results
    real *pm = xmalloc(nr * sizeof(real)), *po = xmalloc(nr * dv * sizeof(real));
    double *pl = xmalloc(nr * sizeof(double));
    int64_t work = 0;   // keys x heads over the rows
    for (int b = 0; b < B; b++) work += (int64_t)(n_keys - (key0 ? key0[b] : 0)) * H;
    int team = attn_decode_team(work);
#pragma omp parallel num_threads(team)
    {
        real *s = xaligned((size_t)H * DECODE_PART * sizeof(real));   // (H, DECODE_PART) scores, then weights
        real *Kt = xaligned((size_t)dk * DECODE_KB * sizeof(real));   // (dk, DECODE_KB)
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int p = 0; p < np; p++) {
                int s0 = (key0 ? key0[b] : 0) + p * DECODE_PART;   // row b's keys: its document's
                if (s0 >= n_keys) continue;
                size_t at = ((size_t)b * np + p) * H;
                DecodePart r = {pm + at, pl + at, po + at * dv};
                decode_part(r, q + (int64_t)b * ldq, kc + ((int64_t)b * max_T + s0) * ldq,
                            vc + ((int64_t)b * max_T + s0) * ldv, imin(DECODE_PART, n_keys - s0), H, dk, dv,
                            (real)scale, s, Kt);
            }
        free(s);
        free(Kt);
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                int n = n_keys - (key0 ? key0[b] : 0), parts = (n + DECODE_PART - 1) / DECODE_PART;
                size_t at = (size_t)b * np * H + h;   // part p of (b, h) at at + p H
                real mx = pm[at];
                for (int p = 1; p < parts; p++) {
                    real mp = pm[at + (size_t)p * H];
                    mx = mp > mx ? mp : mx;
                }
                double l = 0;
                real *ob = o + (int64_t)b * ldv + h * dv;
                for (int c = 0; c < dv; c++) ob[c] = 0;
                for (int p = 0; p < parts; p++) {
                    size_t i = at + (size_t)p * H;
                    real f = r_exp(pm[i] - mx);
                    l += f * pl[i];
#pragma omp simd
                    for (int c = 0; c < dv; c++) ob[c] += f * po[i * dv + c];
                }
#pragma omp simd
                for (int c = 0; c < dv; c++) ob[c] = (real)(ob[c] / l);
            }
    }
    free(pm);
    free(po);
    free(pl);
}
