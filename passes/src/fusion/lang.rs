//! The e-graph language: one e-node kind per IR op, attributes as one interned leaf child.
//!
//! Every op node's first child is an attribute leaf ([`TensorNode::Attr`]) holding an
//! [`AttrId`] into the compilation's [`AttrTable`]; the remaining children are the
//! op's operands. Weights and function parameters are leaves. Payloads are interned in
//! first-seen order, so ids (and therefore e-node order and every tie-break built on it)
//! depend only on the input, never on what else ran in the process.

use std::collections::HashMap;
use std::fmt;

use egg::{Id, Language};
use smelt_ir::op::{BinaryOp, Conv2dAttrs, FusedOp, GemmAttrs, Op, Pool2dAttrs, UnaryOp};
use smelt_ir::types::{Layout, F32};
use smelt_ir::weights::WeightId;

/// The kind of an op e-node: one per op of the IR's table (unary and binary ops are
/// split into one kind per operator). `const` is not a kind: weights are leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum OpKind {
    Conv2d,
    BatchNorm,
    Relu,
    Clip,
    LeakyRelu,
    Sigmoid,
    Tanh,
    Erf,
    Gelu,
    HardSigmoid,
    HardSwish,
    Silu,
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
    LayerNorm,
    MaxPool2d,
    AvgPool2d,
    GlobalAvgPool,
    Flatten,
    Reshape,
    Transpose,
    MatMul,
    Gemm,
    Concat,
    Softmax,
    Reorder,
    BnFoldWeight,
    BnFoldBias,
    BnScale,
    BnShift,
    ChannelScale,
    ChannelVector,
    ConvShiftBias,
    Fused,
}

impl OpKind {
    /// Every kind, in declaration order (used to look kinds up by name).
    pub const ALL: [OpKind; 38] = [
        OpKind::Conv2d,
        OpKind::BatchNorm,
        OpKind::Relu,
        OpKind::Clip,
        OpKind::LeakyRelu,
        OpKind::Sigmoid,
        OpKind::Tanh,
        OpKind::Erf,
        OpKind::Gelu,
        OpKind::HardSigmoid,
        OpKind::HardSwish,
        OpKind::Silu,
        OpKind::Add,
        OpKind::Sub,
        OpKind::Mul,
        OpKind::Div,
        OpKind::Min,
        OpKind::Max,
        OpKind::LayerNorm,
        OpKind::MaxPool2d,
        OpKind::AvgPool2d,
        OpKind::GlobalAvgPool,
        OpKind::Flatten,
        OpKind::Reshape,
        OpKind::Transpose,
        OpKind::MatMul,
        OpKind::Gemm,
        OpKind::Concat,
        OpKind::Softmax,
        OpKind::Reorder,
        OpKind::BnFoldWeight,
        OpKind::BnFoldBias,
        OpKind::BnScale,
        OpKind::BnShift,
        OpKind::ChannelScale,
        OpKind::ChannelVector,
        OpKind::ConvShiftBias,
        OpKind::Fused,
    ];

