// tile_amx.c: the choice of the attention's tile products under bf16, and
// their AMX form (tile_amx.h).
#include "tile_amx.h"

#include "attn_kernel.h"

#include <cpuid.h>
#include <errno.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/syscall.h>
#endif

static const char *const NAMES[BF16_TILES_COUNT] = {"auto", "amx", "avx512bf16", "fp32"};

int bf16_tiles_parse(const char *name) {
    for (int i = 0; i < BF16_TILES_COUNT; i++)
        if (name && !strcmp(name, NAMES[i])) return i;
    return -1;
}

const char *bf16_tiles_name(Bf16Tiles k) { return k >= 0 && k < BF16_TILES_COUNT ? NAMES[k] : "?"; }

// ---- may this process run AMX? ----

#define ARCH_REQ_XCOMP_PERM 0x1023   // (asm/prctl.h, Linux 5.16)
#define XFEATURE_XTILEDATA 18

static bool amx_ok;
static char amx_why[160];

static void amx_probe(void) {
#ifndef AG_TILE_AMX
    snprintf(amx_why, sizeof amx_why,
             "this build has no AMX tiles (they need the AVX512_BF16 tiles of a float32 build for x86-64 Linux, "
             "GCC 11 or later)");
#else
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) {
        snprintf(amx_why, sizeof amx_why, "this CPU has no AMX-BF16 (CPUID 7.0 EDX bits 22, 24)");
        return;
    }
    unsigned lo = 0, hi = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27)))   // OSXSAVE: xgetbv may run
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) {
        snprintf(amx_why, sizeof amx_why, "the OS has not enabled the AMX tile state (XCR0 bits 17, 18)");
        return;
    }
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        snprintf(amx_why, sizeof amx_why, "Linux refused this process the AMX tile state (arch_prctl: %s)",
                 strerror(errno));
        return;
    }
    amx_ok = true;
#endif
}

bool amx_bf16_usable(char *why, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, amx_probe);
    if (!amx_ok && why && n) snprintf(why, n, "%s", amx_why);
    return amx_ok;
}

// ---- the choice ----

static Bf16Tiles chosen = BF16_TILES_AUTO;

static Bf16Tiles resolve(Bf16Tiles k) {
    if (k != BF16_TILES_AUTO) return k;
#ifdef AG_TILE_BF16
    return amx_bf16_usable(NULL, 0) ? BF16_TILES_AMX : BF16_TILES_AVX512BF16;
#else
    return BF16_TILES_FP32;
#endif
}

bool bf16_tiles_select(Bf16Tiles want, char *err, size_t n) {
    char why[200];
    if (want < 0 || want >= BF16_TILES_COUNT) {
        snprintf(err, n, "bf16_tiles: unknown kind %d", (int)want);
        return false;
    }
#ifndef AG_TILE_BF16
    if (want == BF16_TILES_AMX || want == BF16_TILES_AVX512BF16) {
        snprintf(err, n,
                 "bf16_tiles = %s: this build has no bf16 tiles (a float32 build for a CPU with AVX512_BF16, GCC: "
                 "AG_NATIVE=ON on such a CPU); use bf16_tiles = auto or fp32",
                 NAMES[want]);
        return false;
    }
#endif
    if (want == BF16_TILES_AMX && !amx_bf16_usable(why, sizeof why)) {
        snprintf(err, n, "bf16_tiles = amx: %s; use bf16_tiles = auto, avx512bf16 or fp32", why);
        return false;
    }
    chosen = want;
    return true;
}

Bf16Tiles bf16_tiles_current(void) { return resolve(chosen); }

Bf16Tiles attn_tiles_kind(int dk, int dv, int tile_q, int tile_k) {
    bool even = dk % 2 == 0 && dv % 2 == 0 && tile_q % 2 == 0 && tile_k % 2 == 0;
    return tile_products_bf16() && even ? bf16_tiles_current() : BF16_TILES_FP32;
}

int chunk_tiles_kind(void) {
    if (!tile_products_bf16()) return CHUNK_TILES_FP32;
    return bf16_tiles_current() == BF16_TILES_AMX ? CHUNK_TILES_AMX : CHUNK_TILES_BF16;
}

bool attn_tiles_bf16(int dk, int dv, int tile_q, int tile_k) {
    return attn_tiles_kind(dk, dv, tile_q, tile_k) != BF16_TILES_FP32;
}

