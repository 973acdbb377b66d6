"""A BPE model's tokenizer in Python: the project's tokenizer file (what
export_model writes as tokenizer.bpe beside a BPE model, and what a
checkpoint stores as /tokenizer; format in docs/tokenizer.md), read as hostile
input with the checks of the C reader (data/bpe_load.c): bounded sizes, the
header line first, canonical base64, ids unique and below 2^22, ranks dense
(0 to n-1), every single byte a rank, specials right after the ranks, and a
split pattern that is one of the known ones byte for byte (a regex from a file
could take time exponential in the text). A file refused raises
CheckpointError "FILE:LINE: what is wrong".

Decoding (ids to bytes: a rank's bytes, a special's text) needs nothing more.
Encoding splits the text with the tokenizer's pattern, which needs the
`regex` module (Debian's python3-regex; Python's `re` has no \\p{L}), then
merges each piece as tiktoken does: the adjacent pair whose bytes have the
lowest rank first, the leftmost on a tie. Bytes that are not well-formed
UTF-8 are pieces of their own, as in the C split (data/bpe_split.h), and the
text of a special token encodes as ordinary text (bin/tokenize encode without
--allow-special). One difference is left: the C split cuts a piece of more
than 2^20 bytes (a run of one character class that long), this one does not.
"""

import base64
import binascii
import heapq
import os
import zlib

from attnlab_checkpoint import CheckpointError, CheckedFile, pread_exact

TOKEN_MAX = 512                 # BPE_TOKEN_MAX: bytes of one token
VOCAB_MAX = 1 << 22             # BPE_VOCAB_MAX: ids are below it
SPECIALS_MAX = 1024             # BPE_SPECIALS_MAX
FILE_MAX = 256 << 20            # BPE_FILE_MAX: bytes of a file (after gunzip)
PATTERN_MAX = 4096              # BPE_PATTERN_MAX
HEADER = b"#attnlab-bpe 1"

