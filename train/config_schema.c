// config_schema.c: the schema of every config key (one row each: section,
// key, type, default, range or choices, help), and parsing and formatting of
// one value by its row. config.c reads INI text through it.
#include "config_schema.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const TYPE_NAMES[KEY_COUNT] = {"int", "int", "float", "bool", "string", "enum",
                                                   "list", "list"};

#define OFF(sec, field) offsetof(TrainConfig, sec.field)
#define BIG 1e300

const ConfigKey CONFIG_SCHEMA[] = {
    {"model", "layers", KEY_NAMES, OFF(model, layers), "attn,gdn", 1, CONFIG_MAX_LAYERS, NULL, "mixers",
     "comma list of mixer names, one per layer (attn, linear, mamba, gdn, attn_dsa, mamba2, gdp, kda)",
     KEYF_ARCH},
    {"model", "d_model", KEY_INT, OFF(model, d_model), "128", 1, 1 << 16, NULL, "dim,width", "model width D", KEYF_ARCH},
    {"model", "n_heads", KEY_INT, OFF(model, n_heads), "4", 1, 1024, NULL, "heads", "heads H", KEYF_ARCH},
    {"model", "d_k", KEY_INT, OFF(model, d_k), "32", 1, 4096, NULL, "head_dim,dk", "key/query head size", KEYF_ARCH},
    {"model", "d_v", KEY_INT, OFF(model, d_v), "32", 1, 4096, NULL, "dv", "value head size", KEYF_ARCH},
    {"model", "d_ff", KEY_INT, OFF(model, d_ff), "512", 1, 1 << 20, NULL, "ffn_dim,hidden", "MLP hidden width", KEYF_ARCH},
    {"model", "tied_embeddings", KEY_BOOL, OFF(model, tied_embeddings), "true", 0, 0, NULL, "tie_embeddings",
     "output projection shares the embedding matrix", KEYF_ARCH},
    {"model", "chunk_size", KEY_INT, OFF(model, chunk_size), "32", 1, 4096, NULL, "chunk",
     "chunk length C of the chunked forms"},
    {"model", "conv_size", KEY_INT, OFF(model, conv_size), "4", 0, 64, NULL, "conv", "short convolution width (0 = no convolution)", KEYF_ARCH},
    {"model", "norm_eps", KEY_FLOAT, OFF(model, norm_eps), "1e-6", 0, 1, NULL, "eps", "RMSNorm epsilon", KEYF_ARCH},
    {"model", "rope_base", KEY_FLOAT, OFF(model, rope_base), "10000", 1, BIG, NULL, "rope_theta", "RoPE base", KEYF_ARCH},
    {"model", "index_heads", KEY_INT, OFF(model, index_heads), "4", 1, 1024, NULL, NULL,
     "DSA indexer heads H_I", KEYF_ARCH},
    {"model", "index_dim", KEY_INT, OFF(model, index_dim), "16", 1, 4096, NULL, NULL,
     "DSA indexer head size d_I", KEYF_ARCH},
    {"model", "topk", KEY_INT, OFF(model, topk), "64", 1, 1 << 24, NULL, "top_k", "DSA positions kept per query", KEYF_ARCH},
    {"model", "qk_norm", KEY_BOOL, OFF(model, qk_norm), "false", 0, 0, NULL, NULL,
     "attn, attn_dsa: RMSNorm of each head of q and k (one learned gain of d_k) before RoPE, as Qwen3; no effect on "
     "other mixers", KEYF_ARCH},
    {"model", "attn_gate", KEY_BOOL, OFF(model, attn_gate), "false", 0, 0, NULL, NULL,
     "attn, attn_dsa: the attention output times sigmoid(u W_gate) before Wo, as Qwen3-Next; no effect on other "
     "mixers", KEYF_ARCH},
    {"model", "gdp_steps", KEY_INT, OFF(model, gdp_steps), "2", 1, GDP_MAX_STEPS, NULL, "num_householder",
     "gdp: delta-rule steps per token n_h (each with its own key, value and beta); only with a gdp layer",
     KEYF_ARCH},
    {"model", "kda_gate_bias", KEY_BOOL, OFF(model, kda_gate_bias), "true", 0, 0, NULL, NULL,
     "kda: a bias b_g2 in the output gate, sigmoid((u W_g1) W_g2 + b_g2), as fla's KimiDeltaAttention; false: "
     "no bias, as Kimi Linear (and llama.cpp's kimi-linear); only with a kda layer", KEYF_ARCH},
    {"model", "form", KEY_ENUM, OFF(model, form), "chunked", 0, 0, "chunked|parallel|recurrent", "mode",
     "mixer implementation used for training"},

    {"data", "corpus", KEY_STRING, OFF(data, corpus), "cache/kjv.txt", 0, 0, NULL,
     "path,file,files,dir",
     "a text file, a comma list of files, or a directory (relative paths in a config file: to its folder)",
     KEYF_PATH},
    {"data", "cache_dir", KEY_STRING, OFF(data, cache_dir), "cache", 0, 0, NULL, "cache",
     "directory for token caches", KEYF_PATH},
    {"data", "tokenizer", KEY_STRING, OFF(data, tokenizer), "byte", 0, 0, NULL, "vocab,encoding",
     "byte, a tiktoken encoding (gpt2, r50k_base, cl100k_base, o200k_base), bpe:N (a BPE of N ids trained on "
     "the corpus), or a tokenizer file", KEYF_PATH},
    {"data", "documents", KEY_STRING, OFF(data, documents), "none", 0, 0, NULL, "docs,doc_sep",
     "where documents start: none, files, blank_line, eot (the text <|endoftext|>) or text:SEP; every layer "
     "starts fresh at a document start"},
    {"data", "order", KEY_ENUM, OFF(data, order), "random", 0, 0, "random|streams", "sampling",
     "training windows at random starts, or each batch row reading one contiguous stream window after window "
     "(carry_state needs streams)"},
    {"data", "val_fraction", KEY_FLOAT, OFF(data, val_fraction), "0.05", 0, 0.9, NULL, "val_split,validation",
     "fraction of the tokens held out for validation"},
    {"data", "val_choice", KEY_ENUM, OFF(data, val_choice), "documents", 0, 0, "documents|tail", "val_docs,holdout",
     "which tokens are held out: whole documents drawn at random (seeded by [train] seed; with documents only, "
     "else the tail), or the last val_fraction of the tokens"},
    {"data", "seq_len", KEY_INT, OFF(data, seq_len), "256", 1, 1 << 20, NULL, "block_size,context,T",
     "training window length T"},
    {"data", "batch_size", KEY_INT, OFF(data, batch_size), "16", 1, 1 << 16, NULL, "batch,B", "windows per batch B"},

    {"train", "steps", KEY_INT, OFF(train, steps), "2000", 0, 2e9, NULL, "max_steps,iters,iterations",
     "optimizer steps", KEYF_RESUMABLE},
    {"train", "optimizer", KEY_ENUM, OFF(train, optimizer), "adamw", 0, 0, "adamw|sgd", "optim,opt", "optimizer"},
    {"train", "lr", KEY_FLOAT, OFF(train, lr), "1e-3", 0, 10, NULL, "learning_rate,max_lr",
     "peak learning rate (after warm-up)"},
    {"train", "min_lr", KEY_FLOAT, OFF(train, min_lr), "1e-4", 0, 10, NULL, "final_lr",
     "learning rate at the last step (cosine decay)"},
    {"train", "warmup_steps", KEY_INT, OFF(train, warmup_steps), "-1", -1, 2e9, NULL, "warmup",
     "linear warm-up steps (-1: warmup_fraction of steps)"},
    {"train", "warmup_fraction", KEY_FLOAT, OFF(train, warmup_fraction), "0.05", 0, 1, NULL, "warmup_ratio",
     "linear warm-up as a fraction of steps, when warmup_steps = -1"},
    {"train", "weight_decay", KEY_FLOAT, OFF(train, weight_decay), "0.1", 0, 10, NULL, "wd",
     "decoupled weight decay (not on norm gains, biases, A_log, dt_bias, D)"},
    {"train", "beta1", KEY_FLOAT, OFF(train, beta1), "0.9", 0, 0.999999, NULL, NULL, "AdamW beta1"},
    {"train", "beta2", KEY_FLOAT, OFF(train, beta2), "0.95", 0, 0.999999, NULL, NULL, "AdamW beta2"},
    {"train", "adam_eps", KEY_FLOAT, OFF(train, adam_eps), "1e-8", 0, 1, NULL, "eps,epsilon", "AdamW epsilon"},
    {"train", "momentum", KEY_FLOAT, OFF(train, momentum), "0.9", 0, 0.999999, NULL, NULL, "SGD momentum"},
    {"train", "grad_clip", KEY_FLOAT, OFF(train, grad_clip), "1.0", 0, BIG, NULL, "clip,max_grad_norm",
     "global gradient-norm clip (0 = off)"},
    {"train", "accum_steps", KEY_INT, OFF(train, accum_steps), "1", 1, 1 << 16, NULL,
     "grad_accum,gradient_accumulation_steps", "micro-batches accumulated per step"},
    {"train", "eval_every", KEY_INT, OFF(train, eval_every), "200", 0, 2e9, NULL, "eval_interval",
     "steps between validation runs (0 = never)", KEYF_RESUMABLE},
    {"train", "eval_batches", KEY_INT, OFF(train, eval_batches), "8", 1, 1 << 20, NULL, "eval_iters",
     "validation batches per evaluation", KEYF_RESUMABLE},
    {"train", "checkpoint_every", KEY_INT, OFF(train, checkpoint_every), "500", 0, 2e9, NULL,
     "save_every,ckpt_every", "steps between checkpoints (0 = only at the end)", KEYF_RESUMABLE},
    {"train", "log_every", KEY_INT, OFF(train, log_every), "10", 1, 2e9, NULL, "log_interval",
     "steps between log lines", KEYF_RESUMABLE},
    {"train", "seed", KEY_I64, OFF(train, seed), "1337", 0, 9.2e18, NULL, "random_seed", "random seed"},
    {"train", "run_dir", KEY_STRING, OFF(train, run_dir), "", 0, 0, NULL, "out_dir,output_dir",
     "directory for logs and checkpoints (\"\" = runs/<config name> in the current directory)", KEYF_PATH},
    {"train", "threads", KEY_INT, OFF(train, threads), "0", 0, 1024, NULL, "num_threads,omp_threads",
     "OpenMP threads (0 = OMP_NUM_THREADS, else every core)", KEYF_RESUMABLE},
    {"train", "gemm", KEY_ENUM, OFF(train, gemm), "auto", 0, 0, "auto|openblas|onednn", "blas,backend",
     "matrix product backend (auto: oneDNN where OpenBLAS's kernels lag the CPU, else the faster)", KEYF_RESUMABLE},
    {"train", "precision", KEY_ENUM, OFF(train, precision), "fp32", 0, 0, "fp32|bf16|tf32", "dtype,amp",
     "dense layers' products: fp32, or bf16 with fp32 sums (float32 build; an AVX512_BF16 CPU, or the GPU's "
     "tensor cores), or tf32 (the GPU's tensor cores, device = cuda)", KEYF_RESUMABLE},
    {"train", "bf16_tiles", KEY_ENUM, OFF(train, bf16_tiles), "auto", 0, 0, "auto|amx|avx512bf16|fp32", NULL,
     "attention's tile products under precision = bf16 on the CPU: amx (AMX tiles), avx512bf16 (vdpbf16ps), fp32 "
     "(float32 tiles: the attention's operands not rounded), auto (amx where the CPU and OS have it, else "
     "avx512bf16); a run keeps what auto chose", KEYF_RESUMABLE},
    {"train", "zero", KEY_INT, OFF(train, zero), "0", 0, 1, NULL, "zero_stage",
     "under mpirun: 1 shards the optimizer state across the ranks (ZeRO-1)", KEYF_RESUMABLE},
    {"train", "dist_timeout", KEY_FLOAT, OFF(train, dist_timeout), "300", 1, 1e6, NULL, "mpi_timeout",
     "under mpirun: seconds a rank waits for the others before it ends the job", KEYF_RESUMABLE},
    {"train", "dist_bucket_kb", KEY_INT, OFF(train, dist_bucket_kb), "0", 0, 1 << 20, NULL, "bucket_kb",
     "under mpirun: KiB of gradient reduced per collective (0: 1/16 of it, 256 KiB to 16 MiB)", KEYF_RESUMABLE},
    {"train", "device", KEY_ENUM, OFF(train, device), "cpu", 0, 0, "cpu|cuda", NULL,
     "where the step runs: cpu, or cuda (a build with AG_CUDA and a GPU; docs/cuda.md)", KEYF_RESUMABLE},
    {"train", "cuda_graph", KEY_ENUM, OFF(train, cuda_graph), "auto", 0, 0, "auto|on|off", "cuda_graphs",
     "replay each micro-batch's forward and backward from a CUDA graph (device = cuda; auto: where supported)",
     KEYF_RESUMABLE},
    {"train", "carry_state", KEY_BOOL, OFF(train, carry_state), "false", 0, 0, NULL, "tbptt,stateful",
     "each batch row reads one stream, window after window; recurrent layers start each window from the "
     "state the last one ended in (detached)"},

    {"finetune", "mode", KEY_ENUM, OFF(finetune, mode), "none", 0, 0, "none|indexer|sparse", "finetune",
     "none, indexer (distil the DSA indexer, rest frozen) or sparse (train with sparse attention)"},
    {"finetune", "init_from", KEY_STRING, OFF(finetune, init_from), "", 0, 0, NULL, "checkpoint,init,resume",
     "checkpoint whose parameters start the run (\"\" = none); with mode = none the run continues "
     "training that model (on this config's data)", KEYF_PATH},
    {"finetune", "restore_optimizer", KEY_BOOL, OFF(finetune, restore_optimizer), "false", 0, 0, NULL,
     "load_optimizer,resume_optimizer",
     "with mode = none: also restore init_from's optimizer moments and step (else the optimizer starts fresh)"},
    {"finetune", "dsa_layers", KEY_INTS, OFF(finetune, dsa_layers), "", 0, CONFIG_MAX_LAYERS - 1, NULL,
     "layers", "attn layers that get a DSA indexer (empty = every attn layer)"},
};
const int CONFIG_N_KEYS = (int)(sizeof CONFIG_SCHEMA / sizeof CONFIG_SCHEMA[0]);
_Static_assert(sizeof CONFIG_SCHEMA / sizeof CONFIG_SCHEMA[0] <= CONFIG_MAX_KEYS, "raise CONFIG_MAX_KEYS");

