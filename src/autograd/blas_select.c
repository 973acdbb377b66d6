// blas_select.c: which backend runs gemm(), and at which precision the dense
// layers' products run (blas.h).
//
// `auto` first compares the instruction set of OpenBLAS's kernels (it picks
// them from a table of CPU models, or OPENBLAS_CORETYPE) with the CPU's: an
// old OpenBLAS on a new CPU runs Prescott (SSE3) or Haswell (AVX2) kernels on
// an AVX-512 machine, and oneDNN, whose JIT kernels follow the instruction
// set, is then 2x faster or more (docs/cpu_perf.md). When OpenBLAS's kernels
// match the CPU, it times both on the model's product shapes and keeps the
// faster (OpenBLAS when they tie within 5%: it is the design's dependency).
#include <cpuid.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "blas.h"
#include "fileio.h"

GemmBackend blas_backend = GEMM_OPENBLAS;
GemmPrecision blas_precision = PRECISION_FP32;

static char describe[768] = "openblas, products fp32";

static const char *const BACKEND_NAMES[GEMM_BACKEND_COUNT] = {"auto", "openblas", "onednn"};
static const char *const PRECISION_NAMES[PRECISION_COUNT] = {"fp32", "bf16", "tf32"};

int blas_backend_parse(const char *name) {
    for (int i = 0; i < GEMM_BACKEND_COUNT; i++)
        if (name && !strcmp(name, BACKEND_NAMES[i])) return i;
    return -1;
}

const char *blas_backend_name(GemmBackend b) { return b >= 0 && b < GEMM_BACKEND_COUNT ? BACKEND_NAMES[b] : "?"; }
const char *blas_precision_name(GemmPrecision p) { return p >= 0 && p < PRECISION_COUNT ? PRECISION_NAMES[p] : "?"; }
const char *blas_describe(void) { return describe; }

// ---- instruction sets ----

#ifndef AG_DOUBLE   // (the float64 build has OpenBLAS only)
typedef enum { ISA_UNKNOWN, ISA_SSE, ISA_AVX, ISA_AVX2, ISA_AVX512 } IsaLevel;
static const char *const ISA_NAMES[] = {"?", "SSE", "AVX", "AVX2", "AVX-512"};

static IsaLevel cpu_level(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
    if (__builtin_cpu_supports("avx")) return ISA_AVX;
    return ISA_SSE;
}

// The instruction set of each kernel set of OpenBLAS 0.3.21's DYNAMIC_ARCH
// build (the names openblas_get_corename() returns).
static IsaLevel openblas_level(const char *core) {
    static const struct {
        const char *name;
        IsaLevel level;
    } table[] = {
        {"SkylakeX", ISA_AVX512},    {"Cooperlake", ISA_AVX512}, {"SapphireRapids", ISA_AVX512},
        {"Haswell", ISA_AVX2},       {"Zen", ISA_AVX2},          {"Excavator", ISA_AVX2},
        {"Sandybridge", ISA_AVX},    {"Bulldozer", ISA_AVX},     {"Piledriver", ISA_AVX},
        {"Steamroller", ISA_AVX},    {"Prescott", ISA_SSE},      {"Core2", ISA_SSE},
        {"Penryn", ISA_SSE},         {"Dunnington", ISA_SSE},    {"Nehalem", ISA_SSE},
        {"Atom", ISA_SSE},           {"Barcelona", ISA_SSE},     {"Opteron", ISA_SSE},
        {"Opteron_SSE3", ISA_SSE},   {"Katmai", ISA_SSE},        {"Coppermine", ISA_SSE},
        {"Northwood", ISA_SSE},      {"Banias", ISA_SSE},        {"Nano", ISA_SSE},
        {"Bobcat", ISA_SSE},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcasecmp(core, table[i].name)) return table[i].level;
    return ISA_UNKNOWN;
}

// ---- the measurement ----
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// The rows of the measured products: a step's 4096 tokens (the bundled
// configs' B x T), split into slabs and row blocks as a step splits them.
#define MEASURE_ROWS 4096
// In the kept verdict's key: a verdict of another measurement is not this one's.
#define MEASURE_NAME "step products 4096"

typedef struct {
    float *X, *W, *Y;       // inputs: (R, 256), (256, 704), (R, 704)
    float *oY, *oX, *oW;    // outputs, apart from the inputs (no values grow round after round)
    float *part;            // gemm_sum_rows's partials
} MeasureBufs;

