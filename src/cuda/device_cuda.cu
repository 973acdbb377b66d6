// device_cuda.cu: the GPU runtime of device.h: one device, one stream, one
// cuBLAS handle, and the copies and fills the tape needs.
#include <stdio.h>
#include <string.h>

#include "cuda_internal.cuh"

cudaStream_t cu_stream;
cublasHandle_t cu_blas;
static bool cu_ready;
static char cu_desc[256];
static int cu_ordinal;   // the GPU this process uses (cu_choose; one per rank under mpirun)

// A device buffer for host data on its way in (dev_add_from_host's seeds),
// grown as needed; used in stream order only.
static real *cu_stage;
static int64_t cu_stage_n;

// A copy from pageable host memory makes cudaMemcpyAsync wait for the
// stream first, so every small one (token ids, RoPE frequencies, document
// flags: several per decoded token) used to stall the host until the GPU
// had caught up. Copies up to CU_PIN_MAX bytes go through a ring of pinned
// host memory instead: memcpy into it, then a copy the stream runs when it
// gets there. A byte of the ring is written again only after the stream has
// passed every copy queued before: when the ring is full the host waits for
// the stream once and starts again at 0 (so does every cu_sync).
#define CU_PIN_BYTES ((size_t)8 << 20)
#define CU_PIN_MAX ((size_t)256 << 10)
static unsigned char *cu_pin;
static size_t cu_pin_at;
#define CU_BLAS_WS ((size_t)32 << 20)
static void *cu_blas_ws;

extern "C" bool cu_init(char *err, size_t n) {
    if (cu_ready) return true;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(err, n, "no CUDA device found (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
        return false;
    }
    if (cu_ordinal >= count) {
        snprintf(err, n, "GPU %d asked for, and this machine shows %d (one GPU per rank: at most %d rank%s here)",
                 cu_ordinal, count, count, count == 1 ? "" : "s");
        return false;
    }
    cudaDeviceProp p;
    CU_CHECK(cudaGetDeviceProperties(&p, cu_ordinal));
    if (p.major < 9) {
        snprintf(err, n, "%s is compute capability %d.%d; this build targets Hopper (sm_90a)", p.name, p.major,
                 p.minor);
        return false;
    }
    CU_CHECK(cudaSetDevice(cu_ordinal));
    CU_CHECK(cudaStreamCreateWithFlags(&cu_stream, cudaStreamNonBlocking));
    CU_CHECK(cudaMallocHost((void **)&cu_pin, CU_PIN_BYTES));
    cu_pin_at = 0;
    CUBLAS_CHECK(cublasCreate(&cu_blas));
    CUBLAS_CHECK(cublasSetStream(cu_blas, cu_stream));
    // A fixed workspace (the size cuBLAS recommends for Hopper), set after
    // cublasSetStream (which resets it): cuBLAS then allocates nothing per
    // call, which a captured CUDA graph requires, and every product of eager
    // and captured steps has the same workspace to choose its kernels by.
    CU_CHECK(cudaMalloc(&cu_blas_ws, CU_BLAS_WS));
    CUBLAS_CHECK(cublasSetWorkspace(cu_blas, cu_blas_ws, CU_BLAS_WS));
    // Strict IEEE float32 products unless a caller asks for TF32 (docs/cuda.md).
    CUBLAS_CHECK(cublasSetMathMode(cu_blas, CUBLAS_PEDANTIC_MATH));
    int rt = 0;
    cudaRuntimeGetVersion(&rt);
    snprintf(cu_desc, sizeof cu_desc, "%.120s, %d SMs, %.1f GiB, CUDA runtime %d.%d", p.name, p.multiProcessorCount,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), rt / 1000, (rt % 1000) / 10);
    cu_ready = true;
    return true;
}

extern "C" void cu_choose(int ordinal) {
    ASSERT(!cu_ready || ordinal == cu_ordinal, "cu_choose(%d) after GPU %d was set up", ordinal, cu_ordinal);
    cu_ordinal = ordinal;
}

extern "C" void *cu_stream_handle(void) { return cu_stream; }

extern "C" const char *cu_describe(void) { return cu_ready ? cu_desc : "cuda (not initialised)"; }

