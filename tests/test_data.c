// Tokenizer, corpus reading, the HDF5 token cache and batch sampling.
#define _GNU_SOURCE   // nftw
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hdf5.h>

#include "batch.h"
#include "corpus.h"
#include "h5io.h"
#include "test_util.h"
#include "token_cache.h"
#include "tokenizer.h"

static char tmpdir[512];
static void make_tmpdir(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s", test_tmpdir("data"));
}
static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    return remove(path);
}
static void remove_tmpdir(void) { nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }
TestSuite(data, .init = make_tmpdir, .fini = remove_tmpdir);

// <tmpdir>/<name> into buf.
static const char *tpath(char *buf, const char *name) {
    snprintf(buf, 600, "%s/%s", tmpdir, name);
    return buf;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

Test(data, tokenizer_round_trip) {
    uint8_t bytes[300];
    int tokens[300];
    for (int i = 0; i < 300; i++) bytes[i] = (uint8_t)((i * 37 + 11) % 256);
    Tokenizer t;
    tokenizer_bytes(&t);
    cr_assert_eq(t.vocab, 256);
    cr_assert_eq(tokenizer_encode(&t, bytes, 300, tokens), 300);
    uint8_t out[TOKENIZER_STREAM_OUT_MAX];
    TokenizerStream ts = {0};
    for (int i = 0; i < 300; i++) {
        cr_assert_eq(tokens[i], bytes[i]);
        cr_assert_eq(tokenizer_token_len(&t, tokens[i]), 1);
        cr_assert_eq(tokenizer_stream_push(&t, &ts, tokens[i], out), 1);
        cr_assert_eq(out[0], bytes[i]);
    }
    cr_assert_eq(tokenizer_token_len(&t, 256), 0, "an id that is no token");
    size_t n;
    cr_assert_null(tokenizer_to_buffer(&t, &n), "the byte tokenizer stores nothing");
    cr_assert_eq(n, 0);
    int v;
    cr_assert(tokenizer_spec_is_named("byte", &v) && v == 0);
    cr_assert(tokenizer_spec_is_named("cl100k_base", &v) && v == 0);
    cr_assert(tokenizer_spec_is_named("bpe:4096", &v) && v == 4096);
    cr_assert(tokenizer_spec_is_named("bpe:x", &v) && v == 0, "a malformed bpe:N is no file name");
    cr_assert(!tokenizer_spec_is_named("my.tok", &v));
}

// A BPE trained on a corpus: its token cache is keyed by the tokenizer (a byte
// cache of the same corpus is another file), stores fewer tokens than bytes,
// and the stored tokenizer reads back as itself.
Test(data, bpe_tokenizer_and_its_cache) {
    char f[600], cache[600], cpath[CACHE_PATH_MAX], bpath[CACHE_PATH_MAX];
    char text[3000] = "";
    for (int i = 0; i < 60; i++) strcat(text, "the light and the darkness. ");
    write_file(tpath(f, "bpe.txt"), text);
    tpath(cache, "bpe_cache");
    Corpus c;
    cr_assert(corpus_load(&c, f).ok);
    Tokenizer bpe, bytes;
    cr_assert(tokenizer_train(&bpe, c.bytes, c.n, 300).ok);
    cr_assert(bpe.vocab > 256 && bpe.vocab <= 300, "%d ids (fewer when the text runs out of pairs)", bpe.vocab);
    cr_assert_eq(bpe.eot, bpe.vocab - 1, "the end-of-text special comes last");
    tokenizer_bytes(&bytes);
    TokenData a, b;
    bool built;
    cr_assert(token_cache_load(cache, f, &c, &bpe, &(DocSpec){DOCS_NONE}, &a, &built, cpath).ok && built);
    cr_assert(token_cache_load(cache, f, &c, &bytes, &(DocSpec){DOCS_NONE}, &b, &built, bpath).ok && built);
    cr_assert_str_neq(cpath, bpath, "one cache file per tokenizer");
    cr_assert_lt(a.n, c.n / 2, "BPE tokens stand for several bytes: %lld of %lld", (long long)a.n, (long long)c.n);
    cr_assert_eq(b.n, c.n);
    int64_t covered = 0;
    for (int64_t i = 0; i < a.n; i++) covered += tokenizer_token_len(&bpe, a.tokens[i]);
    cr_assert_eq(covered, c.n, "the tokens spell the corpus");
    token_data_free(&a);
    cr_assert(token_cache_load(cache, f, &c, &bpe, &(DocSpec){DOCS_NONE}, &a, &built, NULL).ok && !built, "reused");
    token_data_free(&a);
    token_data_free(&b);
    size_t n;
    uint8_t *buf = tokenizer_to_buffer(&bpe, &n);
    Tokenizer back;
    cr_assert(tokenizer_from_buffer(&back, buf, n, "stored").ok);
    cr_assert_eq(back.hash, bpe.hash);
    tokenizer_free(&back);
    Status st = tokenizer_from_buffer(&back, buf, n / 2, "half");   // a cut file is an error, not a tokenizer
    cr_assert(!st.ok && strstr(st.msg, "half"), "%s", st.msg);
    free(buf);
    tokenizer_free(&bpe);
    corpus_free(&c);
}

Test(data, corpus_file_list_and_directory) {
    char a[256], b[256], d[256], p[400], spec[600];
    write_file(tpath(a, "a.txt"), "hello ");
    write_file(tpath(b, "b.txt"), "world");
    Corpus c;
    cr_assert(corpus_load(&c, a).ok);
    cr_assert_eq(c.n, 6);
    uint64_t h_a = c.hash;
    corpus_free(&c);
    snprintf(spec, sizeof spec, "%s, %s", b, a);   // a list keeps its order
    Status st = corpus_load(&c, spec);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert_eq(c.n, 11);
    cr_assert_eq(memcmp(c.bytes, "worldhello ", 11), 0);
    cr_assert_eq(c.n_files, 2);
    cr_assert_neq(c.hash, h_a);
    corpus_free(&c);
    // A directory: regular files sorted by name; hidden files and subdirectories skipped.
    tpath(d, "dir");
    cr_assert_eq(mkdir(d, 0755), 0);
    snprintf(p, sizeof p, "%s/2.txt", d), write_file(p, "two");
    snprintf(p, sizeof p, "%s/1.txt", d), write_file(p, "one");
    snprintf(p, sizeof p, "%s/.hidden", d), write_file(p, "no");
    snprintf(p, sizeof p, "%s/sub", d), mkdir(p, 0755);
    st = corpus_load(&c, d);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert_eq(c.n, 6);
    cr_assert_eq(memcmp(c.bytes, "onetwo", 6), 0);
    uint64_t h1 = c.hash;
    corpus_free(&c);
    // The hash covers file names as well as bytes.
    snprintf(p, sizeof p, "%s/1.txt", d), unlink(p);
    snprintf(p, sizeof p, "%s/0.txt", d), write_file(p, "one");
    cr_assert(corpus_load(&c, d).ok);
    cr_assert_eq(memcmp(c.bytes, "onetwo", 6), 0);
    cr_assert_neq(c.hash, h1);
    corpus_free(&c);
}

Test(data, corpus_errors_name_the_path) {
    char p[256], want[600], e[256], d[256];
    Corpus c;
    Status st = corpus_load(&c, tpath(p, "missing.txt"));
    snprintf(want, sizeof want, "%s: cannot open corpus file: No such file or directory", p);
    cr_assert_str_eq(st.msg, want);
    write_file(tpath(e, "empty.txt"), "");
    st = corpus_load(&c, e);
    snprintf(want, sizeof want, "%s: the corpus is empty (its files hold 0 bytes)", e);
    cr_assert_str_eq(st.msg, want);
    tpath(d, "emptydir");
    mkdir(d, 0755);
    st = corpus_load(&c, d);
    snprintf(want, sizeof want, "%s: corpus directory holds no regular files", d);
    cr_assert_str_eq(st.msg, want);
    char spec[600];
    snprintf(spec, sizeof spec, "%s,%s", e, d);   // a directory inside a list is not readable as a file
    st = corpus_load(&c, spec);
    snprintf(want, sizeof want, "%s: the corpus file is a directory, not a regular file", d);
    cr_assert_str_eq(st.msg, want);
    st = corpus_load(&c, " , ");
    cr_assert_str_eq(st.msg, "' , ': corpus spec names no file");
}

// Two spellings of one file (./a, a/../a, an absolute path) share one cache:
// the key is the canonical path, not the text of the spec.
Test(data, token_cache_is_keyed_by_the_canonical_path) {
    Tokenizer byte_tok;
    tokenizer_bytes(&byte_tok);
    char f[600], g[600], cache[600], p1[CACHE_PATH_MAX], p2[CACHE_PATH_MAX];
    write_file(tpath(f, "spelled.txt"), "one file, two spellings\n");
    write_file(tpath(g, "other.txt"), "another\n");
    tpath(cache, "cache_spell");
    char *slash = strrchr(f, '/');
    char alt[1400];
    // <dir>/./../<dir name>/spelled.txt
    char dir[600], *base;
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - f), f);
    base = strrchr(dir, '/');
    snprintf(alt, sizeof alt, "%s/./..%s/spelled.txt", dir, base);
    cr_assert_eq(corpus_spec_key(f), corpus_spec_key(alt), "%s vs %s", f, alt);
    char list1[2100], list2[2100];
    snprintf(list1, sizeof list1, "%s,%s", f, g);
    snprintf(list2, sizeof list2, "%s,%s", alt, g);
    cr_assert_eq(corpus_spec_key(list1), corpus_spec_key(list2));
    snprintf(list2, sizeof list2, "%s,%s", g, f);
    cr_assert_neq(corpus_spec_key(list1), corpus_spec_key(list2), "the order of a list is part of the corpus");
    Corpus c;
    TokenData td;
    bool built = false;
    cr_assert(corpus_load(&c, f).ok);
    cr_assert(token_cache_load(cache, f, &c, &byte_tok, &(DocSpec){DOCS_NONE}, &td, &built, p1).ok && built);
    token_data_free(&td);
    cr_assert(token_cache_load(cache, alt, &c, &byte_tok, &(DocSpec){DOCS_NONE}, &td, &built, p2).ok);
    cr_assert(!built, "another spelling of the same file reuses its cache");
    cr_assert_str_eq(p1, p2);
    token_data_free(&td);
    corpus_free(&c);
}

