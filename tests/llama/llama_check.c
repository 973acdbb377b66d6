// llama_check: runs a GGUF file exported by export_model in the real
// llama.cpp (libllama, as the npm package @node-llama-cpp/linux-x64 ships
// it) and compares it with attnlab's own outputs.
//
//   llama_check LIBDIR MODEL.gguf TEXT LOGITS.npy TOL [defaults]
//   llama_check LIBDIR MODEL.gguf TEXT --greedy N EXPECTED_IDS
//
// The first form tokenizes TEXT with llama.cpp and checks the ids against
// the text's bytes (the byte tokenizer), then runs the first T ids (T the
// rows of LOGITS.npy, attnlab's `evaluate --logits` of the same text) twice:
// in one batch and token by token, every position's logits kept, and checks
// each against attnlab's: the normwise relative error over all positions
// must be at most TOL. With `defaults` llama.cpp keeps its default flash
// attention and float16 cache; without, flash attention is off and the
// cache float32. The second form decodes N tokens greedily after TEXT and
// checks the ids against EXPECTED_IDS (a file of whitespace-separated ids,
// attnlab's `generate --temperature 0`). Prints what it measured; exit 0
// when every check holds, 1 when one fails, 2 on a usage or load error.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "llama.h"

static float *read_npy(const char *path, long *rows, long *cols) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char head[10];
    if (fread(head, 1, 10, f) != 10 || memcmp(head, "\x93NUMPY", 6) != 0) return fclose(f), NULL;
    size_t hl = head[8] | (size_t)head[9] << 8;
    char *h = calloc(1, hl + 1);
    float *out = NULL;
    if (fread(h, 1, hl, f) == hl && strstr(h, "'<f4'")) {
        const char *p = strstr(h, "'shape': (");
        if (p && sscanf(p, "'shape': (%ld, %ld)", rows, cols) == 2 && *rows > 0 && *cols > 0) {
            out = malloc((size_t)(*rows * *cols) * sizeof *out);
            if (fread(out, sizeof *out, (size_t)(*rows * *cols), f) != (size_t)(*rows * *cols)) {
                free(out);
                out = NULL;
            }
        }
    }
    free(h);
    fclose(f);
    return out;
}

static char *read_text(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *t = malloc((size_t)*n + 1);
    if (fread(t, 1, (size_t)*n, f) != (size_t)*n) *n = -1;
    t[*n > 0 ? *n : 0] = 0;
    fclose(f);
    return t;
}

static struct llama_context *context(struct llama_model *m, int n_ctx, int defaults) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t)n_ctx;
    cp.n_threads = cp.n_threads_batch = 2;
    if (!defaults) {
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.type_k = cp.type_v = GGML_TYPE_F32;
    }
    return llama_init_from_model(m, cp);
}

// Decode ids[0..n) in pieces of `step` tokens, every position's logits into out (n x V).
static int run(struct llama_context *ctx, const llama_token *ids, int n, int step, int V, float *out) {
    struct llama_batch b = llama_batch_init(step, 0, 1);
    for (int at = 0; at < n; at += step) {
        int k = n - at < step ? n - at : step;
        b.n_tokens = k;
        for (int i = 0; i < k; i++) {
            b.token[i] = ids[at + i];
            b.pos[i] = at + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        if (llama_decode(ctx, b) != 0) {
            llama_batch_free(b);
            return -1;
        }
        for (int i = 0; i < k; i++) memcpy(out + (size_t)(at + i) * V, llama_get_logits_ith(ctx, i), V * sizeof *out);
    }
    llama_batch_free(b);
    return 0;
}

static double rel_error(const float *a, const float *b, size_t n) {
    double d2 = 0, a2 = 0;
    for (size_t i = 0; i < n; i++) d2 += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), a2 += (double)a[i] * a[i];
    return sqrt(d2 / (a2 > 0 ? a2 : 1));
}

