//! The closed op table: every tensor op, its operands, attributes and type rule.
//!
//! Adding an op means adding a variant here and then following the compiler's errors:
//! every consumer (printer, parser, interpreter, e-graph mapping, cost model, lowering)
//! matches on [`Op`] exhaustively, without `_ =>` arms.

use crate::types::{DType, Layout, TensorType, F32};
use crate::weights::WeightId;

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
    /// Exact GELU: `0.5 x (1 + erf(x / sqrt 2))`.
    Gelu,
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
}

impl UnaryOp {
    /// Text mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Relu => "relu",
            UnaryOp::Clip { .. } => "clip",
            UnaryOp::LeakyRelu { .. } => "leaky_relu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Erf => "erf",
            UnaryOp::Gelu => "gelu",
            UnaryOp::HardSigmoid { .. } => "hard_sigmoid",
            UnaryOp::HardSwish => "hard_swish",
            UnaryOp::Silu => "silu",
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
            UnaryOp::Gelu => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
            UnaryOp::HardSigmoid { alpha, beta } => {
                (alpha.0 as f64 * x + beta.0 as f64).clamp(0.0, 1.0)
            }
            UnaryOp::HardSwish => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
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
}

impl BinaryOp {
    /// Text mnemonic.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Min => "min",
            BinaryOp::Max => "max",
        }
    }

    /// Whether `a op b == b op a`.
    pub fn is_commutative(self) -> bool {
        match self {
            BinaryOp::Add | BinaryOp::Mul | BinaryOp::Min | BinaryOp::Max => true,
            BinaryOp::Sub | BinaryOp::Div => false,
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
        }
    }
}

/// Attributes of a 2-D convolution (NCHW input, OIHW weights).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Conv2dAttrs {
    /// Stride along H and W.
    pub strides: [usize; 2],
    /// Zero padding `[top, left, bottom, right]` (ONNX order: begins then ends).
    pub pads: [usize; 4],
    /// Dilation along H and W.
    pub dilations: [usize; 2],
    /// Number of groups; `groups == C_in` with one input channel per group is depthwise.
    pub groups: usize,
    /// Layout of the result: row-major, or channels in blocks (`nchw16c`) where the
    /// layout pass chose it for a kernel that writes blocks (text attribute `layout`).
    pub layout: Layout,
}

impl Default for Conv2dAttrs {
    fn default() -> Self {
        Conv2dAttrs {
            strides: [1, 1],
            pads: [0; 4],
            dilations: [1, 1],
            groups: 1,
            layout: Layout::RowMajor,
        }
    }
}

/// Attributes of a 2-D max or average pool over NCHW.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pool2dAttrs {
    /// Window size along H and W.
    pub kernel: [usize; 2],
    /// Stride along H and W.
    pub strides: [usize; 2],
    /// Padding `[top, left, bottom, right]`.
    pub pads: [usize; 4],
    /// Dilation along H and W.
    pub dilations: [usize; 2],
    /// Round the output size up instead of down (windows may start in the end padding).
    pub ceil_mode: bool,
    /// Layout of the result; row-major unless the layout pass chose channel blocks for a
    /// max pool that reads and writes them (text attribute `layout`).
    pub layout: Layout,
}

impl Pool2dAttrs {
    /// Output spatial size along axis `i` (0 = H, 1 = W) for input size `input`.
    pub fn output_size(&self, i: usize, input: usize) -> Option<usize> {
        let span = self.dilations[i] * (self.kernel[i].checked_sub(1)?) + 1;
        let padded = input + self.pads[i] + self.pads[i + 2];
        let room = padded.checked_sub(span)?;
        let s = self.strides[i];
        let mut out = if self.ceil_mode {
            room.div_ceil(s) + 1
        } else {
            room / s + 1
        };
        // ONNX/PyTorch rule: the last window must start inside the input or the begin pad.
        if self.ceil_mode && (out - 1) * s >= input + self.pads[i] {
            out -= 1;
        }
        Some(out)
    }
}

/// Attributes of `gemm`: `alpha * op(A) * op(B) + beta * C`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GemmAttrs {
    /// Scale of the product.
    pub alpha: F32,
    /// Scale of the optional third operand.
    pub beta: F32,
    /// Use `A^T`.
    pub trans_a: bool,
    /// Use `B^T`.
    pub trans_b: bool,
}

