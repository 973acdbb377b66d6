// dist_internal.h: what dist.c shares with dist_grads.c (not part of the interface).
#ifndef TRAIN_DIST_INTERNAL_H
#define TRAIN_DIST_INTERNAL_H

#include "dist.h"

double dist_now(void);        // monotonic seconds
double dist_timeout(void);    // dist_set_timeout's seconds

// What a rank states at each checked collective (dist.c): it is about to
// run `label`, after `seq` such exchanges and `steps` gradient reductions;
// small payloads travel in v.
#define DIST_RECORD_VALUES 4
typedef struct DistRecord {
    char label[48];
    int64_t seq;
    int64_t steps;
    double v[DIST_RECORD_VALUES];
} DistRecord;

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
// Every rank's record (by rank) once every rank has stated `what` with n (<=
// DIST_RECORD_VALUES) values; when the ranks are at different collectives,
// every rank stops (rank 0 says which rank is where). timeout as in dist_wait_all.
const DistRecord *dist_records(const char *what, const double *v, int n, double timeout);
// A gradient reduction begins (counted in the records, for the message).
void dist_count_step(void);
#endif

#endif
