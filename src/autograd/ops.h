// ops.h: the op builders. Each records itself on the tape (when a gradient
// will be needed) and computes its forward at once. Shapes are checked on
// entry; a mismatch stops with the op's name and the shapes involved.
//
// Broadcasting is by suffix only: in op_add/op_sub/op_mul, `b` either has
// a's shape or a's trailing dimensions (e.g. a bias (D) added to (B, T, D)).
#ifndef AG_OPS_H
#define AG_OPS_H

#include "tape.h"

// ---- linear algebra (ops_matmul.c) ----
// a: (..., M, K), or (..., K, M) when ta. b: (K, N), or (N, K) when tb; b is
// either 2-D (shared by every leading index of a, e.g. a weight) or has the
// same leading dimensions as a (batched). Returns (..., M, N).
Tensor *op_matmul(Tape *tp, Tensor *a, Tensor *b, bool ta, bool tb);
// out[i] = x w[i] for m <= MATMUL_MULTI_MAX weights (K, N_i) of one input x
// (..., K): the same as m op_matmul calls, run as one node (blas.h,
// gemm_rows_multi: one parallel region for the m products, one for their
// backward). On a GPU tape, or with a narrow weight (N_i <= 8), it builds
// the m op_matmul nodes instead.
#define MATMUL_MULTI_MAX 4
// op_matmul's narrow products: rows times a weight (K, N) with N <= this run
// loops of their own on the CPU, in float32 under precision = bf16 too (the
// GPU's bf16 products leave the same ones in float32).
#define MATMUL_NARROW_N 8
void op_matmul_multi(Tape *tp, Tensor *x, Tensor *const *w, int m, Tensor **out);

// ---- elementwise with suffix broadcasting (ops_elementwise.c) ----
Tensor *op_add(Tape *tp, Tensor *a, Tensor *b);
Tensor *op_sub(Tape *tp, Tensor *a, Tensor *b);
Tensor *op_mul(Tape *tp, Tensor *a, Tensor *b);
Tensor *op_scale(Tape *tp, Tensor *a, double s);

// ---- unary activations (ops_unary.c) ----
Tensor *op_silu(Tape *tp, Tensor *x);       // x * sigmoid(x)
Tensor *op_silu_mul(Tape *tp, Tensor *g, Tensor *x);   // silu(g) * x, one shape: op_mul(op_silu(g), x) fused
Tensor *op_sigmoid(Tape *tp, Tensor *x);
Tensor *op_softplus(Tape *tp, Tensor *x);   // log(1 + e^x), computed stably
Tensor *op_exp(Tape *tp, Tensor *x);
Tensor *op_relu(Tape *tp, Tensor *x);       // derivative at exactly 0 taken as 0

// ---- reductions (ops_reduce.c) ----
Tensor *op_sum(Tape *tp, Tensor *x);        // -> (1)
Tensor *op_mean(Tape *tp, Tensor *x);       // -> (1)

// ---- shape (ops_shape.c) ----
Tensor *op_reshape(Tape *tp, Tensor *x, int ndim, const int *shape); // same numel
Tensor *op_transpose(Tape *tp, Tensor *x, int d0, int d1);           // swap two dims (copies)
Tensor *op_slice(Tape *tp, Tensor *x, int dim, int start, int len);  // x[..., start:start+len, ...]
Tensor *op_concat(Tape *tp, Tensor *const *xs, int n, int dim);      // n <= NODE_MAX_IN

// ---- lookup and losses (ops_embed.c, ops_loss.c) ----
// E: (V, D); ids: numel(shape) token ids in [0, V) (copied; take no gradient).
// Returns (shape..., D).
Tensor *op_embedding(Tape *tp, Tensor *E, const int *ids, int ndim, const int *shape);
// Fused log-softmax + cross-entropy. logits: (..., V); targets: one per row
// (copied), a negative target is ignored. Returns the mean over counted rows, (1).
Tensor *op_cross_entropy(Tape *tp, Tensor *logits, const int *targets);
// Softmax over the last dimension.
Tensor *op_softmax(Tape *tp, Tensor *x);

// ---- normalisation (ops_norm.c) ----
// RMSNorm over the last dimension: x / sqrt(mean(x^2) + eps) * g; g: (last dim) or NULL.
Tensor *op_rmsnorm(Tape *tp, Tensor *x, Tensor *g, double eps);
// The same per consecutive group of `group` entries of the last dimension
// (a divisor of it), g: (group): a per-head norm without reshaping to heads.
Tensor *op_rmsnorm_groups(Tape *tp, Tensor *x, Tensor *g, int group, double eps);
// RMSNorm per group times a SiLU gate, one op ("rmsnorm_gate"): y =
// op_rmsnorm_groups(x, g, group, eps) * silu(z), z of x's shape (another
// tensor): the linear-family mixers' output stage.
Tensor *op_rmsnorm_gate(Tape *tp, Tensor *x, Tensor *g, Tensor *z, int group, double eps);
// A pre-norm block's residual add fused with the norm that reads it:
// *sum = a + b (a and b of one shape) and the result RMSNorm(a + b) g, g:
// (last dim). Both outputs take gradients.
Tensor *op_add_rmsnorm(Tape *tp, Tensor *a, Tensor *b, Tensor *g, double eps, Tensor **sum);
// Per-head L2 normalisation: the last dimension is split into groups of
// head_dim, each scaled to z / sqrt(sum z^2 + 1e-6).
Tensor *op_l2norm_heads(Tape *tp, Tensor *x, int head_dim);
// The same times scale > 0 in one pass (q's 1/sqrt(d_k) in linear and gdn):
// op_scale(op_l2norm_heads(x)) without a node, a pass over memory forward and
// backward, and two parallel regions. A GPU tape builds those two nodes.
Tensor *op_l2norm_heads_scaled(Tape *tp, Tensor *x, int head_dim, double scale);

// ---- position and time (ops_rope.c, ops_conv.c) ----
// doc_start (B, T) or NULL: document boundaries inside the rows (docs.h).
// RoPE on x (B, T, H*head_dim): rotates interleaved pairs (2i, 2i+1) of each
// head by angle (pos0 + t) * base^(-2i/head_dim).
Tensor *op_rope(Tape *tp, Tensor *x, int head_dim, int pos0, double base);
// The same at explicit positions: pos (B, T) (copied), row (b, t) rotated by
// pos[b*T + t] * base^(-2i/head_dim) (positions restarting in each document,
// docs_positions; or per-row decoding positions).
Tensor *op_rope_pos(Tape *tp, Tensor *x, int head_dim, const int *pos, double base);
// Causal depthwise 1-D convolution over time, no bias. x: (B, T, C),
// w: (C, W): y[t,c] = sum_{j<W} w[c,j] * x[t-W+1+j, c] (zeros before t=0,
// and before the start of t's document).
Tensor *op_conv1d_causal(Tape *tp, Tensor *x, Tensor *w, const int *doc_start);
// silu(op_conv1d_causal(x, w)) as one op ("conv1d_silu"): saves nothing
// beyond its inputs (the backward recomputes the convolution).
Tensor *op_conv1d_causal_silu(Tape *tp, Tensor *x, Tensor *w, const int *doc_start);

#endif
