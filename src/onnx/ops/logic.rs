//! Cast and CastLike, the comparisons (Equal, Less, Greater, LessOrEqual, GreaterOrEqual),
//! the boolean ops (Not, And, Or, Xor), Where, Range, Size, Mod, Min/Max, and the bitwise
//! ops (folded only).
//!
//! smelt's input shapes are static, so the shape programs exporters write (`Shape` →
//! `Cast` → arithmetic → `Reshape`, `Range` over a dimension, `Equal`/`Where` picking a
//! `-1`) are computed here, on [`ConstTensor`]s: integers exactly in i64 (an overflow is
//! an error, never a wrap), floats in f32, comparisons giving bool constants. On data
//! computed at run time (an attention mask from int64 ids, say) Cast, the comparisons,
//! the boolean ops and Where become IR ops on typed tensors (`cast`, `less`, `and`,
//! `where`, `mod`, ...) for float32, int64, int32 and bool (float16 and bfloat16 through
//! float32, see `narrow.rs`); Range and Size stay folded only.

use smelt_ir::op::{broadcast, BinaryOp, Comparison, LogicOp, Op, UnaryOp};
use smelt_ir::types::MAX_TENSOR_BYTES;
use smelt_ir::Diagnostic;

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::{broadcast_indices, dtype, ConstData, ConstTensor};

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "And"                 [1, 7],                         from 7  => logical;
    "BitShift"            [11],                           from 11 => bitwise;
    "BitwiseAnd"          [18],                           from 18 => bitwise;
    "BitwiseNot"          [18],                           from 18 => bitwise;
    "BitwiseOr"           [18],                           from 18 => bitwise;
    "BitwiseXor"          [18],                           from 18 => bitwise;
    "Cast"                [1, 6, 9, 13, 19, 21, 23, 24, 25, 28], from 6 => cast;
    "CastLike"            [15, 19, 21, 23, 24, 25],       from 15 => cast;
    "Equal"               [1, 7, 11, 13, 19],             from 7  => compare;
    "Greater"             [1, 7, 9, 13],                  from 7  => compare;
    "GreaterOrEqual"      [12, 16],                       from 12 => compare;
    "IsInf"               [10, 20],                     from 10 => is_inf;
    "IsNaN"               [9, 13, 20],                    from 9  => is_nan;
    "Less"                [1, 7, 9, 13],                  from 7  => compare;
    "LessOrEqual"         [12, 16],                       from 12 => compare;
    "Max"                 [1, 6, 8, 12, 13],              from 8  => min_max;
    "Min"                 [1, 6, 8, 12, 13],              from 8  => min_max;
    "Mod"                 [10, 13, 28],                   from 10 => mod_;
    "Not"                 [1],                            from 1  => logical;
    "Or"                  [1, 7],                         from 7  => logical;
    "Range"               [11, 27],                       from 11 => range;
    "Size"                [1, 13, 19, 21, 23, 24, 25],    from 1  => size;
    "Where"               [9, 16],                        from 9  => where_;
    "Xor"                 [1, 7],                         from 7  => logical;
};

/// Most elements a folded Range may have (as many int64s as the largest tensor holds).
const MAX_FOLDED_ELEMENTS: u64 = MAX_TENSOR_BYTES / 8;

/// The error for an op whose input is computed at run time.
fn runtime_input(cx: &NodeCtx, i: usize) -> Diagnostic {
    cx.err(
        "onnx-unsupported-op",
        format!(
            "input {i} ('{}') is computed at run time; {} is only folded at import for now, \
             when its inputs are constants or shape arithmetic (run-time bool and integer \
             tensors come with typed tensors in the JIT)",
            cx.input_name(i).unwrap_or(""),
            cx.node.op_type()
        ),
    )
}

/// Input `i`, which must be known at import time (else the run-time-input error).
fn folded_input(cx: &NodeCtx, i: usize) -> Result<std::rc::Rc<ConstTensor>, Diagnostic> {
    cx.input_name(i).ok_or_else(|| {
        cx.err(
            "onnx-missing-input",
            format!("required input {i} is missing"),
        )
    })?;
    cx.const_input(i)?.ok_or_else(|| runtime_input(cx, i))
}

/// The elements of a constant, by kind.
enum Elems<'a> {
    /// Integer or bool elements.
    Int(&'a [i64]),
    /// float32 elements.
    Float(std::borrow::Cow<'a, [f32]>),
}

fn elems<'a>(c: &'a ConstTensor, what: &str) -> Result<Elems<'a>, String> {
    if let Some(v) = c.i64s() {
        Ok(Elems::Int(v))
    } else if let Some(v) = c.f32s() {
        Ok(Elems::Float(v))
    } else {
        Err(format!(
            "{what} has element type {}, which smelt does not fold (float32, int64, int32, \
             int16, int8, uint16, uint8 and bool are)",
            c.type_name()
        ))
    }
}