// Seconds of one pass over a step's kinds of product, as a step runs them
// (gemm_rows, gemm_sum_rows: forward x W, dX = dY W^T, dW = X^T dY over
// MEASURE_ROWS rows of width 256, MLP width 704) on the backend and
// precision set (measure_ratio sets them).
static double time_products(const MeasureBufs *m) {
    const int R = MEASURE_ROWS;
    double t0 = now();
    gemm_rows(false, R, 704, 256, m->X, 256, m->W, 704, 0, m->oY, 704);
    gemm_rows(true, R, 256, 704, m->Y, 704, m->W, 704, 0, m->oX, 256);
    gemm_sum_rows(256, 704, R, m->X, 256, m->Y, 704, 0, m->oW, 704, m->part);
    return now() - t0;
}

// oneDNN's time over OpenBLAS's in float32: the best of 5 alternating rounds
// of each (the best, because load from elsewhere only ever adds time). About
// 0.2 s on 2 cores of a Zen 4, once per machine (the verdict is kept). The
// backend and precision are put back as they were.
static double measure_ratio(void) {
    const size_t R = MEASURE_ROWS;
    GemmBackend saved = blas_backend;
    GemmPrecision saved_p = blas_precision;
    blas_precision = PRECISION_FP32;
    size_t part = 0;   // the partials' room: as much as either backend's split asks for
    for (int k = 0; k < 2; k++) {
        blas_backend = k ? GEMM_ONEDNN : GEMM_OPENBLAS;
        size_t n = gemm_sum_rows_scratch(256, 704, (int)R);
        if (n > part) part = n;
    }
    MeasureBufs m = {xaligned(R * 256 * sizeof(float)), xaligned((size_t)256 * 704 * sizeof(float)),
                     xaligned(R * 704 * sizeof(float)), xaligned(R * 704 * sizeof(float)),
                     xaligned(R * 256 * sizeof(float)), xaligned((size_t)256 * 704 * sizeof(float)),
                     xaligned((part ? part : 1) * sizeof(float))};
    for (size_t i = 0; i < R * 256; i++) m.X[i] = (float)((i % 7) * 0.01 - 0.03);
    for (size_t i = 0; i < R * 704; i++) m.Y[i] = (float)((i % 11) * 0.01 - 0.05);
    for (size_t i = 0; i < (size_t)256 * 704; i++) m.W[i] = (float)((i % 5) * 0.01 - 0.02);
    double best[2] = {1e30, 1e30};
    for (int r = 0; r < 6; r++)   // round 0 warms both up (thread team, JIT, buffers)
        for (int k = 0; k < 2; k++) {
            blas_backend = k ? GEMM_ONEDNN : GEMM_OPENBLAS;
            double t = time_products(&m);
            if (r > 0 && t < best[k]) best[k] = t;
        }
    blas_backend = saved;
    blas_precision = saved_p;
    float *bufs[] = {m.X, m.W, m.Y, m.oY, m.oX, m.oW, m.part};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    return best[1] / best[0];
}

// ---- the measurement, kept per machine ----
//
// Where the two backends are close the measurement can come out either side
// of its line from one start to the next (0.79-0.95 against a line of 0.95 on
// a Zen 4 machine), and they round differently: two runs of one command would
// then differ in their last bits. So auto measures once per machine and
// thread count and keeps the verdict in a small text file, one line per
// machine: key, tab, ratio, tab, backend. Removing the file measures again.

#define CACHE_LINE_MAX 512   // longer lines are not ours: skipped
#define CACHE_LINES_MAX 64   // machines kept (the oldest go first)
#define CACHE_FILE_MAX (1 << 20)   // a larger file is not ours: no verdict (then rewritten)

// OpenBLAS's version: the second word of its build string ("OpenBLAS 0.3.21
// DYNAMIC_ARCH ..."), at most 15 characters of [0-9A-Za-z.-].
static void openblas_version(char *v, size_t n) {
    const char *cfg = openblas_get_config(), *p = cfg ? strchr(cfg, ' ') : NULL;
    size_t len = 0;
    if (p)
        for (p++; len + 1 < n && len < 15 && p[len] && (isalnum((unsigned char)p[len]) || strchr(".-", p[len]));)
            len++;
    if (len == 0) {
        snprintf(v, n, "?");
        return;
    }
    memcpy(v, p, len);
    v[len] = 0;
}

