// evaluate: a checkpoint's loss, bits per byte and perplexity on any text.
//
//   evaluate --checkpoint runs/tiny_gdn/checkpoint.h5 --text notes.txt [--window T] [--stride S]
//   evaluate --checkpoint runs/tiny_gdn/checkpoint.h5 --text notes.txt --stream
//
// Two ways to score every token of the text once:
//   windows (default)  windows of T tokens (default: the run's seq_len) that
//                      advance by S (default T/2); each window scores only the
//                      tokens no earlier window scored, so after the first
//                      every token sees at least T - S tokens of context (the
//                      strided evaluation of the Hugging Face perplexity guide).
//                      Windows run in parallel batches; any model.
//   --stream           the text as one sequence, token by token with the
//                      decoder: recurrent layers carry their state across the
//                      whole text in constant memory; attention layers keep a
//                      KV cache of everything before (memory grows with the
//                      text). Every token sees all the text before it.
// The figures go to stdout (one line, or a JSON object with --json).
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "corpus.h"
#include "blas.h"
#include "model_setup.h"
#include "runlog.h"
#include "tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: evaluate --checkpoint FILE --text FILE[,FILE...|DIR] [--window T] [--stride S] [--batch B]\n"
            "                [--stream] [--threads N] [--json]\n"
            "  --checkpoint FILE  a checkpoint written by train (the model comes from its stored config)\n"
            "  --text SPEC        the text: a file, a comma list of files, or a directory (as [data] corpus)\n"
            "  --window T         tokens per window (default: the run's seq_len)\n"
            "  --stride S         tokens a window advances, 1..T (default T/2): every token after the first\n"
            "                     window is scored with at least T - S tokens of context\n"
            "  --batch B          windows per forward pass (default 8)\n"
            "  --stream           score the text as one sequence with the decoder (recurrent state carried\n"
            "                     through the whole text; attention keeps a KV cache of all of it)\n"
            "  --threads N        threads (default: all cores; with --stream 1 below 10M parameters)\n"
            "  --json             print the figures as one JSON object\n"
            "  --logits FILE      also write the logits of the first window, (T, V) in the build's precision,\n"
            "                     as a NumPy .npy\n"
            "                     file (to compare with another implementation, e.g. python/attnlab_torch.py)\n"
            "Prints the loss per token (nats), bits per byte and perplexity of the whole text.\n");
}

