// h5io.h: HDF5 datasets written with a checksum and read as hostile input.
//
// Checkpoints and token caches are files a user may have copied, truncated,
// edited or been handed. libhdf5 itself is not safe on such files (crafted
// object headers crash it or make it ask for 2^63 bytes), so the reading
// side never runs libhdf5 on an untrusted file in the calling process:
// h5io_open forks a child, with bounded memory, CPU time and wall time,
// that walks the file's structure with libhdf5 and hands back a catalog of
// its objects (data/h5io_walk.c). A crash, limit or timeout there becomes
// "corrupt file" here. The parent then reads every dataset's bytes itself,
// at the address the catalog gives, bounds-checked against the file.
//
// Everything read through h5io_check / h5io_read is checked before a byte is
// allocated or read:
//   - the path names a regular file that HDF5 recognises;
//   - every link on the way to a dataset is a hard link (no external or soft
//     links that would open other files), and the object is a dataset;
//   - the dataset's type is exactly one of the little-endian standard types
//     the writer uses (H5IO_F32 ...), its dataspace has the expected rank and
//     shape, its element count is bounded;
//   - its storage is contiguous or compact (no filters, so no decompression
//     bomb; no external storage), was written (a never-written dataset would
//     read as zeros), and its size is exactly elements x element size and
//     fits inside the file;
//   - a "crc32" attribute holds the CRC-32 (zlib) of the stored bytes, which
//     h5io_read verifies.
// Writers attach that attribute with h5io_write.
#ifndef DATA_H5IO_H
#define DATA_H5IO_H

#include <hdf5.h>

#include "common.h"

#define H5IO_MAX_RANK 8

typedef enum {
    H5IO_F32,      // IEEE float32, little-endian
    H5IO_F64,      // IEEE float64, little-endian
    H5IO_I32,      // int32, little-endian
    H5IO_I64,      // int64, little-endian
    H5IO_U8,       // uint8
    H5IO_U64,      // uint64, little-endian
    H5IO_STRING,   // a fixed-length string in a scalar dataspace
    H5IO_TYPE_COUNT
} H5ioType;

typedef struct H5ioCatalog H5ioCatalog;   // data/h5io_walk.h

typedef struct H5ioFile {
    int fd;                // the file opened; every read and map is of this one
    const char *path;      // for messages (not owned)
    int64_t file_size;     // bytes
    H5ioCatalog *cat;      // its objects, as the sandboxed walk saw them
} H5ioFile;

typedef struct H5ioInfo {
    H5ioType type;
    int rank;
    hsize_t dims[H5IO_MAX_RANK];
    int64_t numel;         // elements (strings: 1)
    size_t elem_size;      // bytes per element (strings: the string length)
} H5ioInfo;

// Open an existing HDF5 file read-only and catalog its objects in a
// sandboxed child; `what` names it in messages ("checkpoint", "token cache").
Status h5io_open(H5ioFile *hf, const char *path, const char *what);
void h5io_close(H5ioFile *hf);

// Does the hard link `name` (absolute, "/a/b") exist? Errors (a soft or
// external link on the way) are reported through *st when st is non-NULL.
bool h5io_exists(const H5ioFile *hf, const char *name, Status *st);

// The names (without the group's path) of the objects linked from group
// `group`, in name order: the i-th of them, or NULL past the last.
const char *h5io_child(const H5ioFile *hf, const char *group, int i);

// Check dataset `name` as described above. `types` is a bit set of the
// accepted H5ioType values (1u << H5IO_F32 | ...). rank < 0 accepts any rank;
// dims NULL accepts any shape; max_numel bounds the element count (strings:
// the length). Fills *info.
Status h5io_check(const H5ioFile *hf, const char *name, unsigned types, int rank, const hsize_t *dims,
                  int64_t max_numel, H5ioInfo *info);

// Read a dataset checked by h5io_check into `raw` (numel x elem_size bytes,
// as stored: little-endian) and verify its checksum.
Status h5io_read(const H5ioFile *hf, const char *name, const H5ioInfo *info, void *raw);

// A dataset's stored bytes mapped read-only from the file (shared with
// every process that maps them: the page cache's pages, not a copy).
typedef struct H5ioMap {
    const void *data;      // numel x elem_size bytes, as stored
    void *base;            // the mapping (page-aligned), for munmap
    size_t len;
} H5ioMap;
// Map a dataset checked by h5io_check and verify its checksum over the mapped
// bytes. Fails (the caller reads instead) when the data has no single file
// address (compact storage) or its address is not a multiple of `align`
// bytes (the element alignment the caller needs; files written by
// h5io_create_memory_aligned place large datasets on page boundaries).
Status h5io_map(const H5ioFile *hf, const char *name, const H5ioInfo *info, size_t align, H5ioMap *map);
void h5io_unmap(H5ioMap *map);

// Read a string attribute of at most cap - 1 bytes into out (NUL-terminated).
Status h5io_read_attr_string(const H5ioFile *hf, const char *obj, const char *attr, char *out, size_t cap);

// Write a dataset of `type` from bytes already in its stored layout
// (little-endian; strings: `dims` NULL and rank 0, n = the length), with its
// checksum attribute. Returns false on any HDF5 error.
bool h5io_write(hid_t loc, const char *name, H5ioType type, int rank, const hsize_t *dims, const void *raw);
bool h5io_write_string(hid_t loc, const char *name, const char *text);

// Files are built in memory (HDF5's core driver) and written out by
// h5io_commit in one checked write of the file image, so an I/O error (a full
// disk) is ours to report and never leaves HDF5 holding a half-closed file.
hid_t h5io_create_memory(void);
// The same, with every object of `alignment` bytes or more placed at a file
// address that is a multiple of it (4096: datasets that h5io_map can map).
hid_t h5io_create_memory_aligned(hsize_t alignment);
// Write the in-memory file f over `path` through file_replace (fileio.h: a
// new temporary beside it, fsync'd and renamed; only a regular file or a new
// name is replaced), then close f. On any error f is closed and path
// untouched; `what` ("checkpoint") names the file in messages.
Status h5io_commit(hid_t f, const char *path, const char *what);

// CRC-32 of n bytes (zlib's polynomial), for callers that checksum their own data.
uint32_t h5io_crc32(const void *data, size_t n);

#endif
