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
#ifndef DATA_BPE_SPLIT_H
#define DATA_BPE_SPLIT_H

#include "common.h"

#define BPE_PATTERN_MAX 4096   // bytes of a pattern, tiktoken syntax

// The characters of Unicode 15 and 16 in general category class `cls` (L,
// Lu, Ll, Lt, Lm, Lo, M, N) as the body of a PCRE2 class, or NULL for other
// classes. PCRE2 10.42 has Unicode 14 tables, tiktoken's Rust regex Unicode
// 16: bpe_split_new adds these to \p{cls} (bpe_unicode.c, generated).
const char *bpe_unicode_extra(const char *cls);
bool bpe_unicode_is_new(uint32_t c);   // one of those characters (any class)

// tiktoken's split patterns by encoding name: "gpt2" and "r50k_base" (one
// pattern), "cl100k_base", "o200k_base". NULL for any other name.
const char *bpe_pattern_named(const char *name);

typedef struct BpeSplit BpeSplit;   // a compiled pattern; read-only once built

// Compile `pattern` (tiktoken syntax). Errors: too long, contains a NUL or a
// newline, \S inside a character class, can match the empty string, or does
// not compile (PCRE2's message and offset). NULL and *st set on error.
BpeSplit *bpe_split_new(const char *pattern, Status *st);
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
} BpeSplitIter;

void bpe_split_begin(BpeSplitIter *it, const BpeSplit *s, const uint8_t *text, int64_t n);
// The next piece [*start, *end), non-empty; false at the end of the text.
bool bpe_split_next(BpeSplitIter *it, int64_t *start, int64_t *end);
void bpe_split_end(BpeSplitIter *it);

#endif
