// h5io_walk.h: the catalog of an HDF5 file's objects, made by a sandboxed
// child process (h5io_walk.c) and read by h5io's checks (h5io_read.c).
//
// The child runs libhdf5 on the untrusted file; the parent never does. What
// crosses between them is a flat stream of records that the parent parses
// with every length bounded, so nothing the file says reaches the parent
// except through these fields.
#ifndef DATA_H5IO_WALK_H
#define DATA_H5IO_WALK_H

#include <stdint.h>

#include "h5io.h"

enum { H5IO_OBJ_GROUP, H5IO_OBJ_DATASET, H5IO_OBJ_SOFT, H5IO_OBJ_EXTERNAL, H5IO_OBJ_OTHER, H5IO_OBJ_COUNT };
enum { H5IO_SPACE_SIMPLE, H5IO_SPACE_SCALAR, H5IO_SPACE_OTHER };
enum { H5IO_LAYOUT_CONTIGUOUS, H5IO_LAYOUT_COMPACT, H5IO_LAYOUT_OTHER };
enum { H5IO_CRC_MISSING, H5IO_CRC_MALFORMED, H5IO_CRC_OK };
enum { H5IO_ATTR_STRING, H5IO_ATTR_OTHER };

#define H5IO_NAME_MAX 1023          // bytes of an object's full name
#define H5IO_MAX_OBJECTS 65536      // objects in one file
#define H5IO_MAX_ATTRS 64           // attributes of one object
#define H5IO_ATTR_VALUE_MAX 4096    // bytes of a string attribute's value kept
#define H5IO_COMPACT_MAX 65536      // bytes of a compact dataset (HDF5's own limit is 64 KiB)
#define H5IO_NO_OFFSET UINT64_MAX

// The stream: a head {H5IO_WALK_MAGIC, status, objects, 0} of uint32s, one
// record per object (H5ioObj, the name, a compact dataset's bytes, then per
// attribute an H5ioAttrHead, its name and value), then H5IO_WALK_END.
#define H5IO_WALK_MAGIC 0x4f493548u   // "H5IO"
#define H5IO_WALK_END 0x444e4548u     // "HEND"
enum { H5IO_WALK_OK, H5IO_WALK_NOT_HDF5, H5IO_WALK_CANNOT_OPEN, H5IO_WALK_TOO_MANY, H5IO_WALK_CANNOT_LIST, H5IO_WALK_NO_MEMORY };

// The fixed part of one object's record, as the child saw it.
typedef struct H5ioObj {
    uint8_t kind;           // H5IO_OBJ_*
    int8_t type;            // H5ioType, or -1: a type h5io does not read
    uint8_t space;          // H5IO_SPACE_*
    int8_t rank;            // simple dataspaces: the rank; -1 unknown
    uint8_t layout;         // H5IO_LAYOUT_*
    uint8_t allocated;      // storage written
    uint8_t crc_state;      // H5IO_CRC_*
    uint8_t attrs_cut;      // more attributes than H5IO_MAX_ATTRS
    int32_t nfilters;       // -1 unknown
    int32_t nexternal;      // -1 unknown
    uint32_t crc;           // the "crc32" attribute, when H5IO_CRC_OK
    uint64_t elem_size;     // bytes per element (strings: the string length)
    uint64_t dims[H5IO_MAX_RANK];
    uint64_t storage;       // bytes of storage
    uint64_t offset;        // file address of contiguous data, or H5IO_NO_OFFSET
    uint32_t name_len;      // the record's variable part: the name,
    uint32_t compact_len;   // a compact dataset's bytes,
    uint32_t n_attrs;       // then the attributes
} H5ioObj;

typedef struct H5ioAttrHead {
    uint32_t name_len;
    uint32_t state;         // H5IO_ATTR_*
    uint64_t size;          // strings: the type's size in bytes
    uint32_t value_len;     // bytes of value that follow (<= H5IO_ATTR_VALUE_MAX)
    uint32_t pad;
} H5ioAttrHead;

typedef struct H5ioAttr {
    H5ioAttrHead h;
    char *name;             // NUL-terminated
    char *value;            // value_len bytes + NUL
} H5ioAttr;

typedef struct H5ioEntry {
    H5ioObj o;
    char *name;             // "/a/b", NUL-terminated
    unsigned char *compact; // o.compact_len bytes, or NULL
    H5ioAttr *attrs;        // o.n_attrs
} H5ioEntry;

struct H5ioCatalog {
    int n;
    H5ioEntry *e;
    int refs;               // h5io_catalog_free frees it at the last reference
};

// Walk the file open as `fd` in a sandboxed child and parse what it hands
// back into *cat. `path` and `what` name the file in messages.
Status h5io_catalog(int fd, const char *path, const char *what, H5ioCatalog **cat);
// Walk in this process instead (off: the default is on). Only for the
// structure-aware fuzzers, whose files libhdf5 itself wrote and edited: they
// test the checks on the catalog, not libhdf5, and a fork per file costs
// them most of their executions.
void h5io_sandbox(bool on);
// Drop a reference to cat (freed at the last one).
void h5io_catalog_free(H5ioCatalog *cat);
// The entry named `name` ("/a/b"), or NULL.
const H5ioEntry *h5io_catalog_find(const H5ioCatalog *cat, const char *name);

// The stream a walk of `path` gives (the child's side, run in-process: for
// tests and the fuzzers of the parser only; never on an untrusted file).
// Returns a malloc'd buffer of *len bytes, or NULL.
unsigned char *h5io_walk_stream(const char *path, size_t *len);
// Parse a stream; `path` names the file in messages.
Status h5io_catalog_parse(const unsigned char *buf, size_t len, const char *path, const char *what,
                          H5ioCatalog **cat);

#endif
