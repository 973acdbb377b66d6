// Hostile tokenizers and inputs (data/bpe*.c, data/tokenizer.c, tokenize):
// a split pattern that backtracks catastrophically, sparse ids, a FIFO for a
// file, endless input. Each is refused with a sentence, or stopped by a limit
// on work, never by an abort or a hang. The inputs from the attacks are in
// tests/fixtures/hostile/.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bpe.h"
#include "bpe_split.h"
#include "bpe_train.h"
#include "test_util.h"
#include "tokenizer.h"

#define HOSTILE SOURCE_DIR "/tests/fixtures/hostile/"

static const char *const KNOWN[] = {"gpt2", "cl100k_base", "o200k_base"};

// Split text whole; returns PCRE2's error (0: none) and checks the pieces
// tile the text, each at most BPE_PIECE_MAX bytes. *pieces: their count.
static int split_all(const BpeSplit *s, const uint8_t *t, int64_t n, int64_t *pieces, Status *st) {
    BpeSplitIter it;
    bpe_split_begin(&it, s, t, n);
    int64_t a, b, pos = 0, k = 0;
    while (bpe_split_next(&it, &a, &b)) {
        cr_assert(a == pos && b > a && b - a <= BPE_PIECE_MAX, "piece [%lld, %lld) after %lld", (long long)a,
                  (long long)b, (long long)pos);
        pos = b, k++;
    }
    int err = it.error;
    *st = bpe_split_status(&it, 0);
    if (!err) cr_assert_eq(pos, n, "the pieces stop at %lld of %lld", (long long)pos, (long long)n);
    bpe_split_end(&it);
    if (pieces) *pieces = k;
    return err;
}

static uint8_t *repeat(const char *unit, int64_t n, const char *tail, int64_t *len) {
    size_t u = strlen(unit), tl = strlen(tail);
    uint8_t *b = malloc((size_t)n + tl + 1);
    int64_t o = 0;
    for (; o + (int64_t)u <= n; o += (int64_t)u) memcpy(b + o, unit, u);
    memcpy(b + o, tail, tl);
    *len = o + (int64_t)tl;
    return b;
}

// The attacks' tokenizer files: a pattern other than the known ones is
// refused when the file loads, before any text meets it.
Test(bpe_hostile, catastrophic_patterns_refused_at_load) {
    const char *files[] = {"redos_pattern.tok", "nested_quantifier_pattern.tok"};
    for (int i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s%s", HOSTILE, files[i]);
        Status st;
        cr_assert_null(bpe_load(path, &st), "%s loaded", files[i]);
        char want[1200];
        snprintf(want, sizeof want, "%s:2: split pattern: not one of the known patterns", path);
        cr_assert(strstr(st.msg, want) == st.msg, "%s", st.msg);
        // A checkpoint's /tokenizer goes through the same parser (checkpoint_read_tokenizer).
        char *text = test_read_file(path);
        Tokenizer t;
        st = tokenizer_from_buffer(&t, (const uint8_t *)text, strlen(text), "ckpt.h5: /tokenizer");
        cr_assert(!st.ok && strstr(st.msg, "ckpt.h5: /tokenizer:2: split pattern: not one of the known"), "%s",
                  st.msg);
        free(text);
    }
    Status st;
    BpeTrainOpts o = {.vocab = 300, .pattern = "(a|a)*c|\\s+|[^a]+|a"};
    uint8_t *f;
    size_t n;
    st = bpe_train((const uint8_t *)"aaaa", 4, &o, &f, &n, NULL);
    cr_assert(strstr(st.msg, "split pattern: not one of the known patterns"), "%s", st.msg);
    cr_assert(bpe_pattern_known(bpe_pattern_named("o200k_base")) && bpe_pattern_known("\\S+|\\s+"));
}

