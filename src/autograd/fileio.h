// fileio.h: reading and writing files that may be hostile or may fail.
//
// Every file a program reads (configs, corpora, tokenizers) goes through
// file_read_all: the path must name a regular file (a directory, FIFO,
// socket or device is refused with what it is, and a FIFO is never waited
// on), the size is bounded before anything is allocated, and the bytes are
// read to end of file rather than trusting st_size (files under /proc report
// 0). Every write is checked: file_write_all retries short writes and
// reports the first failure.
//
// Every file a program writes goes through FileOut: the bytes go to a new
// temporary in the target's folder (an unpredictable name, created with
// O_EXCL|O_NOFOLLOW, so nothing planted there is followed or reused), which
// is fsync'd and renamed over the target; on any error the temporary is
// removed and the target untouched. Only a regular file or a new name is
// replaced: a directory, FIFO, socket or device is refused, and so is a
// symbolic link (replacing the link would silently cut it, writing through it
// would overwrite what it names; the user says which by giving that path).
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

#define FILE_PATH_MAX 4096

// An output being written: fd is the temporary (write with file_out_write,
// or through file_out_stream's FILE).
typedef struct FileOut {
    int fd;                          // -1 once closed
    FILE *f;                         // the stream on fd, if one was asked for
    int err;                         // the first write error (errno), 0 if none
    const char *what;                // "safetensors file", "checkpoint", ...
    char path[FILE_PATH_MAX];        // the target, as the user gave it
    char tmp[FILE_PATH_MAX + 32];    // the temporary
} FileOut;

// file_out_open's flags: create the target's missing folders (mkdir -p).
#define FILE_OUT_MAKE_DIRS 1

// May `path` be replaced? It must not exist, or be a regular file (lstat:
// a symbolic link is refused). `what` names it in the message.
Status file_check_output(const char *path, const char *what);
// Do two paths name the same file: the same inode when both exist, or the
// same name in the same folder when they do not (yet)?
bool file_same(const char *a, const char *b);
// Refuse writing `out` when it is the input `in` (NULL: nothing to check):
// "<out>: the <out_what> would overwrite the <in_what> <in>".
Status file_check_distinct(const char *out, const char *out_what, const char *in, const char *in_what);
// mkdir -p of the folder `path` lies in; errors name `path`.
Status file_make_parent_dirs(const char *path, const char *what);

// Start writing `path` (checked by file_check_output); on success o->fd is
// the temporary. Every error names `path`, never the temporary.
Status file_out_open(FileOut *o, const char *path, const char *what, int flags);
// Append n bytes; false after a failure (which commit reports).
bool file_out_write(FileOut *o, const void *p, size_t n);
// A stdio stream on the temporary (owned by o; commit or abort closes it).
FILE *file_out_stream(FileOut *o);
// Flush, fsync, rename over the target, fsync the folder. On any error the
// temporary is removed and the target untouched. o is finished either way.
Status file_out_commit(FileOut *o);
// Give up: close and remove the temporary (the target is untouched).
void file_out_abort(FileOut *o);
// The whole file from one buffer: open, write, commit.
Status file_replace(const char *path, const char *what, const void *data, size_t n, int flags);
// Remove what file_out_open left behind for `path` when a process died
// mid-write (regular files named like its temporaries). Only for a folder
// the caller holds a lock on: another writer's temporary would go too.
void file_out_remove_stale(const char *path);

// Check standard output when the program exits: a write that failed (a full
// disk, `> /dev/full`, a closed pipe) turns the exit status into 1 with
// "<program>: cannot write the output (standard output): <why>" on stderr.
// Call once at the start of main.
void file_check_stdout_at_exit(const char *program);

#endif
