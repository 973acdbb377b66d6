// Tokenizer files are hostile (data/bpe_load.c): each malformed file gives an
// error that names the source and the line and says what is wrong.
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "bpe.h"
#include "test_util.h"

// A valid small file: our header, then the 256 single bytes at ranks 0..255,
// then "ab" at 256. Lines: 1 magic, 2 pattern, 3 special, 4.. ranks (byte c
// on line 4 + c).
static char *valid_file(void) {
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *s = malloc(16384);
    int o = sprintf(s, "#attnlab-bpe 1\n#pattern \\S+|\\s+\n#special 257 <|end|>\n");
    for (int c = 0; c < 256; c++)
        o += sprintf(s + o, "%c%c== %d\n", b64[c >> 2], b64[(c & 3) << 4], c);
    sprintf(s + o, "YWI= 256\n");
    return s;
}

// Load text with `from` replaced by `to` (first occurrence); return the error.
static const char *load_error(const char *from, const char *to) {
    static Status st;
    char *s = valid_file(), *buf = malloc(20000);
    char *at = strstr(s, from);
    cr_assert_not_null(at, "'%s' not in the valid file", from);
    int pre = (int)(at - s);
    int n = sprintf(buf, "%.*s%s%s", pre, s, to, at + strlen(from));
    Bpe *b = bpe_from_buffer((const uint8_t *)buf, (size_t)n, "tok.bpe", &st);
    cr_assert_null(b, "replacing '%s' with '%s' must fail", from, to);
    free(s), free(buf);
    return st.msg;
}

#define EXPECT_ERROR(from, to, want)                                            \
    do {                                                                        \
        const char *msg_ = load_error(from, to);                                \
        cr_assert(strstr(msg_, want), "got '%s', want '%s'", msg_, want);      \
    } while (0)

Test(bpe_load, valid_small_file) {
    char *s = valid_file();
    Status st;
    Bpe *b = bpe_from_buffer((const uint8_t *)s, strlen(s), "tok.bpe", &st);
    cr_assert_not_null(b, "%s", st.msg);
    cr_assert_eq(bpe_vocab_size(b), 258);
    int ids[8];
    cr_assert_eq(bpe_encode(b, (const uint8_t *)"abc ab", 6, ids, 0), 4);   // "ab" "c" " " "ab"
    cr_assert(ids[0] == 256 && ids[1] == 'c' && ids[2] == ' ' && ids[3] == 256);
    // The canonical form of this file is the file itself.
    size_t n;
    uint8_t *back = bpe_to_buffer(b, &n);
    cr_assert(n == strlen(s) && memcmp(back, s, n) == 0, "canonical form differs:\n%.*s", (int)n, (char *)back);
    free(back), free(s);
    bpe_free(b);
}

Test(bpe_load, malformed_lines_name_file_and_line) {
    EXPECT_ERROR("#attnlab-bpe 1", "#attnlab-bpe 2", "tok.bpe:1: the first '#' line must be '#attnlab-bpe 1'");
    EXPECT_ERROR("#attnlab-bpe 1\n", "", "tok.bpe:1: the first '#' line must be '#attnlab-bpe 1'");
    EXPECT_ERROR("#attnlab-bpe 1\n#pattern \\S+|\\s+\n#special 257 <|end|>\n", "",
                 "tok.bpe:1: no '#attnlab-bpe 1' line: not a tokenizer file of ours");
    EXPECT_ERROR("QQ== 65\n", "QQ= 65\n", "tok.bpe:69: token 'QQ=' is not canonical base64");
    EXPECT_ERROR("QQ== 65\n", "QR== 65\n", "tok.bpe:69: token 'QR==' is not canonical base64");   // unused bits set
    EXPECT_ERROR("QQ== 65\n", "Q!== 65\n", "tok.bpe:69: token 'Q!==' is not canonical base64");
    EXPECT_ERROR("QQ== 65\n", "QQ== 6x\n", "tok.bpe:69: rank '6x' is not a number in [0, 4194304)");
    EXPECT_ERROR("QQ== 65\n", "QQ== -65\n", "tok.bpe:69: rank '-65' is not a number");
    EXPECT_ERROR("QQ== 65\n", "QQ== 99999999\n", "tok.bpe:69: rank '99999999' is not a number");
    EXPECT_ERROR("QQ== 65\n", "QQ==65\n", "tok.bpe:69: expected '<base64 token> <rank>'");
    EXPECT_ERROR("QQ== 65\n", "QQ==  65\n", "tok.bpe:69: rank ' 65' is not a number");
    EXPECT_ERROR("QQ== 65\n", "QQ== 64\n", "tok.bpe:69: id 64 is taken already (line 68)");
    EXPECT_ERROR("YWI= 256", "QQ== 256", "tok.bpe:260: rank 256 has the same bytes as rank 65 (line 69)");
    EXPECT_ERROR("QQ== 65\n", "", "tok.bpe: byte 0x41 has no rank");
    EXPECT_ERROR("YWI= 256", "#pattern x", "tok.bpe:260: a '#' line after the first rank line");
    EXPECT_ERROR("#special 257", "#pattern x\n#special 257", "tok.bpe:3: a second #pattern line (the first is line 2)");
    EXPECT_ERROR("#special 257 <|end|>", "#special 65 <|end|>", "id 65 is taken already");
    EXPECT_ERROR("#special 257 <|end|>", "#special 257 <|end|>\n#special 258 <|end|>",
                 "tok.bpe:4: special token '<|end|>' repeats line 3");
    EXPECT_ERROR("#special 257 <|end|>", "#special x <|end|>", "tok.bpe:3: expected '#special <id> <text>'");
    EXPECT_ERROR("#special 257 <|end|>", "#special 257 ", "tok.bpe:3: special token text of 0 bytes");
    EXPECT_ERROR("#special 257 <|end|>", "#spacial 257 <|end|>", "tok.bpe:3: unknown header line");
    // Only the known patterns load (a regex from a file could take exponential
    // time); test_bpe_hostile.c has the messages of patterns that do not compile.
    EXPECT_ERROR("#pattern \\S+|\\s+", "#pattern (\\S+", "tok.bpe:2: split pattern: not one of the known patterns");
    EXPECT_ERROR("#pattern \\S+|\\s+", "#pattern \\S+|\\s+ ", "tok.bpe:2: split pattern: not one of the known patterns");
    EXPECT_ERROR("#pattern \\S+|\\s+", "#pattern \\s+|\\S+", "tok.bpe:2: split pattern: not one of the known patterns");
    EXPECT_ERROR("#pattern \\S+|\\s+\n", "", "tok.bpe: no #pattern line");
    // A token longer than BPE_TOKEN_MAX (513 bytes of 'A' in base64).
    char big[1024];
    int o = sprintf(big, "QUFB");
    for (int i = 1; i < 171; i++) o += sprintf(big + o, "QUFB");
    sprintf(big + o, " 256");
    EXPECT_ERROR("YWI= 256", big, "tok.bpe:260: token of 513 bytes (limit 512)");
}

