//! The elementwise family: `UnaryOp` and `BinaryOp` with their f64 semantics (`eval`),
//! flops and the `erf` they use, and the rows of every unary and binary kind.

use super::dim::{broadcast_dims, Shape};
use super::rules::OperandTypes;
use crate::types::{DType, TensorType, F32};

/// An elementwise op of one operand. Parameters that are part of the op's meaning
/// (clip bounds, slopes) live in the variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    /// `max(x, 0)`.
    Relu,
    /// `min(max(x, min), max)`; ReLU6 is `Clip { min: 0, max: 6 }`.
    Clip {
        /// Lower bound.
        min: F32,
        /// Upper bound.
        max: F32,
    },
    /// `x if x >= 0 else alpha * x`.
    LeakyRelu {
        /// Slope for negative inputs.
        alpha: F32,
    },
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// Hyperbolic tangent.
    Tanh,
    /// Gauss error function.
    Erf,
    /// GELU: exact, `0.5 x (1 + erf(x / sqrt 2))`, or the tanh approximation
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (ONNX Gelu's `approximate`).
    Gelu {
        /// Which of the two formulas.
        approximate: GeluApproximation,
    },
    /// `x * tanh(softplus(x))`, softplus being `ln(1 + e^x)`.
    Mish,
    /// `max(0, min(1, alpha * x + beta))`.
    HardSigmoid {
        /// Slope.
        alpha: F32,
        /// Offset.
        beta: F32,
    },
    /// `x * max(0, min(1, x / 6 + 1/2))`.
    HardSwish,
    /// `x * sigmoid(x)` (a.k.a. swish).
    Silu,
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// `sqrt(x)` (NaN below zero).
    Sqrt,
    /// `e^x`.
    Exp,
    /// `1 / x`.
    Reciprocal,
    /// The natural logarithm (NaN below zero, -inf at zero).
    Log,
    /// The largest integer not above `x` (NaN, infinities and -0 kept).
    Floor,
    /// The smallest integer not below `x`.
    Ceil,
    /// The nearest integer, halves to even (ONNX Round, IEEE roundTiesToEven).
    Round,
    /// -1, 0 or 1 by the sign of `x` (zeros and NaN kept).
    Sign,
    /// `sin x`.
    Sin,
    /// `cos x`.
    Cos,
    /// `tan x`.
    Tan,
    /// `asin x` (NaN outside [-1, 1]).
    Asin,
    /// `acos x` (NaN outside [-1, 1]).
    Acos,
    /// `atan x`.
    Atan,
    /// `sinh x`.
    Sinh,
    /// `cosh x`.
    Cosh,
    /// `asinh x`.
    Asinh,
    /// `acosh x` (NaN below 1).
    Acosh,
    /// `atanh x` (±inf at ±1, NaN beyond).
    Atanh,
}

impl UnaryOp {
    /// Text mnemonic (from the op table).
    pub fn name(self) -> &'static str {
        super::Op::Unary(self).name()
    }

    /// Floating-point operations per element, for the cost model.
    pub fn flops(self) -> u64 {
        match self {
            UnaryOp::Relu | UnaryOp::Clip { .. } | UnaryOp::LeakyRelu { .. } => 1,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Reciprocal => 1,
            UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => 1,
            UnaryOp::Asinh | UnaryOp::Acosh | UnaryOp::Atanh => 30,
            UnaryOp::Sinh | UnaryOp::Cosh => 25,
            UnaryOp::Atan => 20,
            UnaryOp::Asin | UnaryOp::Acos => 30,
            UnaryOp::Sin | UnaryOp::Cos => 20,
            UnaryOp::Tan => 40,
            UnaryOp::Sign => 2,
            UnaryOp::Exp | UnaryOp::Log => 15,
            UnaryOp::HardSigmoid { .. } | UnaryOp::HardSwish => 4,
            UnaryOp::Sigmoid | UnaryOp::Tanh | UnaryOp::Silu => 20,
            UnaryOp::Erf | UnaryOp::Gelu { .. } => 30,
            UnaryOp::Mish => 40,
        }
    }

    /// Evaluates the op on one value, in f64 (the interpreter's precision).
    pub fn eval(self, x: f64) -> f64 {
        match self {
            // NaN propagates (as numpy's maximum and ONNX Relu/Clip do); f64::max would drop it.
            UnaryOp::Relu if x.is_nan() => x,
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::Clip { .. } if x.is_nan() => x,
            UnaryOp::Clip { min, max } => x.max(min.0 as f64).min(max.0 as f64),
            UnaryOp::LeakyRelu { alpha } => {
                if x >= 0.0 {
                    x
                } else {
                    alpha.0 as f64 * x
                }
            }
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Erf => erf(x),
            UnaryOp::Gelu {
                approximate: GeluApproximation::None,
            } => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
            UnaryOp::Gelu {
                approximate: GeluApproximation::Tanh,
            } => 0.5 * x * (1.0 + (GELU_TANH_SCALE * (x + GELU_TANH_CUBIC * x * x * x)).tanh()),
            // ln_1p keeps softplus accurate where e^x is tiny; e^x = inf gives x * 1
            UnaryOp::Mish => x * x.exp().ln_1p().tanh(),
            UnaryOp::HardSigmoid { alpha, beta } => {
                (alpha.0 as f64 * x + beta.0 as f64).clamp(0.0, 1.0)
            }
            UnaryOp::HardSwish => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Reciprocal => 1.0 / x,
            UnaryOp::Log => x.ln(),
            UnaryOp::Floor => x.floor(),
            UnaryOp::Ceil => x.ceil(),
            UnaryOp::Round => x.round_ties_even(),
            UnaryOp::Asinh => x.asinh(),
            UnaryOp::Acosh => x.acosh(),
            UnaryOp::Atanh => x.atanh(),
            UnaryOp::Sinh => x.sinh(),
            UnaryOp::Cosh => x.cosh(),
            UnaryOp::Asin => x.asin(),
            UnaryOp::Acos => x.acos(),
            UnaryOp::Atan => x.atan(),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Tan => x.tan(),
            UnaryOp::Sign if x > 0.0 => 1.0,
            UnaryOp::Sign if x < 0.0 => -1.0,
            UnaryOp::Sign => x,
        }
    }
}

