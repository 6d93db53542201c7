//! Conformance: ONNX's own backend node tests and the pytorch-converted cases shipped in
//! the onnx wheel, run through the whole compiler: `smelt::onnx::import`, the reference
//! interpreter, `smelt::optimize` (the default pipeline: fusion, const_fold, dce), the
//! interpreter again on the optimized module, and `Executable::compile` (layouts,
//! lowering, Cranelift, with its verifier on) and `run` with every kernel choice the
//! host runs. Every stage's outputs are compared with ONNX's expected ones, so a failure
//! names its stage: the interpreter right but the JIT wrong on the same optimized module
//! is a lowering or codegen bug.
//!
//! A case is in scope when every op in its model is one smelt imports; every in-scope
//! case must match ONNX's expected outputs (|got − want| <= atol + rtol·|want| with
//! ONNX's tolerances, at most rtol 1e-3 and atol 1e-7; float16 and bfloat16 results by
//! their values) at every stage unless it is listed in [`KNOWN_FAILURES`] with its
//! reason — and a listed case that passes fails the test, so the list stays exact
//! (`SMELT_SHOW_KNOWN=1` prints why each listed case fails). Inputs that are not floats
//! (shapes, axes, indices) are frozen as constants with `ImportOptions::constant_inputs`
//! when the import needs them known, since smelt's shapes are static; int64 results must
//! be constants and are compared by value, before and after optimization. Each suite
//! prints its counts over all its cases (pass, fail, unsupported op, other refusal) and
//! per stage, and must pass at least [`MIN_PASSED`]
//! cases, so coverage cannot shrink silently.
//!
//! Data: `scripts/gen_onnx_tests.py` writes it to `target/onnx-tests/conformance`; this
//! test runs it through `$SMELT_PYTHON` (set by `scripts/test.sh`) when it is missing.

mod common;
mod jit_util;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use prost::Message;
use smelt::ir::{interp, DType, Module, Op, Tensor};
use smelt::onnx::proto::{ModelProto, TensorProto};
use smelt::onnx::tensor::ConstTensor;
use smelt::onnx::{import, supported_op_types, ImportOptions};
use smelt::{optimize, CompileOptions, Executable, OptimizeOptions};

const SPATIAL_3D: &str = "3 spatial dimensions: smelt's conv and pools are 1-D and 2-D";
const TRAINING: &str = "training mode: smelt runs inference";
const RUNTIME_LOGIC: &str =
    "Range of run-time data: smelt folds it only at import (its run-time ops on integers \
     are arithmetic, mod, casts, comparisons, logic, where and gather)";
const FLOAT_FLOOR_MOD: &str =
    "Mod with fmod = 0 on floats (the divisor's sign): smelt's mod takes floats with fmod = 1 \
     only, the one float form the operator's documentation defines";
const NARROW_WIDE_FLOAT: &str = "float64, float8, float4 and 2-/4-bit integer tensors (casts \
     between them and float16 or bfloat16 included): smelt computes in float32 and folds \
     float32, float16, bfloat16, int8-int64, uint8, uint16 and bool";
const NARROW_ROUNDING: &str = "float16 and bfloat16 Attention: smelt computes in float32 and \
     rounds each result once, the reference rounds to the narrow type after every step; they \
     differ by one unit in the last place (2^-8 relative for bfloat16, 2^-11 for float16), \
     beyond the 1e-3 relative tolerance";
const QUANT_TYPES: &str = "QuantizeLinear and DequantizeLinear of float8, float4, int4 and int2: \
     smelt's quantized types are int8, uint8, int16 and uint16 (it holds no narrower type)";
const LEGACY_MUL: &str =
    "Mul of opset 6 (its legacy broadcast attribute): smelt maps Mul from opset 7";
const POW: &str = "Pow of an int32 or int64 base by a float32 exponent computed at run time: \
     smelt computes a general power of float32 bases (integer powers fold at import)";
const TOP_K_TYPES: &str =
    "TopK of int64 tensors: smelt's TopK takes float32 (its reductions are float32's)";
const WIDE_UNSIGNED: &str =
    "uint32 and uint64 tensors: smelt's integers are int64 and int32, and it does not decode these";
const STRING: &str = "string tensors: smelt has none";
const DFT_ROUNDOFF: &str = "inverse DFT whose expected output holds numpy's float32 round-off \
     (1.9e-7) where the exact value is 0: smelt's result is nearer 0, beyond the 1e-7 absolute \
     tolerance on that element (relative error of the output about 1e-7)";
const SOFTMAX_PRECISION: &str = "Attention with softmax_precision = 11 (a float64 softmax): smelt \
     computes the softmax in float32";
const FLOAT_TRIP_COUNT: &str = "a Loop whose trip count is float arithmetic on inputs (Range's \
     expanded form): smelt unrolls loops at import, where it folds integer shape arithmetic but \
     not float math";
const LEGACY_SCAN: &str = "Scan of opset 8 (a batch axis and sequence_lens): smelt imports Scan \
     from opset 9";
const LEGACY_ADD: &str =
    "Add of opset 6 (its legacy broadcast attribute): smelt maps Add from opset 7";

