// h5io_read.c: h5io's reading half (h5io.h): the checks on a file's catalog
// and the reads of its datasets' bytes, which this process makes itself,
// at the addresses the sandboxed walk reported, bounded by the file's size
// and verified against the stored checksums. libhdf5 is not called here.
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fileio.h"
#include "h5io_walk.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "h5io reads stored little-endian bytes as they are");

#define H5IO_MAX_NUMEL ((int64_t)1 << 40)

// Read exactly n bytes at offset off: 0, an errno value, or -1 when the file ends first.
static int pread_all(int fd, void *dst, size_t n, int64_t off) {
    unsigned char *p = dst;
    while (n > 0) {
        ssize_t got = pread(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return errno;
        if (got == 0) return -1;
        p += got;
        off += got;
        n -= (size_t)got;
    }
    return 0;
}

static const char *const TYPE_NAMES[H5IO_TYPE_COUNT] = {"float32", "float64", "int32", "int64",
                                                        "uint8",   "uint64",  "string"};

// The last file's catalog, reused while the same file is opened unchanged
// (a loader opens a checkpoint several times: config, shapes, values, state).
// Its bytes are read afresh and checksummed on every read either way.
static struct {
    pthread_mutex_t lock;
    struct stat sb;
    H5ioCatalog *cat;
} last = {.lock = PTHREAD_MUTEX_INITIALIZER};

static bool same_file(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

static Status catalog_of(int fd, const struct stat *sb, const char *path, const char *what, H5ioCatalog **cat) {
    pthread_mutex_lock(&last.lock);
    if (last.cat && same_file(&last.sb, sb)) {
        last.cat->refs++;
        *cat = last.cat;
        pthread_mutex_unlock(&last.lock);
        return status_ok();
    }
    pthread_mutex_unlock(&last.lock);
    Status s = h5io_catalog(fd, path, what, cat);
    if (!s.ok) return s;
    pthread_mutex_lock(&last.lock);
    h5io_catalog_free(last.cat);
    last.cat = *cat;
    last.sb = *sb;
    (*cat)->refs++;
    pthread_mutex_unlock(&last.lock);
    return s;
}

Status h5io_open(H5ioFile *hf, const char *path, const char *what) {
    memset(hf, 0, sizeof *hf);
    hf->fd = -1;
    hf->path = path;
    int fd;
    Status s = file_open_regular(path, what, &fd);   // a FIFO or directory is refused here, not by HDF5
    if (!s.ok) return s;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        s = status_err("%s: cannot read the %s: %s", path, what, strerror(errno));
        close(fd);
        return s;
    }
    hf->file_size = (int64_t)sb.st_size;
    s = catalog_of(fd, &sb, path, what, &hf->cat);
    if (!s.ok) {
        close(fd);
        return s;
    }
    hf->fd = fd;
    return status_ok();
}

void h5io_close(H5ioFile *hf) {
    if (hf->fd >= 0) close(hf->fd);
    h5io_catalog_free(hf->cat);
    hf->fd = -1;
    hf->cat = NULL;
}

bool h5io_exists(const H5ioFile *hf, const char *name, Status *st) {
    char part[H5IO_NAME_MAX + 1];
    size_t len = strlen(name);
    if (len >= sizeof part || name[0] != '/') {
        if (st) *st = status_err("%s: %.200s: not a valid object name", hf->path, name);
        return false;
    }
    // Walk "/a", "/a/b", ...: every link must exist and be a hard link.
    for (size_t i = 1; i <= len; i++) {
        if (i < len && name[i] != '/') continue;
        memcpy(part, name, i);
        part[i] = 0;
        const H5ioEntry *e = h5io_catalog_find(hf->cat, part);
        if (!e) return false;
        if (e->o.kind == H5IO_OBJ_SOFT || e->o.kind == H5IO_OBJ_EXTERNAL) {
            if (st)
                *st = status_err("%s: %s: %s link (only hard links are read: an external or soft link could "
                                 "point anywhere)",
                                 hf->path, part, e->o.kind == H5IO_OBJ_EXTERNAL ? "an external" : "a soft");
            return false;
        }
    }
    return true;
}

const char *h5io_child(const H5ioFile *hf, const char *group, int i) {
    size_t g = strlen(group);
    bool root = g == 1 && group[0] == '/';
    for (int k = 0; hf->cat && k < hf->cat->n; k++) {
        const char *name = hf->cat->e[k].name;
        if (root ? name[0] != '/' || !name[1] : strncmp(name, group, g) != 0 || name[g] != '/') continue;
        const char *rest = name + (root ? 1 : g + 1);
        if (!*rest || strchr(rest, '/')) continue;
        if (i-- == 0) return rest;
    }
    return NULL;
}

static Status type_error(const H5ioFile *hf, const char *name, int t, unsigned types) {
    char list[128] = "";
    for (int i = 0; i < H5IO_TYPE_COUNT; i++)
        if (types & (1u << i))
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? " or " : "", TYPE_NAMES[i]);
    return status_err("%s: %s: stored as %s, expected %s", hf->path, name, t < 0 ? "an unsupported type" : TYPE_NAMES[t],
                      list);
}

