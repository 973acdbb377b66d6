"""A BPE model's tokenizer in Python (python/attnlab_tokenizer.py): tiktoken's
merging (the lowest rank first, the leftmost on a tie), the split at bytes
that are not UTF-8, and hostile tokenizer files refused with "FILE:LINE:
what is wrong", as data/bpe_load.c refuses them; the loader finds the
tokenizer in a checkpoint's /tokenizer and beside an export, and its program
prints a sentence, never a traceback. (Ids equal bin/tokenize encode's on a
multilingual text: tests/test_outside.sh.)

    /usr/bin/python3 tests/python/test_loader_tokenizer.py      (tests/test_tools.sh runs it)
"""

import gzip
import os
import random
import subprocess
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loader_files as L  # noqa: E402
import attnlab_tokenizer as T  # noqa: E402
import attnlab_torch  # noqa: E402
from attnlab_checkpoint import CheckpointError  # noqa: E402
from test_loader_hdf5 import LoaderTest  # noqa: E402

TORCH_PY = os.path.join(L.ROOT, "python", "attnlab_torch.py")


rank_line, tok_bytes = L.rank_line, L.tok_bytes


class Tokenizer(LoaderTest):
    def write(self, data, name="tokenizer.bpe"):
        with open(self.path(name), "wb") as f:
            f.write(data)
        return self.path(name)

    def refused_tok(self, data, want):
        path = self.write(data)
        with self.assertRaises(CheckpointError) as cm:
            T.load_file(path)
        self.assertEqual(str(cm.exception), path + want)

    def test_lowest_rank_merges_first_leftmost_on_a_tie(self):
        t = T.load_file(self.write(tok_bytes()))
        self.assertEqual((t.vocab, t.n_ranks, t.specials), (260, 259, {259: b"<|end|>"}))
        # bc (256) before ab (257): a|bc, not ab|c; aa (258) on aaa: the leftmost pair.
        self.assertEqual(t.encode(b"abc"), [97, 256])
        self.assertEqual(t.encode(b"aaa"), [258, 97])
        self.assertEqual(t.encode(b"ab abc"), [257, 32, 97, 256])
        # A special's text is ordinary text; decoding gives it back.
        self.assertEqual(t.encode(b"<|end|>"), list(b"<|end|>"))
        self.assertEqual(t.decode([257, 259, 32]), b"ab<|end|> ")

    def test_merging_equals_tiktoken_s_scan_on_random_pieces(self):
        # The loader merges through a heap; tiktoken scans every pair for the lowest rank, leftmost on a tie.
        def scan(t, piece):
            parts = [piece[i:i + 1] for i in range(len(piece))]
            while True:
                ranks = [t.ranks.get(parts[i] + parts[i + 1]) for i in range(len(parts) - 1)]
                best = min((r, i) for i, r in enumerate(ranks) if r is not None) if any(
                    r is not None for r in ranks) else None
                if best is None:
                    return [t.ranks[p] for p in parts]
                i = best[1]
                parts[i:i + 2] = [parts[i] + parts[i + 1]]
        merges = [b"bc", b"ab", b"aa", b"aaa", b"abc", b"aab", b"ca", b"aaaa", b"bcab", b"cc", b"ccc"]
        t = T.load_file(self.write(tok_bytes(merges=merges, specials=())))
        r = random.Random(7)
        for _ in range(2000):
            piece = bytes(r.choice(b"abc") for _ in range(r.randint(1, 30)))
            self.assertEqual(t.merge(piece), scan(t, piece), piece)

    def test_bytes_that_are_not_utf8_are_pieces_of_their_own(self):
        t = T.load_file(self.write(tok_bytes()))
        text = b"ab\xff\xfeab \xc3\xa9\xe2\x82"
        self.assertEqual(list(t.pieces(text)), [b"ab", b"\xff\xfe", b"ab", b" ", b"\xc3\xa9", b"\xe2\x82"])
        self.assertEqual(t.decode(t.encode(text)), text)

    def test_decode_names_an_id_that_is_no_token(self):
        path = self.write(tok_bytes())
        t = T.load_file(path)
        with self.assertRaises(ValueError) as cm:
            t.decode([97, 4000])
        self.assertEqual(str(cm.exception), path + ": id 4000 (position 1) is no token of this tokenizer (260 ids)")

    def test_a_gzip_file_loads(self):
        self.assertEqual(T.load_file(self.write(gzip.compress(tok_bytes()), "t.bpe.gz")).vocab, 260)

    def test_hostile_files_refused_with_file_and_line(self):
        cases = [
            (b"", ": empty file"),
            (tok_bytes(header=b"#attnlab-bpe 2"), ":1: the first '#' line must be '#attnlab-bpe 1'"),
            (tok_bytes()[15:], ":1: the first '#' line must be '#attnlab-bpe 1'"),
            (tok_bytes().replace(b"#pattern", b"#patern"), ":2: unknown header line (expected #pattern or #special)"),
            (tok_bytes(pattern="(a|a)*c"), ":2: split pattern: not one of the known patterns (gpt2 = r50k_base, "
             "cl100k_base, o200k_base, \\S+|\\s+; byte for byte): a pattern from a file could take time exponential "
             "in the text (ReDoS), so no other is accepted"),
            (tok_bytes() + b"#special 300 x\n", ":263: a '#' line after the first rank line (the header comes first)"),
            (tok_bytes(specials=((259, "a"), (260, "a"))), ":4: special token 'a' repeats line 3"),
            (tok_bytes(specials=((2000, "x"),)), ":3: special token id 2000: more than 1024 ids after the last rank "
             "(258)"),
            (tok_bytes(specials=((97, "x"),)), ":101: id 97 is taken already (line 3)"),
            (tok_bytes(merges=(b"ab", b"ab")), ":261: rank 257 has the same bytes as rank 256 (line 260)"),
            (tok_bytes(skip_byte=7), ": byte 0x07 has no rank (every single byte needs one, or some texts could "
             "not be encoded)"),
            (tok_bytes() + rank_line(b"xyz", 5000) + b"\n", ":263: rank 5000, but no token has id 259: ranks must "
             "be 0 to 259 with none missing"),
            (tok_bytes() + b"YWI= 9999999\n", ":263: rank '9999999' is not a number in [0, 4194304)"),
            (tok_bytes() + b"YWJ= 300\n", ":263: token 'YWJ=' is not canonical base64"),
            (tok_bytes() + b"YWI=\n", ":263: expected '<base64 token> <rank>'"),
            (tok_bytes() + b"YW\0= 300\n", ":263: a NUL byte"),
            (tok_bytes() + b"A" * 5000 + b"\n", ":263: a line of 5000 bytes"),
            (b"#attnlab-bpe 1\n#special 3\n", ":2: expected '#special <id> <text>' with an id in [0, 4194304)"),
            (b"#attnlab-bpe 1\n" + rank_line(b"a", 0) + b"\n", ": no #pattern line"),
            (gzip.compress(gzip.compress(tok_bytes())), ": gzip inside gzip"),
            (gzip.compress(tok_bytes())[:-9], ": corrupt or truncated gzip data (zlib: unexpected end)"),
        ]
        for data, want in cases:
            with self.subTest(want):
                self.refused_tok(data, want)

    def test_the_repository_fixtures(self):
        for name, want in (("redos_pattern.tok", ":2: split pattern: not one of the known patterns"),
                           ("nested_quantifier_pattern.tok", ":2: split pattern: not one of the known patterns"),
                           ("sparse_ids_hole.tok", ":259: rank 1000, but no token has id 256"),
                           ("huge_rank_4194303.tok", ":303: rank 4194303, but no token has id 300")):
            with self.subTest(name):
                path = os.path.join(L.HOSTILE, name)
                with self.assertRaises(CheckpointError) as cm:
                    T.load_file(path)
                self.assertTrue(str(cm.exception).startswith(path + want), str(cm.exception))

    def test_a_directory_or_fifo_is_refused(self):
        os.mkdir(self.path("d"))
        with self.assertRaises(CheckpointError) as cm:
            T.load_file(self.path("d"))
        self.assertEqual(str(cm.exception), self.path("d") + ": the tokenizer file is a directory, not a regular file")


