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

static int g_rank = 0, g_size = 1, g_local = 1;
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
    MPI_Comm_free(&local);
    // Errors come back as codes (and are reported with the operation) rather than aborting silently.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (g_size > 1) ag_set_fail_handler(fail_handler);
}

void dist_finalize(void) {
    if (!g_active) return;
    MPI_Finalize();
    g_active = false;
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

void dist_wait_all(int n, MPI_Request *reqs, double timeout, const char *what) {
    double t0 = dist_now();
    for (long spins = 0;; spins++) {
        int done = 0;
        dist_check(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), what);
        if (done) return;
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
        if (timeout > 0 && (spins & 63) == 0 && dist_now() - t0 > timeout)
            dist_abort(5, "%s: no progress for %.0f s: another rank has stopped or hung (a dead rank's own message, "
                          "if any, is above); ending the job ([train] dist_timeout sets this limit)",
                       what, timeout);
    }
}

void dist_barrier(const char *what) {
    if (g_size == 1) return;
    MPI_Request r;
    dist_check(MPI_Ibarrier(MPI_COMM_WORLD, &r), what);
    dist_wait_all(1, &r, g_timeout, what);
}

void dist_sum(double *v, int n, const char *what) {
    if (g_size == 1) return;
    MPI_Request r;
    dist_check(MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &r), what);
    dist_wait_all(1, &r, g_timeout, what);
}

void dist_min(double *v, int n, const char *what) {
    if (g_size == 1) return;
    MPI_Request r;
    dist_check(MPI_Iallreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD, &r), what);
    dist_wait_all(1, &r, g_timeout, what);
}

void dist_bcast(void *buf, size_t bytes, const char *what) {
    if (g_size == 1) return;
    ASSERT(bytes < (size_t)1 << 31, "dist_bcast: %zu bytes", bytes);
    MPI_Request r;
    dist_check(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD, &r), what);
    dist_wait_all(1, &r, g_timeout, what);
}

void dist_allgather_rows(double *buf, int64_t n_rows, int64_t row, const char *what) {
    if (g_size == 1) return;
    ASSERT(n_rows * row < (int64_t)1 << 31, "dist_allgather_rows: %lld x %lld", (long long)n_rows, (long long)row);
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
    MPI_Request r;
    dist_check(MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &r), "setup agreement");
    dist_wait_all(1, &r, 0, "setup agreement");
    if (v[0] == 0) return s;
    if (v[1] > 0) return s.ok ? status_err("rank 0 failed") : s;   // rank 0 tells why; the others stay quiet
    if (!s.ok) fprintf(stderr, "%s: rank %d: %s\n", prog, g_rank, s.msg);
    return status_err("%d of %d ranks failed (their messages, prefixed with the rank, are above)", (int)v[0],
                      g_size);
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
