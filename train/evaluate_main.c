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
//   --stream           the text as one sequence through the decoder, in
//                      parallel windows (lm_prefill_all; --no-prefill: token
//                      by token): recurrent layers carry their state across
//                      the whole text in constant memory; attention layers
//                      keep a KV cache of everything before (memory grows with
//                      the text). Every token sees all the text before it.
// The figures go to stdout (one line, or a JSON object with --json).
// --device cuda scores on the GPU (a build with -DAG_CUDA=ON), windows,
// --stream and --positions alike; the model loads on the host and its values
// move there, the logits come back to the host to be scored.
//
//   evaluate --checkpoint runs/tiny_gdn/checkpoint.h5 --val --positions [--context carry|full|window]
//
// --positions: the loss per position bucket over long sequences (poseval.h):
// the text (or with --val the checkpoint's validation split) is scored as one
// sequence, or as documents (--doc-sep, --seq), each token conditioned on its
// document before it, and the loss is reported per bucket of positions inside
// a document (0-256, 256-1k, 1k-4k, ...; --buckets). Recurrent models carry
// their state through chunks (carry); attention sees its whole document in one
// flash-attention pass (full) or a sliding window (window). With --json: one
// JSON line per bucket, then one for the total.
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "version.h"
#include "corpus.h"
#include "blas.h"
#include "doctext.h"
#include "fileio.h"
#include "model_setup.h"
#include "poseval.h"
#include "runlog.h"
#include "tokenizer.h"
#include "documents.h"
#include "run_config.h"
#include "val_split.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: evaluate --checkpoint FILE --text FILE[,FILE...|DIR] [--window T] [--stride S] [--batch B]\n"
            "                [--stream [--no-prefill]] [--threads N] [--device cpu|cuda] [--json] [--val]\n"
            "                [--limit N] [--logits FILE]\n"
            "       evaluate --checkpoint FILE [--text SPEC] [--val] --positions [--context carry|full|window]\n"
            "                [--chunk N] [--window T] [--stride S] [--buckets E1,E2,...] [--seq N] [--doc-sep STR]\n"
            "  --checkpoint FILE  a checkpoint written by train (the model comes from its stored config)\n"
            "  --text SPEC        the text: a file, a comma list of files, or a directory (as [data] corpus);\n"
            "                     with --val the checkpoint's corpus when not given\n"
            "  --val              only the validation split: the last val_fraction (the checkpoint's) of the\n"
            "                     text's tokens, as training holds it out\n"
            "  --limit N          only the first N tokens (after --val)\n"
            "  --window T         tokens per window (default: the run's seq_len)\n"
            "  --stride S         tokens a window advances, 1..T (default T/2): every token after the first\n"
            "                     window is scored with at least T - S tokens of context\n"
            "  --batch B          windows per forward pass (default 8)\n"
            "  --stream           score the text as one sequence with the decoder (recurrent state carried\n"
            "                     through the whole text; attention keeps a KV cache of all of it), in\n"
            "                     parallel windows of %d tokens (on a GPU larger)\n"
            "  --no-prefill       with --stream: token by token instead (as generate samples)\n"
            "  --threads N        threads (default: all cores; with --stream --no-prefill 1 below 10M\n"
            "                     parameters)\n"
            "  --device D         cpu (default) or cuda: score on the GPU (a build with -DAG_CUDA=ON)\n"
            "  --json             print the figures as one JSON object\n"
            "  --logits FILE      also write the logits of the first window, (T, V) in the build's precision,\n"
            "                     as a NumPy .npy\n"
            "                     file (to compare with another implementation, e.g. python/attnlab_torch.py)\n"
            "Per position (--positions; the options below imply it):\n"
            "  --context MODE     carry: recurrent state carried through chunks, every token sees its whole\n"
            "                     document (every layer recurrent); full: one pass over each document, attention\n"
            "                     over all of it (flash, memory grows with the text); window: sliding windows of\n"
            "                     --window tokens advancing by --stride, every layer restarting in each.\n"
            "                     Default: carry when every layer is recurrent, else full\n"
            "  --chunk N          carry: tokens per forward (default 2048; the result does not depend on it)\n"
            "  --buckets LIST     upper edges of the position buckets, increasing (k = x1024), e.g. 256,1k,4k\n"
            "                     (default 256, 1k, 4k, 16k, ... up to the longest document)\n"
            "  --seq N            cut every document into sequences of N tokens, each scored from position 0\n"
            "  --doc-sep STR      a new document begins after each STR in the text (escapes \\n \\t \\\\ \\xHH);\n"
            "                     documents are tokenized apart and positions count from each one's start\n"
            "Prints the loss per token (nats), bits per byte and perplexity of the whole text; with --positions\n"
            "also per position bucket (with --json one JSON line per bucket, then the total).\n",
            LM_PREFILL_WINDOW);
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
    FileOut o;   // whole or not at all; never through a link or onto a device (fileio.h)
    Status s = file_out_open(&o, path, "logits file", 0);
    if (!s.ok) return s;
    FILE *f = file_out_stream(&o);
    uint16_t hl = (uint16_t)(len + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hl & 0xff, f);
    fputc(hl >> 8, f);
    fwrite(hdr, 1, (size_t)len, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(x, sizeof(real), (size_t)rows * cols, f);
    return file_out_commit(&o);
}

