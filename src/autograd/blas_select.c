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
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "blas.h"

GemmBackend blas_backend = GEMM_OPENBLAS;
GemmPrecision blas_precision = PRECISION_FP32;

static char describe[512] = "openblas, products fp32";

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

// Seconds of one pass over a tiny config's kinds of product (forward x W, dX
// = dY W^T, dW = X^T dY at 1024 rows of width 256, MLP width 704) on backend b.
static double time_products(GemmBackend b, float *X, float *W, float *Y) {
    GemmBackend saved = blas_backend;
    blas_backend = b;
    double t0 = now();
    gemm(false, false, 1024, 704, 256, 1, X, 256, W, 704, 0, Y, 704);
    gemm(false, true, 1024, 256, 704, 1, Y, 704, W, 704, 0, X, 256);
    gemm(true, false, 256, 704, 1024, 1, X, 256, Y, 704, 0, W, 704);
    double t = now() - t0;
    blas_backend = saved;
    return t;
}

// oneDNN's time over OpenBLAS's: the best of 5 alternating rounds of each
// (the best, because load from elsewhere only ever adds time). ~20 ms.
static double measure_ratio(void) {
    float *X = xaligned((size_t)1024 * 704 * sizeof(float)), *W = xaligned((size_t)704 * 704 * sizeof(float));
    float *Y = xaligned((size_t)1024 * 704 * sizeof(float));
    for (int i = 0; i < 1024 * 704; i++) X[i] = Y[i] = (float)((i % 7) * 0.01 - 0.03);
    for (int i = 0; i < 704 * 704; i++) W[i] = (float)((i % 5) * 0.01 - 0.02);
    double best[2] = {1e30, 1e30};
    for (int r = 0; r < 6; r++)   // round 0 warms both up (thread team, JIT, buffers)
        for (int k = 0; k < 2; k++) {
            double t = time_products(k ? GEMM_ONEDNN : GEMM_OPENBLAS, X, W, Y);
            if (r > 0 && t < best[k]) best[k] = t;
        }
    free(X);
    free(W);
    free(Y);
    return best[1] / best[0];
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
    char why[256] = "";
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
            double r = measure_ratio();
            b = r < 0.95 ? GEMM_ONEDNN : GEMM_OPENBLAS;
            snprintf(why, sizeof why, "; auto: measured oneDNN/OpenBLAS time %.2f on %d thread%s", r,
                     omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s");
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