Test(data, token_cache_reused_and_rebuilt) {
    Tokenizer byte_tok;
    tokenizer_bytes(&byte_tok);
    char f[256], cache[256], cpath[CACHE_PATH_MAX];
    write_file(tpath(f, "text.txt"), "abcabcabd\n\xff");
    tpath(cache, "cache/sub");   // created on demand
    Corpus c;
    TokenData td;
    bool built = false;
    cr_assert(corpus_load(&c, f).ok);
    Status st = token_cache_load(cache, f, &c, &byte_tok, &(DocSpec){DOCS_NONE}, &td, &built, cpath);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert(built, "first load builds the cache");
    cr_assert_eq(td.n, 11);
    cr_assert_eq(td.vocab, 256);
    cr_assert_eq(td.tokens[10], 255);
    struct stat s1;
    cr_assert_eq(stat(cpath, &s1), 0);
    token_data_free(&td);
    // Same corpus: read back, not rebuilt (the file is not rewritten either).
    st = token_cache_load(cache, f, &c, &byte_tok, &(DocSpec){DOCS_NONE}, &td, &built, NULL);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert(!built, "an up-to-date cache must be reused");
    cr_assert_eq(td.n, 11);
    for (int64_t i = 0; i < c.n; i++) cr_assert_eq(td.tokens[i], c.bytes[i]);
    struct stat s2;
    stat(cpath, &s2);
    cr_assert(s1.st_mtim.tv_sec == s2.st_mtim.tv_sec && s1.st_mtim.tv_nsec == s2.st_mtim.tv_nsec);
    cr_assert_eq(s1.st_ino, s2.st_ino);
    token_data_free(&td);
    corpus_free(&c);
    // Changed corpus: rebuilt in place with the new tokens.
    write_file(f, "xyz");
    cr_assert(corpus_load(&c, f).ok);
    st = token_cache_load(cache, f, &c, &byte_tok, &(DocSpec){DOCS_NONE}, &td, &built, NULL);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert(built, "a changed corpus must rebuild the cache");
    cr_assert_eq(td.n, 3);
    cr_assert_eq(td.tokens[0], 'x');
    token_data_free(&td);
    // A garbage cache file is rebuilt, not trusted.
    write_file(cpath, "not hdf5");
    st = token_cache_load(cache, f, &c, &byte_tok, &(DocSpec){DOCS_NONE}, &td, &built, NULL);
    cr_assert(st.ok && built, "%s", st.msg);
    cr_assert_eq(td.tokens[2], 'z');
    token_data_free(&td);
    corpus_free(&c);
}

