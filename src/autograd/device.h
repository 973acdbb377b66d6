// device.h: where a tape's tensors live: the CPU (always) or an NVIDIA GPU
// (builds with -DAG_CUDA=ON; docs/cuda.md).
//
// A Tape is on one device. On the GPU its tensors' data and gradients come
// from a device arena (one cudaMalloc'd block after the first step, like the
// host arena), its ops run the CUDA half of their OpDef on one stream, and
// only the nodes, the Tensor structs and the ops' host-side arguments stay
// in host memory. Nothing here synchronises except the copies to the host.
#ifndef AG_DEVICE_H
#define AG_DEVICE_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DEVICE_CPU = 0, DEVICE_CUDA = 1, DEVICE_COUNT } Device;

// True when the library was built with the CUDA backend.
bool device_cuda_built(void);
// True when a GPU can be used now (the backend is built and the driver finds
// a device); else false, with why in err. Initialises the backend (stream,
// cuBLAS handle) on first success.
bool device_cuda_init(char *err, size_t n);
// Before device_cuda_init: which GPU of the machine it takes (default 0; the
// GPU ranks of one machine take one each, by local rank).
void device_cuda_choose(int ordinal);
// One line about the GPU for logs ("NVIDIA H200, 132 SMs, 139.8 GiB, CUDA 13.0").
const char *device_describe(Device d);
const char *device_name(Device d);            // "cpu", "cuda"
int device_parse(const char *name);           // -1 when unknown
// Where the library's own checks run (gradcheck): the environment variable
// AG_DEVICE ("cpu", the default when unset or empty, or "cuda"), read once.
// An unknown name, or cuda where the backend is not built or finds no GPU,
// stops with a message naming the value.
Device device_default(void);

// Memory on a device. dev_alloc is 256-byte aligned on the GPU, 64 on the CPU;
// it stops with a message naming the size when the memory is not there.
void *dev_alloc(Device d, size_t bytes);
void dev_free(Device d, void *p);
void dev_zero(Device d, void *p, size_t bytes);                  // asynchronous on the GPU
// Copies between the host and a device. To the host: waits for the stream.
void dev_to_host(void *dst, const void *src, size_t bytes, Device src_dev);
void dev_from_host(void *dst, Device dst_dev, const void *src, size_t bytes);
// Within one device (regions must not overlap; asynchronous on the GPU):
// bytes from src to dst, and `height` rows of `width` bytes, row r from
// src + r * spitch to dst + r * dpitch.
void dev_copy(Device d, void *dst, const void *src, size_t bytes);
// True when p points into d's memory (on the CPU: always). Lets an op take
// an index array (a selection) from either side on a GPU tape.
bool dev_holds(Device d, const void *p);
void dev_copy2d(Device d, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height);
// dst[i] += src[i] for i < n, src in host memory, dst on the device (seeding
// a backward; float64 or float32 as `real`).
void dev_add_from_host(Device d, real *dst, const real *src, int64_t n);
// Fill with NaN (the float64 build's poison of fresh buffers).
void dev_fill_nan(Device d, real *p, int64_t n);
// CUDA graphs (docs/cuda.md "CUDA graphs"). dev_graph_new: NULL where a
// device has none (the CPU). Between begin and end the work queued on the
// device is recorded, not run; end returns false with the reason when the
// capture failed (a host read, a synchronisation, an allocation inside it),
// and the caller then runs the work eagerly. A launch runs the recorded work
// again; the bytes copied from the host are those of the capture, except the
// copies traced back to one of the n inputs bound at begin (host arrays of
// `bytes` each), which are read afresh from inputs[i] at each launch.
// dev_note_copy: an op's host copy `copy` of the caller's `src` (lets the
// capture trace a copy of `copy` to the input `src` lies in); a no-op unless
// capturing.
typedef struct CuGraph CuGraph;
CuGraph *dev_graph_new(Device d);
void dev_graph_free(CuGraph *g);
bool dev_graph_ready(const CuGraph *g);
void dev_graph_begin(CuGraph *g, const void *const *inputs, const size_t *bytes, int n);
bool dev_graph_end(CuGraph *g, char *why, size_t n);
void dev_graph_launch(CuGraph *g, const void *const *inputs);
int dev_graph_traced(const CuGraph *g);   // copies refreshed from the inputs at each launch
void dev_note_copy(const void *copy, const void *src, size_t bytes);
// The GPU's float32 products: strict IEEE (false, the default) or TF32 on
// the tensor cores (true: 10-bit mantissas in the products, float32 sums).
void device_set_tf32(Device d, bool on);
// The GPU's bf16 products (precision = bf16, float32 build only): op_matmul's
// rows-times-a-weight products (the dense layers') take operands rounded to
// bf16 (nearest, ties to even) on the tensor cores with float32 sums and
// outputs, as the CPU's bf16 products do (blas.h); its other forms stay
// float32. false (the default) turns them off.
void device_set_bf16(Device d, bool on);
// Wait for everything queued on the GPU; reports a kernel's failure (an
// illegal address, a launch error) with where it was noticed.
void dev_sync(Device d);

