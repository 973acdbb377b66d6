// The BPE trainer (data/bpe_train.c) against a reference trainer written
// here the slow, obvious way: recount every pair of every piece after each
// merge, pick the best by a linear scan. Both must give the same file, byte
// for byte, tie-breaks and merges that reuse a token's bytes included.
#define _GNU_SOURCE   // memmem
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "bpe_impl.h"
#include "bpe_train.h"
#include "test_util.h"

typedef struct RefTok {
    uint8_t b[2 * BPE_TOKEN_MAX];
    int n;
} RefTok;

typedef struct RefWord {
    int *ids, n;
    int64_t freq;
} RefWord;

// The reference: returns the canonical file, like bpe_train.
static uint8_t *ref_train(const uint8_t *text, int64_t n, const char *pattern, int vocab, const char *const *specials,
                          int n_specials, size_t *len, int *same_bytes) {
    Status st;
    BpeSplit *split = bpe_split_new(pattern, &st);
    cr_assert_not_null(split, "%s", st.msg);
    RefWord *words = NULL;
    int n_words = 0;
    // The corpus cut at special tokens' texts, each stretch split by the pattern.
    for (int64_t pos = 0; pos < n;) {
        int64_t end = n, skip = 0;
        for (int i = 0; i < n_specials; i++) {
            int64_t l = (int64_t)strlen(specials[i]);
            for (int64_t k = pos; k + l <= end; k++)
                if (memcmp(text + k, specials[i], (size_t)l) == 0) {
                    end = k, skip = l;
                    break;
                }
        }
        BpeSplitIter it;
        bpe_split_begin(&it, split, text + pos, end - pos);
        for (int64_t s, e; bpe_split_next(&it, &s, &e);) {
            int w = 0, len_p = (int)(e - s);
            const uint8_t *p = text + pos + s;
            while (w < n_words && !(words[w].n == len_p && ({
                       bool same = true;
                       for (int i = 0; i < len_p; i++) same &= words[w].ids[i] == p[i];
                       same;
                   })))
                w++;
            if (w == n_words) {
                words = realloc(words, (size_t)(n_words + 1) * sizeof *words);
                words[n_words].ids = malloc((size_t)len_p * sizeof(int));
                for (int i = 0; i < len_p; i++) words[n_words].ids[i] = p[i];
                words[n_words].n = len_p, words[n_words].freq = 0;
                n_words++;
            }
            words[w].freq++;
        }
        bpe_split_end(&it);
        pos = end + skip;
    }
    bpe_split_free(split);
    RefTok *tok = malloc((size_t)vocab * sizeof *tok);
    int n_tok = 256;
    for (int c = 0; c < 256; c++) tok[c].b[0] = (uint8_t)c, tok[c].n = 1;
    *same_bytes = 0;
    int max_pairs = 0;
    for (int w = 0; w < n_words; w++) max_pairs += words[w].n;
    int *pa = malloc((size_t)(max_pairs + 1) * sizeof *pa), *pb = malloc((size_t)(max_pairs + 1) * sizeof *pb);
    int64_t *pc = malloc((size_t)(max_pairs + 1) * sizeof *pc);
    while (n_tok < vocab - n_specials) {
        int np = 0;   // every pair, counted from scratch
        for (int w = 0; w < n_words; w++)
            for (int i = 0; i + 1 < words[w].n; i++) {
                int a = words[w].ids[i], b = words[w].ids[i + 1], k = 0;
                if (tok[a].n + tok[b].n > BPE_TOKEN_MAX) continue;
                while (k < np && !(pa[k] == a && pb[k] == b)) k++;
                if (k == np) pa[np] = a, pb[np] = b, pc[np] = 0, np++;
                pc[k] += words[w].freq;
            }
        int best = -1;
        for (int k = 0; k < np; k++)
            if (best < 0 || pc[k] > pc[best] || (pc[k] == pc[best] && (pa[k] < pa[best] || (pa[k] == pa[best] && pb[k] < pb[best]))))
                best = k;
        if (best < 0) break;
        int a = pa[best], b = pb[best];
        RefTok m;
        memcpy(m.b, tok[a].b, (size_t)tok[a].n);
        memcpy(m.b + tok[a].n, tok[b].b, (size_t)tok[b].n);
        m.n = tok[a].n + tok[b].n;
        int id = 0;
        while (id < n_tok && !(tok[id].n == m.n && memcmp(tok[id].b, m.b, (size_t)m.n) == 0)) id++;
        if (id == n_tok) tok[n_tok++] = m;
        else (*same_bytes)++;
        for (int w = 0; w < n_words; w++) {
            int o = 0, *s = words[w].ids;
            for (int i = 0; i < words[w].n;) {
                if (i + 1 < words[w].n && s[i] == a && s[i + 1] == b) s[o++] = id, i += 2;
                else s[o++] = s[i++];
            }
            words[w].n = o;
        }
    }
    // The result in the .tiktoken form, through the loader to its canonical form.
    char *tk = malloc((size_t)n_tok * 1100 + 1), b64[1100];
    size_t m = 0;
    for (int id = 0; id < n_tok; id++) {
        int l = bpe_base64_encode(tok[id].b, tok[id].n, b64);
        m += (size_t)sprintf(tk + m, "%.*s %d\n", l, b64, id);
    }
    BpeSpecial sp[8];
    for (int i = 0; i < n_specials; i++) sp[i] = (BpeSpecial){specials[i], n_tok + i};
    Bpe *bpe = bpe_from_tiktoken((const uint8_t *)tk, m, "reference", pattern, sp, n_specials, &st);
    cr_assert_not_null(bpe, "%s", st.msg);
    uint8_t *out = bpe_to_buffer(bpe, len);
    bpe_free(bpe);
    for (int w = 0; w < n_words; w++) free(words[w].ids);
    free(words), free(tok), free(pa), free(pb), free(pc), free(tk);
    return out;
}