impl Default for GemmAttrs {
    fn default() -> Self {
        GemmAttrs {
            alpha: F32(1.0),
            beta: F32(1.0),
            trans_a: false,
            trans_b: false,
        }
    }
}

/// One step of a fused op's epilogue, applied to the anchor's result element by element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PostOp {
    /// `acc = op(acc)`.
    Unary(UnaryOp),
    /// `acc = op(acc, operand)` or, when `acc_is_lhs` is false, `op(operand, acc)`.
    /// The operand is the fused op's next extra operand, broadcast to the result's shape
    /// (a per-channel vector, a scalar, or a full tensor such as a residual).
    Binary {
        /// The binary op.
        op: BinaryOp,
        /// Whether the accumulator is the left operand.
        acc_is_lhs: bool,
    },
}

/// A fused op: an anchor op computing into registers, then an ordered post-op list.
///
/// Operands are the anchor's operands followed by one extra operand per
/// [`PostOp::Binary`], in post-op order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FusedOp {
    /// The op computing the tile: conv2d, gemm, matmul, layer_norm or a pool.
    pub anchor: Box<Op>,
    /// Elementwise steps applied to the anchor's result before it is stored.
    pub post_ops: Vec<PostOp>,
}

impl FusedOp {
    /// Number of extra operands consumed by the post-ops.
    pub fn num_post_operands(&self) -> usize {
        self.post_ops
            .iter()
            .filter(|p| matches!(p, PostOp::Binary { .. }))
            .count()
    }
}

/// How many operands an op takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    /// Exactly this many.
    Exact(usize),
    /// Between the two bounds, inclusive (optional trailing operands).
    Range(usize, usize),
    /// At least this many.
    AtLeast(usize),
}

impl Arity {
    /// Whether `n` operands are accepted.
    pub fn accepts(self, n: usize) -> bool {
        match self {
            Arity::Exact(k) => n == k,
            Arity::Range(lo, hi) => (lo..=hi).contains(&n),
            Arity::AtLeast(lo) => n >= lo,
        }
    }
}

impl std::fmt::Display for Arity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arity::Exact(k) => write!(f, "{k}"),
            Arity::Range(lo, hi) => write!(f, "{lo} to {hi}"),
            Arity::AtLeast(lo) => write!(f, "at least {lo}"),
        }
    }
}