// The kernels that are not ops, one table per device, like an OpDef's pair:
// a caller takes its device's table once (device_kernels(tp->device)) and
// calls through it, so that layers and optimizers name no backend. The CPU
// table is device_kernels.c's (the CPU functions of src/layers and
// src/optim); the GPU's is src/cuda/dispatch_cuda.cu's (the cu_* functions
// of cuda_ops.h). Pointers are in d's memory unless an entry says "host".
typedef struct Tape Tape;

// An optimizer step queued as one stretch of device work with no host read
// (DeviceKernels.optim_queue; src/optim/optim_device.h drives it): the
// 1/accum scaling of the gradients, their sum of squares, the clipping at
// max_norm (its scale computed on the device), the update of every chunk
// of the table in one launch (skipped when the sum is not finite), and the
// finite check of the parameters and moments. The same kernels' arithmetic,
// element for element and in the reductions' order, as the eager entries
// (scale, sumsq, adamw_update, sgd_update, first_nonfinite) called one
// slice at a time. Everything that changes from step to step (the learning
// rate, the bias corrections) is read from `hyper` in device memory, so a
// graph of the queued work replays any step.
typedef struct DeviceOptimChunk {
    int64_t a, n;   // flat elements [a, a + n) of p and g
    real decay;     // the slice's weight decay
} DeviceOptimChunk;
typedef struct DeviceOptimStat {
    double sumsq;         // the gradients' sum of squares, after the 1/accum scaling, before clipping
    long long bad[3];     // the first non-finite index after the update of p, m, v (LLONG_MAX: none)
} DeviceOptimStat;
#define DEVICE_OPTIM_SCRATCH ((size_t)16384)   // bytes of the reductions' partials
typedef struct DeviceOptimStep {
    bool adamw;                        // AdamW; false: SGD with momentum
    real *p, *g, *m, *v;               // the flat blocks; m[i - lo], v[i - lo] for flat element i (v NULL: SGD)
    int64_t numel, lo, hi;             // p and g have numel elements; the moments cover [lo, hi)
    const DeviceOptimChunk *chunks;    // device table of n_chunks
    int n_chunks;
    bool scale_first;                  // scale g by inv_accum first
    real inv_accum;
    double max_norm;                   // clip to it when > 0
    real b1, b2, eps, mu;
    const real *hyper;                 // device: lr, 1 - b1^t, 1 - b2^t of this step
    void *scratch;                     // device: DEVICE_OPTIM_SCRATCH bytes
    DeviceOptimStat *stat;             // device: the step's figures
} DeviceOptimStep;

