#include "corpus.h"

#include "fileio.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

uint64_t fnv1a64(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static void add_file(Corpus *c, const char *path) {
    c->files = xrealloc(c->files, (size_t)(c->n_files + 1) * sizeof *c->files);
    c->files[c->n_files++] = strdup(path);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// Expand a directory into its regular files, sorted by name.
static Status add_dir(Corpus *c, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return status_err("%s: cannot open corpus directory: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        names = xrealloc(names, (size_t)(n + 1) * sizeof *names);
        names[n++] = strdup(path);
    }
    closedir(d);
    if (n == 0) return status_err("%s: corpus directory holds no regular files", dir);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 0; i < n; i++) {
        add_file(c, names[i]);
        free(names[i]);
    }
    free(names);
    return status_ok();
}

static Status read_file(Corpus *c, int i) {
    const char *path = c->files[i];
    uint8_t *data;
    int64_t size;
    // Any regular file, read to its end (a /proc file reports size 0); a FIFO,
    // device or directory is refused, never waited on.
    Status s = file_read_all(path, "corpus file", CORPUS_MAX_BYTES - c->n, &data, &size);
    if (!s.ok) return s;
    c->bytes = xrealloc(c->bytes, (size_t)(c->n + size + 1));
    memcpy(c->bytes + c->n, data, (size_t)size);
    free(data);
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    c->hash = fnv1a64(c->hash, base, strlen(base) + 1);
    c->hash = fnv1a64(c->hash, &size, sizeof size);
    c->hash = fnv1a64(c->hash, c->bytes + c->n, (size_t)size);
    c->n += size;
    c->file_end = xrealloc(c->file_end, (size_t)c->n_files * sizeof *c->file_end);
    c->file_end[i] = c->n;
    return status_ok();
}

Status corpus_load(Corpus *c, const char *spec) {
    memset(c, 0, sizeof *c);
    c->hash = FNV1A_INIT;
    Status st = status_ok();
    struct stat sb;
    if (!strchr(spec, ',') && stat(spec, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        st = add_dir(c, spec);
    } else {
        char *copy = strdup(spec), *save = NULL;
        for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
            while (*item == ' ') item++;
            char *e = item + strlen(item);
            while (e > item && e[-1] == ' ') *--e = 0;
            if (*item) add_file(c, item);
        }
        free(copy);
        if (c->n_files == 0) st = status_err("'%s': corpus spec names no file", spec);
    }
    for (int i = 0; st.ok && i < c->n_files; i++) st = read_file(c, i);
    if (st.ok && c->n == 0) st = status_err("%s: the corpus is empty (its files hold 0 bytes)", spec);
    if (!st.ok) corpus_free(c);
    return st;
}

void corpus_free(Corpus *c) {
    for (int i = 0; i < c->n_files; i++) free(c->files[i]);
    free(c->files);
    free(c->file_end);
    free(c->bytes);
    memset(c, 0, sizeof *c);
}
