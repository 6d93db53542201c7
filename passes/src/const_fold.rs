//! Constant folding: every op whose operands are all `const` is evaluated at compile time
//! (with the reference interpreter's `eval_op`, f64 inside) into a new weight.
//!
//! This is what materializes the weight-prep ops fusion introduces: after
//! `fold-bn-into-conv`, `bn_fold_weight` and `bn_fold_bias` over constants become two
//! `const` weights and the batch norm has disappeared. A warning is reported when BN
//! folding scales a weight by more than [`AMPLIFICATION_WARNING`] (a near-zero variance:
//! the folded f32 weights lose precision).

use std::collections::HashMap;

use smelt_ir::diag::{Diagnostic, Diagnostics};
use smelt_ir::graph::{Func, Inst, Module, Value};
use smelt_ir::interp::eval_op;
use smelt_ir::op::Op;
use smelt_ir::tensor::Tensor;
use smelt_ir::types::{DType, Layout, TensorType};
use smelt_ir::weights::{AlignedBuf, WeightId, WeightOrigin, WeightStore};

use crate::manager::{Pass, PassContext, PassError};

/// BN folding scales output channels by `scale / sqrt(var + eps)`; above this factor a
/// warning says the folded weights may lose precision.
pub const AMPLIFICATION_WARNING: f64 = 1e4;

/// The constant-folding pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConstFoldPass;

impl Pass for ConstFoldPass {
    fn name(&self) -> &'static str {
        "const_fold"
    }

    /// It evaluates instructions whose operands are all constants, and constants have
    /// known sizes.
    fn takes_symbolic_sizes(&self) -> bool {
        true
    }

    fn run(&self, module: &mut Module, cx: &mut PassContext) -> Result<(), PassError> {
        for i in 0..module.funcs.len() {
            let mut func = std::mem::replace(
                &mut module.funcs[i],
                Func {
                    name: String::new(),
                    params: Vec::new(),
                    insts: Vec::new(),
                    results: Vec::new(),
                    loc: Default::default(),
                },
            );
            let result = fold_func(&mut func, &mut module.weights, cx);
            module.funcs[i] = func;
            result?;
        }
        Ok(())
    }
}

/// `bn_fold_weight` of an f32 row-major weight as a weight computed on first read
/// ([`ScaledRows::buffer`](crate::scaled_rows::ScaledRows::buffer)): per output channel `o`,
/// `alpha = scale[o] / sqrt(var[o] + eps)` in f64 and each element `(w as f64 * alpha) as f32` — the interpreter's
/// formula, so the result is bit-identical to [`eval_op`]. Only the factors are
/// computed here: the weight packers, which rewrite every conv weight anyway, apply them
/// as they pack ([`ScaledRows::parts`](crate::scaled_rows::ScaledRows::parts)), so ResNet-50's 94 MB of folded weights
/// are never written out (they were a fifth of its compile time); anything else that
/// reads the data (the interpreter, the printer) gets it computed once. `None` when the
/// operands are not of that form (the generic path handles them).
fn fold_bn_weight(
    epsilon: f32,
    inputs: &[WeightId],
    result_ty: &TensorType,
    weights: &WeightStore,
) -> Option<AlignedBuf> {
    let [w, scale, var] = inputs else {
        return None;
    };
    let (w, scale, var) = (weights.get(*w)?, weights.get(*scale)?, weights.get(*var)?);
    let f32_row_major = |t: &TensorType| t.dtype == DType::F32 && t.layout == Layout::RowMajor;
    let channels = *w.ty.dims.first()?;
    let len = w.ty.num_elements();
    let well_formed = f32_row_major(&w.ty)
        && f32_row_major(&scale.ty)
        && f32_row_major(&var.ty)
        && f32_row_major(result_ty)
        && result_ty.dims == w.ty.dims
        && channels > 0
        && len % channels == 0
        && w.data.len_bytes() == len * 4
        && scale.f32s().len() == channels
        && var.f32s().len() == channels;
    if !well_formed {
        return None;
    }
    let eps = epsilon as f64;
    let alpha = scale
        .f32s()
        .iter()
        .zip(var.f32s())
        .map(|(s, v)| *s as f64 / (*v as f64 + eps).sqrt())
        .collect();
    crate::scaled_rows::ScaledRows::buffer(w.data.clone(), alpha)
}

