//! What exporters actually write, through every interface: dynamic dims (`-1`, named,
//! `?` and empty `dim_param`s, unset dims) pinned by the Rust options, the CLI's `--shape`
//! and the C API's `SmeltOptions.input_shapes`, with the unpinned error spelled for each;
//! external data read from side files and confined to the model's folder; the opset
//! forms of the ops whose attributes became inputs; Constant's attribute forms and
//! initializers listed as inputs. Two exporter-style models (a `-1` input, external
//! weights) are checked against onnxruntime through `smelt run`.

mod common;
mod onnx_build;

use onnx_build::*;

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use smelt::capi::{
    smelt_executable_destroy, smelt_executable_from_file, smelt_executable_from_onnx,
    smelt_executable_input, smelt_last_error, smelt_options_default, SmeltExecutable, SmeltOptions,
    SmeltStatus, SmeltTensorInfo,
};
use smelt::ir::op::UnaryOp;
use smelt::ir::{ErrorStats, Module, Op, Tensor, F32};
use smelt::onnx::proto::attribute_proto::AttributeType;
use smelt::onnx::proto::{AttributeProto, StringStringEntryProto, TensorProto};
use smelt::onnx::{import, import_file, ImportOptions};

/// Gate on FACTS.md's relative error: max |got − ref| / max |ref|.
const MAX_RELATIVE: f64 = 1e-4;

// The model builder is tests/onnx_build.

fn param_dims(m: &Module) -> Vec<usize> {
    m.funcs[0].params[0].ty.dims.clone()
}

// ---------------------------------------------------------------------------------------
// Dynamic dims, pinned through each interface.

/// `x: [D, 3]` with dim 0 in each dynamic form → Relu.
fn dynamic_forms() -> Vec<(&'static str, Model)> {
    [
        ("-1", Dim::Fixed(-1)),
        ("named", Dim::Param("batch")),
        ("?", Dim::Param("?")),
        ("empty", Dim::Param("")),
        ("unset", Dim::Unset),
    ]
    .into_iter()
    .map(|(what, d)| {
        let m = Model::new(13)
            .input_dims("x", 1, &[d, Dim::Fixed(3)])
            .node("Relu", "r", &["x"], &["y"], vec![])
            .output("y");
        (what, m)
    })
    .collect()
}

