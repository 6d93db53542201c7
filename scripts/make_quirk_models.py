#!/usr/bin/env python3
"""Builds ONNX models written the way exporters write them, with onnxruntime reference
outputs, for tests/onnx_quirks.rs (into a git-ignored folder).

    .venv/bin/python scripts/make_quirk_models.py target/onnx-tests/quirks

- minus_one/: input x declared [-1, 3, "h", ?] (a -1, a named dim_param and an unset
  dimension), run at 1x3x48x192: Conv 3->8 3x3 pad 1 -> Relu -> Clip (opset-13 min/max
  inputs from Constant nodes) -> Unsqueeze/Squeeze with axes inputs -> Conv 8->4 1x1.
- external/: model.onnx with the initializers of 1 KB or more (w1, w2, fc_w) in the side
  file weights.bin, as onnx.save_model writes them (onnxruntime's shape inference reads
  no external int64 shapes, so smaller tensors stay inline), and inline.onnx, the same model with its data
  embedded: Conv 4->16 3x3 -> Relu -> Conv 16->16 3x3 stride 2 -> Relu -> Reshape ->
  Gemm 784->10, at 1x4x16x16.

Each folder holds x.npy (the input) and y.npy (onnxruntime's output, graph
optimizations disabled). Weights come from a fixed seed. Written under a temporary
name, renamed when complete, stamped `.complete`.
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def weights(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float):
    return numpy_helper.from_array(
        (rng.standard_normal(shape) * scale).astype(np.float32), name
    )


def minus_one_model() -> onnx.ModelProto:
    rng = np.random.default_rng(11)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "h", None])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node(
            "Constant", [], ["lo"], name="lo", value=numpy_helper.from_array(np.array(0.1, np.float32))
        ),
        helper.make_node("Constant", [], ["hi"], name="hi", value_float=1.5),
        helper.make_node("Clip", ["r1", "lo", "hi"], ["k1"], name="clip"),
        helper.make_node("Constant", [], ["ax"], name="ax", value_ints=[0]),
        helper.make_node("Unsqueeze", ["k1", "ax"], ["u1"], name="unsqueeze"),
        helper.make_node("Squeeze", ["u1", "ax"], ["s1"], name="squeeze"),
        helper.make_node("Conv", ["s1", "w2", "b2"], ["y"], name="conv2"),
    ]
    inits = [
        weights(rng, "w1", (8, 3, 3, 3), 0.3),
        weights(rng, "b1", (8,), 0.1),
        weights(rng, "w2", (4, 8, 1, 1), 0.3),
        weights(rng, "b2", (4,), 0.1),
    ]
    graph = helper.make_graph(nodes, "minus_one", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def external_model() -> onnx.ModelProto:
    rng = np.random.default_rng(12)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Reshape", ["r2", "shape"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], name="fc", transB=1),
    ]
    inits = [
        weights(rng, "w1", (16, 4, 3, 3), 0.3),
        weights(rng, "b1", (16,), 0.1),
        weights(rng, "w2", (16, 16, 3, 3), 0.1),
        weights(rng, "b2", (16,), 0.1),
        numpy_helper.from_array(np.array([1, -1], np.int64), "shape"),
        weights(rng, "fc_w", (10, 16 * 7 * 7), 0.05),
        weights(rng, "fc_b", (10,), 0.1),
    ]
    graph = helper.make_graph(nodes, "external", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def reference(path: str, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    final = sys.argv[1]
    tmp = final + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    rng = np.random.default_rng(13)

    d = os.path.join(tmp, "minus_one")
    os.makedirs(d)
    path = os.path.join(d, "model.onnx")
    onnx.save_model(minus_one_model(), path)
    x = rng.uniform(-1, 1, (1, 3, 48, 192)).astype(np.float32)
    np.save(os.path.join(d, "x.npy"), x)
    np.save(os.path.join(d, "y.npy"), reference(path, x))

    d = os.path.join(tmp, "external")
    os.makedirs(d)
    model = external_model()
    onnx.save_model(model, os.path.join(d, "inline.onnx"))
    path = os.path.join(d, "model.onnx")
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=1024,
    )
    stored = onnx.load(path, load_external_data=False)
    external = {t.name for t in stored.graph.initializer if t.data_location == TensorProto.EXTERNAL}
    assert external == {"w1", "w2", "fc_w"}, external
    x = rng.uniform(-1, 1, (1, 4, 16, 16)).astype(np.float32)
    np.save(os.path.join(d, "x.npy"), x)
    np.save(os.path.join(d, "y.npy"), reference(path, x))

    with open(os.path.join(tmp, ".complete"), "w") as f:
        f.write(f"onnx {onnx.__version__} onnxruntime {ort.__version__} quirks 1\n")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    print(f"wrote minus_one, external to {final}")


if __name__ == "__main__":
    main()
