//! Elementwise ops: Add/Sub/Mul/Div (folded when both operands are constant), Sum,
//! the activations (Neg and Abs also folded on integer constants), Clip and Gelu.

use smelt_ir::op::{BinaryOp, GeluApproximation, Op, UnaryOp};
use smelt_ir::{Diagnostic, Value, F32};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::{dtype, ConstData, ConstTensor};

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "Abs"                 [1, 6, 13],                     from 6  => unary;
    "Acos"                [7, 22],                      from 7  => unary;
    "Acosh"               [9, 22],                      from 9  => unary;
    "Add"                 [1, 6, 7, 13, 14],              from 7  => binary;
    "Asin"                [7, 22],                      from 7  => unary;
    "Asinh"               [9, 22],                      from 9  => unary;
    "Atan"                [7, 22],                      from 7  => unary;
    "Atanh"               [9, 22],                      from 9  => unary;
    "Ceil"                [1, 6, 13],                     from 6  => unary;
    "Celu"                [12, 28],                       from 12 => activation;
    "Clip"                [1, 6, 11, 12, 13],             from 6  => clip;
    "Cos"                 [7, 22],                      from 7  => unary;
    "Cosh"                [9, 22],                      from 9  => unary;
    "Div"                 [1, 6, 7, 13, 14],              from 7  => binary;
    "Elu"                 [1, 6, 22],                     from 6  => activation;
    "Erf"                 [9, 13],                        from 9  => unary;
    "Exp"                 [1, 6, 13],                     from 6  => unary;
    "Floor"               [1, 6, 13],                     from 6  => unary;
    "Gelu"                [20],                           from 20 => gelu;
    "HardSigmoid"         [1, 6, 22],                     from 6  => unary;
    "HardSwish"           [14, 22],                       from 14 => unary;
    "LeakyRelu"           [1, 6, 16],                     from 6  => unary;
    "Log"                 [1, 6, 13],                     from 6  => unary;
    "Mean"                [1, 6, 8, 13],                  from 8  => mean;
    "Mish"                [18, 22],                       from 18 => activation;
    "Mul"                 [1, 6, 7, 13, 14],              from 7  => binary;
    "Neg"                 [1, 6, 13],                     from 6  => unary;
    "PRelu"               [1, 6, 7, 9, 16],               from 7  => activation;
    "Pow"                 [1, 7, 12, 13, 15],             from 7  => pow;
    "Reciprocal"          [1, 6, 13],                     from 6  => unary;
    "Relu"                [1, 6, 13, 14],                 from 6  => unary;
    "Round"               [11, 22],                       from 11 => unary;
    "Selu"                [1, 6, 22],                     from 6  => activation;
    "Shrink"              [9],                          from 9  => shrink;
    "Sigmoid"             [1, 6, 13],                     from 6  => unary;
    "Sign"                [9, 13],                      from 9  => unary;
    "Sin"                 [7, 22],                      from 7  => unary;
    "Sinh"                [9, 22],                      from 9  => unary;
    "Softplus"            [1, 22],                        from 1  => activation;
    "Softsign"            [1, 22],                        from 1  => activation;
    "Sqrt"                [1, 6, 13],                     from 6  => unary;
    "Sub"                 [1, 6, 7, 13, 14],              from 7  => binary;
    "Sum"                 [1, 6, 8, 13],                  from 6  => sum;
    "Swish"               [24],                           from 24 => swish;
    "Tan"                 [7, 22],                      from 7  => unary;
    "Tanh"                [1, 6, 13],                     from 6  => unary;
    "ThresholdedRelu"     [10, 22],                       from 10 => activation;
};

/// Add, Sub, Mul, Div with numpy broadcasting (version 7 on; older versions had the
/// legacy `broadcast`/`axis` attributes).
pub fn binary(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    cx.check_max_inputs(2)?;
    let op = match cx.node.op_type() {
        "Add" => BinaryOp::Add,
        "Sub" => BinaryOp::Sub,
        "Mul" => BinaryOp::Mul,
        _ => BinaryOp::Div,
    };
    if let (Some(a), Some(b)) = (cx.const_input(0)?, cx.const_input(1)?) {
        let folded = fold_binary(op, &a, &b).map_err(|m| cx.err("onnx-bad-model", m))?;
        return Ok(vec![Entry::constant(folded)]);
    }
    let a = cx.value(0)?;
    let b = cx.value(1)?;
    Ok(vec![Entry::Value(cx.emit(Op::Binary(op), &[a, b])?)])
}