/// Refuses a constant of an element type smelt does not fold (float16, float64, string,
/// uint32...), naming the input.
fn check_foldable(cx: &NodeCtx, i: usize, c: &ConstTensor) -> Result<(), Diagnostic> {
    elems(c, &format!("input {i}"))
        .map(|_| ())
        .map_err(|m| cx.err("onnx-unsupported-dtype", m))
}

/// Every input of the node when all are constants (checked foldable); `None` when one is
/// computed at run time.
fn constant_inputs(
    cx: &NodeCtx,
    n: usize,
) -> Result<Option<Vec<std::rc::Rc<ConstTensor>>>, Diagnostic> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        cx.input_name(i).ok_or_else(|| {
            cx.err(
                "onnx-missing-input",
                format!("required input {i} is missing"),
            )
        })?;
        match cx.const_input(i)? {
            Some(c) => {
                check_foldable(cx, i, &c)?;
                out.push(c);
            }
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

/// `op` on the node's first `n` inputs as run-time values (constants among them become
/// weights of their own element type).
fn at_run_time(cx: &mut NodeCtx, op: Op, n: usize) -> Result<Vec<Entry>, Diagnostic> {
    let values = (0..n).map(|i| cx.value(i)).collect::<Result<Vec<_>, _>>()?;
    Ok(vec![Entry::Value(cx.emit(op, &values)?)])
}

/// The ONNX type code of a constant as written in messages and results (an unset code
/// on a float32 tensor is float32).
fn type_code(c: &ConstTensor) -> i32 {
    if c.onnx_type == 0 && c.is_f32() {
        dtype::FLOAT
    } else {
        c.onnx_type
    }
}

// ---------------------------------------------------------------------------------------
// Cast

/// The element types Cast folds to.
const CAST_TARGETS: [i32; 10] = [
    dtype::FLOAT,
    dtype::FLOAT16,
    dtype::BFLOAT16,
    dtype::INT64,
    dtype::INT32,
    dtype::INT16,
    dtype::INT8,
    dtype::UINT16,
    dtype::UINT8,
    dtype::BOOL,
];

/// Refuses a Cast target type smelt does not fold to.
fn check_cast_target(to: i32) -> Result<(), String> {
    if CAST_TARGETS.contains(&to) {
        return Ok(());
    }
    Err(format!(
        "casting to {} is not supported (smelt folds casts to float32, float16, \
         bfloat16, int64, int32, int16, int8, uint16, uint8 and bool)",
        dtype::name(to)
    ))
}

/// `v` reduced to the bits of integer type `to`, reinterpreted in two's complement (the
/// ONNX rule for integer to integer casts out of range, as numpy's `astype`).
fn wrap_int(v: i64, to: i32) -> i64 {
    match to {
        dtype::INT32 => v as i32 as i64,
        dtype::INT16 => v as i16 as i64,
        dtype::INT8 => v as i8 as i64,
        dtype::UINT16 => v as u16 as i64,
        dtype::UINT8 => v as u8 as i64,
        dtype::BOOL => i64::from(v != 0),
        _ => v,
    }
}

/// ONNX Cast on a constant: floats to integers truncate toward zero (NaN or a value out of
/// the target's range is an error: ONNX leaves it undefined), integers to narrower
/// integers keep the low bits (two's complement), anything to bool is `x != 0` (NaN is
/// true), bool to numbers is 0 or 1, integers to float32 round to nearest; float16 and
/// bfloat16 go through float32 (exact from them, one rounding to them).
pub fn cast_const(c: &ConstTensor, to: i32) -> Result<ConstTensor, String> {
    check_cast_target(to)?;
    if dtype::is_narrow_float(to) {
        // to float32 (exact from the 2-byte floats, rounding from integers), then one
        // rounding to the narrow type
        let wide = cast_const(c, dtype::FLOAT)?;
        return wide
            .as_float_type(to)
            .ok_or_else(|| format!("internal: no {} of {}", dtype::name(to), c.type_name()));
    }
    let data = match (elems(c, "the input")?, to) {
        (Elems::Float(v), dtype::FLOAT) => ConstData::F32(v.into_owned()),
        (Elems::Float(v), dtype::BOOL) => {
            ConstData::I64(v.iter().map(|&x| i64::from(x != 0.0)).collect())
        }
        (Elems::Float(v), _) => {
            let (lo, hi) = dtype::int_range(to).unwrap_or((i64::MIN, i64::MAX));
            let mut out = Vec::with_capacity(v.len());
            for &x in v.iter() {
                let t = f64::from(x).trunc();
                // i64::MAX as f64 rounds up to 2^63, itself out of range: compare below it
                let fits = t >= lo as f64 && (t < hi as f64 || (hi < 1 << 53 && t <= hi as f64));
                if !fits {
                    return Err(format!(
                        "{x} has no {} value (NaN and values out of range are undefined \
                         in ONNX's Cast; smelt refuses them)",
                        dtype::name(to)
                    ));
                }
                out.push(t as i64);
            }
            ConstData::I64(out)
        }
        (Elems::Int(v), dtype::FLOAT) => ConstData::F32(v.iter().map(|&x| x as f32).collect()),
        (Elems::Int(v), _) => ConstData::I64(v.iter().map(|&x| wrap_int(x, to)).collect()),
    };
    Ok(ConstTensor {
        dims: c.dims.clone(),
        data,
        onnx_type: to,
    })
}

/// Cast (from version 6, `to` an integer type code) and CastLike (the type of input 1).
/// `saturate` and `round_mode` concern float8 and float4 targets only, which smelt does
/// not cast to.
pub fn cast(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["to", "saturate", "round_mode"])?;
    let to = if cx.node.op_type() == "CastLike" {
        match cx.const_input(1)? {
            Some(like) => type_code(&like),
            None => {
                let like = cx.value(1)?;
                dtype::of_ir(cx.type_of(like).dtype)
            }
        }
    } else {
        let to = cx
            .attr_int("to")?
            .ok_or_else(|| cx.bad_attr("to", "is required"))?;
        i32::try_from(to).map_err(|_| cx.bad_attr("to", format!("{to} is not a type code")))?
    };
    match cx.const_input(0)? {
        Some(c) => {
            let out = cast_const(&c, to).map_err(|m| cx.err("onnx-unsupported-dtype", m))?;
            Ok(vec![Entry::constant(out)])
        }
        None => {
            let x = cx.value(0)?;
            let target = dtype::ir(to).ok_or_else(|| {
                cx.err(
                    "onnx-unsupported-dtype",
                    format!(
                        "input 0 ('{}') is computed at run time, and casting it to {} is not \
                         supported (run-time tensors are float32, float16, bfloat16, int64, int32, \
                         int16, uint16, int8, uint8 and bool)",
                        cx.input_name(0).unwrap_or(""),
                        dtype::name(to)
                    ),
                )
            })?;
            if cx.type_of(x).dtype == target {
                return Ok(vec![Entry::Value(x)]);
            }
            Ok(vec![Entry::Value(cx.emit(Op::Cast { to: target }, &[x])?)])
        }
    }
}

