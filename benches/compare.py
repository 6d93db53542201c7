#!/usr/bin/env python3
"""smelt vs ONNX Runtime on the same ONNX models, alternating, in one run.

    bash scripts/setup-python.sh && cargo build --release
    .venv/bin/python benches/compare.py [--threads 1,2] [--rounds 5] [--iterations 20]
                                        [--models resnet18,tail3x3_64_56] [--kernels auto]
                                        [--no-fuse] [--processes] [--markdown]

By default both run in this process and alternate run by run: smelt through its C API
(target/release/libsmelt.so, loaded with ctypes; one executable, inputs and outputs
allocated once) and onnxruntime (CPU provider, graph optimizations ENABLE_ALL, intra-op
threads = the same count, inputs and outputs bound once with io_binding). After `warmup`
untimed runs of each, `rounds × iterations` pairs are timed, smelt first then ORT; the
ratio is median(smelt) / median(ORT): lower is better, < 1 means smelt is faster. This
VM's speed drifts by up to 2× over seconds (neighbours), and run-by-run alternation puts
both sides in the same moments. At more than one thread ORT's workers do not spin after
a run (`session.intra_op.allow_spinning = 0`): spinning workers would hold the cores
that smelt's next run needs. One `smelt bench --json` process per model and thread count
reports the compile time (file to executable, as a user sees it) and the flop count.

`--processes` instead alternates `rounds` times one `smelt bench --json` process
(`warmup` untimed runs, `iterations` timed runs) with as many timed ORT runs, pausing
1 s after ORT's runs so that its spinning workers park (ORT keeps its default spinning).

Models come from benches/make_bench_models.py (written to target/bench-models if missing).
Dynamic input dimensions are pinned to 1 for both sides. The machine's load average is
printed with the table: the machine is shared and timings are noisy.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import re
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

    def __init__(self, path: str, threads: int, spinning: bool = True) -> None:
        model = onnx.load(path, load_external_data=False)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        if not spinning:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
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

    def run(self) -> None:
        self.session.run_with_iobinding(self.binding)

    def time(self, warmup: int, iterations: int) -> list[float]:
        for _ in range(warmup):
            self.run()
        samples = []
        for _ in range(iterations):
            start = time.perf_counter()
            self.run()
            samples.append((time.perf_counter() - start) * 1e3)
        return samples


class SmeltOptions(ctypes.Structure):
    _fields_ = [
        ("fuse", ctypes.c_int32),
        ("threads", ctypes.c_uint32),
        ("input_shapes", ctypes.c_char_p),
        ("kernels", ctypes.c_int32),
        ("allowed_root", ctypes.c_char_p),
        ("memory_budget", ctypes.c_uint64),
    ]


class SmeltTensorInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("rank", ctypes.c_size_t),
        ("dims", ctypes.POINTER(ctypes.c_size_t)),
        ("element_count", ctypes.c_size_t),
        ("layout", ctypes.c_char_p),
        ("element_type", ctypes.c_int32),
    ]


def check_mirrors(header: str) -> None:
    """Fails unless the ctypes structs list the C header's fields in its order (a struct
    passed with another layout would be read as garbage, not rejected)."""
    text = open(header).read()
    for struct in (SmeltOptions, SmeltTensorInfo):
        name = struct.__name__
        body = re.search(r"typedef struct " + name + r" \{(.*?)\} " + name + ";", text, re.S)
        if body is None:
            sys.exit(f"{header}: no struct {name}")
        fields = re.findall(r"^\s*[\w\s\*]*?\b(\w+);", re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S), re.M)
        mirrored = [f[0] for f in struct._fields_]
        if fields != mirrored:
            sys.exit(f"compare.py's {name} {mirrored} does not match {header}: {fields}")


def load_smelt(path: str) -> ctypes.CDLL:
    check_mirrors(os.path.join(ROOT, "include", "smelt.h"))
    lib = ctypes.CDLL(path)
    lib.smelt_options_default.restype = SmeltOptions
    lib.smelt_last_error.restype = ctypes.c_char_p
    lib.smelt_executable_from_file.argtypes = [
        ctypes.c_char_p, ctypes.POINTER(SmeltOptions), ctypes.POINTER(ctypes.c_void_p)]
    lib.smelt_executable_destroy.argtypes = [ctypes.c_void_p]
    for f in (lib.smelt_executable_input_count, lib.smelt_executable_output_count):
        f.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    for f in (lib.smelt_executable_input, lib.smelt_executable_output):
        f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(SmeltTensorInfo)]
    floats = ctypes.POINTER(ctypes.c_float)
    sizes = ctypes.POINTER(ctypes.c_size_t)
    lib.smelt_executable_run.argtypes = [
        ctypes.c_void_p, ctypes.POINTER(floats), sizes, ctypes.c_size_t,
        ctypes.POINTER(floats), sizes, ctypes.c_size_t]
    return lib


class SmeltRunner:
    """One executable compiled through the C API, with its buffers allocated once."""

    KERNELS = {"auto": 0, "cranelift": 1}

    def __init__(self, lib: ctypes.CDLL, path: str, threads: int, kernels: str, fuse: bool,
                 shapes: list[str]) -> None:
        self.lib = lib
        opts = lib.smelt_options_default()
        opts.fuse = int(fuse)
        opts.threads = threads
        opts.kernels = self.KERNELS[kernels]
        self.pins = ";".join(shapes).encode() if shapes else None
        opts.input_shapes = self.pins
        self.exe = ctypes.c_void_p()
        self.check(lib.smelt_executable_from_file(path.encode(), ctypes.byref(opts),
                                                  ctypes.byref(self.exe)))
        rng = np.random.default_rng(1)

        def buffers(count_fn, info_fn, fill: bool) -> list[np.ndarray]:
            n = ctypes.c_size_t()
            self.check(count_fn(self.exe, ctypes.byref(n)))
            arrays = []
            for i in range(n.value):
                info = SmeltTensorInfo()
                self.check(info_fn(self.exe, i, ctypes.byref(info)))
                a = (rng.uniform(-1, 1, info.element_count) if fill
                     else np.zeros(info.element_count)).astype(np.float32)
                arrays.append(a)
            return arrays

        self.inputs = buffers(lib.smelt_executable_input_count, lib.smelt_executable_input, True)
        self.outputs = buffers(lib.smelt_executable_output_count, lib.smelt_executable_output,
                               False)
        floats = ctypes.POINTER(ctypes.c_float)

        def pointers(arrays: list[np.ndarray]):
            ptrs = (floats * len(arrays))(*[a.ctypes.data_as(floats) for a in arrays])
            lens = (ctypes.c_size_t * len(arrays))(*[a.size for a in arrays])
            return ptrs, lens

        self.in_ptrs, self.in_lens = pointers(self.inputs)
        self.out_ptrs, self.out_lens = pointers(self.outputs)

    def check(self, status: int) -> None:
        if status != 0:
            raise RuntimeError(self.lib.smelt_last_error().decode())

    def run(self) -> None:
        self.check(self.lib.smelt_executable_run(
            self.exe, self.in_ptrs, self.in_lens, len(self.inputs),
            self.out_ptrs, self.out_lens, len(self.outputs)))

    def close(self) -> None:
        self.lib.smelt_executable_destroy(self.exe)


def smelt_bench(args: argparse.Namespace, path: str, shapes: list[str], threads: int,
                iterations: int | None = None, warmup: int | None = None) -> dict:
    cmd = [
        args.smelt, "bench", path, "--json",
        "--threads", str(threads),
        "--warmup", str(args.warmup if warmup is None else warmup),
        "--iterations", str(args.iterations if iterations is None else iterations),
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


def compare_interleaved(args: argparse.Namespace, lib: ctypes.CDLL, name: str,
                        threads: int) -> dict:
    path = os.path.join(MODEL_DIR, f"{name}.onnx")
    model = onnx.load(path, load_external_data=False)
    pins = input_shapes(model)
    shapes = [f"{n}={'x'.join(map(str, pins[n]))}" for n in sorted(dynamic_inputs(model))]
    row = {"model": name, "threads": threads, "smelt_ms": None, "ort_ms": None, "ratio": None,
           "smelt_compile_ms": None, "gflop": None, "error": None, "ort_session_ms": None}
    try:
        # the compile time a user sees (file to executable) and the flop count
        once = smelt_bench(args, path, shapes, threads, iterations=1, warmup=0)
        row["smelt_compile_ms"], row["gflop"] = once["compile_ms"], once["gflop"]
        smelt = SmeltRunner(lib, path, threads, args.kernels, not args.no_fuse, shapes)
    except RuntimeError as e:
        row["error"] = str(e).splitlines()[0]
        return row
    runner = OrtRunner(path, threads, spinning=threads <= 1)
    row["ort_session_ms"] = runner.session_ms
    for _ in range(args.warmup):
        smelt.run()
        runner.run()
    smelt_samples, ort_samples = [], []
    for _ in range(args.rounds * args.iterations):
        for side, samples in ((smelt, smelt_samples), (runner, ort_samples)):
            start = time.perf_counter()
            side.run()
            samples.append((time.perf_counter() - start) * 1e3)
    smelt.close()
    row["smelt_ms"] = statistics.median(smelt_samples)
    row["ort_ms"] = statistics.median(ort_samples)
    row["ratio"] = row["smelt_ms"] / row["ort_ms"]
    return row


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
    p.add_argument("--library", default=os.path.join(ROOT, "target", "release", "libsmelt.so"),
                   help="smelt's C library, for the in-process alternation")
    p.add_argument("--processes", action="store_true",
                   help="alternate smelt bench processes with rounds of ORT runs instead")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown rows")
    args = p.parse_args()
    if not os.access(args.smelt, os.X_OK):
        sys.exit(f"{args.smelt} is missing: run `cargo build --release` first")
    lib = None
    if not args.processes:
        if not os.path.exists(args.library):
            sys.exit(f"{args.library} is missing: run `cargo build --release` first")
        lib = load_smelt(args.library)
    names = [n for n in args.models.split(",") if n]
    threads = [int(t) for t in args.threads.split(",") if t]
    ensure_models(names)

    load_before = os.getloadavg()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    print(
        f"# {stamp}, {platform.node()}, {os.cpu_count()} cpus, onnxruntime {ort.__version__}, "
        f"kernels {args.kernels}{', no fusion' if args.no_fuse else ''}, "
        f"{args.rounds} rounds x {args.iterations} runs, "
        f"{'processes' if args.processes else 'run-by-run in one process'}, load average before "
        + " ".join(f"{x:.2f}" for x in load_before)
    )
    if args.markdown:
        print("| model | threads | smelt ms | ORT ms | smelt/ORT | smelt GFLOP/s | smelt compile ms | ORT session ms |")
        print("|---|---|---|---|---|---|---|---|")
    else:
        print(f"{'model':<22} {'thr':>3} {'smelt ms':>9} {'ORT ms':>9} {'ratio':>6} {'GFLOP/s':>8} "
              f"{'compile':>8} {'session':>8}")
    failed = False
    for name in names:
        for t in threads:
            r = compare(args, name, t) if args.processes else compare_interleaved(args, lib, name, t)
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
                failed = True
    load_after = os.getloadavg()
    print("# load average after " + " ".join(f"{x:.2f}" for x in load_after))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
