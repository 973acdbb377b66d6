// bpe.h: byte-level BPE, encoding and decoding exactly like tiktoken.
//
// A tokenizer is a rank table (token bytes -> rank, every single byte
// included), a split pattern (bpe_split.h) and special tokens (text -> id).
// Encoding splits the text into pieces with the pattern; a piece that is a
// token is that token, otherwise its bytes are merged pairwise, always the
// adjacent pair whose concatenation has the lowest rank (the leftmost on a
// tie), until no adjacent pair is a token. Ids are the ranks; special tokens
// have ids of their own. Any byte string encodes, and decodes back to itself.
//
// Invalid UTF-8: a valid UTF-8 text encodes exactly as tiktoken encodes it
// (encode_ordinary, or encode with every special allowed). A maximal run of
// bytes that belong to no well-formed UTF-8 character is a piece of its own
// (bpe_split.h), so each valid stretch between such runs encodes as tiktoken
// encodes that stretch alone. docs/tokenizer.md says why.
//
// The file format (bpe_load.c), text, one item a line:
//   #attnlab-bpe 1                 first line
//   #pattern <split pattern>       tiktoken syntax, as is
//   #special <id> <text>           zero or more, in id order
//   <base64 token> <rank>          the .tiktoken lines, in rank order
// A plain .tiktoken file is the same without the # lines. Either may be
// gzip'd. Files are treated as hostile: every length, count, rank and id is
// bounded and checked, and an error names the file and the line.
#ifndef DATA_BPE_H
#define DATA_BPE_H

#include "common.h"

#define BPE_TOKEN_MAX 512           // bytes of one token (rank or special)
#define BPE_VOCAB_MAX (1 << 22)     // ids are < this
#define BPE_SPECIALS_MAX 1024
#define BPE_FILE_MAX (256 << 20)    // bytes of a tokenizer file (after gunzip)

typedef struct Bpe Bpe;   // read-only once loaded; encode from several threads at once

typedef struct BpeSpecial {
    const char *text;   // NUL-terminated, no line break
    int id;
} BpeSpecial;

// Loading. Each returns NULL and sets *st on error; `what` names the source
// in messages (a path, "checkpoint", ...).
Bpe *bpe_load(const char *path, Status *st);                 // our format, or gzip'd
Bpe *bpe_from_buffer(const uint8_t *buf, size_t n, const char *what, Status *st);
// A plain .tiktoken file (no # lines; gzip'd or not) with the pattern and
// the specials given here.
Bpe *bpe_from_tiktoken(const uint8_t *buf, size_t n, const char *what, const char *pattern,
                       const BpeSpecial *specials, int n_specials, Status *st);
// tiktoken's encodings: "gpt2", "r50k_base", "cl100k_base", "o200k_base", read
// from $ATTNLAB_BPE_DIR or <source>/data/bpe/<name>.tiktoken.gz.
Bpe *bpe_from_name(const char *name, Status *st);
// A name from the list above, else a path.
Bpe *bpe_open(const char *name_or_path, Status *st);
void bpe_free(Bpe *b);

// The canonical file (our format, uncompressed): bpe_from_buffer of it gives
// an equal tokenizer, and writing that again gives the same bytes. Caller frees.
uint8_t *bpe_to_buffer(const Bpe *b, size_t *len);
Status bpe_save(const Bpe *b, const char *path);   // whole or not at all (file_replace, fileio.h)

int bpe_vocab_size(const Bpe *b);    // 1 + the largest id (ids may have holes: cl100k_base)
int bpe_n_ranks(const Bpe *b);       // mergeable tokens
int bpe_n_specials(const Bpe *b);
BpeSpecial bpe_special(const Bpe *b, int i);   // i in [0, n_specials), in id order
int bpe_special_id(const Bpe *b, const char *text);   // -1 if none
const char *bpe_pattern(const Bpe *b);
// FNV-1a 64 of the canonical file: equal iff ranks, pattern and specials are.
uint64_t bpe_hash(const Bpe *b);
// The bytes of id, or NULL for an id that is no token (outside the vocabulary or a hole).
const uint8_t *bpe_token_bytes(const Bpe *b, int id, int *len);

// Encoding. ids must have room for n entries (a token holds at least one
// byte); returns the number written. flags: BPE_ALLOW_SPECIAL makes the text
// of a special token encode as its id (tiktoken's allowed_special="all");
// otherwise it is ordinary text (encode_ordinary).
// A split that hits its work limit (bpe_split.h; the known patterns never do
// on any text) is an error: bpe_encode_checked returns -1 and sets *st (the
// tokenizer's source and the byte offset); bpe_encode prints that sentence
// and exits with status 1.
#define BPE_ALLOW_SPECIAL 1
int64_t bpe_encode_checked(const Bpe *b, const uint8_t *text, int64_t n, int *ids, int flags, Status *st);
int64_t bpe_encode(const Bpe *b, const uint8_t *text, int64_t n, int *ids, int flags);

// Decoding: the bytes of ids, concatenated (malloc'd, *len bytes, plus a NUL
// not counted). NULL and *st set when an id is no token.
uint8_t *bpe_decode(const Bpe *b, const int *ids, int64_t n, int64_t *len, Status *st);

// Streaming decoding for printing tokens as they come: push one id at a time;
// only whole UTF-8 characters come out, an incomplete one waits for the next
// token (bytes that can never complete one come out as they are).
typedef struct BpeStream {
    uint8_t held[4];   // an unfinished UTF-8 sequence
    int n_held;
} BpeStream;
#define BPE_STREAM_OUT_MAX (BPE_TOKEN_MAX + 4)   // bytes one push can write
// Writes to out (room for BPE_STREAM_OUT_MAX) and returns the count; -1 and
// *st set when id is no token.
int bpe_stream_push(BpeStream *s, const Bpe *b, int id, uint8_t *out, Status *st);
int bpe_stream_flush(BpeStream *s, uint8_t *out);   // what is held, as it is

#endif
