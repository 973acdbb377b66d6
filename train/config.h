// config.h: the training configuration, read from an INI file (libinih).
//
// One schema table (config.c, one row per key: section, key, type, default,
// range or choices, help) drives parsing, validation, defaults, the --help
// text and the dump of the effective config. Use:
//
//     TrainConfig cfg;
//     config_defaults(&cfg, NULL);                  // NULL: the mixer registry's names
//     char path[CONFIG_STR_MAX];
//     const char *dirs[] = {".", SOURCE_DIR};
//     Status st = config_find(argv_cfg, dirs, 2, path, sizeof path);
//     if (st.ok) st = config_load_file(&cfg, path);
//     for each --set ARG: if (st.ok) st = config_set(&cfg, ARG);
//     if (st.ok) st = config_validate(&cfg);
//     if (!st.ok) { fprintf(stderr, "%s\n", st.msg); exit(2); }
//     ...
//     config_free(&cfg);
//
// Every error names where it happened, e.g.
//   configs/x.ini:7: [train] lerning_rate: unknown key (did you mean lr?)
//   --set train.lr=abc: [train] lr: 'abc' is not a number
// Unknown sections and keys, bad values (type, range, enum choice, mixer
// name), duplicate keys in a file and missing files are all errors: nothing
// is silently defaulted.
#ifndef TRAIN_CONFIG_H
#define TRAIN_CONFIG_H

#include <stdio.h>

#include "common.h"
#include "lm.h"
#include "mixer.h"

#define CONFIG_MAX_LAYERS 64   // longest [model] layers / [finetune] dsa_layers list
#define CONFIG_NAME_MAX 16     // longest mixer name + 1
#define CONFIG_STR_MAX 1024    // longest string value + 1 (paths)
#define CONFIG_MAX_KEYS 64     // capacity for schema rows
#define CONFIG_LINE_MAX (CONFIG_STR_MAX + 64)   // longest line of INI text (a key and the longest value)
#define CONFIG_TEXT_MAX (1 << 20)               // longest config file

// [model] form: which implementation of the sequence mixers to run (MixerForm, mixer.h).
// [train] optimizer (same order as OptimKind in optim.h).
typedef enum { CFG_OPT_ADAMW, CFG_OPT_SGD, CFG_OPT_COUNT } ConfigOptimizer;
// [finetune] mode.
typedef enum { FT_NONE, FT_INDEXER, FT_SPARSE, FT_COUNT } FinetuneMode;
typedef enum { CFG_ORDER_RANDOM, CFG_ORDER_STREAMS } ConfigOrder;
typedef enum { CFG_VAL_DOCUMENTS, CFG_VAL_TAIL } ConfigValChoice;
typedef enum { CFG_GRAPH_AUTO, CFG_GRAPH_ON, CFG_GRAPH_OFF } ConfigCudaGraph;

typedef struct ConfigNames {   // a comma list of names, e.g. "attn,gdn,attn"
    int n;
    char name[CONFIG_MAX_LAYERS][CONFIG_NAME_MAX];
} ConfigNames;

typedef struct ConfigInts {    // a comma list of integers, e.g. "1,3"
    int n;
    int v[CONFIG_MAX_LAYERS];
} ConfigInts;

// Checks a mixer name of [model] layers; NULL asks the mixer kinds' registry
// (mixer_kind_find: the built-in kinds and those mixer_kind_register added).
typedef bool (*MixerNameCheck)(const char *name);

typedef struct TrainConfig {
    struct {
        ConfigNames layers;     // one mixer name per layer, input to output
        int d_model;            // D
        int n_heads;            // H
        int d_k, d_v;           // per-head key/query and value sizes
        int d_ff;               // MLP hidden width
        bool tied_embeddings;   // output projection = embedding^T
        int chunk_size;         // C, chunked forms
        int conv_size;          // short convolution width w
        double norm_eps;        // RMSNorm epsilon
        double rope_base;       // RoPE base (MODEL.md fixes 10000)
        int index_heads;        // H_I, DSA indexer heads
        int index_dim;          // d_I, DSA indexer head size
        int topk;               // DSA positions kept per query
        bool qk_norm;           // attn, attn_dsa: per-head RMSNorm of q and k before RoPE
        bool attn_gate;         // attn, attn_dsa: sigmoid output gate before Wo
        int gdp_steps;          // gdp: delta-rule steps per token n_h
        bool kda_gate_bias;     // kda: the output gate's bias b_g2 (fla's g_proj; Kimi Linear's has none)
        MixerForm form;         // chunked | parallel | recurrent
    } model;
    struct {
        char corpus[CONFIG_STR_MAX];     // a file, a comma list of files, or a directory
        char cache_dir[CONFIG_STR_MAX];  // where token caches live
        char tokenizer[CONFIG_STR_MAX];  // byte | tiktoken name | bpe:N | a file (tokenizer.h)
        char documents[CONFIG_STR_MAX];  // none | files | blank_line | eot | text:SEP (documents.h)
        ConfigOrder order;               // random windows | each row reads a contiguous stream (batch.h)
        ConfigValChoice val_choice;      // held-out documents at random | the tail (val_split.h)
        double val_fraction;             // last fraction of the tokens held out
        int seq_len;                     // T
        int batch_size;                  // B
    } data;
    struct {
        int steps;                       // optimizer steps
        ConfigOptimizer optimizer;       // adamw | sgd
        double lr, min_lr;               // peak and final learning rate
        int warmup_steps;                // -1: warmup_fraction x steps
        double warmup_fraction;
        double weight_decay;
        double beta1, beta2, adam_eps;   // AdamW
        double momentum;                 // SGD
        double grad_clip;                // global-norm clip; 0 = off
        int accum_steps;                 // micro-batches per step
        int eval_every, eval_batches;
        int checkpoint_every, log_every;
        int64_t seed;
        char run_dir[CONFIG_STR_MAX];
        int threads;                     // 0 = OpenMP default
        int gemm;                        // GemmBackend (blas.h): auto | openblas | onednn
        int precision;                   // GemmPrecision (blas.h): fp32 | bf16
        int bf16_tiles;                  // Bf16Tiles (tile_amx.h): auto | amx | avx512bf16 | fp32
        int zero;                        // under MPI: 1 shards the optimizer state across ranks (ZeRO-1)
        double dist_timeout;             // under MPI: seconds a collective may wait before the job is ended
        int dist_bucket_kb;              // under MPI: gradient bucket size (0: 1/16 of the gradient, 256 KiB-16 MiB)
        bool carry_state;                // rows read streams; recurrent states carried across windows
        int device;                      // Device (device.h): cpu | cuda
        int cuda_graph;                  // ConfigCudaGraph: auto | on | off (docs/cuda.md "CUDA graphs")
    } train;
    struct {
        FinetuneMode mode;               // none | indexer | sparse
        char init_from[CONFIG_STR_MAX];  // checkpoint to start from ("" = none)
        ConfigInts dsa_layers;           // attn layers that get an indexer; empty = every attn layer
        bool restore_optimizer;          // mode = none: init_from's optimizer state too
    } finetune;

    // Bookkeeping (not config keys).
    char *text;                  // raw text of the last file/string loaded (malloc'd) or NULL
    char source[CONFIG_STR_MAX]; // its path (or the name given to config_load_string)
    int origin[CONFIG_MAX_KEYS]; // per schema row: 0 default, >0 line in `source`, -1 --set
    MixerNameCheck check_mixer;  // NULL = the mixer registry (mixer_kind_find)
    int vocab_size;              // the tokenizer's, once a program knows it (0: the byte tokenizer's 256)
} TrainConfig;

