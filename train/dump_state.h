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
// distill: the loss is the indexer distillation KL (lm_distill_loss, indexer
// fine-tuning), the gradients are the indexers' (the rest is frozen), and
// there are no /logits.
#ifndef DUMP_STATE_H
#define DUMP_STATE_H

#include "lm.h"

Status dump_state_write(const char *path, Tape *tp, LM *lm, ParamStore *ps, const int *x, const int *y, int B,
                        int T, bool distill);

#endif