/// Pow. A constant exponent whose elements are all 1, 2, 3 (any base type) or -1 is
/// exactly `x`, `x * x`, `x * x * x` or `1 / x`, which is what exporters write (`Pow(x,
/// 2)` in a variance). Any other exponent, constant or computed at run time, takes a
/// float32 base: `|x|^y = exp(y * log|x|)`, and for a negative base the sign ONNX (C's
/// `pow`) gives: negated for an odd integer `y`, NaN for a non-integer one; `y = 0` gives
/// 1 for every base. An integer base needs one of the exact exponents, or a constant
/// integer exponent with the base constant too: two constants fold at import.
pub fn pow(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let exponent = cx.const_input(1)?;
    if let (Some(base), Some(e)) = (cx.const_input(0)?, exponent.as_deref()) {
        let same_kind =
            (base.i64s().is_some() && e.i64s().is_some()) || (base.is_f32() && e.is_f32());
        if !same_kind {
            // mixed constants are computed like run-time values below
            return pow_of_values(cx, exponent.clone());
        }
        let folded = fold_pow(&base, e).map_err(|m| cx.err("onnx-bad-model", m))?;
        return Ok(vec![Entry::constant(folded)]);
    }
    pow_of_values(cx, exponent)
}

/// Pow of a base that is not folded with its exponent (see [`pow`]).
fn pow_of_values(
    cx: &mut NodeCtx,
    exponent: Option<std::rc::Rc<ConstTensor>>,
) -> Result<Vec<Entry>, Diagnostic> {
    let values: Option<Vec<f64>> = match exponent.as_deref() {
        None => None,
        Some(e) => match (e.f32s(), e.i64s()) {
            (Some(v), _) => Some(v.iter().map(|&e| f64::from(e)).collect()),
            (None, Some(v)) => Some(v.iter().map(|&e| e as f64).collect()),
            (None, None) => {
                return Err(cx.err(
                    "onnx-unsupported-dtype",
                    format!("the exponent has element type {}", e.type_name()),
                ))
            }
        },
    };
    let uniform = values.as_deref().and_then(|v| match v.first() {
        Some(&e) if v.iter().all(|&x| x == e) => Some(e),
        _ => None,
    });
    let x = cx.value(0)?;
    let base = cx.type_of(x).clone();
    let exact_ok = match (uniform, exponent.as_deref()) {
        // an exact form only when the exponent does not broadcast the base larger
        (Some(e), Some(t)) if [1.0, 2.0, 3.0, -1.0].contains(&e) => {
            smelt_ir::op::broadcast(&base.dims, &t.dims).ok().as_deref() == Some(&base.dims[..])
                && (e != -1.0 || base.dtype == smelt_ir::DType::F32)
        }
        _ => false,
    };
    if exact_ok {
        let y = match uniform.map_or(0, |e| e as i64) {
            1 => x,
            2 => cx.emit(Op::Binary(BinaryOp::Mul), &[x, x])?,
            3 => {
                let sq = cx.emit(Op::Binary(BinaryOp::Mul), &[x, x])?;
                cx.emit(Op::Binary(BinaryOp::Mul), &[sq, x])?
            }
            _ => cx.emit(Op::Unary(UnaryOp::Reciprocal), &[x])?,
        };
        return Ok(vec![Entry::Value(y)]);
    }
    if base.dtype != smelt_ir::DType::F32 {
        return Err(cx.err(
            "onnx-unsupported-dtype",
            format!(
                "a base of element type {}: smelt computes Pow of integers for constant \
                 exponents 1, 2 and 3, and any other exponent of a float32 base",
                base.dtype
            ),
        ));
    }
    let y = match (exponent.as_deref(), values) {
        (Some(t), Some(v)) => {
            let as_f32 = ConstTensor::f32(t.dims.clone(), v.iter().map(|&e| e as f32).collect());
            let name = cx.derived_name("exponent");
            cx.materialize(&as_f32, &name)?
        }
        _ => {
            let y = cx.value(1)?;
            match cx.type_of(y).dtype {
                smelt_ir::DType::F32 => y,
                _ => cx.emit(
                    Op::Cast {
                        to: smelt_ir::DType::F32,
                    },
                    &[y],
                )?,
            }
        }
    };
    let y = general_pow(cx, x, y)?;
    Ok(vec![Entry::Value(y)])
}

