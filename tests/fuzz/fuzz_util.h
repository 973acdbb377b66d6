// fuzz_util.h: what the fuzz targets share: reading the fuzzer's bytes as a
// sequence of choices, a scratch folder per process, and structure-aware
// edits of an HDF5 file.
//
// The structure-aware checkpoint and token-cache targets start from a valid
// file this project wrote and apply edits an attacker could make with HDF5
// itself (replace a dataset with another type, rank, shape or content, drop
// or falsify its checksum, link elsewhere, leave it unwritten, flip stored
// bytes), then hand the file to the project's loaders; they reach the
// loaders' own checks. fuzz_checkpoint_raw mutates the file's bytes instead,
// which reaches libhdf5 inside h5io's sandbox.
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

typedef struct FuzzBytes {
    const uint8_t *p;
    size_t n;
} FuzzBytes;

// The next byte / 16-bit value (0 once the input is used up).
unsigned fuzz_u8(FuzzBytes *b);
unsigned fuzz_u16(FuzzBytes *b);

// A folder for this process's scratch files (made once; removed at exit).
const char *fuzz_scratch(void);
// dir/name into a static buffer.
const char *fuzz_path(const char *name);

// Copy bytes to a file; read a whole file (malloc'd).
void fuzz_write_file(const char *path, const void *data, size_t n);
uint8_t *fuzz_read_file(const char *path, size_t *n);

// Apply edits read from b to the HDF5 file at path, on the datasets named in
// targets (absolute paths). Returns after the bytes run out or 32 edits.
void fuzz_edit_hdf5(const char *path, FuzzBytes *b, const char *const *targets, int n_targets);

#endif