static Status shape_error(const H5ioFile *hf, const char *name, const H5ioObj *o, int rank, const hsize_t *want) {
    char a[160] = "(", b[160] = "(";
    for (int k = 0; k < o->rank; k++)
        snprintf(a + strlen(a), sizeof a - strlen(a), "%s%llu", k ? ", " : "", (unsigned long long)o->dims[k]);
    for (int k = 0; want && k < rank; k++)
        snprintf(b + strlen(b), sizeof b - strlen(b), "%s%llu", k ? ", " : "", (unsigned long long)want[k]);
    strcat(a, ")");
    strcat(b, ")");
    if (want) return status_err("%s: %s: shape %s in the file, %s expected", hf->path, name, a, b);
    return status_err("%s: %s: %d dimensions in the file, %d expected", hf->path, name, o->rank, rank);
}

// The dataspace against the rank and shape wanted; fills info's shape.
static Status check_shape(const H5ioFile *hf, const char *name, const H5ioObj *o, int rank, const hsize_t *want,
                          int64_t max_numel, H5ioInfo *info) {
    const char *p = hf->path;
    if (o->type == H5IO_STRING) {
        if (o->space != H5IO_SPACE_SCALAR)
            return status_err("%s: %s: a string dataset must be a single (scalar) string", p, name);
        if (o->elem_size > (uint64_t)max_numel)
            return status_err("%s: %s: a string of %llu bytes, more than the %lld allowed", p, name,
                              (unsigned long long)o->elem_size, (long long)max_numel);
        info->rank = 0;
        info->numel = 1;
        return status_ok();
    }
    if (o->space != H5IO_SPACE_SIMPLE || o->rank < 0)
        return status_err("%s: %s: not an array of at most %d dimensions", p, name, H5IO_MAX_RANK);
    bool same = rank < 0 || o->rank == rank;
    for (int k = 0; same && want && k < o->rank; k++) same = o->dims[k] == want[k];
    if (!same) return shape_error(hf, name, o, rank, want);
    int64_t numel = 1;
    for (int k = 0; k < o->rank; k++) {
        uint64_t d = o->dims[k];
        if (d > (uint64_t)H5IO_MAX_NUMEL || (d && numel > H5IO_MAX_NUMEL / (int64_t)d))
            return status_err("%s: %s: absurd shape (more than 2^40 elements)", p, name);
        numel *= (int64_t)d;
    }
    if (numel > max_numel)
        return status_err("%s: %s: %lld elements, more than the %lld allowed", p, name, (long long)numel,
                          (long long)max_numel);
    info->rank = o->rank;
    for (int k = 0; k < o->rank; k++) info->dims[k] = (hsize_t)o->dims[k];
    info->numel = numel;
    return status_ok();
}

// Contiguous or compact, no filters or external files, written, inside the file, a checksum.
static Status check_storage(const H5ioFile *hf, const char *name, const H5ioObj *o, const H5ioInfo *info) {
    const char *p = hf->path;
    if (o->layout == H5IO_LAYOUT_OTHER || o->nfilters != 0 || o->nexternal != 0)
        return status_err("%s: %s: stored %s; only plain contiguous or compact data is read", p, name,
                          o->nexternal > 0  ? "in external files"
                          : o->nfilters > 0 ? "with filters (compression)"
                                            : "in chunks or a virtual layout");
    if (!o->allocated) return status_err("%s: %s: never written (it would read as zeros)", p, name);
    uint64_t bytes = (uint64_t)info->numel * info->elem_size;
    if (o->storage != bytes || o->storage > (uint64_t)hf->file_size)
        return status_err("%s: %s: %llu bytes of storage for %llu bytes of data in a file of %lld bytes "
                          "(truncated or corrupt?)",
                          p, name, (unsigned long long)o->storage, (unsigned long long)bytes,
                          (long long)hf->file_size);
    bool placed = o->layout == H5IO_LAYOUT_COMPACT ? o->compact_len == bytes
                                                   : o->offset != H5IO_NO_OFFSET && o->offset <= (uint64_t)hf->file_size &&
                                                         bytes <= (uint64_t)hf->file_size - o->offset;
    if (!placed)
        return status_err("%s: %s: its data lies beyond the end of the file (truncated or corrupt?)", p, name);
    if (o->crc_state == H5IO_CRC_MISSING)
        return status_err("%s: %s: no crc32 checksum attribute (not written by this program?)", p, name);
    if (o->crc_state != H5IO_CRC_OK)
        return status_err("%s: %s: the crc32 attribute is not one 32-bit integer", p, name);
    return status_ok();
}

