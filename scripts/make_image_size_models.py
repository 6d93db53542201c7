#!/usr/bin/env python3
"""Builds models whose image height and width are symbolic, with onnxruntime's outputs at
several sizes (into a git-ignored folder), for tests/dynamic_shapes.rs.

    .venv/bin/python scripts/make_image_size_models.py target/onnx-tests/image_sizes

- segmenter: a segmentation head that takes an image of any size, as torch.onnx.export
  writes `F.interpolate(y, size=x.shape[2:], mode="bilinear")`: x [1, 3, height, width]
  and a region mask m [1, 1, height, width] (two inputs sharing both symbols) ->
  Conv 3x3 (pad 1) -> Relu -> Conv 3x3 stride 2 (pad 1) -> Relu -> Resize (linear,
  half_pixel) to sizes = Concat(Shape(y)[0:2], Shape(x)[2:4]) -> Concat with the first
  feature map -> Conv 1x1 -> Sigmoid -> Mul by m. Its sizes need not be multiples of
  anything: 641 x 479 runs.
- recognizer: a CRNN-style text-line recognizer without its LSTM: x [1, 3, 32, width] ->
  Conv 3x3 -> Relu -> MaxPool 2x2 -> Conv 3x3 -> Relu -> ReduceMean over the height ->
  Transpose to [1, steps, 32] -> MatMul -> Add -> Softmax over 12 classes (steps =
  width / 2, rounded down): one symbol, which windows read across.
- dbnet_fpn: the DBNet-style detector of tests/models/exported (refilled as
  scripts/make_exported_models.py refills it) at 320x320, 640x480 and 960x960, and at
  641x479, which it cannot take (its FPN adds a 41-row map to a 42-row upsampling):
  onnxruntime's error is written to refused_641x479.txt.

Each model gets a folder: model.onnx, then for each size WxH-tagged inputs NAME_TAG.npy
and outputs want_NAME_TAG.npy (TAG is HEIGHTxWIDTH). Written under a temporary name,
renamed when complete, stamped `.complete`.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h

from fixtures import complete_folder, const, init, npy_name, reference_session_options
from make_exported_models import FIXTURES, refill_stubs

STAMP = "onnx 1.23.2 onnxruntime 1.32.0 image sizes 1"

SEGMENTER_SIZES = [(641, 479), (320, 320), (97, 203)]
RECOGNIZER_SIZES = [(32, 100), (32, 257), (32, 320)]
DBNET_SIZES = [(320, 320), (640, 480), (960, 960)]


def segmenter(rng):
    inits = [
        init(rng, "c1_w", [8, 3, 3, 3], 0.3),
        init(rng, "c1_b", [8], 0.1),
        init(rng, "c2_w", [16, 8, 3, 3], 0.2),
        init(rng, "c2_b", [16], 0.1),
        init(rng, "head_w", [1, 24, 1, 1], 0.3),
        init(rng, "head_b", [1], 0.1),
        const("zero", [0], np.int64),
        const("two", [2], np.int64),
        const("four", [4], np.int64),
    ]
    nodes = [
        h.make_node("Conv", ["x", "c1_w", "c1_b"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["a1"]),
        h.make_node(
            "Conv", ["a1", "c2_w", "c2_b"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]
        ),
        h.make_node("Relu", ["c2"], ["a2"]),
        # the exporter's shape program for size=x.shape[2:]
        h.make_node("Shape", ["a2"], ["a2_shape"]),
        h.make_node("Slice", ["a2_shape", "zero", "two"], ["batch_channels"]),
        h.make_node("Shape", ["x"], ["x_shape"]),
        h.make_node("Slice", ["x_shape", "two", "four"], ["height_width"]),
        h.make_node("Concat", ["batch_channels", "height_width"], ["sizes"], axis=0),
        h.make_node(
            "Resize",
            ["a2", "", "", "sizes"],
            ["up"],
            mode="linear",
            coordinate_transformation_mode="half_pixel",
        ),
        h.make_node("Concat", ["a1", "up"], ["both"], axis=1),
        h.make_node("Conv", ["both", "head_w", "head_b"], ["logits"], kernel_shape=[1, 1]),
        h.make_node("Sigmoid", ["logits"], ["p"]),
        h.make_node("Mul", ["p", "m"], ["y"]),
    ]
    graph = h.make_graph(
        nodes,
        "segmenter",
        [
            h.make_tensor_value_info("x", T.FLOAT, [1, 3, "height", "width"]),
            h.make_tensor_value_info("m", T.FLOAT, [1, 1, "height", "width"]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 1, "height", "width"])],
        inits,
    )
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8

    def feeds(height, width):
        return {
            "x": rng.uniform(-1, 1, [1, 3, height, width]).astype(np.float32),
            "m": rng.uniform(0, 1, [1, 1, height, width]).astype(np.float32),
        }

    return m, SEGMENTER_SIZES, feeds, None


def recognizer(rng):
    inits = [
        init(rng, "c1_w", [16, 3, 3, 3], 0.3),
        init(rng, "c1_b", [16], 0.1),
        init(rng, "c2_w", [32, 16, 3, 3], 0.15),
        init(rng, "c2_b", [32], 0.1),
        init(rng, "fc_w", [32, 12], 0.3),
        init(rng, "fc_b", [12], 0.1),
    ]
    nodes = [
        h.make_node("Conv", ["x", "c1_w", "c1_b"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["a1"]),
        h.make_node("MaxPool", ["a1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Conv", ["p1", "c2_w", "c2_b"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c2"], ["a2"]),
        h.make_node("ReduceMean", ["a2"], ["columns"], axes=[2], keepdims=0),
        h.make_node("Transpose", ["columns"], ["steps"], perm=[0, 2, 1]),
        h.make_node("MatMul", ["steps", "fc_w"], ["fc"]),
        h.make_node("Add", ["fc", "fc_b"], ["logits"]),
        h.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    graph = h.make_graph(
        nodes,
        "recognizer",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 32, "width"])],
        [h.make_tensor_value_info("probs", T.FLOAT, [1, "steps", 12])],
        inits,
    )
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8

    def feeds(height, width):
        return {"x": rng.uniform(-1, 1, [1, 3, height, width]).astype(np.float32)}

    return m, RECOGNIZER_SIZES, feeds, None


def dbnet(rng):
    manifest = json.load(open(os.path.join(FIXTURES, "manifest.json")))
    m = refill_stubs(onnx.load(os.path.join(FIXTURES, manifest["dbnet_fpn"]["file"])))

    def feeds(height, width):
        return {"x": rng.uniform(-1, 1, [1, 3, height, width]).astype(np.float32)}

    return m, DBNET_SIZES, feeds, (641, 479)


MODELS = {"segmenter": segmenter, "recognizer": recognizer, "dbnet_fpn": dbnet}


def main(out):
    rng = np.random.default_rng(20261205)
    opts = reference_session_options()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    with complete_folder(out, STAMP) as tmp:
        for name, build in MODELS.items():
            model, sizes, feeds, refused = build(rng)
            onnx.checker.check_model(model, full_check=True)
            folder = os.path.join(tmp, name)
            os.makedirs(folder)
            onnx.save(model, os.path.join(folder, "model.onnx"))
            sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            for height, width in sizes:
                tag = f"{height}x{width}"
                inputs = feeds(height, width)
                outputs = sess.run(None, inputs)
                for k, v in inputs.items():
                    np.save(os.path.join(folder, npy_name(f"{k}_{tag}")), v)
                for o, v in zip(sess.get_outputs(), outputs):
                    np.save(os.path.join(folder, npy_name(f"want_{o.name}_{tag}")), v)
            if refused:
                height, width = refused
                try:
                    sess.run(None, feeds(height, width))
                except Exception as e:  # onnxruntime's own error type is not exported
                    with open(os.path.join(folder, f"refused_{height}x{width}.txt"), "w") as f:
                        f.write(str(e) + "\n")
                else:
                    raise SystemExit(f"{name}: onnxruntime ran {height}x{width}, expected a refusal")
            print(f"{name}: {len(model.graph.node)} nodes, sizes {sizes}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
