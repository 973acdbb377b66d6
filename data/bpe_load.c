// bpe_load.c: reading and writing tokenizer files (the format is in bpe.h),
// and tiktoken's encodings by name. Every file is hostile: sizes are checked
// before anything is allocated from them, base64 must be canonical, ranks and
// ids unique and bounded, tokens distinct; messages read "what:line: ...".
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "bpe_impl.h"
#include "corpus.h"   // fnv1a64
#include "data_dir.h"
#include "fileio.h"   // file_replace

#ifndef SOURCE_DIR
#define SOURCE_DIR "."
#endif

#define HEADER_MAGIC "#attnlab-bpe 1"

// tiktoken's encodings: the rank file (data/bpe/<file>.tiktoken.gz, the
// upstream .tiktoken byte for byte) and the special tokens
// (tiktoken_ext/openai_public.py; encoders/*.json of the npm package).
static const struct {
    const char *name, *file;
    BpeSpecial specials[5];
    int n_specials;
} NAMED[] = {
    {"gpt2", "r50k_base", {{"<|endoftext|>", 50256}}, 1},
    {"r50k_base", "r50k_base", {{"<|endoftext|>", 50256}}, 1},
    {"cl100k_base",
     "cl100k_base",
     {{"<|endoftext|>", 100257},
      {"<|fim_prefix|>", 100258},
      {"<|fim_middle|>", 100259},
      {"<|fim_suffix|>", 100260},
      {"<|endofprompt|>", 100276}},
     5},
    {"o200k_base", "o200k_base", {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}, 2},
};

// ---------------------------------------------------------------- base64

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int b64_value(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

// Canonical base64 (RFC 4648: padded, unused bits zero) of s[0..n) into out
// (room for n / 4 * 3); returns the byte count or -1.
static int b64_decode(const uint8_t *s, int n, uint8_t *out) {
    if (n == 0 || n % 4) return -1;
    int o = 0;
    for (int i = 0; i < n; i += 4) {
        int pad = s[i + 3] == '=' ? (s[i + 2] == '=' ? 2 : 1) : 0;
        if (pad && i + 4 != n) return -1;
        int v[4];
        for (int k = 0; k < 4 - pad; k++)
            if ((v[k] = b64_value(s[i + k])) < 0) return -1;
        for (int k = 4 - pad; k < 4; k++) v[k] = 0;
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        if ((pad == 1 && (w & 0xFF)) || (pad == 2 && (w & 0xFFFF))) return -1;   // bits the padding drops must be 0
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2) out[o++] = (uint8_t)(w >> 8);
        if (pad < 1) out[o++] = (uint8_t)w;
    }
    return o;
}

