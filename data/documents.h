// documents.h: a corpus as a list of documents ([data] documents).
//
// A spec is one of
//   none          the corpus is one stream (no boundaries)
//   files         each file of the corpus is a document
//   blank_line    a document ends after a run of blank lines (lines of only
//                 spaces, tabs or \r): a new one starts at the next line with
//                 text; the blank lines stay at the end of the document before
//   text:SEP      documents are separated by the text SEP (1 to 63 bytes,
//                 with the escapes \n \r \t \\), which is removed; empty
//                 documents are dropped
//   eot           text:<|endoftext|> (how many published corpora separate
//                 documents)
// In every mode but none a file's start is a document start too.
//
// Each document is tokenized on its own, and when the tokenizer has an
// end-of-text token (a trained BPE, gpt2, ...) it is appended to every
// document, so a model learns to end one (and `generate` starts an empty
// prompt from it). The byte tokenizer has none: with text:SEP the separator
// is then gone, with blank_line the blank lines remain.
//
// A document start is a token position: the mixers start fresh there
// (lm_forward_docs). The target at a document's last position (the next
// document's first token) is scored, as nanoGPT and llm.c do: the model
// predicts it from the end of the document before (from the end-of-text
// token when the tokenizer has one), without attending across the boundary.
#ifndef DATA_DOCUMENTS_H
#define DATA_DOCUMENTS_H

#include "corpus.h"
#include "tokenizer.h"

typedef enum { DOCS_NONE, DOCS_FILES, DOCS_BLANK_LINE, DOCS_TEXT } DocMode;

#define DOC_SEP_MAX 63

typedef struct DocSpec {
    DocMode mode;
    char sep[DOC_SEP_MAX + 1];   // DOCS_TEXT: the separator, escapes resolved
    int sep_len;
} DocSpec;

// Parse a spec; the error says what is accepted.
Status doc_spec_parse(const char *text, DocSpec *out);

// Tokenize corpus c as documents: *tokens (malloc'd, *n of them) and
// *starts (malloc'd, *n_docs sorted positions, starts[0] = 0; NULL and 0
// for DOCS_NONE, or when nothing is left).
void documents_tokenize(const Corpus *c, const DocSpec *d, const Tokenizer *tok, int **tokens, int64_t *n,
                        int64_t **starts, int64_t *n_docs);

// Each document's bytes, in order, as documents_tokenize splits them (d not
// DOCS_NONE; a document of no bytes is passed too, and documents_tokenize
// skips it).
typedef void (*DocRangeFn)(void *arg, const uint8_t *bytes, int64_t len);
void documents_ranges(const Corpus *c, const DocSpec *d, DocRangeFn fn, void *arg);

// Check a list of document starts read from a file against n tokens:
// starts[0] = 0, strictly increasing, below n. The error names what fails.
Status doc_starts_check(const int64_t *starts, int64_t n_docs, int64_t n);

// Flags for a window of T tokens starting at token `start`: flags[t] = 1
// where start + t is a document start, else 0.
void doc_flags(const int64_t *starts, int64_t n_docs, int64_t start, int T, int *flags);

#endif