typedef struct DeviceKernels {
    // ---- decoding over a KV cache (attn, attn_dsa; attn_kernel.h) ----
    // attn_decode_forward and attn_prefix_forward. key0 (B): where each
    // row's document begins, on the host (NULL: 0); key0_dev: the same in
    // d's memory (the GPU reads it there). Scratch comes from tp.
    void (*attn_decode)(Tape *tp, real *o, const real *q, const real *kc, const real *vc, int B, int max_T,
                        int n_keys, const int *key0, const int *key0_dev, int H, int dk, int dv, double scale);
    void (*attn_prefix)(Tape *tp, real *o, const real *q, const real *kc, const real *vc, int B, int max_T, int pos,
                        int T0, const int *key0, const int *key0_dev, int H, int dk, int dv, double scale);
    // A decoding step of attn whose cache length lives in d's memory (*cnt),
    // so that a CUDA graph of it replays any step (lm_decode_graph.h): q, k
    // (B, 1, H*dk) before RoPE, v (B, 1, H*dv); q and k rotated at position
    // *cnt - key0_dev[b] (frequencies invf (dk/2), op_rope's bits), k and v
    // stored at slot *cnt, o (B, 1, H*dv) over the *cnt + 1 keys (the bits of
    // attn_decode), then *cnt advanced. Its launches are sized for the whole
    // cache (max_T), where attn_step_fits(max_T) (never on the CPU, whose
    // steps take the length from the host).
    void (*attn_step)(Tape *tp, real *o, const real *q, const real *k, const real *v, real *kc, real *vc, int *cnt,
                      const int *key0_dev, const double *invf, int B, int max_T, int H, int dk, int dv, double scale);
    bool (*attn_step_fits)(int max_T);
    // ---- DSA's selection and targets (attn_dsa; dsa_kernel.h, dsa_sel_kl.h) ----
    // The documents argument `docs` of the entries below, made from the
    // host's doc_start (B, T) or NULL: the CPU's kernels take doc_start
    // itself, the GPU's docs.h's index in its memory (from tp's arena).
    const int *(*dsa_docs)(Tape *tp, const int *doc_start, int B, int T);
    void (*dsa_topk)(int *sel, const real *Isc, int B, int T, int K, const int *docs);
    void (*dsa_index_select)(Tape *tp, int *sel, const real *qI, const real *kI, const real *w, int B, int T, int HI,
                             int dI, int K, const int *docs);
    void (*dsa_attn_target)(real *p, const real *q, const real *k, int B, int T, int H, int dk, double scale,
                            const int *docs);
    void (*dsa_sparse_target)(real *p, const real *q, const real *k, const int *sel, int B, int T, int K, int H,
                              int dk, double scale);
    // *out (one double, in d's memory) = dsa_selected_mass(p, sel, ...).
    void (*dsa_selected_mass)(double *out, const real *p, const int *sel, int B, int T, int K);
    // A decoding step's top-k: each row's indexer scores over its cached
    // keys, slots start[b] .. n_keys-1, and their top K into sel (B, K).
    // start on the host, start_dev in d's memory; scores: the cache's
    // buffer (the CPU's one row of max_T, the GPU's B rows); work: the CPU's
    // DSA_TOPK_WORK(max_T) bytes of top-k scratch (the GPU's comes from tp).
    void (*dsa_decode_select)(Tape *tp, int *sel, real *scores, const real *qI, const real *w, const real *kIc, int B,
                              int max_T, int n_keys, const int *start, const int *start_dev, int HI, int dI, int K,
                              void *work);
    void (*dsa_decode_sparse)(real *o, const real *q, const real *kc, const real *vc, int B, int max_T,
                              const int *sel, int K, int H, int dk, int dv, double scale);
    // A prefill window after cached keys: dsa_prefix_select, then every
    // query's dsa_sparse_decode over its selection (sel (B, T0, K)).
    void (*dsa_prefix_select)(Tape *tp, int *sel, const real *qI, const real *w, const real *kIc, int B, int max_T,
                              int pos, int T0, const int *start, const int *start_dev, int HI, int dI, int K);
    void (*dsa_prefix_sparse)(real *o, const real *q, const real *kc, const real *vc, int B, int T0, int max_T,
                              const int *sel, int K, int H, int dk, int dv, double scale);
    // ---- optimizers, clipping and finite checks (src/optim/; optim_kernels.h) ----
    // The elementwise updates of n elements (optim.h states them).
    void (*adamw_update)(real *p, const real *g, real *m, real *v, int64_t n, real lr, real decay, real b1, real b2,
                         real bc1, real bc2, real eps);
    void (*sgd_update)(real *p, const real *g, real *m, int64_t n, real lr, real decay, real mu);
    void (*scale)(real *x, int64_t n, real f);               // x *= f
    double (*sumsq)(const real *x, int64_t n);               // in double, the same for any thread count
    int64_t (*first_nonfinite)(const real *x, int64_t n);    // the first NaN or inf, -1 when none
    // The queued step above (the CPU: its loops, one after the other).
    void (*optim_queue)(const DeviceOptimStep *s);
} DeviceKernels;

// d's table; stops with a message naming d when this build has no kernels
// for it.
const DeviceKernels *device_kernels(Device d);

#ifdef __cplusplus
}
#endif
#endif
