// run_config.h: the config a run trains with, assembled from the config
// file, the --set overrides and, when the run starts from or resumes a
// checkpoint, the config stored in it.
//
// Fresh run: the file, then the overrides, validated. With
//   [finetune] init_from = X: the [model] section is X's (from the config
//   stored in X); the file or --set may repeat its values but not change a
//   key that defines the trained function (KEYF_ARCH), except the indexer's
//   keys when the run adds indexers. mode = indexer | sparse then turns the
//   attn layers named by dsa_layers into attn_dsa; mode = none continues
//   training X's model as it is. X's data settings (corpus, documents,
//   tokenizer, val_fraction) are the run's unless --set gives them; a file
//   value that differs is replaced and reported in the notes.
// --resume: the config stored in <run_dir>/checkpoint.h5 is the run's. An
//   override that changes a key is applied only if the key is resumable
//   (steps, eval_every, ...: how long and how verbosely the run goes on) and
//   refused otherwise; keys the file sets to other values than the run's are
//   reported and the run's values kept.
// Either way the run's effective config is what checkpoints store, so
// `generate`, `init_from` and `--resume` rebuild exactly this model.
#ifndef RUN_CONFIG_H
#define RUN_CONFIG_H

#include "config.h"

typedef struct RunConfigArgs {
    const char *config_path;       // the file found by config_find
    const char *const *sets;       // "section.key=value" overrides
    int n_sets;
    bool resume;
} RunConfigArgs;

// cfg must be config_defaults'ed. run_dir receives the run's folder
// ([train] run_dir, or runs/<config file name>). notes receives what the
// user should know (resume differences), one line each, "" when none.
Status run_config_load(TrainConfig *cfg, const RunConfigArgs *a, char *run_dir, size_t run_dir_n, char *notes,
                       size_t notes_n);

// The attn layers named by dsa_layers (every attn layer when empty) become
// attn_dsa; an error when the model has none.
Status run_config_add_indexers(TrainConfig *c);
// A config read from a checkpoint: keys its text lacks (it was written before
// they existed) take the behaviour the run had then, not today's default.
void run_config_stored_compat(TrainConfig *cfg);
// Was [section] key set on the command line (--set)?
bool run_config_from_command_line(const TrainConfig *cfg, const char *section, const char *key);

#endif
