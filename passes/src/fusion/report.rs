//! The fusion report: stop reason, rule counts, fusion sites with their provenance, near
//! misses (a guard refused) and fusions that lost in extraction — the data behind
//! `smelt explain`. Its text and JSON (serde) forms are deterministic.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use smelt_ir::diag::Location;

/// Why saturation stopped.
#[derive(Clone, Debug, PartialEq)]
pub enum StopReason {
    /// No rule could change the e-graph any more.
    Saturated,
    /// The iteration limit was reached.
    IterationLimit(usize),
    /// The e-node limit was reached.
    NodeLimit(usize),
    /// The time limit (seconds) was reached.
    TimeLimit(f64),
    /// Fusion is disabled in the options.
    Disabled,
    /// Something else (egg's message).
    Other(String),
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::Saturated => f.write_str("saturated"),
            StopReason::IterationLimit(n) => write!(f, "iteration limit ({n})"),
            StopReason::NodeLimit(n) => write!(f, "node limit ({n})"),
            StopReason::TimeLimit(s) => write!(f, "time limit ({s} s)"),
            StopReason::Disabled => f.write_str("disabled"),
            StopReason::Other(m) => write!(f, "stopped: {m}"),
        }
    }
}

/// A stop reason serializes as its text, e.g. `"iteration limit (30)"`.
impl Serialize for StopReason {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Counts of one rule over the whole run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleStat {
    /// Rule name.
    pub rule: String,
    /// Left-hand side matches (counted again in every iteration).
    pub matches: usize,
    /// Matches that changed the e-graph.
    pub applied: usize,
    /// Matches a guard refused.
    pub refused: usize,
}

/// An op of the output built by rules.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FusionSite {
    /// Index of the instruction in the output function.
    pub inst: usize,
    /// The op's mnemonic with its post-ops, e.g. `fused conv2d post [add, relu]`.
    pub op: String,
    /// The rules that built it, in the order they fired.
    pub rules: Vec<String>,
    /// The locations of the input ops it merges, in program order.
    pub merged: Vec<Location>,
    /// The mnemonics of the input ops it merges, parallel to `merged`.
    pub merged_ops: Vec<String>,
}

/// A rule that matched but whose guard refused, at a site where it never fired.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct NearMiss {
    /// Rule name.
    pub rule: String,
    /// The op at the site (the left-hand side root), e.g. `relu`.
    pub op: String,
    /// Its location.
    pub location: Location,
    /// The refusing guard.
    pub guard: String,
    /// The guard's reason.
    pub reason: String,
}

/// A rule that fired where a written-out float attribute matched the model's within the
/// tolerance rather than exactly (`alpha = 0.16666667 in the model, 0.1666667 in the
/// rule`): it fused, and says which value it took for which.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ApproximateMatch {
    /// Rule name.
    pub rule: String,
    /// The op at the site (the left-hand side root).
    pub op: String,
    /// Its location.
    pub location: Location,
    /// The attribute, both values and the tolerance.
    pub note: String,
}

/// A rule that fired but whose result the cost model did not choose.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LostFusion {
    /// Rule name.
    pub rule: String,
    /// The op at the site.
    pub op: String,
    /// Its location.
    pub location: Location,
    /// Total cost (seconds) of the graph with the rule's result chosen.
    pub fused_cost: f64,
    /// Total cost (seconds) of the chosen graph.
    pub chosen_cost: f64,
}

