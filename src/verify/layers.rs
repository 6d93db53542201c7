//! Per-layer comparison: each value of the fused module matched, through the user
//! locations it merged, with the unfused value it stands for, and compared in the
//! interpreter and (with intermediates kept) in the JIT.

use std::collections::BTreeMap;

use smelt_ir::diag::Location;
use smelt_ir::graph::{Func, Module};
use smelt_ir::{ErrorStats, Op, Tensor};
use smelt_passes::fusion::{op_summary, FusionSite};

use super::{LayerCheck, PerLayerReport, SkippedLayer, UserOp, VerifyOptions};
use crate::{CompileOptions, Error, Executable};

/// Compiles function `name` of `module` keeping every intermediate, runs it, and returns
/// each computed value by instruction index.
fn jit_intermediates(
    module: &Module,
    name: &str,
    inputs: &[Tensor],
) -> Result<BTreeMap<usize, Tensor>, Error> {
    let opts = CompileOptions {
        keep_intermediates: true,
        ..CompileOptions::default()
    };
    let (_, values) = Executable::compile(module, Some(name), &opts)?.run_keeping(inputs)?;
    Ok(values.into_iter().map(|v| (v.inst, v.tensor)).collect())
}

/// The location an op of the fused module is compared under: the last user op it
/// merged (for a fused op, the one whose value it produces).
fn last_location(loc: &Location) -> Option<&Location> {
    match loc {
        Location::Unknown => None,
        Location::Fused(parts) => parts.last().and_then(last_location),
        other => Some(other),
    }
}

/// Every user location an op merged, in program order.
fn user_locations(loc: &Location) -> Vec<Location> {
    match loc {
        Location::Unknown => Vec::new(),
        Location::Fused(parts) => parts.iter().flat_map(user_locations).collect(),
        other => vec![other.clone()],
    }
}

/// Non-constant instructions of the unfused function by location.
pub(super) fn ops_by_location(func: &Func) -> BTreeMap<&Location, Vec<usize>> {
    let mut map: BTreeMap<&Location, Vec<usize>> = BTreeMap::new();
    for (i, inst) in func.insts.iter().enumerate() {
        if !matches!(inst.op, Op::Const(_)) {
            map.entry(&inst.loc).or_default().push(i);
        }
    }
    map
}

/// Whether instruction `later` of `func` (transitively) reads the value of instruction
/// `earlier`.
fn depends_on(func: &Func, later: usize, earlier: usize) -> bool {
    let target = func.inst_value(earlier);
    let mut seen = vec![false; func.insts.len()];
    let mut stack = vec![later];
    while let Some(i) = stack.pop() {
        let Some(inst) = func.insts.get(i) else {
            continue;
        };
        for v in &inst.operands {
            if *v == target {
                return true;
            }
            if let Some(k) = v.index().checked_sub(func.params.len()) {
                if k > earlier && k < seen.len() && !seen[k] {
                    seen[k] = true;
                    stack.push(k);
                }
            }
        }
    }
    false
}

pub(super) fn user_ops(
    loc: &Location,
    unfused: &Func,
    by_loc: &BTreeMap<&Location, Vec<usize>>,
) -> Vec<UserOp> {
    user_locations(loc)
        .into_iter()
        .map(|l| {
            let op = match by_loc.get(&l).map(|v| v.as_slice()) {
                Some([i]) => unfused.insts[*i].op.name().to_string(),
                _ => "?".to_string(),
            };
            UserOp { op, location: l }
        })
        .collect()
}

/// The rules that built the fused op at `inst`: the report site with the same
/// location and op (instruction indices change in const_fold and dce).
fn rules_of(sites: &[FusionSite], loc: &Location, op: &str) -> Vec<String> {
    sites
        .iter()
        .find(|s| s.op == op && &Location::fuse(s.merged.clone()) == loc)
        .map(|s| s.rules.clone())
        .unwrap_or_default()
}

