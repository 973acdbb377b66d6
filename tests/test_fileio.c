// fileio.h: the read limit, and FileOut, through which every program output
// is written: whole or not at all, never onto a device, FIFO, folder or
// symbolic link, never through a planted temporary, and nothing left behind.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fileio.h"
#include "test_util.h"

// dir/name, in one of 4 buffers used in turn (keep a copy to use it longer).
static const char *at(const char *dir, const char *name) {
    static char p[4][1200];
    static int k;
    k = (k + 1) % 4;
    cr_assert_lt(snprintf(p[k], sizeof p[k], "%s/%s", dir, name), (int)sizeof p[k], "path too long");
    return p[k];
}

static void write_bytes(const char *path, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    for (size_t i = 0; i < n; i++) fputc('a' + (int)(i % 26), f);
    fclose(f);
}

// Names in dir that contain `part`.
static int count_named(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) n += strstr(de->d_name, part) != NULL;
    closedir(d);
    return n;
}

static void expect_refused(Status s, const char *path, const char *why) {
    cr_assert(!s.ok, "%s: expected a refusal (%s)", path, why);
    cr_assert(strstr(s.msg, path) && strstr(s.msg, why), "%s", s.msg);
    cr_assert_null(strstr(s.msg, ".tmp"), "the message names the user's path, not a temporary: %s", s.msg);
}

Test(fileio, a_file_of_exactly_the_read_limit_is_read) {
    const char *dir = test_tmpdir("fileio_limit");
    for (size_t limit = 1; limit <= 5000; limit += 4999) {   // (1 and 5000 bytes)
        write_bytes(at(dir, "exact"), limit);
        uint8_t *data;
        int64_t n;
        Status s = file_read_all(at(dir, "exact"), "test file", (int64_t)limit, &data, &n);
        cr_assert(s.ok, "a file of exactly the limit (%zu): %s", limit, s.msg);
        cr_assert_eq(n, (int64_t)limit);
        cr_assert_eq(data[n - 1], 'a' + (int)((limit - 1) % 26));
        cr_assert_eq(data[n], 0);
        free(data);
        write_bytes(at(dir, "over"), limit + 1);
        s = file_read_all(at(dir, "over"), "test file", (int64_t)limit, &data, &n);
        cr_assert(!s.ok && strstr(s.msg, "more than the") && strstr(s.msg, at(dir, "over")), "%s", s.msg);
        cr_assert_null(data);
    }
    // /proc reports a size of 0: the bytes are read to their end and the limit still holds.
    uint8_t *data;
    int64_t n;
    Status s = file_read_all("/proc/self/status", "status", 16, &data, &n);
    cr_assert(!s.ok && strstr(s.msg, "more than the 16 bytes"), "%s", s.msg);
    s = file_read_all("/proc/self/status", "status", 1 << 20, &data, &n);
    cr_assert(s.ok && n > 16, "%s", s.msg);
    free(data);
}

Test(fileio, replace_is_whole_and_leaves_no_temporary) {
    const char *dir = test_tmpdir("fileio_replace");
    const char *p = at(dir, "out.bin");
    test_write_file(p, "old contents");
    cr_assert(file_replace(p, "test output", "new", 3, 0).ok);
    char *text = test_read_file(p);
    cr_assert_str_eq(text, "new");
    free(text);
    // Given up half way: the old file stays, the temporary goes.
    FileOut o;
    cr_assert(file_out_open(&o, p, "test output", 0).ok);
    cr_assert(file_out_write(&o, "partial", 7));
    file_out_abort(&o);
    text = test_read_file(p);
    cr_assert_str_eq(text, "new");
    free(text);
    // Two temporaries of one path have different names, neither guessable from the path or the pid.
    FileOut a, b;
    cr_assert(file_out_open(&a, p, "test output", 0).ok && file_out_open(&b, p, "test output", 0).ok);
    char pid_name[1300];
    snprintf(pid_name, sizeof pid_name, "%s.tmp.%d", p, (int)getpid());
    cr_assert(strcmp(a.tmp, b.tmp) != 0 && strcmp(a.tmp, pid_name) != 0, "%s %s", a.tmp, b.tmp);
    file_out_abort(&a);
    file_out_abort(&b);
    cr_assert_eq(count_named(dir, ".tmp"), 0, "no temporary left behind");
}