static int progress_calls;
static void count_progress(void *ctx, const char *stage, int64_t done, int64_t total) {
    cr_assert(done >= 0 && done <= total, "%s: %lld of %lld", stage, (long long)done, (long long)total);
    progress_calls++;
}

// Train with both; the files must be equal. Returns the trainer's stats.
static BpeTrainStats check_against_reference(const char *text, int64_t n, const char *pattern, int vocab,
                                             const char *const *specials, int n_specials) {
    BpeTrainOpts o = {.vocab = vocab, .pattern = pattern, .specials = specials, .n_specials = n_specials,
                      .progress = count_progress};
    uint8_t *got;
    size_t n_got, n_want;
    BpeTrainStats stats;
    progress_calls = 0;
    Status st = bpe_train((const uint8_t *)text, n, &o, &got, &n_got, &stats);
    cr_assert(st.ok, "%s", st.msg);
    cr_assert(progress_calls > 0);
    int same;
    uint8_t *want = ref_train((const uint8_t *)text, n, pattern ? pattern : bpe_pattern_named("cl100k_base"), vocab,
                              specials, n_specials, &n_want, &same);
    cr_assert_eq(stats.same_bytes_merges, same);
    size_t i = 0;
    while (i < n_got && i < n_want && got[i] == want[i]) i++;
    cr_assert(n_got == n_want && i == n_got, "trainer and reference differ at byte %zu:\n%.*s\n---- reference:\n%.*s",
              i, (int)(n_got - i > 200 ? 200 : n_got - i), got + i, (int)(n_want - i > 200 ? 200 : n_want - i), want + i);
    free(got), free(want);
    return stats;
}

Test(bpe_train, equals_reference_classic) {
    const char *t = "aaabdaaabac aaabdaaabac";
    BpeTrainStats s = check_against_reference(t, (int64_t)strlen(t), "\\S+|\\s+", 256 + 10, NULL, 0);
    cr_assert(s.merges > 2 && s.merges < 10, "the corpus runs out of pairs: %d merges", s.merges);
}

// Every pair counts the same: the tie-break (smaller a, then smaller b) decides.
Test(bpe_train, equals_reference_ties) {
    const char *t = "ba ab dc cd ba ab dc cd zz yy xy yx";
    check_against_reference(t, (int64_t)strlen(t), "\\S+|\\s+", 256 + 12, NULL, 0);
    const char *u = "aaaa aaa aa bbbbbbb";   // overlapping pairs count each position
    check_against_reference(u, (int64_t)strlen(u), "\\S+|\\s+", 256 + 8, NULL, 0);
}

// Random words of a small alphabet: many merges, many ties.
Test(bpe_train, equals_reference_random_small_alphabet) {
    uint64_t s = 7;
    for (int trial = 0; trial < 6; trial++) {
        char t[3000];
        int n = 1500 + trial * 200;
        for (int i = 0; i < n; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            t[i] = "abcab \n'"[s % (trial % 2 ? 8 : 6)];
        }
        t[n] = 0;
        check_against_reference(t, n, trial % 2 ? NULL : "\\S+|\\s+", 256 + 40 + 20 * trial, NULL, 0);
    }
}