// tokens[i] = i, so a window's first input is its start position.
static int *iota(int64_t n) {
    int *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = (int)i;
    return t;
}

Test(data, windows_stay_inside_their_split) {
    const int64_t n = 1000;
    const int B = 4, T = 16;
    int *tok = iota(n), x[4 * 16], y[4 * 16];
    Batcher b;
    Status st = batcher_init(&b, tok, n, 0.1, B, T, 5);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert_eq(b.train_end, 900);
    cr_assert_eq(batcher_val_tokens(&b), 100);
    bool hit_last = false;
    for (int k = 0; k < 300; k++) {
        batcher_train(&b, x, y, NULL);
        for (int i = 0; i < B; i++) {
            int s = x[i * T];
            cr_assert(s >= 0 && s + T < 900, "train window [%d, %d] leaves [0, 900)", s, s + T);
            hit_last |= s + T == 899;
            for (int t = 0; t < T; t++) {
                cr_assert_eq(x[i * T + t], s + t);
                cr_assert_eq(y[i * T + t], s + t + 1, "targets are inputs shifted by one");
            }
        }
    }
    cr_assert_eq(b.state.batches, 300);
    cr_assert(hit_last, "the last window of the split is reachable");
    for (int k = 0; k < 5; k++) {
        batcher_val(&b, k, x, y, NULL);
        for (int i = 0; i < B; i++) {
            int s = x[i * T];
            cr_assert(s >= 900 && y[i * T + T - 1] < 1000, "val window at %d", s);
            cr_assert_eq((s - 900) % T, 0);
        }
    }
    int x2[4 * 16], y2[4 * 16];
    batcher_val(&b, 3, x, y, NULL);
    batcher_val(&b, 3, x2, y2, NULL);
    cr_assert_eq(memcmp(x, x2, sizeof x), 0, "validation batches are deterministic");
    free(tok);
}