/// In-scope cases that fail, with the reason. Keep sorted.
const KNOWN_FAILURES: &[(&str, &str)] = &[
    ("test_AvgPool3d", SPATIAL_3D),
    ("test_AvgPool3d_stride", SPATIAL_3D),
    ("test_AvgPool3d_stride1_pad0_gpu_input", SPATIAL_3D),
    ("test_Conv3d", SPATIAL_3D),
    ("test_Conv3d_dilated", SPATIAL_3D),
    ("test_Conv3d_dilated_strided", SPATIAL_3D),
    ("test_Conv3d_groups", SPATIAL_3D),
    ("test_Conv3d_no_bias", SPATIAL_3D),
    ("test_Conv3d_stride", SPATIAL_3D),
    ("test_Conv3d_stride_padding", SPATIAL_3D),
    ("test_GLU", LEGACY_MUL),
    ("test_GLU_dim", LEGACY_MUL),
    ("test_MaxPool3d", SPATIAL_3D),
    ("test_MaxPool3d_stride", SPATIAL_3D),
    ("test_MaxPool3d_stride_padding", SPATIAL_3D),
    ("test_Softsign", LEGACY_ADD),
    ("test_add_uint32", WIDE_UNSIGNED),
    ("test_add_uint64", WIDE_UNSIGNED),
    ("test_attention_3d_causal_bf16", NARROW_ROUNDING),
    ("test_attention_3d_causal_bf16_expanded", NARROW_ROUNDING),
    ("test_attention_4d_attn_mask_causal_bf16", NARROW_ROUNDING),
    (
        "test_attention_4d_attn_mask_causal_bf16_expanded",
        NARROW_ROUNDING,
    ),
    ("test_attention_4d_causal_bf16", NARROW_ROUNDING),
    ("test_attention_4d_causal_bf16_expanded", NARROW_ROUNDING),
    ("test_attention_4d_causal_fp16_expanded", NARROW_ROUNDING),
    ("test_attention_4d_causal_padded_kv_bf16", NARROW_ROUNDING),
    (
        "test_attention_4d_causal_padded_kv_bf16_expanded",
        NARROW_ROUNDING,
    ),
    ("test_attention_4d_padded_kv_bf16", NARROW_ROUNDING),
    ("test_attention_4d_padded_kv_bf16_expanded", NARROW_ROUNDING),
    (
        "test_attention_local_window_gqa_rank4_mask",
        SOFTMAX_PRECISION,
    ),
    (
        "test_attention_local_window_gqa_rank4_mask_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_averagepool_3d_default", SPATIAL_3D),
    (
        "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_False",
        SPATIAL_3D,
    ),
    (
        "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True",
        SPATIAL_3D,
    ),
    (
        "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_False",
        SPATIAL_3D,
    ),
    (
        "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True",
        SPATIAL_3D,
    ),
    ("test_averagepool_3d_dilations_small", SPATIAL_3D),
    ("test_batchnorm_epsilon_training_mode", TRAINING),
    ("test_batchnorm_example_training_mode", TRAINING),
    ("test_bitshift_left_uint32", WIDE_UNSIGNED),
    ("test_bitshift_left_uint64", WIDE_UNSIGNED),
    ("test_bitshift_right_uint32", WIDE_UNSIGNED),
    ("test_bitshift_right_uint64", WIDE_UNSIGNED),
    ("test_bitwise_and_ui64_bcast_3v1d", WIDE_UNSIGNED),
    ("test_bitwise_or_ui64_bcast_3v1d", WIDE_UNSIGNED),
    ("test_bitwise_xor_ui64_bcast_3v1d", WIDE_UNSIGNED),
    ("test_cast_DOUBLE_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_cast_DOUBLE_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT16_to_DOUBLE", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT16_to_FLOAT4E2M1", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT16_to_FLOAT8E4M3FN", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT16_to_FLOAT8E4M3FNUZ", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT16_to_FLOAT8E5M2", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT16_to_FLOAT8E5M2FNUZ", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT16_to_INT2", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT16_to_INT4", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT16_to_UINT2", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT16_to_UINT4", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT4E2M1_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT4E2M1_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT8E4M3FNUZ_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT8E4M3FNUZ_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT8E4M3FN_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT8E4M3FN_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT8E5M2FNUZ_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT8E5M2FNUZ_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT8E5M2_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT8E5M2_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT_to_DOUBLE", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT_to_FLOAT4E2M1", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT_to_FLOAT8E4M3FN", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT_to_FLOAT8E4M3FNUZ", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT_to_FLOAT8E5M2", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT_to_FLOAT8E5M2FNUZ", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT_to_INT2", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT_to_INT4", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT_to_UINT2", NARROW_WIDE_FLOAT),
    ("test_cast_FLOAT_to_UINT4", NARROW_WIDE_FLOAT),
    ("test_cast_INT2_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_cast_INT2_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_cast_INT2_to_INT8", NARROW_WIDE_FLOAT),
    ("test_cast_INT4_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_cast_INT4_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_cast_INT4_to_INT8", NARROW_WIDE_FLOAT),
    ("test_cast_UINT2_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_cast_UINT2_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_cast_UINT2_to_UINT8", NARROW_WIDE_FLOAT),
    ("test_cast_UINT4_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_cast_UINT4_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_cast_UINT4_to_UINT8", NARROW_WIDE_FLOAT),
    ("test_cast_e8m0_FLOAT16_to_FLOAT8E8M0", NARROW_WIDE_FLOAT),
    ("test_cast_e8m0_FLOAT8E8M0_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_cast_e8m0_FLOAT8E8M0_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_cast_e8m0_FLOAT_to_FLOAT8E8M0", NARROW_WIDE_FLOAT),
    (
        "test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FN",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FN",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_cast_no_saturate_FLOAT_to_FLOAT8E5M2",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_cast_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_DOUBLE_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_castlike_DOUBLE_to_FLOAT16", NARROW_WIDE_FLOAT),
    (
        "test_castlike_DOUBLE_to_FLOAT16_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_DOUBLE_to_FLOAT_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT16_to_DOUBLE", NARROW_WIDE_FLOAT),
    (
        "test_castlike_FLOAT16_to_DOUBLE_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_FLOAT16_to_FLOAT4E2M1", NARROW_WIDE_FLOAT),
    (
        "test_castlike_FLOAT16_to_FLOAT4E2M1_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_FLOAT16_to_FLOAT8E4M3FN", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ", NARROW_WIDE_FLOAT),
    (
        "test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_FLOAT16_to_FLOAT8E4M3FN_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_FLOAT16_to_FLOAT8E5M2", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ", NARROW_WIDE_FLOAT),
    (
        "test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_FLOAT16_to_FLOAT8E5M2_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_FLOAT16_to_INT2", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT16_to_INT2_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT16_to_INT4", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT16_to_INT4_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT16_to_UINT2", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT16_to_UINT2_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT16_to_UINT4", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT16_to_UINT4_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT4E2M1_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT4E2M1_to_FLOAT16", NARROW_WIDE_FLOAT),
    (
        "test_castlike_FLOAT4E2M1_to_FLOAT16_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_FLOAT4E2M1_to_FLOAT_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_FLOAT8E4M3FNUZ_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16", NARROW_WIDE_FLOAT),
    (
        "test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_FLOAT8E4M3FNUZ_to_FLOAT_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_FLOAT8E4M3FN_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT8E4M3FN_to_FLOAT16", NARROW_WIDE_FLOAT),
    (
        "test_castlike_FLOAT8E4M3FN_to_FLOAT16_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_FLOAT8E4M3FN_to_FLOAT_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_FLOAT8E5M2FNUZ_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16", NARROW_WIDE_FLOAT),
    (
        "test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_FLOAT8E5M2FNUZ_to_FLOAT_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_FLOAT8E5M2_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT8E5M2_to_FLOAT16", NARROW_WIDE_FLOAT),
    (
        "test_castlike_FLOAT8E5M2_to_FLOAT16_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_FLOAT8E5M2_to_FLOAT_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_FLOAT_to_DOUBLE", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT_to_DOUBLE_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT_to_FLOAT4E2M1", NARROW_WIDE_FLOAT),
    (
        "test_castlike_FLOAT_to_FLOAT4E2M1_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_FLOAT_to_FLOAT8E4M3FN", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT_to_FLOAT8E4M3FNUZ", NARROW_WIDE_FLOAT),
    (
        "test_castlike_FLOAT_to_FLOAT8E4M3FNUZ_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_FLOAT_to_FLOAT8E4M3FN_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_FLOAT_to_FLOAT8E5M2", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT_to_FLOAT8E5M2FNUZ", NARROW_WIDE_FLOAT),
    (
        "test_castlike_FLOAT_to_FLOAT8E5M2FNUZ_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_FLOAT_to_FLOAT8E5M2_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_castlike_FLOAT_to_INT2", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT_to_INT2_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT_to_INT4", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT_to_INT4_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT_to_UINT2", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT_to_UINT2_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT_to_UINT4", NARROW_WIDE_FLOAT),
    ("test_castlike_FLOAT_to_UINT4_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_INT2_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_castlike_INT2_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_castlike_INT2_to_FLOAT16_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_INT2_to_FLOAT_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_INT2_to_INT8", NARROW_WIDE_FLOAT),
    ("test_castlike_INT2_to_INT8_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_INT4_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_castlike_INT4_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_castlike_INT4_to_FLOAT16_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_INT4_to_FLOAT_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_INT4_to_INT8", NARROW_WIDE_FLOAT),
    ("test_castlike_INT4_to_INT8_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_UINT2_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_castlike_UINT2_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_castlike_UINT2_to_FLOAT16_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_UINT2_to_FLOAT_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_UINT2_to_UINT8", NARROW_WIDE_FLOAT),
    ("test_castlike_UINT2_to_UINT8_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_UINT4_to_FLOAT", NARROW_WIDE_FLOAT),
    ("test_castlike_UINT4_to_FLOAT16", NARROW_WIDE_FLOAT),
    ("test_castlike_UINT4_to_FLOAT16_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_UINT4_to_FLOAT_expanded", NARROW_WIDE_FLOAT),
    ("test_castlike_UINT4_to_UINT8", NARROW_WIDE_FLOAT),
    ("test_castlike_UINT4_to_UINT8_expanded", NARROW_WIDE_FLOAT),
    (
        "test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_col2im_5d", SPATIAL_3D),
    ("test_convtranspose_3d", SPATIAL_3D),
    ("test_cumprod_1d", NARROW_WIDE_FLOAT),
    ("test_cumprod_1d_exclusive", NARROW_WIDE_FLOAT),
    ("test_cumprod_1d_reverse", NARROW_WIDE_FLOAT),
    ("test_cumprod_1d_reverse_exclusive", NARROW_WIDE_FLOAT),
    ("test_cumprod_2d_axis_0", NARROW_WIDE_FLOAT),
    ("test_cumprod_2d_axis_1", NARROW_WIDE_FLOAT),
    ("test_cumprod_2d_negative_axis", NARROW_WIDE_FLOAT),
    ("test_cumsum_1d", NARROW_WIDE_FLOAT),
    ("test_cumsum_1d_exclusive", NARROW_WIDE_FLOAT),
    ("test_cumsum_1d_reverse", NARROW_WIDE_FLOAT),
    ("test_cumsum_1d_reverse_exclusive", NARROW_WIDE_FLOAT),
    ("test_cumsum_2d_axis_0", NARROW_WIDE_FLOAT),
    ("test_cumsum_2d_axis_1", NARROW_WIDE_FLOAT),
    ("test_cumsum_2d_negative_axis", NARROW_WIDE_FLOAT),
    ("test_dequantizelinear_e4m3fn", QUANT_TYPES),
    ("test_dequantizelinear_e4m3fn_float16", QUANT_TYPES),
    ("test_dequantizelinear_e4m3fn_zero_point", QUANT_TYPES),
    ("test_dequantizelinear_e5m2", QUANT_TYPES),
    ("test_dequantizelinear_float4e2m1", QUANT_TYPES),
    ("test_dequantizelinear_int2", QUANT_TYPES),
    ("test_dequantizelinear_int4", QUANT_TYPES),
    ("test_dequantizelinear_uint2", QUANT_TYPES),
    ("test_dequantizelinear_uint4", QUANT_TYPES),
    ("test_dft_inverse", DFT_ROUNDOFF),
    ("test_dft_inverse_opset19", DFT_ROUNDOFF),
    ("test_div_uint32", WIDE_UNSIGNED),
    ("test_div_uint64", WIDE_UNSIGNED),
    ("test_einsum_batch_diagonal", NARROW_WIDE_FLOAT),
    ("test_einsum_batch_matmul", NARROW_WIDE_FLOAT),
    ("test_einsum_inner_prod", NARROW_WIDE_FLOAT),
    ("test_einsum_scalar", NARROW_WIDE_FLOAT),
    ("test_einsum_sum", NARROW_WIDE_FLOAT),
    ("test_einsum_transpose", NARROW_WIDE_FLOAT),
    ("test_equal_string", STRING),
    ("test_equal_string_broadcast", STRING),
    ("test_equal_uint32", WIDE_UNSIGNED),
    ("test_equal_uint64", WIDE_UNSIGNED),
    ("test_eyelike_with_dtype", NARROW_WIDE_FLOAT),
    (
        "test_flexattention_double_expanded_ver26",
        NARROW_WIDE_FLOAT,
    ),
    ("test_greater_equal_uint32", WIDE_UNSIGNED),
    ("test_greater_equal_uint32_expanded", WIDE_UNSIGNED),
    ("test_greater_equal_uint64", WIDE_UNSIGNED),
    ("test_greater_equal_uint64_expanded", WIDE_UNSIGNED),
    ("test_greater_uint32", WIDE_UNSIGNED),
    ("test_greater_uint64", WIDE_UNSIGNED),
    ("test_less_equal_uint32", WIDE_UNSIGNED),
    ("test_less_equal_uint32_expanded", WIDE_UNSIGNED),
    ("test_less_equal_uint64", WIDE_UNSIGNED),
    ("test_less_equal_uint64_expanded", WIDE_UNSIGNED),
    ("test_less_uint32", WIDE_UNSIGNED),
    ("test_less_uint64", WIDE_UNSIGNED),
    ("test_lppool_3d_default", SPATIAL_3D),
    ("test_max_float64", NARROW_WIDE_FLOAT),
    ("test_max_uint32", WIDE_UNSIGNED),
    ("test_max_uint64", WIDE_UNSIGNED),
    ("test_maxpool_3d_default", SPATIAL_3D),
    ("test_maxpool_3d_dilations", SPATIAL_3D),
    ("test_maxpool_3d_dilations_use_ref_impl", SPATIAL_3D),
    ("test_maxpool_3d_dilations_use_ref_impl_large", SPATIAL_3D),
    ("test_min_float64", NARROW_WIDE_FLOAT),
    ("test_min_uint32", WIDE_UNSIGNED),
    ("test_min_uint64", WIDE_UNSIGNED),
    ("test_mod_float16_mixed_sign_fmod_0", FLOAT_FLOOR_MOD),
    ("test_mod_float32_mixed_sign_fmod_0", FLOAT_FLOOR_MOD),
    ("test_mod_float64_mixed_sign_fmod_0", NARROW_WIDE_FLOAT),
    ("test_mod_float_edge_cases_fmod_0_float16", FLOAT_FLOOR_MOD),
    ("test_mod_float_edge_cases_fmod_0_float32", FLOAT_FLOOR_MOD),
    (
        "test_mod_float_edge_cases_fmod_0_float64",
        NARROW_WIDE_FLOAT,
    ),
    ("test_mod_mixed_sign_float64", NARROW_WIDE_FLOAT),
    ("test_mod_uint32", WIDE_UNSIGNED),
    ("test_mod_uint64", WIDE_UNSIGNED),
    ("test_mul_uint32", WIDE_UNSIGNED),
    ("test_mul_uint64", WIDE_UNSIGNED),
    ("test_pow_types_float32_uint32", WIDE_UNSIGNED),
    ("test_pow_types_float32_uint64", WIDE_UNSIGNED),
    ("test_pow_types_int32_float32", POW),
    ("test_pow_types_int64_float32", POW),
    ("test_quantizelinear_e4m3fn", QUANT_TYPES),
    ("test_quantizelinear_e5m2", QUANT_TYPES),
    ("test_quantizelinear_float4e2m1", QUANT_TYPES),
    ("test_quantizelinear_int2", QUANT_TYPES),
    ("test_quantizelinear_int4", QUANT_TYPES),
    ("test_quantizelinear_uint2", QUANT_TYPES),
    ("test_quantizelinear_uint4", QUANT_TYPES),
    ("test_range_bfloat16_type_positive_delta", RUNTIME_LOGIC),
    (
        "test_range_bfloat16_type_positive_delta_expanded",
        FLOAT_TRIP_COUNT,
    ),
    ("test_range_float16_type_positive_delta", RUNTIME_LOGIC),
    (
        "test_range_float16_type_positive_delta_expanded",
        FLOAT_TRIP_COUNT,
    ),
    ("test_range_float_type_positive_delta", RUNTIME_LOGIC),
    (
        "test_range_float_type_positive_delta_expanded",
        FLOAT_TRIP_COUNT,
    ),
    (
        "test_range_int32_type_negative_delta_expanded",
        FLOAT_TRIP_COUNT,
    ),
    (
        "test_reduce_log_sum_exp_default_axes_keepdims_example",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_default_axes_keepdims_example_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_default_axes_keepdims_random",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_default_axes_keepdims_random_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_do_not_keepdims_example",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_do_not_keepdims_example_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_do_not_keepdims_random",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_do_not_keepdims_random_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_empty_set_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_keepdims_example",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_keepdims_example_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_reduce_log_sum_exp_keepdims_random", NARROW_WIDE_FLOAT),
    (
        "test_reduce_log_sum_exp_keepdims_random_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_negative_axes_keepdims_example",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_negative_axes_keepdims_example_expanded",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_negative_axes_keepdims_random",
        NARROW_WIDE_FLOAT,
    ),
    (
        "test_reduce_log_sum_exp_negative_axes_keepdims_random_expanded",
        NARROW_WIDE_FLOAT,
    ),
    ("test_scan_sum", LEGACY_SCAN),
    ("test_sub_uint32", WIDE_UNSIGNED),
    ("test_sub_uint64", WIDE_UNSIGNED),
    ("test_top_k_same_values", TOP_K_TYPES),
    ("test_top_k_same_values_2d", TOP_K_TYPES),
    ("test_top_k_same_values_largest", TOP_K_TYPES),
    ("test_top_k_uint64", WIDE_UNSIGNED),
    ("test_training_dropout", TRAINING),
    ("test_training_dropout_default", TRAINING),
    ("test_training_dropout_default_mask", TRAINING),
    ("test_training_dropout_mask", TRAINING),
    ("test_training_dropout_zero_ratio", TRAINING),
    ("test_training_dropout_zero_ratio_mask", TRAINING),
];

/// Ops with extra outputs smelt does not compute: when a case's graph also returns those,
/// they are removed from the graph before import and only the first output is checked.
const FIRST_OUTPUT_ONLY: &[(&str, &str)] = &[
    (
        "LayerNormalization",
        "the Mean and InvStdDev outputs are not computed",
    ),
    ("MaxPool", "the Indices output is not computed"),
];

/// Cases of each suite that must pass through the whole compiler at least, so coverage
/// cannot shrink silently; a count above it is printed, so it can be raised.
const MIN_PASSED: &[(&str, usize)] = &[("node", 1389), ("pytorch-converted", 44)];

/// Whether Cranelift's verifier checks every generated function.
const VERIFY: bool = true;

const MAX_RTOL: f64 = 1e-3;
const MAX_ATOL: f64 = 1e-7;

/// The generated data folder; generates it (once per process) with `$SMELT_PYTHON`
/// if missing or stale.
fn conformance_data() -> PathBuf {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(generate_data).clone()
}

fn generate_data() -> PathBuf {
    common::generated_data("conformance", "gen_onnx_tests.py", "onnx 1.23.2")
}

struct Case {
    name: String,
    op_type: String,
    rtol: f64,
    atol: f64,
    dir: PathBuf,
    /// Number of graph outputs (of `output_N.pb` files).
    num_outputs: usize,
}

fn read_manifest(suite: &Path) -> Vec<Case> {
    let text = std::fs::read_to_string(suite.join("manifest.tsv"))
        .unwrap_or_else(|e| panic!("{}: {e}", suite.display()));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 4, "bad manifest line {l:?}");
            Case {
                name: f[0].to_string(),
                op_type: f[1].to_string(),
                rtol: f[2].parse::<f64>().expect("rtol").min(MAX_RTOL),
                atol: f[3].parse::<f64>().expect("atol").min(MAX_ATOL),
                dir: suite.join(f[0]),
                num_outputs: count_outputs(&suite.join(f[0])),
            }
        })
        .collect()
}

fn count_outputs(case: &Path) -> usize {
    (0..)
        .take_while(|j| {
            case.join(format!("test_data_set_0/output_{j}.pb"))
                .is_file()
        })
        .count()
}

fn read_pb(path: &Path) -> TensorProto {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    TensorProto::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Largest errors seen for a case: max |got − want| and max |got − want| / max |want|.
#[derive(Default, Clone, Copy)]
struct Errors {
    max_abs: f64,
    relative: f64,
}

impl Errors {
    fn max(self, o: Errors) -> Errors {
        Errors {
            max_abs: self.max_abs.max(o.max_abs),
            relative: self.relative.max(o.relative),
        }
    }
}

/// Why a case did not pass.
enum Failure {
    /// Import or compilation refused the case with an error (an integer type, a 3-D
    /// convolution, training mode...).
    Refused(String),
    /// A stage computed wrong values, failed to run, or panicked.
    Wrong(String),
}

/// The stages a case goes through, in order: the interpreter on the imported module, the
/// interpreter on the optimized one, then the JIT with each kernel choice the host runs
/// (`jit_util::kernel_choices`: Cranelift code, AVX2 and, where the CPU has it, AVX-512
/// — the default, `Kernels::Auto`, is the widest of them).
fn stage_names() -> Vec<String> {
    let jit = jit_util::kernel_choices()
        .into_iter()
        .map(|k| format!("JIT {}", k.name()));
    ["interpreter", "optimized, interpreter"]
        .map(String::from)
        .into_iter()
        .chain(jit)
        .collect()
}

/// What one case did: a failure before any stage (unreadable test data, import refusing
/// the model, a panic), or each stage's result.
struct CaseRun {
    before: Option<Failure>,
    stages: Vec<Result<Errors, Failure>>,
    /// Whether every result is an int64 constant, checked by value without a run.
    constant_only: bool,
}

impl CaseRun {
    fn early(failure: Failure) -> CaseRun {
        CaseRun {
            before: Some(failure),
            stages: Vec::new(),
            constant_only: false,
        }
    }

    /// The outcome: the first failure in stage order (a wrong value before a refusal).
    fn outcome(self) -> Result<Errors, Failure> {
        if let Some(f) = self.before {
            return Err(f);
        }
        if self.stages.is_empty() {
            return Err(Failure::Wrong("no stage ran".into()));
        }
        let mut worst = Errors::default();
        let mut refused = None;
        let interp_ok = self.stages[0].is_ok() && self.stages.get(1).is_some_and(|s| s.is_ok());
        for (stage, result) in stage_names().iter().zip(self.stages) {
            match result {
                Ok(e) => worst = worst.max(e),
                Err(Failure::Wrong(m)) => {
                    let hint = if interp_ok && stage.starts_with("JIT") {
                        " [the interpreter is right on the same optimized module: a lowering or codegen bug]"
                    } else {
                        ""
                    };
                    return Err(Failure::Wrong(format!("{stage}: {m}{hint}")));
                }
                Err(Failure::Refused(m)) => {
                    refused.get_or_insert(format!("{stage}: {m}"));
                }
            }
        }
        match refused {
            Some(m) => Err(Failure::Refused(m)),
            None => Ok(worst),
        }
    }
}

/// Runs one case through import, the interpreter, the default pipeline (`fusion,
/// const_fold, dce`), the interpreter again, and the compiler with each kernel choice
/// (see [`stage_names`]).
fn run_case(case: &Case) -> CaseRun {
    prepare_and_run(case).unwrap_or_else(CaseRun::early)
}

fn prepare_and_run(case: &Case) -> Result<CaseRun, Failure> {
    use Failure::{Refused, Wrong};
    let mut model_bytes =
        std::fs::read(case.dir.join("model.onnx")).map_err(|e| Wrong(e.to_string()))?;
    let mut model = ModelProto::decode(model_bytes.as_slice()).map_err(|e| Wrong(e.to_string()))?;
    if first_output_only(case) {
        if let Some(g) = model.graph.as_mut() {
            g.output.truncate(1);
        }
        model_bytes = model.encode_to_vec();
    }
    let graph = model.graph.as_ref().ok_or(Wrong("no graph".into()))?;
    let initializers: Vec<&str> = graph.initializer.iter().map(|t| t.name()).collect();
    let data = case.dir.join("test_data_set_0");
    // Each input read once: its proto, and the host tensor when its type is a run-time one.
    let mut given = Vec::new();
    for (j, input) in graph
        .input
        .iter()
        .filter(|i| !initializers.contains(&i.name()))
        .enumerate()
    {
        let path = data.join(format!("input_{j}.pb"));
        let bytes = std::fs::read(&path).map_err(|e| Wrong(format!("{}: {e}", path.display())))?;
        let proto = TensorProto::decode(bytes.as_slice()).map_err(|e| Wrong(e.to_string()))?;
        let tensor = smelt::onnx::read_tensor(&bytes).ok().map(|(_, t)| t);
        given.push((input.name().to_string(), proto, tensor));
    }
    // An import with the inputs `run_time` picks as run-time tensors, the rest constants.
    let attempt = |run_time: &dyn Fn(usize, &Tensor) -> bool| {
        let mut opts = ImportOptions::default();
        let mut inputs = Vec::new();
        for (j, (name, proto, tensor)) in given.iter().enumerate() {
            match tensor {
                Some(t) if run_time(j, t) => inputs.push(t.clone()),
                _ => {
                    opts.constant_inputs.insert(name.clone(), proto.clone());
                }
            }
        }
        import(&model_bytes, &opts).map(|m| (m, inputs))
    };
    // Every input of a run-time element type is a run-time input; when the import refuses
    // that (a Reshape's shape, an axes input), the integer inputs become constants, as an
    // embedder would pin them; last, every input but the data (input 0) is a constant:
    // float parameters such as a Resize's scales or a OneHot's depth, which a model holds
    // as initializers and the node tests as inputs.
    let (module, inputs) = match attempt(&|_, _| true) {
        Ok(run) => run,
        Err(first) => attempt(&|_, t| t.dtype() == DType::F32 || t.dtype().is_narrow_float())
            .or_else(|_| attempt(&|j, _| j == 0))
            .map_err(|_| Refused(format!("import: {first}")))?,
    };
    let want: Vec<ConstTensor> = (0..module.funcs[0].results.len())
        .map(|j| ConstTensor::from_proto(&read_pb(&data.join(format!("output_{j}.pb")))))
        .collect::<Result<_, _>>()
        .map_err(Wrong)?;
    let func = &module.funcs[0];
    let needs_run = func
        .results
        .iter()
        .any(|r| !matches!(func.inst_of(r.value).map(|i| &i.op), Some(Op::Const(_))));
    let mut stages = Vec::new();

    // the reference interpreter on the imported module
    stages.push(
        check_static(&module, &want)
            .and_then(|()| {
                if !needs_run {
                    return Ok(Errors::default());
                }
                let got = interp::run(&module, func, &inputs).map_err(|e| e.to_string())?;
                check_values(case, &module, &got, &want)
            })
            .map_err(Wrong),
    );

    // the default pipeline, then the interpreter on its result
    let mut optimized = module.clone();
    if let Err(e) = optimize(&mut optimized, &OptimizeOptions::default(), None) {
        stages.push(Err(Wrong(format!("optimize: {e}"))));
        return Ok(CaseRun {
            before: None,
            stages,
            constant_only: !needs_run,
        });
    }
    let opt_func = &optimized.funcs[0];
    stages.push(
        check_static(&optimized, &want)
            .and_then(|()| {
                if !needs_run {
                    return Ok(Errors::default());
                }
                let got = interp::run(&optimized, opt_func, &inputs).map_err(|e| e.to_string())?;
                check_values(case, &optimized, &got, &want)
            })
            .map_err(Wrong),
    );

    // lowering, Cranelift and a run, with each kernel choice
    for kernels in jit_util::kernel_choices() {
        if !needs_run {
            stages.push(Ok(Errors::default()));
            continue;
        }
        let opts = CompileOptions {
            kernels,
            verify: VERIFY,
            ..CompileOptions::default()
        };
        let exe = match Executable::compile(&optimized, None, &opts) {
            Ok(exe) => exe,
            Err(e) => {
                stages.push(Err(Refused(format!("compile: {e}"))));
                continue;
            }
        };
        stages.push(match exe.run(&inputs) {
            Ok(got) => check_values(case, &optimized, &got, &want).map_err(Wrong),
            Err(e) => Err(Wrong(format!("run: {e}"))),
        });
    }
    Ok(CaseRun {
        before: None,
        stages,
        constant_only: !needs_run,
    })
}

/// Checks what needs no run: each result's shape and element type, and the integer and
/// bool results folded to constants, by value.
fn check_static(module: &Module, want: &[ConstTensor]) -> Result<(), String> {
    let func = &module.funcs[0];
    for (j, (result, want)) in func.results.iter().zip(want).enumerate() {
        let ty = func.type_of(result.value);
        if ty.dims != want.dims {
            return Err(format!(
                "output {j}: shape {:?}, expected {:?}",
                ty.dims, want.dims
            ));
        }
        let float = |d: DType| d == DType::F32 || d.is_narrow_float();
        let expected = smelt::onnx::tensor::dtype::ir(want.onnx_type);
        let same_type = if want.f32s().is_some() {
            expected == Some(ty.dtype)
        } else {
            !float(ty.dtype)
        };
        if !same_type {
            return Err(format!(
                "output {j}: smelt computes {}, expected {}",
                ty.dtype,
                want.type_name()
            ));
        }
        if !float(ty.dtype) {
            if let Some(Op::Const(id)) = func.inst_of(result.value).map(|i| &i.op) {
                let got = module
                    .weights
                    .get(*id)
                    .and_then(|w| w.elements())
                    .and_then(|d| d.to_i64s())
                    .ok_or(format!("output {j}: an unreadable constant"))?;
                if Some(&got[..]) != want.i64s() {
                    return Err(format!("output {j}: {got:?}, expected {:?}", want.i64s()));
                }
            }
        }
    }
    Ok(())
}

/// Compares the float results a run computed (`got`, one per result of the module's
/// function) with ONNX's outputs, within the case's tolerances.
fn check_values(
    case: &Case,
    module: &Module,
    got: &[Tensor],
    want: &[ConstTensor],
) -> Result<Errors, String> {
    let func = &module.funcs[0];
    if got.len() != func.results.len() {
        return Err(format!(
            "{} outputs, expected {}",
            got.len(),
            func.results.len()
        ));
    }
    let mut worst = Errors::default();
    for (j, (result, want)) in func.results.iter().zip(want).enumerate() {
        let ty = func.type_of(result.value);
        if ty.dtype != DType::F32 && !ty.dtype.is_narrow_float() {
            // integers and bools are exact
            let got = got[j].to_row_major().to_i64s();
            if got.as_deref() != want.i64s() {
                return Err(format!(
                    "output {j}: {got:?}, expected {:?} ({})",
                    want.i64s(),
                    want.type_name()
                ));
            }
            continue;
        }
        let want = want.f32s().ok_or(format!(
            "output {j}: expected {} values, smelt computes float32",
            want.type_name()
        ))?;
        // float16 and bfloat16 results compared by their (exact) f32 values
        let got = got[j]
            .to_row_major()
            .to_f32s()
            .ok_or(format!("output {j}: not a float tensor"))?;
        if got.len() != want.len() {
            return Err(format!(
                "output {j}: {} values, expected {}",
                got.len(),
                want.len()
            ));
        }
        let max_ref = want.iter().fold(0f64, |m, &v| {
            if v.is_finite() {
                m.max((v as f64).abs())
            } else {
                m
            }
        });
        for (k, (&g, &w)) in got.iter().zip(want.iter()).enumerate() {
            let (g, w) = (g as f64, w as f64);
            let same_special = (g.is_nan() && w.is_nan()) || (g.is_infinite() && g == w);
            if same_special {
                continue;
            }
            let diff = (g - w).abs();
            // written so that a NaN difference fails
            let within = diff <= case.atol + case.rtol * w.abs();
            if !within {
                return Err(format!(
                    "output {j} element {k}: got {g}, expected {w} (|diff| {diff:.3e} > atol {:e} + rtol {:e}·|want|)",
                    case.atol, case.rtol
                ));
            }
            worst.max_abs = worst.max_abs.max(diff);
            if max_ref > 0.0 {
                worst.relative = worst.relative.max(diff / max_ref);
            }
        }
    }
    Ok(worst)
}

/// Whether the case is checked on its first output only (see [`FIRST_OUTPUT_ONLY`]).
fn first_output_only(case: &Case) -> bool {
    FIRST_OUTPUT_ONLY.iter().any(|(op, _)| *op == case.op_type) && case.num_outputs > 1
}

fn model_op_types(dir: &Path) -> Vec<String> {
    let bytes = std::fs::read(dir.join("model.onnx")).unwrap_or_default();
    let model = ModelProto::decode(bytes.as_slice()).unwrap_or_default();
    let mut ops: Vec<String> = model
        .graph
        .iter()
        .flat_map(|g| g.node.iter().map(|n| n.op_type().to_string()))
        .collect();
    ops.sort();
    ops.dedup();
    ops
}

#[derive(Default)]
struct OpTally {
    passed: usize,
    total: usize,
    known: usize,
    first_output_only: usize,
    unsupported_op: usize,
    worst: Errors,
}

/// Counts over every case of a suite.
#[derive(Default)]
struct SuiteTally {
    cases: usize,
    passed: usize,
    failed: usize,
    refused: usize,
    unsupported_op: usize,
    known: usize,
    /// Passed cases whose results are all int64 constants (checked without a run).
    constant_only: usize,
    /// Per stage (see [`stage_names`]), the cases it got right.
    stage_passed: Vec<usize>,
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    format!("PANICKED: {text}")
}

fn run_suite(suite: &str) -> Vec<String> {
    let dir = conformance_data().join(suite);
    let supported: Vec<&str> = supported_op_types().collect();
    let known: BTreeMap<&str, &str> = KNOWN_FAILURES.iter().copied().collect();
    let mut tally: BTreeMap<String, OpTally> = BTreeMap::new();
    let stages = stage_names();
    let mut all = SuiteTally {
        stage_passed: vec![0; stages.len()],
        ..SuiteTally::default()
    };
    let mut problems = Vec::new();
    for case in read_manifest(&dir) {
        all.cases += 1;
        let ops = model_op_types(&case.dir);
        let unsupported = ops.iter().any(|o| !supported.contains(&o.as_str()));
        let relevant = supported.contains(&case.op_type.as_str());
        if unsupported {
            all.unsupported_op += 1;
            if relevant {
                tally
                    .entry(case.op_type.clone())
                    .or_default()
                    .unsupported_op += 1;
            }
            continue;
        }
        let t = tally.entry(case.op_type.clone()).or_default();
        t.total += 1;
        let run = catch_unwind(AssertUnwindSafe(|| run_case(&case)))
            .unwrap_or_else(|p| CaseRun::early(Failure::Wrong(panic_message(p.as_ref()))));
        for (n, s) in all.stage_passed.iter_mut().zip(&run.stages) {
            *n += usize::from(s.is_ok());
        }
        let constant_only = run.constant_only;
        let outcome = run.outcome();
        match &outcome {
            Ok(_) => all.passed += 1,
            Err(Failure::Wrong(_)) => all.failed += 1,
            Err(Failure::Refused(_)) => all.refused += 1,
        }
        match (outcome, known.get(case.name.as_str())) {
            (Ok(e), None) => {
                t.passed += 1;
                t.first_output_only += usize::from(first_output_only(&case));
                t.worst = t.worst.max(e);
                all.constant_only += usize::from(constant_only);
            }
            (Ok(_), Some(_)) => problems.push(format!(
                "{suite}/{}: passes but is listed in KNOWN_FAILURES; remove it",
                case.name
            )),
            (Err(Failure::Wrong(m) | Failure::Refused(m)), Some(_)) => {
                // SMELT_SHOW_KNOWN=1 prints why each known case fails, to review the list
                if std::env::var_os("SMELT_SHOW_KNOWN").is_some() {
                    println!("known {suite}/{} ({}): {m}", case.name, case.op_type);
                }
                t.known += 1;
                all.known += 1;
            }
            (Err(Failure::Wrong(m) | Failure::Refused(m)), None) => {
                problems.push(format!("{suite}/{} ({}): {m}", case.name, case.op_type))
            }
        }
    }
    println!(
        "{suite}: op: passed/in scope (known failures, passed on first output only, \
         cases using unsupported ops) max abs err, max rel err"
    );
    for (op, t) in &tally {
        println!(
            "  {op:<20} {:>3}/{:<3} ({} known, {} first output only, {} unsupported op)  {:.2e} {:.2e}",
            t.passed,
            t.total,
            t.known,
            t.first_output_only,
            t.unsupported_op,
            t.worst.max_abs,
            t.worst.relative
        );
    }
    println!(
        "{suite}: {} cases: {} pass through the whole compiler ({} of them with only int64 \
         constant results, checked without a run), {} fail, {} unsupported op, {} other \
         refusal; {} of the failures and refusals are known",
        all.cases,
        all.passed,
        all.constant_only,
        all.failed,
        all.unsupported_op,
        all.refused,
        all.known
    );
    let by_stage: Vec<String> = stages
        .iter()
        .zip(&all.stage_passed)
        .map(|(s, n)| format!("{s} {n}"))
        .collect();
    println!(
        "{suite}: of the {} in-scope cases, right by stage: {}",
        all.cases - all.unsupported_op,
        by_stage.join(", ")
    );
    let min = MIN_PASSED
        .iter()
        .find(|(s, _)| *s == suite)
        .map(|&(_, n)| n)
        .unwrap_or_else(|| panic!("MIN_PASSED has no entry for {suite}"));
    if all.passed < min {
        problems.push(format!(
            "{suite}: {} cases pass, fewer than MIN_PASSED's {min}",
            all.passed
        ));
    } else if all.passed > min {
        println!(
            "{suite}: {} cases pass, more than MIN_PASSED's {min}: raise it",
            all.passed
        );
    }
    if suite == "node" {
        problems.extend(readme_family_table_problems(&tally));
    }
    problems
}

/// The README row of the node cases whose op is imported by no family file: the ONNX
/// functions smelt runs in their `_expanded` form.
const FUNCTIONS_ROW: &str = "functions smelt has no op for, run in their `_expanded` form";

/// The op types each importer family declares: `"Op"  [versions]` lines of the `ROWS`
/// table in `src/onnx/ops/FAMILY.rs`, by family (the file's stem).
fn importer_families() -> BTreeMap<String, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/onnx/ops");
    let mut family_of = BTreeMap::new();
    let files = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for file in files.flatten() {
        let path = file.path();
        let Some(family) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if family == "mod" || path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let Some(rows) = text
            .split("rules! {")
            .nth(1)
            .and_then(|t| t.split("};").next())
        else {
            continue;
        };
        for line in rows.lines() {
            let line = line.trim_start();
            let Some(rest) = line.strip_prefix('"') else {
                continue;
            };
            if let Some((op, _)) = rest.split_once('"') {
                family_of.insert(op.to_string(), family.to_string());
            }
        }
    }
    family_of
}

/// The README's per-family table of node cases (`README.md`, ONNX section) must say what
/// this run counted: per family, cases passed / run, known failures and the ops with node
/// tests. On a mismatch the rows it should hold are printed, to copy in.
fn readme_family_table_problems(tally: &BTreeMap<String, OpTally>) -> Vec<String> {
    let family_of = importer_families();
    // per row: passed, run, known, ops
    let mut rows: BTreeMap<String, (usize, usize, usize, Vec<String>)> = BTreeMap::new();
    for (op, t) in tally {
        let row = match family_of.get(op) {
            Some(f) => format!("`{f}`"),
            None => FUNCTIONS_ROW.to_string(),
        };
        let r = rows.entry(row).or_default();
        r.0 += t.passed;
        r.1 += t.total;
        r.2 += t.known;
        r.3.push(op.clone());
    }
    let readme_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&readme_path).unwrap_or_default();
    let mut stated: BTreeMap<String, (usize, usize, usize, Vec<String>)> = BTreeMap::new();
    let table = readme
        .split("| family (`src/onnx/ops/`) |")
        .nth(1)
        .and_then(|t| t.split("\n\n").next())
        .unwrap_or("");
    for line in table.lines().skip(2) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 5 {
            continue;
        }
        let counts: Vec<usize> = cells[2]
            .split('/')
            .filter_map(|n| n.trim().parse().ok())
            .collect();
        let known = cells[3]
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(usize::MAX);
        let mut ops: Vec<String> = cells[4].split(',').map(|o| o.trim().to_string()).collect();
        ops.sort();
        if let [passed, run] = counts[..] {
            stated.insert(cells[1].to_string(), (passed, run, known, ops));
        }
    }
    let mut want: Vec<_> = rows.into_iter().collect();
    want.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
    let mismatched =
        want.len() != stated.len() || want.iter().any(|(row, r)| stated.get(row) != Some(r));
    if !mismatched {
        return Vec::new();
    }
    let expected: Vec<String> = want
        .iter()
        .map(|(row, (p, r, k, ops))| format!("| {row} | {p} / {r} | {k} | {} |", ops.join(", ")))
        .collect();
    vec![format!(
        "README.md's per-family table of node cases differs from this run; its rows should be \
         (a known-failure cell may go on with a reason after the count):\n{}",
        expected.join("\n")
    )]
}

#[test]
fn onnx_backend_node_tests() {
    let problems = run_suite("node");
    assert!(
        problems.is_empty(),
        "{} failing cases:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn onnx_pytorch_converted_tests() {
    let problems = run_suite("pytorch-converted");
    assert!(
        problems.is_empty(),
        "{} failing cases:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_known_failure_names_an_existing_case() {
    let dir = conformance_data();
    for (name, reason) in KNOWN_FAILURES {
        assert!(!reason.is_empty(), "{name} needs a reason");
        let exists = ["node", "pytorch-converted"]
            .iter()
            .any(|s| dir.join(s).join(name).is_dir());
        assert!(
            exists,
            "KNOWN_FAILURES lists {name}, which is not a generated case"
        );
    }
    assert!(
        KNOWN_FAILURES.windows(2).all(|w| w[0].0 < w[1].0),
        "KNOWN_FAILURES is not sorted"
    );
}
