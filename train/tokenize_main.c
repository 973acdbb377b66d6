// tokenize: train, use and measure byte-level BPE tokenizers (data/bpe.h).
//
//   tokenize train  --corpus SPEC --vocab N [--special TEXT]... [--pattern P] --out FILE
//   tokenize encode --tokenizer T [--in FILE] [--out FILE] [--allow-special]
//   tokenize decode --tokenizer T [--in FILE] [--out FILE]
//   tokenize stats  --tokenizer T --in FILE
//
// T is a tiktoken encoding name (gpt2, r50k_base, cl100k_base, o200k_base) or
// a tokenizer file. Ids are decimal text, space-separated, on one line.
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "version.h"
#include "bpe.h"
#include "bpe_split.h"
#include "bpe_train.h"
#include "corpus.h"

#define MAX_SPECIALS 64

static const char *USAGE =
    "usage: tokenize COMMAND [options]   (tokenize COMMAND --help for its options)\n"
    "  train    learn a BPE tokenizer from a corpus\n"
    "  encode   text -> token ids\n"
    "  decode   token ids -> text\n"
    "  stats    bytes per token of a tokenizer on a file\n";

static const char *HELP_TRAIN =
    "usage: tokenize train --corpus SPEC --vocab N [--special TEXT]... [--pattern P] --out FILE\n"
    "  --corpus SPEC    a file, a comma list of files, or a directory (its files, sorted)\n"
    "  --vocab N        ids in all: 256 bytes + merges + special tokens, 256 + specials .. 4194304\n"
    "  --special TEXT   a special token (repeatable), e.g. '<|endoftext|>'; the corpus is cut at its\n"
    "                   occurrences (document boundaries); specials take the last ids\n"
    "  --pattern P      split pattern: gpt2, cl100k_base (default), o200k_base, or a regex (tiktoken syntax)\n"
    "  --out FILE       the tokenizer file to write (gzip'd if it ends in .gz)\n"
    "Progress goes to stderr.\n";

static const char *HELP_ENCODE =
    "usage: tokenize encode --tokenizer T [--in FILE] [--out FILE] [--allow-special]\n"
    "  --tokenizer T     gpt2, r50k_base, cl100k_base, o200k_base, or a tokenizer file\n"
    "  --in FILE         text to encode (default: stdin)\n"
    "  --out FILE        where the ids go, decimal, space-separated, one line (default: stdout)\n"
    "  --allow-special   special tokens' text encodes as their ids (default: as ordinary text)\n";

static const char *HELP_DECODE =
    "usage: tokenize decode --tokenizer T [--in FILE] [--out FILE]\n"
    "  --tokenizer T   gpt2, r50k_base, cl100k_base, o200k_base, or a tokenizer file\n"
    "  --in FILE       ids, decimal, separated by white space (default: stdin)\n"
    "  --out FILE      the bytes (default: stdout)\n";

static const char *HELP_STATS =
    "usage: tokenize stats --tokenizer T --in FILE\n"
    "  --tokenizer T   gpt2, r50k_base, cl100k_base, o200k_base, or a tokenizer file\n"
    "  --in FILE       the text to measure\n"
    "Prints bytes, tokens, bytes per token and the encoding speed (one thread).\n";

typedef struct Args {
    const char *corpus, *pattern, *out, *in, *tokenizer;
    const char *specials[MAX_SPECIALS];
    int n_specials;
    long vocab;
    bool allow_special;
} Args;

