#!/usr/bin/env python3
"""Builds small models with a dynamic batch `N`, and their onnxruntime outputs (into a
git-ignored folder), for tests/batch_copies.rs: batches run as copies of the batch-1
executable, and the models that must not.

    .venv/bin/python scripts/make_batch_models.py target/onnx-tests/batches

Each model gets a folder MODEL/ with model.onnx, one NAME.npy per input and
want_NAME.npy per output (onnxruntime's, graph optimizations off):

- embed_classify: int64 token ids [N, 6] gathered from an embedding table (a kernel
  that checks each id at run time, so it can fault), averaged over the tokens, a
  Gemm and a Softmax: `probs` [N, 4]; `confident` [N, 4] (bool, `probs > 0.3`); `ids`
  passed through unchanged; `table_sum` [1], which does not depend on the batch. Batch 5.
- conv_pool: a [N, 3, 16, 16] image through Conv 3x3 + Relu, MaxPool 2x2, a 1x1 Conv,
  GlobalAveragePool, Flatten and Gemm: `logits` [N, 10]. Batch 5.
- batch_mixer: `centered` = x - ReduceMean(x, axis 0): every element reads the others,
  so no batch may run as copies of batch 1. Batch 4.

Written under a temporary name, renamed when complete, stamped `.complete`.
"""

from __future__ import annotations

import sys

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h

from fixtures import init, write_models

STAMP = "onnx 1.23.2 onnxruntime 1.32.0 batches 1"


def embed_classify(rng):
    vocab, hidden, classes, tokens, batch = 20, 8, 4, 6, 5
    inits = [
        init(rng, "table", [vocab, hidden]),
        init(rng, "w", [hidden, classes]),
        init(rng, "b", [classes]),
        h.make_tensor("threshold", T.FLOAT, [], [0.3]),
    ]
    nodes = [
        h.make_node("Gather", ["table", "ids"], ["embedded"], axis=0),
        h.make_node("ReduceMean", ["embedded"], ["pooled"], axes=[1], keepdims=0),
        h.make_node("Gemm", ["pooled", "w", "b"], ["scores"]),
        h.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        h.make_node("Greater", ["probs", "threshold"], ["confident"]),
        h.make_node("Identity", ["ids"], ["ids_out"]),
        h.make_node("ReduceSum", ["table"], ["table_sum"], keepdims=0),
    ]
    graph = h.make_graph(
        nodes,
        "embed_classify",
        [h.make_tensor_value_info("ids", T.INT64, ["N", tokens])],
        [
            h.make_tensor_value_info("probs", T.FLOAT, ["N", classes]),
            h.make_tensor_value_info("confident", T.BOOL, ["N", classes]),
            h.make_tensor_value_info("ids_out", T.INT64, ["N", tokens]),
            h.make_tensor_value_info("table_sum", T.FLOAT, []),
        ],
        inits,
    )
    ids = rng.integers(0, vocab, [batch, tokens]).astype(np.int64)
    return graph, {"ids": ids}, 13


def conv_pool(rng):
    batch = 5
    inits = [
        init(rng, "w1", [8, 3, 3, 3]),
        init(rng, "b1", [8]),
        init(rng, "w2", [16, 8, 1, 1]),
        init(rng, "b2", [16]),
        init(rng, "wf", [10, 16]),
        init(rng, "bf", [10]),
    ]
    nodes = [
        h.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Conv", ["p1", "w2", "b2"], ["c2"]),
        h.make_node("GlobalAveragePool", ["c2"], ["g"]),
        h.make_node("Flatten", ["g"], ["f"]),
        h.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
    ]
    graph = h.make_graph(
        nodes,
        "conv_pool",
        [h.make_tensor_value_info("image", T.FLOAT, ["N", 3, 16, 16])],
        [h.make_tensor_value_info("logits", T.FLOAT, ["N", 10])],
        inits,
    )
    image = rng.normal(0, 1, [batch, 3, 16, 16]).astype(np.float32)
    return graph, {"image": image}, 13


def batch_mixer(rng):
    batch = 4
    nodes = [
        h.make_node("ReduceMean", ["x"], ["mean"], axes=[0], keepdims=1),
        h.make_node("Sub", ["x", "mean"], ["centered"]),
    ]
    graph = h.make_graph(
        nodes,
        "batch_mixer",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 4])],
        [h.make_tensor_value_info("centered", T.FLOAT, ["N", 4])],
    )
    x = rng.normal(0, 1, [batch, 4]).astype(np.float32)
    return graph, {"x": x}, 13


MODELS = {
    "embed_classify": embed_classify,
    "conv_pool": conv_pool,
    "batch_mixer": batch_mixer,
}


def main(out: str) -> None:
    write_models(out, STAMP, 20261206, MODELS)


if __name__ == "__main__":
    main(sys.argv[1])
