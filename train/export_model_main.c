// export_model: a checkpoint's model as safetensors, for other tools, or as
// GGUF, for llama.cpp (export_gguf.h).
//
//   export_model --checkpoint runs/tiny_gdn/checkpoint.h5 --out model.safetensors
//   export_model --checkpoint runs/tiny_attn/checkpoint.h5 --format gguf --out model.gguf
//
// (Named export_model, not export: `export` is a shell builtin, so a program
// of that name could not be run by name from a shell.)
//
// Writes <out> in the safetensors format
// (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
// length N, N bytes of JSON (padded with spaces to a multiple of 8) mapping
// each tensor name to {"dtype": "F32", "shape": [...], "data_offsets": [begin,
// end]} plus "__metadata__" (format "pt", attnlab_config = the INI text the
// checkpoint stores), then the raw little-endian data, tensors in the model's
// registration order. Names and shapes are the checkpoint's
// (docs/checkpoint.md): "layers.0.mixer.wq" is (d_model, H*d_k), applied as
// u W. Beside it, config.json (or --config-json PATH) describes the model in
// JSON, and a BPE model's tokenizer file goes to tokenizer.bpe (named in
// config.json's "tokenizer"; "byte" for the byte tokenizer). Every file is
// written whole or not at all (fileio.h's FileOut), its folders created; an
// output that is the checkpoint or another output, or whose path is not a
// regular file or a new name (a device, FIFO, folder, symbolic link), is
// refused before anything is written.
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "export_gguf.h"
#include "version.h"
#include "fileio.h"
#include "model_setup.h"
#include "runlog.h"
#include "tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: export_model --checkpoint FILE --out MODEL.safetensors [--config-json FILE]\n"
               "       export_model --checkpoint FILE --format gguf --out MODEL.gguf [--type T] [--overwrite]\n"
               "  safetensors (the default): the checkpoint's parameters (float32), the model's description as\n"
               "  JSON (default: config.json in the folder of --out) and a BPE model's tokenizer.bpe beside it\n"
               "  gguf: one file that llama.cpp runs (the model, its metadata and its tokenizer); only what\n"
               "  llama.cpp computes exactly is written (docs/export.md), anything else is refused\n"
               "  --type T      gguf weights: f32 (default), f16 or q8_0 (norms stay f32)\n"
               "  --overwrite   gguf: replace an existing --out (without it an existing file is kept)\n");
}

// Append printf output to a growing buffer.
typedef struct Buf {
    char *p;
    size_t n, cap;
} Buf;

static void put(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Buf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (b->p && (size_t)w < b->cap - b->n) {
            b->n += (size_t)w;
            return;
        }
        b->cap = (b->cap + (size_t)w + 1) * 2;
        b->p = xrealloc(b->p, b->cap);
    }
}

// Write `n` bytes of `data`, then `m` of `more`, to path whole or not at all
// (fileio.h: a new temporary beside it, renamed over it); its folders are
// created.
static Status write_whole(const char *path, const char *what, const void *data, size_t n, const void *more,
                          size_t m) {
    FileOut o;
    Status s = file_out_open(&o, path, what, FILE_OUT_MAKE_DIRS);
    if (!s.ok) return s;
    file_out_write(&o, data, n);
    if (m) file_out_write(&o, more, m);
    return file_out_commit(&o);
}

