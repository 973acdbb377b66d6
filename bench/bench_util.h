// bench_util.h: what the benchmark programs share.
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// --help or -h anywhere among the arguments: print `usage` on stdout; the
// caller then returns 0 (a benchmark never starts measuring on --help).
static inline bool bench_help(int argc, char **argv, const char *usage) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return true;
        }
    return false;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median of x[0..n-1] (sorts x).
static inline double bench_median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, bench_cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

// A comma list of names ("attn,gdn") into out (at most max, each cut to 15
// characters); returns how many.
static inline int bench_parse_names(const char *s, char out[][16], int max) {
    int n = 0;
    while (*s && n < max) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        snprintf(out[n++], 16, "%.*s", (int)len, s);
        s += len + (e ? 1 : 0);
    }
    return n;
}

// argv[i] as an integer in [lo, hi], def when absent; anything else is
// named (prog, name, the value) on stderr and the program exits with 2.
static inline int bench_int_arg(const char *prog, int argc, char **argv, int i, int def, int lo, int hi,
                                const char *name) {
    if (argc <= i) return def;
    char *end;
    long x = strtol(argv[i], &end, 10);
    if (end == argv[i] || *end || x < lo || x > hi) {
        fprintf(stderr, "%s: %s must be an integer in [%d, %d], not '%.40s'\n", prog, name, lo, hi, argv[i]);
        exit(2);
    }
    return (int)x;
}

#endif
