// bpe.c: the encoder and the decoder (bpe.h). Loading and writing files is
// in bpe_load.c, the split pattern in bpe_split.c, training in bpe_train.c.
#define _GNU_SOURCE   // memmem
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_impl.h"

// ---------------------------------------------------------------- rank table

uint64_t bpe_bytes_hash(const uint8_t *p, int len) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)len;
    for (; len >= 8; p += 8, len -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    uint64_t v = 0;
    memcpy(&v, p, (size_t)len);
    h = (h ^ v) * 0x94d049bb133111ebull;
    return h ^ (h >> 29);
}

int bpe_build_table(Bpe *b) {
    uint32_t size = 1024;
    while (size < 2u * (uint32_t)b->n_ranks) size *= 2;
    b->mask = size - 1;
    free(b->table);
    b->table = xcalloc(size, sizeof *b->table);
    for (int r = 0; r < b->vocab; r++) {
        if (b->kind[r] != BPE_ID_RANK) continue;
        const uint8_t *p = b->blob + b->off[r];
        int len = b->len[r];
        if (bpe_rank_of(b, p, len) >= 0) return r;
        uint32_t i = (uint32_t)bpe_bytes_hash(p, len) & b->mask;
        while (b->table[i]) i = (i + 1) & b->mask;
        b->table[i] = (uint32_t)r + 1;
    }
    for (int c = 0; c < 256; c++) {
        uint8_t byte = (uint8_t)c;
        b->byte_rank[c] = bpe_rank_of(b, &byte, 1);
    }
    return -1;
}

// ---------------------------------------------------------------- merging a piece

#define NO_RANK UINT32_MAX
#define SCAN_MAX 64   // pieces up to this length merge by scanning (most of them)

static inline uint32_t pair_rank(const Bpe *b, const uint8_t *p, int from, int to) {
    int r = bpe_rank_of(b, p + from, to - from);
    return r < 0 ? NO_RANK : (uint32_t)r;
}

// tiktoken's loop: parts start at pos[0..m) (pos[m] = len); rank[i] is the
// rank of parts i and i+1 joined. Merge the lowest (leftmost on a tie) until
// no joined pair is a token.
int bpe_merge_scan(const Bpe *b, const uint8_t *p, int len, int *ids) {
    int pos_s[SCAN_MAX + 1];
    uint32_t rank_s[SCAN_MAX];
    int *pos = len <= SCAN_MAX ? pos_s : xmalloc((size_t)(len + 1) * sizeof *pos);
    uint32_t *rank = len <= SCAN_MAX ? rank_s : xmalloc((size_t)len * sizeof *rank);
    for (int i = 0; i < len; i++) {
        pos[i] = i;
        ids[i] = b->byte_rank[p[i]];
    }
    pos[len] = len;
    for (int i = 0; i + 1 < len; i++) rank[i] = pair_rank(b, p, i, i + 2);
    int m = len;
    while (m > 1) {
        uint32_t best = NO_RANK;
        int at = -1;
        for (int i = 0; i + 1 < m; i++)
            if (rank[i] < best) best = rank[i], at = i;
        if (at < 0) break;
        ids[at] = (int)best;   // part at+1 joins part at
        memmove(pos + at + 1, pos + at + 2, (size_t)(m - at - 1) * sizeof *pos);
        if (m - at - 2 > 0) memmove(ids + at + 1, ids + at + 2, (size_t)(m - at - 2) * sizeof *ids);
        if (m - at - 3 > 0) memmove(rank + at + 1, rank + at + 2, (size_t)(m - at - 3) * sizeof *rank);
        m--;
        if (at + 1 < m) rank[at] = pair_rank(b, p, pos[at], pos[at + 2]);
        if (at > 0) rank[at - 1] = pair_rank(b, p, pos[at - 1], pos[at + 1]);
    }
    if (pos != pos_s) free(pos), free(rank);
    return m;
}

// The same merges with a linked list of parts (indexed by start byte) and a
// min-heap of (pair rank, start): the heap's least entry is the lowest rank,
// leftmost on a tie, as in the scan. Stale entries (a part since merged or
// extended) are skipped when popped.
static void heap_push(uint64_t *h, int *n, uint64_t key) {
    int i = (*n)++;
    for (; i > 0 && h[(i - 1) / 2] > key; i = (i - 1) / 2) h[i] = h[(i - 1) / 2];
    h[i] = key;
}
static uint64_t heap_pop(uint64_t *h, int *n) {
    uint64_t top = h[0], last = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= last) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

