"""The HDF5 half of the PyTorch loader, run as a child process: never imported.

    python3 attnlab_h5catalog.py FD

opens the checkpoint already open as file descriptor FD (so it reads the very
file the parent checked and will read) with h5py and prints one JSON object:
a catalog of its links and datasets, and nothing of their data (but for
compact datasets, whose bytes live in the object header where the parent
cannot find them). The parent (attnlab_checkpoint.py) validates the catalog
and reads every dataset's bytes from the file itself.

libhdf5 is a large C library with known crashes on crafted files (segfaults,
out-of-bounds reads, requests for 2^43 bytes and more). It runs here, under
limits set before it is loaded: address space, CPU time, no core file. A crash
or a limit hit ends this process, and the parent reports the file as corrupt.
"""

import base64
import json
import os
import resource
import sys

ADDRESS_SPACE = 2 << 30      # bytes of virtual memory the child may map
CPU_SECONDS = 60
MAX_ENTRIES = 1 << 16        # links listed, all groups together
MAX_DEPTH = 4                # /optim/m is at depth 2: deeper objects are not the loader's
MAX_NAME = 1024              # bytes of one link name
MAX_ATTRS = 16               # string attributes listed per group
MAX_ATTR_BYTES = 256
MAX_COMPACT = 64 << 10       # HDF5 keeps compact data under 64 KiB


def limit_self():
    for res, value in ((resource.RLIMIT_AS, ADDRESS_SPACE), (resource.RLIMIT_CPU, CPU_SECONDS),
                       (resource.RLIMIT_CORE, 0)):
        hard = resource.getrlimit(res)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(res, (value, value))


def type_name(h5t, tid):
    """('float32' ... 'string', element bytes), or (None, bytes) for any other type; exact, as H5Tequal."""
    size = tid.get_size()
    if tid.get_class() == h5t.STRING:
        return (None if tid.is_variable_str() else "string"), size
    for name, std in (("float32", h5t.IEEE_F32LE), ("float64", h5t.IEEE_F64LE), ("int32", h5t.STD_I32LE),
                      ("int64", h5t.STD_I64LE), ("uint8", h5t.STD_U8LE), ("uint64", h5t.STD_U64LE)):
        if tid.equal(std):
            return name, size
    return None, size


def crc_attr(h5py, did):
    """The dataset's crc32 attribute: absent, not one 32-bit integer, or its value."""
    import numpy as np
    if not h5py.h5a.exists(did, b"crc32"):
        return {"present": False}
    a = h5py.h5a.open(did, b"crc32")
    at, sp = a.get_type(), a.get_space()
    if at.get_class() != h5py.h5t.INTEGER or at.get_size() != 4 or sp.get_simple_extent_npoints() != 1:
        return {"present": True, "ok": False}
    value = np.zeros(tuple(sp.get_simple_extent_dims()), dtype=np.uint32)
    a.read(value, mtype=h5py.h5t.NATIVE_UINT32)
    return {"present": True, "ok": True, "value": int(value.reshape(-1)[0])}


def describe_dataset(h5py, did):
    h5t, h5s, h5d = h5py.h5t, h5py.h5s, h5py.h5d
    t, tsize = type_name(h5t, did.get_type())
    sp = did.get_space()
    sclass = sp.get_simple_extent_type()
    space = {h5s.SCALAR: "scalar", h5s.SIMPLE: "simple"}.get(sclass, "null")
    dims = list(sp.get_simple_extent_dims()) if space == "simple" and sp.get_simple_extent_ndims() <= 8 else None
    pl = did.get_create_plist()
    layout = {h5d.CONTIGUOUS: "contiguous", h5d.COMPACT: "compact", h5d.CHUNKED: "chunked"}.get(pl.get_layout(),
                                                                                             "virtual")
    entry = {"kind": "dataset", "type": t, "tsize": tsize, "space": space, "dims": dims, "layout": layout,
             "nfilters": pl.get_nfilters(), "nexternal": pl.get_external_count(),
             "allocated": did.get_space_status() == h5d.SPACE_STATUS_ALLOCATED,
             "storage": did.get_storage_size(), "offset": did.get_offset(), "crc": crc_attr(h5py, did)}
    # Compact data is read here, bounded: only a plain, written dataset whose
    # storage is its exact size and small.
    numel = 1
    for d in dims or []:
        numel *= d
    plain = layout == "compact" and entry["nfilters"] == 0 and entry["nexternal"] == 0 and entry["allocated"]
    if plain and t is not None and entry["storage"] == numel * tsize <= MAX_COMPACT:
        import numpy as np
        raw = np.zeros(entry["storage"], dtype=np.uint8)
        did.read(h5s.ALL, h5s.ALL, raw, mtype=did.get_type())
        entry["compact"] = base64.b64encode(raw.tobytes()).decode("ascii")
    return entry


