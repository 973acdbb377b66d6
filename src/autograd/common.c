#include "common.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

static FailHandler fail_handler = NULL;
static char last_error[1024];

void ag_set_fail_handler(FailHandler h) { fail_handler = h; }
const char *ag_last_error(void) { return last_error; }

_Noreturn void ag_fail(const char *file, int line, const char *fmt, ...) {
    int n = snprintf(last_error, sizeof last_error, "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
    va_end(ap);
    if (fail_handler) fail_handler(last_error);   // the handler owns the message (tests check it)
    fprintf(stderr, "error: %s\n", last_error);
    fflush(stderr);
    abort();
}

void *ag_malloc(size_t bytes, const char *file, int line) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) ag_fail(file, line, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *ag_calloc(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) ag_fail(file, line, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *ag_realloc(void *p, size_t bytes, const char *file, int line) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) ag_fail(file, line, "out of memory reallocating to %zu bytes", bytes);
    return q;
}

void *ag_aligned_alloc(size_t bytes, const char *file, int line) {
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) ag_fail(file, line, "out of memory allocating %zu aligned bytes", bytes);
    return p;
}

FILE *ag_fopen(const char *path, const char *mode, const char *file, int line) {
    FILE *f = fopen(path, mode);
    if (!f) ag_fail(file, line, "cannot open '%s' (mode %s): %s", path, mode, strerror(errno));
    return f;
}

Status status_ok(void) {
    Status s;
    s.ok = 1;
    s.msg[0] = 0;
    return s;
}

Status status_err(const char *fmt, ...) {
    Status s;
    s.ok = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s.msg, sizeof s.msg, fmt, ap);
    va_end(ap);
    return s;
}
