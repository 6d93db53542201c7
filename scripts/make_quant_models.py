#!/usr/bin/env python3
"""Builds QDQ models as onnxruntime's static quantization writes them, and their
onnxruntime outputs (into a git-ignored folder), for tests/onnx_quant.rs.

    .venv/bin/python scripts/make_quant_models.py target/onnx-tests/quant

ORT's `quantize_static` with the QDQ format puts a QuantizeLinear -> DequantizeLinear
pair on every activation (uint8, per tensor), stores weights as int8 initializers read
by a DequantizeLinear (per output channel, `axis` 0, zero point 0) and biases as int32
initializers dequantized with scale = input scale * weight scale. Each model gets a
folder MODEL/ with model.onnx, x.npy and want_y.npy (onnxruntime's, graph optimizations
off, so it computes the QDQ nodes as written):

- qdq_conv: [1, 3, 12, 12] -> Q/DQ -> Conv 3x3 pad 1 (8 channels, per-channel int8
  weights, int32 bias) -> Relu -> Q/DQ -> Conv 1x1 (4 channels) -> Q/DQ (opset 13).
- qdq_matmul: [1, 16, 32] tokens -> Q/DQ (int8 activations, as `--activation_type
  QInt8` writes them) -> MatMul by int8 per-tensor weights -> Add int32-dequantized
  bias -> Q/DQ, in opset 21 with uint16 activations on the second product (ORT's
  16-bit QDQ) -> MatMul -> Q/DQ.
- dynamic_matmul: the operator form of ORT's `quantize_dynamic` (QOperator), reductions
  longer than one exact f32 chunk: x [1, 6, 600] -> DynamicQuantizeLinear (uint8) ->
  MatMulInteger by uint8 weights with per-column zero points -> Cast -> Mul by the two
  scales -> Relu -> QuantizeLinear -> QLinearMatMul (K 300, int8 weights, per-column
  scales and zero points) -> DequantizeLinear (opset 21).
- qlinear_conv: the operator form of a quantized conv layer, reductions longer than one
  exact chunk: x [1, 64, 9, 9] -> QuantizeLinear (uint8) -> QLinearConv 3x3 pad 1 (16
  channels, int8 per-channel weights, int32 bias) -> DequantizeLinear, and the same
  quantized input through ConvInteger (uint8 weights with a zero point, stride 2) -> Cast
  -> Mul by the scales, the two results concatenated along the channels (opset 13).

dynamic_matmul and qlinear_conv are exact integer arithmetic: their want_y.npy is
onnxruntime's where it equals ONNX's reference evaluator, else the reference's, with
oracle.txt saying so (onnxruntime's u8s8 kernels saturate on x86-64 without VNNI).

Written under a temporary name, renamed when complete, stamped `.complete`.
"""

from __future__ import annotations

import sys

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from fixtures import const, write_models

STAMP = "onnx 1.23.2 onnxruntime 1.32.0 quant 4"


def qparams(lo, hi, dtype):
    """The scale and zero point ORT's MinMax calibration gives the range [lo, hi]."""
    info = np.iinfo(dtype)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if dtype in (np.int8, np.int16):
        m = max(abs(lo), abs(hi))
        return np.float32(2 * m / (info.max - info.min)), dtype(0)
    scale = np.float32((hi - lo) / (info.max - info.min))
    return scale, dtype(round(-lo / scale))


def qdq(name, out, scale, zero, nodes, inits):
    """A QuantizeLinear -> DequantizeLinear pair from `name` to `out`."""
    inits += [
        nh.from_array(np.array(scale, np.float32), f"{out}_scale"),
        nh.from_array(np.array(zero), f"{out}_zero"),
    ]
    nodes += [
        h.make_node("QuantizeLinear", [name, f"{out}_scale", f"{out}_zero"], [f"{out}_q"]),
        h.make_node("DequantizeLinear", [f"{out}_q", f"{out}_scale", f"{out}_zero"], [out]),
    ]


