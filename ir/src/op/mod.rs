//! The closed op table: every tensor op, its operands, attributes and type rule.
//!
//! Adding an op means adding a variant here and then following the compiler's errors:
//! every consumer (printer, parser, interpreter, e-graph mapping, cost model, lowering)
//! matches on [`Op`] exhaustively, without `_ =>` arms.
//!
//! This file holds [`Op`] with its flops, and [`Arity`]; the op table (`kind`: mnemonic,
//! arity, role and attribute payload of every [`OpKind`], from one row per op) drives
//! [`Op::name`], [`Op::arity`], [`Op::is_anchor`] and the e-graph's split into kind and
//! payload. The attribute structs are in `attrs`, the type rules ([`Op::infer_type`]) in
//! `type_rules`, the elementwise ops and their semantics in `elementwise`, fused ops in
//! `fused`, all re-exported here.

mod attrs;
mod elementwise;
mod fused;
mod kind;
mod logic;
mod resize;
mod type_rules;

pub use attrs::{
    Conv2dAttrs, ConvTranspose2dAttrs, GemmAttrs, PadAttrs, PadAxis, PadMode, Pool2dAttrs,
    ReduceAttrs, SliceAttrs,
};
pub use elementwise::{erf, BinaryOp, UnaryOp};
pub use fused::{FusedOp, PostOp};
pub use kind::{Attrs, OpKind, Role};
pub use logic::{Comparison, LogicOp, Reduction};
pub use resize::{CoordinateMode, NearestMode, ResizeAttrs, ResizeMode, Taps};
pub use type_rules::broadcast;

use crate::types::{DType, Layout, TensorType, F32};
use crate::weights::WeightId;

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
    /// A strided window of the input: along each axis, `steps` apart from `starts` up to
    /// (not including) `ends`, steps possibly negative (see [`SliceAttrs`]).
    Slice(SliceAttrs),
    /// `pad(x, value?)`: `x` with positions added (or cropped, for negative pads) at
    /// both ends of each axis, filled by the mode (see [`PadAttrs`]). In `constant` mode
    /// the optional second operand, one element of `x`'s element type, is the fill
    /// (zero or `false` without it); an operand rather than an attribute so integers
    /// stay exact and a run-time value works. Other modes take no second operand.
    Pad(PadAttrs),
    /// Numpy broadcast of the input to `shape` (the result shape; the input broadcasts
    /// to it without growing it).
    Expand {
        /// The result dimensions.
        shape: Vec<usize>,
    },
    /// Repeats the input `repeats[k]` times along each axis `k`.
    Tile {
        /// Copies along each axis (at least 1).
        repeats: Vec<usize>,
    },
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
    /// Converts every element to `to`, as ONNX `Cast` does: float to integer truncates
    /// toward zero and saturates at the type's bounds (NaN becomes 0); integer to float
    /// rounds to nearest even; integer to integer wraps; to `i1` is `!= 0`, from `i1` 0 or 1.
    Cast {
        /// The result's element type.
        to: DType,
    },
    /// Elementwise comparison with numpy broadcasting of two operands of one element
    /// type; the result is `i1`.
    Compare(Comparison),
    /// Elementwise logic on two `i1` operands, with numpy broadcasting.
    Logic(LogicOp),
    /// Elementwise negation of an `i1` operand.
    Not,
    /// `where(cond, a, b)`: `a` where the `i1` condition holds, else `b`; the three
    /// broadcast together, `a` and `b` have one element type.
    Where,
    /// `gather(data, indices)` along `axis`: the result's dims are `data`'s before the
    /// axis, then `indices`' dims, then `data`'s after it. Indices (`i64` or `i32`) may be
    /// negative (counting from the end); one outside `-d..d` is a run-time error.
    Gather {
        /// The axis of `data` the indices select along.
        axis: usize,
    },
    /// A reduction of `f32` data over `attrs.axes` (sum, mean, max or min; sums and means
    /// accumulate in f64 in the interpreter).
    Reduce(Reduction, ReduceAttrs),
    /// Resampling to `attrs.sizes` by nearest (any element type) or linear (`f32`)
    /// interpolation along each resized axis.
    Resize(ResizeAttrs),
    /// An anchor op with a fused elementwise epilogue.
    Fused(FusedOp),
    /// 2-D transposed convolution: `x[N,C,H,W], w[C,O/groups,KH,KW], bias[O]?`; each
    /// input pixel scatters `x * w` onto the output window at `pixel * stride - pad`.
    ConvTranspose2d(ConvTranspose2dAttrs),
}

