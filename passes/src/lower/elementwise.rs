//! The per-op vector emitter: elementwise ops on values in registers, shared by
//! standalone elementwise kernels and by fused ops' epilogues (post-ops on a register tile).

use smelt_ir::loops::{
    Access, Affine, BinOp, BufId, BufPtr, CmpOp, Expr, KernelBuilder, LoopVar, RowActivation,
    StoreActivation, UnOp, Width,
};
use smelt_ir::op::{GeluApproximation, PostOp, GELU_TANH_CUBIC, GELU_TANH_SCALE};
use smelt_ir::{BinaryOp, DType, Diagnostic, Layout, Op, TensorType, UnaryOp, Value};
use std::collections::HashMap;

use super::{BufferId, Cx};
use crate::blocks::CHANNEL_BLOCK;

fn c(v: f32, w: Width) -> Expr {
    Expr::constant(v, w)
}

fn add(a: Expr, b: Expr) -> Expr {
    Expr::binary(BinOp::Add, a, b)
}

fn mul(a: Expr, b: Expr) -> Expr {
    Expr::binary(BinOp::Mul, a, b)
}

fn div(a: Expr, b: Expr) -> Expr {
    Expr::binary(BinOp::Div, a, b)
}

/// `max(x, lo)` then `min(_, hi)`.
fn clamp(x: Expr, lo: f32, hi: f32, w: Width) -> Expr {
    Expr::binary(BinOp::Min, Expr::binary(BinOp::Max, x, c(lo, w)), c(hi, w))
}

/// Names `x` with a variable unless it is already cheap to repeat.
fn share(b: &mut KernelBuilder, x: Expr, w: Width) -> Expr {
    if x.is_trivial() {
        x
    } else {
        b.let_(x, w)
    }
}

/// `1 / (1 + e^-x)`.
fn sigmoid(x: Expr, w: Width) -> Expr {
    div(
        c(1.0, w),
        add(c(1.0, w), Expr::unary(UnOp::Exp, Expr::unary(UnOp::Neg, x))),
    )
}

/// `1 − 2 / (e^{2x} + 1)`: exact limits ±1, absolute error ≈ 1e-7.
fn tanh(x: Expr, w: Width) -> Expr {
    let e = Expr::unary(UnOp::Exp, mul(x, c(2.0, w)));
    Expr::binary(BinOp::Sub, c(1.0, w), div(c(2.0, w), add(e, c(1.0, w))))
}

/// erf(x): Taylor series for |x| < 0.5, Abramowitz–Stegun 7.1.26 (absolute error
/// ≤ 1.5e-7) elsewhere, selected lane by lane.
fn erf(b: &mut KernelBuilder, x: Expr, w: Width) -> Expr {
    let x = share(b, x, w);
    let ax = b.let_(Expr::unary(UnOp::Abs, x.clone()), w);
    let x2 = b.let_(mul(x.clone(), x.clone()), w);
    // 2/sqrt(pi) · (x − x³/3 + x⁵/10 − x⁷/42 + x⁹/216 − x¹¹/1320)
    let series = [
        -1.0 / 1320.0,
        1.0 / 216.0,
        -1.0 / 42.0,
        1.0 / 10.0,
        -1.0 / 3.0,
        1.0,
    ];
    let p = horner(&series, x2.clone(), w);
    let small = b.let_(
        mul(mul(p, x.clone()), c(std::f32::consts::FRAC_2_SQRT_PI, w)),
        w,
    );
    let t = b.let_(
        div(
            c(1.0, w),
            Expr::fma(ax.clone(), c(0.327_591_1, w), c(1.0, w)),
        ),
        w,
    );
    let coeffs = [
        1.061_405_4,
        -1.453_152,
        1.421_413_8,
        -0.284_496_74,
        0.254_829_6,
    ];
    let q = horner(&coeffs, t.clone(), w);
    let e = Expr::unary(UnOp::Exp, Expr::unary(UnOp::Neg, x2));
    let large = b.let_(Expr::binary(BinOp::Sub, c(1.0, w), mul(mul(q, t), e)), w);
    Expr::select(CmpOp::Lt, ax, c(0.5, w), small, with_sign_of(x, large, w))
}

/// erf(x) for GELU's `1 + erf(x)`: Abramowitz–Stegun 7.1.28, `1 − (1 + a₁|x| + … +
/// a₆|x|⁶)^−16` with the sign of `x` (error ≤ 3e-7 in exact arithmetic; in f32 the 16th
/// power amplifies the polynomial's rounding to ≈ 1e-6 absolute near 0, harmless beside
/// the 1 it is added to, but not for the Erf op itself, which keeps [`erf`]). One
/// polynomial, four squarings and a division, where [`erf`] evaluates two branches, a
/// division and an exponential: the GELU epilogue of a transformer's up-projection
/// GEMM was ≈ 30% of that GEMM's time.
fn erf_for_gelu(b: &mut KernelBuilder, x: Expr, w: Width) -> Expr {
    let x = share(b, x, w);
    // a₆ … a₁, 1, as the handbook prints them
    let coeffs: [f64; 7] = [
        0.000_043_063_8,
        0.000_276_567_2,
        0.000_152_014_3,
        0.009_270_527_2,
        0.042_282_012_3,
        0.070_523_078_4,
        1.0,
    ];
    let coeffs = coeffs.map(|a| a as f32);
    let p = b.let_(horner(&coeffs, Expr::unary(UnOp::Abs, x.clone()), w), w);
    let p2 = b.let_(mul(p.clone(), p), w);
    let p4 = b.let_(mul(p2.clone(), p2), w);
    let p8 = b.let_(mul(p4.clone(), p4), w);
    let e = Expr::binary(BinOp::Sub, c(1.0, w), div(c(1.0, w), mul(p8.clone(), p8)));
    with_sign_of(x, b.let_(e, w), w)
}

/// `(e^|x|/2, e^-|x|/2)`, the two halves of cosh and sinh. Past |x| = 88 (where e^|x|
/// nears f32's largest value but cosh does not overflow until 89.4) the exponential is
/// taken of |x| − 88, exact there, and scaled by e^88/2, while the small half is 0.
fn exponential_halves(b: &mut KernelBuilder, magnitude: Expr, w: Width) -> (Expr, Expr) {
    let a = share(b, magnitude, w);
    let far = |t: Expr, f: Expr| Expr::select(CmpOp::Gt, a.clone(), c(88.0, w), t, f);
    let exponent = far(Expr::binary(BinOp::Sub, a.clone(), c(88.0, w)), a.clone());
    let e = b.let_(Expr::unary(UnOp::Exp, exponent), w);
    let scale = far(c((0.5 * 88f64.exp()) as f32, w), c(0.5, w));
    let large = mul(e.clone(), scale);
    let small = far(c(0.0, w), div(c(0.5, w), e));
    (large, small)
}

/// ln(1 + u) without the cancellation of ln(1 + u) rounded: with w = 1 + u rounded,
/// ln(w) · u/(w − 1) (exact at w = 1, where it is u; +inf at +inf; NaN below −1).
fn log1p(b: &mut KernelBuilder, u: Expr, w: Width) -> Expr {
    let u = share(b, u, w);
    let v = b.let_(add(c(1.0, w), u.clone()), w);
    let corrected = mul(
        Expr::unary(UnOp::Log, v.clone()),
        div(u.clone(), Expr::binary(BinOp::Sub, v.clone(), c(1.0, w))),
    );
    let finite = Expr::select(
        CmpOp::Eq,
        v.clone(),
        c(f32::INFINITY, w),
        v.clone(),
        corrected,
    );
    Expr::select(CmpOp::Eq, v, c(1.0, w), u, finite)
}