Test(fileio, only_a_regular_file_or_a_new_name_is_replaced) {
    const char *dir = test_tmpdir("fileio_kinds");
    cr_assert_eq(mkfifo(at(dir, "fifo"), 0644), 0);
    expect_refused(file_replace(at(dir, "fifo"), "output", "x", 1, 0), at(dir, "fifo"), "is a FIFO");
    struct stat sb;
    cr_assert(lstat(at(dir, "fifo"), &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO is still there");
    // A device node of our own (the null device's numbers): a regression replaces it, not /dev/null.
    if (mknod(at(dir, "device"), S_IFCHR | 0666, makedev(1, 3)) == 0) {
        expect_refused(file_replace(at(dir, "device"), "output", "x", 1, 0), at(dir, "device"), "is a character device");
        cr_assert(lstat(at(dir, "device"), &sb) == 0 && S_ISCHR(sb.st_mode));
    } else {
        cr_log_info("not root: no device node to write to, the device case is not tested");
    }
    cr_assert_eq(mkdir(at(dir, "folder"), 0755), 0);
    expect_refused(file_replace(at(dir, "folder"), "output", "x", 1, 0), at(dir, "folder"), "is a directory");
    expect_refused(file_replace(at(dir, "folder/"), "output", "x", 1, 0), at(dir, "folder/"), "folder");
    // A symbolic link at the target is neither followed nor cut.
    test_write_file(at(dir, "victim"), "precious");
    cr_assert_eq(symlink(at(dir, "victim"), at(dir, "link")), 0);
    expect_refused(file_replace(at(dir, "link"), "output", "x", 1, 0), at(dir, "link"), "symbolic link");
    cr_assert(lstat(at(dir, "link"), &sb) == 0 && S_ISLNK(sb.st_mode));
    char *text = test_read_file(at(dir, "victim"));
    cr_assert_str_eq(text, "precious");
    free(text);
    // A dangling link too (it would create the file it names).
    cr_assert_eq(symlink(at(dir, "nowhere"), at(dir, "dangling")), 0);
    expect_refused(file_replace(at(dir, "dangling"), "output", "x", 1, 0), at(dir, "dangling"), "symbolic link");
    cr_assert_neq(access(at(dir, "nowhere"), F_OK), 0);
    cr_assert_eq(count_named(dir, ".tmp"), 0);
}

Test(fileio, a_planted_temporary_is_never_followed) {
    const char *dir = test_tmpdir("fileio_planted");
    char p[1200];
    snprintf(p, sizeof p, "%s", at(dir, "model.bin"));
    test_write_file(at(dir, "victim"), "precious");
    // The names earlier builds wrote to: <out>.tmp and <out>.tmp.<pid>.
    char pid_name[1300];
    snprintf(pid_name, sizeof pid_name, "%s.tmp.%d", p, (int)getpid());
    cr_assert_eq(symlink(at(dir, "victim"), at(dir, "model.bin.tmp")), 0);
    cr_assert_eq(symlink(at(dir, "victim"), pid_name), 0);
    cr_assert(file_replace(p, "output", "model", 5, 0).ok);
    char *text = test_read_file(at(dir, "victim"));
    cr_assert_str_eq(text, "precious");
    free(text);
    text = test_read_file(p);
    cr_assert_str_eq(text, "model");
    free(text);
    struct stat sb;
    cr_assert(lstat(at(dir, "model.bin.tmp"), &sb) == 0 && S_ISLNK(sb.st_mode), "the planted link is left alone");
    cr_assert(lstat(p, &sb) == 0 && S_ISREG(sb.st_mode));
}

Test(fileio, a_target_swapped_while_writing_is_not_replaced) {
    const char *dir = test_tmpdir("fileio_swap");
    const char *p = at(dir, "out");
    FileOut o;
    cr_assert(file_out_open(&o, p, "output", 0).ok);
    fputs("data", file_out_stream(&o));
    cr_assert_eq(mkfifo(p, 0644), 0);   // someone puts a FIFO there meanwhile
    expect_refused(file_out_commit(&o), p, "is a FIFO");
    struct stat sb;
    cr_assert(lstat(p, &sb) == 0 && S_ISFIFO(sb.st_mode));
    cr_assert_eq(count_named(dir, ".tmp"), 0);
}

Test(fileio, missing_folders_and_paths_through_a_file) {
    const char *dir = test_tmpdir("fileio_dirs");
    const char *p = at(dir, "new/deeper/out.json");
    Status s = file_replace(p, "config JSON", "{}", 2, 0);
    expect_refused(s, p, "does not exist");
    cr_assert(strstr(s.msg, at(dir, "new/deeper")), "%s", s.msg);
    cr_assert(file_replace(p, "config JSON", "{}", 2, FILE_OUT_MAKE_DIRS).ok);
    char *text = test_read_file(p);
    cr_assert_str_eq(text, "{}");
    free(text);
    // Under a regular file nothing can be created (as root too, unlike a read-only folder).
    test_write_file(at(dir, "file"), "x");
    expect_refused(file_replace(at(dir, "file/x"), "output", "x", 1, 0), at(dir, "file/x"), "Not a directory");
    expect_refused(file_replace(at(dir, "file/sub/x"), "output", "x", 1, FILE_OUT_MAKE_DIRS), at(dir, "file/sub/x"),
                   "Not a directory");
}

Test(fileio, a_failed_write_leaves_the_target_untouched) {
    const char *dir = test_tmpdir("fileio_efbig");
    const char *p = at(dir, "out");
    test_write_file(p, "old");
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {   // writes past 1000 bytes fail with EFBIG, as on a full disk
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {1000, 1000};
        setrlimit(RLIMIT_FSIZE, &rl);
        static char big[5000];
        Status s = file_replace(p, "output", big, sizeof big, 0);
        _exit(!s.ok && strstr(s.msg, p) && strstr(s.msg, "File too large") && strstr(s.msg, "untouched") ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the failure is reported with the path and why");
    char *text = test_read_file(p);
    cr_assert_str_eq(text, "old");
    free(text);
    cr_assert_eq(count_named(dir, ".tmp"), 0);
}

Test(fileio, same_file_by_inode_or_by_name) {
    const char *dir = test_tmpdir("fileio_same");
    test_write_file(at(dir, "a"), "a");
    cr_assert_eq(link(at(dir, "a"), at(dir, "hard")), 0);
    cr_assert_eq(symlink(at(dir, "a"), at(dir, "soft")), 0);
    char dotted[1300];
    snprintf(dotted, sizeof dotted, "%s/./a", dir);
    cr_assert(file_same(at(dir, "a"), at(dir, "hard")) && file_same(at(dir, "soft"), at(dir, "a")));
    cr_assert(file_same(dotted, at(dir, "a")));
    snprintf(dotted, sizeof dotted, "%s/./new", dir);
    cr_assert(file_same(dotted, at(dir, "new")), "names not created yet, one folder");
    cr_assert(!file_same(at(dir, "a"), at(dir, "new")) && !file_same(at(dir, "new"), at(dir, "other")));
    Status s = file_check_distinct(at(dir, "hard"), "output", at(dir, "a"), "input");
    cr_assert(!s.ok && strstr(s.msg, "would overwrite the input"), "%s", s.msg);
    cr_assert(file_check_distinct(at(dir, "new"), "output", NULL, "input").ok);
}

Test(fileio, stale_temporaries_of_a_path_are_removed) {
    const char *dir = test_tmpdir("fileio_stale");
    char p[1200];
    snprintf(p, sizeof p, "%s", at(dir, "checkpoint.h5"));
    FileOut o;
    cr_assert(file_out_open(&o, p, "checkpoint", 0).ok);
    close(o.fd);   // as a process killed mid-write leaves it
    test_write_file(at(dir, "victim"), "precious");
    cr_assert_eq(symlink(at(dir, "victim"), at(dir, "checkpoint.h5.tmp.AAAAAAAAAAAA")), 0);
    test_write_file(at(dir, "checkpoint.h5.tmp.notours"), "kept");
    test_write_file(at(dir, "other.h5.tmp.BBBBBBBBBBBB"), "kept");
    file_out_remove_stale(p);
    cr_assert_neq(access(o.tmp, F_OK), 0, "the killed writer's temporary is gone");
    struct stat sb;
    cr_assert(lstat(at(dir, "checkpoint.h5.tmp.AAAAAAAAAAAA"), &sb) == 0, "a link is not ours: left alone");
    cr_assert(access(at(dir, "checkpoint.h5.tmp.notours"), F_OK) == 0 && access(at(dir, "other.h5.tmp.BBBBBBBBBBBB"),
                                                                                 F_OK) == 0);
    char *text = test_read_file(at(dir, "victim"));
    cr_assert_str_eq(text, "precious");
    free(text);
}