_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_O200K_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_O200K_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
# The known split patterns (data/bpe_split.c), in tiktoken's syntax.
PATTERNS = {
    "gpt2": _GPT2,
    "cl100k_base": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                   r"""\s*[\r\n]+|\s+(?!\S)|\s+""",
    "o200k_base": r"[^\r\n\p{L}\p{N}]?" + _O200K_UPPER + "*" + _O200K_LOWER + r"+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
                  r"[^\r\n\p{L}\p{N}]?" + _O200K_UPPER + "+" + _O200K_LOWER + r"*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
                  r"""\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "whitespace": r"\S+|\s+",
    "r50k_base": _GPT2,
}
# tiktoken's encodings: their rank file (data/bpe/<file>.tiktoken.gz) and special tokens (bpe_load.c).
NAMED = {
    "gpt2": ("r50k_base", [("<|endoftext|>", 50256)]),
    "r50k_base": ("r50k_base", [("<|endoftext|>", 50256)]),
    "cl100k_base": ("cl100k_base", [("<|endoftext|>", 100257), ("<|fim_prefix|>", 100258),
                                    ("<|fim_middle|>", 100259), ("<|fim_suffix|>", 100260),
                                    ("<|endofprompt|>", 100276)]),
    "o200k_base": ("o200k_base", [("<|endoftext|>", 199999), ("<|endofprompt|>", 200018)]),
}
# Rust's \s (tiktoken's): the Unicode White_Space property, as the body of a class.
WHITE_SPACE = "\\t\\n\\x0b\\f\\r\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"


def translate(pattern):
    """The pattern with \\s and \\S as explicit White_Space classes (what the C side does for PCRE2)."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            e = pattern[i + 1]
            if e == "s":
                out.append(WHITE_SPACE if in_class else "[" + WHITE_SPACE + "]")
            elif e == "S" and not in_class:
                out.append("[^" + WHITE_SPACE + "]")
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


def _gunzip(data, what):
    d = zlib.decompressobj(15 + 16)
    try:
        out = d.decompress(data, FILE_MAX + 1)
    except zlib.error as e:
        raise CheckpointError("%s: corrupt or truncated gzip data (zlib: %s)" % (what, e)) from None
    if len(out) > FILE_MAX:
        raise CheckpointError("%s: decompresses to more than %d bytes" % (what, FILE_MAX))
    if not d.eof:
        raise CheckpointError("%s: corrupt or truncated gzip data (zlib: unexpected end)" % what)
    if d.unused_data:
        raise CheckpointError("%s: %d bytes after the end of the gzip data" % (what, len(d.unused_data)))
    if out[:2] == b"\x1f\x8b":
        raise CheckpointError("%s: gzip inside gzip" % what)
    return out


def _parse_id(s):
    """A decimal number of 1 to 7 digits below VOCAB_MAX, or -1."""
    if not 1 <= len(s) <= 7 or not all(0x30 <= b <= 0x39 for b in s):
        return -1
    v = int(s)
    return v if v < VOCAB_MAX else -1


class Tokenizer:
    """A tokenizer file, checked. tokens[id]: the bytes of every id (None for an id that is none);
    specials: id -> text; pattern: the split pattern (tiktoken syntax); vocab: ids in all."""

    def __init__(self, data, what, named=None):
        """`data`: a file of ours; with `named` (an encoding's name), a plain .tiktoken rank file of it."""
        self.what = what
        if data[:2] == b"\x1f\x8b":
            data = _gunzip(data, what)
        if len(data) > FILE_MAX:
            raise self.err(0, "%d bytes, more than the limit of %d", len(data), FILE_MAX)
        entries, self.pattern, pattern_line = [], None, 0   # entries: (id, bytes, line, special)
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        if not lines:
            raise self.err(0, "empty file")
        in_header = True
        for no, s in enumerate(lines, 1):
            if s.endswith(b"\r"):
                s = s[:-1]
            if b"\0" in s:
                raise self.err(no, "a NUL byte")
            if len(s) > PATTERN_MAX + 64:
                raise self.err(no, "a line of %d bytes", len(s))
            if len(entries) >= VOCAB_MAX + SPECIALS_MAX:
                raise self.err(no, "more than %d lines", len(entries))
            if not s:
                continue
            if s[:1] == b"#":
                if named:
                    raise self.err(no, "a '#' line in a plain .tiktoken file")
                if not in_header:
                    raise self.err(no, "a '#' line after the first rank line (the header comes first)")
                if no == 1:
                    if s != HEADER:
                        raise self.err(no, "the first '#' line must be '%s'", HEADER.decode())
                elif s.startswith(b"#pattern ") and len(s) > 9:
                    if self.pattern is not None:
                        raise self.err(no, "a second #pattern line (the first is line %d)", pattern_line)
                    if len(s) - 9 > PATTERN_MAX:
                        raise self.err(no, "pattern of %d bytes (limit %d)", len(s) - 9, PATTERN_MAX)
                    self.pattern, pattern_line = s[9:], no
                elif s.startswith(b"#special ") and len(s) > 9:
                    entries.append(self._special(s[9:], no) + (no, True))
                else:
                    raise self.err(no, "unknown header line (expected #pattern or #special)")
                continue
            if no == 1 and not named:
                raise self.err(no, "no '%s' line: not a tokenizer file of ours", HEADER.decode())
            in_header = False
            entries.append(self._rank(s, no) + (no, False))
        if named:
            self.pattern = PATTERNS[named].encode()
            entries += [(tid, text.encode(), 0, True) for text, tid in NAMED[named][1]]
        if self.pattern is None:
            raise self.err(0, "no #pattern line")
        self._assemble(entries)
        self._check_pattern(pattern_line)
        self._regex = None

    def err(self, line, fmt, *args):
        where = "%s:%d: " % (self.what, line) if line > 0 else "%s: " % self.what
        return CheckpointError(where + fmt % args)

    def _special(self, s, no):
        sp = s.find(b" ")
        tid = _parse_id(s[:sp]) if sp >= 0 else -1
        if tid < 0:
            raise self.err(no, "expected '#special <id> <text>' with an id in [0, %d)", VOCAB_MAX)
        text = s[sp + 1:]
        if not 1 <= len(text) <= TOKEN_MAX:
            raise self.err(no, "special token text of %d bytes (1 to %d)", len(text), TOKEN_MAX)
        if b"\r" in text:
            raise self.err(no, "special token text holds a carriage return")
        return tid, text

    def _rank(self, s, no):
        sp = s.find(b" ")
        if sp < 0:
            raise self.err(no, "expected '<base64 token> <rank>'")
        b64, rest = s[:sp], s[sp + 1:]
        if len(b64) > (TOKEN_MAX + 2) // 3 * 4:
            raise self.err(no, "token of more than %d bytes", TOKEN_MAX)
        try:
            tok = base64.b64decode(b64, validate=True) if b64 else None
        except (binascii.Error, ValueError):
            tok = None
        if tok is None or base64.b64encode(tok) != b64:   # canonical: padded, the unused bits zero
            raise self.err(no, "token '%s' is not canonical base64", b64[:64].decode("latin-1"))
        if len(tok) > TOKEN_MAX:
            raise self.err(no, "token of %d bytes (limit %d)", len(tok), TOKEN_MAX)
        tid = _parse_id(rest)
        if tid < 0:
            raise self.err(no, "rank '%s' is not a number in [0, %d)", rest[:16].decode("latin-1"), VOCAB_MAX)
        return tid, tok

    def _assemble(self, entries):
        line_of, self.tokens, self.specials, self.ranks = {}, {}, {}, {}
        special_line = {}
        for tid, tok, no, special in entries:
            if tid in line_of:
                raise self.err(no, "id %d is taken already (line %d)", tid, line_of[tid])
            line_of[tid] = no
            self.tokens[tid] = tok
            if special:
                if len(self.specials) == SPECIALS_MAX:
                    raise self.err(no, "more than %d special tokens", SPECIALS_MAX)
                if tok in special_line:
                    raise self.err(no, "special token '%s' repeats line %d", tok.decode("utf-8", "replace"),
                                   special_line[tok])
                special_line[tok] = no
                self.specials[tid] = tok
            else:
                if tok in self.ranks:
                    first = self.ranks[tok]
                    raise self.err(no, "rank %d has the same bytes as rank %d (line %d)", tid, first, line_of[first])
                self.ranks[tok] = tid
        if not self.ranks:
            raise self.err(0, "no rank lines")
        for c in range(256):
            if bytes([c]) not in self.ranks:
                raise self.err(0, "byte 0x%02x has no rank (every single byte needs one, or some texts could not be "
                               "encoded)", c)
        n_ranks, last = len(self.ranks), max(self.ranks.values())
        if last != n_ranks - 1:
            hole = next(i for i in range(n_ranks) if i not in self.tokens or i in self.specials)
            raise self.err(line_of[last], "rank %d, but no token has id %d: ranks must be 0 to %d with none missing",
                           last, hole, n_ranks - 1)
        for tid in sorted(self.specials):
            if tid >= n_ranks + SPECIALS_MAX:
                raise self.err(line_of[tid], "special token id %d: more than %d ids after the last rank (%d)", tid,
                               SPECIALS_MAX, n_ranks - 1)
        self.n_ranks, self.vocab = n_ranks, max(self.tokens) + 1

    def _check_pattern(self, line):
        try:
            pattern = self.pattern.decode("utf-8")
        except UnicodeDecodeError:
            pattern = None
        if pattern not in PATTERNS.values():
            raise self.err(line, "split pattern: not one of the known patterns (gpt2 = r50k_base, cl100k_base, "
                           "o200k_base, \\S+|\\s+; byte for byte): a pattern from a file could take time "
                           "exponential in the text (ReDoS), so no other is accepted")
        self.pattern = pattern

    # ------------------------------------------------------------ use

    def decode(self, ids):
        """The bytes of ids (a rank's bytes, a special's text); ValueError naming an id that is no token."""
        parts = []
        for i, tid in enumerate(ids):
            tok = self.tokens.get(tid) if isinstance(tid, int) else None
            if tok is None:
                raise ValueError("%s: id %r (position %d) is no token of this tokenizer (%d ids)"
                                 % (self.what, tid, i, self.vocab))
            parts.append(tok)
        return b"".join(parts)

    def pieces(self, data):
        """The split of bytes `data` into pieces that tile it (needs the regex module)."""
        if self._regex is None:
            try:
                import regex
            except ImportError:
                raise RuntimeError("encoding text with a BPE tokenizer needs the Python module regex (Debian: "
                                   "python3-regex); or encode with bin/tokenize encode and pass --ids") from None
            self._regex = regex.compile(translate(self.pattern))
        text = data.decode("utf-8", "surrogateescape")   # a byte of no character: U+DC80..U+DCFF
        start, n = 0, len(text)
        while start < n:
            bad = "\udc80" <= text[start] <= "\udcff"
            end = start + 1
            while end < n and ("\udc80" <= text[end] <= "\udcff") == bad:
                end += 1
            seg = text[start:end]
            if bad:
                yield seg.encode("utf-8", "surrogateescape")
            else:
                for m in self._regex.finditer(seg):
                    yield m.group().encode("utf-8")
            start = end

    def merge(self, piece):
        """tiktoken's merging of one piece (the adjacent pair of the lowest rank first, the leftmost on a tie):
        the ids of its parts. A heap of the pairs keeps a long piece (a run of spaces) at n log n, not n^2."""
        tid = self.ranks.get(piece)
        if tid is not None:
            return [tid]
        n = len(piece)
        nxt = list(range(1, n + 1))            # part starting at i ends at nxt[i]; prev[i]: the part before
        prev = list(range(-1, n - 1))
        alive = [True] * n
        heap = []

        def push(i):   # the pair of the parts starting at i and at nxt[i], if it is a rank
            j = nxt[i]
            if j < n:
                r = self.ranks.get(piece[i:nxt[j]])
                if r is not None:
                    heap.append((r, i, j, nxt[j]))
        for i in range(n - 1):
            push(i)
        heapq.heapify(heap)
        while heap:
            r, i, j, end = heapq.heappop(heap)
            if not (alive[i] and alive[j] and nxt[i] == j and nxt[j] == end):
                continue   # stale: a part of this pair was merged since
            alive[j] = False
            nxt[i] = end
            if end < n:
                prev[end] = i
            for k in (prev[i], i):
                if k >= 0 and nxt[k] < n:
                    r2 = self.ranks.get(piece[k:nxt[nxt[k]]])
                    if r2 is not None:
                        heapq.heappush(heap, (r2, k, nxt[k], nxt[nxt[k]]))
        out, i = [], 0
        while i < n:
            out.append(self.ranks[piece[i:nxt[i]]])
            i = nxt[i]
        return out

    def encode(self, data):
        """The ids of bytes `data` (a special's text is ordinary text)."""
        ids = []
        for p in self.pieces(data):
            ids.extend(self.merge(p))
        return ids


class _TokenizerFile(CheckedFile):
    """A tokenizer file's bytes: a regular file of at most FILE_MAX bytes."""

    def __init__(self, path):
        super().__init__(path, "tokenizer file")

    def opened(self):
        if self.size > FILE_MAX:
            raise self.err("%d bytes, more than the limit of %d", self.size, FILE_MAX)
        self.data = pread_exact(self.fd, self.size, 0)


def load_file(path):
    """The tokenizer file at `path` (gzip or not)."""
    with _TokenizerFile(path) as f:
        return Tokenizer(f.data, path)


def from_name(name, bpe_dir):
    """A tiktoken encoding by name (gpt2, r50k_base, cl100k_base, o200k_base) from its rank file in bpe_dir
    (the project's data/bpe)."""
    if name not in NAMED:
        raise CheckpointError("'%s': not a tiktoken encoding name (%s)" % (name, ", ".join(NAMED)))
    path = os.path.join(bpe_dir, NAMED[name][0] + ".tiktoken.gz")
    with _TokenizerFile(path) as f:
        return Tokenizer(f.data, path, named=name)


def beside(model_path):
    """tokenizer.bpe in the folder of `model_path` (an export), or None if there is none."""
    path = os.path.join(os.path.dirname(model_path) or ".", "tokenizer.bpe")
    return load_file(path) if os.path.lexists(path) else None
