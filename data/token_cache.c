#include "token_cache.h"

#include <errno.h>
#include <limits.h>
#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "h5io.h"
#include "tokenizer.h"

#define META_WORDS 6   // version, vocab, corpus hash, n, tokenizer hash, documents

// mkdir -p
Status token_cache_make_dir(const char *dir) {
    char buf[CACHE_PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return status_err("cache directory path longer than %d characters", CACHE_PATH_MAX - 1);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return status_err("%s: cannot create cache directory: %s", buf, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    return status_ok();
}

// Read a cache built from corpus c; an error (its message is the note) when
// it cannot be used as it is.
static Status cache_read(const char *path, const Corpus *c, const Tokenizer *tok, bool want_docs, TokenData *out) {
    H5ioFile hf;
    Status s = h5io_open(&hf, path, "token cache");
    if (!s.ok) return s;
    uint64_t meta[META_WORDS] = {0};
    H5ioInfo info;
    // (Any length up to META_WORDS, so that an older format is named as such.)
    s = h5io_check(&hf, "/meta", 1u << H5IO_U64, 1, NULL, META_WORDS, &info);
    if (s.ok) s = h5io_read(&hf, "/meta", &info, meta);
    if (s.ok && meta[0] == TOKEN_CACHE_VERSION && info.numel != META_WORDS)
        s = status_err("%s: /meta: %lld words, format %d has %d", path, (long long)info.numel, TOKEN_CACHE_VERSION,
                       META_WORDS);
    if (s.ok && (meta[0] != TOKEN_CACHE_VERSION || meta[1] != (uint64_t)tok->vocab || meta[4] != tok->hash))
        s = status_err("%s: format %llu with a vocabulary of %llu ids, this run uses format %d and another tokenizer "
                       "or vocabulary (%d ids)",
                       path, (unsigned long long)meta[0], (unsigned long long)meta[1], TOKEN_CACHE_VERSION, tok->vocab);
    if (s.ok && (meta[2] != c->hash || meta[3] > 2 * (uint64_t)c->n))   // a byte or more per token, + an end of text per document
        s = status_err("%s: built from other text (the corpus changed since)", path);
    int64_t n = s.ok ? (int64_t)meta[3] : 0;
    int64_t m = s.ok ? (int64_t)meta[5] : 0;
    if (s.ok && (meta[5] > meta[3] || (want_docs != (m > 0)) || (want_docs && n == 0)))
        s = status_err("%s: %llu documents in %llu tokens, for a run %s documents", path, (unsigned long long)meta[5],
                       (unsigned long long)meta[3], want_docs ? "with" : "without");
    if (s.ok && m > 0) {
        s = h5io_check(&hf, "/doc_starts", 1u << H5IO_I64, 1, (hsize_t[]){(hsize_t)m}, m, &info);
        if (s.ok) {
            out->doc_starts = xmalloc((size_t)m * sizeof *out->doc_starts);
            out->n_docs = m;
            s = h5io_read(&hf, "/doc_starts", &info, out->doc_starts);
        }
        if (s.ok) {
            s = doc_starts_check(out->doc_starts, m, n);
            if (!s.ok) s = status_err("%s: /doc_starts: %s", path, s.msg);
        }
    }
    if (s.ok) s = h5io_check(&hf, "/tokens", 1u << H5IO_I32, 1, (hsize_t[]){(hsize_t)n}, n, &info);
    _Static_assert(sizeof(int) == sizeof(int32_t), "tokens are used as stored: int32");
    if (s.ok) {
        H5ioMap map;
        if (h5io_map(&hf, "/tokens", &info, sizeof(int32_t), &map).ok) {
            out->tokens = map.data;
            out->map_base = map.base;
            out->map_len = map.len;
            out->mapped = true;
        } else {   // (small, or unaligned: read; a bad checksum is then reported by the read)
            out->owned = xmalloc((size_t)(n ? n : 1) * sizeof *out->owned);
            out->tokens = out->owned;
            s = h5io_read(&hf, "/tokens", &info, out->owned);
        }
        for (int64_t i = 0; s.ok && i < n; i++) {
            int id = out->tokens[i];
            if (id < 0 || id >= tok->vocab)
                s = status_err("%s: /tokens: token %lld is %d, outside [0, %d)", path, (long long)i, id, tok->vocab);
        }
    }
    if (!s.ok) token_data_free(out);   // (whatever was allocated before the failure)
    h5io_close(&hf);
    if (s.ok) {
        out->n = n;
        out->vocab = tok->vocab;
    }
    return s;
}

static Status cache_write(const char *path, const Corpus *c, const Tokenizer *tok, const int *tokens, int64_t n_tok,
                          const int64_t *starts, int64_t n_docs) {
    int vocab = tok->vocab;
    hid_t f = h5io_create_memory_aligned(4096);   // the tokens on a page boundary: mappable
    if (f < 0) return status_err("%s: cannot create the token cache in memory", path);
    hsize_t n = (hsize_t)n_tok;
    bool ok = h5io_write(f, "/tokens", H5IO_I32, 1, &n, tokens);
    uint64_t meta[META_WORDS] = {TOKEN_CACHE_VERSION, (uint64_t)vocab, c->hash, (uint64_t)n_tok, tok->hash,
                                 (uint64_t)n_docs};
    ok = ok && h5io_write(f, "/meta", H5IO_U64, 1, (hsize_t[]){META_WORDS}, meta);
    if (n_docs > 0) ok = ok && h5io_write(f, "/doc_starts", H5IO_I64, 1, (hsize_t[]){(hsize_t)n_docs}, starts);
    if (!ok) {
        H5Fclose(f);
        return status_err("%s: building the token cache failed", path);
    }
    return h5io_commit(f, path, "token cache");   // (a temporary of its own: concurrent builds do not collide)
}

// The corpus spec's part of the cache key, by what it names rather than how it
// is spelled: each comma-separated path by its canonical path (realpath), so
// data/a.txt, ./data/a.txt and /abs/data/a.txt share one cache. A path that
// does not resolve is taken as written (the corpus reader reports it).
uint64_t corpus_spec_key(const char *corpus_spec) {
    uint64_t key = FNV1A_INIT;
    const char *p = corpus_spec;
    for (bool first = true;; first = false) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char part[PATH_MAX], real[PATH_MAX];
        snprintf(part, sizeof part, "%.*s", (int)(len < sizeof part ? len : sizeof part - 1), p);
        const char *name = len < sizeof part && realpath(part, real) ? real : part;
        if (!first) key = fnv1a64(key, ",", 1);
        key = fnv1a64(key, name, strlen(name));
        if (!comma) return key;
        p = comma + 1;
    }
}

Status token_cache_load(const char *cache_dir, const char *corpus_spec, const Corpus *c, const Tokenizer *tok,
                        const DocSpec *docs, TokenData *out, bool *built, char *path_out) {
    memset(out, 0, sizeof *out);
    if (built) *built = false;
    Status st = token_cache_make_dir(cache_dir);
    if (!st.ok) return st;
    char path[CACHE_PATH_MAX];
    uint64_t key = corpus_spec_key(corpus_spec);
    key = fnv1a64(key, &tok->hash, sizeof tok->hash);
    bool want_docs = docs->mode != DOCS_NONE;
    if (want_docs) {   // (documents = none keeps the key it had before documents existed)
        key = fnv1a64(key, &docs->mode, sizeof docs->mode);
        key = fnv1a64(key, docs->sep, (size_t)docs->sep_len);
    }
    if (snprintf(path, sizeof path, "%s/tokens-%016llx.h5", cache_dir, (unsigned long long)key) >= (int)sizeof path)
        return status_err("%s: cache directory path too long", cache_dir);
    if (path_out) snprintf(path_out, CACHE_PATH_MAX, "%s", path);
    if (access(path, F_OK) == 0) {
        st = cache_read(path, c, tok, want_docs, out);
        if (st.ok) {
            st = token_cache_verify(c, docs, tok, out);
            if (st.ok) return st;
            st = status_err("%s: not this corpus under this tokenizer: %s", path, st.msg);
            token_data_free(out);
        }
        snprintf(out->note, sizeof out->note, "rebuilt: %.280s", st.msg);
    }
    // (Re)build from the corpus bytes.
    documents_tokenize(c, docs, tok, &out->owned, &out->n, &out->doc_starts, &out->n_docs);
    out->tokens = out->owned;
    out->vocab = tok->vocab;
    st = cache_write(path, c, tok, out->owned, out->n, out->doc_starts, out->n_docs);
    if (!st.ok) {
        token_data_free(out);
        return st;
    }
    if (built) *built = true;
    // Use the file just written (its pages, shared) rather than this copy, when it maps.
    TokenData mapped;
    memset(&mapped, 0, sizeof mapped);
    if (cache_read(path, c, tok, want_docs, &mapped).ok && mapped.mapped && mapped.n == out->n) {
        memcpy(mapped.note, out->note, sizeof mapped.note);
        token_data_free(out);
        *out = mapped;
    } else {
        token_data_free(&mapped);
    }
    return status_ok();
}

void token_data_free(TokenData *d) {
    free(d->owned);
    free(d->doc_starts);
    if (d->map_base) munmap(d->map_base, d->map_len);
    memset(d, 0, sizeof *d);
}