/// Pow of two constants: integers exactly (a negative exponent truncates toward zero as
/// the integer result of C's `pow` does, so only bases 1 and -1 keep a non-zero value;
/// an overflow of the base's type is an error), float32 by `powf`.
fn fold_pow(base: &ConstTensor, e: &ConstTensor) -> Result<ConstTensor, String> {
    let int_pow = |x: i64, y: i64| -> Result<i64, String> {
        let r = match (x, y) {
            (0, ..0) => None,
            (1, _) => Some(1),
            (-1, _) => Some(if y % 2 == 0 { 1 } else { -1 }),
            (_, ..0) => Some(0),
            _ => u32::try_from(y).ok().and_then(|y| x.checked_pow(y)),
        };
        r.ok_or_else(|| format!("integer Pow of {x} by {y} overflows or divides by zero"))
    };
    ConstTensor::binary(base, e, int_pow, f32::powf)
}

/// `x^y` for float32 `x` and `y` (broadcast together) as C's `pow` defines it, from
/// `exp(y * log|x|)`: a negative base gives the negated magnitude for an odd integer
/// `y` and NaN for a non-integer one; `y = 0` gives 1 (even for a zero or NaN base), a
/// zero base to a positive `y` gives 0.
/// Whether `y` is an integer and odd is read by truncating casts through i64; every
/// `|y| >= 2^24` is an even integer in float32, and is taken as one before the cast
/// could saturate. On a constant exponent const_fold computes these masks once.
fn general_pow(cx: &mut NodeCtx, x: Value, y: Value) -> Result<Value, Diagnostic> {
    use smelt_ir::op::{Comparison, LogicOp};
    use smelt_ir::DType;
    let magnitude = cx.emit(Op::Unary(UnaryOp::Abs), &[x])?;
    let log = cx.emit(Op::Unary(UnaryOp::Log), &[magnitude])?;
    let product = cx.emit(Op::Binary(BinaryOp::Mul), &[y, log])?;
    let power = cx.emit(Op::Unary(UnaryOp::Exp), &[product])?;
    // whether `v` is a whole number: truncation through i64 gives it back
    let whole = |cx: &mut NodeCtx, v: Value| -> Result<Value, Diagnostic> {
        let int = cx.emit(Op::Cast { to: DType::I64 }, &[v])?;
        let back = cx.emit(Op::Cast { to: DType::F32 }, &[int])?;
        let same = cx.emit(Op::Compare(Comparison::Equal), &[v, back])?;
        let size = cx.emit(Op::Unary(UnaryOp::Abs), &[v])?;
        let big = cx.scalar(16_777_216.0)?;
        let huge = cx.emit(Op::Compare(Comparison::GreaterOrEqual), &[size, big])?;
        cx.emit(Op::Logic(LogicOp::Or), &[same, huge])
    };
    let integer = whole(cx, y)?;
    let half = cx.scalar(0.5)?;
    let halved = cx.emit(Op::Binary(BinaryOp::Mul), &[y, half])?;
    let even = whole(cx, halved)?;
    let odd = cx.emit(Op::Not, &[even])?;
    let zero = cx.scalar(0.0)?;
    let negative = cx.emit(Op::Compare(Comparison::Less), &[x, zero])?;
    let odd_integer = cx.emit(Op::Logic(LogicOp::And), &[integer, odd])?;
    let flip = cx.emit(Op::Logic(LogicOp::And), &[negative, odd_integer])?;
    let negated = cx.emit(Op::Unary(UnaryOp::Neg), &[power])?;
    let signed = cx.emit(Op::Where, &[flip, negated, power])?;
    let fraction = cx.emit(Op::Not, &[integer])?;
    let undefined = cx.emit(Op::Logic(LogicOp::And), &[negative, fraction])?;
    let nan = cx.scalar(f32::NAN)?;
    let defined = cx.emit(Op::Where, &[undefined, nan, signed])?;
    // a zero base to a positive power is 0, not exp of a huge negative number (the
    // JIT's exp saturates near the smallest normal float rather than reaching zero)
    let zero_base = cx.emit(Op::Compare(Comparison::Equal), &[x, zero])?;
    let positive = cx.emit(Op::Compare(Comparison::Greater), &[y, zero])?;
    let vanishes = cx.emit(Op::Logic(LogicOp::And), &[zero_base, positive])?;
    let defined = cx.emit(Op::Where, &[vanishes, zero, defined])?;
    let none = cx.emit(Op::Compare(Comparison::Equal), &[y, zero])?;
    let one = cx.scalar(1.0)?;
    cx.emit(Op::Where, &[none, one, defined])
}

