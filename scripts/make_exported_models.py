"""Refills the real-exporter fixtures of tests/models/exported/ with seeded weights and
computes onnxruntime's outputs for them, for tests/onnx_exported.rs.

A fixture comes from one of two places (its manifest entry says which):
- `file`: a graph in tests/models/exported/ whose stub initializers (empty tensors whose
  doc_string records the statistics of the weights they replaced, see
  scripts/export_models.py) get seeded normal values of that mean and spread, clipped to
  the original range;
- `wheel`: a model-zoo graph that the pinned onnx wheel ships as a "light" model, each
  weight a ConstantOfShape of 0.02. Each such weight becomes a seeded initializer scaled
  for the op that reads it (He-scaled conv and Gemm weights, BatchNormalization statistics
  near the identity), so activations neither vanish nor saturate through a deep network.

The inputs are drawn as the manifest says (seeded); onnxruntime (pinned, one thread, its
graph rewrites off) runs the refilled model.

Writes OUT/KIND/model.onnx, OUT/KIND/INPUT.npy and OUT/KIND/want_OUTPUT.npy, then
OUT/.complete with the stamp the test checks.

Usage: python scripts/make_exported_models.py OUT
"""

import json
import os
import sys
import zlib

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from fixtures import complete_folder, reference_session_options, save_with_reference

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "models", "exported")
STAMP = "onnx 1.23.2 onnxruntime 1.32.0 exported 2"


def refill_stubs(model):
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


def zoo_weight(op, slot, shape, rng):
    """Seeded values for the weight in input `slot` of an `op` node, scaled for that op."""
    if op == "Conv" and slot == 1:
        fan_in = int(np.prod(shape[1:]))
        return rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape)
    if op == "Gemm" and slot == 1:
        # the zoo's Gemms read B transposed (transB = 1): the fan-in is its last dim
        return rng.normal(0.0, np.sqrt(1.0 / shape[-1]), size=shape)
    if op == "BatchNormalization":
        scale, bias, mean, var = 1, 2, 3, 4
        if slot in (scale, var):
            return rng.uniform(0.5, 1.5, size=shape)
        if slot in (bias, mean):
            return rng.normal(0.0, 0.1, size=shape)
    if op == "Mul":
        return rng.uniform(0.5, 1.5, size=shape)
    # biases, and the Add of a written-out batch norm
    return rng.normal(0.0, 0.05, size=shape)


def refill_zoo(model):
    """Replaces each weight's ConstantOfShape(initializer shape) by a seeded initializer."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    readers = {}
    for n in g.node:
        for slot, name in enumerate(n.input):
            readers.setdefault(name, (n.op_type, slot))
    kept, shape_inputs = [], set()
    for n in g.node:
        if n.op_type != "ConstantOfShape" or n.input[0] not in inits:
            kept.append(n)
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(inits[n.input[0]]))
        weight = n.output[0]
        op, slot = readers[weight]
        rng = np.random.default_rng(zlib.crc32(weight.encode()))
        a = zoo_weight(op, slot, shape, rng).astype(np.float32)
        g.initializer.append(numpy_helper.from_array(a, weight))
        shape_inputs.add(n.input[0])
    del g.node[:]
    g.node.extend(kept)
    live = [t for t in g.initializer if t.name not in shape_inputs]
    del g.initializer[:]
    g.initializer.extend(live)
    # IR version 3 wants every initializer listed as a graph input, which the new weights
    # are not; from IR 4 on an initializer is a constant. The biases the zoo lists as
    # inputs are taken off the list too: onnxruntime would treat them as inputs a caller
    # may override, and neither fold nor fuse them.
    model.ir_version = max(model.ir_version, 4)
    weights = {t.name for t in g.initializer}
    graph_inputs = [i for i in g.input if i.name not in weights | shape_inputs]
    del g.input[:]
    g.input.extend(graph_inputs)
    return model


def calibrate_logits(model, feeds, opts):
    """Scales the classifier that feeds the zoo model's Softmax so its logits spread by
    about 2: random weights through a deep residual network give logits in the thousands,
    whose softmax is one-hot and would hide any error in them. The classifier is linear,
    so scaling its weight and bias scales the logits exactly."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    softmax = [n for n in g.node if n.op_type == "Softmax"]
    if not softmax:
        return model
    logits = softmax[0].input[0]
    node = producer[logits]
    while node.op_type in ("Reshape", "Flatten", "Dropout"):
        node = producer[node.input[0]]
    if node.op_type not in ("Gemm", "Conv"):
        # SqueezeNet ends in conv, relu, global pooling: not linear, and its logits are mild
        return model
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.add().name = logits
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    spread = float(np.std(sess.run([logits], feeds)[0]))
    factor = 2.0 / spread
    inits = {t.name: t for t in g.initializer}
    for name in node.input[1:]:
        while name not in inits:  # Inception v1 reshapes its classifier's weight
            name = producer[name].input[0]
        t = inits[name]
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * np.float32(factor), name))
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


def load(entry):
    if "wheel" in entry:
        onnx_root = os.path.dirname(os.path.dirname(onnx.__file__))
        return refill_zoo(onnx.load(os.path.join(onnx_root, entry["wheel"])))
    return refill_stubs(onnx.load(os.path.join(FIXTURES, entry["file"])))


def main(out):
    manifest = json.load(open(os.path.join(FIXTURES, "manifest.json")))
    opts = reference_session_options()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    with complete_folder(out, STAMP) as tmp:
        for kind, entry in manifest.items():
            model = load(entry)
            rng = np.random.default_rng(2026)
            feeds = {name: draw(spec, rng) for name, spec in entry["inputs"].items()}
            if "wheel" in entry:
                model = calibrate_logits(model, feeds, opts)
            save_with_reference(os.path.join(tmp, kind), model, feeds, opts)
            print(f"{kind}: {len(model.graph.node)} nodes", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
