#include "fileio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
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
    // One byte of room past max_bytes: a file of exactly max_bytes is read to
    // its end (a read of 0), a longer one is caught by the byte past the limit.
    size_t cap = (size_t)(hint > 0 ? hint : 4096) + 1, n = 0;
    uint8_t *buf = xmalloc(cap);
    for (;;) {
        if (n + 1 == cap) {
            if ((int64_t)n > max_bytes) break;
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
    if ((int64_t)n > max_bytes) {   // (st_size said less: a file that grew, or one under /proc)
        free(buf);
        return status_err("%s: the %s is more than the %lld bytes this program reads", path, what,
                          (long long)max_bytes);
    }
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

// ---------------------------------------------------------------- writing

// The folder part of path ("." when it has none) into dir, and its last
// name; false when it does not fit or path ends in '/' (a folder).
static bool split_path(const char *path, char *dir, size_t n, const char **base) {
    const char *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    int len = slash ? snprintf(dir, n, "%.*s", slash == path ? 1 : (int)(slash - path), path) : snprintf(dir, n, ".");
    return len >= 0 && (size_t)len < n && **base && strcmp(*base, ".") != 0 && strcmp(*base, "..") != 0;
}

Status file_check_output(const char *path, const char *what) {
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return status_ok();   // a new name (a missing folder is found when creating)
        return status_err("%s: cannot write the %s: %s", path, what, strerror(errno));
    }
    if (S_ISREG(sb.st_mode)) return status_ok();
    if (S_ISLNK(sb.st_mode))
        return status_err("%s: the %s's path is a symbolic link; it is not replaced (give the path of the file it "
                          "names, or remove the link)",
                          path, what);
    return status_err("%s: the %s's path is %s; only a regular file (or a new name) is replaced", path, what,
                      file_kind_name(sb.st_mode));
}

static bool same_inode(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

bool file_same(const char *a, const char *b) {
    if (strcmp(a, b) == 0) return true;   // (also in a folder not created yet)
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0) return same_inode(&sa, &sb);
    // Not both there (yet): the same name in the same folder is the same file.
    char da[FILE_PATH_MAX], db[FILE_PATH_MAX];
    const char *ba, *bb;
    if (!split_path(a, da, sizeof da, &ba) || !split_path(b, db, sizeof db, &bb) || strcmp(ba, bb) != 0) return false;
    return stat(da, &sa) == 0 && stat(db, &sb) == 0 && same_inode(&sa, &sb);
}

Status file_check_distinct(const char *out, const char *out_what, const char *in, const char *in_what) {
    if (in && file_same(out, in))
        return status_err("%s: the %s would overwrite the %s %s; give another path", out, out_what, in_what, in);
    return status_ok();
}

Status file_make_parent_dirs(const char *path, const char *what) {
    char dir[FILE_PATH_MAX];
    const char *base;
    if (!split_path(path, dir, sizeof dir, &base)) return status_ok();   // (file_out_open says what is wrong)
    for (char *p = dir + 1;; p++) {
        if (*p != '/' && *p) continue;
        char c = *p;
        *p = 0;
        if (mkdir(dir, 0777) != 0 && errno != EEXIST)
            return status_err("%s: cannot create the folder '%s' for the %s: %s", path, dir, what, strerror(errno));
        *p = c;
        if (!c) break;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return status_err("%s: cannot create the %s: '%s' is not a folder", path, what, dir);
    return status_ok();
}

// n letters and digits from the kernel's random source (the clock, the pid
// and a counter where it has none), so a temporary's name cannot be guessed.
static void random_name(char *out, int n) {
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static unsigned counter;
    unsigned char r[32];
    if (n > (int)sizeof r) n = (int)sizeof r;
    if (getrandom(r, (size_t)n, GRND_NONBLOCK) != n) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 40) ^ ++counter;
        for (int i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            r[i] = (unsigned char)x;
        }
    }
    for (int i = 0; i < n; i++) out[i] = abc[r[i] % (sizeof abc - 1)];
    out[n] = 0;
}

// The temporaries of `path`: "<name>.tmp.<12 random characters>" beside it
// (the name cut to 200 bytes, so the temporary's fits in NAME_MAX).
#define TMP_MARK ".tmp."
#define TMP_RANDOM 12

