// dist.c: the process group (dist.h): start-up, rank, barrier, small
// reductions, abort, all with a watchdog on every wait. Built without MPI
// (ATTNLAB_MPI undefined) every process is a group of one.
#define _GNU_SOURCE   // sched_getaffinity, CPU_COUNT
#include "dist.h"

#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist_internal.h"

static int g_rank = 0, g_size = 1, g_local = 1, g_local_rank = 0;
static bool g_active = false;   // MPI_Init was called (and MPI_Finalize not yet)
static double g_timeout = 300;

double dist_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

int dist_rank(void) { return g_rank; }
int dist_size(void) { return g_size; }
int dist_local_size(void) { return g_local; }
int dist_local_rank(void) { return g_local_rank; }
bool dist_active(void) { return g_active; }
void dist_set_timeout(double seconds) { g_timeout = seconds > 0 ? seconds : 300; }
double dist_timeout(void) { return g_timeout; }

void dist_share(int64_t n, int rank, int size, int64_t *lo, int64_t *hi) {
    int64_t base = n / size, extra = n % size;
    *lo = rank * base + (rank < extra ? rank : extra);
    *hi = *lo + base + (rank < extra ? 1 : 0);
}

#ifdef ATTNLAB_MPI
#include <mpi.h>

static DistRecord *g_records;   // (g_size) the last exchange's records, by rank (dist_records)
static int64_t g_seq = 0, g_steps = 0;

// An ASSERT inside the library on one rank ends the whole job with the rank's message.
static void fail_handler(const char *msg) { dist_abort(70, "error: %s", msg); }

void dist_init(int *argc, char ***argv) {
    if (g_active || !launched_by_mpi()) return;
    int provided = 0;
    // Only the main thread calls MPI; OpenMP threads compute between the calls.
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "train: MPI_Init failed\n");
        exit(2);
    }
    g_active = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &g_local);
    MPI_Comm_rank(local, &g_local_rank);
    MPI_Comm_free(&local);
    // Errors come back as codes (and are reported with the operation) rather than aborting silently.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    g_records = xcalloc((size_t)g_size, sizeof *g_records);
    if (g_size > 1) ag_set_fail_handler(fail_handler);
}

void dist_finalize(void) {
    if (!g_active) return;
    // Every rank leaves through here: one that leaves while the others go on
    // (it failed alone, or took another path) stops them with a message
    // instead of leaving them waiting for it.
    if (g_size > 1) dist_records("the end of its run", NULL, 0, g_timeout);
    MPI_Finalize();
    g_active = false;
    free(g_records);
    g_records = NULL;
}

_Noreturn void dist_abort(int code, const char *fmt, ...) {
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g_size > 1) fprintf(stderr, "train: rank %d: %s\n", g_rank, msg);
    else fprintf(stderr, "train: %s\n", msg);
    fflush(stderr);
    if (g_active) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

void dist_check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return;
    char err[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, err, &len);
    dist_abort(4, "%s failed: %s", what, err);
}

bool dist_pause(double t0, long spins, double timeout) {
    // Yield for the first 50 ms (a rank that shares a core with another
    // must let it run), then sleep a little: a long wait costs the others
    // next to nothing. Not sooner: a collective moves on only while both
    // ranks are inside MPI, so a rank asleep when its peer ends the
    // backward adds its wake-ups to every round of the last buckets
    // (sleeping after 200 yields left 0.4 ms of a 1.3-1.9 ms reduction
    // exposed after the backward; docs/distributed.md).
    double waited = dist_now() - t0;
    if (waited < 0.05) sched_yield();
    else usleep(waited < 0.1 ? 50 : 500);
    return timeout > 0 && (spins & 63) == 0 && dist_now() - t0 > timeout;
}

void dist_wait_all(int n, MPI_Request *reqs, double timeout, const char *what) {
    double t0 = dist_now();
    for (long spins = 0;; spins++) {
        int done = 0;
        dist_check(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), what);
        if (done) return;
        if (dist_pause(t0, spins, timeout))
            dist_abort(5, "%s: no progress for %.0f s: another rank has stopped or hung (a dead rank's own message, "
                          "if any, is above); ending the job ([train] dist_timeout sets this limit)",
                       what, timeout);
    }
}

