//! Whole models against onnxruntime: ResNet-18, ResNet-50 (torchvision structure, random
//! weights, BatchNormalization as its own node) and a Conv→BN→Add→Relu residual tail,
//! imported with `smelt::onnx::import` and run by the reference interpreter, compared
//! with onnxruntime's outputs (graph optimizations off) on the same inputs.
//!
//! Data: `scripts/make_models.py` writes it to `target/onnx-tests/models`; this test
//! runs it through `$SMELT_PYTHON` (set by `scripts/test.sh`) when it is missing.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use smelt::ir::{interp, ErrorStats, Location, Module, Op, Tensor};
use smelt::onnx::{import, read_tensor, ImportOptions};

/// Gate on FACTS.md's relative error: max |got − ref| / max |ref|.
const MAX_RELATIVE: f64 = 1e-4;

/// The generated models folder; generates it (once per process) with `$SMELT_PYTHON`.
fn models_dir() -> PathBuf {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(generate).clone()
}

fn generate() -> PathBuf {
    common::generated_data("models", "make_models.py", "onnx 1.23.2 onnxruntime 1.32.0")
}

fn tensor(path: &Path) -> Tensor {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    read_tensor(&bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .1
}

/// Imports MODEL, runs it on its inputs with the interpreter and with the compiled
/// (fused, JIT) executable, and compares both with onnxruntime's outputs.
fn check_model(name: &str, opts: &ImportOptions) -> Module {
    let dir = models_dir().join(name);
    let bytes = std::fs::read(dir.join("model.onnx")).expect("model.onnx");
    let module = import(&bytes, opts).unwrap_or_else(|e| panic!("{name}: import failed: {e}"));
    let func = &module.funcs[0];
    let data = dir.join("test_data_set_0");
    let inputs: Vec<Tensor> = (0..func.params.len())
        .map(|j| tensor(&data.join(format!("input_{j}.pb"))))
        .collect();
    let interpreted = interp::run(&module, func, &inputs)
        .unwrap_or_else(|e| panic!("{name}: interpreter failed: {e}"));
    // The whole pipeline too: fusion, const_fold, dce, Cranelift.
    let (exe, _) = smelt::compile(&module, &smelt::Options::default())
        .unwrap_or_else(|e| panic!("{name}: compile failed: {e}"));
    let compiled = exe
        .run(&inputs)
        .unwrap_or_else(|e| panic!("{name}: compiled run failed: {e}"));
    for (how, outputs) in [("interpreter", &interpreted), ("fused JIT", &compiled)] {
        for (j, got) in outputs.iter().enumerate() {
            let want = tensor(&data.join(format!("output_{j}.pb")));
            let stats =
                ErrorStats::between_tensors(got, &want).unwrap_or_else(|e| panic!("{name}: {e}"));
            println!(
                "{name} output {j} ({how}): max abs {:.3e}, relative {:.3e}, rmse {:.3e} over {} values",
                stats.max_abs, stats.relative, stats.rmse, stats.count
            );
            assert!(
                stats.relative <= MAX_RELATIVE,
                "{name} output {j} ({how}): relative error {:.3e} > {MAX_RELATIVE:e} (max abs {:.3e})",
                stats.relative,
                stats.max_abs
            );
        }
    }
    module
}

fn has_op_at(module: &Module, name: &str, op: &str) -> bool {
    module.funcs[0]
        .insts
        .iter()
        .any(|i| i.op.name() == op && i.loc == Location::Name(name.into()))
}

#[test]
fn residual_tail_matches_onnxruntime() {
    let module = check_model("residual_tail", &ImportOptions::default());
    let names: Vec<&str> = module.funcs[0]
        .params
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, ["x", "shortcut"]);
    assert!(has_op_at(&module, "conv", "conv2d"));
    assert!(has_op_at(&module, "bn", "batch_norm"));
    assert!(has_op_at(&module, "add", "add"));
    assert!(has_op_at(&module, "relu", "relu"));
}

#[test]
fn resnet18_matches_onnxruntime() {
    let module = check_model("resnet18", &ImportOptions::default());
    // The Shape/Gather/Unsqueeze/Concat chain folded into the reshape's static shape.
    let f = &module.funcs[0];
    assert!(f.insts.iter().any(|i| i.op
        == Op::Reshape {
            shape: vec![1, 512]
        }
        && i.loc == Location::Name("flatten".into())));
    assert!(!f.insts.iter().any(
        |i| matches!(&i.loc, Location::Name(n) if n.starts_with("flatten.")
        && !matches!(i.op, Op::Const(_)))
    ));
    assert_eq!(
        f.insts.iter().filter(|i| i.op.name() == "conv2d").count(),
        20
    );
    assert_eq!(
        f.insts
            .iter()
            .filter(|i| i.op.name() == "batch_norm")
            .count(),
        20
    );
}

#[test]
fn resnet50_matches_onnxruntime_with_pinned_batch() {
    let opts = ImportOptions::default().with_shape("input", [1, 3, 224, 224]);
    let module = check_model("resnet50", &opts);
    let f = &module.funcs[0];
    assert_eq!(
        f.insts.iter().filter(|i| i.op.name() == "conv2d").count(),
        53
    );
    assert!(has_op_at(&module, "layer4.2.conv3", "conv2d"));
    assert!(has_op_at(&module, "fc", "gemm"));
}

#[test]
fn resnet50_without_pinned_batch_names_input_and_dim() {
    let bytes = std::fs::read(models_dir().join("resnet50/model.onnx")).expect("model.onnx");
    let err = import(&bytes, &ImportOptions::default()).expect_err("dynamic batch");
    let text = err.to_string();
    assert!(
        text.contains("input 'input' dimension 0 is dynamic ('N'"),
        "{text}"
    );
}
