#include "test_util.h"

#include <math.h>
#include <stdlib.h>

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

const char *test_scratch_corpus(const char *tag) {
    static char dir[256];
    snprintf(dir, sizeof dir, "/tmp/attnlab_%s_XXXXXX", tag);
    cr_assert_not_null(mkdtemp(dir));
    char path[512];
    snprintf(path, sizeof path, "%s/corpus.txt", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    Rng r;
    rng_seed(&r, 9);
    const char *words[] = {"the ", "light ", "and ", "darkness ", "was ", "good ", "evening ", "morning ", "day.\n"};
    for (int i = 0; i < 4000; i++) fputs(words[rng_below(&r, 9)], f);
    fclose(f);
    return dir;
}
