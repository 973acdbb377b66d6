"""Reading an attnlab HDF5 checkpoint (docs/checkpoint.md) as hostile input.

The same checks, with the same messages, as the C loader (data/h5io.c,
train/checkpoint.c), and the same design: libhdf5 never runs on the file in
this process. A child process (attnlab_h5catalog.py, under memory and CPU
limits) lists the file's links and datasets; this side checks that catalog
(hard links only, exact little-endian types, rank and shape, element counts,
contiguous or compact storage without filters or external files, written,
storage of exactly elements x element size inside the file, a crc32
attribute) and reads each dataset's bytes from the file itself, at the offset
the catalog gives, then verifies the checksum. A crash, a hang or a memory
limit hit in the child is "PATH: corrupt checkpoint: ...".
"""

import base64
import json
import os
import signal
import stat
import subprocess
import sys
import zlib

import numpy as np

CHECKPOINT_VERSION = 2
CONFIG_MAX = 1 << 20             # CHECKPOINT_CONFIG_MAX: bytes of /config
MAX_RANK = 8                     # H5IO_MAX_RANK
MAX_NUMEL = 1 << 40              # H5IO_MAX_NUMEL
CATALOG_MAX = 64 << 20           # bytes of the child's answer
CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attnlab_h5catalog.py")
CHILD_TIMEOUT = 120              # seconds of wall time (the child's CPU limit is 60)

NUMPY_TYPES = {"float32": "<f4", "float64": "<f8", "int32": "<i4", "int64": "<i8", "uint8": "u1", "uint64": "<u8"}
TYPE_ORDER = ["float32", "float64", "int32", "int64", "uint8", "uint64", "string"]


class CheckpointError(ValueError):
    """A file refused, with a sentence that names it and what is wrong."""