// Should such a pattern be compiled anyway (bpe_split_new_any, for tests), the
// limits stop it on the attacks' texts at the first piece: PCRE2's match
// limit, reported with the piece's offset, in the JIT and the interpreter.
// (The work is bounded by the limit, which is what is asserted, not a time.)
Test(bpe_hostile, split_limits_stop_catastrophic_backtracking, .timeout = 120) {
    const char *patterns[] = {"(a|a)*c|\\s+|[^a]+|a", "((((((((((a*)*)*)*)*)*)*)*)*)*)b|\\s+|[^\\s]+"};
    const char *texts[] = {HOSTILE "a40.txt", HOSTILE "a28x20.txt"};
    for (int p = 0; p < 2; p++) {
        Status st;
        BpeSplit *s = bpe_split_new_any(patterns[p], &st);
        cr_assert_not_null(s, "%s", st.msg);
        for (int t = 0; t < 2; t++) {
            for (int interp = 0; interp < 2; interp++) {
                bpe_split_limits.interpreter = interp;
                char *text = test_read_file(texts[t]);
                int err = split_all(s, (const uint8_t *)text, (int64_t)strlen(text), NULL, &st);
                cr_assert_eq(err, PCRE2_ERROR_MATCHLIMIT, "pattern %d on %s (interpreter %d): error %d", p, texts[t],
                             interp, err);
                cr_assert(strstr(st.msg, "the split pattern gave up on the piece at byte 0 of the text: match limit "
                                         "exceeded"), "%s", st.msg);
                free(text);
            }
        }
        bpe_split_free(s);
    }
    // The error and its offset through bpe_encode_checked, which names the
    // tokenizer: a limit too low for anything, after a special token.
    Tokenizer tk;
    Status st = tokenizer_open(&tk, "gpt2");
    cr_assert(st.ok, "%s", st.msg);
    bpe_split_limits.match = 1;
    int ids[64];
    const char *x = "<|endoftext|>abc def";
    cr_assert_eq(bpe_encode_checked(tk.bpe, (const uint8_t *)x, (int64_t)strlen(x), ids, BPE_ALLOW_SPECIAL, &st), -1);
    cr_assert(strstr(st.msg, "tokenizer ") == st.msg && strstr(st.msg, "r50k_base.tiktoken.gz: the split pattern gave "
                                                                       "up on the piece at byte 13 of the text"),
              "%s", st.msg);
    tokenizer_free(&tk);
    bpe_split_limits.match = 1u << 25;
}

// The known patterns never reach the limits: runs far longer than any text
// holds (each pattern's backtracking worst cases: white space before a
// non-space, letters, digits, marks, invalid bytes) split without an error,
// in pieces of at most BPE_PIECE_MAX bytes, in the JIT and the interpreter.
Test(bpe_hostile, known_patterns_stay_within_limits, .timeout = 300) {
    const char *units[] = {" ", "\n", "\t ", "a", "A", "1", "!", "\xcc\x81", "\xff", "\xe3\x80\x80"};
    const char *tails[] = {"x", "1"};
    int64_t n = BPE_PIECE_MAX + BPE_PIECE_MAX / 2;
    for (int p = 0; p < 3; p++) {
        Status st;
        BpeSplit *s = bpe_split_new(bpe_pattern_named(KNOWN[p]), &st);
        cr_assert_not_null(s, "%s", st.msg);
        for (size_t u = 0; u < sizeof units / sizeof *units; u++) {
            for (int t = 0; t < 2; t++) {
                int64_t len, pieces;
                uint8_t *text = repeat(units[u], n, tails[t], &len);
                for (int interp = 0; interp < 2; interp++) {
                    bpe_split_limits.interpreter = interp;
                    int err = split_all(s, text, len, &pieces, &st);
                    cr_assert_eq(err, 0, "%s on unit %zu tail %d (interpreter %d): %s", KNOWN[p], u, t, interp, st.msg);
                }
                free(text);
            }
        }
        bpe_split_free(s);
    }
}

