// GGUF export of BPE tokenizers: the merge list derived from the ranks
// (data/bpe_merges.h) encodes as the ranks do when applied GPT-2 style, and
// the tokenizer.ggml.* keys (train/export_gguf_vocab.c). The llama.cpp
// comparison on a multilingual text is tests/test_llama.sh.
#include <stdlib.h>
#include <string.h>

#include "bpe_merges.h"
#include "bpe_train.h"
#include "export_gguf.h"
#include "lm.h"
#include "test_util.h"

// GPT-2-style BPE of one piece: start from its bytes; merge the adjacent
// pair that has a merge with the lowest index (merges are in rank order, so
// the lowest made id), the leftmost on a tie, until no pair has one.
static int merge_gpt2_style(const Bpe *b, const int *left, const int *right, const uint8_t *p, int n, int *ids) {
    int V = bpe_vocab_size(b), k = 0;
    for (int i = 0; i < n; i++) {
        int id = 0, len = 0;
        while (id < V && !(bpe_token_bytes(b, id, &len) && len == 1 && bpe_token_bytes(b, id, &len)[0] == p[i])) id++;
        cr_assert_lt(id, V, "byte %d has a token", p[i]);
        ids[k++] = id;
    }
    for (;;) {
        int best = -1, made = V;
        for (int i = 0; i + 1 < k; i++)
            for (int id = 0; id < made; id++)
                if (left[id] == ids[i] && right[id] == ids[i + 1]) best = i, made = id;
        if (best < 0) return k;
        ids[best] = made;
        memmove(ids + best + 1, ids + best + 2, (size_t)(k - best - 2) * sizeof *ids);
        k--;
    }
}

// Words of a made-up language: syllables drawn by an LCG, so pairs repeat
// often enough to be merged and differ enough to leave many merge orders.
static char *made_up_text(int words, uint32_t seed) {
    static const char *syl[] = {"ka", "lo", "mi", "ne", "ru", "ta", "ell", "on", "is", "a", "o", "str", "ing", "é", "日"};
    char *t = calloc((size_t)words * 16 + 1, 1);
    for (int w = 0; w < words; w++) {
        seed = seed * 1103515245u + 12345u;
        int n = 1 + (int)(seed >> 16) % 4;
        for (int s = 0; s < n; s++) {
            seed = seed * 1103515245u + 12345u;
            strcat(t, syl[(seed >> 16) % (sizeof syl / sizeof syl[0])]);
        }
        strcat(t, " ");
    }
    return t;
}

// A BPE of vocab ids trained on text, with TOKENIZER_EOT and, unless NULL, the special `extra`.
static Bpe *trained(const char *text, int vocab, const char *pattern, const char *extra) {
    const char *specials[] = {TOKENIZER_EOT, extra};
    BpeTrainOpts o = {.vocab = vocab, .pattern = pattern, .specials = specials, .n_specials = extra ? 2 : 1};
    uint8_t *file;
    size_t len;
    Status st = bpe_train((const uint8_t *)text, (int64_t)strlen(text), &o, &file, &len, NULL);
    cr_assert(st.ok, "%s", st.msg);
    Bpe *b = bpe_from_buffer(file, len, "trained", &st);
    cr_assert_not_null(b, "%s", st.msg);
    free(file);
    return b;
}

Test(gguf_vocab, the_merges_of_a_trained_bpe_encode_every_word_as_its_ranks) {
    char *text = made_up_text(3000, 7);
    Bpe *b = trained(text, 400, "\\S+|\\s+", NULL);
    int V = bpe_vocab_size(b), *left = malloc((size_t)V * sizeof *left), *right = malloc((size_t)V * sizeof *right);
    cr_assert_eq(bpe_merges(b, left, right), 0, "a trained tokenizer has no token its pairs cannot make");
    int n_merges = 0;
    for (int id = 0; id < V; id++) n_merges += left[id] >= 0;
    cr_assert_eq(n_merges, bpe_n_ranks(b) - 256, "every token past the bytes has its merge");
    // Words of the training text and of another draw: one piece each (the
    // pattern splits at white space), so tiktoken's encoding is the piece's.
    char *other = made_up_text(2000, 99), *texts[] = {text, other};
    int words = 0, multi = 0;
    for (int t = 0; t < 2; t++)
        for (char *w = strtok(texts[t], " "); w; w = strtok(NULL, " "), words++) {
            int n = (int)strlen(w), want[64], got[64];
            int nw = (int)bpe_encode(b, (const uint8_t *)w, n, want, 0);
            int ng = merge_gpt2_style(b, left, right, (const uint8_t *)w, n, got);
            multi += nw > 1;
            cr_assert(nw == ng && memcmp(want, got, (size_t)nw * sizeof *want) == 0,
                      "'%s': %d ids by the ranks, %d by the merges (first %d, %d)", w, nw, ng, want[0], got[0]);
        }
    cr_assert_gt(multi, 100, "the words exercise merge orders, not only whole tokens (%d of %d)", multi, words);
    free(other), free(text), free(left), free(right);
    bpe_free(b);
}