// Windows of T advancing by S; targets already scored are ignored (-1).
// logits_path: write the first window's logits there.
static Score score_windows(LM *lm, const Tokenizer *tk, const int *tok, int64_t n, int T, int S, int B,
                           const char *logits_path, Status *st, Device dev) {
    Score sc = {0, 0, 0};
    if (n < 2) return sc;
    if (T > n - 1) T = (int)(n - 1);
    int *x = xmalloc((size_t)B * T * sizeof(int)), *y = xmalloc((size_t)B * T * sizeof(int));
    Tape tp;
    tape_init_on(&tp, dev);
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
        if (logits_path && sc.tokens == 0) {   // the first window's rows, from the device they are on
            size_t bytes = (size_t)T * lm->cfg.vocab_size * sizeof(real);
            real *host = xmalloc(bytes);
            dev_to_host(host, logits->data, bytes, dev);
            *st = write_npy(logits_path, host, T, lm->cfg.vocab_size);
            free(host);
        }
        sc.nll += tape_item(&tp, loss) * counted;
        sc.tokens += counted;
        tape_reset(&tp);
    }
    tape_no_grad_pop(&tp);
    tape_free(&tp);
    free(x);
    free(y);
    return sc;
}

// The whole text as one sequence through the decoder: windows of the
// cache's prefill_window positions at once (lm_prefill_all), or with steps
// one position at a time. A window's logits come to the host: at most 16M
// of them (64 MB in float32; 1024 positions at least).
static Score score_stream(LM *lm, const Tokenizer *tk, const int *tok, int64_t n, Device dev, bool steps) {
    Score sc = {0, 0, 0};
    if (n < 2 || n > INT32_MAX) return sc;
    Tape tp;
    tape_init_on(&tp, dev);
    tape_no_grad_push(&tp);
    LMCache *cache = lm_cache_new_on(lm, 1, (int)n, dev);
    int V = lm->cfg.vocab_size, W = imin(cache->prefill_window, imax(LM_PREFILL_WINDOW, (1 << 24) / V));
    if (steps) W = 1;
    real *lg = xmalloc((size_t)W * V * sizeof(real));   // a window's logits on the host
    double t0 = runlog_now(), shown = 0;   // a long text says how far it got, every few seconds
    for (int64_t i = 0; i + 1 < n; i += W) {   // positions i .. i+w-1 predict tokens i+1 .. i+w
        int w = (int)(n - 1 - i < W ? n - 1 - i : W);
        Tensor *out = steps ? lm_step(&tp, lm, cache, &tok[i]) : lm_prefill_all(&tp, lm, cache, &tok[i], w);
        dev_to_host(lg, out->data, (size_t)w * V * sizeof(real), dev);
        for (int j = 0; j < w; j++) {
            const real *l = lg + (size_t)j * V;
            double mx = l[0], z = 0;
            for (int v = 1; v < V; v++) mx = fmax(mx, (double)l[v]);
            for (int v = 0; v < V; v++) z += exp((double)l[v] - mx);
            sc.nll += mx + log(z) - (double)l[tok[i + j + 1]];
            sc.tokens++;
            sc.bytes += tokenizer_token_len(tk, tok[i + j + 1]);
        }
        tape_reset(&tp);
        runlog_progress(stderr, "evaluate: --stream", i + w + 1, n, t0, &shown, 5.0, false);
    }
    runlog_progress(stderr, "evaluate: --stream", n, n, t0, &shown, 5.0, true);
    free(lg);
    lm_cache_free(lm, cache);
    tape_no_grad_pop(&tp);
    tape_free(&tp);
    return sc;
}

