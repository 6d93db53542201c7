#!/usr/bin/env python3
"""Writes the ONNX conformance data smelt's tests run (into a git-ignored folder).

    .venv/bin/python scripts/gen_onnx_tests.py target/onnx-tests/conformance

- node/<case>/: ONNX's backend node tests, regenerated from the generators the onnx
  wheel ships (onnx.backend.test.case.node.collect_testcases()), each as model.onnx and
  test_data_set_0/{input,output}_N.pb; node/manifest.tsv lists
  `case  op_type  rtol  atol` (op_type is the op the case was written for, also for the
  `_expanded` cases that spell the op out as a function body).
- pytorch-converted/<case>/: the PyTorch-exported cases shipped inside the wheel
  (Conv dilated/groups/depthwise/stride/padding/no-bias, BatchNorm eval, pools...),
  copied, with a manifest of the same form (op_type = the model's main op).

The folder is written under a temporary name and renamed when complete, and carries a
`.complete` stamp with the onnx version, so tests can tell a usable folder from a stale
or half-written one.
"""

from __future__ import annotations

import os
import re
import shutil
import sys

import onnx
from onnx import numpy_helper
from onnx.backend.test.case import node as node_cases

# Op types whose pytorch-converted cases are copied (the main op of each model).
PYTORCH_PRIMARY_OPS = {
    "Conv", "BatchNormalization", "MaxPool", "AveragePool", "Relu", "LeakyRelu",
    "Sigmoid", "Tanh", "Softmax", "Gemm", "MatMul", "Flatten", "Add",
}


def write_tensor(path: str, value, name: str) -> None:
    proto = value if isinstance(value, onnx.TensorProto) else numpy_helper.from_array(value, name)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def write_node_cases(out: str) -> int:
    cases = node_cases.collect_testcases()
    origin = node_cases._existing_names  # case name -> the node it tests
    rows = []
    for case in cases:
        if case.kind != "node" or case.model is None or not case.data_sets:
            continue
        base = re.sub(r"_expanded(_ver\d+)?$", "", case.name)
        op_type = origin[base].op_type if base in origin else case.model.graph.node[0].op_type
        graph = case.model.graph
        # Only plain tensor inputs and outputs can be written as .pb files.
        if any(not v.type.HasField("tensor_type") for v in list(graph.input) + list(graph.output)):
            continue
        case_dir = os.path.join(out, case.name)
        data_dir = os.path.join(case_dir, "test_data_set_0")
        os.makedirs(data_dir)
        with open(os.path.join(case_dir, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        inputs, outputs = case.data_sets[0]
        for j, value in enumerate(inputs):
            write_tensor(os.path.join(data_dir, f"input_{j}.pb"), value, graph.input[j].name)
        for j, value in enumerate(outputs):
            write_tensor(os.path.join(data_dir, f"output_{j}.pb"), value, graph.output[j].name)
        rows.append((case.name, op_type, case.rtol, case.atol))
    write_manifest(out, rows)
    return len(rows)


def write_pytorch_cases(out: str) -> int:
    src = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "pytorch-converted")
    rows = []
    for name in sorted(os.listdir(src)):
        model = onnx.load(os.path.join(src, name, "model.onnx"))
        ops = [n.op_type for n in model.graph.node]
        primary = next((o for o in ops if o in PYTORCH_PRIMARY_OPS), None)
        if primary is None:
            continue
        shutil.copytree(os.path.join(src, name), os.path.join(out, name))
        rows.append((name, primary, 1e-3, 1e-7))
    write_manifest(out, rows)
    return len(rows)


def write_manifest(out: str, rows) -> None:
    with open(os.path.join(out, "manifest.tsv"), "w") as f:
        f.write("# case\top_type\trtol\tatol\n")
        for name, op_type, rtol, atol in sorted(rows):
            f.write(f"{name}\t{op_type}\t{rtol!r}\t{atol!r}\n")


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    final = sys.argv[1]
    tmp = final + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "node"))
    os.makedirs(os.path.join(tmp, "pytorch-converted"))
    n_node = write_node_cases(os.path.join(tmp, "node"))
    n_torch = write_pytorch_cases(os.path.join(tmp, "pytorch-converted"))
    with open(os.path.join(tmp, ".complete"), "w") as f:
        f.write(f"onnx {onnx.__version__}\n")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    print(f"wrote {n_node} node cases and {n_torch} pytorch-converted cases to {final}")


if __name__ == "__main__":
    main()