/// Folds a binary op on constants: integer arithmetic for shape computations
/// (integer division truncates, as ONNX Runtime does), f32 arithmetic otherwise.
fn fold_binary(op: BinaryOp, a: &ConstTensor, b: &ConstTensor) -> Result<ConstTensor, String> {
    let int_op = |x: i64, y: i64| -> Result<i64, String> {
        let r = match op {
            BinaryOp::Add => x.checked_add(y),
            BinaryOp::Sub => x.checked_sub(y),
            BinaryOp::Mul => x.checked_mul(y),
            BinaryOp::Div => x.checked_div(y),
            BinaryOp::Min => Some(x.min(y)),
            BinaryOp::Max => Some(x.max(y)),
            BinaryOp::PRelu => Some(if x >= 0 { x } else { y.wrapping_mul(x) }),
        };
        r.ok_or_else(|| {
            format!(
                "integer {} of {x} and {y} overflows or divides by zero",
                op.name()
            )
        })
    };
    let float_op = |x: f32, y: f32| -> f32 {
        match op {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x * y,
            BinaryOp::Div => x / y,
            BinaryOp::Min => x.min(y),
            BinaryOp::Max => x.max(y),
            BinaryOp::PRelu if x >= 0.0 => x,
            BinaryOp::PRelu => y * x,
        }
    };
    ConstTensor::binary(a, b, int_op, float_op)
}

/// Sum of one or more inputs, as a chain of adds (left to right, like ONNX Runtime).
pub fn sum(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    if cx.num_inputs() == 0 {
        return Err(cx.err("onnx-missing-input", "Sum needs at least one input"));
    }
    if cx.num_inputs() == 1 {
        return Ok(vec![cx.entry(0)?]);
    }
    let mut acc = cx.value(0)?;
    for i in 1..cx.num_inputs() {
        let v = cx.value(i)?;
        acc = cx.emit(Op::Binary(BinaryOp::Add), &[acc, v])?;
    }
    Ok(vec![Entry::Value(acc)])
}

/// The activations and math functions that map to one unary op.
pub fn unary(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_max_inputs(1)?;
    let plain = match cx.node.op_type() {
        "Relu" => Some(UnaryOp::Relu),
        "Sigmoid" => Some(UnaryOp::Sigmoid),
        "Tanh" => Some(UnaryOp::Tanh),
        "Erf" => Some(UnaryOp::Erf),
        "HardSwish" => Some(UnaryOp::HardSwish),
        "Neg" => Some(UnaryOp::Neg),
        "Abs" => Some(UnaryOp::Abs),
        "Sqrt" => Some(UnaryOp::Sqrt),
        "Exp" => Some(UnaryOp::Exp),
        "Reciprocal" => Some(UnaryOp::Reciprocal),
        "Log" => Some(UnaryOp::Log),
        "Floor" => Some(UnaryOp::Floor),
        "Ceil" => Some(UnaryOp::Ceil),
        "Round" => Some(UnaryOp::Round),
        "Asinh" => Some(UnaryOp::Asinh),
        "Acosh" => Some(UnaryOp::Acosh),
        "Atanh" => Some(UnaryOp::Atanh),
        "Sinh" => Some(UnaryOp::Sinh),
        "Cosh" => Some(UnaryOp::Cosh),
        "Asin" => Some(UnaryOp::Asin),
        "Acos" => Some(UnaryOp::Acos),
        "Atan" => Some(UnaryOp::Atan),
        "Sin" => Some(UnaryOp::Sin),
        "Cos" => Some(UnaryOp::Cos),
        "Tan" => Some(UnaryOp::Tan),
        "Sign" => Some(UnaryOp::Sign),
        _ => None,
    };
    let op = match (plain, cx.node.op_type()) {
        (Some(op), _) => {
            cx.check_attrs(&[])?;
            op
        }
        (None, "LeakyRelu") => {
            cx.check_attrs(&["alpha"])?;
            UnaryOp::LeakyRelu {
                alpha: F32(cx.attr_float_or("alpha", 0.01)?),
            }
        }
        (None, "HardSigmoid") => {
            cx.check_attrs(&["alpha", "beta"])?;
            UnaryOp::HardSigmoid {
                alpha: F32(cx.attr_float_or("alpha", 0.2)?),
                beta: F32(cx.attr_float_or("beta", 0.5)?),
            }
        }
        (None, other) => {
            return Err(cx.err(
                "onnx-unsupported",
                format!("'{other}' is not a unary op smelt maps"),
            ))
        }
    };
    if matches!(op, UnaryOp::Neg | UnaryOp::Abs) {
        if let Some(c) = cx.const_input(0)?.filter(|c| c.i64s().is_some()) {
            let folded = fold_int_unary(op, &c).map_err(|m| cx.err("onnx-bad-model", m))?;
            return Ok(vec![Entry::constant(folded)]);
        }
    }
    let x = cx.value(0)?;
    Ok(vec![Entry::Value(cx.emit(Op::Unary(op), &[x])?)])
}

