// trainer.h: one training run, from config to final checkpoint. The `train`
// program is a thin command line over this; tests drive it directly (resume
// bit-exactness, interrupted checkpoints, overfitting).
#ifndef TRAINER_H
#define TRAINER_H

#include "checkpoint.h"
#include "model_setup.h"
#include "optim.h"
#include "runlog.h"
#include "token_cache.h"

typedef struct TrainerOptions {
    const char *config;        // path or bundled name
    const char *const *sets;   // "section.key=value" overrides
    int n_sets;
    bool resume;               // continue from <run_dir>/checkpoint.h5
    bool quiet;                // no progress lines (tests)
    int stop_after;            // > 0: behave as if interrupted after this many steps of this run (tests)
} TrainerOptions;

typedef struct Trainer {
    TrainConfig cfg;
    char config_path[CONFIG_STR_MAX];
    LM lm;
    ParamStore ps;
    Optimizer opt;
    Batcher bt;
    TokenData tokens;
    bool cache_built;          // the token cache was (re)built, not reused
    char cache_path[CACHE_PATH_MAX];
    Tape tp;
    Rng model_rng;
    char run_dir[CONFIG_STR_MAX];
    char ckpt[CONFIG_STR_MAX + 32];
    int64_t step;              // steps completed
    int threads;
    int *x, *y;                // (B*T) a batch
    double *losses;            // (cfg.train.steps) training loss of each step, NaN where not run
    double last_val_loss;
} Trainer;

// Everything up to the first step: config, data, model, optimizer, resume.
// Errors name the file, line and key (config) or the path (data, checkpoint).
Status trainer_setup(Trainer *t, const TrainerOptions *o);
// Train to cfg.train.steps (or until interrupted). Returns the exit code:
// 0 done, 3 non-finite loss (last good checkpoint kept), 130 interrupted.
int trainer_run(Trainer *t, const TrainerOptions *o);
void trainer_free(Trainer *t);
// Ask a running trainer to save a checkpoint and stop after the current step (signal-safe).
void trainer_request_stop(void);

#endif