def weight(rng, name, shape, in_scale, nodes, inits, per_channel=True):
    """Int8 weights (symmetric, per output channel along axis 0 or per tensor) and the
    dequantized name; returns (dequantized name, weight scales)."""
    w = rng.uniform(-0.5, 0.5, shape).astype(np.float32)
    if per_channel:
        m = np.abs(w.reshape(shape[0], -1)).max(axis=1)
        scale = (2 * m / 255).astype(np.float32)
        q = np.clip(np.rint(w / scale.reshape([-1] + [1] * (len(shape) - 1))), -127, 127)
        zero = np.zeros(shape[0], np.int8)
        axis = [h.make_attribute("axis", 0)]
    else:
        scale = np.float32(2 * np.abs(w).max() / 255)
        q = np.clip(np.rint(w / scale), -127, 127)
        zero = np.int8(0)
        axis = []
    inits += [
        nh.from_array(q.astype(np.int8), f"{name}_q"),
        nh.from_array(np.array(scale, np.float32), f"{name}_scale"),
        nh.from_array(np.array(zero, np.int8), f"{name}_zero"),
    ]
    node = h.make_node(
        "DequantizeLinear", [f"{name}_q", f"{name}_scale", f"{name}_zero"], [name]
    )
    node.attribute.extend(axis)
    nodes.append(node)
    return name, scale


def bias(rng, name, n, scale, nodes, inits):
    """An int32 bias dequantized with `scale` (input scale times weight scales)."""
    b = rng.uniform(-0.3, 0.3, n).astype(np.float32)
    scale = np.broadcast_to(np.asarray(scale, np.float32), (n,)).astype(np.float32)
    inits += [
        nh.from_array(np.rint(b / scale).astype(np.int32), f"{name}_q"),
        nh.from_array(scale, f"{name}_scale"),
        nh.from_array(np.zeros(n, np.int32), f"{name}_zero"),
    ]
    node = h.make_node(
        "DequantizeLinear", [f"{name}_q", f"{name}_scale", f"{name}_zero"], [name]
    )
    node.attribute.extend([h.make_attribute("axis", 0)])
    nodes.append(node)
    return name


def qdq_conv(rng):
    nodes, inits = [], []
    x = rng.uniform(-1.0, 1.0, [1, 3, 12, 12]).astype(np.float32)
    xs, xz = qparams(-1.0, 1.0, np.uint8)
    qdq("x", "xd", xs, xz, nodes, inits)
    w1, w1s = weight(rng, "w1", [8, 3, 3, 3], xs, nodes, inits)
    b1 = bias(rng, "b1", 8, xs * w1s, nodes, inits)
    nodes.append(h.make_node("Conv", ["xd", w1, b1], ["c1"], pads=[1, 1, 1, 1]))
    nodes.append(h.make_node("Relu", ["c1"], ["r1"]))
    rs, rz = qparams(0.0, 3.0, np.uint8)
    qdq("r1", "r1d", rs, rz, nodes, inits)
    w2, w2s = weight(rng, "w2", [4, 8, 1, 1], rs, nodes, inits)
    b2 = bias(rng, "b2", 4, rs * w2s, nodes, inits)
    nodes.append(h.make_node("Conv", ["r1d", w2, b2], ["c2"]))
    ys, yz = qparams(-2.0, 2.0, np.uint8)
    qdq("c2", "y", ys, yz, nodes, inits)
    graph = h.make_graph(
        nodes,
        "qdq_conv",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 12, 12])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 12, 12])],
        inits,
    )
    return graph, {"x": x}, 13


def qdq_matmul(rng):
    nodes, inits = [], []
    x = rng.uniform(-1.0, 1.0, [1, 16, 32]).astype(np.float32)
    xs, xz = qparams(-1.0, 1.0, np.int8)
    qdq("x", "xd", xs, xz, nodes, inits)
    w1, w1s = weight(rng, "w1", [32, 24], xs, nodes, inits, per_channel=False)
    nodes.append(h.make_node("MatMul", ["xd", w1], ["m1"]))
    b1 = bias(rng, "b1", 24, xs * w1s, nodes, inits)
    nodes.append(h.make_node("Add", ["m1", b1], ["a1"]))
    hs, hz = qparams(-4.0, 4.0, np.uint16)
    qdq("a1", "a1d", hs, hz, nodes, inits)
    w2, _ = weight(rng, "w2", [24, 8], hs, nodes, inits, per_channel=False)
    nodes.append(h.make_node("MatMul", ["a1d", w2], ["m2"]))
    ys, yz = qparams(-4.0, 4.0, np.uint8)
    qdq("m2", "y", ys, yz, nodes, inits)
    graph = h.make_graph(
        nodes,
        "qdq_matmul",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 16, 32])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 16, 8])],
        inits,
    )
    return graph, {"x": x}, 21


