#include "test_util.h"

#include <math.h>

jmp_buf test_fail_jmp;
void test_fail_handler(const char *msg) {
    (void)msg;
    longjmp(test_fail_jmp, 1);
}

void fill_normal(Tensor *t, uint64_t seed, double std) {
    Rng r;
    rng_seed(&r, seed);
    for (int64_t i = 0; i < t->numel; i++) t->data[i] = (real)(std * rng_normal(&r));
}

void fill_uniform(Tensor *t, uint64_t seed, double lo, double hi) {
    Rng r;
    rng_seed(&r, seed);
    for (int64_t i = 0; i < t->numel; i++) t->data[i] = (real)rng_range(&r, lo, hi);
}

double max_rel_diff(const real *a, const real *b, int64_t n) {
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        scale = fmax(scale, fmax(fabs((double)a[i]), fabs((double)b[i])));
        worst = fmax(worst, fabs((double)a[i] - (double)b[i]));
    }
    return scale > 0 ? worst / scale : worst;
}
