// cuda_ops.h: the CUDA half of the op table (src/cuda/*.cu, built with
// -DAG_CUDA=ON) and of device.h. Private to the library.
//
// An op file names its GPU pair in its OpDef as CUDA_PAIR(cu_x_forward,
// cu_x_backward): in a CPU-only build the pair is NULL, NULL and the names
// need not exist. Each GPU function reads the same Node fields (iarg, farg,
// aux, saved) as its CPU twin, with tensor data and grads in device memory
// (aux stays in host memory: the GPU function copies what it needs).
#ifndef AG_CUDA_OPS_H
#define AG_CUDA_OPS_H

#include "tape.h"

#ifdef AG_CUDA
#define CUDA_PAIR(f, b) f, b
#else
#define CUDA_PAIR(f, b) NULL, NULL
#endif

#ifdef __cplusplus
extern "C" {
#endif

#ifdef AG_CUDA
// ---- runtime (src/cuda/device_cuda.cu) ----
bool cu_init(char *err, size_t n);
void cu_choose(int ordinal);    // before cu_init: the device it sets up (default 0)
void *cu_stream_handle(void);   // the library's one stream (a cudaStream_t), for work ordered against it
const char *cu_describe(void);
void *cu_alloc(size_t bytes);
void cu_free(void *p);
void cu_zero(void *p, size_t bytes);
void cu_to_host(void *dst, const void *src, size_t bytes);
void cu_from_host(void *dst, const void *src, size_t bytes);
// Device to device, queued on the stream (regions must not overlap).
void cu_copy(void *dst, const void *src, size_t bytes);
bool cu_holds(const void *p);   // p is device (or managed) memory
void cu_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height);
void cu_add_from_host(real *dst, const real *src, int64_t n);
void cu_fill(real *p, int64_t n, real v);
void cu_sync(const char *where);
void cu_set_tf32(bool on);
void cu_set_bf16(bool on);   // src/cuda/ops_matmul.cu (device_set_bf16)
bool cu_bf16_products(void);   // whether it is on (attention's and op_gdn's tile products follow it)
// Bytes of op_gdn's per-chunk workspace that its last forward (or backward)
// kept in shared memory (ATTNLAB_GDN_WS=backward, the default: the
// backward's chunk kernel; =shared: every per-chunk kernel; =global: none;
// the same results bit for bit, src/cuda/gdn_chunk.cuh).
size_t cu_gdn_ws_shared_last(bool backward);
// Bytes of shared memory into which the last backward's chunk kernel copied
// each chunk's k, q, v and dO rows (0: it read them in place; gdn_chunk_backward.cu).
size_t cu_gdn_in_shared_last(void);
// How many kernels of src/cuda/gdn_chunk64.cu op_gdn launched since the
// start (bf16, heads of 64, chunks of at most 64; ATTNLAB_GDN_CHUNK64=off: none).
int cu_gdn_chunk64_launches(void);
// ---- CUDA graphs (src/cuda/graph_cuda.cu; device.h's dev_graph_*) ----
CuGraph *cu_graph_new(void);
void cu_graph_free(CuGraph *g);
bool cu_graph_ready(const CuGraph *g);
void cu_graph_begin(CuGraph *g, const void *const *inputs, const size_t *bytes, int n);
bool cu_graph_end(CuGraph *g, char *why, size_t n);
void cu_graph_launch(CuGraph *g, const void *const *inputs);
int cu_graph_traced(const CuGraph *g);
void cu_note_copy(const void *copy, const void *src, size_t bytes);
// The GPU's DeviceKernels (device.h), the cu_* below (src/cuda/dispatch_cuda.cu).
const DeviceKernels *cu_device_kernels(void);

// ---- decoding (src/cuda/attn_decode.cu): attn_decode_forward's GPU twin.
// key0: (B) on the host (checked), key0_dev: the same on the GPU. Scratch
// from tp's device arena.
void cu_attn_decode(Tape *tp, real *o, const real *q, const real *kc, const real *vc, int B, int max_T, int n_keys,
                    const int *key0, const int *key0_dev, int H, int dk, int dv, double scale);
