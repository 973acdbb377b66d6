// The trainer's signal handlers (train/signals.h) beside matrix products:
// oneDNN's JIT kernels point the stack pointer into the heap while they run,
// so a handler on the interrupted stack corrupted the heap (glibc aborted
// with "corrupted size vs. prev_size" within a second of this test before the
// handlers had stacks of their own). Here: signals to every thread of the
// OpenMP team, thousands of them, while the products run on oneDNN (OpenBLAS
// in the float64 build), with allocations in between for glibc to check.
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "blas.h"
#include "signals.h"
#include "test_util.h"

#define MAX_TEAM 64

static atomic_int hits;
static atomic_int stop_bombing;
static pthread_t team[MAX_TEAM];
static int team_n;

static void count(int sig) {
    (void)sig;
    atomic_fetch_add(&hits, 1);
}

static void *bomb(void *arg) {
    (void)arg;
    for (unsigned i = 0; !atomic_load(&stop_bombing); i++) {
        pthread_kill(team[i % team_n], SIGUSR1);
        usleep(20);
    }
    return NULL;
}

Test(signals, handlers_beside_products_leave_the_heap_whole, .timeout = 120) {
    if (onednn_built()) test_use_backend(1);
    static const int sigs[] = {SIGUSR1};
    struct sigaction old[1];
    signals_catch(sigs, 1, count, old);
    team_n = omp_get_max_threads() < MAX_TEAM ? omp_get_max_threads() : MAX_TEAM;
#pragma omp parallel num_threads(team_n)
    team[omp_get_thread_num()] = pthread_self();
    enum { N = 256 };
    real *A = test_randn(N * N, 1), *B = test_randn(N * N, 2), *C = test_randn(N * N, 3);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, bomb, NULL), 0);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int products = 0;
    do {
        gemm(false, false, N, N, N, 1, A, N, B, N, 0, C, N);
        free(malloc(1000 + 977 * (products % 7)));
        products++;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (products < 200 || (t.tv_sec - t0.tv_sec) + 1e-9 * (t.tv_nsec - t0.tv_nsec) < 1.5);
    atomic_store(&stop_bombing, 1);
    pthread_join(th, NULL);
    signals_restore(sigs, 1, old);
    // The products are still right (a handler's frame on a kernel's stack would also clobber its data).
    double worst = 0;
    for (int i = 0; i < N; i += 37)
        for (int j = 0; j < N; j += 41) {
            double s = 0, mag = 0;
            for (int k = 0; k < N; k++) {
                double p = (double)A[i * N + k] * B[k * N + j];
                s += p;
                mag += fabs(p);
            }
            double e = fabs(C[i * N + j] - s) / mag;
            if (e > worst) worst = e;
        }
    // (within K u |A||B| of the exact sum, K = 256)
#ifdef AG_DOUBLE
    cr_assert(worst < 1e-13, "the last product is off by %g", worst);
#else
    cr_assert(worst < 2e-5, "the last product is off by %g", worst);
#endif
    cr_log_info("%d products, %d signals handled", products, atomic_load(&hits));
    cr_assert_gt(atomic_load(&hits), 1000, "only %d signals arrived", atomic_load(&hits));
    free(A);
    free(B);
    free(C);
}
