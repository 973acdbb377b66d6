// tape.h: the tape-based autograd.
//
// Ops run eagerly: an op builder checks shapes, allocates its output from the
// tape's arena, records a Node (only when some input requires a gradient and
// the tape is not in no-grad mode) and runs the op's forward at once. The
// tape is therefore in execution order, which is already a topological
// order: tape_backward() is a reverse loop over it. Every op's backward ADDS
// into the gradients of its inputs; parameter gradients are zeroed once,
// centrally (params_zero_grad).
//
// Adding an op touches one place: define an OpDef {name, forward, backward}
// next to its kernels and a builder that calls tape_op().
#ifndef AG_TAPE_H
#define AG_TAPE_H

#include "arena.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NODE_MAX_IN 8
#define NODE_MAX_OUT 4   // op_matmul_multi: q, k, v and the gate

typedef struct Node Node;
typedef struct Tape Tape;
typedef struct TapeProfile TapeProfile;

typedef struct OpDef {
    const char *name;
    void (*forward)(Node *n);   // fills n->out[] from n->in[]; may save state in n->saved
    void (*backward)(Node *n);  // adds into the grads of inputs that require one
    // The same on a GPU tape (src/cuda/, built with AG_CUDA): the pair runs
    // when the node's tape is on DEVICE_CUDA. NULL: the op has no GPU kernel
    // yet, and building it on a GPU tape stops with a message naming it.
    // Write them as CUDA_PAIR(f, b) (cuda_ops.h) so CPU builds need no symbol.
    void (*cuda_forward)(Node *n);
    void (*cuda_backward)(Node *n);
} OpDef;

struct Node {
    const OpDef *op;
    Tape *tape;
    Tensor *in[NODE_MAX_IN];
    int n_in;
    Tensor *out[NODE_MAX_OUT];
    int n_out;
    int iarg[8];                // op-specific integer arguments
    double farg[4];             // op-specific real arguments
    const void *aux;            // op-specific read-only input (token ids, targets, ...), arena-owned
    void *saved;                // op-specific state the backward needs, arena-owned
    bool recorded;              // false: no backward will run, so forward need save nothing
};

struct Tape {
    Arena arena;                // nodes, Tensor structs, ops' host-side state; on the CPU also
                                // the activations, saved state and activation grads
    Device device;              // where the tensors' data live (tape_init: the CPU)
    Arena data;                 // a GPU tape's activations, saved state and activation grads
    Node **nodes;               // (n_nodes) in execution order
    int n_nodes, cap_nodes;
    int no_grad_depth;          // > 0: record nothing
    TapeProfile *prof;          // NULL unless tape_profile() turned it on
    // Called by the backward after each node (index i, from n_nodes - 1 down
    // to 0), whether or not it ran: a parameter's gradient is complete after
    // the earliest node that reads it (train/dist.h starts reducing it then).
    void (*after_node)(void *ctx, int i);
    void *after_node_ctx;
    // The rows (dim 0, e.g. windows) of the whole batch that this tape's
    // losses are means over, when the tape holds only some of them: under MPI
    // a rank sets the global batch size while it builds its training loss,
    // so that the loss is its share of the global mean (the shares sum to
    // it) and every row's gradient has the bits it has in one process (bf16
    // products then round them alike). 0 (tape_init): the rows the loss op
    // is given. Read by cross_entropy, dsa_kl and dsa_sel_kl, CPU tapes only.
    int loss_rows;
    // A CUDA graph may replay this tape's micro-batches (lm_graph.h): ops
    // whose GPU pair would make a decision from batch data on the host (the
    // embedding's backward groups the ids) make it on the device instead,
    // eagerly too, so that the eager micro-batches before a capture allocate
    // what the captured one does. false (tape_init): the host way.
    bool graphable;
};

void tape_init(Tape *tp);
// A tape whose tensors live on `device` (DEVICE_CUDA: device_cuda_init must
// have succeeded).
void tape_init_on(Tape *tp, Device device);
void tape_free(Tape *tp);
// Forget every node and release every activation (call after the backward).
void tape_reset(Tape *tp);

// The rows of the whole batch for a loss op given `rows` rows (dim 0): the
// tape's loss_rows, or `rows` when that is 0. Stops with a message when
// loss_rows is fewer than `rows`, or when a GPU tape holds a share.
int tape_loss_rows(const Tape *tp, int rows, const char *op);

// No-grad mode nests: push/pop. Inside it nothing is recorded.
void tape_no_grad_push(Tape *tp);
void tape_no_grad_pop(Tape *tp);
static inline bool tape_grad_enabled(const Tape *tp) { return tp->no_grad_depth == 0; }

