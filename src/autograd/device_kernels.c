// device_kernels.c: device_kernels() (device.h) and the CPU's table. Like
// mixer.c's list of kinds, the table names the CPU functions of the layers
// and optimizers (attn_kernel.h, dsa_kernel.h, dsa_sel_kl.h,
// optim_kernels.h), and they do not call back into it; the few entries whose
// CPU function takes other arguments than the table's are adapted here. The
// GPU's table is src/cuda/dispatch_cuda.cu's.
#include "device.h"

#include "attn_kernel.h"
#include "dsa_kernel.h"
#include "dsa_sel_kl.h"
#include "optim_kernels.h"
#ifdef AG_CUDA
#include "cuda_ops.h"
#endif

static void cpu_attn_decode(Tape *tp, real *o, const real *q, const real *kc, const real *vc, int B, int max_T,
                            int n_keys, const int *key0, const int *key0_dev, int H, int dk, int dv, double scale) {
    attn_decode_forward(o, q, kc, vc, B, max_T, n_keys, key0, H, dk, dv, scale);
}

static void cpu_attn_prefix(Tape *tp, real *o, const real *q, const real *kc, const real *vc, int B, int max_T,
                            int pos, int T0, const int *key0, const int *key0_dev, int H, int dk, int dv,
                            double scale) {
    attn_prefix_forward(tp, o, q, kc, vc, B, max_T, pos, T0, key0, H, dk, dv, scale);
}

// The CPU's DSA kernels read the documents from doc_start themselves.
static const int *cpu_dsa_docs(Tape *tp, const int *doc_start, int B, int T) { return doc_start; }

static void cpu_dsa_index_select(Tape *tp, int *sel, const real *qI, const real *kI, const real *w, int B, int T,
                                 int HI, int dI, int K, const int *docs) {
    dsa_index_select(sel, qI, kI, w, B, T, HI, dI, K, docs);
}

static void cpu_dsa_selected_mass(double *out, const real *p, const int *sel, int B, int T, int K) {
    *out = dsa_selected_mass(p, sel, B, T, K);
}

// Row by row, each row's scores into the one row of scores the CPU cache
// keeps, at the slots of its document.
static void cpu_dsa_decode_select(Tape *tp, int *sel, real *scores, const real *qI, const real *w, const real *kIc,
                                  int B, int max_T, int n_keys, const int *start, const int *start_dev, int HI, int dI,
                                  int K, void *work) {
    for (int b = 0; b < B; b++) {   // the keys of row b's document: slots start[b] .. n_keys - 1
        int s0 = start[b];
        dsa_index_row(scores + s0, qI + (int64_t)b * HI * dI, w + (int64_t)b * HI,
                      kIc + ((int64_t)b * max_T + s0) * dI, dI, n_keys - s0, HI, dI);
        dsa_topk_from(sel + (int64_t)b * K, scores, s0, n_keys, K, work);
    }
}

static void cpu_dsa_prefix_select(Tape *tp, int *sel, const real *qI, const real *w, const real *kIc, int B,
                                  int max_T, int pos, int T0, const int *start, const int *start_dev, int HI, int dI,
                                  int K) {
    dsa_prefix_select(sel, qI, w, kIc, B, max_T, pos, T0, start, HI, dI, K);
}

// The window's queries in parallel, each a decoding step's sparse attention.
static void cpu_dsa_prefix_sparse(real *o, const real *q, const real *kc, const real *vc, int B, int T0, int max_T,
                                  const int *sel, int K, int H, int dk, int dv, double scale) {
    int ldq = H * dk, ldv = H * dv;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T0; t++) {
            int64_t r = (int64_t)b * T0 + t;
            dsa_sparse_decode(o + r * ldv, q + r * ldq, kc + (int64_t)b * max_T * ldq, vc + (int64_t)b * max_T * ldv,
                              1, max_T, sel + r * K, K, H, dk, dv, scale);
        }
}

// The CPU keeps its caches' lengths on the host (attn's steps take them from
// there): attn_step is never called on it.
static bool cpu_attn_step_fits(int max_T) {
    (void)max_T;
    return false;
}

static void cpu_attn_step(Tape *tp, real *o, const real *q, const real *k, const real *v, real *kc, real *vc, int *cnt,
                          const int *key0_dev, const double *invf, int B, int max_T, int H, int dk, int dv,
                          double scale) {
    (void)tp, (void)o, (void)q, (void)k, (void)v, (void)kc, (void)vc, (void)cnt, (void)key0_dev, (void)invf;
    (void)B, (void)H, (void)dk, (void)dv, (void)scale;
    FAIL("attn_step on the CPU (a cache of %d positions): its attn_step_fits is false", max_T);
}

static const DeviceKernels CPU_KERNELS = {
    .attn_decode = cpu_attn_decode,
    .attn_prefix = cpu_attn_prefix,
    .attn_step = cpu_attn_step,
    .attn_step_fits = cpu_attn_step_fits,
    .dsa_docs = cpu_dsa_docs,
    .dsa_topk = dsa_topk,
    .dsa_index_select = cpu_dsa_index_select,
    .dsa_attn_target = dsa_attn_target,
    .dsa_sparse_target = dsa_sparse_target,
    .dsa_selected_mass = cpu_dsa_selected_mass,
    .dsa_decode_select = cpu_dsa_decode_select,
    .dsa_decode_sparse = dsa_sparse_decode,
    .dsa_prefix_select = cpu_dsa_prefix_select,
    .dsa_prefix_sparse = cpu_dsa_prefix_sparse,
    .adamw_update = optim_cpu_adamw_update,
    .sgd_update = optim_cpu_sgd_update,
    .scale = optim_cpu_scale,
    .sumsq = optim_cpu_sumsq,
    .first_nonfinite = optim_cpu_first_nonfinite,
    .optim_queue = optim_cpu_queue,
};

const DeviceKernels *device_kernels(Device d) {
#ifdef AG_CUDA
    if (d == DEVICE_CUDA) return cu_device_kernels();
#endif
    ASSERT(d == DEVICE_CPU, "device_kernels: %s kernels in a build without them", device_name(d));
    return &CPU_KERNELS;
}
