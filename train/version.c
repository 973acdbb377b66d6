#include "version.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

#ifndef ATTNLAB_VERSION
#define ATTNLAB_VERSION "unknown"
#endif

bool program_version(int argc, char **argv, const char *prog) {
    if (argc < 2 || strcmp(argv[1], "--version") != 0) return false;
    // What a bug report needs besides the version: the precision and the optional backends compiled in.
    const char *cuda = "", *mpi = "";
#ifdef AG_CUDA
    cuda = ", CUDA";
#endif
#ifdef ATTNLAB_MPI
    mpi = ", MPI";
#endif
    printf("%s (attnlab %s, %s build%s%s)\n", prog, ATTNLAB_VERSION, sizeof(real) == 8 ? "float64" : "float32", cuda,
           mpi);
    return true;
}
