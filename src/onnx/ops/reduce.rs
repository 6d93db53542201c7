//! ReduceSum, ReduceMean, ReduceMax and ReduceMin: `reduce_*` ops over the listed axes
//! (an attribute until the version where they became input 1: ReduceSum-13, the others
//! 18), `keepdims` (default 1), and `noop_with_empty_axes` (no axes: every axis, or with
//! it set, the identity); ReduceSumSquare, ReduceL1 and ReduceL2 as a sum of `x·x` or
//! `|x|` (then `sqrt`); ReduceLogSum as `log` of the sum, ReduceLogSumExp as the stable
//! `m + log(Σ exp(x − m))` with `m` the maximum; GlobalMaxPool as `reduce_max` over the
//! spatial axes.

use smelt_ir::op::{BinaryOp, Op, ReduceAttrs, Reduction, UnaryOp};
use smelt_ir::Diagnostic;

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "GlobalMaxPool"       [1, 22],                        from 1  => global_max_pool;
    "ReduceL1"            [1, 11, 13, 18],                from 1  => reduce;
    "ReduceL2"            [1, 11, 13, 18],                from 1  => reduce;
    "ReduceLogSum"        [1, 11, 13, 18, 28],            from 1  => reduce;
    "ReduceLogSumExp"     [1, 11, 13, 18, 28],            from 1  => reduce;
    "ReduceMax"           [1, 11, 12, 13, 18, 20],        from 1  => reduce;
    "ReduceMean"          [1, 11, 13, 18],                from 1  => reduce;
    "ReduceMin"           [1, 11, 12, 13, 18, 20],        from 1  => reduce;
    "ReduceSum"           [1, 11, 13],                    from 1  => reduce;
    "ReduceSumSquare"     [1, 11, 13, 18],                from 1  => reduce;
};

/// ReduceSum, ReduceMean, ReduceMax, ReduceMin.
pub fn reduce(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    let op = cx.node.op_type();
    let (r, input_from) = match op {
        "ReduceSum" => (Reduction::Sum, 13),
        "ReduceMean" => (Reduction::Mean, 18),
        "ReduceMax" => (Reduction::Max, 18),
        "ReduceMin" => (Reduction::Min, 18),
        // ReduceSumSquare, ReduceL1, ReduceL2: sums of a prepared input
        _ => (Reduction::Sum, 18),
    };
    cx.check_attrs(&["axes", "keepdims", "noop_with_empty_axes"])?;
    let rank = cx.dims(0)?.len();
    let keep_dims = cx.attr_int_or("keepdims", 1)? != 0;
    let noop_when_empty = cx.attr_int_or("noop_with_empty_axes", 0)? != 0;
    let listed = cx.versioned_axes(input_from)?.unwrap_or_default();
    let mut axes = Vec::with_capacity(listed.len());
    for &a in &listed {
        let k = cx.axis("axes", a, rank)?;
        if axes.contains(&k) {
            return Err(cx.bad_attr("axes", format!("{listed:?} repeats an axis")));
        }
        axes.push(k);
    }
    axes.sort_unstable();
    if axes.is_empty() {
        if noop_when_empty {
            return Ok(vec![cx.entry(0)?]);
        }
        axes = (0..rank).collect();
    }
    let x = cx.value(0)?;
    if op == "ReduceLogSumExp" {
        let along = ReduceAttrs {
            axes: axes.clone(),
            keep_dims: true,
        };
        let m = cx.emit(Op::Reduce(Reduction::Max, along), &[x])?;
        let shifted = cx.emit(Op::Binary(BinaryOp::Sub), &[x, m])?;
        let e = cx.emit(Op::Unary(UnaryOp::Exp), &[shifted])?;
        let s = cx.emit(
            Op::Reduce(
                Reduction::Sum,
                ReduceAttrs {
                    axes: axes.clone(),
                    keep_dims,
                },
            ),
            &[e],
        )?;
        let l = cx.emit(Op::Unary(UnaryOp::Log), &[s])?;
        // the maximum, shaped as the result
        let m_out = cx.emit(
            Op::Reduce(Reduction::Max, ReduceAttrs { axes, keep_dims }),
            &[x],
        )?;
        let y = cx.emit(Op::Binary(BinaryOp::Add), &[m_out, l])?;
        return Ok(vec![Entry::Value(y)]);
    }
    let summed = match op {
        "ReduceSumSquare" | "ReduceL2" => cx.emit(Op::Binary(BinaryOp::Mul), &[x, x])?,
        "ReduceL1" => cx.emit(Op::Unary(UnaryOp::Abs), &[x])?,
        _ => x,
    };
    let y = cx.emit(Op::Reduce(r, ReduceAttrs { axes, keep_dims }), &[summed])?;
    let y = match op {
        "ReduceL2" => cx.emit(Op::Unary(UnaryOp::Sqrt), &[y])?,
        "ReduceLogSum" => cx.emit(Op::Unary(UnaryOp::Log), &[y])?,
        _ => y,
    };
    Ok(vec![Entry::Value(y)])
}

/// GlobalMaxPool: the largest element of each channel's plane, as `reduce_max` over
/// every axis after the first two, kept.
pub fn global_max_pool(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let rank = cx.dims(0)?.len();
    if rank < 3 {
        return Err(cx.err(
            "onnx-bad-model",
            format!("GlobalMaxPool needs an N x C x spatial input, got rank {rank}"),
        ));
    }
    let x = cx.value(0)?;
    let attrs = ReduceAttrs {
        axes: (2..rank).collect(),
        keep_dims: true,
    };
    Ok(vec![Entry::Value(
        cx.emit(Op::Reduce(Reduction::Max, attrs), &[x])?,
    )])
}
