#!/usr/bin/env python3
"""Builds the ONNX models smelt is checked on, with random weights, and their onnxruntime
reference outputs (into a git-ignored folder).

    .venv/bin/python scripts/make_models.py target/onnx-tests/models

Each model gets a folder MODEL/ with model.onnx and test_data_set_0/{input,output}_N.pb
(the layout of ONNX's own test data):

- resnet18, resnet50: torchvision's layer structure (7x7 stem, max pool, BasicBlock
  [2,2,2,2] / Bottleneck [3,4,6,3] with the stride on the 3x3 conv, 1x1 downsample +
  BN, global average pool, fully connected 1000), built with onnx.helper (torch is not
  needed). BatchNormalization stays its own node with randomized running statistics.
  resnet18 flattens with the Shape/Gather/Unsqueeze/Concat/Reshape chain older PyTorch
  exports emit; resnet50 uses Flatten and declares a dynamic batch dimension "N".
- residual_tail: Conv3x3 -> BatchNormalization -> Add(shortcut) -> Relu at C64 56x56.

Weights come from a fixed seed; outputs from onnxruntime with graph optimizations
disabled. Written under a temporary name, renamed when complete, stamped `.complete`.
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class Builder:
    """Accumulates nodes and initializers with unique, readable names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def node(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int, name: str) -> str:
        fan_in = cin * k * k
        w = self.rng.normal(0.0, np.sqrt(2.0 / fan_in), (cout, cin, k, k)).astype(np.float32)
        self.init(f"{name}.weight", w)
        return self.node(
            "Conv", [x, f"{name}.weight"], name,
            kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4,
        )

    def bn(self, x: str, c: int, name: str) -> str:
        r = self.rng
        self.init(f"{name}.weight", r.uniform(0.5, 1.0, c).astype(np.float32))
        self.init(f"{name}.bias", r.normal(0.0, 0.1, c).astype(np.float32))
        self.init(f"{name}.running_mean", r.normal(0.0, 0.1, c).astype(np.float32))
        self.init(f"{name}.running_var", r.uniform(0.5, 2.0, c).astype(np.float32))
        ins = [x] + [f"{name}.{p}" for p in ("weight", "bias", "running_mean", "running_var")]
        return self.node("BatchNormalization", ins, name, epsilon=1e-5)

    def relu(self, x: str, name: str) -> str:
        return self.node("Relu", [x], name)


def basic_block(b: Builder, x: str, cin: int, cout: int, stride: int, name: str) -> str:
    y = b.relu(b.bn(b.conv(x, cin, cout, 3, stride, f"{name}.conv1"), cout, f"{name}.bn1"), f"{name}.relu1")
    y = b.bn(b.conv(y, cout, cout, 3, 1, f"{name}.conv2"), cout, f"{name}.bn2")
    shortcut = x
    if stride != 1 or cin != cout:
        shortcut = b.bn(b.conv(x, cin, cout, 1, stride, f"{name}.downsample.0"), cout, f"{name}.downsample.1")
    return b.relu(b.node("Add", [y, shortcut], f"{name}.add"), f"{name}.relu")


def bottleneck(b: Builder, x: str, cin: int, width: int, stride: int, name: str) -> str:
    cout = width * 4
    y = b.relu(b.bn(b.conv(x, cin, width, 1, 1, f"{name}.conv1"), width, f"{name}.bn1"), f"{name}.relu1")
    y = b.relu(b.bn(b.conv(y, width, width, 3, stride, f"{name}.conv2"), width, f"{name}.bn2"), f"{name}.relu2")
    y = b.bn(b.conv(y, width, cout, 1, 1, f"{name}.conv3"), cout, f"{name}.bn3")
    shortcut = x
    if stride != 1 or cin != cout:
        shortcut = b.bn(b.conv(x, cin, cout, 1, stride, f"{name}.downsample.0"), cout, f"{name}.downsample.1")
    return b.relu(b.node("Add", [y, shortcut], f"{name}.add"), f"{name}.relu")


