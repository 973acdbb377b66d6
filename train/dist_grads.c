// dist_grads.c: the bucketed gradient reduction, overlapped with the
// backward, and the ZeRO-1 pieces (dist.h). One bucket plan and schedule for
// both kinds of ranks: the CPU's buckets go through MPI, the GPU's through
// NCCL (dist_nccl.c); only starting a bucket and waiting for them differ.
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"
#include "h5io.h"

#ifdef ATTNLAB_MPI

typedef enum { BUCKET_IDLE, BUCKET_RUNNING, BUCKET_DONE } BucketState;

typedef struct Bucket {
    int64_t lo, hi;           // flat elements [lo, hi): consecutive trainable parameters
    int p_first, p_last;      // the parameters it holds, by index (p_first <= p_last)
    int ready;                // after the backward of tape node `ready` every gradient in it is complete
    int *counts, *displs;     // (size) ZeRO-1: its intersection with each rank's slice, offsets from lo
    MPI_Request req;
    BucketState state;
} Bucket;

struct DistGrads {
    ParamStore *ps;
    struct DistNccl *nccl;    // the GPU ranks' communicator (NULL: MPI, on the host)
    bool zero;
    int rank, size;
    Bucket *b;                // (nb) in the order they start: reverse registration order
    int nb;
    int64_t *slice;           // (size + 1) rank r's slice is [slice[r], slice[r + 1])
    int *slice_counts, *slice_displs;   // (size) the same as MPI counts
    real *recv;               // plain: (numel) results of the all-reduce; ZeRO-1: (slice) results of the reduce-scatter
                              // (in the GPU's memory with nccl)
    int *first_use;           // (ps->n) scratch: the earliest tape node reading each parameter
    Tape *tp;                 // armed on
    double weight;
    int next;                 // the next bucket to start
    int running;              // buckets started and not yet seen complete
    double t_first, t_last;   // this step: first start, last completion seen
    DistStats st;
    double *bwd_end, *done;   // (DIST_MAX_WAITS) each step's end of the backward, end of the reduction
};

// The parameter a tape tensor is, or -1 (another ParamStore's, a frozen one, not a parameter).
static int param_index(const ParamStore *ps, const Tensor *t) {
    if (!t || !(t->flags & TENSOR_PARAM) || !t->requires_grad) return -1;
    if (t->data < ps->data || t->data >= ps->data + ps->numel) return -1;
    int64_t off = t->data - ps->data;
    int lo = 0, hi = ps->n - 1;
    while (lo < hi) {   // the last parameter starting at or before off
        int mid = (lo + hi + 1) / 2;
        if (ps->offsets[mid] <= off) lo = mid;
        else hi = mid - 1;
    }
    return ps->params[lo] == t ? lo : -1;
}

