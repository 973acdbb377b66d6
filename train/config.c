// config.c: the INI parser (libinih) over the key schema (config_schema.c),
// cross-key validation, finding bundled configs, and the dump of the
// effective config.
#include "config_schema.h"

#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_dir.h"
#include "fileio.h"
#include "documents.h"
#include "tokenizer.h"

// ---------------------------------------------------------------- parsing

typedef struct ParseCtx {
    TrainConfig *cfg;
    const char *source;   // file name for messages
    const char *p;        // next unread character of the text
    int line;             // 1-based line being parsed
    bool line_start;      // the reader is at the start of a line
    Status st;            // first error
    char **long_values;   // values of lines too long for libinih, handed to it as LONG_VALUE_MARK + index
    int n_long;
    int long_line;        // the line shorten_line last rewrote (0: none)
    const char *base_dir; // absolute folder of the config file: relative paths in it are relative to it (NULL: as written)
} ParseCtx;

// Debian's libinih reads lines of at most 200 bytes (its line buffer is fixed
// at build time), while a value may be a path of CONFIG_STR_MAX - 1
// characters. A longer "key = value" line is split here the way inih splits
// one (first '=' or ':', surrounding blanks dropped, an inline comment starts
// at a ';' after a blank), and inih gets "key = \x01<n>": control characters
// are never valid in a value, so the mark cannot clash with one.
#define LONG_VALUE_MARK '\x01'


static void ctx_error(ParseCtx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ctx_error(ParseCtx *c, const char *fmt, ...) {
    if (!c->st.ok) return;   // keep the first error
    char what[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    c->st = status_err("%s:%d: %s", c->source, c->line, what);
}

// Check a "[section]" header line as the reader hands it to inih: inih does
// not report sections without keys, and reports nothing about names.
static void check_header(ParseCtx *c, const char *line, size_t len) {
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t')) i++;
    if (i == len || line[i] != '[') return;
    const char *close = memchr(line + i, ']', len - i);
    if (!close) return;   // inih reports the syntax error
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)(close - line - i - 1), line + i + 1);
    char *s = schema_trim(name);
    if (!schema_section_known(s)) {
        char hint[96];
        schema_section_hint(s, hint, sizeof hint);
        ctx_error(c, "[%s]: unknown section%s", s, hint);
    }
}

static bool is_blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\r'; }

// A line too long for inih (len bytes at c->p, no newline): write the short
// form inih parses into str (of num bytes) and keep the value.
static void shorten_line(ParseCtx *c, char *str, int num, size_t len) {
    const char *s = c->p, *end = s + len;
    while (s < end && is_blank(*s)) s++;
    const char *delim = s;
    while (delim < end && *delim != '=' && *delim != ':') delim++;
    if (s == end || *s == ';' || *s == '#' || *s == '[' || delim == end || delim - s > 64) {
        if (s < end && (*s == ';' || *s == '#')) snprintf(str, (size_t)num, ";\n");   // a long comment
        else ctx_error(c, "line longer than %d characters that is not key = value", CONFIG_LINE_MAX);
        return;
    }
    const char *v = delim + 1, *ve = v;
    while (ve < end && !(*ve == ';' && ve > delim + 1 && is_blank(ve[-1]))) ve++;   // an inline comment
    while (v < ve && is_blank(*v)) v++;
    while (ve > v && is_blank(ve[-1])) ve--;
    c->long_values = xrealloc(c->long_values, (size_t)(c->n_long + 1) * sizeof *c->long_values);
    char *val = xmalloc((size_t)(ve - v) + 1);
    memcpy(val, v, (size_t)(ve - v));
    val[ve - v] = 0;
    c->long_values[c->n_long] = val;
    snprintf(str, (size_t)num, "%.*s= %c%d\n", (int)(delim - s), s, LONG_VALUE_MARK, c->n_long);
    c->n_long++;
    c->long_line = c->line;
}

