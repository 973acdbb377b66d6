// export_gguf_vocab.c: a tokenizer as GGUF's tokenizer.ggml.* keys.
#include "export_gguf_internal.h"

Status gguf_vocabulary_check(const Tokenizer *tok) {
    if (tok->bpe)
        return status_err("the model's tokenizer is a BPE: GGUF export writes only the byte tokenizer's vocabulary so "
                          "far (train with tokenizer = byte to export)");
    return status_ok();
}

// GPT-2's byte-level alphabet: byte b as the UTF-8 of one code point, the
// printable bytes as themselves and the others as 256 + their order.
static size_t byte_token(int b, char out[4]) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    int cp = b;
    if (!printable) {
        int n = 0;
        for (int c = 0; c < b; c++)
            if (!((c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || (c >= 0xae && c <= 0xff))) n++;
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

void gguf_vocabulary(Gguf *g, const Tokenizer *tok) {
    (void)tok;
    static char text[TOKENIZER_BYTE_VOCAB][4];
    const char *tokens[TOKENIZER_BYTE_VOCAB];
    size_t lens[TOKENIZER_BYTE_VOCAB];
    int32_t types[TOKENIZER_BYTE_VOCAB];
    for (int b = 0; b < TOKENIZER_BYTE_VOCAB; b++) {
        lens[b] = byte_token(b, text[b]);
        tokens[b] = text[b];
        types[b] = 1;   // LLAMA_TOKEN_TYPE_NORMAL
    }
    gguf_kv_str(g, "tokenizer.ggml.model", "gpt2");
    gguf_kv_str(g, "tokenizer.ggml.pre", "default");
    gguf_kv_strs(g, "tokenizer.ggml.tokens", tokens, lens, TOKENIZER_BYTE_VOCAB);
    gguf_kv_i32s(g, "tokenizer.ggml.token_type", types, TOKENIZER_BYTE_VOCAB);
    gguf_kv_strs(g, "tokenizer.ggml.merges", NULL, NULL, 0);
    gguf_kv_bool(g, "tokenizer.ggml.add_bos_token", false);
    gguf_kv_bool(g, "tokenizer.ggml.add_eos_token", false);
}