// --val of a run that held out whole documents ([data] val_choice =
// documents): the run's documents, reordered as training split them, so the
// held-out ones are the tail from *first on, flagged at their starts. Leaves
// everything as it is for a run that held out the tail.
static void val_documents(const TrainConfig *cfg, const Corpus *corpus, const Tokenizer *tok, int **ids, int **flags,
                          int64_t *n, int64_t *first) {
    DocSpec docs;
    if (cfg->data.val_choice != CFG_VAL_DOCUMENTS || !doc_spec_parse(cfg->data.documents, &docs).ok ||
        docs.mode == DOCS_NONE)
        return;
    int *tokens, *split;
    int64_t nt, n_docs, *starts, *split_starts, train_end;
    documents_tokenize(corpus, &docs, tok, &tokens, &nt, &starts, &n_docs);
    if (n_docs >= 2 && val_split_documents(tokens, nt, starts, n_docs, cfg->data.val_fraction, (uint64_t)cfg->train.seed,
                                           &split, &split_starts, &train_end).ok) {
        free(*ids);
        free(*flags);
        *ids = split;
        *flags = xmalloc((size_t)(nt ? nt : 1) * sizeof **flags);
        memset(*flags, 0, (size_t)nt * sizeof **flags);
        for (int64_t d = 0; d < n_docs; d++) (*flags)[split_starts[d]] = 1;
        free(split_starts);
        *n = nt;
        *first = train_end;
    }
    free(tokens);
    free(starts);
}

// Parse "256,1k,4k" (k = x1024) into increasing positive edges; returns how
// many, or -1 with a message.
static int parse_edges(const char *v, int64_t *edges, int max) {
    int k = 0;
    for (const char *p = v; *p;) {
        char *end;
        errno = 0;
        long long e = strtoll(p, &end, 10);
        if (end == p || errno || e < 1 || (*end == 'k' && e > ((int64_t)1 << 40) / 1024)) break;   // (no overflow)
        if (*end == 'k') e *= 1024, end++;
        if (k == max || (k && e <= edges[k - 1]) || e > ((int64_t)1 << 40)) break;
        edges[k++] = e;
        if (!*end) return k;
        if (*end != ',') break;
        p = end + 1;
    }
    fprintf(stderr, "evaluate: --buckets: '%s' is not a list of at most %d increasing positive sizes (e.g. 256,1k,4k)\n",
            v, max);
    return -1;
}

typedef struct PosOptions {
    PosevalSpec spec;
    bool context_given;
    int64_t edges[64];
    int n_edges;         // 0: the default edges
    int seq;             // 0: documents as they are
    char sep[256];
    int seplen;          // 0: the text is one document
} PosOptions;