    /// The op mnemonic of the text form (`conv2d`, `relu`, `add`, ...).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Conv2d => "conv2d",
            OpKind::BatchNorm => "batch_norm",
            OpKind::Relu => "relu",
            OpKind::Clip => "clip",
            OpKind::LeakyRelu => "leaky_relu",
            OpKind::Sigmoid => "sigmoid",
            OpKind::Tanh => "tanh",
            OpKind::Erf => "erf",
            OpKind::Gelu => "gelu",
            OpKind::HardSigmoid => "hard_sigmoid",
            OpKind::HardSwish => "hard_swish",
            OpKind::Silu => "silu",
            OpKind::Add => "add",
            OpKind::Sub => "sub",
            OpKind::Mul => "mul",
            OpKind::Div => "div",
            OpKind::Min => "min",
            OpKind::Max => "max",
            OpKind::LayerNorm => "layer_norm",
            OpKind::MaxPool2d => "max_pool2d",
            OpKind::AvgPool2d => "avg_pool2d",
            OpKind::GlobalAvgPool => "global_avg_pool",
            OpKind::Flatten => "flatten",
            OpKind::Reshape => "reshape",
            OpKind::Transpose => "transpose",
            OpKind::MatMul => "matmul",
            OpKind::Gemm => "gemm",
            OpKind::Concat => "concat",
            OpKind::Softmax => "softmax",
            OpKind::Reorder => "reorder",
            OpKind::BnFoldWeight => "bn_fold_weight",
            OpKind::BnFoldBias => "bn_fold_bias",
            OpKind::BnScale => "bn_scale",
            OpKind::BnShift => "bn_shift",
            OpKind::ChannelScale => "channel_scale",
            OpKind::ChannelVector => "channel_vector",
            OpKind::ConvShiftBias => "conv_shift_bias",
            OpKind::Fused => "fused",
        }
    }

    /// The kind whose mnemonic is `name`.
    pub fn from_name(name: &str) -> Option<OpKind> {
        OpKind::ALL.iter().copied().find(|k| k.name() == name)
    }

    /// The binary operator of a binary kind.
    pub fn binary(self) -> Option<BinaryOp> {
        match self {
            OpKind::Add => Some(BinaryOp::Add),
            OpKind::Sub => Some(BinaryOp::Sub),
            OpKind::Mul => Some(BinaryOp::Mul),
            OpKind::Div => Some(BinaryOp::Div),
            OpKind::Min => Some(BinaryOp::Min),
            OpKind::Max => Some(BinaryOp::Max),
            _ => None,
        }
    }

    /// Whether the kind's payload is always [`Attrs::None`], so patterns may omit it.
    pub fn has_no_attrs(self) -> bool {
        self.default_attrs() == Some(Attrs::None)
    }

    /// The payload patterns use when they omit the attributes: [`Attrs::None`] for
    /// kinds without attributes, `None` (match anything) otherwise.
    pub fn default_attrs(self) -> Option<Attrs> {
        match self {
            OpKind::Relu
            | OpKind::Sigmoid
            | OpKind::Tanh
            | OpKind::Erf
            | OpKind::Gelu
            | OpKind::HardSwish
            | OpKind::Silu
            | OpKind::Add
            | OpKind::Sub
            | OpKind::Mul
            | OpKind::Div
            | OpKind::Min
            | OpKind::Max
            | OpKind::GlobalAvgPool
            | OpKind::MatMul
            | OpKind::ChannelScale
            | OpKind::ChannelVector
            | OpKind::ConvShiftBias => Some(Attrs::None),
            OpKind::Conv2d
            | OpKind::BatchNorm
            | OpKind::Clip
            | OpKind::LeakyRelu
            | OpKind::HardSigmoid
            | OpKind::LayerNorm
            | OpKind::MaxPool2d
            | OpKind::AvgPool2d
            | OpKind::Flatten
            | OpKind::Reshape
            | OpKind::Transpose
            | OpKind::Gemm
            | OpKind::Concat
            | OpKind::Softmax
            | OpKind::Reorder
            | OpKind::BnFoldWeight
            | OpKind::BnFoldBias
            | OpKind::BnScale
            | OpKind::BnShift
            | OpKind::Fused => None,
        }
    }
}

/// An op's attribute payload, shared between ops with the same attribute structure
/// (so a rule can pass a `batch_norm`'s epsilon straight to `bn_fold_weight`).
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
    /// `flatten`, `concat`, `softmax`.
    Axis(usize),
    /// `reshape` target shape or `transpose` permutation.
    Dims(Vec<usize>),
    /// `gemm`.
    Gemm(GemmAttrs),
    /// `reorder` target layout.
    Layout(Layout),
    /// `fused`: the anchor op (with its attributes) and the post-op list.
    Fused(FusedOp),
}

