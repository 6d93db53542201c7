//! Exporter-style models of GridSample's real users, through `smelt run` (the fused JIT)
//! and `smelt verify` (every stage against the interpreter), against onnxruntime: a
//! text recognizer's spatial-transformer rectification (a localization network's Gemm
//! giving an affine transform, the exporter's affine grid — written out at opset 16, the
//! AffineGrid operator at 20 —, bilinear sampling with zeros padding past the image's
//! edges) and an optical-flow warp (a Conv-predicted flow added
//! to an identity grid, bicubic sampling with border padding, then a fixed warp by nearest
//! sampling with reflection).
//!
//! Data: `scripts/make_sampling_models.py` writes it to `target/onnx-tests/sampling`;
//! this test runs it through `$SMELT_PYTHON` (set by `scripts/test.sh`) when it is missing.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

/// Gate on FACTS.md's relative error: max |got − ref| / max |ref|.
const MAX_RELATIVE: f64 = 1e-5;

/// The rectifier's gate: its grid comes out of a Gemm and a MatMul whose float32 sums
/// round differently in each runtime, and denormalizing multiplies a coordinate's last
/// bit by half the image width (48 here) before it weighs neighbours apart by O(1).
const RECTIFIER_MAX_RELATIVE: f64 = 5e-5;

fn data_dir() -> PathBuf {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| {
        common::generated_data(
            "sampling",
            "make_sampling_models.py",
            "onnx 1.23.2 onnxruntime 1.32.0 sampling 3",
        )
    })
    .clone()
}

#[test]
fn an_stn_rectifier_with_affine_grid_and_bilinear_sampling_matches_onnxruntime() {
    common::run_matches_onnxruntime(
        &data_dir().join("stn_rectifier"),
        "y",
        RECTIFIER_MAX_RELATIVE,
    );
}

#[test]
fn the_opset_20_stn_rectifier_with_the_affine_grid_operator_matches_onnxruntime() {
    common::run_matches_onnxruntime(
        &data_dir().join("stn_rectifier_20"),
        "y",
        RECTIFIER_MAX_RELATIVE,
    );
}

#[test]
fn an_optical_flow_warp_with_cubic_and_nearest_sampling_matches_onnxruntime() {
    common::run_matches_onnxruntime(&data_dir().join("flow_warp"), "y", MAX_RELATIVE);
}