fn weight_tensor(weights: &WeightStore, id: WeightId) -> Option<Tensor> {
    let w = weights.get(id)?;
    Some(Tensor {
        ty: w.ty.clone(),
        data: w.elements()?,
    })
}

/// A name for the weight computed by `op` from the weights `inputs`.
fn name_hint(op: &Op, inputs: &[WeightId], weights: &WeightStore) -> String {
    let name = |i: usize| {
        inputs
            .get(i)
            .and_then(|w| weights.get(*w))
            .map(|w| w.name.clone())
            .unwrap_or_else(|| "const".to_string())
    };
    match op {
        Op::BnFoldWeight { .. } => format!("{}_folded", name(0)),
        Op::BnFoldBias { .. } if inputs.len() == 5 => format!("{}_folded", name(4)),
        Op::BnFoldBias { .. } => format!("{}_folded", name(1)),
        other => format!("{}_{}", name(0), other.name()),
    }
}

/// The largest per-channel factor `|scale| / sqrt(var + eps)` of a `bn_fold_weight`.
fn amplification(op: &Op, operands: &[&Tensor]) -> Option<f64> {
    let Op::BnFoldWeight { epsilon } = op else {
        return None;
    };
    let (scale, var) = (operands.get(1)?, operands.get(2)?);
    scale
        .data
        .as_f32()?
        .iter()
        .zip(var.data.as_f32()?)
        .map(|(s, v)| (*s as f64).abs() / (*v as f64 + epsilon.0 as f64).sqrt())
        .reduce(f64::max)
}

fn fold_func(
    func: &mut Func,
    weights: &mut WeightStore,
    cx: &mut PassContext,
) -> Result<(), PassError> {
    let mut known: HashMap<Value, WeightId> = HashMap::new();
    for i in 0..func.insts.len() {
        let value = func.inst_value(i);
        let inst = &func.insts[i];
        if let Op::Const(w) = inst.op {
            known.insert(value, w);
            continue;
        }
        if inst.operands.is_empty() {
            continue;
        }
        let Some(inputs) = inst
            .operands
            .iter()
            .map(|v| known.get(v).copied())
            .collect::<Option<Vec<WeightId>>>()
        else {
            continue;
        };
        // Folding holds the operands' copies and the result at once: checked against the
        // memory budget before either is made, naming the op and its location.
        let result_bytes = (inst.ty.storage_len() * inst.ty.dtype.size_bytes()) as u64;
        let operand_bytes: u64 = inputs
            .iter()
            .filter_map(|w| weights.get(*w))
            .map(|w| w.data.len_bytes() as u64)
            .sum();
        weights
            .check_room(
                &format!("const_fold of this {} ({})", inst.op.name(), inst.ty),
                result_bytes.saturating_add(operand_bytes),
            )
            .map_err(|m| {
                PassError::Diagnostics(Diagnostics(vec![Diagnostic::error(
                    "memory-budget",
                    m,
                    inst.loc.clone(),
                )]))
            })?;
        if let Op::BnFoldWeight { epsilon } = inst.op {
            if let Some(buf) = fold_bn_weight(epsilon.0, &inputs, &inst.ty, weights) {
                if let Some(factor) = bn_amplification(epsilon.0, &inputs, weights) {
                    warn_amplification(factor, inst, cx);
                }
                let hint = name_hint(&inst.op, &inputs, weights);
                let name = weights.fresh_name(&hint);
                let id = weights
                    .add(name, inst.ty.clone(), buf, WeightOrigin::Computed)
                    .map_err(|m| PassError::Internal {
                        pass: "const_fold",
                        message: m,
                    })?;
                replace_with_const(func, i, id, &mut known, cx);
                continue;
            }
        }
        let tensors = inputs
            .iter()
            .map(|w| weight_tensor(weights, *w))
            .collect::<Option<Vec<Tensor>>>()
            .ok_or_else(|| PassError::Internal {
                pass: "const_fold",
                message: format!("instruction {i} reads an unknown weight"),
            })?;
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let with_loc = |mut d: Diagnostic| {
            d.location = inst.loc.clone();
            d
        };
        let result = eval_op(&inst.op, &refs, &inst.ty, weights)
            .map_err(|d| PassError::Diagnostics(Diagnostics(vec![with_loc(d)])))?;
        if let Some(factor) = amplification(&inst.op, &refs) {
            warn_amplification(factor, inst, cx);
        }
        let hint = name_hint(&inst.op, &inputs, weights);
        let id = weights
            .add_computed_data(&hint, result.ty.clone(), &result.data)
            .map_err(|m| PassError::Internal {
                pass: "const_fold",
                message: m,
            })?;
        replace_with_const(func, i, id, &mut known, cx);
    }
    Ok(())
}