Status h5io_check(const H5ioFile *hf, const char *name, unsigned types, int rank, const hsize_t *dims,
                  int64_t max_numel, H5ioInfo *info) {
    memset(info, 0, sizeof *info);
    Status s = status_ok();
    if (!h5io_exists(hf, name, &s)) return s.ok ? status_err("%s: %s: missing", hf->path, name) : s;
    const H5ioEntry *e = h5io_catalog_find(hf->cat, name);
    if (e->o.kind != H5IO_OBJ_DATASET) return status_err("%s: %s: not a dataset", hf->path, name);
    const H5ioObj *o = &e->o;
    if (o->type < 0 || !(types & (1u << o->type))) return type_error(hf, name, o->type, types);
    info->type = (H5ioType)o->type;
    info->elem_size = (size_t)o->elem_size;
    s = check_shape(hf, name, o, rank, dims, max_numel, info);
    return s.ok ? check_storage(hf, name, o, info) : s;
}

static Status crc_verdict(const H5ioFile *hf, const char *name, uint32_t want, const void *data, size_t n) {
    uint32_t got = h5io_crc32(data, n);
    if (got != want)
        return status_err("%s: %s: checksum mismatch (stored %08x, data %08x): the file is corrupt or was altered",
                          hf->path, name, want, got);
    return status_ok();
}

Status h5io_read(const H5ioFile *hf, const char *name, const H5ioInfo *info, void *raw) {
    const H5ioEntry *e = h5io_catalog_find(hf->cat, name);
    size_t bytes = (size_t)info->numel * info->elem_size;
    if (!e || e->o.kind != H5IO_OBJ_DATASET || e->o.crc_state != H5IO_CRC_OK)
        return status_err("%s: %s: cannot open the dataset", hf->path, name);
    if (e->o.layout == H5IO_LAYOUT_COMPACT) {
        if (e->o.compact_len != bytes) return status_err("%s: %s: read failed (corrupt file?)", hf->path, name);
        memcpy(raw, e->compact, bytes);
    } else {
        int err = pread_all(hf->fd, raw, bytes, (int64_t)e->o.offset);
        if (err)
            return status_err("%s: %s: read failed: %s (truncated or corrupt file?)", hf->path, name,
                              err < 0 ? "the file ends early" : strerror(err));
    }
    return crc_verdict(hf, name, e->o.crc, raw, bytes);
}

// ---------------------------------------------------------------- mapping
//
// A mapped file that is truncated under a running program faults (SIGBUS)
// where its pages were. The handler turns that fault inside a mapping h5io
// made into a sentence naming the file, and exits; any other SIGBUS keeps
// its default action.

#define MAP_SLOTS 16

static struct {
    _Atomic(const char *) lo;
    _Atomic(const char *) hi;
    char msg[320];
} map_slot[MAP_SLOTS];
static struct sigaction map_old_bus;
static atomic_int map_handler_set;

static void on_bus(int sig, siginfo_t *si, void *ctx) {
    const char *a = si ? (const char *)si->si_addr : NULL;
    for (int i = 0; a && i < MAP_SLOTS; i++) {
        const char *lo = atomic_load(&map_slot[i].lo), *hi = atomic_load(&map_slot[i].hi);
        if (lo && a >= lo && a < hi) {
            ssize_t w = write(STDERR_FILENO, map_slot[i].msg, strlen(map_slot[i].msg));
            (void)w;
            _exit(1);
        }
    }
    if (map_old_bus.sa_flags & SA_SIGINFO) map_old_bus.sa_sigaction(sig, si, ctx);
    else if (map_old_bus.sa_handler != SIG_IGN && map_old_bus.sa_handler != SIG_DFL) map_old_bus.sa_handler(sig);
    else {
        signal(SIGBUS, SIG_DFL);
        raise(SIGBUS);
    }
}