/// Horner's rule: `coeffs[0] t^(k−1) + … + coeffs[k−1]`, one fused multiply-add per term.
fn horner(coeffs: &[f32], t: Expr, w: Width) -> Expr {
    let mut p = c(coeffs[0], w);
    for &k in &coeffs[1..] {
        p = Expr::fma(p, t.clone(), c(k, w));
    }
    p
}

/// `y` with the sign of `x` (y ≥ 0; NaN stays NaN).
fn with_sign_of(x: Expr, y: Expr, w: Width) -> Expr {
    Expr::select(
        CmpOp::Lt,
        x,
        c(0.0, w),
        Expr::unary(UnOp::Neg, y.clone()),
        y,
    )
}

/// Past 2^12, x² + 1 rounds to x² in f32, and asinh x and acosh x are ln(2x) within
/// 1/(4x²) < 2e-8 relative: ln x + ln 2, which cannot overflow.
const HUGE_FOR_SQUARES: f32 = 4096.0;

/// Emits `op(x)` for a value of width `w`; statements for shared subterms go to `b`.
pub fn unary(b: &mut KernelBuilder, op: UnaryOp, x: Expr, w: Width) -> Expr {
    match op {
        // (0 < x) ? x : 0 — the select pattern that becomes one maxps.
        UnaryOp::Relu => Expr::binary(BinOp::Max, x, c(0.0, w)),
        UnaryOp::Clip { min, max } => clamp(x, min.0, max.0, w),
        UnaryOp::LeakyRelu { alpha } => {
            let x = share(b, x, w);
            let neg = mul(x.clone(), c(alpha.0, w));
            Expr::select(CmpOp::Ge, x.clone(), c(0.0, w), x, neg)
        }
        UnaryOp::Sigmoid => sigmoid(x, w),
        UnaryOp::Tanh => tanh(x, w),
        UnaryOp::Erf => erf(b, x, w),
        UnaryOp::Gelu {
            approximate: GeluApproximation::None,
        } => {
            let x = share(b, x, w);
            let e = erf_for_gelu(b, mul(x.clone(), c(std::f32::consts::FRAC_1_SQRT_2, w)), w);
            mul(mul(x, c(0.5, w)), add(e, c(1.0, w)))
        }
        UnaryOp::Gelu {
            approximate: GeluApproximation::Tanh,
        } => {
            // 0.5 x (1 + tanh(k (x + c x³))), the inner term as x · (k + k c x²)
            let x = share(b, x, w);
            let x2 = mul(x.clone(), x.clone());
            let k = GELU_TANH_SCALE as f32;
            let kc = (GELU_TANH_SCALE * GELU_TANH_CUBIC) as f32;
            let inner = mul(x.clone(), Expr::fma(x2, c(kc, w), c(k, w)));
            let t = tanh(b.let_(inner, w), w);
            mul(mul(x, c(0.5, w)), add(t, c(1.0, w)))
        }
        UnaryOp::Mish => {
            // x · tanh(softplus(x)) = x · (e² + 2e) / (e² + 2e + 2) with e = e^x, so no
            // log is needed; e^x is clamped where e² would overflow (the ratio is 1 there),
            // and the ratio is 0 where e^x is below f32's range (the exp kernel stops at
            // e^-87.3), so -inf gives -inf · 0 = NaN as the definition does
            let x = share(b, x, w);
            let e = b.let_(
                Expr::unary(UnOp::Exp, Expr::binary(BinOp::Min, x.clone(), c(40.0, w))),
                w,
            );
            let n = b.let_(mul(e.clone(), add(e, c(2.0, w))), w);
            let ratio = div(n.clone(), add(n, c(2.0, w)));
            let ratio = Expr::select(CmpOp::Lt, x.clone(), c(-88.0, w), c(0.0, w), ratio);
            mul(x, ratio)
        }
        UnaryOp::HardSigmoid { alpha, beta } => {
            clamp(Expr::fma(x, c(alpha.0, w), c(beta.0, w)), 0.0, 1.0, w)
        }
        UnaryOp::HardSwish => {
            let x = share(b, x, w);
            let gate = clamp(
                Expr::fma(x.clone(), c(1.0 / 6.0, w), c(0.5, w)),
                0.0,
                1.0,
                w,
            );
            mul(x, gate)
        }
        UnaryOp::Silu => {
            let x = share(b, x, w);
            div(
                x.clone(),
                add(c(1.0, w), Expr::unary(UnOp::Exp, Expr::unary(UnOp::Neg, x))),
            )
        }
        UnaryOp::Neg => Expr::unary(UnOp::Neg, x),
        UnaryOp::Abs => Expr::unary(UnOp::Abs, x),
        UnaryOp::Sqrt => Expr::unary(UnOp::Sqrt, x),
        UnaryOp::Exp => Expr::unary(UnOp::Exp, x),
        UnaryOp::Reciprocal => div(c(1.0, w), x),
        UnaryOp::Log => Expr::unary(UnOp::Log, x),
        UnaryOp::Floor => Expr::unary(UnOp::Floor, x),
        UnaryOp::Ceil => Expr::unary(UnOp::Ceil, x),
        UnaryOp::Round => Expr::unary(UnOp::Nearest, x),
        UnaryOp::Asinh => {
            // ln(a + √(a² + 1)) = ln(1 + a + a²/(1 + √(a² + 1))) for a = |x|
            let x = share(b, x, w);
            let a = b.let_(Expr::unary(UnOp::Abs, x.clone()), w);
            let a2 = b.let_(mul(a.clone(), a.clone()), w);
            let root = add(
                c(1.0, w),
                Expr::unary(UnOp::Sqrt, add(a2.clone(), c(1.0, w))),
            );
            let near = log1p(b, add(a.clone(), div(a2, root)), w);
            let far = add(
                Expr::unary(UnOp::Log, a.clone()),
                c(std::f32::consts::LN_2, w),
            );
            let magnitude = Expr::select(CmpOp::Gt, a, c(HUGE_FOR_SQUARES, w), far, near);
            with_sign_of(x, magnitude, w)
        }
        UnaryOp::Acosh => {
            // ln(x + √(x² − 1)) = ln(1 + (x − 1) + √((x − 1)(x + 1))): exact near 1
            let x = share(b, x, w);
            let below = b.let_(Expr::binary(BinOp::Sub, x.clone(), c(1.0, w)), w);
            let root = Expr::unary(UnOp::Sqrt, mul(below.clone(), add(x.clone(), c(1.0, w))));
            let near = log1p(b, add(below, root), w);
            let far = add(
                Expr::unary(UnOp::Log, x.clone()),
                c(std::f32::consts::LN_2, w),
            );
            Expr::select(CmpOp::Gt, x, c(HUGE_FOR_SQUARES, w), far, near)
        }
        UnaryOp::Atanh => {
            // ½ ln((1 + a)/(1 − a)) = ½ ln(1 + 2a/(1 − a)) for a = |x|
            let x = share(b, x, w);
            let a = b.let_(Expr::unary(UnOp::Abs, x.clone()), w);
            let ratio = div(
                mul(c(2.0, w), a.clone()),
                Expr::binary(BinOp::Sub, c(1.0, w), a),
            );
            let magnitude = mul(c(0.5, w), log1p(b, ratio, w));
            with_sign_of(x, magnitude, w)
        }
        UnaryOp::Sinh => {
            // |x| < 1: the Taylor polynomial to x¹³ (remainder below 2e-10 relative),
            // since e^x/2 − e^-x/2 cancels there; beyond, the halves with x's sign
            let x = share(b, x, w);
            let a = b.let_(Expr::unary(UnOp::Abs, x.clone()), w);
            let x2 = b.let_(mul(x.clone(), x.clone()), w);
            let taylor = [
                1.0 / 6_227_020_800.0,
                1.0 / 39_916_800.0,
                1.0 / 362_880.0,
                1.0 / 5040.0,
                1.0 / 120.0,
                1.0 / 6.0,
            ];
            let p = horner(&taylor, x2.clone(), w);
            let near_zero = Expr::fma(mul(p, x2), x.clone(), x.clone());
            let (large, small) = exponential_halves(b, a.clone(), w);
            let magnitude = b.let_(Expr::binary(BinOp::Sub, large, small), w);
            Expr::select(
                CmpOp::Lt,
                a,
                c(1.0, w),
                near_zero,
                with_sign_of(x, magnitude, w),
            )
        }
        UnaryOp::Cosh => {
            let (large, small) = exponential_halves(b, Expr::unary(UnOp::Abs, x), w);
            add(large, small)
        }
        UnaryOp::Asin => {
            // atan(x / √((1 − x)(1 + x))): the factored form keeps its bits as |x| → 1,
            // and |x| > 1 gives √(negative) = NaN
            let x = share(b, x, w);
            let one_minus = Expr::binary(BinOp::Sub, c(1.0, w), x.clone());
            let one_plus = add(c(1.0, w), x.clone());
            let cosine = Expr::unary(UnOp::Sqrt, mul(one_minus, one_plus));
            Expr::unary(UnOp::Atan, div(x, cosine))
        }
        UnaryOp::Acos => {
            // 2 atan √((1 − x)/(1 + x)): no cancellation near x = 1 (π − 2 atan … would
            // have one near −1, which this form reaches as atan(+inf))
            let x = share(b, x, w);
            let one_minus = Expr::binary(BinOp::Sub, c(1.0, w), x.clone());
            let one_plus = add(c(1.0, w), x);
            let half_tangent = Expr::unary(UnOp::Sqrt, div(one_minus, one_plus));
            mul(c(2.0, w), Expr::unary(UnOp::Atan, half_tangent))
        }
        UnaryOp::Atan => Expr::unary(UnOp::Atan, x),
        UnaryOp::Sin => Expr::unary(UnOp::Sin, x),
        UnaryOp::Cos => Expr::unary(UnOp::Cos, x),
        UnaryOp::Tan => {
            // sin/cos: a few ulp even near the poles, where cos x is small but exact
            // to its last bits (the reduction keeps r = x − nπ/2 to 1e-23)
            let x = share(b, x, w);
            div(Expr::unary(UnOp::Sin, x.clone()), Expr::unary(UnOp::Cos, x))
        }
        UnaryOp::Sign => {
            // zeros and NaN fail both compares and are kept
            let x = share(b, x, w);
            let negative = Expr::select(CmpOp::Lt, x.clone(), c(0.0, w), c(-1.0, w), x.clone());
            Expr::select(CmpOp::Gt, x, c(0.0, w), c(1.0, w), negative)
        }
    }
}

