//! QuantizeLinear and DequantizeLinear as compositions of float32 ops and casts:
//! `y = saturate(round_half_even(x / scale) + zero_point)` and
//! `y = (x - zero_point) * scale`, per tensor, per axis or per block.
//!
//! The quantized types are the narrow integers smelt holds at run time (int8, uint8,
//! int16, uint16; DequantizeLinear also reads int32). QuantizeLinear adds the zero point
//! in float32 to the rounded quotient and lets the saturating `cast` clip the sum to the
//! type: every value in the type's range is an exact f32 sum of an integer quotient and
//! a 16-bit zero point, and a sum beyond the range saturates either way (the reference's
//! `clip` of an int32 sum). DequantizeLinear's `x - zero_point` is exact in f32 for
//! every integer type it reads up to 16 bits (int32 differences round as ONNX's
//! reference, which subtracts in float32 too), then one multiplication rounds. The scale
//! and zero point may be computed at run time; constants become weights the
//! `const_fold` pass folds (a QDQ model's weights dequantized once, at compile time).
//!
//! MatMulInteger and QLinearMatMul (the operator forms of ORT's dynamic and static
//! quantization) take the exact int32 product `(A - a_zp)·(B - b_zp)` from float32
//! matmuls: each difference is an integer of at most 255 in magnitude, so a product is
//! at most 65,025 and a sum of 256 of them stays below 2^24 — exact in f32 whatever the
//! order. The reduction is cut into chunks of 256, each chunk's f32 product cast to int32
//! and the chunks summed in int32 (as many flops as one matmul). QLinearMatMul then
//! requantizes as its reference does: the int32 sum times `a_scale·b_scale / y_scale`,
//! plus the zero point, rounded half to even, saturated by the cast.

use smelt_ir::op::{BinaryOp, Op, UnaryOp};
use smelt_ir::{DType, Diagnostic, Value};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::{dtype, ConstTensor};

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "DequantizeLinear"    [10, 13, 19, 21, 23, 24, 25, 28], from 10 => dequantize;
    "DynamicQuantizeLinear" [11],                         from 11 => dynamic_quantize;
    "MatMulInteger"       [10],                           from 10 => matmul_integer;
    "QLinearMatMul"       [10, 21],                       from 10 => qlinear_matmul;
    "QuantizeLinear"      [10, 13, 19, 21, 23, 24, 25, 28], from 10 => quantize;
};

/// The attributes both ops may carry (by version; an attribute a version does not
/// define is still refused by the ONNX checker, not here).
const ATTRS: &[&str] = &[
    "axis",
    "block_size",
    "saturate",
    "output_dtype",
    "precision",
];

/// How a scale or zero point maps onto the input's elements.
struct Quantization {
    /// The input's dimensions.
    dims: Vec<usize>,
    /// The quantized axis (per-axis and blocked forms).
    axis: usize,
    /// The block length along `axis`, 0 for the per-tensor and per-axis forms.
    block_size: usize,
}

impl Quantization {
    fn of(cx: &NodeCtx) -> Result<Quantization, Diagnostic> {
        let dims = cx.dims(0)?;
        let rank = dims.len();
        let axis = cx.attr_int_or("axis", 1)?;
        let block = cx.attr_int_or("block_size", 0)?;
        let block_size = usize::try_from(block)
            .map_err(|_| cx.bad_attr("block_size", format!("{block} is negative")))?;
        // a scalar scale needs no axis, and a rank-0 or rank-1 input may leave it at 1
        let axis = match crate::onnx::context::normalize_axis(axis, rank) {
            Some(a) => a,
            None if cx.dims(1)?.iter().product::<usize>() == 1 && block_size == 0 => 0,
            None => {
                return Err(cx.bad_attr("axis", format!("{axis} is out of range for rank {rank}")))
            }
        };
        Ok(Quantization {
            dims,
            axis,
            block_size,
        })
    }

