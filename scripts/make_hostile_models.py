#!/usr/bin/env python3
"""Builds the ONNX models of the hostile-input corpus (issue 19) and onnxruntime's
outputs for them (into a git-ignored folder), for tests/hostile_input.rs.

    .venv/bin/python scripts/make_hostile_models.py target/onnx-tests/hostile

Valid models (row 1: results that are not float32; row 13: a 0-sized dim) get a folder
MODEL/ with model.onnx, one NAME.npy per input and want_NAME.npy per output
(onnxruntime's, graph optimizations off):

- shape: the int64 `Shape` of a [2, 3, 5] float input.
- dropout: Dropout at opset 13 without `training_mode` (inference): `y` is the input,
  `mask` a bool tensor of all true.
- zero_dim (row 13): a model as an exporter writes it (named nodes, initializers, opset
  17) whose input has a 0-sized dim: `x` is [2, 0]; `y` = Relu(x · W + b) (W is [0, 4],
  so the product is zeros and `y` the bias's ReLU) beside ReduceSum(x) and ReduceMean(x)
  over the empty axis (zeros: ONNX leaves the mean undefined, onnxruntime gives 0) and a
  Softmax of an empty slice, concatenated to [2, 6]; `e` = Relu(x), itself empty.

Invalid models (row 13), each one file, which smelt must refuse naming the node:

- relu_two_inputs.onnx: a Relu node given two inputs.
- duplicate_attribute.onnx: a Softmax node with `axis` given twice.

Written under a temporary name, renamed when complete, stamped `.complete`.
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h

STAMP = "onnx 1.23.2 onnxruntime 1.32.0 hostile 3"


def model(nodes, inputs, outputs, opset=17):
    graph = h.make_graph(nodes, "hostile", inputs, outputs)
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def f32(name, dims):
    return h.make_tensor_value_info(name, T.FLOAT, dims)


def shape(rng):
    m = model(
        [h.make_node("Shape", ["x"], ["s"], name="shape_of_x")],
        [f32("x", [2, 3, 5])],
        [h.make_tensor_value_info("s", T.INT64, [3])],
    )
    return m, {"x": rng.standard_normal([2, 3, 5]).astype(np.float32)}


def dropout(rng):
    m = model(
        [h.make_node("Dropout", ["x"], ["y", "mask"], name="drop")],
        [f32("x", [2, 3])],
        [f32("y", [2, 3]), h.make_tensor_value_info("mask", T.BOOL, [2, 3])],
        opset=13,
    )
    return m, {"x": rng.standard_normal([2, 3]).astype(np.float32)}


def zero_dim(rng):
    init = [
        h.make_tensor("fc.weight", T.FLOAT, [0, 4], []),
        h.make_tensor("fc.bias", T.FLOAT, [4], rng.standard_normal(4).astype(np.float32)),
        h.make_tensor("sum.axes", T.INT64, [1], [1]),
        h.make_tensor("cut.starts", T.INT64, [1], [0]),
        h.make_tensor("cut.ends", T.INT64, [1], [0]),
        h.make_tensor("cut.axes", T.INT64, [1], [1]),
    ]
    nodes = [
        h.make_node("MatMul", ["x", "fc.weight"], ["/fc/MatMul_output_0"], name="/fc/MatMul"),
        h.make_node("Add", ["/fc/MatMul_output_0", "fc.bias"], ["/fc/Add_output_0"], name="/fc/Add"),
        h.make_node("Relu", ["/fc/Add_output_0"], ["/act/Relu_output_0"], name="/act/Relu"),
        h.make_node(
            "ReduceSum", ["x", "sum.axes"], ["/sum/ReduceSum_output_0"], name="/sum/ReduceSum", keepdims=1
        ),
        h.make_node(
            "Slice",
            ["/act/Relu_output_0", "cut.starts", "cut.ends", "cut.axes"],
            ["/cut/Slice_output_0"],
            name="/cut/Slice",
        ),
        h.make_node(
            "ReduceMean", ["x"], ["/mean/ReduceMean_output_0"], name="/mean/ReduceMean", axes=[1], keepdims=1
        ),
        h.make_node("Softmax", ["/cut/Slice_output_0"], ["/cut/Softmax_output_0"], name="/cut/Softmax", axis=1),
        h.make_node(
            "Concat",
            ["/act/Relu_output_0", "/sum/ReduceSum_output_0", "/mean/ReduceMean_output_0", "/cut/Softmax_output_0"],
            ["y"],
            name="/Concat",
            axis=1,
        ),
        h.make_node("Relu", ["x"], ["e"], name="/empty/Relu"),
    ]
    outputs = [f32("y", [2, 6]), f32("e", [2, 0])]
    graph = h.make_graph(nodes, "main_graph", [f32("x", [2, 0])], outputs, init)
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], producer_name="pytorch")
    m.ir_version = 8
    return m, {"x": np.zeros([2, 0], np.float32)}


def invalid():
    relu2 = model(
        [h.make_node("Relu", ["x", "y"], ["r"], name="relu_two")],
        [f32("x", [2, 3]), f32("y", [2, 3])],
        [f32("r", [2, 3])],
    )
    soft = h.make_node("Softmax", ["x"], ["r"], name="soft_twice", axis=1)
    soft.attribute.extend([h.make_attribute("axis", 0)])
    dup = model([soft], [f32("x", [2, 3])], [f32("r", [2, 3])])
    return {"relu_two_inputs": relu2, "duplicate_attribute": dup}


VALID = {"shape": shape, "dropout": dropout, "zero_dim": zero_dim}


def main(out: str) -> None:
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    rng = np.random.default_rng(20261219)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for name, build in VALID.items():
        m, inputs = build(rng)
        onnx.checker.check_model(m, full_check=True)
        d = os.path.join(tmp, name)
        os.makedirs(d)
        onnx.save(m, os.path.join(d, "model.onnx"))
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        for k, v in inputs.items():
            np.save(os.path.join(d, k + ".npy"), v)
        for o, v in zip(sess.get_outputs(), sess.run(None, inputs)):
            np.save(os.path.join(d, "want_" + o.name + ".npy"), v)
    for name, m in invalid().items():
        # onnxruntime refuses the first two; the checker is not asked
        onnx.save(m, os.path.join(tmp, name + ".onnx"))
    with open(os.path.join(tmp, ".complete"), "w") as f:
        f.write(STAMP + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print(f"wrote {', '.join(VALID)} and {', '.join(invalid())} to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
