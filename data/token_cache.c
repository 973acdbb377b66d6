#include "token_cache.h"

#include <errno.h>
#include <hdf5.h>
#include <hdf5_hl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenizer.h"

// mkdir -p
static Status make_dirs(const char *dir) {
    char buf[CACHE_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", dir);
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

// Read the attributes; true if the file is a valid cache for `hash`.
static bool cache_matches(hid_t f, uint64_t hash, int64_t *n, int *vocab) {
    uint64_t h = 0;
    int version = 0;
    if (H5LTget_attribute(f, "/tokens", "corpus_hash", H5T_NATIVE_UINT64, &h) < 0) return false;
    if (H5LTget_attribute_int(f, "/tokens", "format_version", &version) < 0) return false;
    if (H5LTget_attribute_int(f, "/tokens", "vocab", vocab) < 0) return false;
    hsize_t dims[1];
    int rank = 0;
    if (H5LTget_dataset_ndims(f, "/tokens", &rank) < 0 || rank != 1) return false;
    if (H5LTget_dataset_info(f, "/tokens", dims, NULL, NULL) < 0) return false;
    *n = (int64_t)dims[0];
    return h == hash && version == TOKEN_CACHE_VERSION;
}

static Status cache_write(const char *path, const Corpus *c, const int *tokens, int vocab) {
    char tmp[CACHE_PATH_MAX + 24];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());   // per process: concurrent builds do not collide
    hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return status_err("%s: cannot create token cache", tmp);
    hsize_t dims[1] = {(hsize_t)c->n};
    herr_t e;
    if (vocab <= 256) {
        uint8_t *b = xmalloc((size_t)c->n);
        for (int64_t i = 0; i < c->n; i++) b[i] = (uint8_t)tokens[i];
        e = H5LTmake_dataset(f, "/tokens", 1, dims, H5T_STD_U8LE, b);
        free(b);
    } else {
        e = H5LTmake_dataset(f, "/tokens", 1, dims, H5T_NATIVE_INT, tokens);
    }
    int version = TOKEN_CACHE_VERSION;
    if (e >= 0) e = H5LTset_attribute_int(f, "/tokens", "format_version", &version, 1);
    if (e >= 0) e = H5LTset_attribute_int(f, "/tokens", "vocab", &vocab, 1);
    if (e >= 0) e = H5LTset_attribute_ulong(f, "/tokens", "corpus_hash", (const unsigned long *)&c->hash, 1);
    if (H5Fclose(f) < 0 || e < 0) {
        unlink(tmp);
        return status_err("%s: cannot write token cache", tmp);
    }
    if (rename(tmp, path) != 0) {
        Status st = status_err("%s: cannot rename token cache into place: %s", path, strerror(errno));
        unlink(tmp);
        return st;
    }
    return status_ok();
}

Status token_cache_load(const char *cache_dir, const char *corpus_spec, const Corpus *c, TokenData *out,
                        bool *built, char *path_out) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    memset(out, 0, sizeof *out);
    if (built) *built = false;
    Status st = make_dirs(cache_dir);
    if (!st.ok) return st;
    char path[CACHE_PATH_MAX];
    uint64_t key = fnv1a64(FNV1A_INIT, corpus_spec, strlen(corpus_spec));
    snprintf(path, sizeof path, "%s/tokens-%016llx.h5", cache_dir, (unsigned long long)key);
    if (path_out) snprintf(path_out, CACHE_PATH_MAX, "%s", path);

    int64_t n = 0;
    int vocab = 0;
    bool fresh = false;
    hid_t f = access(path, F_OK) == 0 ? H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT) : -1;
    if (f >= 0) {
        fresh = cache_matches(f, c->hash, &n, &vocab) && n == c->n && vocab == TOKENIZER_VOCAB;
        if (fresh) {
            out->tokens = xmalloc((size_t)(n ? n : 1) * sizeof *out->tokens);
            if (H5LTread_dataset(f, "/tokens", H5T_NATIVE_INT, out->tokens) < 0) {
                free(out->tokens);
                out->tokens = NULL;
                fresh = false;   // unreadable: rebuild
            }
        }
        H5Fclose(f);
    }
    if (fresh) {
        out->n = n;
        out->vocab = vocab;
        return status_ok();
    }
    // (Re)build from the corpus bytes.
    out->tokens = xmalloc((size_t)(c->n ? c->n : 1) * sizeof *out->tokens);
    out->n = tokenizer_encode(c->bytes, c->n, out->tokens);
    out->vocab = TOKENIZER_VOCAB;
    st = cache_write(path, c, out->tokens, out->vocab);
    if (!st.ok) {
        token_data_free(out);
        return st;
    }
    if (built) *built = true;
    return status_ok();
}

void token_data_free(TokenData *d) {
    free(d->tokens);
    memset(d, 0, sizeof *d);
}
