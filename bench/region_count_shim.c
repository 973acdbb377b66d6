// region_count_shim.c: an LD_PRELOAD library for bench/region_count.sh. It
// wraps libgomp's GOMP_parallel (what `#pragma omp parallel` compiles to)
// and counts, per outlined function, the regions that fork more than one
// thread (an `if` clause that is false passes num_threads 1: no fork). At
// exit it writes "forked N serial M" and one line per function (count,
// object file, offset of the function in it) to the file named by
// REGION_COUNT_OUT, for addr2line to name.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);

#define MAX_SITES 4096
static void *site_fn[MAX_SITES];
static long site_n[MAX_SITES], forked, serial;
static int n_sites;

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    static gomp_parallel_fn real_parallel;
    if (!real_parallel) real_parallel = (gomp_parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
    if (num_threads == 1) {
        __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED);
    } else {   // called from the program's serial part (nested regions do not fork)
        forked++;
        int i = 0;
        while (i < n_sites && site_fn[i] != (void *)fn) i++;
        if (i == n_sites && n_sites < MAX_SITES) site_fn[n_sites++] = (void *)fn;
        if (i < MAX_SITES) site_n[i]++;
    }
    real_parallel(fn, data, num_threads, flags);
}

__attribute__((destructor)) static void region_count_report(void) {
    const char *path = getenv("REGION_COUNT_OUT");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f) return;
    fprintf(f, "forked %ld serial %ld\n", forked, serial);
    for (int i = 0; i < n_sites; i++) {
        Dl_info info;
        if (dladdr(site_fn[i], &info) && info.dli_fname)
            fprintf(f, "%ld %s 0x%lx\n", site_n[i], info.dli_fname,
                    (unsigned long)((char *)site_fn[i] - (char *)info.dli_fbase));
    }
    fclose(f);
}