static _Noreturn void usage_error(const char *cmd, const char *fmt, const char *arg) {
    fprintf(stderr, "tokenize %s: ", cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (tokenize %s --help)\n", cmd);
    exit(2);
}

static _Noreturn void fail(const char *cmd, const char *msg) {
    fprintf(stderr, "tokenize %s: %s\n", cmd, msg);
    exit(1);
}

// Options of one command; `allowed` lists the option names it takes.
static Args parse_args(const char *cmd, int argc, char **argv, const char *allowed, const char *help) {
    Args a = {.vocab = -1};
    for (int i = 0; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--help") == 0 || strcmp(opt, "-h") == 0) {
            fputs(help, stdout);
            exit(0);
        }
        char key[64];
        snprintf(key, sizeof key, " %s ", opt);
        if (strncmp(opt, "--", 2) != 0 || !strstr(allowed, key)) usage_error(cmd, "unknown option '%s'", opt);
        if (strcmp(opt, "--allow-special") == 0) {
            a.allow_special = true;
            continue;
        }
        if (i + 1 >= argc) usage_error(cmd, "%s needs a value", opt);
        const char *v = argv[++i];
        if (strcmp(opt, "--corpus") == 0) a.corpus = v;
        else if (strcmp(opt, "--pattern") == 0) a.pattern = v;
        else if (strcmp(opt, "--out") == 0) a.out = v;
        else if (strcmp(opt, "--in") == 0) a.in = v;
        else if (strcmp(opt, "--tokenizer") == 0) a.tokenizer = v;
        else if (strcmp(opt, "--special") == 0) {
            if (a.n_specials == MAX_SPECIALS) usage_error(cmd, "more than 64 --special options%s", "");
            if (!*v) usage_error(cmd, "--special: empty text%s", "");
            a.specials[a.n_specials++] = v;
        } else if (strcmp(opt, "--vocab") == 0) {
            char *end;
            errno = 0;
            long n = strtol(v, &end, 10);
            if (errno || end == v || *end || n < 256 || n > BPE_VOCAB_MAX)
                usage_error(cmd, "--vocab '%s': not a whole number in [256, 4194304]", v);
            a.vocab = n;
        }
    }
    return a;
}

static uint8_t *read_all(const char *cmd, const char *path, int64_t *n) {
    FILE *f = path ? fopen(path, "rb") : stdin;
    if (!f) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s: %s", path, strerror(errno));
        fail(cmd, msg);
    }
    size_t cap = 1 << 16, got = 0;
    uint8_t *buf = xmalloc(cap);
    for (size_t r; (r = fread(buf + got, 1, cap - got - 1, f)) > 0;) {
        got += r;
        if (got == cap - 1) buf = xrealloc(buf, cap *= 2);
    }
    bool err = ferror(f);
    if (path) fclose(f);
    if (err) fail(cmd, "read error");
    buf[got] = 0;
    *n = (int64_t)got;
    return buf;
}

static FILE *open_out(const char *cmd, const char *path) {
    if (!path) return stdout;
    FILE *f = fopen(path, "wb");
    if (!f) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s: %s", path, strerror(errno));
        fail(cmd, msg);
    }
    return f;
}

static void close_out(const char *cmd, FILE *f) {
    if (fflush(f) != 0 || ferror(f) || (f != stdout && fclose(f) != 0)) fail(cmd, "write error");
}

