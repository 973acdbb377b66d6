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
//   /config              string      the run's effective config (INI text, config_dump)
//   /tokenizer           uint8 (n)   the tokenizer file (tokenizer.h; absent: bytes)
// Every dataset carries a "crc32" attribute over its stored bytes (h5io.h).
// Writing goes to a new temporary beside <path> ("<name>.tmp.<random>",
// fileio.h), which is flushed, fsync'd and renamed over <path>: a crash
// mid-write leaves the previous checkpoint intact.
// Values are stored as float32 in either build; a float64 build converts on
// load (and loses nothing it saved from float32 training).
//
// Loading treats the file as hostile (h5io.h): every dataset's link, type,
// shape, storage and checksum is checked against the model before anything
// is allocated from it or read, and every value is checked (parameters and
// moments finite, second moments non-negative, counters in range) before
// anything in the model is changed.
#ifndef TRAIN_CHECKPOINT_H
#define TRAIN_CHECKPOINT_H

#include "batch.h"
#include "tokenizer.h"
#include "optim.h"
#include "params.h"

#define CHECKPOINT_VERSION 2          // 2: checksums (1 had none and is not read)
#define CHECKPOINT_CONFIG_MAX (1 << 20)   // longest /config text, bytes
#define CHECKPOINT_STEP_MAX ((int64_t)1 << 53)

typedef struct CheckpointState {
    int64_t step;              // training steps completed
    SamplerState sampler;      // data sampler (Rng + position)
    Rng model_rng;             // the model's / generator's Rng
    char *config_text;         // save: text to store (NULL = ""); load: malloc'd copy, free() it
    const uint8_t *tokenizer;  // save only: tokenizer_to_buffer's bytes (NULL: the byte tokenizer)
    size_t tokenizer_len;
    const double *carry;       // save only: (carry_rows, carry_row) carried states ([train] carry_state), or NULL
    int64_t carry_rows, carry_row;
} CheckpointState;

// The carried states of a run with [train] carry_state (/state/carry,
// float64 (rows, row)): read into out, checked to hold exactly that shape
// and finite values.
Status checkpoint_load_carry(const char *path, double *out, int64_t rows, int64_t row);

// Save everything. opt may be NULL (no /optim group); st may be NULL (zero
// state, empty config). A sharded optimizer must be gathered first.
Status checkpoint_save(const char *path, const ParamStore *ps, const Optimizer *opt, const CheckpointState *st);

// Check the file's /params against ps's parameters (names, shapes, types,
// storage, checksum attributes) without reading any values. ps may be
// registered but not yet finalised, so a model is allocated only once its
// checkpoint is known to hold it. rep NULL: every parameter must be in the
// file and the file must hold no other; otherwise the missing and unused
// ones are listed in *rep (n_loaded is left 0).
typedef struct ParamsLoadReport ParamsLoadReport;
Status checkpoint_check_params(const char *path, const ParamStore *ps, ParamsLoadReport *rep);

// Restore a run: every parameter of ps (by name, shape checked), the
// optimizer (if opt != NULL: it must be initialised with the same kind and
// ParamStore; a sharded one, optim_set_shard, takes its slice of the stored
// moments), and the state (if st != NULL). Every check is done before
// anything is modified. Errors name the file and the dataset, e.g.
//   run/ckpt.h5: /params/layers.0.mixer.wq: shape (64, 32) in the file, (64, 64) in the model
// A parameter in the file that the model lacks is also an error (wrong config?).
Status checkpoint_load(const char *path, ParamStore *ps, Optimizer *opt, CheckpointState *st);

// Parameters only, matched by name (fine-tuning from a trained model).
// Model parameters missing from the file keep their values and are listed
// in the report; file parameters the model lacks are listed as unused.
// A shape mismatch is an error.
struct ParamsLoadReport {
    int n_loaded, n_missing, n_unused;
    char missing[1024];        // comma list of model parameters not in the file (truncated with "...")
    char unused[1024];         // comma list of file parameters not in the model
};
Status checkpoint_load_params(const char *path, ParamStore *ps, ParamsLoadReport *report);

// The tokenizer the checkpoint's model was trained with (the byte tokenizer
// when it stores none); the stored file is checked as hostile input.
Status checkpoint_read_tokenizer(const char *path, Tokenizer *t);

// Read only the stored config text (to rebuild the model before loading),
// at most CHECKPOINT_CONFIG_MAX bytes. *text is malloc'd; free() it.
Status checkpoint_read_config(const char *path, char **text);

#endif