#[test]
fn every_dynamic_dim_form_is_pinned_through_the_rust_api() {
    for (what, model) in dynamic_forms() {
        let opts = ImportOptions::default().with_shape("x", [5, 3]);
        let m = import(&model.bytes(), &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(param_dims(&m), [5, 3], "{what}");
        let text = error_text(model.import(), "onnx-dynamic-shape");
        assert!(
            text.contains("input 'x' dimension 0 is dynamic")
                && text.contains(
                    "pin it with ImportOptions::input_shapes (or LoadOptions::input_shapes), \
                     e.g. ImportOptions::default().with_shape(\"x\", [D0, 3])"
                ),
            "{what}: {text}"
        );
        assert!(!text.contains("--shape"), "{what}: {text}");
        // through load_model too
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.onnx");
        model.write(&path);
        let mut load = smelt::LoadOptions::default();
        load.input_shapes.insert("x".into(), vec![2, 3]);
        let m = smelt::load_model(&path, &load).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(param_dims(&m), [2, 3], "{what}");
    }
}

#[test]
fn the_unpinned_error_says_what_the_dim_is() {
    let forms = dynamic_forms();
    let texts: Vec<String> = forms
        .iter()
        .map(|(_, m)| error_text(m.import(), "onnx-dynamic-shape"))
        .collect();
    for (text, want) in texts.iter().zip([
        "dynamic (-1, declared shape [-1, 3])",
        "dynamic ('batch', declared shape [batch, 3])",
        "dynamic ('?', declared shape [?, 3])",
        "dynamic (an empty dim_param, declared shape [?, 3])",
        "dynamic (unset, declared shape [?, 3])",
    ]) {
        assert!(text.contains(want), "{text}");
    }
    // no shape at all
    let text = error_text(
        Model::new(13)
            .input_no_shape("x")
            .node("Relu", "r", &["x"], &["y"], vec![])
            .output("y")
            .import(),
        "onnx-dynamic-shape",
    );
    assert!(
        text.contains("input 'x' has no declared shape; pin it with ImportOptions"),
        "{text}"
    );
    let opts = ImportOptions::default().with_shape("x", [2, 2, 2]);
    let m = Model::new(13)
        .input_no_shape("x")
        .node("Relu", "r", &["x"], &["y"], vec![])
        .output("y");
    assert_eq!(param_dims(&import(&m.bytes(), &opts).unwrap()), [2, 2, 2]);
}

#[test]
fn pins_that_contradict_the_model_are_errors_naming_the_dim() {
    let model = Model::new(13)
        .input_dims("x", 1, &[Dim::Fixed(-1), Dim::Fixed(3), Dim::Param("h")])
        .node("Relu", "r", &["x"], &["y"], vec![])
        .output("y");
    let import_with = |dims: &[usize]| {
        import(
            &model.bytes(),
            &ImportOptions::default().with_shape("x", dims),
        )
    };
    assert_eq!(param_dims(&import_with(&[1, 3, 7]).unwrap()), [1, 3, 7]);
    let text = error_text(import_with(&[1, 4, 7]), "onnx-bad-option");
    assert!(
        text.contains(
            "shape [1, 4, 7] given for input 'x' does not match its declared shape [-1, 3, h]: \
             dimension 1 is 3 in the model, 4 in the pin"
        ),
        "{text}"
    );
    let text = error_text(import_with(&[1, 3]), "onnx-bad-option");
    assert!(
        text.contains("has rank 2, but its declared shape [-1, 3, h] has rank 3"),
        "{text}"
    );
    // a pin naming no input
    let text = error_text(
        import(
            &model.bytes(),
            &ImportOptions::default().with_shape("images", [1]),
        ),
        "onnx-bad-option",
    );
    assert!(
        text.contains("the model has no input named 'images' (inputs: x)"),
        "{text}"
    );
    // a pin of an input also frozen as a constant
    let mut both = ImportOptions::default().with_shape("x", [1, 3, 1]);
    both.constant_inputs
        .insert("x".into(), f32_raw("x", &[1, 3, 1], &[0.0; 3]));
    let text = error_text(import(&model.bytes(), &both), "onnx-bad-option");
    assert!(
        text.contains("input 'x' is given both a shape and a constant value"),
        "{text}"
    );
    // a declared size below -1 is malformed
    let bad = Model::new(13)
        .input_dims("x", 1, &[Dim::Fixed(-2)])
        .node("Relu", "r", &["x"], &["y"], vec![])
        .output("y");
    let text = error_text(bad.import(), "onnx-bad-model");
    assert!(
        text.contains("input 'x' dimension 0 is declared as -2"),
        "{text}"
    );
}

#[test]
fn every_dynamic_dim_form_is_pinned_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    for (what, model) in dynamic_forms() {
        let path = dir.path().join(format!("{}.onnx", what.replace('?', "q")));
        model.write(&path);
        let out = dir.path().join(format!("out-{}", what.replace('?', "q")));
        let p = path.to_str().unwrap();
        let o = out.to_str().unwrap();
        let ok = common::smelt(&[
            "run",
            p,
            "--shape",
            "x=4x3",
            "--random-inputs",
            "1",
            "--output-dir",
            o,
        ]);
        assert!(ok.status.success(), "{what}: {}", common::stderr(&ok));
        let y = smelt::npy::decode(&std::fs::read(out.join("y.npy")).unwrap()).unwrap();
        assert_eq!(y.dims(), &[4, 3], "{what}");
        // a dynamic leading dim is a batch: compiled code runs it without --shape
        let batched = common::smelt(&[
            "run",
            p,
            "--random-inputs",
            "1",
            "--batch",
            "2",
            "--output-dir",
            o,
        ]);
        assert!(
            batched.status.success(),
            "{what}: {}",
            common::stderr(&batched)
        );
        let y = smelt::npy::decode(&std::fs::read(out.join("y.npy")).unwrap()).unwrap();
        assert_eq!(y.dims(), &[2, 3], "{what}");
        // the interpreter runs one shape: it needs the pin
        let unpinned = common::smelt(&[
            "run",
            p,
            "--interp",
            "--random-inputs",
            "1",
            "--output-dir",
            o,
        ]);
        assert_eq!(unpinned.status.code(), Some(1), "{what}");
        let err = common::stderr(&unpinned);
        assert!(
            err.contains("input 'x' dimension 0 is dynamic")
                && err.contains("pin it with --shape x=D0x3 (each Dk the size of dimension k)"),
            "{what}: {err}"
        );
        assert!(!err.contains("ImportOptions"), "{what}: {err}");
    }
    let p = dir.path().join("-1.onnx");
    let p = p.to_str().unwrap();
    let o = dir.path().join("o");
    let o = o.to_str().unwrap();
    let twice = common::smelt(&[
        "run",
        p,
        "--shape",
        "x=4x3",
        "--shape",
        "x=5x3",
        "--random-inputs",
        "1",
        "--output-dir",
        o,
    ]);
    assert_eq!(twice.status.code(), Some(1));
    assert!(
        common::stderr(&twice).contains("--shape gives input 'x' twice"),
        "{}",
        common::stderr(&twice)
    );
    let unknown = common::smelt(&[
        "run",
        p,
        "--shape",
        "images=4x3",
        "--random-inputs",
        "1",
        "--output-dir",
        o,
    ]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        common::stderr(&unknown).contains("the model has no input named 'images'"),
        "{}",
        common::stderr(&unknown)
    );
    let contradicts = common::smelt(&[
        "run",
        p,
        "--shape",
        "x=4x2",
        "--random-inputs",
        "1",
        "--output-dir",
        o,
    ]);
    assert_eq!(contradicts.status.code(), Some(1));
    assert!(
        common::stderr(&contradicts).contains("dimension 1 is 3 in the model, 2 in the pin"),
        "{}",
        common::stderr(&contradicts)
    );
}