// ---------------------------------------------------------------- checked collectives
//
// Ranks that run different code paths (a config or argument one rank alone
// has, a rank that stopped alone) would post different collectives: Open MPI
// then fails inside its schedules ("NBC_Progress: an error 15") or waits
// forever. So every small collective below, and each step's gradient
// reduction (dist_grads_arm), starts with one of a fixed shape: every rank
// contributes a record of what it is about to do and how many such records
// it has written, and receives every rank's. As long as the records agree,
// the ranks are at the same collective and the one that follows matches; the
// first one that disagrees stops every rank with one message naming what each
// was doing. Small payloads (dist_sum, dist_min, dist_agree) travel in the
// record itself, so they cost no second collective, and every rank sums them
// in rank order (the same bits on every rank).

void dist_count_step(void) { g_steps++; }

// Stops every rank: rank 0 says where it is and where each rank that is
// elsewhere is (the first few: "rank 1 at 'evaluation' after 6 steps").
static _Noreturn void out_of_step(const DistRecord *all) {
    char msg[1400];
    int n = snprintf(msg, sizeof msg,
                     "the ranks are out of step: rank 0 is at '%s' after %lld step%s", all[0].label,
                     (long long)all[0].steps, all[0].steps == 1 ? "" : "s");
    int listed = 0, more = 0;
    for (int r = 1; r < g_size; r++) {
        if (!strcmp(all[r].label, all[0].label) && all[r].seq == all[0].seq) continue;
        if (listed == 6 || n >= (int)sizeof msg - 200) {
            more++;
            continue;
        }
        n += snprintf(msg + n, sizeof msg - (size_t)n, "; rank %d at '%s' after %lld step%s", r, all[r].label,
                      (long long)all[r].steps, all[r].steps == 1 ? "" : "s");
        listed++;
    }
    if (more) n += snprintf(msg + n, sizeof msg - (size_t)n, "; and %d more rank%s", more, more == 1 ? "" : "s");
    snprintf(msg + n, sizeof msg - (size_t)n,
             ". They took different paths (arguments of their own?) or one stopped alone (its message, if any, is "
             "above): stopping every rank");
    // Every rank saw the same records: rank 0 speaks, and all leave together (no MPI_Abort, nothing pending).
    if (g_rank == 0) fprintf(stderr, "train: %s\n", msg);
    fflush(NULL);
    MPI_Finalize();
    g_active = false;
    exit(4);
}

const DistRecord *dist_records(const char *what, const double *v, int n, double timeout) {
    ASSERT(n <= DIST_RECORD_VALUES, "dist_records: %d values", n);
    DistRecord mine;
    memset(&mine, 0, sizeof mine);
    snprintf(mine.label, sizeof mine.label, "%s", what);
    mine.seq = g_seq++;
    mine.steps = g_steps;
    if (n > 0) memcpy(mine.v, v, (size_t)n * sizeof *v);
    MPI_Request r;
    dist_check(MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, g_records, (int)sizeof mine, MPI_BYTE,
                              MPI_COMM_WORLD, &r),
               what);
    dist_wait_all(1, &r, timeout, what);
    for (int k = 0; k < g_size; k++) g_records[k].label[sizeof mine.label - 1] = 0;   // (whatever another rank sent)
    for (int k = 0; k < g_size; k++)
        if (strcmp(g_records[k].label, mine.label) || g_records[k].seq != mine.seq) out_of_step(g_records);
    return g_records;
}

void dist_barrier(const char *what) {
    if (g_size == 1) return;
    dist_records(what, NULL, 0, g_timeout);   // (an exchange is a barrier)
}

// v op= every rank's v, in rank order; op: 0 sum, 1 minimum.
static void reduce_small(double *v, int n, int op, const char *what, double timeout) {
    const DistRecord *all = dist_records(what, v, n, timeout);
    for (int i = 0; i < n; i++) {
        double acc = all[0].v[i];
        for (int r = 1; r < g_size; r++) acc = op == 0 ? acc + all[r].v[i] : fmin(acc, all[r].v[i]);
        v[i] = acc;
    }
}

static void reduce_large(double *v, int n, MPI_Op op, const char *what) {
    dist_records(what, NULL, 0, g_timeout);
    MPI_Request r;
    dist_check(MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, op, MPI_COMM_WORLD, &r), what);
    dist_wait_all(1, &r, g_timeout, what);
}