// The plan: slices and buckets (recv left to the caller).
static DistGrads *grads_plan(ParamStore *ps, bool zero, size_t bucket_bytes) {
    DistGrads *g = xcalloc(1, sizeof *g);
    g->ps = ps;
    g->zero = zero;
    g->rank = dist_rank();
    g->size = dist_size();
    g->slice = xmalloc((size_t)(g->size + 1) * sizeof *g->slice);
    g->slice_counts = xmalloc((size_t)g->size * sizeof(int));
    g->slice_displs = xmalloc((size_t)g->size * sizeof(int));
    for (int r = 0; r < g->size; r++) {
        int64_t lo, hi;
        dist_share(ps->numel, r, g->size, &lo, &hi);
        ASSERT(hi - lo < INT32_MAX && lo < INT32_MAX, "dist: slices of %lld elements need MPI counts beyond int",
               (long long)(hi - lo));
        g->slice[r] = lo;
        g->slice[r + 1] = hi;
        g->slice_counts[r] = (int)(hi - lo);
        g->slice_displs[r] = (int)lo;
    }
    // Buckets: trainable parameters from the last registered to the first;
    // a bucket closes at bucket_bytes or where a frozen parameter breaks the run.
    if (bucket_bytes == 0) {
        bucket_bytes = (size_t)params_count(ps, true) * sizeof(real) / DIST_BUCKETS;
        bucket_bytes = bucket_bytes < DIST_BUCKET_MIN   ? DIST_BUCKET_MIN
                       : bucket_bytes > DIST_BUCKET_MAX ? DIST_BUCKET_MAX
                                                        : bucket_bytes;
    }
    size_t cap_elems = bucket_bytes / sizeof(real);
    g->b = xcalloc((size_t)(ps->n ? ps->n : 1), sizeof *g->b);
    Bucket *cur = NULL;
    for (int i = ps->n - 1; i >= 0; i--) {
        const Tensor *p = ps->params[i];
        if (!p->requires_grad) {
            cur = NULL;
            continue;
        }
        int64_t off = ps->offsets[i];
        if (cur && cur->lo == off + p->numel && (size_t)(cur->hi - off) <= cap_elems) {
            cur->lo = off;
            cur->p_first = i;
        } else {
            cur = &g->b[g->nb++];
            *cur = (Bucket){.lo = off, .hi = off + p->numel, .p_first = i, .p_last = i};
        }
        ASSERT(cur->hi - cur->lo < INT32_MAX, "dist: parameter '%s' has more elements than an MPI count holds",
               p->name);
    }
    for (int k = 0; k < g->nb; k++) {
        Bucket *b = &g->b[k];
        b->counts = xmalloc((size_t)g->size * sizeof(int));
        b->displs = xmalloc((size_t)g->size * sizeof(int));
        for (int r = 0; r < g->size; r++) {
            int64_t a = b->lo > g->slice[r] ? b->lo : g->slice[r];
            int64_t e = b->hi < g->slice[r + 1] ? b->hi : g->slice[r + 1];
            b->counts[r] = e > a ? (int)(e - a) : 0;
            b->displs[r] = e > a ? (int)(a - b->lo) : 0;
        }
        g->st.bytes += (b->hi - b->lo) * (int64_t)sizeof(real);
        b->req = MPI_REQUEST_NULL;
    }
    g->st.n_buckets = g->nb;
    g->first_use = xmalloc((size_t)(ps->n ? ps->n : 1) * sizeof(int));
    g->bwd_end = xmalloc(DIST_MAX_WAITS * sizeof *g->bwd_end);
    g->done = xmalloc(DIST_MAX_WAITS * sizeof *g->done);
    return g;
}

DistGrads *dist_grads_new(ParamStore *ps, bool zero, size_t bucket_bytes) {
    if (dist_size() == 1) return NULL;
    DistGrads *g = grads_plan(ps, zero, bucket_bytes);
    int64_t own = g->slice[g->rank + 1] - g->slice[g->rank];
    g->recv = xaligned((size_t)((zero ? own : ps->numel) + 1) * sizeof(real));
    return g;
}

DistGrads *dist_grads_new_nccl(ParamStore *ps, size_t bucket_bytes, char *err, size_t n) {
#ifdef ATTNLAB_NCCL
    ASSERT(ps->device == DEVICE_CUDA, "dist_grads_new_nccl: the parameters are on %s", device_name(ps->device));
    struct DistNccl *c = dist_nccl_new(err, n);
    if (!c) return NULL;
    DistGrads *g = grads_plan(ps, false, bucket_bytes);
    g->nccl = c;
    g->recv = dev_alloc(DEVICE_CUDA, (size_t)(ps->numel ? ps->numel : 1) * sizeof(real));
    return g;
#else
    (void)ps, (void)bucket_bytes;
    snprintf(err, n, "this build has no NCCL (configure with -DAG_CUDA=ON where nccl.h and libnccl are; docs/cuda.md)");
    return NULL;
#endif
}

void dist_grads_free(DistGrads *g) {
    if (!g) return;
    for (int k = 0; k < g->nb; k++) {
        free(g->b[k].counts);
        free(g->b[k].displs);
    }
    free(g->b);
    free(g->slice);
    free(g->slice_counts);
    free(g->slice_displs);
#ifdef ATTNLAB_NCCL
    if (g->nccl) {
        dist_nccl_free(g->nccl);
        dev_free(DEVICE_CUDA, g->recv);
        g->recv = NULL;
    }
#endif
    free(g->recv);
    free(g->first_use);
    free(g->bwd_end);
    free(g->done);
    free(g);
}

