#!/usr/bin/python3
"""Compare a C training state with the independent PyTorch reference.

    ./build/train --config tiny_gdn.ini --dump-state /tmp/state.h5
    /usr/bin/python3 bench/torch_ref/compare_dump.py /tmp/state.h5 [--tol 1e-4] [--form recurrent|chunked|both]

Reads the dump (train/dump_state.h: /tokens, /targets, /logits, /loss,
/params/<name>, /grads/<name>, attribute `config` = the [model] section, and
/doc_start and /initial_state when the run has documents or carries its state),
rebuilds the model of MODEL.md in float64 from the config, loads the C
parameters by name, runs forward and backward, and prints the normwise relative
difference max|ref - C| / max(max|ref|, max|C|) of the loss, the logits and every parameter
gradient. Exits 1 if any exceeds --tol (default 1e-4, for a float32 C state).
With /doc_start every layer starts afresh at each flagged position, as in the
C step: the reference runs each document of a row on its own. A parameter the
C step froze (no /grads entry) is listed, not compared. Carried states
(/initial_state) must be zero (a run's first step): the reference starts every
window from a zero state, and says so otherwise.

Needs python3-torch and python3-h5py (Debian packages).
"""

import argparse
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import LM, model_config_from_ini  # noqa: E402


def rel_diff(ref, other):
    """Normwise: max|ref - other| / max(max|ref|, max|other|), the project's measure
    (tests/test_util.h max_rel_diff); 0 when both are all zero."""
    ref = np.asarray(ref, dtype=np.float64)
    other = np.asarray(other, dtype=np.float64)
    num = float(np.max(np.abs(ref - other))) if ref.size else 0.0
    den = max(float(np.max(np.abs(ref))), float(np.max(np.abs(other)))) if ref.size else 0.0
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def read_dump(path, config_path=None):
    with h5py.File(path, "r") as f:
        objective = f.attrs.get("objective", b"lm")
        objective = objective.decode() if isinstance(objective, bytes) else str(objective)
        if objective != "lm":
            sys.exit("compare_dump: %s holds the '%s' objective (indexer fine-tuning); the reference "
                     "implements the language-model loss only" % (path, objective))
        d = {
            "tokens": f["tokens"][()].astype(np.int64),
            "targets": f["targets"][()].astype(np.int64),
            "logits": f["logits"][()],
            "loss": float(f["loss"][()].reshape(-1)[0]),
            "params": {k: f["params"][k][()] for k in f["params"]},
            "grads": {k: f["grads"][k][()] for k in f["grads"]},
            "doc_start": f["doc_start"][()].astype(np.int64) if "doc_start" in f else None,
        }
        if "initial_state" in f:
            g = f["initial_state"]
            nonzero = [k for k in g if np.any(g[k][()] != 0)]
            if nonzero:
                sys.exit("compare_dump: %s starts from carried states that are not zero (initial_state %s: a "
                         "resumed carry_state run); the reference starts every window from a zero state: dump the "
                         "first step of a fresh run" % (path, ", ".join(nonzero)))
        if config_path:
            with open(config_path) as c:
                d["config"] = c.read()
        elif "config" in f.attrs:
            c = f.attrs["config"]
            d["config"] = c.decode() if isinstance(c, bytes) else str(c)
        else:
            sys.exit("compare_dump: %s has no 'config' attribute; pass the run's config with --config FILE" % path)
    return d


def document_loss(lm, tokens, targets, doc_start):
    """The loss with every layer starting afresh at each document start (doc_start[b, t] = 1):
    each document of a row goes through the model on its own. Without flags, lm.loss."""
    if doc_start is None or not doc_start[:, 1:].any():
        return lm.loss(tokens, targets)
    rows = []
    T = tokens.shape[1]
    for b in range(tokens.shape[0]):
        cuts = [0] + [t for t in range(1, T) if doc_start[b, t]] + [T]
        rows.append(torch.cat([lm.forward(tokens[b:b + 1, s:e]) for s, e in zip(cuts, cuts[1:])], dim=1))
    logits = torch.cat(rows, dim=0)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return loss, logits


