// token_cache.h: tokens of a corpus, cached in an HDF5 file.
//
// The cache file <cache_dir>/tokens-<16 hex digits>.h5 (the digits hash the
// corpus spec, the tokenizer and the documents spec, so each has its own file) holds
//   /tokens   int32, shape (n,), at a file offset that is a multiple of 4096
//             (when it is 4096 bytes or more)
//   /meta     uint64 (6): TOKEN_CACHE_VERSION, vocab, Corpus.hash of the
//             bytes it was built from (names, sizes and contents), n, the
//             tokenizer's hash, and the number of documents m (0: none)
//   /doc_starts  int64, shape (m,), when m > 0: the token position where
//             each document starts (documents.h), checked on reading
//             (0 first, increasing, below n)
// each with a CRC-32 attribute (h5io.h). The cache is read as hostile input:
// it is reused only when every dataset passes h5io's checks and checksums,
// the version, vocabulary, corpus hash and count match, and every id is in
// [0, vocab), and the tokens are the corpus's under this tokenizer
// (token_cache_verify: the checksums alone would take a cache forged with
// checksums of its own); otherwise it is rebuilt from the corpus and
// TokenData.note says why (a tampered or stale cache is never used, and
// never aborts).
// A build writes a temporary of its own beside the file (fileio.h) and
// renames it over the old one, so a reader never sees a half-written cache.
//
// The tokens are not copied into memory: the dataset's bytes are mapped
// read-only from the file (after the same checks, the checksum computed over
// the mapped bytes), so processes training on one corpus (data-parallel
// ranks on a machine) share the page cache's pages. A cache whose tokens
// cannot be mapped (small, or written unaligned) is read instead. A rebuild
// renames a new file into place, so it never changes a mapped one.
#ifndef DATA_TOKEN_CACHE_H
#define DATA_TOKEN_CACHE_H

#include "corpus.h"
#include "documents.h"
#include "tokenizer.h"

#define TOKEN_CACHE_VERSION 5   // 5: documents; 4: int32 tokens, page-aligned, mapped (3: uint8 for bytes)

typedef struct TokenData {
    const int *tokens;  // (n) token ids in [0, vocab): in the mapped file, or in `owned`
    int64_t n;
    int vocab;
    bool mapped;        // the tokens are the file's mapped pages
    int64_t *doc_starts;   // (n_docs) malloc'd document starts, or NULL (documents = none)
    int64_t n_docs;
    char note[300];     // why the cache was rebuilt ("" when reused or new)
    int *owned;         // malloc'd tokens (not mapped), or NULL
    void *map_base;     // the mapping (munmap on free), or NULL
    size_t map_len;
} TokenData;

// The corpus spec's share of the cache file's name: each comma-separated path
// by its canonical path, so two spellings of one file share a cache.
uint64_t corpus_spec_key(const char *corpus_spec);

// Load the corpus's tokens from the cache, building it first if it is
// missing or stale. *built (may be NULL) says whether it was (re)built.
// path_out (may be NULL, size CACHE_PATH_MAX) receives the cache file path.
#define CACHE_PATH_MAX 1024
Status token_cache_load(const char *cache_dir, const char *corpus_spec, const Corpus *c, const Tokenizer *tok,
                        const DocSpec *docs, TokenData *out, bool *built, char *path_out);
void token_data_free(TokenData *d);
// Are a cache's tokens this corpus under this tokenizer (token_verify.c)?
// The lengths of every document and a few documents (or windows) encoded
// again; an error says what does not match.
Status token_cache_verify(const Corpus *c, const DocSpec *d, const Tokenizer *tok, const TokenData *td);
// Create the cache directory and its parents (mkdir -p).
Status token_cache_make_dir(const char *dir);

#endif
