//! Exporter-style models of the activations real exports write (the tanh GELU spelled
//! out as HF `gelu_new` exports it, Mish as Softplus-Tanh-Mul and as the Mish node,
//! per-channel PRelu after a conv), through `smelt run` (the fused JIT) and
//! `smelt verify` against onnxruntime, with what fusion recognized: each anchor and its
//! activation end as one fused op, and the optimized module matches the interpreter on
//! every kernel choice.
//!
//! Data: `scripts/make_activation_models.py` writes it to `target/onnx-tests/activations`;
//! this test runs it through `$SMELT_PYTHON` (set by `scripts/test.sh`) when it is missing.

mod common;
mod jit_util;

use std::path::PathBuf;
use std::sync::OnceLock;

/// The gate on FACTS.md's relative error: max |got − ref| / max |ref|.
const MAX_RELATIVE: f64 = 1e-4;

fn data_dir() -> PathBuf {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| {
        common::generated_data(
            "activations",
            "make_activation_models.py",
            "onnx 1.23.2 onnxruntime 1.32.0 activations 1",
        )
    })
    .clone()
}

/// Runs `model` on its `x.npy` with `smelt run` and compares its output `y` with
/// onnxruntime's; checks every stage with `smelt verify`; then asserts that `smelt opt`
/// leaves exactly `fused` fused ops and none of the ops in `gone` standalone, and that
/// the optimized module matches the interpreter on every kernel choice.
fn check(model: &str, fused: usize, gone: &[&str]) {
    let dir = data_dir().join(model);
    common::run_matches_onnxruntime(&dir, "y", MAX_RELATIVE);
    let model_path = dir.join("model.onnx");
    let path = model_path.to_str().unwrap();

    let o = common::smelt(&["opt", path, "--elide-weights"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let ir = common::stdout(&o);
    assert_eq!(ir.matches(" = fused ").count(), fused, "{model}: {ir}");
    for op in gone {
        let left = ir.matches(&format!(" = {op} ")).count();
        assert_eq!(
            left, 0,
            "{model}: {left} standalone {op} left after fusion:\n{ir}"
        );
    }

    let mut module = smelt::load_model(&model_path, &smelt::LoadOptions::default())
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    smelt::optimize(&mut module, &smelt::OptimizeOptions::default(), None)
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    let x = common::read_npy(&dir.join("x.npy"));
    jit_util::check_against_interp(model, &module, &[x], 1e-5);
}

#[test]
fn a_gelu_new_mlp_is_two_fused_matmuls_and_matches_onnxruntime() {
    check("gelu_new_mlp", 2, &["tanh", "mul", "add", "matmul", "gemm"]);
}

#[test]
fn a_yolo_mish_block_is_two_fused_convs_and_matches_onnxruntime() {
    check(
        "yolo_mish",
        2,
        &[
            "mish",
            "tanh",
            "log",
            "exp",
            "mul",
            "add",
            "conv2d",
            "batch_norm",
        ],
    );
}

#[test]
fn a_conv_prelu_block_is_two_fused_convs_and_matches_onnxruntime() {
    check(
        "conv_prelu",
        2,
        &["prelu", "relu", "min", "conv2d", "batch_norm"],
    );
}