// ---- the AMX products ----
#ifdef AG_TILE_AMX
#include <immintrin.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
// GCC's _tile_loadd is an asm that does not say it reads memory: without
// this barrier the stores that fill a tile's zero-padded copy may be moved
// after the load or dropped as dead (they were, at -O2: wrong products).
#define TILE_LOAD(t, p, stride)                          \
    do {                                                 \
        __asm__ volatile("" : : "r"(p) : "memory");      \
        _tile_loadd(t, p, stride);                       \
    } while (0)
#define CH 16                            // pairs of k per tile (64 bytes a row)
#define MAX_CH ((AMX_MAX_K / 2 + CH - 1) / CH)

// Palette 1, every tile used as 16 rows of 64 bytes: tiles 0-3 the four
// 16 x 16 blocks of C (two row blocks x two column blocks), 4-5 A's two row
// blocks, 6-7 B's two column blocks. Partial rows and columns of k go
// through zero-padded copies rather than smaller tiles, so one configuration
// serves every shape.
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

// A constant in memory: GCC's _tile_loadconfig tells the compiler it reads
// 8 bytes of its operand, so the stores that filled a local configuration
// could be dropped as dead (they were, at -O2: a fault).
static alignas(64) const TileConfig TILES = {.palette = 1,
                                             .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
                                             .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

AMX_TARGET void amx_tiles_begin(void) {
    if (amx_bf16_usable(NULL, 0)) _tile_loadconfig(&TILES);
}

AMX_TARGET void amx_tiles_end(void) {
    if (amx_bf16_usable(NULL, 0)) _tile_release();
}

static inline int floor_half(int x) { return x >= 0 ? x / 2 : -((1 - x) / 2); }

// The pairs row i takes: those holding an element k of its band
// i + lo <= k <= i + hi within [0, K), as [*p0, *p1).
static inline void row_pairs(int i, int lo, int hi, int KP, int *p0, int *p1) {
    *p0 = imax(0, floor_half(i + lo));
    *p1 = imin(KP, floor_half(i + hi) + 1);
    if (*p1 < *p0) *p1 = *p0;
}

static inline __mmask16 range_mask(int a, int b) {   // lanes a .. b-1 of 0 .. 15
    a = imax(a, 0), b = imin(b, 16);
    return b <= a ? 0 : (__mmask16)(((1u << (b - a)) - 1) << a);
}

// One row block of A (rows i0 .. i0+15) for the chunks c0 .. c1-1, as tiles
// of 16 rows x 16 pairs at dst + 256 (c - c0): each row's pairs outside its
// band, past KP and rows past M zero. A tile that a full block reads whole
// from rows of pairs (ak 1) is not copied: *at[c - c0] points at A itself
// (stride lda pairs, *st), else at its copy (stride 16).
static void amx_pack_a(bfpair *dst, const bfpair **at, int *st, const bfpair *A, int lda, int ak, int M, int KP,
                       int lo, int hi, int i0, int c0, int c1) {
    int q0[16], q1[16];
    bool whole = i0 + 16 <= M;   // every row of the block is a row of A...
    for (int r = 0; r < 16; r++) {
        if (i0 + r < M) row_pairs(i0 + r, lo, hi, KP, &q0[r], &q1[r]);
        else q0[r] = q1[r] = 0;
    }
    for (int c = c0; c < c1; c++) {
        int p = c * CH;
        bfpair *t = dst + (size_t)(c - c0) * 256;
        bool full = whole;   // ... and takes all 16 pairs of the chunk
        for (int r = 0; r < 16 && full; r++) full = q0[r] <= p && q1[r] >= p + CH;
        if (full && ak == 1) {
            at[c - c0] = A + (int64_t)i0 * lda + p;
            st[c - c0] = lda;
            continue;
        }
        at[c - c0] = t, st[c - c0] = 16;
        if (ak == 1) {
            for (int r = 0; r < 16; r++) {
                __mmask16 m = range_mask(q0[r] - p, q1[r] - p);
                __m512i v = _mm512_maskz_loadu_epi32(m, A + (int64_t)(i0 + r) * lda + p);
                _mm512_store_si512((void *)(t + r * 16), v);
            }
            continue;
        }
        if (whole && p + CH <= KP && lda == 1)   // 16 rows of 16 pairs along i: in registers
            transpose_block((float *)t, 16, (const float *)(A + i0 + (int64_t)p * ak), ak);
        else
            for (int r = 0; r < 16; r++)
                for (int q = 0; q < 16; q++)
                    t[r * 16 + q] = i0 + r < M && p + q < KP ? A[(int64_t)(i0 + r) * lda + (int64_t)(p + q) * ak] : 0;
        for (int r = 0; r < 16 && !full; r++) {   // each row's band (full: the whole chunk, nothing to clear)
            __mmask16 m = range_mask(q0[r] - p, q1[r] - p);
            _mm512_store_si512((void *)(t + r * 16), _mm512_maskz_mov_epi32(m, _mm512_load_si512(t + r * 16)));
        }
    }
}

// C's rows r < R of a 16 x 16 block from its tile (cb, stored), as
// tile_mm_bf16.h's mm_block_bf16 finishes its registers: C = s_r c or C +
// s_r c, s_r = alpha rs[r] (rs NULL: alpha).
static inline void amx_finish(const float *cb, int R, float alpha, const float *rs, float *C, int ldc, bool add) {
    for (int r = 0; r < R; r++) {
        __m512 s = _mm512_set1_ps(rs ? alpha * rs[r] : alpha);
        float *cv = C + (int64_t)r * ldc;
        __m512 x = _mm512_mul_ps(s, _mm512_load_ps(cb + r * 16));
        _mm512_storeu_ps(cv, add ? _mm512_add_ps(_mm512_loadu_ps(cv), x) : x);
    }
}

// B's chunk c at columns j (16 pairs): B's own rows when whole, else a copy
// with rows from KP on zero.
static inline const bfpair *amx_b_tile(bfpair *pad, const bfpair *B, int ldb, int KP, int c, int j, int *st) {
    int p = c * CH;
    if (p + CH <= KP) {
        *st = ldb;
        return B + (int64_t)p * ldb + j;
    }
    for (int r = 0; r < CH; r++)
        _mm512_store_si512((void *)(pad + r * 16),
                           p + r < KP ? _mm512_loadu_si512(B + (int64_t)(p + r) * ldb + j) : _mm512_setzero_si512());
    *st = 16;
    return pad;
}

// The products of one group of up to 32 rows: A's tiles of its two row
// blocks (chunks ca[b] .. cb[b]-1), and what is done with the sums.
typedef struct {
    const bfpair *const *at[2];
    const int *st[2], *ca, *cb;
    float alpha;
    const float *rs;   // row scales from row 0 (NULL: none)
    bool lower, add;
} AmxGroup;

// Whether the 16 x 16 block of C at rows r0 .. and columns c0 .. is
// written: every block unless lower, then those on or below the diagonal.
static inline bool amx_block_wanted(const AmxGroup *g, int r0, int c0) { return !g->lower || c0 <= r0; }

// One group of up to 32 rows (i0 ..) against every column block.
static AMX_TARGET void amx_group(const AmxGroup *g, int M, int N, int KP, const bfpair *B, int ldb, float *C,
                                 int ldc, int i0) {
    alignas(64) bfpair pad[2][256];
    alignas(64) float cbuf[4][256];
    const int *ca = g->ca, *cb = g->cb;
    bool two_i = i0 + 16 < M;
    int c0 = two_i ? imin(ca[0], ca[1]) : ca[0], c1 = two_i ? imax(cb[0], cb[1]) : cb[0];
    for (int j = 0; j < N; j += 32) {
        bool two_j = j + 16 < N;
        bool w[4] = {amx_block_wanted(g, i0, j), two_j && amx_block_wanted(g, i0, j + 16),
                     two_i && amx_block_wanted(g, i0 + 16, j), two_i && two_j && amx_block_wanted(g, i0 + 16, j + 16)};
        if (!w[0] && !w[1] && !w[2] && !w[3]) break;   // (lower: so are the blocks right of these)
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int c = c0; c < c1; c++) {
            int sb0, sb1 = 0;
            const bfpair *b0 = amx_b_tile(pad[0], B, ldb, KP, c, j, &sb0);
            const bfpair *b1 = w[1] || w[3] ? amx_b_tile(pad[1], B, ldb, KP, c, j + 16, &sb1) : NULL;
            TILE_LOAD(6, b0, sb0 * 4);
            if (b1) TILE_LOAD(7, b1, sb1 * 4);
            if ((w[0] || w[1]) && c >= ca[0] && c < cb[0]) {
                TILE_LOAD(4, g->at[0][c - ca[0]], g->st[0][c - ca[0]] * 4);
                if (w[0]) _tile_dpbf16ps(0, 4, 6);
                if (w[1]) _tile_dpbf16ps(1, 4, 7);
            }
            if (two_i && c >= ca[1] && c < cb[1]) {
                TILE_LOAD(5, g->at[1][c - ca[1]], g->st[1][c - ca[1]] * 4);
                if (w[2]) _tile_dpbf16ps(2, 5, 6);
                if (w[3]) _tile_dpbf16ps(3, 5, 7);
            }
        }
        // A C tile of 16 whole rows that is C itself (alpha 1, no row
        // scales, no sum) goes straight to C: 1 x is x, bit for bit.
        bool plain = g->alpha == 1 && !g->rs && !g->add;
        bool direct[4] = {plain && i0 + 16 <= M, plain && i0 + 16 <= M, plain && i0 + 32 <= M, plain && i0 + 32 <= M};
        float *Cg = C + (int64_t)i0 * ldc + j;
#define AMX_STORE(t, r, c)                                                                 \
    if (direct[t] && w[t]) _tile_stored(t, Cg + (int64_t)(r) * ldc + (c), ldc * 4);        \
    else _tile_stored(t, cbuf[t], 64)
        AMX_STORE(0, 0, 0);
        AMX_STORE(1, 0, 16);
        AMX_STORE(2, 16, 0);
        AMX_STORE(3, 16, 16);
#undef AMX_STORE
        for (int t = 0; t < 4; t++) {
            int r0 = i0 + 16 * (t / 2), cj = j + 16 * (t % 2);
            if (w[t] && !direct[t])
                amx_finish(cbuf[t], imin(16, M - r0), g->alpha, g->rs ? g->rs + r0 : NULL, C + (int64_t)r0 * ldc + cj,
                           ldc, g->add);
        }
    }
}