    /// Input `i` (a scale or zero point) as float32 values broadcasting to the input:
    /// a scalar as it is, a per-axis vector reshaped to lie along the axis, a blocked
    /// tensor's entries repeated `block_size` times along the axis (one `gather`).
    fn param(&self, cx: &mut NodeCtx, i: usize, what: &str) -> Result<Value, Diagnostic> {
        let p_dims = cx.dims(i)?;
        let v = cx.value(i)?;
        let v = if cx.type_of(v).dtype == DType::F32 {
            v
        } else {
            cx.emit(Op::Cast { to: DType::F32 }, &[v])?
        };
        let count: usize = p_dims.iter().product();
        let name = cx.input_name(i).unwrap_or("").to_string();
        let bad = |cx: &NodeCtx, m: String| {
            cx.err(
                "onnx-bad-model",
                format!("input {i} ('{name}', the {what}) {m}"),
            )
        };
        if self.block_size == 0 {
            if count == 1 {
                return cx.reshape(v, vec![]);
            }
            let d = self.dims.get(self.axis).copied().unwrap_or(0);
            if p_dims.len() != 1 || p_dims[0] != d {
                return Err(bad(
                    cx,
                    format!(
                        "has shape {p_dims:?}: a per-axis {what} is a vector of the {d} \
                         positions of axis {} of the input {:?}",
                        self.axis, self.dims
                    ),
                ));
            }
            let mut shape = vec![1; self.dims.len()];
            shape[self.axis] = d;
            return cx.reshape(v, shape);
        }
        let d = self.dims[self.axis];
        let blocks = d.div_ceil(self.block_size);
        let fits = p_dims.len() == self.dims.len()
            && p_dims
                .iter()
                .zip(&self.dims)
                .enumerate()
                .all(
                    |(k, (&p, &x))| {
                        if k == self.axis {
                            p == blocks
                        } else {
                            p == x
                        }
                    },
                );
        if !fits {
            return Err(bad(
                cx,
                format!(
                    "has shape {p_dims:?}: a blocked {what} has the input's shape {:?} with \
                     axis {} of ceil({d} / {}) = {blocks} blocks",
                    self.dims, self.axis, self.block_size
                ),
            ));
        }
        let indices: Vec<i64> = (0..d).map(|k| (k / self.block_size) as i64).collect();
        let indices = ConstTensor::i64(vec![d], indices);
        let iname = cx.derived_name(&format!("block_index{i}"));
        let indices = cx.materialize(&indices, &iname)?;
        cx.emit(Op::Gather { axis: self.axis }, &[v, indices])
    }
}

/// The run-time element type of quantized type `code`, refusing the ones smelt does not
/// hold (int4, float8, ...). `what` names the tensor for the message.
fn quantized_type(cx: &NodeCtx, code: i32, what: &str, int32: bool) -> Result<DType, Diagnostic> {
    match dtype::ir(code) {
        Some(d) if d.is_narrow_int() || (int32 && d == DType::I32) => Ok(d),
        _ => Err(cx.err(
            "onnx-unsupported-dtype",
            format!(
                "{what} is {}; smelt's quantized types are int8, uint8, int16 and uint16{}",
                dtype::name(code),
                if int32 {
                    " (and int32 for DequantizeLinear)"
                } else {
                    ""
                }
            ),
        )),
    }
}

/// The ONNX type code of input `i`, whether constant or computed.
fn type_code(cx: &NodeCtx, i: usize) -> Result<i32, Diagnostic> {
    Ok(match cx.entry(i)? {
        Entry::Const(c) => c.onnx_type,
        Entry::Value(v) => dtype::of_ir(cx.type_of(v).dtype),
        Entry::Dropped { .. } => return Err(cx.err("onnx-unsupported-output", "dropped input")),
    })
}

/// Whether the optional input `i` is given.
fn present(cx: &NodeCtx, i: usize) -> bool {
    cx.input_name(i).is_some()
}

/// The float32 input `i` (`x` or a scale): float16 and bfloat16 arrive widened.
pub(super) fn check_float(cx: &mut NodeCtx, i: usize, what: &str) -> Result<(), Diagnostic> {
    let code = type_code(cx, i)?;
    if code != dtype::FLOAT {
        return Err(cx.err(
            "onnx-unsupported-dtype",
            format!(
                "input {i} (the {what}) is {}; smelt's quantization reads float32, float16 \
                 and bfloat16",
                dtype::name(code)
            ),
        ));
    }
    Ok(())
}