static Status write_safetensors(const char *path, const ParamStore *ps, const char *config_text) {
    Buf h = {0};
    size_t esc_n = 6 * strlen(config_text) + 3;   // every byte escaped at worst (\u00XX)
    char *esc = xmalloc(esc_n);
    put(&h, "{\"__metadata__\":{\"format\":\"pt\",\"attnlab_format\":\"1\",\"attnlab_config\":%s}",
        runlog_json_str(config_text, esc, esc_n));
    free(esc);
    size_t offset = 0;
    for (int i = 0; i < ps->n; i++) {
        const Tensor *p = ps->params[i];
        put(&h, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", p->name);
        for (int k = 0; k < p->ndim; k++) put(&h, "%s%d", k ? "," : "", p->shape[k]);
        size_t bytes = (size_t)p->numel * 4;
        put(&h, "],\"data_offsets\":[%zu,%zu]}", offset, offset + bytes);
        offset += bytes;
    }
    put(&h, "}");
    while (h.n % 8) put(&h, " ");   // the data starts 8-byte aligned
    uint64_t len = h.n;
    uint8_t *out = xmalloc(8 + h.n);
    for (int k = 0; k < 8; k++) out[k] = (uint8_t)(len >> (8 * k));
    memcpy(out + 8, h.p, h.n);
    float *data = xmalloc(offset ? offset : 4);
    for (int64_t i = 0; i < ps->numel; i++) data[i] = (float)ps->data[i];   // registration order = block order
    Status s = write_whole(path, "safetensors file", out, 8 + h.n, data, offset);
    free(out);
    free(data);
    free(h.p);
    return s;
}

static Status write_config_json(const char *path, const TrainConfig *c, const Tokenizer *tok, const char *tok_file) {
    Buf b = {0};
    put(&b, "{\n  \"architectures\": [\"AttnlabLM\"],\n  \"model_type\": \"attnlab\",\n  \"layers\": [");
    for (int l = 0; l < c->model.layers.n; l++) put(&b, "%s\"%s\"", l ? ", " : "", c->model.layers.name[l]);
    put(&b,
        "],\n  \"vocab_size\": %d,\n  \"tokenizer\": \"%s\",\n  \"d_model\": %d,\n  \"n_heads\": %d,\n"
        "  \"d_k\": %d,\n  \"d_v\": %d,\n  \"d_ff\": %d,\n  \"tied_embeddings\": %s,\n  \"conv_size\": %d,\n"
        "  \"chunk_size\": %d,\n  \"norm_eps\": %.17g,\n  \"rope_base\": %.17g,\n  \"index_heads\": %d,\n"
        "  \"index_dim\": %d,\n  \"topk\": %d,\n  \"qk_norm\": %s,\n  \"attn_gate\": %s,\n  \"gdp_steps\": %d,\n"
        "  \"kda_gate_bias\": %s,\n  \"torch_dtype\": \"float32\"\n}\n",
        tok->vocab, tok->bpe ? tok_file : "byte", c->model.d_model, c->model.n_heads, c->model.d_k, c->model.d_v, c->model.d_ff,
        c->model.tied_embeddings ? "true" : "false", c->model.conv_size, c->model.chunk_size, c->model.norm_eps,
        c->model.rope_base, c->model.index_heads, c->model.index_dim, c->model.topk,
        c->model.qk_norm ? "true" : "false", c->model.attn_gate ? "true" : "false", c->model.gdp_steps,
        c->model.kda_gate_bias ? "true" : "false");
    Status s = write_whole(path, "config JSON", b.p, b.n, NULL, 0);
    free(b.p);
    return s;
}

// Before anything is written: no output is the checkpoint or another output,
// and each may be replaced (a regular file or a new name). tok_path NULL: no
// tokenizer file is written.
static Status check_outputs(const char *ckpt, const char *out, const char *cfg_json, bool cfg_given,
                            const char *tok_path) {
    const char *path[3] = {out, cfg_json, tok_path}, *what[3] = {"safetensors file", "config JSON", "tokenizer file"};
    const char *flag[3] = {"--out", cfg_given ? "--config-json" : "beside --out", "beside the config JSON"};
    for (int i = 0; i < 3; i++) {
        if (!path[i]) continue;
        Status s = file_check_distinct(path[i], what[i], ckpt, "checkpoint");
        for (int j = 0; s.ok && j < i; j++)
            if (file_same(path[i], path[j]))
                s = status_err("%s: the %s (%s) and the %s (%s) would be the same file; give another path", path[i],
                               what[j], flag[j], what[i], flag[i]);
        if (s.ok) s = file_check_output(path[i], what[i]);
        if (!s.ok) return s;
    }
    return status_ok();
}

// --format gguf: the model in one GGUF file (checked to be exportable first).
static Status export_gguf(const char *ckpt, const char *out, GgufType type, bool overwrite) {
    Status s = file_check_distinct(out, "GGUF file", ckpt, "checkpoint");
    if (s.ok) s = file_check_output(out, "GGUF file");
    if (s.ok && !overwrite && access(out, F_OK) == 0)
        s = status_err("%s: exists; give another --out, or --overwrite to replace it", out);
    if (!s.ok) return s;
    TrainConfig cfg;
    LM lm;
    ParamStore ps;
    Tokenizer tok;
    s = model_load_checkpoint(ckpt, &cfg, &lm, &ps, &tok);
    uint8_t *bytes = NULL;
    size_t n = 0;
    if (s.ok) s = export_gguf_bytes(&cfg, &ps, &tok, type, &bytes, &n);
    if (!s.ok && strncmp(s.msg, ckpt, strlen(ckpt)) != 0) {
        char msg[sizeof s.msg];
        snprintf(msg, sizeof msg, "%s", s.msg);
        s = status_err("%s: %s", ckpt, msg);
    }
    if (s.ok) s = write_whole(out, "GGUF file", bytes, n, NULL, 0);
    if (s.ok)
        fprintf(stderr, "export_model: %lld parameters, %zu bytes (%s) -> %s\n", (long long)ps.numel, n,
                type == GGUF_F32 ? "f32" : type == GGUF_F16 ? "f16" : "q8_0", out);
    free(bytes);
    if (ps.finalized) {
        lm_destroy(&lm);
        params_free(&ps);
        tokenizer_free(&tok);
    }
    config_free(&cfg);
    return s;
}

int main(int argc, char **argv) {
    if (program_version(argc, argv, "export_model")) return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    file_check_stdout_at_exit("export_model");
    const char *ckpt = NULL, *out = NULL, *cfg_json = NULL, *format = "safetensors", *type = NULL;
    bool overwrite = false;
    for (int i = 1; i < argc; i++) {
        bool has = i + 1 < argc;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--checkpoint") && has) ckpt = argv[++i];
        else if (!strcmp(argv[i], "--out") && has) out = argv[++i];
        else if (!strcmp(argv[i], "--config-json") && has) cfg_json = argv[++i];
        else if (!strcmp(argv[i], "--format") && has) format = argv[++i];
        else if (!strcmp(argv[i], "--type") && has) type = argv[++i];
        else if (!strcmp(argv[i], "--overwrite")) overwrite = true;
        else {
            fprintf(stderr, "export_model: unknown or incomplete argument '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (!ckpt || !out) {
        fprintf(stderr, "export_model: --checkpoint FILE and --out FILE are required (see --help)\n");
        return 2;
    }
    bool gguf = !strcmp(format, "gguf");
    if (!gguf && strcmp(format, "safetensors") != 0) {
        fprintf(stderr, "export_model: --format %s: expected safetensors or gguf\n", format);
        return 2;
    }
    if (!gguf && (type || overwrite)) {
        fprintf(stderr, "export_model: --type and --overwrite go with --format gguf\n");
        return 2;
    }
    if (gguf) {
        GgufType t = GGUF_F32;
        if (type && !strcmp(type, "f16")) t = GGUF_F16;
        else if (type && !strcmp(type, "q8_0")) t = GGUF_Q8_0;
        else if (type && strcmp(type, "f32") != 0) {
            fprintf(stderr, "export_model: --type %s: expected f32, f16 or q8_0\n", type);
            return 2;
        }
        if (cfg_json) {
            fprintf(stderr, "export_model: --config-json goes with safetensors (a GGUF file holds its metadata)\n");
            return 2;
        }
        Status s = export_gguf(ckpt, out, t, overwrite);
        if (!s.ok) fprintf(stderr, "export_model: %s\n", s.msg);
        return s.ok ? 0 : 1;
    }
    char json_path[4200];
    if (!cfg_json) {
        const char *slash = strrchr(out, '/');
        snprintf(json_path, sizeof json_path, "%.*sconfig.json", slash ? (int)(slash - out + 1) : 0, out);
        cfg_json = json_path;
    }
    char tok_path[4200];
    const char *slash = strrchr(cfg_json, '/');
    snprintf(tok_path, sizeof tok_path, "%.*stokenizer.bpe", slash ? (int)(slash - cfg_json + 1) : 0, cfg_json);
    TrainConfig cfg;
    LM lm;
    ParamStore ps;
    Tokenizer tok;
    Status s = model_load_checkpoint(ckpt, &cfg, &lm, &ps, &tok);
    if (s.ok) s = check_outputs(ckpt, out, cfg_json, cfg_json != json_path, tok.bpe ? tok_path : NULL);
    if (s.ok) s = write_safetensors(out, &ps, cfg.text ? cfg.text : "");
    if (s.ok) s = write_config_json(cfg_json, &cfg, &tok, "tokenizer.bpe");
    if (s.ok && tok.bpe) s = bpe_save(tok.bpe, tok_path);
    if (s.ok)
        fprintf(stderr, "export_model: %lld parameters in %d tensors -> %s, %s\n", (long long)ps.numel, ps.n, out,
                cfg_json);
    else
        fprintf(stderr, "export_model: %s\n", s.msg);
    if (ps.finalized) {
        lm_destroy(&lm);
        params_free(&ps);
        tokenizer_free(&tok);
    }
    config_free(&cfg);
    return s.ok ? 0 : 1;
}