// Backward from a scalar loss (its gradient is seeded with 1).
void tape_backward(Tape *tp, Tensor *loss);
// Backward from any recorded tensor with an explicit seed gradient (numel values).
void tape_backward_from(Tape *tp, Tensor *out, const real *seed);
// Backward from several outputs at once (e.g. a mixer's output and final state).
void tape_backward_multi(Tape *tp, Tensor *const *outs, const real *const *seeds, int n);

// Arena allocation for op state read on the host (always host memory).
void *tape_alloc(Tape *tp, size_t bytes);
// Arena allocation for data the op's kernels read and write: host memory on
// a CPU tape, device memory on a GPU tape.
void *tape_dalloc(Tape *tp, size_t bytes);
// Scratch for a parallel kernel: one slot of `bytes` per OpenMP thread, from
// the arena (so a training step does no malloc). Thread i uses
// base + i * (*stride), with i = omp_get_thread_num(); stride is 64-aligned.
unsigned char *tape_thread_slots(Tape *tp, size_t bytes, size_t *stride);
Tensor *tape_tensor(Tape *tp, int ndim, const int *shape);        // data uninitialised
Tensor *tape_tensor_zeros(Tape *tp, int ndim, const int *shape);
Tensor *tape_tensor_copy(Tape *tp, int ndim, const int *shape, const real *src);   // src in host memory
Tensor *tape_tensor_copy_dev(Tape *tp, int ndim, const int *shape, const real *src);   // src on the tape's device
// Convenience: tape_tensorN(tp, ndim, d0, d1, ...).
Tensor *tape_tensorv(Tape *tp, int ndim, ...);

// Op profile (a developer's tool; off by default, no cost when off): wall
// time and the process's CPU time (every thread) per op kind, forward and
// backward. A forward op is charged the time from its tape_op() to the next
// one (so its builder's work is included); a backward is timed exactly.
// tape_profile_print() lists the ops by total wall time, divided by `steps`
// (the number of forward/backward passes profiled). On a machine shared with
// other jobs the CPU time is the steadier of the two.
void tape_profile(Tape *tp, bool on);
void tape_profile_print(const Tape *tp, FILE *f, int steps);

// For op builders: make a node for `op` over inputs in[] and outputs out[].
// Sets each output's requires_grad and records the node when it will be
// needed by the backward. The caller then runs op->forward(node).
Node *tape_op(Tape *tp, const OpDef *op, Tensor *const *in, int n_in, Tensor *const *out, int n_out);
// Record + forward in one call for builders with nothing to set in between.
Node *tape_run(Tape *tp, const OpDef *op, Tensor *const *in, int n_in, Tensor *const *out, int n_out);
// Run a node's forward on its tape's device (builders end with this).
void tape_forward(Node *n);

// The first element of t as a double, read from the tape's device (on a GPU
// this waits for the work queued before it): losses and logged scalars.
double tape_item(const Tape *tp, const Tensor *t);

// For backward functions: the gradient buffer of a tensor, allocated (zeroed)
// on first use; NULL when the tensor takes no gradient.
real *tensor_grad(Tape *tp, Tensor *t);
#define NODE_GRAD_IN(n, i) tensor_grad((n)->tape, (n)->in[i])
// The same, for hot backward functions that can WRITE their contribution
// when they are the first: *fresh is set true when the buffer was just
// allocated and is uninitialised (the caller must then write every element,
// `=` instead of `+=`, or gemm with beta 0), false when it already holds
// other contributions (add). This skips zeroing and re-reading activation
// gradients, a tenth of a training step. In the float64 build fresh buffers
// are filled with NaN, so a missed element fails every gradient test.
real *tensor_grad_fresh(Tape *tp, Tensor *t, bool *fresh);
#define NODE_GRAD_FRESH(n, i, fresh) tensor_grad_fresh((n)->tape, (n)->in[i], (fresh))

// Heap tensors owned by the caller (tests, gradcheck inputs, caches): data and
// grad are allocated (grad zeroed) when requires_grad is true. Free with tensor_free.
Tensor *tensor_new(int ndim, const int *shape, bool requires_grad);
Tensor *tensor_newv(bool requires_grad, int ndim, ...);
void tensor_free(Tensor *t);
// The same (zeros, no gradient) in a device's memory, for state kept across
// steps (decode caches); free with tensor_free_on and the same device.
Tensor *tensor_new_on(Device d, int ndim, const int *shape);
void tensor_free_on(Device d, Tensor *t);

#ifdef __cplusplus
}
#endif
#endif
