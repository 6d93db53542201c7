//! The typed elementwise family: `cast`, the comparisons (`equal`, `less`, ...), the
//! logic operators (`and`, `or`, `xor`, `not`: logic on `i1`, bitwise on integers, as
//! MLIR's `arith.andi`; `shift_left`, `shift_right` on integers) and `where` — their
//! operators with exact semantics on every element type, variants, rows and type rules —
//! and the reduction operators (`Reduction`, whose rows are in `reduce`).

use super::dim::{broadcast_dims, Shape};
use super::rules::{numeric_pair, OperandTypes};
use crate::types::DType;

/// An elementwise comparison; the result is `i1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Comparison {
    /// `a == b` (NaN equals nothing).
    Equal,
    /// `a < b`.
    Less,
    /// `a <= b`.
    LessOrEqual,
    /// `a > b`.
    Greater,
    /// `a >= b`.
    GreaterOrEqual,
}

impl Comparison {
    /// Whether `a cmp b` holds (IEEE semantics for floats: every comparison with NaN is
    /// false).
    pub fn holds<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            Comparison::Equal => a == b,
            Comparison::Less => a < b,
            Comparison::LessOrEqual => a <= b,
            Comparison::Greater => a > b,
            Comparison::GreaterOrEqual => a >= b,
        }
    }

    /// Text mnemonic (from the op table).
    pub fn name(self) -> &'static str {
        super::Op::Compare(self).name()
    }
}

/// What a reduction computes over its axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reduction {
    /// The sum.
    Sum,
    /// The mean (the sum divided by the number of reduced elements).
    Mean,
    /// The largest element (NaN if any is NaN, as numpy's `max`).
    Max,
    /// The smallest element (NaN if any is NaN).
    Min,
}

impl Reduction {
    /// Text mnemonic (from the op table).
    pub fn name(self) -> &'static str {
        super::Op::Reduce(self, super::ReduceAttrs::default()).name()
    }

    /// The reduction of `values` (NaN propagates through max and min; an empty
    /// reduction is 0 for sum, -inf for max and +inf for min, as ONNX defines them, and 0
    /// for mean, which ONNX leaves undefined: onnxruntime's value).
    pub fn eval(self, values: impl Iterator<Item = f64>) -> f64 {
        let mut n = 0usize;
        let mut acc = match self {
            Reduction::Sum | Reduction::Mean => 0.0,
            Reduction::Max => f64::NEG_INFINITY,
            Reduction::Min => f64::INFINITY,
        };
        for v in values {
            n += 1;
            acc = match self {
                Reduction::Sum | Reduction::Mean => acc + v,
                Reduction::Max if v.is_nan() || acc.is_nan() => f64::NAN,
                Reduction::Min if v.is_nan() || acc.is_nan() => f64::NAN,
                Reduction::Max => acc.max(v),
                Reduction::Min => acc.min(v),
            };
        }
        match self {
            Reduction::Mean if n > 0 => acc / n as f64,
            _ => acc,
        }
    }
}

/// An elementwise logic operator: on `i1` values logic, on integers bitwise; the shifts
/// take integers only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LogicOp {
    /// `a && b`; bitwise `a & b` on integers.
    And,
    /// `a || b`; bitwise `a | b` on integers.
    Or,
    /// `a != b`; bitwise `a ^ b` on integers.
    Xor,
    /// `a << b`, wrapping; a shift by a negative amount or by the width or more gives 0
    /// (ONNX's BitShift).
    ShiftLeft,
    /// `a >> b`, arithmetic (the sign fills); a shift by a negative amount or by the
    /// width or more gives the sign: -1 for a negative `a`, else 0 (ONNX's BitShift).
    ShiftRight,
}

impl LogicOp {
    /// `a op b` on `i1` (the shifts, which the type rule keeps from `i1`, shift a 1-bit
    /// unsigned value).
    pub fn eval(self, a: bool, b: bool) -> bool {
        match self {
            LogicOp::And => a && b,
            LogicOp::Or => a || b,
            LogicOp::Xor => a != b,
            LogicOp::ShiftLeft => a && !b,
            LogicOp::ShiftRight => a && !b,
        }
    }

