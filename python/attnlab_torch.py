"""Load an attnlab model into PyTorch: a checkpoint as `train` writes it (HDF5)
or a safetensors file as `export_model` writes it, into the independent
PyTorch implementation of the spec (attnlab_model.LM, docs/MODEL.md).

    import sys; sys.path.insert(0, "python")        # from the project folder
    import torch, attnlab_torch
    lm = attnlab_torch.load("runs/tiny_gdn/checkpoint.h5")     # or "model.safetensors"
    ids = attnlab_torch.encode(lm, b"In the beginning")        # bytes, or a BPE model's ids
    logits = lm.forward(torch.tensor([ids]))                   # (1, T, vocab), float32
    attnlab_torch.decode(lm, ids)                              # back to bytes

The config comes from the file itself (a checkpoint's /config, or the
safetensors metadata "attnlab_config"), and a BPE model's tokenizer from the
checkpoint's /tokenizer or the tokenizer.bpe export_model writes beside the
safetensors file (lm.tokenizer: attnlab_tokenizer.Tokenizer; None for the
byte tokenizer). Files are read as hostile input, with the C loader's checks
and messages (docs/checkpoint.md): the config's values in the C programs'
bounds, every parameter's shape checked against the config before anything
is allocated, checksums verified, every value finite, the tokenizer file
checked as data/bpe_load.c checks it; a file refused raises CheckpointError
(a ValueError) that names the file and what is wrong. HDF5 needs h5py
(Debian's python3-h5py), which runs only in a child process under memory and
CPU limits (attnlab_checkpoint.py); safetensors is read with the standard
library and torch alone (attnlab_safetensors.py). Encoding text for a BPE
model needs the regex module (Debian's python3-regex); decoding does not.

Mixers: attn, linear, mamba, gdn, mamba2, gdp, kda (attn_dsa is not in the
reference: loading a model with it raises CheckpointError). form "chunked"
(fast) or "recurrent" (the spec's token-by-token reference).

As a program: attnlab_torch.py FILE [--text TEXT | --text-file F | --ids F]
prints the model and its greedy continuation of the text, decoded;
--logits-npy OUT writes the logits of the text.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attnlab_model import LM, param_shapes  # noqa: E402
from attnlab_config import VOCAB_MAX, ConfigError, model_config  # noqa: E402
from attnlab_checkpoint import (CheckpointError, open_checkpoint, open_regular, pread_exact,  # noqa: E402
                                read_config, read_params)
from attnlab_safetensors import SafetensorsFile  # noqa: E402
import attnlab_tokenizer  # noqa: E402

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
BYTE_VOCAB = 256


def checked_config(path, text, rows):
    """(ModelConfig, its parameters' shapes) of a file's config text; `rows` (the embedding's rows in the
    file) is the vocabulary."""
    if rows is None:
        raise CheckpointError("%s: no 'embed' parameter of two dimensions (not an attnlab model?)" % path)
    if not 1 <= rows <= VOCAB_MAX:
        raise CheckpointError("%s: embed: %d rows, a vocabulary has 1 to %d ids" % (path, rows, VOCAB_MAX))
    try:
        cfg = model_config(text, path, rows)
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    try:
        return cfg, param_shapes(cfg)
    except ValueError as e:   # a mixer the C programs know and this reference does not (attn_dsa)
        raise CheckpointError("%s: %s" % (path, e)) from None


def read_tokenizer(h):
    """The checkpoint's /tokenizer (a tokenizer file's bytes), checked as the C loader checks it."""
    d = h.check("/tokenizer", ["uint8"], 1, None, attnlab_tokenizer.FILE_MAX)
    return attnlab_tokenizer.Tokenizer(h.read("/tokenizer", d), "%s: /tokenizer" % h.path)


def read_checkpoint(path):
    """(ModelConfig, tensors: name -> torch tensor, tokenizer or None) of an HDF5 checkpoint, every check of
    the C loader passed."""
    with open_checkpoint(path) as h:
        text = read_config(h)
        # The vocabulary: 256 bytes unless the checkpoint carries a tokenizer (then its ids, which the
        # embedding's rows must equal, as in the C loader).
        tok = read_tokenizer(h) if h.exists("/tokenizer") else None
        cfg, shapes = checked_config(path, text, tok.vocab if tok else BYTE_VOCAB)
        arrays = read_params(h, shapes)
    return cfg, {name: torch.from_numpy(a) for name, a in arrays.items()}, tok


def read_safetensors(path):
    """(ModelConfig, tensors: name -> torch tensor, tokenizer or None) of a safetensors export, checked before
    anything is read; the tokenizer is the tokenizer.bpe beside it, if there is one."""
    with SafetensorsFile(path) as st:
        text = st.format_and_config()
        embed = st.tensors.get("embed")
        rows = embed[1][0] if embed and len(embed[1]) == 2 else None
        cfg, shapes = checked_config(path, text, rows)
        st.check_shapes(shapes)
        tok = attnlab_tokenizer.beside(path)
        if tok is None and rows != BYTE_VOCAB:
            raise CheckpointError("%s: a model of %d ids and no tokenizer.bpe beside it (export_model writes one "
                                  "there; copy it with the model)" % (path, rows))
        if tok is not None and tok.vocab != rows:
            raise CheckpointError("%s: %d ids, but the model's embedding has %d rows (the tokenizer of another "
                                  "model?)" % (tok.what, tok.vocab, rows))
        return cfg, {name: st.read(name) for name in shapes}, tok


def load(path, dtype=torch.float32, form="chunked"):
    """The model in `path` (an HDF5 checkpoint or a safetensors export) as attnlab_model.LM.

    A file refused raises CheckpointError (a ValueError) whose message names the file and what is wrong."""
    fd = open_regular(path, "model file")
    try:
        magic = pread_exact(fd, 8, 0)
    finally:
        os.close(fd)
    cfg, tensors, tok = read_checkpoint(path) if magic == HDF5_MAGIC else read_safetensors(path)
    lm = LM(cfg, dtype=dtype, form=form)
    lm.load(tensors)
    lm.tokenizer = tok
    for p in lm.params.values():
        p.requires_grad_(False)
    return lm


def encode(lm, data):
    """The ids of bytes `data` for the model: its bytes, or its BPE tokenizer's ids (needs the regex module)."""
    return lm.tokenizer.encode(data) if lm.tokenizer else list(data)