static bool parse_int(const char *opt, const char *v, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "evaluate: %s: '%s' is not an integer in [%lld, %lld]\n", opt, v, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

typedef struct Score {
    double nll;          // sum of -log p(token) over scored tokens (nats)
    int64_t tokens;      // tokens scored
    int64_t bytes;       // bytes of text those tokens stand for
} Score;

// Write a (rows, cols) array of reals as a NumPy .npy file (format 1.0), in
// the build's precision (<f4, or <f8 in the float64 build).
static Status write_npy(const char *path, const real *x, int rows, int cols) {
    char hdr[128];
    int len = snprintf(hdr, sizeof hdr, "{'descr': '<f%d', 'fortran_order': False, 'shape': (%d, %d), }",
                       (int)sizeof(real), rows, cols);
    int total = 10 + len + 1;
    int pad = (64 - total % 64) % 64;   // the data starts 64-byte aligned
    FILE *f = fopen(path, "wb");
    if (!f) return status_err("%s: cannot create: %s", path, strerror(errno));
    uint16_t hl = (uint16_t)(len + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hl & 0xff, f);
    fputc(hl >> 8, f);
    fwrite(hdr, 1, (size_t)len, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(x, sizeof(real), (size_t)rows * cols, f);
    bool ok = !ferror(f);
    ok = fclose(f) == 0 && ok;
    return ok ? status_ok() : status_err("%s: writing failed", path);
}

// Windows of T advancing by S; targets already scored are ignored (-1).
// logits_path: write the first window's logits there.
static Score score_windows(LM *lm, const Tokenizer *tk, const int *tok, int64_t n, int T, int S, int B,
                           const char *logits_path, Status *st) {
    Score sc = {0, 0, 0};
    if (n < 2) return sc;
    if (T > n - 1) T = (int)(n - 1);
    int *x = xmalloc((size_t)B * T * sizeof(int)), *y = xmalloc((size_t)B * T * sizeof(int));
    Tape tp;
    tape_init(&tp);
    tape_no_grad_push(&tp);
    int64_t scored_to = 0;   // targets 1..scored_to are done
    for (int64_t start = 0; scored_to < n - 1;) {
        int b = 0, counted = 0;
        for (; b < B && scored_to < n - 1; b++, start += S) {
            int64_t s = start + T > n - 1 ? n - 1 - T : start;   // the last window ends at the text's end
            for (int t = 0; t < T; t++) {
                int64_t target = s + t + 1;
                x[b * T + t] = tok[s + t];
                y[b * T + t] = target > scored_to ? tok[target] : -1;
                counted += target > scored_to;
                if (target > scored_to) sc.bytes += tokenizer_token_len(tk, tok[target]);
            }
            scored_to = s + T;
        }
        Tensor *logits = NULL;
        Tensor *loss = lm_loss(&tp, lm, x, y, b, T, &logits);
        if (logits_path && sc.tokens == 0) *st = write_npy(logits_path, logits->data, T, lm->cfg.vocab_size);
        sc.nll += loss->data[0] * counted;
        sc.tokens += counted;
        tape_reset(&tp);
    }
    tape_no_grad_pop(&tp);
    tape_free(&tp);
    free(x);
    free(y);
    return sc;
}

// The whole text as one sequence through the decoder.
static Score score_stream(LM *lm, const Tokenizer *tk, const int *tok, int64_t n) {
    Score sc = {0, 0, 0};
    if (n < 2 || n > INT32_MAX) return sc;
    Tape tp;
    tape_init(&tp);
    tape_no_grad_push(&tp);
    LMCache *cache = lm_cache_new(lm, 1, (int)n);
    int V = lm->cfg.vocab_size;
    for (int64_t i = 0; i + 1 < n; i++) {
        const real *lg = lm_step(&tp, lm, cache, &tok[i])->data;
        double mx = lg[0], z = 0;
        for (int v = 1; v < V; v++) mx = fmax(mx, (double)lg[v]);
        for (int v = 0; v < V; v++) z += exp((double)lg[v] - mx);
        sc.nll += mx + log(z) - (double)lg[tok[i + 1]];
        sc.tokens++;
        sc.bytes += tokenizer_token_len(tk, tok[i + 1]);
        tape_reset(&tp);
    }
    lm_cache_free(lm, cache);
    tape_no_grad_pop(&tp);
    tape_free(&tp);
    return sc;
}

int main(int argc, char **argv) {
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    const char *ckpt = NULL, *text = NULL, *logits_path = NULL;
    long long window = 0, stride = 0, batch = 8, threads = 0;
    bool stream = false, json = false;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        bool has = i + 1 < argc, ok = true;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(o, "--stream")) stream = true;
        else if (!strcmp(o, "--json")) json = true;
        else if (!has) ok = false;
        else if (!strcmp(o, "--checkpoint")) ckpt = argv[++i];
        else if (!strcmp(o, "--text")) text = argv[++i];
        else if (!strcmp(o, "--logits")) logits_path = argv[++i];
        else if (!strcmp(o, "--window")) ok = parse_int(o, argv[++i], 1, 1 << 20, &window);
        else if (!strcmp(o, "--stride")) ok = parse_int(o, argv[++i], 1, 1 << 20, &stride);
        else if (!strcmp(o, "--batch")) ok = parse_int(o, argv[++i], 1, 4096, &batch);
        else if (!strcmp(o, "--threads")) ok = parse_int(o, argv[++i], 1, MODEL_MAX_THREADS, &threads);
        else ok = false;
        if (!ok) {
            if (!has || !strncmp(o, "--", 2)) fprintf(stderr, "evaluate: bad or incomplete argument '%s' (see --help)\n", o);
            return 2;
        }
    }
    if (!ckpt || !text) {
        fprintf(stderr, "evaluate: --checkpoint FILE and --text FILE are required (see evaluate --help)\n");
        return 2;
    }
    TrainConfig cfg;
    LM lm;
    ParamStore ps;
    Tokenizer tok;
    Status s = model_load_checkpoint(ckpt, &cfg, &lm, &ps, &tok);
    Corpus corpus = {0};
    if (s.ok) s = corpus_load(&corpus, text);
    if (!s.ok) {
        fprintf(stderr, "evaluate: %s\n", s.msg);
        config_free(&cfg);
        return 2;
    }
    int T = window ? (int)window : cfg.data.seq_len;
    int S = stride ? (int)stride : (T > 1 ? T / 2 : 1);
    if (S > T) {
        fprintf(stderr, "evaluate: --stride %d is more than the window of %d tokens\n", S, T);
        return 2;
    }
    if (!threads && stream && params_count(&ps, false) < 10000000) threads = 1;   // as generate
    int nthreads = model_set_threads((int)threads);
    blas_select_from_env();   // float32 products on ATTNLAB_GEMM's backend (default auto), as generate
    int *ids = xmalloc((size_t)(corpus.n ? corpus.n : 1) * sizeof(int));
    int64_t n = tokenizer_encode(&tok, corpus.bytes, corpus.n, ids);
    double t0 = runlog_now();
    Status ws = status_ok();
    Score sc = stream ? score_stream(&lm, &tok, ids, n)
                      : score_windows(&lm, &tok, ids, n, T, S, (int)batch, logits_path, &ws);
    if (!ws.ok) fprintf(stderr, "evaluate: --logits: %s\n", ws.msg);
    double secs = runlog_now() - t0;
    int code = ws.ok ? 0 : 1;
    if (stream && logits_path) fprintf(stderr, "evaluate: --logits is written in window mode only\n");
    if (sc.tokens == 0) {
        fprintf(stderr, "evaluate: %s: fewer than 2 tokens, nothing to score\n", text);
        code = 2;
    } else {
        double loss = sc.nll / (double)sc.tokens;
        double bpb = sc.nll / log(2.0) / (double)sc.bytes;   // per byte of the text the scored tokens stand for
        char mode[64];
        if (stream) snprintf(mode, sizeof mode, "stream");
        else snprintf(mode, sizeof mode, "windows of %d, stride %d", T > n - 1 ? (int)(n - 1) : T, S);
        if (json) {
            char tj[1100], mj[100];
            printf("{\"text\":%s,\"bytes\":%lld,\"tokens_scored\":%lld,\"bytes_scored\":%lld,\"loss\":%.6f,\"bits_per_byte\":%.6f,"
                   "\"perplexity\":%.4f,\"mode\":%s,\"seconds\":%.2f}\n",
                   runlog_json_str(text, tj, sizeof tj), (long long)corpus.n, (long long)sc.tokens,
                   (long long)sc.bytes, loss, bpb,
                   exp(loss), runlog_json_str(mode, mj, sizeof mj), secs);
        } else {
            printf("evaluate: %s: %lld bytes, %lld tokens scored | loss %.4f nats/token | %.4f bits/byte | "
                   "perplexity %.3f | %s | %.1f s, %d thread%s\n",
                   text, (long long)corpus.n, (long long)sc.tokens, loss, bpb, exp(loss), mode, secs, nthreads,
                   nthreads == 1 ? "" : "s");
        }
    }
    free(ids);
    tokenizer_free(&tok);
    corpus_free(&corpus);
    lm_destroy(&lm);
    params_free(&ps);
    config_free(&cfg);
    return code;
}
