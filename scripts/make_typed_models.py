#!/usr/bin/env python3
"""Builds exporter-style models with int64 and bool tensors, and their onnxruntime
outputs (into a git-ignored folder), for tests/onnx_typed.rs.

    .venv/bin/python scripts/make_typed_models.py target/onnx-tests/typed

Each model gets a folder MODEL/ with model.onnx, one NAME.npy per input and
want_NAME.npy per output (onnxruntime's, graph optimizations off):

- bert_embedding: what a BERT encoder exported by torch.onnx.export starts with. int64
  `input_ids` and `attention_mask` of dims [batch, seq] (dim_params, pinned by the test),
  word, position and token-type embeddings gathered by id (positions from
  Shape -> Gather -> Range -> Unsqueeze, token types from ConstantOfShape), their sum
  layer-normalized, and one attention layer of 2 heads whose additive mask is computed
  from the int64 mask as the exporter writes it: Unsqueeze -> Cast(float) -> Sub(1, m) ->
  Mul by the float32 minimum. The mask's last two positions are padding.
- layer_norm_decomposed: layer normalization as exporters of opset < 17 write it
  (ReduceMean -> Sub -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul -> Add),
  over the last axis of a [2, 8, 48] activation, then a MatMul and GELU written out
  with Erf, as in a transformer's feed-forward block (opset 13: axes as attributes).
- int64_ops: int64 arithmetic on values above 2^24 (exact only in integers), a
  comparison, Where, Not and Casts to int32 and float, with int64, int32, bool and float
  outputs whose element types the test checks too.
- float16_mlp: a float16 model as a half-precision export stores it: float16 input,
  weights and bias (MatMul -> Add -> SiLU as Sigmoid and Mul), a Transpose of the
  float16 result and a Cast of it to float32, so float16 tensors cross the model's
  interface both ways and move through data movement.

Written under a temporary name, renamed when complete, stamped `.complete`.
"""

from __future__ import annotations

import sys

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from fixtures import (
    init,
    write_models,
)

STAMP = "onnx 1.23.2 onnxruntime 1.32.0 typed 3"

VOCAB, HIDDEN, HEADS, MAX_POS = 30, 16, 2, 16
BATCH, SEQ = 1, 8


def const(name, values, dtype=np.int64):
    return h.make_node(
        "Constant", [], [name], value=nh.from_array(np.array(values, dtype=dtype), name)
    )


