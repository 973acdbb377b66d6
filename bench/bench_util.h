// bench_util.h: what the benchmark programs share.
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stdbool.h>
#include <stdio.h>
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

#endif