Test(bpe_load, nul_bytes_carriage_returns_and_blank_lines) {
    char *s = valid_file();
    Status st;
    // CR LF line ends and blank lines are read as tiktoken reads them.
    char *crlf = malloc(40000);
    int o = 0;
    for (char *p = s; *p; p++) {
        if (*p == '\n') crlf[o++] = '\r';
        crlf[o++] = *p;
        if (p[0] == '\n' && p[1] == 'Y') crlf[o++] = '\n';   // a blank line before the last rank
    }
    Bpe *b = bpe_from_buffer((const uint8_t *)crlf, (size_t)o, "crlf", &st);
    cr_assert_not_null(b, "%s", st.msg);
    cr_assert_eq(bpe_vocab_size(b), 258);
    bpe_free(b);
    s[100] = 0;   // inside a rank line
    size_t n = strlen(s + 101) + 101;
    cr_assert_null(bpe_from_buffer((const uint8_t *)s, n, "nul", &st));
    cr_assert(strstr(st.msg, "nul:") && strstr(st.msg, "a NUL byte"), "%s", st.msg);
    cr_assert_null(bpe_from_buffer((const uint8_t *)"", 0, "empty", &st));
    cr_assert_str_eq(st.msg, "empty: empty file");
    free(s), free(crlf);
}

Test(bpe_load, gzip_plain_tiktoken_and_missing_files) {
    char *s = valid_file();
    uLongf cap = 20000;
    uint8_t *gz = malloc(cap);
    // gzip by hand: zlib's gz* API writes files, compress2 writes zlib format.
    z_stream z = {0};
    deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
    z.next_in = (uint8_t *)s, z.avail_in = (uInt)strlen(s), z.next_out = gz, z.avail_out = (uInt)cap;
    cr_assert_eq(deflate(&z, Z_FINISH), Z_STREAM_END);
    size_t n = cap - z.avail_out;
    deflateEnd(&z);
    Status st;
    Bpe *b = bpe_from_buffer(gz, n, "tok.bpe.gz", &st);
    cr_assert_not_null(b, "%s", st.msg);
    bpe_free(b);
    cr_assert_null(bpe_from_buffer(gz, n - 9, "cut.gz", &st));
    cr_assert(strstr(st.msg, "cut.gz: corrupt or truncated gzip data"), "%s", st.msg);
    gz[n / 2] ^= 0x55;
    cr_assert_null(bpe_from_buffer(gz, n, "flip.gz", &st));
    cr_assert(strstr(st.msg, "flip.gz:"), "%s", st.msg);
    // A plain .tiktoken file: the # lines are not allowed, the pattern comes from the caller.
    const char *ranks = strstr(s, "AA== 0");
    BpeSpecial sp[1] = {{"<|eot|>", 300}};
    b = bpe_from_tiktoken((const uint8_t *)ranks, strlen(ranks), "plain", "\\S+|\\s+", sp, 1, &st);
    cr_assert_not_null(b, "%s", st.msg);
    cr_assert_eq(bpe_vocab_size(b), 301);
    bpe_free(b);
    cr_assert_null(bpe_from_tiktoken((const uint8_t *)s, strlen(s), "plain", "\\S+", NULL, 0, &st));
    cr_assert(strstr(st.msg, "plain:1: a '#' line in a plain .tiktoken file"), "%s", st.msg);
    BpeSpecial bad[1] = {{"a\nb", 300}};
    cr_assert_null(bpe_from_tiktoken((const uint8_t *)ranks, strlen(ranks), "plain", "\\S+", bad, 1, &st));
    cr_assert(strstr(st.msg, "special token 0"), "%s", st.msg);
    cr_assert_null(bpe_load("/nonexistent/tok.bpe", &st));
    cr_assert_str_eq(st.msg, "/nonexistent/tok.bpe: cannot open tokenizer file: No such file or directory");
    cr_assert_null(bpe_load("/tmp", &st));
    cr_assert_str_eq(st.msg, "/tmp: the tokenizer file is a directory, not a regular file");
    free(gz), free(s);
}
