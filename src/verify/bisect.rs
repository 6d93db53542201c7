//! Bisection over fusion sites: fusion limited to the first N sites of the full run,
//! binary-searched for the first site whose inclusion makes the outputs disagree.

use smelt_ir::diag::Location;
use smelt_ir::graph::{Func, Module};
use smelt_ir::interp;
use smelt_ir::{ErrorStats, Tensor};
use smelt_passes::fusion::FusionSite;

use super::layers::{ops_by_location, user_ops};
use super::{
    jit_run, worst_of, BisectOutcome, BisectProbe, BisectReport, Run, VerifyOptions, VerifyReport,
};
use crate::Error;

/// Bisects over fusion sites on `inputs` (random ones in [-input_range, input_range]),
/// against `reference`, the unfused results on them; see [`BisectReport`].
#[allow(clippy::too_many_arguments)]
pub(super) fn bisect(
    module: &Module,
    func: &Func,
    inputs: &[Tensor],
    reference: &[Tensor],
    input_range: f32,
    report: &VerifyReport,
    opts: &VerifyOptions,
) -> BisectReport {
    // the comparisons on the inputs bisected (those of `input_range`)
    let outputs = report.outputs_in(input_range).unwrap_or(&report.outputs);
    let interp_bad =
        worst_of(outputs, Run::InterpFused, Run::InterpUnfused).is_some_and(|r| r > opts.rtol);
    let jit_bad =
        worst_of(outputs, Run::JitFused, Run::InterpUnfused).is_some_and(|r| r > opts.rtol);
    let oracle = if interp_bad || !jit_bad {
        Run::InterpFused
    } else {
        Run::JitFused
    };
    let mut out = BisectReport {
        input_range,
        oracle,
        total_sites: report.sites.len(),
        probes: Vec::new(),
        outcome: BisectOutcome::NotNeeded,
    };
    if !interp_bad && !jit_bad {
        return out;
    }
    let sites = &report.sites;
    out.outcome = match bisect_sites(
        module,
        func,
        inputs,
        reference,
        sites,
        oracle,
        opts,
        &mut out.probes,
    ) {
        Ok(outcome) => outcome,
        Err(e) => BisectOutcome::Unavailable(e.to_string()),
    };
    out
}

/// Runs the fused module limited to the first `limit` sites under `oracle`; returns
/// the largest relative error over the outputs.
fn probe(
    module: &Module,
    func: &Func,
    inputs: &[Tensor],
    reference: &[Tensor],
    oracle: Run,
    opts: &VerifyOptions,
    limit: usize,
) -> Result<f64, Error> {
    let mut optimize = opts.optimize.clone();
    optimize.fusion.site_limit = Some(limit);
    let mut fused = module.clone();
    crate::optimize(&mut fused, &optimize, None)?;
    let fused_func = fused.func(&func.name).ok_or_else(|| {
        Error::Unsupported(format!("optimization removed function @{}", func.name))
    })?;
    let got = match oracle {
        Run::JitFused | Run::JitDynamic => jit_run(&fused, &func.name, inputs)?,
        Run::InterpFused | Run::InterpUnfused => interp::run(&fused, fused_func, inputs)?,
    };
    let mut worst = 0.0f64;
    for (i, (g, w)) in got.iter().zip(reference).enumerate() {
        let stats = ErrorStats::between_tensors(g, w).map_err(|m| {
            Error::Unsupported(format!("result {i} changed shape with {limit} sites: {m}"))
        })?;
        worst = worst.max(stats.relative);
    }
    Ok(worst)
}

/// Binary search for the smallest site count that disagrees. The full fusion
/// (`sites.len()` sites, as the report lists them in canonical order) is known to
/// disagree; a limit of N keeps exactly the first N of those sites.
#[allow(clippy::too_many_arguments)]
fn bisect_sites(
    module: &Module,
    func: &Func,
    inputs: &[Tensor],
    reference: &[Tensor],
    sites: &[FusionSite],
    oracle: Run,
    opts: &VerifyOptions,
    probes: &mut Vec<BisectProbe>,
) -> Result<BisectOutcome, Error> {
    let mut run = |limit: usize| -> Result<bool, Error> {
        let relative = probe(module, func, inputs, reference, oracle, opts, limit)?;
        let agree = relative <= opts.rtol;
        probes.push(BisectProbe {
            sites: limit,
            relative,
            agree,
        });
        Ok(agree)
    };
    if !run(0)? {
        return Ok(BisectOutcome::WithoutFusion);
    }
    // Invariant: the first `good` sites agree, the first `bad` disagree.
    let (mut good, mut bad) = (0usize, sites.len());
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if run(mid)? {
            good = mid;
        } else {
            bad = mid;
        }
    }
    let Some(site) = bad.checked_sub(1).and_then(|i| sites.get(i)).cloned() else {
        return Ok(BisectOutcome::NotReproduced);
    };
    let by_loc = ops_by_location(func);
    let user_ops = user_ops(&Location::fuse(site.merged.clone()), func, &by_loc);
    Ok(BisectOutcome::Culprit {
        sites: bad,
        site,
        user_ops,
    })
}