Test(data, batches_replay_from_saved_state) {
    const int64_t n = 5000;
    int *tok = iota(n);
    int x[8 * 32], y[8 * 32], x2[8 * 32], y2[8 * 32];
    Batcher a, b;
    cr_assert(batcher_init(&a, tok, n, 0.05, 8, 32, 42).ok);
    for (int k = 0; k < 7; k++) batcher_train(&a, x, y, NULL);
    uint64_t words[SAMPLER_STATE_WORDS];
    sampler_state_pack(&a.state, words);
    cr_assert(batcher_init(&b, tok, n, 0.05, 8, 32, 999).ok);   // a different seed...
    sampler_state_unpack(&b.state, words);                     // ...replaced by the saved state
    cr_assert_eq(b.state.batches, 7);
    for (int k = 0; k < 3; k++) {
        batcher_train(&a, x, y, NULL);
        batcher_train(&b, x2, y2, NULL);
        cr_assert_eq(memcmp(x, x2, sizeof x), 0);
        cr_assert_eq(memcmp(y, y2, sizeof y), 0);
    }
    // A fresh sampler with another seed draws different windows.
    Batcher c;
    cr_assert(batcher_init(&c, tok, n, 0.05, 8, 32, 999).ok);
    batcher_train(&c, x2, y2, NULL);
    cr_assert_neq(memcmp(x, x2, sizeof x), 0);
    free(tok);
}

