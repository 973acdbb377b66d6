// model_setup.h: what `train` and `generate` share: the LM built from a
// TrainConfig, thread settings, and evaluation.
#ifndef MODEL_SETUP_H
#define MODEL_SETUP_H

#include "batch.h"
#include "config.h"
#include "lm.h"

// Fill an LMConfig from the [model] section (vocabulary: the byte tokenizer's).
Status model_config_from_train(const TrainConfig *tc, LMConfig *lc);
// Build the LM and finalize its parameters from the config's seed.
Status model_build(const TrainConfig *tc, LM *lm, ParamStore *ps);
// OpenMP (and with it OpenBLAS's OpenMP build) thread count; 0 keeps the default.
int model_set_threads(int threads);
// Is this a known mixer name? (for config validation)
bool model_mixer_known(const char *name);
// Mean validation loss over n_batches fixed validation batches (no-grad).
double model_eval_loss(Tape *tp, LM *lm, const Batcher *bt, int n_batches, int *x, int *y);

#endif