/// Emits `op(a, b)` for values of width `w`; statements for shared subterms go to `k`.
pub fn binary(k: &mut KernelBuilder, op: BinaryOp, a: Expr, b: Expr, w: Width) -> Expr {
    let op = match op {
        BinaryOp::PRelu => {
            let a = share(k, a, w);
            let scaled = mul(a.clone(), b);
            return Expr::select(CmpOp::Ge, a.clone(), c(0.0, w), a, scaled);
        }
        BinaryOp::Add => BinOp::Add,
        BinaryOp::Sub => BinOp::Sub,
        BinaryOp::Mul => BinOp::Mul,
        BinaryOp::Div => BinOp::Div,
        BinaryOp::Min => BinOp::Min,
        BinaryOp::Max => BinOp::Max,
    };
    Expr::binary(op, a, b)
}

/// Numpy-broadcast element strides of a row-major operand of shape `dims` against the
/// result shape `out`: one stride per result dimension, 0 where the operand is broadcast.
pub fn broadcast_strides(dims: &[usize], out: &[usize]) -> Vec<i64> {
    let mut strides = vec![0i64; out.len()];
    let mut s = 1i64;
    for k in 0..dims.len() {
        let d = dims[dims.len() - 1 - k];
        let o = out.len() - 1 - k;
        strides[o] = if d == 1 { 0 } else { s };
        s *= d as i64;
    }
    strides
}

/// `Σ strides[d] · idx[d]`.
pub fn index_of(strides: &[i64], idx: &[Affine]) -> Affine {
    strides
        .iter()
        .zip(idx)
        .fold(Affine::constant(0), |acc, (&s, i)| acc.add(&i.scale(s)))
}

/// Row-major strides of `dims`.
pub fn row_major_strides(dims: &[usize]) -> Vec<i64> {
    let mut strides = vec![1i64; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * dims[k + 1] as i64;
    }
    strides
}

/// Loads an operand at `index` for a result of width `w` whose lanes advance along a
/// dimension where the operand's stride is `lane_stride` (1: consecutive, 0: broadcast).
pub fn load_lanes(buf: BufId, index: Affine, lane_stride: i64, w: Width) -> Expr {
    match (w, lane_stride) {
        (Width::F32x4, 0) => Expr::Splat(Box::new(Expr::load(buf, index, Width::Scalar))),
        (Width::F32x4, _) => Expr::load(buf, index, Width::F32x4),
        _ => Expr::load(buf, index, w),
    }
}

/// A fused op's post-ops with their extra operands, applied to a register tile just
/// before it is stored. Empty for unfused ops.
#[derive(Clone)]
pub struct Epilogue {
    post: Vec<PostOp>,
    /// Buffer, length and broadcast strides (against the result shape) of each distinct
    /// extra operand: a value that several binary post-ops read is one kernel argument,
    /// since every argument's pointer stays live through the whole kernel (thousands of
    /// them made register allocation superlinear, issue 19 row 8).
    operands: Vec<(BufferId, usize, Vec<i64>)>,
    /// For the `k`-th binary post-op, the index in `operands` of the value it reads.
    reads: Vec<usize>,
    /// Whether each extra operand has the result's whole shape (no broadcast), and so
    /// the result's layout (the fused op's type rule).
    full: Vec<bool>,
    /// Each extra operand's value when it is a constant of one element.
    single: Vec<Option<f32>>,
    args: Vec<BufId>,
}

/// The native activation-rows routine of a post-op, if it has one.
fn row_activation(post: &PostOp) -> Option<RowActivation> {
    match post {
        PostOp::Unary(UnaryOp::Silu) => Some(RowActivation::Silu),
        PostOp::Unary(UnaryOp::Sigmoid) => Some(RowActivation::Sigmoid),
        PostOp::Unary(UnaryOp::Gelu {
            approximate: GeluApproximation::None,
        }) => Some(RowActivation::Gelu),
        _ => None,
    }
}

