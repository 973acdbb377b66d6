// h5io_walk.c: libhdf5 on an untrusted file, in a child process that may die.
//
// h5io_catalog forks. The child lowers its limits (address space, CPU time,
// no file writes, no core dump), points stdout and stderr at /dev/null, puts
// the fatal signals back to their defaults (a sanitizer's or fuzzer's handler
// must not report the child's crash as the parent's), opens the file through
// /proc/self/fd (the very file the parent opened, whatever was renamed over
// its path since), visits every link with libhdf5 and writes one record per
// object to a pipe (h5io_walk.h). The parent reads the pipe with a deadline,
// reaps the child and parses the stream (h5io_catalog.c). Whatever libhdf5
// does on a crafted file (a NULL read, an overflow, a request for 2^63
// bytes, a loop) ends in the child, and the parent says the file is corrupt.
#define _GNU_SOURCE   // pipe2
#include "h5io_walk.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fileio.h"

#define WALK_MEMORY ((rlim_t)1 << 30)   // address space the child may add to what it inherits
#define WALK_CPU_S 30
#define WALK_WALL_MS 60000
#define WALK_STREAM_MAX ((size_t)256 << 20)

typedef struct Buf {
    unsigned char *p;
    size_t n, cap;
    bool failed;
} Buf;

static void buf_put(Buf *b, const void *src, size_t n) {
    if (b->failed || n == 0) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        unsigned char *p = cap <= WALK_STREAM_MAX ? realloc(b->p, cap) : NULL;
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

// ---------------------------------------------------------------- the child's walk

// Which H5ioType is the dataset's type? -1 if none.
static int type_of(hid_t dtype) {
    if (H5Tget_class(dtype) == H5T_STRING) return H5Tis_variable_str(dtype) > 0 ? -1 : H5IO_STRING;
    const hid_t types[H5IO_STRING] = {H5T_IEEE_F32LE, H5T_IEEE_F64LE, H5T_STD_I32LE,
                                      H5T_STD_I64LE,  H5T_STD_U8LE,   H5T_STD_U64LE};
    for (int t = 0; t < H5IO_STRING; t++)
        if (H5Tequal(dtype, types[t]) > 0) return t;
    return -1;
}

typedef struct AttrWalk {
    Buf *b;
    int n;
    bool cut;
} AttrWalk;

static herr_t visit_attr(hid_t loc, const char *name, const H5A_info_t *ai, void *arg) {
    (void)ai;
    AttrWalk *w = arg;
    if (w->n == H5IO_MAX_ATTRS) {
        w->cut = true;
        return 1;
    }
    H5ioAttrHead h = {.state = H5IO_ATTR_OTHER};
    size_t name_len = strnlen(name, H5IO_NAME_MAX + 1);
    if (name_len > H5IO_NAME_MAX) return 0;   // a name no caller asks for
    h.name_len = (uint32_t)name_len;
    char value[H5IO_ATTR_VALUE_MAX + 1];
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t t = a >= 0 ? H5Aget_type(a) : -1;
    hid_t sp = a >= 0 ? H5Aget_space(a) : -1;
    if (t >= 0 && sp >= 0 && H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) == 0 &&
        H5Sget_simple_extent_npoints(sp) == 1) {
        h.size = H5Tget_size(t);
        h.state = H5IO_ATTR_STRING;
        if (h.size <= H5IO_ATTR_VALUE_MAX) {
            memset(value, 0, sizeof value);
            if (H5Aread(a, t, value) >= 0) h.value_len = (uint32_t)h.size;
            else h.state = H5IO_ATTR_OTHER;
        }
    }
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    buf_put(w->b, &h, sizeof h);
    buf_put(w->b, name, name_len);
    buf_put(w->b, value, h.value_len);
    w->n++;
    return 0;
}