// ---------------------------------------------------------------------------------------
// Elementwise folding with broadcasting

/// `f` on the elements of `inputs` broadcast together, for any number of inputs.
fn broadcast_map<T>(
    inputs: &[&ConstTensor],
    mut f: impl FnMut(&[usize]) -> Result<T, String>,
) -> Result<(Vec<usize>, Vec<T>), String> {
    let mut dims: Vec<usize> = Vec::new();
    for c in inputs {
        dims = broadcast(&dims, &c.dims)?;
    }
    let count = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
        .filter(|&n| n <= MAX_FOLDED_ELEMENTS)
        .ok_or_else(|| format!("the broadcast shape {dims:?} is too large to fold"))?;
    let indices: Vec<Vec<usize>> = inputs
        .iter()
        .map(|c| broadcast_indices(&c.dims, &dims))
        .collect();
    let mut at = vec![0usize; inputs.len()];
    let mut out = Vec::with_capacity(count as usize);
    for k in 0..count as usize {
        for (a, ix) in at.iter_mut().zip(&indices) {
            *a = ix[k];
        }
        out.push(f(&at)?);
    }
    Ok((dims, out))
}

/// Both operands' elements, which must be of one type.
fn same_type<'a>(a: &'a ConstTensor, b: &'a ConstTensor) -> Result<(Elems<'a>, Elems<'a>), String> {
    if type_code(a) != type_code(b) {
        return Err(format!(
            "operands have element types {} and {}; ONNX requires one type",
            a.type_name(),
            b.type_name()
        ));
    }
    Ok((elems(a, "input 0")?, elems(b, "input 1")?))
}

/// A comparison on constants (float NaN compares false, as IEEE says).
fn compare_const(op: &str, a: &ConstTensor, b: &ConstTensor) -> Result<ConstTensor, String> {
    fn test<T: PartialOrd>(op: &str, x: T, y: T) -> bool {
        match op {
            "Equal" => x == y,
            "Less" => x < y,
            "Greater" => x > y,
            "LessOrEqual" => x <= y,
            _ => x >= y,
        }
    }
    let (dims, v) = match same_type(a, b)? {
        (Elems::Int(x), Elems::Int(y)) => {
            broadcast_map(&[a, b], |ix| Ok(test(op, x[ix[0]], y[ix[1]])))?
        }
        (Elems::Float(x), Elems::Float(y)) => {
            broadcast_map(&[a, b], |ix| Ok(test(op, x[ix[0]], y[ix[1]])))?
        }
        _ => return Err("operands mix integer and float elements".into()),
    };
    Ok(ConstTensor::bool(dims, v))
}

