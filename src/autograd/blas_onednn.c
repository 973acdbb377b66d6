// blas_onednn.c: the oneDNN backend of blas.h (Debian's libdnnl, 2.6).
//
// float32 products go through dnnl_sgemm, whose JIT kernels are chosen by the
// CPU's instruction set (AVX-512 on an AVX-512 CPU), not by a table of CPU
// models as OpenBLAS's are. bf16 products (bf16 inputs, float32 accumulation
// and output) go through a matmul primitive: dnnl_sgemm has no bf16 variant in
// this version, and a float32 matmul with fpmath_mode bf16 runs float32
// kernels here (measured: same speed as float32).
//
// Threads: libdnnl is built with the OpenMP runtime (dnnl_config.h:
// DNNL_CPU_RUNTIME OMP) and links libgomp, the runtime of this project and of
// OpenBLAS's OpenMP build, so all three share one thread pool. oneDNN runs a
// product on omp_get_max_threads() threads, or on one inside a parallel
// region (as OpenBLAS does); docs/cpu_perf.md has the measurement.
//
// Without oneDNN (built without libdnnl-dev, or the float64 build, for which
// oneDNN has no products) the functions below report that it is missing and
// the others are never called.
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"

#if defined(AG_HAVE_ONEDNN) && !defined(AG_DOUBLE)
#include <oneapi/dnnl/dnnl.h>

#define DNNL_CHECK(call)                                                                  \
    do {                                                                                  \
        dnnl_status_t st_ = (call);                                                       \
        ASSERT(st_ == dnnl_success, "oneDNN: %s failed (status %d)", #call, (int)st_);    \
    } while (0)

bool onednn_built(void) { return true; }

static dnnl_cpu_isa_t cpu_isa(void) { return dnnl_get_effective_cpu_isa(); }

const char *onednn_isa_name(void) {
    switch (cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "?";
    }
}

const char *onednn_version(void) {
    static char v[32];
    const dnnl_version_t *d = dnnl_version();
    snprintf(v, sizeof v, "%d.%d.%d", d->major, d->minor, d->patch);
    return v;
}

// The ISA values are bit sets, each including the ones below it.
bool onednn_has_bf16(void) {
    return (cpu_isa() & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

// Below this many multiply-adds a product runs on one thread: waking the
// second costs more than it saves (gemm_bench: a 1 x 256 x 256 product, as in
// decoding, took 1.7 us on one thread and 17 us on two).
#define ONE_THREAD_MACS (1 << 22)

// Run f on one thread (outside a parallel region oneDNN would take them all).
#define ON_ONE_THREAD(small, stmt)                   \
    do {                                             \
        int saved_ = 0;                              \
        if (small) {                                 \
            saved_ = omp_get_max_threads();          \
            omp_set_num_threads(1);                  \
        }                                            \
        stmt;                                        \
        if (small) omp_set_num_threads(saved_);      \
    } while (0)

void onednn_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc) {
    bool small = (int64_t)M * N * K < ONE_THREAD_MACS && !omp_in_parallel();
    ON_ONE_THREAD(small, DNNL_CHECK(dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb,
                                               beta, C, ldc)));
}

// ---- bf16 matmul primitives, cached by shape ----
//
// Creating a primitive JIT-compiles its kernels (~0.1-1 ms); a training step
// uses a few dozen shapes, so each is made once and kept. A primitive made
// inside a parallel region plans for one thread, one made outside for all of
// them, so the thread count is part of the key. Scratch memory is ours (one
// buffer per thread), which makes running one primitive on several threads at
// once safe.

typedef struct MatmulKey {
    int ta, tb, M, N, K, lda, ldb, ldc, accumulate, threads;
} MatmulKey;

typedef struct MatmulEntry {
    MatmulKey key;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a_md, b_md, c_md, scratch_md;
    size_t scratch_bytes;
} MatmulEntry;

#define CACHE_MAX 512   // shapes kept; beyond it a primitive is made and freed per product

static struct {
    pthread_mutex_t lock;
    dnnl_engine_t engine;
    MatmulEntry entries[CACHE_MAX];
    int n;
} cache = {PTHREAD_MUTEX_INITIALIZER};

static _Thread_local struct {
    void *p;
    size_t bytes;
} scratch;

// Freed when its thread ends (blas.c's bf16 buffers say why).
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_thread_end(void *unused) {
    (void)unused;
    free(scratch.p);
    scratch.p = NULL;
    scratch.bytes = 0;
}

static void scratch_key_make(void) {
    ASSERT(pthread_key_create(&scratch_key, scratch_thread_end) == 0, "oneDNN scratch: no thread key");
}

static void *thread_scratch(size_t bytes) {
    if (bytes > scratch.bytes) {
        pthread_once(&scratch_once, scratch_key_make);
        pthread_setspecific(scratch_key, &scratch);   // non-NULL: the destructor runs
        free(scratch.p);
        scratch.bytes = (bytes + 4095) & ~(size_t)4095;
        scratch.p = xaligned(scratch.bytes);
    }
    return scratch.p;
}

// A (M x K) row-major, or stored transposed (K x M) when ta: the strides of a
// 2-D memory descriptor of the product's logical (M x K) shape.
static void make_md(dnnl_memory_desc_t *md, int rows, int cols, bool trans, int ld, dnnl_data_type_t dt) {
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides));
}

