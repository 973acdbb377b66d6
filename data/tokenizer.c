#include "tokenizer.h"

#include <stdio.h>

#include "common.h"

int64_t tokenizer_encode(const uint8_t *bytes, int64_t n, int *tokens) {
    for (int64_t i = 0; i < n; i++) tokens[i] = bytes[i];
    return n;
}

int64_t tokenizer_decode(const int *tokens, int64_t n, uint8_t *bytes) {
    for (int64_t i = 0; i < n; i++) {
        ASSERT(tokens[i] >= 0 && tokens[i] < TOKENIZER_VOCAB, "tokenizer_decode: token %lld is %d, outside [0, %d)",
               (long long)i, tokens[i], TOKENIZER_VOCAB);
        bytes[i] = (uint8_t)tokens[i];
    }
    return n;
}

const char *tokenizer_token_str(int id, char buf[5]) {
    ASSERT(id >= 0 && id < TOKENIZER_VOCAB, "tokenizer_token_str: id %d outside [0, %d)", id, TOKENIZER_VOCAB);
    if (id == '\n') snprintf(buf, 5, "\\n");
    else if (id == '\t') snprintf(buf, 5, "\\t");
    else if (id == '\\') snprintf(buf, 5, "\\\\");
    else if (id >= 32 && id < 127) snprintf(buf, 5, "%c", id);
    else snprintf(buf, 5, "\\x%02x", id);
    return buf;
}
