"""Reading a safetensors file (https://huggingface.co/docs/safetensors; what
export_model writes, docs/export.md) as hostile input.

Nothing is allocated from the file's say-so: the header length is bounded,
the JSON header is parsed with bounds (no duplicate keys, no NaN constants,
nesting caught), every tensor's dtype, shape and data_offsets are checked
(offsets inside the data section, end - begin = elements x element size, and
the tensors tile the data section: no overlap, no hole, nothing after), and
the data are read only afterwards, tensor by tensor, with pread.
"""

import json
import struct

import torch

from attnlab_checkpoint import MAX_NUMEL, MAX_RANK, CheckedFile, pread_exact

HEADER_MAX = 16 << 20                    # bytes of JSON header (the config in it is at most 1 MiB)
TENSORS_MAX = 1 << 16
DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8), "F16": (torch.float16, 2),
          "BF16": (torch.bfloat16, 2)}
FORMAT = "1"                             # the attnlab_format export_model writes


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError("the key %r appears twice" % k)
        out[k] = v
    return out


def _no_constant(name):
    raise ValueError("%s is not JSON" % name)


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


class SafetensorsFile(CheckedFile):
    """The checked header of a safetensors file: tensors (name -> (dtype, shape, begin, end)) and metadata."""

    def __init__(self, path):
        super().__init__(path, "safetensors file")

    def opened(self):
        self._read_header()

    def _read_header(self):
        if self.size < 8:
            raise self.err("too short for safetensors (%d bytes)", self.size)
        (n,) = struct.unpack("<Q", pread_exact(self.fd, 8, 0))
        if n > self.size - 8:
            raise self.err("header length %d runs past the end of the file (%d bytes)", n, self.size)
        if n > HEADER_MAX:
            raise self.err("a header of %d bytes, more than the %d allowed", n, HEADER_MAX)
        try:
            header = json.loads(pread_exact(self.fd, n, 8).decode("utf-8"), object_pairs_hook=_no_duplicates,
                                parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise self.err("the header is not valid JSON: %s", str(e)[:200]) from None
        if not isinstance(header, dict):
            raise self.err("the header is not a JSON object")
        meta = header.pop("__metadata__", {})
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise self.err("__metadata__ is not an object of strings")
        self.meta, self.data_start, self.data_len = meta, 8 + n, self.size - 8 - n
        if len(header) > TENSORS_MAX:
            raise self.err("%d tensors, more than the %d allowed", len(header), TENSORS_MAX)
        self.tensors = {name: self._check_entry(name, info) for name, info in header.items()}
        self._check_tiling()

    def _check_entry(self, name, info):
        if not isinstance(info, dict) or sorted(info) != ["data_offsets", "dtype", "shape"]:
            raise self.err("%s: not a tensor entry (dtype, shape, data_offsets)", name)
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPES:
            raise self.err("%s: dtype %s is not supported here (%s)", name, str(dtype)[:20], ", ".join(DTYPES))
        if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_is_int(d) and d >= 0 for d in shape):
            raise self.err("%s: shape %s is not a list of at most %d sizes", name, str(shape)[:80], MAX_RANK)
        numel = 1
        for d in shape:
            if d > MAX_NUMEL or (d and numel > MAX_NUMEL // d):
                raise self.err("%s: absurd shape (more than 2^40 elements)", name)
            numel *= d
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(x) for x in offsets):
            raise self.err("%s: data_offsets %s is not [begin, end]", name, str(offsets)[:80])
        begin, end = offsets
        if not 0 <= begin <= end <= self.data_len:
            raise self.err("%s: data_offsets [%d, %d] outside the %d bytes of data", name, begin, end, self.data_len)
        if end - begin != numel * DTYPES[dtype][1]:
            raise self.err("%s: data_offsets [%d, %d] hold %d bytes, shape %s of %s needs %d", name, begin, end,
                           end - begin, tuple(shape), dtype, numel * DTYPES[dtype][1])
        return dtype, tuple(shape), begin, end

    def _check_tiling(self):
        at, last = 0, None
        for name, (_, _, begin, end) in sorted(self.tensors.items(), key=lambda kv: (kv[1][2], kv[1][3])):
            if begin < at:
                raise self.err("%s: data_offsets [%d, %d] overlap %s's", name, begin, end, last)
            if begin > at:
                raise self.err("%s: data_offsets [%d, %d] leave bytes [%d, %d) of the data unused", name, begin,
                               end, at, begin)
            at, last = end, name
        if at != self.data_len:
            raise self.err("%d bytes of data after the last tensor (the data section is %d bytes)",
                           self.data_len - at, self.data_len)

    def format_and_config(self):
        """The attnlab config text of the metadata, its attnlab_format checked."""
        fmt = self.meta.get("attnlab_format")
        if fmt is None:
            raise self.err("no attnlab_format in the safetensors metadata (not written by export_model?)")
        if fmt != FORMAT:
            raise self.err("attnlab_format %s, this build reads format %s", fmt[:20], FORMAT)
        config = self.meta.get("attnlab_config")
        if config is None:
            raise self.err("no attnlab_config in the safetensors metadata (not written by export_model?)")
        return config

    def check_shapes(self, shapes):
        """Every parameter of `shapes` (name -> shape) present with that shape, and nothing else."""
        for name, shape in shapes.items():
            if name not in self.tensors:
                raise self.err("%s: missing", name)
            got = self.tensors[name][1]
            if got != tuple(shape):
                fmt = lambda s: "(%s)" % ", ".join(str(x) for x in s)   # noqa: E731
                raise self.err("%s: shape %s in the file, %s in the model", name, fmt(got), fmt(shape))
        unused = sorted(set(self.tensors) - set(shapes))
        if unused:
            shown = ", ".join(unused[:20]) + (", ..." if len(unused) > 20 else "")
            raise self.err("%d tensor(s) the model lacks: %s (a different model config?)", len(unused), shown)

    def read(self, name):
        """One tensor (checked by check_shapes), every element finite."""
        dtype, shape, begin, end = self.tensors[name]
        raw = pread_exact(self.fd, end - begin, self.data_start + begin)
        if len(raw) != end - begin:
            raise self.err("%s: read failed (truncated file?)", name)
        t = torch.frombuffer(bytearray(raw), dtype=DTYPES[dtype][0]) if raw else torch.empty(0, dtype=DTYPES[dtype][0])
        bad = (~torch.isfinite(t)).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            raise self.err("%s: element %d is %g (not a finite number)", name, i, float(t[i]))
        return t.reshape(shape)
