// bpe_split.c: tiktoken's split patterns, their translation to PCRE2, and
// the iteration over pieces (matches and invalid-UTF-8 gaps).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "bpe_split.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

// The patterns as tiktoken writes them (tiktoken_ext/openai_public.py, and
// encoders/*.json of the npm package `tiktoken`).
static const struct {
    const char *name, *pattern;
} NAMED[] = {
    {"gpt2", "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
    {"r50k_base", "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
    {"cl100k_base", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {"o200k_base", "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
                   "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
                   "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
                   "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
                   "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
};

// Rust's \s: the Unicode White_Space property (PropList.txt), as the body of
// a PCRE2 character class.
static const char WHITE_SPACE[] = "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"
                                  "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// Measured (docs/tokenizer.md, "Bounded splitting"): the known patterns,
// over the KJV and over runs built to make them backtrack most, need at most
// 2^21 matches (cl100k_base and o200k_base on a 1 MiB window of spaces or
// newlines, linear in the window), a depth of 2^3 and no heap beyond
// PCRE2's first frames. The limits leave 16x, 2048x and 16 MiB; a pattern
// that backtracks catastrophically reaches 2^25 at its first piece.
BpeSplitLimits bpe_split_limits = {.match = 1u << 25, .depth = 1u << 14, .heap_kib = 1u << 14, .window_min = 256};

struct BpeSplit {
    char *pattern;          // tiktoken syntax, as given
    pcre2_code *code;       // compiled from the translation, JIT'd where PCRE2 has a JIT
    pcre2_code *code_u14;   // the same without the Unicode 15-16 additions, or NULL if it is the same
};

const char *bpe_pattern_named(const char *name) {
    for (size_t i = 0; i < sizeof NAMED / sizeof NAMED[0]; i++)
        if (strcmp(NAMED[i].name, name) == 0) return NAMED[i].pattern;
    return NULL;
}

// Rewrite \s and \S (outside and inside character classes) as explicit
// White_Space classes, and add to \p{L}, \p{N}, ... the characters of
// Unicode 15 and 16 (bpe_unicode.c); everything else is copied.
static Status translate(const char *p, char *out, size_t cap, bool add_new) {
    size_t o = 0;
    bool in_class = false;
#define PUT(str)                                                       \
    do {                                                               \
        size_t l_ = strlen(str);                                       \
        if (o + l_ + 1 > cap) return status_err("pattern too long");  \
        memcpy(out + o, str, l_), o += l_;                             \
    } while (0)
    for (size_t i = 0; p[i]; i++) {
        char c = p[i], one[3] = {c, 0, 0};
        if (c == '\\' && p[i + 1]) {
            char e = p[++i];
            if (e == 's') {
                if (!in_class) PUT("[");
                PUT(WHITE_SPACE);
                if (!in_class) PUT("]");
            } else if (e == 'S') {
                if (in_class) return status_err("\\S inside a character class is not supported (at offset %zu)", i - 1);
                PUT("[^");
                PUT(WHITE_SPACE);
                PUT("]");
            } else if ((e == 'p' || e == 'P') && p[i + 1] == '{' && strchr(p + i, '}') &&
                       strchr(p + i, '}') - (p + i + 2) < 16) {
                // \p{X}: add the characters tiktoken's Unicode has in X and PCRE2's lacks (bpe_unicode.c)
                const char *name = p + i + 2, *close = strchr(name, '}');
                char cls[16], prop[32];
                snprintf(cls, sizeof cls, "%.*s", (int)(close - name), name);
                snprintf(prop, sizeof prop, "\\p{%s}", cls);
                const char *extra = add_new ? bpe_unicode_extra(cls) : NULL;
                if (!extra || !*extra) {
                    prop[1] = e;
                    PUT(prop);
                } else if (e == 'P' && in_class) {
                    return status_err("\\P{%s} inside a character class is not supported (at offset %zu)", cls, i - 1);
                } else {
                    if (!in_class) PUT(e == 'P' ? "[^" : "[");
                    PUT(prop);
                    PUT(extra);
                    if (!in_class) PUT("]");
                }
                i = (size_t)(close - p);
            } else {
                one[1] = e;
                PUT(one);
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            PUT("[");
            if (p[i + 1] == '^') {
                PUT("^");
                i++;
            }
            if (p[i + 1] == ']') {   // a leading ']' is literal
                PUT("]");
                i++;
            }
            continue;
        }
        if (in_class && c == '[' && p[i + 1] == ':') {   // [:alpha:] inside a class: copy it whole
            const char *end = strstr(p + i + 2, ":]");
            size_t len = end ? (size_t)(end - (p + i)) + 2 : 1;
            if (o + len + 1 > cap) return status_err("pattern too long");
            memcpy(out + o, p + i, len), o += len, i += len - 1;
            continue;
        }
        if (in_class && c == ']') in_class = false;
        PUT(one);
    }
#undef PUT
    out[o] = 0;
    return status_ok();
}

// Compile the translation of pattern; NULL and *st set on error.
static pcre2_code *compile(const char *pattern, bool add_new, Status *st) {
    size_t cap = (size_t)BPE_PATTERN_MAX * 16;   // \s grows to ~90 bytes, \p{L} to ~700
    char *tr = xmalloc(cap);
    *st = translate(pattern, tr, cap, add_new);
    if (!st->ok) {
        Status e = *st;
        *st = status_err("split pattern: %s", e.msg);
        free(tr);
        return NULL;
    }
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)tr, PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
    free(tr);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        *st = status_err("split pattern: does not compile: %s (offset %zu of the PCRE2 form)", (char *)msg, (size_t)off);
        return NULL;
    }
    uint32_t minlen = 0;
    pcre2_pattern_info(code, PCRE2_INFO_MINLENGTH, &minlen);
    if (minlen == 0) {
        pcre2_code_free(code);
        *st = status_err("split pattern: can match the empty string (every piece must hold at least one character)");
        return NULL;
    }
    // (without a JIT, on an unsupported CPU, the interpreter runs)
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD);
    *st = status_ok();
    return code;
}

// The classic split at white space, linear like tiktoken's (the tests' small
// tokenizers use it). Known, but not a name --pattern takes.
static const char WHITESPACE_SPLIT[] = "\\S+|\\s+";

bool bpe_pattern_known(const char *pattern) {
    for (size_t i = 0; i < sizeof NAMED / sizeof NAMED[0]; i++)
        if (strcmp(NAMED[i].pattern, pattern) == 0) return true;
    return strcmp(pattern, WHITESPACE_SPLIT) == 0;
}

BpeSplit *bpe_split_new(const char *pattern, Status *st) {
    if (!bpe_pattern_known(pattern)) {
        *st = status_err("split pattern: not one of the known patterns (gpt2 = r50k_base, cl100k_base, o200k_base, "
                         "\\S+|\\s+; byte for byte): a pattern from a file could take time exponential in the text "
                         "(ReDoS), so no other is accepted");
        return NULL;
    }
    return bpe_split_new_any(pattern, st);
}

BpeSplit *bpe_split_new_any(const char *pattern, Status *st) {
    size_t len = strnlen(pattern, BPE_PATTERN_MAX + 1);
    if (len == 0 || len > BPE_PATTERN_MAX) {
        *st = status_err("split pattern: %zu bytes, must be 1 to %d", len, BPE_PATTERN_MAX);
        return NULL;
    }
    if (strchr(pattern, '\n') || strchr(pattern, '\r')) {
        *st = status_err("split pattern: contains a line break (write \\n and \\r as escapes)");
        return NULL;
    }
    pcre2_code *code = compile(pattern, true, st);
    if (!code) return NULL;
    // The classes with the Unicode 15-16 additions are ~1.5x slower to match;
    // a text holding none of those characters gets the same split from the
    // pattern without them (every class answers alike for every character of
    // the text), so bpe_split_begin picks that one when it can.
    char *a = xmalloc((size_t)BPE_PATTERN_MAX * 16), *b = xmalloc((size_t)BPE_PATTERN_MAX * 16);
    bool differ = translate(pattern, a, (size_t)BPE_PATTERN_MAX * 16, true).ok &&
                  translate(pattern, b, (size_t)BPE_PATTERN_MAX * 16, false).ok && strcmp(a, b) != 0;
    free(a), free(b);
    pcre2_code *code_u14 = differ ? compile(pattern, false, st) : NULL;
    if (differ && !code_u14) {
        pcre2_code_free(code);
        return NULL;
    }
    BpeSplit *s = xcalloc(1, sizeof *s);
    s->pattern = strdup(pattern);
    s->code = code;
    s->code_u14 = code_u14;
    *st = status_ok();
    return s;
}

void bpe_split_free(BpeSplit *s) {
    if (!s) return;
    pcre2_code_free(s->code);
    pcre2_code_free(s->code_u14);
    free(s->pattern);
    free(s);
}

const char *bpe_split_pattern(const BpeSplit *s) { return s->pattern; }

// Whether text holds a character of Unicode 15-16 (bpe_unicode.c); all of
// them are above U+0800, so only 3- and 4-byte sequences are decoded.
static bool has_new_chars(const uint8_t *t, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (t[i] < 0xE0) continue;
        uint32_t c;
        if (t[i] < 0xF0 && i + 2 < n) c = (uint32_t)(t[i] & 0x0F) << 12 | (uint32_t)(t[i + 1] & 0x3F) << 6 | (t[i + 2] & 0x3F);
        else if (i + 3 < n) c = (uint32_t)(t[i] & 0x07) << 18 | (uint32_t)(t[i + 1] & 0x3F) << 12 |
                                (uint32_t)(t[i + 2] & 0x3F) << 6 | (t[i + 3] & 0x3F);
        else continue;
        if (bpe_unicode_is_new(c)) return true;   // (a malformed sequence may say yes: then the exact pattern runs)
    }
    return false;
}

void bpe_split_begin(BpeSplitIter *it, const BpeSplit *s, const uint8_t *text, int64_t n) {
    memset(it, 0, sizeof *it);
    it->split = s;
    it->code = s->code_u14 && !has_new_chars(text, n) ? s->code_u14 : s->code;
    it->text = text;
    it->n = n;
    it->match_start = it->match_end = -1;
    it->match_data = pcre2_match_data_create_from_pattern(it->code, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    ASSERT(it->match_data && mc, "bpe_split_begin: out of memory");
    // Every search looks at most BPE_PIECE_MAX bytes ahead, so the work of one
    // is bounded for every pattern; these limits bound it (bpe_split.h).
    pcre2_set_match_limit(mc, bpe_split_limits.match);
    pcre2_set_depth_limit(mc, bpe_split_limits.depth);
    pcre2_set_heap_limit(mc, bpe_split_limits.heap_kib);
    it->match_ctx = mc;   // the JIT's own 32 KB stack first; a larger one only if a match needs it
}

// Where a search from pos with a window of w bytes stops: w bytes on (or the
// end of the text), moved back to the start of a UTF-8 character so that none
// is cut in two.
static int64_t window_end(const BpeSplitIter *it, int64_t w) {
    if (it->n - it->pos <= w) return it->n;
    int64_t we = it->pos + w;
    for (int k = 0; k < 3 && (it->text[we] & 0xC0) == 0x80; k++) we--;
    return we;
}

static int match(BpeSplitIter *it, int64_t we, uint32_t opt) {
    if (bpe_split_limits.interpreter) opt |= PCRE2_NO_JIT;
    return pcre2_match(it->code, it->text, (PCRE2_SIZE)we, (PCRE2_SIZE)it->pos, opt, it->match_data, it->match_ctx);
}

// The next match from pos, in a window that grows until what it found does
// not depend on where the window ends: PCRE2_PARTIAL_HARD reports any path
// of the search that reached the window's end (a repeat or a lookahead that
// wanted more, or no match at all), and then the window grows 16-fold. So a
// text whose pieces are shorter than BPE_PIECE_MAX splits as if searched
// whole, and a search costs what its piece does (PCRE2's interpreter checks
// the UTF-8 of the subject to its end on every call). At BPE_PIECE_MAX the
// window's end is taken as the end of the text. *we receives the window's end.
static int search(BpeSplitIter *it, int64_t *we) {
    int rc = 0;
    for (int64_t w = bpe_split_limits.window_min;; w *= 16) {
        if (w > BPE_PIECE_MAX) w = BPE_PIECE_MAX;
        *we = window_end(it, w);
        bool last = *we == it->n || w >= BPE_PIECE_MAX;
        rc = match(it, *we, last ? 0 : PCRE2_PARTIAL_HARD);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !it->jit_stack) {
            it->jit_stack = pcre2_jit_stack_create(256 * 1024, BPE_SPLIT_JIT_STACK_MAX, NULL);
            ASSERT(it->jit_stack, "bpe_split_next: cannot allocate a JIT stack");
            pcre2_jit_stack_assign(it->match_ctx, NULL, it->jit_stack);
            rc = match(it, *we, last ? 0 : PCRE2_PARTIAL_HARD);
        }
        if (last || (rc != PCRE2_ERROR_PARTIAL && rc != PCRE2_ERROR_NOMATCH)) return rc;
    }
}

bool bpe_split_next(BpeSplitIter *it, int64_t *start, int64_t *end) {
    if (it->pos >= it->n || it->error) return false;
    if (it->match_start < 0) {   // find the next match from pos
        int64_t we;
        int rc = search(it, &we);
        if (rc == PCRE2_ERROR_NOMATCH) {   // the rest of the window is a gap
            *start = it->pos, *end = we;
            it->pos = we;
            return true;
        }
        if (rc < 0) {   // a limit: the caller reports it (bpe_split_status)
            it->error = rc;
            return false;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(it->match_data);
        it->match_start = (int64_t)ov[0];
        it->match_end = (int64_t)ov[1];
        // A lookbehind or \K could end a match before pos or leave it empty:
        // never let the pieces go backwards or stall.
        if (it->match_start < it->pos) it->match_start = it->pos;
        if (it->match_end <= it->match_start) it->match_start = it->match_end = -1, it->match_end = -2;
    }
    if (it->match_end == -2) {   // an empty match: one byte becomes a piece of its own
        *start = it->pos, *end = it->pos + 1;
        it->match_start = it->match_end = -1;
    } else if (it->match_start > it->pos) {   // the gap before the match
        *start = it->pos, *end = it->match_start;
    } else {
        *start = it->match_start, *end = it->match_end;
        it->match_start = it->match_end = -1;
    }
    it->pos = *end;
    return true;
}

Status bpe_split_status(const BpeSplitIter *it, int64_t base) {
    if (!it->error) return status_ok();
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(it->error, msg, sizeof msg);
    return status_err("the split pattern gave up on the piece at byte %lld of the text: %s (the work one piece may "
                      "take is bounded)", (long long)(base + it->pos), (char *)msg);
}

void bpe_split_end(BpeSplitIter *it) {
    pcre2_match_data_free(it->match_data);
    pcre2_match_context_free(it->match_ctx);
    pcre2_jit_stack_free(it->jit_stack);
    memset(it, 0, sizeof *it);
}