/// `sqrt(2 / pi)`, the tanh-approximate GELU's scale.
pub const GELU_TANH_SCALE: f64 = 0.797_884_560_802_865_4;

/// The cubic coefficient of the tanh-approximate GELU.
pub const GELU_TANH_CUBIC: f64 = 0.044_715;

/// Which formula `gelu` computes (ONNX Gelu's `approximate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum GeluApproximation {
    /// The exact GELU, with `erf`.
    #[default]
    None,
    /// The tanh approximation (HF `gelu_new`, torch `approximate='tanh'`).
    Tanh,
}

impl GeluApproximation {
    /// Every variant, for messages and the text form.
    pub const ALL: [GeluApproximation; 2] = [GeluApproximation::None, GeluApproximation::Tanh];

    /// The name in the text form and in ONNX.
    pub fn name(self) -> &'static str {
        match self {
            GeluApproximation::None => "none",
            GeluApproximation::Tanh => "tanh",
        }
    }
}

/// Error function, accurate to about 1e-15 (W. J. Cody's rational approximations would
/// be overkill; this uses the series for small |x| and a continued fraction otherwise).
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < 2.5 {
        // Maclaurin series: erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        let mut term = a;
        let mut sum = a;
        let x2 = a * a;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -x2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if a > 6.0 {
        1.0
    } else {
        // erfc(a) = exp(-a^2)/sqrt(pi) * 1/(a + 1/2/(a + 1/(a + 3/2/(a + 2/(a + ...)))))
        let mut f = a;
        for k in (1..60).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / (f * std::f64::consts::PI.sqrt())
    };
    r.copysign(x)
}

/// An elementwise op of two operands with numpy broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// `min(a, b)`.
    Min,
    /// `max(a, b)`.
    Max,
    /// `a if a >= 0 else b * a`: ONNX PRelu, `b` the slope (per channel as exporters
    /// write it, broadcast to `a`).
    PRelu,
}

impl BinaryOp {
    /// Text mnemonic (from the op table).
    pub fn name(self) -> &'static str {
        super::Op::Binary(self).name()
    }

    /// Whether `a op b == b op a`.
    pub fn is_commutative(self) -> bool {
        match self {
            BinaryOp::Add | BinaryOp::Mul | BinaryOp::Min | BinaryOp::Max => true,
            BinaryOp::Sub | BinaryOp::Div | BinaryOp::PRelu => false,
        }
    }

    /// Evaluates the op in f64.
    pub fn eval(self, a: f64, b: f64) -> f64 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            // NaN propagates, as in numpy's minimum/maximum and ONNX Min/Max.
            BinaryOp::Min | BinaryOp::Max if a.is_nan() || b.is_nan() => f64::NAN,
            BinaryOp::Min => a.min(b),
            BinaryOp::Max => a.max(b),
            // NaN fails `>= 0` and stays NaN when scaled, as ONNX's reference gives
            BinaryOp::PRelu if a >= 0.0 => a,
            BinaryOp::PRelu => b * a,
        }
    }
}

