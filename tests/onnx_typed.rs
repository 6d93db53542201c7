//! Exporter-style models with int64 and bool tensors through `smelt run` (the fused JIT)
//! against onnxruntime: a BERT-style embedding lookup by int64 ids with the additive
//! attention mask computed from an int64 mask, and int64 arithmetic above 2^24 with
//! outputs of every element type (checked for type and exact value), and a layer norm
//! written out as exporters of opset < 17 do (ReduceMean, Pow, Sqrt, ...) feeding a
//! MatMul and an Erf-written GELU; a float16 model (float16 input, weights and outputs,
//! `.npy` files of `<f2`). Wrong input types and an id outside the table are clear errors.
//!
//! Data: `scripts/make_typed_models.py` writes it to `target/onnx-tests/typed`; this test
//! runs it through `$SMELT_PYTHON` (set by `scripts/test.sh`) when it is missing.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use smelt::ir::{DType, ErrorStats, Tensor};

/// Gate on FACTS.md's relative error: max |got − ref| / max |ref|.
const MAX_RELATIVE: f64 = 1e-4;

const BERT_PINS: [&str; 4] = ["--shape", "input_ids=1x8", "--shape", "attention_mask=1x8"];

fn data_dir() -> PathBuf {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| {
        common::generated_data(
            "typed",
            "make_typed_models.py",
            "onnx 1.23.2 onnxruntime 1.32.0 typed 3",
        )
    })
    .clone()
}

/// `smelt run MODEL --input NAME=FILE... EXTRA...` into a fresh folder; the output.
fn smelt_run(
    model: &str,
    inputs: &[(&str, &Path)],
    extra: &[&str],
) -> (std::process::Output, tempfile::TempDir) {
    let dir = data_dir().join(model);
    let out = tempfile::tempdir().unwrap();
    let model_path = dir.join("model.onnx");
    let specs: Vec<String> = inputs
        .iter()
        .map(|(name, file)| format!("{name}={}", file.display()))
        .collect();
    let mut args = vec!["run", model_path.to_str().unwrap()];
    for s in &specs {
        args.extend(["--input", s.as_str()]);
    }
    args.extend(["--output-dir", out.path().to_str().unwrap()]);
    args.extend_from_slice(extra);
    (common::smelt(&args), out)
}