/// Every tensor op. Each op has exactly one result.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// A module weight (`const @name`); no operands.
    Const(WeightId),
    /// 2-D convolution: `x[N,C,H,W], w[O,C/groups,KH,KW], bias[O]?`.
    Conv2d(Conv2dAttrs),
    /// Inference batch norm: `x[N,C,...], scale[C], bias[C], mean[C], var[C]`.
    BatchNorm {
        /// Added to the variance before the square root.
        epsilon: F32,
    },
    /// Elementwise unary op.
    Unary(UnaryOp),
    /// Elementwise binary op with numpy broadcasting.
    Binary(BinaryOp),
    /// Layer normalization over axes `axis..rank`: `x, scale, bias?`.
    LayerNorm {
        /// First normalized axis.
        axis: usize,
        /// Added to the variance.
        epsilon: F32,
    },
    /// 2-D max pool over NCHW; padding never wins the max.
    MaxPool2d(Pool2dAttrs),
    /// 2-D average pool over NCHW.
    AvgPool2d {
        /// Window geometry.
        pool: Pool2dAttrs,
        /// Divide by the full window size (true) or by the number of input elements (false).
        count_include_pad: bool,
    },
    /// Mean over H and W: `[N,C,H,W] -> [N,C,1,1]`.
    GlobalAvgPool,
    /// Collapses `[d0..d(axis-1)]` and `[d(axis)..]` into a 2-D tensor.
    Flatten {
        /// First axis of the second dimension.
        axis: usize,
    },
    /// Same elements, new static shape.
    Reshape {
        /// Target dimensions.
        shape: Vec<usize>,
    },
    /// Permutes dimensions: result dim `i` is input dim `perm[i]`.
    Transpose {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// Numpy matmul: batched, with broadcasting of leading dimensions.
    MatMul,
    /// `alpha * op(A) * op(B) + beta * C` with 2-D `A`, `B` and broadcastable `C`.
    Gemm(GemmAttrs),
    /// Concatenation along `axis`.
    Concat {
        /// The axis.
        axis: usize,
    },
    /// Softmax along `axis`.
    Softmax {
        /// The axis.
        axis: usize,
    },
    /// Copies a tensor into another layout; the only op that changes layout.
    Reorder {
        /// Layout of the result.
        layout: Layout,
    },
    /// Weight preparation for BN folding: `w[O,...], scale[O], var[O] ->
    /// w * scale / sqrt(var + epsilon)` per output channel. Evaluated at compile time.
    BnFoldWeight {
        /// The batch norm's epsilon.
        epsilon: F32,
    },
    /// Weight preparation for BN folding: `scale, bias, mean, var, conv_bias? ->
    /// (conv_bias - mean) * scale / sqrt(var + epsilon) + bias` (conv_bias = 0 when absent).
    BnFoldBias {
        /// The batch norm's epsilon.
        epsilon: F32,
    },
    /// Weight preparation for BN as a per-channel affine map over NCHW: `scale[C], var[C]
    /// -> scale / sqrt(var + epsilon)` shaped `[C,1,1]`. Evaluated at compile time.
    BnScale {
        /// The batch norm's epsilon.
        epsilon: F32,
    },
    /// Weight preparation for BN as a per-channel affine map over NCHW: `scale, bias, mean,
    /// var -> bias - mean * scale / sqrt(var + epsilon)` shaped `[C,1,1]`. Compile time.
    BnShift {
        /// The batch norm's epsilon.
        epsilon: F32,
    },
    /// Weight preparation: `w[O,...], s -> w * s[o]` along `w`'s first axis, where `s`
    /// holds `O` values in any shape (`[O]`, `[O,1,1]`, `[1,O,1,1]`). Compile time.
    ChannelScale,
    /// Weight preparation: the values of a per-channel constant (`[1,C,1,1]`, `[C,1,1]`)
    /// as a vector `[C]`, e.g. to become a conv bias. Compile time.
    ChannelVector,
    /// Weight preparation: `w[O,C/g,KH,KW], t (C values) -> b[O]` with
    /// `b[o] = sum over c, kh, kw of w[o,c,kh,kw] * t[group(o) * C/g + c]`: the bias that
    /// adding `t` per input channel before an unpadded conv contributes. Compile time.
    ConvShiftBias,
    /// An anchor op with a fused elementwise epilogue.
    Fused(FusedOp),
}