// device.h's DeviceKernels.attn_step and attn_step_fits.
void cu_attn_step(Tape *tp, real *o, const real *q, const real *k, const real *v, real *kc, real *vc, int *cnt,
                  const int *key0_dev, const double *invf, int B, int max_T, int H, int dk, int dv, double scale);
bool cu_attn_step_fits(int max_T);

// ---- prefill (src/cuda/attn_flash.cu): attn_prefix_forward's GPU twin,
// key0 and key0_dev as cu_attn_decode's. q, o: (B, T0, H*dk / H*dv).
void cu_attn_prefix_forward(real *o, const real *q, const real *kc, const real *vc, int B, int max_T, int pos, int T0,
                            const int *key0, const int *key0_dev, int H, int dk, int dv, double scale);

// ---- ops (src/cuda/ops_*.cu), named after their CPU twins ----
void cu_matmul_forward(Node *n);        // ops_matmul.cu (cuBLAS)
void cu_matmul_backward(Node *n);
void cu_ew_forward(Node *n);            // ops_elementwise.cu: add, sub, mul
void cu_ew_backward(Node *n);
void cu_scale_forward(Node *n);
void cu_scale_backward(Node *n);
void cu_unary_forward(Node *n);         // ops_unary.cu
void cu_unary_backward(Node *n);
void cu_silu_mul_forward(Node *n);
void cu_silu_mul_backward(Node *n);
void cu_reduce_forward(Node *n);        // ops_reduce.cu: sum, mean
void cu_reduce_backward(Node *n);
void cu_rmsnorm_forward(Node *n);       // ops_norm.cu
void cu_rmsnorm_backward(Node *n);
void cu_add_rmsnorm_forward(Node *n);
void cu_add_rmsnorm_backward(Node *n);
void cu_rms_gate_forward(Node *n);
void cu_rms_gate_backward(Node *n);
void cu_l2norm_forward(Node *n);
void cu_l2norm_backward(Node *n);
void cu_rope_forward(Node *n);          // ops_rope.cu
void cu_rope_backward(Node *n);
void cu_conv_forward(Node *n);          // ops_conv.cu
void cu_conv_backward(Node *n);
void cu_embedding_forward(Node *n);     // ops_embed.cu
void cu_embedding_backward(Node *n);
void cu_softmax_forward(Node *n);       // ops_loss.cu
void cu_softmax_backward(Node *n);
void cu_ce_forward(Node *n);
void cu_ce_backward(Node *n);
void cu_reshape_forward(Node *n);       // ops_shape.cu
void cu_reshape_backward(Node *n);
void cu_transpose_forward(Node *n);
void cu_transpose_backward(Node *n);
void cu_slice_forward(Node *n);
void cu_slice_backward(Node *n);
void cu_concat_forward(Node *n);
void cu_concat_backward(Node *n);
// ---- optimizers (src/cuda/optim.cu): the loops of src/optim/ on device blocks ----
void cu_adamw_update(real *p, const real *g, real *m, real *v, int64_t n, real lr, real decay, real b1, real b2,
                     real bc1, real bc2, real eps);
