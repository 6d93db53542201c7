//! Values of the loop IR: affine addresses over the loop variables, and the expression
//! trees of loads, constants, arithmetic, comparisons, selects and casts that kernels
//! assign and store.

use super::{BufId, LoopVar, VarId, Width};
use crate::types::F32;

/// An integer address in elements: `offset + Σ coefficient · loop variable`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Affine {
    /// Constant part.
    pub offset: i64,
    /// Terms, at most one per loop variable, sorted by variable.
    pub terms: Vec<(LoopVar, i64)>,
}

impl Affine {
    /// A constant address.
    pub fn constant(offset: i64) -> Affine {
        Affine {
            offset,
            terms: Vec::new(),
        }
    }

    /// The loop variable itself.
    pub fn var(v: LoopVar) -> Affine {
        Affine {
            offset: 0,
            terms: vec![(v, 1)],
        }
    }

    /// `self + other`.
    pub fn add(&self, other: &Affine) -> Affine {
        let mut out = self.clone();
        out.offset += other.offset;
        for &(v, c) in &other.terms {
            out.add_term(v, c);
        }
        out
    }

    /// `self + k`.
    pub fn plus(&self, k: i64) -> Affine {
        let mut out = self.clone();
        out.offset += k;
        out
    }

    /// `self · k`.
    pub fn scale(&self, k: i64) -> Affine {
        let mut out = Affine::constant(self.offset * k);
        for &(v, c) in &self.terms {
            out.add_term(v, c * k);
        }
        out
    }

    fn add_term(&mut self, v: LoopVar, c: i64) {
        match self.terms.binary_search_by_key(&v, |t| t.0) {
            Ok(i) => {
                self.terms[i].1 += c;
                if self.terms[i].1 == 0 {
                    self.terms.remove(i);
                }
            }
            Err(i) if c != 0 => self.terms.insert(i, (v, c)),
            Err(_) => {}
        }
    }
}

/// An elementwise function of one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnOp {
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// Square root.
    Sqrt,
    /// `e^x` (code generation expands it into a polynomial; relative error ≈ 2e-7).
    Exp,
    /// `ln x` (code generation expands it into a polynomial; relative error ≈ 1e-7;
    /// NaN below zero, -inf at zero, +inf at +inf).
    Log,
    /// Round toward -inf to an integer value.
    Floor,
    /// Round toward +inf to an integer value.
    Ceil,
    /// Round to the nearest integer value, halves to even.
    Nearest,
    /// `sin x` (code generation expands it: Cody–Waite reduction by π/2, then a
    /// polynomial; at most 1.5 ulp for |x| ≤ 1e4; NaN at ±inf).
    Sin,
    /// `cos x` (as [`UnOp::Sin`], a quarter turn on).
    Cos,
    /// `atan x` (code generation reduces to |t| ≤ tan(π/8), then a polynomial; at most
    /// 2.6 ulp; ±π/2 at ±inf).
    Atan,
}

/// An elementwise function of two values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// The remainder of `a / b` with the sign of `a` (C's `%` and `fmod`): integers
    /// exactly, by zero a [`Fault`] like `Div` (`MIN rem -1` is 0); `f32` as
    /// `a - trunc(a / b) * b`, exact while the quotient is below 2^24 in magnitude.
    Rem,
    /// `a > b ? a : b` (the x86 `maxps` rule: a NaN in `a` gives `b`).
    Max,
    /// `a < b ? a : b`.
    Min,
    /// Bitwise and (integers and `i1` only).
    And,
    /// Bitwise or (integers and `i1` only).
    Or,
    /// Bitwise exclusive or (integers and `i1` only).
    Xor,
    /// `a << b`, the amount taken modulo the width (the hardware's rule; integers only).
    Shl,
    /// `a >> b`, arithmetic, the amount taken modulo the width (integers only).
    Shr,
}

