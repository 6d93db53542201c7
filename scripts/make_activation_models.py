#!/usr/bin/env python3
"""Builds exporter-style models of the activations real exports write out or use as
nodes (the tanh GELU, Mish, per-channel PRelu), and their onnxruntime outputs (into a
git-ignored folder), for tests/onnx_activations.rs.

    .venv/bin/python scripts/make_activation_models.py target/onnx-tests/activations

Each model gets a folder MODEL/ with model.onnx, one NAME.npy per input and
want_NAME.npy per output (onnxruntime's, graph optimizations off):

- gelu_new_mlp: a transformer MLP as torch.onnx.export writes HF `gelu_new` (opset 17):
  MatMul + Add bias, then `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))`
  spelled out (Pow 3, Mul, Add, Mul, Tanh, Add 1, Mul 0.5, Mul), MatMul + Add back to
  the width, on [1, 16, 32] tokens.
- yolo_mish: a YOLOv4-style block (opset 18): Conv 3x3 -> BatchNormalization -> Mish
  written out as Softplus, Tanh, Mul (how darknet converters and torch below opset 18
  write it), then Conv 3x3 stride 2 with bias -> the Mish node.
- conv_prelu: an InsightFace/PP-OCR-style block (opset 17): Conv 3x3 -> BatchNormalization
  -> PRelu with a [C, 1, 1] slope, Conv 1x1 with bias -> PRelu with a [C, 1, 1] slope.

Written under a temporary name, renamed when complete, stamped `.complete`.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from fixtures import (
    batch_norm,
    bn_node,
    init,
    write_models,
)

STAMP = "onnx 1.23.2 onnxruntime 1.32.0 activations 1"


def scalar(name, value):
    return nh.from_array(np.array(value, np.float32), name)


def gelu_new_mlp(rng):
    width, hidden, tokens = 32, 64, 16
    inits = [
        init(rng, "fc1_w", [width, hidden], 0.4),
        init(rng, "fc1_b", [hidden], 0.2),
        init(rng, "fc2_w", [hidden, width], 0.3),
        init(rng, "fc2_b", [width], 0.2),
        scalar("three", 3.0),
        scalar("cubic", 0.044715),
        scalar("scale", math.sqrt(2.0 / math.pi)),
        scalar("one", 1.0),
        scalar("half", 0.5),
    ]
    nodes = [
        h.make_node("MatMul", ["x", "fc1_w"], ["m1"]),
        h.make_node("Add", ["m1", "fc1_b"], ["h"]),
        h.make_node("Mul", ["h", "half"], ["half_h"]),
        h.make_node("Pow", ["h", "three"], ["cube"]),
        h.make_node("Mul", ["cube", "cubic"], ["cc"]),
        h.make_node("Add", ["h", "cc"], ["inner"]),
        h.make_node("Mul", ["inner", "scale"], ["scaled"]),
        h.make_node("Tanh", ["scaled"], ["t"]),
        h.make_node("Add", ["t", "one"], ["gate"]),
        h.make_node("Mul", ["half_h", "gate"], ["g"]),
        h.make_node("MatMul", ["g", "fc2_w"], ["m2"]),
        h.make_node("Add", ["m2", "fc2_b"], ["y"]),
    ]
    graph = h.make_graph(
        nodes,
        "gelu_new_mlp",
        [h.make_tensor_value_info("x", T.FLOAT, [1, tokens, width])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, tokens, width])],
        inits,
    )
    # wide enough that the GELU's tanh leaves its linear range
    x = rng.normal(0, 2, [1, tokens, width]).astype(np.float32)
    return graph, {"x": x}, 17


def yolo_mish(rng):
    inits = [
        init(rng, "c1_w", [16, 3, 3, 3], 0.4),
        *batch_norm(rng, "bn1", 16),
        init(rng, "c2_w", [8, 16, 3, 3], 0.2),
        init(rng, "c2_b", [8], 0.2),
    ]
    nodes = [
        h.make_node("Conv", ["x", "c1_w"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        bn_node("bn1", "c1", "n1"),
        h.make_node("Softplus", ["n1"], ["sp"]),
        h.make_node("Tanh", ["sp"], ["t"]),
        h.make_node("Mul", ["n1", "t"], ["a1"]),
        h.make_node(
            "Conv",
            ["a1", "c2_w", "c2_b"],
            ["c2"],
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
        ),
        h.make_node("Mish", ["c2"], ["y"]),
    ]
    graph = h.make_graph(
        nodes,
        "yolo_mish",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 20, 24])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 8, 10, 12])],
        inits,
    )
    x = rng.normal(0, 1.5, [1, 3, 20, 24]).astype(np.float32)
    return graph, {"x": x}, 18


def conv_prelu(rng):
    inits = [
        init(rng, "c1_w", [16, 3, 3, 3], 0.4),
        *batch_norm(rng, "bn1", 16),
        nh.from_array(rng.uniform(0.05, 0.5, [16, 1, 1]).astype(np.float32), "slope1"),
        init(rng, "c2_w", [24, 16, 1, 1], 0.3),
        init(rng, "c2_b", [24], 0.2),
        # negative and above-one slopes as well: nothing but the definition holds them
        nh.from_array(rng.uniform(-0.5, 1.5, [24, 1, 1]).astype(np.float32), "slope2"),
    ]
    nodes = [
        h.make_node("Conv", ["x", "c1_w"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        bn_node("bn1", "c1", "n1"),
        h.make_node("PRelu", ["n1", "slope1"], ["p1"]),
        h.make_node("Conv", ["p1", "c2_w", "c2_b"], ["c2"], kernel_shape=[1, 1]),
        h.make_node("PRelu", ["c2", "slope2"], ["y"]),
    ]
    graph = h.make_graph(
        nodes,
        "conv_prelu",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 18, 22])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 24, 18, 22])],
        inits,
    )
    x = rng.normal(0, 1, [1, 3, 18, 22]).astype(np.float32)
    return graph, {"x": x}, 17


MODELS = {
    "gelu_new_mlp": gelu_new_mlp,
    "yolo_mish": yolo_mish,
    "conv_prelu": conv_prelu,
}


def main(out: str) -> None:
    write_models(out, STAMP, 20261203, MODELS)


if __name__ == "__main__":
    main(sys.argv[1])
