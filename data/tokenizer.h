// tokenizer.h: the byte-level tokenizer. Every byte is one token, so the
// vocabulary is 256 and any text round-trips exactly.
#ifndef DATA_TOKENIZER_H
#define DATA_TOKENIZER_H

#include <stdint.h>

#define TOKENIZER_VOCAB 256

// tokens[i] = bytes[i] for i < n; returns n (the number of tokens written).
int64_t tokenizer_encode(const uint8_t *bytes, int64_t n, int *tokens);
// bytes[i] = tokens[i]; every id must be in [0, 256) (ASSERT). Returns n.
int64_t tokenizer_decode(const int *tokens, int64_t n, uint8_t *bytes);
// A printable form of one token for logs: "a", "\n", "\x07". buf: 5 bytes.
const char *tokenizer_token_str(int id, char buf[5]);

#endif