/// Splits an op into its e-node kind and attribute payload; `None` for `const`
/// (weights are leaves).
pub fn split_op(op: &Op) -> Option<(OpKind, Attrs)> {
    let pair = match op {
        Op::Const(_) => return None,
        Op::Conv2d(a) => (OpKind::Conv2d, Attrs::Conv2d(a.clone())),
        Op::BatchNorm { epsilon } => (OpKind::BatchNorm, Attrs::Epsilon(*epsilon)),
        Op::Unary(u) => match *u {
            UnaryOp::Relu => (OpKind::Relu, Attrs::None),
            UnaryOp::Clip { min, max } => (OpKind::Clip, Attrs::Clip { min, max }),
            UnaryOp::LeakyRelu { alpha } => (OpKind::LeakyRelu, Attrs::Alpha(alpha)),
            UnaryOp::Sigmoid => (OpKind::Sigmoid, Attrs::None),
            UnaryOp::Tanh => (OpKind::Tanh, Attrs::None),
            UnaryOp::Erf => (OpKind::Erf, Attrs::None),
            UnaryOp::Gelu => (OpKind::Gelu, Attrs::None),
            UnaryOp::HardSigmoid { alpha, beta } => {
                (OpKind::HardSigmoid, Attrs::HardSigmoid { alpha, beta })
            }
            UnaryOp::HardSwish => (OpKind::HardSwish, Attrs::None),
            UnaryOp::Silu => (OpKind::Silu, Attrs::None),
        },
        Op::Binary(b) => {
            let kind = match b {
                BinaryOp::Add => OpKind::Add,
                BinaryOp::Sub => OpKind::Sub,
                BinaryOp::Mul => OpKind::Mul,
                BinaryOp::Div => OpKind::Div,
                BinaryOp::Min => OpKind::Min,
                BinaryOp::Max => OpKind::Max,
            };
            (kind, Attrs::None)
        }
        Op::LayerNorm { axis, epsilon } => (
            OpKind::LayerNorm,
            Attrs::LayerNorm {
                axis: *axis,
                epsilon: *epsilon,
            },
        ),
        Op::MaxPool2d(p) => (OpKind::MaxPool2d, Attrs::Pool(p.clone())),
        Op::AvgPool2d {
            pool,
            count_include_pad,
        } => (
            OpKind::AvgPool2d,
            Attrs::AvgPool {
                pool: pool.clone(),
                count_include_pad: *count_include_pad,
            },
        ),
        Op::GlobalAvgPool => (OpKind::GlobalAvgPool, Attrs::None),
        Op::Flatten { axis } => (OpKind::Flatten, Attrs::Axis(*axis)),
        Op::Reshape { shape } => (OpKind::Reshape, Attrs::Dims(shape.clone())),
        Op::Transpose { perm } => (OpKind::Transpose, Attrs::Dims(perm.clone())),
        Op::MatMul => (OpKind::MatMul, Attrs::None),
        Op::Gemm(g) => (OpKind::Gemm, Attrs::Gemm(g.clone())),
        Op::Concat { axis } => (OpKind::Concat, Attrs::Axis(*axis)),
        Op::Softmax { axis } => (OpKind::Softmax, Attrs::Axis(*axis)),
        Op::Reorder { layout } => (OpKind::Reorder, Attrs::Layout(*layout)),
        Op::BnFoldWeight { epsilon } => (OpKind::BnFoldWeight, Attrs::Epsilon(*epsilon)),
        Op::BnFoldBias { epsilon } => (OpKind::BnFoldBias, Attrs::Epsilon(*epsilon)),
        Op::BnScale { epsilon } => (OpKind::BnScale, Attrs::Epsilon(*epsilon)),
        Op::BnShift { epsilon } => (OpKind::BnShift, Attrs::Epsilon(*epsilon)),
        Op::ChannelScale => (OpKind::ChannelScale, Attrs::None),
        Op::ChannelVector => (OpKind::ChannelVector, Attrs::None),
        Op::ConvShiftBias => (OpKind::ConvShiftBias, Attrs::None),
        Op::Fused(f) => (OpKind::Fused, Attrs::Fused(f.clone())),
    };
    Some(pair)
}