#[test]
fn a_bert_embedding_with_an_int64_mask_matches_onnxruntime() {
    let dir = data_dir().join("bert_embedding");
    let (ids, mask) = (dir.join("input_ids.npy"), dir.join("attention_mask.npy"));
    assert_eq!(common::read_npy(&ids).dtype(), DType::I64);
    let (o, out) = smelt_run(
        "bert_embedding",
        &[("input_ids", &ids), ("attention_mask", &mask)],
        &BERT_PINS,
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    let got = common::read_npy(&out.path().join("output.npy"));
    let want = common::read_npy(&dir.join("want_output.npy"));
    let e = ErrorStats::between_tensors(&got, &want).unwrap();
    println!(
        "bert_embedding: max abs {:.3e}, relative {:.3e} over {} values",
        e.max_abs, e.relative, e.count
    );
    assert!(e.relative <= MAX_RELATIVE, "relative {:.3e}", e.relative);
    // the same graph, checked stage by stage against the interpreter
    let model = dir.join("model.onnx");
    let mut args = vec!["verify", model.to_str().unwrap()];
    args.extend_from_slice(&BERT_PINS);
    let v = common::smelt(&args);
    assert!(v.status.success(), "{}", common::stdout(&v));
    assert!(
        common::stdout(&v).contains("PASS"),
        "{}",
        common::stdout(&v)
    );
}

#[test]
fn a_layer_norm_written_out_with_reductions_matches_onnxruntime() {
    let dir = data_dir().join("layer_norm_decomposed");
    let (o, out) = smelt_run("layer_norm_decomposed", &[("x", &dir.join("x.npy"))], &[]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let got = common::read_npy(&out.path().join("y.npy"));
    let want = common::read_npy(&dir.join("want_y.npy"));
    let e = ErrorStats::between_tensors(&got, &want).unwrap();
    println!(
        "layer_norm_decomposed: max abs {:.3e}, relative {:.3e} over {} values",
        e.max_abs, e.relative, e.count
    );
    assert!(e.relative <= MAX_RELATIVE, "relative {:.3e}", e.relative);
}

#[test]
fn int64_outputs_of_every_type_match_onnxruntime_exactly() {
    let dir = data_dir().join("int64_ops");
    let (o, out) = smelt_run("int64_ops", &[("ids", &dir.join("ids.npy"))], &[]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    for (name, dtype) in [
        ("picked", DType::I64),
        ("not_two", DType::Bool),
        ("narrow", DType::I32),
        ("as_float", DType::F32),
    ] {
        let got = common::read_npy(&out.path().join(format!("{name}.npy")));
        let want = common::read_npy(&dir.join(format!("want_{name}.npy")));
        assert_eq!(got.dtype(), dtype, "{name}");
        assert_eq!(got, want, "{name}: smelt and onnxruntime differ");
    }
    // 3 * 2^33 + 2^40 + 7 is far from any f32: it came through exactly
    let picked = common::read_npy(&out.path().join("picked.npy"))
        .data
        .to_i64s()
        .unwrap();
    assert_eq!(picked[4], -(3 * (1i64 << 33) + (1 << 40) + 7));
}

#[test]
fn wrong_input_types_and_ids_outside_the_table_are_clear_errors() {
    let scratch = tempfile::tempdir().unwrap();
    let write = |name: &str, t: &Tensor| {
        let p = scratch.path().join(name);
        std::fs::write(&p, smelt::npy::encode(t)).unwrap();
        p
    };
    let dir = data_dir().join("bert_embedding");
    let mask = dir.join("attention_mask.npy");
    // float ids where the model declares int64: refused, never converted
    let float_ids = write("f.npy", &Tensor::new([1, 8], vec![1.0; 8]).unwrap());
    let (o, _) = smelt_run(
        "bert_embedding",
        &[("input_ids", &float_ids), ("attention_mask", &mask)],
        &BERT_PINS,
    );
    assert!(!o.status.success());
    let e = common::stderr(&o);
    assert!(
        e.contains("input_ids") && e.contains("i64") && e.contains("f32"),
        "{e}"
    );
    // an id outside the 30-row table: the run stops with an error, no read outside
    let mut ids: Vec<i64> = (0..8).collect();
    ids[3] = 99;
    let bad_ids = write("bad.npy", &Tensor::typed([1, 8], ids).unwrap());
    for extra in [&[][..], &["--interp"][..]] {
        let mut args = BERT_PINS.to_vec();
        args.extend_from_slice(extra);
        let (o, _) = smelt_run(
            "bert_embedding",
            &[("input_ids", &bad_ids), ("attention_mask", &mask)],
            &args,
        );
        assert!(!o.status.success(), "{extra:?}");
        let e = common::stderr(&o);
        assert!(
            e.contains("out of range") && e.contains("gather"),
            "{extra:?}: {e}"
        );
    }
    // the reverse: int64 data where float32 is declared
    let tir = scratch.path().join("f.tir");
    std::fs::write(
        &tir,
        "func @f(%x: tensor<4xf32>) -> (y: tensor<4xf32>) {\n  %y = relu %x : tensor<4xf32>\n  return %y : tensor<4xf32>\n}\n",
    )
    .unwrap();
    let ints = write("i.npy", &Tensor::typed([4], vec![1i64, 2, 3, 4]).unwrap());
    let spec = format!("x={}", ints.display());
    let out = scratch.path().join("out");
    let o = common::smelt(&[
        "run",
        tir.to_str().unwrap(),
        "--input",
        &spec,
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let e = common::stderr(&o);
    assert!(e.contains("%x") && e.contains("i64"), "{e}");
}

#[test]
fn a_float16_model_reads_and_writes_float16_and_matches_onnxruntime() {
    let dir = data_dir().join("float16_mlp");
    let (o, out) = smelt_run("float16_mlp", &[("x", &dir.join("x.npy"))], &[]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    for (name, dtype) in [("y", DType::F16), ("yt", DType::F16), ("y32", DType::F32)] {
        let got = common::read_npy(&out.path().join(format!("{name}.npy")));
        let want = common::read_npy(&dir.join(format!("want_{name}.npy")));
        assert_eq!(got.dtype(), dtype, "{name}");
        let e = ErrorStats::between_tensors(&got, &want).unwrap();
        // smelt computes in f32 and rounds once; onnxruntime's float16 kernels round
        // more often: a few float16 ulps (2^-11 relative) apart at most
        assert!(e.relative <= 4e-3, "{name}: relative error {}", e.relative);
    }
    // the transpose moved the float16 elements exactly
    let y = common::read_npy(&out.path().join("y.npy"));
    let yt = common::read_npy(&out.path().join("yt.npy"));
    let (y, yt) = (y.data.to_f32s().unwrap(), yt.data.to_f32s().unwrap());
    for i in 0..2 {
        for j in 0..8 {
            assert_eq!(y[i * 8 + j].to_bits(), yt[j * 2 + i].to_bits());
        }
    }
}
