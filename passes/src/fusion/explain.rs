//! `smelt explain`: the fusion reports of a pipeline run told in the user's names — which
//! rules built each fused op and which input ops it merges, which guard refused a match
//! and why, which fused forms lost in extraction and by how much, and the op counts
//! before fusion and after the whole pipeline. Text and JSON, both deterministic.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use smelt_ir::diag::Location;

use super::report::{
    counts, micros, ApproximateMatch, FusionReport, LostFusion, NearMiss, StopReason,
};

/// Op counts summed over every function's report (`ops_before` or `ops_after`).
fn total_counts(
    reports: &[FusionReport],
    pick: impl Fn(&FusionReport) -> &BTreeMap<String, usize>,
) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in reports {
        for (op, n) in pick(r) {
            *out.entry(op.clone()).or_insert(0) += n;
        }
    }
    out
}

/// How much more the fused form of a lost fusion costs, e.g. `+90.681 us, 1.85x`.
fn loss_text(l: &LostFusion) -> String {
    let extra = micros(l.fused_cost - l.chosen_cost);
    if l.chosen_cost > 0.0 {
        format!("+{extra}, {:.2}x", l.fused_cost / l.chosen_cost)
    } else {
        format!("+{extra}")
    }
}

/// The explanation as text, one fact per line, byte-identical across runs. Expects the
/// reports of a whole pipeline run (so `ops_after` counts the pipeline's result).
pub fn explain_text(reports: &[FusionReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let _ = writeln!(out, "@{}", r.func);
        let _ = writeln!(
            out,
            "  fusion:     {} after {} iterations ({} e-nodes, {} e-classes)",
            r.stop_reason, r.iterations, r.egraph_nodes, r.egraph_classes
        );
        let _ = writeln!(
            out,
            "  cost:       {} -> {} (cost model estimate)",
            micros(r.cost_before),
            micros(r.cost_after)
        );
        let _ = writeln!(out, "  ops before: {}", counts(&r.ops_before));
        let _ = writeln!(out, "  ops after:  {}", counts(&r.ops_after));
        let _ = writeln!(out, "fused ({}):", r.sites.len());
        for s in &r.sites {
            let _ = writeln!(out, "  {}", s.op);
            let _ = writeln!(out, "    rules:  {}", s.rules.join(" -> "));
            let merged: Vec<String> = s
                .merged_ops
                .iter()
                .zip(&s.merged)
                .map(|(op, loc)| format!("{op} {loc}"))
                .collect();
            let _ = writeln!(out, "    merges: {}", merged.join(", "));
        }
        if !r.withheld.is_empty() {
            let _ = writeln!(
                out,
                "left unfused by the site limit ({}):",
                r.withheld.len()
            );
            for s in &r.withheld {
                let _ = writeln!(out, "  {} <- {}", s.op, s.rules.join(" -> "));
            }
        }
        let _ = writeln!(out, "not fused, a guard refused ({}):", r.near_misses.len());
        for n in &r.near_misses {
            let _ = writeln!(
                out,
                "  {} {}: {} refused by guard '{}': {}",
                n.op, n.location, n.rule, n.guard, n.reason
            );
        }
        if !r.approximate.is_empty() {
            let _ = writeln!(
                out,
                "fused on attributes within the tolerance ({}):",
                r.approximate.len()
            );
            for a in &r.approximate {
                let _ = writeln!(out, "  {} {}: {}: {}", a.op, a.location, a.rule, a.note);
            }
        }
        let _ = writeln!(out, "lost in extraction ({}):", r.lost.len());
        for l in &r.lost {
            let _ = writeln!(
                out,
                "  {} {}: {} gives a graph costing {}, the chosen graph {} ({})",
                l.op,
                l.location,
                l.rule,
                micros(l.fused_cost),
                micros(l.chosen_cost),
                loss_text(l)
            );
        }
    }
    if reports.len() > 1 {
        let _ = writeln!(
            out,
            "all functions: ops before: {}",
            counts(&total_counts(reports, |r| &r.ops_before))
        );
        let _ = writeln!(
            out,
            "all functions: ops after:  {}",
            counts(&total_counts(reports, |r| &r.ops_after))
        );
    }
    out
}

/// The JSON form of [`explain_json`]: a view of the reports, borrowed, in field order.
#[derive(Serialize)]
struct Explanation<'a> {
    /// Summed over every function.
    ops_before: BTreeMap<String, usize>,
    /// Summed over every function, counted at the end of the pipeline.
    ops_after: BTreeMap<String, usize>,
    sites: Vec<ExplainedSite<'a>>,
    near_misses: Vec<ExplainedMiss<'a>>,
    approximate: Vec<ExplainedApproximate<'a>>,
    lost: Vec<ExplainedLoss<'a>>,
    functions: Vec<FunctionSummary<'a>>,
}