void dist_sum(double *v, int n, const char *what) {
    if (g_size == 1) return;
    if (n <= DIST_RECORD_VALUES) reduce_small(v, n, 0, what, g_timeout);
    else reduce_large(v, n, MPI_SUM, what);
}

void dist_min(double *v, int n, const char *what) {
    if (g_size == 1) return;
    if (n <= DIST_RECORD_VALUES) reduce_small(v, n, 1, what, g_timeout);
    else reduce_large(v, n, MPI_MIN, what);
}

void dist_bcast(void *buf, size_t bytes, const char *what) {
    if (g_size == 1) return;
    ASSERT(bytes < (size_t)1 << 31, "dist_bcast: %zu bytes", bytes);
    dist_records(what, NULL, 0, g_timeout);
    MPI_Request r;
    dist_check(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD, &r), what);
    dist_wait_all(1, &r, g_timeout, what);
}

void dist_allgather_rows(double *buf, int64_t n_rows, int64_t row, const char *what) {
    if (g_size == 1) return;
    ASSERT(n_rows * row < (int64_t)1 << 31, "dist_allgather_rows: %lld x %lld", (long long)n_rows, (long long)row);
    dist_records(what, NULL, 0, g_timeout);
    int *counts = xmalloc((size_t)g_size * sizeof *counts), *displs = xmalloc((size_t)g_size * sizeof *displs);
    for (int r = 0; r < g_size; r++) {
        int64_t lo, hi;
        dist_share(n_rows, r, g_size, &lo, &hi);
        counts[r] = (int)((hi - lo) * row);
        displs[r] = (int)(lo * row);
    }
    MPI_Request req;
    dist_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_DOUBLE, MPI_COMM_WORLD,
                               &req),
               what);
    dist_wait_all(1, &req, g_timeout, what);
    free(counts);
    free(displs);
}

Status dist_agree(Status s, const char *prog) {
    if (g_size == 1) return s;
    // (No timeout: a rank may take long to build a token cache or train a tokenizer.)
    double v[2] = {s.ok ? 0 : 1, (g_rank == 0 && !s.ok) ? 1 : 0};
    reduce_small(v, 2, 0, "setup", 0);
    if (v[0] == 0) return s;
    if (v[1] > 0) return s.ok ? status_err("rank 0 failed") : s;   // rank 0 tells why; the others stay quiet
    if (!s.ok) fprintf(stderr, "%s: rank %d: %s\n", prog, g_rank, s.msg);
    return status_err("%d of %d ranks failed (their messages, prefixed with the rank, are above)", (int)v[0],
                      g_size);
}

// ---------------------------------------------------------------- settings

// One "name = value" line of a settings text.
typedef struct Line {
    const char *name, *value;
    int name_len, value_len;
} Line;

// The line at *p (before end), and *p past it; false at the end.
static bool next_line(const char **p, const char *end, Line *l) {
    if (*p >= end) return false;
    const char *nl = memchr(*p, '\n', (size_t)(end - *p));
    if (!nl) nl = end;
    const char *eq = memmem(*p, (size_t)(nl - *p), " = ", 3);
    l->name = *p;
    l->name_len = (int)((eq ? eq : nl) - *p);
    l->value = eq ? eq + 3 : nl;
    l->value_len = (int)(nl - l->value);
    *p = nl < end ? nl + 1 : end;
    return true;
}

// Appends item to out (cap bytes) as "; item", or counts it in *more when it does not fit.
static void add_item(char *out, size_t cap, const char *item, int *more) {
    size_t n = strlen(out);
    if (*more || n + strlen(item) + 48 > cap) {
        (*more)++;
        return;
    }
    snprintf(out + n, cap - n, "%s%s", n ? "; " : "", item);
}

