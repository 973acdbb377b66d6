// BPE encoder and decoder (data/bpe.c): ids equal to tiktoken's, round trips
// of arbitrary bytes, the two merge algorithms, streaming decoding, files.
//
// Expected ids come from the npm package `tiktoken` 1.0.22 (tiktoken's Rust
// core built to WASM): tests/fixtures/bpe/make_fixtures.mjs wrote them for
// text.txt.gz (353 KB, make_text.py: ~45 languages, a Unicode sweep, emoji,
// code, numbers, whitespace, contractions), specials.txt (special tokens
// allowed), invalid.bin (invalid UTF-8; the rule is in data/bpe.h and the
// script says how its ids were made) and unicode_new.txt.gz (characters of
// Unicode 15 and 16, which PCRE2 10.42 does not know: data/bpe_unicode.c).
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "bpe.h"
#include "bpe_impl.h"
#include "test_util.h"

#define FIXTURES SOURCE_DIR "/tests/fixtures/bpe/"

// A fixture file, gunzipped when its name ends in .gz; NUL-terminated.
static uint8_t *read_fixture(const char *name, int64_t *n) {
    char path[512];
    snprintf(path, sizeof path, FIXTURES "%s", name);
    gzFile f = gzopen(path, "rb");   // reads plain files as they are
    cr_assert_not_null(f, "cannot open %s", path);
    int64_t cap = 1 << 20, got = 0;
    uint8_t *buf = malloc((size_t)cap);
    for (int r; (r = gzread(f, buf + got, (unsigned)(cap - got - 1))) > 0;) {
        got += r;
        if (got == cap - 1) buf = realloc(buf, (size_t)(cap *= 2));
    }
    gzclose(f);
    buf[got] = 0;
    *n = got;
    return buf;
}

static int *read_ids(const char *name, int64_t *n) {
    int64_t len;
    char *text = (char *)read_fixture(name, &len), *p = text, *end;
    int *ids = malloc((size_t)(len / 2 + 1) * sizeof *ids);
    *n = 0;
    for (long v; (v = strtol(p, &end, 10)), end != p; p = end) ids[(*n)++] = (int)v;
    free(text);
    return ids;
}

static Bpe *load_named(const char *name) {
    Status st;
    Bpe *b = bpe_from_name(name, &st);
    cr_assert_not_null(b, "%s", st.msg);
    return b;
}

// ids of text (flags) equal the fixture's, and decode back to the text.
static void check_fixture(const Bpe *b, const char *text_name, const char *ids_name, int flags) {
    int64_t n, m_want;
    uint8_t *text = read_fixture(text_name, &n);
    int *want = read_ids(ids_name, &m_want);
    int *got = malloc((size_t)(n + 1) * sizeof *got);
    int64_t m = bpe_encode(b, text, n, got, flags);
    int64_t first = 0;
    while (first < m && first < m_want && got[first] == want[first]) first++;
    if (first < m || m != m_want) {
        int64_t len;
        Status st;
        int64_t from = first > 5 ? first - 5 : 0, to = first + 5 < m ? first + 5 : m;
        uint8_t *ctx = bpe_decode(b, got + from, to - from, &len, &st);
        cr_assert_fail("%s: %lld ids, tiktoken %lld; first difference at id %lld: %d, tiktoken %d (text around: '%s')",
                ids_name, (long long)m, (long long)m_want, (long long)first, first < m ? got[first] : -1,
                first < m_want ? want[first] : -1, ctx ? (char *)ctx : "?");
    }
    int64_t len;
    Status st;
    uint8_t *back = bpe_decode(b, got, m, &len, &st);
    cr_assert_not_null(back, "%s", st.msg);
    cr_assert(len == n && memcmp(back, text, (size_t)n) == 0, "%s: decode(encode(text)) != text", text_name);
    free(back), free(got), free(want), free(text);
}

static void check_encoding(const char *name) {
    Bpe *b = load_named(name);
    char ids[128];
    snprintf(ids, sizeof ids, "ids_%s.txt.gz", name);
    check_fixture(b, "text.txt.gz", ids, 0);
    snprintf(ids, sizeof ids, "ids_special_%s.txt.gz", name);
    check_fixture(b, "specials.txt", ids, BPE_ALLOW_SPECIAL);
    snprintf(ids, sizeof ids, "ids_invalid_%s.txt.gz", name);
    check_fixture(b, "invalid.bin", ids, 0);
    snprintf(ids, sizeof ids, "ids_unicode_new_%s.txt.gz", name);
    check_fixture(b, "unicode_new.txt.gz", ids, 0);
    bpe_free(b);
}