/// QuantizeLinear: `x / scale` in float32, rounded half to even, plus the zero point,
/// saturated to the quantized type by the cast.
pub fn quantize(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(ATTRS)?;
    cx.check_max_inputs(3)?;
    check_float(cx, 0, "input")?;
    check_float(cx, 1, "scale")?;
    if let Some(p) = cx.attr_int("precision")? {
        if p != 0 && p != i64::from(dtype::FLOAT) {
            return Err(cx.bad_attr(
                "precision",
                format!(
                    "is {}; smelt divides in float32",
                    dtype::name(i32::try_from(p).unwrap_or(0))
                ),
            ));
        }
    }
    let output_dtype = cx.attr_int_or("output_dtype", 0)?;
    let output_dtype = i32::try_from(output_dtype)
        .map_err(|_| cx.bad_attr("output_dtype", format!("{output_dtype} is not a type code")))?;
    let code = if present(cx, 2) {
        let z = type_code(cx, 2)?;
        if output_dtype != 0 && output_dtype != z {
            return Err(cx.bad_attr(
                "output_dtype",
                format!(
                    "is {} but the zero point is {}",
                    dtype::name(output_dtype),
                    dtype::name(z)
                ),
            ));
        }
        z
    } else if output_dtype != 0 {
        output_dtype
    } else {
        dtype::UINT8
    };
    let to = quantized_type(cx, code, "the quantized type", false)?;
    let q = Quantization::of(cx)?;
    let x = cx.value(0)?;
    let scale = q.param(cx, 1, "scale")?;
    let y = cx.emit(Op::Binary(BinaryOp::Div), &[x, scale])?;
    let mut y = cx.emit(Op::Unary(UnaryOp::Round), &[y])?;
    if present(cx, 2) {
        let zero = q.param(cx, 2, "zero point")?;
        y = cx.emit(Op::Binary(BinaryOp::Add), &[y, zero])?;
    }
    Ok(vec![Entry::Value(cx.emit(Op::Cast { to }, &[y])?)])
}

/// DequantizeLinear: `(x - zero_point) * scale` in float32 (the result in the scale's
/// type, or `output_dtype`'s).
pub fn dequantize(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(ATTRS)?;
    cx.check_max_inputs(3)?;
    check_float(cx, 1, "scale")?;
    let code = type_code(cx, 0)?;
    quantized_type(cx, code, "input 0 (the quantized input)", true)?;
    if present(cx, 2) {
        let z = type_code(cx, 2)?;
        if z != code {
            return Err(cx.err(
                "onnx-bad-model",
                format!(
                    "the zero point is {} but the input is {}",
                    dtype::name(z),
                    dtype::name(code)
                ),
            ));
        }
    }
    let output_dtype = cx.attr_int_or("output_dtype", 0)?;
    let out = match i32::try_from(output_dtype) {
        Ok(0) | Ok(dtype::FLOAT) => None,
        Ok(c @ (dtype::FLOAT16 | dtype::BFLOAT16)) => dtype::ir(c),
        _ => {
            return Err(cx.bad_attr(
                "output_dtype",
                format!("{output_dtype} is not float32, float16 or bfloat16"),
            ))
        }
    };
    let q = Quantization::of(cx)?;
    let x = cx.value(0)?;
    let mut y = cx.emit(Op::Cast { to: DType::F32 }, &[x])?;
    if present(cx, 2) {
        let zero = q.param(cx, 2, "zero point")?;
        y = cx.emit(Op::Binary(BinaryOp::Sub), &[y, zero])?;
    }
    let scale = q.param(cx, 1, "scale")?;
    y = cx.emit(Op::Binary(BinaryOp::Mul), &[y, scale])?;
    if let Some(to) = out {
        y = cx.emit(Op::Cast { to }, &[y])?;
    }
    Ok(vec![Entry::Value(y)])
}

/// Reduction entries per exact f32 chunk of an integer product or conv: every centred
/// operand is at most 255 in magnitude, so 256 · 255² < 2^24.
pub(super) const EXACT_CHUNK: usize = 256;

/// A 1-D `v` of more than one element shaped `[n, 1, …]` with `trailing` ones, so it
/// broadcasts along a leading axis (per row of A, per output channel of a conv); any
/// other `v` as it is (a scalar, or per column, which broadcasts along the last axis).
pub(super) fn along_leading_axis(
    cx: &mut NodeCtx,
    v: Value,
    trailing: usize,
) -> Result<Value, Diagnostic> {
    let d = cx.type_of(v).dims.clone();
    if trailing == 0 || d.len() != 1 || d[0] <= 1 {
        return Ok(v);
    }
    let mut shape = vec![d[0]];
    shape.resize(1 + trailing, 1);
    cx.reshape(v, shape)
}

