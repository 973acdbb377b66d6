// The validation split as whole documents drawn at random (val_split.h):
// whole documents only, the same split from the same seed, the training
// documents first in their order, and a run that holds them out (the default
// where documents exist) or the tail (val_choice = tail).
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "trainer.h"
#include "val_split.h"

// 20 documents of 3..22 tokens, token value = 1000 * document + position.
static int64_t make_docs(int *tokens, int64_t *starts) {
    int64_t n = 0;
    for (int d = 0; d < 20; d++) {
        starts[d] = n;
        for (int i = 0; i < 3 + d; i++) tokens[n++] = 1000 * d + i;
    }
    return n;
}

Test(val_split, whole_documents_at_random_and_seeded) {
    int tokens[400];
    int64_t starts[20];
    int64_t n = make_docs(tokens, starts);
    int *a, *b;
    int64_t *sa, *sb, ea, eb;
    cr_assert(val_split_documents(tokens, n, starts, 20, 0.2, 7, &a, &sa, &ea).ok);
    cr_assert(ea < n && (double)(n - ea) >= 0.2 * (double)n - 0.5, "held out %lld of %lld", (long long)(n - ea),
              (long long)n);
    // Every document comes whole, once; training documents first, each part in document order.
    bool seen[20] = {0};
    int last_train = -1, last_val = -1;
    for (int64_t d = 0; d < 20; d++) {
        int doc = a[sa[d]] / 1000;
        int64_t end = d + 1 < 20 ? sa[d + 1] : n;
        cr_assert_eq(end - sa[d], 3 + doc, "document %d is whole", doc);
        for (int64_t i = sa[d]; i < end; i++) cr_assert_eq(a[i], 1000 * doc + (int)(i - sa[d]));
        cr_assert(!seen[doc]);
        seen[doc] = true;
        bool held = sa[d] >= ea;
        cr_assert(sa[d] != ea || d > 0, "the split is at a document start");
        int *last = held ? &last_val : &last_train;
        cr_assert_gt(doc, *last, "each part keeps the documents' order");
        *last = doc;
    }
    cr_assert(last_val >= 0 && last_train >= 0);
    bool at_start = false;
    for (int d = 0; d < 20; d++) at_start |= sa[d] == ea;
    cr_assert(at_start, "the held-out part begins at a document");
    // Not simply the last documents (the tail of a name-sorted folder).
    cr_assert(a[ea] / 1000 < 17, "the held-out documents are drawn, not the last ones (first: %d)", a[ea] / 1000);
    cr_assert(val_split_documents(tokens, n, starts, 20, 0.2, 7, &b, &sb, &eb).ok);
    cr_assert(eb == ea && memcmp(a, b, (size_t)n * sizeof *a) == 0, "the same seed, the same split");
    free(b), free(sb);
    bool differs = false;
    for (uint64_t seed = 8; seed < 12 && !differs; seed++) {
        cr_assert(val_split_documents(tokens, n, starts, 20, 0.2, seed, &b, &sb, &eb).ok);
        differs = eb != ea || memcmp(a, b, (size_t)n * sizeof *a) != 0;
        free(b), free(sb);
    }
    cr_assert(differs, "another seed, another split");
    free(a), free(sa);
    // At least one document, never all; fewer than two documents: an error that says what to do.
    cr_assert(val_split_documents(tokens, n, starts, 20, 0.001, 1, &a, &sa, &ea).ok && ea < n);
    free(a), free(sa);
    cr_assert(val_split_documents(tokens, n, starts, 20, 0.9, 1, &a, &sa, &ea).ok && ea > 0);
    free(a), free(sa);
    Status s = val_split_documents(tokens, n, starts, 1, 0.2, 1, &a, &sa, &ea);
    cr_assert(!s.ok && strstr(s.msg, "val_choice = tail") && !a && !sa, "%s", s.msg);
}

// A run with documents holds out whole documents by default and stores the
// choice in its config; val_choice = tail holds out the last tokens as before.
Test(val_split, a_run_holds_out_documents_by_default, .timeout = 90) {
    const char *cfg = test_tiny_config("val_split_run", "gdn", 2, NULL, NULL);
    // The scratch corpus as documents: a line per "day."; about 1000 of them.
    const char *docs[] = {"data.documents=text:day.", "data.val_fraction=0.2"};
    static Trainer t;
    Status s = trainer_setup(&t, &(TrainerOptions){.config = cfg, .quiet = true, .sets = docs, .n_sets = 2});
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(t.cfg.data.val_choice, CFG_VAL_DOCUMENTS);
    cr_assert_gt(t.tokens.n_docs, 10);
    int64_t end = t.bt.train_end, n = t.tokens.n;
    bool at_start = false;
    for (int64_t d = 0; d < t.tokens.n_docs; d++) at_start |= t.tokens.doc_starts[d] == end;
    cr_assert(at_start, "the validation split starts at a document");
    cr_assert_neq(end, n - (int64_t)((double)n * 0.2), "whole documents, not the cut at 80%% of the tokens");
    TrainerOptions o = {.config = cfg, .quiet = true, .sets = docs, .n_sets = 2};
    cr_assert_eq(trainer_run(&t, &o), 0);
    char ckpt[1500], out[1600];
    snprintf(ckpt, sizeof ckpt, "%s", t.ckpt);
    int64_t val_tokens = batcher_val_tokens(&t.bt);
    trainer_free(&t);
    // evaluate --val scores the same held-out documents (every token after the first).
    snprintf(out, sizeof out, "%s/val.json", test_dir_of(ckpt));
    int code = test_spawn((char *[]){(char *)test_program("evaluate"), "--checkpoint", ckpt, "--val", "--json", NULL},
                          NULL, out, NULL, 60, NULL);
    char *json = test_read_file(out);
    cr_assert(code == 0 && json, "evaluate --val: exit %d", code);
    const char *k = strstr(json, "\"tokens_scored\":");
    cr_assert(k && strtoll(k + 16, NULL, 10) == val_tokens - 1, "%lld held out, evaluate --val: %s",
              (long long)val_tokens, json);
    free(json);
    const char *tail[] = {"data.documents=text:day.", "data.val_fraction=0.2", "data.val_choice=tail"};
    s = trainer_setup(&t, &(TrainerOptions){.config = cfg, .quiet = true, .overwrite = true, .sets = tail, .n_sets = 3});
    cr_assert(s.ok, "%s", s.msg);
    cr_assert_eq(t.bt.train_end, t.tokens.n - (int64_t)((double)t.tokens.n * 0.2));
    trainer_free(&t);
}