/// An epilogue as native routines apply it to a run of sums in place
/// ([`Epilogue::native_finish`]): the activation routine's leading activation with the
/// bias, then the store routine's residual and activation (with the bias when no leading
/// activation took it).
#[derive(Clone, Copy)]
pub(crate) struct NativeFinish {
    leading: Option<RowActivation>,
    residual: Option<BufId>,
    act: StoreActivation,
}

impl NativeFinish {
    /// Whether zero sums with a zero bias and residual stay zero (every activation
    /// but the sigmoid maps 0 to 0): what a padded lane finished with the real ones
    /// needs.
    pub(crate) fn keeps_zero(&self) -> bool {
        self.leading != Some(RowActivation::Sigmoid)
    }

    /// What a conv tile finishing its sums in registers applies
    /// ([`ConvTile::finish`](smelt_ir::loops::ConvTile::finish)): the residual and the
    /// activation, when the epilogue has no leading activation (the tile has no
    /// sigmoid, SiLU or GELU).
    pub(crate) fn in_tile(&self) -> Option<(Option<BufId>, StoreActivation)> {
        self.leading.is_none().then_some((self.residual, self.act))
    }

    /// The calls finishing `rows` rows of `lanes` sums at `run` in place, their bias at
    /// `bias`; a residual is read at the run's own index.
    pub(crate) fn emit(
        &self,
        b: &mut KernelBuilder,
        run: BufPtr,
        mut bias: Option<BufPtr>,
        rows: i64,
        lanes: i64,
    ) {
        if let Some(act) = self.leading {
            b.activation_rows(act, run.clone(), bias.take(), rows, lanes);
        }
        if bias.is_none() && self.residual.is_none() && self.act == StoreActivation::Identity {
            return;
        }
        let residual = self.residual.map(|buf| BufPtr {
            buf,
            index: run.index.clone(),
        });
        b.store_rows(self.act, run.clone(), bias, residual, run, rows, lanes);
    }
}

impl Epilogue {
    /// The epilogue for `post` with extra operands `vals`, for a result of shape `out`.
    pub(crate) fn new(cx: &Cx, post: &[PostOp], vals: &[Value], out: &[usize]) -> Epilogue {
        let mut distinct: Vec<Value> = Vec::new();
        let mut index: HashMap<Value, usize> = HashMap::new();
        let reads = vals
            .iter()
            .map(|&v| {
                *index.entry(v).or_insert_with(|| {
                    distinct.push(v);
                    distinct.len() - 1
                })
            })
            .collect();
        let vals = &distinct;
        let operands = vals
            .iter()
            .map(|&v| {
                let b = cx.buf(v);
                (
                    b,
                    cx.len_of(b),
                    broadcast_strides(&cx.func.type_of(v).dims, out),
                )
            })
            .collect();
        let full = vals
            .iter()
            .map(|&v| cx.func.type_of(v).dims == out)
            .collect();
        let single = vals
            .iter()
            .map(|&v| match cx.const_data(v) {
                Some(&[x]) => Some(x),
                _ => None,
            })
            .collect();
        Epilogue {
            post: post.to_vec(),
            operands,
            reads,
            full,
            single,
            args: Vec::new(),
        }
    }

    /// The product of the leading post-ops that multiply by a constant of one value
    /// (the √scale of Q and of Kᵀ a matmul absorbed), and the epilogue after them;
    /// `None` when it does not start with one. A matrix product folds the factor into
    /// its packed B, which is linear in it. Call before [`Epilogue::declare`].
    pub(crate) fn leading_scale(&self) -> Option<(f32, Epilogue)> {
        let mut factor = 1.0f32;
        let mut taken = 0;
        for p in &self.post {
            let PostOp::Binary {
                op: BinaryOp::Mul, ..
            } = p
            else {
                break;
            };
            let Some(x) = self.reads.get(taken).and_then(|&o| self.single[o]) else {
                break;
            };
            factor *= x;
            taken += 1;
        }
        (taken > 0).then(|| {
            let rest = Epilogue {
                post: self.post[taken..].to_vec(),
                reads: self.reads[taken..].to_vec(),
                ..self.clone()
            };
            (factor, rest)
        })
    }

    /// The same epilogue for a result whose `[.., h, w]` plane is walked as rows of `k`
    /// (`h·w` a multiple of `k`), as a 1×1 stride-1 convolution may: `None` when an
    /// operand neither walks the plane contiguously nor broadcasts over all of it.
    pub(crate) fn with_plane_rows(&self, w: usize, k: usize) -> Option<Epilogue> {
        let mut operands = self.operands.clone();
        for (_, _, strides) in &mut operands {
            let [.., sh, sw] = strides.as_mut_slice() else {
                return None;
            };
            if *sh != *sw * w as i64 {
                return None;
            }
            *sh = *sw * k as i64;
        }
        Some(Epilogue {
            post: self.post.clone(),
            operands,
            reads: self.reads.clone(),
            full: self.full.clone(),
            single: self.single.clone(),
            args: Vec::new(),
        })
    }

    /// The same epilogue for a result of shape `out` whose leading `lead` dimensions are
    /// walked as one (a batched matrix product's batch dims and M, flattened into M):
    /// `None` when an operand neither walks them contiguously nor broadcasts over all of
    /// them (a mask per batch row, say), since its index would not be affine in the
    /// merged row.
    pub(crate) fn with_merged_rows(&self, out: &[usize], lead: usize) -> Option<Epilogue> {
        if lead == 0 || lead > out.len() {
            return None;
        }
        let mut operands = self.operands.clone();
        for (_, _, strides) in &mut operands {
            if strides.len() != out.len() {
                return None;
            }
            // the merged row's stride is the innermost lead dim's; every outer one must
            // be it times the rows inside (dims of size 1 are never walked)
            let unit = strides[lead - 1];
            let mut inner = 1i64;
            for d in (0..lead).rev() {
                if out[d] > 1 && strides[d] != unit * inner {
                    return None;
                }
                inner *= out[d] as i64;
            }
            strides.splice(0..lead, [unit]);
        }
        Some(Epilogue {
            post: self.post.clone(),
            operands,
            reads: self.reads.clone(),
            full: self.full.clone(),
            single: self.single.clone(),
            args: Vec::new(),
        })
    }

    /// Whether the post-ops can run on vectors whose lanes are consecutive channels
    /// (axis 1), as for a result stored in channel blocks: every broadcast operand walks
    /// the channels contiguously (per-channel vectors) or not at all (scalars).
    pub(crate) fn runs_along_channels(&self) -> bool {
        self.operands
            .iter()
            .zip(&self.full)
            .all(|((_, _, strides), &full)| full || matches!(strides.get(1), Some(0 | 1)))
    }

