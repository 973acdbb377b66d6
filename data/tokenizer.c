#include "tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_train.h"

#define BYTES_HASH 0x6279746573ull   // "bytes": the byte tokenizer's identity in cache keys

static const char *const NAMED[] = {"gpt2", "r50k_base", "cl100k_base", "o200k_base"};

void tokenizer_bytes(Tokenizer *t) {
    memset(t, 0, sizeof *t);
    t->vocab = TOKENIZER_BYTE_VOCAB;
    t->eot = -1;
    t->hash = BYTES_HASH;
}

bool tokenizer_spec_is_named(const char *spec, int *train_vocab) {
    if (train_vocab) *train_vocab = 0;
    if (!strcmp(spec, "byte")) return true;
    for (size_t i = 0; i < sizeof NAMED / sizeof NAMED[0]; i++)
        if (!strcmp(spec, NAMED[i])) return true;
    if (strncmp(spec, "bpe:", 4) != 0) return false;
    char *end;
    errno = 0;
    long v = strtol(spec + 4, &end, 10);
    bool digits = spec[4] >= '0' && spec[4] <= '9';   // (strtol would take " 5" and "+5")
    if (digits && !*end && !errno && v >= TOKENIZER_TRAIN_VOCAB_MIN && v <= BPE_VOCAB_MAX && train_vocab)
        *train_vocab = (int)v;
    return true;   // a malformed bpe:N too: it names no file (tokenizer_open says what is wrong)
}

static void adopt(Tokenizer *t, Bpe *b) {
    memset(t, 0, sizeof *t);
    t->bpe = b;
    t->vocab = bpe_vocab_size(b);
    t->eot = bpe_special_id(b, TOKENIZER_EOT);
    t->hash = bpe_hash(b);
}

Status tokenizer_open(Tokenizer *t, const char *spec) {
    tokenizer_bytes(t);
    if (!strcmp(spec, "byte")) return status_ok();
    int train_vocab;
    if (!strncmp(spec, "bpe:", 4) && tokenizer_spec_is_named(spec, &train_vocab) && train_vocab)
        return status_err("%s: a tokenizer to train on the corpus, not one to open", spec);
    if (!strncmp(spec, "bpe:", 4))
        return status_err("'%s': bpe:N trains a tokenizer of N ids, N a whole number from %d (256 bytes and %s) "
                          "to %d", spec, TOKENIZER_TRAIN_VOCAB_MIN, TOKENIZER_EOT, BPE_VOCAB_MAX);
    Status st = status_ok();
    Bpe *b = bpe_open(spec, &st);
    if (!b) return st;
    adopt(t, b);
    return status_ok();
}

Status tokenizer_train(Tokenizer *t, const uint8_t *text, int64_t n, int vocab) {
    tokenizer_bytes(t);
    const char *specials[] = {TOKENIZER_EOT};
    BpeTrainOpts o = {.vocab = vocab, .specials = specials, .n_specials = 1};
    uint8_t *file = NULL;
    size_t len = 0;
    Status st = bpe_train(text, n, &o, &file, &len, NULL);
    if (!st.ok) return st;
    st = tokenizer_from_buffer(t, file, len, "the trained tokenizer");
    free(file);
    return st;
}

uint8_t *tokenizer_to_buffer(const Tokenizer *t, size_t *n) {
    *n = 0;
    return t->bpe ? bpe_to_buffer(t->bpe, n) : NULL;
}

Status tokenizer_from_buffer(Tokenizer *t, const uint8_t *buf, size_t n, const char *what) {
    tokenizer_bytes(t);
    if (n == 0) return status_ok();
    Status st = status_ok();
    Bpe *b = bpe_from_buffer(buf, n, what, &st);
    if (!b) return st;
    adopt(t, b);
    return status_ok();
}

void tokenizer_free(Tokenizer *t) {
    if (t->bpe) bpe_free(t->bpe);
    tokenizer_bytes(t);
}

const char *tokenizer_describe(const Tokenizer *t, char *buf, size_t n) {
    if (!t->bpe) snprintf(buf, n, "bytes");
    else snprintf(buf, n, "BPE of %d ids", t->vocab);
    return buf;
}

int64_t tokenizer_encode(const Tokenizer *t, const uint8_t *bytes, int64_t n, int *ids) {
    if (t->bpe) return bpe_encode(t->bpe, bytes, n, ids, 0);
    for (int64_t i = 0; i < n; i++) ids[i] = bytes[i];
    return n;
}

int tokenizer_token_len(const Tokenizer *t, int id) {
    if (!t->bpe) return id >= 0 && id < TOKENIZER_BYTE_VOCAB ? 1 : 0;
    int len = 0;
    return bpe_token_bytes(t->bpe, id, &len) ? len : 0;
}

int tokenizer_emittable_ids(const Tokenizer *t, int vocab, int *ids) {
    int n = 0;
    for (int id = 0; id < vocab; id++)
        if (tokenizer_token_len(t, id) > 0) ids[n++] = id;
    return n;
}

int tokenizer_stream_push(const Tokenizer *t, TokenizerStream *s, int id, uint8_t *out) {
    if (!t->bpe) {
        out[0] = (uint8_t)id;
        return 1;
    }
    Status st = status_ok();
    int n = bpe_stream_push(&s->bpe, t->bpe, id, out, &st);
    return n < 0 ? 0 : n;   // an id that is no token prints nothing (a model only samples ids < vocab)
}

int tokenizer_stream_flush(const Tokenizer *t, TokenizerStream *s, uint8_t *out) {
    return t->bpe ? bpe_stream_flush(&s->bpe, out) : 0;
}
