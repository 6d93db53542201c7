#!/usr/bin/env python3
"""Writes the ONNX models of the benchmark (issue 6) into a folder, default
target/bench-models:

    .venv/bin/python benches/make_bench_models.py [OUT_DIR [NAME ...]]

(every model, or only those named)

- resnet18.onnx, resnet50.onnx: the networks of scripts/make_models.py (same builder,
  same seeds; resnet50 has a dynamic batch dimension "N", pinned to 1 by benches/compare.py);
- tail3x3_C_HW.onnx: Conv3x3(C->C) -> BatchNormalization -> Add(shortcut) -> Relu at
  (C, HW) = (64, 56), (128, 28), (256, 14), (512, 7);
- tail1x1_64to256_56.onnx, tail1x1_256to64_56.onnx: Conv1x1 -> BN -> Add -> Relu at 56x56
  (the expanding and reducing 1x1 convolutions of a bottleneck);
- dwtail_256_56.onnx: depthwise Conv3x3 (group = C) -> BN -> Add -> Relu at C256 56x56;
- bert_base.onnx: a BERT-base-sized encoder (12 layers, hidden 768, 12 heads of 64, FFN
  3072) in the PyTorch exporter's own graph: the exported BERT fixture
  (target/onnx-tests/exported/bert_opset14, 6 x 384, written by
  scripts/make_exported_models.py if missing) with its layers repeated to 12 and every
  width doubled (weights redrawn with seeds, the head size and the score scale of its
  shape program rewritten); its inputs (token ids, a mask with a padded tail, token types
  at batch 1, sequence 128) are the fixture's, in bert_base.inputs/.

Inputs of every tail: x (the conv input) and shortcut (the residual, the conv's output
shape). Weights are random with fixed seeds. Files are written under a temporary name and
renamed, so an interrupted run leaves no half-written model.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import make_models  # noqa: E402  (the ResNet builder; scripts/ is on the path above)
from fixtures import npy_name  # noqa: E402  (the saved inputs' file names)

OPSET = make_models.OPSET

TAILS_3X3 = [(64, 56), (128, 28), (256, 14), (512, 7)]
TAILS_1X1 = [(64, 256, 56), (256, 64, 56)]
DEPTHWISE = [(256, 56)]


def tail(name: str, cin: int, cout: int, hw: int, k: int, depthwise: bool, seed: int) -> onnx.ModelProto:
    """Conv(k x k, pad k//2) -> BatchNormalization -> Add(shortcut) -> Relu."""
    b = make_models.Builder(seed=seed)
    if depthwise:
        assert cin == cout
        w = b.rng.normal(0.0, np.sqrt(2.0 / (k * k)), (cout, 1, k, k)).astype(np.float32)
        b.init("conv.weight", w)
        y = b.node(
            "Conv", ["x", "conv.weight"], "conv",
            kernel_shape=[k, k], strides=[1, 1], pads=[k // 2] * 4, group=cin,
        )
    else:
        y = b.conv("x", cin, cout, k, 1, "conv")
    y = b.bn(y, cout, "bn")
    y = b.node("Add", [y, "shortcut"], "add")
    b.nodes.append(helper.make_node("Relu", [y], ["y"], name="relu"))

    def info(n: str, c: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, c, hw, hw])

    graph = helper.make_graph(
        b.nodes, name, [info("x", cin), info("shortcut", cout)], [info("y", cout)], b.inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def bert_base() -> onnx.ModelProto:
    """The exported 6 x 384 BERT fixture grown to BERT-base's 12 x 768 (see the module doc)."""
    from onnx import numpy_helper

    src = os.path.join(ROOT, "target", "onnx-tests", "exported", "bert_opset14", "model.onnx")
    if not os.path.exists(src):
        import subprocess

        subprocess.run(
            [sys.executable, os.path.join(ROOT, "scripts", "make_exported_models.py"),
             os.path.join(ROOT, "target", "onnx-tests", "exported")],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    m = onnx.load(src)
    g = m.graph
    layers = sorted({int(n.name.split("/")[3].split(".")[1])
                     for n in g.node if n.name.startswith("/bert/encoder/layer.")})
    count = len(layers)
    # the last layer's result is the graph's `last_hidden_state` itself: the original
    # last layer now writes an inner name, which the copies start from, and the last copy
    # writes the graph's
    last_node = next(n for n in g.node
                     if n.name == f"/bert/encoder/layer.{count - 1}/output/LayerNorm/Add_1")
    result = last_node.output[0]
    last_out = f"/bert/encoder/layer.{count - 1}/output/LayerNorm/Add_1_output_0"
    last_node.output[0] = last_out
    inits = {i.name: i for i in g.initializer}
    produced = {o for n in g.node for o in n.output}
    # layers count..2*count-1: copies of 0..count-1, chained after the last one; each
    # copy's own tensors and weights renamed
    copies = []
    for n in g.node:
        if not n.name.startswith("/bert/encoder/layer."):
            continue
        k = int(n.name.split("/")[3].split(".")[1])
        new_k = k + count
        def rename(t: str) -> str:
            if t == last_out and k == count - 1:
                return result
            if t == "/bert/embeddings/LayerNorm/Add_1_output_0" and k == 0:
                return last_out
            if t.startswith(f"/bert/encoder/layer.{k}/"):
                return t.replace(f"/bert/encoder/layer.{k}/", f"/bert/encoder/layer.{new_k}/", 1)
            if t.startswith(f"/bert/encoder/layer.{k - 1}/") and k > 0:
                return t.replace(f"/bert/encoder/layer.{k - 1}/", f"/bert/encoder/layer.{new_k - 1}/", 1)
            if t in inits and t not in produced and (f"layer.{k}." in t or t.startswith("onnx::MatMul")):
                return f"{t}__copy"
            return t
        c = onnx.NodeProto()
        c.CopyFrom(n)
        c.name = n.name.replace(f"/bert/encoder/layer.{k}/", f"/bert/encoder/layer.{new_k}/", 1)
        del c.input[:]
        c.input.extend(rename(t) for t in n.input)
        del c.output[:]
        c.output.extend(rename(t) for t in n.output)
        copies.append(c)
    copied_inits = sorted({t for c in copies for t in c.input if t.endswith("__copy")})
    for t in copied_inits:
        i = onnx.TensorProto()
        i.CopyFrom(inits[t[: -len("__copy")]])
        i.name = t
        g.initializer.append(i)
    # the copies go before the pooler, which reads the graph's result as before
    first_rest = next(i for i, n in enumerate(g.node) if n.name.startswith("/bert/pooler"))
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(nodes[:first_rest] + copies + nodes[first_rest:])
    # widths: 384 -> 768, 1536 -> 3072, the head size 32 -> 64 and its score scale
    rng = np.random.default_rng(21)
    wide = {384: 768, 1536: 3072}
    for i in g.initializer:
        if i.data_type != TensorProto.FLOAT or not any(d in wide for d in i.dims):
            continue
        dims = [wide.get(d, d) for d in i.dims]
        if "LayerNorm.weight" in i.name:
            v = rng.uniform(0.5, 1.5, dims)
        else:
            v = rng.normal(0.0, 0.02, dims)
        i.CopyFrom(numpy_helper.from_array(v.astype(np.float32), i.name))
    for n in g.node:
        if n.op_type != "Constant" or "/attention/self/" not in n.name:
            continue
        t = numpy_helper.to_array(n.attribute[0].t)
        if t.dtype == np.int64 and t.tolist() == [32]:
            n.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array([64], np.int64)))
        elif t.dtype == np.float32 and t.size == 1 and abs(float(t.reshape(-1)[0]) - 32 ** -0.25) < 1e-6:
            n.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(64 ** -0.25, np.float32)))
    for vi in list(g.output) + list(g.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value in wide:
                d.dim_value = wide[d.dim_value]
    return m


def models() -> list[tuple[str, Callable[[], onnx.ModelProto]]]:
    """Every model by name, each built only when called (bert_base alone is 440 MB)."""
    out: list[tuple[str, Callable[[], onnx.ModelProto]]] = [
        ("resnet18", lambda: make_models.resnet(18)),
        ("resnet50", lambda: make_models.resnet(50)),
    ]
    for i, (c, hw) in enumerate(TAILS_3X3):
        out.append((f"tail3x3_{c}_{hw}",
                    lambda c=c, hw=hw, i=i: tail("tail3x3", c, c, hw, 3, False, seed=100 + i)))
    for i, (cin, cout, hw) in enumerate(TAILS_1X1):
        out.append((f"tail1x1_{cin}to{cout}_{hw}",
                    lambda cin=cin, cout=cout, hw=hw, i=i:
                    tail("tail1x1", cin, cout, hw, 1, False, seed=200 + i)))
    for i, (c, hw) in enumerate(DEPTHWISE):
        out.append((f"dwtail_{c}_{hw}",
                    lambda c=c, hw=hw, i=i: tail("dwtail", c, c, hw, 3, True, seed=300 + i)))
    out.append(("bert_base", bert_base))
    return out


def main() -> None:
    args = sys.argv[1:]
    out = args[0] if args else os.path.join(ROOT, "target", "bench-models")
    known = dict(models())
    wanted = args[1:] or list(known)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        sys.exit(f"unknown models {unknown}\n{__doc__}")
    os.makedirs(out, exist_ok=True)
    for name in wanted:
        model = known[name]()
        onnx.checker.check_model(model)
        path = os.path.join(out, f"{name}.onnx")
        tmp = f"{path}.tmp{os.getpid()}"
        onnx.save_model(model, tmp)
        os.replace(tmp, path)
        print(f"wrote {path}")
    if "bert_base" in wanted:
        # the BERT's inputs: the fixture's token ids, mask and token types
        fixture = os.path.join(ROOT, "target", "onnx-tests", "exported", "bert_opset14")
        inputs = os.path.join(out, "bert_base.inputs")
        os.makedirs(inputs, exist_ok=True)
        for name in ["input_ids", "attention_mask", "token_type_ids"]:
            np.save(os.path.join(inputs, npy_name(name)),
                    np.load(os.path.join(fixture, npy_name(name))))


if __name__ == "__main__":
    main()