// fgets-style reader over the text that counts lines for the handler.
static char *ctx_reader(char *str, int num, void *stream) {
    ParseCtx *c = stream;
    if (!*c->p) return NULL;
    size_t len = strcspn(c->p, "\n");
    bool whole = (int)len < num - 1;
    if (c->line_start) {
        c->line++;
        const char *cr = memchr(c->p, '\r', len);
        if (cr && cr + 1 < c->p + len)   // a CR that does not end the line (CRLF is fine)
            ctx_error(c, "carriage return inside a line: the file uses old Mac (CR) line endings or holds a "
                         "stray CR; convert it to LF line endings");
        if (len > CONFIG_LINE_MAX) ctx_error(c, "line longer than %d characters", CONFIG_LINE_MAX);
        check_header(c, c->p, len);
        if (!whole) {
            shorten_line(c, str, num, len);
            c->p += len + (c->p[len] == '\n');
            return str;
        }
        // Leading blanks dropped: inih would read an indented line as the
        // continuation of the previous key's value.
        while (len > 0 && (*c->p == ' ' || *c->p == '\t')) c->p++, len--;
        whole = (int)len < num - 1;
    }
    size_t take = whole ? len + (c->p[len] == '\n') : (size_t)num - 1;
    memcpy(str, c->p, take);
    str[take] = 0;
    c->p += take;
    c->line_start = take > 0 && str[take - 1] == '\n';
    return str;
}