static const char *const SECTIONS[] = {"model", "data", "train", "finetune"};
#define N_SECTIONS 4

// ---------------------------------------------------------------- lookup

const ConfigKey *schema_find(const char *section, const char *key) {
    for (int i = 0; i < CONFIG_N_KEYS; i++)
        if (!strcmp(CONFIG_SCHEMA[i].section, section) && !strcmp(CONFIG_SCHEMA[i].key, key)) return &CONFIG_SCHEMA[i];
    return NULL;
}

bool schema_section_known(const char *s) {
    for (int i = 0; i < N_SECTIONS; i++)
        if (!strcmp(SECTIONS[i], s)) return true;
    return false;
}

static int edit_distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = imin(sub, imin(del, ins));
        }
    return d[la][lb];
}

static bool close_enough(const char *typed, const char *name) {
    int d = edit_distance(typed, name);
    int len = (int)strlen(name);
    return d <= imax(1, imin(3, len / 3)) || (d <= 2 && len >= 4);
}

// Does `typed` look like `name` or one of the comma-separated aliases?
static bool resembles(const char *typed, const char *name, const char *aliases) {
    if (close_enough(typed, name)) return true;
    if (!aliases) return false;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", aliases);
    for (char *save = NULL, *a = strtok_r(buf, ",", &save); a; a = strtok_r(NULL, ",", &save))
        if (close_enough(typed, a)) return true;
    return false;
}

