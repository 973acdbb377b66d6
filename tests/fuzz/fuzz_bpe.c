// fuzz_bpe.c: libFuzzer target for the BPE tokenizer-file loader and the
// encoder/decoder (data/bpe*.c). Build and run: tests/fuzz/run.sh 60 bpe.
//
// The first byte picks what the rest is:
//   0: a tokenizer file in our format (bpe_from_buffer; gzip'd or not)
//   1: a plain .tiktoken file, with the gpt2 pattern and one special token
//   3: a split pattern (to the first newline) and a text: any pattern that
//      compiles (bpe_split_new_any) splits the text under the work limits;
//      the pieces must tile the text, or the split must stop with a limit's
//      error (a catastrophic pattern), never hang or crash
//   2, 4+: text, encoded with r50k_base (loaded once) with and without specials
// Whatever loads must encode any text so that decoding gives it back, and the
// streaming decoder must give the same bytes; a violation aborts. Files with
// #pattern lines (the known patterns, and the attacks' catastrophic ones,
// which must be refused) are among the seeds.
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "bpe_split.h"

static void check_round_trip(const Bpe *b, const uint8_t *x, size_t n, int flags) {
    int *ids = malloc((n + 1) * sizeof *ids);
    int64_t m = bpe_encode(b, x, (int64_t)n, ids, flags), len;
    if (m < 0 || m > (int64_t)n) abort();
    Status st;
    uint8_t *back = bpe_decode(b, ids, m, &len, &st);
    if (!back || len != (int64_t)n || memcmp(back, x, n) != 0) abort();
    BpeStream s = {0};
    uint8_t out[BPE_STREAM_OUT_MAX];
    int64_t o = 0;
    for (int64_t i = 0; i < m; i++) {
        int k = bpe_stream_push(&s, b, ids[i], out, &st);
        if (k < 0 || o + k > (int64_t)n || memcmp(back + o, out, (size_t)k) != 0) abort();
        o += k;
    }
    o += bpe_stream_flush(&s, out);
    if (o != (int64_t)n) abort();
    free(back);
    free(ids);
}

static void split_any(const uint8_t *x, size_t n) {
    const uint8_t *nl = memchr(x, '\n', n);
    if (!nl || nl == x || nl - x > BPE_PATTERN_MAX) return;
    char *pattern = strndup((const char *)x, (size_t)(nl - x));
    Status st;
    BpeSplit *s = strlen(pattern) == (size_t)(nl - x) ? bpe_split_new_any(pattern, &st) : NULL;
    free(pattern);
    if (!s) return;
    // A lower match limit than the library's: every input stays fast, and the
    // limit is what stops a catastrophic pattern, as it would the library's.
    bpe_split_limits.match = 100000;
    const uint8_t *t = nl + 1;
    int64_t len = (int64_t)(n - (size_t)(nl + 1 - x)), a, b, pos = 0;
    BpeSplitIter it;
    bpe_split_begin(&it, s, t, len);
    while (bpe_split_next(&it, &a, &b)) {
        if (a != pos || b <= a) abort();
        pos = b;
    }
    if (it.error ? bpe_split_status(&it, 0).ok : pos != len) abort();
    bpe_split_end(&it);
    bpe_split_free(s);
}

static const uint8_t SAMPLE[] = "Hello, world! I'LL we'Re 123456 \xe5\xad\x97\xf0\x9f\x98\x80 \xff\xc0\x80  \n\n<|endoftext|>x";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *rest = data + 1;
    size_t n = size - 1;
    Status st;
    if (data[0] == 0 || data[0] == 1) {
        BpeSpecial sp[1] = {{"<|endoftext|>", 300}};
        Bpe *b = data[0] == 0 ? bpe_from_buffer(rest, n, "fuzz", &st)
                              : bpe_from_tiktoken(rest, n, "fuzz", bpe_pattern_named("gpt2"), sp, 1, &st);
        if (!b) return 0;
        check_round_trip(b, SAMPLE, sizeof SAMPLE - 1, 0);
        check_round_trip(b, SAMPLE, sizeof SAMPLE - 1, BPE_ALLOW_SPECIAL);
        size_t len;
        uint8_t *buf = bpe_to_buffer(b, &len);
        Bpe *c = bpe_from_buffer(buf, len, "fuzz canonical", &st);
        if (!c || bpe_hash(c) != bpe_hash(b)) abort();   // the canonical form reloads to the same tokenizer
        bpe_free(c);
        free(buf);
        bpe_free(b);
        return 0;
    }
    if (data[0] == 3) {
        split_any(rest, n);
        return 0;
    }
    static Bpe *r50k;
    if (!r50k && !(r50k = bpe_from_name("r50k_base", &st))) abort();
    check_round_trip(r50k, rest, n, 0);
    check_round_trip(r50k, rest, n, BPE_ALLOW_SPECIAL);
    return 0;
}