int bpe_base64_encode(const uint8_t *p, int n, char *out) {
    int o = 0;
    for (int i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        out[o++] = B64[w >> 18 & 63];
        out[o++] = B64[w >> 12 & 63];
        out[o++] = i + 1 < n ? B64[w >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? B64[w & 63] : '=';
    }
    return o;
}

// ---------------------------------------------------------------- gzip

static bool is_gzip(const uint8_t *buf, size_t n) { return n >= 2 && buf[0] == 0x1f && buf[1] == 0x8b; }

static uint8_t *gunzip(const uint8_t *buf, size_t n, const char *what, size_t *out_n, Status *st) {
    z_stream z = {0};
    if (n > BPE_FILE_MAX || inflateInit2(&z, 15 + 16) != Z_OK) {
        *st = status_err("%s: gzip data of %zu bytes: too large or zlib failed", what, n);
        return NULL;
    }
    size_t cap = n * 4 + 1024, got = 0;
    if (cap > BPE_FILE_MAX + 1) cap = BPE_FILE_MAX + 1;
    uint8_t *out = xmalloc(cap);
    z.next_in = (uint8_t *)buf;
    z.avail_in = (uInt)n;
    int rc = Z_OK;
    while (rc == Z_OK) {
        if (got == cap) {
            if (cap > BPE_FILE_MAX) break;
            cap = cap * 2 > BPE_FILE_MAX + 1 ? BPE_FILE_MAX + 1 : cap * 2;
            out = xrealloc(out, cap);
        }
        z.next_out = out + got;
        z.avail_out = (uInt)(cap - got);
        rc = inflate(&z, Z_NO_FLUSH);
        got = cap - z.avail_out;
    }
    inflateEnd(&z);
    if (rc != Z_STREAM_END) {
        free(out);
        *st = got > BPE_FILE_MAX ? status_err("%s: decompresses to more than %d bytes", what, BPE_FILE_MAX)
                                 : status_err("%s: corrupt or truncated gzip data (zlib: %s)", what,
                                              z.msg ? z.msg : rc == Z_BUF_ERROR ? "unexpected end" : "error");
        return NULL;
    }
    if (z.avail_in != 0) {
        free(out);
        *st = status_err("%s: %u bytes after the end of the gzip data", what, z.avail_in);
        return NULL;
    }
    *out_n = got;
    return out;
}

// ---------------------------------------------------------------- parsing

typedef struct Entry {
    int id, line;
    uint32_t off;   // into the blob being built
    uint16_t len;
    bool special;
} Entry;

static void prefix(Status *st, const char *what, int line) {
    char msg[sizeof st->msg];
    memcpy(msg, st->msg, sizeof msg);
    msg[sizeof msg - 1] = 0;
    int k = line > 0 ? snprintf(st->msg, sizeof st->msg, "%s:%d: ", what, line)
                     : snprintf(st->msg, sizeof st->msg, "%s: ", what);
    if (k >= 0 && (size_t)k < sizeof st->msg) snprintf(st->msg + k, sizeof st->msg - (size_t)k, "%.*s", 400, msg);
}

// *st = "what:line: message" (line 0: "what: message"); returns false.
__attribute__((format(printf, 4, 5))) static bool perr(Status *st, const char *what, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    st->ok = 0;
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
    prefix(st, what, line);
    return false;
}
#define PERR(line, ...) perr(st, what, line, __VA_ARGS__)

// A decimal number of 1..7 digits below BPE_VOCAB_MAX, or -1.
static int parse_id(const uint8_t *s, int n) {
    if (n < 1 || n > 7) return -1;
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v < BPE_VOCAB_MAX ? v : -1;
}

typedef struct Parsed {
    Entry *e;
    int n, cap;
    uint8_t *blob;
    size_t blob_n, blob_cap;
    char *pattern;
    int pattern_line;
} Parsed;

static Entry *add_entry(Parsed *p, const uint8_t *bytes, int len, int id, int line, bool special) {
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 1024;
        p->e = xrealloc(p->e, (size_t)p->cap * sizeof *p->e);
    }
    if (p->blob_n + (size_t)len + 1 > p->blob_cap) {
        p->blob_cap = 2 * p->blob_cap + (size_t)len + 4096;
        p->blob = xrealloc(p->blob, p->blob_cap);
    }
    Entry *e = &p->e[p->n++];
    *e = (Entry){id, line, (uint32_t)p->blob_n, (uint16_t)len, special};
    memcpy(p->blob + p->blob_n, bytes, (size_t)len);
    p->blob_n += (size_t)len;
    if (special) p->blob[p->blob_n++] = 0;   // so bpe_special can hand out a C string
    return e;
}

// One line (without its line break). header: whether # lines are allowed.
static bool parse_line(Parsed *p, const uint8_t *s, int n, int line, bool header, bool *in_header, const char *what,
                       Status *st) {
    uint8_t tok[BPE_TOKEN_MAX + 3];
    if (s[0] == '#') {
        if (!header) return PERR(line, "a '#' line in a plain .tiktoken file (use bpe_from_buffer for our format)");
        if (!*in_header) return PERR(line, "a '#' line after the first rank line (the header comes first)");
        if (line == 1) {
            if (n != (int)strlen(HEADER_MAGIC) || memcmp(s, HEADER_MAGIC, (size_t)n) != 0)
                return PERR(line, "the first '#' line must be '%s'", HEADER_MAGIC);
            return true;
        }
        if (n > 9 && memcmp(s, "#pattern ", 9) == 0) {
            if (p->pattern) return PERR(line, "a second #pattern line (the first is line %d)", p->pattern_line);
            if (n - 9 > BPE_PATTERN_MAX) return PERR(line, "pattern of %d bytes (limit %d)", n - 9, BPE_PATTERN_MAX);
            p->pattern = strndup((const char *)s + 9, (size_t)(n - 9));
            p->pattern_line = line;
            return true;
        }
        if (n > 9 && memcmp(s, "#special ", 9) == 0) {
            const uint8_t *sp = memchr(s + 9, ' ', (size_t)(n - 9));
            int id = sp ? parse_id(s + 9, (int)(sp - (s + 9))) : -1;
            if (id < 0) return PERR(line, "expected '#special <id> <text>' with an id in [0, %d)", BPE_VOCAB_MAX);
            int len = n - (int)(sp + 1 - s);
            if (len < 1 || len > BPE_TOKEN_MAX) return PERR(line, "special token text of %d bytes (1 to %d)", len, BPE_TOKEN_MAX);
            if (memchr(sp + 1, '\r', (size_t)len)) return PERR(line, "special token text holds a carriage return");
            add_entry(p, sp + 1, len, id, line, true);
            return true;
        }
        return PERR(line, "unknown header line (expected #pattern or #special)");
    }
    if (line == 1 && header) return PERR(line, "no '%s' line: not a tokenizer file of ours (a plain .tiktoken file "
                                               "needs its pattern: bpe_from_tiktoken or bpe_from_name)", HEADER_MAGIC);
    *in_header = false;
    const uint8_t *sp = memchr(s, ' ', (size_t)n);
    if (!sp) return PERR(line, "expected '<base64 token> <rank>'");
    int blen = (int)(sp - s);
    if (blen > (BPE_TOKEN_MAX + 2) / 3 * 4) return PERR(line, "token of more than %d bytes", BPE_TOKEN_MAX);
    int len = b64_decode(s, blen, tok);
    if (len < 0) return PERR(line, "token '%.*s' is not canonical base64", blen > 64 ? 64 : blen, (const char *)s);
    if (len > BPE_TOKEN_MAX) return PERR(line, "token of %d bytes (limit %d)", len, BPE_TOKEN_MAX);
    int id = parse_id(sp + 1, n - blen - 1);
    if (id < 0) return PERR(line, "rank '%.*s' is not a number in [0, %d)", n - blen - 1 > 16 ? 16 : n - blen - 1,
                            (const char *)sp + 1, BPE_VOCAB_MAX);
    add_entry(p, tok, len, id, line, false);
    return true;
}