// A hint for an unknown key, e.g. " (did you mean lr?)" or " (it belongs in [data])".
void schema_key_hint(const char *section, const char *key, char *out, size_t n) {
    out[0] = 0;
    for (int i = 0; i < CONFIG_N_KEYS; i++)
        if (!strcmp(CONFIG_SCHEMA[i].section, section) && resembles(key, CONFIG_SCHEMA[i].key, CONFIG_SCHEMA[i].alias)) {
            snprintf(out, n, " (did you mean %s?)", CONFIG_SCHEMA[i].key);
            return;
        }
    for (int i = 0; i < CONFIG_N_KEYS; i++)
        if (!strcmp(CONFIG_SCHEMA[i].key, key)) {
            snprintf(out, n, " (it belongs in [%s])", CONFIG_SCHEMA[i].section);
            return;
        }
    for (int i = 0; i < CONFIG_N_KEYS; i++)
        if (resembles(key, CONFIG_SCHEMA[i].key, CONFIG_SCHEMA[i].alias)) {
            snprintf(out, n, " (did you mean [%s] %s?)", CONFIG_SCHEMA[i].section, CONFIG_SCHEMA[i].key);
            return;
        }
}

void schema_section_hint(const char *section, char *out, size_t n) {
    out[0] = 0;
    for (int i = 0; i < N_SECTIONS; i++)
        if (close_enough(section, SECTIONS[i])) {
            snprintf(out, n, " (did you mean [%s]?)", SECTIONS[i]);
            return;
        }
    snprintf(out, n, " (sections: [model] [data] [train] [finetune])");
}

