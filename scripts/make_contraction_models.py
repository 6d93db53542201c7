#!/usr/bin/env python3
"""Builds exporter-style models of Einsum and Col2Im, and their onnxruntime outputs (into a
git-ignored folder), for tests/onnx_contractions.rs.

    .venv/bin/python scripts/make_contraction_models.py target/onnx-tests/contractions

Each model gets a folder MODEL/ with model.onnx, x.npy and want_y.npy (onnxruntime's
output, graph optimizations off):

- einsum_attention: multi-head attention as einsum-style exports write it (x [2, 10, 32]):
  the projections `bsd,de->bse` and an implicit-output `ij,jk`, heads split by Reshape,
  scores `bqhd,bkhd->bhqk` (the head transposes inside the equation), Softmax, the
  context `bhqk,bkhd->bqhd`, and an outer-product gate `bs,d->bsd`.
- einsum_forms: the other forms (x [3, 5, 5]): a batch diagonal `...ii->...i`, a transpose
  `bij->bji`, a batched product of x with its transpose, an outer product `bi,bj->bij`, a
  three-operand contraction `bij,bij,b->bj`, a broadcast ellipsis `...j,j->...` and a
  trace-like total `bii->`.
- col2im_fold: PyTorch's `fold` (Col2Im, opset 18) of a Conv's output seen as columns,
  with strides, pads and dilations: x [1, 18, 10] -> Conv 1x1 to 2·3·3 channels of 40
  blocks -> Col2Im into [1, 2, 9, 11].

Written under a temporary name, renamed when complete, stamped `.complete`.
"""

from __future__ import annotations

import sys

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from fixtures import const, init, write_models

STAMP = "onnx 1.23.2 onnxruntime 1.32.0 contractions 1"


def einsum_attention(rng):
    b, s, d, heads = 2, 10, 32, 4
    inits = [
        init(rng, "wq", [d, d]),
        init(rng, "wk", [d, d]),
        init(rng, "wv", [d, d]),
        init(rng, "wo", [d, d]),
        init(rng, "gate", [d]),
        const("split", [b, s, heads, d // heads], np.int64),
        const("merge", [b, s, d], np.int64),
        const("rows", [b * s, d], np.int64),
        const("scale", 1.0 / np.sqrt(d // heads), np.float32),
    ]
    e = lambda eq, ins, out: h.make_node("Einsum", ins, [out], equation=eq)
    nodes = [
        e("bsd,de->bse", ["x", "wq"], "q"),
        e("bsd,de->bse", ["x", "wk"], "k"),
        h.make_node("Reshape", ["x", "rows"], ["x2"]),
        e("ij,jk", ["x2", "wv"], "v2"),
        h.make_node("Reshape", ["v2", "merge"], ["v"]),
        h.make_node("Reshape", ["q", "split"], ["qh"]),
        h.make_node("Reshape", ["k", "split"], ["kh"]),
        h.make_node("Reshape", ["v", "split"], ["vh"]),
        e("bqhd,bkhd->bhqk", ["qh", "kh"], "scores"),
        h.make_node("Mul", ["scores", "scale"], ["scaled"]),
        h.make_node("Softmax", ["scaled"], ["p"], axis=-1),
        e("bhqk,bkhd->bqhd", ["p", "vh"], "ctx"),
        h.make_node("Reshape", ["ctx", "merge"], ["c"]),
        e("bse,ed->bsd", ["c", "wo"], "o"),
        h.make_node("ReduceMean", ["x"], ["m"], axes=[2], keepdims=0),
        e("bs,d->bsd", ["m", "gate"], "g"),
        h.make_node("Add", ["o", "g"], ["y"]),
    ]
    graph = h.make_graph(
        nodes,
        "einsum_attention",
        [h.make_tensor_value_info("x", T.FLOAT, [b, s, d])],
        [h.make_tensor_value_info("y", T.FLOAT, [b, s, d])],
        inits,
    )
    return graph, {"x": rng.normal(0, 1, [b, s, d]).astype(np.float32)}, 13


def einsum_forms(rng):
    inits = [init(rng, "w", [3]), init(rng, "v", [5])]
    e = lambda eq, ins, out: h.make_node("Einsum", ins, [out], equation=eq)
    nodes = [
        e("...ii->...i", ["x"], "diag"),
        e("bij->bji", ["x"], "t"),
        e("bij,bjk->bik", ["x", "t"], "p"),
        e("bi,bj->bij", ["diag", "diag"], "outer"),
        e("bij,bij,b->bj", ["p", "outer", "w"], "mixed"),
        e("...j,j->...", ["mixed", "v"], "dot"),
        e("bii->", ["x"], "total"),
        h.make_node("Unsqueeze", ["dot", "one"], ["dot1"]),
        h.make_node("Add", ["mixed", "dot1"], ["sum1"]),
        h.make_node("Add", ["sum1", "total"], ["y"]),
    ]
    inits.append(const("one", [1], np.int64))
    graph = h.make_graph(
        nodes,
        "einsum_forms",
        [h.make_tensor_value_info("x", T.FLOAT, [3, 5, 5])],
        [h.make_tensor_value_info("y", T.FLOAT, [3, 5])],
        inits,
    )
    return graph, {"x": rng.normal(0, 1, [3, 5, 5]).astype(np.float32)}, 13


def col2im_fold(rng):
    # image 9x11, block 3x3, dilation [1, 2], stride [2, 1], pads [1, 0, 0, 1]:
    # rows (9 + 1 - 3) // 2 + 1 = 4, cols (11 + 1 - 5) // 1 + 1 = 8 -> 32 blocks
    inits = [
        init(rng, "w", [18, 18, 1]),
        const("image", [9, 11], np.int64),
        const("block", [3, 3], np.int64),
    ]
    nodes = [
        h.make_node("Conv", ["x", "w"], ["cols"], kernel_shape=[1]),
        h.make_node(
            "Col2Im",
            ["cols", "image", "block"],
            ["y"],
            dilations=[1, 2],
            strides=[2, 1],
            pads=[1, 0, 0, 1],
        ),
    ]
    graph = h.make_graph(
        nodes,
        "col2im_fold",
        [h.make_tensor_value_info("x", T.FLOAT, [1, 18, 32])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 2, 9, 11])],
        inits,
    )
    return graph, {"x": rng.normal(0, 1, [1, 18, 32]).astype(np.float32)}, 18


MODELS = {
    "einsum_attention": einsum_attention,
    "einsum_forms": einsum_forms,
    "col2im_fold": col2im_fold,
}


def main(out: str) -> None:
    write_models(out, STAMP, 20261203, MODELS)


if __name__ == "__main__":
    main(sys.argv[1])
