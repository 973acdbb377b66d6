// trainer.h: one training run, from config to final checkpoint. The `train`
// program is a thin command line over this; tests drive it directly (resume
// bit-exactness, interrupted checkpoints, overfitting).
#ifndef TRAINER_H
#define TRAINER_H

#include "checkpoint.h"
#include "dist.h"
#include "dsa_eval.h"
#include "lm_graph.h"
#include "optim_device.h"
#include "model_setup.h"
#include "optim.h"
#include "run_dir.h"
#include "runlog.h"
#include "token_cache.h"

typedef struct TrainerOptions {
    const char *config;        // path or bundled name
    const char *const *sets;   // "section.key=value" overrides
    int n_sets;
    bool resume;               // continue from <run_dir>/checkpoint.h5
    bool overwrite;            // a fresh run may replace a previous run in run_dir
    bool quiet;                // no progress lines (tests)
    int stop_after;            // > 0: behave as if interrupted after this many steps of this run (tests)
    bool nccl_one;             // device = cuda in one process: reduce over NCCL all the same, a communicator
                               // of one (tests: the GPU ranks' path on one GPU)
} TrainerOptions;

typedef struct Trainer {
    TrainConfig cfg;
    char config_path[CONFIG_STR_MAX];
    LM lm;
    ParamStore ps;
    Optimizer opt;
    Batcher bt;
    TokenData tokens;
    Tokenizer tok;             // the run's tokenizer ([data] tokenizer, or the checkpoint's)
    uint8_t *tok_buf;          // its stored form for checkpoints (NULL: bytes)
    size_t tok_len;
    double val_bytes_per_token;   // of the validation batches: loss / ln 2 / this = bits per byte
    bool cache_built;          // the token cache was (re)built, not reused
    char cache_path[CACHE_PATH_MAX];
    Tape tp;
    Rng model_rng;
    char run_dir[CONFIG_STR_MAX];
    char ckpt[CONFIG_STR_MAX + 32];
    RunDir rd;                 // the run folder, locked while the trainer lives
    char notes[2048];          // what setup wants the user to know (resume differences), one per line
    int64_t step;              // steps completed
    int64_t first_step;        // the step this process started at (0, or the resumed checkpoint's)
    int64_t saved_step;        // step of the last checkpoint written or loaded (-1: none)
    int threads;
    int *x, *y;                // (B*T) a batch
    int *doc;                  // (B*T) its doc_start flags (documents, carry_state)
    LMCache *carry;            // [train] carry_state: this rank's rows' carried states (else NULL)
    LMGraph graph;             // [train] cuda_graph: the micro-batches' CUDA graph (graph.g NULL: eager)
    OptimDevice ostep;         // a GPU run in one process: the optimizer's work queued as one (optim_device.h),
                               // replayed from a graph when `graph` is on (ostep.hyper NULL: optim.h's calls)
    double *losses;            // (n_losses) training loss of steps first_step, first_step + 1, ...
    int64_t n_losses, cap_losses;
    bool has_val;              // a validation split exists (val_fraction > 0)
    double last_val_loss;
    // [finetune] (mode != none): what came from init_from, and the DSA figures.
    ParamsLoadReport init_report;   // parameters loaded from init_from; the missing ones are fresh indexers
    DsaMode dsa_mode;               // the attn_dsa layers' mode while training
    double last_kl;                 // the last step's KL term (NaN when there is none; under MPI this rank's share)
    DsaEval last_dsa;               // the last evaluation's DSA figures (NaN when not run)
    double decode_dense_tok_s, decode_sparse_tok_s;   // at the end, at a DSA_DECODE_CTX context
    // Data parallel (dist.h; README "Many processes (MPI)"): rank `rank` of
    // `ranks` takes windows [bt.lo, bt.hi) of every batch; its gradients and
    // losses count with weight (bt.hi - bt.lo) / batch_size, so N ranks train
    // as one process with the whole batch would, up to rounding.
    int rank, ranks;
    DistGrads *dg;                  // the gradient reduction (NULL in a single process)
    int64_t slice_lo, slice_hi;     // the flat elements whose gradient norm this rank sums (ZeRO-1: updates)
} Trainer;

// Context length and steps of the end-of-run decoding-speed measurement.
#define DSA_DECODE_CTX 4096
#define DSA_DECODE_STEPS 32   // per round (dsa_eval_decode_speed)

// Fine-tuning and continued training: run_config.h says how the config is
// assembled from init_from's. mode = none with init_from loads every
// parameter (they must all be there) and, with restore_optimizer, the
// optimizer state; the step count starts at 0 on this config's data.
//
// Indexer fine-tuning ([finetune] mode = indexer | sparse; README "Sparse attention:
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
// Everything up to the first step: config, data, model, optimizer, resume,
// and the run folder (locked; a previous run there is refused unless
// resume or overwrite). Errors name the file, line and key (config) or the
// path (data, checkpoint); a failed setup writes nothing.
Status trainer_setup(Trainer *t, const TrainerOptions *o);
// Under MPI every rank calls trainer_setup, trainer_run and trainer_free;
// rank 0 alone writes the checkpoints and logs and prints (other ranks print
// only their own errors, prefixed with their rank). trainer_setup's error is
// to be printed by rank 0 only (dist_agree).
//
// Train to cfg.train.steps (or until interrupted). Returns the exit code:
// 0 done, 1 the final checkpoint could not be written, 3 a non-finite loss,
// gradient or parameter (the last good checkpoint is kept and none is written
// from the bad state), 130 interrupted (SIGINT, SIGTERM or SIGUSR1: checkpoint saved).
int trainer_run(Trainer *t, const TrainerOptions *o);
// [train] carry_state: doubles per batch row of the carried states, and
// copying this rank's rows into (pack) or out of a (batch_size x row) array.
int64_t trainer_carry_row(Trainer *t);
void trainer_carry_copy(Trainer *t, double *full, bool pack);
// The training loss of step `step` (0-based) if this process ran it, else NaN.
double trainer_loss(const Trainer *t, int64_t step);
void trainer_free(Trainer *t);
// Ask a running trainer to save a checkpoint and stop after the current step (signal-safe).
void trainer_request_stop(void);
// Whether the last run's stop (trainer_run returned 130) came from SIGINT or
// SIGTERM on some rank, rather than SIGUSR1 or trainer_request_stop: every
// rank answers alike. Under mpirun the former means mpirun is ending the job.
bool trainer_stop_ends_job(void);

#endif