// The search's window grows until the match does not depend on where it
// ends, so pieces shorter than BPE_PIECE_MAX come out as one search over the
// whole text gives them: runs around the window's sizes (256, 4096, 65536)
// of each kind of character, followed by others.
Test(bpe_hostile, window_does_not_change_the_split, .timeout = 300) {
    const char *units[] = {" ", "\n", "a", "A", "1", "!", "\xc3\xa9", "\xff", " a"};
    const int64_t lens[] = {255, 256, 257, 4095, 4096, 4097, 65537};
    uint8_t *text = malloc(1 << 20);
    int64_t n = 0;
    for (size_t u = 0; u < sizeof units / sizeof *units; u++) {
        for (size_t l = 0; l < sizeof lens / sizeof *lens; l++) {
            int64_t len;
            uint8_t *run = repeat(units[u], lens[l], (u + l) % 2 ? " x\n" : "A1 ", &len);
            memcpy(text + n, run, (size_t)len);
            n += len;
            free(run);
        }
    }
    cr_assert_lt(n, BPE_PIECE_MAX);
    for (int p = 0; p < 3; p++) {
        Status st;
        BpeSplit *s = bpe_split_new(bpe_pattern_named(KNOWN[p]), &st);
        int64_t *cut[2], k[2];
        for (int w = 0; w < 2; w++) {   // the windows from 256 bytes, then one window over everything
            bpe_split_limits.window_min = w ? BPE_PIECE_MAX : 256;
            cut[w] = malloc((size_t)n * sizeof **cut);
            BpeSplitIter it;
            bpe_split_begin(&it, s, text, n);
            int64_t a, b;
            for (k[w] = 0; bpe_split_next(&it, &a, &b);) cut[w][k[w]++] = b;
            cr_assert_eq(it.error, 0);
            bpe_split_end(&it);
        }
        cr_assert_eq(k[0], k[1], "%s: %lld pieces with windows, %lld without", KNOWN[p], (long long)k[0],
                     (long long)k[1]);
        cr_assert_eq(memcmp(cut[0], cut[1], (size_t)k[0] * sizeof **cut), 0, "%s: the pieces differ", KNOWN[p]);
        free(cut[0]), free(cut[1]);
        bpe_split_free(s);
    }
    free(text);
}

// One piece longer than BPE_PIECE_MAX (a run of one letter) is cut at a
// character boundary, so the merging of a piece takes bounded memory; the
// text still encodes and decodes to itself.
Test(bpe_hostile, huge_piece_cut_at_characters, .timeout = 300) {
    int64_t n;
    uint8_t *text = repeat("\xc3\xa9", BPE_PIECE_MAX + 1001, "", &n);   // é: two bytes, never cut apart
    Tokenizer tk;
    Status st = tokenizer_open(&tk, "cl100k_base");
    cr_assert(st.ok, "%s", st.msg);
    BpeSplit *s = bpe_split_new(bpe_pattern_named("cl100k_base"), &st);
    BpeSplitIter it;
    bpe_split_begin(&it, s, text, n);
    int64_t a, b, pieces = 0;
    while (bpe_split_next(&it, &a, &b)) {
        cr_assert(b - a <= BPE_PIECE_MAX && (b - a) % 2 == 0, "piece [%lld, %lld)", (long long)a, (long long)b);
        pieces++;
    }
    cr_assert_eq(pieces, 2);
    bpe_split_end(&it);
    bpe_split_free(s);
    int *ids = malloc((size_t)n * sizeof *ids);
    int64_t m = bpe_encode_checked(tk.bpe, text, n, ids, 0, &st), len;
    cr_assert(m > 0, "%s", st.msg);
    uint8_t *back = bpe_decode(tk.bpe, ids, m, &len, &st);
    cr_assert(back && len == n && memcmp(back, text, (size_t)n) == 0);
    free(back), free(ids), free(text);
    tokenizer_free(&tk);
}

// A tokenizer file of the 256 bytes (ranks 0..255) and one special of this id.
static int special_after_bytes(char *buf, int id) {
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    int o = sprintf(buf, "#attnlab-bpe 1\n#pattern \\S+|\\s+\n#special %d <|far|>\n", id);
    for (int c = 0; c < 256; c++) o += sprintf(buf + o, "%c%c== %d\n", b64[c >> 2], b64[(c & 3) << 4], c);
    return o;
}

// Ids must be dense: ranks 0..N-1, specials within BPE_SPECIALS_MAX after
// them. One far rank would make a model of millions of embedding rows; an id
// without bytes would be one a model could emit and nothing could print.
Test(bpe_hostile, sparse_ids_refused) {
    Status st;
    cr_assert_null(bpe_load(HOSTILE "huge_rank_4194303.tok", &st));
    cr_assert_str_eq(st.msg, HOSTILE "huge_rank_4194303.tok:303: rank 4194303, but no token has id 300: ranks must "
                                     "be 0 to 300 with none missing");
    cr_assert_null(bpe_load(HOSTILE "sparse_ids_hole.tok", &st));
    cr_assert_str_eq(st.msg, HOSTILE "sparse_ids_hole.tok:259: rank 1000, but no token has id 256: ranks must be 0 to "
                                     "256 with none missing");
    // A special far after the ranks, and the last id allowed.
    char buf[8192];
    int n = special_after_bytes(buf, 256 + BPE_SPECIALS_MAX);
    cr_assert_null(bpe_from_buffer((const uint8_t *)buf, (size_t)n, "far.tok", &st));
    cr_assert_str_eq(st.msg, "far.tok:3: special token id 1280: more than 1024 ids after the last rank (255)");
    n = special_after_bytes(buf, 255 + BPE_SPECIALS_MAX);
    Bpe *b = bpe_from_buffer((const uint8_t *)buf, (size_t)n, "near.tok", &st);
    cr_assert_not_null(b, "%s", st.msg);
    cr_assert_eq(bpe_vocab_size(b), 256 + BPE_SPECIALS_MAX);
    bpe_free(b);
}

