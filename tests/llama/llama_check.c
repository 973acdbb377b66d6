// llama_check: runs a GGUF file exported by export_model in the real
// llama.cpp (libllama, as the npm package @node-llama-cpp/linux-x64 ships
// it) and compares it with attnlab's own outputs.
//
//   llama_check LIBDIR MODEL.gguf TEXT [--ids IDS] LOGITS.npy TOL [defaults]
//   llama_check LIBDIR MODEL.gguf TEXT [--ids IDS] --greedy N EXPECTED_IDS
//   llama_check LIBDIR MODEL.gguf TEXT [--ids IDS] --greedy-text N EXPECTED_TEXT
//
// Each form first tokenizes TEXT with llama.cpp (no BOS, specials as plain
// text) and checks the ids against IDS (a file of whitespace-separated ids,
// attnlab's `tokenize encode`) or, without --ids, against the text's bytes
// (the byte tokenizer). The first form then runs the first T ids (T the
// rows of LOGITS.npy, attnlab's `evaluate --logits` of the same text) twice:
// in one batch and token by token, every position's logits kept, and checks
// each against attnlab's: the normwise relative error over all positions
// must be at most TOL. With `defaults` llama.cpp keeps its default flash
// attention and float16 cache; without, flash attention is off and the
// cache float32. The second form decodes N tokens greedily after TEXT and
// checks the ids against EXPECTED_IDS (a file of whitespace-separated ids,
// attnlab's `generate --temperature 0`); --greedy-text checks the text of
// the N tokens instead (generate prints text, not ids, for a BPE), each
// token's bytes as llama.cpp gives them, specials as their text; like
// generate, it never picks a token that stands for no bytes (UNUSED).
// Prints what it measured; exit 0
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
    // One thread: ggml's workers wait spinning, and on a busy machine the
    // spinning of a second one cost ten times the work of these small models.
    cp.n_threads = cp.n_threads_batch = 1;
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

// The greedy token after logits row `row`: never an UNUSED one (no bytes).
static int argmax(const struct llama_vocab *vocab, const float *row, int V) {
    int best = -1;
    for (int v = 0; v < V; v++)
        if (!(llama_vocab_get_attr(vocab, v) & LLAMA_TOKEN_ATTR_UNUSED) && (best < 0 || row[v] > row[best])) best = v;
    return best;
}

// as_text: EXPECTED is the tokens' text, else their ids.
static int check_greedy(struct llama_model *m, const llama_token *ids, int n_ids, char **argv, int as_text) {
    int n = atoi(argv[5]);
    long len;
    char *want = read_text(argv[6], &len);
    if (!want || n <= 0) return 2;
    const struct llama_vocab *vocab = llama_model_get_vocab(m);
    int V = llama_vocab_n_tokens(vocab), bad = 0;
    struct llama_context *ctx = context(m, n_ids + n, 0);
    float *logits = malloc((size_t)(n_ids + n) * V * sizeof *logits);
    char *got = malloc((size_t)n * 1024 + 1);
    long got_len = 0;
    if (!ctx || run(ctx, ids, n_ids, n_ids, V, logits) != 0) return 2;
    char *p = want;
    for (int i = 0; i < n && !bad; i++) {
        int best = argmax(vocab, logits + (size_t)(n_ids + i - 1) * V, V);
        if (as_text) {
            int k = llama_token_to_piece(vocab, best, got + got_len, 1024, 0, true);
            if (k < 0) return 2;
            got_len += k;
        } else {
            long expected = strtol(p, &p, 10);
            if (best != expected) {
                printf("llama_check: greedy token %d: llama.cpp %d, attnlab %ld\n", i, best, expected);
                bad = 1;
            }
        }
        struct llama_batch b = llama_batch_init(1, 0, 1);
        b.n_tokens = 1, b.token[0] = best, b.pos[0] = n_ids + i, b.n_seq_id[0] = 1, b.seq_id[0][0] = 0, b.logits[0] = 1;
        if (llama_decode(ctx, b) != 0) return 2;
        memcpy(logits + (size_t)(n_ids + i) * V, llama_get_logits_ith(ctx, 0), V * sizeof *logits);
        llama_batch_free(b);
    }
    if (as_text && (got_len != len || memcmp(got, want, (size_t)len) != 0)) {
        long at = 0;
        while (at < got_len && at < len && got[at] == want[at]) at++;
        printf("llama_check: the text of %d greedy tokens differs from attnlab's at byte %ld of %ld (llama.cpp: %ld)\n",
               n, at, len, got_len);
        bad = 1;
    }
    if (!bad) printf("llama_check: %d greedy tokens equal attnlab's%s\n", n, as_text ? " (their text)" : "");
    llama_free(ctx);
    free(got);
    free(logits);
    free(want);
    return bad;
}

