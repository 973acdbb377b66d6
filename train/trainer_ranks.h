// trainer_ranks.h: do the ranks of a job train the same thing? Start-up
// checks under MPI (dist_same_settings, dist.h); in one process each returns
// ok at once.
//
// Ranks started by an MPMD launch (mpirun -np 1 train --config a.ini : -np 1
// train --config b.ini), with a --set of their own, or on machines whose
// "same path" holds different files would otherwise train on silently, each
// on its own batches, learning rate or clipping, until the parameters are
// compared at the first checkpoint. Each check is made by every rank at the
// same point of trainer_setup and gives every rank the same verdict: an
// error naming the rank, the setting and both values, e.g.
//   the ranks' configs differ: rank 1: train.lr = 0.001, rank 0 has 0.002
//
// What may differ from rank to rank (TRAINER_RANK_KEYS): where a machine
// keeps its token cache ([data] cache_dir: the tokens themselves are
// compared), the threads a rank uses ([train] threads: a rank's own share of
// the work, summed in the same order across ranks) and its watchdog ([train]
// dist_timeout). Every other key of the effective config (the file, --set
// overrides and defaults, or the stored config on --resume) must be equal.
#ifndef TRAIN_TRAINER_RANKS_H
#define TRAIN_TRAINER_RANKS_H

#include "trainer.h"

#define TRAINER_RANK_KEYS "data.cache_dir, train.threads, train.dist_timeout"

// After every rank has read its config: the build (float32 or float64),
// --resume, and every config key but TRAINER_RANK_KEYS.
Status trainer_ranks_same_config(const Trainer *t, const TrainerOptions *o);
// After every rank has its data: the tokenizer, and the tokens and document
// starts it will train on (counts and CRC-32s).
Status trainer_ranks_same_data(const Trainer *t);
// After the model is built or resumed: the step, the sampler's and the
// model's random state.
Status trainer_ranks_same_start(const Trainer *t);

#endif