/// Equal, Less, Greater, LessOrEqual, GreaterOrEqual (numpy broadcasting, version 7 on):
/// bool constants.
pub fn compare(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let Some(inputs) = constant_inputs(cx, 2)? else {
        let c = match cx.node.op_type() {
            "Equal" => Comparison::Equal,
            "Less" => Comparison::Less,
            "Greater" => Comparison::Greater,
            "LessOrEqual" => Comparison::LessOrEqual,
            _ => Comparison::GreaterOrEqual,
        };
        return at_run_time(cx, Op::Compare(c), 2);
    };
    let [a, b] = <[_; 2]>::try_from(inputs).map_err(|_| runtime_input(cx, 1))?;
    let out = compare_const(cx.node.op_type(), &a, &b).map_err(|m| cx.err("onnx-bad-model", m))?;
    Ok(vec![Entry::constant(out)])
}

/// The bool elements of input `i`, which must be a bool constant.
fn bools<'a>(cx: &NodeCtx, i: usize, c: &'a ConstTensor) -> Result<&'a [i64], Diagnostic> {
    match c.i64s() {
        Some(v) if c.is_bool() => Ok(v),
        _ => Err(cx.err(
            "onnx-bad-model",
            format!("input {i} must be bool, got {}", c.type_name()),
        )),
    }
}

/// Not, And, Or, Xor on bool constants (broadcasting from version 7).
pub fn logical(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let op = cx.node.op_type();
    let arity = if op == "Not" { 1 } else { 2 };
    if constant_inputs(cx, arity)?.is_none() {
        let ir = match op {
            "Not" => Op::Not,
            "And" => Op::Logic(LogicOp::And),
            "Or" => Op::Logic(LogicOp::Or),
            _ => Op::Logic(LogicOp::Xor),
        };
        return at_run_time(cx, ir, arity);
    }
    let a = folded_input(cx, 0)?;
    let x = bools(cx, 0, &a)?;
    if op == "Not" {
        let v = x.iter().map(|&b| b == 0).collect();
        return Ok(vec![Entry::constant(ConstTensor::bool(a.dims.clone(), v))]);
    }
    let b = folded_input(cx, 1)?;
    let y = bools(cx, 1, &b)?;
    let (dims, v) = broadcast_map(&[&a, &b], |ix| {
        let (p, q) = (x[ix[0]] != 0, y[ix[1]] != 0);
        Ok(match op {
            "And" => p && q,
            "Or" => p || q,
            _ => p != q,
        })
    })
    .map_err(|m| cx.err("onnx-bad-model", m))?;
    Ok(vec![Entry::constant(ConstTensor::bool(dims, v))])
}

/// BitwiseNot, BitwiseAnd, BitwiseOr, BitwiseXor and BitShift (`direction` LEFT or RIGHT)
/// on integers of one type (broadcasting). On constants folded for every integer type:
/// elements are held widened to i64 (sign-extended when signed, zero-extended when not),
/// which And, Or and Xor keep; Not's result is cut back to the unsigned types' width and
/// the shifts wrap to the type's ([`LogicOp::eval_int`]: an amount outside the width
/// shifts every bit out). On run-time int64 and int32 data they are the IR's `not`, `and`,
/// `or`, `xor`, `shift_left` and `shift_right`.
pub fn bitwise(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    let op_type = cx.node.op_type();
    let op = match op_type {
        "BitShift" => {
            cx.check_attrs(&["direction"])?;
            match cx.attr_string("direction")?.as_deref() {
                Some("LEFT") => Some(LogicOp::ShiftLeft),
                Some("RIGHT") => Some(LogicOp::ShiftRight),
                other => {
                    return Err(cx.bad_attr(
                        "direction",
                        format!("{other:?} must be \"LEFT\" or \"RIGHT\""),
                    ))
                }
            }
        }
        "BitwiseAnd" => Some(LogicOp::And),
        "BitwiseOr" => Some(LogicOp::Or),
        "BitwiseXor" => Some(LogicOp::Xor),
        _ => None,
    };
    if op_type != "BitShift" {
        cx.check_attrs(&[])?;
    }
    let arity = if op.is_some() { 2 } else { 1 };
    cx.check_max_inputs(arity)?;
    let Some(inputs) = constant_inputs(cx, arity)? else {
        for i in 0..arity {
            let v = cx.value(i)?;
            let d = cx.type_of(v).dtype;
            if !d.is_integer() {
                return Err(cx.err(
                    "onnx-unsupported-dtype",
                    format!(
                        "input {i} is {d} at run time: smelt's run-time bitwise ops take int64 \
                         and int32 (other integer types are folded on constants only)"
                    ),
                ));
            }
        }
        return at_run_time(cx, op.map_or(Op::Not, Op::Logic), arity);
    };
    let a = &inputs[0];
    let integer = |i: usize, c: &ConstTensor| match (c.i64s(), c.onnx_type) {
        (Some(v), t) if t != dtype::BOOL => Ok(v.to_vec()),
        _ => Err(cx.err(
            "onnx-unsupported-dtype",
            format!("input {i} must be an integer tensor, got {}", c.type_name()),
        )),
    };
    let x = integer(0, a)?;
    let Some(op) = op else {
        let mask = match a.onnx_type {
            dtype::UINT8 => 0xff,
            dtype::UINT16 => 0xffff,
            _ => -1,
        };
        let v = x.iter().map(|&e| !e & mask).collect();
        return Ok(vec![Entry::constant(ConstTensor {
            onnx_type: a.onnx_type,
            ..ConstTensor::i64(a.dims.clone(), v)
        })]);
    };
    let b = &inputs[1];
    let y = integer(1, b)?;
    if a.onnx_type != b.onnx_type {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "inputs of types {} and {} must have one type",
                a.type_name(),
                b.type_name()
            ),
        ));
    }
    let (bits, signed) = match dtype::int_range(a.onnx_type) {
        // the range holds 2^bits values
        Some((lo, hi)) => (
            ((i128::from(hi) - i128::from(lo)) as u128 + 1).trailing_zeros(),
            lo < 0,
        ),
        None => (64, true),
    };
    let (dims, v) = broadcast_map(&[a, b], |ix| {
        Ok(op.eval_int(x[ix[0]], y[ix[1]], bits, signed))
    })
    .map_err(|m| cx.err("onnx-bad-model", m))?;
    Ok(vec![Entry::constant(ConstTensor {
        onnx_type: a.onnx_type,
        ..ConstTensor::i64(dims, v)
    })])
}