void cu_sgd_update(real *p, const real *g, real *m, int64_t n, real lr, real decay, real mu);
void cu_scale_inplace(real *x, int64_t n, real f);
double cu_sumsq(const real *x, int64_t n);            // sum of squares in double; waits for the result
int64_t cu_first_nonfinite(const real *x, int64_t n); // first NaN/inf index, -1 if none; waits
void cu_optim_queue(const DeviceOptimStep *s);         // device.h's DeviceOptimStep; no host read
// ---- mixers (src/cuda/<layer>.cu) ----
void cu_gla_forward(Node *n);           // gla.cu: op_gla_dt (linear, mamba), every form
void cu_gla_backward(Node *n);
void cu_gdn_chunk_forward(Node *n);     // gdn_chunk.cu / gdn_chunk_backward.cu: op_gdn, chunked form
void cu_gdn_chunk_backward(Node *n);
void cu_gdn_naive_forward(Node *n);     // gdn_naive.cu: op_gdn, recurrent form
void cu_gdn_naive_backward(Node *n);
void cu_kda_chunk_forward(Node *n);     // kda_chunk.cu / kda_chunk_backward.cu: op_kda, chunked form
void cu_kda_chunk_backward(Node *n);
void cu_kda_naive_forward(Node *n);     // kda_naive.cu: op_kda, recurrent form
void cu_kda_naive_backward(Node *n);
void cu_flash_forward(Node *n);         // attn_flash.cu / attn_flash_backward.cu: op_attention (tiled, O(T) memory)
void cu_flash_backward(Node *n);
void cu_naive_attn_forward(Node *n);    // attn_naive.cu: op_attention_naive (the masked-parallel reference)
void cu_naive_attn_backward(Node *n);
// ---- DSA (src/cuda/dsa_index.cu, dsa_topk.cu, dsa_sparse.cu, dsa_sel_kl.cu): the ops of dsa_kernel.h and
// dsa_sel_kl.h, and the layer's selection and targets on the device. first:
// docs.h's index (B*T) in device memory, or NULL; sel (B, T, K) in device memory.
void cu_dsa_index_forward(Node *n);     // op_dsa_index_scores
void cu_dsa_index_backward(Node *n);
void cu_dsa_kl_forward(Node *n);        // op_dsa_kl
void cu_dsa_kl_backward(Node *n);
void cu_sparse_forward(Node *n);        // op_sparse_attention
void cu_sparse_backward(Node *n);
void cu_sel_kl_forward(Node *n);        // op_dsa_sel_kl
void cu_sel_kl_backward(Node *n);
void cu_dsa_topk(int *sel, const real *Isc, int B, int T, int K, const int *first);
void cu_dsa_index_select(Tape *tp, int *sel, const real *qI, const real *kI, const real *w, int B, int T, int HI,
                         int dI, int K, const int *first);
void cu_dsa_attn_target(real *p, const real *q, const real *k, int B, int T, int H, int dk, double scale,
                        const int *first);
void cu_dsa_sparse_target(real *p, const real *q, const real *k, const int *sel, int B, int T, int K, int H, int dk,
                          double scale);
// *out (one double, device memory) = dsa_selected_mass(p, sel, ...).
void cu_dsa_selected_mass(double *out, const real *p, const int *sel, int B, int T, int K);
// Decoding (attn_dsa's step on a GPU cache): each row's indexer scores over
// its cached keys, slots start[b] .. n_keys-1 (start: (B) on the device), into
// scores (B, max_T), and their top K into sel (B, K); then the sparse
// attention of one query per row over those slots (dsa_sparse_decode).
// Scratch for the top-k of long rows comes from tp.
void cu_dsa_decode_select(Tape *tp, int *sel, real *scores, const real *qI, const real *w, const real *kIc, int B,
                          int max_T, int n_keys, const int *start, int HI, int dI, int K);
void cu_dsa_decode_sparse(real *o, const real *q, const real *kc, const real *vc, int B, int max_T, const int *sel,
                          int K, int H, int dk, int dv, double scale);
// A prefill window after cached keys (dsa_prefix_select's and the sparse
// steps' twins): the T0 queries of each row at slots pos .. pos+T0-1 (qI
// (B, T0, HI*dI), w (B, T0, HI)), each's top K of slots start[b] .. its own
// into sel (B, T0, K) by the decoding step's scores (scratch from tp); then
// their sparse attention, q (B, T0, H*dk), o (B, T0, H*dv).
void cu_dsa_prefix_select(Tape *tp, int *sel, const real *qI, const real *w, const real *kIc, int B, int max_T,
                          int pos, int T0, const int *start, int HI, int dI, int K);
void cu_dsa_prefix_sparse(real *o, const real *q, const real *kc, const real *vc, int B, int T0, int max_T,
                          const int *sel, int K, int H, int dk, int dv, double scale);
#endif

#ifdef __cplusplus
}
#endif
#endif
