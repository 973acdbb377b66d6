// model_setup.h: what `train` and `generate` share: the LM built from a
// TrainConfig, thread settings, and evaluation.
#ifndef MODEL_SETUP_H
#define MODEL_SETUP_H

#include "batch.h"
#include "config.h"
#include "lm.h"
#include "tokenizer.h"

// Build the LM and finalize its parameters from the config's seed. ckpt
// non-NULL: first check that this checkpoint holds exactly the model's
// parameters (checkpoint_check_params), before anything is allocated.
Status model_build(const TrainConfig *tc, LM *lm, ParamStore *ps, const char *ckpt);
// Call first in every program's main(). libgomp reads OMP_WAIT_POLICY once,
// when it is loaded, and its default lets idle threads spin for a while,
// taking cores from whatever else runs (measured: 20 training steps took 50 s
// beside a busy process, 8 s with PASSIVE). When the variable is unset this
// sets OMP_WAIT_POLICY=PASSIVE and re-executes the program, so it is fast
// however it is started; a value the user set is kept.
void model_init_process(char **argv);
// The model a checkpoint holds, as generate, evaluate and export rebuild it:
// its stored config (validated), the model built only once the file's
// parameter datasets are known to match it (model_build), then its values.
// cfg is config_defaults'ed here. tok (may be NULL) receives the checkpoint's
// tokenizer (tokenizer_free it). On failure lm, ps and tok hold nothing (and
// config_free(cfg) is still due).
Status model_load_checkpoint(const char *ckpt, TrainConfig *cfg, LM *lm, ParamStore *ps, Tokenizer *tok);
// Mean bytes per target token of the n_batches validation batches (the
// factor from a loss per token to bits per byte: bpb = loss / ln 2 / this).
double model_val_bytes_per_token(const Batcher *bt, const Tokenizer *tok, int n_batches, int *x, int *y);
// OpenMP (and with it OpenBLAS's OpenMP build) thread count; 0 keeps the
// default. At most MODEL_MAX_THREADS (the config's and generate's limit).
#define MODEL_MAX_THREADS 1024
int model_set_threads(int threads);
// The product backend and precision of [train] gemm and precision (blas.h:
// blas_select; auto may time both backends on the current thread count, so
// call it after model_set_threads). An error says why the request cannot run
// here (no oneDNN in this build, bf16 in the float64 build or on a CPU
// without AVX512_BF16). Under bf16 on the CPU also the attention's tiles,
// [train] bf16_tiles (tile_amx.h: bf16_tiles_select).
Status model_set_products(const TrainConfig *tc);
// Is this a known mixer name? (mixer_kind_find; the same as config_defaults' NULL)
bool model_mixer_known(const char *name);
// Mean validation loss over n_batches fixed validation batches (no-grad).
double model_eval_loss(Tape *tp, LM *lm, const Batcher *bt, int n_batches, int *x, int *y, int *doc);

#endif