/// Rebuilds the IR op from a kind and a payload; `None` when the payload does not fit
/// the kind (a user rule that wired a `conv2d`'s attributes into a `clip`, say).
pub fn join_op(kind: OpKind, attrs: &Attrs) -> Option<Op> {
    let op = match (kind, attrs) {
        (OpKind::Conv2d, Attrs::Conv2d(a)) => Op::Conv2d(a.clone()),
        (OpKind::BatchNorm, Attrs::Epsilon(e)) => Op::BatchNorm { epsilon: *e },
        (OpKind::Relu, Attrs::None) => Op::Unary(UnaryOp::Relu),
        (OpKind::Clip, Attrs::Clip { min, max }) => Op::Unary(UnaryOp::Clip {
            min: *min,
            max: *max,
        }),
        (OpKind::LeakyRelu, Attrs::Alpha(alpha)) => Op::Unary(UnaryOp::LeakyRelu { alpha: *alpha }),
        (OpKind::Sigmoid, Attrs::None) => Op::Unary(UnaryOp::Sigmoid),
        (OpKind::Tanh, Attrs::None) => Op::Unary(UnaryOp::Tanh),
        (OpKind::Erf, Attrs::None) => Op::Unary(UnaryOp::Erf),
        (OpKind::Gelu, Attrs::None) => Op::Unary(UnaryOp::Gelu),
        (OpKind::HardSigmoid, Attrs::HardSigmoid { alpha, beta }) => {
            Op::Unary(UnaryOp::HardSigmoid {
                alpha: *alpha,
                beta: *beta,
            })
        }
        (OpKind::HardSwish, Attrs::None) => Op::Unary(UnaryOp::HardSwish),
        (OpKind::Silu, Attrs::None) => Op::Unary(UnaryOp::Silu),
        (OpKind::Add, Attrs::None) => Op::Binary(BinaryOp::Add),
        (OpKind::Sub, Attrs::None) => Op::Binary(BinaryOp::Sub),
        (OpKind::Mul, Attrs::None) => Op::Binary(BinaryOp::Mul),
        (OpKind::Div, Attrs::None) => Op::Binary(BinaryOp::Div),
        (OpKind::Min, Attrs::None) => Op::Binary(BinaryOp::Min),
        (OpKind::Max, Attrs::None) => Op::Binary(BinaryOp::Max),
        (OpKind::LayerNorm, Attrs::LayerNorm { axis, epsilon }) => Op::LayerNorm {
            axis: *axis,
            epsilon: *epsilon,
        },
        (OpKind::MaxPool2d, Attrs::Pool(p)) => Op::MaxPool2d(p.clone()),
        (
            OpKind::AvgPool2d,
            Attrs::AvgPool {
                pool,
                count_include_pad,
            },
        ) => Op::AvgPool2d {
            pool: pool.clone(),
            count_include_pad: *count_include_pad,
        },
        (OpKind::GlobalAvgPool, Attrs::None) => Op::GlobalAvgPool,
        (OpKind::Flatten, Attrs::Axis(axis)) => Op::Flatten { axis: *axis },
        (OpKind::Reshape, Attrs::Dims(shape)) => Op::Reshape {
            shape: shape.clone(),
        },
        (OpKind::Transpose, Attrs::Dims(perm)) => Op::Transpose { perm: perm.clone() },
        (OpKind::MatMul, Attrs::None) => Op::MatMul,
        (OpKind::Gemm, Attrs::Gemm(g)) => Op::Gemm(g.clone()),
        (OpKind::Concat, Attrs::Axis(axis)) => Op::Concat { axis: *axis },
        (OpKind::Softmax, Attrs::Axis(axis)) => Op::Softmax { axis: *axis },
        (OpKind::Reorder, Attrs::Layout(layout)) => Op::Reorder { layout: *layout },
        (OpKind::BnFoldWeight, Attrs::Epsilon(e)) => Op::BnFoldWeight { epsilon: *e },
        (OpKind::BnFoldBias, Attrs::Epsilon(e)) => Op::BnFoldBias { epsilon: *e },
        (OpKind::BnScale, Attrs::Epsilon(e)) => Op::BnScale { epsilon: *e },
        (OpKind::BnShift, Attrs::Epsilon(e)) => Op::BnShift { epsilon: *e },
        (OpKind::ChannelScale, Attrs::None) => Op::ChannelScale,
        (OpKind::ChannelVector, Attrs::None) => Op::ChannelVector,
        (OpKind::ConvShiftBias, Attrs::None) => Op::ConvShiftBias,
        (OpKind::Fused, Attrs::Fused(f)) => Op::Fused(f.clone()),
        _ => return None,
    };
    Some(op)
}

/// Index of an interned attribute payload in the compilation's [`AttrTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttrId(pub u32);

/// Attribute payloads of one compilation, interned in first-seen order.
#[derive(Clone, Debug, Default)]
pub struct AttrTable {
    payloads: Vec<Attrs>,
    index: HashMap<Attrs, AttrId>,
}