/// Neg or Abs of an integer constant, exactly (the negation of the type's minimum, which
/// has no positive counterpart, is an error).
fn fold_int_unary(op: UnaryOp, c: &ConstTensor) -> Result<ConstTensor, String> {
    let (lo, _) = dtype::int_range(c.onnx_type)
        .filter(|_| c.onnx_type != dtype::BOOL)
        .ok_or_else(|| format!("{} of {} is not defined", op.name(), c.type_name()))?;
    let v = c.i64s().unwrap_or_default();
    if let Some(&bad) = v.iter().find(|&&x| x == lo && lo < 0) {
        return Err(format!(
            "{} of {bad} overflows {} (smelt refuses rather than wraps)",
            op.name(),
            c.type_name()
        ));
    }
    let data = v
        .iter()
        .map(|&x| {
            if matches!(op, UnaryOp::Neg) {
                -x
            } else {
                x.abs()
            }
        })
        .collect();
    Ok(ConstTensor {
        data: ConstData::I64(data),
        ..c.clone()
    })
}

/// Shrink: `x + bias` below `-lambd`, `x − bias` above `lambd`, 0 between, written with
/// elementwise ops so it fuses as they do: `m = sign(x − clip(x, −lambd, lambd))` is −1,
/// 0 or 1 by the side x lies on (exactly: the difference is 0 only inside), and
/// `y = (x − bias·m)·|m|`. A negative `lambd` (the two sides overlapping) is refused.
pub fn shrink(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_max_inputs(1)?;
    cx.check_attrs(&["bias", "lambd"])?;
    let bias = cx.attr_float_or("bias", 0.0)?;
    let lambd = cx.attr_float_or("lambd", 0.5)?;
    if lambd.is_nan() || lambd < 0.0 {
        return Err(cx.bad_attr("lambd", format!("{lambd} must be 0 or more")));
    }
    let x = cx.value(0)?;
    let clip = UnaryOp::Clip {
        min: F32(-lambd),
        max: F32(lambd),
    };
    let inside = cx.emit(Op::Unary(clip), &[x])?;
    let outside = cx.emit(Op::Binary(BinaryOp::Sub), &[x, inside])?;
    let side = cx.emit(Op::Unary(UnaryOp::Sign), &[outside])?;
    let kept = cx.emit(Op::Unary(UnaryOp::Abs), &[side])?;
    let shifted = if bias == 0.0 {
        x
    } else {
        let b = cx.scalar(bias)?;
        let offset = cx.emit(Op::Binary(BinaryOp::Mul), &[b, side])?;
        cx.emit(Op::Binary(BinaryOp::Sub), &[x, offset])?
    };
    Ok(vec![Entry::Value(
        cx.emit(Op::Binary(BinaryOp::Mul), &[shifted, kept])?,
    )])
}