// ---------------------------------------------------------------- values

// Without a checker of the program's own, the kinds' registry (mixer.h)
// says which names exist: the built-in ones and any mixer_kind_register added.
static bool mixer_known(const TrainConfig *cfg, const char *name) {
    if (cfg->check_mixer) return cfg->check_mixer(name);
    return mixer_kind_find(name) != NULL;
}

char *schema_trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n')) *--e = 0;
    return s;
}

static bool parse_i64(const char *v, int64_t *out) {
    if (!*v) return false;
    errno = 0;
    char *end;
    long long x = strtoll(v, &end, 10);
    if (errno || *end) return false;
    *out = x;
    return true;
}

static bool in_range(const ConfigKey *k, double x, char *err, size_t n) {
    if (x < k->min || x > k->max) {
        if (k->max >= BIG) snprintf(err, n, "%.17g is out of range (at least %g)", x, k->min);
        else snprintf(err, n, "%.17g is out of range [%g, %g]", x, k->min, k->max);
        return false;
    }
    return true;
}

// Parse `value` for key k into cfg. On failure write the reason into err.
bool schema_set_value(TrainConfig *cfg, const ConfigKey *k, const char *value, char *err, size_t n) {
    void *dst = (char *)cfg + k->offset;
    char buf[CONFIG_STR_MAX];
    if (strlen(value) >= sizeof buf) {
        snprintf(err, n, "value is longer than %d characters", CONFIG_STR_MAX - 1);
        return false;
    }
    snprintf(buf, sizeof buf, "%s", value);
    char *v = schema_trim(buf);
    switch (k->type) {
    case KEY_INT:
    case KEY_I64: {
        int64_t x;
        if (!parse_i64(v, &x)) {
            snprintf(err, n, "'%s' is not an integer", v);
            return false;
        }
        if (!in_range(k, (double)x, err, n)) return false;
        if (k->type == KEY_INT) *(int *)dst = (int)x;
        else *(int64_t *)dst = x;
        return true;
    }
    case KEY_FLOAT: {
        char *end;
        errno = 0;
        double x = *v ? strtod(v, &end) : 0;
        if (!*v || *end || errno == ERANGE || !isfinite(x)) {
            snprintf(err, n, "'%s' is not a finite number", v);
            return false;
        }
        if (!in_range(k, x, err, n)) return false;
        *(double *)dst = x;
        return true;
    }
    case KEY_BOOL: {
        static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
        for (int i = 0; i < 4; i++) {
            if (!strcasecmp(v, yes[i])) return *(bool *)dst = true, true;
            if (!strcasecmp(v, no[i])) return *(bool *)dst = false, true;
        }
        snprintf(err, n, "'%s' is not a bool (true/false, yes/no, on/off, 1/0)", v);
        return false;
    }
    case KEY_STRING:
        for (const char *c = v; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) {
                snprintf(err, n, "contains the control character 0x%02x at offset %d (a value is one line of text)",
                         (unsigned char)*c, (int)(c - v));
                return false;
            }
        snprintf((char *)dst, CONFIG_STR_MAX, "%s", v);
        return true;
    case KEY_ENUM: {
        char choices[256];
        snprintf(choices, sizeof choices, "%s", k->choices);
        int idx = 0;
        for (char *save = NULL, *c = strtok_r(choices, "|", &save); c; c = strtok_r(NULL, "|", &save), idx++)
            if (!strcmp(c, v)) return *(int *)dst = idx, true;
        snprintf(err, n, "'%s' is not one of %s", v, k->choices);
        return false;
    }
    case KEY_NAMES:
    case KEY_INTS: {
        ConfigNames names = {0};
        ConfigInts ints = {0};
        int count = 0;
        if (*v) {
            for (char *p = v;;) {
                char *comma = strchr(p, ',');
                if (comma) *comma = 0;
                char *item = schema_trim(p);
                if (count == CONFIG_MAX_LAYERS) {
                    snprintf(err, n, "more than %d items", CONFIG_MAX_LAYERS);
                    return false;
                }
                if (!*item) {
                    snprintf(err, n, "empty item %d in the list", count + 1);
                    return false;
                }
                if (k->type == KEY_NAMES) {
                    if (strlen(item) >= CONFIG_NAME_MAX || !mixer_known(cfg, item)) {
                        if (cfg->check_mixer) snprintf(err, n, "'%s' is not a known mixer", item);
                        else snprintf(err, n, "'%s' is not a known mixer (%s)", item, mixer_kind_names());
                        return false;
                    }
                    snprintf(names.name[count], CONFIG_NAME_MAX, "%s", item);
                } else {
                    int64_t x;
                    if (!parse_i64(item, &x)) {
                        snprintf(err, n, "item '%s' is not an integer", item);
                        return false;
                    }
                    if (!in_range(k, (double)x, err, n)) return false;
                    ints.v[count] = (int)x;
                }
                count++;
                if (!comma) break;
                p = comma + 1;
            }
        }
        if (k->type == KEY_NAMES) {
            if (count < (int)k->min) {
                snprintf(err, n, "needs at least %d item(s)", (int)k->min);
                return false;
            }
            names.n = count;
            *(ConfigNames *)dst = names;
        } else {
            ints.n = count;
            *(ConfigInts *)dst = ints;
        }
        return true;
    }
    default: FAIL("config: key [%s] %s has unknown type %d", k->section, k->key, k->type);
    }
}

