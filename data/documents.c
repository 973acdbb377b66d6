#define _GNU_SOURCE   // memmem
#include "documents.h"

#include <stdlib.h>
#include <string.h>

Status doc_spec_parse(const char *text, DocSpec *out) {
    memset(out, 0, sizeof *out);
    if (!strcmp(text, "none")) out->mode = DOCS_NONE;
    else if (!strcmp(text, "files")) out->mode = DOCS_FILES;
    else if (!strcmp(text, "blank_line")) out->mode = DOCS_BLANK_LINE;
    else if (!strcmp(text, "eot")) {
        out->mode = DOCS_TEXT;
        out->sep_len = (int)strlen(TOKENIZER_EOT);
        memcpy(out->sep, TOKENIZER_EOT, (size_t)out->sep_len + 1);
    } else if (!strncmp(text, "text:", 5)) {
        out->mode = DOCS_TEXT;
        for (const char *p = text + 5; *p; p++) {
            char ch = *p;
            if (ch == '\\') {
                p++;
                switch (*p) {
                case 'n': ch = '\n'; break;
                case 'r': ch = '\r'; break;
                case 't': ch = '\t'; break;
                case '\\': ch = '\\'; break;
                default:
                    return status_err("'%s': in text:SEP, a backslash starts one of \\n \\r \\t \\\\", text);
                }
            }
            if (out->sep_len == DOC_SEP_MAX)
                return status_err("'%s': the separator is longer than %d bytes", text, DOC_SEP_MAX);
            out->sep[out->sep_len++] = ch;
        }
        if (out->sep_len == 0) return status_err("'%s': text:SEP needs a separator after the colon", text);
    } else {
        return status_err("'%s': expected none, files, blank_line, eot or text:SEP", text);
    }
    return status_ok();
}

// A line of only spaces, tabs and \r, from p to its \n (excluded) or end.
static bool blank_line_at(const uint8_t *p, const uint8_t *end) {
    for (; p < end && *p != '\n'; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r') return false;
    return true;
}

typedef struct Out {
    int *tokens;
    int64_t n, cap;
    int64_t *starts;
    int64_t n_docs, cap_docs;
} Out;

static void add_document(Out *o, const Tokenizer *tok, const uint8_t *bytes, int64_t len) {
    if (len <= 0) return;
    if (o->n_docs == o->cap_docs) {
        o->cap_docs = o->cap_docs ? 2 * o->cap_docs : 64;
        o->starts = xrealloc(o->starts, (size_t)o->cap_docs * sizeof *o->starts);
    }
    o->starts[o->n_docs++] = o->n;
    o->n += tokenizer_encode(tok, bytes, len, o->tokens + o->n);   // at most one id per byte
    if (tok->eot >= 0) o->tokens[o->n++] = tok->eot;
}

// Split one file's bytes [p, end) into documents: each one's bytes to fn.
static void split_file(const DocSpec *d, const uint8_t *p, const uint8_t *end, DocRangeFn fn, void *arg) {
    if (d->mode == DOCS_FILES) {
        fn(arg, p, end - p);
    } else if (d->mode == DOCS_BLANK_LINE) {
        const uint8_t *doc = p, *line = p;
        bool seen_text = false, in_blank = false;
        while (line < end) {
            const uint8_t *nl = memchr(line, '\n', (size_t)(end - line));
            const uint8_t *next = nl ? nl + 1 : end;
            bool blank = blank_line_at(line, end);
            if (!blank && in_blank && seen_text) {   // text after blank lines: a new document
                fn(arg, doc, line - doc);
                doc = line;
            }
            if (!blank) seen_text = true;
            in_blank = blank;
            line = next;
        }
        fn(arg, doc, end - doc);
    } else {   // DOCS_TEXT
        const uint8_t *doc = p;
        while (doc < end) {
            const uint8_t *hit = memmem(doc, (size_t)(end - doc), d->sep, (size_t)d->sep_len);
            const uint8_t *stop = hit ? hit : end;
            fn(arg, doc, stop - doc);
            doc = hit ? hit + d->sep_len : end;
        }
    }
}

void documents_ranges(const Corpus *c, const DocSpec *d, DocRangeFn fn, void *arg) {
    int64_t lo = 0;
    for (int f = 0; f < c->n_files; f++) {
        split_file(d, c->bytes + lo, c->bytes + c->file_end[f], fn, arg);
        lo = c->file_end[f];
    }
}

typedef struct Tokenize {
    Out *o;
    const Tokenizer *tok;
} Tokenize;

static void tokenize_document(void *arg, const uint8_t *bytes, int64_t len) {
    Tokenize *t = arg;
    add_document(t->o, t->tok, bytes, len);
}

void documents_tokenize(const Corpus *c, const DocSpec *d, const Tokenizer *tok, int **tokens, int64_t *n,
                        int64_t **starts, int64_t *n_docs) {
    Out o = {0};
    // At most one id per byte, plus an end-of-text token per document (a
    // document holds a byte at least).
    o.cap = 2 * c->n + 1;
    o.tokens = xmalloc((size_t)o.cap * sizeof *o.tokens);
    if (d->mode == DOCS_NONE) {
        o.n = tokenizer_encode(tok, c->bytes, c->n, o.tokens);
    } else {
        documents_ranges(c, d, tokenize_document, &(Tokenize){&o, tok});
    }
    *tokens = xrealloc(o.tokens, (size_t)(o.n ? o.n : 1) * sizeof *o.tokens);   // (the room for 2 per byte back)
    *n = o.n;
    *starts = o.starts;
    *n_docs = o.n_docs;
}

Status doc_starts_check(const int64_t *starts, int64_t n_docs, int64_t n) {
    if (n_docs < 1 || starts[0] != 0) return status_err("the first document does not start at token 0");
    for (int64_t i = 1; i < n_docs; i++)
        if (starts[i] <= starts[i - 1] || starts[i] >= n)
            return status_err("document %lld starts at %lld, after %lld, with %lld tokens", (long long)i,
                              (long long)starts[i], (long long)starts[i - 1], (long long)n);
    return status_ok();
}

void doc_flags(const int64_t *starts, int64_t n_docs, int64_t start, int T, int *flags) {
    memset(flags, 0, (size_t)T * sizeof *flags);
    // The first document start >= start (binary search), then every one inside the window.
    int64_t lo = 0, hi = n_docs;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (starts[mid] < start) lo = mid + 1;
        else hi = mid;
    }
    for (int64_t i = lo; i < n_docs && starts[i] < start + T; i++) flags[starts[i] - start] = 1;
}