// A relative path written in a config file names a file relative to that
// file's folder (as in a Makefile or a docker-compose.yml), so a config works
// from any directory; it is stored absolute. corpus is a comma list.
static bool resolve_paths(TrainConfig *cfg, const ConfigKey *k, const char *base, char *err, size_t n) {
    if (!(k->flags & KEYF_PATH) || !base) return true;
    char *dst = (char *)cfg + k->offset;
    if (dst == cfg->data.tokenizer && tokenizer_spec_is_named(dst, NULL)) return true;   // a name, not a file
    char in[CONFIG_STR_MAX], out[CONFIG_STR_MAX];
    snprintf(in, sizeof in, "%s", dst);
    size_t used = 0;
    out[0] = 0;
    for (char *save = NULL, *item = strtok_r(in, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        item = schema_trim(item);
        if (!*item) continue;
        int len = snprintf(out + used, sizeof out - used, "%s%s%s%s", used ? "," : "", item[0] == '/' ? "" : base,
                           item[0] == '/' ? "" : "/", item);
        if (len < 0 || used + (size_t)len >= sizeof out) {
            snprintf(err, n, "'%s' is longer than %d characters once made relative to the config's folder %s", dst,
                     CONFIG_STR_MAX - 1, base);
            return false;
        }
        used += (size_t)len;
    }
    snprintf(dst, CONFIG_STR_MAX, "%s", out);
    return true;
}

static int ctx_handler(void *user, const char *section, const char *name, const char *value) {
    ParseCtx *c = user;
    if (!c->st.ok) return 0;
    if (c->long_line == c->line && value[0] == LONG_VALUE_MARK) {   // this line was rewritten by shorten_line
        int i = atoi(value + 1);
        ASSERT(i >= 0 && i < c->n_long, "config: long value %d of %d", i, c->n_long);
        value = c->long_values[i];
    }
    if (!*section) {
        ctx_error(c, "%s: key outside any section (put it under [model], [data], [train] or [finetune])", name);
        return 0;
    }
    if (!schema_section_known(section)) {
        char hint[96];
        schema_section_hint(section, hint, sizeof hint);
        ctx_error(c, "[%s] %s: unknown section%s", section, name, hint);
        return 0;
    }
    const ConfigKey *k = schema_find(section, name);
    if (!k) {
        char hint[96];
        schema_key_hint(section, name, hint, sizeof hint);
        ctx_error(c, "[%s] %s: unknown key%s", section, name, hint);
        return 0;
    }
    int row = (int)(k - CONFIG_SCHEMA);
    if (c->cfg->origin[row] > 0) {
        ctx_error(c, "[%s] %s: duplicate key (first set on line %d)", section, name, c->cfg->origin[row]);
        return 0;
    }
    char err[700];
    if (!schema_set_value(c->cfg, k, value, err, sizeof err) || !resolve_paths(c->cfg, k, c->base_dir, err, sizeof err)) {
        ctx_error(c, "[%s] %s: %s", section, name, err);
        return 0;
    }
    c->cfg->origin[row] = c->line;
    return 1;
}

static Status load_text(TrainConfig *cfg, const char *text, const char *source, const char *base_dir) {
    // Lines set by an earlier file no longer count as duplicates.
    for (int i = 0; i < CONFIG_N_KEYS; i++)
        if (cfg->origin[i] > 0) cfg->origin[i] = 0;
    ParseCtx c = {.cfg = cfg, .source = source, .p = text, .line = 0, .line_start = true, .st = status_ok(),
                  .base_dir = base_dir};
    int r = ini_parse_stream(ctx_reader, &c, ctx_handler, &c);
    for (int i = 0; i < c.n_long; i++) free(c.long_values[i]);
    free(c.long_values);
    if (c.st.ok && r > 0) {
        c.line = r;
        ctx_error(&c, "syntax error (expected [section] or key = value)");
    }
    if (c.st.ok && r < 0) c.st = status_err("%s: out of memory while parsing", source);
    if (!c.st.ok) return c.st;
    size_t len = strlen(text) + 1;
    free(cfg->text);
    cfg->text = xmalloc(len);
    memcpy(cfg->text, text, len);
    snprintf(cfg->source, sizeof cfg->source, "%s", source);
    return status_ok();
}

Status config_load_string(TrainConfig *cfg, const char *text, const char *source) {
    return load_text(cfg, text, source, NULL);
}

Status config_load_file(TrainConfig *cfg, const char *path) {
    // The file's folder, absolute: relative paths in the file are relative to it.
    char base[CONFIG_STR_MAX], cwd[CONFIG_STR_MAX] = "";
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path) : 0;
    if (path[0] != '/' && !getcwd(cwd, sizeof cwd))
        return status_err("%s: cannot resolve the config's folder: %s", path, strerror(errno));
    int len = path[0] == '/' ? snprintf(base, sizeof base, "%.*s", dir_len ? dir_len : 1, path)
                             : snprintf(base, sizeof base, "%s%s%.*s", cwd, dir_len ? "/" : "", dir_len, path);
    if (len < 0 || len >= (int)sizeof base) return status_err("%s: the config's folder path is too long", path);
    uint8_t *buf;
    int64_t n;
    Status st = file_read_all(path, "config", CONFIG_TEXT_MAX, &buf, &n);
    if (!st.ok) return st;
    if ((int64_t)strlen((char *)buf) != n) st = status_err("%s: config contains a NUL byte (not a text file?)", path);
    else st = load_text(cfg, (char *)buf, path, strcmp(base, "/") ? base : "");
    free(buf);
    return st;
}

// Keys that say one thing two ways: a --set of one replaces what the file
// said with the other (it goes back to its default), as a --set replaces the
// file's value of its own key; both on the command line still collide.
static void set_replaces_file_twin(TrainConfig *cfg, const ConfigKey *k) {
    static const char *const TWINS[][3] = {{"train", "warmup_steps", "warmup_fraction"},
                                           {"train", "warmup_fraction", "warmup_steps"}};
    for (size_t i = 0; i < sizeof TWINS / sizeof TWINS[0]; i++) {
        if (strcmp(k->section, TWINS[i][0]) != 0 || strcmp(k->key, TWINS[i][1]) != 0) continue;
        const ConfigKey *twin = schema_find(TWINS[i][0], TWINS[i][2]);
        char err[300];
        if (twin && cfg->origin[twin - CONFIG_SCHEMA] > 0 && schema_set_value(cfg, twin, twin->def, err, sizeof err))
            cfg->origin[twin - CONFIG_SCHEMA] = 0;
    }
}