static int check_logits(struct llama_model *m, const llama_token *ids, int n_ids, char **argv, int argc) {
    long T, V;
    float *want = read_npy(argv[4], &T, &V);
    double tol = atof(argv[5]);
    int defaults = argc > 6 && strcmp(argv[6], "defaults") == 0;
    if (!want || T > n_ids || V != llama_vocab_n_tokens(llama_model_get_vocab(m))) {
        fprintf(stderr, "llama_check: %s: not a (T, %d) float32 .npy with T <= %d\n", argv[4],
                llama_vocab_n_tokens(llama_model_get_vocab(m)), n_ids);
        return 2;
    }
    float *got = malloc((size_t)(T * V) * sizeof *got);
    int bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        struct llama_context *ctx = context(m, (int)T, defaults);
        if (!ctx || run(ctx, ids, (int)T, pass == 0 ? (int)T : 1, (int)V, got) != 0) {
            fprintf(stderr, "llama_check: llama_decode failed\n");
            return 2;
        }
        double e = rel_error(want, got, (size_t)(T * V));
        printf("llama_check: %s, %s: %ld positions, relative error %.3g (bound %.0e)\n", pass ? "token by token" : "one batch",
               defaults ? "llama.cpp defaults" : "no flash attention, f32 cache", T, e, tol);
        bad |= !(e <= tol);
        llama_free(ctx);
    }
    free(got);
    free(want);
    return bad;
}

static int check_greedy(struct llama_model *m, const llama_token *ids, int n_ids, char **argv) {
    int n = atoi(argv[5]);
    long len;
    char *text = read_text(argv[6], &len);
    if (!text || n <= 0) return 2;
    int V = llama_vocab_n_tokens(llama_model_get_vocab(m)), bad = 0;
    struct llama_context *ctx = context(m, n_ids + n, 0);
    float *logits = malloc((size_t)(n_ids + n) * V * sizeof *logits);
    llama_token *all = malloc((size_t)(n_ids + n) * sizeof *all);
    memcpy(all, ids, (size_t)n_ids * sizeof *all);
    if (!ctx || run(ctx, all, n_ids, n_ids, V, logits) != 0) return 2;
    char *p = text;
    for (int i = 0; i < n; i++) {
        const float *row = logits + (size_t)(n_ids + i - 1) * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        long expected = strtol(p, &p, 10);
        if (best != expected) {
            printf("llama_check: greedy token %d: llama.cpp %d, attnlab %ld\n", i, best, expected);
            bad = 1;
            break;
        }
        all[n_ids + i] = best;
        struct llama_batch b = llama_batch_init(1, 0, 1);
        b.n_tokens = 1, b.token[0] = best, b.pos[0] = n_ids + i, b.n_seq_id[0] = 1, b.seq_id[0][0] = 0, b.logits[0] = 1;
        if (llama_decode(ctx, b) != 0) return 2;
        memcpy(logits + (size_t)(n_ids + i) * V, llama_get_logits_ith(ctx, 0), V * sizeof *logits);
        llama_batch_free(b);
    }
    if (!bad) printf("llama_check: %d greedy tokens equal attnlab's\n", n);
    llama_free(ctx);
    free(all);
    free(logits);
    free(text);
    return bad;
}

static bool no_progress(float progress, void *user) {
    (void)progress, (void)user;
    return true;
}

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: llama_check LIBDIR MODEL.gguf TEXT LOGITS.npy TOL [defaults]\n"
                        "       llama_check LIBDIR MODEL.gguf TEXT --greedy N EXPECTED_IDS\n");
        return 2;
    }
    llama_log_set(quiet, NULL);
    ggml_backend_load_all_from_path(argv[1]);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.progress_callback = no_progress;
    struct llama_model *m = llama_model_load_from_file(argv[2], mp);
    if (!m) {
        fprintf(stderr, "llama_check: llama.cpp could not load %s\n", argv[2]);
        return 2;
    }
    long len;
    char *text = read_text(argv[3], &len);
    if (!text || len <= 0) return 2;
    llama_token *ids = malloc((size_t)(len + 8) * sizeof *ids);
    int n_ids = llama_tokenize(llama_model_get_vocab(m), text, (int32_t)len, ids, (int32_t)len + 8, false, false);
    int bad = n_ids != len;
    for (int i = 0; !bad && i < n_ids; i++) bad = ids[i] != (unsigned char)text[i];
    printf("llama_check: llama_tokenize of %ld bytes: %d ids, %s\n", len, n_ids, bad ? "NOT the bytes" : "the bytes");
    int r = strcmp(argv[4], "--greedy") == 0 && argc >= 7 ? check_greedy(m, ids, n_ids, argv) : check_logits(m, ids, n_ids, argv, argc);
    free(ids);
    free(text);
    llama_model_free(m);
    llama_backend_free();
    return bad ? 1 : r;
}
