#!/usr/bin/env python3
"""smelt vs ONNX Runtime on the same ONNX models, alternating, in one run.

    bash scripts/setup-python.sh && cargo build --release
    .venv/bin/python benches/compare.py [--threads 1,2] [--rounds 5] [--iterations 20]
                                        [--models resnet18,tail3x3_64_56] [--kernels auto]
                                        [--no-fuse] [--processes] [--markdown] [--ort-ops]
    .venv/bin/python benches/compare.py --models exported --threads 1   # every kind of the manifest

By default both run in this process and alternate run by run: smelt through its C API
(target/release/libsmelt.so, loaded with ctypes; one executable, inputs and outputs
allocated once) and onnxruntime (CPU provider, graph optimizations ENABLE_ALL, intra-op
threads = the same count, inputs and outputs bound once with io_binding). After `warmup`
untimed runs of each, `rounds × iterations` pairs are timed, smelt first then ORT; the
ratio is median(smelt) / median(ORT): lower is better, < 1 means smelt is faster; `min
ratio` is min(smelt) / min(ORT), each side's best run of the same alternation (this VM's
slow phases, when another tenant shares the core's load ports, take up to half of
smelt's speed and less of ORT's: the minima compare the two in the calm moments). This
VM's speed drifts by up to 2× over seconds (neighbours), and run-by-run alternation puts
both sides in the same moments. At more than one thread ORT's workers do not spin after
a run (`session.intra_op.allow_spinning = 0`): spinning workers would hold the cores
that smelt's next run needs; and each run is followed by an untimed pause of `PARK_S`,
longer than smelt's workers spin after a run (3 ms), so that neither side's run meets
the other's spinning workers (both start each run with parked workers). Compile time is
measured as an embedding host sees it, in this warm process: after one untimed pair, `max(rounds, COMPILE_ROUNDS)` alternations of
one `smelt_executable_from_file` (file to executable) and one ORT session of the same
model and options (file to session), each side's median in the `compile` and `session`
columns. One `smelt bench --json` process per
model and thread count reports the flop count and a fresh process's compile time (column
`process`: it also pays the first touch of the process's memory, which on this VM varies
2-5× from run to run, as ORT's does in a fresh process). With `--processes` both compile
columns are the fresh processes' and ORT's first session.

`--processes` instead alternates `rounds` times one `smelt bench --json` process
(`warmup` untimed runs, `iterations` timed runs) with as many timed ORT runs, pausing
1 s after ORT's runs so that its spinning workers park (ORT keeps its default spinning).

Models come from benches/make_bench_models.py (written to target/bench-models if missing),
with dynamic input dimensions pinned to 1 and seeded uniform [-1, 1] float inputs, or,
for a model written with a `NAME.inputs/` folder (bert_base: token ids), those inputs and
its dynamic dimensions pinned to their shapes. A name
`exported/KIND` is a real exporter's model of tests/models/exported/manifest.json:
target/onnx-tests/exported/KIND/model.onnx (written with its inputs by
scripts/make_exported_models.py if missing), its dynamic inputs pinned as the manifest's
"pins" say and its inputs read from the saved INPUT.npy files (valid token ids, masks).
`--models exported` stands for every kind in the manifest; the default list is the
ResNets and the tails. Both sides get the same arrays, of each input's own element type
(smelt through `smelt_executable_run_typed`).

Correctness guard: after the warmup, smelt's outputs are compared with ORT's for the same
inputs (relative error max|a-b| / max|b| of each output, the largest is in the `rel err`
column); above 1e-4 the row is reported as an error, with no timing. `--processes` checks
once through the C API when the library is there (`smelt bench` runs its own inputs:
uniform floats, integers 0 or 1). `--ort-ops` prints, per model, the op types of ORT's
optimized graph (what it fused). The machine's load average is printed with the table:
the machine is shared and timings are noisy.
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
import tempfile
import time
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from fixtures import npy_name  # noqa: E402  (the saved inputs' file names)

MODEL_DIR = os.path.join(ROOT, "target", "bench-models")

# Seconds of untimed pause after each run at more than one thread: longer than smelt's
# workers spin after a run, so the other side's run never meets them.
PARK_S = 0.005

# Alternating compile / session-creation pairs timed per model (at least).
COMPILE_ROUNDS = 7
EXPORTED_DIR = os.path.join(ROOT, "target", "onnx-tests", "exported")
MANIFEST = os.path.join(ROOT, "tests", "models", "exported", "manifest.json")
MAX_REL_ERR = 1e-4
# what a row reports instead of crashing: smelt's (RuntimeError), files', and ORT's
# (pybind11 exceptions that derive from Exception only)
ERRORS = (RuntimeError, OSError, ort.capi.onnxruntime_pybind11_state.Fail,
          ort.capi.onnxruntime_pybind11_state.InvalidArgument,
          ort.capi.onnxruntime_pybind11_state.InvalidGraph,
          ort.capi.onnxruntime_pybind11_state.NotImplemented,
          ort.capi.onnxruntime_pybind11_state.RuntimeException)
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


def exported_kinds() -> list[str]:
    with open(MANIFEST) as f:
        return list(json.load(f))


def expand(names: list[str]) -> list[str]:
    """Model names with the group `exported` replaced by `exported/KIND` for every kind."""
    out = []
    for n in names:
        out += [f"exported/{k}" for k in exported_kinds()] if n == "exported" else [n]
    return out


def model_path(name: str) -> str:
    if name.startswith("exported/"):
        return os.path.join(EXPORTED_DIR, name.split("/", 1)[1], "model.onnx")
    return os.path.join(MODEL_DIR, f"{name}.onnx")


def ensure_models(names: list[str]) -> None:
    missing = [n for n in names if not os.path.exists(model_path(n))]
    made_here = [n for n in missing if not n.startswith("exported/")]
    if made_here:
        print(f"writing models ({', '.join(made_here)} missing)", file=sys.stderr)
        subprocess.run(
            [sys.executable, os.path.join(ROOT, "benches", "make_bench_models.py"), MODEL_DIR,
             *made_here],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    if any(n.startswith("exported/") for n in missing):
        print("writing the exported models", file=sys.stderr)
        subprocess.run(
            [sys.executable, os.path.join(ROOT, "scripts", "make_exported_models.py"),
             EXPORTED_DIR],
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


def model_inputs(name: str, model: onnx.ModelProto) -> tuple[dict[str, np.ndarray], list[str]]:
    """The input arrays both sides run and smelt's pins (`NAME=D0xD1...`) of the dynamic
    inputs: an exported model's saved inputs and manifest pins, else seeded uniform floats
    with dynamic dimensions pinned to 1."""
    if name.startswith("exported/"):
        kind = name.split("/", 1)[1]
        with open(MANIFEST) as f:
            entry = json.load(f)[kind]
        folder = os.path.dirname(model_path(name))
        arrays = {}
        for n, spec in entry["inputs"].items():
            a = np.load(os.path.join(folder, npy_name(n)))
            if a.dtype != np.dtype(spec["dtype"]) or list(a.shape) != spec["shape"]:
                raise RuntimeError(f"{folder}/{npy_name(n)} is {a.dtype} {list(a.shape)}, the manifest "
                                   f"says {spec['dtype']} {spec['shape']}")
            arrays[n] = a
        pins = [f"{n}={'x'.join(map(str, d))}" for n, d in sorted(entry["pins"].items())]
        return arrays, pins
    given = os.path.join(MODEL_DIR, f"{name}.inputs")
    if os.path.isdir(given):
        # a bench model that needs real inputs (a BERT's token ids) comes with them
        arrays = {inp.name: np.load(os.path.join(given, npy_name(inp.name)))
                  for inp in model.graph.input
                  if inp.name not in {i.name for i in model.graph.initializer}}
        pins = [f"{n}={'x'.join(map(str, arrays[n].shape))}" for n in sorted(dynamic_inputs(model))]
        return arrays, pins
    rng = np.random.default_rng(1)
    shapes = input_shapes(model)
    arrays = {n: rng.uniform(-1, 1, d).astype(np.float32) for n, d in shapes.items()}
    pins = [f"{n}={'x'.join(map(str, shapes[n]))}" for n in sorted(dynamic_inputs(model))]
    return arrays, pins


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max|got - want| / max|want| in f64 (max|got - want| when want is all zeros)."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    if got.shape != want.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    diff = np.abs(got - want).max()
    scale = np.abs(want).max()
    return float(diff / scale) if scale > 0 else float(diff)


def check_outputs(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    """The largest relative error over the outputs; raises when it is above MAX_REL_ERR or
    an output is missing or not finite."""
    worst = 0.0
    for name, w in want.items():
        if name not in got:
            raise RuntimeError(f"smelt has no output {name!r} (it has {', '.join(got)})")
        err = relative_error(got[name], w)
        if not np.isfinite(err):
            raise RuntimeError(f"wrong result: output {name!r} {got[name].shape} vs ORT's "
                               f"{w.shape}, or not finite")
        if err > MAX_REL_ERR:
            raise RuntimeError(f"wrong result: output {name!r} relative error {err:.2e} "
                               f"> {MAX_REL_ERR:g}")
        worst = max(worst, err)
    return worst


def ort_op_types(path: str) -> Counter:
    """The op types (domain-qualified when not ONNX's) of ORT's optimized graph (ENABLE_ALL)."""
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 3  # not the warning that the saved graph is host-specific
        opts.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        optimized = onnx.load(opts.optimized_model_filepath, load_external_data=False)
    return Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                   for n in optimized.graph.node)


class OrtRunner:
    """One session with inputs and outputs bound once; `time(n)` returns n run times in ms."""

    def __init__(self, path: str, threads: int, inputs: dict[str, np.ndarray],
                 spinning: bool = True) -> None:
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
        self.path, self.opts = path, opts
        self.binding = self.session.io_binding()
        self.keep = []  # the bound arrays must outlive the binding
        for name, array in inputs.items():
            value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
            self.keep.append(value)
            self.binding.bind_ortvalue_input(name, value)
        for out in self.session.get_outputs():
            self.binding.bind_output(out.name, "cpu")
        self.session.run_with_iobinding(self.binding)  # allocates the outputs once
        outputs = self.binding.get_outputs()
        for out, value in zip(self.session.get_outputs(), outputs):
            self.binding.bind_ortvalue_output(out.name, value)
        self.keep.extend(outputs)
        self.bound_outputs = {out.name: value for out, value in zip(self.session.get_outputs(),
                                                                   outputs)}

    def outputs(self) -> dict[str, np.ndarray]:
        """A copy of each output of the last run, by name."""
        return {name: value.numpy() for name, value in self.bound_outputs.items()}

    def run(self) -> None:
        self.session.run_with_iobinding(self.binding)

    def session_only_ms(self) -> float:
        """Milliseconds of one more session of the same model and options, dropped."""
        start = time.perf_counter()
        ort.InferenceSession(self.path, self.opts, providers=["CPUExecutionProvider"])
        return (time.perf_counter() - start) * 1e3

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


class SmeltBuffer(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("element_count", ctypes.c_size_t),
        ("element_type", ctypes.c_int32),
    ]


# SmeltElementType values (include/smelt.h) and the numpy type of their elements
ELEMENT_TYPES = {
    0: np.float32,
    1: np.int64,
    2: np.int32,
    3: np.bool_,
    6: np.int8,
    7: np.uint8,
    8: np.int16,
    9: np.uint16,
}


def check_mirrors(header: str) -> None:
    """Fails unless the ctypes structs list the C header's fields in its order (a struct
    passed with another layout would be read as garbage, not rejected)."""
    text = open(header).read()
    for struct in (SmeltOptions, SmeltTensorInfo, SmeltBuffer):
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
    buffers = ctypes.POINTER(SmeltBuffer)
    lib.smelt_executable_run_typed.argtypes = [
        ctypes.c_void_p, buffers, ctypes.c_size_t, buffers, ctypes.c_size_t]
    return lib


class SmeltRunner:
    """One executable compiled through the C API, with its buffers allocated once: the
    given input arrays (by name, of each input's element type) and zeroed outputs."""

    KERNELS = {"auto": 0, "cranelift": 1}

    def __init__(self, lib: ctypes.CDLL, path: str, threads: int, kernels: str, fuse: bool,
                 shapes: list[str], inputs: dict[str, np.ndarray]) -> None:
        self.lib = lib
        self.exe = self.compile(lib, path, threads, kernels, fuse, shapes)

        def tensors(count_fn, info_fn) -> list[tuple[str, list[int], type]]:
            n = ctypes.c_size_t()
            self.check(count_fn(self.exe, ctypes.byref(n)))
            out = []
            for i in range(n.value):
                info = SmeltTensorInfo()
                self.check(info_fn(self.exe, i, ctypes.byref(info)))
                name, dims = info.name.decode(), [info.dims[d] for d in range(info.rank)]
                if info.layout.decode() != "row_major" or info.element_count != np.prod(dims):
                    raise RuntimeError(f"{name}: layout {info.layout.decode()} is not row-major")
                if info.element_type not in ELEMENT_TYPES:
                    raise RuntimeError(f"{name}: unknown element type {info.element_type}")
                out.append((name, dims, ELEMENT_TYPES[info.element_type]))
            return out

        self.inputs = []
        for name, dims, dtype in tensors(lib.smelt_executable_input_count,
                                         lib.smelt_executable_input):
            if name not in inputs:
                raise RuntimeError(f"no array for smelt's input {name!r}")
            a = inputs[name]
            if a.dtype != dtype or list(a.shape) != dims:
                raise RuntimeError(f"input {name!r}: smelt takes {np.dtype(dtype)} {dims}, "
                                   f"the array is {a.dtype} {list(a.shape)}")
            self.inputs.append(np.ascontiguousarray(a))
        self.output_names, self.outputs = [], []
        for name, dims, dtype in tensors(lib.smelt_executable_output_count,
                                         lib.smelt_executable_output):
            self.output_names.append(name)
            self.outputs.append(np.zeros(dims, dtype))

        def buffers(arrays: list[np.ndarray]):
            types = {v: k for k, v in ELEMENT_TYPES.items()}
            return (SmeltBuffer * len(arrays))(
                *[SmeltBuffer(a.ctypes.data, a.size, types[a.dtype.type]) for a in arrays])

        self.in_bufs = buffers(self.inputs)
        self.out_bufs = buffers(self.outputs)

    def check(self, status: int) -> None:
        if status != 0:
            raise RuntimeError(self.lib.smelt_last_error().decode())

    @staticmethod
    def compile(lib: ctypes.CDLL, path: str, threads: int, kernels: str, fuse: bool,
                shapes: list[str]) -> ctypes.c_void_p:
        """One `smelt_executable_from_file` (file to executable) with these options."""
        opts = lib.smelt_options_default()
        opts.fuse = int(fuse)
        opts.threads = threads
        opts.kernels = SmeltRunner.KERNELS[kernels]
        pins = ";".join(shapes).encode() if shapes else None  # alive through the call
        opts.input_shapes = pins
        exe = ctypes.c_void_p()
        if lib.smelt_executable_from_file(path.encode(), ctypes.byref(opts),
                                          ctypes.byref(exe)) != 0:
            raise RuntimeError(lib.smelt_last_error().decode())
        return exe

    @staticmethod
    def compile_ms(lib: ctypes.CDLL, path: str, threads: int, kernels: str, fuse: bool,
                   shapes: list[str]) -> float:
        """Milliseconds of one [`compile`], the executable destroyed after."""
        start = time.perf_counter()
        exe = SmeltRunner.compile(lib, path, threads, kernels, fuse, shapes)
        ms = (time.perf_counter() - start) * 1e3
        lib.smelt_executable_destroy(exe)
        return ms

    def run(self) -> None:
        self.check(self.lib.smelt_executable_run_typed(
            self.exe, self.in_bufs, len(self.inputs), self.out_bufs, len(self.outputs)))

    def results(self) -> dict[str, np.ndarray]:
        """A copy of each output of the last run, by name."""
        return {name: a.copy() for name, a in zip(self.output_names, self.outputs)}

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


def guard(smelt: SmeltRunner, runner: OrtRunner) -> float:
    """Runs both once on their inputs and checks smelt's outputs against ORT's."""
    smelt.run()
    runner.run()
    return check_outputs(smelt.results(), runner.outputs())


def compare_interleaved(args: argparse.Namespace, lib: ctypes.CDLL, name: str,
                        threads: int) -> dict:
    path = model_path(name)
    row = {"model": name, "threads": threads, "smelt_ms": None, "ort_ms": None, "ratio": None,
           "min_ratio": None, "smelt_compile_ms": None, "gflop": None, "error": None,
           "ort_session_ms": None, "rel_err": None, "smelt_process_compile_ms": None}
    smelt = None
    try:
        inputs, shapes = model_inputs(name, onnx.load(path, load_external_data=False))
        # the compile time of a fresh `smelt bench` process, and the flop count
        once = smelt_bench(args, path, shapes, threads, iterations=1, warmup=0)
        row["smelt_process_compile_ms"], row["gflop"] = once["compile_ms"], once["gflop"]
        smelt = SmeltRunner(lib, path, threads, args.kernels, not args.no_fuse, shapes, inputs)
        runner = OrtRunner(path, threads, inputs, spinning=threads <= 1)
        # compile time as an embedding host sees it: file to executable (to session) in
        # this warm process, alternating, after one untimed pair (the first compile
        # beside a live executable maps fresh memory), at least COMPILE_ROUNDS of each: a
        # few milliseconds of noise on a 20 ms compile need more samples than a run
        # does (a fresh process also pays the first touch of its memory, which on this
        # VM varies 2-5x from run to run)
        compiles, sessions = [], []
        for i in range(1 + max(args.rounds, COMPILE_ROUNDS)):
            compiled = SmeltRunner.compile_ms(lib, path, threads, args.kernels,
                                              not args.no_fuse, shapes)
            session = runner.session_only_ms()
            if i > 0:
                compiles.append(compiled)
                sessions.append(session)
        row["smelt_compile_ms"] = statistics.median(compiles)
        row["ort_session_ms"] = statistics.median(sessions)
        for _ in range(args.warmup):
            smelt.run()
            runner.run()
        row["rel_err"] = guard(smelt, runner)
        smelt_samples, ort_samples = [], []
        for _ in range(args.rounds * args.iterations):
            for side, samples in ((smelt, smelt_samples), (runner, ort_samples)):
                start = time.perf_counter()
                side.run()
                samples.append((time.perf_counter() - start) * 1e3)
                if threads > 1:
                    time.sleep(PARK_S)
    except ERRORS as e:
        row["error"] = str(e).splitlines()[0]
        return row
    finally:
        if smelt is not None:
            smelt.close()
    row["smelt_ms"] = statistics.median(smelt_samples)
    row["ort_ms"] = statistics.median(ort_samples)
    row["ratio"] = row["smelt_ms"] / row["ort_ms"]
    row["min_ratio"] = min(smelt_samples) / min(ort_samples)
    return row


def compare(args: argparse.Namespace, lib: ctypes.CDLL | None, name: str, threads: int) -> dict:
    path = model_path(name)
    row = {"model": name, "threads": threads, "smelt_ms": None, "ort_ms": None, "ratio": None,
           "min_ratio": None, "smelt_compile_ms": None, "gflop": None, "error": None,
           "ort_session_ms": None, "rel_err": None}
    try:
        inputs, shapes = model_inputs(name, onnx.load(path, load_external_data=False))
        runner = OrtRunner(path, threads, inputs)
        row["ort_session_ms"] = runner.session_ms
        if lib is not None:
            smelt = SmeltRunner(lib, path, threads, args.kernels, not args.no_fuse, shapes,
                                inputs)
            try:
                row["rel_err"] = guard(smelt, runner)
            finally:
                smelt.close()
    except ERRORS as e:
        row["error"] = str(e).splitlines()[0]
        return row
    smelt_samples, ort_samples, compile_ms = [], [], []
    for _ in range(args.rounds):
        try:
            result = smelt_bench(args, path, shapes, threads)
            smelt_samples += result["samples_ms"]
            compile_ms.append(result["compile_ms"])
            row["gflop"] = result["gflop"]
        except RuntimeError as e:
            row["error"] = str(e).splitlines()[0]
        ort_samples += runner.time(args.warmup, args.iterations)
        # ORT's intra-op threads keep spinning for a while after a run (its default
        # allow_spinning): let them park before the next smelt process starts, so that
        # smelt's second thread does not share its core with them (measured: smelt's p90
        # at 2 threads 2-4.7 ms right after ORT runs, 0.8-1.1 ms after a 1 s pause)
        time.sleep(1.0)
    row["ort_ms"] = statistics.median(ort_samples)
    row["smelt_ms"] = statistics.median(smelt_samples) if smelt_samples else None
    row["smelt_compile_ms"] = statistics.median(compile_ms) if compile_ms else None
    row["ratio"] = row["smelt_ms"] / row["ort_ms"] if row["smelt_ms"] else None
    row["min_ratio"] = min(smelt_samples) / min(ort_samples) if smelt_samples else None
    return row


def fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="comma-separated model names, exported/KIND, or `exported` for every kind")
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
    p.add_argument("--ort-ops", action="store_true",
                   help="print the op types of ORT's optimized graph of each model")
    args = p.parse_args()
    if not os.access(args.smelt, os.X_OK):
        sys.exit(f"{args.smelt} is missing: run `cargo build --release` first")
    lib = None
    if os.path.exists(args.library):
        lib = load_smelt(args.library)
    elif not args.processes:
        sys.exit(f"{args.library} is missing: run `cargo build --release` first")
    names = expand([n for n in args.models.split(",") if n])
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
    width = max([22] + [len(n) for n in names])
    if args.markdown:
        print("| model | threads | smelt ms | ORT ms | smelt/ORT | min ratio | GFLOP | smelt GFLOP/s "
              "| rel err | smelt compile ms | ORT session ms | smelt process compile ms |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    else:
        print(f"{'model':<{width}} {'thr':>3} {'smelt ms':>9} {'ORT ms':>9} {'ratio':>6} "
              f"{'min r':>6} {'GFLOP':>7} {'GFLOP/s':>8} {'rel err':>8} {'compile':>8} "
              f"{'session':>8} {'process':>8}")
    failed = False
    for name in names:
        for t in threads:
            r = (compare(args, lib, name, t) if args.processes
                 else compare_interleaved(args, lib, name, t))
            gflops = r["gflop"] / r["smelt_ms"] * 1e3 if r["smelt_ms"] and r["gflop"] else None
            cells = [
                name, str(t), fmt(r["smelt_ms"], ".2f"), fmt(r["ort_ms"], ".2f"),
                fmt(r["ratio"], ".2f"), fmt(r["min_ratio"], ".2f"), fmt(r["gflop"], ".3f"),
                fmt(gflops, ".1f"),
                fmt(r["rel_err"], ".1e"),
                fmt(r["smelt_compile_ms"], ".0f"), fmt(r["ort_session_ms"], ".0f"),
                fmt(r.get("smelt_process_compile_ms"), ".0f"),
            ]
            if args.markdown:
                print("| " + " | ".join(cells) + " |", flush=True)
            else:
                print(f"{cells[0]:<{width}} {cells[1]:>3} {cells[2]:>9} {cells[3]:>9} "
                      f"{cells[4]:>6} {cells[5]:>6} {cells[6]:>7} {cells[7]:>8} {cells[8]:>8} "
                      f"{cells[9]:>8} {cells[10]:>8} {cells[11]:>8}", flush=True)
            if r["error"]:
                print(f"  failed: {r['error']}", flush=True)
                failed = True
        if args.ort_ops:
            ops = ort_op_types(model_path(name))
            print("  ORT's optimized graph: "
                  + ", ".join(f"{op} {n}" for op, n in sorted(ops.items(), key=lambda x: -x[1])),
                  flush=True)
    load_after = os.getloadavg()
    print("# load average after " + " ".join(f"{x:.2f}" for x in load_after))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
