#!/usr/bin/env python3
"""One dynamic-sequence executable swept over every length: how many specializations it
compiles and what the first call of each new length bucket costs.

    bash scripts/setup-python.sh && cargo build --release --lib
    .venv/bin/python benches/sequence_sweep.py [--model exported/bert_opset14]
                                               [--lengths 1-384] [--threads 1]

One `SmeltDynamicExecutable` (C API) runs lengths in order, each once, on seeded token
ids with a mask whose last quarter is padding. A call that compiles a bucket (it grows
`smelt_dynamic_specialization_count`) is reported with its wall time, whose compile part
the specialization's own `compile_ms` gives; every length's run is checked against
onnxruntime (ENABLE_ALL, one thread) at 1 length in 16 and at each bucket's first call.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import onnxruntime as ort  # noqa: E402
from compare import ROOT, check_outputs, ensure_models, load_smelt, model_path  # noqa: E402
from dynamic_batch import DynamicRunner, declare_dynamic  # noqa: E402


def inputs_at(length: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    ids = rng.integers(0, 30522, size=(1, length), dtype=np.int64)
    mask = np.ones((1, length), np.int64)
    mask[:, length - length // 4 :] = 0
    types = np.zeros((1, length), np.int64)
    types[:, length // 2 :] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="exported/bert_opset14")
    p.add_argument("--lengths", default="1-384", help="FIRST-LAST, every length between")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    first, last = (int(x) for x in a.lengths.split("-"))
    ensure_models([a.model])
    path = model_path(a.model)
    lib = load_smelt(os.path.join(ROOT, "target", "release", "libsmelt.so"))
    declare_dynamic(lib)
    smelt = DynamicRunner(lib, path, a.threads)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = a.threads
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    rng = np.random.default_rng(2026)
    compiled = 0
    worst_error = 0.0
    print(f"{a.model}: lengths {first}..{last}, {a.threads} thread(s)")
    for length in range(first, last + 1):
        feeds = inputs_at(length, rng)
        start = time.perf_counter()
        smelt.prepare(list(feeds.values()))
        smelt.run()
        call_ms = (time.perf_counter() - start) * 1e3
        specs = smelt.specializations()
        new = len(specs) > compiled
        if new or length % 16 == 0:
            want = dict(zip(names, session.run(None, feeds)))
            worst_error = max(worst_error, check_outputs(smelt.results(), want))
        if new:
            compile_ms = specs[-1][1]
            print(f"  length {length:4}: new bucket, first call {call_ms:7.1f} ms "
                  f"(its compile {compile_ms:6.1f} ms)")
            compiled = len(specs)
    print(f"{compiled} specializations for {last - first + 1} lengths; "
          f"worst relative error against onnxruntime {worst_error:.2e}")
    smelt.close()


if __name__ == "__main__":
    main()