// Shortest text that reads back as exactly x.
static void format_double(double x, char *out, size_t n) {
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(out, n, "%.*g", prec, x);
        if (strtod(out, NULL) == x) return;
    }
}

void schema_format_value(const TrainConfig *cfg, const ConfigKey *k, char *out, size_t n) {
    const void *src = (const char *)cfg + k->offset;
    out[0] = 0;
    switch (k->type) {
    case KEY_INT: snprintf(out, n, "%d", *(const int *)src); break;
    case KEY_I64: snprintf(out, n, "%lld", (long long)*(const int64_t *)src); break;
    case KEY_FLOAT: format_double(*(const double *)src, out, n); break;
    case KEY_BOOL: snprintf(out, n, "%s", *(const bool *)src ? "true" : "false"); break;
    case KEY_STRING: snprintf(out, n, "%s", (const char *)src); break;
    case KEY_ENUM: {
        int idx = *(const int *)src;
        const char *c = k->choices;
        for (int i = 0; i < idx && c; i++) c = strchr(c, '|') ? strchr(c, '|') + 1 : NULL;
        size_t len = c ? strcspn(c, "|") : 1;
        snprintf(out, n, "%.*s", (int)len, c ? c : "?");
        break;
    }
    case KEY_NAMES:
    case KEY_INTS: {
        size_t used = 0;
        int count = k->type == KEY_NAMES ? ((const ConfigNames *)src)->n : ((const ConfigInts *)src)->n;
        for (int i = 0; i < count && used < n; i++) {
            if (k->type == KEY_NAMES)
                used += snprintf(out + used, n - used, "%s%s", i ? "," : "", ((const ConfigNames *)src)->name[i]);
            else
                used += snprintf(out + used, n - used, "%s%d", i ? "," : "", ((const ConfigInts *)src)->v[i]);
        }
        break;
    }
    default: FAIL("config: key [%s] %s has unknown type %d", k->section, k->key, k->type);
    }
}