static void map_watch(const H5ioFile *hf, const void *base, size_t len) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&map_handler_set, &expected, 1)) {
        struct sigaction sa = {0};
        sa.sa_sigaction = on_bus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, &map_old_bus);
    }
    for (int i = 0; i < MAP_SLOTS; i++) {
        if (atomic_load(&map_slot[i].lo)) continue;
        snprintf(map_slot[i].msg, sizeof map_slot[i].msg,
                 "error: %s: the file was truncated or rewritten while this program was reading it; stopping\n",
                 hf->path);
        atomic_store(&map_slot[i].hi, (const char *)base + len);
        atomic_store(&map_slot[i].lo, (const char *)base);
        return;
    }
}

static void map_unwatch(const void *base) {
    for (int i = 0; i < MAP_SLOTS; i++)
        if (atomic_load(&map_slot[i].lo) == base) {
            atomic_store(&map_slot[i].lo, NULL);
            atomic_store(&map_slot[i].hi, NULL);
        }
}

Status h5io_map(const H5ioFile *hf, const char *name, const H5ioInfo *info, size_t align, H5ioMap *map) {
    memset(map, 0, sizeof *map);
    const H5ioEntry *e = h5io_catalog_find(hf->cat, name);
    if (!e || e->o.kind != H5IO_OBJ_DATASET) return status_err("%s: %s: cannot open the dataset", hf->path, name);
    uint64_t off = e->o.offset, bytes = (uint64_t)info->numel * info->elem_size;
    if (e->o.crc_state != H5IO_CRC_OK) return status_err("%s: %s: unreadable checksum", hf->path, name);
    if (off == H5IO_NO_OFFSET || bytes == 0) return status_err("%s: %s: no file address to map", hf->path, name);
    if (align > 1 && off % align != 0) return status_err("%s: %s: not aligned for mapping", hf->path, name);
    struct stat sb;
    if (fstat(hf->fd, &sb) != 0 || (int64_t)sb.st_size != hf->file_size)
        return status_err("%s: changed while it was being read", hf->path);
    if (off > (uint64_t)hf->file_size || bytes > (uint64_t)hf->file_size - off)
        return status_err("%s: %s: its data lies beyond the end of the file (truncated or corrupt?)", hf->path, name);
    long page = sysconf(_SC_PAGESIZE);
    uint64_t start = off - off % (uint64_t)page;
    size_t len = (size_t)(off - start + bytes);
    void *base = mmap(NULL, len, PROT_READ, MAP_SHARED, hf->fd, (off_t)start);
    if (base == MAP_FAILED) return status_err("%s: %s: mmap failed: %s", hf->path, name, strerror(errno));
    map_watch(hf, base, len);
    const unsigned char *data = (const unsigned char *)base + (off - start);
    Status s = crc_verdict(hf, name, e->o.crc, data, (size_t)bytes);
    if (!s.ok) {
        map_unwatch(base);
        munmap(base, len);
        return s;
    }
    *map = (H5ioMap){data, base, len};
    return status_ok();
}

void h5io_unmap(H5ioMap *map) {
    if (map->base) {
        map_unwatch(map->base);
        munmap(map->base, map->len);
    }
    memset(map, 0, sizeof *map);
}

Status h5io_read_attr_string(const H5ioFile *hf, const char *obj, const char *attr, char *out, size_t cap) {
    out[0] = 0;
    const H5ioEntry *e = h5io_catalog_find(hf->cat, obj);
    if (!e || (e->o.kind != H5IO_OBJ_GROUP && e->o.kind != H5IO_OBJ_DATASET))
        return status_err("%s: %s: cannot open", hf->path, obj);
    const H5ioAttr *a = NULL;
    for (uint32_t k = 0; k < e->o.n_attrs && !a; k++)
        if (strcmp(e->attrs[k].name, attr) == 0) a = &e->attrs[k];
    if (!a) return status_err("%s: %s: attribute '%s' missing", hf->path, obj, attr);
    if (a->h.state != H5IO_ATTR_STRING)
        return status_err("%s: %s: attribute '%s' is not a single fixed-length string", hf->path, obj, attr);
    if (a->h.size >= cap)
        return status_err("%s: %s: attribute '%s' is %llu bytes long, at most %zu expected", hf->path, obj, attr,
                          (unsigned long long)a->h.size, cap - 1);
    if (a->h.value_len != a->h.size) return status_err("%s: %s: attribute '%s' unreadable", hf->path, obj, attr);
    memset(out, 0, cap);
    memcpy(out, a->value, a->h.value_len);
    out[cap - 1] = 0;
    return status_ok();
}