Status config_set(TrainConfig *cfg, const char *assignment) { return config_set_key(cfg, assignment, NULL); }

Status config_set_key(TrainConfig *cfg, const char *assignment, int *key_index) {
    char buf[CONFIG_STR_MAX + 128], shown[128];
    // Messages quote the assignment, shortened: a long value must not push the reason out of the message.
    snprintf(shown, sizeof shown, "%.100s%s", assignment, strlen(assignment) > 100 ? "..." : "");
    if (strlen(assignment) >= sizeof buf) return status_err("--set %s: too long", shown);
    snprintf(buf, sizeof buf, "%s", assignment);
    char *eq = strchr(buf, '=');
    char *dot = eq ? memchr(buf, '.', (size_t)(eq - buf)) : NULL;
    if (!eq || !dot) return status_err("--set %s: expected section.key=value", shown);
    *eq = 0;
    *dot = 0;
    char *section = schema_trim(buf), *key = schema_trim(dot + 1), *value = eq + 1;
    char hint[96];
    if (!schema_section_known(section)) {
        schema_section_hint(section, hint, sizeof hint);
        return status_err("--set %s: [%s] %s: unknown section%s", shown, section, key, hint);
    }
    const ConfigKey *k = schema_find(section, key);
    if (!k) {
        schema_key_hint(section, key, hint, sizeof hint);
        return status_err("--set %s: [%s] %s: unknown key%s", shown, section, key, hint);
    }
    char err[700];
    if (!schema_set_value(cfg, k, value, err, sizeof err))
        return status_err("--set %s: [%s] %s: %s", shown, section, key, err);
    cfg->origin[k - CONFIG_SCHEMA] = -1;
    if (key_index) *key_index = (int)(k - CONFIG_SCHEMA);
    set_replaces_file_twin(cfg, k);
    return status_ok();
}

void config_defaults(TrainConfig *cfg, MixerNameCheck check_mixer) {
    memset(cfg, 0, sizeof *cfg);
    cfg->check_mixer = check_mixer;
    for (int i = 0; i < CONFIG_N_KEYS; i++) {
        char err[300];
        // The layers default uses fixed names; a custom checker may reject them
        // only if it does not know attn/gdn, which is a programming error.
        ASSERT(schema_set_value(cfg, &CONFIG_SCHEMA[i], CONFIG_SCHEMA[i].def, err, sizeof err), "config default [%s] %s: %s",
               CONFIG_SCHEMA[i].section, CONFIG_SCHEMA[i].key, err);
    }
}

void config_free(TrainConfig *cfg) {
    free(cfg->text);
    cfg->text = NULL;
}

// Where a key was set, for cross-key messages: "x.ini:7", "--set" or "default".
static const char *origin_str(const TrainConfig *cfg, const char *section, const char *key, char *buf,
                              size_t n) {
    int o = cfg->origin[schema_find(section, key) - CONFIG_SCHEMA];
    if (o > 0) snprintf(buf, n, "%s:%d", cfg->source, o);
    else snprintf(buf, n, "%s", o < 0 ? "--set" : "default");
    return buf;
}
#define WHERE(sec, key) origin_str(cfg, sec, key, (char[CONFIG_STR_MAX + 16]){0}, CONFIG_STR_MAX + 16)

const char *config_cuda_graph_refusal(const TrainConfig *cfg) {
    if (cfg->train.device != DEVICE_CUDA) return "graphs need device = cuda";
    if (!device_cuda_built()) return "this build has no CUDA backend";
    if (cfg->finetune.mode != FT_NONE)
        return "indexer and sparse fine-tuning read the DSA selection and KL on the host inside the step";
    for (int i = 0; i < cfg->model.layers.n; i++)
        if (!strcmp(cfg->model.layers.name[i], "attn_dsa"))
            return "attn_dsa layers read their selection on the host inside the step";
    return NULL;
}

int config_warmup_steps(const TrainConfig *cfg) {
    if (cfg->train.warmup_steps >= 0) return cfg->train.warmup_steps;
    return (int)floor(cfg->train.warmup_fraction * cfg->train.steps + 0.5);
}