Test(bpe, tiktoken_ids_gpt2) { check_encoding("gpt2"); }
Test(bpe, tiktoken_ids_cl100k_base) { check_encoding("cl100k_base"); }
Test(bpe, tiktoken_ids_o200k_base) { check_encoding("o200k_base"); }

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static void check_round_trip(const Bpe *b, const uint8_t *x, int64_t n, const char *what) {
    int *ids = malloc((size_t)(n + 1) * sizeof *ids);
    int64_t m = bpe_encode(b, x, n, ids, BPE_ALLOW_SPECIAL), len;
    cr_assert(m >= (n > 0) && m <= n, "%s: %lld ids for %lld bytes", what, (long long)m, (long long)n);
    Status st;
    uint8_t *back = bpe_decode(b, ids, m, &len, &st);
    cr_assert_not_null(back, "%s: %s", what, st.msg);
    cr_assert(len == n && memcmp(back, x, (size_t)n) == 0, "%s: decode(encode(x)) != x (%lld bytes back of %lld)",
              what, (long long)len, (long long)n);
    free(back), free(ids);
}

// decode(encode(x)) == x for random and adversarial bytes.
Test(bpe, round_trip_arbitrary_bytes) {
    Bpe *b = load_named("cl100k_base");
    uint64_t s = 0x9E3779B97F4A7C15ull;
    uint8_t buf[4096];
    for (int trial = 0; trial < 200; trial++) {
        int n = (int)(rng_next(&s) % sizeof buf);
        int mode = trial % 4;
        for (int i = 0; i < n; i++) {
            uint64_t r = rng_next(&s);
            buf[i] = mode == 0 ? (uint8_t)r                                   // any byte
                   : mode == 1 ? (uint8_t)(0x80 | (r & 0x7F))                 // continuation and lead bytes only
                   : mode == 2 ? "a \n\0'\xc0\xe0\x80\xbf\xff\xed\xa0\xf4\x90 1"[r % 16]   // a mix of the tricky ones
                               : (uint8_t)(r % 3 == 0 ? 0 : ' ' + r % 4);     // NULs, spaces, punctuation
        }
        check_round_trip(b, buf, n, "random bytes");
    }
    static const char *adversarial[] = {
        "\x80", "\xbf\xbf\xbf", "\xc0\xaf", "\xc1\xbf", "\xe0\x80\xaf", "\xe0\x9f\xbf", "\xf0\x80\x80\xaf",
        "\xf0\x8f\xbf\xbf", "\xed\xa0\x80\xed\xb0\x80", "\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80", "\xfe\xff",
        "abc\xe2\x82", "\xf0\x9f\x98", "  \xff  ", "I'\xffLL", "1\x80" "2", "\xc3\x28", "\xe2\x28\xa1",
        "<|endoftext|>\xff<|endoftext|", "\r\n\xc0\r\n",
    };
    for (size_t i = 0; i < sizeof adversarial / sizeof *adversarial; i++)
        check_round_trip(b, (const uint8_t *)adversarial[i], (int64_t)strlen(adversarial[i]), adversarial[i]);
    uint8_t nuls[64] = {0};
    check_round_trip(b, nuls, 64, "NULs");
    bpe_free(b);
}

// Long pieces: a run of 200k spaces before a letter (\s+(?!\S) backtracks
// once), 100k letters (one piece, merged by the heap), 50k digits.
Test(bpe, round_trip_long_pieces) {
    Bpe *b = load_named("cl100k_base");
    int64_t n = 200001;
    uint8_t *x = malloc((size_t)n);
    memset(x, ' ', (size_t)n - 1);
    x[n - 1] = 'x';
    check_round_trip(b, x, n, "spaces then a letter");
    for (int64_t i = 0; i < 100000; i++) x[i] = "abcab"[i % 5];
    check_round_trip(b, x, 100000, "one long word");
    for (int64_t i = 0; i < 50000; i++) x[i] = (uint8_t)('0' + i % 7);
    check_round_trip(b, x, 50000, "digits");
    free(x);
    bpe_free(b);
}

