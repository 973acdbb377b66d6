#include "run_config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"

static Status load_file_and_sets(TrainConfig *cfg, const RunConfigArgs *a) {
    Status s = config_load_file(cfg, a->config_path);
    for (int i = 0; s.ok && i < a->n_sets; i++) s = config_set(cfg, a->sets[i]);
    return s;
}

// [train] run_dir, or runs/<config file name without .ini>.
static Status default_run_dir(const TrainConfig *cfg, char *out, size_t n) {
    int len;
    if (cfg->train.run_dir[0]) {
        len = snprintf(out, n, "%s", cfg->train.run_dir);
    } else {
        const char *base = strrchr(cfg->source, '/');
        base = base ? base + 1 : cfg->source;
        char name[CONFIG_STR_MAX];
        snprintf(name, sizeof name, "%s", base);
        char *dot = strrchr(name, '.');
        if (dot && dot != name) *dot = 0;
        len = snprintf(out, n, "runs/%s", name);
    }
    if (len < 0 || (size_t)len >= n) return status_err("[train] run_dir: longer than %zu characters", n - 1);
    return status_ok();
}

static void note(char *notes, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(char *notes, size_t n, const char *fmt, ...) {
    size_t used = strlen(notes);
    if (used + 2 >= n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(notes + used, n - used - 1, fmt, ap);
    va_end(ap);
    used = strlen(notes);
    if (used + 1 < n) strcat(notes, "\n");
}

void run_config_stored_compat(TrainConfig *cfg) {
    for (int i = 0; i < config_n_keys(); i++) {
        ConfigKeyRef r = config_key_ref(i);
        // [data] val_choice: a run from before the key held out the tail.
        if (!strcmp(r.section, "data") && !strcmp(r.key, "val_choice") && cfg->origin[i] == 0)
            cfg->data.val_choice = CFG_VAL_TAIL;
    }
}

// Read the config stored in checkpoint `ck` into *out (defaults, then its text).
static Status stored_config(const char *ck, const TrainConfig *like, TrainConfig *out) {
    char *text = NULL;
    Status s = checkpoint_read_config(ck, &text);
    config_defaults(out, like->check_mixer);
    if (s.ok) s = config_load_string(out, text, ck);
    if (s.ok) run_config_stored_compat(out);
    if (s.ok) s = config_validate(out);
    free(text);
    if (!s.ok) config_free(out);
    return s;
}

static bool has_layer(const TrainConfig *c, const char *kind) {
    for (int l = 0; l < c->model.layers.n; l++)
        if (strcmp(c->model.layers.name[l], kind) == 0) return true;
    return false;
}

static bool is_indexer_key(const char *key) {
    return !strcmp(key, "index_heads") || !strcmp(key, "index_dim") || !strcmp(key, "topk");
}

// [finetune] init_from: the [model] section comes from the checkpoint's config.
static Status adopt_init_model(TrainConfig *cfg, const RunConfigArgs *a) {
    char ck[CONFIG_STR_MAX];
    snprintf(ck, sizeof ck, "%s", cfg->finetune.init_from);
    if (access(ck, R_OK) != 0)
        return status_err("[finetune] init_from: cannot read the checkpoint %s (%s): train that model first, e.g. "
                          "train --config tiny_attn.ini, or point init_from at its checkpoint.h5",
                          ck, strerror(errno));
    TrainConfig base;
    Status s = stored_config(ck, cfg, &base);
    if (!s.ok) return status_err("[finetune] init_from: %s", s.msg);
    // Indexers are new when the run adds attn_dsa layers to a model without them.
    bool new_indexers = cfg->finetune.mode != FT_NONE && !has_layer(&base, "attn_dsa");
    for (int i = 0; s.ok && i < config_n_keys(); i++) {
        ConfigKeyRef r = config_key_ref(i);
        if (!r.arch || !config_key_explicit(cfg, i) || (new_indexers && is_indexer_key(r.key))) continue;
        char mine[CONFIG_STR_MAX + 64], theirs[CONFIG_STR_MAX + 64], where[CONFIG_STR_MAX + 16];
        config_format_key(cfg, i, mine, sizeof mine);
        config_format_key(&base, i, theirs, sizeof theirs);
        if (strcmp(mine, theirs) != 0)
            s = status_err("%s: [model] %s: %s here, but %s in the model of %s (init_from): a run that starts from "
                           "a checkpoint keeps its model; drop the key, or train a new model",
                           config_key_where(cfg, i, where, sizeof where), r.key, mine, theirs, ck);
    }
    if (s.ok) {
        // The checkpoint's [model], then the file and overrides again over it
        // (they may only set how it is computed, or the new indexers).
        config_free(cfg);
        config_defaults(cfg, base.check_mixer);
        cfg->model = base.model;
        s = load_file_and_sets(cfg, a);
    }
    config_free(&base);
    return s;
}

Status run_config_add_indexers(TrainConfig *c) {
    ConfigNames *ln = &c->model.layers;
    const ConfigInts *dl = &c->finetune.dsa_layers;
    for (int l = 0; l < ln->n; l++) {
        bool chosen = dl->n == 0;
        for (int i = 0; i < dl->n; i++) chosen |= dl->v[i] == l;
        if (chosen && strcmp(ln->name[l], "attn") == 0) snprintf(ln->name[l], sizeof ln->name[l], "attn_dsa");
    }
    if (has_layer(c, "attn_dsa")) return status_ok();
    return status_err("[finetune] mode = %s: the model (layers from %s) has no attn layer to give an indexer",
                      config_finetune_name(c->finetune.mode), c->finetune.init_from);
}

bool run_config_from_command_line(const TrainConfig *cfg, const char *section, const char *key) {
    for (int i = 0; i < config_n_keys(); i++) {
        ConfigKeyRef r = config_key_ref(i);
        if (!strcmp(r.section, section) && !strcmp(r.key, key)) return cfg->origin[i] < 0;
    }
    return false;
}

// [finetune] init_from: what the model was trained on is its data unless the
// command line says otherwise. A config file written for another model (the
// bundled indexer_ft.ini names the KJV) would otherwise switch the corpus
// and its documents without a word: each key the file or a default sets
// differently is replaced by the model's run's value and said in the notes.
// (The tokenizer is the model's own in any case: setup_tokenizer.)
static Status adopt_init_data(TrainConfig *cfg, char *notes, size_t nn) {
    static const char *const KEYS[] = {"corpus", "documents", "tokenizer", "val_fraction"};
    TrainConfig base;
    Status s = stored_config(cfg->finetune.init_from, cfg, &base);
    if (!s.ok) return status_err("[finetune] init_from: %s", s.msg);
    for (int i = 0; s.ok && i < config_n_keys(); i++) {
        ConfigKeyRef r = config_key_ref(i);
        bool data = false;
        for (size_t k = 0; k < sizeof KEYS / sizeof KEYS[0]; k++) data |= !strcmp(r.section, "data") && !strcmp(r.key, KEYS[k]);
        if (!data || cfg->origin[i] < 0) continue;
        char mine[CONFIG_STR_MAX + 64], theirs[CONFIG_STR_MAX + 64], where[CONFIG_STR_MAX + 16];
        config_format_key(cfg, i, mine, sizeof mine);
        config_format_key(&base, i, theirs, sizeof theirs);
        if (!strcmp(mine, theirs)) continue;
        config_key_where(cfg, i, where, sizeof where);
        char assign[2 * CONFIG_STR_MAX];
        snprintf(assign, sizeof assign, "data.%s=%s", r.key, theirs);
        s = config_set(cfg, assign);
        cfg->origin[i] = 0;   // nobody set it here: the model's run did
        note(notes, nn, "[finetune] init_from: [data] %s = %s, as the model was trained (%s says %s; --set data.%s=... "
             "to choose)", r.key, theirs, where, mine, r.key);
    }
    config_free(&base);
    return s;
}

static Status fresh_config(TrainConfig *cfg, const RunConfigArgs *a, char *notes, size_t nn) {
    Status s = status_ok();
    if (cfg->finetune.init_from[0]) s = adopt_init_model(cfg, a);
    if (s.ok && cfg->finetune.init_from[0]) s = adopt_init_data(cfg, notes, nn);
    if (s.ok) s = config_validate(cfg);
    if (s.ok && cfg->finetune.mode != FT_NONE) {
        s = run_config_add_indexers(cfg);
        if (s.ok) s = config_validate(cfg);   // the attn_dsa layers' own constraints
    }
    return s;
}

static Status resume_config(TrainConfig *cfg, const RunConfigArgs *a, const char *run_dir, char *notes, size_t nn) {
    char ck[CONFIG_STR_MAX + 32];
    if (snprintf(ck, sizeof ck, "%s/checkpoint.h5", run_dir) >= (int)sizeof ck)
        return status_err("--resume: run folder path too long");
    if (access(ck, F_OK) != 0)
        return status_err("--resume: %s: no checkpoint to resume (%s); start the run without --resume", ck,
                          strerror(errno));
    TrainConfig run;
    Status s = stored_config(ck, cfg, &run);
    if (!s.ok) return status_err("--resume: the config stored in the checkpoint: %s", s.msg);
    TrainConfig orig = run;   // the values as stored, for comparison (the text stays run's)
    orig.text = NULL;
    for (int i = 0; s.ok && i < a->n_sets; i++) {
        int k = -1;
        s = config_set_key(&run, a->sets[i], &k);
        if (!s.ok) break;
        char was[CONFIG_STR_MAX + 64], now[CONFIG_STR_MAX + 64];
        config_format_key(&orig, k, was, sizeof was);
        config_format_key(&run, k, now, sizeof now);
        if (strcmp(was, now) == 0) continue;
        ConfigKeyRef r = config_key_ref(k);
        if (!r.resumable)
            s = status_err("--resume: --set %s: [%s] %s is %s in the run being resumed; a resumed run keeps its "
                           "config (only how long and how verbosely it goes on may change): start a new run in "
                           "another run_dir, or continue from its weights with [finetune] init_from",
                           a->sets[i], r.section, r.key, was);
        else
            note(notes, nn, "--resume: [%s] %s: %s -> %s (--set)", r.section, r.key, was, now);
    }
    // What the file says differently from the run is kept as the run had it.
    for (int i = 0; s.ok && i < config_n_keys(); i++) {
        if (cfg->origin[i] <= 0) continue;   // not from the file (defaults, or --set handled above)
        ConfigKeyRef r = config_key_ref(i);
        char file[CONFIG_STR_MAX + 64], have[CONFIG_STR_MAX + 64], where[CONFIG_STR_MAX + 16];
        config_format_key(cfg, i, file, sizeof file);
        config_format_key(&run, i, have, sizeof have);
        if (strcmp(file, have) != 0)
            note(notes, nn, "--resume: %s sets [%s] %s = %s, but the run has %s: the run's value is kept%s",
                 config_key_where(cfg, i, where, sizeof where), r.section, r.key, file, have,
                 r.resumable ? " (to change it, --set it)" : "");
    }
    if (s.ok) s = config_validate(&run);
    if (!s.ok) {
        config_free(&run);
        return s;
    }
    config_free(cfg);
    *cfg = run;
    return s;
}

Status run_config_load(TrainConfig *cfg, const RunConfigArgs *a, char *run_dir, size_t run_dir_n, char *notes,
                       size_t notes_n) {
    notes[0] = 0;
    Status s = load_file_and_sets(cfg, a);
    if (s.ok) s = default_run_dir(cfg, run_dir, run_dir_n);
    if (!s.ok) return s;
    return a->resume ? resume_config(cfg, a, run_dir, notes, notes_n) : fresh_config(cfg, a, notes, notes_n);
}