// A FIFO named as a tokenizer file is refused without opening it for good
// (which would wait for a writer forever).
Test(bpe_hostile, fifo_tokenizer_refused, .timeout = 30) {
    char path[1200];
    snprintf(path, sizeof path, "%s/tok.fifo", test_tmpdir("bpe_fifo"));
    cr_assert_eq(mkfifo(path, 0600), 0);
    Status st;
    cr_assert_null(bpe_load(path, &st));
    char want[1400];
    snprintf(want, sizeof want, "%s: the tokenizer file is a FIFO (named pipe), not a regular file", path);
    cr_assert_str_eq(st.msg, want);
    Tokenizer t;
    st = tokenizer_open(&t, path);
    cr_assert_str_eq(st.msg, want);
}

// bpe:N with no valid N says which N are valid (and names no file).
Test(bpe_hostile, bpe_n_spec_says_the_range) {
    const char *bad[] = {"bpe:abc", "bpe:0", "bpe:", "bpe:256", "bpe:4194305", "bpe: 300", "bpe:+300", "bpe:300x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int v = -1;
        cr_assert(tokenizer_spec_is_named(bad[i], &v) && v == 0, "%s", bad[i]);
        Tokenizer t;
        Status st = tokenizer_open(&t, bad[i]);
        char want[200];
        snprintf(want, sizeof want, "'%s': bpe:N trains a tokenizer of N ids, N a whole number from 257 (256 bytes "
                 "and <|endoftext|>) to 4194304", bad[i]);
        cr_assert_str_eq(st.msg, want);
    }
    int v;
    cr_assert(tokenizer_spec_is_named("bpe:257", &v) && v == 257);
    Tokenizer t;
    Status st = tokenizer_open(&t, "bpe:257");
    cr_assert_str_eq(st.msg, "bpe:257: a tokenizer to train on the corpus, not one to open");
}

// cl100k_base leaves ids unused between its ranks and specials: a model may
// emit only the others (generate samples among these).
Test(bpe_hostile, emittable_ids_skip_holes) {
    Tokenizer t;
    Status st = tokenizer_open(&t, "cl100k_base");
    cr_assert(st.ok, "%s", st.msg);
    int *ids = malloc((size_t)t.vocab * sizeof *ids);
    int n = tokenizer_emittable_ids(&t, t.vocab, ids);
    cr_assert_eq(t.vocab, 100277);
    cr_assert_eq(n, 100256 + 5, "100256 ranks and 5 specials");
    for (int i = 0; i < n; i++) cr_assert_gt(tokenizer_token_len(&t, ids[i]), 0);
    cr_assert_eq(ids[100255], 100255);
    cr_assert_eq(ids[100256], 100257, "100256 is a hole");
    cr_assert_eq(ids[n - 1], 100276);
    free(ids);
    tokenizer_free(&t);
    tokenizer_bytes(&t);
    int b[300];
    cr_assert_eq(tokenizer_emittable_ids(&t, 300, b), 256, "ids past the byte tokenizer's 256 print nothing");
}