#[allow(clippy::too_many_arguments)]
pub(super) fn per_layer(
    unfused: &Func,
    fused_func: &Func,
    fused: &Module,
    sites: &[FusionSite],
    reference_all: &[Tensor],
    fused_all: &[Tensor],
    inputs: &[Tensor],
    input_range: f32,
    opts: &VerifyOptions,
) -> PerLayerReport {
    let by_loc = ops_by_location(unfused);
    let np_unfused = unfused.params.len();
    let np_fused = fused_func.params.len();
    let mut skipped = Vec::new();
    // Fused instruction -> the unfused instruction of its last user op.
    let mut candidates: Vec<(usize, usize)> = Vec::new();
    for (i, inst) in fused_func.insts.iter().enumerate() {
        if matches!(inst.op, Op::Const(_)) {
            continue;
        }
        let op = op_summary(&inst.op);
        let skip = |reason: String| SkippedLayer {
            inst: i,
            op: op.clone(),
            location: inst.loc.clone(),
            reason,
        };
        let Some(last) = last_location(&inst.loc) else {
            skipped.push(skip("it has no location".into()));
            continue;
        };
        match by_loc.get(last).map(|v| v.as_slice()) {
            Some([u]) => {
                let ref_ty = &unfused.insts[*u].ty;
                if ref_ty.dims != inst.ty.dims {
                    skipped.push(skip(format!(
                        "its type {} differs from the unfused value's {}",
                        inst.ty, ref_ty
                    )));
                } else {
                    candidates.push((i, *u));
                }
            }
            Some(several) => skipped.push(skip(format!(
                "{} unfused ops share its location {last}",
                several.len()
            ))),
            None => skipped.push(skip(format!("no unfused op has the location {last}"))),
        }
    }
    // A fused op computes all of its last user op only if no op downstream of it also
    // merged that user op: otherwise a rewrite split the user op (e.g. a batch norm
    // turned into a scale kept here and a shift folded into the next conv), or this op
    // is an inner node of a rewrite whose root produces the user op's value.
    let mut compared: Vec<(usize, usize)> = Vec::new();
    for &(i, u) in &candidates {
        let inst = &fused_func.insts[i];
        let Some(last) = last_location(&inst.loc) else {
            continue;
        };
        let rest = (i + 1..fused_func.insts.len()).find(|&j| {
            let later = &fused_func.insts[j];
            !matches!(later.op, Op::Const(_))
                && user_locations(&later.loc).contains(last)
                && depends_on(fused_func, j, i)
        });
        match rest {
            Some(j) => skipped.push(SkippedLayer {
                inst: i,
                op: op_summary(&inst.op),
                location: inst.loc.clone(),
                reason: format!(
                    "it computes only part of {} {last}; %{j} downstream merges it too",
                    unfused.insts[u].op.name()
                ),
            }),
            None => compared.push((i, u)),
        }
    }
    skipped.sort_by_key(|s| s.inst);

    // The JIT's intermediates: the fused function compiled with its own memory per
    // value, every value read back after one run.
    let (jit_values, jit_note) = if !opts.jit {
        (None, Some("the JIT legs are off".to_string()))
    } else {
        match jit_intermediates(fused, &fused_func.name, inputs) {
            Ok(values) => (Some(values), None),
            Err(e) => (
                None,
                Some(format!(
                    "the JIT could not run with intermediates kept: {e}"
                )),
            ),
        }
    };

    let mut layers = Vec::with_capacity(compared.len());
    for &(i, u) in &compared {
        let inst = &fused_func.insts[i];
        let op = op_summary(&inst.op);
        let (Some(got), Some(want)) = (
            fused_all.get(np_fused + i),
            reference_all.get(np_unfused + u),
        ) else {
            continue;
        };
        let Ok(interp_stats) = ErrorStats::between_tensors(got, want) else {
            continue;
        };
        let jit = jit_values
            .as_ref()
            .and_then(|v| v.get(&i))
            .and_then(|t| ErrorStats::between_tensors(t, want).ok());
        let pass = interp_stats.relative <= opts.rtol
            && jit.as_ref().is_none_or(|j| j.relative <= opts.rtol);
        layers.push(LayerCheck {
            inst: i,
            rules: rules_of(sites, &inst.loc, &op),
            op,
            user_ops: user_ops(&inst.loc, unfused, &by_loc),
            reference_inst: u,
            interp: interp_stats,
            jit,
            pass,
        });
    }
    let first_divergence = layers.iter().position(|l| !l.pass);
    PerLayerReport {
        input_range,
        layers,
        skipped,
        first_divergence,
        jit_note,
    }
}