Test(data, split_too_small) {
    int *tok = iota(100);
    Batcher b;
    Status st = batcher_init(&b, tok, 100, 0.1, 2, 16, 1);
    cr_assert(!st.ok);
    cr_assert(strstr(st.msg, "validation split (10 tokens"), "%s", st.msg);
    st = batcher_init(&b, tok, 100, 0.0, 2, 100, 1);
    cr_assert(strstr(st.msg, "training split (100 tokens) is shorter than one window of seq_len + 1 = 101"),
              "%s", st.msg);
    cr_assert(batcher_init(&b, tok, 100, 0.0, 2, 99, 1).ok);
    free(tok);
}

Test(data, special_files_as_corpus, .timeout = 10) {
    char fifo[600], want[1400];
    cr_assert_eq(mkfifo(tpath(fifo, "fifo.txt"), 0644), 0);
    Corpus c;
    Status st = corpus_load(&c, fifo);   // refused at once, never waited on
    snprintf(want, sizeof want, "%s: the corpus file is a FIFO (named pipe), not a regular file", fifo);
    cr_assert_str_eq(st.msg, want);
    st = corpus_load(&c, "/dev/zero,/dev/null");
    cr_assert_str_eq(st.msg, "/dev/zero: the corpus file is a character device, not a regular file");
    // A /proc file reports size 0 but has content: it is read to its end.
    st = corpus_load(&c, "/proc/self/status");
    cr_assert(st.ok, "%s", st.msg);
    cr_assert_gt(c.n, 10);
    cr_assert(memmem(c.bytes, (size_t)c.n, "Name:", 5), "the real content was read");
    corpus_free(&c);
}

// Build a cache for `text`; then apply `edit` to the file and load again:
// the cache must be rebuilt (tokens equal to the corpus) with a note containing `why`.
static void expect_rebuilt(const char *tag, void (*edit)(const char *cache_file), const char *why) {
    Tokenizer byte_tok;
    tokenizer_bytes(&byte_tok);
    char f[600], cache[600], cpath[CACHE_PATH_MAX];
    write_file(tpath(f, tag), "the light and the darkness\n");
    snprintf(cache, sizeof cache, "%s/cache_%s", tmpdir, tag);
    Corpus c;
    TokenData td;
    bool built = false;
    cr_assert(corpus_load(&c, f).ok);
    cr_assert(token_cache_load(cache, f, &c, &byte_tok, &(DocSpec){DOCS_NONE}, &td, &built, cpath).ok);
    token_data_free(&td);
    edit(cpath);
    Status st = token_cache_load(cache, f, &c, &byte_tok, &(DocSpec){DOCS_NONE}, &td, &built, NULL);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert(built, "a bad cache is rebuilt (%s)", why);
    cr_assert(strstr(td.note, why), "note: %s (wanted '%s')", td.note, why);
    cr_assert_eq(td.n, c.n);
    for (int64_t i = 0; i < c.n; i++) cr_assert_eq(td.tokens[i], c.bytes[i]);
    token_data_free(&td);
    st = token_cache_load(cache, f, &c, &byte_tok, &(DocSpec){DOCS_NONE}, &td, &built, NULL);   // and the rebuilt one is reused
    cr_assert(st.ok && !built && !td.note[0], "%s %s", st.msg, td.note);
    token_data_free(&td);
    corpus_free(&c);
}