impl Op {
    /// Text mnemonic.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Const(_) => "const",
            Op::Conv2d(_) => "conv2d",
            Op::BatchNorm { .. } => "batch_norm",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::LayerNorm { .. } => "layer_norm",
            Op::MaxPool2d(_) => "max_pool2d",
            Op::AvgPool2d { .. } => "avg_pool2d",
            Op::GlobalAvgPool => "global_avg_pool",
            Op::Flatten { .. } => "flatten",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::MatMul => "matmul",
            Op::Gemm(_) => "gemm",
            Op::Concat { .. } => "concat",
            Op::Softmax { .. } => "softmax",
            Op::Reorder { .. } => "reorder",
            Op::BnFoldWeight { .. } => "bn_fold_weight",
            Op::BnFoldBias { .. } => "bn_fold_bias",
            Op::BnScale { .. } => "bn_scale",
            Op::BnShift { .. } => "bn_shift",
            Op::ChannelScale => "channel_scale",
            Op::ChannelVector => "channel_vector",
            Op::ConvShiftBias => "conv_shift_bias",
            Op::Fused(_) => "fused",
        }
    }

    /// Number of operands accepted.
    pub fn arity(&self) -> Arity {
        match self {
            Op::Const(_) => Arity::Exact(0),
            Op::Conv2d(_) => Arity::Range(2, 3),
            Op::BatchNorm { .. } => Arity::Exact(5),
            Op::Unary(_) => Arity::Exact(1),
            Op::Binary(_) => Arity::Exact(2),
            Op::LayerNorm { .. } => Arity::Range(2, 3),
            Op::MaxPool2d(_) | Op::AvgPool2d { .. } | Op::GlobalAvgPool => Arity::Exact(1),
            Op::Flatten { .. } | Op::Reshape { .. } | Op::Transpose { .. } => Arity::Exact(1),
            Op::MatMul => Arity::Exact(2),
            Op::Gemm(_) => Arity::Range(2, 3),
            Op::Concat { .. } => Arity::AtLeast(1),
            Op::Softmax { .. } | Op::Reorder { .. } => Arity::Exact(1),
            Op::BnFoldWeight { .. } => Arity::Exact(3),
            Op::BnFoldBias { .. } => Arity::Range(4, 5),
            Op::BnScale { .. } => Arity::Exact(2),
            Op::BnShift { .. } => Arity::Exact(4),
            Op::ChannelScale | Op::ConvShiftBias => Arity::Exact(2),
            Op::ChannelVector => Arity::Exact(1),
            Op::Fused(f) => {
                let extra = f.num_post_operands();
                match f.anchor.arity() {
                    Arity::Exact(k) => Arity::Exact(k + extra),
                    Arity::Range(lo, hi) => Arity::Range(lo + extra, hi + extra),
                    Arity::AtLeast(lo) => Arity::AtLeast(lo + extra),
                }
            }
        }
    }

    /// Whether this op may anchor a [`FusedOp`].
    pub fn is_anchor(&self) -> bool {
        match self {
            Op::Conv2d(_)
            | Op::Gemm(_)
            | Op::MatMul
            | Op::LayerNorm { .. }
            | Op::MaxPool2d(_)
            | Op::AvgPool2d { .. }
            | Op::GlobalAvgPool => true,
            Op::Const(_)
            | Op::BatchNorm { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Flatten { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Concat { .. }
            | Op::Softmax { .. }
            | Op::Reorder { .. }
            | Op::BnFoldWeight { .. }
            | Op::BnFoldBias { .. }
            | Op::BnScale { .. }
            | Op::BnShift { .. }
            | Op::ChannelScale
            | Op::ChannelVector
            | Op::ConvShiftBias
            | Op::Fused(_) => false,
        }
    }

    /// Whether the op only prepares weights (always evaluated at compile time by const folding).
    pub fn is_weight_prep(&self) -> bool {
        matches!(
            self,
            Op::BnFoldWeight { .. }
                | Op::BnFoldBias { .. }
                | Op::BnScale { .. }
                | Op::BnShift { .. }
                | Op::ChannelScale
                | Op::ChannelVector
                | Op::ConvShiftBias
        )
    }

    /// The type rule: the result type for these operand types, or a message saying
    /// which operand or attribute is wrong. Operand counts are checked by the caller
    /// against [`Op::arity`]; this checks them again so it never indexes out of bounds.
    ///
    /// Computing ops take row-major operands except where noted; `reorder` and
    /// layout-aware kernels introduced by the layout pass are the exceptions.
    pub fn infer_type(
        &self,
        operands: &[&TensorType],
        weight_type: &dyn Fn(WeightId) -> Option<TensorType>,
    ) -> Result<TensorType, String> {
        let arity = self.arity();
        if !arity.accepts(operands.len()) {
            return Err(format!(
                "'{}' takes {arity} operands, got {}",
                self.name(),
                operands.len()
            ));
        }
        for (i, t) in operands.iter().enumerate() {
            if t.dtype != DType::F32 {
                return Err(format!(
                    "operand {i} of '{}' must be f32, got {}",
                    self.name(),
                    t.dtype.name()
                ));
            }
        }
        let out = match self {
            Op::Const(id) => weight_type(*id).ok_or_else(|| format!("unknown weight {}", id.0))?,
            Op::Conv2d(a) => conv2d_type(a, operands)?,
            Op::BatchNorm { .. } => {
                let x = operands[0];
                if x.rank() < 2 {
                    return Err(format!("batch_norm input must have rank >= 2, got {x}"));
                }
                let c = x.dims[1];
                for (i, name) in ["scale", "bias", "mean", "var"].iter().enumerate() {
                    expect_vector(operands[i + 1], c, name, "input channel count")?;
                }
                plain(x.clone())
            }
            Op::Unary(_) => plain(operands[0].clone()),
            Op::Binary(_) => {
                let dims = broadcast(&operands[0].dims, &operands[1].dims)?;
                TensorType::f32(dims)
            }
            Op::LayerNorm { axis, .. } => {
                let x = operands[0];
                if *axis >= x.rank() {
                    return Err(format!("layer_norm axis {axis} out of range for {x}"));
                }
                let norm = &x.dims[*axis..];
                for (i, t) in operands[1..].iter().enumerate() {
                    if t.dims != norm {
                        return Err(format!(
                            "layer_norm {} has shape {t}, expected dims {norm:?}",
                            ["scale", "bias"][i]
                        ));
                    }
                }
                plain(x.clone())
            }
            Op::MaxPool2d(p) | Op::AvgPool2d { pool: p, .. } => {
                let x = expect_rank(operands[0], 4, "pool input")?;
                if p.kernel.contains(&0) || p.strides.contains(&0) || p.dilations.contains(&0) {
                    return Err("pool kernel, strides and dilations must be positive".into());
                }
                if p.pads[0] >= p.kernel[0] * p.dilations[0]
                    || p.pads[1] >= p.kernel[1] * p.dilations[1]
                    || p.pads[2] >= p.kernel[0] * p.dilations[0]
                    || p.pads[3] >= p.kernel[1] * p.dilations[1]
                {
                    return Err(format!(
                        "pool pads {:?} must be smaller than the window {:?}",
                        p.pads, p.kernel
                    ));
                }
                let oh = p.output_size(0, x.dims[2]);
                let ow = p.output_size(1, x.dims[3]);
                let result = match (oh, ow) {
                    (Some(oh), Some(ow)) if oh > 0 && ow > 0 => {
                        TensorType::f32([x.dims[0], x.dims[1], oh, ow]).with_layout(p.layout)
                    }
                    _ => return Err(format!("pool window {:?} does not fit input {x}", p.kernel)),
                };
                if let Layout::Blocked { axis, block } = p.layout {
                    if axis != 1 || block == 0 || !result.dims[1].is_multiple_of(block as usize) {
                        return Err(format!(
                            "pool result layout {:?} does not fit {result}",
                            p.layout
                        ));
                    }
                }
                result
            }
            Op::GlobalAvgPool => {
                let x = operands[0];
                if x.rank() < 3 {
                    return Err(format!(
                        "global_avg_pool input must have rank >= 3, got {x}"
                    ));
                }
                let mut dims = x.dims.clone();
                for d in &mut dims[2..] {
                    *d = 1;
                }
                TensorType::f32(dims)
            }
            Op::Flatten { axis } => {
                let x = operands[0];
                if *axis > x.rank() {
                    return Err(format!("flatten axis {axis} out of range for {x}"));
                }
                let outer: usize = x.dims[..*axis].iter().product();
                let inner: usize = x.dims[*axis..].iter().product();
                TensorType::f32([outer, inner])
            }
            Op::Reshape { shape } => {
                let x = operands[0];
                let want = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
                if want != Some(x.num_elements()) {
                    return Err(format!(
                        "reshape of {x} ({} elements) to {shape:?} changes the element count",
                        x.num_elements()
                    ));
                }
                TensorType::f32(shape.clone())
            }
            Op::Transpose { perm } => {
                let x = operands[0];
                let mut seen = vec![false; x.rank()];
                if perm.len() != x.rank() {
                    return Err(format!(
                        "transpose perm {perm:?} does not match rank of {x}"
                    ));
                }
                for &p in perm {
                    if p >= x.rank() || std::mem::replace(&mut seen[p], true) {
                        return Err(format!("transpose perm {perm:?} is not a permutation"));
                    }
                }
                TensorType::f32(perm.iter().map(|&p| x.dims[p]).collect::<Vec<_>>())
            }
            Op::MatMul => matmul_type(operands[0], operands[1])?,
            Op::Gemm(g) => {
                let a = expect_rank(operands[0], 2, "gemm A")?;
                let b = expect_rank(operands[1], 2, "gemm B")?;
                let (m, ka) = if g.trans_a {
                    (a.dims[1], a.dims[0])
                } else {
                    (a.dims[0], a.dims[1])
                };
                let (kb, n) = if g.trans_b {
                    (b.dims[1], b.dims[0])
                } else {
                    (b.dims[0], b.dims[1])
                };
                if ka != kb {
                    return Err(format!(
                        "gemm inner dimensions differ: A gives K = {ka}, B gives K = {kb}"
                    ));
                }
                if let Some(c) = operands.get(2) {
                    let bc = broadcast(&c.dims, &[m, n])?;
                    if bc != [m, n] {
                        return Err(format!("gemm C {c} does not broadcast to [{m}, {n}]"));
                    }
                }
                TensorType::f32([m, n])
            }
            Op::Concat { axis } => {
                let first = operands[0];
                if *axis >= first.rank() {
                    return Err(format!("concat axis {axis} out of range for {first}"));
                }
                let mut dims = first.dims.clone();
                for (i, t) in operands.iter().enumerate().skip(1) {
                    let same_rest = t.rank() == first.rank()
                        && t.dims
                            .iter()
                            .zip(&first.dims)
                            .enumerate()
                            .all(|(k, (a, b))| k == *axis || a == b);
                    if !same_rest {
                        return Err(format!(
                            "concat operand {i} {t} does not match {first} outside axis {axis}"
                        ));
                    }
                    dims[*axis] += t.dims[*axis];
                }
                TensorType::f32(dims)
            }
            Op::Softmax { axis } => {
                let x = operands[0];
                if *axis >= x.rank() {
                    return Err(format!("softmax axis {axis} out of range for {x}"));
                }
                plain(x.clone())
            }
            Op::Reorder { layout } => {
                let x = operands[0];
                if let Layout::Blocked { axis, block } = layout {
                    if *axis as usize >= x.rank() || *block == 0 {
                        return Err(format!("layout {layout:?} does not fit {x}"));
                    }
                }
                x.with_layout(*layout)
            }
            Op::BnFoldWeight { .. } => {
                let w = operands[0];
                if w.rank() < 1 {
                    return Err("bn_fold_weight weight must have rank >= 1".into());
                }
                expect_vector(operands[1], w.dims[0], "scale", "output channel count")?;
                expect_vector(operands[2], w.dims[0], "var", "output channel count")?;
                plain(w.clone())
            }
            Op::BnFoldBias { .. } => {
                let c = operands[0].dims.first().copied().unwrap_or(0);
                for (i, t) in operands.iter().enumerate() {
                    let name = ["scale", "bias", "mean", "var", "conv_bias"][i];
                    expect_vector(t, c, name, "channel count")?;
                }
                TensorType::f32([c])
            }
            Op::BnScale { .. } | Op::BnShift { .. } => {
                let c = operands[0].dims.first().copied().unwrap_or(0);
                let names: &[&str] = match self {
                    Op::BnScale { .. } => &["scale", "var"],
                    _ => &["scale", "bias", "mean", "var"],
                };
                for (t, name) in operands.iter().zip(names) {
                    expect_vector(t, c, name, "channel count")?;
                }
                TensorType::f32([c, 1, 1])
            }
            Op::ChannelScale => {
                let (w, s) = (operands[0], operands[1]);
                let o = w.dims.first().copied().unwrap_or(0);
                if w.rank() < 1 || s.num_elements() != o {
                    return Err(format!(
                        "channel_scale needs one scale per index of the first axis of {w}, got {s}"
                    ));
                }
                plain(w.clone())
            }
            Op::ChannelVector => TensorType::f32([operands[0].num_elements()]),
            Op::ConvShiftBias => {
                let w = expect_rank(operands[0], 4, "conv_shift_bias weight")?;
                let t = operands[1];
                let (o, cg) = (w.dims[0], w.dims[1]);
                let c = t.num_elements();
                let groups_fit =
                    cg > 0 && c >= cg && c.is_multiple_of(cg) && o.is_multiple_of(c / cg);
                if !groups_fit {
                    return Err(format!(
                        "conv_shift_bias: {t} has no whole number of groups of the {cg} input channels of weight {w}"
                    ));
                }
                TensorType::f32([o])
            }
            Op::Fused(f) => {
                if !f.anchor.is_anchor() {
                    return Err(format!("'{}' cannot anchor a fused op", f.anchor.name()));
                }
                let n_anchor = operands.len() - f.num_post_operands();
                let acc = f.anchor.infer_type(&operands[..n_anchor], weight_type)?;
                for (i, t) in operands[n_anchor..].iter().enumerate() {
                    let b = broadcast(&acc.dims, &t.dims)?;
                    if b != acc.dims {
                        return Err(format!(
                            "post-op operand {i} {t} does not broadcast to the anchor result {acc}"
                        ));
                    }
                }
                acc
            }
        };
        out.check_size()?;
        Ok(out)
    }

    /// Floating-point operations (multiply and add count one each) to compute the result
    /// from operands of these types; the cost model's compute term.
    pub fn flops(&self, operands: &[&TensorType], result: &TensorType) -> u64 {
        let out = result.num_elements() as u64;
        match self {
            Op::Const(_) | Op::Flatten { .. } | Op::Reshape { .. } => 0,
            Op::Transpose { .. } | Op::Concat { .. } | Op::Reorder { .. } => 0,
            Op::Conv2d(_) => {
                // each output element takes C/groups * KH * KW multiply-adds = |w| / O
                let w = operands
                    .get(1)
                    .map(|t| t.num_elements() as u64)
                    .unwrap_or(0);
                let per_out = w / (result.dims.get(1).copied().unwrap_or(1).max(1) as u64);
                2 * out * per_out
            }
            Op::BatchNorm { .. } => 2 * out,
            Op::Unary(u) => out * unary_flops(*u),
            Op::Binary(_) => out,
            Op::LayerNorm { .. } => 8 * out,
            Op::MaxPool2d(p) | Op::AvgPool2d { pool: p, .. } => {
                out * (p.kernel[0] * p.kernel[1]) as u64
            }
            Op::GlobalAvgPool => operands
                .first()
                .map(|t| t.num_elements() as u64)
                .unwrap_or(0),
            Op::MatMul | Op::Gemm(_) => {
                let a = operands.first().map(|t| t.dims.clone()).unwrap_or_default();
                let k = match self {
                    Op::Gemm(g) if g.trans_a => a.first().copied().unwrap_or(0),
                    _ => a.last().copied().unwrap_or(0),
                };
                2 * out * k as u64
            }
            Op::Softmax { .. } => 5 * out,
            Op::BnFoldWeight { .. } | Op::BnFoldBias { .. } => 0,
            Op::BnScale { .. } | Op::BnShift { .. } | Op::ChannelScale => 0,
            Op::ChannelVector | Op::ConvShiftBias => 0,
            Op::Fused(f) => {
                let n_anchor = operands.len() - f.num_post_operands();
                let post: u64 = f
                    .post_ops
                    .iter()
                    .map(|p| match p {
                        PostOp::Unary(u) => unary_flops(*u),
                        PostOp::Binary { .. } => 1,
                    })
                    .sum();
                f.anchor.flops(&operands[..n_anchor], result) + post * out
            }
        }
    }
}

fn unary_flops(u: UnaryOp) -> u64 {
    match u {
        UnaryOp::Relu | UnaryOp::Clip { .. } | UnaryOp::LeakyRelu { .. } => 1,
        UnaryOp::HardSigmoid { .. } | UnaryOp::HardSwish => 4,
        UnaryOp::Sigmoid | UnaryOp::Tanh | UnaryOp::Silu => 20,
        UnaryOp::Erf | UnaryOp::Gelu => 30,
    }
}

fn plain(t: TensorType) -> TensorType {
    t.with_layout(Layout::RowMajor)
}

fn expect_rank<'a>(t: &'a TensorType, rank: usize, what: &str) -> Result<&'a TensorType, String> {
    if t.rank() == rank {
        Ok(t)
    } else {
        Err(format!("{what} must have rank {rank}, got {t}"))
    }
}