// The per-position view: score ids (n) with documents flags (n), print the
// buckets and the total. Returns the exit code.
static int run_positions(LM *lm, const Tokenizer *tk, const char *ckpt, const char *text, const int *ids,
                         const int *flags, int64_t n, PosOptions *po, bool json, int nthreads, Device dev) {
    PosevalSpec *sp = &po->spec;
    if (!po->context_given) sp->context = poseval_all_recurrent(lm) ? POSEVAL_CARRY : POSEVAL_FULL;
    int64_t longest, docs = doctext_count(flags, n, &longest);
    double *nll = xmalloc((size_t)(n > 1 ? n : 1) * sizeof(double));
    int64_t *pos = xmalloc((size_t)(n > 1 ? n : 1) * sizeof(int64_t));
    int *tbytes = xmalloc((size_t)(n > 1 ? n : 1) * sizeof(int));
    double t0 = runlog_now();
    Status s = poseval_score(lm, ids, flags, n, sp, nll, pos, dev);
    double secs = runlog_now() - t0;
    int code = 0;
    PosevalBucket b[64], all;
    int nb = 0;
    if (!s.ok) {
        fprintf(stderr, "evaluate: %s\n", s.msg);
        code = 2;
    } else {
        int64_t max_pos = 0;
        for (int64_t i = 0; i + 1 < n; i++) {
            tbytes[i] = tokenizer_token_len(tk, ids[i + 1]);
            if (pos[i] > max_pos) max_pos = pos[i];
        }
        nb = po->n_edges ? po->n_edges : poseval_default_edges(max_pos, po->edges, 64);
        poseval_buckets(nll, pos, tbytes, n - 1, po->edges, nb, b);
        poseval_buckets(nll, pos, tbytes, n - 1, (int64_t[]){max_pos + 1}, 1, &all);
        if (all.tokens == 0) {
            fprintf(stderr, "evaluate: %s: no token to score (every document is one token long)\n", text);
            code = 2;
        }
    }
    if (code == 0) {
        char ctx[96];
        if (sp->context == POSEVAL_CARRY) snprintf(ctx, sizeof ctx, "carry, chunks of %d", sp->chunk);
        else if (sp->context == POSEVAL_FULL) snprintf(ctx, sizeof ctx, "full");
        else snprintf(ctx, sizeof ctx, "window of %d, stride %d", sp->window, sp->stride);
        char cj[1100], tj[1100], xj[200];
        runlog_json_str(ckpt, cj, sizeof cj);
        runlog_json_str(text, tj, sizeof tj);
        runlog_json_str(ctx, xj, sizeof xj);
        if (!json)
            printf("evaluate: %s: %lld tokens in %lld document%s (the longest %lld) | %lld scored | loss %.4f "
                   "nats/token | %.4f bits/byte | context %s | %.1f s, %d thread%s\n"
                   "%-16s %10s %10s %9s %9s\n",
                   text, (long long)n, (long long)docs, docs == 1 ? "" : "s", (long long)longest,
                   (long long)all.tokens, all.nll / all.tokens, all.nll / log(2.0) / all.bytes, ctx, secs, nthreads,
                   nthreads == 1 ? "" : "s", "positions", "tokens", "mean pos", "loss", "bits/byte");
        for (int k = 0; k < nb; k++) {
            if (b[k].tokens == 0) continue;
            double loss = b[k].nll / b[k].tokens, bpb = b[k].nll / log(2.0) / b[k].bytes;
            if (json)
                printf("{\"type\":\"bucket\",\"checkpoint\":%s,\"text\":%s,\"context\":%s,\"lo\":%lld,\"hi\":%lld,"
                       "\"tokens\":%lld,\"bytes\":%lld,\"mean_pos\":%.1f,\"loss\":%.6f,\"bits_per_byte\":%.6f}\n",
                       cj, tj, xj, (long long)b[k].lo, (long long)b[k].hi, (long long)b[k].tokens,
                       (long long)b[k].bytes, b[k].pos_sum / b[k].tokens, loss, bpb);
            else {
                char range[48];
                snprintf(range, sizeof range, "%lld-%lld", (long long)b[k].lo, (long long)b[k].hi);
                printf("%-16s %10lld %10.1f %9.4f %9.4f\n", range, (long long)b[k].tokens, b[k].pos_sum / b[k].tokens,
                       loss, bpb);
            }
        }
        if (json)
            printf("{\"type\":\"total\",\"checkpoint\":%s,\"text\":%s,\"context\":%s,\"tokens\":%lld,\"documents\":%lld,"
                   "\"longest\":%lld,\"tokens_scored\":%lld,\"bytes_scored\":%lld,\"loss\":%.6f,\"bits_per_byte\":%.6f,"
                   "\"perplexity\":%.4f,\"seconds\":%.2f,\"threads\":%d}\n",
                   cj, tj, xj, (long long)n, (long long)docs, (long long)longest, (long long)all.tokens,
                   (long long)all.bytes, all.nll / all.tokens, all.nll / log(2.0) / all.bytes,
                   exp(all.nll / all.tokens), secs, nthreads);
    }
    free(nll);
    free(pos);
    free(tbytes);
    return code;
}

