#define _GNU_SOURCE   // memmem
#include "run_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"

// The files a run writes; RUN_FRESH with overwrite deletes them.
static const char *const RUN_FILES[] = {"checkpoint.h5", "metrics.jsonl", "loss.tsv", "loss.png", "loss.gp",
                                        "config.ini"};
static const char *const STALE_FILES[] = {"checkpoint.h5.tmp", "loss.png.tmp", "metrics.jsonl.tmp", "loss.tsv.tmp",
                                          "config.ini.tmp"};

// mkdir -p
static Status make_dirs(const char *path) {
    char buf[RUN_DIR_PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return status_err("run folder path longer than %d characters: %.80s...", RUN_DIR_PATH_MAX - 1, path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p) continue;
        char c = *p;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return status_err("cannot create '%s': %s", buf, strerror(errno));
        *p = c;
        if (!c) break;
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return status_err("%s: not a directory", path);
    return status_ok();
}

Status run_dir_file(const RunDir *rd, const char *name, char *out, size_t n) { return path_join(out, n, rd->path, name); }

static bool exists_nonempty(const RunDir *rd, const char *name) {
    char p[RUN_DIR_PATH_MAX + 32];
    struct stat sb;
    return run_dir_file(rd, name, p, sizeof p).ok && stat(p, &sb) == 0 && sb.st_size > 0;
}

static void remove_files(const RunDir *rd, const char *const *names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char p[RUN_DIR_PATH_MAX + 32];
        if (run_dir_file(rd, names[i], p, sizeof p).ok) unlink(p);
    }
}

Status run_dir_open(RunDir *rd, const char *path, RunDirMode mode, bool overwrite) {
    memset(rd, 0, sizeof *rd);
    rd->lock_fd = -1;
    Status s = make_dirs(path);
    if (!s.ok) return s;
    snprintf(rd->path, sizeof rd->path, "%s", path);
    char lock[RUN_DIR_PATH_MAX + 32];
    s = run_dir_file(rd, ".lock", lock, sizeof lock);
    if (!s.ok) return s;
    // The lock file is truncated and written (the pid): never through a link
    // (O_NOFOLLOW), and only a regular file (a FIFO or device is refused).
    s = file_check_output(lock, "lock file");
    if (!s.ok) return s;
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0) return status_err("%s: cannot create the lock file: %s", lock, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return status_err("%s: the lock file is not a regular file", lock);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char pid[32] = "";
        ssize_t got = pread(fd, pid, sizeof pid - 1, 0);
        pid[got > 0 ? got : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        close(fd);
        if (e == EWOULDBLOCK)
            return status_err("%s: another train process (pid %s) is writing to this run folder; wait for it to "
                              "finish, or use another [train] run_dir",
                              path, pid[0] ? pid : "?");
        return status_err("%s: cannot lock the run folder: %s", path, strerror(e));
    }
    char me[32];
    int len = snprintf(me, sizeof me, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) == 0) (void)!pwrite(fd, me, (size_t)len, 0);
    rd->lock_fd = fd;
    bool has_ckpt = exists_nonempty(rd, "checkpoint.h5");
    if (mode == RUN_FRESH && !has_ckpt && !overwrite && exists_nonempty(rd, "metrics.jsonl")) {
        // A run stopped before its first checkpoint: nothing to resume and
        // nothing its logs describe can be had again, so it starts afresh
        // (the caller says so; run_dir_restarted).
        remove_files(rd, RUN_FILES, sizeof RUN_FILES / sizeof RUN_FILES[0]);
        rd->restarted = true;
    }
    if (mode == RUN_FRESH && (has_ckpt || exists_nonempty(rd, "metrics.jsonl"))) {
        if (!overwrite) {
            run_dir_close(rd);
            return status_err("%s holds a previous run (checkpoint.h5, metrics.jsonl): continue it with --resume, "
                              "replace it with --overwrite (deletes its checkpoint and logs), or set another "
                              "[train] run_dir",
                              path);
        }
        remove_files(rd, RUN_FILES, sizeof RUN_FILES / sizeof RUN_FILES[0]);
    }
    remove_files(rd, STALE_FILES, sizeof STALE_FILES / sizeof STALE_FILES[0]);   // (names of older builds)
    for (size_t i = 0; i < sizeof RUN_FILES / sizeof RUN_FILES[0]; i++) {   // a killed writer's temporaries
        char p[RUN_DIR_PATH_MAX + 32];
        if (run_dir_file(rd, RUN_FILES[i], p, sizeof p).ok) file_out_remove_stale(p);
    }
    return status_ok();
}

void run_dir_close(RunDir *rd) {
    if (rd->lock_fd >= 0) close(rd->lock_fd);   // releases the flock
    rd->lock_fd = -1;
}

Status run_dir_write_file(const RunDir *rd, const char *name, const char *text) {
    char path[RUN_DIR_PATH_MAX + 32];
    Status s = run_dir_file(rd, name, path, sizeof path);
    return s.ok ? file_replace(path, name, text, strlen(text), 0) : s;
}

// The step of a log line: the number after "step":  (JSON) or at the start
// (loss.tsv); -1 for a line without one (the start record, the TSV header).
static int64_t line_step(const char *line, size_t len, bool json) {
    if (!json) return (len && line[0] >= '0' && line[0] <= '9') ? strtoll(line, NULL, 10) : -1;
    const char *k = memmem(line, len, "\"step\":", 7);
    return k ? strtoll(k + 7, NULL, 10) : -1;
}

static Status trim_one(const RunDir *rd, const char *name, bool json, int64_t step) {
    char path[RUN_DIR_PATH_MAX + 32];
    Status s = run_dir_file(rd, name, path, sizeof path);
    if (!s.ok) return s;
    if (access(path, F_OK) != 0) return status_ok();
    uint8_t *data;
    int64_t n;
    s = file_read_all(path, "log", (int64_t)1 << 34, &data, &n);
    if (!s.ok) return s;
    // Whole lines up to the step kept in place (out <= at); a line with a NUL
    // byte (what a machine that lost power can leave in a file) is damaged:
    // dropped, with a word, rather than cutting the file at its NUL.
    char *t = (char *)data;
    size_t at = 0, out = 0;
    int damaged = 0;
    while (at < (size_t)n) {
        const char *nl = memchr(t + at, '\n', (size_t)n - at);
        if (!nl) break;   // an incomplete last line
        size_t len = (size_t)(nl - (t + at));
        if (memchr(t + at, 0, len)) damaged++;
        else if (line_step(t + at, len, json) > step) break;
        else {
            memmove(t + out, t + at, len + 1);
            out += len + 1;
        }
        at += len + 1;
    }
    if (damaged)
        fprintf(stderr, "train: %s: %d damaged line%s (NUL bytes) dropped\n", path, damaged, damaged > 1 ? "s" : "");
    if (out < (size_t)n) s = file_replace(path, name, t, out, 0);
    free(data);
    return s;
}

Status run_dir_trim_logs(const RunDir *rd, int64_t step) {
    Status s = trim_one(rd, "metrics.jsonl", true, step);
    return s.ok ? trim_one(rd, "loss.tsv", false, step) : s;
}
