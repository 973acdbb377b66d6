// graph_cuda.cu: CUDA graphs of a stretch of work queued on cu_stream
// (a training micro-batch's forward and backward, docs/cuda.md "CUDA
// graphs"). Capture records the kernels, copies and cuBLAS calls instead of
// running them; a replay runs them again with the same arguments, the same
// device addresses and the same bytes copied from the host, except the
// copies the capture traced back to a bound input (the batch's token ids and
// targets): those are refreshed from the caller's arrays before each launch.
//
// What would make a capture wrong stops it instead: a copy to the host, a
// synchronisation, a cudaMalloc or cudaFree, any failed call. The capture
// then ends as failed (cu_graph_end returns false with the first reason) and
// the caller runs the work eagerly; nothing is aborted while capturing.
#include <stdio.h>
#include <string.h>

#include "cuda_internal.cuh"

// Bytes of pinned host memory a graph's copies from the host may take (the
// ids, targets, documents' index, RoPE tables of one micro-batch: tens of KiB
// at the bundled shapes).
#define CU_GRAPH_POOL ((size_t)16 << 20)
#define CU_GRAPH_MAX_COPIES 4096
#define CU_GRAPH_MAX_ALIASES 64
#define CU_GRAPH_MAX_INPUTS 4

typedef struct {
    size_t at, bytes;   // where in the pool
    const void *src;    // the host bytes it was captured from
    int input;          // the bound input it is refreshed from (-1: constant)
    size_t in_off;      // at this byte offset of the input
} GraphCopy;

struct CuGraph {
    cudaGraphExec_t exec;
    cudaEvent_t done;
    bool launched;
    unsigned char *pool;
    size_t pool_at;
    GraphCopy copy[CU_GRAPH_MAX_COPIES];
    int n_copy;
    const void *in[CU_GRAPH_MAX_INPUTS];
    size_t in_bytes[CU_GRAPH_MAX_INPUTS];
    int n_in;
};

// Host copies of a bound input (an op's own copy of the ids it was given),
// noted while capturing: lets a copy from the host be traced to the input.
typedef struct {
    const void *copy, *src;
    size_t bytes;
} GraphAlias;

bool cu_capturing;
static CuGraph *cap;   // the graph being captured (cu_capturing)
static char cap_why[200];
static GraphAlias alias[CU_GRAPH_MAX_ALIASES];
static int n_alias;

extern "C" bool cu_capture_absorb(const char *what, const char *err) {
    if (!cu_capturing) return false;
    if (!cap_why[0]) snprintf(cap_why, sizeof cap_why, "%s: %s", what, err);
    return true;
}

extern "C" CuGraph *cu_graph_new(void) {
    CuGraph *g = (CuGraph *)calloc(1, sizeof *g);
    ASSERT(g, "out of memory for a CUDA graph");
    CU_CHECK(cudaMallocHost((void **)&g->pool, CU_GRAPH_POOL));
    CU_CHECK(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming));
    return g;
}

static void graph_drop(CuGraph *g) {
    if (g->launched) CU_CHECK(cudaEventSynchronize(g->done));   // the pool is read until then
    if (g->exec) CU_CHECK(cudaGraphExecDestroy(g->exec));
    g->exec = NULL;
    g->launched = false;
}

extern "C" void cu_graph_free(CuGraph *g) {
    if (!g) return;
    graph_drop(g);
    CU_CHECK(cudaEventDestroy(g->done));
    CU_CHECK(cudaFreeHost(g->pool));
    free(g);
}

extern "C" bool cu_graph_ready(const CuGraph *g) { return g && g->exec; }

extern "C" void cu_graph_begin(CuGraph *g, const void *const *inputs, const size_t *bytes, int n) {
    ASSERT(!cu_capturing, "cu_graph_begin: a capture is already open");
    ASSERT(n <= CU_GRAPH_MAX_INPUTS, "cu_graph_begin: %d inputs, at most %d", n, CU_GRAPH_MAX_INPUTS);
    graph_drop(g);
    cu_sync("before a graph capture");   // the pool and the pinned ring are free
    g->pool_at = 0;
    g->n_copy = 0;
    g->n_in = n;
    for (int i = 0; i < n; i++) g->in[i] = inputs[i], g->in_bytes[i] = bytes[i];
    n_alias = 0;
    cap_why[0] = 0;
    cap = g;
    cu_capturing = true;
    cudaError_t e = cudaStreamBeginCapture(cu_stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) cu_capture_absorb("cudaStreamBeginCapture", cudaGetErrorString(e));
}

