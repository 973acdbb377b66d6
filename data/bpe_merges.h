// bpe_merges.h: a rank table (bpe.h) as the merge list of GPT-2-style BPE,
// for runtimes that apply merges instead of ranks (llama.cpp's "gpt2"
// vocabularies, Hugging Face's tokenizers).
//
// tiktoken merges the adjacent pair whose concatenation has the lowest rank;
// GPT-2-style BPE merges the listed pair (A, B) with the lowest merge index.
// The list that makes them agree: for each multi-byte token T, in rank
// order, run tiktoken's merging on T's bytes with only the ranks below T's;
// when it ends in two parts A and B, the merge "A B" makes T. A token whose
// bytes end in more parts has no merge (no lower-ranked pair builds it): a
// GPT-2-style tokenizer produces it only when a whole piece is that token
// and the runtime looks pieces up before merging (llama.cpp's
// ignore_merges). Trained tokenizers (bpe_train.h) have no such token.
#ifndef DATA_BPE_MERGES_H
#define DATA_BPE_MERGES_H

#include "bpe.h"

// left[id], right[id] (room for bpe_vocab_size(b) each) receive the ids of
// the pair that makes token id, or -1 for a single byte, a special, a hole,
// or a token no pair makes. Returns the number of tokens no pair makes.
// Merges in rank order are the ids with left[id] >= 0, ascending.
int bpe_merges(const Bpe *b, int *left, int *right);

// The rank of the token whose bytes are p[0..len), or -1 if none is.
int bpe_rank(const Bpe *b, const uint8_t *p, int len);

#endif