static void entry_create(MatmulEntry *e) {
    const MatmulKey *k = &e->key;
    if (!cache.engine) DNNL_CHECK(dnnl_engine_create(&cache.engine, dnnl_cpu, 0));
    make_md(&e->a_md, k->M, k->K, k->ta, k->lda, dnnl_bf16);
    make_md(&e->b_md, k->K, k->N, k->tb, k->ldb, dnnl_bf16);
    make_md(&e->c_md, k->M, k->N, false, k->ldc, dnnl_f32);
    dnnl_matmul_desc_t desc;
    DNNL_CHECK(dnnl_matmul_desc_init(&desc, &e->a_md, &e->b_md, NULL, &e->c_md));
    dnnl_primitive_attr_t attr;
    DNNL_CHECK(dnnl_primitive_attr_create(&attr));
    DNNL_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (k->accumulate) {   // C += A B: a sum post-op
        dnnl_post_ops_t po;
        DNNL_CHECK(dnnl_post_ops_create(&po));
        DNNL_CHECK(dnnl_post_ops_append_sum(po, 1.0f));
        DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
        DNNL_CHECK(dnnl_post_ops_destroy(po));
    }
    dnnl_primitive_desc_t pd;
    DNNL_CHECK(dnnl_primitive_desc_create(&pd, &desc, attr, cache.engine, NULL));
    DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
    e->scratch_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    e->scratch_bytes = dnnl_memory_desc_get_size(&e->scratch_md);
    DNNL_CHECK(dnnl_primitive_create(&e->prim, pd));
    DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
}

static void entry_run(const MatmulEntry *e, const bf16 *A, const bf16 *B, float *C) {
    dnnl_memory_t a, b, c, s = NULL;
    DNNL_CHECK(dnnl_memory_create(&a, &e->a_md, cache.engine, (void *)A));
    DNNL_CHECK(dnnl_memory_create(&b, &e->b_md, cache.engine, (void *)B));
    DNNL_CHECK(dnnl_memory_create(&c, &e->c_md, cache.engine, C));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
    int nargs = 3;
    if (e->scratch_bytes) {
        DNNL_CHECK(dnnl_memory_create(&s, &e->scratch_md, cache.engine, thread_scratch(e->scratch_bytes)));
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, s};
    }
    // A stream per call: a stream is not to be shared between threads, and
    // making one is cheap (no queue on the CPU engine).
    dnnl_stream_t stream;
    DNNL_CHECK(dnnl_stream_create(&stream, cache.engine, dnnl_stream_default_flags));
    DNNL_CHECK(dnnl_primitive_execute(e->prim, stream, nargs, args));
    DNNL_CHECK(dnnl_stream_wait(stream));
    DNNL_CHECK(dnnl_stream_destroy(stream));
    dnnl_memory_destroy(a);
    dnnl_memory_destroy(b);
    dnnl_memory_destroy(c);
    if (s) dnnl_memory_destroy(s);
}

void onednn_gemm_bf16(bool ta, bool tb, int M, int N, int K, const bf16 *A, int lda, const bf16 *B, int ldb,
                      float beta, float *C, int ldc) {
    ASSERT(beta == 0 || beta == 1, "onednn_gemm_bf16: beta must be 0 or 1, got %g", (double)beta);
    if (M == 0 || N == 0) return;
    bool in_par = omp_in_parallel();
    bool small = (int64_t)M * N * K < ONE_THREAD_MACS && !in_par;
    MatmulKey key = {ta, tb, M, N, K, lda, ldb, ldc, beta != 0, in_par || small ? 1 : omp_get_max_threads()};
    ON_ONE_THREAD(small, {
        pthread_mutex_lock(&cache.lock);
        MatmulEntry *e = NULL;
        for (int i = 0; i < cache.n && !e; i++)
            if (!memcmp(&cache.entries[i].key, &key, sizeof key)) e = &cache.entries[i];
        MatmulEntry once;
        if (!e) {
            e = cache.n < CACHE_MAX ? &cache.entries[cache.n] : &once;
            e->key = key;
            entry_create(e);
            if (e != &once) cache.n++;
        }
        pthread_mutex_unlock(&cache.lock);
        entry_run(e, A, B, C);
        if (e == &once) dnnl_primitive_destroy(once.prim);
    });
}

void onednn_release(void) {
    pthread_mutex_lock(&cache.lock);
    for (int i = 0; i < cache.n; i++) dnnl_primitive_destroy(cache.entries[i].prim);
    cache.n = 0;
    if (cache.engine) dnnl_engine_destroy(cache.engine);
    cache.engine = NULL;
    pthread_mutex_unlock(&cache.lock);
    free(scratch.p);
    scratch.p = NULL;
    scratch.bytes = 0;
}

#else   // no oneDNN in this build

bool onednn_built(void) { return false; }
const char *onednn_isa_name(void) { return "none"; }
const char *onednn_version(void) { return "none"; }
bool onednn_has_bf16(void) { return false; }
void onednn_release(void) {}

void onednn_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                  int ldb, float beta, float *C, int ldc) {
    FAIL("onednn_sgemm: this build has no oneDNN");
}

void onednn_gemm_bf16(bool ta, bool tb, int M, int N, int K, const bf16 *A, int lda, const bf16 *B, int ldb,
                      float beta, float *C, int ldc) {
    FAIL("onednn_gemm_bf16: this build has no oneDNN");
}

#endif
