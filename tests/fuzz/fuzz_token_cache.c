// fuzz_token_cache: the token-cache loader on structure-aware edits of a
// valid cache (fuzz_util.h). Invariant: token_cache_load always ends with the
// corpus's own tokens, whether it reused the cache or rebuilt it.
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "h5io_walk.h"
#include "token_cache.h"

static Corpus corpus;
static Tokenizer bytes_tok;
static const DocSpec docs = {DOCS_BLANK_LINE};   // blank-line documents: /doc_starts is checked too
static char cache_path[CACHE_PATH_MAX];
static uint8_t *base_image;
static size_t base_size;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512], spec[512];
    snprintf(dir, sizeof dir, "%s", fuzz_path("cache"));
    snprintf(spec, sizeof spec, "%s", fuzz_path("corpus.txt"));
    if (!base_image) {
        h5io_sandbox(false);   // libhdf5 wrote every file this target reads: its edits test our checks
        static const char text[] = "In the beginning God created the heaven and the earth.\n\n\xff\x00\x01\n \nAnd.";
        fuzz_write_file(spec, text, sizeof text - 1);
        if (!corpus_load(&corpus, spec).ok) abort();
        tokenizer_bytes(&bytes_tok);
        TokenData td;
        if (!token_cache_load(dir, spec, &corpus, &bytes_tok, &docs, &td, NULL, cache_path).ok) abort();
        token_data_free(&td);
        base_image = fuzz_read_file(cache_path, &base_size);
    }
    fuzz_write_file(cache_path, base_image, base_size);
    FuzzBytes b = {data, size};
    static const char *const targets[] = {"/tokens", "/meta", "/doc_starts"};
    fuzz_edit_hdf5(cache_path, &b, targets, 3);
    TokenData td;
    Status s = token_cache_load(dir, spec, &corpus, &bytes_tok, &docs, &td, NULL, NULL);
    if (!s.ok || td.n != corpus.n) abort();
    for (int64_t i = 0; i < td.n; i++)
        if (td.tokens[i] != corpus.bytes[i]) abort();
    // Documents (blank_line): starts at 0, after "earth.\n\n" and after "\n \n".
    if (td.n_docs != 3 || td.doc_starts[0] != 0 || td.doc_starts[1] != 56 || td.doc_starts[2] != 62) abort();
    token_data_free(&td);
    return 0;
}
