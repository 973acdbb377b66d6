// fileio.h: reading and writing files that may be hostile or may fail.
//
// Every file a program reads (configs, corpora, tokenizers) goes through
// file_read_all: the path must name a regular file (a directory, FIFO,
// socket or device is refused with what it is, and a FIFO is never waited
// on), the size is bounded before anything is allocated, and the bytes are
// read to end of file rather than trusting st_size (files under /proc report
// 0). Every write is checked: file_write_all retries short writes and
// reports the first failure.
#ifndef AG_FILEIO_H
#define AG_FILEIO_H

#include <sys/types.h>

#include "common.h"

// "a directory", "a FIFO", "a character device", ... for st_mode; "a regular file".
const char *file_kind_name(mode_t mode);

// Open `path` for reading; it must be a regular file. Never blocks on a FIFO.
// `what` names the file in messages ("config", "corpus file"). Returns the fd.
Status file_open_regular(const char *path, const char *what, int *fd);

// Read a whole regular file of at most max_bytes. *data is malloc'd with one
// extra NUL byte after the n bytes; free() it.
Status file_read_all(const char *path, const char *what, int64_t max_bytes, uint8_t **data, int64_t *n);

// Write n bytes, retrying short writes and EINTR. Returns 0 or an errno value.
int file_write_all(int fd, const void *p, size_t n);

// out = dir + "/" + name; an error instead of a truncated path.
Status path_join(char *out, size_t n, const char *dir, const char *name);

#endif
