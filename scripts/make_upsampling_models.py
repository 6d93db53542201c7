#!/usr/bin/env python3
"""Builds exporter-style models of the ops real detectors and classic classifiers use
(ConvTranspose, LRN, InstanceNormalization, DepthToSpace, a general Pow), and their
onnxruntime outputs (into a git-ignored folder), for tests/onnx_upsampling.rs.

    .venv/bin/python scripts/make_upsampling_models.py target/onnx-tests/upsampling

Each model gets a folder MODEL/ with model.onnx, one NAME.npy per input and
want_NAME.npy per output (onnxruntime's, graph optimizations off):

- dbnet_head: the probability head of a DBNet-style text detector, as torch.onnx.export
  writes it: Conv 3x3 (pad 1) -> BatchNormalization -> Relu -> ConvTranspose (k 2,
  stride 2, with bias) -> BatchNormalization -> Relu -> ConvTranspose (k 2, stride 2, to
  one channel) -> Sigmoid, upsampling a [1, 32, 24, 20] feature map four times.
- classic_stem: an AlexNet/GoogLeNet-style stem and a style-transfer tail: Conv 5x5
  stride 2 (SAME_UPPER) -> Relu -> MaxPool 3x3 stride 2 (ceil_mode) -> LRN (size 5) ->
  InstanceNormalization -> Pow by 1.5 of the Relu'd values -> Conv to 4x channels ->
  DepthToSpace (blocksize 2, CRD: a pixel shuffle).
- vision_resizes: the resizes of vision preprocessing and crop heads (opset 19): an
  antialiased bicubic halving (a = -0.5, pytorch_half_pixel, as torchvision's antialias
  export), Conv 3x3 -> Relu, an antialiased bilinear shrink to given sizes, a bicubic
  align_corners upsampling with exclude_outside, then a tf_crop_and_resize over axes 2
  and 3 whose window reaches past the image (extrapolation_value 0.5).

Written under a temporary name, renamed when complete, stamped `.complete`.
"""

from __future__ import annotations

import sys

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from fixtures import (
    batch_norm,
    const,
    bn_node,
    init,
    write_models,
)

STAMP = "onnx 1.23.2 onnxruntime 1.32.0 upsampling 2"