// The dataset's fields of o (see H5ioObj), read as h5io's checks need them.
static void describe_dataset(hid_t d, H5ioObj *o, unsigned char *compact) {
    hid_t dt = H5Dget_type(d);
    o->type = (int8_t)(dt >= 0 ? type_of(dt) : -1);
    o->elem_size = dt >= 0 ? H5Tget_size(dt) : 0;
    hid_t sp = H5Dget_space(d);
    H5S_class_t sc = sp >= 0 ? H5Sget_simple_extent_type(sp) : H5S_NO_CLASS;
    int r = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    o->space = sc == H5S_SIMPLE ? H5IO_SPACE_SIMPLE : sc == H5S_SCALAR ? H5IO_SPACE_SCALAR : H5IO_SPACE_OTHER;
    o->rank = (int8_t)(r >= 0 && r <= H5IO_MAX_RANK ? r : -1);
    if (o->rank >= 0) {
        hsize_t dims[H5IO_MAX_RANK] = {0};
        H5Sget_simple_extent_dims(sp, dims, NULL);
        for (int k = 0; k < r; k++) o->dims[k] = dims[k];
    }
    if (sp >= 0) H5Sclose(sp);
    hid_t pl = H5Dget_create_plist(d);
    H5D_layout_t layout = pl >= 0 ? H5Pget_layout(pl) : H5D_LAYOUT_ERROR;
    o->layout = layout == H5D_CONTIGUOUS ? H5IO_LAYOUT_CONTIGUOUS
                : layout == H5D_COMPACT  ? H5IO_LAYOUT_COMPACT
                                         : H5IO_LAYOUT_OTHER;
    o->nfilters = pl >= 0 ? H5Pget_nfilters(pl) : -1;
    o->nexternal = pl >= 0 ? H5Pget_external_count(pl) : -1;
    if (pl >= 0) H5Pclose(pl);
    H5D_space_status_t status;
    o->allocated = H5Dget_space_status(d, &status) >= 0 && status == H5D_SPACE_STATUS_ALLOCATED;
    o->storage = H5Dget_storage_size(d);
    haddr_t off = H5Dget_offset(d);
    o->offset = off == HADDR_UNDEF ? H5IO_NO_OFFSET : (uint64_t)off;
    // The checksum attribute.
    if (H5Aexists(d, "crc32") > 0) {
        o->crc_state = H5IO_CRC_MALFORMED;
        hid_t a = H5Aopen(d, "crc32", H5P_DEFAULT);
        hid_t at = a >= 0 ? H5Aget_type(a) : -1;
        hid_t as = a >= 0 ? H5Aget_space(a) : -1;
        if (at >= 0 && as >= 0 && H5Tget_class(at) == H5T_INTEGER && H5Tget_size(at) == 4 &&
            H5Sget_simple_extent_npoints(as) == 1 && H5Aread(a, H5T_NATIVE_UINT32, &o->crc) >= 0)
            o->crc_state = H5IO_CRC_OK;
        if (at >= 0) H5Tclose(at);
        if (as >= 0) H5Sclose(as);
        if (a >= 0) H5Aclose(a);
    }
    // A compact dataset's bytes have no address of their own: the child reads them.
    uint64_t bytes = o->elem_size;
    for (int k = 0; o->space == H5IO_SPACE_SIMPLE && k < o->rank; k++)
        bytes = o->dims[k] && bytes > H5IO_COMPACT_MAX / o->dims[k] ? H5IO_COMPACT_MAX + 1 : bytes * o->dims[k];
    if (o->layout == H5IO_LAYOUT_COMPACT && o->type >= 0 && o->allocated && o->rank >= 0 && bytes > 0 &&
        bytes <= H5IO_COMPACT_MAX && dt >= 0 && H5Dread(d, dt, H5S_ALL, H5S_ALL, H5P_DEFAULT, compact) >= 0)
        o->compact_len = (uint32_t)bytes;
    if (dt >= 0) H5Tclose(dt);
}

typedef struct Walk {
    Buf b;
    int n;
    int status;
} Walk;

// One object's record: name, kind and (for groups and datasets) fields and attributes.
static void put_object(Walk *w, hid_t loc, const char *rel, const char *full, int kind) {
    static unsigned char compact[H5IO_COMPACT_MAX];
    H5ioObj o = {.kind = (uint8_t)kind, .type = -1, .rank = -1, .nfilters = -1, .nexternal = -1,
                 .offset = H5IO_NO_OFFSET};
    hid_t obj = -1;
    if (kind == H5IO_OBJ_GROUP || kind == H5IO_OBJ_DATASET) obj = H5Oopen(loc, rel, H5P_DEFAULT);
    if (kind == H5IO_OBJ_DATASET && obj >= 0) describe_dataset(obj, &o, compact);
    o.name_len = (uint32_t)strlen(full);
    Buf attrs = {0};
    AttrWalk aw = {.b = &attrs};
    if (obj >= 0) {
        hsize_t idx = 0;
        H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &idx, visit_attr, &aw);
        H5Oclose(obj);
    }
    o.n_attrs = (uint32_t)aw.n;
    o.attrs_cut = aw.cut;
    buf_put(&w->b, &o, sizeof o);
    buf_put(&w->b, full, o.name_len);
    buf_put(&w->b, compact, o.compact_len);
    if (attrs.failed) w->b.failed = true;
    buf_put(&w->b, attrs.p, attrs.n);
    free(attrs.p);
    w->n++;
}