/// Everything fusion did to one function. Its JSON form ([`FusionReport::to_json`]) has
/// the fields in declaration order; costs are in seconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FusionReport {
    /// The function's name.
    pub func: String,
    /// Why saturation stopped.
    pub stop_reason: StopReason,
    /// Iterations run.
    pub iterations: usize,
    /// E-nodes at the end.
    pub egraph_nodes: usize,
    /// E-classes at the end.
    pub egraph_classes: usize,
    /// Cost (seconds) of the input graph under the cost model.
    pub cost_before: f64,
    /// Cost (seconds) of the output graph.
    pub cost_after: f64,
    /// Op counts of the input, by mnemonic.
    pub ops_before: BTreeMap<String, usize>,
    /// Op counts of the output, by mnemonic: of the function at the end of the pipeline
    /// that ran fusion (after `const_fold` and `dce` in the default pipeline, so folded
    /// weight-prep ops are gone), or of fusion's own output when [`super::fuse_func`]
    /// is called alone.
    pub ops_after: BTreeMap<String, usize>,
    /// Per-rule counts, by rule name.
    pub rules: Vec<RuleStat>,
    /// Ops of the output built by rules.
    pub sites: Vec<FusionSite>,
    /// Sites of the full fusion that [`super::FusionOptions::site_limit`] left unfused, in
    /// canonical order (`inst` indexes the fully fused output).
    pub withheld: Vec<FusionSite>,
    /// Matches refused by a guard (a written-out attribute outside the tolerance
    /// included, as guard `attributes`).
    pub near_misses: Vec<NearMiss>,
    /// Rules that fired on attributes matched within the tolerance, not exactly.
    pub approximate: Vec<ApproximateMatch>,
    /// Rule results the cost model did not choose.
    pub lost: Vec<LostFusion>,
}

pub(crate) fn micros(s: f64) -> String {
    format!("{:.3} us", s * 1e6)
}

pub(crate) fn counts(m: &BTreeMap<String, usize>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl FusionReport {
    /// The report as text, one fact per line, byte-identical across runs.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "fusion of @{}: {} after {} iterations ({} e-nodes, {} e-classes)",
            self.func, self.stop_reason, self.iterations, self.egraph_nodes, self.egraph_classes
        );
        let _ = writeln!(
            out,
            "cost: {} -> {}",
            micros(self.cost_before),
            micros(self.cost_after)
        );
        let _ = writeln!(out, "ops before: {}", counts(&self.ops_before));
        let _ = writeln!(out, "ops after:  {}", counts(&self.ops_after));
        let fired: Vec<&RuleStat> = self.rules.iter().filter(|r| r.matches > 0).collect();
        if !fired.is_empty() {
            let _ = writeln!(out, "rules:");
            for r in fired {
                let _ = writeln!(
                    out,
                    "  {}: {} matches, {} applied, {} refused",
                    r.rule, r.matches, r.applied, r.refused
                );
            }
        }
        if !self.sites.is_empty() {
            let _ = writeln!(out, "sites:");
            for s in &self.sites {
                let merged = s
                    .merged
                    .iter()
                    .map(|l| l.to_string())
                    .collect::<Vec<_>>()
                    .join(", ");
                let _ = writeln!(
                    out,
                    "  #{} {} <- {} [{}]",
                    s.inst,
                    s.op,
                    s.rules.join(", "),
                    merged
                );
            }
        }
        if !self.withheld.is_empty() {
            let _ = writeln!(out, "withheld by the site limit:");
            for s in &self.withheld {
                let _ = writeln!(out, "  {} <- {}", s.op, s.rules.join(", "));
            }
        }
        if !self.near_misses.is_empty() {
            let _ = writeln!(out, "near misses:");
            for n in &self.near_misses {
                let _ = writeln!(
                    out,
                    "  {} at {} {}: guard '{}' refused: {}",
                    n.rule, n.op, n.location, n.guard, n.reason
                );
            }
        }
        if !self.approximate.is_empty() {
            let _ = writeln!(out, "attributes matched within the tolerance:");
            for a in &self.approximate {
                let _ = writeln!(out, "  {} at {} {}: {}", a.rule, a.op, a.location, a.note);
            }
        }
        if !self.lost.is_empty() {
            let _ = writeln!(out, "lost in extraction:");
            for l in &self.lost {
                let _ = writeln!(
                    out,
                    "  {} at {} {}: fused graph costs {}, chosen graph {}",
                    l.rule,
                    l.op,
                    l.location,
                    micros(l.fused_cost),
                    micros(l.chosen_cost)
                );
            }
        }
        out
    }
}

impl FusionReport {
    /// The report as one JSON object, deterministic (fields in declaration order, op
    /// counts sorted by name, non-finite costs as null); docs/json.md has the schema.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a fusion report serializes: every map key is a string")
    }
}
