// common.h: the scalar type, always-on asserts, checked allocation and I/O.
//
// The library builds in float32 (default) or float64 (-DAG_DOUBLE) from the
// same source; `real` is the scalar type of every tensor.
#ifndef AG_COMMON_H
#define AG_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdbool.h>

#ifdef __cplusplus
// The CUDA kernels (src/cuda/*.cu) are C++ and include these headers.
#define _Noreturn [[noreturn]]
extern "C" {
#endif

#ifdef AG_DOUBLE
typedef double real;
#define REAL_NAME "float64"
#define REAL_EPS 2.220446049250313e-16
#else
typedef float real;
#define REAL_NAME "float32"
#define REAL_EPS 1.1920929e-07
#endif

// Failure: print "file:line: message" and call the fail handler (abort() by
// default). Tests install a handler that longjmps to check the message.
typedef void (*FailHandler)(const char *msg);
void ag_set_fail_handler(FailHandler h);
const char *ag_last_error(void);
_Noreturn void ag_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define ASSERT(cond, ...)                                   \
    do {                                                    \
        if (!(cond)) ag_fail(__FILE__, __LINE__, __VA_ARGS__); \
    } while (0)

#define FAIL(...) ag_fail(__FILE__, __LINE__, __VA_ARGS__)

void *ag_malloc(size_t bytes, const char *file, int line);
void *ag_calloc(size_t n, size_t size, const char *file, int line);
void *ag_realloc(void *p, size_t bytes, const char *file, int line);
void *ag_aligned_alloc(size_t bytes, const char *file, int line); // 64-byte aligned, free()
FILE *ag_fopen(const char *path, const char *mode, const char *file, int line);
#define xmalloc(n) ag_malloc((n), __FILE__, __LINE__)
#define xcalloc(n, s) ag_calloc((n), (s), __FILE__, __LINE__)
#define xrealloc(p, n) ag_realloc((p), (n), __FILE__, __LINE__)
#define xaligned(n) ag_aligned_alloc((n), __FILE__, __LINE__)
#define xfopen(p, m) ag_fopen((p), (m), __FILE__, __LINE__)

// Recoverable errors (bad config, corrupt checkpoint) return a status and
// leave a message here instead of aborting.
typedef struct Status {
    int ok;            // 1 on success
    char msg[1024];    // what went wrong, and where
} Status;
Status status_ok(void);
Status status_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

#ifdef __cplusplus
}
#endif
#endif