def decode(lm, ids):
    """The bytes of ids of the model (a BPE token's bytes, a special's text)."""
    return lm.tokenizer.decode(ids) if lm.tokenizer else bytes(ids)


INPUT_MAX = 64 << 20   # bytes of an --ids or --text-file file
GENERATE_MAX = 4096


def read_input(path, what):
    """The bytes of a regular file of at most INPUT_MAX bytes (a FIFO or a folder refused with what it is)."""
    fd = open_regular(path, what)
    try:
        size = os.fstat(fd).st_size
        if size > INPUT_MAX:
            raise CheckpointError("%s: %d bytes, more than the %d a %s may have" % (path, size, INPUT_MAX, what))
        return pread_exact(fd, size, 0)
    finally:
        os.close(fd)


def read_ids(path, vocab):
    """Ids as bin/tokenize encode writes them (decimal, separated by white space), each below vocab."""
    words = read_input(path, "ids file").split()
    ids = []
    for i, w in enumerate(words):
        if not (w.isdigit() and len(w) <= 8 and int(w) < vocab):
            raise CheckpointError("%s: id %d is '%s', not a whole number in [0, %d) (the model's ids)"
                                  % (path, i + 1, w[:20].decode("latin-1"), vocab))
        ids.append(int(w))
    if not ids:
        raise CheckpointError("%s: no ids (bin/tokenize encode writes them, decimal, space-separated)" % path)
    return ids


def greedy(lm, ids, n):
    """n more ids, each the most likely after those before it."""
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(lm.forward(torch.tensor([ids]))[0, -1].argmax()))
    return ids


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description="Load an attnlab checkpoint or safetensors export into PyTorch.")
    ap.add_argument("file")
    ap.add_argument("--text", default="In the beginning", help="text to run (encoded with the model's tokenizer)")
    ap.add_argument("--text-file", help="read the text from this file instead")
    ap.add_argument("--ids", help="run these ids instead (as bin/tokenize encode writes them)")
    ap.add_argument("--generate", type=int, default=16, help="ids of greedy continuation to print (default 16)")
    ap.add_argument("--logits-npy", help="write the logits (T, V) of the text here")
    ap.add_argument("--float64", action="store_true", help="run in float64")
    a = ap.parse_args(argv)
    if not 0 <= a.generate <= GENERATE_MAX:
        sys.exit("--generate %d: 0 to %d" % (a.generate, GENERATE_MAX))
    try:
        lm = load(a.file, dtype=torch.float64 if a.float64 else torch.float32)
        if a.ids:
            ids = read_ids(a.ids, lm.cfg.vocab_size)
        else:
            ids = encode(lm, read_input(a.text_file, "text file") if a.text_file else a.text.encode("utf-8"))
    except (CheckpointError, ValueError, RuntimeError) as e:
        sys.exit(str(e))
    if not ids:
        sys.exit("%s: the text is empty: nothing to run" % (a.text_file or "--text"))
    print("%s: layers %s, d_model %d, %d parameters, %s" % (
        a.file, ",".join(lm.cfg.layers), lm.cfg.d_model, sum(p.numel() for p in lm.params.values()),
        "tokenizer %s (%d ids)" % (lm.tokenizer.what, lm.tokenizer.vocab) if lm.tokenizer else "bytes"))
    if a.logits_npy:
        import numpy as np
        with torch.no_grad():
            np.save(a.logits_npy, lm.forward(torch.tensor([ids]))[0].float().numpy())
    more = greedy(lm, ids, a.generate)[len(ids):]
    print("after %r the greedy continuation: %r" % (decode(lm, ids)[-40:].decode("utf-8", "replace"),
                                                   decode(lm, more).decode("utf-8", "replace")))


if __name__ == "__main__":
    main(sys.argv[1:])
