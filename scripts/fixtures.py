"""What the test-data scripts share: a folder written whole or not at all, a model saved
beside its inputs and onnxruntime's outputs for them, and seeded weights."""

import contextlib
import os
import shutil

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper as h
from onnx import numpy_helper as nh


@contextlib.contextmanager
def complete_folder(out, stamp):
    """Yields a scratch folder that becomes `out`, with `.complete` holding `stamp`, only
    when the body finishes: a test never reads half-written data."""
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    yield tmp
    with open(os.path.join(tmp, ".complete"), "w") as f:
        f.write(stamp + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)


def reference_session_options():
    """onnxruntime without its graph rewrites: the reference computes the model as written."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return opts


def npy_name(name):
    """The file name smelt gives a tensor called `name` (`smelt::npy::file_name_for`):
    every byte outside [A-Za-z0-9._-] percent-encoded, so `gpu_0/data_0` stays in its folder."""
    out = "".join(
        chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "._-") else f"%{b:02X}"
        for b in name.encode()
    )
    if set(out) <= {"."}:
        out = out.replace(".", "%2E")
    return out + ".npy"


def save_with_reference(folder, model, inputs, opts, exact=False):
    """Checks and saves `model` as folder/model.onnx, each input as NAME.npy and
    onnxruntime's outputs as want_NAME.npy (NAME as `npy_name` spells it).

    `exact`: the model's outputs are exact integer arithmetic (scaled), which ONNX's own
    reference evaluator computes too. Where onnxruntime disagrees with it, the reference's
    outputs are saved instead and folder/oracle.txt says why: on x86-64 hosts without
    AVX-512 VNNI or AVX-VNNI, onnxruntime's u8s8 kernels sum pairs of products in
    saturating 16-bit lanes (vpmaddubsw), so a full-range int8 weight times a uint8 input
    is clipped."""
    onnx.checker.check_model(model, full_check=True)
    os.makedirs(folder)
    onnx.save(model, os.path.join(folder, "model.onnx"))
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    outputs = sess.run(None, inputs)
    if exact:
        reference = exact_reference(model, inputs)
        differs = [o.name for o, a, b in zip(sess.get_outputs(), outputs, reference) if not np.array_equal(a, b)]
        if differs:
            outputs = reference
            with open(os.path.join(folder, "oracle.txt"), "w") as f:
                f.write(
                    f"onnx.reference: onnxruntime {ort.__version__} differs on {', '.join(differs)} "
                    "(its u8s8 kernels saturate 16-bit pair sums on this host)\n"
                )
    for k, v in inputs.items():
        np.save(os.path.join(folder, npy_name(k)), v)
    for o, v in zip(sess.get_outputs(), outputs):
        np.save(os.path.join(folder, "want_" + npy_name(o.name)), v)


def exact_reference(model, inputs):
    """The outputs of ONNX's reference evaluator on `model`. Its QuantizeLinear and
    DequantizeLinear start at opset 19, whose semantics include those of 13 for the
    per-tensor and per-axis forms, so a model of an older opset is evaluated as 21."""
    from onnx.reference import ReferenceEvaluator

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = max(o.version, 21)
    return ReferenceEvaluator(m).run(None, inputs)


def write_models(out, stamp, seed, models, exact=()):
    """Builds each model of `models` (name -> build(rng) giving graph, inputs, opset) with
    one generator seeded `seed`, in order, and saves it with onnxruntime's outputs into
    `out` (written whole or not at all, stamped `stamp`); the models named in `exact`
    compute exact integer arithmetic and are checked against ONNX's reference evaluator
    (`save_with_reference`)."""
    rng = np.random.default_rng(seed)
    opts = reference_session_options()
    with complete_folder(out, stamp) as tmp:
        for name, build in models.items():
            graph, inputs, opset = build(rng)
            m = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
            m.ir_version = 8
            save_with_reference(os.path.join(tmp, name), m, inputs, opts, exact=name in exact)
    print(f"wrote {', '.join(models)} to {out}")


def const(name, values, dtype=np.float32):
    """An initializer `name` holding `values` (a scalar, list or array) as `dtype`."""
    return nh.from_array(np.asarray(values, dtype), name)


def init(rng, name, shape, scale=0.5):
    return nh.from_array(rng.uniform(-scale, scale, shape).astype(np.float32), name)


def batch_norm(rng, prefix, channels):
    """The initializers of an inference BatchNormalization, with non-trivial statistics."""
    return [
        nh.from_array(rng.uniform(0.5, 1.5, channels).astype(np.float32), prefix + "_g"),
        nh.from_array(rng.uniform(-0.2, 0.2, channels).astype(np.float32), prefix + "_b"),
        nh.from_array(rng.uniform(-0.1, 0.1, channels).astype(np.float32), prefix + "_m"),
        nh.from_array(rng.uniform(0.5, 2.0, channels).astype(np.float32), prefix + "_v"),
    ]


def bn_node(prefix, x, y):
    return h.make_node(
        "BatchNormalization",
        [x, prefix + "_g", prefix + "_b", prefix + "_m", prefix + "_v"],
        [y],
        epsilon=1e-5,
    )