fn last_error() -> String {
    // SAFETY: smelt_last_error never returns NULL; its string lives until the next call
    // on this thread, and is copied at once.
    unsafe { CStr::from_ptr(smelt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Compiles ONNX `bytes` through the C API with `shapes` as `input_shapes`; the status,
/// the message, and the dims of input 0 on success.
fn c_from_onnx(bytes: &[u8], shapes: Option<&str>) -> (SmeltStatus, String, Vec<usize>) {
    let shapes = shapes.map(|s| CString::new(s).unwrap());
    let opts = SmeltOptions {
        input_shapes: shapes.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
        ..smelt_options_default()
    };
    let mut exe: *mut SmeltExecutable = std::ptr::null_mut();
    // SAFETY: `bytes` is readable for its length, `opts` is a valid options struct whose
    // string outlives the call, `exe` is writable.
    let status =
        unsafe { smelt_executable_from_onnx(bytes.as_ptr(), bytes.len(), &opts, &mut exe) };
    c_result(status, exe)
}

fn c_from_file(path: &Path, shapes: Option<&str>) -> (SmeltStatus, String, Vec<usize>) {
    let shapes = shapes.map(|s| CString::new(s).unwrap());
    let opts = SmeltOptions {
        input_shapes: shapes.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
        ..smelt_options_default()
    };
    let path = CString::new(path.to_str().unwrap()).unwrap();
    let mut exe: *mut SmeltExecutable = std::ptr::null_mut();
    // SAFETY: `path` is NUL-terminated, `opts` valid, `exe` writable.
    let status = unsafe { smelt_executable_from_file(path.as_ptr(), &opts, &mut exe) };
    c_result(status, exe)
}

fn c_result(status: SmeltStatus, exe: *mut SmeltExecutable) -> (SmeltStatus, String, Vec<usize>) {
    let message = last_error();
    if status != SmeltStatus::Ok {
        assert!(exe.is_null());
        return (status, message, Vec::new());
    }
    let mut info = SmeltTensorInfo {
        name: std::ptr::null(),
        rank: 0,
        dims: std::ptr::null(),
        element_count: 0,
        layout: std::ptr::null(),
        element_type: smelt::capi::SmeltElementType::F32,
    };
    // SAFETY: `exe` is a live handle and `info` is writable.
    let s = unsafe { smelt_executable_input(exe, 0, &mut info) };
    assert_eq!(s, SmeltStatus::Ok);
    // SAFETY: on success `dims` points to `rank` dims owned by the live handle.
    let dims = unsafe { std::slice::from_raw_parts(info.dims, info.rank) }.to_vec();
    assert_eq!(smelt_executable_destroy(exe), SmeltStatus::Ok);
    (status, message, dims)
}

#[test]
fn every_dynamic_dim_form_is_pinned_through_the_c_api() {
    for (what, model) in dynamic_forms() {
        let (status, msg, dims) = c_from_onnx(&model.bytes(), Some("x=6x3"));
        assert_eq!(status, SmeltStatus::Ok, "{what}: {msg}");
        assert_eq!(dims, [6, 3], "{what}");
        let (status, msg, _) = c_from_onnx(&model.bytes(), None);
        assert_eq!(status, SmeltStatus::Onnx, "{what}: {msg}");
        assert!(
            msg.contains("input 'x' dimension 0 is dynamic")
                && msg.contains(
                    "pin it with SmeltOptions.input_shapes = \"x=D0x3\" (each Dk the size of \
                     dimension k)"
                ),
            "{what}: {msg}"
        );
        assert!(
            !msg.contains("--shape") && !msg.contains("ImportOptions"),
            "{what}: {msg}"
        );
    }
    let (_, model) = &dynamic_forms()[0];
    let (status, msg, _) = c_from_onnx(&model.bytes(), Some("x=6x3; x=7x3"));
    assert_eq!(status, SmeltStatus::InvalidArgument, "{msg}");
    assert!(msg.contains("input_shapes gives input 'x' twice"), "{msg}");
    let (status, msg, _) = c_from_onnx(&model.bytes(), Some("images=6x3"));
    assert_eq!(status, SmeltStatus::Onnx, "{msg}");
    assert!(
        msg.contains("the model has no input named 'images'"),
        "{msg}"
    );
    let (status, msg, _) = c_from_onnx(&model.bytes(), Some("x=6x4"));
    assert_eq!(status, SmeltStatus::Onnx, "{msg}");
    assert!(
        msg.contains("dimension 1 is 3 in the model, 4 in the pin"),
        "{msg}"
    );
    // from a file too
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.onnx");
    model.write(&path);
    let (status, msg, dims) = c_from_file(&path, Some("x=2x3"));
    assert_eq!(status, SmeltStatus::Ok, "{msg}");
    assert_eq!(dims, [2, 3]);
    let (status, msg, _) = c_from_file(&path, None);
    assert_eq!(status, SmeltStatus::Onnx);
    assert!(
        msg.contains("SmeltOptions.input_shapes = \"x=D0x3\""),
        "{msg}"
    );
}

// ---------------------------------------------------------------------------------------
// External data.

/// `y = Reshape(Conv(x, w) + b, shape) * c`: w, b and shape from initializers, c from a
/// Constant node. `tensors` gives them (inline or external).
fn conv_model(w: TensorProto, b: TensorProto, shape: TensorProto, c: TensorProto) -> Model {
    Model::new(17)
        .input_dims("x", 1, &fixed(&[1, 8, 12, 12]))
        .init(w)
        .init(b)
        .init(shape)
        .node("Constant", "c", &[], &["c"], vec![attr_tensor("value", c)])
        .node(
            "Conv",
            "conv",
            &["x", "w"],
            &["conv"],
            vec![attr_ints("pads", &[1, 1, 1, 1])],
        )
        .node("Add", "bias", &["conv", "b"], &["biased"], vec![])
        .node("Reshape", "flat", &["biased", "shape"], &["flat"], vec![])
        .node("Mul", "scale", &["flat", "c"], &["y"], vec![])
        .output("y")
}

const W_DIMS: [i64; 4] = [32, 8, 3, 3]; // 9 KB
const B_DIMS: [i64; 3] = [32, 1, 1];

fn conv_values() -> (Vec<f32>, Vec<f32>, Vec<i64>, Vec<f32>) {
    let w = smelt::ir::weights::random_f32(3, 32 * 8 * 9, -0.5, 0.5);
    let b = smelt::ir::weights::random_f32(4, 32, -0.5, 0.5);
    (w, b, vec![1, 32, -1], [0.5, -2.0, 1.25, 3.0].repeat(36))
}

fn inline_conv_model() -> Model {
    let (w, b, shape, c) = conv_values();
    conv_model(
        f32_raw("w", &W_DIMS, &w),
        f32_raw("b", &B_DIMS, &b),
        i64_typed("shape", &shape),
        f32_raw("c", &[144], &c),
    )
}

/// Writes the conv model with all four tensors in `folder/data/weights.bin` (at
/// scattered offsets, padded between them, as exporters align them) and returns the
/// model's path.
fn write_external_conv_model(folder: &Path) -> PathBuf {
    let (w, b, shape, c) = conv_values();
    let mut file = vec![0xAAu8; 100]; // an offset before the first tensor
    let mut place = |bytes: Vec<u8>| {
        let offset = file.len() as u64;
        let len = bytes.len() as u64;
        file.extend(bytes);
        file.extend([0x55u8; 36]);
        (offset, len)
    };
    let (wo, wl) = place(f32_le(&w));
    let (bo, _) = place(f32_le(&b));
    let (so, sl) = place(shape.iter().flat_map(|v| v.to_le_bytes()).collect());
    let (co, cl) = place(f32_le(&c));
    std::fs::create_dir_all(folder.join("data")).unwrap();
    std::fs::write(folder.join("data/weights.bin"), &file).unwrap();
    let model = conv_model(
        external("w", 1, &W_DIMS, "data/weights.bin", wo, Some(wl)),
        external("b", 1, &B_DIMS, "./data/../data/weights.bin", bo, None),
        external("shape", 7, &[3], "data/weights.bin", so, Some(sl)),
        external("c", 1, &[144], "data/weights.bin", co, Some(cl)),
    );
    let path = folder.join("model.onnx");
    model.write(&path);
    path
}

#[test]
fn external_data_imports_and_runs_bit_for_bit_like_inline_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_external_conv_model(dir.path());
    let ext = import_file(&path, &ImportOptions::default()).expect("external import");
    let inline = inline_conv_model().import().expect("inline import");
    assert_eq!(ops(&ext), ops(&inline));
    let x = Tensor::new(
        [1, 8, 12, 12],
        smelt::ir::weights::random_f32(5, 8 * 144, -1.0, 1.0),
    )
    .unwrap();
    let bits = |ts: &[Tensor]| -> Vec<u32> { ts[0].f32s().iter().map(|v| v.to_bits()).collect() };
    let a = run(&ext, std::slice::from_ref(&x));
    let b = run(&inline, std::slice::from_ref(&x));
    assert_eq!(a[0].dims(), &[1, 32, 144]);
    assert!(bits(&a) == bits(&b), "interpreter outputs differ");
    let jit = |m: &Module| {
        let (exe, _) = smelt::compile(m, &smelt::Options::default()).unwrap();
        bits(&exe.run(std::slice::from_ref(&x)).unwrap())
    };
    assert!(jit(&ext) == jit(&inline), "JIT outputs differ");
    // the C API reads it from the file too, and refuses it as bytes
    let (status, msg, dims) = c_from_file(&path, None);
    assert_eq!(status, SmeltStatus::Ok, "{msg}");
    assert_eq!(dims, [1, 8, 12, 12]);
    let bytes = std::fs::read(&path).unwrap();
    let (status, msg, _) = c_from_onnx(&bytes, None);
    assert_eq!(status, SmeltStatus::Onnx);
    assert!(
        msg.contains("initializer 'w' stores its data in the external file 'data/weights.bin'")
            && msg.contains("compile the file with smelt_executable_from_file"),
        "{msg}"
    );
    let text = error_text(
        import(&bytes, &ImportOptions::default()),
        "onnx-external-data",
    );
    assert!(
        text.contains("given as bytes") && text.contains("smelt::onnx::import_file"),
        "{text}"
    );
}

/// Imports `model` (written as `folder/model.onnx`), expecting an external-data error
/// containing every string of `want`, within a few seconds.
fn refused(folder: &Path, model: &Model, want: &[&str]) {
    let path = folder.join("model.onnx");
    model.write(&path);
    let start = Instant::now();
    let text = error_text(
        import_file(&path, &ImportOptions::default()),
        "onnx-external-data",
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    for w in want {
        assert!(text.contains(w), "want {w:?} in: {text}");
    }
}

/// The model `y = x + w` with `w: [4]` as given.
fn add_model(w: TensorProto) -> Model {
    Model::new(13)
        .input_dims("x", 1, &fixed(&[4]))
        .init(w)
        .node("Add", "add", &["x", "w"], &["y"], vec![])
        .output("y")
}

#[test]
fn external_data_outside_the_folder_or_past_the_file_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let folder = root.path().join("model");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(root.path().join("secret.bin"), f32_le(&[1.0; 4])).unwrap();
    std::fs::write(folder.join("w.bin"), f32_le(&[1.0, 2.0, 3.0, 4.0])).unwrap();
    let w = |loc: &str, offset: u64, length: Option<u64>| {
        add_model(external("w", 1, &[4], loc, offset, length))
    };
    // the good one first: the refusals below are the location's fault alone
    std::fs::write(folder.join("model.onnx"), w("w.bin", 0, Some(16)).bytes()).unwrap();
    let m = import_file(&folder.join("model.onnx"), &ImportOptions::default()).unwrap();
    assert_eq!(
        run(&m, &[Tensor::new([4], vec![0.0; 4]).unwrap()])[0].data,
        [1.0, 2.0, 3.0, 4.0]
    );
    refused(
        &folder,
        &w("../secret.bin", 0, None),
        &[
            "initializer 'w'",
            "'../secret.bin'",
            "climbs out of the model's folder",
        ],
    );
    refused(
        &folder,
        &w("sub/../../secret.bin", 0, None),
        &["'sub/../../secret.bin'", "'..'"],
    );
    let abs = root.path().join("secret.bin");
    refused(
        &folder,
        &w(abs.to_str().unwrap(), 0, None),
        &["initializer 'w'", "is an absolute path"],
    );
    refused(
        &folder,
        &w("/dev/zero", 0, None),
        &["'/dev/zero'", "is an absolute path"],
    );
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(root.path().join("secret.bin"), folder.join("link.bin"))
            .unwrap();
        refused(
            &folder,
            &w("link.bin", 0, None),
            &["'link.bin'", "leads out of the model's folder"],
        );
        // ... with the same words as a link to a file that does not exist, so the
        // error tells nothing about what is outside
        std::os::unix::fs::symlink(root.path().join("nothing.bin"), folder.join("gone.bin"))
            .unwrap();
        refused(
            &folder,
            &w("gone.bin", 0, None),
            &["'gone.bin'", "leads out of the model's folder"],
        );
        // unless the caller allows the folder it leads to
        let path = folder.join("model.onnx");
        w("link.bin", 0, None).write(&path);
        let allowed = ImportOptions {
            allowed_root: Some(root.path().to_path_buf()),
            ..ImportOptions::default()
        };
        let m = import_file(&path, &allowed).unwrap();
        assert_eq!(
            run(&m, &[Tensor::new([4], vec![0.0; 4]).unwrap()])[0].data,
            [1.0; 4]
        );
        std::os::unix::fs::symlink("/dev/zero", folder.join("zero.bin")).unwrap();
        refused(
            &folder,
            &w("zero.bin", 0, None),
            &["'zero.bin'", "leads out of the model's folder"],
        );
        // a FIFO inside the folder: refused without waiting for a writer
        let fifo = folder.join("pipe.bin");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            refused(
                &folder,
                &w("pipe.bin", 0, None),
                &["'pipe.bin'", "is not a regular file"],
            );
        }
    }
    std::fs::create_dir(folder.join("dir.bin")).unwrap();
    refused(
        &folder,
        &w("dir.bin", 0, None),
        &["'dir.bin'", "is a directory"],
    );
    refused(
        &folder,
        &w("missing.bin", 0, None),
        &["'missing.bin'", "cannot be opened"],
    );
    refused(
        &folder,
        &w("w.bin", 4, None),
        &["offset 4 with length 16 runs past the end of 'w.bin' (16 bytes)"],
    );
    refused(
        &folder,
        &w("w.bin", u64::MAX - 3, None),
        &["runs past the end"],
    );
    refused(
        &folder,
        &w("w.bin", 0, Some(12)),
        &["length 12, but the tensor's dims and type make 16 bytes"],
    );
    refused(
        &folder,
        &w("w.bin", 0, Some(1 << 40)),
        &["length 1099511627776"],
    );
    // a huge declared tensor is refused before any allocation
    let huge = add_model(external("w", 1, &[1 << 20, 1 << 20], "w.bin", 0, None));
    refused(&folder, &huge, &["tensor limit"]);
    // malformed entries
    let mut no_location = external("w", 1, &[4], "w.bin", 0, None);
    no_location.external_data.retain(|e| e.key() != "location");
    refused(&folder, &add_model(no_location), &["gives no location"]);
    let mut bad_offset = external("w", 1, &[4], "w.bin", 0, None);
    bad_offset.external_data[1].value = Some("-8".into());
    refused(
        &folder,
        &add_model(bad_offset),
        &["offset '-8' is not a non-negative integer"],
    );
    let mut unknown = external("w", 1, &[4], "w.bin", 0, None);
    unknown.external_data.push(StringStringEntryProto {
        key: Some("basepath".into()),
        value: Some("/".into()),
    });
    refused(&folder, &add_model(unknown), &["unknown key 'basepath'"]);
    // a Constant node's tensor is confined the same way, and named as an attribute
    let constant = Model::new(13)
        .input_dims("x", 1, &fixed(&[4]))
        .node(
            "Constant",
            "k",
            &[],
            &["w"],
            vec![attr_tensor(
                "value",
                external("v", 1, &[4], "../secret.bin", 0, None),
            )],
        )
        .node("Add", "add", &["x", "w"], &["y"], vec![])
        .output("y");
    refused(
        &folder,
        &constant,
        &["attribute 'value' of Constant node 'k'", "climbs out"],
    );
}

