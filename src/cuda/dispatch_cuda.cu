// dispatch_cuda.cu: the GPU's DeviceKernels (device.h): the cu_* kernels of
// cuda_ops.h, each the twin of the CPU entry in src/autograd/device_kernels.c.
// Where a cu_* function takes other arguments than the table's, a few lines
// here adapt it; no kernel lives here.
#include "cuda_internal.cuh"
#include "device.h"
extern "C" {   // (docs.h has no C++ guard of its own)
#include "docs.h"
}

static void gpu_attn_prefix(Tape *tp, real *o, const real *q, const real *kc, const real *vc, int B, int max_T,
                            int pos, int T0, const int *key0, const int *key0_dev, int H, int dk, int dv,
                            double scale) {
    cu_attn_prefix_forward(o, q, kc, vc, B, max_T, pos, T0, key0, key0_dev, H, dk, dv, scale);
}

// The GPU's DSA kernels take docs.h's index of the documents, in device
// memory: made on the host, copied to tp's device arena (NULL: one document
// per row).
static const int *gpu_dsa_docs(Tape *tp, const int *doc_start, int B, int T) {
    const int *first_host = docs_first(tp, doc_start, B, T);
    if (!first_host) return NULL;
    int *first = (int *)tape_dalloc(tp, (size_t)B * T * sizeof(int));
    dev_from_host(first, DEVICE_CUDA, first_host, (size_t)B * T * sizeof(int));
    return first;
}

static void gpu_dsa_decode_select(Tape *tp, int *sel, real *scores, const real *qI, const real *w, const real *kIc,
                                  int B, int max_T, int n_keys, const int *start, const int *start_dev, int HI, int dI,
                                  int K, void *work) {
    cu_dsa_decode_select(tp, sel, scores, qI, w, kIc, B, max_T, n_keys, start_dev, HI, dI, K);
}

static void gpu_dsa_prefix_select(Tape *tp, int *sel, const real *qI, const real *w, const real *kIc, int B,
                                  int max_T, int pos, int T0, const int *start, const int *start_dev, int HI, int dI,
                                  int K) {
    cu_dsa_prefix_select(tp, sel, qI, w, kIc, B, max_T, pos, T0, start_dev, HI, dI, K);
}

// Field by field (C++17 has no designated initialisers): a new entry of
// DeviceKernels left out here stays NULL, and device_kernels' test on a GPU
// (tests/cuda) finds it.
static DeviceKernels gpu_kernels(void) {
    DeviceKernels k = {};
    k.attn_decode = cu_attn_decode;
    k.attn_prefix = gpu_attn_prefix;
    k.attn_step = cu_attn_step;
    k.attn_step_fits = cu_attn_step_fits;
    k.dsa_docs = gpu_dsa_docs;
    k.dsa_topk = cu_dsa_topk;
    k.dsa_index_select = cu_dsa_index_select;
    k.dsa_attn_target = cu_dsa_attn_target;
    k.dsa_sparse_target = cu_dsa_sparse_target;
    k.dsa_selected_mass = cu_dsa_selected_mass;
    k.dsa_decode_select = gpu_dsa_decode_select;
    k.dsa_decode_sparse = cu_dsa_decode_sparse;
    k.dsa_prefix_select = gpu_dsa_prefix_select;
    k.dsa_prefix_sparse = cu_dsa_prefix_sparse;
    k.adamw_update = cu_adamw_update;
    k.sgd_update = cu_sgd_update;
    k.scale = cu_scale_inplace;
    k.sumsq = cu_sumsq;
    k.first_nonfinite = cu_first_nonfinite;
    k.optim_queue = cu_optim_queue;
    return k;
}

extern "C" const DeviceKernels *cu_device_kernels(void) {
    static const DeviceKernels k = gpu_kernels();
    return &k;
}