def bert_embedding(rng):
    head = HIDDEN // HEADS
    inits = [
        init(rng, "word_emb", [VOCAB, HIDDEN]),
        init(rng, "pos_emb", [MAX_POS, HIDDEN]),
        init(rng, "type_emb", [2, HIDDEN]),
        nh.from_array(np.ones(HIDDEN, np.float32), "ln_g"),
        nh.from_array(np.zeros(HIDDEN, np.float32), "ln_b"),
    ]
    for p in "qkv":
        inits += [init(rng, f"w{p}", [HIDDEN, HIDDEN]), init(rng, f"b{p}", [HIDDEN], 0.1)]
    nodes = [
        h.make_node("Gather", ["word_emb", "input_ids"], ["words"]),
        # position ids: arange(seq), from the ids' run-time shape
        h.make_node("Shape", ["input_ids"], ["ids_shape"]),
        const("one_idx", 1),
        h.make_node("Gather", ["ids_shape", "one_idx"], ["seq_len"], axis=0),
        const("zero", 0),
        const("step", 1),
        h.make_node("Range", ["zero", "seq_len", "step"], ["positions"]),
        const("axis0", [0]),
        h.make_node("Unsqueeze", ["positions", "axis0"], ["position_ids"]),
        h.make_node("Gather", ["pos_emb", "position_ids"], ["pos"]),
        # token types: zeros of the ids' shape
        h.make_node(
            "ConstantOfShape",
            ["ids_shape"],
            ["token_type_ids"],
            value=nh.from_array(np.array([0], np.int64)),
        ),
        h.make_node("Gather", ["type_emb", "token_type_ids"], ["types"]),
        h.make_node("Add", ["words", "pos"], ["wp"]),
        h.make_node("Add", ["wp", "types"], ["emb"]),
        h.make_node(
            "LayerNormalization", ["emb", "ln_g", "ln_b"], ["hidden"], axis=-1, epsilon=1e-12
        ),
        # the additive mask: (1 - mask) * float32 min, shaped [batch, 1, 1, seq]
        const("mask_axes", [1, 2]),
        h.make_node("Unsqueeze", ["attention_mask", "mask_axes"], ["mask4"]),
        h.make_node("Cast", ["mask4"], ["maskf"], to=T.FLOAT),
        const("onef", 1.0, np.float32),
        h.make_node("Sub", ["onef", "maskf"], ["inverted"]),
        const("fmin", np.finfo(np.float32).min, np.float32),
        h.make_node("Mul", ["inverted", "fmin"], ["additive"]),
        const("heads_shape", [BATCH, SEQ, HEADS, head]),
        const("merged_shape", [BATCH, SEQ, HIDDEN]),
    ]
    for p in "qkv":
        nodes += [
            h.make_node("MatMul", ["hidden", f"w{p}"], [f"{p}_mm"]),
            h.make_node("Add", [f"{p}_mm", f"b{p}"], [f"{p}_lin"]),
            h.make_node("Reshape", [f"{p}_lin", "heads_shape"], [f"{p}_heads"]),
            h.make_node("Transpose", [f"{p}_heads"], [f"{p}_t"], perm=[0, 2, 1, 3]),
        ]
    nodes += [
        h.make_node("Transpose", ["k_t"], ["k_tt"], perm=[0, 1, 3, 2]),
        h.make_node("MatMul", ["q_t", "k_tt"], ["scores"]),
        const("scale", np.sqrt(head), np.float32),
        h.make_node("Div", ["scores", "scale"], ["scaled"]),
        h.make_node("Add", ["scaled", "additive"], ["masked"]),
        h.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        h.make_node("MatMul", ["probs", "v_t"], ["context"]),
        h.make_node("Transpose", ["context"], ["context_t"], perm=[0, 2, 1, 3]),
        h.make_node("Reshape", ["context_t", "merged_shape"], ["output"]),
    ]
    graph = h.make_graph(
        nodes,
        "bert_embedding",
        [
            h.make_tensor_value_info("input_ids", T.INT64, ["batch", "seq"]),
            h.make_tensor_value_info("attention_mask", T.INT64, ["batch", "seq"]),
        ],
        [h.make_tensor_value_info("output", T.FLOAT, ["batch", "seq", HIDDEN])],
        inits,
    )
    ids = rng.integers(0, VOCAB, [BATCH, SEQ]).astype(np.int64)
    mask = np.ones([BATCH, SEQ], np.int64)
    mask[:, -2:] = 0
    return graph, {"input_ids": ids, "attention_mask": mask}, 17


def int64_ops(rng):
    big = 2**40 + 7
    nodes = [
        const("three", 3),
        const("big", big),
        h.make_node("Mul", ["ids", "three"], ["tripled"]),
        h.make_node("Add", ["tripled", "big"], ["shifted"]),
        const("two", 2),
        h.make_node("Equal", ["ids", "two"], ["is_two"]),
        h.make_node("Neg", ["shifted"], ["negated"]),
        h.make_node("Where", ["is_two", "shifted", "negated"], ["picked"]),
        h.make_node("Not", ["is_two"], ["not_two"]),
        h.make_node("Cast", ["ids"], ["narrow"], to=T.INT32),
        h.make_node("Cast", ["shifted"], ["as_float"], to=T.FLOAT),
    ]
    graph = h.make_graph(
        nodes,
        "int64_ops",
        [h.make_tensor_value_info("ids", T.INT64, [6])],
        [
            h.make_tensor_value_info("picked", T.INT64, [6]),
            h.make_tensor_value_info("not_two", T.BOOL, [6]),
            h.make_tensor_value_info("narrow", T.INT32, [6]),
            h.make_tensor_value_info("as_float", T.FLOAT, [6]),
        ],
    )
    ids = np.array([2, 5, -3, 2, 2**33, 0], np.int64)
    return graph, {"ids": ids}, 17


