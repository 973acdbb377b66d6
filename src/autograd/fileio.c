#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *file_kind_name(mode_t mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

Status file_open_regular(const char *path, const char *what, int *fd_out) {
    *fd_out = -1;
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return status_err("%s: cannot open %s: %s", path, what, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        Status s = status_err("%s: cannot stat %s: %s", path, what, strerror(errno));
        close(fd);
        return s;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return status_err("%s: the %s is %s, not a regular file", path, what, file_kind_name(sb.st_mode));
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *fd_out = fd;
    return status_ok();
}

Status file_read_all(const char *path, const char *what, int64_t max_bytes, uint8_t **data, int64_t *n_out) {
    *data = NULL;
    *n_out = 0;
    int fd;
    Status s = file_open_regular(path, what, &fd);
    if (!s.ok) return s;
    struct stat sb;
    int64_t hint = fstat(fd, &sb) == 0 ? (int64_t)sb.st_size : 0;
    if (hint > max_bytes) {
        close(fd);
        return status_err("%s: the %s is %lld bytes, more than the %lld this program reads", path, what,
                          (long long)hint, (long long)max_bytes);
    }
    size_t cap = (size_t)(hint > 0 ? hint : 4096) + 1, n = 0;
    uint8_t *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 == cap) {
            if ((int64_t)n >= max_bytes) {
                free(buf);
                close(fd);
                return status_err("%s: the %s is more than the %lld bytes this program reads", path, what,
                                  (long long)max_bytes);
            }
            size_t grow = cap * 2 < (size_t)max_bytes + 2 ? cap * 2 : (size_t)max_bytes + 2;
            buf = xrealloc(buf, cap = grow);
        }
        ssize_t got = read(fd, buf + n, cap - n - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            s = status_err("%s: cannot read %s: %s", path, what, strerror(errno));
            free(buf);
            close(fd);
            return s;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    close(fd);
    buf[n] = 0;
    *data = buf;
    *n_out = (int64_t)n;
    return status_ok();
}

int file_write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno;
        if (w == 0) return EIO;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

Status path_join(char *out, size_t n, const char *dir, const char *name) {
    int len = snprintf(out, n, "%s/%s", dir, name);
    if (len < 0 || (size_t)len >= n)
        return status_err("path '%s/%s' is longer than %zu characters", dir, name, n - 1);
    return status_ok();
}
