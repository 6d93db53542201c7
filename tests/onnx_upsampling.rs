//! Exporter-style models of the ops real detectors and classic classifiers need, through
//! `smelt run` (the fused JIT) and `smelt verify` (every stage against the interpreter),
//! against onnxruntime: a DBNet-style probability head that upsamples by two stride-2
//! ConvTransposes between BatchNorms and Relus, and a classic stem with a SAME_UPPER
//! strided Conv, a ceil-mode MaxPool, LRN, InstanceNormalization, a Pow by 1.5 and a
//! DepthToSpace pixel shuffle, and the resizes of vision preprocessing (antialiased
//! bicubic and bilinear shrinks, a bicubic upsampling with exclude_outside, a
//! tf_crop_and_resize past the image's edges).
//!
//! Data: `scripts/make_upsampling_models.py` writes it to `target/onnx-tests/upsampling`;
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
            "upsampling",
            "make_upsampling_models.py",
            "onnx 1.23.2 onnxruntime 1.32.0 upsampling 2",
        )
    })
    .clone()
}

/// Runs `model` on its `x.npy` with `smelt run`, compares output `output` with
/// onnxruntime's, and checks every stage with `smelt verify`.
fn matches_onnxruntime(model: &str, output: &str) {
    common::run_matches_onnxruntime(&data_dir().join(model), output, MAX_RELATIVE);
}

#[test]
fn a_dbnet_head_upsampling_by_conv_transposes_matches_onnxruntime() {
    matches_onnxruntime("dbnet_head", "prob");
}

#[test]
fn a_classic_stem_with_lrn_instance_norm_pow_and_depth_to_space_matches_onnxruntime() {
    matches_onnxruntime("classic_stem", "y");
}

#[test]
fn antialiased_bicubic_and_cropping_resizes_match_onnxruntime() {
    matches_onnxruntime("vision_resizes", "y");
}