class LoaderWithTokenizer(LoaderTest):
    def bpe_export(self, tok=None, vocab=260):
        """An export of a model of `vocab` ids with `tok` (default tok_bytes()) as its tokenizer.bpe."""
        path = L.write_safetensors(self.path("m.safetensors"), L.model_params(vocab=vocab))
        with open(self.path("tokenizer.bpe"), "wb") as f:
            f.write(tok_bytes() if tok is None else tok)
        return path

    def test_an_export_loads_its_tokenizer(self):
        lm = attnlab_torch.load(self.bpe_export())
        self.assertEqual(lm.tokenizer.vocab, 260)
        self.assertEqual(attnlab_torch.encode(lm, b"abc"), [97, 256])
        self.assertEqual(attnlab_torch.decode(lm, [259, 257]), b"<|end|>ab")

    def test_an_export_without_its_tokenizer_or_with_another(self):
        path = self.bpe_export()
        os.remove(self.path("tokenizer.bpe"))
        self.refused(path, "a model of 260 ids and no tokenizer.bpe beside it (export_model writes one there; copy "
                           "it with the model)")
        self.bpe_export(tok=tok_bytes(specials=()))
        with self.assertRaises(CheckpointError) as cm:
            attnlab_torch.load(path)
        self.assertEqual(str(cm.exception), self.path("tokenizer.bpe") + ": 259 ids, but the model's embedding has "
                         "260 rows (the tokenizer of another model?)")
        self.bpe_export(tok=tok_bytes(pattern="(a+)+$"))
        with self.assertRaises(CheckpointError) as cm:
            attnlab_torch.load(path)
        self.assertTrue(str(cm.exception).startswith(self.path("tokenizer.bpe") + ":2: split pattern: not one"))

    def checkpoint(self, tok, vocab=260):
        def add(f, params):
            L.put(f, "tokenizer", np.frombuffer(tok, dtype="u1"))
        return L.write_checkpoint(self.path("c.h5"), L.model_params(vocab=vocab), edit=add)

    def test_a_checkpoint_loads_its_tokenizer(self):
        lm = attnlab_torch.load(self.checkpoint(tok_bytes()))
        self.assertEqual((lm.cfg.vocab_size, lm.tokenizer.vocab), (260, 260))
        self.assertEqual(attnlab_torch.decode(lm, attnlab_torch.encode(lm, b"aaa bc")), b"aaa bc")

    def test_a_checkpoint_with_a_hostile_tokenizer(self):
        path = self.checkpoint(tok_bytes(pattern="(a|a)*c"))
        self.refused_like(path, "/tokenizer:2: split pattern: not one of the known patterns")
        path = self.checkpoint(tok_bytes(specials=()))   # 259 ids, the embedding 260 rows
        self.refused(path, "/params/embed: shape (260, 16) in the file, (259, 16) in the model")

    def run_program(self, *args):
        r = subprocess.run([sys.executable, TORCH_PY] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, timeout=300)
        return r.returncode, r.stdout.decode(), r.stderr.decode()

    def test_the_program_reads_ids_and_refuses_bad_ones_with_a_sentence(self):
        path = self.bpe_export()
        ids = self.path("ids.txt")
        with open(ids, "w") as f:
            f.write("97 256 259\n")
        code, out, err = self.run_program(path, "--ids", ids, "--generate", "3")
        self.assertEqual(code, 0, err)
        self.assertIn("tokenizer %s (260 ids)" % self.path("tokenizer.bpe"), out)
        self.assertIn("after 'abc<|end|>' the greedy continuation: ", out)
        for text, want in (("97 260\n", "id 2 is '260', not a whole number in [0, 260) (the model's ids)"),
                           ("97 -1", "id 2 is '-1', not a whole number in [0, 260) (the model's ids)"),
                           ("", "no ids (bin/tokenize encode writes them, decimal, space-separated)")):
            with open(ids, "w") as f:
                f.write(text)
            code, out, err = self.run_program(path, "--ids", ids)
            self.assertEqual((code, err.strip()), (1, ids + ": " + want))
        os.mkfifo(self.path("fifo"))
        for args, want in ((("--text-file", self.path("fifo")), self.path("fifo") + ": the text file is a FIFO "
                            "(named pipe), not a regular file"), (("--text", ""), "--text: the text is empty: nothing "
                                                                  "to run")):
            code, out, err = self.run_program(path, *args)
            self.assertEqual((code, err.strip()), (1, want))
        with open(self.path("tokenizer.bpe"), "ab") as f:
            f.write(b"#special 300 x\n")
        code, out, err = self.run_program(path, "--text", "abc")
        self.assertEqual(code, 1)
        self.assertNotIn("Traceback", err)
        self.assertEqual(err.strip(), self.path("tokenizer.bpe") + ":263: a '#' line after the first rank line "
                         "(the header comes first)")


if __name__ == "__main__":
    unittest.main()