// The heap merge (long pieces) gives what tiktoken's scan gives, on pieces
// from a small alphabet (many merges, many ties between equal pairs).
Test(bpe, merge_heap_equals_scan) {
    Bpe *b = load_named("cl100k_base");
    uint64_t s = 12345;
    uint8_t p[300];
    int a[300], c[300];
    for (int trial = 0; trial < 3000; trial++) {
        int len = 1 + (int)(rng_next(&s) % (trial < 2000 ? 40 : 300));
        const char *alpha = trial % 3 == 0 ? "ab" : trial % 3 == 1 ? "the quick" : "aa \xe4\xb8\x80\xf0\x9f";
        for (int i = 0; i < len; i++) p[i] = (uint8_t)alpha[rng_next(&s) % strlen(alpha)];
        int na = bpe_merge_scan(b, p, len, a), nc = bpe_merge_heap(b, p, len, c);
        cr_assert_eq(na, nc, "trial %d: scan gives %d ids, heap %d", trial, na, nc);
        cr_assert_eq(memcmp(a, c, (size_t)na * sizeof *a), 0, "trial %d: scan and heap differ", trial);
    }
    bpe_free(b);
}

static bool utf8_whole(const uint8_t *p, int n) {   // complete, well-formed characters only
    for (int i = 0; i < n;) {
        int k = p[i] < 0x80 ? 1 : p[i] >= 0xC2 && p[i] <= 0xDF ? 2 : p[i] >= 0xE0 && p[i] <= 0xEF ? 3
              : p[i] >= 0xF0 && p[i] <= 0xF4 ? 4 : 0;
        if (k == 0 || i + k > n) return false;
        for (int j = 1; j < k; j++)
            if ((p[i + j] & 0xC0) != 0x80) return false;
        i += k;
    }
    return true;
}

// Tokens that split a character (CJK, emoji in cl100k_base) come out whole.
Test(bpe, stream_decoder_emits_whole_characters) {
    Bpe *b = load_named("cl100k_base");
    const char *text = "Emoji 👩‍👩‍👧 and 𝕏 and 字字字 — ok\xe2\x82";   // ends in an unfinished character
    int n = (int)strlen(text), ids[256];
    int m = (int)bpe_encode(b, (const uint8_t *)text, n, ids, 0);
    BpeStream s = {0};
    uint8_t out[BPE_STREAM_OUT_MAX], all[512];
    int total = 0, split_chars = 0;
    Status st;
    for (int i = 0; i < m; i++) {
        int k = bpe_stream_push(&s, b, ids[i], out, &st);
        cr_assert(k >= 0, "%s", st.msg);
        cr_assert(utf8_whole(out, k), "push %d wrote a partial character", i);
        split_chars += s.n_held > 0;
        memcpy(all + total, out, (size_t)k), total += k;
    }
    cr_assert(split_chars > 0, "the text should have tokens that end inside a character");
    cr_assert_eq(s.n_held, 2, "the unfinished \\xe2\\x82 waits");
    total += bpe_stream_flush(&s, all + total);
    cr_assert(total == n && memcmp(all, text, (size_t)n) == 0);
    cr_assert_eq(bpe_stream_push(&s, b, 100256, out, &st), -1, "a hole in cl100k_base's ids");
    cr_assert(strstr(st.msg, "id 100256 is no token"), "%s", st.msg);
    // A byte that can never complete a character is not held back.
    cr_assert_eq(bpe_stream_push(&s, b, b->byte_rank[0xff], out, &st), 1);
    cr_assert_eq(bpe_stream_push(&s, b, b->byte_rank[0xe0], out, &st), 0, "a lead byte waits");
    cr_assert_eq(bpe_stream_push(&s, b, b->byte_rank[0x80], out, &st), 2, "E0 80 can never complete: out it goes");
    cr_assert_eq(bpe_stream_push(&s, b, b->byte_rank[0xf4], out, &st), 0);
    cr_assert_eq(bpe_stream_push(&s, b, b->byte_rank[0x90], out, &st), 2, "F4 90 would be above U+10FFFF");
    bpe_free(b);
}