static void free_model(LM *lm, ParamStore *ps, Tokenizer *tok) {
    tokenizer_free(tok);
    lm_destroy(lm);
    params_free(ps);
}

// --logits: a regular file or a new name, and neither the checkpoint nor a
// file of the text.
static Status check_logits_path(const char *path, const char *ckpt, const Corpus *text) {
    Status s = file_check_distinct(path, "logits file (--logits)", ckpt, "checkpoint");
    for (int i = 0; s.ok && i < text->n_files; i++)
        s = file_check_distinct(path, "logits file (--logits)", text->files[i], "text file");
    return s.ok ? file_check_output(path, "logits file") : s;
}

// The command line, parsed.
typedef struct Args {
    const char *ckpt, *text, *logits_path;
    long long window, stride, batch, threads, limit, chunk, seq;
    bool stream, json, val, positions, steps;
    Device device;
    PosOptions po;
} Args;

// Parse argv into *a: -1 to go on, else the exit code (0 after --help).
static int parse_args(int argc, char **argv, Args *a) {
    *a = (Args){.batch = 8, .chunk = 2048, .device = DEVICE_CPU};
    PosOptions *po = &a->po;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        bool has = i + 1 < argc, ok = true, known = true;   // known: an option with its value (its error said)
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(o, "--stream")) a->stream = true;
        else if (!strcmp(o, "--no-prefill")) a->steps = true;
        else if (!strcmp(o, "--json")) a->json = true;
        else if (!strcmp(o, "--val")) a->val = true;
        else if (!strcmp(o, "--positions")) a->positions = true;
        else if (!has) ok = known = false;
        else if (!strcmp(o, "--checkpoint")) a->ckpt = argv[++i];
        else if (!strcmp(o, "--text")) a->text = argv[++i];
        else if (!strcmp(o, "--logits")) a->logits_path = argv[++i];
        else if (!strcmp(o, "--window")) ok = parse_int(o, argv[++i], 1, 1 << 20, &a->window);
        else if (!strcmp(o, "--stride")) ok = parse_int(o, argv[++i], 1, 1 << 20, &a->stride);
        else if (!strcmp(o, "--batch")) ok = parse_int(o, argv[++i], 1, 4096, &a->batch);
        else if (!strcmp(o, "--threads")) ok = parse_int(o, argv[++i], 1, MODEL_MAX_THREADS, &a->threads);
        else if (!strcmp(o, "--limit")) ok = parse_int(o, argv[++i], 2, (long long)1 << 40, &a->limit);
        else if (!strcmp(o, "--chunk")) a->positions = true, ok = parse_int(o, argv[++i], 1, 1 << 20, &a->chunk);
        else if (!strcmp(o, "--seq")) a->positions = true, ok = parse_int(o, argv[++i], 2, INT32_MAX, &a->seq);
        else if (!strcmp(o, "--buckets")) a->positions = true, ok = (po->n_edges = parse_edges(argv[++i], po->edges, 64)) > 0;
        else if (!strcmp(o, "--device")) {
            int d = device_parse(argv[++i]);
            if (d < 0) fprintf(stderr, "evaluate: --device '%.40s': expected cpu or cuda\n", argv[i]);
            else a->device = (Device)d;
            ok = d >= 0;
        } else if (!strcmp(o, "--context")) {
            a->positions = po->context_given = true;
            int c = poseval_context_parse(argv[++i]);
            if (c < 0) fprintf(stderr, "evaluate: --context: '%s' is not carry, full or window\n", argv[i]);
            else po->spec.context = (PosevalContext)c;
            ok = c >= 0;
        } else if (!strcmp(o, "--doc-sep")) {
            a->positions = true;
            po->seplen = doctext_unescape(argv[++i], po->sep, sizeof po->sep);
            if (po->seplen <= 0) fprintf(stderr, "evaluate: --doc-sep: '%s' is empty, too long or has a bad escape\n", argv[i]);
            ok = po->seplen > 0;
        } else ok = known = false;
        if (!ok) {
            if (!known) fprintf(stderr, "evaluate: unknown or incomplete argument '%s' (see evaluate --help)\n", o);
            return 2;
        }
    }
    if (!a->ckpt || (!a->text && !a->val)) {
        fprintf(stderr, "evaluate: --checkpoint FILE and --text FILE are required (see evaluate --help)\n");
        return 2;
    }
    if (a->steps && !a->stream) {
        fprintf(stderr, "evaluate: --no-prefill applies to --stream only\n");
        return 2;
    }
    if (a->positions && (a->stream || a->logits_path)) {
        fprintf(stderr, "evaluate: --positions scores with --context; --stream and --logits do not apply\n");
        return 2;
    }
    return -1;
}