/// A comparison for [`Expr::Select`] and [`Expr::Compare`] (signed for integers;
/// ordered for floats, so only `Ne` holds with a NaN).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CmpOp {
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
    /// `a < b`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
}

/// A horizontal reduction of a vector to a scalar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    /// Sum of the lanes.
    Add,
    /// Largest lane.
    Max,
}

/// A value computed in registers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Expr {
    /// The current value of a register variable.
    Var(VarId),
    /// A constant, splatted to every lane.
    Const(F32, Width),
    /// An integer or `i1` constant of the given scalar width.
    Int(i64, Width),
    /// Loads `width.lanes()` consecutive elements of `buf` starting at `index`.
    Load {
        /// The buffer.
        buf: BufId,
        /// Element index of the first lane.
        index: Affine,
        /// How many lanes.
        width: Width,
    },
    /// Loads one element of `buf` at `base + index * stride`, where `index` is a
    /// scalar `i64` computed at run time: the generated code first tests
    /// `0 <= index < bound` and ends the kernel with [`Fault::IndexOutOfRange`] when it
    /// fails, so the load happens only inside the range the checker proved.
    LoadAt {
        /// The buffer.
        buf: BufId,
        /// Element index of element 0 of the indexed axis.
        base: Affine,
        /// The run-time index (an `i64` value).
        index: Box<Expr>,
        /// Elements between consecutive indices.
        stride: i64,
        /// Exclusive upper bound of valid indices.
        bound: i64,
        /// The loaded value's width (a scalar).
        width: Width,
    },
    /// A scalar broadcast to every lane of a vector.
    Splat(Box<Expr>),
    /// A scalar converted to another element type, as ONNX `Cast` does (float to
    /// integer truncates and saturates, NaN to 0; integer to float rounds to nearest;
    /// integer to integer wraps; to `i1` is `!= 0`).
    Cast(Width, Box<Expr>),
    /// `a cmp b` on two scalars of one type: an `i1`.
    Compare(CmpOp, Box<Expr>, Box<Expr>),
    /// An elementwise function of one value.
    Unary(UnOp, Box<Expr>),
    /// An elementwise function of two values of the same width.
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `a * b + c`, fused when the target has FMA.
    Fma(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `(a cmp b) ? if_true : if_false`, lane by lane.
    Select {
        /// The comparison.
        cmp: CmpOp,
        /// Left side of the comparison.
        a: Box<Expr>,
        /// Right side of the comparison.
        b: Box<Expr>,
        /// Value where the comparison holds.
        if_true: Box<Expr>,
        /// Value where it does not.
        if_false: Box<Expr>,
    },
    /// A vector reduced to a scalar.
    Reduce(ReduceOp, Box<Expr>),
    /// One lane (0..4) of a vector, as a scalar.
    Lane(Box<Expr>, u8),
    /// Lanes picked from two vectors: lane `i` of the result is lane `m[i]` of the
    /// eight lanes `a ++ b` (`m[i] < 8`). Register tiles are transposed with these.
    Shuffle(Box<Expr>, Box<Expr>, [u8; 4]),
}

impl Expr {
    /// A load of `width` lanes.
    pub fn load(buf: BufId, index: Affine, width: Width) -> Expr {
        Expr::Load { buf, index, width }
    }

    /// A constant.
    pub fn constant(v: f32, width: Width) -> Expr {
        Expr::Const(F32(v), width)
    }

    /// `op(a, b)`.
    pub fn binary(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::Binary(op, Box::new(a), Box::new(b))
    }

    /// `op(x)`.
    pub fn unary(op: UnOp, x: Expr) -> Expr {
        Expr::Unary(op, Box::new(x))
    }

    /// `a * b + c`.
    pub fn fma(a: Expr, b: Expr, c: Expr) -> Expr {
        Expr::Fma(Box::new(a), Box::new(b), Box::new(c))
    }

