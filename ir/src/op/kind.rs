//! The op table: one row per op kind, the single definition of its mnemonic, arity,
//! role, and attribute payload, from which [`OpKind`], the mnemonic lookup, the arity
//! and role queries, and the split of an [`Op`] into kind and payload (and back) are
//! generated. The e-graph language (smelt-passes) uses these kinds and payloads as they
//! are, so it mirrors nothing by hand.
//!
//! Unary and binary elementwise ops get one kind per operator (`relu`, `add`, ...);
//! `const` is not a kind (weights are leaves of every graph form). A row reads
//!
//! ```text
//! Kind "mnemonic" arity, role: (Op form) <=> (payload form);
//! ```
//!
//! where the two forms are written with the same bindings, so each serves as pattern
//! and as constructor: `Clip "clip" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Clip
//! { min, max })) <=> (Attrs::Clip { min, max });`. Adding an op is adding its row (and
//! its variant, type rule and flops in this module's siblings); the compiler then lists
//! every other site, since nothing matches ops with `_ =>`.

use super::{
    Arity, BinaryOp, Comparison, Conv2dAttrs, ConvTranspose2dAttrs, FusedOp, GemmAttrs, LogicOp,
    Op, PadAttrs, Pool2dAttrs, ReduceAttrs, Reduction, ResizeAttrs, SliceAttrs, UnaryOp,
};
use crate::types::{DType, Layout, F32};

/// What an op is for, beyond computing its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An ordinary op.
    Plain,
    /// An elementwise op ([`UnaryOp`], [`BinaryOp`]): it may be a post-op of a fused op.
    Elementwise,
    /// It may anchor a [`FusedOp`] (a conv, GEMM, norm or pool with an epilogue).
    Anchor,
    /// It only prepares weights: always evaluated at compile time by const folding.
    WeightPrep,
}

/// An op's attribute payload, keyed by attribute structure rather than by op, so ops
/// with the same attributes share it (a rule can pass a `batch_norm`'s epsilon straight
/// to `bn_fold_weight`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Attrs {
    /// Ops without attributes.
    None,
    /// `batch_norm` and the BN weight-prep ops (`bn_fold_weight`, `bn_scale`, ...).
    Epsilon(F32),
    /// `conv2d`.
    Conv2d(Conv2dAttrs),
    /// `clip`.
    Clip {
        /// Lower bound.
        min: F32,
        /// Upper bound.
        max: F32,
    },
    /// `leaky_relu` slope.
    Alpha(F32),
    /// `hard_sigmoid`.
    HardSigmoid {
        /// Slope.
        alpha: F32,
        /// Offset.
        beta: F32,
    },
    /// `layer_norm`.
    LayerNorm {
        /// First normalized axis.
        axis: usize,
        /// Added to the variance.
        epsilon: F32,
    },
    /// `max_pool2d`.
    Pool(Pool2dAttrs),
    /// `avg_pool2d`.
    AvgPool {
        /// Window geometry.
        pool: Pool2dAttrs,
        /// Divisor includes padding.
        count_include_pad: bool,
    },
    /// `flatten`, `concat`, `softmax`, `gather`.
    Axis(usize),
    /// `cast` target element type.
    DType(DType),
    /// The reductions' axes.
    Reduce(ReduceAttrs),
    /// `resize`.
    Resize(ResizeAttrs),
    /// `reshape` and `expand` target shape, `transpose` permutation or `tile` repeats.
    Dims(Vec<usize>),
    /// `gemm`.
    Gemm(GemmAttrs),
    /// `slice` window.
    Slice(SliceAttrs),
    /// `pad` pads and mode.
    Pad(PadAttrs),
    /// `reorder` target layout.
    Layout(Layout),
    /// `fused`: the anchor op (with its attributes) and the post-op list.
    Fused(FusedOp),
    /// `conv_transpose2d`.
    ConvTranspose2d(ConvTranspose2dAttrs),
}