/// `v` (int8 or uint8) as f32 less its zero point, input `zp` if present, shaped by
/// [`along_leading_axis`] with `trailing` ones.
pub(super) fn centred(
    cx: &mut NodeCtx,
    v: Value,
    zp: usize,
    trailing: usize,
) -> Result<Value, Diagnostic> {
    let d = cx.type_of(v).dtype;
    if !matches!(d, DType::I8 | DType::U8) {
        return Err(cx.err(
            "onnx-unsupported-dtype",
            format!("an integer product takes int8 or uint8 tensors, got {d}"),
        ));
    }
    let v = cx.emit(Op::Cast { to: DType::F32 }, &[v])?;
    if !present(cx, zp) {
        return Ok(v);
    }
    let z = cx.value(zp)?;
    let z = cx.emit(Op::Cast { to: DType::F32 }, &[z])?;
    let z = along_leading_axis(cx, z, trailing)?;
    cx.emit(Op::Binary(BinaryOp::Sub), &[v, z])
}

/// The int32 sum of `part(lo, hi)` over chunks of `0..total` of at most `chunk` entries:
/// each part is an f32 product or conv of integers whose sum stays below 2^24 (exact
/// whatever the order), cast to int32.
pub(super) fn exact_int_sum(
    cx: &mut NodeCtx,
    total: usize,
    chunk: usize,
    mut part: impl FnMut(&mut NodeCtx, usize, usize) -> Result<Value, Diagnostic>,
) -> Result<Value, Diagnostic> {
    let mut sum: Option<Value> = None;
    for lo in (0..total.max(1)).step_by(chunk.max(1)) {
        let p = part(cx, lo, (lo + chunk).min(total))?;
        let p = cx.emit(Op::Cast { to: DType::I32 }, &[p])?;
        sum = Some(match sum {
            None => p,
            Some(s) => cx.emit(Op::Binary(BinaryOp::Add), &[s, p])?,
        });
    }
    sum.ok_or_else(|| cx.err("onnx-bad-model", "an empty integer product"))
}

/// The QLinear ops' requantization of the int32 `c`: `saturate(round_half_even(c ·
/// in_scale·w_scale / y_scale) + y_zero_point)` in f32, the scales at inputs `scales`
/// (the input's, the weights', the result's) and the zero point at `y_zp` (its type the
/// result's; input 0's when it is absent).
pub(super) fn requantize(
    cx: &mut NodeCtx,
    c: Value,
    [in_scale, w_scale, y_scale]: [Value; 3],
    y_zp: usize,
) -> Result<Value, Diagnostic> {
    let code = if present(cx, y_zp) {
        type_code(cx, y_zp)?
    } else {
        type_code(cx, 0)?
    };
    let to = quantized_type(cx, code, "the result's quantized type", false)?;
    let c = cx.emit(Op::Cast { to: DType::F32 }, &[c])?;
    let both = cx.emit(Op::Binary(BinaryOp::Mul), &[in_scale, w_scale])?;
    let scale = cx.emit(Op::Binary(BinaryOp::Div), &[both, y_scale])?;
    let mut y = cx.emit(Op::Binary(BinaryOp::Mul), &[c, scale])?;
    if present(cx, y_zp) {
        let z = cx.value(y_zp)?;
        let z = cx.emit(Op::Cast { to: DType::F32 }, &[z])?;
        y = cx.emit(Op::Binary(BinaryOp::Add), &[y, z])?;
    }
    let y = cx.emit(Op::Unary(UnaryOp::Round), &[y])?;
    cx.emit(Op::Cast { to }, &[y])
}