static herr_t visit_link(hid_t g, const char *name, const H5L_info_t *li, void *arg) {
    Walk *w = arg;
    if (w->n >= H5IO_MAX_OBJECTS) {
        w->status = H5IO_WALK_TOO_MANY;
        return 1;
    }
    char full[H5IO_NAME_MAX + 2];
    if (snprintf(full, sizeof full, "/%s", name) > H5IO_NAME_MAX) return 0;   // a name no caller asks for
    int kind = H5IO_OBJ_OTHER;
    if (li->type == H5L_TYPE_SOFT) kind = H5IO_OBJ_SOFT;
    else if (li->type == H5L_TYPE_EXTERNAL) kind = H5IO_OBJ_EXTERNAL;
    else if (li->type == H5L_TYPE_HARD) {
        hid_t o = H5Oopen(g, name, H5P_DEFAULT);
        H5I_type_t t = o >= 0 ? H5Iget_type(o) : H5I_BADID;
        if (o >= 0) H5Oclose(o);
        kind = t == H5I_GROUP ? H5IO_OBJ_GROUP : t == H5I_DATASET ? H5IO_OBJ_DATASET : H5IO_OBJ_OTHER;
    }
    put_object(w, g, name, full, kind);
    return w->b.failed ? -1 : 0;
}

unsigned char *h5io_walk_stream(const char *path, size_t *len) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    Walk w = {0};
    uint32_t head[4] = {H5IO_WALK_MAGIC, H5IO_WALK_OK, 0, 0};
    buf_put(&w.b, head, sizeof head);
    hid_t f = -1;
#if H5_VERSION_GE(1, 12, 0)
    htri_t is_hdf5 = H5Fis_accessible(path, H5P_DEFAULT);
#else
    htri_t is_hdf5 = H5Fis_hdf5(path);
#endif
    if (is_hdf5 <= 0) w.status = H5IO_WALK_NOT_HDF5;
    else if ((f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0) w.status = H5IO_WALK_CANNOT_OPEN;
    else {
        put_object(&w, f, "/", "/", H5IO_OBJ_GROUP);
        if (H5Lvisit(f, H5_INDEX_NAME, H5_ITER_INC, visit_link, &w) < 0 && w.status == H5IO_WALK_OK)
            w.status = w.b.failed ? H5IO_WALK_NO_MEMORY : H5IO_WALK_CANNOT_LIST;
        H5Fclose(f);
    }
    if (w.b.failed) w.status = H5IO_WALK_NO_MEMORY;
    uint32_t end = H5IO_WALK_END;
    buf_put(&w.b, &end, sizeof end);
    if (w.b.failed) {
        free(w.b.p);
        return NULL;
    }
    uint32_t *h = (uint32_t *)w.b.p;
    h[1] = (uint32_t)w.status;
    h[2] = (uint32_t)w.n;
    *len = w.b.n;
    return w.b.p;
}

// ---------------------------------------------------------------- the sandbox

// Sanitizers and libFuzzer report a death through this hook; in the child a
// death is an answer ("corrupt"), not a finding of the parent's.
extern void __sanitizer_set_death_callback(void (*)(void)) __attribute__((weak));

// The child's current size of a /proc/self/status field ("VmSize:"), in bytes; 0 if unknown.
static rlim_t proc_status_bytes(const char *field) {
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char text[8192];
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0) return 0;
    text[n] = 0;
    const char *p = strstr(text, field);
    return p ? (rlim_t)strtoull(p + strlen(field), NULL, 10) * 1024 : 0;
}

