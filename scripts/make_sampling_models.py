#!/usr/bin/env python3
"""Builds exporter-style models of GridSample's real users, and their onnxruntime outputs
(into a git-ignored folder), for tests/onnx_sampling.rs.

    .venv/bin/python scripts/make_sampling_models.py target/onnx-tests/sampling

Each model gets a folder MODEL/ with model.onnx, one NAME.npy per input and
want_NAME.npy per output (onnxruntime's, graph optimizations off):

- stn_rectifier (opset 16): the spatial-transformer rectification of a text recognizer,
  as torch.onnx.export writes `F.affine_grid` + `F.grid_sample`: a localization network
  (Conv 3x3 stride 2 -> Relu -> Conv 3x3 stride 2 -> Relu -> Flatten -> Gemm -> Tanh,
  bounded as ASTER's head bounds its outputs, scaled and added to a slightly rotated,
  zoomed-out affine transform) gives theta [N, 2, 3]; the affine grid
  is the exporter's decomposition (a constant base grid [1, H*W, 3] of (x, y, 1) MatMul
  theta transposed, Reshape to [N, H, W, 2]); GridSample bilinear, zeros padding,
  align_corners 0, resamples the [2, 3, 32, 96] line image to [2, 3, 24, 80] (the
  zoom-out reaches past the image's edges).
- stn_rectifier_20 (opset 20): the same network as torch.onnx.export writes it from
  opset 20, with the AffineGrid operator and GridSample `linear`.
- flow_warp (opset 20): an optical-flow warp: Conv 3x3 -> Tanh gives a flow field
  [N, 2, H, W] (scaled to reach a third of the image), Transpose to [N, H, W, 2] plus an
  align_corners identity grid, then GridSample cubic with border padding, align_corners
  1; then a fixed warp (a constant grid reaching past the image, as a lens-distortion
  correction keeps) by GridSample nearest with reflection padding. (A grid computed from
  the input would make nearest's rounding flip with the last bit of a sum, which
  `smelt verify`'s wide random inputs find.)

Written under a temporary name, renamed when complete, stamped `.complete`.
"""

from __future__ import annotations

import sys

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from fixtures import init, write_models

STAMP = "onnx 1.23.2 onnxruntime 1.32.0 sampling 3"


def base_grid(height, width, align_corners):
    """PyTorch's affine_grid base: pixel centres in [-1, 1], x fastest, then y."""

    def line(n):
        v = np.linspace(-1.0, 1.0, n, dtype=np.float32)
        return v if align_corners else v * (n - 1) / n

    ys, xs = np.meshgrid(line(height), line(width), indexing="ij")
    return np.stack([xs, ys], axis=-1).astype(np.float32)  # [H, W, 2]