Test(gguf_vocab, gpt2_merges_begin_as_openai_published_them) {
    Status st;
    Bpe *b = bpe_from_name("gpt2", &st);
    cr_assert_not_null(b, "%s", st.msg);
    int V = bpe_vocab_size(b), *left = malloc((size_t)V * sizeof *left), *right = malloc((size_t)V * sizeof *right);
    cr_assert_eq(bpe_merges(b, left, right), 0, "every gpt2 token is made by a pair");
    // merges.txt of GPT-2 begins "Ġ t", "Ġ a", "h e": ids 256, 257, 258.
    const char *pairs[][2] = {{" ", "t"}, {" ", "a"}, {"h", "e"}};
    for (int i = 0; i < 3; i++) {
        int n;
        const uint8_t *l = bpe_token_bytes(b, left[256 + i], &n);
        cr_assert(n == 1 && *l == (uint8_t)pairs[i][0][0], "merge %d, left", i);
        const uint8_t *r = bpe_token_bytes(b, right[256 + i], &n);
        cr_assert(n == 1 && *r == (uint8_t)pairs[i][1][0], "merge %d, right", i);
    }
    cr_assert_eq(left[bpe_special_id(b, TOKENIZER_EOT)], -1, "a special has no merge");
    free(left), free(right);
    bpe_free(b);
}

// ---------------------------------------------------------------- the keys

typedef struct Kv {
    const uint8_t *p;
    size_t at, n;
} Kv;

static uint64_t take(Kv *r, size_t bytes) {
    cr_assert_leq(r->at + bytes, r->n, "the file ends inside a key");
    uint64_t v = 0;
    memcpy(&v, r->p + r->at, bytes);
    r->at += bytes;
    return v;
}

// Position r at the value of key (its type into *type); false if absent.
static bool seek_key(Kv *r, const char *key, uint32_t *type) {
    static const size_t size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    r->at = 16;   // past the magic, the version and the tensor count
    uint64_t nkv = take(r, 8);
    for (uint64_t i = 0; i < nkv; i++) {
        size_t len = take(r, 8);
        bool hit = len == strlen(key) && memcmp(r->p + r->at, key, len) == 0;
        r->at += len;
        *type = (uint32_t)take(r, 4);
        if (hit) return true;
        uint32_t t = *type;
        uint64_t count = 1;
        if (t == 9) t = (uint32_t)take(r, 4), count = take(r, 8);
        for (uint64_t k = 0; k < count; k++) {
            if (t == 8) {
                r->at += take(r, 8);
            } else {
                cr_assert_lt(t, 13u);
                r->at += size[t];
            }
        }
    }
    return false;
}

// Element i of the string array `key`, and the array's length.
static const char *string_at(Kv *r, const char *key, uint64_t i, size_t *len, uint64_t *count) {
    uint32_t type;
    cr_assert(seek_key(r, key, &type) && type == 9 && take(r, 4) == 8, "%s: an array of strings", key);
    *count = take(r, 8);
    cr_assert_lt(i, *count);
    for (uint64_t k = 0; k < i; k++) r->at += take(r, 8);
    *len = take(r, 8);
    return (const char *)r->p + r->at;
}

static int32_t i32_at(Kv *r, const char *key, uint64_t i) {
    uint32_t type;
    cr_assert(seek_key(r, key, &type) && type == 9 && take(r, 4) == 5, "%s: an array of int32", key);
    cr_assert_lt(i, take(r, 8));
    r->at += 4 * i;
    return (int32_t)take(r, 4);
}

// A two-layer attn model of tok's vocabulary, exported.
static uint8_t *export_with(const Tokenizer *tok, size_t *n) {
    LMConfig c = test_tiny_lm_config("attn,attn");
    c.d_model = 32, c.d_ff = 64, c.mixer = mixer_config_default(32, 2, 16, 16), c.vocab_size = tok->vocab;
    ParamStore ps;
    params_init(&ps);
    LM lm;
    lm_create(&lm, &c, &ps);
    params_finalize(&ps, 3);
    TrainConfig tc;
    memset(&tc, 0, sizeof tc);
    tc.model.layers.n = 2;
    for (int l = 0; l < 2; l++) snprintf(tc.model.layers.name[l], CONFIG_NAME_MAX, "attn");
    tc.model.d_model = 32, tc.model.n_heads = 2, tc.model.d_k = tc.model.d_v = 16, tc.model.d_ff = 64;
    tc.model.tied_embeddings = true, tc.model.norm_eps = 1e-6, tc.model.rope_base = 10000, tc.data.seq_len = 64;
    uint8_t *bytes = NULL;
    Status s = export_gguf_bytes(&tc, &ps, tok, GGUF_F32, &bytes, n);
    cr_assert(s.ok, "%s", s.msg);
    lm_destroy(&lm);
    params_free(&ps);
    return bytes;
}