AMX_TARGET bool amx_mm_bf16_band_part(int M, int N, int K, int lo, int hi, bool lower, float alpha, const float *rs,
                                      const bfpair *A, int lda, int ak, const bfpair *B, int ldb, float *C, int ldc,
                                      bool add) {
    if (K > AMX_MAX_K) return false;
    if (M <= 0 || N <= 0) return true;
    int KP = (K + 1) / 2;
    alignas(64) bfpair abuf[2][MAX_CH * 256];
    const bfpair *at[2][MAX_CH];
    int st[2][MAX_CH];
    for (int i0 = 0; i0 < M; i0 += 32) {
        int ca[2] = {0, 0}, cb[2] = {0, 0};
        for (int b = 0; b < 2 && i0 + 16 * b < M; b++) {
            int r0 = i0 + 16 * b, r1 = imin(M, r0 + 16) - 1, p0, p1, u0, u1;   // the block's first and last row
            row_pairs(r0, lo, hi, KP, &p0, &u0);
            row_pairs(r1, lo, hi, KP, &u1, &p1);
            ca[b] = p0 / CH;
            cb[b] = p1 > p0 ? (p1 + CH - 1) / CH : ca[b];
            amx_pack_a(abuf[b], at[b], st[b], A, lda, ak, M, KP, lo, hi, r0, ca[b], cb[b]);
        }
        AmxGroup g = {{at[0], at[1]}, {st[0], st[1]}, ca, cb, alpha, rs, lower, add};
        amx_group(&g, M, N, KP, B, ldb, C, ldc, i0);
    }
    return true;
}

bool amx_mm_bf16_band(int M, int N, int K, int lo, int hi, float alpha, const bfpair *A, int lda, int ak,
                      const bfpair *B, int ldb, float *C, int ldc, bool add) {
    return amx_mm_bf16_band_part(M, N, K, lo, hi, false, alpha, NULL, A, lda, ak, B, ldb, C, ldc, add);
}
#else
void amx_tiles_begin(void) {}
void amx_tiles_end(void) {}
#ifdef AG_TILE_BF16
bool amx_mm_bf16_band_part(int M, int N, int K, int lo, int hi, bool lower, float alpha, const float *rs,
                           const bfpair *A, int lda, int ak, const bfpair *B, int ldb, float *C, int ldc, bool add) {
    (void)M, (void)N, (void)K, (void)lo, (void)hi, (void)lower, (void)alpha, (void)rs, (void)A, (void)lda, (void)ak;
    (void)B, (void)ldb, (void)C, (void)ldc, (void)add;
    return false;   // no AMX in this build: the caller runs tile_mm_bf16_band_part
}
#endif
#endif
