//! Exporter-style models of Einsum (attention written as einsums, diagonals, transposes,
//! outer products, three operands, ellipses, implicit outputs) and Col2Im (PyTorch's
//! `fold` with strides, pads and dilations), through `smelt run` (the fused JIT) and
//! `smelt verify` (every stage against the interpreter), against onnxruntime.
//!
//! Data: `scripts/make_contraction_models.py` writes it to `target/onnx-tests/contractions`;
//! this test runs it through `$SMELT_PYTHON` (set by `scripts/test.sh`) when it is missing.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

/// Gate on FACTS.md's relative error: max |got − ref| / max |ref|.
const MAX_RELATIVE: f64 = 1e-5;

fn data_dir() -> PathBuf {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| {
        common::generated_data(
            "contractions",
            "make_contraction_models.py",
            "onnx 1.23.2 onnxruntime 1.32.0 contractions 1",
        )
    })
    .clone()
}

fn matches_onnxruntime(model: &str) {
    common::run_matches_onnxruntime(&data_dir().join(model), "y", MAX_RELATIVE);
}

#[test]
fn attention_written_as_einsums_matches_onnxruntime() {
    matches_onnxruntime("einsum_attention");
}

#[test]
fn diagonals_transposes_outer_products_and_three_operand_einsums_match_onnxruntime() {
    matches_onnxruntime("einsum_forms");
}

#[test]
fn col2im_with_strides_pads_and_dilations_matches_onnxruntime() {
    matches_onnxruntime("col2im_fold");
}
