// decode_kernel_bench: how close attention's decoding kernel
// (attn_decode_forward) comes to the machine's memory bandwidth.
//
//   decode_kernel_bench [layers=4] [reps=50]
//
// Per decoded token, attention reads every cached key and value once: at a
// long context the kernel is a stream over the cache. For the tiny configs'
// shape (H 4, dk = dv 32, batch 1) and `layers` caches of n positions each,
// n = 2k, 16k and 64k, it prints the kernel's rate (bytes of keys and values
// read per second, best of 3 runs of `reps` tokens) and, in the same run, a
// plain read stream over as many bytes (a vector sum: what one pass over
// memory takes here), on one thread and on all. 2k positions fit in the
// caches (4 layers x 2 MB); 16k and 64k (64 and 256 MB) come from memory.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "attn_kernel.h"
#include "tile_mm.h"   // vreal, VL: the vectors the kernels use
#include "bench_util.h"
#include "runlog.h"

enum { H = 4, DK = 32, DV = 32 };

// Best seconds of 3 runs of body.
#define BEST3(secs, body)                                   \
    do {                                                    \
        secs = 1e30;                                        \
        for (int run_ = 0; run_ < 3; run_++) {              \
            double t0_ = omp_get_wtime();                   \
            body;                                           \
            double dt_ = omp_get_wtime() - t0_;             \
            secs = dt_ < secs ? dt_ : secs;                 \
        }                                                   \
    } while (0)

// A read stream over n reals (a whole number of 4 vectors, aligned): a
// vector sum split among the threads.
static real stream_sum(const real *a, size_t n) {
    real tot = 0;
#pragma omp parallel reduction(+ : tot)
    {
        vreal s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
#pragma omp for schedule(static)
        for (size_t i = 0; i < n; i += 4 * VL) {
            s0 += *(const vreal *)(a + i);
            s1 += *(const vreal *)(a + i + VL);
            s2 += *(const vreal *)(a + i + 2 * VL);
            s3 += *(const vreal *)(a + i + 3 * VL);
        }
        vreal s = (s0 + s1) + (s2 + s3);
        for (int j = 0; j < VL; j++) tot += s[j];
    }
    return tot;
}

int main(int argc, char **argv) {
    if (bench_help(argc, argv, "usage: decode_kernel_bench [layers=4] [reps=50]\n")) return 0;
    int L = argc > 1 ? atoi(argv[1]) : 4, reps = argc > 2 ? atoi(argv[2]) : 50;
    if (L < 1 || L > 64 || reps < 1) {
        fprintf(stderr, "decode_kernel_bench: layers 1..64, reps >= 1\n");
        return 2;
    }
    int all = omp_get_max_threads();
    char cpu[256];
    runlog_cpu_name(cpu, sizeof cpu);
    printf("decode_kernel_bench: %s, %d threads at most; H %d, dk = dv = %d, %d layers' caches, batch 1\n", cpu, all,
           H, DK, L);
    printf("| positions | cache MB | threads | kernel GB/s | read stream GB/s | kernel / stream |\n");
    printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const int ns[] = {2048, 16384, 65536};
    real q[H * DK], o[H * DV];
    for (int i = 0; i < H * DK; i++) q[i] = (real)(0.01 * (i % 17));
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        int n = ns[t];
        size_t per = (size_t)n * H * DK;   // reals of one layer's keys (= its values)
        real *k = xmalloc(L * per * sizeof(real)), *v = xmalloc(L * per * sizeof(real));
        real *a = xaligned(2 * L * per * sizeof(real));
        for (size_t i = 0; i < L * per; i++) k[i] = (real)((i * 7919) % 1000 * 1e-3);
        for (size_t i = 0; i < L * per; i++) v[i] = (real)((i * 104729) % 1000 * 1e-3);
        for (size_t i = 0; i < 2 * L * per; i++) a[i] = (real)(i & 1023);
        double bytes = 2.0 * L * per * sizeof(real);
        int threads[2] = {1, all};
        for (int ti = 0; ti < (all > 1 ? 2 : 1); ti++) {
            omp_set_num_threads(threads[ti]);
            double ks, ss;
            volatile real sink = 0;
            BEST3(ks, for (int r = 0; r < reps; r++) for (int l = 0; l < L; l++)
                          attn_decode_forward(o, q, k + l * per, v + l * per, 1, n, n, NULL, H, DK, DV, 0.17));
            BEST3(ss, for (int r = 0; r < reps; r++) sink += stream_sum(a, 2 * L * per));
            double kg = bytes * reps / ks / 1e9, sg = bytes * reps / ss / 1e9;
            printf("| %d | %.0f | %d | %.1f | %.1f | %.2f |\n", n, bytes / 1e6, threads[ti], kg, sg, kg / sg);
        }
        omp_set_num_threads(all);
        free(k), free(v), free(a);
    }
    return 0;
}