def run_reference(d, form, threads):
    vocab = d["params"]["embed"].shape[0]
    cfg = model_config_from_ini(d["config"], vocab_size=vocab)
    lm = LM(cfg, dtype=torch.float64, form=form)
    lm.load(d["params"])
    tokens, targets = torch.from_numpy(d["tokens"]), torch.from_numpy(d["targets"])
    loss, logits = document_loss(lm, tokens, targets, d["doc_start"])
    loss.backward()
    grads = {k: p.grad.numpy() if p.grad is not None else np.zeros(p.shape) for k, p in lm.params.items()}
    return cfg, float(loss), logits.detach().numpy(), grads


def compare(d, ref_loss, ref_logits, ref_grads, tol, label):
    rows = [("loss", rel_diff([ref_loss], [d["loss"]])), ("logits", rel_diff(ref_logits, d["logits"]))]
    frozen = [name for name in ref_grads if name not in d["grads"]]
    for name in ref_grads:   # the model's registration order
        if name in d["grads"]:
            rows.append(("grad " + name, rel_diff(ref_grads[name], d["grads"][name])))
    if frozen:
        print("%s: no gradient in the dump (frozen in the C step), not compared: %s" % (label, ", ".join(frozen)))
    width = max(len(r[0]) for r in rows)
    print("%s: reference loss %.8f, C loss %.8f" % (label, ref_loss, d["loss"]))
    bad = 0
    for name, r in rows:
        flag = "" if r <= tol else "   <-- above %g" % tol
        bad += r > tol
        print("  %-*s  %.3e%s" % (width, name, r, flag))
    worst = max(rows, key=lambda r: r[1])
    grad_worst = max(rows[2:], key=lambda r: r[1]) if len(rows) > 2 else ("grad (none)", 0.0)
    print("%s: loss %.2e, logits %.2e, worst gradient %.2e (%s); %d of %d above %g"
          % (label, rows[0][1], rows[1][1], grad_worst[1], grad_worst[0][5:], bad, len(rows), tol))
    return bad, worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("state", help="HDF5 file written by train --dump-state")
    ap.add_argument("--tol", type=float, default=1e-4, help="normwise relative tolerance (default 1e-4)")
    ap.add_argument("--form", choices=("recurrent", "chunked", "both"), default="recurrent",
                    help="reference form of the mixers: recurrence (default), chunked, or both (also "
                         "checks the two torch forms against each other)")
    ap.add_argument("--config", help="INI file to use instead of the dump's config attribute")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    d = read_dump(a.state, a.config)
    forms = ("recurrent", "chunked") if a.form == "both" else (a.form,)
    bad, results = 0, {}
    for form in forms:
        cfg, loss, logits, grads = run_reference(d, form, a.threads)
        if not results:
            print("%s: layers %s, D %d, H %d, dk %d, dv %d, d_ff %d, conv %d, chunk %d, B %d, T %d, torch %s"
                  % (a.state, ",".join(cfg.layers), cfg.d_model, cfg.n_heads, cfg.d_k, cfg.d_v, cfg.d_ff,
                     cfg.conv_size, cfg.chunk_size, d["tokens"].shape[0], d["tokens"].shape[1],
                     torch.__version__))
        results[form] = (loss, logits, grads)
        b, _ = compare(d, loss, logits, grads, a.tol, "C vs torch float64 (%s)" % form)
        bad += b
    if len(forms) == 2:
        (l0, lg0, g0), (l1, lg1, g1) = results["recurrent"], results["chunked"]
        r = max([rel_diff([l0], [l1]), rel_diff(lg0, lg1)] + [rel_diff(g0[k], g1[k]) for k in g0])
        print("torch recurrent vs torch chunked (both float64): worst normwise difference %.2e" % r)
        if r > 1e-9:
            print("  <-- the two torch forms disagree (above 1e-9)")
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