macro_rules! elementwise_ops {
    ([$($variants:tt)*] [$($rows:tt)*] $next:ident $(, $more:ident)*) => { $next! {
    [$($variants)*
        /// Elementwise unary op.
        Unary(UnaryOp),
        /// Elementwise binary op with numpy broadcasting.
        Binary(BinaryOp),
    ]
    [$($rows)*
        Relu "relu" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Relu)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Relu);
        Clip "clip" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Clip { min, max })) <=> (Attrs::Clip { min, max })
            attrs { min, max },
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Clip { min: *min, max: *max });
        LeakyRelu "leaky_relu" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::LeakyRelu { alpha })) <=> (Attrs::Alpha(alpha))
            attrs { alpha = DEFAULT_LEAKY_ALPHA },
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::LeakyRelu { alpha: *alpha });
        Sigmoid "sigmoid" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Sigmoid)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Sigmoid);
        Tanh "tanh" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Tanh)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Tanh);
        Erf "erf" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Erf)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Erf);
        Gelu "gelu" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Gelu { approximate })) <=> (Attrs::Gelu(approximate))
            attrs { approximate = GeluApproximation::None },
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Gelu { approximate: *approximate });
        Mish "mish" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Mish)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Mish);
        HardSigmoid "hard_sigmoid" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::HardSigmoid { alpha, beta })) <=> (Attrs::HardSigmoid { alpha, beta })
            attrs { alpha = DEFAULT_HARD_SIGMOID_ALPHA, beta = DEFAULT_HARD_SIGMOID_BETA },
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::HardSigmoid { alpha: *alpha, beta: *beta });
        HardSwish "hard_swish" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::HardSwish)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::HardSwish);
        Silu "silu" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Silu)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Silu);
        Neg "neg" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Neg)) <=> (Attrs::None)
            attrs {},
            dtype: numeric_one,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Neg);
        Abs "abs" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Abs)) <=> (Attrs::None)
            attrs {},
            dtype: numeric_one,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Abs);
        Sqrt "sqrt" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Sqrt)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Sqrt);
        Exp "exp" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Exp)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Exp);
        Log "log" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Log)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Log);
        Reciprocal "reciprocal" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Reciprocal)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Reciprocal);
        Floor "floor" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Floor)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Floor);
        Ceil "ceil" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Ceil)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Ceil);
        Round "round" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Round)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Round);
        Asinh "asinh" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Asinh)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Asinh);
        Acosh "acosh" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Acosh)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Acosh);
        Atanh "atanh" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Atanh)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Atanh);
        Sinh "sinh" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Sinh)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Sinh);
        Cosh "cosh" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Cosh)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Cosh);
        Asin "asin" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Asin)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Asin);
        Acos "acos" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Acos)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Acos);
        Atan "atan" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Atan)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Atan);
        Sin "sin" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Sin)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Sin);
        Cos "cos" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Cos)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Cos);
        Tan "tan" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Tan)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Tan);
        Sign "sign" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Sign)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: same_dims,
            flops: unary_flops(UnaryOp::Sign);
        Add "add" Some(Exact(2)), Elementwise: (Op::Binary(BinaryOp::Add)) <=> (Attrs::None)
            attrs {},
            dtype: numeric_pair,
            shape: broadcast_pair,
            flops: one_per_element;
        Sub "sub" Some(Exact(2)), Elementwise: (Op::Binary(BinaryOp::Sub)) <=> (Attrs::None)
            attrs {},
            dtype: numeric_pair,
            shape: broadcast_pair,
            flops: one_per_element;
        Mul "mul" Some(Exact(2)), Elementwise: (Op::Binary(BinaryOp::Mul)) <=> (Attrs::None)
            attrs {},
            dtype: numeric_pair,
            shape: broadcast_pair,
            flops: one_per_element;
        Div "div" Some(Exact(2)), Elementwise: (Op::Binary(BinaryOp::Div)) <=> (Attrs::None)
            attrs {},
            dtype: numeric_pair,
            shape: broadcast_pair,
            flops: one_per_element;
        Min "min" Some(Exact(2)), Elementwise: (Op::Binary(BinaryOp::Min)) <=> (Attrs::None)
            attrs {},
            dtype: numeric_pair,
            shape: broadcast_pair,
            flops: one_per_element;
        Max "max" Some(Exact(2)), Elementwise: (Op::Binary(BinaryOp::Max)) <=> (Attrs::None)
            attrs {},
            dtype: numeric_pair,
            shape: broadcast_pair,
            flops: one_per_element;
        PRelu "prelu" Some(Exact(2)), Elementwise: (Op::Binary(BinaryOp::PRelu)) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: broadcast_pair,
            flops: |_, out| 2 * out.num_elements() as u64;
    ]
    $($more),* } };
}
pub(super) use elementwise_ops;

/// Element-type rule of `neg` and `abs`: one numeric operand.
pub(super) fn numeric_one(o: &OperandTypes<'_>) -> Result<DType, String> {
    o.need(0, DType::is_numeric, "numeric")
}

/// Shape rule of binary elementwise ops: the operands broadcast together.
pub(super) fn broadcast_pair(o: &OperandTypes<'_>) -> Result<Shape, String> {
    Ok(broadcast_dims(&o.dims(0), &o.dims(1))?.into())
}

/// Flops of a unary op: its per-element count times the elements.
pub(super) fn unary_flops(u: UnaryOp) -> impl FnOnce(&[&TensorType], &TensorType) -> u64 {
    move |_, out| out.num_elements() as u64 * u.flops()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
            (-1.5, -0.966_105_146_475_310_7),
        ] {
            assert!(
                (erf(x) - want).abs() < 1e-13,
                "erf({x}) = {} want {want}",
                erf(x)
            );
        }
    }
}