// Score ids[0..n) in windows or as one stream and print the figures; the exit code.
static int score_and_print(LM *lm, const Tokenizer *tok, const Args *a, const char *text, const int *ids, int64_t n,
                           int T, int S, int nthreads) {
    int64_t text_bytes = 0;
    for (int64_t i = 0; i < n; i++) text_bytes += tokenizer_token_len(tok, ids[i]);
    double t0 = runlog_now();
    Status ws = status_ok();
    Score sc = a->stream ? score_stream(lm, tok, ids, n, a->device, a->steps)
                         : score_windows(lm, tok, ids, n, T, S, (int)a->batch, a->logits_path, &ws, a->device);
    if (!ws.ok) fprintf(stderr, "evaluate: --logits: %s\n", ws.msg);
    double secs = runlog_now() - t0;
    int code = ws.ok ? 0 : 1;
    if (a->stream && a->logits_path) fprintf(stderr, "evaluate: --logits is written in window mode only\n");
    if (sc.tokens == 0) {
        fprintf(stderr, "evaluate: %s: fewer than 2 tokens, nothing to score\n", text);
        return 2;
    }
    double loss = sc.nll / (double)sc.tokens;
    double bpb = sc.nll / log(2.0) / (double)sc.bytes;   // per byte of the text the scored tokens stand for
    char mode[64];
    if (a->stream) snprintf(mode, sizeof mode, "stream");
    else snprintf(mode, sizeof mode, "windows of %d, stride %d", T > n - 1 ? (int)(n - 1) : T, S);
    if (a->json) {
        char tj[1100], mj[100];
        printf("{\"text\":%s,\"bytes\":%lld,\"tokens_scored\":%lld,\"bytes_scored\":%lld,\"loss\":%.6f,"
               "\"bits_per_byte\":%.6f,\"perplexity\":%.4f,\"mode\":%s,\"seconds\":%.2f}\n",
               runlog_json_str(text, tj, sizeof tj), (long long)text_bytes, (long long)sc.tokens, (long long)sc.bytes,
               loss, bpb, exp(loss), runlog_json_str(mode, mj, sizeof mj), secs);
    } else {
        printf("evaluate: %s: %lld bytes, %lld tokens scored | loss %.4f nats/token | %.4f bits/byte | "
               "perplexity %.3f | %s | %.1f s, %d thread%s\n",
               text, (long long)text_bytes, (long long)sc.tokens, loss, bpb, exp(loss), mode, secs, nthreads,
               nthreads == 1 ? "" : "s");
    }
    return code;
}