def layer_norm_decomposed(rng):
    hidden = 48
    inits = [
        nh.from_array(rng.uniform(0.5, 1.5, hidden).astype(np.float32), "gamma"),
        nh.from_array(rng.uniform(-0.1, 0.1, hidden).astype(np.float32), "beta"),
        init(rng, "w1", [hidden, 2 * hidden]),
    ]
    nodes = [
        h.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], keepdims=1),
        h.make_node("Sub", ["x", "mean"], ["centered"]),
        const("two", 2.0, np.float32),
        h.make_node("Pow", ["centered", "two"], ["squared"]),
        h.make_node("ReduceMean", ["squared"], ["var"], axes=[-1], keepdims=1),
        const("eps", 1e-5, np.float32),
        h.make_node("Add", ["var", "eps"], ["var_eps"]),
        h.make_node("Sqrt", ["var_eps"], ["std"]),
        h.make_node("Div", ["centered", "std"], ["normed"]),
        h.make_node("Mul", ["normed", "gamma"], ["scaled"]),
        h.make_node("Add", ["scaled", "beta"], ["ln"]),
        h.make_node("MatMul", ["ln", "w1"], ["ff"]),
        # GELU as torch.onnx.export writes it: x * 0.5 * (1 + erf(x / sqrt 2))
        const("sqrt2", np.sqrt(2.0), np.float32),
        h.make_node("Div", ["ff", "sqrt2"], ["ff_s"]),
        h.make_node("Erf", ["ff_s"], ["ff_erf"]),
        const("onef", 1.0, np.float32),
        h.make_node("Add", ["ff_erf", "onef"], ["ff_1"]),
        h.make_node("Mul", ["ff", "ff_1"], ["ff_m"]),
        const("half", 0.5, np.float32),
        h.make_node("Mul", ["ff_m", "half"], ["y"]),
    ]
    graph = h.make_graph(
        nodes,
        "layer_norm_decomposed",
        [h.make_tensor_value_info("x", T.FLOAT, [2, 8, hidden])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 8, 2 * hidden])],
        inits,
    )
    x = rng.normal(0, 2, [2, 8, hidden]).astype(np.float32)
    # opset 13: the form before LayerNormalization existed
    return graph, {"x": x}, 13


def float16_mlp(rng):
    inits = [
        nh.from_array(rng.uniform(-0.5, 0.5, [16, 8]).astype(np.float16), "w"),
        nh.from_array(rng.uniform(-0.2, 0.2, [8]).astype(np.float16), "b"),
    ]
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["xw"]),
        h.make_node("Add", ["xw", "b"], ["z"]),
        h.make_node("Sigmoid", ["z"], ["s"]),
        h.make_node("Mul", ["z", "s"], ["y"]),
        h.make_node("Transpose", ["y"], ["yt"], perm=[1, 0]),
        h.make_node("Cast", ["y"], ["y32"], to=T.FLOAT),
    ]
    graph = h.make_graph(
        nodes,
        "float16_mlp",
        [h.make_tensor_value_info("x", T.FLOAT16, [2, 16])],
        [
            h.make_tensor_value_info("y", T.FLOAT16, [2, 8]),
            h.make_tensor_value_info("yt", T.FLOAT16, [8, 2]),
            h.make_tensor_value_info("y32", T.FLOAT, [2, 8]),
        ],
        inits,
    )
    x = rng.normal(0, 1, [2, 16]).astype(np.float16)
    return graph, {"x": x}, 17


MODELS = {
    "bert_embedding": bert_embedding,
    "layer_norm_decomposed": layer_norm_decomposed,
    "int64_ops": int64_ops,
    # last: the generator's draws for the models above stay as they were
    "float16_mlp": float16_mlp,
}


def main(out: str) -> None:
    write_models(out, STAMP, 20261201, MODELS)


if __name__ == "__main__":
    main(sys.argv[1])