/// Where(condition, x, y) on constants, with three-way broadcasting.
pub fn where_(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let Some(inputs) = constant_inputs(cx, 3)? else {
        return at_run_time(cx, Op::Where, 3);
    };
    let [c, x, y] = <[_; 3]>::try_from(inputs).map_err(|_| runtime_input(cx, 2))?;
    let cond = bools(cx, 0, &c)?;
    let bad = |m: String| cx.err("onnx-bad-model", m);
    let pick = |ix: &[usize]| cond[ix[0]] != 0;
    let out = match same_type(&x, &y).map_err(bad)? {
        (Elems::Int(a), Elems::Int(b)) => {
            let (dims, v) = broadcast_map(&[&c, &x, &y], |ix| {
                Ok(if pick(ix) { a[ix[1]] } else { b[ix[2]] })
            })
            .map_err(bad)?;
            ConstTensor {
                onnx_type: x.onnx_type,
                ..ConstTensor::i64(dims, v)
            }
        }
        (Elems::Float(a), Elems::Float(b)) => {
            let (dims, v) = broadcast_map(&[&c, &x, &y], |ix| {
                Ok(if pick(ix) { a[ix[1]] } else { b[ix[2]] })
            })
            .map_err(bad)?;
            ConstTensor::f32(dims, v)
        }
        _ => return Err(bad("x and y mix integer and float elements".into())),
    };
    Ok(vec![Entry::constant(out)])
}

// ---------------------------------------------------------------------------------------
// Range, Size

/// The single element of a Range operand.
fn scalar_of<'a>(cx: &NodeCtx, i: usize, c: &'a ConstTensor) -> Result<Elems<'a>, Diagnostic> {
    if c.len() != 1 {
        return Err(cx.err(
            "onnx-bad-model",
            format!("input {i} must be a scalar, got shape {:?}", c.dims),
        ));
    }
    elems(c, &format!("input {i}")).map_err(|m| cx.err("onnx-unsupported-dtype", m))
}

/// The element count `max(ceil((limit - start) / delta), 0)` of an integer Range, exact.
fn int_range_len(start: i64, limit: i64, delta: i64) -> Result<u64, String> {
    if delta == 0 {
        return Err("delta is 0, so the range never reaches its limit".into());
    }
    let (span, step) = (i128::from(limit) - i128::from(start), i128::from(delta));
    // ceil division for either sign of step
    let n = if (span > 0) == (step > 0) && span != 0 {
        (span.abs() + step.abs() - 1) / step.abs()
    } else {
        0
    };
    u64::try_from(n).map_err(|_| "the range is too long".into())
}

/// The element count of a float32 Range (`ceil((limit - start) / delta)` in f64).
fn float_range_len(start: f32, limit: f32, delta: f32) -> Result<u64, String> {
    if delta == 0.0 {
        return Err("delta is 0, so the range never reaches its limit".into());
    }
    if !(start.is_finite() && limit.is_finite() && delta.is_finite()) {
        return Err(format!(
            "start {start}, limit {limit} and delta {delta} must be finite"
        ));
    }
    let n = ((f64::from(limit) - f64::from(start)) / f64::from(delta)).ceil();
    Ok(if n > 0.0 {
        n.min(u64::MAX as f64) as u64
    } else {
        0
    })
}

