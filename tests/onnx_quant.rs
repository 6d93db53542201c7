//! QDQ models as onnxruntime's static quantization writes them (uint8 activations
//! between QuantizeLinear and DequantizeLinear, int8 per-channel or per-tensor weights
//! and int32 biases behind DequantizeLinear, a uint16 activation) through `smelt run`
//! and `smelt verify` against onnxruntime; the weights' dequantization folds at compile
//! time, and the optimized module matches the interpreter on every kernel choice.
//!
//! Data: `scripts/make_quant_models.py` writes it to `target/onnx-tests/quant`; this test
//! runs it through `$SMELT_PYTHON` (set by `scripts/test.sh`) when it is missing.

mod common;
mod jit_util;

use std::path::PathBuf;
use std::sync::OnceLock;

fn data_dir() -> PathBuf {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| {
        common::generated_data(
            "quant",
            "make_quant_models.py",
            "onnx 1.23.2 onnxruntime 1.32.0 quant 4",
        )
    })
    .clone()
}

/// Runs `model` against onnxruntime, then checks that no weight is dequantized at run
/// time (every int8 or int32 initializer folded into an f32 weight: the only narrow
/// integer casts left are the activations' round trips, `activation_casts` of them) and
/// that the optimized module matches the interpreter on every kernel choice.
fn check(model: &str, activation_casts: usize) {
    let dir = data_dir().join(model);
    // a quantized output is a multiple of its scale, so the same arithmetic gives the
    // same values; any difference would be a whole quantization step (≥ 4e-3 relative)
    common::run_matches_onnxruntime(&dir, "y", 1e-6);
    let model_path = dir.join("model.onnx");
    let mut module = smelt::load_model(&model_path, &smelt::LoadOptions::default())
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    smelt::optimize(&mut module, &smelt::OptimizeOptions::default(), None)
        .unwrap_or_else(|e| panic!("{model}: {e}"));
    let opts = smelt_ir::text::PrintOptions {
        elide_weights: true,
        ..Default::default()
    };
    let text = smelt_ir::text::print(&module, &opts);
    let narrow_casts = text
        .lines()
        .filter(|l| l.contains(" = cast ") && (l.contains("{to = ui") || l.contains("{to = i")))
        .count();
    assert_eq!(narrow_casts, activation_casts, "{model}:\n{text}");
    let narrow_weights = text
        .lines()
        .filter(|l| l.starts_with("const @") && !l.contains("xf32>") && !l.contains("<f32>"))
        .count();
    assert_eq!(narrow_weights, 0, "{model}: integer weights left:\n{text}");
    let x = common::read_npy(&dir.join("x.npy"));
    jit_util::check_against_interp(model, &module, &[x], 0.0);
}

#[test]
fn a_qdq_conv_net_matches_onnxruntime_with_its_weights_dequantized_at_compile_time() {
    // x, the relu and the output each quantize once
    check("qdq_conv", 3);
}

#[test]
fn a_qdq_matmul_net_with_int8_and_uint16_activations_matches_onnxruntime() {
    check("qdq_matmul", 3);
}

/// The operator form of ORT's dynamic quantization: DynamicQuantizeLinear, MatMulInteger
/// over 600 reduction entries (three exact f32 chunks) with per-column zero points, then
/// QLinearMatMul with per-column scales; the integer products are exact, so smelt's
/// output equals onnxruntime's (or, on a host where onnxruntime's u8s8 kernels saturate,
/// ONNX's reference evaluator's: the data's `oracle.txt` says which).
#[test]
fn matmul_integer_and_qlinear_matmul_over_long_reductions_match_onnxruntime_exactly() {
    let dir = data_dir().join("dynamic_matmul");
    common::run_matches_onnxruntime(&dir, "y", 1e-6);
}

/// QLinearConv (per-channel int8 weights, an int32 bias, padding) and ConvInteger (a
/// weight zero point, stride 2) over 64 input channels of a 3×3 kernel: 576 products per
/// output, three exact f32 chunks; equal to onnxruntime's output (or the reference
/// evaluator's, as above).
#[test]
fn qlinear_conv_and_conv_integer_over_many_channels_match_onnxruntime_exactly() {
    let dir = data_dir().join("qlinear_conv");
    common::run_matches_onnxruntime(&dir, "y", 1e-6);
}
