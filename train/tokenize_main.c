// tokenize: train, use and measure byte-level BPE tokenizers (data/bpe.h).
//
//   tokenize train  --corpus SPEC --vocab N [--special TEXT]... [--pattern P] --out FILE
//   tokenize encode --tokenizer T [--in FILE] [--out FILE] [--allow-special] [--max-input BYTES]
//   tokenize decode --tokenizer T [--in FILE] [--out FILE] [--max-input BYTES]
//   tokenize stats  --tokenizer T --in FILE [--max-input BYTES]
//
// T is a tiktoken encoding name (gpt2, r50k_base, cl100k_base, o200k_base) or
// a tokenizer file. Ids are decimal text, space-separated, on one line.
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "version.h"
#include "bpe.h"
#include "bpe_split.h"
#include "bpe_train.h"
#include "corpus.h"
#include "fileio.h"

#include "fileio.h"

#define MAX_SPECIALS 64
#define INPUT_MAX_DEFAULT (256LL << 20)   // bytes of input read by default (a byte can cost 4 more as an id)
#define INPUT_MAX_LIMIT (1LL << 40)

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
    "  --pattern P      split pattern: gpt2, cl100k_base (default) or o200k_base (tiktoken's; no other\n"
    "                   regex is accepted: one could take time exponential in the text)\n"
    "  --out FILE       the tokenizer file to write (gzip'd if it ends in .gz)\n"
    "Progress goes to stderr.\n";

static const char *HELP_ENCODE =
    "usage: tokenize encode --tokenizer T [--in FILE] [--out FILE] [--allow-special] [--max-input BYTES]\n"
    "  --tokenizer T     gpt2, r50k_base, cl100k_base, o200k_base, or a tokenizer file\n"
    "  --in FILE         text to encode, a regular file (default: stdin)\n"
    "  --out FILE        where the ids go, decimal, space-separated, one line (default: stdout)\n"
    "  --allow-special   special tokens' text encodes as their ids (default: as ordinary text)\n"
    "  --max-input N     read at most N bytes (default 268435456; the text and its ids are in memory)\n";

static const char *HELP_DECODE =
    "usage: tokenize decode --tokenizer T [--in FILE] [--out FILE] [--max-input BYTES]\n"
    "  --tokenizer T   gpt2, r50k_base, cl100k_base, o200k_base, or a tokenizer file\n"
    "  --in FILE       ids, decimal, separated by white space, a regular file (default: stdin)\n"
    "  --out FILE      the bytes (default: stdout)\n"
    "  --max-input N   read at most N bytes (default 268435456)\n";

static const char *HELP_STATS =
    "usage: tokenize stats --tokenizer T --in FILE [--max-input BYTES]\n"
    "  --tokenizer T   gpt2, r50k_base, cl100k_base, o200k_base, or a tokenizer file\n"
    "  --in FILE       the text to measure\n"
    "  --max-input N   read at most N bytes (default 268435456)\n"
    "Prints bytes, tokens, bytes per token and the encoding speed (one thread).\n";

typedef struct Args {
    const char *corpus, *pattern, *out, *in, *tokenizer;
    const char *specials[MAX_SPECIALS];
    int n_specials;
    long vocab;
    long long max_input;
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
    Args a = {.vocab = -1, .max_input = INPUT_MAX_DEFAULT};
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
        } else if (strcmp(opt, "--max-input") == 0) {
            char *end;
            errno = 0;
            long long n = strtoll(v, &end, 10);
            if (errno || end == v || *end || n < 1 || n > INPUT_MAX_LIMIT)
                usage_error(cmd, "--max-input '%s': not a whole number of bytes in [1, 2^40]", v);
            a.max_input = n;
        }
    }
    return a;
}

// The whole input in memory (ids take 4 bytes a byte more): at most max
// bytes, so that a endless stream (/dev/zero) is refused instead of growing
// until the machine runs out of memory. --in must be a regular file (a FIFO
// or a directory is refused with what it is); a pipe comes on stdin.
static size_t size_min(size_t a, size_t b) { return a < b ? a : b; }

static uint8_t *read_all(const char *cmd, const char *path, int64_t max, int64_t *n) {
    uint8_t *buf;
    char msg[1200];
    if (path) {
        Status st = file_read_all(path, "input", max, &buf, n);
        if (st.ok) return buf;
        snprintf(msg, sizeof msg, "%s%s", st.msg,
                 strstr(st.msg, " this program reads") ? " (raise it with --max-input BYTES, or split the file)" : "");
        fail(cmd, msg);
    }
    size_t cap = 1 << 16, got = 0;
    buf = xmalloc(cap);
    // (never more than max + 1 bytes: one past the limit tells it is exceeded)
    for (size_t r; (r = fread(buf + got, 1, size_min(cap - got - 1, (size_t)max + 1 - got), stdin)) > 0;) {
        got += r;
        if ((int64_t)got > max) {
            snprintf(msg, sizeof msg, "standard input: more than %lld bytes, the limit (raise it with --max-input BYTES, "
                     "or split the text)", (long long)max);
            fail(cmd, msg);
        }
        if (got == cap - 1) buf = xrealloc(buf, cap *= 2);
    }
    if (ferror(stdin)) {
        snprintf(msg, sizeof msg, "standard input: cannot read: %s", strerror(errno));
        fail(cmd, msg);
    }
    buf[got] = 0;
    *n = (int64_t)got;
    return buf;
}

// --out is written whole or not at all (fileio.h), and never over an input:
// the text read (--in) or the tokenizer file.
static FileOut out_file;

