"""Load an attnlab model into PyTorch: a checkpoint as `train` writes it (HDF5)
or a safetensors file as `export_model` writes it, into the independent
PyTorch implementation of the spec (attnlab_model.LM, docs/MODEL.md).

    import sys; sys.path.insert(0, "python")        # from the project folder
    import torch, attnlab_torch
    lm = attnlab_torch.load("runs/tiny_gdn/checkpoint.h5")     # or "model.safetensors"
    tokens = torch.tensor([list(b"In the beginning")])         # the byte tokenizer
    logits = lm.forward(tokens)                                # (1, T, 256), float32

The config comes from the file itself (a checkpoint's /config, or the
safetensors metadata "attnlab_config"). HDF5 needs h5py (Debian's python3-h5py);
safetensors is read with the standard library and torch alone, following the
format's specification (8-byte little-endian header length, JSON header, raw
little-endian data). Each HDF5 dataset's crc32 attribute is checked.

Mixers: attn, linear, mamba, gdn (attn_dsa is not in the reference: loading a
model with it raises ValueError). form "chunked" (fast) or "recurrent" (the
spec's token-by-token reference).

As a program: attnlab_torch.py FILE [--text TEXT] prints the model and the
most likely next bytes; --logits-npy OUT writes the logits of TEXT.
"""

import json
import os
import struct
import sys
import zlib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attnlab_model import LM, model_config_from_ini  # noqa: E402

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
SAFETENSORS_DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8), "F16": (torch.float16, 2),
                      "BF16": (torch.bfloat16, 2)}


def read_safetensors(path):
    """(tensors: name -> torch tensor, metadata: dict) of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("%s: too short for safetensors" % path)
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError("%s: header length %d runs past the end of the file" % (path, n))
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    body = data[8 + n:]
    tensors = {}
    for name, info in header.items():
        if info["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError("%s: %s: dtype %s is not supported here" % (path, name, info["dtype"]))
        dtype, size = SAFETENSORS_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = list(info["shape"])
        count = 1
        for d in shape:
            count *= d
        if not (0 <= begin <= end <= len(body)) or end - begin != count * size:
            raise ValueError("%s: %s: data_offsets %s do not fit shape %s" % (path, name, (begin, end), shape))
        t = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype) if count else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(shape)
    return tensors, meta


def read_checkpoint(path):
    """(tensors: name -> torch tensor, config text) of an HDF5 checkpoint (checksums verified)."""
    import h5py  # Debian: python3-h5py
    with h5py.File(path, "r") as f:
        config = f["config"][()]
        config = config.decode() if isinstance(config, bytes) else str(config)
        tensors = {}
        for name, d in f["params"].items():
            a = d[()]
            crc = zlib.crc32(a.astype("<f4").tobytes())
            if "crc32" in d.attrs and crc != int(d.attrs["crc32"]):
                raise ValueError("%s: /params/%s: checksum mismatch" % (path, name))
            tensors[name] = torch.from_numpy(a.copy())
    return tensors, config


def load(path, dtype=torch.float32, form="chunked"):
    """The model in `path` (an HDF5 checkpoint or a safetensors export) as attnlab_model.LM."""
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic == HDF5_MAGIC:
        tensors, config = read_checkpoint(path)
    else:
        tensors, meta = read_safetensors(path)
        config = meta.get("attnlab_config")
        if config is None:
            raise ValueError("%s: no attnlab_config in the safetensors metadata (not written by export_model?)" % path)
    if "embed" not in tensors:
        raise ValueError("%s: no 'embed' tensor (not an attnlab model?)" % path)
    cfg = model_config_from_ini(config, vocab_size=int(tensors["embed"].shape[0]))   # 256 bytes, or a BPE's ids
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
    lm = load(a.file, dtype=torch.float64 if a.float64 else torch.float32)
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