static void flip_a_token(const char *p) {   // one bit of the stored tokens (the checksum no longer matches)
    hid_t f = H5Fopen(p, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "/tokens", H5P_DEFAULT);
    haddr_t off = H5Dget_offset(d);
    H5Dclose(d), H5Fclose(f);
    FILE *fp = fopen(p, "r+b");
    fseek(fp, (long)off + 4, SEEK_SET);
    int ch = fgetc(fp);
    fseek(fp, (long)off + 4, SEEK_SET);
    fputc(ch ^ 1, fp);
    fclose(fp);
}
static void tokens_out_of_range(const char *p) {   // ids out of range (with a valid checksum) to reach the id check
    hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "/tokens", H5P_DEFAULT);
    int32_t ids[27];
    for (int i = 0; i < 27; i++) ids[i] = 300 + i;
    cr_assert(h5io_write(f, "/tokens", H5IO_I32, 1, (hsize_t[]){27}, ids));
    H5Fclose(f);
}
static void garbage(const char *p) {
    FILE *fp = fopen(p, "w");
    fputs("not an HDF5 file", fp);
    fclose(fp);
}
static void stale_format(const char *p) {
    hid_t f = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "/meta", H5P_DEFAULT);
    uint64_t meta[5] = {1, 256, 0, 27, 0};
    cr_assert(h5io_write(f, "/meta", H5IO_U64, 1, (hsize_t[]){5}, meta));
    H5Fclose(f);
}

Test(data, tampered_token_caches_are_rebuilt) {
    expect_rebuilt("flip.txt", flip_a_token, "/tokens: checksum mismatch");
    expect_rebuilt("int.txt", tokens_out_of_range, "/tokens: token 0 is 300, outside [0, 256)");
    expect_rebuilt("junk.txt", garbage, "not an HDF5 file");
    expect_rebuilt("old.txt", stale_format, "format 1 with a vocabulary of 256 ids");
}

// A token cache truncated under a running program (its tokens are mapped,
// not copied) faults where its pages were: the program stops with a
// sentence naming the file instead of dying of SIGBUS.
Test(data, token_cache_truncated_while_mapped_stops_with_a_sentence) {
    Tokenizer byte_tok;
    tokenizer_bytes(&byte_tok);
    char f[256], cache[256], cpath[CACHE_PATH_MAX];
    static char text[64 * 1024];
    for (size_t i = 0; i + 1 < sizeof text; i++) text[i] = (char)('a' + i % 23);
    write_file(tpath(f, "long.txt"), text);
    tpath(cache, "cache_bus");
    Corpus c;
    TokenData td;
    bool built = false;
    cr_assert(corpus_load(&c, f).ok);
    Status st = token_cache_load(cache, f, &c, &byte_tok, &(DocSpec){DOCS_NONE}, &td, &built, cpath);
    cr_assert(st.ok && built, "%s", st.msg);
    token_data_free(&td);
    st = token_cache_load(cache, f, &c, &byte_tok, &(DocSpec){DOCS_NONE}, &td, &built, NULL);
    cr_assert(st.ok && !built && td.mapped, "the cache's tokens must be mapped: %s", st.msg);
    int err[2];
    cr_assert_eq(pipe(err), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(err[1], STDERR_FILENO);
        if (truncate(cpath, 0) != 0) _exit(3);
        volatile int sum = 0;
        for (int64_t i = 0; i < td.n; i += 1024) sum += td.tokens[i];
        _exit(sum == -1 ? 4 : 5);   // reached only if the truncation did not fault
    }
    close(err[1]);
    char msg[512] = "";
    ssize_t n = read(err[0], msg, sizeof msg - 1);
    msg[n > 0 ? n : 0] = 0;
    close(err[0]);
    int ws = 0;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 1, "status %d", ws);
    cr_assert(strstr(msg, cpath) && strstr(msg, "truncated or rewritten while this program was reading it"), "%s", msg);
    token_data_free(&td);
    corpus_free(&c);
}

