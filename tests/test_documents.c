// A corpus as documents ([data] documents, documents.h) and state carried
// across windows ([train] carry_state): the spec, the split and its tokens,
// the flags of a window, the token cache's document starts (written, read
// back identically, tampered), the batcher's streams, and the trainer
// (bit-exact resume with carried states, errors that name the key).
#include <hdf5.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "checkpoint.h"
#include "documents.h"
#include "h5io.h"
#include "test_util.h"
#include "token_cache.h"
#include "trainer.h"

Test(documents, spec_parse) {
    DocSpec d;
    cr_assert(doc_spec_parse("none", &d).ok && d.mode == DOCS_NONE);
    cr_assert(doc_spec_parse("files", &d).ok && d.mode == DOCS_FILES);
    cr_assert(doc_spec_parse("blank_line", &d).ok && d.mode == DOCS_BLANK_LINE);
    cr_assert(doc_spec_parse("eot", &d).ok && d.mode == DOCS_TEXT && !strcmp(d.sep, "<|endoftext|>"));
    cr_assert(doc_spec_parse("text:\\n---\\n", &d).ok && d.mode == DOCS_TEXT && d.sep_len == 5 &&
              !memcmp(d.sep, "\n---\n", 5));
    cr_assert(doc_spec_parse("text:a\\\\b\\t", &d).ok && d.sep_len == 4 && !memcmp(d.sep, "a\\b\t", 4));
    const char *bad[] = {"", "paragraphs", "text:", "text:\\q", "Files", "text:a\\"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Status s = doc_spec_parse(bad[i], &d);
        cr_assert(!s.ok, "'%s' accepted", bad[i]);
        cr_assert(strstr(s.msg, bad[i]) != NULL, "the error names the value: %s", s.msg);
    }
    char longsep[80] = "text:";
    memset(longsep + 5, 'x', 64);
    cr_assert(!doc_spec_parse(longsep, &d).ok, "a separator over 63 bytes");
}

// A corpus of the given files (text each) in a scratch folder.
static Corpus corpus_of(const char *tag, const char *const *texts, int n) {
    const char *dir = test_tmpdir(tag);
    char spec[2048] = "";
    for (int i = 0; i < n; i++) {
        char path[700];
        snprintf(path, sizeof path, "%s/f%d.txt", dir, i);
        test_write_file(path, texts[i]);
        snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "%s%s", i ? "," : "", path);
    }
    Corpus c;
    Status s = corpus_load(&c, spec);
    cr_assert(s.ok, "%s", s.msg);
    return c;
}

// The bytes of tokens [a, b) of the byte tokenizer.
static void expect_bytes(const int *tok, int64_t a, int64_t b, const char *want) {
    cr_assert_eq(b - a, (int64_t)strlen(want), "length %lld, want '%s'", (long long)(b - a), want);
    for (int64_t i = a; i < b; i++) cr_assert_eq(tok[i], (unsigned char)want[i - a], "at %lld", (long long)i);
}

