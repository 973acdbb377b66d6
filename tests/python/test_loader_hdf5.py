"""The PyTorch loader (python/attnlab_torch.py) on hostile HDF5 checkpoints:
every check of the C loader (data/h5io.c, train/checkpoint.c), with its
message, and the crafted files of tests/fixtures/hostile/ refused cleanly.

    /usr/bin/python3 tests/python/test_loader_hdf5.py      (tests/test_tools.sh runs it)
"""

import os
import sys
import tempfile
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loader_files as L  # noqa: E402
import attnlab_checkpoint  # noqa: E402
import attnlab_torch  # noqa: E402
from attnlab_checkpoint import CheckpointError  # noqa: E402

WQ = "layers.0.mixer.wq"


class LoaderTest(unittest.TestCase):
    def setUp(self):
        self._dir = tempfile.TemporaryDirectory(prefix="attnlab-pyloader-")
        self.dir = self._dir.name

    def tearDown(self):
        self._dir.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def refused(self, path, want, sep=": "):
        """load(path) raises CheckpointError with exactly "PATH: want" (a config's line: "PATH:LINE: ...")."""
        with self.assertRaises(CheckpointError) as cm:
            attnlab_torch.load(path)
        self.assertEqual(str(cm.exception), path + sep + want)

    def refused_like(self, path, *parts):
        """load(path) raises CheckpointError naming the file and holding every part."""
        with self.assertRaises(CheckpointError) as cm:
            attnlab_torch.load(path)
        msg = str(cm.exception)
        self.assertTrue(msg.startswith(path + ": "), msg)
        for p in parts:
            self.assertIn(p, msg)
        return msg


