#include "batch.h"

#include <string.h>

#include "documents.h"

Status batcher_init(Batcher *b, const int *tokens, int64_t n, double val_fraction, int B, int T, uint64_t seed) {
    ASSERT(val_fraction >= 0 && val_fraction < 1, "batcher_init: val_fraction %g outside [0, 1)", val_fraction);
    int64_t n_val = (int64_t)((double)n * val_fraction);
    Status s = batcher_init_at(b, tokens, n, n - n_val, B, T, seed);
    if (s.ok && val_fraction > 0 && n_val < (int64_t)T + 1)   // (none at all is too small too)
        s = status_err("corpus of %lld tokens: the validation split (%lld tokens, val_fraction %g) is shorter "
                       "than one window of seq_len + 1 = %d tokens",
                       (long long)n, (long long)n_val, val_fraction, T + 1);
    return s;
}

Status batcher_init_at(Batcher *b, const int *tokens, int64_t n, int64_t train_end, int B, int T, uint64_t seed) {
    ASSERT(B > 0 && T > 0, "batcher_init: B = %d, T = %d", B, T);
    ASSERT(train_end >= 0 && train_end <= n, "batcher_init: train_end %lld outside [0, %lld]", (long long)train_end,
           (long long)n);
    memset(b, 0, sizeof *b);
    int64_t n_train = train_end, n_val = n - train_end;
    if (n_train < (int64_t)T + 1)
        return status_err("corpus of %lld tokens: the training split (%lld tokens) is shorter than one window "
                          "of seq_len + 1 = %d tokens",
                          (long long)n, (long long)n_train, T + 1);
    if (n_val > 0 && n_val < (int64_t)T + 1)
        return status_err("corpus of %lld tokens: the validation split (%lld tokens) is shorter than one window of "
                          "seq_len + 1 = %d tokens",
                          (long long)n, (long long)n_val, T + 1);
    b->tokens = tokens;
    b->n = n;
    b->train_end = n_train;
    b->B = B;
    b->T = T;
    b->lo = 0;
    b->hi = B;
    rng_seed(&b->state.rng, seed);
    return status_ok();
}

static void copy_window(const Batcher *b, int64_t start, int *x, int *y, int *doc) {
    memcpy(x, b->tokens + start, (size_t)b->T * sizeof *x);
    memcpy(y, b->tokens + start + 1, (size_t)b->T * sizeof *y);
    if (!doc) return;
    if (b->doc_starts) doc_flags(b->doc_starts, b->n_docs, start, b->T, doc);
    else memset(doc, 0, (size_t)b->T * sizeof *doc);
}

void batcher_set_documents(Batcher *b, const int64_t *starts, int64_t n_docs) {
    ASSERT(n_docs >= 0 && (n_docs == 0 || starts), "batcher_set_documents: %lld documents", (long long)n_docs);
    b->doc_starts = n_docs > 0 ? starts : NULL;
    b->n_docs = n_docs;
}

Status batcher_set_streams(Batcher *b) {
    int64_t len = b->train_end / b->B;
    if (len < (int64_t)b->T + 1)
        return status_err("the training split of %lld tokens, read as %d streams (one per row of batch_size), "
                          "gives each %lld tokens, fewer than one window of seq_len + 1 = %d",
                          (long long)b->train_end, b->B, (long long)len, b->T + 1);
    b->streams = true;
    b->stream_len = len;
    b->stream_windows = (len - 1) / b->T;
    return status_ok();
}

void batcher_set_share(Batcher *b, int lo, int hi) {
    ASSERT(0 <= lo && lo < hi && hi <= b->B, "batcher_set_share: windows [%d, %d) of a batch of %d", lo, hi, b->B);
    b->lo = lo;
    b->hi = hi;
}

void batcher_train(Batcher *b, int *x, int *y, int *doc) {
    if (b->streams) {
        int64_t w = b->state.batches % b->stream_windows;
        for (int i = b->lo; i < b->hi; i++) {
            size_t off = (size_t)(i - b->lo) * b->T;
            copy_window(b, (int64_t)i * b->stream_len + w * b->T, x + off, y + off, doc ? doc + off : NULL);
            if (doc && w == 0) doc[off] = 1;   // the stream starts (again): a fresh state
        }
        b->state.batches++;
        return;
    }
    // Starts in [0, train_end - T - 1]: the window [start, start + T] stays in the split.
    uint64_t n_starts = (uint64_t)(b->train_end - b->T);
    for (int i = 0; i < b->B; i++) {
        int64_t start = (int64_t)rng_below(&b->state.rng, n_starts);   // every start is drawn: the stream is shared
        size_t off = (size_t)(i - b->lo) * b->T;
        if (i >= b->lo && i < b->hi) copy_window(b, start, x + off, y + off, doc ? doc + off : NULL);
    }
    b->state.batches++;
}

void batcher_val(const Batcher *b, int64_t index, int *x, int *y, int *doc) {
    int64_t n_val = b->n - b->train_end;
    ASSERT(n_val >= b->T + 1, "batcher_val: no validation split (val_fraction = 0?)");
    // Non-overlapping windows of T tokens (+1 target) from the split start, wrapping.
    int64_t n_windows = (n_val - 1) / b->T;
    for (int i = b->lo; i < b->hi; i++) {
        int64_t w = (index * b->B + i) % n_windows;
        size_t off = (size_t)(i - b->lo) * b->T;
        copy_window(b, b->train_end + w * b->T, x + off, y + off, doc ? doc + off : NULL);
    }
}

int64_t batcher_train_tokens(const Batcher *b) { return b->train_end; }
int64_t batcher_val_tokens(const Batcher *b) { return b->n - b->train_end; }

void sampler_state_pack(const SamplerState *s, uint64_t out[SAMPLER_STATE_WORDS]) {
    for (int i = 0; i < 4; i++) out[i] = s->rng.s[i];
    out[4] = (uint64_t)s->batches;
}

void sampler_state_unpack(SamplerState *s, const uint64_t in[SAMPLER_STATE_WORDS]) {
    for (int i = 0; i < 4; i++) s->rng.s[i] = in[i];
    s->batches = (int64_t)in[4];
}