Test(documents, split_by_files_blank_lines_and_separators) {
    const char *texts[] = {"\n\nalpha one\nalpha two\n\n \t\r\nbeta\n\n", "gamma<|endoftext|><|endoftext|>delta"};
    Corpus c = corpus_of("docsplit", texts, 2);
    Tokenizer bytes;
    tokenizer_bytes(&bytes);
    int *tok;
    int64_t n, *st, nd;
    DocSpec d;

    doc_spec_parse("none", &d);
    documents_tokenize(&c, &d, &bytes, &tok, &n, &st, &nd);
    cr_assert_eq(n, c.n);
    cr_assert_eq(nd, 0);
    cr_assert_null(st);
    free(tok);

    doc_spec_parse("files", &d);
    documents_tokenize(&c, &d, &bytes, &tok, &n, &st, &nd);
    cr_assert_eq(nd, 2);
    cr_assert_eq(n, c.n, "the byte tokenizer has no end-of-text token: nothing is added");
    cr_assert(st[0] == 0 && st[1] == (int64_t)strlen(texts[0]));
    free(tok);
    free(st);

    // Leading blank lines stay in the first document; a blank run (spaces,
    // tabs, \r) ends one; a file start is a start too.
    doc_spec_parse("blank_line", &d);
    documents_tokenize(&c, &d, &bytes, &tok, &n, &st, &nd);
    cr_assert_eq(nd, 3);
    cr_assert_eq(n, c.n);
    expect_bytes(tok, st[0], st[1], "\n\nalpha one\nalpha two\n\n \t\r\n");
    expect_bytes(tok, st[1], st[2], "beta\n\n");
    expect_bytes(tok, st[2], n, texts[1]);
    free(tok);
    free(st);

    // eot: the separator is removed, empty documents dropped.
    doc_spec_parse("eot", &d);
    documents_tokenize(&c, &d, &bytes, &tok, &n, &st, &nd);
    cr_assert_eq(nd, 3);
    expect_bytes(tok, st[1], st[2], "gamma");
    expect_bytes(tok, st[2], n, "delta");
    free(tok);
    free(st);

    // A tokenizer with an end-of-text token ends every document with it.
    Tokenizer bpe;
    const char *train_text = "alpha beta gamma delta alpha beta gamma delta one two";
    cr_assert(tokenizer_train(&bpe, (const uint8_t *)train_text, (int64_t)strlen(train_text), 300).ok);
    cr_assert(bpe.eot >= 0);
    doc_spec_parse("blank_line", &d);
    documents_tokenize(&c, &d, &bpe, &tok, &n, &st, &nd);
    cr_assert_eq(nd, 3);
    for (int64_t i = 0; i < nd; i++) {
        int64_t end = i + 1 < nd ? st[i + 1] : n;
        cr_assert_eq(tok[end - 1], bpe.eot, "document %lld ends with end-of-text", (long long)i);
        for (int64_t j = st[i]; j < end - 1; j++) cr_assert_neq(tok[j], bpe.eot);
        // Each document's tokens are its own encoding.
        int buf[256];
        const int64_t lo[] = {0, 27, c.file_end[0]}, len[] = {27, 6, c.file_end[1] - c.file_end[0]};
        int64_t m = tokenizer_encode(&bpe, c.bytes + lo[i], len[i], buf);
        cr_assert_eq(m, end - 1 - st[i], "document %lld", (long long)i);
        cr_assert(!memcmp(buf, tok + st[i], (size_t)m * sizeof *buf));
    }
    free(tok);
    free(st);
    tokenizer_free(&bpe);
    corpus_free(&c);
}

Test(documents, flags_of_a_window_and_checks) {
    const int64_t starts[] = {0, 5, 6, 20, 31};
    int flags[12];
    for (int64_t start = 0; start < 30; start++) {
        doc_flags(starts, 5, start, 12, flags);
        for (int t = 0; t < 12; t++) {
            int want = 0;
            for (int i = 0; i < 5; i++) want |= starts[i] == start + t;
            cr_assert_eq(flags[t], want, "window at %lld, t = %d", (long long)start, t);
        }
    }
    cr_assert(doc_starts_check(starts, 5, 32).ok);
    cr_assert(!doc_starts_check(starts, 5, 31).ok, "a start at n");
    const int64_t bad1[] = {1, 5}, bad2[] = {0, 5, 5}, bad3[] = {0, 7, 6};
    cr_assert(!doc_starts_check(bad1, 2, 10).ok);
    cr_assert(!doc_starts_check(bad2, 3, 10).ok);
    cr_assert(!doc_starts_check(bad3, 3, 10).ok);
    cr_assert(!doc_starts_check(starts, 0, 10).ok, "no document at all");
}

// Overwrite a dataset of an HDF5 file in place with n int64 values (its
// checksum attribute is left as it was, so the reader must notice).
static void poke_i64(const char *path, const char *name, const int64_t *v) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert(f >= 0);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    cr_assert(d >= 0);
    cr_assert(H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
    H5Dclose(d);
    H5Fclose(f);
}

