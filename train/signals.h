// signals.h: catching SIGINT, SIGTERM and SIGUSR1 safely beside oneDNN.
//
// oneDNN's JIT float32 GEMM kernels point the stack pointer into a heap
// buffer while they run (oneDNN issue #4845, present in Debian's 2.6.3). A
// handler that runs on the interrupted stack then writes its signal frame
// into the heap, and glibc aborts later ("corrupted size vs. prev_size"):
// Ctrl-C or mpirun's SIGTERM in the middle of a product crashed a run instead
// of saving its checkpoint. So the handlers run on an alternate stack
// (sigaltstack, SA_ONSTACK) of their own, given to the calling thread and to
// every thread of the OpenMP team, where the products run.
#ifndef SIGNALS_H
#define SIGNALS_H

#include <signal.h>

// Install handler for sigs[0..n) with SA_ONSTACK, after giving the calling
// thread and each thread of the OpenMP team (omp_get_max_threads) an
// alternate signal stack where it has none; the previous actions go to old.
void signals_catch(const int *sigs, int n, void (*handler)(int), struct sigaction *old);
// Put back the actions signals_catch replaced (the stacks stay, for the next).
void signals_restore(const int *sigs, int n, const struct sigaction *old);

#endif
