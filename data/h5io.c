#include "h5io.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5_hl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "fileio.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "h5io reads stored little-endian bytes as they are");

#define CRC_ATTR "crc32"
#define H5IO_MAX_NUMEL ((int64_t)1 << 40)

static const char *const TYPE_NAMES[H5IO_TYPE_COUNT] = {"float32", "float64", "int32", "int64",
                                                        "uint8",   "uint64",  "string"};

// The file type of each H5ioType (strings are built per dataset).
static hid_t file_type(H5ioType t) {
    switch (t) {
    case H5IO_F32: return H5T_IEEE_F32LE;
    case H5IO_F64: return H5T_IEEE_F64LE;
    case H5IO_I32: return H5T_STD_I32LE;
    case H5IO_I64: return H5T_STD_I64LE;
    case H5IO_U8: return H5T_STD_U8LE;
    case H5IO_U64: return H5T_STD_U64LE;
    default: return -1;
    }
}

uint32_t h5io_crc32(const void *data, size_t n) {
    uLong crc = crc32(0L, Z_NULL, 0);
    const Bytef *p = data;
    while (n > 0) {
        uInt take = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = crc32(crc, p, take);
        p += take;
        n -= take;
    }
    return (uint32_t)crc;
}

Status h5io_open(H5ioFile *hf, const char *path, const char *what) {
    memset(hf, 0, sizeof *hf);
    hf->f = -1;
    hf->path = path;
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    int fd;
    Status s = file_open_regular(path, what, &fd);   // a FIFO or directory is refused here, not by HDF5
    if (!s.ok) return s;
    struct stat sb;
    if (fstat(fd, &sb) == 0) {
        hf->file_size = (int64_t)sb.st_size;
        hf->dev = (uint64_t)sb.st_dev;
        hf->ino = (uint64_t)sb.st_ino;
    }
    close(fd);
#if H5_VERSION_GE(1, 12, 0)
    htri_t is_hdf5 = H5Fis_accessible(path, H5P_DEFAULT);
#else
    htri_t is_hdf5 = H5Fis_hdf5(path);
#endif
    if (is_hdf5 <= 0) return status_err("%s: not an HDF5 file (not a %s, or truncated)", path, what);
    hf->f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (hf->f < 0) return status_err("%s: cannot open the %s as HDF5 (truncated or corrupt?)", path, what);
    return status_ok();
}

void h5io_close(H5ioFile *hf) {
    if (hf->f >= 0) H5Fclose(hf->f);
    hf->f = -1;
}

bool h5io_exists(const H5ioFile *hf, const char *name, Status *st) {
    char part[1024];
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
        if (H5Lexists(hf->f, part, H5P_DEFAULT) <= 0) return false;
        H5L_info_t li;
        if (H5Lget_info(hf->f, part, &li, H5P_DEFAULT) < 0) return false;
        if (li.type != H5L_TYPE_HARD) {
            if (st)
                *st = status_err("%s: %s: %s link (only hard links are read: an external or soft link could "
                                 "point anywhere)",
                                 hf->path, part, li.type == H5L_TYPE_EXTERNAL ? "an external" : "a soft");
            return false;
        }
    }
    return true;
}

// Which H5ioType is the dataset's type? -1 if none.
static int type_of(hid_t dtype) {
    if (H5Tget_class(dtype) == H5T_STRING) return H5Tis_variable_str(dtype) > 0 ? -1 : H5IO_STRING;
    for (int t = 0; t < H5IO_STRING; t++)
        if (H5Tequal(dtype, file_type((H5ioType)t)) > 0) return t;
    return -1;
}

