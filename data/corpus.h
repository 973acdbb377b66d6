// corpus.h: read the training text into memory.
//
// A corpus spec is one of
//   - a file:                     "data/kjv.txt"
//   - a comma list of files:      "a.txt,b.txt"   (in the order given)
//   - a directory:                "texts/"        (its regular files, sorted by
//                                                  name, hidden files skipped,
//                                                  not recursive)
// The files' bytes are concatenated as they are (no separator).
#ifndef DATA_CORPUS_H
#define DATA_CORPUS_H

#include "common.h"

typedef struct Corpus {
    uint8_t *bytes;    // (n) all files' bytes, concatenated
    int64_t n;
    char **files;      // (n_files) the paths read, in order
    int n_files;
    int64_t *file_end; // (n_files) where each file's bytes end in `bytes`
    uint64_t hash;     // FNV-1a 64 over each file's base name, length and bytes
} Corpus;

// Errors name the path: missing, unreadable, not a regular file (a FIFO is
// refused without waiting on it), an empty directory, or a corpus of 0 bytes.
// Files are read to their end, so a file whose size the system reports as 0
// (under /proc) is read as it is.
#define CORPUS_MAX_BYTES ((int64_t)1 << 40)
Status corpus_load(Corpus *c, const char *spec);
void corpus_free(Corpus *c);

// 64-bit FNV-1a: start from FNV1A_INIT, feed bytes in order.
#define FNV1A_INIT 0xcbf29ce484222325ull
uint64_t fnv1a64(uint64_t h, const void *data, size_t n);

#endif
