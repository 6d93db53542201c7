//! `smelt explain`: the fusion reports of a pipeline run told in the user's names — which
//! rules built each fused op and which input ops it merges, which guard refused a match
//! and why, which fused forms lost in extraction and by how much, and the op counts
//! before fusion and after the whole pipeline. Text and JSON, both deterministic.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::report::{
    counts, json_counts, json_list, json_num, json_str, micros, FusionReport, LostFusion,
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

/// The explanation as one JSON object (keys in a fixed order): `ops_before` and
/// `ops_after` (op name → count, summed over functions), `sites` (`func`, `op`,
/// `rules`, `merged`: a list of `{op, location}`), `near_misses` (`func`, `rule`,
/// `op`, `location`, `guard`, `reason`), `lost` (`func`, `rule`, `op`, `location`,
/// `fused_cost`, `chosen_cost`, `extra_cost` in seconds) and `functions` (per function:
/// `func`, `stop_reason`, `iterations`, `egraph_nodes`, `egraph_classes`,
/// `cost_before`, `cost_after`, `ops_before`, `ops_after`).
pub fn explain_json(reports: &[FusionReport]) -> String {
    let sites = json_list(reports.iter().flat_map(|r| {
        r.sites.iter().map(move |s| {
            let merged = json_list(s.merged_ops.iter().zip(&s.merged).map(|(op, loc)| {
                format!(
                    "{{\"op\": {}, \"location\": {}}}",
                    json_str(op),
                    json_str(&loc.to_string())
                )
            }));
            format!(
                "{{\"func\": {}, \"op\": {}, \"rules\": {}, \"merged\": {merged}}}",
                json_str(&r.func),
                json_str(&s.op),
                json_list(s.rules.iter().map(|x| json_str(x)))
            )
        })
    }));
    let near = json_list(reports.iter().flat_map(|r| {
        r.near_misses.iter().map(move |n| {
            format!(
                "{{\"func\": {}, \"rule\": {}, \"op\": {}, \"location\": {}, \"guard\": {}, \
                 \"reason\": {}}}",
                json_str(&r.func),
                json_str(&n.rule),
                json_str(&n.op),
                json_str(&n.location.to_string()),
                json_str(&n.guard),
                json_str(&n.reason)
            )
        })
    }));
    let lost = json_list(reports.iter().flat_map(|r| {
        r.lost.iter().map(move |l| {
            format!(
                "{{\"func\": {}, \"rule\": {}, \"op\": {}, \"location\": {}, \"fused_cost\": {}, \
                 \"chosen_cost\": {}, \"extra_cost\": {}}}",
                json_str(&r.func),
                json_str(&l.rule),
                json_str(&l.op),
                json_str(&l.location.to_string()),
                json_num(l.fused_cost),
                json_num(l.chosen_cost),
                json_num(l.fused_cost - l.chosen_cost)
            )
        })
    }));
    let functions = json_list(reports.iter().map(|r| {
        format!(
            "{{\"func\": {}, \"stop_reason\": {}, \"iterations\": {}, \"egraph_nodes\": {}, \
             \"egraph_classes\": {}, \"cost_before\": {}, \"cost_after\": {}, \
             \"ops_before\": {}, \"ops_after\": {}}}",
            json_str(&r.func),
            json_str(&r.stop_reason.to_string()),
            r.iterations,
            r.egraph_nodes,
            r.egraph_classes,
            json_num(r.cost_before),
            json_num(r.cost_after),
            json_counts(&r.ops_before),
            json_counts(&r.ops_after)
        )
    }));
    format!(
        "{{\"ops_before\": {}, \"ops_after\": {}, \"sites\": {sites}, \"near_misses\": {near}, \
         \"lost\": {lost}, \"functions\": {functions}}}",
        json_counts(&total_counts(reports, |r| &r.ops_before)),
        json_counts(&total_counts(reports, |r| &r.ops_after)),
    )
}
