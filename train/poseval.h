// poseval.h: the loss per position of long sequences ("evaluation at any
// length"), for `evaluate --positions`.
//
// A text is a stream of n tokens, cut into documents by doc_start (n), nonzero
// where a document begins (NULL: the stream is one document). Every target
// tok[i+1] inside a document is scored once, conditioned on tokens of its own
// document only, and filed under its position: the position of the input i
// inside its document, p = i - (where i's document begins), so that p + 1
// tokens are visible at best. (The first token of a document is not a target:
// nothing of its document comes before it.) Grouped into buckets of
// positions, [0, 256), [256, 1k), ..., the mean loss shows whether a model
// still gains from context far past its training length, or loses.
//
// How the model is given its context (PosevalContext):
//   CARRY   all-recurrent models (every layer linear, mamba or gdn):
//           consecutive chunks of `chunk` tokens through lm_forward_carry, the
//           state (and the short convolutions' last inputs) carried from one
//           to the next: exactly one pass over the stream (tested against
//           FULL), in the memory of a chunk. Refused for attention layers,
//           which would see only their chunk.
//   FULL    any model: one lm_forward_docs over the whole stream. Attention
//           sees its whole document (flash attention: memory O(n), time
//           O(n^2) per attention layer within a document); recurrent layers
//           run their training form over everything.
//   WINDOW  any model: windows of `window` tokens advancing by `stride`,
//           every layer starting afresh in each window (a sliding window);
//           a target is scored in the first window that reaches it, so it
//           sees at least window - stride and at most `window` tokens of its
//           document. The last window ends at the stream's end.
#ifndef POSEVAL_H
#define POSEVAL_H

#include "lm.h"

typedef enum {
    POSEVAL_CARRY,
    POSEVAL_FULL,
    POSEVAL_WINDOW,
    POSEVAL_COUNT
} PosevalContext;

const char *poseval_context_name(PosevalContext c);   // "carry", "full", "window"
int poseval_context_parse(const char *s);             // -1 if unknown

typedef struct PosevalSpec {
    PosevalContext context;
    int chunk;               // CARRY: tokens per forward
    int window, stride;      // WINDOW: 1 <= stride <= window
    int batch;               // WINDOW: windows per forward
} PosevalSpec;

// Can CARRY run this model (does every layer carry its state)?
bool poseval_all_recurrent(const LM *lm);

// Score the stream tok (n) with documents doc_start (n, or NULL). Writes, for
// every input i < n - 1: nll[i] = -log p(tok[i+1] | its context) in nats, or
// NAN where tok[i+1] begins a document (not scored); pos[i] = the position of
// i inside its document. Returns an error (and writes nothing) when the spec
// does not fit the model (CARRY with attention layers, bad sizes). dev: where
// lm's parameters are and the forwards run (the logits are read on the host).
Status poseval_score(LM *lm, const int *tok, const int *doc_start, int64_t n, const PosevalSpec *sp, double *nll,
                     int64_t *pos, Device dev);

typedef struct PosevalBucket {
    int64_t lo, hi;          // positions [lo, hi)
    double nll;              // sum of the scored targets' nll (nats)
    int64_t tokens;          // scored targets
    int64_t bytes;           // bytes of text they stand for (0 without target_bytes)
    double pos_sum;          // sum of their positions (mean position = pos_sum / tokens)
} PosevalBucket;

// Sum nll and pos (n entries, as poseval_score writes them; NAN entries are
// skipped) into the buckets [0, edges[0]), [edges[0], edges[1]), ...,
// [edges[n_edges-2], edges[n_edges-1]); positions at or past the last edge
// are left out. edges: strictly increasing and positive. target_bytes (n) or
// NULL: the byte length of each target. out: n_edges buckets.
void poseval_buckets(const double *nll, const int64_t *pos, const int *target_bytes, int64_t n, const int64_t *edges,
                     int n_edges, PosevalBucket *out);

// Default bucket edges: 256, 1024, 4096, ... (x4) up to the first that
// exceeds max_pos. Writes at most max_edges; returns how many.
int poseval_default_edges(int64_t max_pos, int64_t *edges, int max_edges);

#endif
