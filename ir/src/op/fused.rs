//! Fused ops: an anchor op followed by its `PostOp` list.

use super::{BinaryOp, Op, UnaryOp};

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