    /// Whether there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.post.is_empty()
    }

    /// Declares the extra operands as read-only kernel arguments; returns their buffers,
    /// to be appended to the step's arguments in the same order.
    pub fn declare(&mut self, b: &mut KernelBuilder) -> Vec<BufferId> {
        self.args = self
            .operands
            .iter()
            .enumerate()
            .map(|(i, (_, len, _))| b.arg(&format!("post{i}"), *len, Access::Read))
            .collect();
        self.operands.iter().map(|o| o.0).collect()
    }

    /// The epilogue past a leading SiLU or sigmoid post-op, when it starts with one, and
    /// that activation (for a caller that applies it itself, as a conv tile's native
    /// activation rows do), with the same kernel arguments.
    pub(crate) fn after_leading_activation(&self) -> Option<(RowActivation, Epilogue)> {
        let act = row_activation(self.post.first()?)?;
        let rest = Epilogue {
            post: self.post[1..].to_vec(),
            ..self.clone()
        };
        Some((act, rest))
    }

    /// When the epilogue starts with the add of a bias, one value per column of the
    /// result (broadcast over every other dimension), then a SiLU, sigmoid or GELU: that
    /// activation, the bias's operand, and the epilogue past both (for a caller that adds
    /// the bias and applies the activation itself, as a GEMM tile's native activation
    /// rows do).
    pub(crate) fn after_leading_bias_activation(&self) -> Option<(RowActivation, usize, Epilogue)> {
        let [PostOp::Binary {
            op: BinaryOp::Add, ..
        }, second, ..] = &self.post[..]
        else {
            return None;
        };
        let act = row_activation(second)?;
        let operand = *self.reads.first()?;
        let strides = &self.operands[operand].2;
        let (last, rest) = strides.split_last()?;
        if *last != 1 || rest.iter().any(|&s| s != 0) {
            return None;
        }
        let rest = Epilogue {
            post: self.post[2..].to_vec(),
            reads: self.reads[1..].to_vec(),
            ..self.clone()
        };
        Some((act, operand, rest))
    }

    /// How the native routines finish a run of this epilogue's sums in place, when they
    /// can: a leading SiLU, sigmoid or GELU on the activation routine, then what a
    /// store-rows routine applies ([`Epilogue::as_store_rows`]). Call after
    /// [`Epilogue::declare`].
    pub(crate) fn native_finish(&self) -> Option<NativeFinish> {
        let (leading, (residual, act)) = match self.after_leading_activation() {
            Some((leading, rest)) => (Some(leading), rest.as_store_rows()?),
            None => (None, self.as_store_rows()?),
        };
        Some(NativeFinish {
            leading,
            residual,
            act,
        })
    }

    /// When the post-ops are what a store-rows routine applies after the bias (nothing,
    /// a ReLU or a hard-swish, the add of an operand of the result's whole shape — a
    /// residual, read at the result's own index —, or that add then one of those
    /// activations): the residual's kernel
    /// argument, if there is one, and the activation. Call after [`Epilogue::declare`].
    pub(crate) fn as_store_rows(&self) -> Option<(Option<BufId>, StoreActivation)> {
        let act = |p: &PostOp| match p {
            PostOp::Unary(UnaryOp::Relu) => Some(StoreActivation::Relu),
            PostOp::Unary(UnaryOp::HardSwish) => Some(StoreActivation::HardSwish),
            _ => None,
        };
        let residual = || {
            let i = *self.reads.first()?;
            self.full[i].then(|| self.args.get(i).copied()).flatten()
        };
        let add = |p: &PostOp| {
            matches!(
                p,
                PostOp::Binary {
                    op: BinaryOp::Add,
                    ..
                }
            )
        };
        match &self.post[..] {
            [] => Some((None, StoreActivation::Identity)),
            [a] if add(a) => Some((Some(residual()?), StoreActivation::Identity)),
            [r] => Some((None, act(r)?)),
            [a, r] if add(a) => Some((Some(residual()?), act(r)?)),
            _ => None,
        }
    }

    /// Where extra operand `i` is read for the result element at logical index `idx`.
    pub(crate) fn operand_at(&self, i: usize, idx: &[Affine]) -> BufPtr {
        BufPtr {
            buf: self.args[i],
            index: index_of(&self.operands[i].2, idx),
        }
    }

    /// Prefetches what the post-ops will read for `rows` consecutive indices along result
    /// dimension `axis` × `len` along the last, from logical index `idx`: the runs of
    /// each extra operand that walks the last dimension contiguously (a residual).
    pub fn prefetch(
        &self,
        b: &mut KernelBuilder,
        idx: &[Affine],
        axis: usize,
        rows: usize,
        len: usize,
    ) {
        for ((_, _, strides), &buf) in self.operands.iter().zip(&self.args) {
            if strides.last() != Some(&1) || rows == 0 {
                continue;
            }
            let at = BufPtr {
                buf,
                index: index_of(strides, idx),
            };
            b.prefetch(at, rows as i64, strides[axis], len as i64);
        }
    }

    /// Prefetches, for each full-size operand (a residual in the result's layout),
    /// `rows` runs of `len` elements `row_stride` apart from storage index `at`.
    pub(crate) fn prefetch_stored(
        &self,
        b: &mut KernelBuilder,
        at: &Affine,
        rows: i64,
        row_stride: i64,
        len: i64,
    ) {
        for (&buf, _) in self.args.iter().zip(&self.full).filter(|(_, &full)| full) {
            let at = BufPtr {
                buf,
                index: at.clone(),
            };
            b.prefetch(at, rows, row_stride, len);
        }
    }

    /// Applies the post-ops to `acc`, the result element(s) at logical index `idx` (one
    /// affine per result dimension; vector lanes run along the last dimension).
    pub fn apply(&self, b: &mut KernelBuilder, acc: Expr, idx: &[Affine], w: Width) -> Expr {
        self.apply_loading(b, acc, w, |i| {
            let strides = &self.operands[i].2;
            let lane = strides.last().copied().unwrap_or(0);
            load_lanes(self.args[i], index_of(strides, idx), lane, w)
        })
    }

    /// [`Epilogue::apply`] for a result stored in channel blocks, with vector lanes along
    /// channels (see [`Epilogue::runs_along_channels`]): full-size operands, laid out as
    /// the result, are read at `stored`, the result element's storage index; broadcast
    /// ones at logical index `idx`.
    pub(crate) fn apply_along_channels(
        &self,
        b: &mut KernelBuilder,
        acc: Expr,
        idx: &[Affine],
        stored: &Affine,
        w: Width,
    ) -> Expr {
        self.apply_loading(b, acc, w, |i| {
            let strides = &self.operands[i].2;
            if self.full[i] {
                Expr::load(self.args[i], stored.clone(), w)
            } else {
                let lane = strides.get(1).copied().unwrap_or(0);
                load_lanes(self.args[i], index_of(strides, idx), lane, w)
            }
        })
    }

    /// The post-ops on `acc`, the extra operand `i` of a binary one read by `load(i)`.
    fn apply_loading(
        &self,
        b: &mut KernelBuilder,
        acc: Expr,
        w: Width,
        load: impl Fn(usize) -> Expr,
    ) -> Expr {
        let mut acc = acc;
        let mut next = 0;
        for p in &self.post {
            acc = match *p {
                PostOp::Unary(u) => unary(b, u, acc, w),
                PostOp::Binary { op, acc_is_lhs } => {
                    let x = load(self.reads[next]);
                    next += 1;
                    if acc_is_lhs {
                        binary(b, op, acc, x, w)
                    } else {
                        binary(b, op, x, acc, w)
                    }
                }
            };
            if !acc.is_trivial() && !self.post.is_empty() {
                acc = b.let_(acc, w);
            }
        }
        acc
    }
}

