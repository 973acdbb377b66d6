"""The fla anchor's swap (bench/torch_ref/fla_model.py) without fla: with TorchOps, a pure-PyTorch
double of fla's two calls made of the reference's own recurrences, AnchorLM's loss and every
gradient equal the reference's bit for bit (float32 and float64; a gdn/attn/mamba/linear hybrid
with a partial last chunk), so whatever the anchor computes differently on the GPU is fla's
kernels, not the code around them. The check says PASS for that double and FAIL for one that
drops fla's scale; it names what is missing when there is no fla folder, GPU or Triton.

    /usr/bin/python3 tests/python/test_anchor_swap.py      (tests/test_tools.sh runs it)
"""

import contextlib
import io
import os
import subprocess
import sys
import unittest

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BENCH = os.path.join(ROOT, "bench", "torch_ref")
sys.path.insert(0, BENCH)
import fla_model as A  # noqa: E402
import mfu  # noqa: E402
from model import LM, model_config_from_ini  # noqa: E402

# d_k = 16: 1/sqrt(d_k) is a power of two, so fla's scale * q is the reference's q / sqrt(d_k) exactly.
SMALL = ("[model]\nlayers = %s\nd_model = 32\nn_heads = 2\nd_k = 16\nd_v = 16\nd_ff = 64\n"
         "chunk_size = 8\nconv_size = 4\n")
SETS = ["--set", "model.layers=gdn,attn,mamba,linear", "--set", "model.d_model=32", "--set", "model.n_heads=2",
        "--set", "model.d_k=16", "--set", "model.d_v=16", "--set", "model.d_ff=64", "--set", "model.chunk_size=8"]
FLA_PY = os.path.join(BENCH, "fla_model.py")
CONFIG = os.path.join(ROOT, "configs", "tiny_hybrid.ini")


class NoScale(A.TorchOps):
    """A swap with a bug the check must catch: fla's scale dropped in gla."""

    def gla(self, q, k, v, g, scale):
        return super().gla(q, k, v, g, 1.0)


def batch(cfg, B=2, T=21):
    g = torch.Generator().manual_seed(4)
    return (torch.randint(0, cfg.vocab_size, (B, T), generator=g),
            torch.randint(0, cfg.vocab_size, (B, T), generator=g))


class Swap(unittest.TestCase):
    def test_bit_identical_to_the_reference(self):
        cfg = model_config_from_ini(SMALL % "gdn,attn,mamba,linear")
        x, y = batch(cfg)
        for dtype in (torch.float32, torch.float64):
            lm = LM(cfg, dtype=dtype, seed=3, form="chunked")
            anchor = A.AnchorLM.sharing(lm, A.TorchOps(cfg.chunk_size))
            a, _ = lm.loss(x, y)
            b, _ = anchor.loss(x, y)
            ga = torch.autograd.grad(a, lm.parameters())
            gb = torch.autograd.grad(b, anchor.parameters())
            self.assertEqual(float(a), float(b), dtype)
            for n, u, v in zip(lm.params, ga, gb):
                self.assertTrue(torch.equal(u, v),
                                "%s %s: gradients differ by %g" % (dtype, n, float((u - v).abs().max())))

    def test_own_weights_are_the_reference_s(self):
        cfg = model_config_from_ini(SMALL % "gdn,attn")
        anchor = A.AnchorLM(cfg, A.TorchOps(cfg.chunk_size), dtype=torch.float32, seed=3)
        lm = LM(cfg, dtype=torch.float32, seed=3, form="chunked")
        self.assertEqual(list(anchor.params), list(lm.params))
        for n in lm.params:
            self.assertTrue(torch.equal(anchor.params[n], lm.params[n]), n)
        self.assertEqual(anchor.no_decay, lm.no_decay)

    def test_refuses_mixers_it_does_not_swap(self):
        for kind in ("kda", "gdp", "mamba2"):
            with self.assertRaises(ValueError) as e:
                A.AnchorLM(model_config_from_ini(SMALL % ("gdn," + kind)), A.TorchOps(8))
            self.assertIn("layer 1 is %s" % kind, str(e.exception))

    def test_check_fails_a_wrong_swap(self):
        cfg = model_config_from_ini(SMALL % "gdn,attn,mamba,linear")
        for ops, want, status in ((A.TorchOps(8), "check: PASS", 0), (NoScale(8), "check: FAIL", 1)):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                got = A.run_check(cfg, ops, 2, 21, "cpu")
            self.assertEqual(got, status, out.getvalue())
            self.assertIn(want, out.getvalue())
        self.assertRegex(out.getvalue(), r"layer  2 mamba .* FAIL")

    def test_check_command_with_the_stand_in(self):
        r = subprocess.run([sys.executable, FLA_PY, "check", CONFIG, "--stand-in", "--device", "cpu",
                            "--batch", "1", "--seq", "19"] + SETS, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("loss: anchor vs reference f32 0.00e+00 relative", r.stdout)
        self.assertEqual(r.stdout.strip().splitlines()[-1], "check: PASS")

    def test_says_what_is_missing(self):
        with self.assertRaises(A.Unavailable) as e:
            A.FlaOps("/nonexistent/fla-src", 64)
        self.assertIn("--fla '/nonexistent/fla-src': no fla/ops/gated_delta_rule/chunk.py under it", str(e.exception))
        if torch.cuda.is_available():
            return
        r = subprocess.run([sys.executable, FLA_PY, "check", CONFIG, "--fla", "/nonexistent"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)   # sys.exit(message)
        self.assertIn("fla_model: check: torch %s sees no CUDA GPU" % torch.__version__, r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        r = subprocess.run([sys.executable, os.path.join(BENCH, "throughput.py"), CONFIG, "--fla", "/nonexistent"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--fla runs fla's Triton kernels: it needs --device cuda", r.stderr)


class Flops(unittest.TestCase):
    def test_counted_by_hand(self):
        # attn, H 1, d_k = d_v = 2, T 3: 1 + 2 + 3 = 6 (query, key) pairs a row, 2 d_k + 2 d_v = 8 FLOPs
        # each: 48 a row, 16 a token forward, 48 with the backward.
        cfg = model_config_from_ini("[model]\nlayers = attn\nd_model = 4\nn_heads = 1\nd_k = 2\nd_v = 2\n"
                                    "d_ff = 8\nchunk_size = 2\n")
        total, parts = mfu.model_flops_per_token(cfg, 3)
        self.assertEqual(parts["attn"], 48)
        self.assertEqual(parts["params"], 6 * sum(p.numel() for p in LM(cfg, seed=0).parameters()))
        self.assertEqual(total, parts["attn"] + parts["params"])
        # gdn's chunked WY form, C = T = 1, H 1, d_k = d_v = 2: no pairs inside a chunk (0), the inverse
        # 1/3, W, P 2 d_k (C + 1) = 8, U, P D 2 d_v (C + 1) = 8, three state products 6 d_k d_v = 24.
        cfg.layers = ["gdn"]
        self.assertAlmostEqual(mfu.model_flops_per_token(cfg, 1)[1]["gdn"], 3 * (0 + 1 / 3 + 8 + 8 + 24))
        cfg.layers = ["kda2"]
        with self.assertRaises(ValueError):
            mfu.model_flops_per_token(cfg, 1)


if __name__ == "__main__":
    unittest.main()
