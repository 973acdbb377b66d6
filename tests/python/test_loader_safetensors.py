"""The PyTorch loader (python/attnlab_torch.py) on hostile safetensors files
and hostile configs: the header parsed with bounds before anything is
allocated, every shape checked against the config, the config bounded as the
C programs bound it (train/config_schema.c, model_check).

    /usr/bin/python3 tests/python/test_loader_safetensors.py      (tests/test_tools.sh runs it)
"""

import os
import struct
import sys
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loader_files as L  # noqa: E402
import attnlab_torch  # noqa: E402
from test_loader_hdf5 import WQ, LoaderTest  # noqa: E402
from attnlab_checkpoint import CheckpointError  # noqa: E402


class SafetensorsChecks(LoaderTest):
    def write(self, name="m.safetensors", tensors=None, **kw):
        return L.write_safetensors(self.path(name), tensors, **kw)

    def write_raw(self, data, name="raw.safetensors"):
        with open(self.path(name), "wb") as f:
            f.write(data)
        return self.path(name)

    def test_an_export_loads_with_its_values(self):
        params = L.model_params()
        lm = attnlab_torch.load(self.write(tensors=params))
        for name, a in params.items():
            self.assertTrue(torch.equal(lm.params[name], torch.from_numpy(a)), name)

    def test_header_length(self):
        self.refused(self.write_raw(b"\1\0\0"), "too short for safetensors (3 bytes)")
        self.refused(self.write_raw(struct.pack("<Q", 1 << 62) + b"{}"),
                     "header length %d runs past the end of the file (10 bytes)" % (1 << 62))
        path = self.write_raw(struct.pack("<Q", 32 << 20) + b"{}")
        os.truncate(path, (32 << 20) + 8)   # sparse: no disk used
        self.refused(path, "a header of %d bytes, more than the %d allowed" % (32 << 20, 16 << 20))

    def test_header_json(self):
        def with_header(text):
            text += b" " * (-len(text) % 8)
            return self.write_raw(struct.pack("<Q", len(text)) + text)
        self.refused_like(with_header(b"{\"a\": "), "the header is not valid JSON: ")
        self.refused_like(with_header(b"[" * 100000 + b"]" * 100000), "the header is not ")
        self.refused_like(with_header(b"{\"a\": 1, \"a\": 2}"),
                          "the header is not valid JSON: the key 'a' appears twice")
        self.refused_like(with_header(b"{\"a\": NaN}"), "the header is not valid JSON: NaN is not JSON")
        self.refused(with_header(b"[1, 2]"), "the header is not a JSON object")
        self.refused(with_header(b"{\"__metadata__\": {\"a\": 1}}"), "__metadata__ is not an object of strings")

    def test_entries(self):
        def edited(fn, name):
            return self.write(name, header_edit=fn)
        self.refused(edited(lambda h: h[WQ].update(dtype="I64"), "dt.safetensors"),
                     "%s: dtype I64 is not supported here (F32, F64, F16, BF16)" % WQ)
        self.refused(edited(lambda h: h[WQ].update(shape=[True, 16]), "sb.safetensors"),
                     "%s: shape [True, 16] is not a list of at most 8 sizes" % WQ)
        self.refused(edited(lambda h: h[WQ].update(shape=[1] * 9), "s9.safetensors"),
                     "%s: shape [1, 1, 1, 1, 1, 1, 1, 1, 1] is not a list of at most 8 sizes" % WQ)
        self.refused(edited(lambda h: h[WQ].update(shape=[1 << 30, 1 << 30]), "sa.safetensors"),
                     "%s: absurd shape (more than 2^40 elements)" % WQ)
        self.refused(edited(lambda h: h[WQ].update(extra=1), "ex.safetensors"),
                     "%s: not a tensor entry (dtype, shape, data_offsets)" % WQ)
        self.refused(edited(lambda h: h[WQ].update(data_offsets=[0]), "o1.safetensors"),
                     "%s: data_offsets [0] is not [begin, end]" % WQ)

    def test_offsets_inside_consistent_and_tiling(self):
        params = L.model_params()
        n = sum(a.nbytes for a in params.values())
        b, e = self.offsets(params, WQ)
        self.refused(self.write("past.safetensors", header_edit=lambda h: h[WQ].update(data_offsets=[b, n + 4])),
                     "%s: data_offsets [%d, %d] outside the %d bytes of data" % (WQ, b, n + 4, n))
        self.refused(self.write("size.safetensors", header_edit=lambda h: h[WQ].update(shape=[16, 8])),
                     "%s: data_offsets [%d, %d] hold 1024 bytes, shape (16, 8) of F32 needs 512" % (WQ, b, e))

        def overlap(h):   # wq's bytes also claimed by wk (same size), wk's own bytes left over
            h["layers.0.mixer.wk"]["data_offsets"] = [b, e]
        msg = self.refused_like(self.write("overlap.safetensors", header_edit=overlap), "overlap")
        self.assertRegex(msg, r": layers\.0\.mixer\.w[qk]: data_offsets \[%d, %d\] overlap layers\.0\.mixer\.w[qk]'s$"
                         % (b, e))

        def hole(h):
            for info in h.values():
                if "data_offsets" in info and info["data_offsets"][0] >= e:
                    info["data_offsets"] = [x + 4 for x in info["data_offsets"]]
        data = L.safetensors_bytes(params, header_edit=hole) + b"\0" * 4
        self.refused_like(self.write_raw(data, "hole.safetensors"),
                          "leave bytes [%d, %d) of the data unused" % (e, e + 4))
        data = L.safetensors_bytes(params) + b"\0" * 8
        self.refused(self.write_raw(data, "trail.safetensors"),
                     "8 bytes of data after the last tensor (the data section is %d bytes)" % (n + 8))

    @staticmethod
    def offsets(params, name):
        at = 0
        for k, a in params.items():
            if k == name:
                return at, at + a.nbytes
            at += a.nbytes

    def test_values_and_names(self):
        params = L.model_params()
        params[WQ].reshape(-1)[7] = np.nan
        self.refused(self.write("nan.safetensors", params), "%s: element 7 is nan (not a finite number)" % WQ)
        params = L.model_params()
        params[WQ] = params[WQ][:, :8]
        self.refused(self.write("shape.safetensors", params),
                     "%s: shape (16, 8) in the file, (16, 16) in the model" % WQ)
        params = L.model_params()
        params["extra"] = np.zeros(2, dtype="<f4")
        self.refused(self.write("extra.safetensors", params),
                     "1 tensor(s) the model lacks: extra (a different model config?)")
        params = L.model_params()
        del params["norm_f"]
        self.refused(self.write("missing.safetensors", params), "norm_f: missing")
        params = L.model_params()
        del params["embed"]
        self.refused(self.write("noembed.safetensors", params),
                     "no 'embed' parameter of two dimensions (not an attnlab model?)")

    def test_metadata_format_and_config(self):
        meta = {"format": "pt", "attnlab_format": "2", "attnlab_config": L.CONFIG}
        self.refused(self.write("f2.safetensors", meta=meta), "attnlab_format 2, this build reads format 1")
        del meta["attnlab_format"]
        self.refused(self.write("f.safetensors", meta=meta),
                     "no attnlab_format in the safetensors metadata (not written by export_model?)")
        self.refused(self.write("c.safetensors", meta={"attnlab_format": "1"}),
                     "no attnlab_config in the safetensors metadata (not written by export_model?)")