/// A near miss with the name of its function in front of its own fields.
#[derive(Serialize)]
struct ExplainedMiss<'a> {
    func: &'a str,
    #[serde(flatten)]
    miss: &'a NearMiss,
}

/// An approximate attribute match with the name of its function in front.
#[derive(Serialize)]
struct ExplainedApproximate<'a> {
    func: &'a str,
    #[serde(flatten)]
    matched: &'a ApproximateMatch,
}

/// A fused op with each merged input op beside its location (the report keeps the two
/// as parallel lists).
#[derive(Serialize)]
struct ExplainedSite<'a> {
    func: &'a str,
    op: &'a str,
    rules: &'a [String],
    merged: Vec<MergedOp<'a>>,
}

#[derive(Serialize)]
struct MergedOp<'a> {
    op: &'a str,
    location: &'a Location,
}

/// A lost fusion with how much more (seconds) its graph would have cost.
#[derive(Serialize)]
struct ExplainedLoss<'a> {
    func: &'a str,
    #[serde(flatten)]
    lost: &'a LostFusion,
    extra_cost: f64,
}

/// A report's run statistics and op counts, without its item lists.
#[derive(Serialize)]
struct FunctionSummary<'a> {
    func: &'a str,
    stop_reason: &'a StopReason,
    iterations: usize,
    egraph_nodes: usize,
    egraph_classes: usize,
    cost_before: f64,
    cost_after: f64,
    ops_before: &'a BTreeMap<String, usize>,
    ops_after: &'a BTreeMap<String, usize>,
}

/// The explanation as one JSON object (fields in a fixed order, deterministic; schema in
/// docs/json.md): `ops_before` and `ops_after` (op name → count, summed over functions),
/// `sites` (`func`, `op`, `rules`, `merged`: a list of `{op, location}`), `near_misses`
/// (`func`, `rule`, `op`, `location`, `guard`, `reason`), `approximate` (`func`, `rule`,
/// `op`, `location`, `note`: a written-out attribute matched within the tolerance), `lost` (`func`, `rule`, `op`,
/// `location`, `fused_cost`, `chosen_cost`, `extra_cost` in seconds) and `functions` (per
/// function: `func`, `stop_reason`, `iterations`, `egraph_nodes`, `egraph_classes`,
/// `cost_before`, `cost_after`, `ops_before`, `ops_after`).
pub fn explain_json(reports: &[FusionReport]) -> String {
    let explanation = Explanation {
        ops_before: total_counts(reports, |r| &r.ops_before),
        ops_after: total_counts(reports, |r| &r.ops_after),
        sites: reports
            .iter()
            .flat_map(|r| {
                r.sites.iter().map(|s| ExplainedSite {
                    func: &r.func,
                    op: &s.op,
                    rules: &s.rules,
                    merged: s
                        .merged_ops
                        .iter()
                        .zip(&s.merged)
                        .map(|(op, location)| MergedOp { op, location })
                        .collect(),
                })
            })
            .collect(),
        near_misses: reports
            .iter()
            .flat_map(|r| {
                r.near_misses.iter().map(|miss| ExplainedMiss {
                    func: &r.func,
                    miss,
                })
            })
            .collect(),
        approximate: reports
            .iter()
            .flat_map(|r| {
                r.approximate.iter().map(|matched| ExplainedApproximate {
                    func: &r.func,
                    matched,
                })
            })
            .collect(),
        lost: reports
            .iter()
            .flat_map(|r| {
                r.lost.iter().map(|lost| ExplainedLoss {
                    func: &r.func,
                    lost,
                    extra_cost: lost.fused_cost - lost.chosen_cost,
                })
            })
            .collect(),
        functions: reports
            .iter()
            .map(|r| FunctionSummary {
                func: &r.func,
                stop_reason: &r.stop_reason,
                iterations: r.iterations,
                egraph_nodes: r.egraph_nodes,
                egraph_classes: r.egraph_classes,
                cost_before: r.cost_before,
                cost_after: r.cost_after,
                ops_before: &r.ops_before,
                ops_after: &r.ops_after,
            })
            .collect(),
    };
    serde_json::to_string(&explanation)
        .expect("an explanation serializes: every map key is a string")
}