Test(gguf_vocab, cl100k_base_is_written_with_its_pre_tokenizer_specials_and_placeholders) {
    Tokenizer tok;
    Status s = tokenizer_open(&tok, "cl100k_base");
    cr_assert(s.ok, "%s", s.msg);
    size_t n, len;
    uint64_t count;
    uint8_t *bytes = export_with(&tok, &n);
    Kv r = {bytes, 0, n};
    uint32_t type;
    cr_assert(seek_key(&r, "tokenizer.ggml.pre", &type) && type == 8);
    size_t pl = take(&r, 8);
    cr_assert(pl == 9 && memcmp(bytes + r.at, "llama-bpe", 9) == 0, "cl100k_base's pattern is llama.cpp's llama3 regex");
    const char *t = string_at(&r, "tokenizer.ggml.tokens", 100257, &len, &count);
    cr_assert_eq(count, (uint64_t)tok.vocab, "one token per embedding row, holes included");
    cr_assert(len == strlen(TOKENIZER_EOT) && memcmp(t, TOKENIZER_EOT, len) == 0, "a special as its text");
    cr_assert_eq(i32_at(&r, "tokenizer.ggml.token_type", 100257), 3, "a special is CONTROL");
    t = string_at(&r, "tokenizer.ggml.tokens", 100261, &len, &count);
    cr_assert(memchr(t, ' ', len), "a hole's placeholder has a space, which no byte-level token has");
    cr_assert_eq(i32_at(&r, "tokenizer.ggml.token_type", 100261), 5, "a hole is UNUSED");
    t = string_at(&r, "tokenizer.ggml.tokens", 0, &len, &count);
    cr_assert(len == 1 && *t == '!', "ids keep their ranks");
    cr_assert_eq(i32_at(&r, "tokenizer.ggml.token_type", 0), 1);
    t = string_at(&r, "tokenizer.ggml.merges", 0, &len, &count);
    cr_assert(len == 5 && memcmp(t, "\xc4\xa0 \xc4\xa0", 5) == 0, "cl100k_base's first merge is two spaces, as 'Ġ Ġ'");
    cr_assert_eq(count, (uint64_t)bpe_n_ranks(tok.bpe) - 256);
    cr_assert(seek_key(&r, "tokenizer.ggml.eos_token_id", &type) && type == 4 && take(&r, 4) == 100257);
    cr_assert(seek_key(&r, "tokenizer.ggml.add_bos_token", &type) && type == 7 && take(&r, 1) == 0,
              "no BOS: attnlab's ids start with the text's");
    free(bytes);
    tokenizer_free(&tok);
}

// export_gguf_check of a one-layer attn model with tokenizer b.
static Status check_with(const Bpe *b) {
    size_t len;
    uint8_t *file = bpe_to_buffer(b, &len);
    Tokenizer tok;
    Status s = tokenizer_from_buffer(&tok, file, len, "trained");
    cr_assert(s.ok, "%s", s.msg);
    TrainConfig tc;
    memset(&tc, 0, sizeof tc);
    tc.model.layers.n = 1;
    snprintf(tc.model.layers.name[0], CONFIG_NAME_MAX, "attn");
    tc.model.d_k = tc.model.d_v = 16;
    s = export_gguf_check(&tc, &tok);
    tokenizer_free(&tok);
    free(file);
    return s;
}

Test(gguf_vocab, a_split_pattern_llama_cpp_lacks_is_refused_by_name) {
    char *text = made_up_text(500, 3);
    Bpe *b = trained(text, 300, "\\S+|\\s+", NULL);
    Status s = check_with(b);
    cr_assert(!s.ok && strstr(s.msg, "'\\S+|\\s+'") && strstr(s.msg, "no llama.cpp pre-tokenizer"), "%s", s.msg);
    free(text);
    bpe_free(b);
}

Test(gguf_vocab, a_special_with_an_ordinary_tokens_text_is_refused) {
    char *text = made_up_text(500, 5);
    // GPT-2's alphabet writes "é" (merged: the text has many) as "Ã©", and byte 0x0a as "Ċ".
    const char *clashes[] = {"\xc3\x83\xc2\xa9", "\xc4\x8a"};
    for (int i = 0; i < 2; i++) {
        Bpe *b = trained(text, 300, NULL, clashes[i]);
        Status s = check_with(b);
        cr_assert(!s.ok && strstr(s.msg, clashes[i]) && strstr(s.msg, "would give one id for both"), "%s", s.msg);
        bpe_free(b);
    }
    Bpe *b = trained(text, 300, NULL, "<|pad|>");
    Status s = check_with(b);
    cr_assert(s.ok, "a special no ordinary token spells is written: %s", s.msg);
    free(text);
    bpe_free(b);
}