// A piece that is a token is that token, even when no merges lead to it
// (tiktoken looks the whole piece up first: npm tiktoken gives 256 32 120 121
// 122 120 for "xyz xyzx" with these ranks).
Test(bpe, whole_piece_before_merging) {
    char *ranks = malloc(4096);
    int o = 0;
    for (int c = 0; c < 256; c++) {
        uint8_t byte = (uint8_t)c;
        char b64[8];
        int l = bpe_base64_encode(&byte, 1, b64);
        o += sprintf(ranks + o, "%.*s %d\n", l, b64, c);
    }
    o += sprintf(ranks + o, "eHl6 256\n");   // "xyz", and neither "xy" nor "yz"
    Status st;
    Bpe *b = bpe_from_tiktoken((const uint8_t *)ranks, (size_t)o, "xyz", "\\S+|\\s+", NULL, 0, &st);
    cr_assert_not_null(b, "%s", st.msg);
    int ids[8], want[6] = {256, 32, 120, 121, 122, 120};
    cr_assert_eq(bpe_encode(b, (const uint8_t *)"xyz xyzx", 8, ids, 0), 6);
    cr_assert_eq(memcmp(ids, want, sizeof want), 0);
    bpe_free(b);
    free(ranks);
}

Test(bpe, vocabulary_specials_and_bad_ids) {
    Bpe *b = load_named("o200k_base");
    cr_assert_eq(bpe_vocab_size(b), 200019);
    cr_assert_eq(bpe_n_ranks(b), 199998);
    cr_assert_eq(bpe_n_specials(b), 2);
    cr_assert_eq(bpe_special_id(b, "<|endofprompt|>"), 200018);
    cr_assert_eq(bpe_special(b, 0).id, 199999);
    cr_assert_str_eq(bpe_special(b, 0).text, "<|endoftext|>");
    int len, ids[32];
    cr_assert_null(bpe_token_bytes(b, 200000, &len), "a hole");
    cr_assert_null(bpe_token_bytes(b, -1, &len));
    const uint8_t *t = bpe_token_bytes(b, 200018, &len);
    cr_assert(t && len == 15 && memcmp(t, "<|endofprompt|>", 15) == 0);
    const char *x = "a<|endoftext|>b";
    cr_assert_eq(bpe_encode(b, (const uint8_t *)x, 15, ids, BPE_ALLOW_SPECIAL), 3);
    cr_assert_eq(ids[1], 199999);
    int64_t m = bpe_encode(b, (const uint8_t *)x, 15, ids, 0);
    for (int64_t i = 0; i < m; i++) cr_assert_neq(ids[i], 199999, "ordinary encoding reads specials as text");
    Status st;
    int64_t n;
    int wrong[3] = {1, 200019, 2};
    cr_assert_null(bpe_decode(b, wrong, 3, &n, &st));
    cr_assert_str_eq(st.msg, "token 1: id 200019 is no token of this tokenizer (vocabulary 200019)");
    bpe_free(b);
    Bpe *g = load_named("gpt2");
    cr_assert_eq(bpe_vocab_size(g), 50257);
    bpe_free(g);
    cr_assert_null(bpe_from_name("p50k", &st));
    cr_assert(strstr(st.msg, "not a tiktoken encoding name"), "%s", st.msg);
}

// Serialising is canonical: buffer -> load -> buffer gives the same bytes,
// through gzip too; the hash follows the content.
Test(bpe, serialise_reload_identical) {
    Bpe *b = load_named("r50k_base");
    size_t n1, n2;
    uint8_t *buf1 = bpe_to_buffer(b, &n1);
    Status st;
    Bpe *c = bpe_from_buffer(buf1, n1, "buffer", &st);
    cr_assert_not_null(c, "%s", st.msg);
    uint8_t *buf2 = bpe_to_buffer(c, &n2);
    cr_assert(n1 == n2 && memcmp(buf1, buf2, n1) == 0);
    cr_assert_eq(bpe_hash(b), bpe_hash(c));
    cr_assert_str_eq(bpe_pattern(c), bpe_pattern_named("gpt2"));
    char path[700];
    snprintf(path, sizeof path, "%s/saved.tiktoken.gz", test_tmpdir("bpe"));
    cr_assert(bpe_save(c, path).ok);
    Bpe *d = bpe_load(path, &st);
    cr_assert_not_null(d, "%s", st.msg);
    cr_assert_eq(bpe_hash(d), bpe_hash(b));
    remove(path);
    Bpe *e = bpe_from_name("cl100k_base", &st);
    cr_assert_neq(bpe_hash(e), bpe_hash(b));
    free(buf1), free(buf2);
    bpe_free(b), bpe_free(c), bpe_free(d), bpe_free(e);
}
