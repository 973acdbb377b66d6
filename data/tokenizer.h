// tokenizer.h: what turns text into token ids and back, for training,
// evaluation and decoding: bytes (every byte a token; vocabulary 256; any
// text round-trips) or a byte-level BPE (bpe.h: a tiktoken encoding, a file
// written by `tokenize train`, or one trained on the corpus).
//
// A Tokenizer is chosen by a spec ([data] tokenizer):
//   byte                  the byte tokenizer (the default)
//   gpt2 | r50k_base | cl100k_base | o200k_base   tiktoken's encodings
//   bpe:N                 a BPE of N ids trained on the run's corpus (the
//                         trainer does it: tokenizer_train)
//   anything else         a tokenizer file (bpe.h's format, or .tiktoken)
// A checkpoint stores the tokenizer it was trained with (tokenizer_to_buffer),
// so decoding needs no file.
#ifndef DATA_TOKENIZER_H
#define DATA_TOKENIZER_H

#include <stdint.h>

#include "bpe.h"
#include "common.h"

#define TOKENIZER_BYTE_VOCAB 256
#define TOKENIZER_EOT "<|endoftext|>"   // the end-of-text special of trained tokenizers
#define TOKENIZER_TRAIN_VOCAB_MIN 257   // bpe:N: the 256 bytes and TOKENIZER_EOT at least

typedef struct Tokenizer {
    Bpe *bpe;          // NULL: bytes
    int vocab;         // ids are in [0, vocab)
    int eot;           // the id of TOKENIZER_EOT, -1 if the tokenizer has none
    uint64_t hash;     // identifies the vocabulary (token caches are keyed by it)
} Tokenizer;

// The byte tokenizer.
void tokenizer_bytes(Tokenizer *t);
// Is spec "byte", a tiktoken encoding's name, or "bpe:..." (not a file)?
// *train_vocab receives N for "bpe:N" with N in [TOKENIZER_TRAIN_VOCAB_MIN,
// BPE_VOCAB_MAX], else 0 (a malformed "bpe:..." is a name too, never a file:
// tokenizer_open says which N are valid).
bool tokenizer_spec_is_named(const char *spec, int *train_vocab);
// Open a spec other than "bpe:N" (errors name the spec or file and line).
Status tokenizer_open(Tokenizer *t, const char *spec);
// Train a BPE of `vocab` ids (256 bytes, merges, and TOKENIZER_EOT) on text.
Status tokenizer_train(Tokenizer *t, const uint8_t *text, int64_t n, int vocab);
// The stored form (a checkpoint's /tokenizer): the canonical BPE file, or
// nothing (*n = 0, NULL) for bytes. tokenizer_from_buffer reads it back (n = 0:
// bytes); the buffer is hostile input (bpe.h's checks).
uint8_t *tokenizer_to_buffer(const Tokenizer *t, size_t *n);
Status tokenizer_from_buffer(Tokenizer *t, const uint8_t *buf, size_t n, const char *what);
void tokenizer_free(Tokenizer *t);
// "bytes" or "BPE of 4096 ids" for messages.
const char *tokenizer_describe(const Tokenizer *t, char *buf, size_t n);

// ids must have room for n entries; returns the number written. Special
// tokens' texts are ordinary text (tiktoken's encode_ordinary).
int64_t tokenizer_encode(const Tokenizer *t, const uint8_t *bytes, int64_t n, int *ids);
// The number of bytes id stands for (0 for an id that is no token).
int tokenizer_token_len(const Tokenizer *t, int id);
// The ids of [0, vocab) that stand for bytes, ascending, into ids (room for
// vocab): what a model may emit. A BPE may leave ids unused (tiktoken's
// cl100k_base and o200k_base, between their specials); a sampler that picked
// one would print nothing. Returns the count.
int tokenizer_emittable_ids(const Tokenizer *t, int vocab, int *ids);

// Decoding for printing as tokens come: only whole UTF-8 characters come out
// of a BPE (an incomplete one waits for the next token); bytes come out as
// they are. out must have room for TOKENIZER_STREAM_OUT_MAX bytes.
typedef struct TokenizerStream {
    BpeStream bpe;
} TokenizerStream;
#define TOKENIZER_STREAM_OUT_MAX BPE_STREAM_OUT_MAX
int tokenizer_stream_push(const Tokenizer *t, TokenizerStream *s, int id, uint8_t *out);
int tokenizer_stream_flush(const Tokenizer *t, TokenizerStream *s, uint8_t *out);

#endif