// Rewrite a token cache with other ids for the same text, its checksums
// recomputed (h5io_write checksums what it writes): what a forger can do.
static void forge_cache(const char *cpath, const int *ids, int64_t n, const int64_t *starts, int64_t n_docs) {
    hid_t f = H5Fopen(cpath, H5F_ACC_RDONLY, H5P_DEFAULT);
    cr_assert_geq(f, 0);
    uint64_t meta[6];
    hid_t d = H5Dopen2(f, "/meta", H5P_DEFAULT);
    cr_assert_geq(H5Dread(d, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, meta), 0);
    H5Dclose(d);
    H5Fclose(f);
    meta[3] = (uint64_t)n;
    hid_t m = h5io_create_memory_aligned(4096);
    hsize_t nn = (hsize_t)n;
    cr_assert(h5io_write(m, "/tokens", H5IO_I32, 1, &nn, ids));
    cr_assert(h5io_write(m, "/meta", H5IO_U64, 1, (hsize_t[]){6}, meta));
    if (n_docs) cr_assert(h5io_write(m, "/doc_starts", H5IO_I64, 1, (hsize_t[]){(hsize_t)n_docs}, starts));
    Status s = h5io_commit(m, cpath, "token cache");
    cr_assert(s.ok, "%s", s.msg);
}

// A cache forged with checksums of its own is not trusted: one whose ids
// spell other bytes, and one that spells the same bytes with other ids
// (every byte its own token under a BPE), are both rebuilt.
Test(data, token_cache_forged_with_its_own_checksums_is_rebuilt) {
    char f[256], cache[256], cpath[CACHE_PATH_MAX];
    write_file(tpath(f, "forge.txt"), "In the beginning God created the heaven and the earth.\n\nAnd the earth was "
                                      "without form, and void.\nAnd darkness was upon the face of the deep.\n");
    tpath(cache, "cache_forge");
    Corpus c;
    cr_assert(corpus_load(&c, f).ok);
    static const DocSpec none = {DOCS_NONE}, blank = {DOCS_BLANK_LINE};
    Tokenizer bytes, bpe;
    tokenizer_bytes(&bytes);
    Status st = tokenizer_open(&bpe, "gpt2");
    cr_assert(st.ok, "%s", st.msg);
    const struct {
        const Tokenizer *tok;
        const DocSpec *docs;
    } runs[] = {{&bytes, &none}, {&bpe, &none}, {&bpe, &blank}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        TokenData td;
        bool built = false;
        st = token_cache_load(cache, f, &c, runs[r].tok, runs[r].docs, &td, &built, cpath);
        cr_assert(st.ok && built, "%s", st.msg);
        int64_t n = td.n, n_docs = td.n_docs;
        int *ids = malloc((size_t)(2 * c.n + 2) * sizeof *ids);
        int64_t *starts = n_docs ? malloc((size_t)n_docs * sizeof *starts) : NULL;
        if (n_docs) memcpy(starts, td.doc_starts, (size_t)n_docs * sizeof *starts);
        if (runs[r].tok == &bytes) {   // other bytes: two ids swapped
            memcpy(ids, td.tokens, (size_t)n * sizeof *ids);
            int t = ids[3];
            ids[3] = ids[4], ids[4] = t;
        } else {   // the same bytes, every one its own token (its single-byte id)
            int64_t k = 0, at = 0, d = 0;
            for (int64_t i = 0; i < n; i++) {
                while (n_docs && d < n_docs && td.doc_starts[d] == i) starts[d++] = k;
                if (td.tokens[i] == runs[r].tok->eot) {
                    ids[k++] = td.tokens[i];
                    continue;
                }
                int len = tokenizer_token_len(runs[r].tok, td.tokens[i]);
                for (int j = 0; j < len; j++) {
                    int one;
                    cr_assert_eq(tokenizer_encode(runs[r].tok, c.bytes + at + j, 1, &one), 1);
                    ids[k++] = one;
                }
                at += len;
            }
            cr_assert_eq(at, c.n);
            cr_assert_gt(k, n, "the byte spelling has more ids");
            n = k;
        }
        token_data_free(&td);
        forge_cache(cpath, ids, n, starts, n_docs);
        st = token_cache_load(cache, f, &c, runs[r].tok, runs[r].docs, &td, &built, NULL);
        cr_assert(st.ok && built, "run %zu: a forged cache must be rebuilt (%s)", r, st.msg);
        cr_assert(strstr(td.note, "not this corpus under this tokenizer"), "run %zu: %s", r, td.note);
        token_data_free(&td);
        free(ids);
        free(starts);
    }
    tokenizer_free(&bpe);
    corpus_free(&c);
}