// Every value written out by config_dump must read back the same: write the
// config, parse it into a fresh one and compare key by key.
static Status check_round_trip(const TrainConfig *cfg) {
    char *text = config_dump_string(cfg);
    TrainConfig back;
    config_defaults(&back, cfg->check_mixer);
    Status s = config_load_string(&back, text, "(the config as written to config.ini)");
    free(text);
    for (int i = 0; s.ok && i < CONFIG_N_KEYS; i++) {
        const ConfigKey *k = &CONFIG_SCHEMA[i];
        char a[CONFIG_STR_MAX + 64], b[CONFIG_STR_MAX + 64];
        schema_format_value(cfg, k, a, sizeof a);
        schema_format_value(&back, k, b, sizeof b);
        if (strcmp(a, b) != 0)
            s = status_err("%s: [%s] %s: the value '%s' would not read back from config.ini as written (it reads "
                           "'%s'; INI text treats ' ;' as a comment)",
                           WHERE(k->section, k->key), k->section, k->key, a, b);
    }
    config_free(&back);
    return s;
}

Status config_model(const TrainConfig *tc, LMConfig *lc) {
    memset(lc, 0, sizeof *lc);
    lc->vocab_size = tc->vocab_size > 0 ? tc->vocab_size : TOKENIZER_BYTE_VOCAB;
    lc->d_model = tc->model.d_model;
    lc->d_ff = tc->model.d_ff;
    lc->tied = tc->model.tied_embeddings;
    lc->norm_eps = tc->model.norm_eps;
    if (tc->model.layers.n > LM_MAX_LAYERS) return status_err("[model] layers: more than %d layers", LM_MAX_LAYERS);
    lc->n_layers = tc->model.layers.n;
    for (int l = 0; l < lc->n_layers; l++) {
        if (!mixer_kind_find(tc->model.layers.name[l]))
            return status_err("[model] layers: mixer '%s' is not built into this program (known: %s)",
                              tc->model.layers.name[l], mixer_kind_names());
        snprintf(lc->layers[l], sizeof lc->layers[l], "%s", tc->model.layers.name[l]);
    }
    MixerConfig mc = mixer_config_default(tc->model.d_model, tc->model.n_heads, tc->model.d_k, tc->model.d_v);
    mc.chunk_size = tc->model.chunk_size;
    mc.conv_size = tc->model.conv_size;
    mc.form = tc->model.form;
    mc.rope_base = tc->model.rope_base;
    mc.norm_eps = tc->model.norm_eps;
    mc.index_heads = tc->model.index_heads;
    mc.index_dim = tc->model.index_dim;
    mc.topk = tc->model.topk;
    mc.qk_norm = tc->model.qk_norm;
    mc.attn_gate = tc->model.attn_gate;
    mc.gdp_steps = tc->model.gdp_steps;
    mc.kda_gate_bias = tc->model.kda_gate_bias;
    lc->mixer = mc;
    return status_ok();
}

// Every constraint the model built from cfg would assert (lm_config_check,
// through the mixer kinds' registry): the [model] or [data] key at fault and
// why, or NULL.
static const char *check_model(const TrainConfig *cfg, char *why, size_t n) {
    LMConfig lc;
    Status s = config_model(cfg, &lc);
    if (!s.ok) {
        snprintf(why, n, "%.*s", (int)n - 1, s.msg);   // cut to why's size
        return "layers";
    }
    return lm_config_check(&lc, (int64_t)cfg->data.batch_size * cfg->data.seq_len, why, n);
}

