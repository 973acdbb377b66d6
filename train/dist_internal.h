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
// One round of a polling wait that began at t0 (dist_now), `spins` rounds
// ago: yield or sleep a little; true once `timeout` seconds (> 0) have passed.
bool dist_pause(double t0, long spins, double timeout);
// Wait for n requests, polling; after `timeout` seconds (0: never) abort the job naming `what`.
void dist_wait_all(int n, MPI_Request *reqs, double timeout, const char *what);
// Every rank's record (by rank) once every rank has stated `what` with n (<=
// DIST_RECORD_VALUES) values; when the ranks are at different collectives,
// every rank stops (rank 0 says which rank is where). timeout as in dist_wait_all.
const DistRecord *dist_records(const char *what, const double *v, int n, double timeout);
// A gradient reduction begins (counted in the records, for the message).
void dist_count_step(void);

#ifdef ATTNLAB_NCCL
// The GPU ranks' communicator (dist_nccl.c): rank 0's NCCL id reaches the
// others over MPI (a group of one makes its own); NULL with why in err.
typedef struct DistNccl DistNccl;
DistNccl *dist_nccl_new(char *err, size_t n);
void dist_nccl_free(DistNccl *c);
// Bucket [grad, grad + n) in GPU memory, complete on the library's stream:
// scaled there by weight (unless 1), then summed over the ranks on the
// communicator's stream into recv and copied back.
void dist_nccl_bucket(DistNccl *c, real *grad, real *recv, int64_t n, double weight);
// The backward has been queued to its end (on the library's stream).
void dist_nccl_backward_end(DistNccl *c);
// Every bucket started is reduced and back in place (and the library's
// stream will run after it); errors and `timeout` seconds without progress
// end the job. Returns the seconds the reduction ran on the GPU after the
// backward's end (dist_nccl_backward_end; 0 when it ended first).
double dist_nccl_wait(DistNccl *c, double timeout);
#endif
#endif

#endif