int main(int argc, char **argv) {
    if (program_version(argc, argv, "evaluate")) return 0;
    model_init_process(argv);   // OMP_WAIT_POLICY=PASSIVE unless the user set it
    file_check_stdout_at_exit("evaluate");
    Args a;
    int code = parse_args(argc, argv, &a);
    if (code >= 0) return code;
    const char *ckpt = a.ckpt, *text = a.text;
    PosOptions po = a.po;
    TrainConfig cfg;
    LM lm;
    ParamStore ps;
    Tokenizer tok;
    Status s = model_load_checkpoint(ckpt, &cfg, &lm, &ps, &tok);
    bool loaded = s.ok;   // (on failure the loader frees what it built)
    if (s.ok) run_config_stored_compat(&cfg);
    if (s.ok && !text) text = cfg.data.corpus;
    if (s.ok && a.val && !(cfg.data.val_fraction > 0))
        s = status_err("%s: --val: the run held out no validation split (val_fraction 0)", ckpt);
    Corpus corpus = {0};
    if (s.ok) s = corpus_load(&corpus, text);
    if (s.ok && a.logits_path) s = check_logits_path(a.logits_path, ckpt, &corpus);
    if (s.ok && a.device != DEVICE_CPU) {   // the model is loaded on the host: now its values move
        char err[512];
        if (device_cuda_init(err, sizeof err)) params_to_device(&ps, a.device);
        else s = status_err("--device cuda: %s; or score on the CPU: --device cpu", err);
    }
    int T = a.window ? (int)a.window : cfg.data.seq_len;
    int S = a.stride ? (int)a.stride : (T > 1 ? T / 2 : 1);
    if (s.ok && S > T) s = status_err("--stride %d is more than the window of %d tokens", S, T);
    if (!s.ok) {
        fprintf(stderr, "evaluate: %s\n", s.msg);
        if (loaded) free_model(&lm, &ps, &tok);
        corpus_free(&corpus);
        config_free(&cfg);
        return 2;
    }
    long long threads = a.threads;
    if (!threads && a.stream && a.steps && params_count(&ps, false) < 10000000) threads = 1;   // as generate
    int nthreads = model_set_threads((int)threads);
    blas_select_from_env();   // float32 products on ATTNLAB_GEMM's backend (default auto), as generate
    int *all_ids = xmalloc((size_t)(corpus.n ? corpus.n : 1) * sizeof(int));
    int *all_flags = xmalloc((size_t)(corpus.n ? corpus.n : 1) * sizeof(int));
    int64_t n = doctext_encode(&tok, corpus.bytes, corpus.n, po.seplen ? po.sep : NULL, po.seplen, all_ids, all_flags);
    // --val: the tokens the run held out (the last val_fraction of them, or its
    // documents drawn at random: val_split.h); --limit: the first tokens of that.
    int64_t first = a.val ? n - (int64_t)((double)n * cfg.data.val_fraction) : 0;
    if (a.val && !po.seplen) val_documents(&cfg, &corpus, &tok, &all_ids, &all_flags, &n, &first);
    int *ids = all_ids + first, *flags = all_flags + first;
    n -= first;
    if (a.limit && n > a.limit) n = a.limit;
    if (n > 0) flags[0] = 1;
    if (a.positions) {
        if (a.seq) doctext_cut(flags, n, (int)a.seq);
        po.spec.chunk = (int)a.chunk;
        po.spec.window = T;
        po.spec.stride = S;
        po.spec.batch = (int)a.batch;
        code = run_positions(&lm, &tok, ckpt, text, ids, flags, n, &po, a.json, nthreads, a.device);
    } else {
        code = score_and_print(&lm, &tok, &a, text, ids, n, T, S, nthreads);
    }
    free(all_ids);
    free(all_flags);
    free_model(&lm, &ps, &tok);
    corpus_free(&corpus);
    config_free(&cfg);
    return code;
}
