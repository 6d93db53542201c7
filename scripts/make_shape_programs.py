#!/usr/bin/env python3
"""Builds exporter-style shape-program models and their onnxruntime outputs (into a
git-ignored folder), for tests/onnx_shape_programs.rs.

    .venv/bin/python scripts/make_shape_programs.py target/onnx-tests/shape-programs

Each model gets a folder MODEL/ with model.onnx, x.npy (its float32 input) and
want.npy (onnxruntime's output, graph optimizations off). Every model computes a shape
at run time from its input's static shape; smelt folds the program at import:

- gather_concat: Shape -> Gather -> Unsqueeze -> Concat -> Reshape (flatten after dim 0).
- cast_mul: Shape -> Cast(float) -> Mul -> Cast(int64) -> Reshape (halve a dim, double one).
- range_gather: Range(0, Size(x)) as Gather indices of a constant, added to x.
- equal_where: Equal/Where turning the dim that equals 6 into -1 of a Reshape target.
- int64_exact: (2^40 + 1) * 3 + Size(x) - 3 * 2^40, exact only in integers, divided
  back to the element count and used as a Reshape target; the result multiplies x by
  Cast(float) of a value above 2^24 minus 2^40, so a float round trip shows.

bad/NAME.onnx are models the importer must refuse with a clear error (a Cast to string
or float64, a Cast of run-time data to uint32, a Range with delta 0, a Range of 2^62
elements, an int64 Mul that overflows, a Less of float32 run-time data and an int64
constant).

Written under a temporary name, renamed when complete, stamped `.complete`.
"""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

STAMP = "onnx 1.23.2 onnxruntime 1.32.0 shape-programs 4"


def const(name, values, dtype=np.int64):
    return h.make_node(
        "Constant", [], [name], value=nh.from_array(np.array(values, dtype=dtype), name)
    )


def model(nodes, in_shape, out_shape, initializers=()):
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, in_shape)],
        [h.make_tensor_value_info("y", T.FLOAT, out_shape)],
        list(initializers),
    )
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def gather_concat():
    return model(
        [
            h.make_node("Shape", ["x"], ["s"]),
            const("zero", 0),
            h.make_node("Gather", ["s", "zero"], ["n"], axis=0),
            const("axes", [0]),
            h.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
            const("minus1", [-1]),
            h.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
            h.make_node("Reshape", ["x", "target"], ["r"]),
            h.make_node("Relu", ["r"], ["y"]),
        ],
        [2, 3, 4, 5],
        [2, 60],
    )


def cast_mul():
    return model(
        [
            h.make_node("Shape", ["x"], ["s"]),
            h.make_node("Cast", ["s"], ["sf"], to=T.FLOAT),
            const("scale", [1.0, 0.5, 2.0], np.float32),
            h.make_node("Mul", ["sf", "scale"], ["tf"]),
            h.make_node("Cast", ["tf"], ["target"], to=T.INT64),
            h.make_node("Reshape", ["x", "target"], ["y"]),
        ],
        [3, 8, 5],
        [3, 4, 10],
    )


def range_gather():
    table = nh.from_array(np.linspace(-1, 1, 100, dtype=np.float32), "table")
    return model(
        [
            h.make_node("Size", ["x"], ["n"]),
            const("start", 0),
            const("step", 1),
            h.make_node("Range", ["start", "n", "step"], ["idx"]),
            h.make_node("Gather", ["table", "idx"], ["picked"], axis=0),
            h.make_node("Shape", ["x"], ["s"]),
            h.make_node("Reshape", ["picked", "s"], ["p"]),
            h.make_node("Add", ["x", "p"], ["y"]),
        ],
        [2, 3, 4],
        [2, 3, 4],
        [table],
    )


def equal_where():
    return model(
        [
            h.make_node("Shape", ["x"], ["s"]),
            const("six", [6]),
            h.make_node("Equal", ["s", "six"], ["is6"]),
            const("minus1", [-1]),
            h.make_node("Where", ["is6", "minus1", "s"], ["t0"]),
            # GreaterOrEqual/Not/And on the way, as exporters' guards do
            const("one", [1]),
            h.make_node("GreaterOrEqual", ["s", "one"], ["pos"]),
            h.make_node("Not", ["is6"], ["not6"]),
            h.make_node("And", ["pos", "not6"], ["keep"]),
            h.make_node("Where", ["keep", "s", "t0"], ["t1"]),
            h.make_node("Reshape", ["x", "t1"], ["r"]),
            h.make_node("Sigmoid", ["r"], ["y"]),
        ],
        [2, 6, 5],
        [2, 6, 5],
    )


