#!/usr/bin/env python3
"""Writes the ONNX models of the benchmark (issue 6) into a folder, default
target/bench-models:

    .venv/bin/python benches/make_bench_models.py [OUT_DIR]

- resnet18.onnx, resnet50.onnx: the networks of scripts/make_models.py (same builder,
  same seeds; resnet50 has a dynamic batch dimension "N", pinned to 1 by benches/compare.py);
- tail3x3_C_HW.onnx: Conv3x3(C->C) -> BatchNormalization -> Add(shortcut) -> Relu at
  (C, HW) = (64, 56), (128, 28), (256, 14), (512, 7);
- tail1x1_64to256_56.onnx, tail1x1_256to64_56.onnx: Conv1x1 -> BN -> Add -> Relu at 56x56
  (the expanding and reducing 1x1 convolutions of a bottleneck);
- dwtail_256_56.onnx: depthwise Conv3x3 (group = C) -> BN -> Add -> Relu at C256 56x56.

Inputs of every tail: x (the conv input) and shortcut (the residual, the conv's output
shape). Weights are random with fixed seeds. Files are written under a temporary name and
renamed, so an interrupted run leaves no half-written model.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import make_models  # noqa: E402  (the ResNet builder; scripts/ is on the path above)

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


def models() -> list[tuple[str, onnx.ModelProto]]:
    out = [("resnet18", make_models.resnet(18)), ("resnet50", make_models.resnet(50))]
    for i, (c, hw) in enumerate(TAILS_3X3):
        out.append((f"tail3x3_{c}_{hw}", tail("tail3x3", c, c, hw, 3, False, seed=100 + i)))
    for i, (cin, cout, hw) in enumerate(TAILS_1X1):
        out.append((f"tail1x1_{cin}to{cout}_{hw}", tail("tail1x1", cin, cout, hw, 1, False, seed=200 + i)))
    for i, (c, hw) in enumerate(DEPTHWISE):
        out.append((f"dwtail_{c}_{hw}", tail("dwtail", c, c, hw, 3, True, seed=300 + i)))
    return out


def main() -> None:
    if len(sys.argv) > 2:
        sys.exit(__doc__)
    out = sys.argv[1] if len(sys.argv) == 2 else os.path.join(ROOT, "target", "bench-models")
    os.makedirs(out, exist_ok=True)
    for name, model in models():
        onnx.checker.check_model(model)
        path = os.path.join(out, f"{name}.onnx")
        tmp = f"{path}.tmp{os.getpid()}"
        onnx.save_model(model, tmp)
        os.replace(tmp, path)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