void dist_grads_slice(const DistGrads *g, int64_t *lo, int64_t *hi) {
    if (!g) {   // a single process owns everything
        *lo = 0;
        *hi = INT64_MAX;
        return;
    }
    *lo = g->slice[g->rank];
    *hi = g->slice[g->rank + 1];
}

// The part of bucket b this rank receives (ZeRO-1): flat [*a, *a + count).
static int own_part(const DistGrads *g, const Bucket *b, int64_t *a) {
    *a = b->lo + b->displs[g->rank];
    return b->counts[g->rank];
}

static void start_bucket(DistGrads *g, Bucket *b) {
    real *grad = g->ps->grad;
    int n = (int)(b->hi - b->lo);
#ifdef ATTNLAB_NCCL
    if (g->nccl) {   // (queued behind the backward on the GPU: complete when dist_grads_wait returns)
        dist_nccl_bucket(g->nccl, grad + b->lo, g->recv + b->lo, n, g->weight);
        b->state = BUCKET_RUNNING;
        if (g->running++ == 0 && g->t_first == 0) g->t_first = dist_now();
        return;
    }
#endif
    if (g->weight != 1.0) {   // this rank's share of the global batch
        real w = (real)g->weight;
        real *x = grad + b->lo;
        for (int i = 0; i < n; i++) x[i] *= w;
    }
    int rc;
    if (g->zero) {
        int64_t a;
        own_part(g, b, &a);
        real *dst = g->recv + (b->counts[g->rank] ? a - g->slice[g->rank] : 0);
        rc = MPI_Ireduce_scatter(grad + b->lo, dst, b->counts, DIST_REAL, MPI_SUM, MPI_COMM_WORLD, &b->req);
    } else {
        // Not in place: OpenMPI's non-blocking all-reduce then picks its bandwidth-optimal
        // algorithms for many ranks (in place it always reduces to one rank and broadcasts).
        rc = MPI_Iallreduce(grad + b->lo, g->recv + b->lo, n, DIST_REAL, MPI_SUM, MPI_COMM_WORLD, &b->req);
    }
    dist_check(rc, "gradient reduction");
    b->state = BUCKET_RUNNING;
    if (g->running++ == 0 && g->t_first == 0) g->t_first = dist_now();
}

// A completed bucket's results into the gradient block.
static void finish_bucket(DistGrads *g, Bucket *b) {
    if (g->zero) {
        int64_t a;
        int n = own_part(g, b, &a);
        if (n) memcpy(g->ps->grad + a, g->recv + (a - g->slice[g->rank]), (size_t)n * sizeof(real));
    } else {
        memcpy(g->ps->grad + b->lo, g->recv + b->lo, (size_t)(b->hi - b->lo) * sizeof(real));
    }
    b->state = BUCKET_DONE;
    g->running--;
    g->t_last = dist_now();
}

// Let MPI move the running buckets on (OpenMPI progresses only inside its calls).
static void poll_buckets(DistGrads *g) {
    if (g->nccl) return;   // (NCCL moves on by itself)
    for (int k = 0; k < g->next; k++) {
        Bucket *b = &g->b[k];
        if (b->state != BUCKET_RUNNING) continue;
        int done = 0;
        dist_check(MPI_Test(&b->req, &done, MPI_STATUS_IGNORE), "gradient reduction");
        if (done) finish_bucket(g, b);
    }
}

static void after_node(void *ctx, int i) {
    DistGrads *g = ctx;
    while (g->next < g->nb && g->b[g->next].ready >= i) {
        start_bucket(g, &g->b[g->next++]);
        g->st.started_in_backward++;
    }
    if (g->running) poll_buckets(g);
}