def dynamic_matmul(rng):
    m, k, n, n2 = 6, 600, 300, 20
    x = rng.uniform(-2.0, 2.0, [1, m, k]).astype(np.float32)
    w = rng.integers(0, 256, [k, n]).astype(np.uint8)
    wz = rng.integers(100, 156, [n]).astype(np.uint8)
    ws = np.float32(0.02)
    w2 = rng.integers(-128, 128, [n, n2]).astype(np.int8)
    w2s = rng.uniform(0.002, 0.01, [n2]).astype(np.float32)
    w2z = np.zeros([n2], np.int8)
    hs, hz = qparams(0.0, 60.0, np.uint8)
    ys, yz = qparams(-3.0, 3.0, np.uint8)
    inits = [
        nh.from_array(w, "w"),
        nh.from_array(wz, "wz"),
        const("ws", ws, np.float32),
        nh.from_array(w2, "w2"),
        nh.from_array(w2s, "w2s"),
        nh.from_array(w2z, "w2z"),
        const("hs", hs, np.float32),
        const("hz", hz, np.uint8),
        const("ys", ys, np.float32),
        const("yz", yz, np.uint8),
    ]
    nodes = [
        h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        h.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"]),
        h.make_node("Cast", ["acc"], ["accf"], to=T.FLOAT),
        h.make_node("Mul", ["xs", "ws"], ["s"]),
        h.make_node("Mul", ["accf", "s"], ["h"]),
        h.make_node("Relu", ["h"], ["hr"]),
        h.make_node("QuantizeLinear", ["hr", "hs", "hz"], ["hq"]),
        h.make_node("QLinearMatMul", ["hq", "hs", "hz", "w2", "w2s", "w2z", "ys", "yz"], ["yq"]),
        h.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
    ]
    graph = h.make_graph(
        nodes,
        "dynamic_matmul",
        [h.make_tensor_value_info("x", T.FLOAT, [1, m, k])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, m, n2])],
        inits,
    )
    return graph, {"x": x}, 21


def qlinear_conv(rng):
    c, m = 64, 16
    x = rng.uniform(-1.0, 1.0, [1, c, 9, 9]).astype(np.float32)
    xs, xz = qparams(-1.0, 1.0, np.uint8)
    w = rng.integers(-127, 128, [m, c, 3, 3]).astype(np.int8)
    ws = rng.uniform(0.001, 0.004, [m]).astype(np.float32)
    b = rng.integers(-2000, 2000, [m]).astype(np.int32)
    ys, yz = qparams(-6.0, 6.0, np.uint8)
    w2 = rng.integers(0, 256, [8, c, 3, 3]).astype(np.uint8)
    w2z = np.uint8(128)
    inits = [
        const("xs", xs, np.float32),
        const("xz", xz, np.uint8),
        nh.from_array(w, "w"),
        nh.from_array(ws, "ws"),
        nh.from_array(np.zeros([m], np.int8), "wz"),
        nh.from_array(b, "b"),
        const("ys", ys, np.float32),
        const("yz", yz, np.uint8),
        nh.from_array(w2, "w2"),
        const("w2z", w2z, np.uint8),
        const("s2", xs * 0.01, np.float32),
        const("full", [1, 16, 9, 9], np.int64),
    ]
    nodes = [
        h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        h.make_node(
            "QLinearConv",
            ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
            ["yq"],
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
        ),
        h.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y1"]),
        h.make_node("ConvInteger", ["xq", "w2", "xz", "w2z"], ["acc"], strides=[2, 2]),
        h.make_node("Cast", ["acc"], ["accf"], to=T.FLOAT),
        h.make_node("Mul", ["accf", "s2"], ["y2"]),
        h.make_node("Flatten", ["y1"], ["f1"], axis=1),
        h.make_node("Flatten", ["y2"], ["f2"], axis=1),
        h.make_node("Concat", ["f1", "f2"], ["y"], axis=1),
    ]
    graph = h.make_graph(
        nodes,
        "qlinear_conv",
        [h.make_tensor_value_info("x", T.FLOAT, [1, c, 9, 9])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, m * 81 + 8 * 16])],
        inits,
    )
    return graph, {"x": x}, 13


MODELS = {
    "qdq_conv": qdq_conv,
    "qdq_matmul": qdq_matmul,
    "dynamic_matmul": dynamic_matmul,
    "qlinear_conv": qlinear_conv,
}


def main(out: str) -> None:
    # their integer products are exact: where onnxruntime saturates (no VNNI), ONNX's
    # reference evaluator is the oracle
    write_models(out, STAMP, 20261202, MODELS, exact=("dynamic_matmul", "qlinear_conv"))


if __name__ == "__main__":
    main(sys.argv[1])
