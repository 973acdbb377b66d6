#include "val_split.h"

#include <stdlib.h>
#include <string.h>

#include "rng.h"

Status val_split_documents(const int *tokens, int64_t n, const int64_t *starts, int64_t n_docs, double val_fraction,
                           uint64_t seed, int **out_tokens, int64_t **out_starts, int64_t *train_end) {
    *out_tokens = NULL;
    *out_starts = NULL;
    *train_end = n;
    if (n_docs < 2)
        return status_err("val_choice = documents: %lld document%s, and a validation split of whole documents "
                          "needs two or more (or val_choice = tail)",
                          (long long)n_docs, n_docs == 1 ? "" : "s");
    int64_t *order = xmalloc((size_t)n_docs * sizeof *order);
    bool *held = xmalloc((size_t)n_docs * sizeof *held);
    for (int64_t i = 0; i < n_docs; i++) order[i] = i, held[i] = false;
    Rng r;
    rng_seed(&r, seed ^ 0x76616c5f73706c69ull);   // ("val_spli": not the window sampler's stream)
    for (int64_t i = n_docs - 1; i > 0; i--) {   // Fisher-Yates
        int64_t j = (int64_t)rng_below(&r, (uint64_t)i + 1), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    int64_t want = (int64_t)((double)n * val_fraction), got = 0;
    for (int64_t k = 0; k < n_docs - 1 && (k == 0 || got < want); k++) {
        int64_t d = order[k];
        held[d] = true;
        got += (d + 1 < n_docs ? starts[d + 1] : n) - starts[d];
    }
    int *out = xmalloc((size_t)(n ? n : 1) * sizeof *out);
    int64_t *st = xmalloc((size_t)n_docs * sizeof *st);
    int64_t pos = 0, nd = 0;
    for (int pass = 0; pass < 2; pass++) {   // the training documents, then the held-out ones
        if (pass == 1) *train_end = pos;
        for (int64_t d = 0; d < n_docs; d++) {
            if (held[d] != (pass == 1)) continue;
            int64_t len = (d + 1 < n_docs ? starts[d + 1] : n) - starts[d];
            memcpy(out + pos, tokens + starts[d], (size_t)len * sizeof *out);
            st[nd++] = pos;
            pos += len;
        }
    }
    free(order);
    free(held);
    *out_tokens = out;
    *out_starts = st;
    return status_ok();
}