static FILE *open_out(const char *cmd, const Args *a) {
    if (!a->out) return stdout;
    Status st = file_check_distinct(a->out, "output (--out)", a->in, "input (--in)");
    if (st.ok && access(a->tokenizer, F_OK) == 0)   // (not a file: a tiktoken encoding's name)
        st = file_check_distinct(a->out, "output (--out)", a->tokenizer, "tokenizer file");
    if (st.ok) st = file_out_open(&out_file, a->out, "output", 0);
    if (!st.ok) fail(cmd, st.msg);
    return file_out_stream(&out_file);
}

static void close_out(const char *cmd, FILE *f) {
    if (f == stdout) return;   // (checked at exit: file_check_stdout_at_exit)
    Status st = file_out_commit(&out_file);
    if (!st.ok) fail(cmd, st.msg);
}

// tokenize train's --out: a regular file or a new name, and no file of the
// corpus (checked before the training, which can take long).
static void check_train_out(const char *out, const Corpus *c) {
    Status st = file_check_output(out, "tokenizer file");
    for (int i = 0; st.ok && i < c->n_files; i++)
        st = file_check_distinct(out, "tokenizer file (--out)", c->files[i], "corpus file");
    if (!st.ok) fail("train", st.msg);
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
    const char *pattern = a.pattern ? bpe_pattern_named(a.pattern) : NULL;
    if (a.pattern && !pattern)
        usage_error("train", "--pattern '%s': not gpt2, cl100k_base or o200k_base (no other regex is accepted: one "
                    "could take time exponential in the text)", a.pattern);
    Corpus c;
    Status st = corpus_load(&c, a.corpus);
    if (!st.ok) fail("train", st.msg);
    check_train_out(a.out, &c);
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
    Args a = parse_args("encode", argc, argv, " --tokenizer --in --out --allow-special --max-input ", HELP_ENCODE);
    Bpe *b = open_tokenizer("encode", a.tokenizer);
    int64_t n;
    uint8_t *text = read_all("encode", a.in, a.max_input, &n);
    int *ids = xmalloc((size_t)(n + 1) * sizeof *ids);
    Status st;
    int64_t m = bpe_encode_checked(b, text, n, ids, a.allow_special ? BPE_ALLOW_SPECIAL : 0, &st);
    if (m < 0) {
        free(ids), free(text), bpe_free(b);
        fail("encode", st.msg);
    }
    FILE *f = open_out("encode", &a);
    for (int64_t i = 0; i < m; i++) fprintf(f, i ? " %d" : "%d", ids[i]);
    fputc('\n', f);
    close_out("encode", f);
    free(ids), free(text), bpe_free(b);
    return 0;
}

// Up to 20 bytes of [p, stop) for a message: printable ASCII as it is, any other byte as \xNN.
static void excerpt(char out[96], const char *p, const char *stop) {
    size_t k = 0;
    for (int i = 0; i < 20 && p + i < stop; i++) {
        unsigned char c = (unsigned char)p[i];
        k += (size_t)snprintf(out + k, 96 - k, c >= 32 && c < 127 && c != '\\' ? "%c" : "\\x%02x", c);
    }
    out[k] = 0;
}

// A byte between ids: white space as Python's split takes it (a NUL is not).
static bool id_sep(char c) { return c && strchr(" \n\t\r\v\f", c); }

static int cmd_decode(int argc, char **argv) {
    Args a = parse_args("decode", argc, argv, " --tokenizer --in --out --max-input ", HELP_DECODE);
    Bpe *b = open_tokenizer("decode", a.tokenizer);
    int64_t n, m = 0;
    char *text = (char *)read_all("decode", a.in, a.max_input, &n), *p = text, *stop = text + n;
    int *ids = xmalloc((size_t)(n / 2 + 1) * sizeof *ids);
    // Ids in decimal between id_sep bytes; any other byte, a NUL included
    // (the whole input is read, not a C string up to its first NUL), is not an id.
    for (;;) {
        while (p < stop && id_sep(*p)) p++;
        if (p == stop) break;
        char *end;
        errno = 0;
        long v = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : (end = p, 0);   // (strtol takes "+5", " 5")
        if (end == p || errno || v > INT_MAX || (end < stop && !id_sep(*end))) {
            char msg[200], at[96];
            excerpt(at, p, stop);
            snprintf(msg, sizeof msg, "token %lld: '%s' is not an id (a whole number >= 0)", (long long)m, at);
            free(ids), free(text), bpe_free(b);   // (nothing left for LeakSanitizer at the exit)
            fail("decode", msg);
        }
        ids[m++] = (int)v;
        p = end;
    }
    Status st;
    int64_t len;
    uint8_t *bytes = bpe_decode(b, ids, m, &len, &st);
    if (!bytes) {
        free(ids), free(text), bpe_free(b);
        fail("decode", st.msg);
    }
    FILE *f = open_out("decode", &a);
    fwrite(bytes, 1, (size_t)len, f);
    close_out("decode", f);
    free(bytes), free(ids), free(text), bpe_free(b);
    return 0;
}

static int cmd_stats(int argc, char **argv) {
    Args a = parse_args("stats", argc, argv, " --tokenizer --in --max-input ", HELP_STATS);
    if (!a.in) usage_error("stats", "--in is required%s", "");
    Bpe *b = open_tokenizer("stats", a.tokenizer);
    int64_t n;
    uint8_t *text = read_all("stats", a.in, a.max_input, &n);
    int *ids = xmalloc((size_t)(n + 1) * sizeof *ids);
    double t0 = now();
    Status st;
    int64_t m = bpe_encode_checked(b, text, n, ids, 0, &st);
    if (m < 0) fail("stats", st.msg);
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
    file_check_stdout_at_exit("tokenize");
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
