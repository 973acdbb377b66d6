// test_device_kernels.c: the CPU's DeviceKernels (device.h): every entry
// set, and the finite search the finite check of parameters and moments
// (optim_nonfinite_param) now makes on either device.
#include <math.h>
#include <omp.h>
#include <string.h>

#include "device.h"
#include "optim_kernels.h"
#include "test_util.h"

Test(device_kernels, the_cpu_table_sets_every_entry) {
    test_assert_kernels_set(device_kernels(DEVICE_CPU), "cpu");
    cr_assert_eq(device_kernels(DEVICE_CPU)->sumsq, optim_cpu_sumsq);
}

Test(device_kernels, first_nonfinite_finds_the_first_across_blocks) {
    int64_t n = 3 * 4096 + 17;   // blocks of the vectorised pass, and a short last one
    real *x = test_randn(n, 5);
    const DeviceKernels *k = device_kernels(DEVICE_CPU);
    cr_assert_eq(k->first_nonfinite(x, n), -1);
    cr_assert_eq(k->first_nonfinite(x, 0), -1);
    x[n - 1] = (real)INFINITY;
    cr_assert_eq(k->first_nonfinite(x, n), n - 1);
    cr_assert_eq(k->first_nonfinite(x, n - 1), -1);
    x[4096 + 5] = (real)-INFINITY;
    cr_assert_eq(k->first_nonfinite(x, n), 4096 + 5);
    x[4096 + 4000] = (real)NAN;   // a later one in the same block changes nothing
    cr_assert_eq(k->first_nonfinite(x, n), 4096 + 5);
    x[4095] = (real)NAN;          // the last of the block before
    cr_assert_eq(k->first_nonfinite(x, n), 4095);
    free(x);
}

Test(device_kernels, first_nonfinite_is_the_least_index_on_any_thread_count) {
    // Past the size the threads share (blocks of 4096): failures in the
    // blocks of different threads, the least one wins whoever finds it.
    int64_t n = 64 * 4096 + 333;
    real *x = test_randn(n, 6);
    const DeviceKernels *k = device_kernels(DEVICE_CPU);
    const int64_t at[] = {n - 1, 40 * 4096 + 7, 17 * 4096, 3 * 4096 + 4095, 5};
    int saved = omp_get_max_threads();
    for (size_t j = 0; j < sizeof at / sizeof at[0]; j++) {
        x[at[j]] = (real)(j % 2 ? NAN : -INFINITY);   // each earlier than the ones before
        for (int nt = 1; nt <= 4; nt++) {
            omp_set_num_threads(nt);
            cr_assert_eq(k->first_nonfinite(x, n), at[j], "threads %d: failure %zu at %lld", nt, j, (long long)at[j]);
        }
    }
    omp_set_num_threads(saved);
    free(x);
}