// CPU brand (cpuid), family / model / stepping, the ISA levels of the CPU and
// of OpenBLAS's kernels, both libraries' versions (an upgrade measures again),
// oneDNN's ISA, the thread count and the measurement's name.
void blas_auto_key(char *key, size_t n) {
    unsigned r[12] = {0}, a = 0, b = 0, c = 0, d = 0;
    char brand[49] = "";
    if (__get_cpuid(0x80000000u, &a, &b, &c, &d) && a >= 0x80000004u) {
        for (unsigned i = 0; i < 3; i++)
            __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
        memcpy(brand, r, 48);
        brand[48] = 0;
    }
    unsigned fam = 0, mod = 0, step = 0;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        fam = ((a >> 8) & 0xf) + ((a >> 20) & 0xff);
        mod = ((a >> 4) & 0xf) | ((a >> 12) & 0xf0);
        step = a & 0xf;
    }
    char *p = brand;   // trimmed, and no tabs or newlines (the file's separators)
    while (*p == ' ') p++;
    for (char *q = p; *q; q++)
        if (*q == '\t' || *q == '\n' || *q == '\r') *q = ' ';
    size_t len = strlen(p);
    while (len > 0 && p[len - 1] == ' ') p[--len] = 0;
    char obv[16];
    openblas_version(obv, sizeof obv);
    snprintf(key, n, "%s|family %u model %u stepping %u|cpu %s|openblas %s %s|onednn %s %s|threads %d|%s", p, fam,
             mod, step, ISA_NAMES[cpu_level()], obv, blas_core_name(), onednn_version(),
             onednn_built() ? onednn_isa_name() : "none", omp_get_max_threads(), MEASURE_NAME);
}

