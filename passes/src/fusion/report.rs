//! The fusion report: stop reason, rule counts, fusion sites with their provenance, near
//! misses (a guard refused) and fusions that lost in extraction — the data behind
//! `smelt explain`. Its text form is deterministic.

use std::collections::BTreeMap;
use std::fmt::Write as _;

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

/// Counts of one rule over the whole run.
#[derive(Clone, Debug, PartialEq, Eq)]
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
#[derive(Clone, Debug, PartialEq, Eq)]
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
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
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

/// A rule that fired but whose result the cost model did not choose.
#[derive(Clone, Debug, PartialEq)]
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

/// Everything fusion did to one function.
#[derive(Clone, Debug, PartialEq)]
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
    /// Per-rule counts, by rule name.
    pub rules: Vec<RuleStat>,
    /// Ops of the output built by rules.
    pub sites: Vec<FusionSite>,
    /// Sites of the full fusion that [`super::FusionOptions::site_limit`] left unfused, in
    /// canonical order (`inst` indexes the fully fused output).
    pub withheld: Vec<FusionSite>,
    /// Matches refused by a guard.
    pub near_misses: Vec<NearMiss>,
    /// Rule results the cost model did not choose.
    pub lost: Vec<LostFusion>,
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

/// A JSON string literal for `s` (quotes, backslashes and control characters escaped):
/// the one escaper behind every hand-written JSON report (fusion, explain, verify, bench).
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub(crate) fn json_counts(m: &BTreeMap<String, usize>) -> String {
    let items: Vec<String> = m
        .iter()
        .map(|(k, v)| format!("{}: {v}", json_str(k)))
        .collect();
    format!("{{{}}}", items.join(", "))
}

pub(crate) fn json_list(items: impl IntoIterator<Item = String>) -> String {
    format!("[{}]", items.into_iter().collect::<Vec<_>>().join(", "))
}

/// Seconds as a JSON number (finite; NaN becomes null).
pub(crate) fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:e}")
    } else {
        "null".to_string()
    }
}

impl FusionReport {
    /// The report as one JSON object (keys in a fixed order, deterministic): `func`,
    /// `stop_reason`, `iterations`, `egraph_nodes`, `egraph_classes`, `cost_before`,
    /// `cost_after` (seconds), `ops_before`, `ops_after` (op name → count), `rules`,
    /// `sites`, `withheld`, `near_misses`, `lost`.
    pub fn to_json(&self) -> String {
        let rules = json_list(self.rules.iter().map(|r| {
            format!(
                "{{\"rule\": {}, \"matches\": {}, \"applied\": {}, \"refused\": {}}}",
                json_str(&r.rule),
                r.matches,
                r.applied,
                r.refused
            )
        }));
        let site = |s: &FusionSite| {
            format!(
                "{{\"inst\": {}, \"op\": {}, \"rules\": {}, \"merged\": {}}}",
                s.inst,
                json_str(&s.op),
                json_list(s.rules.iter().map(|r| json_str(r))),
                json_list(s.merged.iter().map(|l| json_str(&l.to_string())))
            )
        };
        let sites = json_list(self.sites.iter().map(site));
        let withheld = json_list(self.withheld.iter().map(site));
        let near = json_list(self.near_misses.iter().map(|n| {
            format!(
                "{{\"rule\": {}, \"op\": {}, \"location\": {}, \"guard\": {}, \"reason\": {}}}",
                json_str(&n.rule),
                json_str(&n.op),
                json_str(&n.location.to_string()),
                json_str(&n.guard),
                json_str(&n.reason)
            )
        }));
        let lost = json_list(self.lost.iter().map(|l| {
            format!(
                "{{\"rule\": {}, \"op\": {}, \"location\": {}, \"fused_cost\": {}, \"chosen_cost\": {}}}",
                json_str(&l.rule),
                json_str(&l.op),
                json_str(&l.location.to_string()),
                json_num(l.fused_cost),
                json_num(l.chosen_cost)
            )
        }));
        format!(
            "{{\"func\": {}, \"stop_reason\": {}, \"iterations\": {}, \"egraph_nodes\": {}, \
             \"egraph_classes\": {}, \"cost_before\": {}, \"cost_after\": {}, \"ops_before\": {}, \
             \"ops_after\": {}, \"rules\": {rules}, \"sites\": {sites}, \"withheld\": {withheld}, \"near_misses\": {near}, \
             \"lost\": {lost}}}",
            json_str(&self.func),
            json_str(&self.stop_reason.to_string()),
            self.iterations,
            self.egraph_nodes,
            self.egraph_classes,
            json_num(self.cost_before),
            json_num(self.cost_after),
            json_counts(&self.ops_before),
            json_counts(&self.ops_after),
        )
    }
}