// ---------------------------------------------------------------------------------------
// Opset forms: attributes that became inputs.

/// A model squeezing x: [1, 3, 1] → [3] with axes in the given form.
fn squeeze(opset: i64, inputs: &[&str], attrs: Vec<AttributeProto>) -> Model {
    Model::new(opset)
        .input_dims("x", 1, &fixed(&[1, 3, 1]))
        .node("Squeeze", "sq", inputs, &["y"], attrs)
        .output("y")
}

#[test]
fn squeeze_and_unsqueeze_axes_come_in_the_form_of_the_opset() {
    let reshape_to = |dims: &[usize]| Op::Reshape {
        shape: dims.to_vec(),
    };
    // attribute before 13 (negative axes from 11)
    for opset in [1, 11, 12] {
        let axes = if opset >= 11 { [0, -1] } else { [0, 2] };
        let m = squeeze(opset, &["x"], vec![attr_ints("axes", &axes)])
            .import()
            .unwrap();
        assert_eq!(ops(&m), [&reshape_to(&[3])], "opset {opset}");
    }
    // an input from 13: initializer, Constant node, folded shape arithmetic, or absent
    for opset in [13, 21, 25] {
        let init = squeeze(opset, &["x", "axes"], vec![]).init(i64_typed("axes", &[0, 2]));
        let constant = Model::new(opset)
            .input_dims("x", 1, &fixed(&[1, 3, 1]))
            .node(
                "Constant",
                "k",
                &[],
                &["axes"],
                vec![attr_ints("value_ints", &[-1, 0])],
            )
            .node("Squeeze", "sq", &["x", "axes"], &["y"], vec![])
            .output("y");
        // axes = Shape(x)[1:2] - 3 + ... : [1,3,1] → Gather index 0 → [1] - 1 = [0]
        let folded = Model::new(opset)
            .input_dims("x", 1, &fixed(&[1, 3, 1]))
            .init(i64_typed("i", &[0]))
            .init(i64_typed("one", &[1]))
            .node("Shape", "shape", &["x"], &["s"], vec![])
            .node("Gather", "g", &["s", "i"], &["first"], vec![])
            .node("Sub", "sub", &["first", "one"], &["axes"], vec![])
            .node("Squeeze", "sq", &["x", "axes"], &["y"], vec![])
            .output("y");
        let absent = squeeze(opset, &["x"], vec![]);
        for (what, model, want) in [
            ("initializer", init, vec![3]),
            ("Constant", constant, vec![3]),
            ("folded", folded, vec![3, 1]),
            ("absent", absent, vec![3]),
        ] {
            let m = model
                .import()
                .unwrap_or_else(|e| panic!("opset {opset} {what}: {e}"));
            assert_eq!(ops(&m), [&reshape_to(&want)], "opset {opset} {what}");
        }
        let unsq = Model::new(opset)
            .input_dims("x", 1, &fixed(&[3]))
            .node(
                "Constant",
                "k",
                &[],
                &["axes"],
                vec![attr_ints("value_ints", &[0, -1])],
            )
            .node("Unsqueeze", "u", &["x", "axes"], &["y"], vec![])
            .output("y")
            .import()
            .unwrap();
        assert_eq!(ops(&unsq), [&reshape_to(&[1, 3, 1])], "opset {opset}");
    }
    for opset in [1, 11] {
        let unsq = Model::new(opset)
            .input_dims("x", 1, &fixed(&[3]))
            .node(
                "Unsqueeze",
                "u",
                &["x"],
                &["y"],
                vec![attr_ints("axes", &[0, 2])],
            )
            .output("y")
            .import()
            .unwrap();
        assert_eq!(ops(&unsq), [&reshape_to(&[1, 3, 1])], "opset {opset}");
    }
    // the other opset's form is an error, not half-read
    let text = error_text(
        squeeze(13, &["x"], vec![attr_ints("axes", &[0])]).import(),
        "onnx-bad-attribute",
    );
    assert!(
        text.contains("Squeeze node 'sq', opset 13")
            && text.contains("attribute 'axes': is input 1 of Squeeze from opset 13"),
        "{text}"
    );
    let text = error_text(
        squeeze(11, &["x", "axes"], vec![])
            .init(i64_typed("axes", &[0]))
            .import(),
        "onnx-bad-model",
    );
    assert!(
        text.contains("Squeeze-11 takes its axes as an attribute"),
        "{text}"
    );
    // axes computed at run time cannot fold
    let text = error_text(
        Model::new(13)
            .input_dims("x", 1, &fixed(&[1, 3, 1]))
            .input_dims("axes", 1, &fixed(&[1]))
            .node("Squeeze", "sq", &["x", "axes"], &["y"], vec![])
            .output("y")
            .import(),
        "onnx-dynamic-shape",
    );
    assert!(text.contains("the axes) is computed at run time"), "{text}");
}