/// Clip: bounds from attributes (before version 11) or from optional inputs. Constant
/// bounds become one `clip` op; bounds computed at run time become `max` then `min`.
pub fn clip(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    let x = cx.value(0)?;
    if cx.version < 11 {
        cx.check_attrs(&["min", "max"])?;
        if cx.num_inputs() > 1 {
            return Err(cx.err(
                "onnx-bad-model",
                format!(
                    "Clip-{} takes min and max as attributes; the min and max inputs exist \
                     from opset 11 (this model imports an older opset)",
                    cx.version
                ),
            ));
        }
        let lo = cx.attr_float_or("min", f32::MIN)?;
        let hi = cx.attr_float_or("max", f32::MAX)?;
        return clip_const(cx, x, lo, hi);
    }
    if let Some(a) = cx
        .node
        .attribute
        .iter()
        .find(|a| a.name() == "min" || a.name() == "max")
    {
        return Err(cx.bad_attr(
            a.name(),
            format!(
                "is an input of Clip from opset 11 (this node is version {}); the attribute \
                 form is Clip-6's",
                cx.version
            ),
        ));
    }
    cx.check_attrs(&[])?;
    let mut bounds = [None, None];
    let mut all_const = true;
    for (k, bound) in bounds.iter_mut().enumerate() {
        if cx.input_name(k + 1).is_none() {
            continue;
        }
        match cx.const_input(k + 1)? {
            Some(c) => {
                let v = c.f32s().filter(|v| v.len() == 1).ok_or_else(|| {
                    cx.err(
                        "onnx-bad-model",
                        format!(
                            "input {} must be a float32 scalar, got {} of shape {:?}",
                            k + 1,
                            c.type_name(),
                            c.dims
                        ),
                    )
                })?;
                *bound = Some(v[0]);
            }
            None => all_const = false,
        }
    }
    if all_const {
        let lo = bounds[0].unwrap_or(f32::NEG_INFINITY);
        let hi = bounds[1].unwrap_or(f32::INFINITY);
        if bounds == [None, None] {
            return Ok(vec![Entry::Value(x)]);
        }
        return clip_const(cx, x, lo, hi);
    }
    let mut y = x;
    for (k, op) in [(1, BinaryOp::Max), (2, BinaryOp::Min)] {
        if let Some(b) = cx.opt_value(k)? {
            y = cx.emit(Op::Binary(op), &[y, b])?;
        }
    }
    Ok(vec![Entry::Value(y)])
}

fn clip_const(cx: &mut NodeCtx, x: Value, lo: f32, hi: f32) -> Result<Vec<Entry>, Diagnostic> {
    let op = UnaryOp::Clip {
        min: F32(lo),
        max: F32(hi),
    };
    Ok(vec![Entry::Value(cx.emit(Op::Unary(op), &[x])?)])
}

/// Gelu (opset 20): one `gelu` op, exact (`approximate = "none"`) or the tanh
/// approximation `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["approximate"])?;
    let x = cx.value(0)?;
    let approximate = cx
        .attr_string("approximate")?
        .unwrap_or_else(|| "none".into());
    let approximate = GeluApproximation::ALL
        .into_iter()
        .find(|a| a.name() == approximate)
        .ok_or_else(|| {
            cx.bad_attr(
                "approximate",
                format!("'{approximate}' is not one of \"none\", \"tanh\""),
            )
        })?;
    let y = cx.emit(Op::Unary(UnaryOp::Gelu { approximate }), &[x])?;
    Ok(vec![Entry::Value(y)])
}