/// The exact int32 product `(A - a_zp)·(B - b_zp)` of inputs `a` and `b` (zero points at
/// `a_zp` and `b_zp`; A's per row, B's per column), by f32 matmuls over chunks of
/// [`EXACT_CHUNK`] reduction entries.
fn integer_product(cx: &mut NodeCtx, [a, a_zp, b, b_zp]: [usize; 4]) -> Result<Value, Diagnostic> {
    let (ad, bd) = (cx.dims(a)?, cx.dims(b)?);
    if ad.len() < 2 || bd.len() < 2 || ad[ad.len() - 1] != bd[bd.len() - 2] {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "A of shape {ad:?} and B of shape {bd:?} do not multiply (smelt's integer \
                 products take matrices, [.., M, K] by [.., K, N])"
            ),
        ));
    }
    let av = cx.value(a)?;
    let av = centred(cx, av, a_zp, 1)?;
    let bv = cx.value(b)?;
    let bv = centred(cx, bv, b_zp, 0)?;
    let k = ad[ad.len() - 1];
    exact_int_sum(cx, k, EXACT_CHUNK, |cx, lo, hi| {
        let (ac, bc) = if lo == 0 && hi == k {
            (av, bv)
        } else {
            (
                cx.slice_along(av, ad.len() - 1, lo, hi)?,
                cx.slice_along(bv, bd.len() - 2, lo, hi)?,
            )
        };
        cx.emit(Op::MatMul, &[ac, bc])
    })
}

/// MatMulInteger: `(A - a_zero_point)·(B - b_zero_point)` in int32.
pub fn matmul_integer(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    cx.check_max_inputs(4)?;
    let y = integer_product(cx, [0, 2, 1, 3])?;
    Ok(vec![Entry::Value(y)])
}

/// QLinearMatMul: the int32 product of the centred quantized inputs, requantized
/// ([`requantize`]; `a_scale` per tensor or per row, `b_scale` per tensor or per column).
pub fn qlinear_matmul(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    cx.check_max_inputs(8)?;
    for (i, what) in [(1, "a_scale"), (4, "b_scale"), (6, "y_scale")] {
        check_float(cx, i, what)?;
    }
    let c = integer_product(cx, [0, 2, 3, 5])?;
    let a_scale = cx.value(1)?;
    let a_scale = along_leading_axis(cx, a_scale, 1)?;
    let scales = [a_scale, cx.value(4)?, cx.value(6)?];
    Ok(vec![Entry::Value(requantize(cx, c, scales, 7)?)])
}

/// DynamicQuantizeLinear, as its ONNX function computes it: the range of `x` widened to
/// hold 0, `scale = range / 255`, the zero point `round(clip(0 - min / scale, 0, 255))` as
/// uint8, and `x` quantized by them (three results: y, y_scale, y_zero_point).
pub fn dynamic_quantize(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    use smelt_ir::op::{ReduceAttrs, Reduction};
    cx.check_attrs(&[])?;
    cx.check_max_inputs(1)?;
    check_float(cx, 0, "input")?;
    let x = cx.value(0)?;
    let rank = cx.type_of(x).dims.len();
    let all = ReduceAttrs {
        axes: (0..rank).collect(),
        keep_dims: false,
    };
    let zero = cx.scalar(0.0)?;
    let lo = cx.emit(Op::Reduce(Reduction::Min, all.clone()), &[x])?;
    let lo = cx.emit(Op::Binary(BinaryOp::Min), &[lo, zero])?;
    let hi = cx.emit(Op::Reduce(Reduction::Max, all), &[x])?;
    let hi = cx.emit(Op::Binary(BinaryOp::Max), &[hi, zero])?;
    let range = cx.emit(Op::Binary(BinaryOp::Sub), &[hi, lo])?;
    let levels = cx.scalar(255.0)?;
    let scale = cx.emit(Op::Binary(BinaryOp::Div), &[range, levels])?;
    let lo_scaled = cx.emit(Op::Binary(BinaryOp::Div), &[lo, scale])?;
    let zp = cx.emit(Op::Binary(BinaryOp::Sub), &[zero, lo_scaled])?;
    let zp = cx.emit(
        Op::Unary(UnaryOp::Clip {
            min: smelt_ir::F32(0.0),
            max: smelt_ir::F32(255.0),
        }),
        &[zp],
    )?;
    let zp = cx.emit(Op::Unary(UnaryOp::Round), &[zp])?;
    let zp_q = cx.emit(Op::Cast { to: DType::U8 }, &[zp])?;
    let q = cx.emit(Op::Binary(BinaryOp::Div), &[x, scale])?;
    let q = cx.emit(Op::Unary(UnaryOp::Round), &[q])?;
    let q = cx.emit(Op::Binary(BinaryOp::Add), &[q, zp])?;
    let y = cx.emit(Op::Cast { to: DType::U8 }, &[q])?;
    Ok(vec![
        Entry::Value(y),
        Entry::Value(scale),
        Entry::Value(zp_q),
    ])
}
