// fork_bench: what one OpenMP parallel region costs beyond its work, under
// the wait policy of the environment (OMP_WAIT_POLICY, GOMP_SPINCOUNT), after
// a gap of serial work on the calling thread. A training step forks a few
// hundred regions (bench/spin_bench.sh); when the other threads sleep between
// them (PASSIVE), each region first wakes them, and on a virtual machine the
// wake goes through the hypervisor.
//
//   fork_bench [REGIONS=2000]
//
// For gaps of 0, 5, 20 and 80 us: REGIONS times, busy-wait `gap` us on the
// calling thread, then time one region in which every thread busy-waits
// 20 us. Prints the mean region time less 20 us.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "model_setup.h"
#include "runlog.h"

static void busy_us(double us) {
    double t0 = runlog_now();
    while ((runlog_now() - t0) * 1e6 < us) {
    }
}

int main(int argc, char **argv) {
    if (bench_help(argc, argv,
                   "usage: fork_bench [REGIONS=2000]\n"
                   "  the cost of one OpenMP parallel region beyond its 20 us of work, after a gap of\n"
                   "  0, 5, 20 and 80 us of serial work, under OMP_WAIT_POLICY / GOMP_SPINCOUNT as set\n"))
        return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    if (n < 1 || n > 10000000) {
        fprintf(stderr, "fork_bench: REGIONS must be 1 .. 10000000, not '%s'\n", argv[1]);
        return 2;
    }
    const char *pol = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
    printf("fork_bench: %d threads, OMP_WAIT_POLICY=%s, GOMP_SPINCOUNT=%s, %d regions per gap\n",
           omp_get_max_threads(), pol ? pol : "(unset)", spin ? spin : "(unset)", n);
    const int gaps[] = {0, 5, 20, 80};
    for (size_t g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
        double total = 0;
        for (int i = 0; i < n; i++) {
            busy_us(gaps[g]);
            double t0 = runlog_now();
#pragma omp parallel
            busy_us(20);
            total += runlog_now() - t0;
        }
        printf("gap %2d us: a region costs %6.1f us beyond its work\n", gaps[g], total / n * 1e6 - 20);
    }
    return 0;
}
