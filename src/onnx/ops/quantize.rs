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

use smelt_ir::op::{BinaryOp, Op, UnaryOp};
use smelt_ir::{DType, Diagnostic, Value};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::{dtype, ConstTensor};

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "DequantizeLinear"    [10, 13, 19, 21, 23, 24, 25, 28], from 10 => dequantize;
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
fn check_float(cx: &mut NodeCtx, i: usize, what: &str) -> Result<(), Diagnostic> {
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
