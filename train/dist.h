// dist.h: data-parallel training over processes (MPI), behind one small
// interface. A process that no MPI launcher started is a group of one: every
// call below returns at once and MPI is never initialised (no start-up cost),
// so the single-process path is the same code.
//
//   dist_init(&argc, &argv);            // MPI_Init only under mpirun (OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK)
//   ... dist_rank(), dist_size(), dist_barrier(), dist_sum(v, n) ...
//   DistGrads *g = dist_grads_new(&ps, zero, timeout);   // buckets of the trainable gradients
//   per step, on the last micro-batch:
//       forward; dist_grads_arm(g, &tape, weight); tape_backward(...); dist_grads_flush(g);
//       dist_grads_wait(g);             // the gradient block holds sum_r weight_r * g_r
//   dist_finalize();
//
// Gradients are reduced in buckets of contiguous trainable parameters, taken
// in reverse registration order (the order the backward completes them). A
// parameter's gradient is complete once the backward of the earliest tape
// node that reads it has run; dist_grads_arm records, per bucket, the index
// of that node, and a hook after each backward node starts the bucket's
// non-blocking collective as soon as it is complete, so the reduction of the
// last layers overlaps the backward of the first. Buckets start strictly in
// order, so every rank issues the same collectives in the same order, and the
// sums do not depend on timing: fixed buckets, MPI's algorithm fixed by the
// sizes and the rank count.
//
// The GPU ranks (dist_grads_new_nccl) reduce the same buckets with NCCL on a
// stream of their own, each after a CUDA event that follows its gradient's
// last kernel (dist_nccl.c).
//
// Plain data parallel (zero = 0): MPI_Iallreduce of each bucket into a second
// block, copied back as it completes. ZeRO-1 (zero = 1): the flat block is cut
// into one contiguous slice per rank (dist_grads_slice); each bucket is
// reduce-scattered (MPI_Ireduce_scatter, the bucket's intersection with each
// slice as the counts), so a rank holds the summed gradient of its slice
// only, updates that slice (an optimizer sharded with optim_set_shard), and
// dist_params_allgather brings every rank the whole updated block.
//
// Every wait polls with MPI_Test and gives up after `timeout` seconds with
// MPI_Abort and a message naming the operation: a rank that hangs ends the
// job instead of leaving the others waiting forever.
//
// Ranks that take different paths (a setting or an argument only one rank
// has, a rank that stopped alone) would otherwise post different
// collectives, which Open MPI answers with an internal error or a wait
// without end. Every collective here but the gradient buckets and the ZeRO-1
// all-gather is preceded by (or carried in) a small exchange of what each
// rank is about to do (dist.c, "checked collectives"), and dist_grads_arm and
// dist_finalize make one too: the first time the ranks disagree, every rank
// stops with one message naming where each one is. dist_same_settings
// compares the ranks' settings before the first step.
#ifndef TRAIN_DIST_H
#define TRAIN_DIST_H

#include "optim.h"
#include "params.h"
#include "tape.h"

