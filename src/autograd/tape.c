#include "tape.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROF_MAX_OPS 96

struct TapeProfile {
    const OpDef *op[PROF_MAX_OPS];
    double fwd[PROF_MAX_OPS], bwd[PROF_MAX_OPS];            // wall seconds
    double fwd_cpu[PROF_MAX_OPS], bwd_cpu[PROF_MAX_OPS];    // CPU seconds of every thread
    long calls[PROF_MAX_OPS];
    int n;
    const OpDef *open;   // the forward op being charged, or NULL
    double mark;         // when it started
    double mark_cpu;
    Device device;       // the tape's: on a GPU every reading waits for the stream first
};

static double clock_s(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double prof_now(void) { return clock_s(CLOCK_MONOTONIC); }
// The process's CPU time: on a machine shared with other jobs it moves far
// less than wall time (a thread waiting for a core is not charged).
static double prof_cpu(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

static int prof_slot(TapeProfile *p, const OpDef *op) {
    for (int i = 0; i < p->n; i++)
        if (p->op[i] == op) return i;
    if (p->n == PROF_MAX_OPS) return PROF_MAX_OPS - 1;   // lumped into the last slot
    p->op[p->n] = op;
    return p->n++;
}

// On a GPU tape the kernels run after their launch: a profile reading waits
// for the stream (the profile's times are then the kernels'; the step slows
// by one synchronisation per op, so profiled steps are not timed steps).
static void prof_wait(const TapeProfile *p) {
    if (p->device != DEVICE_CPU) dev_sync(p->device);
}

// Charge the open forward op up to now and open `next` (NULL: none).
static void prof_switch(TapeProfile *p, const OpDef *next) {
    prof_wait(p);
    double now = prof_now(), cpu = prof_cpu();
    if (p->open) {
        int i = prof_slot(p, p->open);
        p->fwd[i] += now - p->mark;
        p->fwd_cpu[i] += cpu - p->mark_cpu;
        p->calls[i]++;
    }
    p->open = next;
    p->mark = now;
    p->mark_cpu = cpu;
}

void tape_profile(Tape *tp, bool on) {
    if (on && !tp->prof) {
        tp->prof = xcalloc(1, sizeof *tp->prof);
        tp->prof->device = tp->device;
    }
    if (!on) {
        free(tp->prof);
        tp->prof = NULL;
    }
}

void tape_profile_print(const Tape *tp, FILE *f, int steps) {
    const TapeProfile *p = tp->prof;
    if (!p || steps < 1) return;
    int order[PROF_MAX_OPS];
    double total = 0, total_cpu = 0;
    for (int i = 0; i < p->n; i++) {
        order[i] = i;
        total += p->fwd[i] + p->bwd[i];
        total_cpu += p->fwd_cpu[i] + p->bwd_cpu[i];
    }
    for (int i = 1; i < p->n; i++)   // insertion sort by total time, largest first
        for (int j = i; j > 0; j--) {
            int a = order[j - 1], b = order[j];
            if (p->fwd[a] + p->bwd[a] >= p->fwd[b] + p->bwd[b]) break;
            order[j - 1] = b;
            order[j] = a;
        }
    fprintf(f, "%-20s %8s %10s %10s %10s %6s %10s %6s\n", "op", "calls", "fwd ms", "bwd ms", "total ms", "share",
            "CPU ms", "share");
    for (int k = 0; k < p->n; k++) {
        int i = order[k];
        double cpu = p->fwd_cpu[i] + p->bwd_cpu[i];
        fprintf(f, "%-20s %8.1f %10.2f %10.2f %10.2f %5.1f%% %10.2f %5.1f%%\n", p->op[i]->name,
                (double)p->calls[i] / steps, 1e3 * p->fwd[i] / steps, 1e3 * p->bwd[i] / steps,
                1e3 * (p->fwd[i] + p->bwd[i]) / steps, total > 0 ? 100 * (p->fwd[i] + p->bwd[i]) / total : 0.0,
                1e3 * cpu / steps, total_cpu > 0 ? 100 * cpu / total_cpu : 0.0);
    }
    fprintf(f, "%-20s %8s %10s %10s %10.2f %6s %10.2f\n", "all ops", "", "", "", 1e3 * total / steps, "",
            1e3 * total_cpu / steps);
}

void tape_init(Tape *tp) { tape_init_on(tp, DEVICE_CPU); }

void tape_init_on(Tape *tp, Device device) {
    arena_init(&tp->arena, device == DEVICE_CPU ? (size_t)8 << 20 : (size_t)1 << 20);
    tp->device = device;
    arena_init_on(&tp->data, (size_t)64 << 20, device);
    tp->nodes = NULL;
    tp->n_nodes = tp->cap_nodes = 0;
    tp->no_grad_depth = 0;
    tp->prof = NULL;
    tp->after_node = NULL;
    tp->after_node_ctx = NULL;
    tp->loss_rows = 0;
    tp->graphable = false;
}

int tape_loss_rows(const Tape *tp, int rows, const char *op) {
    if (tp->loss_rows == 0 || tp->loss_rows == rows) return rows;
    ASSERT(tp->loss_rows > rows, "%s: the tape's batch of %d rows holds fewer than the loss's %d", op, tp->loss_rows,
           rows);
    ASSERT(tp->device == DEVICE_CPU, "%s: a share of a larger batch (loss_rows) on a GPU tape", op);
    return tp->loss_rows;
}

void tape_free(Tape *tp) {
    tape_profile(tp, false);
    arena_free(&tp->arena);
    arena_free(&tp->data);
    free(tp->nodes);
    tp->nodes = NULL;
    tp->n_nodes = tp->cap_nodes = 0;
}

void tape_reset(Tape *tp) {
    if (tp->prof) prof_switch(tp->prof, NULL);
    tp->n_nodes = 0;
    arena_reset(&tp->arena);
    arena_reset(&tp->data);
}

void tape_no_grad_push(Tape *tp) { tp->no_grad_depth++; }
void tape_no_grad_pop(Tape *tp) {
    ASSERT(tp->no_grad_depth > 0, "tape_no_grad_pop without a matching push");
    tp->no_grad_depth--;
}

void *tape_alloc(Tape *tp, size_t bytes) { return arena_alloc(&tp->arena, bytes); }

void *tape_dalloc(Tape *tp, size_t bytes) {
    return arena_alloc(tp->device == DEVICE_CPU ? &tp->arena : &tp->data, bytes);
}

static void *tape_dcalloc(Tape *tp, size_t bytes) {
    return arena_calloc(tp->device == DEVICE_CPU ? &tp->arena : &tp->data, bytes);
}

unsigned char *tape_thread_slots(Tape *tp, size_t bytes, size_t *stride) {
    *stride = (bytes + 63) & ~(size_t)63;
    return arena_alloc(&tp->arena, *stride * (size_t)omp_get_max_threads());
}

// Float64 is the checking build: fill uninitialised arena buffers with NaN
// so that reading one before writing it shows up in every test.
#ifdef AG_DOUBLE
static void poison(Tape *tp, real *p, int64_t n) {
    if (tp->device != DEVICE_CPU) {
        dev_fill_nan(tp->device, p, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) p[i] = NAN;
}
#else
static void poison(Tape *tp, real *p, int64_t n) {
    (void)tp;
    (void)p;
    (void)n;
}
#endif

static Tensor *tensor_in_arena(Tape *tp, int ndim, const int *shape) {
    ASSERT(ndim >= 1 && ndim <= TENSOR_MAX_DIMS, "tensors have 1 to %d dimensions, asked for %d",
           TENSOR_MAX_DIMS, ndim);
    Tensor *t = arena_alloc(&tp->arena, sizeof *t);
    memset(t, 0, sizeof *t);
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        ASSERT(shape[i] >= 0, "negative dimension %d at position %d", shape[i], i);
        t->shape[i] = shape[i];
    }
    t->numel = shape_numel(ndim, shape);
    if (tp->device == DEVICE_CUDA) t->flags |= TENSOR_ON_GPU;
    return t;
}

Tensor *tape_tensor(Tape *tp, int ndim, const int *shape) {
    Tensor *t = tensor_in_arena(tp, ndim, shape);
    t->data = tape_dalloc(tp, (size_t)t->numel * sizeof(real));
    poison(tp, t->data, t->numel);
    return t;
}

Tensor *tape_tensor_zeros(Tape *tp, int ndim, const int *shape) {
    Tensor *t = tensor_in_arena(tp, ndim, shape);
    t->data = tape_dcalloc(tp, (size_t)t->numel * sizeof(real));
    return t;
}

Tensor *tape_tensor_copy(Tape *tp, int ndim, const int *shape, const real *src) {
    Tensor *t = tape_tensor(tp, ndim, shape);
    dev_from_host(t->data, tp->device, src, (size_t)t->numel * sizeof(real));
    return t;
}

Tensor *tape_tensor_copy_dev(Tape *tp, int ndim, const int *shape, const real *src) {
    Tensor *t = tape_tensor(tp, ndim, shape);
    dev_copy(tp->device, t->data, src, (size_t)t->numel * sizeof(real));
    return t;
}

Tensor *tape_tensorv(Tape *tp, int ndim, ...) {
    int shape[TENSOR_MAX_DIMS] = {0};
    va_list ap;
    va_start(ap, ndim);
    for (int i = 0; i < ndim && i < TENSOR_MAX_DIMS; i++) shape[i] = va_arg(ap, int);
    va_end(ap);
    return tape_tensor(tp, ndim, shape);
}

Node *tape_op(Tape *tp, const OpDef *op, Tensor *const *in, int n_in, Tensor *const *out, int n_out) {
    ASSERT(n_in >= 0 && n_in <= NODE_MAX_IN, "op '%s': %d inputs, at most %d", op->name, n_in, NODE_MAX_IN);
    ASSERT(n_out >= 1 && n_out <= NODE_MAX_OUT, "op '%s': %d outputs, 1 to %d", op->name, n_out, NODE_MAX_OUT);
    bool needs = false;
    for (int i = 0; i < n_in; i++) {
        ASSERT(in[i] != NULL || i > 0, "op '%s': input %d is NULL", op->name, i);
        if (!in[i]) continue;
        if (in[i]->requires_grad) needs = true;
        bool on_gpu = (in[i]->flags & TENSOR_ON_GPU) != 0;
        ASSERT(on_gpu == (tp->device == DEVICE_CUDA),
               "op '%s': input %d %s ('%s') lives in %s memory but the tape runs on the %s: give a %s tape "
               "tensors made on it (tape_tensor_copy copies host data in) and parameters moved there "
               "(params_to_device)",
               op->name, i, SHAPE(in[i]), in[i]->name ? in[i]->name : "?", on_gpu ? "GPU" : "host",
               device_name(tp->device), device_name(tp->device));
    }
    bool rec = needs && tape_grad_enabled(tp);
    ASSERT(tp->device == DEVICE_CPU || (op->cuda_forward && op->cuda_backward),
           "op '%s' has no CUDA kernel yet: build this model on a CPU tape (docs/cuda.md lists the ops "
           "the GPU runs)", op->name);
    if (tp->prof) prof_switch(tp->prof, op);
    Node *n = arena_alloc(&tp->arena, sizeof *n);
    memset(n, 0, sizeof *n);
    n->op = op;
    n->tape = tp;
    n->n_in = n_in;
    n->n_out = n_out;
    for (int i = 0; i < n_in; i++) n->in[i] = in[i];
    for (int i = 0; i < n_out; i++) {
        n->out[i] = out[i];
        if (out[i]) {
            out[i]->requires_grad = rec;
            if (!out[i]->name) out[i]->name = op->name;
        }
    }
    n->recorded = rec;
    if (rec) {
        if (tp->n_nodes == tp->cap_nodes) {
            tp->cap_nodes = tp->cap_nodes ? 2 * tp->cap_nodes : 1024;
            tp->nodes = xrealloc(tp->nodes, (size_t)tp->cap_nodes * sizeof *tp->nodes);
        }
        tp->nodes[tp->n_nodes++] = n;
    }
    return n;
}

Node *tape_run(Tape *tp, const OpDef *op, Tensor *const *in, int n_in, Tensor *const *out, int n_out) {
    Node *n = tape_op(tp, op, in, n_in, out, n_out);
    tape_forward(n);
    return n;
}

void tape_forward(Node *n) {
    if (n->tape->device == DEVICE_CPU) n->op->forward(n);
    else n->op->cuda_forward(n);   // tape_op checked that it exists
}

double tape_item(const Tape *tp, const Tensor *t) {
    real v;
    dev_to_host(&v, t->data, sizeof v, tp->device);
    return (double)v;
}

real *tensor_grad_fresh(Tape *tp, Tensor *t, bool *fresh) {
    *fresh = false;
    if (!t || !t->requires_grad) return NULL;
    if (!t->grad) {
        t->grad = tape_dalloc(tp, (size_t)t->numel * sizeof(real));
        poison(tp, t->grad, t->numel);
        *fresh = true;
    }
    return t->grad;
}

real *tensor_grad(Tape *tp, Tensor *t) {
    if (!t || !t->requires_grad) return NULL;
    if (!t->grad) t->grad = tape_dcalloc(tp, (size_t)t->numel * sizeof(real));
    return t->grad;
}

static void run_backward(Tape *tp) {
    TapeProfile *p = tp->prof;
    if (p) prof_switch(p, NULL);
    for (int i = tp->n_nodes - 1; i >= 0; i--) {
        Node *n = tp->nodes[i];
        bool any = false;
        for (int o = 0; o < n->n_out; o++)
            if (n->out[o] && n->out[o]->grad) any = true;
        if (any) {   // else nothing flows back through this node
            if (p) prof_wait(p);
            double t0 = p ? prof_now() : 0, c0 = p ? prof_cpu() : 0;
            if (tp->device == DEVICE_CPU) n->op->backward(n);
            else n->op->cuda_backward(n);
            if (p) {
                prof_wait(p);
                int k = prof_slot(p, n->op);
                p->bwd[k] += prof_now() - t0;
                p->bwd_cpu[k] += prof_cpu() - c0;
            }
        }
        if (tp->after_node) tp->after_node(tp->after_node_ctx, i);
    }
}

static void check_backward_root(Tape *tp, Tensor *t, const char *what) {
    ASSERT(t != NULL, "%s: the loss is NULL", what);
    ASSERT(tape_grad_enabled(tp), "%s: called in no-grad mode (pop the no-grad scope first)", what);
    ASSERT(t->requires_grad,
           "%s: tensor '%s' %s does not depend on anything that requires a gradient: "
           "was it built under no-grad, or are all parameters frozen?",
           what, t->name ? t->name : "?", SHAPE(t));
}

void tape_backward(Tape *tp, Tensor *loss) {
    check_backward_root(tp, loss, "tape_backward");
    ASSERT(loss->numel == 1,
           "tape_backward: the loss must be a scalar, got tensor '%s' of shape %s "
           "(reduce it with op_sum or op_mean, or use tape_backward_from with a seed)",
           loss->name ? loss->name : "?", SHAPE(loss));
    real *g = tensor_grad(tp, loss);
    const real one = 1;
    dev_add_from_host(tp->device, g, &one, 1);
    run_backward(tp);
}

void tape_backward_from(Tape *tp, Tensor *out, const real *seed) {
    tape_backward_multi(tp, &out, &seed, 1);
}

void tape_backward_multi(Tape *tp, Tensor *const *outs, const real *const *seeds, int n) {
    bool any = false;
    for (int k = 0; k < n; k++) {
        ASSERT(outs[k] != NULL, "tape_backward_multi: output %d is NULL", k);
        ASSERT(tape_grad_enabled(tp), "tape_backward_multi: called in no-grad mode");
        if (!outs[k]->requires_grad) continue;   // a constant output: its seed goes nowhere
        any = true;
        real *g = tensor_grad(tp, outs[k]);
        dev_add_from_host(tp->device, g, seeds[k], outs[k]->numel);
    }
    if (!any) check_backward_root(tp, outs[0], "tape_backward_multi");
    run_backward(tp);
}

// A heap Tensor of this shape with no buffers yet.
static Tensor *tensor_shell(int ndim, const int *shape) {
    ASSERT(ndim >= 1 && ndim <= TENSOR_MAX_DIMS, "tensors have 1 to %d dimensions, asked for %d",
           TENSOR_MAX_DIMS, ndim);
    Tensor *t = xcalloc(1, sizeof *t);
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->numel = shape_numel(ndim, shape);
    return t;
}

Tensor *tensor_new(int ndim, const int *shape, bool requires_grad) {
    Tensor *t = tensor_shell(ndim, shape);
    t->data = xaligned((size_t)t->numel * sizeof(real));
    memset(t->data, 0, (size_t)t->numel * sizeof(real));
    t->requires_grad = requires_grad;
    if (requires_grad) {
        t->grad = xaligned((size_t)t->numel * sizeof(real));
        memset(t->grad, 0, (size_t)t->numel * sizeof(real));
    }
    return t;
}

Tensor *tensor_newv(bool requires_grad, int ndim, ...) {
    int shape[TENSOR_MAX_DIMS] = {0};
    va_list ap;
    va_start(ap, ndim);
    for (int i = 0; i < ndim && i < TENSOR_MAX_DIMS; i++) shape[i] = va_arg(ap, int);
    va_end(ap);
    return tensor_new(ndim, shape, requires_grad);
}

void tensor_free(Tensor *t) {
    if (!t) return;
    free(t->data);
    free(t->grad);
    free(t);
}

Tensor *tensor_new_on(Device d, int ndim, const int *shape) {
    if (d == DEVICE_CPU) return tensor_new(ndim, shape, false);
    Tensor *t = tensor_shell(ndim, shape);
    t->data = dev_alloc(d, (size_t)t->numel * sizeof(real));
    dev_zero(d, t->data, (size_t)t->numel * sizeof(real));
    if (d == DEVICE_CUDA) t->flags |= TENSOR_ON_GPU;
    return t;
}

void tensor_free_on(Device d, Tensor *t) {
    if (!t) return;
    if (d == DEVICE_CPU) {
        tensor_free(t);
        return;
    }
    dev_free(d, t->data);
    free(t);
}