macro_rules! op_table {
    ($(
        $(#[$doc:meta])*
        $kind:ident $name:literal $arity:expr, $role:ident: ($($op:tt)+) <=> ($($attrs:tt)+);
    )*) => {
        /// The kind of an op: one per row of the op table (unary and binary ops are one
        /// kind per operator; `const` is not a kind).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpKind {
            $(
                #[doc = concat!("`", $name, "` (see [`Op`] for its operands and semantics).")]
                $(#[$doc])*
                $kind,
            )*
        }

        impl OpKind {
            /// Every kind, in table order.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$kind),*];

            /// The mnemonic of the text form (`conv2d`, `relu`, `add`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $(OpKind::$kind => $name,)*
                }
            }

            /// Operands accepted; `None` for `fused`, whose count depends on its post-ops.
            pub fn arity(self) -> Option<Arity> {
                #[allow(unused_imports)]
                use Arity::{AtLeast, Exact, Range};
                match self {
                    $(OpKind::$kind => $arity,)*
                }
            }

            /// What the op is for.
            pub fn role(self) -> Role {
                match self {
                    $(OpKind::$kind => Role::$role,)*
                }
            }

            /// Rebuilds the op from its payload; `None` when the payload does not fit the
            /// kind (a user rule that wired a `conv2d`'s attributes into a `clip`, say).
            pub fn join(self, attrs: &Attrs) -> Option<Op> {
                match self {
                    $(OpKind::$kind => match attrs.clone() {
                        $($attrs)+ => Some($($op)+),
                        // a payload of another structure
                        _ => None,
                    },)*
                }
            }
        }

        impl Op {
            /// The op's kind; `None` for `const`.
            #[allow(unused_variables)]
            pub fn kind(&self) -> Option<OpKind> {
                match self {
                    Op::Const(_) => None,
                    $($($op)+ => Some(OpKind::$kind),)*
                }
            }

            /// The op's kind and attribute payload; `None` for `const` (a leaf).
            pub fn split(&self) -> Option<(OpKind, Attrs)> {
                match self.clone() {
                    Op::Const(_) => None,
                    $($($op)+ => Some((OpKind::$kind, $($attrs)+)),)*
                }
            }
        }
    };
}