static Status check_open(const H5ioFile *hf, const char *name, hid_t d, unsigned types, int rank,
                         const hsize_t *want, int64_t max_numel, H5ioInfo *info) {
    const char *p = hf->path;
    memset(info, 0, sizeof *info);
    // Type.
    hid_t dt = H5Dget_type(d);
    int t = dt >= 0 ? type_of(dt) : -1;
    size_t tsize = dt >= 0 ? H5Tget_size(dt) : 0;
    if (dt >= 0) H5Tclose(dt);
    if (t < 0 || !(types & (1u << t))) {
        char list[128] = "";
        for (int i = 0; i < H5IO_TYPE_COUNT; i++)
            if (types & (1u << i))
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? " or " : "",
                         TYPE_NAMES[i]);
        return status_err("%s: %s: stored as %s, expected %s", p, name, t < 0 ? "an unsupported type" : TYPE_NAMES[t],
                          list);
    }
    info->type = (H5ioType)t;
    info->elem_size = tsize;
    // Shape.
    hid_t sp = H5Dget_space(d);
    H5S_class_t sc = sp >= 0 ? H5Sget_simple_extent_type(sp) : H5S_NO_CLASS;
    int r = sp >= 0 ? H5Sget_simple_extent_ndims(sp) : -1;
    hsize_t dims[H5IO_MAX_RANK] = {0};
    if (r >= 0 && r <= H5IO_MAX_RANK) H5Sget_simple_extent_dims(sp, dims, NULL);
    if (sp >= 0) H5Sclose(sp);
    if (t == H5IO_STRING) {
        if (sc != H5S_SCALAR) return status_err("%s: %s: a string dataset must be a single (scalar) string", p, name);
        if ((int64_t)tsize > max_numel)
            return status_err("%s: %s: a string of %zu bytes, more than the %lld allowed", p, name, tsize,
                              (long long)max_numel);
        info->rank = 0;
        info->numel = 1;
    } else {
        if (sc != H5S_SIMPLE || r < 0 || r > H5IO_MAX_RANK)
            return status_err("%s: %s: not an array of at most %d dimensions", p, name, H5IO_MAX_RANK);
        bool same = rank < 0 || r == rank;
        for (int k = 0; same && want && k < r; k++) same = dims[k] == want[k];
        if (!same) {
            char a[160] = "(", b[160] = "(";
            for (int k = 0; k < r; k++)
                snprintf(a + strlen(a), sizeof a - strlen(a), "%s%llu", k ? ", " : "", (unsigned long long)dims[k]);
            for (int k = 0; want && k < rank; k++)
                snprintf(b + strlen(b), sizeof b - strlen(b), "%s%llu", k ? ", " : "", (unsigned long long)want[k]);
            strcat(a, ")");
            strcat(b, ")");
            if (want) return status_err("%s: %s: shape %s in the file, %s expected", p, name, a, b);
            return status_err("%s: %s: %d dimensions in the file, %d expected", p, name, r, rank);
        }
        int64_t numel = 1;
        for (int k = 0; k < r; k++) {
            if (dims[k] > (hsize_t)H5IO_MAX_NUMEL || (dims[k] && numel > H5IO_MAX_NUMEL / (int64_t)dims[k]))
                return status_err("%s: %s: absurd shape (more than 2^40 elements)", p, name);
            numel *= (int64_t)dims[k];
        }
        if (numel > max_numel)
            return status_err("%s: %s: %lld elements, more than the %lld allowed", p, name, (long long)numel,
                              (long long)max_numel);
        info->rank = r;
        memcpy(info->dims, dims, sizeof dims);
        info->numel = numel;
    }
    // Storage: contiguous or compact, no filters or external files, written, inside the file.
    hid_t pl = H5Dget_create_plist(d);
    H5D_layout_t layout = pl >= 0 ? H5Pget_layout(pl) : H5D_LAYOUT_ERROR;
    int nfilters = pl >= 0 ? H5Pget_nfilters(pl) : -1;
    int nexternal = pl >= 0 ? H5Pget_external_count(pl) : -1;
    if (pl >= 0) H5Pclose(pl);
    if ((layout != H5D_CONTIGUOUS && layout != H5D_COMPACT) || nfilters != 0 || nexternal != 0)
        return status_err("%s: %s: stored %s; only plain contiguous or compact data is read", p, name,
                          nexternal > 0  ? "in external files"
                          : nfilters > 0 ? "with filters (compression)"
                                         : "in chunks or a virtual layout");
    H5D_space_status_t status;
    if (H5Dget_space_status(d, &status) < 0 || status != H5D_SPACE_STATUS_ALLOCATED)
        return status_err("%s: %s: never written (it would read as zeros)", p, name);
    uint64_t bytes = (uint64_t)info->numel * info->elem_size;
    uint64_t stored = H5Dget_storage_size(d);
    if (stored != bytes || (int64_t)stored > hf->file_size)
        return status_err("%s: %s: %llu bytes of storage for %llu bytes of data in a file of %lld bytes "
                          "(truncated or corrupt?)",
                          p, name, (unsigned long long)stored, (unsigned long long)bytes, (long long)hf->file_size);
    // The checksum attribute.
    htri_t has = H5Aexists(d, CRC_ATTR);
    if (has <= 0) return status_err("%s: %s: no %s checksum attribute (not written by this program?)", p, name, CRC_ATTR);
    hid_t a = H5Aopen(d, CRC_ATTR, H5P_DEFAULT);
    hid_t at = a >= 0 ? H5Aget_type(a) : -1;
    hid_t as = a >= 0 ? H5Aget_space(a) : -1;
    bool ok = at >= 0 && as >= 0 && H5Tget_class(at) == H5T_INTEGER && H5Tget_size(at) == 4 &&
              H5Sget_simple_extent_npoints(as) == 1;
    if (at >= 0) H5Tclose(at);
    if (as >= 0) H5Sclose(as);
    if (a >= 0) H5Aclose(a);
    if (!ok) return status_err("%s: %s: the %s attribute is not one 32-bit integer", p, name, CRC_ATTR);
    return status_ok();
}

