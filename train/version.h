// version.h: every program's --version.
#ifndef VERSION_H
#define VERSION_H

#include <stdbool.h>

// When argv[1] is --version: print "<prog> (attnlab <version>, float32|float64
// build[, CUDA][, MPI])" on stdout and return true (the program exits 0).
bool program_version(int argc, char **argv, const char *prog);

#endif
