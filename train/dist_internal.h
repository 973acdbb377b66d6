// dist_internal.h: what dist.c shares with dist_grads.c (not part of the interface).
#ifndef TRAIN_DIST_INTERNAL_H
#define TRAIN_DIST_INTERNAL_H

#include "dist.h"

double dist_now(void);        // monotonic seconds
double dist_timeout(void);    // dist_set_timeout's seconds

#ifdef ATTNLAB_MPI
#include <mpi.h>

#ifdef AG_DOUBLE
#define DIST_REAL MPI_DOUBLE
#else
#define DIST_REAL MPI_FLOAT
#endif

// Abort the job with `what` and MPI's message unless rc is MPI_SUCCESS.
void dist_check(int rc, const char *what);
// Wait for n requests, polling; after `timeout` seconds (0: never) abort the job naming `what`.
void dist_wait_all(int n, MPI_Request *reqs, double timeout, const char *what);
#endif

#endif
