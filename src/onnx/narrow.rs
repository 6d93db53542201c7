//! float16 and bfloat16 nodes computed in f32: the inputs widened, the op imported as
//! for float32, the float results rounded back to the node's type.
//!
//! smelt's ops compute on f32 only; the 2-byte floats are storage types that `cast`
//! and data movement take. Widening is exact, and for `+ - * /` and `sqrt` one rounding
//! of the f32 result to f16 or bf16 is what computing in the narrow type gives (f32
//! has more than twice their precision plus two bits), so a node computed this way
//! matches a runtime that computes in f16; longer computations (a reduction, a
//! softmax) are only more accurate. The casts are ordinary `cast` ops, which lowering
//! compiles into their own kernels. Data movement (Reshape, Transpose, Concat, ...)
//! moves the 2-byte elements as they are.

use smelt_ir::op::Op;
use smelt_ir::{DType, Diagnostic};

use super::context::{Entry, Importer};
use super::proto::NodeProto;
use super::tensor::dtype;

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

/// The suffix of the names under which widened inputs are entered; [`plain_names`]
/// takes it out of messages, which speak of the model's tensors.
const WIDE_SUFFIX: &str = " (as float32)";

/// `message` speaking of the widened inputs by their names in the model.
pub(super) fn plain_names(message: &str) -> String {
    message.replace(WIDE_SUFFIX, "")
}

/// What [`widen_inputs`] made of a node with float16 or bfloat16 inputs.
pub(super) struct Widened {
    /// The node reading f32 versions of its narrow inputs (under derived names).
    pub node: NodeProto,
    /// The narrow ONNX type the results are rounded to: the type of the node's first
    /// float input, when that one is narrow and no attribute names the result type.
    pub result_type: Option<i32>,
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
    let result_input = RESULT_INPUT
        .iter()
        .find(|(op, _)| *op == node.op_type())
        .map(|&(_, i)| i);
    let mut first_float = None;
    // the node is copied only when it reads a narrow float (a Constant node's copy
    // would copy its tensor)
    let mut widened: Option<NodeProto> = None;
    for (k, name) in node.input.iter().enumerate() {
        let Some(entry) = (!name.is_empty()).then(|| imp.entries.get(name)).flatten() else {
            continue;
        };
        let entry = entry.clone();
        let Some(ty) = float_type(imp, &entry) else {
            continue;
        };
        if result_input.is_none_or(|i| i == k) {
            first_float.get_or_insert(ty);
        }
        if !dtype::is_narrow_float(ty) {
            continue;
        }
        let wide = match imp.widened.get(name) {
            Some(w) => w.clone(),
            None => {
                // a name no tensor of the model has (a model may use any string)
                let mut wide = format!("{name}{WIDE_SUFFIX}");
                let mut k = 1;
                while imp.entries.contains_key(&wide) {
                    wide = format!("{name}{WIDE_SUFFIX} {k}");
                    k += 1;
                }
                let e = match entry {
                    Entry::Value(v) => {
                        Entry::Value(imp.builder.op(Op::Cast { to: DType::F32 }, &[v])?)
                    }
                    Entry::Const(c) => match c.as_float_type(dtype::FLOAT) {
                        Some(w) => Entry::constant(w),
                        None => continue,
                    },
                    Entry::Dropped { .. } => continue,
                };
                imp.entries.insert(wide.clone(), e);
                imp.widened.insert(name.clone(), wide.clone());
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
    let result_type = first_float.filter(|&t| dtype::is_narrow_float(t) && !names_result_type);
    Ok(Some(Widened {
        node: widened,
        result_type,
    }))
}

/// The results of a widened node rounded to its type `code`: each float32 value by a
/// `cast`, each float32 constant by rounding its elements; other results as they are.
pub(super) fn narrow_results(
    imp: &mut Importer,
    outputs: Vec<Entry>,
    code: i32,
) -> Result<Vec<Entry>, Diagnostic> {
    let Some(to) = dtype::ir(code) else {
        return Ok(outputs);
    };
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
