//! float16 and bfloat16 nodes computed in f32, and int8, uint8, int16 and uint16 nodes
//! computed in i32: the inputs widened, the op imported as for float32 or int32, the
//! results rounded or wrapped back to the node's type.
//!
//! smelt's ops compute on f32 only; the 2-byte floats are storage types that `cast`
//! and data movement take. Widening is exact, and for `+ - * /` and `sqrt` one rounding
//! of the f32 result to f16 or bf16 is what computing in the narrow type gives (f32
//! has more than twice their precision plus two bits), so a node computed this way
//! matches a runtime that computes in f16; longer computations (a reduction, a
//! softmax) are only more accurate. The casts are ordinary `cast` ops, which lowering
//! compiles into their own kernels. Data movement (Reshape, Transpose, Concat, ...)
//! moves the 2-byte elements as they are.
//!
//! The narrow integers widen to i32 exactly (sign- or zero-extended by `cast`), and the
//! i32 results are cast back, keeping the low bits: ONNX's integer arithmetic is modular,
//! so for `+ - *`, the bitwise ops, Neg and Abs that is exactly the narrow operation.
//! Div and Mod of widened values are the exact quotient and remainder, which fit the
//! narrow type (the one exception, `-128 / -1` in int8, wraps to -128 as in C and
//! numpy); Min, Max, Clip and the comparisons are exact; the shifts of a widened value
//! by 0 to 31 bits keep in their low bits what the narrow shift gives, and a shift by the
//! narrow width or more gives 0 (or the sign) either way — ONNX's rule for BitShift out
//! of range. A node is widened only when it reads a run-time narrow integer: on
//! constants alone the handlers fold in i64 themselves.

use smelt_ir::op::Op;
use smelt_ir::{DType, Diagnostic};

use super::context::{Entry, Importer};
use super::proto::NodeProto;
use super::tensor::{dtype, ConstTensor};

/// Ops that take float16 and bfloat16 tensors as they are: the casts, which convert
/// them, pure data movement, whose IR ops take any element type (moving 2-byte
/// elements is exact and half the traffic of moving their widenings), and control flow,
/// which hands its inputs to a body whose nodes widen them for themselves (a Scan's
/// results have the body's types).
const NATIVE: &[&str] = &[
    "Cast",
    "CastLike",
    "Concat",
    "Flatten",
    "Identity",
    "If",
    "Loop",
    "Scan",
    "Reshape",
    "Squeeze",
    "Transpose",
    "Unsqueeze",
];

/// Attributes that name an op's result type: a node with one gets its results in that
/// type from its handler, never rounded to the inputs' type here.
const RESULT_TYPE_ATTRS: &[&str] = &["dtype", "to", "output_dtype"];

/// Ops whose results take the type of a later input than their first float one (OneHot's
/// `depth` may be a float; its `values` give the result type).
const RESULT_INPUT: &[(&str, usize)] = &[("OneHot", 2)];

/// Ops that take narrow integer tensors as they are, besides [`NATIVE`]:
/// QuantizeLinear and DequantizeLinear, which convert them, and the integer matrix
/// products, which widen their operands themselves and give int32 or quantized results.
const NATIVE_INT: &[&str] = &[
    "ConvInteger",
    "DequantizeLinear",
    "MatMulInteger",
    "QLinearConv",
    "QLinearMatMul",
    "QuantizeLinear",
];

/// Ops that compute on float32 only but define narrow integer inputs: their narrow
/// integers widen to f32 instead (exact: f32 holds every 16-bit integer), and the f32
/// results are cast back (exact for a max pool, whose results are input elements).
const INT_VIA_F32: &[&str] = &["MaxPool"];

/// The suffix of the names under which widened inputs are entered; [`plain_names`]
/// takes it out of messages, which speak of the model's tensors.
const WIDE_SUFFIX: &str = " (as float32)";

/// The suffix of widened narrow integers' names, like [`WIDE_SUFFIX`].
const WIDE_INT_SUFFIX: &str = " (as int32)";

/// `message` speaking of the widened inputs by their names in the model.
pub(super) fn plain_names(message: &str) -> String {
    message
        .replace(WIDE_SUFFIX, "")
        .replace(WIDE_INT_SUFFIX, "")
}