// ATTNLAB_CACHE_DIR, else $XDG_CACHE_HOME/attnlab, else ~/.cache/attnlab; false when none is set.
static bool cache_dir(char *dir, size_t n) {
    const char *e = getenv("ATTNLAB_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int w = e && *e ? snprintf(dir, n, "%s", e)
            : x && *x ? snprintf(dir, n, "%s/attnlab", x)
            : h && *h ? snprintf(dir, n, "%s/.cache/attnlab", h)
                      : -1;
    return w > 0 && (size_t)w < n;
}

// One line of the file: true with its fields when it is well formed.
static bool cache_parse(char *line, char **key, double *ratio, GemmBackend *b) {
    char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
    if (!t1 || !t2 || t1 == line) return false;
    *t1 = *t2 = 0;
    char *end, *name = t2 + 1;
    name[strcspn(name, "\r\n")] = 0;
    errno = 0;
    double r = strtod(t1 + 1, &end);
    if (errno || end == t1 + 1 || *end || !(r >= 1e-3 && r <= 1000)) return false;   // (%.4f keeps it)
    int k = blas_backend_parse(name);
    if (k != GEMM_OPENBLAS && k != GEMM_ONEDNN) return false;
    *key = line;
    *ratio = r;
    *b = (GemmBackend)k;
    return true;
}

// Reads path's well-formed lines (of its first 256) through file_read_all,
// as every file the project reads (a regular file, bounded: a FIFO or a
// device there is never waited on); calls f on each. A missing file has
// none; the file is not trusted: a line too long or with a NUL byte is
// skipped whole.
typedef void (*CacheVisit)(const char *key, double ratio, GemmBackend b, void *ctx);
static void cache_read(const char *path, CacheVisit f, void *ctx) {
    uint8_t *data;
    int64_t n;
    if (!file_read_all(path, "gemm = auto verdict file", CACHE_FILE_MAX, &data, &n).ok) return;
    char line[CACHE_LINE_MAX + 1];
    int64_t at = 0;
    for (int lines = 0; lines < 4 * CACHE_LINES_MAX && at < n; lines++) {
        const uint8_t *p = data + at, *nl = memchr(p, '\n', (size_t)(n - at));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(n - at);
        at += (int64_t)len + 1;
        if (len > CACHE_LINE_MAX || memchr(p, 0, len)) continue;
        memcpy(line, p, len);
        line[len] = 0;
        char *key;
        double r;
        GemmBackend b;
        if (cache_parse(line, &key, &r, &b)) f(key, r, b, ctx);
    }
    free(data);
}

typedef struct Found {
    const char *key;
    double ratio;
    GemmBackend b;
    bool found;
} Found;

static void find_visit(const char *key, double ratio, GemmBackend b, void *ctx) {
    Found *fd = ctx;
    if (!strcmp(key, fd->key)) fd->ratio = ratio, fd->b = b, fd->found = true;   // the last line wins
}

bool blas_auto_cache_lookup(const char *path, const char *key, double *ratio, GemmBackend *b) {
    Found fd = {key, 0, GEMM_OPENBLAS, false};
    cache_read(path, find_visit, &fd);
    if (fd.found) *ratio = fd.ratio, *b = fd.b;
    return fd.found;
}

typedef struct Kept {
    const char *skip;
    char lines[CACHE_LINES_MAX][CACHE_LINE_MAX + 2];
    int n;
} Kept;

// One line as the file holds it; false when it would not fit (the key is too
// long for the file, which blas_auto_cache_store refuses).
static bool cache_format(char *line, const char *key, double ratio, GemmBackend b) {
    int w = snprintf(line, CACHE_LINE_MAX + 2, "%s\t%.4f\t%s\n", key, ratio, blas_backend_name(b));
    return w > 0 && w <= CACHE_LINE_MAX + 1;
}

static void keep_visit(const char *key, double ratio, GemmBackend b, void *ctx) {
    Kept *k = ctx;
    if (!strcmp(key, k->skip)) return;
    if (k->n == CACHE_LINES_MAX - 1) {   // room for the new line: the oldest goes
        memmove(k->lines[0], k->lines[1], (size_t)(CACHE_LINES_MAX - 2) * sizeof k->lines[0]);
        k->n--;
    }
    if (cache_format(k->lines[k->n], key, ratio, b)) k->n++;
}

bool blas_auto_cache_store(const char *path, const char *key, double ratio, GemmBackend b) {
    if (strlen(key) + 32 > CACHE_LINE_MAX || !*key || strpbrk(key, "\t\n\r") || !(ratio >= 1e-3 && ratio <= 1000) ||
        (b != GEMM_OPENBLAS && b != GEMM_ONEDNN))
        return false;
    Kept *k = calloc(1, sizeof *k);
    if (!k) return false;
    k->skip = key;
    cache_read(path, keep_visit, k);
    cache_format(k->lines[k->n++], key, ratio, b);   // (fits: the key's length was checked)
    // Whole or not at all, and only over a regular file (fileio.h).
    FileOut o;
    bool ok = file_out_open(&o, path, "GEMM cache", 0).ok;
    for (int i = 0; ok && i < k->n; i++) ok = file_out_write(&o, k->lines[i], strlen(k->lines[i]));
    if (ok) ok = file_out_commit(&o).ok;
    else file_out_abort(&o);
    free(k);
    return ok;
}

// The measured ratio for this machine and thread count, and the backend it
// chose (*b): from the file when it has them, else measured now and kept. A
// lock beside the file makes the first process to measure the one that
// decides, when several start at once (the ranks of mpirun, parallel tests).
// *where says which, for the start-up line.
static double auto_ratio(GemmBackend *b, char *where, size_t n) {
    char key[CACHE_LINE_MAX], dir[4096], path[4200], lock[4200];
    blas_auto_key(key, sizeof key);
    bool have = cache_dir(dir, sizeof dir) && path_join(path, sizeof path, dir, "gemm_auto").ok &&
                path_join(lock, sizeof lock, dir, "gemm_auto.lock").ok;
    int lk = -1;
    if (have) {   // mkdir -p of the last two levels (e.g. ~/.cache/attnlab)
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) {
            *slash = 0;
            mkdir(dir, 0755);
            *slash = '/';
        }
        mkdir(dir, 0755);
        lk = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);   // (a link there: no lock, no cache)
        if (lk >= 0) flock(lk, LOCK_EX);
    }
    double r;
    if (have && blas_auto_cache_lookup(path, key, &r, b)) {
        snprintf(where, n, "; measured earlier, read from %s", path);
    } else {
        r = measure_ratio();
        *b = r < 0.95 ? GEMM_ONEDNN : GEMM_OPENBLAS;   // (OpenBLAS, the design's dependency, wins near-ties)
        if (lk >= 0 && blas_auto_cache_store(path, key, r, *b))
            snprintf(where, n, "; saved to %s for the next runs", path);
        else
            snprintf(where, n, "%s", have ? "; not saved (cannot write its file)" : "");
    }
    if (lk >= 0) close(lk);   // (and the lock with it)
    return r;
}
#endif

