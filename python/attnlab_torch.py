"""Load an attnlab model into PyTorch: a checkpoint as `train` writes it (HDF5)
or a safetensors file as `export_model` writes it, into the independent
PyTorch implementation of the spec (attnlab_model.LM, docs/MODEL.md).

    import sys; sys.path.insert(0, "python")        # from the project folder
    import torch, attnlab_torch
    lm = attnlab_torch.load("runs/tiny_gdn/checkpoint.h5")     # or "model.safetensors"
    tokens = torch.tensor([list(b"In the beginning")])         # the byte tokenizer
    logits = lm.forward(tokens)                                # (1, T, 256), float32

The config comes from the file itself (a checkpoint's /config, or the
safetensors metadata "attnlab_config"). Files are read as hostile input, with
the C loader's checks and messages (docs/checkpoint.md): the config's values
in the C programs' bounds, every parameter's shape checked against the config
before anything is allocated, checksums verified, every value finite; a file
refused raises CheckpointError (a ValueError) that names the file and what is
wrong. HDF5 needs h5py (Debian's python3-h5py), which runs only in a child
process under memory and CPU limits (attnlab_checkpoint.py); safetensors is
read with the standard library and torch alone (attnlab_safetensors.py).

Mixers: attn, linear, mamba, gdn, gdp (attn_dsa is not in the reference: loading a
model with it raises ValueError). form "chunked" (fast) or "recurrent" (the
spec's token-by-token reference).

As a program: attnlab_torch.py FILE [--text TEXT] prints the model and the
most likely next bytes; --logits-npy OUT writes the logits of TEXT.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attnlab_model import LM, param_shapes  # noqa: E402
from attnlab_config import VOCAB_MAX, ConfigError, model_config  # noqa: E402
from attnlab_checkpoint import (CheckpointError, open_checkpoint, open_regular, pread_exact,  # noqa: E402
                                read_config, read_params, vocab_rows)
from attnlab_safetensors import SafetensorsFile  # noqa: E402

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


def read_checkpoint(path):
    """(ModelConfig, tensors: name -> torch tensor) of an HDF5 checkpoint, every check of the C loader passed."""
    with open_checkpoint(path) as h:
        text = read_config(h)
        # The vocabulary: 256 bytes unless the checkpoint carries a tokenizer (then the embedding's rows).
        cfg, shapes = checked_config(path, text, vocab_rows(h) if h.exists("/tokenizer") else BYTE_VOCAB)
        arrays = read_params(h, shapes)
    return cfg, {name: torch.from_numpy(a) for name, a in arrays.items()}


def read_safetensors(path):
    """(ModelConfig, tensors: name -> torch tensor) of a safetensors export, checked before anything is read."""
    with SafetensorsFile(path) as st:
        text = st.format_and_config()
        embed = st.tensors.get("embed")
        cfg, shapes = checked_config(path, text, embed[1][0] if embed and len(embed[1]) == 2 else None)
        st.check_shapes(shapes)
        return cfg, {name: st.read(name) for name in shapes}


def load(path, dtype=torch.float32, form="chunked"):
    """The model in `path` (an HDF5 checkpoint or a safetensors export) as attnlab_model.LM.

    A file refused raises CheckpointError (a ValueError) whose message names the file and what is wrong."""
    fd = open_regular(path, "model file")
    try:
        magic = pread_exact(fd, 8, 0)
    finally:
        os.close(fd)
    cfg, tensors = read_checkpoint(path) if magic == HDF5_MAGIC else read_safetensors(path)
    lm = LM(cfg, dtype=dtype, form=form)
    lm.load(tensors)
    for p in lm.params.values():
        p.requires_grad_(False)
    return lm


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description="Load an attnlab checkpoint or safetensors export into PyTorch.")
    ap.add_argument("file")
    ap.add_argument("--text", default="In the beginning", help="text to run (the byte tokenizer)")
    ap.add_argument("--text-file", help="read the text from this file instead")
    ap.add_argument("--logits-npy", help="write the logits (T, V) of the text here")
    ap.add_argument("--float64", action="store_true", help="run in float64")
    a = ap.parse_args(argv)
    try:
        lm = load(a.file, dtype=torch.float64 if a.float64 else torch.float32)
    except (CheckpointError, ValueError) as e:
        sys.exit(str(e))
    text = open(a.text_file, "rb").read() if a.text_file else a.text.encode("utf-8")
    if lm.cfg.vocab_size != 256:
        sys.exit("%s: a BPE model: encode the text with bin/tokenize encode and pass ids to lm.forward" % a.file)
    tokens = torch.tensor([list(text)], dtype=torch.long)
    with torch.no_grad():
        logits = lm.forward(tokens)[0]
    print("%s: layers %s, d_model %d, %d parameters" % (a.file, ",".join(lm.cfg.layers), lm.cfg.d_model,
                                                        sum(p.numel() for p in lm.params.values())))
    top = torch.topk(logits[-1], 5).indices.tolist()
    print("after %r the most likely next bytes: %s" % (text[-40:].decode("utf-8", "replace"),
                                                      ", ".join(repr(chr(b)) for b in top)))
    if a.logits_npy:
        import numpy as np
        np.save(a.logits_npy, logits.float().numpy())


if __name__ == "__main__":
    main(sys.argv[1:])