op_table! {
    Conv2d "conv2d" Some(Range(2, 3)), Anchor: (Op::Conv2d(a)) <=> (Attrs::Conv2d(a));
    BatchNorm "batch_norm" Some(Exact(5)), Plain: (Op::BatchNorm { epsilon }) <=> (Attrs::Epsilon(epsilon));
    Relu "relu" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Relu)) <=> (Attrs::None);
    Clip "clip" Some(Exact(1)), Elementwise:
        (Op::Unary(UnaryOp::Clip { min, max })) <=> (Attrs::Clip { min, max });
    LeakyRelu "leaky_relu" Some(Exact(1)), Elementwise:
        (Op::Unary(UnaryOp::LeakyRelu { alpha })) <=> (Attrs::Alpha(alpha));
    Sigmoid "sigmoid" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Sigmoid)) <=> (Attrs::None);
    Tanh "tanh" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Tanh)) <=> (Attrs::None);
    Erf "erf" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Erf)) <=> (Attrs::None);
    Gelu "gelu" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Gelu)) <=> (Attrs::None);
    HardSigmoid "hard_sigmoid" Some(Exact(1)), Elementwise:
        (Op::Unary(UnaryOp::HardSigmoid { alpha, beta })) <=> (Attrs::HardSigmoid { alpha, beta });
    HardSwish "hard_swish" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::HardSwish)) <=> (Attrs::None);
    Silu "silu" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Silu)) <=> (Attrs::None);
    Neg "neg" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Neg)) <=> (Attrs::None);
    Abs "abs" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Abs)) <=> (Attrs::None);
    Sqrt "sqrt" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Sqrt)) <=> (Attrs::None);
    Exp "exp" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Exp)) <=> (Attrs::None);
    Log "log" Some(Exact(1)), Elementwise: (Op::Unary(UnaryOp::Log)) <=> (Attrs::None);
    Reciprocal "reciprocal" Some(Exact(1)), Elementwise:
        (Op::Unary(UnaryOp::Reciprocal)) <=> (Attrs::None);
    Add "add" Some(Exact(2)), Elementwise: (Op::Binary(BinaryOp::Add)) <=> (Attrs::None);
    Sub "sub" Some(Exact(2)), Elementwise: (Op::Binary(BinaryOp::Sub)) <=> (Attrs::None);
    Mul "mul" Some(Exact(2)), Elementwise: (Op::Binary(BinaryOp::Mul)) <=> (Attrs::None);
    Div "div" Some(Exact(2)), Elementwise: (Op::Binary(BinaryOp::Div)) <=> (Attrs::None);
    Min "min" Some(Exact(2)), Elementwise: (Op::Binary(BinaryOp::Min)) <=> (Attrs::None);
    Max "max" Some(Exact(2)), Elementwise: (Op::Binary(BinaryOp::Max)) <=> (Attrs::None);
    LayerNorm "layer_norm" Some(Range(2, 3)), Anchor:
        (Op::LayerNorm { axis, epsilon }) <=> (Attrs::LayerNorm { axis, epsilon });
    MaxPool2d "max_pool2d" Some(Exact(1)), Anchor: (Op::MaxPool2d(p)) <=> (Attrs::Pool(p));
    AvgPool2d "avg_pool2d" Some(Exact(1)), Anchor:
        (Op::AvgPool2d { pool, count_include_pad }) <=> (Attrs::AvgPool { pool, count_include_pad });
    GlobalAvgPool "global_avg_pool" Some(Exact(1)), Anchor: (Op::GlobalAvgPool) <=> (Attrs::None);
    Flatten "flatten" Some(Exact(1)), Plain: (Op::Flatten { axis }) <=> (Attrs::Axis(axis));
    Reshape "reshape" Some(Exact(1)), Plain: (Op::Reshape { shape }) <=> (Attrs::Dims(shape));
    Transpose "transpose" Some(Exact(1)), Plain: (Op::Transpose { perm }) <=> (Attrs::Dims(perm));
    MatMul "matmul" Some(Exact(2)), Anchor: (Op::MatMul) <=> (Attrs::None);
    Gemm "gemm" Some(Range(2, 3)), Anchor: (Op::Gemm(g)) <=> (Attrs::Gemm(g));
    Slice "slice" Some(Exact(1)), Plain: (Op::Slice(s)) <=> (Attrs::Slice(s));
    Pad "pad" Some(Range(1, 2)), Plain: (Op::Pad(p)) <=> (Attrs::Pad(p));
    Expand "expand" Some(Exact(1)), Plain: (Op::Expand { shape }) <=> (Attrs::Dims(shape));
    Tile "tile" Some(Exact(1)), Plain: (Op::Tile { repeats }) <=> (Attrs::Dims(repeats));
    Concat "concat" Some(AtLeast(1)), Plain: (Op::Concat { axis }) <=> (Attrs::Axis(axis));
    Softmax "softmax" Some(Exact(1)), Plain: (Op::Softmax { axis }) <=> (Attrs::Axis(axis));
    Reorder "reorder" Some(Exact(1)), Plain: (Op::Reorder { layout }) <=> (Attrs::Layout(layout));
    BnFoldWeight "bn_fold_weight" Some(Exact(3)), WeightPrep:
        (Op::BnFoldWeight { epsilon }) <=> (Attrs::Epsilon(epsilon));
    BnFoldBias "bn_fold_bias" Some(Range(4, 5)), WeightPrep:
        (Op::BnFoldBias { epsilon }) <=> (Attrs::Epsilon(epsilon));
    BnScale "bn_scale" Some(Exact(2)), WeightPrep: (Op::BnScale { epsilon }) <=> (Attrs::Epsilon(epsilon));
    BnShift "bn_shift" Some(Exact(4)), WeightPrep: (Op::BnShift { epsilon }) <=> (Attrs::Epsilon(epsilon));
    ChannelScale "channel_scale" Some(Exact(2)), WeightPrep: (Op::ChannelScale) <=> (Attrs::None);
    ChannelVector "channel_vector" Some(Exact(1)), WeightPrep: (Op::ChannelVector) <=> (Attrs::None);
    ConvShiftBias "conv_shift_bias" Some(Exact(2)), WeightPrep: (Op::ConvShiftBias) <=> (Attrs::None);
    Cast "cast" Some(Exact(1)), Plain: (Op::Cast { to }) <=> (Attrs::DType(to));
    Equal "equal" Some(Exact(2)), Plain: (Op::Compare(Comparison::Equal)) <=> (Attrs::None);
    Less "less" Some(Exact(2)), Plain: (Op::Compare(Comparison::Less)) <=> (Attrs::None);
    LessOrEqual "less_equal" Some(Exact(2)), Plain:
        (Op::Compare(Comparison::LessOrEqual)) <=> (Attrs::None);
    Greater "greater" Some(Exact(2)), Plain: (Op::Compare(Comparison::Greater)) <=> (Attrs::None);
    GreaterOrEqual "greater_equal" Some(Exact(2)), Plain:
        (Op::Compare(Comparison::GreaterOrEqual)) <=> (Attrs::None);
    And "and" Some(Exact(2)), Plain: (Op::Logic(LogicOp::And)) <=> (Attrs::None);
    Or "or" Some(Exact(2)), Plain: (Op::Logic(LogicOp::Or)) <=> (Attrs::None);
    Xor "xor" Some(Exact(2)), Plain: (Op::Logic(LogicOp::Xor)) <=> (Attrs::None);
    Not "not" Some(Exact(1)), Plain: (Op::Not) <=> (Attrs::None);
    Where "where" Some(Exact(3)), Plain: (Op::Where) <=> (Attrs::None);
    Gather "gather" Some(Exact(2)), Plain: (Op::Gather { axis }) <=> (Attrs::Axis(axis));
    ReduceSum "reduce_sum" Some(Exact(1)), Plain:
        (Op::Reduce(Reduction::Sum, r)) <=> (Attrs::Reduce(r));
    ReduceMean "reduce_mean" Some(Exact(1)), Plain:
        (Op::Reduce(Reduction::Mean, r)) <=> (Attrs::Reduce(r));
    ReduceMax "reduce_max" Some(Exact(1)), Plain:
        (Op::Reduce(Reduction::Max, r)) <=> (Attrs::Reduce(r));
    ReduceMin "reduce_min" Some(Exact(1)), Plain:
        (Op::Reduce(Reduction::Min, r)) <=> (Attrs::Reduce(r));
    Resize "resize" Some(Exact(1)), Plain: (Op::Resize(r)) <=> (Attrs::Resize(r));
    Fused "fused" None, Plain: (Op::Fused(f)) <=> (Attrs::Fused(f));
    ConvTranspose2d "conv_transpose2d" Some(Range(2, 3)), Plain:
        (Op::ConvTranspose2d(a)) <=> (Attrs::ConvTranspose2d(a));
}

