// checkpoint.h: save and restore a training run in one HDF5 file.
//
// Format (docs/checkpoint.md has the details and a Python example):
//   /format_version      int32 (1)       CHECKPOINT_VERSION
//   /params/<name>       float32, the parameter's shape, row-major; the name
//                        keeps its dots ("layers.0.mixer.wq" is one dataset)
//   /optim               group, attribute kind = "adamw" | "sgd" (absent when
//                        saved without an optimizer)
//   /optim/m, /optim/v   float32 (numel) flat moment blocks in ParamStore
//                        order (v only for AdamW);  /optim/step int64 (1)
//   /state/step          int64 (1)   training steps completed
//   /state/sampler       uint64 (5)  SamplerState: rng s[0..3], batches drawn
//   /state/model_rng     uint64 (4)  the model's Rng (e.g. generation)
//   /config              string      the config text the run was started with
// Writing goes to "<path>.tmp", which is flushed, fsync'd and renamed over
// <path>: a crash mid-write leaves the previous checkpoint intact.
// Values are stored as float32 in either build; a float64 build converts on
// load (and loses nothing it saved from float32 training).
#ifndef TRAIN_CHECKPOINT_H
#define TRAIN_CHECKPOINT_H

#include "batch.h"
#include "optim.h"
#include "params.h"

#define CHECKPOINT_VERSION 1

typedef struct CheckpointState {
    int64_t step;              // training steps completed
    SamplerState sampler;      // data sampler (Rng + position)
    Rng model_rng;             // the model's / generator's Rng
    char *config_text;         // save: text to store (NULL = ""); load: malloc'd copy, free() it
} CheckpointState;

// Save everything. opt may be NULL (no /optim group); st may be NULL (zero
// state, empty config).
Status checkpoint_save(const char *path, const ParamStore *ps, const Optimizer *opt, const CheckpointState *st);

// Restore a run: every parameter of ps (by name, shape checked), the
// optimizer (if opt != NULL: it must be initialised with the same kind and
// ParamStore), and the state (if st != NULL). Every check is done before
// anything is modified. Errors name the file and the dataset, e.g.
//   run/ckpt.h5: /params/layers.0.mixer.wq: shape (64, 32) in the file, (64, 64) in the model
// A parameter in the file that the model lacks is also an error (wrong config?).
Status checkpoint_load(const char *path, ParamStore *ps, Optimizer *opt, CheckpointState *st);

// Parameters only, matched by name (fine-tuning from a trained model).
// Model parameters missing from the file keep their values and are listed
// in the report; file parameters the model lacks are listed as unused.
// A shape mismatch is an error.
typedef struct ParamsLoadReport {
    int n_loaded, n_missing, n_unused;
    char missing[1024];        // comma list of model parameters not in the file (truncated with "...")
    char unused[1024];         // comma list of file parameters not in the model
} ParamsLoadReport;
Status checkpoint_load_params(const char *path, ParamStore *ps, ParamsLoadReport *report);

// Read only the stored config text (to rebuild the model before loading).
// *text is malloc'd; free() it.
Status checkpoint_read_config(const char *path, char **text);

#endif
