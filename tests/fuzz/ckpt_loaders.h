// ckpt_loaders.h: what the checkpoint fuzz targets share: the small model
// every input is loaded into, and the loaders a user's checkpoint meets.
#ifndef FUZZ_CKPT_LOADERS_H
#define FUZZ_CKPT_LOADERS_H

#include "config.h"
#include "lm.h"
#include "params.h"

enum { CKPT_CARRY_ROWS = 3, CKPT_CARRY_ROW = 7 };

// The fuzzers' model (gdn, attn_dsa and mamba layers, a few hundred parameters).
void ckpt_build_model(TrainConfig *cfg, LM *lm, ParamStore *ps);

// Hand the file at path to generate's loader (the model from the stored
// config), --resume's (parameters, AdamW, run state and carried states into
// the known model) and init_from's (parameters by name). Aborts on a broken
// invariant: a failed load that changed the model, a successful one with a
// non-finite value or an impossible run state.
void ckpt_load_every_way(const char *path);

#endif