void dist_grads_arm(DistGrads *g, Tape *tp, double weight) {
    if (!g) return;
    // The buckets are collectives the records do not precede one by one: the
    // ranks first agree that each is at a step's reduction (dist.c); from
    // there every rank starts the same buckets in the same order. (A
    // communicator of one, the tests' NCCL path in one process, has no MPI.)
    if (g->size > 1) dist_records("gradient reduction", NULL, 0, dist_timeout());
    dist_count_step();
    const ParamStore *ps = g->ps;
    for (int i = 0; i < ps->n; i++) g->first_use[i] = INT32_MAX;   // never read: complete (zero) from the start
    for (int n = tp->n_nodes - 1; n >= 0; n--) {
        const Node *node = tp->nodes[n];
        for (int k = 0; k < node->n_in; k++) {
            int p = param_index(ps, node->in[k]);
            if (p >= 0) g->first_use[p] = n;
        }
    }
    for (int k = 0; k < g->nb; k++) {
        Bucket *b = &g->b[k];
        b->ready = INT32_MAX;
        for (int p = b->p_first; p <= b->p_last; p++)
            if (g->first_use[p] < b->ready) b->ready = g->first_use[p];
        b->state = BUCKET_IDLE;
    }
    g->weight = weight;
    g->next = 0;
    g->running = 0;
    g->t_first = g->t_last = 0;
    g->tp = tp;
    tp->after_node = after_node;
    tp->after_node_ctx = g;
}

void dist_grads_flush(DistGrads *g) {
    if (!g) return;
    if (g->tp && g->st.steps < DIST_MAX_WAITS) g->bwd_end[g->st.steps] = dist_now();
#ifdef ATTNLAB_NCCL
    if (g->tp && g->nccl) dist_nccl_backward_end(g->nccl);   // (the GPU ends it later than the host queued it)
#endif
    while (g->next < g->nb) start_bucket(g, &g->b[g->next++]);
    if (g->tp) {
        g->tp->after_node = NULL;
        g->tp->after_node_ctx = NULL;
        g->tp = NULL;
    }
}

void dist_grads_wait(DistGrads *g) {
    if (!g) return;
    dist_grads_flush(g);
    double t0 = dist_now(), late = 0;
    if (g->nccl) {
#ifdef ATTNLAB_NCCL
        late = dist_nccl_wait(g->nccl, dist_timeout());   // (the results are in place: nothing to copy)
#endif
        for (int k = 0; k < g->nb; k++)
            if (g->b[k].state == BUCKET_RUNNING) {
                g->b[k].state = BUCKET_DONE;
                g->running--;
            }
        g->t_last = dist_now();
    } else {
        MPI_Request *reqs = xmalloc((size_t)(g->nb ? g->nb : 1) * sizeof *reqs);
        for (int k = 0; k < g->nb; k++) reqs[k] = g->b[k].state == BUCKET_RUNNING ? g->b[k].req : MPI_REQUEST_NULL;
        dist_wait_all(g->nb, reqs, dist_timeout(), "gradient reduction");
        for (int k = 0; k < g->nb; k++)
            if (g->b[k].state == BUCKET_RUNNING) {
                g->b[k].req = MPI_REQUEST_NULL;
                finish_bucket(g, &g->b[k]);
            }
        free(reqs);
    }
    double t1 = dist_now();
    g->st.wait_s += t1 - t0;
    if (g->st.steps < DIST_MAX_WAITS) {
        g->done[g->st.steps] = t1;
        // The GPU's backward ended `late` before its reduction did, not when the host had queued it.
        if (g->nccl) g->bwd_end[g->st.steps] = t1 - late;
    }
    if (g->t_first > 0) g->st.comm_s += g->t_last - g->t_first;
    g->st.steps++;
}

void dist_params_allgather(DistGrads *g) {
    if (!g || !g->zero) return;
    // (No record first: it follows the step's reduction of the loss and the
    // norm, whose sums give every rank the same verdict on going on.)
    MPI_Request *reqs = xmalloc((size_t)(g->nb ? g->nb : 1) * sizeof *reqs);
    for (int k = 0; k < g->nb; k++) {
        Bucket *b = &g->b[k];
        dist_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, g->ps->data + b->lo, b->counts, b->displs,
                                   DIST_REAL, MPI_COMM_WORLD, &reqs[k]),
                   "parameter all-gather");
    }
    dist_wait_all(g->nb, reqs, dist_timeout(), "parameter all-gather");
    free(reqs);
}

