//! Fused ops: an anchor op followed by its `PostOp` list — the variant, its row and
//! type rule. Its text form is its own syntax (`fused ANCHOR ... post [...]`), not an
//! attribute dictionary.

use super::dim::{broadcast_dims, Dim, Shape};
use super::rules::OperandTypes;
use super::{BinaryOp, Op, UnaryOp};
use crate::text::{AttrDict, AttrError, AttrSchema, Printed};
use crate::types::TensorType;

macro_rules! fused_ops {
    ([$($variants:tt)*] [$($rows:tt)*] $next:ident $(, $more:ident)*) => { $next! {
    [$($variants)*
        /// An anchor op with a fused elementwise epilogue.
        Fused(FusedOp),
    ]
    [$($rows)*
        Fused "fused" None, Plain: (Op::Fused(f)) <=> (Attrs::Fused(f))
            attrs { ..f },
            dtype: all_f32,
            shape: |o| fused_shape(f, o),
            flops: |operands, out| fused_flops(f, operands, out);
    ]
    $($more),* } };
}
pub(super) use fused_ops;

/// The anchor's result, which every post-op operand broadcasts to.
pub(super) fn fused_shape(f: &FusedOp, o: &OperandTypes<'_>) -> Result<Shape, String> {
    if !f.anchor.is_anchor() {
        return Err(format!("'{}' cannot anchor a fused op", f.anchor.name()));
    }
    let n_anchor = o.len() - f.num_post_operands();
    let acc = f
        .anchor
        .infer_type(&o.all()[..n_anchor], &|id| o.weight(id))?;
    let acc_dims = Dim::all(&acc.dims);
    for (i, t) in o.all()[n_anchor..].iter().enumerate() {
        let b = broadcast_dims(&acc_dims, &Dim::all(&t.dims))?;
        if b != acc_dims {
            return Err(format!(
                "post-op operand {i} {t} does not broadcast to the anchor result {acc}"
            ));
        }
    }
    Ok(Shape::row_major(acc_dims).with_layout(acc.layout))
}

/// The anchor's flops, plus each post-op's per element.
pub(super) fn fused_flops(f: &FusedOp, operands: &[&TensorType], result: &TensorType) -> u64 {
    let n_anchor = operands.len() - f.num_post_operands();
    let post: u64 = f
        .post_ops
        .iter()
        .map(|p| match p {
            PostOp::Unary(u) => u.flops(),
            PostOp::Binary { .. } => 1,
        })
        .sum();
    f.anchor.flops(&operands[..n_anchor], result) + post * result.num_elements() as u64
}

/// A fused op is written in its own syntax; as an attribute dictionary it has none.
impl AttrSchema for FusedOp {
    fn read(d: &mut AttrDict) -> Result<Self, AttrError> {
        Err(d.error_at_owner(
            "a fused op is written 'fused ANCHOR OPERANDS {ATTRS} post [POST_OPS] : TYPE'",
        ))
    }

    fn print(&self, _rank: usize, _out: &mut Printed) {}
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
    /// The op computing the tile: conv2d, conv_transpose2d, gemm, matmul, layer_norm or a pool.
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