Status config_validate(const TrainConfig *cfg) {
    if (cfg->train.min_lr > cfg->train.lr)
        return status_err("%s: [train] min_lr: %g is above lr = %g", WHERE("train", "min_lr"), cfg->train.min_lr,
                          cfg->train.lr);
    if (cfg->train.warmup_steps > cfg->train.steps)
        return status_err("%s: [train] warmup_steps: %d is more than steps = %d (or use warmup_fraction, which "
                          "scales with steps)",
                          WHERE("train", "warmup_steps"), cfg->train.warmup_steps, cfg->train.steps);
    const ConfigKey *wf = schema_find("train", "warmup_fraction");
    char def[32];
    if (cfg->train.warmup_steps >= 0 && cfg->origin[wf - CONFIG_SCHEMA] != 0 &&
        (schema_format_value(cfg, wf, def, sizeof def), strcmp(def, wf->def) != 0))
        return status_err("%s: [train] warmup_fraction: set together with warmup_steps = %d (%s); set one of them",
                          WHERE("train", "warmup_fraction"), cfg->train.warmup_steps, WHERE("train", "warmup_steps"));
    if (cfg->finetune.mode != FT_NONE && !cfg->finetune.init_from[0])
        return status_err("%s: [finetune] init_from: mode = %s needs a checkpoint to start from",
                          WHERE("finetune", "mode"), config_finetune_name(cfg->finetune.mode));
    if (cfg->finetune.restore_optimizer && (cfg->finetune.mode != FT_NONE || !cfg->finetune.init_from[0]))
        return status_err("%s: [finetune] restore_optimizer: only with mode = none and an init_from checkpoint "
                          "(continuing a model's training with its optimizer state)",
                          WHERE("finetune", "restore_optimizer"));
    DocSpec ds;
    Status d = doc_spec_parse(cfg->data.documents, &ds);
    if (!d.ok) return status_err("%s: [data] documents: %s", WHERE("data", "documents"), d.msg);
    if (cfg->train.carry_state && cfg->data.order != CFG_ORDER_STREAMS)
        return status_err("%s: [train] carry_state: needs [data] order = streams (each batch row reads one "
                          "stream, so a window's state can start the next)",
                          WHERE("train", "carry_state"));
    if (cfg->train.carry_state && cfg->finetune.mode == FT_INDEXER)
        return status_err("%s: [train] carry_state: indexer fine-tuning trains no recurrent layer (use mode = "
                          "none or sparse)",
                          WHERE("train", "carry_state"));
    const char *no_graph = config_cuda_graph_refusal(cfg);
    if (cfg->train.cuda_graph == CFG_GRAPH_ON && no_graph)
        return status_err("%s: [train] cuda_graph = on: %s (auto turns graphs off there)", WHERE("train", "cuda_graph"),
                          no_graph);
    char why[600];
    const char *key = check_model(cfg, why, sizeof why);
    if (key) {
        const char *sec = schema_find("model", key) ? "model" : "data";
        return status_err("%s: [%s] %s: %s", WHERE(sec, key), sec, key, why);
    }
    const ConfigInts *dl = &cfg->finetune.dsa_layers;
    for (int i = 0; i < dl->n; i++) {
        if (dl->v[i] >= cfg->model.layers.n)
            return status_err("%s: [finetune] dsa_layers: layer %d does not exist (the model has %d layers)",
                              WHERE("finetune", "dsa_layers"), dl->v[i], cfg->model.layers.n);
        const char *kind = cfg->model.layers.name[dl->v[i]];
        if (strcmp(kind, "attn") != 0 && strcmp(kind, "attn_dsa") != 0)
            return status_err("%s: [finetune] dsa_layers: layer %d is '%s'; only attn layers get an indexer",
                              WHERE("finetune", "dsa_layers"), dl->v[i], kind);
        for (int j = 0; j < i; j++)
            if (dl->v[j] == dl->v[i])
                return status_err("%s: [finetune] dsa_layers: layer %d listed twice", WHERE("finetune", "dsa_layers"),
                                  dl->v[i]);
    }
    return check_round_trip(cfg);
}

int config_n_keys(void) { return CONFIG_N_KEYS; }