def stn_rectifier(rng, affine_grid_op=False):
    n, c, height, width = 2, 3, 32, 96
    out_h, out_w = 24, 80
    # the localization head's features: 8 x 8 x 24 after two stride-2 convs
    features = 8 * 8 * 24
    angle = 0.1
    theta = np.array(
        [1.15 * np.cos(angle), -np.sin(angle), 0.05, np.sin(angle), 1.2 * np.cos(angle), -0.03],
        np.float32,
    )
    grid = base_grid(out_h, out_w, align_corners=False).reshape(1, out_h * out_w, 2)
    ones = np.ones((1, out_h * out_w, 1), np.float32)
    inits = [
        init(rng, "loc1_w", [8, c, 3, 3], 0.3),
        init(rng, "loc1_b", [8], 0.1),
        init(rng, "loc2_w", [8, 8, 3, 3], 0.3),
        init(rng, "loc2_b", [8], 0.1),
        init(rng, "fc_w", [6, features], 0.02),
        init(rng, "fc_b", [6], 0.1),
        nh.from_array(np.array(0.15, np.float32), "fc_reach"),
        nh.from_array(theta, "theta_base"),
        nh.from_array(np.array([-1, 2, 3], np.int64), "theta_shape"),
        nh.from_array(np.concatenate([grid, ones], axis=-1), "base_grid"),
        nh.from_array(np.array([-1, out_h, out_w, 2], np.int64), "grid_shape"),
    ]
    nodes = [
        h.make_node(
            "Conv", ["x", "loc1_w", "loc1_b"], ["l1"], kernel_shape=[3, 3], strides=[2, 2],
            pads=[1, 1, 1, 1],
        ),
        h.make_node("Relu", ["l1"], ["r1"]),
        h.make_node(
            "Conv", ["r1", "loc2_w", "loc2_b"], ["l2"], kernel_shape=[3, 3], strides=[2, 2],
            pads=[1, 1, 1, 1],
        ),
        h.make_node("Relu", ["l2"], ["r2"]),
        h.make_node("Flatten", ["r2"], ["f"], axis=1),
        h.make_node("Gemm", ["f", "fc_w", "fc_b"], ["t0"], transB=1),
        h.make_node("Tanh", ["t0"], ["t1"]),
        h.make_node("Mul", ["t1", "fc_reach"], ["t2"]),
        h.make_node("Add", ["t2", "theta_base"], ["t"]),
        h.make_node("Reshape", ["t", "theta_shape"], ["theta"]),
    ]
    if affine_grid_op:
        inits.append(nh.from_array(np.array([n, c, out_h, out_w], np.int64), "out_size"))
        nodes += [
            h.make_node("AffineGrid", ["theta", "out_size"], ["grid"], align_corners=0),
            h.make_node("GridSample", ["x", "grid"], ["y"], mode="linear", align_corners=0),
        ]
    else:
        nodes += [
            # affine_grid: base [1, H*W, 3] @ theta^T [N, 3, 2] -> [N, H*W, 2]
            h.make_node("Transpose", ["theta"], ["theta_t"], perm=[0, 2, 1]),
            h.make_node("MatMul", ["base_grid", "theta_t"], ["points"]),
            h.make_node("Reshape", ["points", "grid_shape"], ["grid"]),
            h.make_node(
                "GridSample", ["x", "grid"], ["y"], mode="bilinear", padding_mode="zeros",
                align_corners=0,
            ),
        ]
    graph = h.make_graph(
        nodes,
        "stn_rectifier",
        [h.make_tensor_value_info("x", T.FLOAT, [n, c, height, width])],
        [h.make_tensor_value_info("y", T.FLOAT, [n, c, out_h, out_w])],
        inits,
    )
    x = rng.normal(0, 1, [n, c, height, width]).astype(np.float32)
    return graph, {"x": x}, 20 if affine_grid_op else 16


def stn_rectifier_20(rng):
    return stn_rectifier(rng, affine_grid_op=True)


def flow_warp(rng):
    n, c, height, width = 1, 4, 20, 28
    identity = base_grid(height, width, align_corners=True)[None]
    inits = [
        init(rng, "flow_w", [2, c, 3, 3], 0.5),
        init(rng, "flow_b", [2], 0.1),
        nh.from_array(np.array(0.7, np.float32), "reach"),
        nh.from_array(identity, "identity"),
        nh.from_array(rng.uniform(-1.4, 1.4, [n, height, width, 2]).astype(np.float32), "lens"),
    ]
    nodes = [
        h.make_node("Conv", ["x", "flow_w", "flow_b"], ["f1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        h.make_node("Tanh", ["f1"], ["f2"]),
        h.make_node("Mul", ["f2", "reach"], ["flow"]),
        h.make_node("Transpose", ["flow"], ["flow_t"], perm=[0, 2, 3, 1]),
        h.make_node("Add", ["identity", "flow_t"], ["grid"]),
        h.make_node(
            "GridSample", ["x", "grid"], ["w1"], mode="cubic", padding_mode="border",
            align_corners=1,
        ),
        h.make_node(
            "GridSample", ["w1", "lens"], ["y"], mode="nearest", padding_mode="reflection",
            align_corners=0,
        ),
    ]
    graph = h.make_graph(
        nodes,
        "flow_warp",
        [h.make_tensor_value_info("x", T.FLOAT, [n, c, height, width])],
        [h.make_tensor_value_info("y", T.FLOAT, [n, c, height, width])],
        inits,
    )
    x = rng.normal(0, 1, [n, c, height, width]).astype(np.float32)
    return graph, {"x": x}, 20


MODELS = {
    "stn_rectifier": stn_rectifier,
    "stn_rectifier_20": stn_rectifier_20,
    "flow_warp": flow_warp,
}


def main(out: str) -> None:
    write_models(out, STAMP, 20261202, MODELS)


if __name__ == "__main__":
    main(sys.argv[1])