def int64_exact():
    big = 2**40
    return model(
        [
            h.make_node("Size", ["x"], ["n"]),
            const("big1", big + 1),
            const("three", 3),
            const("big3", 3 * big),
            h.make_node("Mul", ["big1", "three"], ["m"]),  # 3 * 2^40 + 3
            h.make_node("Add", ["m", "n"], ["a"]),
            h.make_node("Sub", ["a", "big3"], ["b"]),  # n + 3
            h.make_node("Sub", ["b", "three"], ["n2"]),  # n exactly
            const("axes", [0]),
            h.make_node("Unsqueeze", ["n2", "axes"], ["target"]),
            h.make_node("Reshape", ["x", "target"], ["flat"]),
            # (2^40 + 2^24 + 1) - 2^40 = 2^24 + 1 in int64; the float of it is 2^24
            const("above", big + 2**24 + 1),
            const("bigc", big),
            h.make_node("Sub", ["above", "bigc"], ["k"]),
            h.make_node("Cast", ["k"], ["kf"], to=T.FLOAT),
            h.make_node("Mul", ["flat", "kf"], ["y"]),
        ],
        [4, 6],
        [24],
    )


def bad_model(nodes, out_type=T.FLOAT):
    """A model the importer must refuse (not checked: some are invalid on purpose)."""
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [h.make_tensor_value_info("y", out_type, None)],
    )
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


# Models smelt must refuse with a clear error, by name: (model, words the error has).
BAD = {
    "cast_to_string": bad_model(
        [h.make_node("Shape", ["x"], ["s"]), h.make_node("Cast", ["s"], ["y"], to=T.STRING)]
    ),
    "cast_to_float64": bad_model(
        [h.make_node("Shape", ["x"], ["s"]), h.make_node("Cast", ["s"], ["y"], to=T.DOUBLE)]
    ),
    "cast_runtime_to_uint32": bad_model([h.make_node("Cast", ["x"], ["y"], to=T.UINT32)]),
    "range_delta_0": bad_model(
        [
            const("a", 0),
            const("b", 10),
            const("d", 0),
            h.make_node("Range", ["a", "b", "d"], ["y"]),
        ]
    ),
    "range_huge": bad_model(
        [
            const("a", 0),
            const("b", 2**62),
            const("d", 1),
            h.make_node("Range", ["a", "b", "d"], ["y"]),
        ]
    ),
    "mul_overflow": bad_model(
        [const("a", 2**40), h.make_node("Mul", ["a", "a"], ["y"])], T.INT64
    ),
    "less_mixed_types": bad_model(
        [const("z", 0), h.make_node("Less", ["x", "z"], ["y"])], T.BOOL
    ),
}


MODELS = {
    "gather_concat": gather_concat,
    "cast_mul": cast_mul,
    "range_gather": range_gather,
    "equal_where": equal_where,
    "int64_exact": int64_exact,
}


def main(out: str) -> None:
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    rng = np.random.default_rng(17)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for name, build in MODELS.items():
        m = build()
        d = os.path.join(tmp, name)
        os.makedirs(d)
        onnx.save(m, os.path.join(d, "model.onnx"))
        dims = [x.dim_value for x in m.graph.input[0].type.tensor_type.shape.dim]
        x = rng.uniform(-2, 2, dims).astype(np.float32)
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        (y,) = sess.run(None, {"x": x})
        np.save(os.path.join(d, "x.npy"), x)
        np.save(os.path.join(d, "want.npy"), y.astype(np.float32))
    os.makedirs(os.path.join(tmp, "bad"))
    for name, m in BAD.items():
        onnx.save(m, os.path.join(tmp, "bad", name + ".onnx"))
    with open(os.path.join(tmp, ".complete"), "w") as f:
        f.write(STAMP + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)


if __name__ == "__main__":
    main(sys.argv[1])