/// Merges adjacent result dimensions that every operand walks contiguously (or
/// broadcasts along entirely), so elementwise loops are as long and flat as possible.
/// Returns the merged result dims and each operand's merged strides.
pub fn collapse(out: &[usize], strides: &[Vec<i64>]) -> (Vec<usize>, Vec<Vec<i64>>) {
    let mut dims: Vec<usize> = Vec::new();
    let mut st: Vec<Vec<i64>> = vec![Vec::new(); strides.len()];
    for d in 0..out.len() {
        if out[d] == 1 {
            continue;
        }
        let mergeable = !dims.is_empty()
            && strides.iter().enumerate().all(|(k, s)| {
                let prev = *st[k].last().unwrap_or(&0);
                prev == s[d] * out[d] as i64
            });
        if mergeable {
            let last = dims.len() - 1;
            dims[last] *= out[d];
            for (k, s) in strides.iter().enumerate() {
                let l = st[k].len() - 1;
                st[k][l] = s[d];
            }
        } else {
            dims.push(out[d]);
            for (k, s) in strides.iter().enumerate() {
                st[k].push(s[d]);
            }
        }
    }
    if dims.is_empty() {
        dims.push(1);
        for s in &mut st {
            s.push(0);
        }
    }
    (dims, st)
}

/// Emits loops over `dims` (row-major), the last one vectorized with a scalar tail when
/// `vectorize`; `body` receives the index of every dimension and the width.
pub fn emit_nest(
    b: &mut KernelBuilder,
    dims: &[usize],
    vectorize: bool,
    body: &mut dyn FnMut(&mut KernelBuilder, &[Affine], Width),
) {
    fn go(
        b: &mut KernelBuilder,
        dims: &[usize],
        idx: &mut Vec<Affine>,
        vectorize: bool,
        body: &mut dyn FnMut(&mut KernelBuilder, &[Affine], Width),
    ) {
        let d = idx.len();
        let n = dims[d] as i64;
        if d + 1 == dims.len() {
            let main = if vectorize { n / 4 * 4 } else { 0 };
            b.for_loop(0, main, 4, |b, i| {
                idx.push(Affine::var(i));
                body(b, idx, Width::F32x4);
                idx.pop();
            });
            b.for_loop(main, n, 1, |b, i| {
                idx.push(Affine::var(i));
                body(b, idx, Width::Scalar);
                idx.pop();
            });
        } else {
            b.for_loop(0, n, 1, |b, i| {
                idx.push(Affine::var(i));
                go(b, dims, idx, vectorize, body);
                idx.pop();
            });
        }
    }
    go(b, dims, &mut Vec::new(), vectorize, body);
}

/// Nested loops over `dims` (step 1), `body` receiving the loop variables outermost first.
pub(crate) fn loop_nest(
    b: &mut KernelBuilder,
    dims: &[usize],
    body: &mut dyn FnMut(&mut KernelBuilder, &[LoopVar]),
) {
    fn go(
        b: &mut KernelBuilder,
        dims: &[usize],
        vars: &mut Vec<LoopVar>,
        body: &mut dyn FnMut(&mut KernelBuilder, &[LoopVar]),
    ) {
        match dims.split_first() {
            None => body(b, vars),
            Some((&d, rest)) => b.for_loop(0, d as i64, 1, |b, v| {
                vars.push(v);
                go(b, rest, vars, body);
                vars.pop();
            }),
        }
    }
    go(b, dims, &mut Vec::new(), body)
}

/// What a standalone elementwise kernel computes per element: the ops the lowering
/// dispatch sends to [`lower_map`], so its matches are exhaustive.
#[derive(Clone, Copy, Debug)]
pub(crate) enum MapOp {
    /// A unary op.
    Unary(UnaryOp),
    /// A binary op with broadcasting.
    Binary(BinaryOp),
    /// Inference batch norm: `(x − mean) · scale / sqrt(var + ε) + bias`.
    BatchNorm {
        /// Added to the variance.
        epsilon: f32,
    },
}

impl MapOp {
    /// The op's name, for kernel names.
    fn name(self) -> &'static str {
        match self {
            MapOp::Unary(u) => u.name(),
            MapOp::Binary(o) => o.name(),
            MapOp::BatchNorm { .. } => "batch_norm",
        }
    }
}

/// Declares `operands` as the kernel's read-only arguments `in0`, `in1`, …; returns
/// them and the buffers a step passes for them.
fn declare_inputs(
    b: &mut KernelBuilder,
    cx: &Cx,
    operands: &[Value],
) -> (Vec<BufId>, Vec<BufferId>) {
    let bufs: Vec<BufferId> = operands.iter().map(|&v| cx.buf(v)).collect();
    let args = bufs
        .iter()
        .enumerate()
        .map(|(i, &buf)| b.arg(&format!("in{i}"), cx.len_of(buf), Access::Read))
        .collect();
    (args, bufs)
}

/// Chains of `f32` row-major unary and binary ops (not scalars) where each link's result is read
/// only by the next link, as an operand, and has the next's shape (YOLO's box decode:
/// `mul → sub → add → mul`): per instruction, the link it feeds (`None`: it feeds no
/// chain). The last link computes the chain in one kernel, the first op's result
/// through the others as post-ops in registers; the earlier links get no kernel. At most
/// [`super::MAX_POST_IN_REGISTERS`] links follow a chain's first op.
pub(crate) fn chained_maps(
    func: &smelt_ir::graph::Func,
    uses: &[Vec<smelt_ir::graph::Use>],
    inlined: &[bool],
) -> Vec<Option<usize>> {
    use smelt_ir::graph::Use;
    let map = |i: usize| {
        let inst = &func.insts[i];
        let row_major = |t: &TensorType| t.layout == Layout::RowMajor;
        matches!(inst.op, Op::Unary(_) | Op::Binary(_))
            && !inlined[i]
            && inst.ty.rank() > 0
            && inst.ty.dtype == DType::F32
            && row_major(&inst.ty)
            && inst.operands.iter().all(|&v| {
                let t = func.type_of(v);
                t.dtype == DType::F32 && row_major(t)
            })
    };
    let mut next = vec![None; func.insts.len()];
    // per instruction: the links before it in its chain, and whether one feeds it (a
    // binary op of two chained operands continues only the first one's chain)
    let mut links = vec![0usize; func.insts.len()];
    let mut fed = vec![false; func.insts.len()];
    for i in 0..func.insts.len() {
        if !map(i) {
            continue;
        }
        let v = func.inst_value(i);
        let [Use::Operand { inst: j, .. }] = uses[v.index()][..] else {
            continue;
        };
        let joins = map(j) && !fed[j] && func.insts[j].ty.dims == func.insts[i].ty.dims;
        if joins && links[i] < super::MAX_POST_IN_REGISTERS {
            next[i] = Some(j);
            links[j] = links[i] + 1;
            fed[j] = true;
        }
    }
    next
}