def string_attrs(h5py, gid):
    """Fixed-length scalar string attributes of a group (e.g. /optim's kind), by name."""
    out = {}
    for i in range(min(h5py.h5a.get_num_attrs(gid), MAX_ATTRS)):
        a = h5py.h5a.open(gid, index=i)
        name, at, sp = a.name, a.get_type(), a.get_space()
        if (at.get_class() != h5py.h5t.STRING or at.is_variable_str() or at.get_size() > MAX_ATTR_BYTES
                or sp.get_simple_extent_npoints() != 1 or len(name) > MAX_NAME):
            continue
        import numpy as np
        buf = np.zeros(1, dtype="S%d" % at.get_size())
        a.read(buf, mtype=at)
        out[name.decode("utf-8", "replace")] = buf[0].decode("utf-8", "replace")
    return out


def walk(h5py, gid, prefix, depth, catalog):
    group = h5py.Group(gid)
    catalog[prefix or "/"]["attrs"] = string_attrs(h5py, gid)
    for name in group:
        if len(catalog) >= MAX_ENTRIES:
            raise OverflowError("more than %d objects" % MAX_ENTRIES)
        if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME:
            raise OverflowError("a link name longer than %d bytes" % MAX_NAME)
        path = prefix + "/" + name
        link = group.get(name, getlink=True)
        if isinstance(link, h5py.ExternalLink):
            catalog[path] = {"link": "external"}
            continue
        if isinstance(link, h5py.SoftLink):
            catalog[path] = {"link": "soft"}
            continue
        obj = group[name]
        if isinstance(obj, h5py.Dataset):
            entry = describe_dataset(h5py, obj.id)
        elif isinstance(obj, h5py.Group):
            entry = {"kind": "group"}
        else:
            entry = {"kind": "other"}
        entry["link"] = "hard"
        catalog[path] = entry
        if entry["kind"] == "group" and depth < MAX_DEPTH:
            walk(h5py, obj.id, path, depth + 1, catalog)


def main(argv):
    limit_self()
    fd = int(argv[1])
    os.environ["HDF5_USE_FILE_LOCKING"] = "FALSE"   # a read-only file system or a reader elsewhere
    out = {}
    try:
        import h5py
    except Exception as e:       # noqa: BLE001 - a missing h5py is reported, not raised
        print(json.dumps({"error": "h5py", "detail": str(e)[:300]}))
        return
    try:
        f = h5py.File("/proc/self/fd/%d" % fd, "r")
    except Exception as e:       # noqa: BLE001 - any failure to open is "not HDF5"
        print(json.dumps({"error": "open", "detail": str(e)[:300]}))
        return
    try:
        catalog = {"/": {"kind": "group", "link": "hard"}}
        walk(h5py, h5py.h5g.open(f.id, b"/"), "", 1, catalog)
        out = {"catalog": catalog}
    except OverflowError as e:
        out = {"error": "bounds", "detail": str(e)}
    except MemoryError:
        out = {"error": "memory", "detail": "the HDF5 library asked for more memory than the limit"}
    except Exception as e:       # noqa: BLE001 - libhdf5 refusing its own structures
        out = {"error": "structure", "detail": str(e)[:300]}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv)
