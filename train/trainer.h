// trainer.h: one training run, from config to final checkpoint. The `train`
// program is a thin command line over this; tests drive it directly (resume
// bit-exactness, interrupted checkpoints, overfitting).
#ifndef TRAINER_H
#define TRAINER_H

#include "checkpoint.h"
#include "dsa_eval.h"
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
    // [finetune] (mode != none): what came from init_from, and the DSA figures.
    ParamsLoadReport init_report;   // parameters loaded from init_from; the missing ones are fresh indexers
    DsaMode dsa_mode;               // the attn_dsa layers' mode while training
    double last_kl;                 // the last step's KL term (NaN when there is none)
    DsaEval last_dsa;               // the last evaluation's DSA figures (NaN when not run)
    double decode_dense_tok_s, decode_sparse_tok_s;   // at the end, at a DSA_DECODE_CTX context
} Trainer;

// Context length and steps of the end-of-run decoding-speed measurement.
#define DSA_DECODE_CTX 4096
#define DSA_DECODE_STEPS 16

// Fine-tuning ([finetune] mode = indexer | sparse; README "Sparse attention:
// two-step recipe"): the [model] keys the config does not set come from the
// config stored in init_from (the architecture must match the checkpoint's),
// then the attn layers named by dsa_layers (all attn layers when empty)
// become attn_dsa. Every parameter of init_from is loaded; only the indexer
// weights may be missing (they start fresh, and are reported). mode = indexer
// freezes everything but the indexers and minimises the distillation KL
// (lm_distill_loss); mode = sparse trains every weight on the LM loss with
// sparse attention plus the indexers' KL over the selected positions. The
// effective config (with the attn_dsa layers) is what the checkpoint stores.
//
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
