// bpe_impl.h: the inside of a Bpe, shared by bpe.c (encode, decode) and
// bpe_load.c (parse, validate, write). Not for users of bpe.h.
#ifndef DATA_BPE_IMPL_H
#define DATA_BPE_IMPL_H

#include <string.h>

#include "bpe.h"
#include "bpe_split.h"

enum { BPE_ID_NONE = 0, BPE_ID_RANK = 1, BPE_ID_SPECIAL = 2 };

struct Bpe {
    int vocab;              // 1 + the largest id
    int n_ranks;
    uint8_t *kind;          // (vocab) BPE_ID_NONE / _RANK / _SPECIAL
    uint32_t *off;          // (vocab) where the id's bytes start in blob
    uint16_t *len;          // (vocab) their length, 0 for BPE_ID_NONE
    uint8_t *blob;          // every token's bytes
    uint32_t *table;        // (mask + 1) open addressing, bytes -> rank: rank + 1, 0 = empty
    uint32_t mask;
    int byte_rank[256];     // the rank of each single byte
    int n_specials;
    int *special_ids;       // (n_specials) ascending
    BpeSplit *split;
    uint64_t hash;          // bpe_hash
    char *source;           // the file or buffer it was read from, for messages
};

// A hash of a byte string, for the rank table (and the trainer's tables).
uint64_t bpe_bytes_hash(const uint8_t *p, int len);

// Standard base64 of p[0..n) into out (room for (n + 2) / 3 * 4); returns its length.
int bpe_base64_encode(const uint8_t *p, int n, char *out);

// The rank of the token with these bytes, or -1.
static inline int bpe_rank_of(const Bpe *b, const uint8_t *p, int len) {
    if (len > BPE_TOKEN_MAX) return -1;
    uint32_t i = (uint32_t)bpe_bytes_hash(p, len) & b->mask;
    for (uint32_t r; (r = b->table[i]) != 0; i = (i + 1) & b->mask) {
        r--;
        if (b->len[r] == len && memcmp(b->blob + b->off[r], p, (size_t)len) == 0) return (int)r;
    }
    return -1;
}

// Build the rank table from kind/off/len/blob (ranks must be unique bytes:
// returns the first rank whose bytes repeat an earlier one's, or -1).
int bpe_build_table(Bpe *b);

// Encode one piece (len >= 1) into ids; returns the count. The two merge
// algorithms below give the same result; bpe_merge_piece picks by length.
int bpe_merge_piece(const Bpe *b, const uint8_t *p, int len, int *ids);
int bpe_merge_scan(const Bpe *b, const uint8_t *p, int len, int *ids);   // O(len^2), tiktoken's loop
int bpe_merge_heap(const Bpe *b, const uint8_t *p, int len, int *ids);   // O(len log len)

#endif