class ParamShapes(unittest.TestCase):
    def test_param_shapes_are_the_models(self):
        """The shapes a file is checked against before anything is allocated are the model's own."""
        import attnlab_model
        for layers in (["attn"], ["linear"], ["mamba"], ["gdn"], ["kda"], ["gdn", "attn", "mamba", "linear", "kda"]):
            for tied, conv in ((True, 4), (False, 0)):
                cfg = attnlab_model.ModelConfig(layers, d_model=12, n_heads=3, d_k=4, d_v=2, d_ff=20,
                                                tied_embeddings=tied, conv_size=conv, vocab_size=300)
                lm = attnlab_model.LM(cfg, dtype=torch.float32)
                self.assertEqual({k: tuple(v.shape) for k, v in lm.params.items()}, attnlab_model.param_shapes(cfg))
                self.assertEqual(list(lm.params), list(attnlab_model.param_shapes(cfg)))

    def test_kda_without_gate_bias_has_no_b_g2(self):
        """kda_gate_bias = false leaves the parameter out (not zero), as the C model; the rest is unchanged."""
        import attnlab_model
        ini = "[model]\nlayers = kda,attn\nd_model = 12\nn_heads = 3\nd_k = 4\nd_v = 4\nd_ff = 20\n"
        on = attnlab_model.param_shapes(attnlab_model.model_config_from_ini(ini))
        cfg = attnlab_model.model_config_from_ini(ini + "kda_gate_bias = false\n")
        self.assertFalse(cfg.kda_gate_bias)
        off = attnlab_model.param_shapes(cfg)
        self.assertEqual(on.pop("layers.0.mixer.b_g2"), (12,))
        self.assertEqual(list(on.items()), list(off.items()))
        lm = attnlab_model.LM(cfg, dtype=torch.float64, seed=1, form="chunked")
        self.assertEqual(list(lm.params), list(off))
        tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])
        with torch.no_grad():
            a = lm.forward(tokens)
            lm.form = "recurrent"
            b = lm.forward(tokens)
        self.assertLess(float((a - b).abs().max()), 1e-10)