fn expect_vector(t: &TensorType, len: usize, name: &str, what: &str) -> Result<(), String> {
    if t.dims == [len] {
        Ok(())
    } else {
        Err(format!(
            "{name} has shape {t}, expected tensor<{len}xf32> to match the {what} {len}"
        ))
    }
}

fn conv2d_type(a: &Conv2dAttrs, operands: &[&TensorType]) -> Result<TensorType, String> {
    let x = expect_rank(operands[0], 4, "conv2d input")?;
    let w = expect_rank(operands[1], 4, "conv2d weight")?;
    if a.strides.contains(&0) || a.dilations.contains(&0) || a.groups == 0 {
        return Err("conv2d strides, dilations and groups must be positive".into());
    }
    let [n, c, h, wd] = [x.dims[0], x.dims[1], x.dims[2], x.dims[3]];
    let [o, cg, kh, kw] = [w.dims[0], w.dims[1], w.dims[2], w.dims[3]];
    if c % a.groups != 0 || o % a.groups != 0 {
        return Err(format!(
            "conv2d groups = {} must divide input channels {c} and output channels {o}",
            a.groups
        ));
    }
    if cg * a.groups != c {
        return Err(format!(
            "conv2d weight has {cg} input channels per group, input has {c} channels in {} groups",
            a.groups
        ));
    }
    if let Some(b) = operands.get(2) {
        expect_vector(b, o, "conv2d bias", "output channel count")?;
    }
    let out = |i: usize, input: usize, k: usize| -> Option<usize> {
        let span = a.dilations[i] * (k.checked_sub(1)?) + 1;
        let padded = input + a.pads[i] + a.pads[i + 2];
        Some(padded.checked_sub(span)? / a.strides[i] + 1)
    };
    match (out(0, h, kh), out(1, wd, kw)) {
        (Some(oh), Some(ow)) => {
            let result = TensorType::f32([n, o, oh, ow]).with_layout(a.layout);
            if let Layout::Blocked { axis, block } = a.layout {
                if axis >= 4 || block == 0 {
                    return Err(format!("conv2d result layout {a:?} does not fit {result}"));
                }
            }
            Ok(result)
        }
        _ => Err(format!(
            "conv2d kernel {kh}x{kw} (dilations {:?}) does not fit the padded input {h}x{wd}",
            a.dilations
        )),
    }
}