// Ids are dense where it matters: the ranks are exactly 0 .. n_ranks-1 (so a
// special, whose id no rank has, comes after them) and the specials lie in
// the next BPE_SPECIALS_MAX ids (tiktoken's cl100k_base and o200k_base leave
// a few ids there unused). A model has one embedding row per id, so one far
// id would make it huge, and an id without bytes is one a model could learn
// to emit and nothing could print.
static bool check_ids(const Bpe *b, const int *line_of, const char *what, Status *st) {
    int last_rank = -1;
    for (int id = 0; id < b->vocab; id++)
        if (b->kind[id] == BPE_ID_RANK) last_rank = id;
    if (last_rank != b->n_ranks - 1) {
        int hole = 0;
        while (b->kind[hole] == BPE_ID_RANK) hole++;
        return PERR(line_of[last_rank], "rank %d, but no token has id %d: ranks must be 0 to %d with none missing",
                    last_rank, hole, b->n_ranks - 1);
    }
    for (int i = 0; i < b->n_specials; i++) {
        int id = b->special_ids[i];
        if (id >= b->n_ranks + BPE_SPECIALS_MAX)
            return PERR(line_of[id], "special token id %d: more than %d ids after the last rank (%d)", id,
                        BPE_SPECIALS_MAX, b->n_ranks - 1);
    }
    return true;
}