// Special tokens cut the corpus (no merge across them) and take the last ids.
Test(bpe_train, equals_reference_with_specials) {
    const char *sp[2] = {"<|endoftext|>", "<|pad|>"};
    const char *t = "the cat<|endoftext|>the hat<|endoftext|>at the<|pad|>the cat sat";
    BpeTrainStats s = check_against_reference(t, (int64_t)strlen(t), NULL, 256 + 2 + 6, sp, 2);
    cr_assert_eq(s.vocab, 256 + 2 + 6);
    Status st;
    BpeTrainOpts o = {.vocab = 256 + 2 + 6, .specials = sp, .n_specials = 2};
    uint8_t *file;
    size_t n;
    cr_assert(bpe_train((const uint8_t *)t, (int64_t)strlen(t), &o, &file, &n, NULL).ok);
    Bpe *b = bpe_from_buffer(file, n, "trained", &st);
    cr_assert_not_null(b, "%s", st.msg);
    cr_assert_eq(bpe_special_id(b, "<|endoftext|>"), 262);
    cr_assert_eq(bpe_special_id(b, "<|pad|>"), 263);
    int len;
    for (int id = 0; id < 262; id++) {
        const uint8_t *p = bpe_token_bytes(b, id, &len);
        cr_assert(!memmem(p, (size_t)len, "|>", 2) && !memmem(p, (size_t)len, "<|", 2), "a merge crossed a special");
    }
    bpe_free(b), free(file);
}

// Real text with cl100k_base's pattern: the first 12 KB of the fixture text.
Test(bpe_train, equals_reference_multilingual) {
    char path[512];
    snprintf(path, sizeof path, "%s/tests/fixtures/bpe/specials.txt", SOURCE_DIR);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    char *t = malloc(12001);
    int64_t n = (int64_t)fread(t, 1, 12000, f);
    fclose(f);
    check_against_reference(t, n, NULL, 256 + 120, NULL, 0);
    free(t);
}

// Training twice gives the same file; the file reloads to the same bytes
// (write -> read -> write) and encodes any bytes reversibly.
Test(bpe_train, deterministic_and_reloads_identically) {
    const char *text = "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
                       "and darkness was upon the face of the deep. 1234567 I'LL we'Re  \n\n\t x";
    int64_t n = (int64_t)strlen(text);
    const char *sp[1] = {"<|endoftext|>"};
    BpeTrainOpts o = {.vocab = 256 + 50, .specials = sp, .n_specials = 1};
    uint8_t *f1, *f2, *f3;
    size_t n1, n2, n3;
    cr_assert(bpe_train((const uint8_t *)text, n, &o, &f1, &n1, NULL).ok);
    cr_assert(bpe_train((const uint8_t *)text, n, &o, &f2, &n2, NULL).ok);
    cr_assert(n1 == n2 && memcmp(f1, f2, n1) == 0, "training twice gave different files");
    Status st;
    Bpe *b = bpe_from_buffer(f1, n1, "trained", &st);
    cr_assert_not_null(b, "%s", st.msg);
    f3 = bpe_to_buffer(b, &n3);
    cr_assert(n1 == n3 && memcmp(f1, f3, n1) == 0, "write -> read -> write changed the file");
    cr_assert_eq(bpe_vocab_size(b), 306);
    int ids[256];
    int64_t m = bpe_encode(b, (const uint8_t *)text, n, ids, 0), len;
    cr_assert(m < n / 2, "50 merges on their own training text: %lld ids for %lld bytes", (long long)m, (long long)n);
    uint8_t *back = bpe_decode(b, ids, m, &len, &st);
    cr_assert(len == n && memcmp(back, text, (size_t)n) == 0);
    free(back), free(f1), free(f2), free(f3);
    bpe_free(b);
}

Test(bpe_train, bad_options) {
    uint8_t *f;
    size_t n;
    const char *sp[2] = {"<|a|>", "<|a|>"};
    BpeTrainOpts o = {.vocab = 255};
    Status st = bpe_train((const uint8_t *)"ab", 2, &o, &f, &n, NULL);
    cr_assert_str_eq(st.msg, "vocabulary 255: must be in [256, 4194304] (256 bytes + 0 special tokens at least)");
    o = (BpeTrainOpts){.vocab = 300, .specials = sp, .n_specials = 2};
    st = bpe_train((const uint8_t *)"ab", 2, &o, &f, &n, NULL);
    cr_assert_str_eq(st.msg, "special token '<|a|>' given twice");
    o = (BpeTrainOpts){.vocab = 300, .pattern = "(x"};
    st = bpe_train((const uint8_t *)"ab", 2, &o, &f, &n, NULL);
    cr_assert(strstr(st.msg, "split pattern: not one of the known patterns"), "%s", st.msg);   // (no regex of the caller's)
}
