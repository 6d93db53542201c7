//! Every model the pinned onnx wheel ships as test data (its model-zoo "light" CNNs and its
//! pytorch-converted, pytorch-operator and simple models) through the whole compiler, in
//! process: each either compiles and runs on zero inputs, or is refused with an error —
//! never a panic (issue #21: "no panic on any model in the ONNX wheel's test data"). The
//! node tests, which the wheel generates rather than ships, go through
//! `tests/onnx_conformance.rs`; the light models' numbers are checked against onnxruntime
//! with seeded weights in `tests/onnx_exported.rs`.
//!
//! The wheel is found through `$SMELT_PYTHON` (set by `scripts/test.sh`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use smelt::{Options, Tensor};

/// The wheel's folders of shipped models, each with the count that compiled and ran when
/// this test was written: coverage may grow, not shrink silently.
const FOLDERS: &[(&str, usize)] = &[
    ("light", 9),
    ("pytorch-converted", 59),
    ("pytorch-operator", 24),
    ("simple", 1),
];

fn wheel_data() -> PathBuf {
    let python = std::env::var("SMELT_PYTHON")
        .expect("SMELT_PYTHON is not set: run `scripts/test.sh` (it names the pinned venv)");
    let out = std::process::Command::new(&python)
        .args([
            "-c",
            "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), \
             'backend', 'test', 'data'))",
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    assert!(out.status.success(), "{python} cannot import onnx");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The model files of one folder: `light/*.onnx`, or `*/model.onnx` for the others.
fn models(folder: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(folder).unwrap_or_else(|e| panic!("{}: {e}", folder.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            let model = path.join("model.onnx");
            if model.is_file() {
                found.push(model);
            }
        } else if path.extension().is_some_and(|e| e == "onnx") {
            found.push(path);
        }
    }
    found.sort();
    found
}

enum Outcome {
    Ran,
    Refused,
    Panicked(String),
}

fn compile_and_run(model: &Path) -> Outcome {
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<(), smelt::Error> {
        let (exe, _) = smelt::compile_file(model, &Options::default())?;
        let inputs: Vec<Tensor> = exe.inputs().iter().map(|i| Tensor::zeros(&i.ty)).collect();
        exe.run(&inputs)?;
        Ok(())
    }));
    match result {
        Ok(Ok(())) => Outcome::Ran,
        Ok(Err(_)) => Outcome::Refused,
        Err(payload) => Outcome::Panicked(
            payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
        ),
    }
}

#[test]
fn every_shipped_model_compiles_and_runs_or_is_refused_without_a_panic() {
    let data = wheel_data();
    let mut panics = Vec::new();
    for &(folder, min_ran) in FOLDERS {
        let files = models(&data.join(folder));
        assert!(
            !files.is_empty(),
            "no models in {}",
            data.join(folder).display()
        );
        let (mut ran, mut refused) = (0, 0);
        for model in &files {
            match compile_and_run(model) {
                Outcome::Ran => ran += 1,
                Outcome::Refused => refused += 1,
                Outcome::Panicked(message) => {
                    panics.push(format!("{}: {message}", model.display()))
                }
            }
        }
        println!(
            "{folder}: {} models: {ran} ran, {refused} refused",
            files.len()
        );
        assert!(
            ran >= min_ran,
            "{folder}: {ran} models ran, fewer than the {min_ran} that did"
        );
    }
    assert!(panics.is_empty(), "panics:\n{}", panics.join("\n"));
}