Test(documents, token_cache_keeps_the_starts) {
    const char *texts[] = {"one\n\ntwo three\n\nfour\n", "five six\n"};
    Corpus c = corpus_of("doccache", texts, 2);
    Tokenizer bytes;
    tokenizer_bytes(&bytes);
    char cache[700], path[CACHE_PATH_MAX], path_none[CACHE_PATH_MAX];
    snprintf(cache, sizeof cache, "%s/cache", test_tmpdir("doccache"));
    DocSpec d;
    doc_spec_parse("blank_line", &d);
    TokenData a, b;
    bool built;
    cr_assert(token_cache_load(cache, "spec", &c, &bytes, &d, &a, &built, path).ok && built);
    cr_assert_eq(a.n_docs, 4);
    // Read back: the same tokens and starts.
    cr_assert(token_cache_load(cache, "spec", &c, &bytes, &d, &b, &built, NULL).ok && !built, "%s", b.note);
    cr_assert(b.n == a.n && b.n_docs == a.n_docs);
    cr_assert(!memcmp(a.tokens, b.tokens, (size_t)a.n * sizeof(int)));
    cr_assert(!memcmp(a.doc_starts, b.doc_starts, (size_t)a.n_docs * sizeof(int64_t)));
    const int64_t want[] = {0, 5, 16, 21};
    cr_assert(!memcmp(b.doc_starts, want, sizeof want));
    token_data_free(&b);
    // Another documents spec has its own cache file, without starts.
    cr_assert(token_cache_load(cache, "spec", &c, &bytes, &(DocSpec){DOCS_NONE}, &b, &built, path_none).ok && built);
    cr_assert(strcmp(path, path_none) != 0);
    cr_assert_eq(b.n_docs, 0);
    cr_assert_null(b.doc_starts);
    token_data_free(&b);
    // Tampered starts (the checksum no longer matches; and a decreasing list): rebuilt, with a note.
    const int64_t tampered[] = {0, 16, 5, 21};
    poke_i64(path, "/doc_starts", tampered);
    cr_assert(token_cache_load(cache, "spec", &c, &bytes, &d, &b, &built, NULL).ok && built);
    cr_assert(strstr(b.note, "doc_starts") != NULL, "note: %s", b.note);
    cr_assert(!memcmp(b.doc_starts, want, sizeof want));
    token_data_free(&b);
    token_data_free(&a);
    corpus_free(&c);
}

Test(documents, batcher_streams_continue_row_by_row) {
    enum { N = 1000, B = 3, T = 16 };
    int *tokens = malloc(N * sizeof *tokens);
    for (int i = 0; i < N; i++) tokens[i] = i % 251;
    const int64_t starts[] = {0, 100, 101, 700};
    Batcher b, part;
    cr_assert(batcher_init(&b, tokens, N, 0.1, B, T, 7).ok);
    batcher_set_documents(&b, starts, 4);
    cr_assert(batcher_set_streams(&b).ok);
    int64_t len = 900 / B, W = (len - 1) / T;
    cr_assert_eq(b.stream_len, len);
    cr_assert_eq(b.stream_windows, W);
    cr_assert(batcher_init(&part, tokens, N, 0.1, B, T, 7).ok);   // rows [1, 3) only, as a second rank
    batcher_set_documents(&part, starts, 4);
    cr_assert(batcher_set_streams(&part).ok);
    batcher_set_share(&part, 1, 3);
    int x[B * T], y[B * T], doc[B * T], px[B * T], py[B * T], pdoc[B * T];
    for (int64_t k = 0; k < 2 * W + 1; k++) {
        batcher_train(&b, x, y, doc);
        batcher_train(&part, px, py, pdoc);
        int64_t w = k % W;
        for (int r = 0; r < B; r++) {
            int64_t s = r * len + w * T;
            for (int t = 0; t < T; t++) {
                cr_assert_eq(x[r * T + t], tokens[s + t]);
                cr_assert_eq(y[r * T + t], tokens[s + t + 1]);
                int want = (t == 0 && w == 0) || s + t == 100 || s + t == 101 || s + t == 700;
                cr_assert_eq(doc[r * T + t], want, "batch %lld row %d t %d", (long long)k, r, t);
            }
        }
        cr_assert(!memcmp(px, x + T, 2 * T * sizeof(int)) && !memcmp(py, y + T, 2 * T * sizeof(int)) &&
                  !memcmp(pdoc, doc + T, 2 * T * sizeof(int)), "a share is the same rows");
    }
    // Too short a split for B streams of one window.
    Batcher small;
    cr_assert(batcher_init(&small, tokens, 40, 0, B, T, 7).ok);   // streams of 13 tokens
    Status s = batcher_set_streams(&small);
    cr_assert(!s.ok && strstr(s.msg, "streams"), "%s", s.msg);
    free(tokens);
}

// A tiny run with documents and carried states (test_tiny_config's corpus,
// its lines grouped into blank-line documents).
static const char *carry_config(const char *layers, int steps, const char *extra_train) {
    char extra[600];
    // On device_default() (AG_DEVICE=cuda: the trainer's model, steps and
    // carried states on the GPU).
    snprintf(extra, sizeof extra, "carry_state = true\ndevice = %s\n%s[data]\ndocuments = blank_line\norder = streams\n",
             device_name(device_default()), extra_train ? extra_train : "");
    const char *cfg = test_tiny_config("doctrain", layers, steps, NULL, extra);
    char corpus[1600];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", test_dir_of(cfg));
    char *text = test_read_file(corpus);
    // A blank line after every 7th line: documents of a few hundred bytes, shorter and longer than a window.
    size_t n = strlen(text), lines = 0;
    char *out = malloc(2 * n + 1), *o = out;
    for (size_t i = 0; i < n; i++) {
        *o++ = text[i];
        if (text[i] == '\n' && ++lines % 7 == 0) *o++ = '\n';
    }
    *o = 0;
    test_write_file(corpus, out);
    free(out);
    free(text);
    return cfg;
}