impl OpKind {
    /// The kind whose mnemonic is `name`.
    pub fn from_name(name: &str) -> Option<OpKind> {
        OpKind::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// The binary operator of a binary kind.
    pub fn binary(self) -> Option<BinaryOp> {
        match self.join(&Attrs::None)? {
            Op::Binary(b) => Some(b),
            _ => None,
        }
    }

    /// Whether the kind takes no attributes (its payload is always [`Attrs::None`]).
    pub fn has_no_attrs(self) -> bool {
        self.join(&Attrs::None).is_some()
    }

    /// The payload patterns use when they omit the attributes: [`Attrs::None`] for
    /// kinds without attributes, `None` (match anything) otherwise.
    pub fn default_attrs(self) -> Option<Attrs> {
        self.has_no_attrs().then_some(Attrs::None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_join_round_trip_and_names_are_unique() {
        for &k in OpKind::ALL {
            assert_eq!(OpKind::from_name(k.name()), Some(k));
        }
        let ops = [
            Op::Conv2d(Conv2dAttrs::default()),
            Op::BatchNorm { epsilon: F32(1e-5) },
            Op::Unary(UnaryOp::Clip {
                min: F32(0.0),
                max: F32(6.0),
            }),
            Op::Binary(BinaryOp::Sub),
            Op::Reshape { shape: vec![2, 3] },
            Op::Transpose { perm: vec![1, 0] },
            Op::BnFoldBias { epsilon: F32(1e-3) },
        ];
        for op in ops {
            let (k, a) = op.split().expect("not a const");
            assert_eq!(k.join(&a), Some(op.clone()));
            assert_eq!(op.kind(), Some(k));
        }
        // a payload of another structure does not fit
        assert_eq!(OpKind::Clip.join(&Attrs::Epsilon(F32(1.0))), None);
        assert_eq!(OpKind::Add.binary(), Some(BinaryOp::Add));
        assert!(OpKind::Relu.has_no_attrs() && !OpKind::Clip.has_no_attrs());
    }
}
