#!/usr/bin/env python3
"""smelt vs ONNX Runtime on the same ONNX models, alternating, in one run.

    bash scripts/setup-python.sh && cargo build --release
    .venv/bin/python benches/compare.py [--threads 1,2] [--rounds 5] [--iterations 20]
                                        [--models resnet18,tail3x3_64_56] [--kernels auto]
                                        [--no-fuse] [--markdown]

For each model and thread count, `rounds` times in turn: one `smelt bench --json` process
(compile, `warmup` untimed runs, `iterations` timed runs), then the same number of timed
onnxruntime runs (CPU provider, graph optimizations ENABLE_ALL, intra-op threads = the
same count, inputs and outputs bound once with io_binding, session created once, before
the first round). Samples of all rounds are pooled; the ratio is median(smelt) /
median(ORT): lower is better, < 1 means smelt is faster.

Models come from benches/make_bench_models.py (written to target/bench-models if missing).
Dynamic input dimensions are pinned to 1 for both sides. The machine's load average is
printed with the table: the machine is shared and timings are noisy.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_DIR = os.path.join(ROOT, "target", "bench-models")
DEFAULT_MODELS = [
    "resnet18",
    "resnet50",
    "tail3x3_64_56",
    "tail3x3_128_28",
    "tail3x3_256_14",
    "tail3x3_512_7",
    "tail1x1_64to256_56",
    "tail1x1_256to64_56",
    "dwtail_256_56",
]


def ensure_models(names: list[str]) -> None:
    missing = [n for n in names if not os.path.exists(os.path.join(MODEL_DIR, f"{n}.onnx"))]
    if missing:
        print(f"writing models ({', '.join(missing)} missing)", file=sys.stderr)
        subprocess.run(
            [sys.executable, os.path.join(ROOT, "benches", "make_bench_models.py"), MODEL_DIR],
            check=True,
            stdout=subprocess.DEVNULL,
        )


def input_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Each graph input that is not an initializer, with dynamic dimensions pinned to 1."""
    inits = {i.name for i in model.graph.initializer}
    shapes = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        dims = inp.type.tensor_type.shape.dim
        shapes[inp.name] = [d.dim_value if d.HasField("dim_value") else 1 for d in dims]
    return shapes


def dynamic_inputs(model: onnx.ModelProto) -> set[str]:
    return {
        inp.name
        for inp in model.graph.input
        if any(not d.HasField("dim_value") for d in inp.type.tensor_type.shape.dim)
    }


class OrtRunner:
    """One session with inputs and outputs bound once; `time(n)` returns n run times in ms."""

    def __init__(self, path: str, threads: int) -> None:
        model = onnx.load(path, load_external_data=False)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        start = time.perf_counter()
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.session_ms = (time.perf_counter() - start) * 1e3
        rng = np.random.default_rng(1)
        self.binding = self.session.io_binding()
        self.keep = []  # the bound arrays must outlive the binding
        for name, dims in input_shapes(model).items():
            value = ort.OrtValue.ortvalue_from_numpy(rng.uniform(-1, 1, dims).astype(np.float32))
            self.keep.append(value)
            self.binding.bind_ortvalue_input(name, value)
        for out in self.session.get_outputs():
            self.binding.bind_output(out.name, "cpu")
        self.session.run_with_iobinding(self.binding)  # allocates the outputs once
        outputs = self.binding.get_outputs()
        for out, value in zip(self.session.get_outputs(), outputs):
            self.binding.bind_ortvalue_output(out.name, value)
        self.keep.extend(outputs)

    def time(self, warmup: int, iterations: int) -> list[float]:
        for _ in range(warmup):
            self.session.run_with_iobinding(self.binding)
        samples = []
        for _ in range(iterations):
            start = time.perf_counter()
            self.session.run_with_iobinding(self.binding)
            samples.append((time.perf_counter() - start) * 1e3)
        return samples


def smelt_bench(args: argparse.Namespace, path: str, shapes: list[str], threads: int) -> dict:
    cmd = [
        args.smelt, "bench", path, "--json",
        "--threads", str(threads),
        "--warmup", str(args.warmup),
        "--iterations", str(args.iterations),
        "--kernels", args.kernels,
    ]
    for s in shapes:
        cmd += ["--shape", s]
    if args.no_fuse:
        cmd.append("--no-fuse")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip() or f"smelt bench exited with {done.returncode}")
    return json.loads(done.stdout)


