// dist_nccl.c: the GPU ranks' gradient buckets over NCCL (dist_internal.h),
// started and awaited by dist_grads.c on the same schedule as the CPU
// ranks' MPI buckets. Built with ATTNLAB_NCCL only (CUDA, MPI and NCCL).
//
// Streams: the backward runs on the library's one stream (cu_stream_handle).
// A bucket is scaled there (the same kernel, so the same bits, as the single
// GPU's optim_scale_grads), an event is recorded after it, and the
// communicator's own stream waits for that event before its all-reduce: the
// reduction of the last layers' buckets runs beside the backward of the
// first. Out of place, then copied back on that stream, as the CPU ranks do:
// over a communicator of one the sum is then a copy taken at the moment the
// stream reaches it, so a bucket reduced before its gradient was complete
// would show in the tests (in place, one rank's all-reduce does nothing).
//
// Waiting: an event after the last copy, queried from the host, with
// ncclCommGetAsyncError polled beside it. An error or no progress for the
// timeout aborts the communicator and ends the job with a message naming
// it (dist_abort: MPI_Abort stops every rank).
#include "dist_internal.h"

#ifdef ATTNLAB_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_ops.h"

#ifdef AG_DOUBLE
#define NCCL_REAL ncclFloat64
#else
#define NCCL_REAL ncclFloat32
#endif

struct DistNccl {
    ncclComm_t comm;
    cudaStream_t stream;      // the communicator's
    cudaEvent_t ready, done;  // ready: after a bucket's scaling on the library's stream; done: after the last copy
    cudaEvent_t bwd;          // the backward's end on the library's stream (timing the reduction left after it)
    bool marked;              // bwd recorded for this step
};

// Ends the job when a CUDA call failed (what names it).
static void cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) dist_abort(4, "GPU gradient reduction: %s: %s", what, cudaGetErrorString(e));
}

static void nccl_ok(DistNccl *c, ncclResult_t r, const char *what) {
    if (r == ncclSuccess) return;
    char last[300] = "";   // (NCCL's words, kept before the abort)
    if (c && c->comm) {
        const char *l = ncclGetLastError(c->comm);
        snprintf(last, sizeof last, "%s", l ? l : "");
        ncclCommAbort(c->comm);
    }
    dist_abort(4, "GPU gradient reduction: %s failed: %s%s%s", what, ncclGetErrorString(r), last[0] ? ": " : "", last);
}

DistNccl *dist_nccl_new(char *err, size_t n) {
    // Rank 0's id, or why it has none, reaches every rank in one broadcast.
    struct {
        ncclUniqueId id;
        char why[200];
    } hello;
    memset(&hello, 0, sizeof hello);
    if (dist_rank() == 0) {
        ncclResult_t r = ncclGetUniqueId(&hello.id);
        if (r != ncclSuccess) snprintf(hello.why, sizeof hello.why, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    }
    dist_bcast(&hello, sizeof hello, "NCCL set-up");
    if (hello.why[0]) {
        snprintf(err, n, "rank 0: %s", hello.why);
        return NULL;
    }
    int version = 0;
    ncclGetVersion(&version);
    DistNccl *c = xcalloc(1, sizeof *c);
    ncclResult_t r = ncclCommInitRank(&c->comm, dist_size(), hello.id, dist_rank());
    if (r != ncclSuccess) {
        snprintf(err, n, "ncclCommInitRank (NCCL %d, rank %d of %d): %s", version, dist_rank(), dist_size(),
                 ncclGetErrorString(r));
        free(c);
        // The others may be waiting inside their own ncclCommInitRank, where no
        // agreement reaches them: end the job from here (MPI_Abort stops them).
        if (dist_size() > 1) dist_abort(4, "%s", err);
        return NULL;
    }
    cuda_ok(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_ok(cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&c->done), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&c->bwd), "cudaEventCreate");
    return c;
}

void dist_nccl_free(DistNccl *c) {
    if (!c) return;
    cudaStreamSynchronize(c->stream);
    ncclCommDestroy(c->comm);
    cudaEventDestroy(c->ready);
    cudaEventDestroy(c->done);
    cudaEventDestroy(c->bwd);
    cudaStreamDestroy(c->stream);
    free(c);
}

void dist_nccl_bucket(DistNccl *c, real *grad, real *recv, int64_t n, double weight) {
    cudaStream_t main = (cudaStream_t)cu_stream_handle();
    if (weight != 1.0) device_kernels(DEVICE_CUDA)->scale(grad, n, (real)weight);   // this rank's share
    // (One event serves every bucket: a wait takes the record made just before it.)
    cuda_ok(cudaEventRecord(c->ready, main), "cudaEventRecord");
    cuda_ok(cudaStreamWaitEvent(c->stream, c->ready, 0), "cudaStreamWaitEvent");
    nccl_ok(c, ncclAllReduce(grad, recv, (size_t)n, NCCL_REAL, ncclSum, c->comm, c->stream), "ncclAllReduce");
    cuda_ok(cudaMemcpyAsync(grad, recv, (size_t)n * sizeof(real), cudaMemcpyDeviceToDevice, c->stream),
            "copying a reduced bucket back");
}

void dist_nccl_backward_end(DistNccl *c) {
    cuda_ok(cudaEventRecord(c->bwd, (cudaStream_t)cu_stream_handle()), "cudaEventRecord");
    c->marked = true;
}

double dist_nccl_wait(DistNccl *c, double timeout) {
    cuda_ok(cudaEventRecord(c->done, c->stream), "cudaEventRecord");
    double t0 = dist_now();
    for (long spins = 0;; spins++) {
        cudaError_t e = cudaEventQuery(c->done);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) cuda_ok(e, "waiting for the reduction");
        ncclResult_t async = ncclSuccess;
        nccl_ok(c, ncclCommGetAsyncError(c->comm, &async), "ncclCommGetAsyncError");
        if (async != ncclInProgress) nccl_ok(c, async, "the reduction");
        if (dist_pause(t0, spins, timeout)) {
            ncclCommAbort(c->comm);
            c->comm = NULL;
            dist_abort(5, "GPU gradient reduction: no progress for %.0f s: another rank has stopped or hung (a dead "
                          "rank's own message, if any, is above); ending the job ([train] dist_timeout sets this "
                          "limit)",
                       timeout);
        }
    }
    // Whatever the library's stream runs next (clipping, the update) comes after the reduction.
    cuda_ok(cudaStreamWaitEvent((cudaStream_t)cu_stream_handle(), c->done, 0), "cudaStreamWaitEvent");
    // The GPU's time from the backward's end to the reduction's (0: it ended first, or the backward is
    // still running, which leaves nothing of the reduction after it).
    float ms = 0;
    if (c->marked && cudaEventQuery(c->bwd) == cudaSuccess)
        cuda_ok(cudaEventElapsedTime(&ms, c->bwd, c->done), "cudaEventElapsedTime");
    c->marked = false;
    return ms > 0 ? 1e-3 * ms : 0;
}

#else
typedef int dist_nccl_unused;   // (a build without NCCL compiles nothing here)
#endif
