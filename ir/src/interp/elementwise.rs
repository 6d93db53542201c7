//! Elementwise kernels: unary ops, broadcasting binary ops and fused post-ops.

use super::shape::broadcast_to;
use super::Arg;
use crate::op::{BinaryOp, UnaryOp};

/// `u` applied to every element, evaluated in f64.
pub(super) fn unary(u: UnaryOp, x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| u.eval(v as f64) as f32).collect()
}

/// `u` applied to every element in place.
pub(super) fn unary_in_place(u: UnaryOp, x: &mut [f32]) {
    for v in x {
        *v = u.eval(*v as f64) as f32;
    }
}

/// `a op b` with both operands broadcast to `out`.
pub(super) fn binary(op: BinaryOp, a: &Arg, b: &Arg, out: &[usize]) -> Vec<f32> {
    let a = broadcast_to(&a.data, a.dims, out);
    let b = broadcast_to(&b.data, b.dims, out);
    a.iter()
        .zip(b.iter())
        .map(|(&x, &y)| op.eval(x as f64, y as f64) as f32)
        .collect()
}

/// One binary post-op of a fused op: `acc = acc op operand` (or `operand op acc` when
/// `acc_is_lhs` is false), the operand broadcast to the result shape `out`.
pub(super) fn binary_post_op(
    op: BinaryOp,
    acc_is_lhs: bool,
    acc: &mut [f32],
    operand: &Arg,
    out: &[usize],
) {
    let operand = broadcast_to(&operand.data, operand.dims, out);
    for (a, &o) in acc.iter_mut().zip(operand.iter()) {
        let (lhs, rhs) = if acc_is_lhs {
            (*a as f64, o as f64)
        } else {
            (o as f64, *a as f64)
        };
        *a = op.eval(lhs, rhs) as f32;
    }
}