// Fill every key with its default. Must be called first; config_free later.
void config_defaults(TrainConfig *cfg, MixerNameCheck check_mixer);
void config_free(TrainConfig *cfg);
// Read and parse an INI file over the current values; keeps its text.
Status config_load_file(TrainConfig *cfg, const char *path);
// Parse INI text (e.g. the config stored in a checkpoint); `source` names it
// in error messages.
Status config_load_string(TrainConfig *cfg, const char *text, const char *source);
// Apply one override "section.key=value" with the same validation.
Status config_set(TrainConfig *cfg, const char *assignment);
// The same; *key_index (may be NULL) receives the key's index (config_key_ref).
Status config_set_key(TrainConfig *cfg, const char *assignment, int *key_index);
// Cross-key checks (min_lr <= lr, dsa_layers inside the model, ...), every
// constraint the layers assert (lm_config_check of config_model's LMConfig), and that every value survives
// being written by config_dump and read back. Call after the file and the
// overrides; errors name where the key was set (file:line, --set, default).
Status config_validate(const TrainConfig *cfg);

// The LMConfig the [model] section describes (vocabulary: cfg->vocab_size,
// or the byte tokenizer's when 0). An error names a mixer this program lacks.
Status config_model(const TrainConfig *cfg, LMConfig *lc);

// The warm-up steps a run uses: warmup_steps, or warmup_fraction x steps.
int config_warmup_steps(const TrainConfig *cfg);
// Why this config cannot train with CUDA graphs ([train] cuda_graph), or
// NULL when it can: not on a GPU, a build without CUDA, or a mode whose step
// reads device values on the host (DSA's selection and KL). cuda_graph = on
// with a reason is a config error; auto means off then. (More than one MPI
// rank is refused by the trainer, which knows the ranks.)
const char *config_cuda_graph_refusal(const TrainConfig *cfg);

// The keys one by one (e.g. to compare two configs): i in [0, config_n_keys()).
typedef struct ConfigKeyRef {
    const char *section, *key;
    bool resumable;      // train --resume may change it with --set
    bool arch;           // [model]: defines the trained function (a checkpoint's must be kept)
} ConfigKeyRef;
int config_n_keys(void);
ConfigKeyRef config_key_ref(int i);
// Key i's value as config_dump writes it.
void config_format_key(const TrainConfig *cfg, int i, char *out, size_t n);
// Where key i was set: "x.ini:7", "--set" or "default" (written into buf).
const char *config_key_where(const TrainConfig *cfg, int i, char *buf, size_t n);
// Was key i set by the file or --set (not left at its default)?
#define config_key_explicit(cfg, i) ((cfg)->origin[i] != 0)

// Where bundled configs are looked up by name (with config_find): the
// current directory, the source tree, and the install prefix's share/attnlab.
extern const char *const CONFIG_SEARCH_DIRS[];
extern const int CONFIG_N_SEARCH_DIRS;

// Resolve a config name: `name` itself if it exists; otherwise, when it has
// no '/', <dir>/configs/<name> and <dir>/configs/<name>.ini for each of the
// `ndirs` base dirs in order. Writes the path found into out.
Status config_find(const char *name, const char *const *dirs, int ndirs, char *out, size_t out_size);

// Print the schema as --help text: one line per key with type, default,
// range/choices and help.
void config_help(FILE *f);
// Write the effective config as INI text that config_load_string reads back
// to the same values.
void config_dump(const TrainConfig *cfg, FILE *f);
char *config_dump_string(const TrainConfig *cfg);   // malloc'd, free()

const char *config_form_name(MixerForm f);
const char *config_finetune_name(FinetuneMode m);

#endif