Status h5io_check(const H5ioFile *hf, const char *name, unsigned types, int rank, const hsize_t *dims,
                  int64_t max_numel, H5ioInfo *info) {
    Status s = status_ok();
    if (!h5io_exists(hf, name, &s)) return s.ok ? status_err("%s: %s: missing", hf->path, name) : s;
    hid_t d = H5Dopen2(hf->f, name, H5P_DEFAULT);
    if (d < 0) return status_err("%s: %s: not a dataset", hf->path, name);
    s = check_open(hf, name, d, types, rank, dims, max_numel, info);
    H5Dclose(d);
    return s;
}

Status h5io_read(const H5ioFile *hf, const char *name, const H5ioInfo *info, void *raw) {
    hid_t d = H5Dopen2(hf->f, name, H5P_DEFAULT);
    if (d < 0) return status_err("%s: %s: cannot open the dataset", hf->path, name);
    hid_t mt = info->type == H5IO_STRING ? H5Dget_type(d) : H5Tcopy(file_type(info->type));
    uint32_t want = 0;
    hid_t a = H5Aopen(d, CRC_ATTR, H5P_DEFAULT);
    herr_t e = a >= 0 ? H5Aread(a, H5T_NATIVE_UINT32, &want) : -1;
    if (a >= 0) H5Aclose(a);
    if (e >= 0 && mt >= 0) e = H5Dread(d, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw);
    if (mt >= 0) H5Tclose(mt);
    H5Dclose(d);
    if (e < 0 || mt < 0) return status_err("%s: %s: read failed (truncated or corrupt file?)", hf->path, name);
    uint32_t got = h5io_crc32(raw, (size_t)info->numel * info->elem_size);
    if (got != want)
        return status_err("%s: %s: checksum mismatch (stored %08x, data %08x): the file is corrupt or was altered",
                          hf->path, name, want, got);
    return status_ok();
}

// The dataset's stored checksum (its attribute, checked by h5io_check).
static bool stored_crc(hid_t d, uint32_t *crc) {
    hid_t a = H5Aopen(d, CRC_ATTR, H5P_DEFAULT);
    bool ok = a >= 0 && H5Aread(a, H5T_NATIVE_UINT32, crc) >= 0;
    if (a >= 0) H5Aclose(a);
    return ok;
}

Status h5io_map(const H5ioFile *hf, const char *name, const H5ioInfo *info, size_t align, H5ioMap *map) {
    memset(map, 0, sizeof *map);
    hid_t d = H5Dopen2(hf->f, name, H5P_DEFAULT);
    if (d < 0) return status_err("%s: %s: cannot open the dataset", hf->path, name);
    haddr_t off = H5Dget_offset(d);
    uint32_t want = 0;
    bool crc_ok = stored_crc(d, &want);
    H5Dclose(d);
    uint64_t bytes = (uint64_t)info->numel * info->elem_size;
    if (!crc_ok) return status_err("%s: %s: unreadable checksum", hf->path, name);
    if (off == HADDR_UNDEF || bytes == 0) return status_err("%s: %s: no file address to map", hf->path, name);
    if (align > 1 && off % align != 0) return status_err("%s: %s: not aligned for mapping", hf->path, name);
    if (off > (uint64_t)hf->file_size || bytes > (uint64_t)hf->file_size - off)
        return status_err("%s: %s: its data lies beyond the end of the file (truncated or corrupt?)", hf->path, name);
    int fd;
    Status s = file_open_regular(hf->path, "file", &fd);
    if (!s.ok) return s;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_dev != hf->dev || (uint64_t)sb.st_ino != hf->ino ||
        (int64_t)sb.st_size != hf->file_size) {
        close(fd);
        return status_err("%s: replaced while it was being read", hf->path);
    }
    long page = sysconf(_SC_PAGESIZE);
    uint64_t start = off - off % (uint64_t)page;
    size_t len = (size_t)(off - start + bytes);
    void *base = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)start);
    close(fd);
    if (base == MAP_FAILED) return status_err("%s: %s: mmap failed: %s", hf->path, name, strerror(errno));
    const unsigned char *data = (const unsigned char *)base + (off - start);
    uint32_t got = h5io_crc32(data, (size_t)bytes);
    if (got != want) {
        munmap(base, len);
        return status_err("%s: %s: checksum mismatch (stored %08x, data %08x): the file is corrupt or was altered",
                          hf->path, name, want, got);
    }
    *map = (H5ioMap){data, base, len};
    return status_ok();
}

void h5io_unmap(H5ioMap *map) {
    if (map->base) munmap(map->base, map->len);
    memset(map, 0, sizeof *map);
}