class ConfigBounds(LoaderTest):
    """A config the C programs refuse is refused, with their message."""

    def config_refused(self, config, want, vocab=256):
        meta = {"format": "pt", "attnlab_format": "1", "attnlab_config": config}
        params = L.model_params()
        params["embed"] = np.zeros((vocab, 16), dtype="<f4")
        path = L.write_safetensors(self.path("cfg.safetensors"), params, meta=meta)
        self.refused(path, want, sep=":")

    def swap(self, old, new):
        self.assertIn(old, L.CONFIG)
        return L.CONFIG.replace(old, new)

    def test_values_out_of_range_or_malformed(self):
        self.config_refused(self.swap("d_ff = 32", "d_ff = 0"), "7: [model] d_ff: 0 is out of range [1, 1.04858e+06]")
        self.config_refused(self.swap("d_k = 8", "d_k = 8x"), "5: [model] d_k: '8x' is not an integer")
        self.config_refused(self.swap("chunk_size = 4", "chunk_size = 4\nnorm_eps = nan"),
                            "9: [model] norm_eps: 'nan' is not a finite number")
        self.config_refused(self.swap("chunk_size = 4", "chunk_size = 4\nrope_base = 0.5"),
                            "9: [model] rope_base: 0.5 is out of range (at least 1)")
        self.config_refused(self.swap("chunk_size = 4", "chunk_size = 4\ntied_embeddings = maybe"),
                            "9: [model] tied_embeddings: 'maybe' is not a bool (true/false, yes/no, on/off, 1/0)")
        self.config_refused(self.swap("layers = attn,linear,mamba,gdn", "layers = attn,,gdn"),
                            "2: [model] layers: empty item 2 in the list")
        self.config_refused(self.swap("layers = attn,linear,mamba,gdn", "layers = attn,rwkv"),
                            "2: [model] layers: 'rwkv' is not a known mixer")
        self.config_refused(self.swap("layers = attn,linear,mamba,gdn", "layers = " + ",".join(["gdn"] * 65)),
                            "2: [model] layers: more than 64 items")
        self.config_refused(self.swap("chunk_size = 4", "chunk_size = 4\nform = fast"),
                            "9: [model] form: 'fast' is not one of chunked|parallel|recurrent")

    def test_keys_sections_and_lines(self):
        self.config_refused(self.swap("chunk_size = 4", "chunk_size = 4\nwidth = 3"), "9: [model] width: unknown key")
        self.config_refused(self.swap("chunk_size = 4", "chunk_size = 4\nd_ff = 64"),
                            "9: [model] d_ff: duplicate key (first set on line 7)")
        self.config_refused(self.swap("[train]", "[trian]"),
                            "13: [trian]: unknown section (sections: [model] [data] [train] [finetune])")
        self.config_refused("d_model = 16\n" + L.CONFIG,
                            "1: d_model: key outside any section (put it under [model], [data], [train] or [finetune])")
        self.config_refused(self.swap("d_v = 8", "d_v = 8\r x"),
                            "6: carriage return inside a line: the file uses old Mac (CR) line endings or holds a "
                            "stray CR; convert it to LF line endings")

    def test_model_check(self):
        self.config_refused(self.swap("d_k = 8", "d_k = 7"),
                            "5: [model] d_k: layer 0: attention's RoPE rotates pairs of dimensions: d_k = 7 must be "
                            "even")
        self.config_refused(self.swap("chunk_size = 4", "chunk_size = 4\nform = parallel"),
                            "9: [model] form: layer 3: gdn has no 'parallel' form (it has: chunked, recurrent)")
        self.config_refused(self.swap("layers = attn,linear,mamba,gdn", "layers = attn").replace(
            "chunk_size = 4", "chunk_size = 4\nform = recurrent"),
            "9: [model] form: form = recurrent has no effect: none of the layers (attn...) has training forms to "
            "choose between (only linear, mamba, mamba2, gdn, gdp and kda do); remove the key")
        # gdp_steps (its default 2 aside) without a gdp layer, or out of its range, as train refuses it.
        self.config_refused(self.swap("chunk_size = 4", "chunk_size = 4\ngdp_steps = 3"),
                            "9: [model] gdp_steps: gdp_steps = 3 has no effect: none of the layers (attn...) is gdp; "
                            "remove the key")
        self.config_refused(self.swap("chunk_size = 4", "chunk_size = 4\ngdp_steps = 9"),
                            "9: [model] gdp_steps: 9 is out of range [1, 8]")
        # kda_gate_bias = false (its default true aside) without a kda layer, or not a bool.
        self.config_refused(self.swap("chunk_size = 4", "chunk_size = 4\nkda_gate_bias = false"),
                            "9: [model] kda_gate_bias: kda_gate_bias = false has no effect: none of the layers "
                            "(attn...) is kda; remove the key")
        self.config_refused(self.swap("chunk_size = 4", "chunk_size = 4\nkda_gate_bias = 2"),
                            "9: [model] kda_gate_bias: '2' is not a bool (true/false, yes/no, on/off, 1/0)")
        self.config_refused(self.swap("d_ff = 32", "d_ff = 1048576").replace("d_model = 16", "d_model = 4096"),
                            "3: [model] d_model: a weight of 4096 x 1048576 elements is more than this build's "
                            "2147483647 per tensor")

    def test_a_mixer_this_reference_lacks(self):
        meta = {"format": "pt", "attnlab_format": "1",
                "attnlab_config": self.swap("layers = attn,linear,mamba,gdn", "layers = attn_dsa")}
        path = L.write_safetensors(self.path("dsa.safetensors"), L.model_params(), meta=meta)
        self.refused(path, "layer 0: mixer 'attn_dsa' is not in this reference (attn, linear, mamba, gdn, mamba2, gdp, "
                           "kda)")

    def test_vocabulary_bounds(self):
        meta = {"format": "pt", "attnlab_format": "1", "attnlab_config": L.CONFIG}
        params = L.model_params()
        params["embed"] = np.zeros((0, 16), dtype="<f4")
        path = L.write_safetensors(self.path("v0.safetensors"), params, meta=meta)
        self.refused(path, "embed: 0 rows, a vocabulary has 1 to 4194304 ids")