// Rank 0: every rank's settings (texts[displs[r]], len[r] bytes) against its
// own; the differences into out ("" when there are none).
static void compare_settings(const char *texts, const int *len, const int *displs, char *out, size_t cap) {
    out[0] = 0;
    int more = 0;
    const char *z = texts + displs[0], *zend = z + len[0];
    for (int r = 1; r < g_size; r++) {
        const char *p = texts + displs[r], *pend = p + len[r], *q = z;
        Line a, b;
        for (;;) {
            bool ha = next_line(&p, pend, &a), hb = next_line(&q, zend, &b);
            if (!ha && !hb) break;
            char item[600];
            if (!ha || !hb || a.name_len != b.name_len || memcmp(a.name, b.name, (size_t)a.name_len)) {
                snprintf(item, sizeof item, "rank %d lists other settings than rank 0 ('%.*s' where rank 0 has "
                                            "'%.*s'): is it running another build of train?",
                         r, ha ? (a.name_len > 60 ? 60 : a.name_len) : 5, ha ? a.name : "(end)",
                         hb ? (b.name_len > 60 ? 60 : b.name_len) : 5, hb ? b.name : "(end)");
                add_item(out, cap, item, &more);
                break;
            }
            if (a.value_len == b.value_len && !memcmp(a.value, b.value, (size_t)a.value_len)) continue;
            snprintf(item, sizeof item, "rank %d: %.*s = %.*s, rank 0 has %.*s", r, a.name_len > 60 ? 60 : a.name_len,
                     a.name, a.value_len > 200 ? 200 : a.value_len, a.value, b.value_len > 200 ? 200 : b.value_len,
                     b.value);
            add_item(out, cap, item, &more);
        }
    }
    size_t n = strlen(out);
    if (more) snprintf(out + n, cap - n, " (and %d more difference%s)", more, more == 1 ? "" : "s");
}

Status dist_same_settings(const char *mine, const char *what) {
    if (g_size == 1) return status_ok();
    char label[48];
    snprintf(label, sizeof label, "comparing the ranks' %s", what);
    size_t len = strlen(mine);
    ASSERT(len < (size_t)1 << 24, "dist_same_settings: %zu bytes", len);
    double l = (double)len;
    const DistRecord *all = dist_records(label, &l, 1, g_timeout);
    int *counts = xmalloc((size_t)g_size * sizeof *counts), *displs = xmalloc((size_t)g_size * sizeof *displs);
    int64_t total = 0;
    for (int r = 0; r < g_size; r++) {
        counts[r] = (int)all[r].v[0];
        displs[r] = (int)total;
        total += counts[r];
    }
    ASSERT(total < INT32_MAX, "dist_same_settings: %lld bytes in all", (long long)total);
    char *texts = g_rank == 0 ? xmalloc((size_t)total + 1) : NULL;
    MPI_Request req;
    dist_check(MPI_Igatherv(mine, (int)len, MPI_CHAR, texts, counts, displs, MPI_CHAR, 0, MPI_COMM_WORLD, &req),
               label);
    dist_wait_all(1, &req, g_timeout, label);
    char verdict[760] = "";   // (room in a Status for the caller's words)
    if (g_rank == 0) compare_settings(texts, counts, displs, verdict, sizeof verdict);
    free(texts);
    free(counts);
    free(displs);
    dist_bcast(verdict, sizeof verdict, label);
    return verdict[0] ? status_err("the ranks' %s differ: %s", what, verdict) : status_ok();
}

#else   // no MPI in this build: a group of one

void dist_init(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (launched_by_mpi() && getenv("OMPI_COMM_WORLD_SIZE") && atoi(getenv("OMPI_COMM_WORLD_SIZE")) > 1) {
        fprintf(stderr, "train: started by mpirun, but this build has no MPI (install libopenmpi-dev and rebuild)\n");
        exit(2);
    }
}
void dist_finalize(void) {}
_Noreturn void dist_abort(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "train: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(code);
}
void dist_barrier(const char *what) { (void)what; }
void dist_sum(double *v, int n, const char *what) { (void)v, (void)n, (void)what; }
void dist_min(double *v, int n, const char *what) { (void)v, (void)n, (void)what; }
void dist_bcast(void *buf, size_t bytes, const char *what) { (void)buf, (void)bytes, (void)what; }
void dist_allgather_rows(double *buf, int64_t n_rows, int64_t row, const char *what) {
    (void)buf, (void)n_rows, (void)row, (void)what;
}
Status dist_agree(Status s, const char *prog) {
    (void)prog;
    return s;
}
Status dist_same_settings(const char *mine, const char *what) {
    (void)mine, (void)what;
    return status_ok();
}

#endif

int dist_default_threads(void) {
    if (g_size == 1 && !g_active) return 0;
    cpu_set_t set;
    int bound = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (bound > 0 && bound < online) return bound;   // the launcher gave this rank its cores
    int t = (int)(online / (g_local > 0 ? g_local : 1));
    return t > 0 ? t : 1;
}