// The ids in a file of whitespace-separated ids (at most cap); -1 if it is not one.
static int read_ids(const char *path, llama_token *ids, int cap) {
    long len;
    char *t = read_text(path, &len), *p = t, *end;
    if (!t || len < 0) return -1;
    int n = 0;
    for (long v; n < cap && (v = strtol(p, &end, 10), end != p); p = end) ids[n++] = (llama_token)v;
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    n = *p ? -1 : n;
    free(t);
    return n;
}

static bool no_progress(float progress, void *user) {
    (void)progress, (void)user;
    return true;
}

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

// llama.cpp's ids of TEXT against the expected: IDS, or the text's bytes. 0 when equal.
static int check_ids(const llama_token *ids, int n_ids, const char *text, long len, const char *ids_path) {
    llama_token *want = malloc((size_t)(len + 8) * sizeof *want);
    int n_want = (int)len;
    if (ids_path) n_want = read_ids(ids_path, want, (int)len + 8);
    else
        for (long i = 0; i < len; i++) want[i] = (unsigned char)text[i];
    if (n_want < 0) {
        fprintf(stderr, "llama_check: %s: not a file of whitespace-separated token ids\n", ids_path);
        exit(2);
    }
    int at = 0;
    while (at < n_ids && at < n_want && ids[at] == want[at]) at++;
    int bad = at != n_ids || at != n_want;
    printf("llama_check: llama_tokenize of %ld bytes: %d ids, %s", len, n_ids,
           ids_path ? (bad ? "NOT attnlab's" : "attnlab's") : (bad ? "NOT the bytes" : "the bytes"));
    if (bad) printf(" (%d expected; the first difference at id %d: llama.cpp %d, attnlab %d)", n_want, at,
                    at < n_ids ? ids[at] : -1, at < n_want ? want[at] : -1);
    printf("\n");
    free(want);
    return bad;
}

int main(int argc, char **argv) {
    const char *ids_path = NULL;   // --ids FILE, taken out of argv
    for (int i = 4; i + 1 < argc; i++)
        if (strcmp(argv[i], "--ids") == 0) {
            ids_path = argv[i + 1];
            memmove(argv + i, argv + i + 2, (size_t)(argc - i - 2) * sizeof *argv);
            argc -= 2;
            break;
        }
    if (argc < 6) {
        fprintf(stderr, "usage: llama_check LIBDIR MODEL.gguf TEXT [--ids IDS] LOGITS.npy TOL [defaults]\n"
                        "       llama_check LIBDIR MODEL.gguf TEXT [--ids IDS] --greedy N EXPECTED_IDS\n"
                        "       llama_check LIBDIR MODEL.gguf TEXT [--ids IDS] --greedy-text N EXPECTED_TEXT\n");
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
    int bad = check_ids(ids, n_ids, text, len, ids_path), r;
    if (argc >= 7 && strcmp(argv[4], "--greedy") == 0) r = check_greedy(m, ids, n_ids, argv, 0);
    else if (argc >= 7 && strcmp(argv[4], "--greedy-text") == 0) r = check_greedy(m, ids, n_ids, argv, 1);
    else r = check_logits(m, ids, n_ids, argv, argc);
    free(ids);
    free(text);
    llama_model_free(m);
    llama_backend_free();
    return bad ? 1 : r;
}
