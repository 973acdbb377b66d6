// bpe_split.h: the pre-tokenization split of byte-level BPE (tiktoken's
// "pat_str"), run by PCRE2 (8-bit, UTF, JIT).
//
// A pattern is written in tiktoken's syntax (Rust's fancy_regex). PCRE2 reads
// the same syntax with one difference that matters here: its \s (with UCP)
// also matches U+180E MONGOLIAN VOWEL SEPARATOR, which Rust's \s (Unicode
// White_Space) does not. bpe_split_new therefore rewrites \s and \S into
// explicit classes of the White_Space characters before compiling. And
// Debian 12's PCRE2 (10.42) has Unicode 14 tables where tiktoken has Unicode
// 16: \p{L}, \p{N}, \p{M} and the letter subclasses get the characters
// assigned since (bpe_unicode.c).
//
// The text is split into pieces that tile it, in order:
//   - each match of the pattern, searched from the end of the previous piece;
//   - each stretch the pattern does not match (a "gap"). With the bundled
//     patterns, which match every character, gaps are exactly the maximal runs
//     of bytes that are not part of a well-formed UTF-8 character: PCRE2's
//     PCRE2_MATCH_INVALID_UTF makes such bytes match nothing and act, for the
//     text on either side, like the end and the start of the subject.
// So a valid UTF-8 text splits exactly as tiktoken splits it, and every byte
// of any input lands in exactly one piece (nothing is dropped, unlike
// tiktoken, which skips what its pattern does not match).
//
// Bounded work. A regex from a file could backtrack for a time exponential
// in the text ("(a|a)*c" on a run of a's), so only the known patterns below
// are accepted, byte for byte; and for them too each search looks at no more
// than BPE_PIECE_MAX bytes from where it starts, under PCRE2 match, depth and
// heap limits far above what they need there (measured: docs/tokenizer.md).
// The one difference from tiktoken this makes: a piece longer than
// BPE_PIECE_MAX bytes (a run of one character class that long, which no
// natural text holds) is cut into pieces of at most that many bytes, at
// character boundaries; it also bounds the memory the merging of one piece
// takes. A limit hit ends the split with an error (bpe_split_status), never
// an abort.
#ifndef DATA_BPE_SPLIT_H
#define DATA_BPE_SPLIT_H

#include "common.h"

#define BPE_PATTERN_MAX 4096         // bytes of a pattern, tiktoken syntax
#define BPE_PIECE_MAX (1 << 20)      // bytes one search looks at, so the most a piece holds
#define BPE_SPLIT_JIT_STACK_MAX (64 << 20)   // bytes of the JIT's stack, for a match that needs more than 32 KB

// PCRE2's limits on one search (pcre2_set_match_limit, _depth_limit,
// _heap_limit; the JIT heeds the first only). Tests of the limits and the
// measurement may change them before splitting; nothing else does.
typedef struct BpeSplitLimits {
    uint32_t match, depth, heap_kib;
    bool interpreter;     // PCRE2's interpreter even where the JIT compiled (what a CPU without a JIT runs)
    int64_t window_min;   // bytes a search looks at first (it grows 16-fold to BPE_PIECE_MAX)
} BpeSplitLimits;
extern BpeSplitLimits bpe_split_limits;

// The characters of Unicode 15 and 16 in general category class `cls` (L,
// Lu, Ll, Lt, Lm, Lo, M, N) as the body of a PCRE2 class, or NULL for other
// classes. PCRE2 10.42 has Unicode 14 tables, tiktoken's Rust regex Unicode
// 16: bpe_split_new adds these to \p{cls} (bpe_unicode.c, generated).
const char *bpe_unicode_extra(const char *cls);
bool bpe_unicode_is_new(uint32_t c);   // one of those characters (any class)

// tiktoken's split patterns by encoding name: "gpt2" and "r50k_base" (one
// pattern), "cl100k_base", "o200k_base". NULL for any other name.
const char *bpe_pattern_named(const char *name);

// Whether pattern is one of those, or \S+|\s+ (the classic split at white
// space), byte for byte.
bool bpe_pattern_known(const char *pattern);

typedef struct BpeSplit BpeSplit;   // a compiled pattern; read-only once built

// Compile `pattern`, which must be a known one (bpe_pattern_known). NULL and
// *st set on error.
BpeSplit *bpe_split_new(const char *pattern, Status *st);
// Any pattern (tiktoken syntax), for the tests of the translation and of the
// limits only: never one from a file. Errors: too long, contains a newline,
// \S inside a character class, can match the empty string, or does not
// compile (PCRE2's message and offset).
BpeSplit *bpe_split_new_any(const char *pattern, Status *st);
void bpe_split_free(BpeSplit *s);
const char *bpe_split_pattern(const BpeSplit *s);   // as given (tiktoken syntax)

// One pass over a text. Not shared between threads (it owns PCRE2's match
// data); several iterators may run over one BpeSplit at once.
typedef struct BpeSplitIter {
    const BpeSplit *split;
    const void *code;                            // the pcre2_code used for this text
    void *match_data, *match_ctx, *jit_stack;   // PCRE2 objects
    const uint8_t *text;
    int64_t n, pos;
    int64_t match_start, match_end;   // the next match found but not yet returned
    int error;                        // PCRE2's error code once a search failed (a limit), else 0
} BpeSplitIter;

void bpe_split_begin(BpeSplitIter *it, const BpeSplit *s, const uint8_t *text, int64_t n);
// The next piece [*start, *end), non-empty, at most BPE_PIECE_MAX bytes;
// false at the end of the text, or when a search hit a limit: then
// bpe_split_status says so, and the text is not split.
bool bpe_split_next(BpeSplitIter *it, int64_t *start, int64_t *end);
// The error, naming the piece's byte offset (base + its offset in this text).
Status bpe_split_status(const BpeSplitIter *it, int64_t base);
void bpe_split_end(BpeSplitIter *it);

#endif