int bpe_merge_heap(const Bpe *b, const uint8_t *p, int len, int *ids) {
    int *next = xmalloc((size_t)len * sizeof *next), *prev = xmalloc((size_t)len * sizeof *prev);
    int *tok = xmalloc((size_t)len * sizeof *tok);   // rank of the part starting here, -1: inside a part
    uint32_t *rank = xmalloc((size_t)len * sizeof *rank);   // rank of this part joined with the next
    uint64_t *heap = xmalloc((size_t)(3 * len + 1) * sizeof *heap);
    int nh = 0;
    for (int i = 0; i < len; i++) {
        next[i] = i + 1, prev[i] = i - 1, tok[i] = b->byte_rank[p[i]];
        rank[i] = i + 1 < len ? pair_rank(b, p, i, i + 2) : NO_RANK;
        if (rank[i] != NO_RANK) heap_push(heap, &nh, (uint64_t)rank[i] << 32 | (uint32_t)i);
    }
    while (nh > 0) {
        uint64_t key = heap_pop(heap, &nh);
        int s = (int)(uint32_t)key;
        uint32_t r = (uint32_t)(key >> 32);
        if (tok[s] < 0 || rank[s] != r) continue;   // stale
        int t = next[s];
        tok[s] = (int)r, tok[t] = -1;
        next[s] = next[t];
        if (next[s] < len) prev[next[s]] = s;
        rank[s] = next[s] < len ? pair_rank(b, p, s, next[s] < len ? next[next[s]] : len) : NO_RANK;
        if (rank[s] != NO_RANK) heap_push(heap, &nh, (uint64_t)rank[s] << 32 | (uint32_t)s);
        int q = prev[s];
        if (q >= 0) {
            rank[q] = pair_rank(b, p, q, next[s]);
            if (rank[q] != NO_RANK) heap_push(heap, &nh, (uint64_t)rank[q] << 32 | (uint32_t)q);
        }
    }
    int m = 0;
    for (int i = 0; i < len; i = next[i]) ids[m++] = tok[i];
    free(next), free(prev), free(tok), free(rank), free(heap);
    return m;
}

int bpe_merge_piece(const Bpe *b, const uint8_t *p, int len, int *ids) {
    if (len == 1) {
        ids[0] = b->byte_rank[p[0]];
        return 1;
    }
    int r = bpe_rank_of(b, p, len);   // tiktoken looks the whole piece up first
    if (r >= 0) {
        ids[0] = r;
        return 1;
    }
    return len <= SCAN_MAX ? bpe_merge_scan(b, p, len, ids) : bpe_merge_heap(b, p, len, ids);
}

// ---------------------------------------------------------------- encoding

// text[0..n) holds bytes base.. of what the caller encodes (for the message).
static int64_t encode_ordinary(const Bpe *b, const uint8_t *text, int64_t n, int *ids, int64_t base, Status *st) {
    BpeSplitIter it;
    bpe_split_begin(&it, b->split, text, n);
    int64_t m = 0, s, e;
    while (bpe_split_next(&it, &s, &e)) m += bpe_merge_piece(b, text + s, (int)(e - s), ids + m);
    Status sp = bpe_split_status(&it, base);
    bpe_split_end(&it);
    if (!sp.ok) {
        *st = status_err("tokenizer %s: %s", b->source, sp.msg);
        return -1;
    }
    return m;
}

int64_t bpe_encode_checked(const Bpe *b, const uint8_t *text, int64_t n, int *ids, int flags, Status *st) {
    *st = status_ok();
    if (!(flags & BPE_ALLOW_SPECIAL) || b->n_specials == 0) return encode_ordinary(b, text, n, ids, 0, st);
    int ns = b->n_specials;
    int64_t *next_at = xmalloc((size_t)ns * sizeof *next_at);   // next occurrence of each, n: none
    for (int i = 0; i < ns; i++) next_at[i] = -1;
    int64_t pos = 0, m = 0;
    while (pos < n) {
        int64_t at = n;
        int which = -1;
        for (int i = 0; i < ns; i++) {
            int id = b->special_ids[i], len = b->len[id];
            if (next_at[i] < pos && next_at[i] != n) {
                const uint8_t *f = memmem(text + pos, (size_t)(n - pos), b->blob + b->off[id], (size_t)len);
                next_at[i] = f ? f - text : n;
            }
            // leftmost; at one position the longest (tiktoken leaves this to a
            // hash map's order; no bundled encoding has a special that starts another)
            if (next_at[i] < at || (next_at[i] == at && at < n && len > b->len[b->special_ids[which]]))
                at = next_at[i], which = i;
        }
        int64_t k = encode_ordinary(b, text + pos, at - pos, ids + m, pos, st);
        if (k < 0) {
            m = -1;
            break;
        }
        m += k;
        if (which < 0) break;
        ids[m++] = b->special_ids[which];
        pos = at + b->len[b->special_ids[which]];
    }
    free(next_at);
    return m;
}

