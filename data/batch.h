// batch.h: training and validation batches of token windows.
//
// The tokens are split by position: the first (1 - val_fraction) of them
// are the training split, the rest the validation split. A window holds
// T + 1 consecutive tokens of one split; inputs are its first T tokens and
// targets its last T (MODEL.md).
//
// Training windows start at uniformly random positions drawn from the
// sampler's Rng; the SamplerState (Rng + batches drawn) is all that is
// needed to replay the stream, and is saved in checkpoints.
// Validation batch i is fixed: consecutive windows from the start of the
// validation split, wrapping around, so every evaluation sees the same data.
//
// Documents (documents.h; batcher_set_documents): each batch comes with
// doc_start flags (B, T), 1 where a document starts inside a window; the
// windows are packed across documents as before (a window may hold the end
// of one and the start of the next), and the model starts fresh at a flag.
//
// Streams (batcher_set_streams; [train] carry_state): instead of random
// starts, row i of every batch reads stream i, the i-th of B equal
// contiguous parts of the training split, window after window (batch k reads
// window k mod W of each stream, W = its whole windows), so a model can
// carry its state from one window of a row to the next. The first window of
// a stream (the start, and again after the stream's end) is flagged at
// t = 0: the carried state starts afresh there. The stream position is
// SamplerState.batches, so resuming needs nothing more.
//
// Data-parallel processes share each batch of B windows: every one draws the
// whole batch (the same starts, so the stream and its SamplerState do not
// depend on how many there are) and copies only its share, windows [lo, hi)
// (batcher_set_share; all B by default).
#ifndef DATA_BATCH_H
#define DATA_BATCH_H

#include "common.h"
#include "rng.h"

typedef struct SamplerState {
    Rng rng;            // draws training window starts
    int64_t batches;    // training batches drawn so far (the stream position)
} SamplerState;

#define SAMPLER_STATE_WORDS 5   // uint64 words of a packed SamplerState

typedef struct Batcher {
    const int *tokens;      // (n) all tokens; not owned
    int64_t n;
    int64_t train_end;      // training split = [0, train_end), validation = [train_end, n)
    int B, T;
    int lo, hi;             // this process's windows of each batch (0, B unless shared)
    const int64_t *doc_starts;   // (n_docs) document starts, or NULL; not owned
    int64_t n_docs;
    bool streams;           // rows read contiguous streams (batcher_set_streams)
    int64_t stream_len;     // tokens per stream
    int64_t stream_windows; // whole windows per stream (W)
    SamplerState state;
} Batcher;

// Errors (Status) if a split is too small to hold one window of T + 1 tokens
// (the validation split only matters when val_fraction > 0).
Status batcher_init(Batcher *b, const int *tokens, int64_t n, double val_fraction, int B, int T, uint64_t seed);
// The same with the validation split given as where it starts: tokens
// [train_end, n) (val_split.h reorders documents so that it is their tail).
Status batcher_init_at(Batcher *b, const int *tokens, int64_t n, int64_t train_end, int B, int T, uint64_t seed);
// Copy only windows [lo, hi) of each batch from now on (0 <= lo < hi <= B).
void batcher_set_share(Batcher *b, int lo, int hi);
// Flag document starts from now on (starts as documents.h: sorted, 0 first).
void batcher_set_documents(Batcher *b, const int64_t *starts, int64_t n_docs);
// Read contiguous streams, one per row; an error if a stream would be
// shorter than one window of T + 1 tokens.
Status batcher_set_streams(Batcher *b);
// Whether batches come with doc_start flags (documents or streams).
static inline bool batcher_has_flags(const Batcher *b) { return b->doc_starts != NULL || b->streams; }
// Windows per batch this process gets: hi - lo.
static inline int batcher_share(const Batcher *b) { return b->hi - b->lo; }
// Next training batch: x, y (hi - lo, T) inputs and targets of its windows
// [lo, hi); doc (hi - lo, T) its doc_start flags (may be NULL: not wanted).
// Advances the state by the whole batch.
void batcher_train(Batcher *b, int *x, int *y, int *doc);
// Validation batch `index` (0, 1, ...): x, y, doc as batcher_train's; its
// windows [lo, hi). Needs a validation split. Validation windows are never
// streams (each is scored from a fresh state).
void batcher_val(const Batcher *b, int64_t index, int *x, int *y, int *doc);
// Tokens in the training / validation split.
int64_t batcher_train_tokens(const Batcher *b);
int64_t batcher_val_tokens(const Batcher *b);

// A SamplerState as SAMPLER_STATE_WORDS uint64 words (rng s[0..3], batches).
void sampler_state_pack(const SamplerState *s, uint64_t out[SAMPLER_STATE_WORDS]);
void sampler_state_unpack(SamplerState *s, const uint64_t in[SAMPLER_STATE_WORDS]);

#endif
