// dump_state.h: `train --dump-state FILE`: the state of one forward and
// backward on a batch, for comparison with an independent implementation.
//
// HDF5 layout (reals in the build's precision: float32, or float64 in the
// float64 build; parameter names as in the checkpoint):
//   /tokens (B, T) int32, /targets (B, T) int32, /logits (B, T, V), /loss (1)
//   /params/<name>                  each parameter, with its shape
//   /grads/<name>                   the gradient of each trainable parameter
//   attribute config (string)       the [model] section
//   attribute objective             "lm" (cross-entropy) or "distill"
//   attribute precision             "float32" or "float64"
//   /doc_start (B, T) int32         when the run has documents or streams: 1
//                                   where a document starts (every layer
//                                   starts fresh there), as the step used them
//   /initial_state/<i>              with [train] carry_state: each carried
//                                   state buffer (lm_carry_buffers order) as
//                                   the step started from it (zero at a run's
//                                   first step)
// distill: the loss is the indexer distillation KL (lm_distill_loss, indexer
// fine-tuning), the gradients are the indexers' (the rest is frozen), and
// there are no /logits.
#ifndef DUMP_STATE_H
#define DUMP_STATE_H

#include "lm.h"

// The batch a training step takes: x, y (B, T); doc (B, T) its document-start
// flags or NULL; carry the carried states ([train] carry_state) or NULL.
typedef struct DumpBatch {
    const int *x, *y, *doc;
    int B, T;
    LMCache *carry;
    bool distill;
} DumpBatch;

Status dump_state_write(const char *path, Tape *tp, LM *lm, ParamStore *ps, const DumpBatch *b);

#endif