/// Lowers a standalone elementwise op (unary, binary with broadcasting, batch_norm).
pub(crate) fn lower_map(
    cx: &mut Cx,
    op: MapOp,
    operands: &[Value],
    out_ty: &TensorType,
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let out_dims = &out_ty.dims;
    if out_ty.layout != Layout::RowMajor
        || operands
            .iter()
            .any(|&v| cx.func.type_of(v).layout != Layout::RowMajor)
    {
        if !epi.is_empty() {
            return Err(cx.unsupported("post-ops on an elementwise anchor"));
        }
        if out_ty.layout != Layout::RowMajor {
            return map_on_blocks(cx, op, operands, out_ty, out);
        }
        return map_from_blocks(cx, op, operands, out_ty, out);
    }
    let mut strides: Vec<Vec<i64>> = operands
        .iter()
        .map(|&v| {
            let t = cx.func.type_of(v);
            match op {
                // scale, bias, mean, var are per-channel (axis 1) vectors
                MapOp::BatchNorm { .. } if t.rank() == 1 => {
                    let mut s = vec![0i64; out_dims.len()];
                    s[1] = 1;
                    s
                }
                MapOp::Unary(_) | MapOp::Binary(_) | MapOp::BatchNorm { .. } => {
                    broadcast_strides(&t.dims, out_dims)
                }
            }
        })
        .collect();
    strides.push(row_major_strides(out_dims));
    // With post-ops (a chain of maps, `chained_maps`) the nest runs over the result's
    // own dims, the index the post-ops' operands broadcast against; otherwise over the
    // dims collapsed where every operand runs on.
    let chain = !epi.is_empty();
    if chain && out_dims.is_empty() {
        // `chained_maps` leaves scalars out
        return Err(cx.unsupported("post-ops on a scalar elementwise op"));
    }
    let (dims, st) = match chain {
        true => (out_dims.clone(), strides),
        false => collapse(out_dims, &strides),
    };
    let vectorize = chain || st.iter().all(|s| matches!(s.last(), Some(0 | 1)));

    let name = format!(
        "{}_{}{}",
        op.name(),
        dims_name(out_dims),
        if chain { "_fused" } else { "" }
    );
    let mut b = KernelBuilder::new(&name);
    let (ins, mut args) = declare_inputs(&mut b, cx, operands);
    args.extend(epi.declare(&mut b));
    let y = b.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    let out_st = st[st.len() - 1].clone();
    emit_nest(&mut b, &dims, vectorize, &mut |b, idx, w| {
        let load = |k: usize| load_lanes(ins[k], index_of(&st[k], idx), st[k][st[k].len() - 1], w);
        let v = match op {
            MapOp::Unary(u) => unary(b, u, load(0), w),
            MapOp::Binary(o) => binary(b, o, load(0), load(1), w),
            MapOp::BatchNorm { epsilon } => {
                // (x − mean) · scale / sqrt(var + ε) + bias
                let inv = div(
                    load(1),
                    Expr::unary(UnOp::Sqrt, add(load(4), c(epsilon, w))),
                );
                Expr::fma(Expr::binary(BinOp::Sub, load(0), load(3)), inv, load(2))
            }
        };
        let v = if chain { epi.apply(b, v, idx, w) } else { v };
        b.store(y, index_of(&out_st, idx), v, w);
    });
    cx.step(b.finish(), args)
}

/// The ops the channel-block kernels compute: a [`MapOp`] but batch norm.
#[derive(Clone, Copy)]
enum BlockOp {
    Unary(UnaryOp),
    Binary(BinaryOp),
}

impl BlockOp {
    /// `op` unless it is a batch norm.
    fn of(op: MapOp) -> Option<BlockOp> {
        match op {
            MapOp::Unary(u) => Some(BlockOp::Unary(u)),
            MapOp::Binary(o) => Some(BlockOp::Binary(o)),
            MapOp::BatchNorm { .. } => None,
        }
    }

    /// The op of operands `x` (a unary op reads `x[0]`, a binary one `x[0]` and `x[1]`).
    fn apply(self, b: &mut KernelBuilder, x: &[Expr], width: Width) -> Expr {
        match self {
            BlockOp::Unary(u) => unary(b, u, x[0].clone(), width),
            BlockOp::Binary(o) => binary(b, o, x[0].clone(), x[1].clone(), width),
        }
    }
}

/// A unary or binary op computed in channel blocks (`[n][c/16][h][w][16]`, see
/// [`crate::blocks::elementwise_on_blocks`]): its full-size operands and its result in
/// blocks, the others row-major and broadcast along the channels contiguously (a vector
/// of 4 channels, an SE gate's scale) or not at all (a splat). Per image, block and
/// pixel, each vector of 4 channels as it is stored; a partial block's padded lanes get
/// zeros (its readers compute on whole blocks, against zero weights: the lanes must hold
/// finite values).
fn map_on_blocks(
    cx: &mut Cx,
    op: MapOp,
    operands: &[Value],
    out_ty: &TensorType,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let dims = &out_ty.dims;
    let types: Vec<&TensorType> = operands.iter().map(|&v| cx.func.type_of(v)).collect();
    let fits = out_ty.layout == crate::blocks::CHANNEL_BLOCKS
        && crate::blocks::elementwise_operands_fit_blocks(&types, dims)
        && types
            .iter()
            .all(|t| t.dims != *dims || t.layout == out_ty.layout);
    if !fits {
        return Err(cx.unsupported(
            "a unary or binary op in channel blocks needs its full-size operands in blocks \
             and the others broadcast along the channels",
        ));
    }
    let Some(compute) = BlockOp::of(op) else {
        return Err(cx.unsupported("a batch norm of channel blocks"));
    };
    let blocked: Vec<bool> = types.iter().map(|t| t.dims == *dims).collect();
    let lane = CHANNEL_BLOCK as i64;
    let [n, h, w] = [dims[0], dims[2], dims[3]].map(|d| d as i64);
    let stored = dims[1].div_ceil(CHANNEL_BLOCK) as i64;
    let mut b = KernelBuilder::new(&format!("{}_c16_{}", op.name(), dims_name(dims)));
    let (ins, mut args) = declare_inputs(&mut b, cx, operands);
    let y = b.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    let row_major: Vec<Vec<i64>> = types
        .iter()
        .map(|t| broadcast_strides(&t.dims, dims))
        .collect();
    let w4 = Width::F32x4;
    b.for_loop(0, n, 1, |b, i| {
        let i = Affine::var(i);
        b.for_blocks(dims[1], CHANNEL_BLOCK, |b, cb, channels| {
            let block_at = i.scale(stored).add(cb).scale(h * w * lane);
            b.for_loop(0, h, 1, |b, r| {
                let r = Affine::var(r);
                b.for_loop(0, w, 1, |b, col| {
                    let col = Affine::var(col);
                    let pixel = block_at.add(&r.scale(w * lane)).add(&col.scale(lane));
                    for l0 in (0..channels as i64).step_by(4) {
                        let ch = cb.scale(lane).plus(l0);
                        let xs: Vec<Expr> = (0..operands.len())
                            .map(|k| {
                                if blocked[k] {
                                    return Expr::load(ins[k], pixel.plus(l0), w4);
                                }
                                let s = &row_major[k];
                                let at = i
                                    .scale(s[0])
                                    .add(&ch.scale(s[1]))
                                    .add(&r.scale(s[2]))
                                    .add(&col.scale(s[3]));
                                load_lanes(ins[k], at, s[1], w4)
                            })
                            .collect();
                        let v = compute.apply(b, &xs, w4);
                        b.store(y, pixel.plus(l0), v, w4);
                    }
                    for l0 in (channels as i64..lane).step_by(4) {
                        b.store(y, pixel.plus(l0), Expr::constant(0.0, w4), w4);
                    }
                });
            });
        });
    });
    cx.step(b.finish(), args)
}