/// Warns when BN folding scales weights by more than [`AMPLIFICATION_WARNING`].
fn warn_amplification(factor: f64, inst: &Inst, cx: &mut PassContext) {
    if factor > AMPLIFICATION_WARNING {
        cx.warnings.push(Diagnostic::warning(
            "bn-fold-amplifies",
            format!(
                "folding batch norm into the conv scales weights by up to {factor:.3e} \
                 (a near-zero running variance); the folded f32 weights may lose precision"
            ),
            inst.loc.clone(),
        ));
    }
}

/// [`amplification`] of a `bn_fold_weight` over the weights `[w, scale, var]`.
fn bn_amplification(epsilon: f32, inputs: &[WeightId], weights: &WeightStore) -> Option<f64> {
    let (scale, var) = (weights.get(*inputs.get(1)?)?, weights.get(*inputs.get(2)?)?);
    scale
        .f32s()
        .iter()
        .zip(var.f32s())
        .map(|(s, v)| (*s as f64).abs() / (*v as f64 + epsilon as f64).sqrt())
        .reduce(f64::max)
}

/// Makes instruction `i` a `const` of the weight `id`.
fn replace_with_const(
    func: &mut Func,
    i: usize,
    id: WeightId,
    known: &mut HashMap<Value, WeightId>,
    cx: &mut PassContext,
) {
    let value = func.inst_value(i);
    let inst = &mut func.insts[i];
    inst.op = Op::Const(id);
    inst.operands.clear();
    known.insert(value, id);
    cx.folded_consts += 1;
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ir::types::F32;
    use smelt_ir::weights::random_f32;

    /// The direct `bn_fold_weight` is bit-identical to the interpreter's.
    #[test]
    fn direct_bn_weight_fold_equals_the_interpreter_bit_for_bit() {
        for (dims, eps) in [
            (vec![8, 3, 3, 3], 1e-5f32),
            (vec![5, 1, 1, 1], 1e-3),
            (vec![7], 0.1),
        ] {
            let mut store = WeightStore::new();
            let w_ty = TensorType::f32(dims.clone());
            let c = dims[0];
            let n = w_ty.num_elements();
            let w = store
                .add_computed("w", w_ty.clone(), &random_f32(1, n, -1.0, 1.0))
                .unwrap();
            let s = store
                .add_computed("s", TensorType::f32([c]), &random_f32(2, c, 0.5, 1.5))
                .unwrap();
            let v = store
                .add_computed("v", TensorType::f32([c]), &random_f32(3, c, 0.0, 2.0))
                .unwrap();
            let op = Op::BnFoldWeight { epsilon: F32(eps) };
            let direct = fold_bn_weight(eps, &[w, s, v], &w_ty, &store).expect("well formed");
            let tensors: Vec<Tensor> = [w, s, v]
                .iter()
                .map(|id| weight_tensor(&store, *id).unwrap())
                .collect();
            let refs: Vec<&Tensor> = tensors.iter().collect();
            let want = eval_op(&op, &refs, &w_ty, &store).unwrap();
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(direct.as_f32()), bits(want.f32s()), "{dims:?}");
        }
    }

    /// Operands of another form are left to the generic path.
    #[test]
    fn direct_bn_weight_fold_declines_mismatched_channels() {
        let mut store = WeightStore::new();
        let w_ty = TensorType::f32([4, 2]);
        let w = store.add_computed("w", w_ty.clone(), &[1.0; 8]).unwrap();
        let s = store
            .add_computed("s", TensorType::f32([3]), &[1.0; 3])
            .unwrap();
        let v = store
            .add_computed("v", TensorType::f32([3]), &[1.0; 3])
            .unwrap();
        assert!(fold_bn_weight(1e-5, &[w, s, v], &w_ty, &store).is_none());
    }
}