void config_help(FILE *f) {
    fprintf(f, "Config keys (set in the INI file or with --set section.key=value):\n");
    const char *section = "";
    for (int i = 0; i < CONFIG_N_KEYS; i++) {
        const ConfigKey *k = &CONFIG_SCHEMA[i];
        if (strcmp(section, k->section)) fprintf(f, "[%s]\n", section = k->section);
        char range[96] = "";
        if (k->type == KEY_ENUM) snprintf(range, sizeof range, " %s", k->choices);
        else if (k->type == KEY_FLOAT) {
            if (k->max >= BIG) snprintf(range, sizeof range, " >= %g", k->min);
            else snprintf(range, sizeof range, " in [%g, %g]", k->min, k->max);
        } else if (k->type == KEY_INT || k->type == KEY_I64 || k->type == KEY_INTS) {
            snprintf(range, sizeof range, " in [%lld, %lld]", (long long)k->min, (long long)k->max);
        }
        fprintf(f, "  %-17s %-6s default %-10s%s\n      %s\n", k->key, TYPE_NAMES[k->type],
                *k->def ? k->def : "\"\"", range, k->help);
    }
}

const char *config_form_name(MixerForm form) {
    return mixer_form_name(form);
}

const char *config_finetune_name(FinetuneMode m) {
    static const char *names[FT_COUNT] = {"none", "indexer", "sparse"};
    return (m >= 0 && m < FT_COUNT) ? names[m] : "?";
}
