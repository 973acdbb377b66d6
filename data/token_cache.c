#include "token_cache.h"

#include <errno.h>
#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "h5io.h"
#include "tokenizer.h"

#define META_WORDS 5   // version, vocab, corpus hash, n, tokenizer hash

// mkdir -p
static Status make_dirs(const char *dir) {
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
static Status cache_read(const char *path, const Corpus *c, const Tokenizer *tok, TokenData *out) {
    H5ioFile hf;
    Status s = h5io_open(&hf, path, "token cache");
    if (!s.ok) return s;
    uint64_t meta[META_WORDS] = {0};
    H5ioInfo info;
    s = h5io_check(&hf, "/meta", 1u << H5IO_U64, 1, (hsize_t[]){META_WORDS}, META_WORDS, &info);
    if (s.ok) s = h5io_read(&hf, "/meta", &info, meta);
    if (s.ok && (meta[0] != TOKEN_CACHE_VERSION || meta[1] != (uint64_t)tok->vocab || meta[4] != tok->hash))
        s = status_err("%s: format %llu with a vocabulary of %llu ids, this run uses format %d and another tokenizer "
                       "or vocabulary (%d ids)",
                       path, (unsigned long long)meta[0], (unsigned long long)meta[1], TOKEN_CACHE_VERSION, tok->vocab);
    if (s.ok && (meta[2] != c->hash || meta[3] > (uint64_t)c->n))   // every token stands for a byte or more
        s = status_err("%s: built from other text (the corpus changed since)", path);
    int64_t n = s.ok ? (int64_t)meta[3] : 0;
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
        if (!s.ok) token_data_free(out);
    }
    h5io_close(&hf);
    if (s.ok) {
        out->n = n;
        out->vocab = tok->vocab;
    }
    return s;
}

static Status cache_write(const char *path, const Corpus *c, const Tokenizer *tok, const int *tokens, int64_t n_tok) {
    int vocab = tok->vocab;
    char tmp[CACHE_PATH_MAX + 24];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());   // per process: concurrent builds do not collide
    hid_t f = h5io_create_memory_aligned(4096);   // the tokens on a page boundary: mappable
    if (f < 0) return status_err("%s: cannot create the token cache in memory", path);
    hsize_t n = (hsize_t)n_tok;
    bool ok = h5io_write(f, "/tokens", H5IO_I32, 1, &n, tokens);
    uint64_t meta[META_WORDS] = {TOKEN_CACHE_VERSION, (uint64_t)vocab, c->hash, (uint64_t)n_tok, tok->hash};
    ok = ok && h5io_write(f, "/meta", H5IO_U64, 1, (hsize_t[]){META_WORDS}, meta);
    if (!ok) {
        H5Fclose(f);
        return status_err("%s: building the token cache failed", path);
    }
    Status s = h5io_commit(f, path, tmp);
    return s.ok ? s : status_err("token cache %s", s.msg);
}

Status token_cache_load(const char *cache_dir, const char *corpus_spec, const Corpus *c, const Tokenizer *tok,
                        TokenData *out, bool *built, char *path_out) {
    memset(out, 0, sizeof *out);
    if (built) *built = false;
    Status st = make_dirs(cache_dir);
    if (!st.ok) return st;
    char path[CACHE_PATH_MAX];
    uint64_t key = fnv1a64(FNV1A_INIT, corpus_spec, strlen(corpus_spec));
    key = fnv1a64(key, &tok->hash, sizeof tok->hash);
    if (snprintf(path, sizeof path, "%s/tokens-%016llx.h5", cache_dir, (unsigned long long)key) >= (int)sizeof path)
        return status_err("%s: cache directory path too long", cache_dir);
    if (path_out) snprintf(path_out, CACHE_PATH_MAX, "%s", path);
    if (access(path, F_OK) == 0) {
        st = cache_read(path, c, tok, out);
        if (st.ok) return st;
        snprintf(out->note, sizeof out->note, "rebuilt: %.280s", st.msg);
    }
    // (Re)build from the corpus bytes.
    out->owned = xmalloc((size_t)(c->n ? c->n : 1) * sizeof *out->owned);
    out->tokens = out->owned;
    out->n = tokenizer_encode(tok, c->bytes, c->n, out->owned);
    out->vocab = tok->vocab;
    st = cache_write(path, c, tok, out->owned, out->n);
    if (!st.ok) {
        token_data_free(out);
        return st;
    }
    if (built) *built = true;
    // Use the file just written (its pages, shared) rather than this copy, when it maps.
    TokenData mapped;
    memset(&mapped, 0, sizeof mapped);
    if (cache_read(path, c, tok, &mapped).ok && mapped.mapped && mapped.n == out->n) {
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
    if (d->map_base) munmap(d->map_base, d->map_len);
    memset(d, 0, sizeof *d);
}
