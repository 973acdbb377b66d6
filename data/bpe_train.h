// bpe_train.h: learn a byte-level BPE tokenizer from a corpus.
//
// The corpus is cut at every occurrence of a special token's text (document
// boundaries: they take part in no merge), each stretch is split by the
// pattern (bpe_split.h), and equal pieces are counted once with their
// frequency. Tokens start as the 256 single bytes (rank = byte value). Each
// step merges the adjacent pair (a, b) with the highest count, where a pair
// counts once per position in every piece, times the piece's frequency
// (overlapping pairs such as the two "aa" in "aaa" both count). On a tie the
// pair with the smaller a wins, then the smaller b. Occurrences are replaced
// left to right, without overlap; the merged token gets the next rank, unless
// a token with the same bytes exists already: then the occurrences become
// that token and no rank is added. (Whether two merges such as (a, bc) and
// (ab, c) can both happen is not obvious: after a merge of (x, y) no x is
// ever again followed by a y, and 1,092 random small corpora produced no such
// case; the rule keeps the file valid if one does.) A pair whose token would exceed BPE_TOKEN_MAX bytes is never
// merged. Counts are kept up to date incrementally: only the pieces holding the
// merged pair are visited, and a max-heap over pair counts gives the next pair.
//
// The result is the tokenizer file (bpe.h's format): ranks 0..255 the bytes,
// then the merges in order, then the special tokens, in the order given.
#ifndef DATA_BPE_TRAIN_H
#define DATA_BPE_TRAIN_H

#include "common.h"

typedef void (*BpeTrainProgress)(void *ctx, const char *stage, int64_t done, int64_t total);

typedef struct BpeTrainOpts {
    int vocab;                      // ids in all: 256 bytes + merges + specials
    const char *pattern;            // split pattern, tiktoken syntax; NULL: cl100k_base's
    const char *const *specials;    // (n_specials) texts, e.g. "<|endoftext|>"
    int n_specials;
    BpeTrainProgress progress;      // may be NULL; called a few hundred times at most
    void *progress_ctx;
} BpeTrainOpts;

typedef struct BpeTrainStats {
    int64_t pieces, unique_pieces;
    int merges;                     // ranks added (fewer than asked when the corpus runs out of pairs)
    int same_bytes_merges;          // merges that reused an existing token
    int vocab;                      // ids in the result
} BpeTrainStats;

// *file (malloc'd, *len bytes) receives the tokenizer; stats may be NULL.
// Errors: vocab outside [256 + n_specials, BPE_VOCAB_MAX], a bad pattern or
// special token (empty, too long, a line break, repeated).
Status bpe_train(const uint8_t *text, int64_t n, const BpeTrainOpts *o, uint8_t **file, size_t *len,
                 BpeTrainStats *stats);

#endif
