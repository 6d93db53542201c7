#!/usr/bin/env python3
"""Builds exporter-style recurrent models with per-entry sequence lengths, and their
onnxruntime outputs (into a git-ignored folder), for tests/onnx_recurrent.rs.

    .venv/bin/python scripts/make_recurrent_models.py target/onnx-tests/recurrent

Each model gets a folder MODEL/ with model.onnx, x.npy and want_NAME.npy per output
(onnxruntime's, graph optimizations off):

- lstm_ragged: a bidirectional LSTM (hidden 6, with biases, initial states and peepholes)
  over x [7, 3, 5] whose batch entries are 7, 4 and 1 steps long (`sequence_lens` an
  initializer, as a padded batch of text-line features carries), its Y, Y_h and Y_c
  combined into one output `y` (Y flattened, then Y_h and Y_c).
- gru_ragged: a reverse GRU (hidden 4, linear_before_reset) over x [5, 4, 3] with lengths
  5, 0, 2 and 3, Y and Y_h concatenated into `y`.

Written under a temporary name, renamed when complete, stamped `.complete`.
"""

from __future__ import annotations

import sys

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from fixtures import const, init, write_models

STAMP = "onnx 1.23.2 onnxruntime 1.32.0 recurrent 1"


def flat(name, out):
    return h.make_node("Reshape", [name, "minus_one"], [out])


def lstm_ragged(rng):
    seq, batch, inp, hid = 7, 3, 5, 6
    inits = [
        init(rng, "w", [2, 4 * hid, inp]),
        init(rng, "r", [2, 4 * hid, hid]),
        init(rng, "b", [2, 8 * hid], 0.2),
        const("lens", [7, 4, 1], np.int32),
        init(rng, "h0", [2, batch, hid]),
        init(rng, "c0", [2, batch, hid]),
        init(rng, "p", [2, 3 * hid], 0.3),
        const("minus_one", [-1], np.int64),
    ]
    nodes = [
        h.make_node(
            "LSTM",
            ["x", "w", "r", "b", "lens", "h0", "c0", "p"],
            ["Y", "Y_h", "Y_c"],
            hidden_size=hid,
            direction="bidirectional",
        ),
        flat("Y", "yf"),
        flat("Y_h", "hf"),
        flat("Y_c", "cf"),
        h.make_node("Concat", ["yf", "hf", "cf"], ["y"], axis=0),
    ]
    total = seq * 2 * batch * hid + 2 * 2 * batch * hid
    graph = h.make_graph(
        nodes,
        "lstm_ragged",
        [h.make_tensor_value_info("x", T.FLOAT, [seq, batch, inp])],
        [h.make_tensor_value_info("y", T.FLOAT, [total])],
        inits,
    )
    return graph, {"x": rng.normal(0, 1, [seq, batch, inp]).astype(np.float32)}, 14


def gru_ragged(rng):
    seq, batch, inp, hid = 5, 4, 3, 4
    inits = [
        init(rng, "w", [1, 3 * hid, inp]),
        init(rng, "r", [1, 3 * hid, hid]),
        init(rng, "b", [1, 6 * hid], 0.2),
        const("lens", [5, 0, 2, 3], np.int32),
        const("minus_one", [-1], np.int64),
    ]
    nodes = [
        h.make_node(
            "GRU",
            ["x", "w", "r", "b", "lens"],
            ["Y", "Y_h"],
            hidden_size=hid,
            direction="reverse",
            linear_before_reset=1,
        ),
        flat("Y", "yf"),
        flat("Y_h", "hf"),
        h.make_node("Concat", ["yf", "hf"], ["y"], axis=0),
    ]
    total = seq * batch * hid + batch * hid
    graph = h.make_graph(
        nodes,
        "gru_ragged",
        [h.make_tensor_value_info("x", T.FLOAT, [seq, batch, inp])],
        [h.make_tensor_value_info("y", T.FLOAT, [total])],
        inits,
    )
    return graph, {"x": rng.normal(0, 1, [seq, batch, inp]).astype(np.float32)}, 14


MODELS = {
    "lstm_ragged": lstm_ragged,
    "gru_ragged": gru_ragged,
}


def main(out: str) -> None:
    write_models(out, STAMP, 20261204, MODELS)


if __name__ == "__main__":
    main(sys.argv[1])