    /// `a op b` on integers of `bits` bits (signed or not) held widened to i64
    /// (sign-extended, resp. zero-extended); the result is held the same way.
    pub fn eval_int(self, a: i64, b: i64, bits: u32, signed: bool) -> i64 {
        let in_range = (0..i64::from(bits)).contains(&b);
        let wrap = |v: i64| match (bits, signed) {
            (64.., _) => v,
            (_, true) => (v << (64 - bits)) >> (64 - bits),
            (_, false) => v & ((1i64 << bits) - 1),
        };
        match self {
            LogicOp::And => a & b,
            LogicOp::Or => a | b,
            LogicOp::Xor => a ^ b,
            LogicOp::ShiftLeft if in_range => wrap(a.wrapping_shl(b as u32)),
            LogicOp::ShiftLeft => 0,
            // `a` is held sign- or zero-extended, so i64's arithmetic shift is the type's
            LogicOp::ShiftRight if in_range => a >> b,
            LogicOp::ShiftRight if signed && a < 0 => -1,
            LogicOp::ShiftRight => 0,
        }
    }

    /// Whether the operator is a shift (integers only).
    pub fn is_shift(self) -> bool {
        matches!(self, LogicOp::ShiftLeft | LogicOp::ShiftRight)
    }

    /// Text mnemonic (from the op table).
    pub fn name(self) -> &'static str {
        super::Op::Logic(self).name()
    }
}

macro_rules! logic_ops {
    ([$($variants:tt)*] [$($rows:tt)*] $next:ident $(, $more:ident)*) => { $next! {
    [$($variants)*
        /// Converts every element to `to`, as ONNX `Cast` does: float to integer truncates
        /// toward zero and saturates at the type's bounds (NaN becomes 0); integer to float
        /// rounds to nearest even; integer to integer wraps; to `i1` is `!= 0`, from `i1` 0 or 1.
        /// `f16` and `bf16` convert through `f32`: widening is exact, narrowing rounds to
        /// nearest even (overflow to infinity, NaN stays NaN; see [`crate::half`]). The
        /// narrow integers follow the integer rules: sign- or zero-extended exactly,
        /// wrapped from wider integers, saturated from floats at their bounds.
        Cast {
            /// The result's element type.
            to: DType,
        },
        /// Elementwise comparison with numpy broadcasting of two operands of one element
        /// type; the result is `i1`.
        Compare(Comparison),
        /// Elementwise logic on two `i1` operands, or bitwise operators and shifts on two
        /// integer operands of one type, with numpy broadcasting.
        Logic(LogicOp),
        /// Elementwise negation of an `i1` operand, or bitwise complement of an integer one.
        Not,
        /// `where(cond, a, b)`: `a` where the `i1` condition holds, else `b`; the three
        /// broadcast together, `a` and `b` have one element type.
        Where,
        /// `mod(a, b)`, broadcast, of one numeric type (ONNX `Mod`): the remainder of `a / b`
        /// with the sign of the divisor `b` (Python's `%`, integers only), or with
        /// `fmod` the sign of the dividend `a` (C's `fmod` and `%`, floats and integers).
        /// An integer remainder by zero is a run-time error.
        Mod {
            /// C-style remainder (sign of the dividend) instead of Python's.
            fmod: bool,
        },
    ]
    [$($rows)*
        Cast "cast" Some(Exact(1)), Plain: (Op::Cast { to }) <=> (Attrs::DType(to))
            attrs { to },
            dtype: |_| Ok(*to),
            shape: same_dims,
            flops: no_flops;
        Equal "equal" Some(Exact(2)), Plain: (Op::Compare(Comparison::Equal)) <=> (Attrs::None)
            attrs {},
            dtype: compare_dtype,
            shape: broadcast_pair,
            flops: one_per_element;
        Less "less" Some(Exact(2)), Plain: (Op::Compare(Comparison::Less)) <=> (Attrs::None)
            attrs {},
            dtype: compare_dtype,
            shape: broadcast_pair,
            flops: one_per_element;
        LessOrEqual "less_equal" Some(Exact(2)), Plain: (Op::Compare(Comparison::LessOrEqual)) <=> (Attrs::None)
            attrs {},
            dtype: compare_dtype,
            shape: broadcast_pair,
            flops: one_per_element;
        Greater "greater" Some(Exact(2)), Plain: (Op::Compare(Comparison::Greater)) <=> (Attrs::None)
            attrs {},
            dtype: compare_dtype,
            shape: broadcast_pair,
            flops: one_per_element;
        GreaterOrEqual "greater_equal" Some(Exact(2)), Plain: (Op::Compare(Comparison::GreaterOrEqual)) <=> (Attrs::None)
            attrs {},
            dtype: compare_dtype,
            shape: broadcast_pair,
            flops: one_per_element;
        And "and" Some(Exact(2)), Plain: (Op::Logic(LogicOp::And)) <=> (Attrs::None)
            attrs {},
            dtype: bits_dtype,
            shape: broadcast_pair,
            flops: one_per_element;
        Or "or" Some(Exact(2)), Plain: (Op::Logic(LogicOp::Or)) <=> (Attrs::None)
            attrs {},
            dtype: bits_dtype,
            shape: broadcast_pair,
            flops: one_per_element;
        Xor "xor" Some(Exact(2)), Plain: (Op::Logic(LogicOp::Xor)) <=> (Attrs::None)
            attrs {},
            dtype: bits_dtype,
            shape: broadcast_pair,
            flops: one_per_element;
        ShiftLeft "shift_left" Some(Exact(2)), Plain: (Op::Logic(LogicOp::ShiftLeft)) <=> (Attrs::None)
            attrs {},
            dtype: shift_dtype,
            shape: broadcast_pair,
            flops: one_per_element;
        ShiftRight "shift_right" Some(Exact(2)), Plain: (Op::Logic(LogicOp::ShiftRight)) <=> (Attrs::None)
            attrs {},
            dtype: shift_dtype,
            shape: broadcast_pair,
            flops: one_per_element;
        Not "not" Some(Exact(1)), Plain: (Op::Not) <=> (Attrs::None)
            attrs {},
            dtype: bits_dtype,
            shape: same_dims,
            flops: one_per_element;
        Where "where" Some(Exact(3)), Plain: (Op::Where) <=> (Attrs::None)
            attrs {},
            dtype: where_dtype,
            shape: where_shape,
            flops: no_flops;
        Mod "mod" Some(Exact(2)), Plain: (Op::Mod { fmod }) <=> (Attrs::Flag(fmod))
            attrs { fmod = false },
            dtype: |o| mod_dtype(*fmod, o),
            shape: broadcast_pair,
            flops: one_per_element;
    ]
    $($more),* } };
}
pub(super) use logic_ops;

