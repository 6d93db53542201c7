#!/usr/bin/env python3
"""A dynamic-batch executable against specialized ones and ONNX Runtime, batch by batch.

    bash scripts/setup-python.sh && cargo build --release
    .venv/bin/python benches/dynamic_batch.py [--model resnet50] [--batches 1,2,3,4,8]
                                              [--threads 1,2] [--rounds 3] [--iterations 5]

For each thread count, one `SmeltDynamicExecutable` (C API, `max_bucket` 8) is opened once
and runs every batch; its buckets compile on first use, and the time of each first call
is reported. For each batch, an executable specialized for it (`input_shapes` pinned) and
one ONNX Runtime session (graph optimizations ENABLE_ALL, the model's dynamic batch) run
the same seeded inputs. After one untimed run of each, the three alternate run by run for
`rounds × iterations` runs; the table gives the medians and the ratios dynamic /
specialized and dynamic / ORT. Correctness guard: the dynamic run's outputs against ORT's
(relative error max|a-b| / max|b|, above 1e-4 the row is an error).

Models: a name of benches/make_bench_models.py (target/bench-models/NAME.onnx; resnet50
has a dynamic batch "N") or a path to an .onnx file whose one input has a dynamic
leading dimension and whose other dims are fixed.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare import (  # noqa: E402  (benches/ is on the path above)
    ELEMENT_TYPES, ROOT, OrtRunner, SmeltRunner, check_outputs, ensure_models, load_smelt,
    model_path,
)

MAX_RANK = 8


class SmeltShape(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_size_t), ("dims", ctypes.c_size_t * MAX_RANK)]


class SmeltTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("element_type", ctypes.c_int32),
                ("shape", SmeltShape)]


def declare_dynamic(lib: ctypes.CDLL) -> None:
    handle, size = ctypes.c_void_p, ctypes.c_size_t
    tensors = ctypes.POINTER(SmeltTensor)
    lib.smelt_dynamic_from_file.argtypes = [
        ctypes.c_char_p, ctypes.c_void_p, size, ctypes.POINTER(handle)]
    lib.smelt_dynamic_destroy.argtypes = [handle]
    lib.smelt_dynamic_describe_outputs.argtypes = [handle, tensors, size, tensors, size]
    lib.smelt_dynamic_run.argtypes = [handle, tensors, size, tensors, size]
    lib.smelt_dynamic_output_count.argtypes = [handle, ctypes.POINTER(size)]
    lib.smelt_dynamic_output_name.argtypes = [handle, size, ctypes.POINTER(ctypes.c_char_p)]
    lib.smelt_dynamic_specialization_count.argtypes = [handle, ctypes.POINTER(size)]
    lib.smelt_dynamic_specialization.argtypes = [
        handle, size, ctypes.POINTER(size), ctypes.POINTER(ctypes.c_double)]


class DynamicRunner:
    """One dynamic executable; `prepare(inputs)` binds a batch's arrays and allocates its
    outputs (compiling the buckets that batch needs, timed), `run()` runs them."""

    def __init__(self, lib: ctypes.CDLL, path: str, threads: int) -> None:
        self.lib = lib
        opts = lib.smelt_options_default()
        opts.threads = threads
        self.exe = ctypes.c_void_p()
        self.check(lib.smelt_dynamic_from_file(path.encode(), ctypes.byref(opts), 8,
                                               ctypes.byref(self.exe)))
        n = ctypes.c_size_t()
        self.check(lib.smelt_dynamic_output_count(self.exe, ctypes.byref(n)))
        self.output_names = []
        for i in range(n.value):
            name = ctypes.c_char_p()
            self.check(lib.smelt_dynamic_output_name(self.exe, i, ctypes.byref(name)))
            self.output_names.append(name.value.decode())

    def check(self, status: int) -> None:
        if status != 0:
            raise RuntimeError(self.lib.smelt_last_error().decode())

    def prepare(self, inputs: list[np.ndarray]) -> float:
        types = {v: k for k, v in ELEMENT_TYPES.items()}

        def tensor(a: np.ndarray) -> SmeltTensor:
            dims = (ctypes.c_size_t * MAX_RANK)(*a.shape)
            return SmeltTensor(a.ctypes.data, types[a.dtype.type], SmeltShape(a.ndim, dims))

        self.inputs = [np.ascontiguousarray(a) for a in inputs]
        self.in_t = (SmeltTensor * len(inputs))(*[tensor(a) for a in self.inputs])
        self.out_t = (SmeltTensor * len(self.output_names))()
        start = time.perf_counter()
        self.check(self.lib.smelt_dynamic_describe_outputs(
            self.exe, self.in_t, len(inputs), self.out_t, len(self.output_names)))
        first_ms = (time.perf_counter() - start) * 1e3
        self.outputs = []
        for t in self.out_t:
            a = np.zeros([t.shape.dims[k] for k in range(t.shape.rank)],
                         ELEMENT_TYPES[t.element_type])
            t.data = a.ctypes.data
            self.outputs.append(a)
        return first_ms

    def run(self) -> None:
        self.check(self.lib.smelt_dynamic_run(self.exe, self.in_t, len(self.inputs), self.out_t,
                                              len(self.outputs)))

    def results(self) -> dict[str, np.ndarray]:
        return {n: a.copy() for n, a in zip(self.output_names, self.outputs)}

    def specializations(self) -> list[tuple[int, float]]:
        n = ctypes.c_size_t()
        self.check(self.lib.smelt_dynamic_specialization_count(self.exe, ctypes.byref(n)))
        out = []
        for i in range(n.value):
            b, ms = ctypes.c_size_t(), ctypes.c_double()
            self.check(self.lib.smelt_dynamic_specialization(self.exe, i, ctypes.byref(b),
                                                             ctypes.byref(ms)))
            out.append((b.value, ms.value))
        return out

    def close(self) -> None:
        self.lib.smelt_dynamic_destroy(self.exe)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batches", default="1,2,3,4,8")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--library", default=os.path.join(ROOT, "target", "release", "libsmelt.so"))
    args = p.parse_args()
    if args.model.endswith(".onnx"):
        path = args.model
    else:
        ensure_models([args.model])
        path = model_path(args.model)
    model = onnx.load(path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in inits]
    fixed = [d.dim_value for d in inp.type.tensor_type.shape.dim][1:]
    lib = load_smelt(args.library)
    declare_dynamic(lib)
    print(f"model {path}, input {inp.name} Nx{'x'.join(map(str, fixed))}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print("| threads | batch | chunks' first call ms | dynamic ms | specialized ms | ORT ms "
          "| dyn/spec | dyn/ORT | rel err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for threads in map(int, args.threads.split(",")):
        dynamic = DynamicRunner(lib, path, threads)
        try:
            for batch in map(int, args.batches.split(",")):
                x = np.random.default_rng(batch).uniform(-1, 1, [batch] + fixed)
                x = x.astype(np.float32)
                first_ms = dynamic.prepare([x])
                pin = [f"{inp.name}={'x'.join(map(str, [batch] + fixed))}"]
                spec = SmeltRunner(lib, path, threads, "auto", True, pin, {inp.name: x})
                ort_runner = OrtRunner(path, threads, {inp.name: x}, spinning=threads <= 1)
                try:
                    dynamic.run()
                    spec.run()
                    ort_runner.run()
                    err = check_outputs(dynamic.results(), ort_runner.outputs())
                    samples = {"dyn": [], "spec": [], "ort": []}
                    for _ in range(args.rounds * args.iterations):
                        for key, side in (("dyn", dynamic), ("spec", spec), ("ort", ort_runner)):
                            start = time.perf_counter()
                            side.run()
                            samples[key].append((time.perf_counter() - start) * 1e3)
                finally:
                    spec.close()
                d, s, o = (statistics.median(samples[k]) for k in ("dyn", "spec", "ort"))
                print(f"| {threads} | {batch} | {first_ms:.0f} | {d:.2f} | {s:.2f} | {o:.2f} "
                      f"| {d / s:.3f} | {d / o:.3f} | {err:.1e} |", flush=True)
            specs = ", ".join(f"{b} ({ms:.0f} ms)" for b, ms in dynamic.specializations())
            print(f"|  | buckets compiled at {threads} thread(s): {specs} |||||||| ")
        finally:
            dynamic.close()


if __name__ == "__main__":
    main()