#[test]
fn clip_bounds_come_in_the_form_of_the_opset() {
    let clip = |lo: f32, hi: f32| {
        Op::Unary(UnaryOp::Clip {
            min: F32(lo),
            max: F32(hi),
        })
    };
    let x = Tensor::new([4], vec![-3.0, 0.5, 1.5, 9.0]).unwrap();
    let check = |m: &Module, want: &[f32], what: &str| {
        assert_eq!(run(m, std::slice::from_ref(&x))[0].data, want, "{what}");
    };
    // attributes before 11
    let m = Model::new(6)
        .input_dims("x", 1, &fixed(&[4]))
        .node("Clip", "c", &["x"], &["y"], vec![attr_float("min", -1.0)])
        .output("y")
        .import()
        .unwrap();
    assert_eq!(ops(&m), [&clip(-1.0, f32::MAX)]);
    check(&m, &[-1.0, 0.5, 1.5, 9.0], "opset 6 min only");
    // inputs from 11: initializers, Constant nodes of each float form, absent min
    for opset in [11, 12, 13] {
        let m = Model::new(opset)
            .input_dims("x", 1, &fixed(&[4]))
            .init(f32_raw("lo", &[], &[-1.0]))
            .node(
                "Constant",
                "hi",
                &[],
                &["hi"],
                vec![attr_float("value_float", 2.0)],
            )
            .node("Clip", "c", &["x", "lo", "hi"], &["y"], vec![])
            .output("y")
            .import()
            .unwrap();
        assert_eq!(ops(&m), [&clip(-1.0, 2.0)], "opset {opset}");
        check(&m, &[-1.0, 0.5, 1.5, 2.0], "inputs");
        let m = Model::new(opset)
            .input_dims("x", 1, &fixed(&[4]))
            .node(
                "Constant",
                "hi",
                &[],
                &["hi"],
                vec![attr_tensor("value", f32_raw("v", &[1], &[1.0]))],
            )
            .node("Clip", "c", &["x", "", "hi"], &["y"], vec![])
            .output("y")
            .import()
            .unwrap();
        assert_eq!(ops(&m), [&clip(f32::NEG_INFINITY, 1.0)], "opset {opset}");
        check(&m, &[-3.0, 0.5, 1.0, 1.0], "max only");
        // a bound computed at run time becomes max / min
        let m = Model::new(opset)
            .input_dims("x", 1, &fixed(&[4]))
            .input_dims("lo", 1, &fixed(&[]))
            .node("Clip", "c", &["x", "lo"], &["y"], vec![])
            .output("y")
            .import()
            .unwrap();
        assert_eq!(m.funcs[0].insts.len(), 1, "opset {opset}: one max");
    }
    let text = error_text(
        Model::new(13)
            .input_dims("x", 1, &fixed(&[4]))
            .node("Clip", "c", &["x"], &["y"], vec![attr_float("min", 0.0)])
            .output("y")
            .import(),
        "onnx-bad-attribute",
    );
    assert!(
        text.contains("attribute 'min': is an input of Clip from opset 11"),
        "{text}"
    );
    let text = error_text(
        Model::new(6)
            .input_dims("x", 1, &fixed(&[4]))
            .init(f32_raw("lo", &[], &[-1.0]))
            .node("Clip", "c", &["x", "lo"], &["y"], vec![])
            .output("y")
            .import(),
        "onnx-bad-model",
    );
    assert!(
        text.contains("Clip-6 takes min and max as attributes"),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------
// Constant forms and initializers listed as inputs.

#[test]
fn every_constant_attribute_form_imports() {
    // y = Reshape(x, shape) * k, with k and shape from each form
    let with = |k: AttributeProto, shape: AttributeProto| {
        Model::new(13)
            .input_dims("x", 1, &fixed(&[2, 2]))
            .node("Constant", "k", &[], &["k"], vec![k])
            .node("Constant", "s", &[], &["s"], vec![shape])
            .node("Reshape", "r", &["x", "s"], &["flat"], vec![])
            .node("Mul", "m", &["flat", "k"], &["y"], vec![])
            .output("y")
    };
    let x = Tensor::new([2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let typed_k = TensorProto {
        dims: vec![4],
        data_type: Some(1),
        float_data: vec![2.0; 4],
        ..Default::default()
    };
    let shape_t = TensorProto {
        dims: vec![1],
        data_type: Some(7),
        raw_data: Some((-1i64).to_le_bytes().to_vec().into()),
        ..Default::default()
    };
    for (what, k, s) in [
        (
            "value raw / value_ints",
            attr_tensor("value", f32_raw("k", &[4], &[2.0; 4])),
            attr_ints("value_ints", &[4]),
        ),
        (
            "value typed / value raw int64",
            attr_tensor("value", typed_k),
            attr_tensor("value", shape_t),
        ),
        (
            "value_float / value_ints",
            attr_float("value_float", 2.0),
            attr_ints("value_ints", &[-1]),
        ),
        (
            "value_floats / value_ints",
            attr_floats("value_floats", &[2.0]),
            attr_ints("value_ints", &[4]),
        ),
    ] {
        let m = with(k, s)
            .import()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            run(&m, std::slice::from_ref(&x))[0].data,
            [2.0, 4.0, 6.0, 8.0],
            "{what}"
        );
    }
    // value_int is a scalar: an integer, usable as a shape only after Unsqueeze
    let m = Model::new(13)
        .input_dims("x", 1, &fixed(&[2, 2]))
        .node("Constant", "n", &[], &["n"], vec![attr_int("value_int", 4)])
        .node(
            "Constant",
            "ax",
            &[],
            &["ax"],
            vec![attr_ints("value_ints", &[0])],
        )
        .node("Unsqueeze", "u", &["n", "ax"], &["s"], vec![])
        .node("Reshape", "r", &["x", "s"], &["y"], vec![])
        .output("y")
        .import()
        .unwrap();
    assert_eq!(ops(&m), [&Op::Reshape { shape: vec![4] }]);
    for (attr, want) in [
        (
            AttributeProto {
                name: Some("value_string".into()),
                s: Some(b"hi".to_vec()),
                r#type: Some(AttributeType::String as i32),
                ..Default::default()
            },
            "'value_string' (sparse or string constants) is not supported",
        ),
        (
            AttributeProto {
                name: Some("sparse_value".into()),
                r#type: Some(AttributeType::SparseTensor as i32),
                ..Default::default()
            },
            "'sparse_value' (sparse or string constants) is not supported",
        ),
    ] {
        let text = error_text(
            Model::new(13)
                .input_dims("x", 1, &fixed(&[1]))
                .node("Constant", "k", &[], &["k"], vec![attr])
                .node("Add", "a", &["x", "k"], &["y"], vec![])
                .output("y")
                .import(),
            "onnx-unsupported-attribute",
        );
        assert!(
            text.contains(want) && text.contains("Constant node 'k'"),
            "{text}"
        );
    }
}

#[test]
fn initializers_listed_as_inputs_stay_constants() {
    let model = Model::new(13)
        .input_dims("x", 1, &fixed(&[4]))
        .input_dims("w", 1, &fixed(&[4]))
        .init(f32_raw("w", &[4], &[1.0, 2.0, 3.0, 4.0]))
        .node("Add", "add", &["x", "w"], &["y"], vec![])
        .output("y");
    let m = model.import().unwrap();
    let names: Vec<&str> = m.funcs[0].params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["x"]);
    assert_eq!(
        run(&m, &[Tensor::new([4], vec![1.0; 4]).unwrap()])[0].data,
        [2.0, 3.0, 4.0, 5.0]
    );
    let text = error_text(
        import(
            &model.bytes(),
            &ImportOptions::default().with_shape("w", [4]),
        ),
        "onnx-bad-option",
    );
    assert!(
        text.contains("input 'w', which has an initializer of shape [4]"),
        "{text}"
    );
    // a constant input given by the caller replaces the default
    let mut opts = ImportOptions::default();
    opts.constant_inputs
        .insert("w".into(), f32_raw("w", &[4], &[0.0; 4]));
    let m = import(&model.bytes(), &opts).unwrap();
    assert_eq!(
        run(&m, &[Tensor::new([4], vec![1.0; 4]).unwrap()])[0].data,
        [1.0; 4]
    );
}

// ---------------------------------------------------------------------------------------
// Exporter-style models against onnxruntime, through `smelt run`.

fn quirk_models() -> PathBuf {
    common::generated_data(
        "quirks",
        "make_quirk_models.py",
        "onnx 1.23.2 onnxruntime 1.32.0 quirks 1",
    )
}

fn npy(path: &Path) -> Tensor {
    smelt::npy::decode(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .unwrap()
}

/// Runs `smelt run MODEL --input x=X.npy EXTRA...` and returns output `y`.
fn smelt_run(model: &Path, x: &Path, extra: &[&str], out: &Path) -> Tensor {
    let input = format!("x={}", x.display());
    let mut args = vec![
        "run",
        model.to_str().unwrap(),
        "--input",
        &input,
        "--output-dir",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let o = common::smelt(&args);
    assert!(o.status.success(), "{}", common::stderr(&o));
    npy(&out.join("y.npy"))
}

fn against_ort(name: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.dims(), want.dims(), "{name}");
    let e = ErrorStats::between_tensors(got, want).unwrap();
    println!(
        "{name}: max abs {:.3e}, relative {:.3e} over {} values (smelt run vs onnxruntime)",
        e.max_abs, e.relative, e.count
    );
    assert!(
        e.relative <= MAX_RELATIVE,
        "{name}: relative {:.3e}",
        e.relative
    );
}

#[test]
fn a_minus_one_input_model_matches_onnxruntime_through_smelt_run() {
    let dir = quirk_models().join("minus_one");
    let out = tempfile::tempdir().unwrap();
    let got = smelt_run(
        &dir.join("model.onnx"),
        &dir.join("x.npy"),
        &["--shape", "x=1x3x48x192"],
        out.path(),
    );
    against_ort("minus_one", &got, &npy(&dir.join("y.npy")));
    let o = common::smelt(&[
        "run",
        dir.join("model.onnx").to_str().unwrap(),
        "--random-inputs",
        "1",
        "--output-dir",
        out.path().to_str().unwrap(),
    ]);
    assert!(
        common::stderr(&o).contains(
            "input 'x' dimension 0 is dynamic (-1, declared shape [-1, 3, h, ?]); pin it with \
             --shape x=D0x3xD2xD3"
        ),
        "{}",
        common::stderr(&o)
    );
}

#[test]
fn an_external_data_model_matches_onnxruntime_and_its_inline_twin() {
    let dir = quirk_models().join("external");
    let out = tempfile::tempdir().unwrap();
    let ext = smelt_run(
        &dir.join("model.onnx"),
        &dir.join("x.npy"),
        &[],
        &out.path().join("ext"),
    );
    let inline = smelt_run(
        &dir.join("inline.onnx"),
        &dir.join("x.npy"),
        &[],
        &out.path().join("inline"),
    );
    against_ort("external", &ext, &npy(&dir.join("y.npy")));
    let bits = |t: &Tensor| -> Vec<u32> { t.f32s().iter().map(|v| v.to_bits()).collect() };
    assert_eq!(
        bits(&ext),
        bits(&inline),
        "external and inline weights differ"
    );
}

/// torch's `select`, `x[i]` and the `unbind` of a fused QKV projection export as Gather
/// of run-time data at one constant index: imported as a `slice` of that position (then
/// a `reshape` dropping the axis, for a scalar index), a contiguous copy, never a
/// per-element `gather`. A negative index counts from the end; a one-element index list
/// keeps the axis; an index out of range is a clear error.
#[test]
fn gather_at_one_constant_index_is_a_slice() {
    let scalar = |name: &str, v: i64| {
        let mut t = i64_typed(name, &[v]);
        t.dims.clear();
        t
    };
    let x: Vec<f32> = (0..24).map(|k| k as f32).collect();
    for (what, index, dims_out, want) in [
        (
            "scalar 1",
            scalar("i", 1),
            vec![2, 4],
            vec![4.0f32, 5.0, 6.0, 7.0, 16.0, 17.0, 18.0, 19.0],
        ),
        (
            "scalar -1",
            scalar("i", -1),
            vec![2, 4],
            vec![8.0, 9.0, 10.0, 11.0, 20.0, 21.0, 22.0, 23.0],
        ),
        (
            "list [0]",
            i64_typed("i", &[0]),
            vec![2, 1, 4],
            vec![0.0, 1.0, 2.0, 3.0, 12.0, 13.0, 14.0, 15.0],
        ),
    ] {
        let m = Model::new(13)
            .input("x", &[2, 3, 4])
            .init(index)
            .node(
                "Gather",
                "select",
                &["x", "i"],
                &["y"],
                vec![attr_int("axis", 1)],
            )
            .output("y")
            .import()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let kinds: Vec<&str> = ops(&m).iter().map(|op| op.name()).collect();
        assert!(
            kinds.contains(&"slice") && !kinds.contains(&"gather"),
            "{what}: {kinds:?}"
        );
        let (exe, _) = smelt::compile(&m, &smelt::Options::default()).expect("compiles");
        let y = exe
            .run(&[Tensor::new([2, 3, 4], x.clone()).unwrap()])
            .expect("runs")
            .remove(0);
        assert_eq!(y.dims(), &dims_out[..], "{what}");
        assert_eq!(y.f32s(), &want[..], "{what}");
    }
    let err = Model::new(13)
        .input("x", &[2, 3, 4])
        .init(scalar("i", 3))
        .node(
            "Gather",
            "select",
            &["x", "i"],
            &["y"],
            vec![attr_int("axis", 1)],
        )
        .output("y")
        .import()
        .expect_err("an index past the axis")
        .to_string();
    assert!(
        err.contains("index 3 is out of range for axis 1 of size 3"),
        "{err}"
    );
}