static void lower_limits(void) {
    // The address space it inherits (a training process's, or a sanitizer's
    // shadow) plus a bound for libhdf5's own work.
    rlim_t vm = proc_status_bytes("VmSize:");
    struct rlimit as = {vm + WALK_MEMORY, vm + WALK_MEMORY};
    if (vm > 0) setrlimit(RLIMIT_AS, &as);
    struct rlimit cpu = {WALK_CPU_S, WALK_CPU_S + 1}, none = {0, 0};
    setrlimit(RLIMIT_CPU, &cpu);
    setrlimit(RLIMIT_FSIZE, &none);
    setrlimit(RLIMIT_CORE, &none);
}

static _Noreturn void child_main(int fd, const char *path, int out) {
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE, SIGSYS, SIGXCPU, SIGXFSZ, SIGTRAP};
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++) signal((int)fatal[i], SIG_DFL);
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(NULL);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
    }
    lower_limits();
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    size_t len = 0;
    unsigned char *stream = h5io_walk_stream(access(self, R_OK) == 0 ? self : path, &len);
    _exit(stream && file_write_all(out, stream, len) == 0 ? 0 : 3);
}

static int64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

enum { STREAM_COMPLETE, STREAM_TIMEOUT, STREAM_BROKEN };

// Read the child's stream until end of file, the size cap or the deadline.
static int read_stream(int in, Buf *b, int64_t deadline) {
    unsigned char chunk[65536];
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0) return STREAM_TIMEOUT;
        struct pollfd p = {.fd = in, .events = POLLIN};
        int r = poll(&p, 1, (int)(left > 1000 ? 1000 : left));
        if (r < 0 && errno != EINTR) return STREAM_BROKEN;
        if (r <= 0) continue;
        ssize_t n = read(in, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return STREAM_BROKEN;
        if (n == 0) return STREAM_COMPLETE;
        buf_put(b, chunk, (size_t)n);   // (fails past WALK_STREAM_MAX)
        if (b->failed) return STREAM_BROKEN;
    }
}

// Why the child failed, for the message.
static void child_fate(int wstatus, bool timed_out, char *out, size_t n) {
    if (timed_out) snprintf(out, n, "it took longer than %d s", WALK_WALL_MS / 1000);
    else if (WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGXCPU)
        snprintf(out, n, "it used more than %d s of CPU", WALK_CPU_S);
    else if (WIFSIGNALED(wstatus)) snprintf(out, n, "it crashed with signal %d (%s)", WTERMSIG(wstatus),
                                            strsignal(WTERMSIG(wstatus)));
    else snprintf(out, n, "it failed (exit status %d; out of its memory bound?)", WEXITSTATUS(wstatus));
}

static bool sandboxed = true;

void h5io_sandbox(bool on) { sandboxed = on; }

// The walk in this process (h5io_sandbox(false)).
static Status catalog_here(int fd, const char *path, const char *what, H5ioCatalog **cat) {
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    size_t len = 0;
    unsigned char *stream = h5io_walk_stream(self, &len);
    Status s = stream ? h5io_catalog_parse(stream, len, path, what, cat)
                      : status_err("%s: corrupt %s: its HDF5 structure could not be read", path, what);
    free(stream);
    return s;
}

Status h5io_catalog(int fd, const char *path, const char *what, H5ioCatalog **cat) {
    *cat = NULL;
    if (!sandboxed) return catalog_here(fd, path, what, cat);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return status_err("%s: cannot read the %s: pipe: %s", path, what, strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return status_err("%s: cannot read the %s: fork: %s", path, what, strerror(errno));
    }
    if (pid == 0) {
        close(p[0]);
        child_main(fd, path, p[1]);
    }
    close(p[1]);
    Buf b = {0};
    int got = read_stream(p[0], &b, now_ms() + WALK_WALL_MS);
    close(p[0]);
    if (got != STREAM_COMPLETE) kill(pid, SIGKILL);
    int wstatus = 0;
    while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {}
    Status s;
    if (got == STREAM_COMPLETE && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) {
        s = h5io_catalog_parse(b.p, b.n, path, what, cat);
    } else {
        char why[160];
        if (got == STREAM_BROKEN) snprintf(why, sizeof why, "its catalog was unreadable or over %zu MiB",
                                           WALK_STREAM_MAX >> 20);
        else child_fate(wstatus, got == STREAM_TIMEOUT, why, sizeof why);
        s = status_err("%s: corrupt %s: reading its HDF5 structure failed (%s); the file is damaged or crafted",
                       path, what, why);
    }
    free(b.p);
    return s;
}