/// Range(start, limit, delta) on scalar constants: `start + i·delta` while it is short of
/// `limit`. A zero delta and a range longer than the largest tensor are errors, found
/// before anything is allocated.
pub fn range(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    // stash_type is the compute type of float16/bfloat16 ranges, which smelt does not fold
    cx.check_attrs(&["stash_type"])?;
    let start = folded_input(cx, 0)?;
    let limit = folded_input(cx, 1)?;
    let delta = folded_input(cx, 2)?;
    let bad = |m: String| cx.err("onnx-bad-model", m);
    for (i, c) in [(1, &limit), (2, &delta)] {
        if type_code(c) != type_code(&start) {
            return Err(bad(format!(
                "input {i} has element type {}, input 0 {}; ONNX requires one type",
                c.type_name(),
                start.type_name()
            )));
        }
    }
    let too_long = |n: u64| -> Result<usize, Diagnostic> {
        if n > MAX_FOLDED_ELEMENTS {
            return Err(bad(format!(
                "the range has {n} elements, more than the {MAX_FOLDED_ELEMENTS} smelt folds"
            )));
        }
        Ok(n as usize)
    };
    let out = match (
        scalar_of(cx, 0, &start)?,
        scalar_of(cx, 1, &limit)?,
        scalar_of(cx, 2, &delta)?,
    ) {
        (Elems::Int(s), Elems::Int(l), Elems::Int(d)) => {
            let (s, l, d) = (s[0], l[0], d[0]);
            let n = too_long(int_range_len(s, l, d).map_err(bad)?)?;
            // every element lies between start and limit, so none overflows
            // wrapping: `i·d` alone may leave i64 when start is near its minimum
            let v = (0..n as i64)
                .map(|i| s.wrapping_add(i.wrapping_mul(d)))
                .collect();
            ConstTensor {
                onnx_type: start.onnx_type,
                ..ConstTensor::i64(vec![n], v)
            }
        }
        (Elems::Float(s), Elems::Float(l), Elems::Float(d)) => {
            let (s, l, d) = (s[0], l[0], d[0]);
            let n = too_long(float_range_len(s, l, d).map_err(bad)?)?;
            let v = (0..n).map(|i| s + i as f32 * d).collect();
            ConstTensor::f32(vec![n], v)
        }
        _ => return Err(bad("inputs mix integer and float elements".into())),
    };
    Ok(vec![Entry::constant(out)])
}

/// Size: the element count of the input (static, so always a constant int64 scalar).
pub fn size(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let n = cx
        .dims(0)?
        .iter()
        .try_fold(1i64, |a, &d| a.checked_mul(d as i64))
        .ok_or_else(|| cx.err("onnx-bad-model", "the element count overflows int64"))?;
    Ok(vec![Entry::constant(ConstTensor::i64(vec![], vec![n]))])
}

// ---------------------------------------------------------------------------------------
// Min, Max, Mod

/// Min and Max of one or more inputs (numpy broadcasting, version 8 on): folded when every
/// input is constant (integers exactly), a chain of `min`/`max` ops on float32 values
/// otherwise.
pub fn min_max(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let is_max = cx.node.op_type() == "Max";
    let n = cx.num_inputs();
    if n == 0 {
        return Err(cx.err("onnx-missing-input", "needs at least one input"));
    }
    let consts = (0..n)
        .map(|i| cx.const_input(i))
        .collect::<Result<Vec<_>, _>>()?;
    if consts.iter().all(Option::is_some) {
        let parts: Vec<&ConstTensor> = consts.iter().flatten().map(|c| &**c).collect();
        for (i, p) in parts.iter().enumerate() {
            check_foldable(cx, i, p)?;
        }
        let mut acc = parts[0].clone();
        for p in &parts[1..] {
            if type_code(p) != type_code(&acc) {
                return Err(cx.err(
                    "onnx-bad-model",
                    format!(
                        "inputs have element types {} and {}; ONNX requires one type",
                        acc.type_name(),
                        p.type_name()
                    ),
                ));
            }
            acc = ConstTensor::binary(
                &acc,
                p,
                |x, y| Ok(if is_max { x.max(y) } else { x.min(y) }),
                // NaN propagates, as in numpy and ONNX Runtime
                |x, y| {
                    if x.is_nan() || y.is_nan() {
                        f32::NAN
                    } else if is_max {
                        x.max(y)
                    } else {
                        x.min(y)
                    }
                },
            )
            .map_err(|m| cx.err("onnx-bad-model", m))?;
        }
        return Ok(vec![Entry::constant(acc)]);
    }
    let op = if is_max { BinaryOp::Max } else { BinaryOp::Min };
    let mut acc = cx.value(0)?;
    for i in 1..n {
        let v = cx.value(i)?;
        acc = cx.emit(Op::Binary(op), &[acc, v])?;
    }
    Ok(vec![Entry::Value(acc)])
}