def file_kind(mode):
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path, what):
    """A read-only descriptor of `path`, refused unless it is a regular file (file_open_regular)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)   # a FIFO would block without O_NONBLOCK
    except OSError as e:
        raise CheckpointError("%s: cannot open %s: %s" % (path, what, e.strerror)) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CheckpointError("%s: the %s is %s, not a regular file" % (path, what, file_kind(mode)))
    os.set_blocking(fd, True)
    return fd


def pread_exact(fd, n, offset):
    parts, got = [], 0
    while got < n:
        b = os.pread(fd, min(n - got, 1 << 26), offset + got)
        if not b:
            break
        parts.append(b)
        got += len(b)
    return b"".join(parts)


# ---------------------------------------------------------------- the child

def run_catalog(path, fd, timeout=CHILD_TIMEOUT, child=None):
    """The catalog of the HDF5 file open as fd, made by the child under limits (never a shell)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", HDF5_USE_FILE_LOCKING="FALSE")
    try:
        r = subprocess.run([sys.executable, child or CHILD, str(fd)], pass_fds=(fd,), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CheckpointError("%s: corrupt checkpoint: the HDF5 reader took more than %d s on it" % (path, timeout)) \
            from None
    if r.returncode < 0:
        try:
            name = signal.Signals(-r.returncode).name
        except ValueError:
            name = "signal %d" % -r.returncode
        why = ("hit its CPU time limit" if -r.returncode == signal.SIGXCPU else
               "was killed (SIGKILL: out of memory?)" if -r.returncode == signal.SIGKILL else "crashed (%s)" % name)
        raise CheckpointError("%s: corrupt checkpoint: the HDF5 reader %s on it" % (path, why))
    out = r.stdout[:CATALOG_MAX + 1]
    try:
        answer = json.loads(out.decode("utf-8")) if r.returncode == 0 and len(out) <= CATALOG_MAX else None
    except (UnicodeDecodeError, ValueError):
        answer = None
    if not isinstance(answer, dict):
        tail = r.stderr.decode("utf-8", "replace").strip().splitlines()
        why = "ran out of its memory limit" if tail and "MemoryError" in tail[-1] else \
            "failed (exit status %d%s)" % (r.returncode, ": " + tail[-1][:200] if tail else "")
        raise CheckpointError("%s: corrupt checkpoint: the HDF5 reader %s on it" % (path, why))
    err = answer.get("error")
    if err == "h5py":
        raise CheckpointError("%s: reading HDF5 checkpoints needs h5py (Debian: python3-h5py): %s"
                              % (path, answer.get("detail")))
    if err == "open":
        raise CheckpointError("%s: cannot open the checkpoint as HDF5 (truncated or corrupt?)" % path)
    if err == "memory":
        raise CheckpointError("%s: corrupt checkpoint: the HDF5 reader ran out of its memory limit on it" % path)
    if err is not None:
        raise CheckpointError("%s: corrupt checkpoint: %s" % (path, str(answer.get("detail"))[:300]))
    catalog = answer.get("catalog")
    if not isinstance(catalog, dict):
        raise CheckpointError("%s: corrupt checkpoint: the HDF5 reader gave no catalog" % path)
    return catalog


# ---------------------------------------------------------------- checks (data/h5io.c)

class CheckedFile:
    """A file opened as open_regular opens it, read by its descriptor; `opened()` checks what it holds
    (the descriptor is closed if that fails). A context manager; err() makes "PATH: ..." errors."""

    def __init__(self, path, what):
        self.path = path
        self.fd = open_regular(path, what)
        try:
            self.size = os.fstat(self.fd).st_size
            self.opened()
        except BaseException:
            os.close(self.fd)
            raise

    def opened(self):
        pass

    def close(self):
        os.close(self.fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def err(self, fmt, *args):
        return CheckpointError(("%s: " + fmt) % ((self.path,) + args))


class H5File(CheckedFile):
    """A checkpoint: its descriptor, size and catalog."""

    def __init__(self, path):
        super().__init__(path, "checkpoint")

    def opened(self):
        self.catalog = run_catalog(self.path, self.fd)

    def exists(self, name):
        """h5io_exists: does the hard link `name` exist? A soft or external link on the way is an error."""
        parts = name.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            part = "/" + "/".join(parts[:i])
            entry = self.catalog.get(part)
            if not isinstance(entry, dict):
                return False
            if entry.get("link") != "hard":
                raise self.err("%s: %s link (only hard links are read: an external or soft link could point "
                               "anywhere)", part, "an external" if entry.get("link") == "external" else "a soft")
        return True

    def children(self, group):
        """Names of the links directly in `group` (a hard-linked group)."""
        prefix = group.rstrip("/") + "/"
        return sorted(k[len(prefix):] for k in self.catalog if k.startswith(prefix) and "/" not in k[len(prefix):])

    def check(self, name, types, rank, dims, max_numel, in_model=False):
        """h5io_check: the dataset's type, shape and storage. Returns its catalog entry."""
        if not self.exists(name):
            raise self.err("%s: missing", name)
        d = self.catalog[name]
        if d.get("kind") != "dataset":
            raise self.err("%s: not a dataset", name)
        t, tsize = d.get("type"), d.get("tsize")
        if t not in types or not isinstance(tsize, int) or tsize <= 0:
            listed = " or ".join(x for x in TYPE_ORDER if x in types)
            raise self.err("%s: stored as %s, expected %s", name, t if t in TYPE_ORDER else "an unsupported type",
                           listed)
        if t == "string":
            if d.get("space") != "scalar":
                raise self.err("%s: a string dataset must be a single (scalar) string", name)
            if tsize > max_numel:
                raise self.err("%s: a string of %d bytes, more than the %d allowed", name, tsize, max_numel)
            numel = 1
        else:
            numel = self.check_shape(name, d, rank, dims, max_numel, in_model)
        self.check_storage(name, d, numel * tsize)
        return d

    def check_shape(self, name, d, rank, want, max_numel, in_model):
        got = d.get("dims")
        if d.get("space") != "simple" or not isinstance(got, list) or len(got) > MAX_RANK or \
                not all(isinstance(x, int) and x >= 0 for x in got):
            raise self.err("%s: not an array of at most %d dimensions", name, MAX_RANK)
        if (rank >= 0 and len(got) != rank) or (want is not None and list(want) != got):
            if want is not None:
                fmt = lambda s: "(%s)" % ", ".join(str(x) for x in s)   # noqa: E731
                raise self.err("%s: shape %s in the file, %s %s", name, fmt(got), fmt(want),
                               "in the model" if in_model else "expected")
            raise self.err("%s: %d dimensions in the file, %d expected", name, len(got), rank)
        numel = 1
        for x in got:
            if x > MAX_NUMEL or (x and numel > MAX_NUMEL // x):
                raise self.err("%s: absurd shape (more than 2^40 elements)", name)
            numel *= x
        if numel > max_numel:
            raise self.err("%s: %d elements, more than the %d allowed", name, numel, max_numel)
        return numel

    def check_storage(self, name, d, nbytes):
        nfilters, nexternal = d.get("nfilters"), d.get("nexternal")
        if d.get("layout") not in ("contiguous", "compact") or nfilters != 0 or nexternal != 0:
            how = ("in external files" if isinstance(nexternal, int) and nexternal > 0 else
                   "with filters (compression)" if isinstance(nfilters, int) and nfilters > 0 else
                   "in chunks or a virtual layout")
            raise self.err("%s: stored %s; only plain contiguous or compact data is read", name, how)
        if d.get("allocated") is not True:
            raise self.err("%s: never written (it would read as zeros)", name)
        stored = d.get("storage")
        if not isinstance(stored, int) or stored != nbytes or stored > self.size:
            raise self.err("%s: %s bytes of storage for %d bytes of data in a file of %d bytes (truncated or "
                           "corrupt?)", name, stored, nbytes, self.size)
        crc = d.get("crc")
        if not isinstance(crc, dict) or crc.get("present") is not True:
            raise self.err("%s: no crc32 checksum attribute (not written by this program?)", name)
        if crc.get("ok") is not True or not isinstance(crc.get("value"), int):
            raise self.err("%s: the crc32 attribute is not one 32-bit integer", name)

    def read(self, name, d):
        """h5io_read: the dataset's stored bytes (checked by check), checksum verified."""
        nbytes = d["storage"]
        if d["layout"] == "compact":
            try:
                raw = base64.b64decode(d.get("compact") or "", validate=True)
            except ValueError:
                raw = b""
        else:
            off = d.get("offset")
            if not isinstance(off, int) or off < 0 or off > self.size or nbytes > self.size - off:
                raise self.err("%s: its data lies beyond the end of the file (truncated or corrupt?)", name)
            raw = pread_exact(self.fd, nbytes, off)
        if len(raw) != nbytes:
            raise self.err("%s: read failed (truncated or corrupt file?)", name)
        want, got = d["crc"]["value"] & 0xFFFFFFFF, zlib.crc32(raw) & 0xFFFFFFFF
        if got != want:
            raise self.err("%s: checksum mismatch (stored %08x, data %08x): the file is corrupt or was altered",
                           name, want, got)
        return raw

    def read_array(self, name, d):
        """The dataset as a numpy array of its shape (a copy: writable, owned)."""
        return np.frombuffer(self.read(name, d), dtype=NUMPY_TYPES[d["type"]]).reshape(d["dims"]).copy()


# ---------------------------------------------------------------- checkpoint.c

def check_finite(path, name, a):
    bad = np.flatnonzero(~np.isfinite(a.reshape(-1)))
    if bad.size:
        raise CheckpointError("%s: %s: element %d is %g (not a finite number)" % (path, name, int(bad[0]),
                                                                              float(a.reshape(-1)[bad[0]])))


def open_checkpoint(path):
    """The checkpoint, its /format_version known (open_checkpoint in train/checkpoint.c)."""
    h = H5File(path)
    try:
        if not h.exists("/format_version"):
            raise h.err("/format_version: missing (not a checkpoint?)")
        d = h.check("/format_version", ["int32"], 1, [1], 1)
        version = int(h.read_array("/format_version", d)[0])
        if version != CHECKPOINT_VERSION:
            raise h.err("/format_version: %d, this build reads version %d%s", version, CHECKPOINT_VERSION,
                        " (version 1 checkpoints carry no checksums; retrain, or load it with the build that "
                        "wrote it)" if version == 1 else "")
    except BaseException:
        h.close()
        raise
    return h


def read_config(h):
    """/config: one fixed-length string of at most 1 MiB, no NUL inside the text."""
    d = h.check("/config", ["string"], 0, None, CONFIG_MAX)
    raw = h.read("/config", d)
    text = raw.split(b"\0", 1)[0]
    if raw[len(text):].strip(b"\0"):
        raise h.err("/config: holds a NUL byte inside the text")
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError:
        raise h.err("/config: not UTF-8 text") from None


def read_params(h, shapes):
    """Every parameter of `shapes` (name -> shape, from the config) checked, then read and checked finite."""
    infos = {}
    for name, shape in shapes.items():
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        infos[name] = h.check("/params/" + name, ["float32"], len(shape), list(shape), numel, in_model=True)
    unused = [n for n in h.children("/params") if n not in shapes] if h.exists("/params") else []
    if unused:
        shown = ", ".join(unused[:20]) + (", ..." if len(unused) > 20 else "")
        raise h.err("/params: %d parameter(s) the model lacks: %s (a different model config?)", len(unused), shown)
    arrays = {}
    for name, d in infos.items():
        a = h.read_array("/params/" + name, d)
        check_finite(h.path, "/params/" + name, a)
        arrays[name] = a
    return arrays
