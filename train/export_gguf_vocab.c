// export_gguf_vocab.c: a tokenizer as GGUF's tokenizer.ggml.* keys.
//
// Both tokenizers become llama.cpp's byte-level "gpt2" vocabulary: tokens
// are their bytes in GPT-2's byte-to-unicode alphabet. The byte tokenizer is
// 256 tokens and no merges, so every byte is its own id whatever the
// pre-tokenizer splits. A BPE is its ranks (ids kept), the merges that
// rebuild them (bpe_merges.h), its specials as CONTROL tokens, and the
// pre-tokenizer whose regex is its split pattern. Ids between specials that
// stand for nothing (cl100k_base, o200k_base) are UNUSED placeholders:
// llama.cpp's ids must be dense, and no text tokenizes to them.
#include "export_gguf_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpe_merges.h"
#include "bpe_split.h"

enum { TYPE_NORMAL = 1, TYPE_CONTROL = 3, TYPE_UNUSED = 5 };   // llama.cpp's llama_token_type

// llama.cpp's pre-tokenizer for each split pattern it implements (regexes in
// src/llama-vocab.cpp, llm_tokenizer_bpe): "gpt-2" is gpt2's pattern,
// "llama-bpe" (LLAMA3) cl100k_base's. For o200k_base's, "granite-embed-
// multi-97m": its regex keeps combining marks (\p{M}) in letter runs as
// tiktoken's does, where "gpt-4o"'s drops them and splits Devanagari
// elsewhere. Both of these look a whole piece up before merging, as tiktoken
// does; "gpt-2" merges every piece, which gives gpt2's ids since its ranks
// are GPT-2's merges in order (every token is made by its pair: bpe_merges.h).
static const char *pre_tokenizer(const char *pattern) {
    static const struct {
        const char *encoding, *pre;
    } map[] = {{"gpt2", "gpt-2"}, {"cl100k_base", "llama-bpe"}, {"o200k_base", "granite-embed-multi-97m"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(pattern, bpe_pattern_named(map[i].encoding)) == 0) return map[i].pre;
    return NULL;
}

// GPT-2's byte-level alphabet: byte b as one code point, the printable
// bytes as themselves and the others as 256 + their order.
static bool printable(int b) { return (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff); }

// The bytes whose GPT-2 alphabet form is the UTF-8 text s, into out (room for
// strlen(s)); -1 if s has a character outside the alphabet.
static int unmapped(const char *s, uint8_t *out) {
    const uint8_t *p = (const uint8_t *)s;
    int n = 0;
    while (*p) {
        int cp = *p++;
        if (cp >= 0xc0 && cp < 0xe0 && (*p & 0xc0) == 0x80) cp = (cp & 0x1f) << 6 | (*p++ & 0x3f);
        else if (cp >= 0x80) return -1;
        int b = -1;
        if (cp < 256 && printable(cp)) b = cp;
        for (int c = 0, k = 256; b < 0 && c < 256; c++)
            if (!printable(c) && k++ == cp) b = c;
        if (b < 0) return -1;
        out[n++] = (uint8_t)b;
    }
    return n;
}

Status gguf_vocabulary_check(const Tokenizer *tok) {
    if (!tok->bpe) return status_ok();
    const Bpe *b = tok->bpe;
    if (!pre_tokenizer(bpe_pattern(b)))
        return status_err("the model's tokenizer splits text with the pattern '%s', which no llama.cpp pre-tokenizer "
                          "implements (llama.cpp has gpt2's, cl100k_base's and o200k_base's): llama.cpp would give "
                          "other ids; train with a tokenizer of one of those patterns to export",
                          bpe_pattern(b));
    // llama.cpp finds tokens by their text: a special written as it is must
    // not be the text of an ordinary token in GPT-2's alphabet.
    uint8_t bytes[BPE_TOKEN_MAX];
    for (int i = 0; i < bpe_n_specials(b); i++) {
        BpeSpecial sp = bpe_special(b, i);
        int n = strlen(sp.text) <= BPE_TOKEN_MAX ? unmapped(sp.text, bytes) : -1, rank = bpe_rank(b, bytes, n);
        if (rank >= 0)
            return status_err("the special token '%s' (id %d) has the text that token %d has in GPT-2's byte "
                              "alphabet: llama.cpp finds tokens by their text and would give one id for both; "
                              "rename the special to export",
                              sp.text, sp.id, rank);
    }
    return status_ok();
}

// Byte b in GPT-2's alphabet, as UTF-8 into out; returns its length.
static size_t byte_token(int b, char out[2]) {
    int cp = b;
    if (!printable(b)) {
        int n = 0;
        for (int c = 0; c < b; c++) n += !printable(c);
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

static void byte_vocabulary(Gguf *g) {
    char text[TOKENIZER_BYTE_VOCAB][2];
    const char *tokens[TOKENIZER_BYTE_VOCAB];
    size_t lens[TOKENIZER_BYTE_VOCAB];
    int32_t types[TOKENIZER_BYTE_VOCAB];
    for (int b = 0; b < TOKENIZER_BYTE_VOCAB; b++) {
        lens[b] = byte_token(b, text[b]);
        tokens[b] = text[b];
        types[b] = TYPE_NORMAL;
    }
    gguf_kv_str(g, "tokenizer.ggml.model", "gpt2");
    gguf_kv_str(g, "tokenizer.ggml.pre", "default");
    gguf_kv_strs(g, "tokenizer.ggml.tokens", tokens, lens, TOKENIZER_BYTE_VOCAB);
    gguf_kv_i32s(g, "tokenizer.ggml.token_type", types, TOKENIZER_BYTE_VOCAB);
    gguf_kv_strs(g, "tokenizer.ggml.merges", NULL, NULL, 0);
}

// Bytes p[0..n) in GPT-2's alphabet into out (room for 2 n); returns the length.
static size_t mapped(const uint8_t *p, int n, char *out) {
    size_t o = 0;
    for (int i = 0; i < n; i++) o += byte_token(p[i], out + o);
    return o;
}

// The token strings of a BPE, one block: token id at text + off[id], len[id] bytes.
static char *bpe_token_texts(const Bpe *b, size_t *off, size_t *len, int32_t *types) {
    int V = bpe_vocab_size(b);
    size_t cap = 0;
    for (int id = 0; id < V; id++) {
        int n = 0;
        bpe_token_bytes(b, id, &n);
        cap += 2 * (size_t)n + 32;
    }
    char *text = xmalloc(cap);
    for (int id = 0; id < V; id++) types[id] = TYPE_NORMAL;
    for (int i = 0; i < bpe_n_specials(b); i++) types[bpe_special(b, i).id] = TYPE_CONTROL;
    size_t at = 0;
    for (int id = 0; id < V; id++) {
        int n = 0;
        const uint8_t *p = bpe_token_bytes(b, id, &n);
        off[id] = at;
        if (!p) {
            // (a space: no token in GPT-2's alphabet has one, so no piece looks it up)
            len[id] = (size_t)snprintf(text + at, 32, "<|unused %d|>", id);
            types[id] = TYPE_UNUSED;
        } else if (types[id] == TYPE_CONTROL) {
            memcpy(text + at, p, (size_t)n);   // specials as they are written, as llama.cpp parses them
            len[id] = (size_t)n;
        } else {
            len[id] = mapped(p, n, text + at);
        }
        at += len[id];
    }
    return text;
}

static void bpe_vocabulary(Gguf *g, const Tokenizer *tok) {
    const Bpe *b = tok->bpe;
    int V = bpe_vocab_size(b);
    size_t *off = xmalloc((size_t)V * sizeof *off), *len = xmalloc((size_t)V * sizeof *len);
    int32_t *types = xmalloc((size_t)V * sizeof *types);
    char *text = bpe_token_texts(b, off, len, types);
    const char **tokens = xmalloc((size_t)V * sizeof *tokens);
    for (int id = 0; id < V; id++) tokens[id] = text + off[id];
    int *left = xmalloc((size_t)V * sizeof *left), *right = xmalloc((size_t)V * sizeof *right);
    bpe_merges(b, left, right);
    // "A B": both sides in GPT-2's alphabet (which has no space), in rank order.
    size_t n_merges = 0, cap = 0;
    for (int id = 0; id < V; id++)
        if (left[id] >= 0) n_merges++, cap += len[left[id]] + 1 + len[right[id]];
    char *mtext = xmalloc(cap + 1);
    const char **merges = xmalloc((n_merges + 1) * sizeof *merges);
    size_t *mlens = xmalloc((n_merges + 1) * sizeof *mlens), k = 0, at = 0;
    for (int id = 0; id < V; id++) {
        if (left[id] < 0) continue;
        merges[k] = mtext + at;
        memcpy(mtext + at, tokens[left[id]], len[left[id]]);
        at += len[left[id]];
        mtext[at++] = ' ';
        memcpy(mtext + at, tokens[right[id]], len[right[id]]);
        at += len[right[id]];
        mlens[k] = (size_t)(mtext + at - merges[k]);
        k++;
    }
    gguf_kv_str(g, "tokenizer.ggml.model", "gpt2");
    gguf_kv_str(g, "tokenizer.ggml.pre", pre_tokenizer(bpe_pattern(b)));
    gguf_kv_strs(g, "tokenizer.ggml.tokens", tokens, len, (size_t)V);
    gguf_kv_i32s(g, "tokenizer.ggml.token_type", types, (size_t)V);
    gguf_kv_strs(g, "tokenizer.ggml.merges", merges, mlens, n_merges);
    if (tok->eot >= 0) gguf_kv_u32(g, "tokenizer.ggml.eos_token_id", (uint32_t)tok->eot);
    free(mlens), free(merges), free(mtext), free(left), free(right);
    free(tokens), free(text), free(types), free(len), free(off);
}

void gguf_vocabulary(Gguf *g, const Tokenizer *tok) {
    if (tok->bpe) bpe_vocabulary(g, tok);
    else byte_vocabulary(g);
    gguf_kv_bool(g, "tokenizer.ggml.add_bos_token", false);
    gguf_kv_bool(g, "tokenizer.ggml.add_eos_token", false);
}
