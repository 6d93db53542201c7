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
use smelt_ir::graph::{Func, Module, Value};
use smelt_ir::interp::eval_op;
use smelt_ir::op::Op;
use smelt_ir::tensor::Tensor;
use smelt_ir::weights::{WeightId, WeightStore};

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

fn weight_tensor(weights: &WeightStore, id: WeightId) -> Option<Tensor> {
    let w = weights.get(id)?;
    Some(Tensor {
        ty: w.ty.clone(),
        data: w.f32s().to_vec(),
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
        .iter()
        .zip(&var.data)
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
        let hint = name_hint(&inst.op, &inputs, weights);
        let id = weights
            .add_computed(&hint, result.ty.clone(), &result.data)
            .map_err(|m| PassError::Internal {
                pass: "const_fold",
                message: m,
            })?;
        let inst = &mut func.insts[i];
        inst.op = Op::Const(id);
        inst.operands.clear();
        known.insert(value, id);
        cx.folded_consts += 1;
    }
    Ok(())
}