class CheckpointChecks(LoaderTest):
    def test_a_written_checkpoint_loads_with_its_values(self):
        params = L.model_params()
        lm = attnlab_torch.load(L.write_checkpoint(self.path("ok.h5"), params))
        self.assertEqual(list(lm.params), list(params))
        for name, a in params.items():
            self.assertTrue(torch.equal(lm.params[name], torch.from_numpy(a)), name)

    def test_format_version_unknown_missing_or_1(self):
        self.refused(L.write_checkpoint(self.path("v3.h5"), version=3),
                     "/format_version: 3, this build reads version 2")
        self.refused(L.write_checkpoint(self.path("v1.h5"), version=1),
                     "/format_version: 1, this build reads version 2 (version 1 checkpoints carry no checksums; "
                     "retrain, or load it with the build that wrote it)")
        self.refused(L.write_checkpoint(self.path("v.h5"), version=None),
                     "/format_version: missing (not a checkpoint?)")

    def test_nan_and_infinite_parameters(self):
        for bad, shown in ((np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")):
            params = L.model_params()
            params[WQ].reshape(-1)[5] = bad
            self.refused(L.write_checkpoint(self.path("nan.h5"), params),
                         "/params/%s: element 5 is %s (not a finite number)" % (WQ, shown))

    def test_checksum_missing_malformed_or_wrong(self):
        def no_crc(f, params):
            f["params"].create_dataset(WQ, data=params[WQ])
        self.refused(L.write_checkpoint(self.path("nocrc.h5"), skip=(WQ,), edit=no_crc),
                     "/params/%s: no crc32 checksum attribute (not written by this program?)" % WQ)

        def crc64(f, params):
            d = f["params"].create_dataset(WQ, data=params[WQ])
            d.attrs.create("crc32", L.crc(params[WQ]), dtype="<i8")
        self.refused(L.write_checkpoint(self.path("crc64.h5"), skip=(WQ,), edit=crc64),
                     "/params/%s: the crc32 attribute is not one 32-bit integer" % WQ)

        def wrong(f, params):
            L.put(f["params"], WQ, params[WQ], crc_value=0x12345678)
        msg = self.refused_like(L.write_checkpoint(self.path("wrong.h5"), skip=(WQ,), edit=wrong),
                                "/params/%s: checksum mismatch (stored 12345678, data " % WQ)
        self.assertTrue(msg.endswith("): the file is corrupt or was altered"), msg)

    def test_storage_filters_chunks_external_and_unwritten(self):
        def gzip(f, params):
            L.put(f["params"], WQ, params[WQ], compression="gzip", chunks=params[WQ].shape)
        self.refused(L.write_checkpoint(self.path("gzip.h5"), skip=(WQ,), edit=gzip),
                     "/params/%s: stored with filters (compression); only plain contiguous or compact data is "
                     "read" % WQ)

        def chunked(f, params):
            L.put(f["params"], WQ, params[WQ], chunks=(1, params[WQ].shape[1]))
        self.refused(L.write_checkpoint(self.path("chunk.h5"), skip=(WQ,), edit=chunked),
                     "/params/%s: stored in chunks or a virtual layout; only plain contiguous or compact data is "
                     "read" % WQ)
        ext = self.path("ext.bin")

        def external(f, params):
            params[WQ].astype("<f4").tofile(ext)
            d = f["params"].create_dataset(WQ, shape=params[WQ].shape, dtype="<f4",
                                           external=[(ext, 0, params[WQ].nbytes)])
            d.attrs.create("crc32", L.crc(params[WQ]), dtype="<u4")
        self.refused(L.write_checkpoint(self.path("external.h5"), skip=(WQ,), edit=external),
                     "/params/%s: stored in external files; only plain contiguous or compact data is read" % WQ)

        def unwritten(f, params):
            d = f["params"].create_dataset(WQ, shape=params[WQ].shape, dtype="<f4")
            d.attrs.create("crc32", 0, dtype="<u4")
        self.refused(L.write_checkpoint(self.path("unwritten.h5"), skip=(WQ,), edit=unwritten),
                     "/params/%s: never written (it would read as zeros)" % WQ)

    def test_compact_storage_is_read_and_checked(self):
        import h5py
        params = L.model_params()

        def compact(crc_value):
            def edit(f, p):
                space = h5py.h5s.create_simple(p[WQ].shape)
                plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                plist.set_layout(h5py.h5d.COMPACT)
                did = h5py.h5d.create(f["params"].id, WQ.encode(), h5py.h5t.IEEE_F32LE, space, dcpl=plist)
                did.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(p[WQ], dtype="<f4"))
                f["params"][WQ].attrs.create("crc32", crc_value, dtype="<u4")
            return edit
        path = L.write_checkpoint(self.path("compact.h5"), params, skip=(WQ,), edit=compact(L.crc(params[WQ])))
        self.assertEqual(attnlab_checkpoint.open_checkpoint(path).catalog["/params/" + WQ]["layout"], "compact")
        lm = attnlab_torch.load(path)
        self.assertTrue(torch.equal(lm.params[WQ], torch.from_numpy(params[WQ])))
        self.refused_like(L.write_checkpoint(self.path("compact_bad.h5"), params, skip=(WQ,), edit=compact(7)),
                          "/params/%s: checksum mismatch (stored 00000007" % WQ)

    def test_links_other_than_hard_are_refused(self):
        import h5py
        other = L.write_checkpoint(self.path("other.h5"))

        def external(f, params):
            f["params"][WQ] = h5py.ExternalLink(other, "/params/" + WQ)
        self.refused(L.write_checkpoint(self.path("elink.h5"), skip=(WQ,), edit=external),
                     "/params/%s: an external link (only hard links are read: an external or soft link could "
                     "point anywhere)" % WQ)

        def soft(f, params):
            L.put(f, "elsewhere", params[WQ])
            f["params"][WQ] = h5py.SoftLink("/elsewhere")
        self.refused(L.write_checkpoint(self.path("slink.h5"), skip=(WQ,), edit=soft),
                     "/params/%s: a soft link (only hard links are read: an external or soft link could point "
                     "anywhere)" % WQ)

    def test_types_shapes_and_names(self):
        def typed(dtype):
            def edit(f, params):
                L.put(f["params"], WQ, params[WQ].astype(dtype))
            return edit
        self.refused(L.write_checkpoint(self.path("be.h5"), skip=(WQ,), edit=typed(">f4")),
                     "/params/%s: stored as an unsupported type, expected float32" % WQ)
        self.refused(L.write_checkpoint(self.path("f64.h5"), skip=(WQ,), edit=typed("<f8")),
                     "/params/%s: stored as float64, expected float32" % WQ)
        params = L.model_params()
        params[WQ] = params[WQ][:, :-1]
        self.refused(L.write_checkpoint(self.path("shape.h5"), params),
                     "/params/%s: shape (16, 15) in the file, (16, 16) in the model" % WQ)
        params = L.model_params()
        params["extra"] = np.zeros(3, dtype="<f4")
        self.refused(L.write_checkpoint(self.path("extra.h5"), params),
                     "/params: 1 parameter(s) the model lacks: extra (a different model config?)")
        self.refused(L.write_checkpoint(self.path("missing.h5"), skip=("norm_f",)), "/params/norm_f: missing")

        def group(f, params):
            f["params"].create_group(WQ)
        self.refused(L.write_checkpoint(self.path("group.h5"), skip=(WQ,), edit=group),
                     "/params/%s: not a dataset" % WQ)

    def test_vocabulary_from_the_tokenizer(self):
        params = L.model_params(vocab=300)

        def tokenizer(f, p, data=L.tok_bytes(merges=[b"%c%c" % (97 + i // 26, 97 + i % 26) for i in range(43)],
                                              specials=((299, "<|end|>"),))):
            L.put(f, "tokenizer", np.frombuffer(data, dtype="u1"))
        lm = attnlab_torch.load(L.write_checkpoint(self.path("bpe.h5"), params, edit=tokenizer))
        self.assertEqual((lm.cfg.vocab_size, lm.tokenizer.vocab), (300, 300))
        # The tokenizer is checked as the C loader checks it, not taken for a vocabulary size.
        path = L.write_checkpoint(self.path("bad.h5"), params,
                                  edit=lambda f, p: tokenizer(f, p, b"#attnlab-bpe 1\n"))
        self.refused(path, "/tokenizer: no #pattern line")
        self.refused(L.write_checkpoint(self.path("bytes.h5"), params),
                     "/params/embed: shape (300, 16) in the file, (256, 16) in the model")

    def test_config_text(self):
        self.refused(L.write_checkpoint(self.path("nul.h5"), config=L.CONFIG + "\0# more\n"),
                     "/config: holds a NUL byte inside the text")
        path = L.write_checkpoint(self.path("wide.h5"), config=L.CONFIG.replace("d_model = 16", "d_model = 70000"))
        self.refused(path, "3: [model] d_model: 70000 is out of range [1, 65536]", sep=":")

    def test_not_hdf5_truncated_or_not_a_file(self):
        path = L.write_checkpoint(self.path("cut.h5"))
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        self.refused(path, "cannot open the checkpoint as HDF5 (truncated or corrupt?)")
        self.refused(self.dir, "the model file is a directory, not a regular file")
        fifo = self.path("fifo")
        os.mkfifo(fifo)
        self.refused(fifo, "the model file is a FIFO (named pipe), not a regular file")


class ChildProcess(LoaderTest):
    """The HDF5 reader's crash, memory limit or hang becomes "corrupt checkpoint"."""

    def child(self, code):
        path = self.path("child.py")
        with open(path, "w") as f:
            f.write("import os, signal, sys, time\nsys.path.insert(0, %r)\n%s\n"
                    % (os.path.dirname(attnlab_checkpoint.CHILD), code))
        return path

    def catalog(self, child, timeout=attnlab_checkpoint.CHILD_TIMEOUT):
        path = L.write_checkpoint(self.path("ok.h5"))
        fd = os.open(path, os.O_RDONLY)
        try:
            with self.assertRaises(CheckpointError) as cm:
                attnlab_checkpoint.run_catalog(path, fd, timeout=timeout, child=child)
        finally:
            os.close(fd)
        return path, str(cm.exception)

    def test_a_crash(self):
        path, msg = self.catalog(self.child("os.kill(os.getpid(), signal.SIGSEGV)"))
        self.assertEqual(msg, path + ": corrupt checkpoint: the HDF5 reader crashed (SIGSEGV) on it")

    def test_the_child_limits_itself(self):
        import json
        import subprocess
        child = self.child("import attnlab_h5catalog, json, resource\nattnlab_h5catalog.limit_self()\n"
                           "print(json.dumps([resource.getrlimit(r) for r in (resource.RLIMIT_AS, "
                           "resource.RLIMIT_CPU, resource.RLIMIT_CORE)]))")
        got = json.loads(subprocess.run([sys.executable, child], stdout=subprocess.PIPE, check=True).stdout)
        import resource

        def want(res, value):   # a lower hard limit this process already has is kept
            hard = resource.getrlimit(res)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            return [value, value]
        self.assertEqual(got, [want(resource.RLIMIT_AS, 2 << 30), want(resource.RLIMIT_CPU, 60),
                               want(resource.RLIMIT_CORE, 0)])

    def test_the_cpu_limit(self):
        path, msg = self.catalog(self.child("os.kill(os.getpid(), signal.SIGXCPU)"))
        self.assertEqual(msg, path + ": corrupt checkpoint: the HDF5 reader hit its CPU time limit on it")

    def test_the_memory_limit_holds(self):
        path, msg = self.catalog(self.child("import attnlab_h5catalog\nattnlab_h5catalog.limit_self()\n"
                                            "x = bytearray(3 << 30)"))
        self.assertEqual(msg, path + ": corrupt checkpoint: the HDF5 reader ran out of its memory limit on it")

    def test_a_hang(self):
        path, msg = self.catalog(self.child("time.sleep(60)"), timeout=1)
        self.assertEqual(msg, path + ": corrupt checkpoint: the HDF5 reader took more than 1 s on it")

    def test_no_answer(self):
        path, msg = self.catalog(self.child("print('not json')"))
        self.assertEqual(msg, path + ": corrupt checkpoint: the HDF5 reader failed (exit status 0) on it")


class HostileFixtures(LoaderTest):
    """The files that crashed or exhausted the loader before (issue 46)."""

    def fixture(self, name):
        return os.path.join(L.HOSTILE, name)

    def test_gzip_filled_embed_refused_before_any_read(self):
        self.refused(self.fixture("py_loader_gzip_fill_8GB_embed.h5"),
                     "/params/embed: shape (67108864, 32) in the file, (256, 32) in the model")

    def test_unwritten_embed_refused(self):
        self.refused(self.fixture("py_loader_unwritten_2e24_embed.h5"),
                     "/params/embed: shape (16777216, 32) in the file, (256, 32) in the model")

    def test_external_link_refused(self):
        self.refused(self.fixture("py_loader_external_link.h5"),
                     "/params/norm_f: an external link (only hard links are read: an external or soft link "
                     "could point anywhere)")

    def test_libhdf5_crashers_are_corrupt_checkpoints(self):
        for name in ("fuzz_ck_hdf5_localheap_segv.h5", "fuzz_ck_hdf5_attr_segv.h5", "fuzz_ck_hdf5_attr_segv_named.h5",
                     "fuzz_ck_hdf5_attr_heap_overflow.h5"):
            with self.subTest(name):
                self.refused_like(self.fixture(name), ": corrupt checkpoint: ")

    def test_config_d_model_65536_refused_before_allocating(self):
        path = self.fixture("py_loader_config_d65536.safetensors")
        self.refused(path, "3: [model] d_model: a weight of 65536 x 1048576 elements is more than this build's "
                           "2147483647 per tensor", sep=":")


if __name__ == "__main__":
    unittest.main()