def resnet(depth: int) -> onnx.ModelProto:
    b = Builder(seed=depth)
    x = b.relu(b.bn(b.conv("input", 3, 64, 7, 2, "conv1"), 64, "bn1"), "relu")
    x = b.node("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    blocks, block = ([2, 2, 2, 2], basic_block) if depth == 18 else ([3, 4, 6, 3], bottleneck)
    cin = 64
    for stage, count in enumerate(blocks):
        width = 64 << stage
        for i in range(count):
            stride = 2 if stage > 0 and i == 0 else 1
            x = block(b, x, cin, width, stride, f"layer{stage + 1}.{i}")
            cin = width if depth == 18 else width * 4
    x = b.node("GlobalAveragePool", [x], "avgpool")
    if depth == 18:
        # x.view(x.size(0), -1) as older exporters wrote it: shape arithmetic to fold
        shape = b.node("Shape", [x], "flatten.shape")
        b.init("flatten.zero", np.array(0, dtype=np.int64))
        batch = b.node("Gather", [shape, "flatten.zero"], "flatten.batch", axis=0)
        b.init("flatten.axes", np.array([0], dtype=np.int64))
        batch1 = b.node("Unsqueeze", [batch, "flatten.axes"], "flatten.batch1")
        b.init("flatten.minus_one", np.array([-1], dtype=np.int64))
        target = b.node("Concat", [batch1, "flatten.minus_one"], "flatten.target", axis=0)
        x = b.node("Reshape", [x, target], "flatten")
    else:
        x = b.node("Flatten", [x], "flatten", axis=1)
    fc_w = b.rng.normal(0.0, np.sqrt(1.0 / cin), (1000, cin)).astype(np.float32)
    b.init("fc.weight", fc_w)
    b.init("fc.bias", b.rng.normal(0.0, 0.01, 1000).astype(np.float32))
    b.nodes.append(helper.make_node("Gemm", [x, "fc.weight", "fc.bias"], ["output"], name="fc", transB=1))
    batch_dim = 1 if depth == 18 else "N"
    graph = helper.make_graph(
        b.nodes, f"resnet{depth}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch_dim, 3, 224, 224])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch_dim, 1000])],
        b.inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def residual_tail() -> onnx.ModelProto:
    b = Builder(seed=7)
    y = b.bn(b.conv("x", 64, 64, 3, 1, "conv"), 64, "bn")
    y = b.node("Add", [y, "shortcut"], "add")
    b.nodes.append(helper.make_node("Relu", [y], ["y"], name="relu"))
    info = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 64, 56, 56])  # noqa: E731
    graph = helper.make_graph(b.nodes, "residual_tail", [info("x"), info("shortcut")], [info("y")], b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def write_case(out: str, name: str, model: onnx.ModelProto, seed: int) -> None:
    onnx.checker.check_model(model)
    case = os.path.join(out, name)
    data = os.path.join(case, "test_data_set_0")
    os.makedirs(data)
    onnx.save_model(model, os.path.join(case, "model.onnx"))
    rng = np.random.default_rng(seed)
    feeds = {}
    for j, inp in enumerate(model.graph.input):
        dims = [d.dim_value if d.HasField("dim_value") else 1 for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = rng.standard_normal(dims).astype(np.float32)
        with open(os.path.join(data, f"input_{j}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(feeds[inp.name], inp.name).SerializeToString())
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for j, value in enumerate(session.run(None, feeds)):
        name_j = model.graph.output[j].name
        with open(os.path.join(data, f"output_{j}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(value, name_j).SerializeToString())


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    final = sys.argv[1]
    tmp = final + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    write_case(tmp, "residual_tail", residual_tail(), seed=1)
    write_case(tmp, "resnet18", resnet(18), seed=2)
    write_case(tmp, "resnet50", resnet(50), seed=3)
    with open(os.path.join(tmp, ".complete"), "w") as f:
        f.write(f"onnx {onnx.__version__} onnxruntime {ort.__version__}\n")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    print(f"wrote residual_tail, resnet18, resnet50 to {final}")


if __name__ == "__main__":
    main()