/// Integer Mod: `fmod = 0` takes the divisor's sign (floor), `fmod = 1` the dividend's
/// (truncation); a zero divisor is an error.
fn int_mod(x: i64, y: i64, fmod: bool) -> Result<i64, String> {
    let r = x
        .checked_rem(y)
        .ok_or_else(|| format!("{x} mod {y} divides by zero or overflows"))?;
    Ok(if !fmod && r != 0 && ((r < 0) != (y < 0)) {
        r + y
    } else {
        r
    })
}

/// Mod (version 10 on): integers exactly; floats only with `fmod = 1` (C's `fmod`), the
/// one form ONNX defines for every float. Folded on constants; a run-time `mod` op
/// otherwise (whose type rule refuses float inputs without `fmod`).
pub fn mod_(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["fmod"])?;
    let fmod = cx.attr_bool("fmod", false)?;
    let Some(inputs) = constant_inputs(cx, 2)? else {
        return at_run_time(cx, Op::Mod { fmod }, 2);
    };
    for (i, c) in inputs.iter().enumerate() {
        check_foldable(cx, i, c)?;
    }
    let [a, b] = <[_; 2]>::try_from(inputs).map_err(|_| runtime_input(cx, 1))?;
    if type_code(&a) != type_code(&b) {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "operands have element types {} and {}; ONNX requires one type",
                a.type_name(),
                b.type_name()
            ),
        ));
    }
    if a.is_f32() && !fmod {
        return Err(cx.bad_attr("fmod", "must be 1 for float inputs"));
    }
    let out = ConstTensor::binary(&a, &b, |x, y| int_mod(x, y, fmod), |x, y| x % y)
        .map_err(|m| cx.err("onnx-bad-model", m))?;
    Ok(vec![Entry::constant(out)])
}

/// IsNaN: `not(equal(x, x))` at run time, since NaN is the only value unequal to itself
/// (the JIT's float compare is ordered, as the interpreter's is); constants fold.
pub fn is_nan(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let x = match float_test_input(cx, f32::is_nan)? {
        FloatTest::Folded(entries) => return Ok(entries),
        FloatTest::RunTime(x) => x,
    };
    let equal = cx.emit(Op::Compare(Comparison::Equal), &[x, x])?;
    Ok(vec![Entry::Value(cx.emit(Op::Not, &[equal])?)])
}

/// Input 0 of a float32 test (IsNaN, IsInf): a constant folds to its bool result, else
/// the run-time float32 value the test compares.
enum FloatTest {
    Folded(Vec<Entry>),
    RunTime(smelt_ir::Value),
}

fn float_test_input(cx: &mut NodeCtx, test: impl Fn(f32) -> bool) -> Result<FloatTest, Diagnostic> {
    if let Some(c) = cx.const_input(0)? {
        let Some(v) = c.f32s() else {
            return Err(cx.err(
                "onnx-unsupported-dtype",
                format!("input 0 must be float32, got {}", c.type_name()),
            ));
        };
        let flags = v.iter().map(|&x| test(x)).collect();
        return Ok(FloatTest::Folded(vec![Entry::constant(ConstTensor::bool(
            c.dims.clone(),
            flags,
        ))]));
    }
    let x = cx.value(0)?;
    let dtype = cx.type_of(x).dtype;
    if dtype != smelt_ir::DType::F32 {
        return Err(cx.err(
            "onnx-unsupported-dtype",
            format!("input 0 must be float32, got {}", dtype.name()),
        ));
    }
    Ok(FloatTest::RunTime(x))
}