impl AttrTable {
    /// The id of `attrs`, interning it on first sight.
    pub fn intern(&mut self, attrs: Attrs) -> AttrId {
        if let Some(id) = self.index.get(&attrs) {
            return *id;
        }
        let id = AttrId(self.payloads.len() as u32);
        self.payloads.push(attrs.clone());
        self.index.insert(attrs, id);
        id
    }

    /// The payload of `id`.
    pub fn get(&self, id: AttrId) -> Option<&Attrs> {
        self.payloads.get(id.0 as usize)
    }
}

/// A node of the fusion e-graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorNode {
    /// An interned attribute payload; the first child of every op node.
    Attr(AttrId),
    /// The i-th function parameter.
    Param(u32),
    /// A module weight.
    Weight(WeightId),
    /// An op: kind, then children `[attrs, operands...]`.
    Op(OpKind, Box<[Id]>),
}

impl TensorNode {
    /// The op kind, for op nodes.
    pub fn kind(&self) -> Option<OpKind> {
        match self {
            TensorNode::Op(k, _) => Some(*k),
            TensorNode::Attr(_) | TensorNode::Param(_) | TensorNode::Weight(_) => None,
        }
    }

    /// The operand children of an op node (all children but the attribute leaf).
    pub fn operands(&self) -> &[Id] {
        match self {
            TensorNode::Op(_, c) => c.get(1..).unwrap_or(&[]),
            TensorNode::Attr(_) | TensorNode::Param(_) | TensorNode::Weight(_) => &[],
        }
    }

    /// The attribute child of an op node.
    pub fn attr_child(&self) -> Option<Id> {
        match self {
            TensorNode::Op(_, c) => c.first().copied(),
            TensorNode::Attr(_) | TensorNode::Param(_) | TensorNode::Weight(_) => None,
        }
    }
}

/// What [`Language::matches`] compares: the variant and, for leaves, the payload.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NodeTag {
    /// An attribute leaf.
    Attr(AttrId),
    /// A parameter leaf.
    Param(u32),
    /// A weight leaf.
    Weight(WeightId),
    /// An op node of this kind.
    Op(OpKind),
}

impl Language for TensorNode {
    type Discriminant = NodeTag;

    fn discriminant(&self) -> NodeTag {
        match self {
            TensorNode::Attr(a) => NodeTag::Attr(*a),
            TensorNode::Param(p) => NodeTag::Param(*p),
            TensorNode::Weight(w) => NodeTag::Weight(*w),
            TensorNode::Op(k, _) => NodeTag::Op(*k),
        }
    }

    fn matches(&self, other: &Self) -> bool {
        match (self, other) {
            (TensorNode::Op(a, ca), TensorNode::Op(b, cb)) => a == b && ca.len() == cb.len(),
            (a, b) => a == b,
        }
    }

    fn children(&self) -> &[Id] {
        match self {
            TensorNode::Op(_, c) => c,
            TensorNode::Attr(_) | TensorNode::Param(_) | TensorNode::Weight(_) => &[],
        }
    }

    fn children_mut(&mut self) -> &mut [Id] {
        match self {
            TensorNode::Op(_, c) => c,
            TensorNode::Attr(_) | TensorNode::Param(_) | TensorNode::Weight(_) => &mut [],
        }
    }
}

impl fmt::Display for TensorNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorNode::Attr(a) => write!(f, "#attr{}", a.0),
            TensorNode::Param(p) => write!(f, "%param{p}"),
            TensorNode::Weight(w) => write!(f, "@weight{}", w.0),
            TensorNode::Op(k, _) => f.write_str(k.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_join_round_trip_every_kind_name() {
        for k in OpKind::ALL {
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
            let (k, a) = split_op(&op).expect("not a const");
            assert_eq!(join_op(k, &a), Some(op));
        }
        assert_eq!(join_op(OpKind::Relu, &Attrs::Epsilon(F32(1.0))), None);
    }

    #[test]
    fn attrs_intern_in_first_seen_order() {
        let mut t = AttrTable::default();
        let a = t.intern(Attrs::Epsilon(F32(1e-5)));
        let b = t.intern(Attrs::None);
        assert_eq!((a, b), (AttrId(0), AttrId(1)));
        assert_eq!(t.intern(Attrs::Epsilon(F32(1e-5))), a);
    }
}
