// token_verify.c: a token cache's tokens checked against the corpus before
// they are reused (token_cache.h).
//
// The cache's checksums only say that its file is whole: anyone who can write
// the cache folder can also write a cache whose checksums hold and whose
// tokens are another tokenizer's, or wrong. So a reused cache must also be
// this corpus under this tokenizer:
//   - every document's tokens stand for exactly its bytes (their lengths add
//     up to its length; for the byte tokenizer, every id is its byte), each
//     document ends in the end-of-text token when the tokenizer has one, and
//     the documents are the corpus's;
//   - a few documents (or, without documents, windows between places where
//     every known split pattern ends a piece: a newline before an ASCII
//     letter) drawn at random are encoded again and must give the cache's
//     ids exactly, so a cache that spells the text with other ids (another
//     segmentation under the same vocabulary) is caught with a probability
//     that grows with how much of it is forged.
// All of it is a pass over the ids, plus encoding a few hundred kB.
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "token_cache.h"

#define SAMPLES 4
#define SAMPLE_BYTES ((int64_t)64 << 10)   // a document longer than this is checked by its lengths only

typedef struct Docs {
    const uint8_t **bytes;
    int64_t *len;
    int64_t n, cap;
} Docs;

static void collect(void *arg, const uint8_t *bytes, int64_t len) {
    Docs *d = arg;
    if (len <= 0) return;   // (documents_tokenize skips empty documents)
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 64;
        d->bytes = xrealloc(d->bytes, (size_t)d->cap * sizeof *d->bytes);
        d->len = xrealloc(d->len, (size_t)d->cap * sizeof *d->len);
    }
    d->bytes[d->n] = bytes;
    d->len[d->n++] = len;
}

static uint64_t random_u64(void) {
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint64_t)(uintptr_t)&r ^ 0x9e3779b97f4a7c15ull;
    return r;
}

// Do ids[0..n) stand for exactly bytes[0..len)?
static bool spells(const Tokenizer *tok, const int *ids, int64_t n, const uint8_t *bytes, int64_t len) {
    if (!tok->bpe) {
        if (n != len) return false;
        for (int64_t i = 0; i < n; i++)
            if (ids[i] != bytes[i]) return false;
        return true;
    }
    int64_t total = 0;
    for (int64_t i = 0; i < n && total <= len; i++) total += tokenizer_token_len(tok, ids[i]);
    return total == len;
}

// Are ids[0..n) what the tokenizer gives for bytes[0..len)?
static bool encodes_to(const Tokenizer *tok, const int *ids, int64_t n, const uint8_t *bytes, int64_t len) {
    if (n > len) return false;
    int *again = xmalloc((size_t)(len ? len : 1) * sizeof *again);
    bool same = tokenizer_encode(tok, bytes, len, again) == n && memcmp(again, ids, (size_t)n * sizeof *ids) == 0;
    free(again);
    return same;
}

static Status verify_documents(const Corpus *c, const DocSpec *d, const Tokenizer *tok, const TokenData *td) {
    Docs docs = {0};
    documents_ranges(c, d, collect, &docs);
    Status s = status_ok();
    if (docs.n != td->n_docs)
        s = status_err("%lld documents, the corpus has %lld", (long long)td->n_docs, (long long)docs.n);
    int64_t eot = tok->eot >= 0;
    for (int64_t k = 0; s.ok && k < docs.n; k++) {
        int64_t lo = td->doc_starts[k], hi = k + 1 < td->n_docs ? td->doc_starts[k + 1] : td->n;
        if (hi - lo < eot || (eot && td->tokens[hi - 1] != tok->eot) ||
            !spells(tok, td->tokens + lo, hi - lo - eot, docs.bytes[k], docs.len[k]))
            s = status_err("document %lld's tokens do not spell its bytes", (long long)k);
    }
    uint64_t r = random_u64();
    for (int i = 0; s.ok && i < SAMPLES && docs.n > 0; i++, r = r * 6364136223846793005ull + 1442695040888963407ull) {
        int64_t k = (int64_t)((r >> 17) % (uint64_t)docs.n);
        int64_t lo = td->doc_starts[k], hi = k + 1 < td->n_docs ? td->doc_starts[k + 1] : td->n;
        if (docs.len[k] <= SAMPLE_BYTES && !encodes_to(tok, td->tokens + lo, hi - lo - eot, docs.bytes[k], docs.len[k]))
            s = status_err("document %lld is not what the tokenizer makes of its bytes", (long long)k);
    }
    free(docs.bytes);
    free(docs.len);
    return s;
}

// The first place at or after `from` where every known split pattern ends a
// piece: just after a newline that an ASCII letter follows; n at the end.
static int64_t piece_boundary(const uint8_t *b, int64_t n, int64_t from) {
    for (int64_t p = from > 0 ? from : 1; p < n; p++)
        if (b[p - 1] == '\n' && ((b[p] | 0x20) >= 'a' && (b[p] | 0x20) <= 'z')) return p;
    return n;
}

// The id whose bytes begin at byte offset `at` (off: each id's offset, n + 1 entries); -1 if none does.
static int64_t id_at(const int64_t *off, int64_t n, int64_t at) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (off[mid] < at) lo = mid + 1;
        else hi = mid;
    }
    return off[lo] == at ? lo : -1;
}

static Status verify_stream(const Corpus *c, const Tokenizer *tok, const TokenData *td) {
    if (!spells(tok, td->tokens, td->n, c->bytes, c->n)) return status_err("the tokens do not spell the corpus");
    if (!tok->bpe || c->n == 0) return status_ok();
    int64_t *off = xmalloc((size_t)(td->n + 1) * sizeof *off);
    off[0] = 0;
    for (int64_t i = 0; i < td->n; i++) off[i + 1] = off[i] + tokenizer_token_len(tok, td->tokens[i]);
    Status s = status_ok();
    uint64_t r = random_u64();
    for (int i = 0; s.ok && i < SAMPLES; i++, r = r * 6364136223846793005ull + 1442695040888963407ull) {
        int64_t b1 = i == 0 ? 0 : piece_boundary(c->bytes, c->n, (int64_t)((r >> 17) % (uint64_t)c->n));
        int64_t b2 = piece_boundary(c->bytes, c->n, b1 + SAMPLE_BYTES);
        if (b1 >= c->n || b2 - b1 > 16 * SAMPLE_BYTES) continue;   // (no boundary near: a text of another shape)
        int64_t k1 = id_at(off, td->n, b1), k2 = id_at(off, td->n, b2);
        if (k1 < 0 || k2 < 0 || !encodes_to(tok, td->tokens + k1, k2 - k1, c->bytes + b1, b2 - b1))
            s = status_err("bytes %lld to %lld are not what the tokenizer makes of them", (long long)b1, (long long)b2);
    }
    free(off);
    return s;
}

Status token_cache_verify(const Corpus *c, const DocSpec *d, const Tokenizer *tok, const TokenData *td) {
    return d->mode == DOCS_NONE ? verify_stream(c, tok, td) : verify_documents(c, d, tok, td);
}