/// Element-type rule of comparisons: two operands of one type (not a storage type, which
/// only `cast` and data movement take), an `i1` result.
pub(super) fn compare_dtype(o: &OperandTypes<'_>) -> Result<DType, String> {
    o.same_as(0, 1)?;
    o.need(0, |d| !d.is_storage(), "f32, i64, i32 or i1")?;
    Ok(DType::Bool)
}

/// Element-type rule of `and`, `or`, `xor`, `not`: every operand `i1` (logic), or every
/// operand of one integer type (bitwise).
pub(super) fn bits_dtype(o: &OperandTypes<'_>) -> Result<DType, String> {
    for i in 1..o.len() {
        o.same_as(0, i)?;
    }
    o.need(
        0,
        |d| d == DType::Bool || d.is_integer(),
        "i1 or an integer type",
    )
}

/// Element-type rule of the shifts: two operands of one integer type.
pub(super) fn shift_dtype(o: &OperandTypes<'_>) -> Result<DType, String> {
    o.same_as(0, 1)?;
    o.need(0, DType::is_integer, "an integer type")
}

/// Element-type rule of `where`: an `i1` condition, two branches of one type.
pub(super) fn where_dtype(o: &OperandTypes<'_>) -> Result<DType, String> {
    o.need(0, |d| d == DType::Bool, "i1")?;
    o.same_as(1, 2)?;
    Ok(o.ty(1).dtype)
}

/// Element-type rule of `mod`: one numeric type; Python's remainder only on integers
/// (ONNX asks for `fmod` on floats).
pub(super) fn mod_dtype(fmod: bool, o: &OperandTypes<'_>) -> Result<DType, String> {
    let d = numeric_pair(o)?;
    if !fmod && !d.is_integer() {
        return Err(format!(
            "'mod' of {d} needs fmod = true (the remainder with the divisor's sign is for integers)"
        ));
    }
    Ok(d)
}

/// The three operands broadcast together.
pub(super) fn where_shape(o: &OperandTypes<'_>) -> Result<Shape, String> {
    let branches = broadcast_dims(&o.dims(1), &o.dims(2))?;
    Ok(broadcast_dims(&o.dims(0), &branches)?.into())
}