static Bpe *open_tokenizer(const char *cmd, const char *spec) {
    if (!spec) usage_error(cmd, "--tokenizer is required%s", "");
    Status st;
    Bpe *b = bpe_open(spec, &st);
    if (!b) fail(cmd, st.msg);
    return b;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double train_t0, last_shown;
static void progress(void *ctx, const char *stage, int64_t done, int64_t total) {
    if (now() - last_shown < 0.25 && done < total) return;   // a few lines a second
    last_shown = now();
    fprintf(stderr, "\rtokenize train: %-5s %5.1f%%  (%lld / %lld)  %.1f s   ", stage,
            100.0 * (double)done / (double)(total ? total : 1), (long long)done, (long long)total, now() - train_t0);
}

static int cmd_train(int argc, char **argv) {
    Args a = parse_args("train", argc, argv, " --corpus --vocab --special --pattern --out ", HELP_TRAIN);
    if (!a.corpus) usage_error("train", "--corpus is required%s", "");
    if (a.vocab < 0) usage_error("train", "--vocab is required%s", "");
    if (!a.out) usage_error("train", "--out is required%s", "");
    if (a.vocab < 256 + a.n_specials) usage_error("train", "--vocab must leave room for the 256 bytes and the %s",
                                                  "special tokens");
    const char *pattern = a.pattern ? bpe_pattern_named(a.pattern) ? bpe_pattern_named(a.pattern) : a.pattern : NULL;
    Corpus c;
    Status st = corpus_load(&c, a.corpus);
    if (!st.ok) fail("train", st.msg);
    BpeTrainOpts o = {.vocab = (int)a.vocab, .pattern = pattern, .specials = a.specials, .n_specials = a.n_specials,
                      .progress = progress};
    train_t0 = now();
    uint8_t *file;
    size_t len;
    BpeTrainStats s;
    st = bpe_train(c.bytes, c.n, &o, &file, &len, &s);
    fprintf(stderr, "\n");
    if (!st.ok) fail("train", st.msg);
    double secs = now() - train_t0;
    Bpe *b = bpe_from_buffer(file, len, a.out, &st);
    if (!b) fail("train", st.msg);
    st = bpe_save(b, a.out);
    if (!st.ok) fail("train", st.msg);
    fprintf(stderr, "tokenize train: %lld bytes, %lld pieces (%lld distinct), %d merges, vocabulary %d, %.2f s -> %s\n",
            (long long)c.n, (long long)s.pieces, (long long)s.unique_pieces, s.merges, s.vocab, secs, a.out);
    if (s.vocab < a.vocab)
        fprintf(stderr, "tokenize train: the corpus ran out of pairs: vocabulary %d of the %ld asked\n", s.vocab, a.vocab);
    bpe_free(b), free(file), corpus_free(&c);
    return 0;
}

static int cmd_encode(int argc, char **argv) {
    Args a = parse_args("encode", argc, argv, " --tokenizer --in --out --allow-special ", HELP_ENCODE);
    Bpe *b = open_tokenizer("encode", a.tokenizer);
    int64_t n;
    uint8_t *text = read_all("encode", a.in, &n);
    int *ids = xmalloc((size_t)(n + 1) * sizeof *ids);
    int64_t m = bpe_encode(b, text, n, ids, a.allow_special ? BPE_ALLOW_SPECIAL : 0);
    FILE *f = open_out("encode", a.out);
    for (int64_t i = 0; i < m; i++) fprintf(f, i ? " %d" : "%d", ids[i]);
    fputc('\n', f);
    close_out("encode", f);
    free(ids), free(text), bpe_free(b);
    return 0;
}

static int cmd_decode(int argc, char **argv) {
    Args a = parse_args("decode", argc, argv, " --tokenizer --in --out ", HELP_DECODE);
    Bpe *b = open_tokenizer("decode", a.tokenizer);
    int64_t n, m = 0;
    char *text = (char *)read_all("decode", a.in, &n), *p = text;
    int *ids = xmalloc((size_t)(n / 2 + 1) * sizeof *ids);
    for (;;) {
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT_MAX || (*end && !strchr(" \n\t\r", *end))) {
            char msg[128];
            snprintf(msg, sizeof msg, "token %lld: '%.20s' is not an id (a whole number >= 0)", (long long)m, p);
            fail("decode", msg);
        }
        ids[m++] = (int)v;
        p = end;
    }
    Status st;
    int64_t len;
    uint8_t *bytes = bpe_decode(b, ids, m, &len, &st);
    if (!bytes) fail("decode", st.msg);
    FILE *f = open_out("decode", a.out);
    fwrite(bytes, 1, (size_t)len, f);
    close_out("decode", f);
    free(bytes), free(ids), free(text), bpe_free(b);
    return 0;
}

static int cmd_stats(int argc, char **argv) {
    Args a = parse_args("stats", argc, argv, " --tokenizer --in ", HELP_STATS);
    if (!a.in) usage_error("stats", "--in is required%s", "");
    Bpe *b = open_tokenizer("stats", a.tokenizer);
    int64_t n;
    uint8_t *text = read_all("stats", a.in, &n);
    int *ids = xmalloc((size_t)(n + 1) * sizeof *ids);
    double t0 = now();
    int64_t m = bpe_encode(b, text, n, ids, 0);
    double secs = now() - t0;
    printf("%s: %lld bytes, %lld tokens, %.3f bytes/token, vocabulary %d; encoded in %.3f s (%.1f MB/s, one thread)\n",
           a.in, (long long)n, (long long)m, m ? (double)n / (double)m : 0.0, bpe_vocab_size(b), secs,
           secs > 0 ? (double)n / secs / 1e6 : 0.0);
    free(ids), free(text), bpe_free(b);
    return 0;
}

int main(int argc, char **argv) {
    if (program_version(argc, argv, "tokenize")) return 0;
    if (argc < 2) {
        fputs(USAGE, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(USAGE, stdout);
        return 0;
    }
    if (strcmp(cmd, "train") == 0) return cmd_train(argc - 2, argv + 2);
    if (strcmp(cmd, "encode") == 0) return cmd_encode(argc - 2, argv + 2);
    if (strcmp(cmd, "decode") == 0) return cmd_decode(argc - 2, argv + 2);
    if (strcmp(cmd, "stats") == 0) return cmd_stats(argc - 2, argv + 2);
    fprintf(stderr, "tokenize: unknown command '%s'\n%s", cmd, USAGE);
    return 2;
}