void dist_gather_moments(DistGrads *g, const Optimizer *opt, real *m_full, real *v_full) {
    ASSERT(g && opt->lo == g->slice[g->rank] && opt->hi == g->slice[g->rank + 1],
           "dist_gather_moments: the optimizer is not sharded over this rank's slice");
    dist_records("gathering the optimizer state", NULL, 0, dist_timeout());
    MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int n = g->slice_counts[g->rank];
    dist_check(MPI_Igatherv(opt->m, n, DIST_REAL, m_full, g->slice_counts, g->slice_displs, DIST_REAL, 0,
                            MPI_COMM_WORLD, &r[0]),
               "gathering the optimizer state");
    if (opt->v)
        dist_check(MPI_Igatherv(opt->v, n, DIST_REAL, v_full, g->slice_counts, g->slice_displs, DIST_REAL, 0,
                                MPI_COMM_WORLD, &r[1]),
                   "gathering the optimizer state");
    dist_wait_all(2, r, dist_timeout(), "gathering the optimizer state");
}

bool dist_params_agree(const DistGrads *g) {
    if (!g || g->size == 1) return true;
    const real *data = params_pull(g->ps);   // (the GPU's values through the host copy)
    double crc = (double)h5io_crc32(data, (size_t)g->ps->numel * sizeof(real));
    const DistRecord *all = dist_records("parameter check", &crc, 1, dist_timeout());
    for (int r = 0; r < g->size; r++)   // (every rank sees every CRC: the same verdict on all)
        if (all[r].v[0] != crc) return false;
    return true;
}

DistStats dist_grads_stats(const DistGrads *g) { return g ? g->st : (DistStats){0}; }

int dist_grads_times(const DistGrads *g, const double **bwd_end, const double **done) {
    *bwd_end = g ? g->bwd_end : NULL;
    *done = g ? g->done : NULL;
    return g ? (int)(g->st.steps < DIST_MAX_WAITS ? g->st.steps : DIST_MAX_WAITS) : 0;
}

#else   // no MPI: a single process, nothing to reduce

DistGrads *dist_grads_new_nccl(ParamStore *ps, size_t bucket_bytes, char *err, size_t n) {
    (void)ps, (void)bucket_bytes;
    snprintf(err, n, "this build has no MPI, and so no NCCL (install libopenmpi-dev and rebuild; docs/cuda.md)");
    return NULL;
}

DistGrads *dist_grads_new(ParamStore *ps, bool zero, size_t bucket_bytes) {
    (void)ps, (void)zero, (void)bucket_bytes;
    return NULL;
}
void dist_grads_free(DistGrads *g) { (void)g; }
void dist_grads_slice(const DistGrads *g, int64_t *lo, int64_t *hi) {
    (void)g;
    *lo = 0;
    *hi = INT64_MAX;
}
void dist_grads_arm(DistGrads *g, Tape *tp, double weight) { (void)g, (void)tp, (void)weight; }
void dist_grads_flush(DistGrads *g) { (void)g; }
void dist_grads_wait(DistGrads *g) { (void)g; }
void dist_params_allgather(DistGrads *g) { (void)g; }
void dist_gather_moments(DistGrads *g, const Optimizer *opt, real *m_full, real *v_full) {
    (void)g, (void)opt, (void)m_full, (void)v_full;
}
bool dist_params_agree(const DistGrads *g) {
    (void)g;
    return true;
}
DistStats dist_grads_stats(const DistGrads *g) {
    (void)g;
    return (DistStats){0};
}
int dist_grads_times(const DistGrads *g, const double **bwd_end, const double **done) {
    (void)g;
    *bwd_end = *done = NULL;
    return 0;
}

#endif

bool dist_nccl_built(void) {
#ifdef ATTNLAB_NCCL
    return true;
#else
    return false;
#endif
}