Status file_out_open(FileOut *o, const char *path, const char *what, int flags) {
    memset(o, 0, sizeof *o);
    o->fd = -1;
    o->what = what;
    char dir[FILE_PATH_MAX];
    const char *base;
    if (strlen(path) >= sizeof o->path) return status_err("%.200s...: the %s's path is too long", path, what);
    if (!split_path(path, dir, sizeof dir, &base))
        return status_err("%s: names a folder, not a file to write the %s to", path, what);
    snprintf(o->path, sizeof o->path, "%s", path);
    Status s = file_check_output(path, what);
    if (s.ok && (flags & FILE_OUT_MAKE_DIRS)) s = file_make_parent_dirs(path, what);
    if (!s.ok) return s;
    int e = EEXIST;
    for (int tries = 0; tries < 100 && e == EEXIST; tries++) {
        char rnd[TMP_RANDOM + 1];
        random_name(rnd, TMP_RANDOM);
        snprintf(o->tmp, sizeof o->tmp, "%.*s%.200s" TMP_MARK "%s", (int)(base - path), path, base, rnd);
        o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        e = o->fd < 0 ? errno : 0;
    }
    if (o->fd >= 0) return status_ok();
    o->tmp[0] = 0;
    if (e == ENOENT) return status_err("%s: cannot create the %s: the folder '%s' does not exist", path, what, dir);
    return status_err("%s: cannot create the %s: %s", path, what, strerror(e));
}

bool file_out_write(FileOut *o, const void *p, size_t n) {
    if (o->err) return false;
    if (o->f) {
        if (fwrite(p, 1, n, o->f) != n) o->err = errno ? errno : EIO;
    } else {
        o->err = file_write_all(o->fd, p, n);
    }
    return o->err == 0;
}

FILE *file_out_stream(FileOut *o) {
    if (!o->f) {
        o->f = fdopen(o->fd, "wb");
        ASSERT(o->f, "%s: fdopen: %s", o->tmp, strerror(errno));
    }
    return o->f;
}

// Close the temporary; the first error (errno) of everything written, or 0.
static int close_tmp(FileOut *o) {
    int e = o->err;
    if (o->f && fflush(o->f) != 0 && !e) e = errno;
    if (o->f && ferror(o->f) && !e) e = EIO;
    if (o->fd >= 0 && !e && fsync(o->fd) != 0) e = errno;
    if (o->f) {
        if (fclose(o->f) != 0 && !e) e = errno;
    } else if (o->fd >= 0 && close(o->fd) != 0 && !e) {
        e = errno;
    }
    o->f = NULL;
    o->fd = -1;
    return e;
}

void file_out_abort(FileOut *o) {
    o->err = o->err ? o->err : ECANCELED;
    close_tmp(o);
    if (o->tmp[0]) unlink(o->tmp);
    o->tmp[0] = 0;
}

Status file_out_commit(FileOut *o) {
    int e = close_tmp(o);
    Status s = e ? status_err("%s: writing the %s failed: %s; the file is untouched", o->path, o->what, strerror(e))
                 : file_check_output(o->path, o->what);   // (what lies there may have changed since open)
    if (s.ok && rename(o->tmp, o->path) != 0)
        s = status_err("%s: writing the %s failed: %s; the file is untouched", o->path, o->what, strerror(errno));
    if (!s.ok) {
        file_out_abort(o);
        return s;
    }
    o->tmp[0] = 0;
    char dir[FILE_PATH_MAX];
    const char *base;
    if (split_path(o->path, dir, sizeof dir, &base)) {   // make the rename durable; best effort
        int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd >= 0) {
            (void)!fsync(fd);
            close(fd);
        }
    }
    return status_ok();
}

Status file_replace(const char *path, const char *what, const void *data, size_t n, int flags) {
    FileOut o;
    Status s = file_out_open(&o, path, what, flags);
    if (!s.ok) return s;
    file_out_write(&o, data, n);
    return file_out_commit(&o);
}

void file_out_remove_stale(const char *path) {
    char dir[FILE_PATH_MAX];
    const char *base;
    if (!split_path(path, dir, sizeof dir, &base)) return;
    char prefix[300];
    int plen = snprintf(prefix, sizeof prefix, "%.200s" TMP_MARK, base);
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *de; (de = readdir(d));) {
        if (strncmp(de->d_name, prefix, (size_t)plen) != 0 || strlen(de->d_name) != (size_t)plen + TMP_RANDOM)
            continue;
        struct stat sb;
        if (fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode))
            unlinkat(dirfd(d), de->d_name, 0);
    }
    closedir(d);
}

// ---------------------------------------------------------------- standard output

static const char *stdout_program = "";

static void check_stdout(void) {
    int e = 0;
    bool bad = ferror(stdout) != 0;
    if (fflush(stdout) != 0) bad = true, e = errno;
    // fclose reports what a delayed write-back found (NFS); EBADF alone is a
    // closed stdout the program never wrote to.
    if (fclose(stdout) != 0 && !bad && errno != EBADF) bad = true, e = errno;
    if (!bad) return;
    fprintf(stderr, "%s: cannot write the output (standard output)%s%s\n", stdout_program, e ? ": " : "",
            e ? strerror(e) : "");
    _exit(1);   // (exit() may not be called again from an exit handler)
}

void file_check_stdout_at_exit(const char *program) {
    stdout_program = program;
    atexit(check_stdout);
}
