#include "h5io.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5_hl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "fileio.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "h5io reads stored little-endian bytes as they are");

#define CRC_ATTR "crc32"

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