// tokenize as users run it.
static int tokenize(const char *dir, char *const args[], const char *in, char **err) {
    char *argv[16] = {(char *)test_program("tokenize")};
    int n = 1;
    for (; args[n - 1]; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    char o[1500], e[1500];
    snprintf(o, sizeof o, "%s/tokenize.out", dir);
    snprintf(e, sizeof e, "%s/tokenize.err", dir);
    int code = test_spawn(argv, in, o, e, 60, NULL);
    *err = test_read_file(e);
    return code;
}

Test(bpe_hostile, tokenize_bounds_its_input, .timeout = 240) {
    const char *dir = test_tmpdir("tokenize_in");
    char *err;
    // stdin without end (/dev/zero) stops at the limit, with how to raise it.
    int code = tokenize(dir, (char *[]){"encode", "--tokenizer", "gpt2", "--max-input", "100000", NULL}, "/dev/zero",
                        &err);
    cr_assert_eq(code, 1);
    cr_assert_str_eq(err, "tokenize encode: standard input: more than 100000 bytes, the limit (raise it with "
                          "--max-input BYTES, or split the text)\n");
    free(err);
    // --in a directory, a FIFO, a file over the limit.
    code = tokenize(dir, (char *[]){"encode", "--tokenizer", "gpt2", "--in", (char *)dir, NULL}, NULL, &err);
    cr_assert_eq(code, 1);
    char want[2000];
    snprintf(want, sizeof want, "tokenize encode: %s: the input is a directory, not a regular file\n", dir);
    cr_assert_str_eq(err, want);
    free(err);
    char path[1200];
    snprintf(path, sizeof path, "%s/in.fifo", dir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    code = tokenize(dir, (char *[]){"stats", "--tokenizer", "gpt2", "--in", path, NULL}, NULL, &err);
    cr_assert(code == 1 && strstr(err, "the input is a FIFO (named pipe), not a regular file"), "%d %s", code, err);
    free(err);
    code = tokenize(dir, (char *[]){"encode", "--tokenizer", path, NULL}, NULL, &err);
    cr_assert(code == 1 && strstr(err, "the tokenizer file is a FIFO (named pipe)"), "%d %s", code, err);
    free(err);
    code = tokenize(dir, (char *[]){"decode", "--tokenizer", "gpt2", "--in", HOSTILE "a28x20.txt", "--max-input", "100",
                                    NULL}, NULL, &err);
    cr_assert(code == 1 && strstr(err, "a28x20.txt: the input is 580 bytes, more than the 100 this program reads (raise "
                                       "it with --max-input BYTES, or split the file)"), "%d %s", code, err);
    free(err);
    // decode reads the whole input: an id file with a NUL byte (or any other
    // byte that is not a digit or white space) is refused there, not read up
    // to the NUL; vertical tab and form feed separate ids as Python's split does.
    snprintf(path, sizeof path, "%s/ids.txt", dir);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    static const char nul[] = "15496\v11\f995 108\0 99", ok[] = "15496\v11\f995\n";
    fwrite(nul, 1, sizeof nul - 1, f);
    fclose(f);
    code = tokenize(dir, (char *[]){"decode", "--tokenizer", "gpt2", "--in", path, NULL}, NULL, &err);
    cr_assert_eq(code, 1, "%s", err);
    cr_assert_str_eq(err, "tokenize decode: token 3: '108\\x00 99' is not an id (a whole number >= 0)\n");
    free(err);
    f = fopen(path, "wb");
    fwrite(ok, 1, sizeof ok - 1, f);
    fclose(f);
    code = tokenize(dir, (char *[]){"decode", "--tokenizer", "gpt2", "--in", path, NULL}, NULL, &err);
    char out[1200], *text;
    snprintf(out, sizeof out, "%s/tokenize.out", dir);
    text = test_read_file(out);
    cr_assert(code == 0 && !strcmp(text, "Hello, world"), "%d '%s' %s", code, text, err);
    free(text);
    free(err);
    // The attacks' tokenizer files and patterns: refused at once.
    code = tokenize(dir, (char *[]){"encode", "--tokenizer", HOSTILE "nested_quantifier_pattern.tok", "--in",
                                    HOSTILE "a28x20.txt", NULL}, NULL, &err);
    cr_assert(code == 1 && strstr(err, "split pattern: not one of the known patterns"), "%d %s", code, err);
    free(err);
    code = tokenize(dir, (char *[]){"train", "--corpus", HOSTILE "a28x20.txt", "--vocab", "300", "--pattern",
                                    "(a|a)*c", "--out", "unused.tok", NULL}, NULL, &err);
    cr_assert(code == 2 && strstr(err, "--pattern '(a|a)*c': not gpt2, cl100k_base or o200k_base"), "%d %s", code, err);
    free(err);
}