extern "C" void cu_note_copy(const void *copy, const void *src, size_t bytes) {
    if (!cu_capturing || !bytes) return;
    if (n_alias == CU_GRAPH_MAX_ALIASES) {
        cu_capture_absorb("the capture's input copies", "more than the table holds");
        return;
    }
    alias[n_alias++] = (GraphAlias){copy, src, bytes};
}

// Whether [p, p + n) lies within [base, base + size); the offset if so.
static bool within(const void *p, size_t n, const void *base, size_t size, size_t *off) {
    const unsigned char *a = (const unsigned char *)p, *b = (const unsigned char *)base;
    if (a < b || a + n > b + size) return false;
    *off = (size_t)(a - b);
    return true;
}

// Trace a copy's source through the noted aliases to a bound input.
static void graph_trace(CuGraph *g, GraphCopy *c) {
    c->input = -1;
    const void *src = c->src;
    size_t off = 0;
    for (int k = 0; k < n_alias; k++)
        if (within(src, c->bytes, alias[k].copy, alias[k].bytes, &off)) {
            src = (const unsigned char *)alias[k].src + off;
            break;
        }
    for (int i = 0; i < g->n_in; i++)
        if (within(src, c->bytes, g->in[i], g->in_bytes[i], &off)) {
            c->input = i;
            c->in_off = off;
            return;
        }
}

// While capturing: the pinned bytes a copy from the host reads (its own
// place in the graph's pool, kept for every replay); NULL when the pool is full.
extern "C" void *cu_capture_stage(const void *src, size_t bytes) {
    CuGraph *g = cap;
    size_t need = (bytes + 255) & ~(size_t)255;
    if (g->n_copy == CU_GRAPH_MAX_COPIES || g->pool_at + need > CU_GRAPH_POOL) {
        cu_capture_absorb("copies from the host", "more than a graph's pool holds");
        return NULL;
    }
    GraphCopy *c = &g->copy[g->n_copy++];
    *c = (GraphCopy){g->pool_at, bytes, src, -1, 0};
    g->pool_at += need;
    memcpy(g->pool + c->at, src, bytes);
    graph_trace(g, c);
    return g->pool + c->at;
}

extern "C" bool cu_graph_end(CuGraph *g, char *why, size_t n) {
    ASSERT(cu_capturing && cap == g, "cu_graph_end without cu_graph_begin");
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(cu_stream, &graph);
    cu_capturing = false;
    cap = NULL;
    if (e != cudaSuccess && !cap_why[0]) snprintf(cap_why, sizeof cap_why, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
    if (!cap_why[0]) {
        e = cudaGraphInstantiate(&g->exec, graph, 0);
        if (e != cudaSuccess) {
            g->exec = NULL;
            snprintf(cap_why, sizeof cap_why, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
        }
    }
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();   // a failed capture's errors are reported here, not later
    snprintf(why, n, "%s", cap_why);
    return cap_why[0] == 0;
}

extern "C" void cu_graph_launch(CuGraph *g, const void *const *inputs) {
    ASSERT(g->exec, "cu_graph_launch: no graph captured");
    if (g->launched) CU_CHECK(cudaEventSynchronize(g->done));   // the last launch has read the pool
    for (int i = 0; i < g->n_copy; i++) {
        const GraphCopy *c = &g->copy[i];
        if (c->input >= 0) memcpy(g->pool + c->at, (const unsigned char *)inputs[c->input] + c->in_off, c->bytes);
    }
    CU_CHECK(cudaGraphLaunch(g->exec, cu_stream));
    CU_CHECK(cudaEventRecord(g->done, cu_stream));
    g->launched = true;
}

extern "C" int cu_graph_traced(const CuGraph *g) {
    int n = 0;
    for (int i = 0; i < g->n_copy; i++) n += g->copy[i].input >= 0;
    return n;
}
