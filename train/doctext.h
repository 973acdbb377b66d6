// doctext.h: a text as a stream of tokens cut into documents, for evaluation
// (evaluate --positions): document flags as lm_forward_docs reads them.
#ifndef DOCTEXT_H
#define DOCTEXT_H

#include "tokenizer.h"

// Decode the C escapes \n \t \r \0 \\ \xHH of s into out (cap bytes).
// Returns the decoded length, or -1 (bad escape, or longer than cap).
int doctext_unescape(const char *s, char *out, int cap);

// Tokenize bytes (nb) as documents: a new document begins after each
// occurrence of sep (seplen bytes; the separator ends the document before
// it), or, with sep NULL / seplen 0, the whole text is one. Each document is
// encoded on its own, so no token spans two. ids and flags need room for nb
// entries; flags[i] = 1 where a document's first token is, else 0 (empty
// documents are dropped). Returns the number of tokens.
int64_t doctext_encode(const Tokenizer *tk, const uint8_t *bytes, int64_t nb, const char *sep, int seplen, int *ids,
                       int *flags);

// Cut every document of flags (n) into sequences of at most seq tokens: a
// flag every seq positions of a document.
void doctext_cut(int *flags, int64_t n, int seq);

// The number of documents in flags (n) and the length of the longest (a
// stream whose first flag is past 0 begins with a document all the same).
int64_t doctext_count(const int *flags, int64_t n, int64_t *longest);

#endif