/// A unary or binary op whose full-size operands are in channel blocks
/// (`[n][c/16][h][w][16]`, see [`crate::blocks::elementwise_reads_blocks`]) and whose
/// other operands and result are row-major — an SE block's gating `mul`, which reads the
/// depthwise conv's blocks and hands the projection NCHW planes, the layout change
/// folded into the op. Per image, block and row, 4 pixels × 4 channels at a time: four
/// vector loads of a pixel's channels, a transpose in registers, then the op on
/// vectors of 4 pixels of one channel (a broadcast operand's lanes along W: a splat or
/// a vector) and a vector store; the columns past the last 4 go one by one.
fn map_from_blocks(
    cx: &mut Cx,
    op: MapOp,
    operands: &[Value],
    out_ty: &TensorType,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let dims = &out_ty.dims;
    let lane = CHANNEL_BLOCK as i64;
    let blocked: Vec<bool> = operands
        .iter()
        .map(|&v| cx.func.type_of(v).layout != Layout::RowMajor)
        .collect();
    let Some(compute) = BlockOp::of(op) else {
        return Err(cx.unsupported("a batch norm of channel blocks"));
    };
    if dims.len() != 4 || !dims[1].is_multiple_of(4) {
        return Err(cx.unsupported(
            "channel blocks of a result that is not [n, c, h, w] with whole vectors of 4 channels",
        ));
    }
    let [n, h, w] = [dims[0], dims[2], dims[3]].map(|d| d as i64);
    let mut b = KernelBuilder::new(&format!("{}_from_c16_{}", op.name(), dims_name(dims)));
    let (ins, mut args) = declare_inputs(&mut b, cx, operands);
    let y = b.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    // each row-major operand's strides along [n, c, h, w] (broadcast ones 0)
    let row_major: Vec<Vec<i64>> = operands
        .iter()
        .map(|&v| broadcast_strides(&cx.func.type_of(v).dims, dims))
        .collect();
    let out_st = row_major_strides(dims);
    let stored = dims[1].div_ceil(CHANNEL_BLOCK) as i64;
    let w4 = Width::F32x4;
    let main = w / 4 * 4;
    // where row-major operand `k` (or the result, with `out_st`) holds channel `ch` of
    // row `r`, column `col` of image `i`
    let at = |st: &[i64], i: &Affine, ch: &Affine, r: &Affine, col: &Affine| {
        i.scale(st[0])
            .add(&ch.scale(st[1]))
            .add(&r.scale(st[2]))
            .add(&col.scale(st[3]))
    };
    // the first `channels` channels (whole vectors of 4) of block `cb` of image `i`
    let block = |b: &mut KernelBuilder, i: &Affine, cb: &Affine, channels: usize| {
        let (i, cb, channels) = (i.clone(), cb.clone(), channels as i64);
        // the block's storage: [h][w][16] from here
        let block_at = i.scale(stored).add(&cb).scale(h * w * lane);
        b.for_loop(0, h, 1, |b, r| {
            let r = Affine::var(r);
            let pixel = |col: &Affine| block_at.add(&r.scale(w * lane)).add(&col.scale(lane));
            b.for_loop(0, main, 4, |b, col| {
                let col = Affine::var(col);
                for l0 in (0..channels).step_by(4) {
                    let ch0 = cb.scale(lane).plus(l0);
                    // per blocked operand: vectors of 4 pixels, one per channel
                    let mut transposed: Vec<Option<Vec<Expr>>> = Vec::new();
                    for (k, &is_blocked) in blocked.iter().enumerate() {
                        transposed.push(is_blocked.then(|| {
                            let rows: Vec<Expr> = (0..4)
                                .map(|p| {
                                    let at = pixel(&col.plus(p)).plus(l0);
                                    b.let_(Expr::load(ins[k], at, w4), w4)
                                })
                                .collect();
                            super::conv::transpose4(b, &rows)
                        }));
                    }
                    for kk in 0..4 {
                        let ch = ch0.plus(kk);
                        let xs: Vec<Expr> = (0..operands.len())
                            .map(|k| match &transposed[k] {
                                Some(t) => t[kk as usize].clone(),
                                None => {
                                    let s = &row_major[k];
                                    load_lanes(ins[k], at(s, &i, &ch, &r, &col), s[3], w4)
                                }
                            })
                            .collect();
                        let v = compute.apply(b, &xs, w4);
                        b.store(y, at(&out_st, &i, &ch, &r, &col), v, w4);
                    }
                }
            });
            b.for_loop(main, w, 1, |b, col| {
                let col = Affine::var(col);
                b.for_loop(0, channels, 1, |b, l| {
                    let ch = cb.scale(lane).add(&Affine::var(l));
                    let xs: Vec<Expr> = (0..operands.len())
                        .map(|k| {
                            let index = if blocked[k] {
                                pixel(&col).add(&Affine::var(l))
                            } else {
                                at(&row_major[k], &i, &ch, &r, &col)
                            };
                            Expr::load(ins[k], index, Width::Scalar)
                        })
                        .collect();
                    let v = compute.apply(b, &xs, Width::Scalar);
                    b.store(y, at(&out_st, &i, &ch, &r, &col), v, Width::Scalar);
                });
            });
        });
    };
    b.for_loop(0, n, 1, |b, i| {
        let i = Affine::var(i);
        b.for_blocks(dims[1], CHANNEL_BLOCK, |b, cb, channels| {
            block(b, &i, cb, channels)
        });
    });
    cx.step(b.finish(), args)
}

/// Applies an epilogue to a computed tensor: `out = post_ops(src, operands…)`.
pub(crate) fn lower_epilogue(
    cx: &mut Cx,
    src: BufferId,
    out_ty: &TensorType,
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let dims = if out_ty.dims.is_empty() {
        vec![1]
    } else {
        out_ty.dims.clone()
    };
    let mut b = KernelBuilder::new(&format!("epilogue_{}", dims_name(&dims)));
    let sa = b.arg("anchor", cx.len_of(src), Access::Read);
    let mut args = vec![src];
    args.extend(epi.declare(&mut b));
    let ya = b.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    let strides = row_major_strides(&dims);
    let rank = out_ty.rank();
    emit_nest(&mut b, &dims, true, &mut |b, idx, w| {
        let at = index_of(&strides, idx);
        let v = Expr::load(sa, at.clone(), w);
        let v = epi.apply(b, v, &idx[..rank], w);
        b.store(ya, at, v, w);
    });
    cx.step(b.finish(), args)
}

/// `1x64x56x56` for kernel names.
pub fn dims_name(dims: &[usize]) -> String {
    dims.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("x")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_strides_zero_on_broadcast_dims() {
        assert_eq!(
            broadcast_strides(&[64, 1, 1], &[1, 64, 7, 7]),
            vec![0, 1, 0, 0]
        );
        assert_eq!(broadcast_strides(&[2, 3], &[2, 3]), vec![3, 1]);
        assert_eq!(broadcast_strides(&[], &[4, 5]), vec![0, 0]);
    }

    #[test]
    fn collapse_merges_contiguous_dims_only() {
        let out = [2, 3, 4, 5];
        let full = row_major_strides(&out);
        let chan = broadcast_strides(&[3, 1, 1], &out);
        let (dims, st) = collapse(&out, &[full.clone(), chan]);
        assert_eq!(dims, vec![2, 3, 20]);
        assert_eq!(st[0], vec![60, 20, 1]);
        assert_eq!(st[1], vec![0, 1, 0]);
        let (dims, _) = collapse(&out, &[full]);
        assert_eq!(dims, vec![120]);
    }
}
