// dump_state.h: `train --dump-state FILE`: the state of one forward and
// backward on a batch, for comparison with an independent implementation.
//
// HDF5 layout (float32 for reals, parameter names as in the checkpoint):
//   /tokens (B, T) int32, /targets (B, T) int32, /logits (B, T, V), /loss (1)
//   /params/<name>, /grads/<name>   each with the parameter's shape
//   attribute config (string)       the config text
#ifndef DUMP_STATE_H
#define DUMP_STATE_H

#include "lm.h"

Status dump_state_write(const char *path, Tape *tp, LM *lm, ParamStore *ps, const int *x, const int *y, int B,
                        int T);

#endif