impl Op {
    /// Text mnemonic (from the op table).
    pub fn name(&self) -> &'static str {
        self.kind().map_or("const", OpKind::name)
    }

    /// Number of operands accepted (from the op table; a fused op's anchor's plus its
    /// post-ops' operands).
    pub fn arity(&self) -> Arity {
        match self {
            Op::Const(_) => Arity::Exact(0),
            Op::Fused(f) => {
                let extra = f.num_post_operands();
                match f.anchor.arity() {
                    Arity::Exact(k) => Arity::Exact(k + extra),
                    Arity::Range(lo, hi) => Arity::Range(lo + extra, hi + extra),
                    Arity::AtLeast(lo) => Arity::AtLeast(lo + extra),
                }
            }
            op => op.kind().and_then(OpKind::arity).unwrap_or(Arity::Exact(0)),
        }
    }

    /// Whether this op may anchor a [`FusedOp`].
    pub fn is_anchor(&self) -> bool {
        self.kind().is_some_and(|k| k.role() == Role::Anchor)
    }

    /// Whether the op only prepares weights (always evaluated at compile time by const folding).
    pub fn is_weight_prep(&self) -> bool {
        self.kind().is_some_and(|k| k.role() == Role::WeightPrep)
    }

    /// Floating-point operations (multiply and add count one each) to compute the result
    /// from operands of these types; the cost model's compute term.
    pub fn flops(&self, operands: &[&TensorType], result: &TensorType) -> u64 {
        let out = result.num_elements() as u64;
        match self {
            Op::Const(_) | Op::Flatten { .. } | Op::Reshape { .. } => 0,
            Op::Transpose { .. } | Op::Concat { .. } | Op::Reorder { .. } => 0,
            Op::Slice(_) | Op::Pad(_) | Op::Expand { .. } | Op::Tile { .. } => 0,
            Op::Gather { .. } | Op::Cast { .. } | Op::Where => 0,
            Op::Compare(_) | Op::Logic(_) | Op::Not => out,
            Op::Reduce(..) => operands.first().map_or(0, |t| t.num_elements() as u64),
            Op::Resize(r) => match r.mode {
                ResizeMode::Nearest(_) => 0,
                ResizeMode::Linear => 4 * out,
            },
            Op::Conv2d(_) => {
                // each output element takes C/groups * KH * KW multiply-adds = |w| / O
                let w = operands
                    .get(1)
                    .map(|t| t.num_elements() as u64)
                    .unwrap_or(0);
                let per_out = w / (result.dims.get(1).copied().unwrap_or(1).max(1) as u64);
                2 * out * per_out
            }
            Op::ConvTranspose2d(_) => {
                // every input element meets O/groups * KH * KW taps: 2 * |x| * |w| / C
                let x = operands.first().map_or(0, |t| t.num_elements() as u64);
                let w = operands.get(1).map_or(0, |t| t.num_elements() as u64);
                let c = operands
                    .get(1)
                    .and_then(|t| t.dims.first().copied())
                    .unwrap_or(1)
                    .max(1) as u64;
                2 * x * (w / c)
            }
            Op::BatchNorm { .. } => 2 * out,
            Op::Unary(u) => out * u.flops(),
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
                        PostOp::Unary(u) => u.flops(),
                        PostOp::Binary { .. } => 1,
                    })
                    .sum();
                f.anchor.flops(&operands[..n_anchor], result) + post * out
            }
        }
    }
}