// ---- selection ----

bool blas_select(GemmBackend want, GemmPrecision prec, char *err, size_t n) {
    const char *core = blas_core_name();
    if (want < 0 || want >= GEMM_BACKEND_COUNT || prec < 0 || prec >= PRECISION_COUNT) {
        snprintf(err, n, "unknown GEMM backend %d or precision %d", (int)want, (int)prec);
        return false;
    }
    if (prec == PRECISION_TF32) {
        snprintf(err, n, "precision = tf32 is for the GPU's products (with device = cuda); on the CPU: fp32 or bf16");
        return false;
    }
#ifdef AG_DOUBLE
    if (prec == PRECISION_BF16) {
        snprintf(err, n, "precision = bf16 needs the float32 build (this float64 build is for gradient checks; "
                         "use build/ rather than build-f64/)");
        return false;
    }
    if (want == GEMM_ONEDNN) {
        snprintf(err, n, "gemm = onednn: oneDNN has no float64 products; the float64 build uses OpenBLAS "
                         "(gemm = auto or openblas)");
        return false;
    }
    blas_backend = GEMM_OPENBLAS;
    blas_precision = PRECISION_FP32;
    snprintf(describe, sizeof describe, "openblas (%s kernels%s), products fp64", core,
             want == GEMM_AUTO ? "; auto: the float64 build has no other" : "");
    return true;
#else
    if ((want == GEMM_ONEDNN || prec == PRECISION_BF16) && !onednn_built()) {
        snprintf(err, n, "%s needs oneDNN, and this build has none (apt-get install libdnnl-dev, then rebuild)",
                 prec == PRECISION_BF16 ? "precision = bf16" : "gemm = onednn");
        return false;
    }
    if (prec == PRECISION_BF16 && !onednn_has_bf16()) {
        snprintf(err, n, "precision = bf16 needs a CPU with AVX512_BF16 (oneDNN finds %s here); use precision = fp32",
                 onednn_isa_name());
        return false;
    }
    GemmBackend b = want;
    char why[512] = "";
    if (want == GEMM_AUTO) {
        IsaLevel cpu = cpu_level(), ob = openblas_level(core);
        if (!onednn_built()) {
            b = GEMM_OPENBLAS;
            snprintf(why, sizeof why, "; auto: this build has no oneDNN");
        } else if (ob != ISA_UNKNOWN && ob < cpu) {
            b = GEMM_ONEDNN;
            snprintf(why, sizeof why, "; auto: OpenBLAS's %s kernels are %s on an %s CPU", core, ISA_NAMES[ob],
                     ISA_NAMES[cpu]);
        } else {
            char where[4300];
            double r = auto_ratio(&b, where, sizeof where);
            snprintf(why, sizeof why, "; auto: measured oneDNN/OpenBLAS time %.2f on %d thread%s%.300s", r,
                     omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s", where);
        }
    }
    blas_backend = b;
    blas_precision = prec;
    if (b == GEMM_ONEDNN)
        snprintf(describe, sizeof describe, "onednn (%s kernels%s), products %s", onednn_isa_name(), why,
                 PRECISION_NAMES[prec]);
    else
        snprintf(describe, sizeof describe, "openblas (%s kernels%s), products %s%s", core, why,
                 PRECISION_NAMES[prec], prec == PRECISION_BF16 ? " (the bf16 ones through oneDNN)" : "");
    return true;
#endif
}

void blas_select_from_env(void) {
    const char *v = getenv("ATTNLAB_GEMM");
    int b = v && *v ? blas_backend_parse(v) : GEMM_AUTO;
    char err[256];
    if (b < 0) {
        fprintf(stderr, "ATTNLAB_GEMM=%s: not one of auto, openblas, onednn; using openblas\n", v);
        b = GEMM_OPENBLAS;
    }
    if (!blas_select((GemmBackend)b, PRECISION_FP32, err, sizeof err)) {
        fprintf(stderr, "ATTNLAB_GEMM=%s: %s; using openblas\n", v, err);
        blas_select(GEMM_OPENBLAS, PRECISION_FP32, err, sizeof err);
    }
}