extern "C" void *cu_alloc(size_t bytes) {
    ASSERT(cu_ready, "GPU memory asked for before device_cuda_init");
    void *p = NULL;
    // A graph's addresses must stay the ones of the settled arena.
    if (cu_capture_absorb("cudaMalloc", "memory allocated while capturing (the arena grew)")) return NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        FAIL("out of GPU memory allocating %zu bytes (%zu of %zu free): %s", bytes, free_b, total_b,
             cudaGetErrorString(e));
    }
    return p;
}

extern "C" void cu_free(void *p) {
    if (!p) return;
    if (cu_capture_absorb("cudaFree", "memory freed while capturing")) return;   // (kept: a small leak once)
    CU_CHECK(cudaFree(p));
}

extern "C" void cu_zero(void *p, size_t bytes) {
    if (bytes) CU_CHECK(cudaMemsetAsync(p, 0, bytes, cu_stream));
}

extern "C" void cu_to_host(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (cu_capture_absorb("a copy to the host", "a host read inside the captured work")) {
        memset(dst, 0, bytes);   // the capture is void; the work runs eagerly after it
        return;
    }
    CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cu_stream));
    cu_sync("a copy to the host");
}

extern "C" bool cu_holds(const void *p) {
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        (void)cudaGetLastError();   // an unregistered host pointer on old drivers: not an error to keep
        return false;
    }
    return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

extern "C" void cu_from_host(void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (cu_capturing) {   // from the graph's own pinned bytes, kept for its replays
        void *p = cu_capture_stage(src, bytes);
        if (p) CU_CHECK(cudaMemcpyAsync(dst, p, bytes, cudaMemcpyHostToDevice, cu_stream));
        return;
    }
    if (bytes <= CU_PIN_MAX) {
        size_t need = (bytes + 255) & ~(size_t)255;
        if (cu_pin_at + need > CU_PIN_BYTES) cu_sync("the pinned copy ring");   // resets cu_pin_at
        unsigned char *p = cu_pin + cu_pin_at;
        cu_pin_at += need;
        memcpy(p, src, bytes);   // the caller may reuse src at once
        CU_CHECK(cudaMemcpyAsync(dst, p, bytes, cudaMemcpyHostToDevice, cu_stream));
        return;
    }
    // From pageable memory the call returns once src has been read, so the
    // caller may reuse src at once.
    CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cu_stream));
}

extern "C" void cu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cu_stream));
}

extern "C" void cu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height) {
    if (width && height)
        CU_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDeviceToDevice, cu_stream));
}

__global__ void k_add(real *dst, const real *src, int64_t n) {
    CU_FOR(i, n) dst[i] += src[i];
}

extern "C" void cu_add_from_host(real *dst, const real *src, int64_t n) {
    if (n <= 0) return;
    if (n > cu_stage_n) {
        if (cu_capture_absorb("the seed buffer", "grown while capturing")) return;
        if (cu_stage) CU_CHECK(cudaFree(cu_stage));   // synchronises: no kernel still reads it
        cu_stage = (real *)cu_alloc((size_t)n * sizeof(real));
        cu_stage_n = n;
    }
    cu_from_host(cu_stage, src, (size_t)n * sizeof(real));
    k_add<<<cu_grid(n), CU_THREADS, 0, cu_stream>>>(dst, cu_stage, n);
    CU_LAUNCHED();
}

__global__ void k_fill(real *p, int64_t n, real v) {
    CU_FOR(i, n) p[i] = v;
}

extern "C" void cu_fill(real *p, int64_t n, real v) {
    if (n <= 0) return;
    k_fill<<<cu_grid(n), CU_THREADS, 0, cu_stream>>>(p, n, v);
    CU_LAUNCHED();
}

extern "C" void cu_set_tf32(bool on) {
    CUBLAS_CHECK(cublasSetMathMode(cu_blas, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
}

extern "C" void cu_sync(const char *where) {
    if (cu_capture_absorb("a synchronisation", where)) return;
    cudaError_t e = cudaStreamSynchronize(cu_stream);
    if (e != cudaSuccess)
        FAIL("CUDA: a kernel failed (noticed at %s): %s (%s)", where, cudaGetErrorString(e), cudaGetErrorName(e));
    cu_pin_at = 0;   // every queued copy has read its bytes
}