class SafetensorsMutations(LoaderTest):
    """A fuzz smoke of the reader: a valid export with bytes flipped, cut,
    repeated or overwritten (a fixed seed, so a failure reproduces) must load
    with finite values or be refused with a CheckpointError naming the file:
    never another exception, and never a load of absurd size."""

    def test_mutated_exports_load_or_are_refused_by_name(self):
        import random
        path = L.write_safetensors(self.path("base.safetensors"), L.model_params())
        with open(path, "rb") as f:
            base = f.read()
        rng = random.Random(46)
        outcomes = {"loaded": 0, "refused": 0}
        for i in range(int(os.environ.get("ATTNLAB_MUTATIONS", "400"))):
            data = bytearray(base)
            for _ in range(rng.randint(1, 4)):
                kind, at = rng.randrange(4), rng.randrange(len(data))
                if kind == 0:
                    data[at] ^= 1 << rng.randrange(8)
                elif kind == 1:
                    del data[at:at + rng.randint(1, 64)]
                elif kind == 2:
                    data[at:at] = data[at:at + rng.randint(1, 64)]
                else:
                    data[at] = rng.choice(b'0123456789{}[]",:e-. ')
            mutated = self.path("m%d.safetensors" % i)
            with open(mutated, "wb") as f:
                f.write(bytes(data))
            try:
                lm = attnlab_torch.load(mutated)
            except CheckpointError as e:
                self.assertIn(mutated, str(e))
                outcomes["refused"] += 1
            else:
                for name, t in lm.params.items():
                    self.assertTrue(bool(torch.isfinite(t).all()), "%s: %s is not finite" % (mutated, name))
                outcomes["loaded"] += 1
            os.remove(mutated)
        self.assertGreater(outcomes["refused"], 0)
        print("safetensors mutations: %(loaded)d loaded, %(refused)d refused" % outcomes, file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
