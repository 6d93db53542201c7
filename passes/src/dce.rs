//! Dead-code elimination: drops instructions no result depends on, then weights no
//! `const` references (the store is rebuilt in the old id order, so it is deterministic).

use std::collections::BTreeMap;

use smelt_ir::graph::{Func, Module, Value};
use smelt_ir::op::Op;
use smelt_ir::weights::WeightId;

use crate::manager::{Pass, PassContext, PassError};

/// The dead-code elimination pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct DcePass;

impl Pass for DcePass {
    fn name(&self) -> &'static str {
        "dce"
    }

    /// Liveness reads no size.
    fn takes_symbolic_sizes(&self) -> bool {
        true
    }

    fn run(&self, module: &mut Module, cx: &mut PassContext) -> Result<(), PassError> {
        let mut removed_insts = 0;
        for f in &mut module.funcs {
            removed_insts += remove_dead_insts(f);
        }
        let removed_weights = remove_dead_weights(module)?;
        cx.dce_removed.0 += removed_insts;
        cx.dce_removed.1 += removed_weights;
        Ok(())
    }
}

/// Removes instructions whose values reach no result; returns how many.
pub fn remove_dead_insts(func: &mut Func) -> usize {
    let n_params = func.params.len();
    let mut live = vec![false; func.num_values()];
    for r in &func.results {
        if let Some(l) = live.get_mut(r.value.index()) {
            *l = true;
        }
    }
    for i in (0..func.insts.len()).rev() {
        if live[n_params + i] {
            for v in &func.insts[i].operands {
                if let Some(l) = live.get_mut(v.index()) {
                    *l = true;
                }
            }
        }
    }
    let mut new_value: Vec<Option<Value>> = (0..n_params).map(|p| Some(Value(p as u32))).collect();
    let old = std::mem::take(&mut func.insts);
    let before = old.len();
    for (i, mut inst) in old.into_iter().enumerate() {
        if !live[n_params + i] {
            new_value.push(None);
            continue;
        }
        for v in &mut inst.operands {
            // Live instructions only use live values, which are already renumbered.
            *v = new_value[v.index()].unwrap_or(*v);
        }
        func.insts.push(inst);
        new_value.push(Some(func.inst_value(func.insts.len() - 1)));
    }
    for r in &mut func.results {
        r.value = new_value
            .get(r.value.index())
            .copied()
            .flatten()
            .unwrap_or(r.value);
    }
    before - func.insts.len()
}

/// Rebuilds the weight store with only referenced weights; returns how many were dropped.
pub fn remove_dead_weights(module: &mut Module) -> Result<usize, PassError> {
    let mut used: BTreeMap<WeightId, Option<WeightId>> = BTreeMap::new();
    for f in &module.funcs {
        for inst in &f.insts {
            if let Op::Const(w) = inst.op {
                used.insert(w, None);
            }
        }
    }
    if used.len() == module.weights.len() {
        return Ok(0);
    }
    let mut store = module.weights.empty_like();
    for (old, new) in used.iter_mut() {
        let w = module
            .weights
            .get(*old)
            .ok_or_else(|| PassError::Internal {
                pass: "dce",
                message: format!("const references missing weight {}", old.0),
            })?;
        let id = store
            .add_shared(
                w.name.clone(),
                w.ty.clone(),
                w.data.clone(),
                w.origin.clone(),
            )
            .map_err(|m| PassError::Internal {
                pass: "dce",
                message: m,
            })?;
        *new = Some(id);
    }
    for f in &mut module.funcs {
        for inst in &mut f.insts {
            if let Op::Const(w) = &mut inst.op {
                if let Some(Some(new)) = used.get(w) {
                    *w = *new;
                }
            }
        }
    }
    let dropped = module.weights.len() - store.len();
    module.weights = store;
    Ok(dropped)
}
