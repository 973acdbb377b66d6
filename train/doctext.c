#define _GNU_SOURCE   // memmem
#include "doctext.h"

#include <string.h>

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int doctext_unescape(const char *s, char *out, int cap) {
    int n = 0;
    for (; *s; s++) {
        char c = *s;
        if (c == '\\') {
            s++;
            switch (*s) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case '0': c = 0; break;
            case '\\': c = '\\'; break;
            case 'x': {
                int hi = hex_digit(s[1]), lo = hi < 0 ? -1 : hex_digit(s[2]);
                if (hi < 0 || lo < 0) return -1;
                c = (char)(hi * 16 + lo);
                s += 2;
                break;
            }
            default: return -1;   // also a lone backslash at the end
            }
        }
        if (n == cap) return -1;
        out[n++] = c;
    }
    return n;
}

int64_t doctext_encode(const Tokenizer *tk, const uint8_t *bytes, int64_t nb, const char *sep, int seplen, int *ids,
                       int *flags) {
    int64_t n = 0;
    for (int64_t start = 0; start < nb;) {
        int64_t end = nb;   // the document is [start, end)
        if (sep && seplen > 0) {
            const uint8_t *hit = memmem(bytes + start, (size_t)(nb - start), sep, (size_t)seplen);
            if (hit) end = hit - bytes + seplen;
        }
        int64_t k = tokenizer_encode(tk, bytes + start, end - start, ids + n);
        if (k > 0) {
            memset(flags + n, 0, (size_t)k * sizeof(int));
            flags[n] = 1;
        }
        n += k;
        start = end;
    }
    return n;
}

void doctext_cut(int *flags, int64_t n, int seq) {
    for (int64_t i = 0, len = 0; i < n; i++, len++) {
        if (flags[i] || len == seq) len = 0;
        if (len == 0) flags[i] = 1;
    }
}

int64_t doctext_count(const int *flags, int64_t n, int64_t *longest) {
    int64_t docs = 0, best = 0, begin = 0;
    for (int64_t i = 0; i <= n; i++) {
        if (i == n || (flags[i] && i > 0)) {
            if (i - begin > best) best = i - begin;
            docs += i > begin;
            begin = i;
        }
    }
    if (longest) *longest = best;
    return docs;
}
