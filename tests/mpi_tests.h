// mpi_tests.h: what the files of the mpi_tests binary share (mpi_tests.c).
#ifndef TESTS_MPI_TESTS_H
#define TESTS_MPI_TESTS_H

#ifndef MPIEXEC
#define MPIEXEC "mpiexec"
#endif

typedef struct Run {
    char dir[1300];      // run folder
    char err[2600];      // its stderr
    int code;
} Run;

// The test's tiny.ini (setup_config): a tiny model, a batch of 5 windows, 2
// micro-batches per step, 12 steps, evaluations and checkpoints every 6,
// a constant learning rate of 3e-3; OMP_NUM_THREADS=1.
extern const char *cfg_path;
void setup_config(const char *tag);

// Float32 rounding through a dozen steps of a tiny model: the sums over the
// batch happen in another order (per rank, then across ranks), so the losses
// and weights of N ranks and of one process differ in the last bits, which
// training then carries along. Measured: at most 2e-6 in the losses over
// these 12 steps (the logs keep 6 decimals).
#ifdef AG_DOUBLE
#define LOSS_TOL 2e-6   // (the logs' resolution)
#define PARAM_TOL 1e-12
#else
#define LOSS_TOL 2e-5
#define PARAM_TOL 1e-5
#endif

// `train --config cfg_path --set train.run_dir=<folder>/<name> extra...` on
// np ranks (0: without mpirun); asserts that it exits 0.
Run run(const char *name, int np, const char *const *extra);
// The run's metrics.jsonl (free()).
char *metrics(const Run *r);
// The largest difference of the two runs' logged losses over steps [from, to].
double loss_diff(const Run *a, const Run *b, int from, int to);
// max_rel_diff of the two runs' final parameters (their checkpoints).
double param_diff(const Run *a, const Run *b);

#endif