static int cmp_special(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

// Everything parsed: build the Bpe and check what spans lines.
static Bpe *assemble(Parsed *p, const char *what, Status *st) {
    Bpe *b = xcalloc(1, sizeof *b);
    int *line_of = NULL;
    for (int i = 0; i < p->n; i++) b->vocab = imax(b->vocab, p->e[i].id + 1);
    b->kind = xcalloc((size_t)b->vocab + 1, 1);
    b->off = xcalloc((size_t)b->vocab + 1, sizeof *b->off);
    b->len = xcalloc((size_t)b->vocab + 1, sizeof *b->len);
    line_of = xcalloc((size_t)b->vocab + 1, sizeof *line_of);
    b->blob = p->blob, p->blob = NULL;
    b->special_ids = xmalloc((size_t)p->n * sizeof *b->special_ids + 1);
    for (int i = 0; i < p->n; i++) {
        Entry *e = &p->e[i];
        if (b->kind[e->id]) {
            PERR(e->line, "id %d is taken already (line %d)", e->id, line_of[e->id]);
            goto fail;
        }
        if (e->special) {
            if (b->n_specials == BPE_SPECIALS_MAX) {
                PERR(e->line, "more than %d special tokens", BPE_SPECIALS_MAX);
                goto fail;
            }
            for (int k = 0; k < b->n_specials; k++) {
                int o = b->special_ids[k];
                if (b->len[o] == e->len && memcmp(b->blob + b->off[o], b->blob + e->off, e->len) == 0) {
                    PERR(e->line, "special token '%s' repeats line %d", (char *)b->blob + e->off, line_of[o]);
                    goto fail;
                }
            }
            b->special_ids[b->n_specials++] = e->id;
        } else {
            b->n_ranks++;
        }
        b->kind[e->id] = e->special ? BPE_ID_SPECIAL : BPE_ID_RANK;
        b->off[e->id] = e->off, b->len[e->id] = e->len, line_of[e->id] = e->line;
    }
    if (b->n_ranks == 0) {
        PERR(0, "no rank lines");
        goto fail;
    }
    qsort(b->special_ids, (size_t)b->n_specials, sizeof *b->special_ids, cmp_special);
    int dup = bpe_build_table(b);
    if (dup >= 0) {
        int first = bpe_rank_of(b, b->blob + b->off[dup], b->len[dup]);
        PERR(line_of[dup], "rank %d has the same bytes as rank %d (line %d)", dup, first, line_of[first]);
        goto fail;
    }
    for (int c = 0; c < 256; c++) {
        if (b->byte_rank[c] < 0) {
            PERR(0, "byte 0x%02x has no rank (every single byte needs one, or some texts could not be encoded)", c);
            goto fail;
        }
    }
    if (!check_ids(b, line_of, what, st)) goto fail;
    b->split = bpe_split_new(p->pattern, st);
    if (!b->split) {
        prefix(st, what, p->pattern_line);
        goto fail;
    }
    b->source = strdup(what);
    size_t len;
    uint8_t *canon = bpe_to_buffer(b, &len);
    b->hash = fnv1a64(FNV1A_INIT, canon, len);
    free(canon);
    free(line_of);
    *st = status_ok();
    return b;
fail:
    free(line_of);
    bpe_free(b);
    return NULL;
}

// header: whether the buffer is our format (else plain .tiktoken).
static Bpe *parse(const uint8_t *buf, size_t n, const char *what, bool header, const char *pattern,
                  const BpeSpecial *specials, int n_specials, Status *st) {
    if (is_gzip(buf, n)) {
        size_t m;
        uint8_t *plain = gunzip(buf, n, what, &m, st);
        if (!plain) return NULL;
        Bpe *b = is_gzip(plain, m) ? (*st = status_err("%s: gzip inside gzip", what), NULL)
                                   : parse(plain, m, what, header, pattern, specials, n_specials, st);
        free(plain);
        return b;
    }
    if (n > BPE_FILE_MAX) {
        *st = status_err("%s: %zu bytes, more than the limit of %d", what, n, BPE_FILE_MAX);
        return NULL;
    }
    Parsed p = {0};
    bool in_header = header, ok = true;
    int line = 0;
    for (size_t i = 0; ok && i < n;) {
        const uint8_t *nl = memchr(buf + i, '\n', n - i);
        size_t end = nl ? (size_t)(nl - buf) : n, len = end - i;
        line++;
        if (len > 0 && buf[end - 1] == '\r') len--;
        if (memchr(buf + i, 0, len)) ok = PERR(line, "a NUL byte");
        else if (len > BPE_PATTERN_MAX + 64) ok = PERR(line, "a line of %zu bytes", len);
        else if (p.n >= BPE_VOCAB_MAX + BPE_SPECIALS_MAX) ok = PERR(line, "more than %d lines", p.n);
        else if (len > 0) ok = parse_line(&p, buf + i, (int)len, line, header, &in_header, what, st);
        i = end + 1;
    }
    if (ok && header && line == 0) ok = PERR(0, "empty file");
    if (ok && !header) {
        p.pattern = strdup(pattern);
        for (int i = 0; ok && i < n_specials; i++) {
            size_t l = strlen(specials[i].text);
            if (l < 1 || l > BPE_TOKEN_MAX || specials[i].id < 0 || specials[i].id >= BPE_VOCAB_MAX ||
                strpbrk(specials[i].text, "\r\n"))
                ok = PERR(0, "special token %d: text of %zu bytes (1 to %d, no line break) or id %d (0 to %d)", i, l,
                          BPE_TOKEN_MAX, specials[i].id, BPE_VOCAB_MAX - 1);
            else add_entry(&p, (const uint8_t *)specials[i].text, (int)l, specials[i].id, 0, true);
        }
    }
    if (ok && !p.pattern) ok = PERR(0, "no #pattern line");
    Bpe *b = ok ? assemble(&p, what, st) : NULL;
    free(p.e), free(p.blob), free(p.pattern);
    return b;
}

Bpe *bpe_from_buffer(const uint8_t *buf, size_t n, const char *what, Status *st) {
    return parse(buf, n, what, true, NULL, NULL, 0, st);
}

Bpe *bpe_from_tiktoken(const uint8_t *buf, size_t n, const char *what, const char *pattern,
                       const BpeSpecial *specials, int n_specials, Status *st) {
    if (n_specials < 0 || n_specials > BPE_SPECIALS_MAX) {
        *st = status_err("%s: %d special tokens (0 to %d)", what, n_specials, BPE_SPECIALS_MAX);
        return NULL;
    }
    return parse(buf, n, what, false, pattern, specials, n_specials, st);
}

static uint8_t *read_file(const char *path, size_t *n, Status *st) {
    uint8_t *buf;
    int64_t got;
    // A regular file only (a FIFO would block the open), of at most BPE_FILE_MAX bytes.
    *st = file_read_all(path, "tokenizer file", BPE_FILE_MAX, &buf, &got);
    if (!st->ok) return NULL;
    *n = (size_t)got;
    return buf;
}

Bpe *bpe_load(const char *path, Status *st) {
    size_t n;
    uint8_t *buf = read_file(path, &n, st);
    if (!buf) return NULL;
    Bpe *b = bpe_from_buffer(buf, n, path, st);
    free(buf);
    return b;
}

Bpe *bpe_from_name(const char *name, Status *st) {
    for (size_t i = 0; i < sizeof NAMED / sizeof NAMED[0]; i++) {
        if (strcmp(NAMED[i].name, name) != 0) continue;
        // ATTNLAB_BPE_DIR, else the source tree's data/bpe, else the installed share/attnlab/bpe.
        const char *dir = getenv("ATTNLAB_BPE_DIR");
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.tiktoken.gz", dir && *dir ? dir : SOURCE_DIR "/data/bpe", NAMED[i].file);
        if (!(dir && *dir) && access(path, R_OK) != 0)
            snprintf(path, sizeof path, "%s/bpe/%s.tiktoken.gz", attnlab_data_dir(), NAMED[i].file);
        size_t n;
        uint8_t *buf = read_file(path, &n, st);
        if (!buf) return NULL;
        Bpe *b = bpe_from_tiktoken(buf, n, path, bpe_pattern_named(name), NAMED[i].specials, NAMED[i].n_specials, st);
        free(buf);
        return b;
    }
    *st = status_err("'%s': not a tiktoken encoding name (gpt2, r50k_base, cl100k_base, o200k_base)", name);
    return NULL;
}

Bpe *bpe_open(const char *name_or_path, Status *st) {
    return bpe_pattern_named(name_or_path) ? bpe_from_name(name_or_path, st) : bpe_load(name_or_path, st);
}

// ---------------------------------------------------------------- writing

uint8_t *bpe_to_buffer(const Bpe *b, size_t *len) {
    const char *pat = bpe_pattern(b);
    size_t cap = strlen(HEADER_MAGIC) + strlen(pat) + 16;
    for (int id = 0; id < b->vocab; id++) cap += (size_t)b->len[id] / 3 * 4 + 4 + 32;
    char *out = xmalloc(cap);
    size_t o = (size_t)snprintf(out, cap, "%s\n#pattern %s\n", HEADER_MAGIC, pat);
    for (int i = 0; i < b->n_specials; i++) {
        int id = b->special_ids[i];
        o += (size_t)snprintf(out + o, cap - o, "#special %d %s\n", id, (const char *)b->blob + b->off[id]);
    }
    for (int id = 0; id < b->vocab; id++) {
        if (b->kind[id] != BPE_ID_RANK) continue;
        o += (size_t)bpe_base64_encode(b->blob + b->off[id], b->len[id], out + o);
        o += (size_t)snprintf(out + o, cap - o, " %d\n", id);
    }
    *len = o;
    return (uint8_t *)out;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

// gzip with a fixed header (no name, no time), so equal tokenizers give equal files.
static uint8_t *gzip_buffer(const uint8_t *in, size_t n, size_t *out_n) {
    z_stream z = {0};
    ASSERT(deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY) == Z_OK, "deflateInit2 failed");
    size_t cap = deflateBound(&z, (uLong)n) + 64;
    uint8_t *out = xmalloc(cap);
    z.next_in = (uint8_t *)in, z.avail_in = (uInt)n;
    z.next_out = out, z.avail_out = (uInt)cap;
    ASSERT(deflate(&z, Z_FINISH) == Z_STREAM_END, "deflate did not finish");
    *out_n = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

Status bpe_save(const Bpe *b, const char *path) {
    size_t n;
    uint8_t *buf = bpe_to_buffer(b, &n);
    if (ends_with(path, ".gz")) {
        size_t m;
        uint8_t *gz = gzip_buffer(buf, n, &m);
        free(buf);
        buf = gz, n = m;
    }
    Status s = file_replace(path, "tokenizer file", buf, n, 0);
    free(buf);
    return s;
}