    /// `(a cmp b) ? t : f`.
    pub fn select(cmp: CmpOp, a: Expr, b: Expr, t: Expr, f: Expr) -> Expr {
        Expr::Select {
            cmp,
            a: Box::new(a),
            b: Box::new(b),
            if_true: Box::new(t),
            if_false: Box::new(f),
        }
    }

    /// `x` broadcast to `width` (no-op for scalar width).
    pub fn splat_to(x: Expr, width: Width) -> Expr {
        match width {
            Width::F32x4 => Expr::Splat(Box::new(x)),
            _ => x,
        }
    }

    /// Lane `lane` (0..4) of the vector `x`.
    pub fn lane(x: Expr, lane: u8) -> Expr {
        Expr::Lane(Box::new(x), lane)
    }

    /// Lanes `m` of the eight lanes `a ++ b` (see [`Expr::Shuffle`]).
    pub fn shuffle(a: Expr, b: Expr, m: [u8; 4]) -> Expr {
        Expr::Shuffle(Box::new(a), Box::new(b), m)
    }

    /// An integer or `i1` constant.
    pub fn int(v: i64, width: Width) -> Expr {
        Expr::Int(v, width)
    }

    /// `x` converted to `width`'s element type.
    pub fn cast(width: Width, x: Expr) -> Expr {
        Expr::Cast(width, Box::new(x))
    }

    /// `a cmp b` as an `i1`.
    pub fn compare(cmp: CmpOp, a: Expr, b: Expr) -> Expr {
        Expr::Compare(cmp, Box::new(a), Box::new(b))
    }

    /// Whether evaluating the expression twice costs nothing (a variable or a constant).
    pub fn is_trivial(&self) -> bool {
        matches!(self, Expr::Var(_) | Expr::Const(..) | Expr::Int(..))
    }

    /// Whether evaluating the expression can end the kernel with a [`Fault`]: it holds a
    /// run-time index or an integer division. `vars` are the kernel's variable widths.
    pub fn can_fault(&self, vars: &[Width]) -> bool {
        match self {
            Expr::Var(_) | Expr::Const(..) | Expr::Int(..) | Expr::Load { .. } => false,
            Expr::LoadAt { .. } => true,
            Expr::Binary(op, a, b) => {
                (matches!(op, BinOp::Div | BinOp::Rem) && a.width(vars).is_integer())
                    || a.can_fault(vars)
                    || b.can_fault(vars)
            }
            Expr::Splat(x)
            | Expr::Unary(_, x)
            | Expr::Cast(_, x)
            | Expr::Reduce(_, x)
            | Expr::Lane(x, _) => x.can_fault(vars),
            Expr::Compare(_, a, b) | Expr::Shuffle(a, b, _) => {
                a.can_fault(vars) || b.can_fault(vars)
            }
            Expr::Fma(a, b, c) => a.can_fault(vars) || b.can_fault(vars) || c.can_fault(vars),
            Expr::Select {
                a,
                b,
                if_true,
                if_false,
                ..
            } => [a, b, if_true, if_false].iter().any(|x| x.can_fault(vars)),
        }
    }

    /// The width of the value, read off its structure with the kernel's variable widths
    /// `vars` (for a checked kernel; [`Kernel::check`] verifies that operands agree).
    pub fn width(&self, vars: &[Width]) -> Width {
        match self {
            Expr::Var(v) => vars.get(v.0 as usize).copied().unwrap_or(Width::Scalar),
            Expr::Const(_, w)
            | Expr::Int(_, w)
            | Expr::Load { width: w, .. }
            | Expr::LoadAt { width: w, .. }
            | Expr::Cast(w, _) => *w,
            Expr::Compare(..) => Width::Bool,
            Expr::Splat(_) | Expr::Shuffle(..) => Width::F32x4,
            Expr::Unary(_, x) | Expr::Binary(_, x, _) | Expr::Fma(x, ..) => x.width(vars),
            Expr::Select { if_true, .. } => if_true.width(vars),
            Expr::Reduce(..) | Expr::Lane(..) => Width::Scalar,
        }
    }
}
