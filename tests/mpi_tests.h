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

#endif