/// What [`widen_inputs`] made of a node with float16 or bfloat16 inputs.
pub(super) struct Widened {
    /// The node reading f32 versions of its narrow inputs (under derived names).
    pub node: NodeProto,
    /// The narrow ONNX type the results are rounded (or wrapped) to: the type of the
    /// node's first float input, when that one is narrow and no attribute names the
    /// result type, else likewise of its first integer input.
    pub result_type: Option<i32>,
    /// The narrow integer type of the inputs widened to i32, if any (for a note on the
    /// node's errors, which speak of the widened types).
    pub widened_int: Option<i32>,
}

/// The note an error of a node whose narrow integers were widened carries.
pub(super) fn widened_note(code: i32) -> String {
    format!(
        "smelt computes {} nodes in int32 (its narrow integers are storage types)",
        dtype::name(code)
    )
}

/// The ONNX integer type of an entry (int64, int32 or a narrow integer; not bool), if it
/// is an integer.
fn int_type(imp: &Importer, e: &Entry) -> Option<i32> {
    match e {
        Entry::Value(v) => {
            let d = imp.builder.type_of(*v).dtype;
            (d.is_integer() || d.is_narrow_int()).then(|| dtype::of_ir(d))
        }
        Entry::Const(c) => match c.onnx_type {
            _ if c.i64s().is_none() => None,
            dtype::BOOL => None,
            0 => Some(dtype::INT64),
            code => Some(code),
        },
        Entry::Dropped { .. } => None,
    }
}

/// Whether an entry is a run-time value of a narrow integer type.
fn is_narrow_int_value(imp: &Importer, e: &Entry) -> bool {
    matches!(e, Entry::Value(v) if imp.builder.type_of(*v).dtype.is_narrow_int())
}

/// The ONNX float type of an entry (float32, float16 or bfloat16), if it is a float.
fn float_type(imp: &Importer, e: &Entry) -> Option<i32> {
    match e {
        Entry::Value(v) => match imp.builder.type_of(*v).dtype {
            d @ (DType::F32 | DType::F16 | DType::BF16) => Some(dtype::of_ir(d)),
            _ => None,
        },
        Entry::Const(c) => matches!(c.onnx_type, dtype::FLOAT | dtype::FLOAT16 | dtype::BFLOAT16)
            .then_some(c.onnx_type),
        Entry::Dropped { .. } => None,
    }
}

