#!/usr/bin/env python3
"""GEMM throughput of smelt beside onnxruntime's MatMul on the encoder's weight shapes
(issue 22, item 1):

    .venv/bin/python benches/gemm_bench.py [--smelt target/release/smelt] [--rounds 3]
        [--iterations 20] [--ms 1,8,128,512] [--kn 384x384,384x1536,1536x384] [--bias-gelu]
        [--threads 1,2]

For each M and (K, N) it writes target/bench-models/gemm/matmul_M_K_N.onnx: one MatMul of
an activation `[1, M, K]` (rank 3, as the exported transformers have it: the leading dims
flatten into M) by a constant weight `[K, N]` (seeded uniform values), with `--bias-gelu`
followed by `Add(bias[N])` and an erf GELU as torch.onnx writes it (`Div` by √2, `Erf`,
`Add` 1, `Mul` x, `Mul` 0.5: BERT's first FFN layer, which smelt fuses). Then,
`rounds` times alternating, one `smelt bench --json --threads T` process and one round of
ORT runs (T intra-op threads, ENABLE_ALL), for each thread count T of `--threads`, and
prints the medians as ms and GFLOP/s (2·M·K·N flops; the epilogue is not counted) with
the ratio smelt / ORT. At more than one thread each side keeps its default spinning
after runs, and a pause of 1 s after ORT's round lets its workers park before smelt's
next process (as `compare.py --processes`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "target", "bench-models", "gemm")


def model_path(m: int, k: int, n: int, bias_gelu: bool) -> str:
    """Writes (once) and returns the MatMul model of one shape."""
    name = f"matmul{'_bias_gelu2' if bias_gelu else ''}_{m}_{k}_{n}.onnx"
    path = os.path.join(OUT_DIR, name)
    if os.path.exists(path):
        return path
    os.makedirs(OUT_DIR, exist_ok=True)
    rng = np.random.default_rng(1000 + m + 7 * k + 13 * n)
    w = rng.uniform(-0.1, 0.1, size=(k, n)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y" if not bias_gelu else "mm"])]
    if bias_gelu:
        b = rng.uniform(-0.1, 0.1, size=(n,)).astype(np.float32)
        inits += [
            numpy_helper.from_array(b, "b"),
            numpy_helper.from_array(np.array(2 ** 0.5, np.float32), "sqrt2"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        ]
        nodes += [
            helper.make_node("Add", ["mm", "b"], ["z"]),
            helper.make_node("Div", ["z", "sqrt2"], ["zs"]),
            helper.make_node("Erf", ["zs"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["e1"]),
            helper.make_node("Mul", ["z", "e1"], ["ze"]),
            helper.make_node("Mul", ["ze", "half"], ["y"]),
        ]
    graph = helper.make_graph(
        nodes,
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    tmp = path + ".tmp"
    onnx.save(model, tmp)
    os.replace(tmp, path)
    return path


def smelt_ms(smelt: str, path: str, iterations: int, kernels: str, threads: int) -> float:
    done = subprocess.run(
        [smelt, "bench", path, "--json", "--threads", str(threads), "--warmup", "3",
         "--iterations", str(iterations), "--kernels", kernels],
        capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["median_ms"]


def ort_ms(session, feed: dict, iterations: int) -> float:
    for _ in range(3):
        session.run(None, feed)
    samples = []
    for _ in range(iterations):
        t = time.perf_counter()
        session.run(None, feed)
        samples.append((time.perf_counter() - t) * 1e3)
    return statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smelt", default=os.path.join(ROOT, "target", "release", "smelt"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--ms", default="1,8,128,512")
    p.add_argument("--kn", default="384x384,384x1536,1536x384")
    p.add_argument("--kernels", default="auto")
    p.add_argument("--bias-gelu", action="store_true")
    p.add_argument("--threads", default="1", help="thread counts, e.g. 1,2")
    args = p.parse_args()
    import onnxruntime as ort

    print(f"load average {os.getloadavg()[0]:.2f}")
    print("| threads | M | K | N | smelt ms | smelt GFLOP/s | ORT ms | ORT GFLOP/s | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    thread_counts = [int(v) for v in args.threads.split(",")]
    shapes = [tuple(int(v) for v in kn.split("x")) for kn in args.kn.split(",")]
    rows = [int(v) for v in args.ms.split(",")]
    for threads, (k, n), m in itertools.product(thread_counts, shapes, rows):
        path = model_path(m, k, n, args.bias_gelu)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        x = np.random.default_rng(m).uniform(-1, 1, size=(1, m, k)).astype(np.float32)
        s_samples, o_samples = [], []
        for _ in range(args.rounds):
            s_samples.append(smelt_ms(args.smelt, path, args.iterations, args.kernels,
                                      threads))
            o_samples.append(ort_ms(session, {"x": x}, args.iterations))
            if threads > 1:
                # ORT's workers spin after its runs (its default): let them park before
                # smelt's next process needs the cores
                time.sleep(1.0)
        s, o = statistics.median(s_samples), statistics.median(o_samples)
        flop = 2.0 * m * k * n
        print(f"| {threads} | {m} | {k} | {n} | {s:.4f} | {flop / s / 1e6:.1f} | {o:.4f} | "
              f"{flop / o / 1e6:.1f} | {s / o:.2f} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