Status h5io_read_attr_string(const H5ioFile *hf, const char *obj, const char *attr, char *out, size_t cap) {
    out[0] = 0;
    hid_t o = H5Oopen(hf->f, obj, H5P_DEFAULT);
    if (o < 0) return status_err("%s: %s: cannot open", hf->path, obj);
    Status s = status_ok();
    hid_t a = H5Aexists(o, attr) > 0 ? H5Aopen(o, attr, H5P_DEFAULT) : -1;
    hid_t t = a >= 0 ? H5Aget_type(a) : -1;
    hid_t sp = a >= 0 ? H5Aget_space(a) : -1;
    if (a < 0) s = status_err("%s: %s: attribute '%s' missing", hf->path, obj, attr);
    else if (t < 0 || sp < 0 || H5Tget_class(t) != H5T_STRING || H5Tis_variable_str(t) != 0 ||
             H5Sget_simple_extent_npoints(sp) != 1)
        s = status_err("%s: %s: attribute '%s' is not a single fixed-length string", hf->path, obj, attr);
    else if (H5Tget_size(t) >= cap)
        s = status_err("%s: %s: attribute '%s' is %zu bytes long, at most %zu expected", hf->path, obj, attr,
                       H5Tget_size(t), cap - 1);
    else {
        memset(out, 0, cap);
        if (H5Aread(a, t, out) < 0) s = status_err("%s: %s: attribute '%s' unreadable", hf->path, obj, attr);
        out[cap - 1] = 0;
    }
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    H5Oclose(o);
    return s;
}

static bool attach_crc(hid_t d, const void *raw, size_t bytes) {
    uint32_t crc = h5io_crc32(raw, bytes);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = sp >= 0 ? H5Acreate2(d, CRC_ATTR, H5T_STD_U32LE, sp, H5P_DEFAULT, H5P_DEFAULT) : -1;
    bool ok = a >= 0 && H5Awrite(a, H5T_NATIVE_UINT32, &crc) >= 0;
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    return ok;
}

static bool write_with(hid_t loc, const char *name, hid_t ftype, hid_t space, const void *raw, size_t bytes) {
    hid_t d = space >= 0 ? H5Dcreate2(loc, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) : -1;
    bool ok = d >= 0 && H5Dwrite(d, ftype, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw) >= 0 && attach_crc(d, raw, bytes);
    if (d >= 0) ok = H5Dclose(d) >= 0 && ok;
    return ok;
}

bool h5io_write(hid_t loc, const char *name, H5ioType type, int rank, const hsize_t *dims, const void *raw) {
    ASSERT(type != H5IO_STRING && rank >= 1 && rank <= H5IO_MAX_RANK, "h5io_write('%s'): type %d, rank %d", name,
           (int)type, rank);
    hid_t ft = file_type(type);
    size_t bytes = H5Tget_size(ft);
    for (int k = 0; k < rank; k++) bytes *= (size_t)dims[k];
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    bool ok = write_with(loc, name, ft, sp, raw, bytes);
    if (sp >= 0) H5Sclose(sp);
    return ok;
}

bool h5io_write_string(hid_t loc, const char *name, const char *text) {
    size_t n = strlen(text);
    hid_t st = H5Tcopy(H5T_C_S1);
    // A zero-length string type is not allowed: an empty text is stored as one NUL.
    bool ok = st >= 0 && H5Tset_size(st, n ? n : 1) >= 0 && H5Tset_strpad(st, H5T_STR_NULLPAD) >= 0;
    hid_t sp = H5Screate(H5S_SCALAR);
    char zero = 0;
    ok = ok && write_with(loc, name, st, sp, n ? (const void *)text : &zero, n ? n : 1);
    if (sp >= 0) H5Sclose(sp);
    if (st >= 0) H5Tclose(st);
    return ok;
}

hid_t h5io_create_memory(void) { return h5io_create_memory_aligned(0); }

hid_t h5io_create_memory_aligned(hsize_t alignment) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_fapl_core(fapl, 1 << 20, 0) < 0 ||   // grow by 1 MiB, no backing file
        (alignment > 1 && H5Pset_alignment(fapl, alignment, alignment) < 0)) {
        if (fapl >= 0) H5Pclose(fapl);
        return -1;
    }
    hid_t f = H5Fcreate("in-memory.h5", H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    return f;
}

Status h5io_commit(hid_t f, const char *path, const char *what) {
    ssize_t size = H5Fflush(f, H5F_SCOPE_GLOBAL) >= 0 ? H5Fget_file_image(f, NULL, 0) : -1;
    void *image = size > 0 ? malloc((size_t)size) : NULL;
    bool ok = image && H5Fget_file_image(f, image, (size_t)size) == size;
    ok = H5Fclose(f) >= 0 && ok;
    Status s = ok ? file_replace(path, what, image, (size_t)size, 0)
                  : status_err("%s: building the %s in memory failed", path, what);
    free(image);
    return s;
}
