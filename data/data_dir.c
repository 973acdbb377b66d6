#include "data_dir.h"

#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef ATTNLAB_DATA_DIR
#define ATTNLAB_DATA_DIR "/usr/local/share/attnlab"
#endif
// share/attnlab as seen from the installed bin/ (CMake: file(RELATIVE_PATH)).
#ifndef ATTNLAB_DATA_FROM_BIN
#define ATTNLAB_DATA_FROM_BIN "../share/attnlab"
#endif

const char *attnlab_data_dir_for(const char *exe_path, char *out, size_t n) {
    snprintf(out, n, "%s", ATTNLAB_DATA_DIR);
    const char *slash = exe_path ? strrchr(exe_path, '/') : NULL;
    if (!slash) return out;
    char dir[PATH_MAX + 64];
    int len = snprintf(dir, sizeof dir, "%.*s/%s", (int)(slash - exe_path), exe_path, ATTNLAB_DATA_FROM_BIN);
    struct stat sb;
    // A build tree's program (build/train) has no share/attnlab beside it: the configured path stays.
    if (len > 0 && len < (int)sizeof dir && (size_t)len < n && stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char real[PATH_MAX];   // P/share/attnlab in messages, not P/bin/../share/attnlab
        snprintf(out, n, "%s", realpath(dir, real) && strlen(real) < n ? real : dir);
    }
    return out;
}

const char *attnlab_data_dir(void) {
    static char dir[PATH_MAX + 64];
    if (dir[0]) return dir;
    char exe[PATH_MAX];
    ssize_t got = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[got > 0 ? got : 0] = 0;
    return attnlab_data_dir_for(got > 0 ? exe : NULL, dir, sizeof dir);
}
