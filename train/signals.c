// signals.c: signal handlers on alternate stacks (signals.h says why).
#include "signals.h"

#include <stdlib.h>
#include <unistd.h>

#define ALT_STACK_BYTES (64 << 10)

// This thread's alternate stack, made once (threads keep theirs: OpenMP's
// pool lives as long as the process). A stack someone else gave the thread
// (e.g. AddressSanitizer's) is kept.
static _Thread_local void *own_stack;

static void stack_this_thread(void) {
    stack_t cur;
    if (own_stack || sigaltstack(NULL, &cur) != 0 || !(cur.ss_flags & SS_DISABLE)) return;
    size_t bytes = ALT_STACK_BYTES;
#ifdef _SC_SIGSTKSZ
    long min = sysconf(_SC_SIGSTKSZ);   // (the CPU's register state: larger with AVX-512)
    if (min > 0 && (size_t)min * 4 > bytes) bytes = (size_t)min * 4;
#endif
    stack_t ss = {.ss_sp = malloc(bytes), .ss_size = bytes, .ss_flags = 0};
    if (ss.ss_sp && sigaltstack(&ss, NULL) == 0) own_stack = ss.ss_sp;
    else free(ss.ss_sp);   // (then the handler runs where the thread is, as before)
}

void signals_catch(const int *sigs, int n, void (*handler)(int), struct sigaction *old) {
    stack_this_thread();
#pragma omp parallel
    stack_this_thread();
    struct sigaction sa = {0};
    sa.sa_handler = handler;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < n; i++) sigaction(sigs[i], &sa, &old[i]);
}

void signals_restore(const int *sigs, int n, const struct sigaction *old) {
    for (int i = 0; i < n; i++) sigaction(sigs[i], &old[i], NULL);
}