/// For a node reading float16 or bfloat16 tensors (other than a cast), the node reading
/// their f32 widenings instead — a `cast` for a run-time value, made once per tensor
/// and shared by every reader, and an exactly widened copy for a constant; `None` when
/// the node reads no narrow float or converts it itself.
pub(super) fn widen_inputs(
    imp: &mut Importer,
    node: &NodeProto,
) -> Result<Option<Widened>, Diagnostic> {
    if NATIVE.contains(&node.op_type()) {
        return Ok(None);
    }
    // narrow integers are widened only for a node that reads one at run time
    let widen_ints = !NATIVE_INT.contains(&node.op_type())
        && node.input.iter().any(|name| {
            imp.entries
                .get(name)
                .is_some_and(|e| is_narrow_int_value(imp, e))
        });
    let result_input = RESULT_INPUT
        .iter()
        .find(|(op, _)| *op == node.op_type())
        .map(|&(_, i)| i);
    let mut first_float = None;
    let mut first_int = None;
    let mut widened_int = None;
    let via_f32 = INT_VIA_F32.contains(&node.op_type());
    // the node is copied only when it reads a narrow float (a Constant node's copy
    // would copy its tensor)
    let mut widened: Option<NodeProto> = None;
    for (k, name) in node.input.iter().enumerate() {
        let Some(entry) = (!name.is_empty()).then(|| imp.entries.get(name)).flatten() else {
            continue;
        };
        let entry = entry.clone();
        let counts = result_input.is_none_or(|i| i == k);
        let (ty, suffix) = match (float_type(imp, &entry), int_type(imp, &entry)) {
            (Some(ty), _) => {
                if counts {
                    first_float.get_or_insert(ty);
                }
                if !dtype::is_narrow_float(ty) {
                    continue;
                }
                (ty, WIDE_SUFFIX)
            }
            (None, Some(ty)) => {
                if counts {
                    first_int.get_or_insert(ty);
                }
                if !widen_ints || !dtype::is_narrow_int(ty) {
                    continue;
                }
                let suffix = if via_f32 {
                    WIDE_SUFFIX
                } else {
                    widened_int.get_or_insert(ty);
                    WIDE_INT_SUFFIX
                };
                (ty, suffix)
            }
            (None, None) => continue,
        };
        // the shared widenings of narrow integers are their i32 ones (an f32 one is made
        // for each reader that wants it)
        let shared = !(via_f32 && dtype::is_narrow_int(ty));
        let wide = match imp.widened.get(name).filter(|_| shared) {
            Some(w) => w.clone(),
            None => {
                // a name no tensor of the model has (a model may use any string)
                let mut wide = format!("{name}{suffix}");
                let mut k = 1;
                while imp.entries.contains_key(&wide) {
                    wide = format!("{name}{suffix} {k}");
                    k += 1;
                }
                let int = dtype::is_narrow_int(ty) && !via_f32;
                let e = match entry {
                    Entry::Value(v) => {
                        let to = if int { DType::I32 } else { DType::F32 };
                        Entry::Value(imp.builder.op(Op::Cast { to }, &[v])?)
                    }
                    Entry::Const(c) if dtype::is_narrow_int(ty) && !int => {
                        let values = c.i64s().unwrap_or_default();
                        Entry::constant(ConstTensor::f32(
                            c.dims.clone(),
                            values.iter().map(|&v| v as f32).collect(),
                        ))
                    }
                    // a narrow integer constant's values are int32 values as they are
                    Entry::Const(c) if int => Entry::constant(ConstTensor {
                        onnx_type: dtype::INT32,
                        ..c.as_ref().clone()
                    }),
                    Entry::Const(c) => match c.as_float_type(dtype::FLOAT) {
                        Some(w) => Entry::constant(w),
                        None => continue,
                    },
                    Entry::Dropped { .. } => continue,
                };
                imp.entries.insert(wide.clone(), e);
                if shared {
                    imp.widened.insert(name.clone(), wide.clone());
                }
                wide
            }
        };
        widened.get_or_insert_with(|| node.clone()).input[k] = wide;
    }
    let Some(widened) = widened else {
        return Ok(None);
    };
    let names_result_type = node
        .attribute
        .iter()
        .any(|a| RESULT_TYPE_ATTRS.contains(&a.name()));
    let result_type = match first_float {
        Some(t) => Some(t).filter(|&t| dtype::is_narrow_float(t)),
        None => first_int.filter(|&t| dtype::is_narrow_int(t)),
    }
    .filter(|_| !names_result_type);
    Ok(Some(Widened {
        node: widened,
        result_type,
        widened_int,
    }))
}

/// The results of a widened node rounded to its type `code`: each float32 value by a
/// `cast`, each float32 constant by rounding its elements; for a narrow integer `code`,
/// each int32 value by a wrapping `cast` (a float32 one by a saturating `cast`: the
/// [`INT_VIA_F32`] ops) and each int32 constant by keeping its values' low bits; other
/// results as they are.
pub(super) fn narrow_results(
    imp: &mut Importer,
    outputs: Vec<Entry>,
    code: i32,
) -> Result<Vec<Entry>, Diagnostic> {
    let Some(to) = dtype::ir(code) else {
        return Ok(outputs);
    };
    if dtype::is_narrow_int(code) {
        return outputs
            .into_iter()
            .map(|e| {
                Ok(match e {
                    Entry::Value(v)
                        if matches!(imp.builder.type_of(v).dtype, DType::I32 | DType::F32) =>
                    {
                        Entry::Value(imp.builder.op(Op::Cast { to }, &[v])?)
                    }
                    Entry::Const(c) if c.onnx_type == dtype::INT32 => {
                        match super::ops::logic::cast_const(&c, code) {
                            Ok(n) => Entry::constant(n),
                            Err(_) => Entry::Const(c),
                        }
                    }
                    other => other,
                })
            })
            .collect();
    }
    outputs
        .into_iter()
        .map(|e| {
            Ok(match e {
                Entry::Value(v) if imp.builder.type_of(v).dtype == DType::F32 => {
                    Entry::Value(imp.builder.op(Op::Cast { to }, &[v])?)
                }
                Entry::Const(c) if c.onnx_type == dtype::FLOAT => match c.as_float_type(code) {
                    Some(n) => Entry::constant(n),
                    None => Entry::Const(c),
                },
                other => other,
            })
        })
        .collect()
}
