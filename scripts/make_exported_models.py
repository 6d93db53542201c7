"""Refills the real-exporter fixtures of tests/models/exported/ with seeded weights and
computes onnxruntime's outputs for them, for tests/onnx_exported.rs.

For each fixture in the manifest: every stub initializer (an empty tensor whose doc_string
records the statistics of the weight it replaced, see scripts/export_models.py) gets seeded
normal values of that mean and spread, clipped to the original range; the inputs are drawn
as the manifest says (seeded); onnxruntime (pinned, one thread) runs the refilled model.

Writes OUT/KIND/model.onnx, OUT/KIND/INPUT.npy and OUT/KIND/want_OUTPUT.npy, then
OUT/.complete with the stamp the test checks.

Usage: python scripts/make_exported_models.py OUT
"""

import json
import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "models", "exported")
STAMP = f"onnx {onnx.__version__} onnxruntime {ort.__version__} exported 1"


def refill(model):
    for t in model.graph.initializer:
        if not t.doc_string.startswith('{"refill"'):
            continue
        spec = json.loads(t.doc_string)
        rng = np.random.default_rng(spec["seed"])
        shape = tuple(t.dims)
        a = rng.normal(spec["mean"], spec["std"], size=shape)
        a = np.clip(a, spec["low"], spec["high"]).astype(np.float32)
        t.CopyFrom(numpy_helper.from_array(a, t.name))
    return model


def draw(spec, rng):
    shape = tuple(spec["shape"])
    if "mask_tail" in spec:
        # an attention mask: ones, then `mask_tail` padding positions at the end
        a = np.ones(shape, dtype=np.int64)
        a[..., shape[-1] - spec["mask_tail"] :] = 0
        return a
    if spec["dtype"] == "int64":
        return rng.integers(spec["low"], spec["high"], size=shape, dtype=np.int64)
    return rng.uniform(spec["low"], spec["high"], size=shape).astype(np.float32)


def main(out):
    manifest = json.load(open(os.path.join(FIXTURES, "manifest.json")))
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    for kind, entry in manifest.items():
        d = os.path.join(out, kind)
        os.makedirs(d)
        model = refill(onnx.load(os.path.join(FIXTURES, entry["file"])))
        path = os.path.join(d, "model.onnx")
        onnx.save(model, path)
        rng = np.random.default_rng(2026)
        feeds = {name: draw(spec, rng) for name, spec in entry["inputs"].items()}
        for name, a in feeds.items():
            np.save(os.path.join(d, f"{name}.npy"), a)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        for name, a in zip(names, sess.run(names, feeds)):
            np.save(os.path.join(d, f"want_{name}.npy"), a)
        print(f"{kind}: {len(model.graph.node)} nodes, outputs {names}", flush=True)
    with open(os.path.join(out, ".complete"), "w") as f:
        f.write(STAMP + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