ConfigKeyRef config_key_ref(int i) {
    ASSERT(i >= 0 && i < CONFIG_N_KEYS, "config_key_ref(%d)", i);
    const ConfigKey *k = &CONFIG_SCHEMA[i];
    return (ConfigKeyRef){k->section, k->key, (k->flags & KEYF_RESUMABLE) != 0, (k->flags & KEYF_ARCH) != 0};
}

const char *config_key_where(const TrainConfig *cfg, int i, char *buf, size_t n) {
    ConfigKeyRef r = config_key_ref(i);
    return origin_str(cfg, r.section, r.key, buf, n);
}

void config_format_key(const TrainConfig *cfg, int i, char *out, size_t n) {
    ASSERT(i >= 0 && i < CONFIG_N_KEYS, "config_format_key(%d)", i);
    schema_format_value(cfg, &CONFIG_SCHEMA[i], out, n);
}

// ---------------------------------------------------------------- find, help, dump

#ifndef SOURCE_DIR
#define SOURCE_DIR "."
#endif
#ifndef ATTNLAB_DATA_DIR
#define ATTNLAB_DATA_DIR "/usr/local/share/attnlab"
#endif
const char *const CONFIG_SEARCH_DIRS[] = {".", SOURCE_DIR, ATTNLAB_DATA_DIR};
const int CONFIG_N_SEARCH_DIRS = 3;

// 1: a regular file, 0: nothing there, -1: something else (*mode says what).
static int file_state(const char *path, mode_t *mode) {
    struct stat sb;
    if (stat(path, &sb) != 0) return 0;
    *mode = sb.st_mode;
    return S_ISREG(sb.st_mode) ? 1 : -1;
}

Status config_find(const char *name, const char *const *dirs, int ndirs, char *out, size_t out_size) {
    mode_t mode = 0;
    int st = file_state(name, &mode);
    if (st != 0 && (st < 0 || strlen(name) < out_size)) {
        if (st < 0) return status_err("%s: is %s, not a config file", name, file_kind_name(mode));
        snprintf(out, out_size, "%s", name);
        return status_ok();
    }
    if (strchr(name, '/')) return status_err("%s: config file not found", name);
    bool has_ext = strlen(name) > 4 && strcmp(name + strlen(name) - 4, ".ini") == 0;
    char tried[600] = "";
    size_t used = 0;
    for (int d = 0; d < ndirs; d++)
        for (int ext = 0; ext < (has_ext ? 1 : 2); ext++) {
            char path[CONFIG_STR_MAX];
            // The install's data folder is where this program was installed (data_dir.h), not only the configured one.
            const char *dir = strcmp(dirs[d], ATTNLAB_DATA_DIR) == 0 ? attnlab_data_dir() : dirs[d];
            if (snprintf(path, sizeof path, "%s/configs/%s%s", dir, name, ext ? ".ini" : "") >= (int)sizeof path)
                continue;
            if ((st = file_state(path, &mode)) < 0)
                return status_err("%s: is %s, not a config file", path, file_kind_name(mode));
            if (st > 0 && strlen(path) < out_size) {
                snprintf(out, out_size, "%s", path);
                return status_ok();
            }
            if (used < sizeof tried)
                used += snprintf(tried + used, sizeof tried - used, "%s%s", used ? ", " : "", path);
        }
    return status_err("%s: config not found (tried %s)", name, used ? tried : "no directories");
}


void config_dump(const TrainConfig *cfg, FILE *f) {
    const char *section = "";
    for (int i = 0; i < CONFIG_N_KEYS; i++) {
        const ConfigKey *k = &CONFIG_SCHEMA[i];
        if (strcmp(section, k->section)) {
            fprintf(f, "%s[%s]\n", *section ? "\n" : "", k->section);
            section = k->section;
        }
        char v[CONFIG_STR_MAX + 64];
        schema_format_value(cfg, k, v, sizeof v);
        fprintf(f, "%s = %s\n", k->key, v);
    }
}

char *config_dump_string(const TrainConfig *cfg) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    ASSERT(f, "config_dump_string: open_memstream failed");
    config_dump(cfg, f);
    fclose(f);
    return buf;
}