// Start (under an MPI launcher) or not; idempotent. Errors abort with a message.
void dist_init(int *argc, char ***argv);
void dist_finalize(void);
int dist_rank(void);
int dist_size(void);
// Ranks of this job on this machine (1 when not launched by mpirun).
int dist_local_size(void);
// This rank's place among them, 0 .. dist_local_size() - 1 (the GPU it takes).
int dist_local_rank(void);
// Is MPI in use (size > 1 or launched by mpirun)?
bool dist_active(void);
// The seconds every wait below allows before it aborts the job (default 300).
void dist_set_timeout(double seconds);
// A barrier (with the timeout).
void dist_barrier(const char *what);
// In-place sum over ranks of n doubles (with the timeout).
void dist_sum(double *v, int n, const char *what);
// In-place minimum over ranks of n doubles (with the timeout).
void dist_min(double *v, int n, const char *what);
// Broadcast bytes from rank 0 (with the timeout).
void dist_bcast(void *buf, size_t bytes, const char *what);
// buf holds n_rows rows of row doubles, of which this rank has filled its
// share (dist_share(n_rows, rank, size)); afterwards every rank has all rows
// (with the timeout).
void dist_allgather_rows(double *buf, int64_t n_rows, int64_t row, const char *what);
// Ends the whole job: prints "train: rank R: <message>" and calls MPI_Abort
// (exit(code) in a single process).
_Noreturn void dist_abort(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Setup agreement: every rank passes its own status; returns the job's. When
// rank 0 failed, only it has printed... nothing: the caller prints s.msg on
// rank 0 only. When other ranks failed, each prints its message prefixed with
// its rank, and every rank gets an error saying which ranks failed.
Status dist_agree(Status s, const char *prog);

// Start-up: are the ranks' settings the same? `mine` holds this rank's as
// lines "name = value" (the same names in the same order on every rank, no
// newline in a value). Rank 0 compares every rank's with its own; every
// rank gets the same verdict: ok, or an error naming each rank that differs,
// the names and both values: "the ranks' <what> differ: rank 1: train.lr =
// 0.001, rank 0 has 0.002; ...". (A group of one: ok.)
Status dist_same_settings(const char *mine, const char *what);

// This rank's share of n items split in contiguous parts (uneven splits: the
// first n % size ranks get one more): [*lo, *hi).
void dist_share(int64_t n, int rank, int size, int64_t *lo, int64_t *hi);

// The threads a rank should use when neither [train] threads nor
// OMP_NUM_THREADS says: the CPUs the launcher bound it to, or the machine's
// CPUs divided among the ranks on it. 0: keep OpenMP's default (one process).
int dist_default_threads(void);

// ---------------------------------------------------------------- gradients

typedef struct DistGrads DistGrads;

typedef struct DistStats {
    int64_t steps;            // reductions completed
    double wait_s;            // time blocked in dist_grads_wait after the backward: the communication
                              // not hidden, and waiting for a slower rank (dist_grads_times tells them apart)
    double comm_s;            // time from the first bucket's start to the last one's completion
    int64_t bytes;            // bytes reduced per step (the trainable gradient)
    int n_buckets;
    int64_t started_in_backward;   // buckets started by the backward's hook (over all steps), not after it
} DistStats;

// Buckets of at most bucket_bytes over ps's trainable parameters (frozen
// ones are not reduced); 0: DIST_BUCKETS buckets of the trainable gradient,
// each between DIST_BUCKET_MIN and DIST_BUCKET_MAX bytes. zero: ZeRO-1
// (reduce-scatter into this rank's slice). NULL when size is 1: every
// dist_grads_* call accepts NULL and does nothing.
//
// Small buckets end the backward with less left to reduce (the parameters
// the forward reads first complete last, and only their bucket is then still
// to go); each bucket costs a collective's latency.
DistGrads *dist_grads_new(ParamStore *ps, bool zero, size_t bucket_bytes);
// The GPU ranks' reduction (device = cuda; builds with NCCL, docs/cuda.md):
// the same buckets and schedule over ps's gradient block, which is on the
// GPU already, reduced by NCCL (plain data parallel: no ZeRO-1). Every rank
// calls it; in a group of one it makes a communicator of one (the tests'
// way to run this path on one GPU). NULL with why in err.
DistGrads *dist_grads_new_nccl(ParamStore *ps, size_t bucket_bytes, char *err, size_t n);
// Does this build have it (CUDA, MPI and NCCL)?
bool dist_nccl_built(void);
void dist_grads_free(DistGrads *g);
#define DIST_BUCKETS 16
#define DIST_BUCKET_MIN ((size_t)256 << 10)
#define DIST_BUCKET_MAX ((size_t)16 << 20)
// This rank's slice [*lo, *hi) of the flat block (ZeRO-1 shards the optimizer
// over it; the gradient norm sums over it in both modes).
void dist_grads_slice(const DistGrads *g, int64_t *lo, int64_t *hi);
// Before the backward of the last micro-batch (the tape recorded): scale
// this rank's gradients by `weight` as each bucket starts (the trainer: 1 /
// accum_steps; its loss is already its share of the global batch's mean, see
// Tape.loss_rows), and hook the tape to start the buckets.
void dist_grads_arm(DistGrads *g, Tape *tp, double weight);
// After that backward: start the buckets not started yet, unhook the tape.
void dist_grads_flush(DistGrads *g);
// Wait for every bucket; the summed gradients are then in ps->grad (all of
// it; ZeRO-1: this rank's slice).
void dist_grads_wait(DistGrads *g);
// ZeRO-1 after the update: every rank gets every trainable parameter.
void dist_params_allgather(DistGrads *g);
// Gather a sharded optimizer's moments into full (numel) blocks on rank 0
// (m_full/v_full may be NULL elsewhere; v NULL for SGD).
void dist_gather_moments(DistGrads *g, const Optimizer *opt, real *m_full, real *v_full);
// Do all ranks hold the same parameters? (a CRC of the block, compared).
bool dist_params_agree(const DistGrads *g);
DistStats dist_grads_stats(const DistGrads *g);
// When each reduction's backward ended (dist_grads_flush; GPU ranks: when
// the GPU finished it, from CUDA events, on the host's clock) and when the
// reduction was complete here (dist_grads_wait), in seconds of
// CLOCK_MONOTONIC, which the ranks of one machine share: the communication
// left after the backward is max over ranks of done - max over ranks of
// bwd_end. The first DIST_MAX_WAITS steps; returns how many.
#define DIST_MAX_WAITS 65536
int dist_grads_times(const DistGrads *g, const double **bwd_end, const double **done);

#endif
