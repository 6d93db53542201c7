//! NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, the losses as plain math at
//! inference: each target's log-probability picked by a GatherElements along the
//! classes (so a target out of range is an error from `run`), negated, weighted by its
//! class weight (a checked `gather`), `ignore_index` masked by a `where`, then summed,
//! averaged over the weights, or kept per element.

use smelt_ir::op::{BinaryOp, Comparison, Op, ReduceAttrs, Reduction, UnaryOp};
use smelt_ir::{Diagnostic, Value};

use super::indexing::{gather_elements_of, Indices};
use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "NegativeLogLikelihoodLoss" [12, 13, 22],             from 12 => negative_log_likelihood_loss;
    "SoftmaxCrossEntropyLoss" [12, 13],                   from 12 => softmax_cross_entropy_loss;
};

/// NegativeLogLikelihoodLoss of log-probabilities `[N, C, d…]` and targets `[N, d…]`.
pub fn negative_log_likelihood_loss(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["ignore_index", "reduction"])?;
    cx.check_max_inputs(3)?;
    class_dims(cx)?;
    let x = cx.value(0)?;
    Ok(vec![Entry::Value(negative_log_likelihood(cx, x)?)])
}

/// SoftmaxCrossEntropyLoss: the loss of `log_softmax` over the classes (axis 1), and
/// those log-probabilities as the optional second output.
pub fn softmax_cross_entropy_loss(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["ignore_index", "reduction"])?;
    cx.check_max_inputs(3)?;
    class_dims(cx)?;
    let x = cx.value(0)?;
    let log_prob = super::linalg::log_softmax_of(cx, x, 1)?;
    let loss = negative_log_likelihood(cx, log_prob)?;
    Ok(vec![Entry::Value(loss), Entry::Value(log_prob)])
}

/// Checks input 0 is `[N, C, d…]` and the target `[N, d…]`.
fn class_dims(cx: &NodeCtx) -> Result<(), Diagnostic> {
    let dims = cx.dims(0)?;
    let target = cx.dims(1)?;
    let mut want = dims.clone();
    if dims.len() >= 2 {
        want.remove(1);
    }
    if dims.len() < 2 || target != want {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "input {dims:?} must be [N, C, d...] and the target [N, d...] without the \
                 classes, got target {target:?}"
            ),
        ));
    }
    Ok(())
}

/// How the per-element losses are combined.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LossReduction {
    None,
    Sum,
    Mean,
}

/// The loss of log-probabilities `log_prob` (`[N, C, d…]`) against input 1's targets,
/// with input 2's class weights and the `ignore_index` and `reduction` attributes.
fn negative_log_likelihood(cx: &mut NodeCtx, log_prob: Value) -> Result<Value, Diagnostic> {
    let reduction = match cx.attr_string("reduction")?.as_deref() {
        None | Some("mean") => LossReduction::Mean,
        Some("sum") => LossReduction::Sum,
        Some("none") => LossReduction::None,
        Some(other) => {
            return Err(cx.bad_attr(
                "reduction",
                format!("'{other}' is not 'none', 'sum' or 'mean'"),
            ))
        }
    };
    let dims = cx.type_of(log_prob).dims.clone();
    let classes = dims[1];
    let target_dims = cx.dims(1)?;
    let target = cx.value(1)?;
    let target = cx.int64_indices(target, "the target")?;
    // which targets count, and a class for the others that is surely in range
    let (valid, target) = match cx.attr_int("ignore_index")? {
        None => (None, target),
        Some(ignored) => {
            let ignored = cx.int_scalar(ignored)?;
            let is_ignored = cx.emit(Op::Compare(Comparison::Equal), &[target, ignored])?;
            let valid = cx.emit(Op::Not, &[is_ignored])?;
            let zero = cx.int_scalar(0)?;
            let safe = cx.emit(Op::Where, &[valid, target, zero])?;
            (Some(valid), safe)
        }
    };
    let mut picked_dims = target_dims.clone();
    picked_dims.insert(1, 1);
    let along_classes = cx.reshape(target, picked_dims)?;
    let picked = gather_elements_of(cx, log_prob, Indices::Value(along_classes), 1)?;
    let picked = cx.reshape(picked, target_dims.clone())?;
    let mut loss = cx.emit(Op::Unary(UnaryOp::Neg), &[picked])?;
    let zero = cx.scalar(0.0)?;
    let weights = match cx.input_name(2) {
        None => None,
        Some(_) => {
            let w_dims = cx.dims(2)?;
            if w_dims != [classes] {
                return Err(cx.err(
                    "onnx-bad-model",
                    format!("weight of shape {w_dims:?} must be [{classes}], one per class"),
                ));
            }
            let w = cx.value(2)?;
            let w = cx.emit(Op::Gather { axis: 0 }, &[w, target])?;
            loss = cx.emit(Op::Binary(BinaryOp::Mul), &[w, loss])?;
            Some(w)
        }
    };
    let weights = match valid {
        None => weights,
        Some(valid) => {
            loss = cx.emit(Op::Where, &[valid, loss, zero])?;
            let kept = match weights {
                Some(w) => w,
                None => cx.scalar(1.0)?,
            };
            Some(cx.emit(Op::Where, &[valid, kept, zero])?)
        }
    };
    let all = ReduceAttrs {
        axes: (0..target_dims.len()).collect(),
        keep_dims: false,
    };
    Ok(match (reduction, weights) {
        (LossReduction::None, _) => loss,
        (LossReduction::Sum, _) => cx.emit(Op::Reduce(Reduction::Sum, all), &[loss])?,
        (LossReduction::Mean, None) => cx.emit(Op::Reduce(Reduction::Mean, all), &[loss])?,
        (LossReduction::Mean, Some(w)) => {
            let total = cx.emit(Op::Reduce(Reduction::Sum, all.clone()), &[loss])?;
            let weight = cx.emit(Op::Reduce(Reduction::Sum, all), &[w])?;
            cx.emit(Op::Binary(BinaryOp::Div), &[total, weight])?
        }
    })
}