Test(documents, carry_state_resume_is_bit_exact, .timeout = 180) {
    enum { N = 6 };
    const char *cfg = carry_config("gdn,attn,mamba", N, NULL);
    static Trainer a, b;
    TrainerOptions o = {.config = cfg, .quiet = true};
    Status s = trainer_setup(&a, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_not_null(a.carry);
    cr_assert(a.tokens.n_docs > 10, "%lld documents", (long long)a.tokens.n_docs);
    cr_assert_eq(trainer_run(&a, &o), 0);
    double straight[N];
    for (int i = 0; i < N; i++) straight[i] = trainer_loss(&a, i);
    // The checkpoint holds the carried states: batch_size rows, not all zero.
    int64_t row = trainer_carry_row(&a);
    cr_assert(row > 0);
    double *carry = calloc((size_t)3 * row, sizeof *carry);
    s = checkpoint_load_carry(a.ckpt, carry, 3, row);
    cr_assert(s.ok, "%s", s.msg);
    double mass = 0;
    for (int64_t i = 0; i < 3 * row; i++) mass += carry[i] * carry[i];
    cr_assert(mass > 0, "the carried states are saved");
    // A reader that expects another shape is refused.
    s = checkpoint_load_carry(a.ckpt, carry, 2, row);
    cr_assert(!s.ok && strstr(s.msg, "/state/carry"), "%s", s.msg);
    free(carry);
    char ckpt[sizeof a.ckpt];
    snprintf(ckpt, sizeof ckpt, "%s", a.ckpt);
    trainer_free(&a);

    o.stop_after = 3;
    o.overwrite = true;
    s = trainer_setup(&a, &o);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(trainer_run(&a, &o), 130);
    trainer_free(&a);
    TrainerOptions r = {.config = cfg, .quiet = true, .resume = true};
    s = trainer_setup(&b, &r);
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(b.step, 3);
    cr_assert_eq(trainer_run(&b, &r), 0);
    double resumed[N];
    for (int i = 3; i < N; i++) resumed[i] = trainer_loss(&b, i);
    test_assert_resumed_losses(resumed, straight, 3, N);
    trainer_free(&b);

    // A checkpoint without its carried states cannot resume such a run.
    hid_t f = H5Fopen(ckpt, H5F_ACC_RDWR, H5P_DEFAULT);
    cr_assert(f >= 0);
    cr_assert(H5Ldelete(f, "/state/carry", H5P_DEFAULT) >= 0);
    H5Fclose(f);
    s = trainer_setup(&b, &r);
    cr_assert(!s.ok && strstr(s.msg, "/state/carry") && strstr(s.msg, "missing"), "%s", s.msg);
}

Test(documents, two_carried_windows_equal_one_window_of_twice_the_length) {
    // The trainer's model and streams, forward only: windows 0 and 1 of each
    // row with the state carried equal one forward over both (the documents'
    // flags included), and differ from window 1 started from zero.
    const char *cfg = carry_config("gdn,mamba,linear", 3, NULL);
    static Trainer a;
    TrainerOptions o = {.config = cfg, .quiet = true};
    Status s = trainer_setup(&a, &o);
    cr_assert(s.ok, "%s", s.msg);
    int T = a.cfg.data.seq_len, B = a.cfg.data.batch_size, V = a.lm.cfg.vocab_size;
    Device dev = a.cfg.train.device;
    cr_assert_eq(dev, device_default());
    size_t bt = (size_t)B * T;
    int *x2 = malloc(2 * bt * sizeof(int)), *d2 = malloc(2 * bt * sizeof(int));
    real *carried = malloc(2 * bt * V * sizeof(real)), *fresh = malloc(bt * V * sizeof(real));
    tape_no_grad_push(&a.tp);
    for (int w = 0; w < 2; w++) {
        batcher_train(&a.bt, a.x, a.y, a.doc);
        for (int r = 0; r < B; r++) {
            memcpy(x2 + (size_t)r * 2 * T + w * T, a.x + (size_t)r * T, T * sizeof(int));
            memcpy(d2 + (size_t)r * 2 * T + w * T, a.doc + (size_t)r * T, T * sizeof(int));
        }
        Tensor *lg = lm_forward_carry(&a.tp, &a.lm, a.x, a.doc, B, T, a.carry);
        for (int r = 0; r < B; r++)
            dev_to_host(carried + ((size_t)r * 2 * T + w * T) * V, lg->data + (size_t)r * T * V,
                        (size_t)T * V * sizeof(real), dev);
        tape_reset(&a.tp);
        if (w == 1) {
            LMCache *zero = lm_cache_new_on(&a.lm, B, 1, dev);
            lg = lm_forward_carry(&a.tp, &a.lm, a.x, a.doc, B, T, zero);
            dev_to_host(fresh, lg->data, bt * V * sizeof(real), dev);
            tape_reset(&a.tp);
            lm_cache_free(&a.lm, zero);
        }
    }
    Tensor *lw = lm_forward_docs(&a.tp, &a.lm, x2, d2, B, 2 * T, NULL, NULL);
    real *whole = malloc(2 * bt * V * sizeof(real));
    dev_to_host(whole, lw->data, 2 * bt * V * sizeof(real), dev);
    double scale = 0, diff = 0, moved = 0;
    for (size_t i = 0; i < 2 * bt * V; i++) {
        scale = fmax(scale, fabs((double)whole[i]));
        diff = fmax(diff, fabs((double)whole[i] - (double)carried[i]));
    }
    for (int r = 0; r < B; r++)
        for (size_t i = 0; i < (size_t)T * V; i++)
            moved = fmax(moved, fabs((double)fresh[(size_t)r * T * V + i] -
                                     (double)carried[((size_t)r * 2 * T + T) * V + i]));
    tape_reset(&a.tp);
    tape_no_grad_pop(&a.tp);
#ifdef AG_DOUBLE
    double tol = 1e-10;
#else
    double tol = 1e-4;
#endif
    cr_assert(diff <= tol * scale, "carried windows vs one forward: %g (scale %g)", diff, scale);
    cr_assert(moved > 100 * tol * scale, "window 1 from a zero state should differ: %g", moved);
    free(x2);
    free(d2);
    free(whole);
    free(carried);
    free(fresh);
    trainer_free(&a);
}

Test(documents, config_errors_name_the_key) {
    static Trainer t;
    const char *cfg = test_tiny_config("docerr", "gdn", 2, NULL, "[data]\ndocuments = paragraphs\n");
    TrainerOptions o = {.config = cfg, .quiet = true};
    Status s = trainer_setup(&t, &o);
    cr_assert(!s.ok && strstr(s.msg, "tiny.ini:") && strstr(s.msg, "documents") && strstr(s.msg, "paragraphs"),
              "%s", s.msg);
    cfg = test_tiny_config("docerr", "gdn", 2, NULL, "carry_state = true\n");   // without order = streams
    o.config = cfg;
    s = trainer_setup(&t, &o);
    cr_assert(!s.ok && strstr(s.msg, "tiny.ini:") && strstr(s.msg, "carry_state") && strstr(s.msg, "order = streams"),
              "%s", s.msg);
    cfg = test_tiny_config("docerr", "attn", 2, NULL, "carry_state = true\n[data]\norder = streams\n");
    o.config = cfg;
    s = trainer_setup(&t, &o);
    cr_assert(!s.ok && strstr(s.msg, "carry_state") && strstr(s.msg, "no layer"), "%s", s.msg);
    // carry_state cannot change on resume (the stream would change under the run).
    cfg = test_tiny_config("docerr", "gdn", 2, NULL, NULL);
    o.config = cfg;
    cr_assert(trainer_setup(&t, &o).ok);
    cr_assert_eq(trainer_run(&t, &o), 0);
    char init[sizeof t.ckpt + 32];
    snprintf(init, sizeof init, "finetune.init_from=%s", t.ckpt);
    trainer_free(&t);
    // Indexer fine-tuning trains no recurrent layer: carry_state is refused, naming the key.
    const char *ft[] = {"finetune.mode=indexer", init, "data.order=streams", "train.carry_state=true"};
    TrainerOptions f = {.config = cfg, .quiet = true, .overwrite = true, .sets = ft, .n_sets = 4};
    s = trainer_setup(&t, &f);
    cr_assert(!s.ok && strstr(s.msg, "carry_state") && strstr(s.msg, "indexer"), "%s", s.msg);
    const char *sets[] = {"train.carry_state=true", "data.order=streams", "train.steps=3"};
    TrainerOptions r = {.config = cfg, .quiet = true, .resume = true, .sets = sets, .n_sets = 3};
    s = trainer_setup(&t, &r);
    cr_assert(!s.ok && strstr(s.msg, "carry_state"), "%s", s.msg);
}
