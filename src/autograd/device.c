// device.c: the CPU half of device.h, and the door to the CUDA half
// (src/cuda/device_cuda.cu) in builds with AG_CUDA.
#include "device.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef AG_CUDA
#include "cuda_ops.h"
#endif

bool device_cuda_built(void) {
#ifdef AG_CUDA
    return true;
#else
    return false;
#endif
}

bool device_cuda_init(char *err, size_t n) {
#ifdef AG_CUDA
    return cu_init(err, n);
#else
    snprintf(err, n, "this build has no CUDA backend (configure with -DAG_CUDA=ON where nvcc is installed)");
    return false;
#endif
}

void device_cuda_choose(int ordinal) {
#ifdef AG_CUDA
    cu_choose(ordinal);
#else
    (void)ordinal;
#endif
}

const char *device_name(Device d) { return d == DEVICE_CUDA ? "cuda" : "cpu"; }

int device_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "cpu")) return DEVICE_CPU;
    if (!strcmp(name, "cuda")) return DEVICE_CUDA;
    return -1;
}

Device device_default(void) {
    static int chosen = -1;
    if (chosen >= 0) return (Device)chosen;
    const char *v = getenv("AG_DEVICE");
    int d = DEVICE_CPU;
    if (v && *v) {
        d = device_parse(v);
        ASSERT(d >= 0, "AG_DEVICE=%.64s: not a device (cpu or cuda)", v);
        if (d == DEVICE_CUDA) {
            char err[256];
            ASSERT(device_cuda_init(err, sizeof err), "AG_DEVICE=cuda: %s", err);
        }
    }
    chosen = d;
    return (Device)d;
}

const char *device_describe(Device d) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) return cu_describe();
#endif
    return d == DEVICE_CPU ? "cpu" : "cuda (not built)";
}

void *dev_alloc(Device d, size_t bytes) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) return cu_alloc(bytes);
#endif
    ASSERT(d == DEVICE_CPU, "dev_alloc: %s memory in a build without it", device_name(d));
    return xaligned(bytes);
}

void dev_free(Device d, void *p) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) {
        cu_free(p);
        return;
    }
#endif
    free(p);
}

void dev_zero(Device d, void *p, size_t bytes) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) {
        cu_zero(p, bytes);
        return;
    }
#endif
    memset(p, 0, bytes);
}

void dev_to_host(void *dst, const void *src, size_t bytes, Device src_dev) {
#ifdef AG_CUDA
    if (src_dev == DEVICE_CUDA) {
        cu_to_host(dst, src, bytes);
        return;
    }
#endif
    if (bytes) memcpy(dst, src, bytes);
}

void dev_from_host(void *dst, Device dst_dev, const void *src, size_t bytes) {
#ifdef AG_CUDA
    if (dst_dev == DEVICE_CUDA) {
        cu_from_host(dst, src, bytes);
        return;
    }
#endif
    if (bytes) memcpy(dst, src, bytes);
}

void dev_copy(Device d, void *dst, const void *src, size_t bytes) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) {
        cu_copy(dst, src, bytes);
        return;
    }
#endif
    if (bytes) memcpy(dst, src, bytes);
}

bool dev_holds(Device d, const void *p) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) return cu_holds(p);
#endif
    (void)p;
    return d == DEVICE_CPU;
}

void dev_copy2d(Device d, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) {
        cu_copy2d(dst, dpitch, src, spitch, width, height);
        return;
    }
#endif
    for (size_t r = 0; r < height && width; r++)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
}

void dev_add_from_host(Device d, real *dst, const real *src, int64_t n) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) {
        cu_add_from_host(dst, src, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

void dev_fill_nan(Device d, real *p, int64_t n) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) {
        cu_fill(p, n, (real)NAN);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) p[i] = (real)NAN;
}

void device_set_tf32(Device d, bool on) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) cu_set_tf32(on);
#endif
    (void)d;
    (void)on;
}

void device_set_bf16(Device d, bool on) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) cu_set_bf16(on);
#endif
    (void)d;
    (void)on;
}

void dev_sync(Device d) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) cu_sync("dev_sync");
#endif
    (void)d;
}

CuGraph *dev_graph_new(Device d) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) return cu_graph_new();
#endif
    (void)d;
    return NULL;
}

#ifdef AG_CUDA
void dev_graph_free(CuGraph *g) { cu_graph_free(g); }
bool dev_graph_ready(const CuGraph *g) { return cu_graph_ready(g); }
void dev_graph_begin(CuGraph *g, const void *const *inputs, const size_t *bytes, int n) {
    cu_graph_begin(g, inputs, bytes, n);
}
bool dev_graph_end(CuGraph *g, char *why, size_t n) { return cu_graph_end(g, why, n); }
void dev_graph_launch(CuGraph *g, const void *const *inputs) { cu_graph_launch(g, inputs); }
int dev_graph_traced(const CuGraph *g) { return cu_graph_traced(g); }
void dev_note_copy(const void *copy, const void *src, size_t bytes) { cu_note_copy(copy, src, bytes); }
#else
// No graph exists in a CPU build (dev_graph_new returns NULL): these are never reached with one.
void dev_graph_free(CuGraph *g) { (void)g; }
bool dev_graph_ready(const CuGraph *g) { (void)g; return false; }
void dev_graph_begin(CuGraph *g, const void *const *inputs, const size_t *bytes, int n) {
    (void)g, (void)inputs, (void)bytes, (void)n;
    FAIL("dev_graph_begin: this build has no CUDA backend");
}
bool dev_graph_end(CuGraph *g, char *why, size_t n) {
    (void)g;
    snprintf(why, n, "this build has no CUDA backend");
    return false;
}
void dev_graph_launch(CuGraph *g, const void *const *inputs) {
    (void)g, (void)inputs;
    FAIL("dev_graph_launch: this build has no CUDA backend");
}
int dev_graph_traced(const CuGraph *g) { (void)g; return 0; }
void dev_note_copy(const void *copy, const void *src, size_t bytes) { (void)copy, (void)src, (void)bytes; }
#endif
