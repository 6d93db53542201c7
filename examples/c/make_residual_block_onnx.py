"""Writes residual_block.onnx: the block of residual_block.tir with a dynamic batch N.

    python examples/c/make_residual_block_onnx.py    # (the project's .venv has onnx)

Same graph (Conv 3x3 pad 1 with bias -> BatchNormalization eps 1e-3 -> Add x -> Relu)
and the same weights: each `random<seed, min, max>` line of the .tir is regenerated here
with smelt's documented generator (SplitMix64, top 24 bits as a float in [0, 1), scaled
to [min, max] in f32), exactly as residual_block.c does, so the C program checks the
ONNX model's dynamic runs against the same loop nest. Only the input's batch differs:
`tensor<Nx6x9x9xf32>` with dim_param "N".
"""

import pathlib
import re

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = pathlib.Path(__file__).resolve().parent
MASK = (1 << 64) - 1


def smelt_random_f32(seed, length, lo, hi):
    state, out = seed, np.empty(length, dtype=np.float32)
    lo, hi = np.float32(lo), np.float32(hi)
    for i in range(length):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        unit = np.float32(z >> 40) / np.float32(16777216.0)
        out[i] = lo + (hi - lo) * unit
    return out


def tir_weights(text):
    pattern = re.compile(
        r"const @(\w+) : tensor<([0-9x]+)xf32> = "
        r"random<seed = (\d+), min = ([-0-9.e]+), max = ([-0-9.e]+)>"
    )
    weights = {}
    for name, dims, seed, lo, hi in pattern.findall(text):
        shape = [int(d) for d in dims.split("x")]
        values = smelt_random_f32(int(seed), int(np.prod(shape)), float(lo), float(hi))
        weights[name] = values.reshape(shape)
    return weights


def main():
    w = tir_weights((HERE / "residual_block.tir").read_text())
    channels, size = w["w"].shape[0], 9
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, size, size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels, size, size])
    nodes = [
        helper.make_node("Conv", ["x", "w", "bias"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization",
            ["conv", "gamma", "beta", "mean", "var"],
            ["bn"],
            epsilon=1e-3,
        ),
        helper.make_node("Add", ["bn", "x"], ["sum"]),
        helper.make_node("Relu", ["sum"], ["y"]),
    ]
    inits = [numpy_helper.from_array(v, name) for name, v in sorted(w.items())]
    graph = helper.make_graph(nodes, "residual_block", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, HERE / "residual_block.onnx")


if __name__ == "__main__":
    main()