def compare(args: argparse.Namespace, name: str, threads: int) -> dict:
    path = os.path.join(MODEL_DIR, f"{name}.onnx")
    model = onnx.load(path, load_external_data=False)
    pins = input_shapes(model)
    shapes = [f"{n}={'x'.join(map(str, pins[n]))}" for n in sorted(dynamic_inputs(model))]
    runner = OrtRunner(path, threads)
    smelt_samples, ort_samples, compile_ms, gflop = [], [], [], None
    error = None
    for _ in range(args.rounds):
        try:
            result = smelt_bench(args, path, shapes, threads)
            smelt_samples += result["samples_ms"]
            compile_ms.append(result["compile_ms"])
            gflop = result["gflop"]
        except RuntimeError as e:
            error = str(e).splitlines()[0]
        ort_samples += runner.time(args.warmup, args.iterations)
        # ORT's intra-op threads keep spinning for a while after a run (its default
        # allow_spinning): let them park before the next smelt process starts, so that
        # smelt's second thread does not share its core with them (measured: smelt's p90
        # at 2 threads 2-4.7 ms right after ORT runs, 0.8-1.1 ms after a 1 s pause)
        time.sleep(1.0)
    row = {
        "model": name,
        "threads": threads,
        "ort_ms": statistics.median(ort_samples),
        "ort_session_ms": runner.session_ms,
        "smelt_ms": statistics.median(smelt_samples) if smelt_samples else None,
        "smelt_compile_ms": statistics.median(compile_ms) if compile_ms else None,
        "gflop": gflop,
        "error": error,
    }
    row["ratio"] = row["smelt_ms"] / row["ort_ms"] if row["smelt_ms"] else None
    return row


def fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated model names")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--rounds", type=int, default=5, help="alternations per model and thread count")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iterations", type=int, default=10, help="timed runs per round and side")
    p.add_argument("--kernels", default="auto", choices=["auto", "cranelift"])
    p.add_argument("--no-fuse", action="store_true", help="pass --no-fuse to smelt")
    p.add_argument("--smelt", default=os.path.join(ROOT, "target", "release", "smelt"))
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown rows")
    args = p.parse_args()
    if not os.access(args.smelt, os.X_OK):
        sys.exit(f"{args.smelt} is missing: run `cargo build --release` first")
    names = [n for n in args.models.split(",") if n]
    threads = [int(t) for t in args.threads.split(",") if t]
    ensure_models(names)

    load_before = os.getloadavg()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    print(
        f"# {stamp}, {platform.node()}, {os.cpu_count()} cpus, onnxruntime {ort.__version__}, "
        f"kernels {args.kernels}{', no fusion' if args.no_fuse else ''}, "
        f"{args.rounds} rounds x {args.iterations} runs, load average before "
        + " ".join(f"{x:.2f}" for x in load_before)
    )
    if args.markdown:
        print("| model | threads | smelt ms | ORT ms | smelt/ORT | smelt GFLOP/s | smelt compile ms | ORT session ms |")
        print("|---|---|---|---|---|---|---|---|")
    else:
        print(f"{'model':<22} {'thr':>3} {'smelt ms':>9} {'ORT ms':>9} {'ratio':>6} {'GFLOP/s':>8} "
              f"{'compile':>8} {'session':>8}")
    for name in names:
        for t in threads:
            r = compare(args, name, t)
            gflops = r["gflop"] / r["smelt_ms"] * 1e3 if r["smelt_ms"] and r["gflop"] else None
            cells = [
                name, str(t), fmt(r["smelt_ms"], ".2f"), fmt(r["ort_ms"], ".2f"),
                fmt(r["ratio"], ".2f"), fmt(gflops, ".1f"),
                fmt(r["smelt_compile_ms"], ".0f"), fmt(r["ort_session_ms"], ".0f"),
            ]
            if args.markdown:
                print("| " + " | ".join(cells) + " |", flush=True)
            else:
                print(f"{cells[0]:<22} {cells[1]:>3} {cells[2]:>9} {cells[3]:>9} {cells[4]:>6} "
                      f"{cells[5]:>8} {cells[6]:>8} {cells[7]:>8}", flush=True)
            if r["error"]:
                print(f"  smelt failed: {r['error']}", flush=True)
    load_after = os.getloadavg()
    print("# load average after " + " ".join(f"{x:.2f}" for x in load_after))


if __name__ == "__main__":
    main()