int64_t bpe_encode(const Bpe *b, const uint8_t *text, int64_t n, int *ids, int flags) {
    Status st;
    int64_t m = bpe_encode_checked(b, text, n, ids, flags, &st);
    if (m < 0) {   // no caller of this form can go on without the ids: stop with the sentence, not an abort
        fprintf(stderr, "error: %s\n", st.msg);
        exit(1);
    }
    return m;
}

// ---------------------------------------------------------------- decoding

const uint8_t *bpe_token_bytes(const Bpe *b, int id, int *len) {
    if (id < 0 || id >= b->vocab || b->kind[id] == BPE_ID_NONE) return NULL;
    *len = b->len[id];
    return b->blob + b->off[id];
}

static Status bad_id(const Bpe *b, int id, int64_t i) {
    return status_err("token %lld: id %d is no token of this tokenizer (vocabulary %d%s)", (long long)i, id, b->vocab,
                      id >= 0 && id < b->vocab ? ", a hole in its ids" : "");
}

uint8_t *bpe_decode(const Bpe *b, const int *ids, int64_t n, int64_t *len, Status *st) {
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        int l;
        if (!bpe_token_bytes(b, ids[i], &l)) {
            *st = bad_id(b, ids[i], i);
            return NULL;
        }
        total += l;
    }
    uint8_t *out = xmalloc((size_t)total + 1);
    int64_t o = 0;
    for (int64_t i = 0; i < n; i++) {
        memcpy(out + o, b->blob + b->off[ids[i]], b->len[ids[i]]);
        o += b->len[ids[i]];
    }
    out[o] = 0;
    *len = o;
    *st = status_ok();
    return out;
}

// Length of the tail of buf[0..n) to hold back: the start of a UTF-8
// character (Unicode's table 3-7) that more bytes could still complete.
static int incomplete_tail(const uint8_t *buf, int n) {
    for (int k = 1; k <= 3 && k <= n; k++) {
        uint8_t c = buf[n - k];
        if ((c & 0xC0) == 0x80) continue;   // a continuation byte: look further back
        int need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (need <= k) return 0;   // not a lead byte, or its character is complete
        if (k >= 2) {   // the second byte's range depends on the lead
            uint8_t lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
            if (buf[n - k + 1] < lo || buf[n - k + 1] > hi) return 0;
        }
        return k;
    }
    return 0;
}

int bpe_stream_push(BpeStream *s, const Bpe *b, int id, uint8_t *out, Status *st) {
    int len;
    const uint8_t *p = bpe_token_bytes(b, id, &len);
    if (!p) {
        *st = bad_id(b, id, 0);
        return -1;
    }
    memcpy(out, s->held, (size_t)s->n_held);
    memcpy(out + s->n_held, p, (size_t)len);
    int n = s->n_held + len, keep = incomplete_tail(out, n);
    memcpy(s->held, out + n - keep, (size_t)keep);
    s->n_held = keep;
    *st = status_ok();
    return n - keep;
}

int bpe_stream_flush(BpeStream *s, uint8_t *out) {
    int n = s->n_held;
    memcpy(out, s->held, (size_t)n);
    s->n_held = 0;
    return n;
}

// ---------------------------------------------------------------- accessors

int bpe_vocab_size(const Bpe *b) { return b->vocab; }
int bpe_n_ranks(const Bpe *b) { return b->n_ranks; }
int bpe_n_specials(const Bpe *b) { return b->n_specials; }
const char *bpe_pattern(const Bpe *b) { return bpe_split_pattern(b->split); }
uint64_t bpe_hash(const Bpe *b) { return b->hash; }

BpeSpecial bpe_special(const Bpe *b, int i) {
    ASSERT(i >= 0 && i < b->n_specials, "bpe_special: %d outside [0, %d)", i, b->n_specials);
    int id = b->special_ids[i];
    return (BpeSpecial){(const char *)b->blob + b->off[id], id};   // blob keeps a NUL after each special
}

int bpe_special_id(const Bpe *b, const char *text) {
    size_t l = strlen(text);
    for (int i = 0; i < b->n_specials; i++) {
        int id = b->special_ids[i];
        if (b->len[id] == l && memcmp(b->blob + b->off[id], text, l) == 0) return id;
    }
    return -1;
}

void bpe_free(Bpe *b) {
    if (!b) return;
    free(b->kind), free(b->off), free(b->len), free(b->blob), free(b->table), free(b->special_ids);
    bpe_split_free(b->split);
    free(b->source);
    free(b);
}
