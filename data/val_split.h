// val_split.h: the validation split as whole documents drawn at random.
//
// The tail of the tokens is a poor validation set when the corpus is a
// folder of files sorted by name: the last files (one author, one kind of
// text) become all of it. With documents, a seeded random set of whole
// documents is held out instead ([data] val_choice = documents): the tokens
// are reordered so the training documents come first, in their order, then
// the held-out ones, in theirs; the batcher's split by position then holds
// out exactly those documents, and a run replays the same split from its
// config (the seed is [train] seed, stored with it in every checkpoint).
#ifndef DATA_VAL_SPLIT_H
#define DATA_VAL_SPLIT_H

#include <stdint.h>

#include "common.h"

// Documents are drawn in a seeded random order until they hold
// val_fraction * n tokens (at least one document, never all of them).
// *out_tokens (n) and *out_starts (n_docs) are malloc'd: the reordered tokens
// and document starts; *train_end is where the held-out documents begin.
// An error when there are fewer than two documents.
Status val_split_documents(const int *tokens, int64_t n, const int64_t *starts, int64_t n_docs, double val_fraction,
                           uint64_t seed, int **out_tokens, int64_t **out_starts, int64_t *train_end);

#endif