/// The activations ONNX defines that smelt writes with its elementwise ops, exactly as
/// their definitions read (so each piece can fuse into an anchor's epilogue):
/// - PRelu: `prelu(x, slope)` (slope broadcast to x), one op so it can be a post-op;
/// - Elu: `relu(x) + alpha · (exp(min(x, 0)) − 1)`, Selu: `gamma ·` that;
/// - Celu: `relu(x) + min(0, alpha · (exp(x / alpha) − 1))`;
/// - Softsign: `x / (1 + |x|)`;
/// - ThresholdedRelu: `where(x > alpha, x, 0)`;
/// - Softplus: `log(exp(x) + 1)`; Mish: one `mish` op, so it can be a post-op.
pub fn activation(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    let op = cx.node.op_type();
    let known: &[&str] = match op {
        "Elu" | "Celu" | "ThresholdedRelu" => &["alpha"],
        "Selu" => &["alpha", "gamma"],
        _ => &[],
    };
    cx.check_attrs(known)?;
    let unary = |cx: &mut NodeCtx, u: UnaryOp, x: Value| cx.emit(Op::Unary(u), &[x]);
    let binary =
        |cx: &mut NodeCtx, b: BinaryOp, x: Value, y: Value| cx.emit(Op::Binary(b), &[x, y]);
    let x = cx.value(0)?;
    let zero = cx.scalar(0.0)?;
    let one = cx.scalar(1.0)?;
    // relu(x) + factor · (exp(min(x, 0) / inner) − 1), the exponential linear family
    let elu = |cx: &mut NodeCtx, alpha: f32| -> Result<Value, Diagnostic> {
        let pos = unary(cx, UnaryOp::Relu, x)?;
        let neg = binary(cx, BinaryOp::Min, x, zero)?;
        let e = unary(cx, UnaryOp::Exp, neg)?;
        let em1 = binary(cx, BinaryOp::Sub, e, one)?;
        let a = cx.scalar(alpha)?;
        let scaled = binary(cx, BinaryOp::Mul, a, em1)?;
        binary(cx, BinaryOp::Add, pos, scaled)
    };
    let y = match op {
        "PRelu" => {
            let slope = cx.value(1)?;
            binary(cx, BinaryOp::PRelu, x, slope)?
        }
        "Elu" => elu(cx, cx.attr_float_or("alpha", 1.0)?)?,
        "Selu" => {
            let alpha = cx.attr_float_or("alpha", 1.673_263_2)?;
            let gamma = cx.attr_float_or("gamma", 1.050_701)?;
            let inner = elu(cx, alpha)?;
            let g = cx.scalar(gamma)?;
            binary(cx, BinaryOp::Mul, g, inner)?
        }
        "Celu" => {
            let alpha = cx.attr_float_or("alpha", 1.0)?;
            let pos = unary(cx, UnaryOp::Relu, x)?;
            let a = cx.scalar(alpha)?;
            let scaled_x = binary(cx, BinaryOp::Div, x, a)?;
            let e = unary(cx, UnaryOp::Exp, scaled_x)?;
            let em1 = binary(cx, BinaryOp::Sub, e, one)?;
            let scaled = binary(cx, BinaryOp::Mul, a, em1)?;
            let neg = binary(cx, BinaryOp::Min, zero, scaled)?;
            binary(cx, BinaryOp::Add, pos, neg)?
        }
        "Softplus" => {
            let e = unary(cx, UnaryOp::Exp, x)?;
            let e1 = binary(cx, BinaryOp::Add, e, one)?;
            unary(cx, UnaryOp::Log, e1)?
        }
        "Mish" => unary(cx, UnaryOp::Mish, x)?,
        "Softsign" => {
            let magnitude = unary(cx, UnaryOp::Abs, x)?;
            let denominator = binary(cx, BinaryOp::Add, one, magnitude)?;
            binary(cx, BinaryOp::Div, x, denominator)?
        }
        _ => {
            let alpha = cx.attr_float_or("alpha", 1.0)?;
            let a = cx.scalar(alpha)?;
            let above = cx.emit(Op::Compare(smelt_ir::op::Comparison::Greater), &[x, a])?;
            cx.emit(Op::Where, &[above, x, zero])?
        }
    };
    Ok(vec![Entry::Value(y)])
}

/// Mean of one or more inputs: their sum (a chain of adds, as Sum) divided by the count.
pub fn mean(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    if cx.num_inputs() == 0 {
        return Err(cx.err("onnx-missing-input", "Mean needs at least one input"));
    }
    let mut acc = cx.value(0)?;
    for i in 1..cx.num_inputs() {
        let v = cx.value(i)?;
        acc = cx.emit(Op::Binary(BinaryOp::Add), &[acc, v])?;
    }
    if cx.num_inputs() == 1 {
        return Ok(vec![Entry::Value(acc)]);
    }
    let count = cx.scalar(cx.num_inputs() as f32)?;
    Ok(vec![Entry::Value(
        cx.emit(Op::Binary(BinaryOp::Div), &[acc, count])?,
    )])
}

/// Swish: `x · sigmoid(alpha · x)` (alpha 1 is `silu`).
pub fn swish(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["alpha"])?;
    cx.check_max_inputs(1)?;
    let alpha = cx.attr_float_or("alpha", 1.0)?;
    let x = cx.value(0)?;
    let a = cx.scalar(alpha)?;
    let scaled = cx.emit(Op::Binary(BinaryOp::Mul), &[x, a])?;
    let gate = cx.emit(Op::Unary(UnaryOp::Sigmoid), &[scaled])?;
    Ok(vec![Entry::Value(
        cx.emit(Op::Binary(BinaryOp::Mul), &[x, gate])?,
    )])
}
