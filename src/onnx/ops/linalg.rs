//! Matrix ops, Softmax and Hardmax: Gemm, MatMul, Softmax and Hardmax (with their pre-13
//! flattening semantics), LogSoftmax.

use smelt_ir::op::{Comparison, GemmAttrs, Op, ReduceAttrs, Reduction};
use smelt_ir::{DType, Diagnostic, Value, F32};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::ConstTensor;

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "Gemm"                [1, 6, 7, 9, 11, 13],           from 6  => gemm;
    "Hardmax"             [1, 11, 13],                  from 1  => hardmax;
    "LogSoftmax"          [1, 11, 13],                    from 1  => log_softmax;
    "MatMul"              [1, 9, 13],                     from 1  => matmul;
    "Softmax"             [1, 11, 13],                    from 1  => softmax;
};

/// Gemm: `alpha * op(A) * op(B) + beta * C` with optional C (from version 11). Version 6's
/// `broadcast` flag only allowed what numpy broadcasting of C allows.
pub fn gemm(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["alpha", "beta", "transA", "transB", "broadcast"])?;
    let attrs = GemmAttrs {
        alpha: F32(cx.attr_float_or("alpha", 1.0)?),
        beta: F32(cx.attr_float_or("beta", 1.0)?),
        trans_a: cx.attr_bool("transA", false)?,
        trans_b: cx.attr_bool("transB", false)?,
    };
    let mut operands = vec![cx.value(0)?, cx.value(1)?];
    if let Some(c) = cx.opt_value(2)? {
        operands.push(c);
    }
    Ok(vec![Entry::Value(cx.emit(Op::Gemm(attrs), &operands)?)])
}

/// MatMul with numpy semantics.
pub fn matmul(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let a = cx.value(0)?;
    let b = cx.value(1)?;
    Ok(vec![Entry::Value(cx.emit(Op::MatMul, &[a, b])?)])
}

/// LogSoftmax as `x − max − log(Σ exp(x − max))` along the axis (the stable form
/// onnxruntime computes), with Softmax's axis rules (one axis from 13, flattened before).
pub fn log_softmax(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    use smelt_ir::op::{BinaryOp, ReduceAttrs, Reduction, UnaryOp};
    cx.check_attrs(&["axis"])?;
    let dims = cx.dims(0)?;
    let rank = dims.len();
    let x = cx.value(0)?;
    let (x, axis, flattened) = if cx.version >= 13 {
        (
            x,
            cx.axis("axis", cx.attr_int_or("axis", -1)?, rank)?,
            false,
        )
    } else {
        let raw = cx.attr_int_or("axis", 1)?;
        let axis = if raw == rank as i64 {
            rank
        } else {
            cx.axis("axis", raw, rank)?
        };
        let outer: usize = dims[..axis].iter().product();
        let inner: usize = dims[axis..].iter().product();
        (cx.reshape(x, vec![outer, inner])?, 1, true)
    };
    let along = ReduceAttrs {
        axes: vec![axis],
        keep_dims: true,
    };
    let max = cx.emit(Op::Reduce(Reduction::Max, along.clone()), &[x])?;
    let shifted = cx.emit(Op::Binary(BinaryOp::Sub), &[x, max])?;
    let e = cx.emit(Op::Unary(UnaryOp::Exp), &[shifted])?;
    let sum = cx.emit(Op::Reduce(Reduction::Sum, along), &[e])?;
    let log_sum = cx.emit(Op::Unary(UnaryOp::Log), &[sum])?;
    let y = cx.emit(Op::Binary(BinaryOp::Sub), &[shifted, log_sum])?;
    let y = if flattened { cx.reshape(y, dims)? } else { y };
    Ok(vec![Entry::Value(y)])
}

/// Softmax. From version 13 it normalizes along one axis (default -1); before, the input
/// is flattened to 2-D at `axis` (default 1) and normalized along the second dimension.
pub fn softmax(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis"])?;
    let dims = cx.dims(0)?;
    let rank = dims.len();
    let x = cx.value(0)?;
    if cx.version >= 13 {
        let axis = cx.axis("axis", cx.attr_int_or("axis", -1)?, rank)?;
        return Ok(vec![Entry::Value(cx.emit(Op::Softmax { axis }, &[x])?)]);
    }
    let raw = cx.attr_int_or("axis", 1)?;
    // Before 13, axis may equal rank (a flattened inner size of 1).
    let axis = if raw == rank as i64 {
        rank
    } else {
        cx.axis("axis", raw, rank)?
    };
    if axis + 1 == rank {
        return Ok(vec![Entry::Value(cx.emit(Op::Softmax { axis }, &[x])?)]);
    }
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis..].iter().product();
    let flat = cx.reshape(x, vec![outer, inner])?;
    let y = cx.emit(Op::Softmax { axis: 1 }, &[flat])?;
    let y = cx.reshape(y, dims)?;
    Ok(vec![Entry::Value(y)])
}

/// Hardmax: 1.0 at the first largest element along the axis, 0.0 elsewhere; from version
/// 13 along one axis (default -1), before along the second dimension of the input
/// flattened to 2-D at `axis` (default 1), as Softmax.
pub fn hardmax(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis"])?;
    let dims = cx.dims(0)?;
    let rank = dims.len();
    let x = cx.value(0)?;
    if cx.version >= 13 {
        let axis = cx.axis("axis", cx.attr_int_or("axis", -1)?, rank)?;
        return Ok(vec![Entry::Value(first_largest(cx, x, &dims, axis)?)]);
    }
    let raw = cx.attr_int_or("axis", 1)?;
    // Before 13, axis may equal rank (a flattened inner size of 1).
    let axis = if raw == rank as i64 {
        rank
    } else {
        cx.axis("axis", raw, rank)?
    };
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis..].iter().product();
    let flat = cx.reshape(x, vec![outer, inner])?;
    let y = first_largest(cx, flat, &[outer, inner], 1)?;
    Ok(vec![Entry::Value(cx.reshape(y, dims)?)])
}

/// The one-hot float32 mask of the first largest element of `x` (of shape `dims`) along
/// `axis`: the positions equal to the maximum, the smallest index among them (`where`
/// over the axis' indices, then `reduce_min`), and a comparison of the indices with it.
fn first_largest(
    cx: &mut NodeCtx,
    x: Value,
    dims: &[usize],
    axis: usize,
) -> Result<Value, Diagnostic> {
    let along = ReduceAttrs {
        axes: vec![axis],
        keep_dims: true,
    };
    let largest = cx.emit(Op::Reduce(Reduction::Max, along.clone()), &[x])?;
    let is_largest = cx.emit(Op::Compare(Comparison::Equal), &[x, largest])?;
    let count = dims[axis];
    let mut index_dims = vec![1; dims.len()];
    index_dims[axis] = count;
    let indices = ConstTensor::f32(index_dims, (0..count).map(|i| i as f32).collect());
    let name = cx.derived_name("indices");
    let indices = cx.materialize(&indices, &name)?;
    let none = cx.scalar(count as f32)?;
    let candidates = cx.emit(Op::Where, &[is_largest, indices, none])?;
    let first = cx.emit(Op::Reduce(Reduction::Min, along), &[candidates])?;
    let one_hot = cx.emit(Op::Compare(Comparison::Equal), &[indices, first])?;
    cx.emit(Op::Cast { to: DType::F32 }, &[one_hot])
}