/// IsInf: `x == +inf` and/or `x == -inf` by `detect_positive` and `detect_negative` (both
/// by default: `|x| == inf`; neither: every element false, as `x == NaN` is), folded on a
/// constant input.
pub fn is_inf(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["detect_negative", "detect_positive"])?;
    let positive = cx.attr_bool("detect_positive", true)?;
    let negative = cx.attr_bool("detect_negative", true)?;
    let detects = |v: f32| v.is_infinite() && (if v > 0.0 { positive } else { negative });
    let x = match float_test_input(cx, detects)? {
        FloatTest::Folded(entries) => return Ok(entries),
        FloatTest::RunTime(x) => x,
    };
    let (operand, target) = match (positive, negative) {
        (true, true) => (cx.emit(Op::Unary(UnaryOp::Abs), &[x])?, f32::INFINITY),
        (true, false) => (x, f32::INFINITY),
        (false, true) => (x, f32::NEG_INFINITY),
        (false, false) => (x, f32::NAN),
    };
    let target = cx.scalar(target)?;
    let equal = cx.emit(Op::Compare(Comparison::Equal), &[operand, target])?;
    Ok(vec![Entry::Value(equal)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_to_int_truncates_toward_zero_and_refuses_nan_and_out_of_range() {
        let c = ConstTensor::f32(vec![4], vec![2.9, -2.9, 0.5, -0.0]);
        let i = cast_const(&c, dtype::INT64).unwrap();
        assert_eq!(i.i64s(), Some(&[2, -2, 0, 0][..]));
        assert_eq!(i.onnx_type, dtype::INT64);
        for bad in [f32::NAN, f32::INFINITY, 3.0e9, 9.3e18] {
            let to = if bad == 3.0e9 {
                dtype::INT32
            } else {
                dtype::INT64
            };
            assert!(cast_const(&ConstTensor::f32(vec![1], vec![bad]), to).is_err());
        }
        let u8s = cast_const(&ConstTensor::f32(vec![2], vec![255.7, -0.5]), dtype::UINT8);
        assert_eq!(u8s.unwrap().i64s(), Some(&[255, 0][..]));
    }

    #[test]
    fn int_casts_wrap_and_bool_casts_test_nonzero() {
        let big = ConstTensor::i64(vec![3], vec![(1 << 40) + 1, 200, -1]);
        let i32s = cast_const(&big, dtype::INT32).unwrap();
        assert_eq!(i32s.i64s(), Some(&[1, 200, -1][..]));
        let i8s = cast_const(&big, dtype::INT8).unwrap();
        assert_eq!(i8s.i64s(), Some(&[1, -56, -1][..]));
        let b = cast_const(
            &ConstTensor::f32(vec![3], vec![0.0, f32::NAN, -0.0]),
            dtype::BOOL,
        );
        assert_eq!(b.unwrap().i64s(), Some(&[0, 1, 0][..]));
        let f = cast_const(
            &ConstTensor::i64(vec![1], vec![(1 << 24) + 1]),
            dtype::FLOAT,
        );
        assert_eq!(f.unwrap().f32s().unwrap()[0], 16_777_216.0);
        // float16 folds round through float32: 2^40 + 1 overflows to infinity; 0.1 as
        // bfloat16 is 0x3dcd (0.10009765625)
        let h = cast_const(&big, dtype::FLOAT16).unwrap();
        assert_eq!(h.onnx_type, dtype::FLOAT16);
        assert_eq!(h.f32s().unwrap()[..], [f32::INFINITY, 200.0, -1.0]);
        let tenth = ConstTensor::f32(vec![1], vec![0.1]);
        let b = cast_const(&tenth, dtype::BFLOAT16).unwrap();
        assert_eq!(b.f32s().unwrap()[0].to_bits(), 0x3dcd_0000);
        assert!(cast_const(&big, 11).is_err());
        assert!(cast_const(&big, 8).is_err());
    }

    #[test]
    fn range_lengths_are_exact_and_refuse_zero_steps() {
        assert_eq!(int_range_len(0, 5, 2), Ok(3));
        assert_eq!(int_range_len(10, 4, -3), Ok(2));
        assert_eq!(int_range_len(0, 5, -1), Ok(0));
        assert_eq!(int_range_len(i64::MIN, i64::MAX, 1), Ok(u64::MAX));
        assert!(int_range_len(0, 5, 0).is_err());
        assert_eq!(float_range_len(1.0, 5.0, 2.0), Ok(2));
        assert!(float_range_len(1.0, 5.0, 0.0).is_err());
    }

    #[test]
    fn modulo_signs_follow_fmod() {
        assert_eq!(int_mod(-4, 3, false), Ok(2));
        assert_eq!(int_mod(4, -3, false), Ok(-2));
        assert_eq!(int_mod(-4, 3, true), Ok(-1));
        assert!(int_mod(1, 0, false).is_err());
        assert!(int_mod(i64::MIN, -1, false).is_err());
    }

    #[test]
    fn comparisons_broadcast_to_bools() {
        let a = ConstTensor::i64(vec![2, 1], vec![1, 5]);
        let b = ConstTensor::i64(vec![3], vec![1, 2, 5]);
        let lt = compare_const("Less", &a, &b).unwrap();
        assert_eq!(lt.dims, vec![2, 3]);
        assert!(lt.is_bool());
        assert_eq!(lt.i64s(), Some(&[0, 1, 1, 0, 0, 0][..]));
        let nan = ConstTensor::f32(vec![1], vec![f32::NAN]);
        assert_eq!(
            compare_const("Equal", &nan, &nan).unwrap().i64s(),
            Some(&[0][..])
        );
        let i32s = ConstTensor {
            onnx_type: dtype::INT32,
            ..ConstTensor::i64(vec![1], vec![1])
        };
        assert!(compare_const("Equal", &a, &i32s).is_err());
    }
}
