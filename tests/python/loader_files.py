"""Files for the PyTorch loader's tests: a small model's checkpoint (HDF5, as
train writes it, docs/checkpoint.md) and export (safetensors, as export_model
writes it, docs/export.md), written here with h5py and the standard library so
that each test can change one thing about them."""

import base64
import json
import os
import struct
import sys
import zlib

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import attnlab_model  # noqa: E402

HOSTILE = os.path.join(ROOT, "tests", "fixtures", "hostile")

CONFIG = """[model]
layers = attn,linear,mamba,gdn
d_model = 16
n_heads = 2
d_k = 8
d_v = 8
d_ff = 32
chunk_size = 4

[data]
seq_len = 16

[train]
steps = 1
"""


def model_params(config=CONFIG, vocab=256, seed=3):
    """name -> float32 numpy array of a fresh model of `config` (the C registration order)."""
    cfg = attnlab_model.model_config_from_ini(config, vocab_size=vocab)
    lm = attnlab_model.LM(cfg, dtype=torch.float32, seed=seed)
    return {name: p.detach().numpy().copy() for name, p in lm.params.items()}


def crc(a):
    return zlib.crc32(np.ascontiguousarray(a).tobytes()) & 0xFFFFFFFF


def put(loc, name, data, crc_value=None, **kw):
    """A dataset with its crc32 attribute (uint32, scalar), as h5io_write makes it."""
    d = loc.create_dataset(name, data=data, **kw)
    d.attrs.create("crc32", crc(data) if crc_value is None else crc_value, dtype="<u4")
    return d


def write_checkpoint(path, params=None, config=CONFIG, version=2, skip=(), edit=None):
    """A checkpoint of `params` (default: model_params()). edit(f, params) may change the open file before
    the params are written; names in `skip` are left for edit to write."""
    import h5py
    params = model_params() if params is None else params
    with h5py.File(path, "w") as f:
        if version is not None:
            put(f, "format_version", np.array([version], dtype="<i4"))
        g = f.create_group("params")
        if edit:
            edit(f, params)
        for name, a in params.items():
            if name not in skip:
                put(g, name, a.astype("<f4"))
        text = config.encode() or b"\0"
        put(f, "config", np.array(text, dtype="S%d" % len(text)))
    return path


def safetensors_bytes(tensors, meta=None, header_edit=None, pad_to=8):
    """A safetensors file of name -> float32 array, laid out as export_model lays it out."""
    meta = {"format": "pt", "attnlab_format": "1", "attnlab_config": CONFIG} if meta is None else meta
    header, body, at = {"__metadata__": meta}, b"", 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        body += raw
        at += len(raw)
    if header_edit:
        header_edit(header)
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    text += b" " * (-(8 + len(text)) % pad_to)
    return struct.pack("<Q", len(text)) + text + body


def write_safetensors(path, tensors=None, **kw):
    with open(path, "wb") as f:
        f.write(safetensors_bytes(model_params() if tensors is None else tensors, **kw))
    return path


def rank_line(tok, rank):
    return base64.b64encode(tok) + b" %d" % rank


def tok_bytes(merges=(b"bc", b"ab", b"aa"), pattern=r"\S+|\s+", specials=((259, "<|end|>"),), header=b"#attnlab-bpe 1",
              skip_byte=None):
    """A tokenizer file: every byte its own rank (id = byte), then `merges` as ranks 256, 257, ..."""
    lines = [header, b"#pattern " + pattern.encode()] + [b"#special %d %s" % (i, t.encode()) for i, t in specials]
    lines += [rank_line(bytes([c]), c) for c in range(256) if c != skip_byte]
    lines += [rank_line(m, 256 + i) for i, m in enumerate(merges)]
    return b"\n".join(lines) + b"\n"