/// Numpy broadcasting of two shapes.
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(format!(
                    "shapes {a:?} and {b:?} do not broadcast (dimension {i}: {da} vs {db})"
                ))
            }
        };
    }
    Ok(out)
}

fn matmul_type(a: &TensorType, b: &TensorType) -> Result<TensorType, String> {
    if a.rank() == 0 || b.rank() == 0 {
        return Err("matmul operands must have rank >= 1".into());
    }
    let a2 = if a.rank() == 1 {
        vec![1, a.dims[0]]
    } else {
        a.dims.clone()
    };
    let b2 = if b.rank() == 1 {
        vec![b.dims[0], 1]
    } else {
        b.dims.clone()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (kb, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != kb {
        return Err(format!(
            "matmul inner dimensions differ: {a} @ {b} ({k} vs {kb})"
        ));
    }
    let mut dims = broadcast(&a2[..a2.len() - 2], &b2[..b2.len() - 2])?;
    if a.rank() > 1 {
        dims.push(m);
    }
    if b.rank() > 1 {
        dims.push(n);
    }
    Ok(TensorType::f32(dims))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_weights(_: WeightId) -> Option<TensorType> {
        None
    }

    #[test]
    fn conv_output_shape_with_stride_pads_dilation() {
        let x = TensorType::f32([1, 4, 10, 9]);
        let w = TensorType::f32([6, 2, 3, 3]);
        let op = Op::Conv2d(Conv2dAttrs {
            strides: [2, 1],
            pads: [1, 0, 2, 1],
            dilations: [1, 2],
            groups: 2,
            layout: Layout::RowMajor,
        });
        let t = op.infer_type(&[&x, &w], &no_weights).unwrap();
        // H: (10 + 3 - 3) / 2 + 1 = 6; W: (9 + 1 - 5) / 1 + 1 = 6
        assert_eq!(t.dims, vec![1, 6, 6, 6]);
    }

    #[test]
    fn conv_result_takes_the_layout_attribute() {
        let blocks = Layout::Blocked { axis: 1, block: 16 };
        let x = TensorType::f32([1, 32, 5, 5]);
        let w = TensorType::f32([48, 32, 1, 1]);
        let conv = |layout| {
            Op::Conv2d(Conv2dAttrs {
                layout,
                ..Conv2dAttrs::default()
            })
        };
        let t = conv(blocks).infer_type(&[&x.with_layout(blocks), &w], &no_weights);
        assert_eq!(
            t.unwrap(),
            TensorType::f32([1, 48, 5, 5]).with_layout(blocks)
        );
        let bad = Layout::Blocked { axis: 4, block: 8 };
        let e = conv(bad).infer_type(&[&x, &w], &no_weights).unwrap_err();
        assert!(e.contains("does not fit"), "{e}");
    }

    #[test]
    fn pool_ceil_mode_drops_window_starting_in_end_pad() {
        let p = Pool2dAttrs {
            kernel: [2, 2],
            strides: [2, 2],
            pads: [0, 0, 1, 1],
            dilations: [1, 1],
            ceil_mode: true,
            layout: Layout::RowMajor,
        };
        // input 4, padded 5: floor gives 2, ceil gives 3 but window 3 starts at 4 = in the pad
        assert_eq!(p.output_size(0, 4), Some(2));
        assert_eq!(p.output_size(0, 5), Some(3));
    }

    #[test]
    fn broadcast_rules() {
        assert_eq!(
            broadcast(&[1, 64, 1, 1], &[2, 64, 7, 7]).unwrap(),
            vec![2, 64, 7, 7]
        );
        assert_eq!(
            broadcast(&[64, 1, 1], &[1, 64, 7, 7]).unwrap(),
            vec![1, 64, 7, 7]
        );
        assert!(broadcast(&[3], &[4]).is_err());
    }

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