def dbnet_head(rng):
    c_in, c_mid = 32, 8
    inits = [
        init(rng, "conv_w", [c_mid, c_in, 3, 3], 0.2),
        *batch_norm(rng, "bn1", c_mid),
        # ConvTranspose weights are [C_in, C_out / group, kH, kW]
        init(rng, "up1_w", [c_mid, c_mid, 2, 2]),
        init(rng, "up1_b", [c_mid], 0.1),
        *batch_norm(rng, "bn2", c_mid),
        init(rng, "up2_w", [c_mid, 1, 2, 2]),
        init(rng, "up2_b", [1], 0.1),
    ]
    nodes = [
        h.make_node("Conv", ["x", "conv_w"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        bn_node("bn1", "c1", "n1"),
        h.make_node("Relu", ["n1"], ["r1"]),
        h.make_node(
            "ConvTranspose", ["r1", "up1_w", "up1_b"], ["u1"], kernel_shape=[2, 2], strides=[2, 2]
        ),
        bn_node("bn2", "u1", "n2"),
        h.make_node("Relu", ["n2"], ["r2"]),
        h.make_node(
            "ConvTranspose", ["r2", "up2_w", "up2_b"], ["u2"], kernel_shape=[2, 2], strides=[2, 2]
        ),
        h.make_node("Sigmoid", ["u2"], ["prob"]),
    ]
    graph = h.make_graph(
        nodes,
        "dbnet_head",
        [h.make_tensor_value_info("x", T.FLOAT, [1, c_in, 24, 20])],
        [h.make_tensor_value_info("prob", T.FLOAT, [1, 1, 96, 80])],
        inits,
    )
    x = rng.normal(0, 1, [1, c_in, 24, 20]).astype(np.float32)
    return graph, {"x": x}, 17


def classic_stem(rng):
    inits = [
        init(rng, "stem_w", [8, 3, 5, 5], 0.3),
        init(rng, "stem_b", [8], 0.1),
        nh.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "in_scale"),
        nh.from_array(rng.uniform(-0.5, 0.5, 8).astype(np.float32), "in_bias"),
        nh.from_array(np.array(1.5, np.float32), "power"),
        init(rng, "shuffle_w", [12, 8, 3, 3], 0.3),
    ]
    nodes = [
        h.make_node(
            "Conv",
            ["x", "stem_w", "stem_b"],
            ["c1"],
            kernel_shape=[5, 5],
            strides=[2, 2],
            auto_pad="SAME_UPPER",
        ),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        h.make_node("LRN", ["p1"], ["l1"], size=5, alpha=1e-3, beta=0.75, bias=2.0),
        h.make_node("InstanceNormalization", ["l1", "in_scale", "in_bias"], ["i1"], epsilon=1e-5),
        h.make_node("Relu", ["i1"], ["r2"]),
        h.make_node("Pow", ["r2", "power"], ["w1"]),
        h.make_node("Conv", ["w1", "shuffle_w"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        h.make_node("DepthToSpace", ["c2"], ["y"], blocksize=2, mode="CRD"),
    ]
    # 3x37x45 -> conv SAME stride 2: 19x23 -> pool ceil: 9x11 -> shuffle: 18x22
    graph = h.make_graph(
        nodes,
        "classic_stem",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 37, 45])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 3, 18, 22])],
        inits,
    )
    x = rng.normal(0, 1, [1, 3, 37, 45]).astype(np.float32)
    return graph, {"x": x}, 17


def vision_resizes(rng):
    inits = [
        const("half", [1.0, 1.0, 0.5, 0.5]),
        init(rng, "conv_w", [8, 3, 3, 3], 0.3),
        init(rng, "conv_b", [8], 0.1),
        const("shrunk", [1, 8, 15, 20], np.int64),
        const("grown", [1, 8, 31, 41], np.int64),
        const("window", [0.1, -0.2, 0.9, 1.15]),
        const("crop", [12, 16], np.int64),
    ]
    nodes = [
        h.make_node(
            "Resize",
            ["x", "", "half"],
            ["r1"],
            mode="cubic",
            cubic_coeff_a=-0.5,
            antialias=1,
            coordinate_transformation_mode="pytorch_half_pixel",
        ),
        h.make_node("Conv", ["r1", "conv_w", "conv_b"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["a1"]),
        h.make_node("Resize", ["a1", "", "", "shrunk"], ["r2"], mode="linear", antialias=1),
        h.make_node(
            "Resize",
            ["r2", "", "", "grown"],
            ["r3"],
            mode="cubic",
            exclude_outside=1,
            coordinate_transformation_mode="align_corners",
        ),
        h.make_node(
            "Resize",
            ["r3", "window", "", "crop"],
            ["y"],
            mode="linear",
            axes=[2, 3],
            coordinate_transformation_mode="tf_crop_and_resize",
            extrapolation_value=0.5,
        ),
    ]
    # 45x61 -> halved: 22x30 -> shrunk 15x20 -> grown 31x41 -> cropped 12x16
    graph = h.make_graph(
        nodes,
        "vision_resizes",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 45, 61])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 8, 12, 16])],
        inits,
    )
    x = rng.normal(0, 1, [1, 3, 45, 61]).astype(np.float32)
    return graph, {"x": x}, 19


MODELS = {
    "dbnet_head": dbnet_head,
    "classic_stem": classic_stem,
    "vision_resizes": vision_resizes,
}


def main(out: str) -> None:
    write_models(out, STAMP, 20261202, MODELS)


if __name__ == "__main__":
    main(sys.argv[1])
