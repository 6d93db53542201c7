//! E-graph fusion: egg language, analysis, rules as data, cost model, extraction, explanations.
//!
//! [`fuse_func`] builds an e-graph from a function (every result a root; commutative
//! operands put in canonical order first), saturates it with the rules under node,
//! iteration and time limits, extracts the cheapest graph with a DAG-aware extractor, and
//! rebuilds a function in canonical order whose ops carry their provenance. Weight-prep
//! ops the rules introduce (`bn_fold_weight`, `bn_fold_bias`) are left for `const_fold`.

pub mod analysis;
pub mod apply;
pub mod attr_match;
pub mod check;
pub mod cost;
pub mod dot;
pub mod explain;
pub mod extract;
mod from_func;
pub mod lang;
pub mod polynomial;
pub mod prove;
pub mod report;
pub mod rules;
pub mod smt;
mod to_func;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use egg::{Id, Language, Runner, SimpleScheduler};
use smelt_ir::diag::{Diagnostic, Location};
use smelt_ir::graph::{Func, FuncResult, Inst, Module, Value};
use smelt_ir::op::{broadcast, Op, PostOp};
use smelt_ir::types::TensorType;
use smelt_ir::weights::WeightStore;

use crate::manager::{Pass, PassContext, PassError};
use analysis::{FusionAnalysis, FusionGraph, Outcome, Provenance};
use apply::{compile_rules, GuardContext};
pub use check::{check_rule, check_rules, CheckOptions, RuleCheck, Stratum, Verdict};
pub use cost::CostModel;
pub use explain::{explain_json, explain_text};
use extract::{dag_cost, CostTable};
use from_func::*;
use lang::{split_op, OpKind, TensorNode};
pub use report::{
    ApproximateMatch, FusionReport, FusionSite, LostFusion, NearMiss, RuleStat, StopReason,
};
pub use rules::{builtin_rules, load_rules, Rule, BUILTIN_RULES};
use to_func::*;

/// Saturation limits. The time limit is a safety net set far above what normal models
/// need, so results never depend on machine load; the iteration and node limits bind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusionLimits {
    /// Maximum rewrite iterations.
    pub iterations: usize,
    /// Maximum e-nodes.
    pub nodes: usize,
    /// Maximum wall time.
    pub time: Duration,
}

impl Default for FusionLimits {
    fn default() -> Self {
        FusionLimits {
            iterations: 30,
            nodes: 100_000,
            time: Duration::from_secs(30),
        }
    }
}

/// Options of the fusion pass.
#[derive(Clone, Debug, PartialEq)]
pub struct FusionOptions {
    /// Run fusion at all.
    pub enabled: bool,
    /// Rules not to run, by name.
    pub disabled_rules: Vec<String>,
    /// When set, run only these rules.
    pub only_rules: Option<Vec<String>>,
    /// User rules added to the built-in ones (see [`load_rules`]).
    pub extra_rules: Vec<Rule>,
    /// Saturation limits.
    pub limits: FusionLimits,
    /// The cost model's machine parameters.
    pub cost: CostModel,
    /// Keep only the first N fusion sites of the extracted graph, in canonical order (the
    /// order of [`FusionReport::sites`] without a limit); the ops of the other sites stay
    /// as the input had them. `Some(0)` gives the unfused graph (in canonical order),
    /// `None` or a limit at or above the number of sites gives the full fusion. For
    /// bisecting a fused model that computes something wrong (`smelt verify --bisect`).
    pub site_limit: Option<usize>,
    /// Run user rules ([`FusionOptions::extra_rules`]) that fail the numerical check
    /// ([`check_rule`]: unsound, or untested — no instance satisfied their types and
    /// guards). Off by default: the fusion pass refuses such a rule with
    /// [`PassError::UncheckedRule`] naming it and the check's finding; on, it runs them and
    /// adds a `rule-unchecked` warning per rule to [`PassContext::warnings`], so every
    /// report built from the context says so. For debugging a wrong rule
    /// (`smelt verify --bisect --allow-unchecked-rules`).
    pub allow_unchecked_rules: bool,
}

impl Default for FusionOptions {
    fn default() -> Self {
        FusionOptions {
            enabled: true,
            disabled_rules: Vec::new(),
            only_rules: None,
            extra_rules: Vec::new(),
            limits: FusionLimits::default(),
            cost: CostModel::default(),
            site_limit: None,
            allow_unchecked_rules: false,
        }
    }
}

impl FusionOptions {
    /// The rules to run: built-in plus extra, filtered by `only_rules` and
    /// `disabled_rules`. Naming a rule that does not exist is an error.
    pub fn rules(&self) -> Result<Vec<Rule>, PassError> {
        let mut all = builtin_rules();
        for r in &self.extra_rules {
            if all.iter().any(|b| b.name == r.name) {
                return Err(PassError::DuplicateRule(r.name.clone()));
            }
            all.push(r.clone());
        }
        let names: Vec<&String> = self
            .disabled_rules
            .iter()
            .chain(self.only_rules.iter().flatten())
            .collect();
        for n in names {
            if !all.iter().any(|r| &r.name == n) {
                return Err(PassError::UnknownRule(n.clone()));
            }
        }
        Ok(all
            .into_iter()
            .filter(|r| !self.disabled_rules.contains(&r.name))
            .filter(|r| {
                self.only_rules
                    .as_ref()
                    .is_none_or(|only| only.contains(&r.name))
            })
            .collect())
    }
}

/// The text of an op for reports: `conv2d`, or `fused conv2d post [add, relu]`.
pub fn op_summary(op: &Op) -> String {
    match op {
        Op::Fused(f) => {
            let posts: Vec<&str> = f
                .post_ops
                .iter()
                .map(|p| match p {
                    PostOp::Unary(u) => u.name(),
                    PostOp::Binary { op, .. } => op.name(),
                })
                .collect();
            format!("fused {} post [{}]", f.anchor.name(), posts.join(", "))
        }
        other => other.name().to_string(),
    }
}

/// Op counts of `func`, by mnemonic.
pub fn op_counts(func: &Func) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for inst in &func.insts {
        *m.entry(inst.op.name().to_string()).or_insert(0) += 1;
    }
    m
}

/// Fuses one function: saturate, extract, rebuild. Returns the new function and the
/// report; warnings (a limit was hit) go to `warnings`. User rules are taken as given:
/// the numerical check of [`check_user_rules`] is the pass's ([`FusionPass`]), not this
/// function's.
pub fn fuse_func(
    func: &Func,
    weights: &WeightStore,
    options: &FusionOptions,
    warnings: &mut Vec<Diagnostic>,
) -> Result<(Func, FusionReport), PassError> {
    without_calibration(|| fuse_with_egg(func, weights, options, warnings))
}

/// Runs `f` with egg's clock replaced by one that never advances. egg times its phases
/// with `quanta`, whose first use in a process calibrates the TSC against the OS clock
/// for 0.5–200 ms (≈ 7 ms on the reference VM: a third of a small CNN's compile, paid
/// by every process's first compile); smelt reads none of those timings, and enforces
/// the fusion time limit itself ([`TimeLimit`]).
pub(crate) fn without_calibration<T>(f: impl FnOnce() -> T) -> T {
    let (clock, _mock) = quanta::Clock::mock();
    quanta::with_clock(&clock, f)
}

/// The fusion time limit, checked by a runner hook before each iteration (where egg
/// checks its own) against the OS clock.
#[derive(Clone, Copy)]
struct TimeLimit {
    start: std::time::Instant,
    limit: Duration,
}

impl TimeLimit {
    /// The message of the hook's stop, which [`fuse_with_egg`] turns back into
    /// [`StopReason::TimeLimit`].
    const STOP: &'static str = "smelt fusion time limit";

    fn check(&self) -> Result<(), String> {
        match self.start.elapsed() > self.limit {
            true => Err(Self::STOP.to_string()),
            false => Ok(()),
        }
    }
}

/// Whether a rule built `node` (its provenance names one).
fn fused_by_rule(egraph: &FusionGraph, node: &TensorNode) -> bool {
    FusionAnalysis::provenance_ref(egraph, node).is_some_and(|p| !p.rules.is_empty())
}

fn fuse_with_egg(
    func: &Func,
    weights: &WeightStore,
    options: &FusionOptions,
    warnings: &mut Vec<Diagnostic>,
) -> Result<(Func, FusionReport), PassError> {
    let ops_before = op_counts(func);
    if !options.enabled {
        let report = FusionReport {
            func: func.name.clone(),
            stop_reason: StopReason::Disabled,
            iterations: 0,
            egraph_nodes: 0,
            egraph_classes: 0,
            rules: Vec::new(),
            sites: Vec::new(),
            withheld: Vec::new(),
            near_misses: Vec::new(),
            approximate: Vec::new(),
            lost: Vec::new(),
            cost_before: 0.0,
            cost_after: 0.0,
            ops_after: ops_before.clone(),
            ops_before,
        };
        return Ok((func.clone(), report));
    }
    let rules = options.rules()?;
    let Built {
        mut egraph,
        value_class,
        original,
    } = build(func, weights)?;

    let uses = func.uses();
    let context = Arc::new(GuardContext::new(
        value_class
            .iter()
            .enumerate()
            .map(|(v, id)| (*id, uses.get(v).map_or(0, |u| u.len())))
            .collect(),
        weights,
        value_labels(func, weights),
    ));
    context.annotate(&mut egraph);
    let rewrites = compile_rules(&rules, &mut egraph.analysis.attrs, &context).map_err(|m| {
        PassError::Internal {
            pass: "fusion",
            message: m,
        }
    })?;

    let roots: Vec<Id> = func
        .results
        .iter()
        .map(|r| value_class[r.value.index()])
        .collect();
    let time = TimeLimit {
        start: std::time::Instant::now(),
        limit: options.limits.time,
    };
    let runner = Runner::<TensorNode, FusionAnalysis>::new(FusionAnalysis::default())
        .with_egraph(egraph)
        .with_iter_limit(options.limits.iterations)
        .with_node_limit(options.limits.nodes)
        // egg's clock does not advance here (`without_calibration`): the hook checks
        .with_time_limit(Duration::MAX)
        .with_scheduler(SimpleScheduler)
        .with_hook(move |runner| {
            time.check()?;
            FusionAnalysis::recanonicalize(&mut runner.egraph);
            Ok(())
        })
        .run(&rewrites);
    let iterations = runner.iterations.len();
    let stop_reason = match runner.stop_reason {
        Some(egg::StopReason::Saturated) | None => StopReason::Saturated,
        Some(egg::StopReason::IterationLimit(n)) => StopReason::IterationLimit(n),
        Some(egg::StopReason::NodeLimit(n)) => StopReason::NodeLimit(n),
        Some(egg::StopReason::TimeLimit(s)) => StopReason::TimeLimit(s),
        Some(egg::StopReason::Other(m)) if m == TimeLimit::STOP => {
            StopReason::TimeLimit(time.start.elapsed().as_secs_f64())
        }
        Some(egg::StopReason::Other(m)) => StopReason::Other(m),
    };
    let mut egraph = runner.egraph;
    egraph.rebuild();
    FusionAnalysis::recanonicalize(&mut egraph);
    if stop_reason != StopReason::Saturated {
        warnings.push(Diagnostic::warning(
            "fusion-limit",
            format!(
                "fusion of @{} stopped at the {stop_reason}; the best graph found so far is used",
                func.name
            ),
            func.loc.clone(),
        ));
    }

    let table = CostTable::new(&egraph, &options.cost);
    let extraction =
        extract::extract(&egraph, &table, &roots, &original).map_err(|m| PassError::Internal {
            pass: "fusion",
            message: m,
        })?;

    let canon_roots: Vec<Id> = roots.iter().map(|r| egraph.find(*r)).collect();
    let cost_before = extraction.input_cost.unwrap_or(f64::NAN);

    let (out, sites, site_classes) = emit(func, &egraph, &extraction.chosen, &roots)?;

    // Explanations: sites, near misses, lost fusions.
    let site_of = |class: Id| -> Option<(String, Location)> {
        let class = egraph.find(class);
        value_class
            .iter()
            .enumerate()
            .skip(func.params.len())
            .find(|(_, id)| egraph.find(**id) == class)
            .and_then(|(v, _)| func.inst_of(Value(v as u32)))
            .map(|inst| (op_summary(&inst.op), inst.loc.clone()))
    };
    let mut fired: BTreeSet<(analysis::RuleName, Id)> = BTreeSet::new();
    for e in &egraph.analysis.events {
        if matches!(e.outcome, Outcome::Fired(_)) {
            fired.insert((e.rule.clone(), egraph.find(e.class)));
        }
    }
    let mut near: BTreeSet<NearMiss> = BTreeSet::new();
    let mut approximate: BTreeSet<ApproximateMatch> = BTreeSet::new();
    let mut lost: Vec<LostFusion> = Vec::new();
    let mut full_choice: extract::Choice = HashMap::new();
    for (class, node) in &extraction.chosen {
        if let Some(i) = table.nodes[class].iter().position(|(n, _)| n == node) {
            full_choice.insert(*class, i);
        }
    }
    let mut seen_lost: BTreeSet<(analysis::RuleName, Id, TensorNode)> = BTreeSet::new();
    for e in &egraph.analysis.events {
        let class = egraph.find(e.class);
        match &e.outcome {
            Outcome::Refused { guard, reason } => {
                // A near miss is an op left unfused: not one this rule fused elsewhere in
                // its class, nor one merged into (or rebuilt by) another rule's result.
                let unfused = extraction
                    .chosen
                    .get(&class)
                    .is_some_and(|n| !fused_by_rule(&egraph, n));
                // A user rule's refusal is reported even where a built-in rule fused the
                // op: its author is debugging that rule, not the built-in set.
                let user_rule = options.extra_rules.iter().any(|r| *r.name == *e.rule);
                if fired.contains(&(e.rule.clone(), class)) || !(unfused || user_rule) {
                    continue;
                }
                if let Some((op, location)) = site_of(class) {
                    near.insert(NearMiss {
                        rule: e.rule.to_string(),
                        op,
                        location,
                        guard: guard.clone(),
                        reason: reason.clone(),
                    });
                }
            }
            Outcome::Approximate { note } => {
                if !fired.contains(&(e.rule.clone(), class)) {
                    continue;
                }
                if let Some((op, location)) = site_of(class) {
                    approximate.insert(ApproximateMatch {
                        rule: e.rule.to_string(),
                        op,
                        location,
                        note: note.clone(),
                    });
                }
            }
            Outcome::Fired(node) => {
                let node = node.clone().map_children(|k| egraph.find(k));
                let Some(chosen) = extraction.chosen.get(&class) else {
                    continue;
                };
                // Only a loss to the unfused form is a loss; another rule's result winning
                // is fusion working.
                let chosen_by_rule = fused_by_rule(&egraph, chosen);
                if *chosen == node
                    || chosen_by_rule
                    || !seen_lost.insert((e.rule.clone(), class, node.clone()))
                {
                    continue;
                }
                let Some(i) = table.nodes[&class].iter().position(|(n, _)| *n == node) else {
                    continue;
                };
                let mut alt = full_choice.clone();
                alt.insert(class, i);
                // Children of the alternative not chosen so far take their cheapest tree.
                fill_missing(&table, &mut alt, &egraph, &node);
                let Some(fused_cost) = dag_cost(&table, &alt, &canon_roots) else {
                    continue;
                };
                if let Some((op, location)) = site_of(class) {
                    lost.push(LostFusion {
                        rule: e.rule.to_string(),
                        op,
                        location,
                        fused_cost,
                        chosen_cost: extraction.cost,
                    });
                }
            }
        }
    }

    // A site refused by a specific guard needs no "not an anchor" note from the other
    // operand order of the same rule.
    let specific: BTreeSet<(String, Location)> = near
        .iter()
        .filter(|n| n.guard != "anchor")
        .map(|n| (n.rule.clone(), n.location.clone()))
        .collect();
    near.retain(|n| {
        n.guard != "anchor" || !specific.contains(&(n.rule.clone(), n.location.clone()))
    });
    // One line per (rule, site): the cheapest graph the rule could have given.
    lost.sort_by(|a, b| {
        (&a.rule, &a.location)
            .cmp(&(&b.rule, &b.location))
            .then(a.fused_cost.total_cmp(&b.fused_cost))
    });
    lost.dedup_by(|later, first| later.rule == first.rule && later.location == first.location);
    // The site limit: withhold the sites after the first `limit` (in canonical order).
    let (out, sites, withheld, cost_after) = match options.site_limit {
        Some(limit) if limit < sites.len() => {
            let inputs = input_nodes(&egraph, func, &value_class, &original);
            let (chosen, forced) = withhold_sites(
                &egraph,
                &table,
                &extraction.chosen,
                &inputs,
                &canon_roots,
                &site_classes[limit..],
            );
            let stuck = site_classes[limit..]
                .iter()
                .filter(|c| !forced.contains(c))
                .count();
            if stuck > 0 {
                warnings.push(Diagnostic::warning(
                    "fusion-site-limit",
                    format!(
                        "{stuck} fusion site(s) of @{} past the limit {limit} cannot be undone \
                         (a rule merged values of the input) and stay fused",
                        func.name
                    ),
                    func.loc.clone(),
                ));
            }
            let cost = chosen_cost(&table, &chosen).ok_or_else(|| PassError::Internal {
                pass: "fusion",
                message: "a withheld site's input node has no cost".into(),
            })?;
            let (limited, limited_sites, _) = emit(func, &egraph, &chosen, &roots)?;
            let withheld = sites
                .iter()
                .zip(&site_classes)
                .filter(|(_, c)| forced.contains(c))
                .map(|(s, _)| s.clone())
                .collect();
            (limited, limited_sites, withheld, cost)
        }
        Some(_) | None => (out, sites, Vec::new(), extraction.cost),
    };
    let counts = &egraph.analysis.counts;
    let report = FusionReport {
        func: func.name.clone(),
        stop_reason,
        iterations,
        egraph_nodes: egraph.total_number_of_nodes(),
        egraph_classes: egraph.number_of_classes(),
        rules: rules
            .iter()
            .map(|r| {
                let c = counts.get(r.name.as_str()).copied().unwrap_or_default();
                RuleStat {
                    rule: r.name.clone(),
                    matches: c.matches,
                    applied: c.applied,
                    refused: c.refused,
                }
            })
            .collect(),
        sites,
        withheld,
        near_misses: near.into_iter().collect(),
        approximate: approximate.into_iter().collect(),
        lost,
        cost_before,
        cost_after,
        ops_before,
        ops_after: op_counts(&out),
    };
    Ok((out, report))
}

/// The numerical check of every user rule that will run ([`FusionOptions::extra_rules`],
/// after `only_rules`/`disabled_rules`): a rule that fails it is an error, or, with
/// [`FusionOptions::allow_unchecked_rules`], a warning. Verdicts are cached per rule text
/// for the process, so a rule file checked once costs nothing on the next compile; the
/// check is the sampling one with the in-process exact provers (tens of milliseconds per
/// rule), never a solver process.
pub fn check_user_rules(options: &FusionOptions) -> Result<Vec<Diagnostic>, PassError> {
    let running = options.rules()?;
    let mut warnings = Vec::new();
    for rule in &options.extra_rules {
        if !running.iter().any(|r| r.name == rule.name) {
            continue;
        }
        let check = cached_check(rule);
        if !check.verdict.fails() {
            continue;
        }
        if !options.allow_unchecked_rules {
            return Err(PassError::UncheckedRule {
                rule: rule.name.clone(),
                location: rule.location.clone(),
                finding: check.to_text(),
            });
        }
        warnings.push(Diagnostic::warning(
            "rule-unchecked",
            format!(
                "user rule '{}' failed the numerical check and runs only because unchecked \
                 rules are allowed: {}",
                rule.name,
                check.to_text()
            ),
            rule.location.clone(),
        ));
    }
    Ok(warnings)
}

/// [`check_rule`] with the default options, remembered per rule (its full text, location
/// included) for the life of the process; the cache is bounded (cleared when full).
fn cached_check(rule: &Rule) -> RuleCheck {
    use std::sync::{Mutex, OnceLock};
    const MAX_ENTRIES: usize = 4096;
    static CACHE: OnceLock<Mutex<HashMap<String, RuleCheck>>> = OnceLock::new();
    let key = format!("{rule:?}");
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    // A poisoned lock only means another thread panicked mid-insert; the map is intact.
    if let Some(hit) = cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .cloned()
    {
        return hit;
    }
    let check = check_rule(rule, &CheckOptions::default());
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    if map.len() >= MAX_ENTRIES {
        map.clear();
    }
    map.insert(key, check.clone());
    check
}

/// The fusion pass: [`check_user_rules`], then [`fuse_func`] on every function of the
/// module.
#[derive(Clone, Debug, Default)]
pub struct FusionPass {
    /// Its options.
    pub options: FusionOptions,
}

impl Pass for FusionPass {
    fn name(&self) -> &'static str {
        "fusion"
    }

    /// Its guards compare sizes for equality (which symbolic sizes answer for every value
    /// of their symbols) and its cost model takes each symbol at `SYMBOL_COST_SIZE`.
    fn takes_symbolic_sizes(&self) -> bool {
        true
    }

    fn run(&self, module: &mut Module, cx: &mut PassContext) -> Result<(), PassError> {
        if self.options.enabled {
            cx.warnings.extend(check_user_rules(&self.options)?);
        }
        let mut funcs = Vec::with_capacity(module.funcs.len());
        for f in &module.funcs {
            let (new, report) = fuse_func(f, &module.weights, &self.options, &mut cx.warnings)?;
            cx.fusion_reports.push(report);
            funcs.push(new);
        }
        module.funcs = funcs;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ir::builder::FuncBuilder;
    use smelt_ir::op::{BinaryOp, Conv2dAttrs, UnaryOp};

    /// A 3x3 conv (expensive) whose result feeds a relu and a residual add.
    fn shared_conv_module() -> Module {
        let mut m = Module::default();
        let mut b = FuncBuilder::new(&mut m, "shared");
        let x = b.param("x", TensorType::f32([1, 32, 16, 16]));
        let skip = b.param("skip", TensorType::f32([1, 32, 16, 16]));
        let n = 32 * 32 * 9;
        let w = b
            .constant(
                "w",
                TensorType::f32([32, 32, 3, 3]),
                &smelt_ir::weights::random_f32(1, n, -0.1, 0.1),
            )
            .unwrap();
        let conv = Op::Conv2d(Conv2dAttrs {
            pads: [1, 1, 1, 1],
            ..Conv2dAttrs::default()
        });
        let c = b.op(conv, &[x, w]).unwrap();
        let r = b.op(Op::Unary(UnaryOp::Relu), &[c]).unwrap();
        let s = b.op(Op::Binary(BinaryOp::Add), &[c, skip]).unwrap();
        b.finish(&[("r", r), ("s", s)]);
        m
    }

    /// egg's tree-cost extractor counts the shared conv once per consumer, so it picks
    /// the two fused ops (each recomputing the conv); the DAG-aware extractor keeps one.
    #[test]
    fn tree_cost_extraction_duplicates_the_shared_conv_and_ours_does_not() {
        struct TreeCost<'a>(&'a CostTable);
        impl egg::CostFunction<TensorNode> for TreeCost<'_> {
            type Cost = f64;
            fn cost<C: FnMut(Id) -> f64>(&mut self, enode: &TensorNode, mut costs: C) -> f64 {
                let own = self
                    .0
                    .nodes
                    .values()
                    .flatten()
                    .find(|(n, _)| n == enode)
                    .map_or(f64::INFINITY, |(_, c)| *c);
                enode.children().iter().map(|c| costs(*c)).sum::<f64>() + own
            }
        }
        let m = shared_conv_module();
        let func = &m.funcs[0];
        let Built {
            mut egraph,
            value_class,
            original,
        } = build(func, &m.weights).unwrap();
        let context = Arc::new(GuardContext::default());
        let rules = builtin_rules();
        let rewrites = compile_rules(&rules, &mut egraph.analysis.attrs, &context).unwrap();
        let runner = Runner::<TensorNode, FusionAnalysis>::new(FusionAnalysis::default())
            .with_egraph(egraph)
            .with_scheduler(SimpleScheduler)
            .run(&rewrites);
        let egraph = runner.egraph;
        let model = CostModel::default();
        let table = CostTable::new(&egraph, &model);
        let roots: Vec<Id> = func
            .results
            .iter()
            .map(|r| egraph.find(value_class[r.value.index()]))
            .collect();
        let ours = extract::extract(&egraph, &table, &roots, &original).unwrap();

        let tree = egg::Extractor::new(&egraph, TreeCost(&table));
        let mut choice: extract::Choice = HashMap::new();
        for class in &table.classes {
            let best = tree.find_best_node(*class).clone();
            if let Some(i) = table.nodes[class].iter().position(|(n, _)| *n == best) {
                choice.insert(*class, i);
            }
        }
        let tree_dag = dag_cost(&table, &choice, &roots).unwrap();
        let fused_roots = roots
            .iter()
            .filter(|r| table.nodes[r][choice[r]].0.kind() == Some(OpKind::Fused))
            .count();
        assert_eq!(fused_roots, 2, "tree cost fuses into both consumers");
        assert!(
            ours.cost < tree_dag,
            "DAG-aware {} must beat tree-cost {}",
            ours.cost,
            tree_dag
        );
        let anchors = ours
            .chosen
            .values()
            .filter(|n| matches!(n.kind(), Some(OpKind::Conv2d) | Some(OpKind::Fused)))
            .count();
        assert_eq!(anchors, 1, "the conv is computed once");
    }

    fn fuse_text(text: &str, options: &FusionOptions) -> (Func, FusionReport) {
        let m = smelt_ir::text::parse(text, "t.tir").expect("parses");
        let mut warnings = Vec::new();
        fuse_func(&m.funcs[0], &m.weights, options, &mut warnings).expect("fuses")
    }

    /// `scalar` used to read only constants of at most 16 elements.
    #[test]
    fn the_scalar_guard_sees_splat_constants_of_any_size() {
        let model = |hi: &str| {
            format!(
                "const @lo : tensor<4097xf32> = dense<0.0>\n\
                 const @hi : tensor<4097xf32> = {hi}\n\
                 func @f(%x: tensor<2x4097xf32>) -> (y: tensor<2x4097xf32>) {{\n  \
                   %l = const @lo : tensor<4097xf32>\n  \
                   %h = const @hi : tensor<4097xf32>\n  \
                   %a = max %x, %l : tensor<2x4097xf32>\n  \
                   %b = min %a, %h : tensor<2x4097xf32>\n  \
                   return %b : tensor<2x4097xf32>\n}}\n"
            )
        };
        let (f, _) = fuse_text(&model("dense<6.0>"), &FusionOptions::default());
        assert!(
            f.insts.iter().any(
                |i| matches!(i.op, Op::Unary(smelt_ir::op::UnaryOp::Clip { .. }))
                    || matches!(&i.op, Op::Fused(_))
            ),
            "{:?}",
            f.insts.iter().map(|i| i.op.name()).collect::<Vec<_>>()
        );
        // not all equal: refused, and the reason says so
        let (_, report) = fuse_text(
            &model("random<seed = 1, min = 5.0, max = 7.0>"),
            &FusionOptions::default(),
        );
        let reasons: Vec<&str> = report
            .near_misses
            .iter()
            .map(|n| n.reason.as_str())
            .collect();
        assert!(
            reasons.iter().any(|r| r.contains("not all equal")),
            "{reasons:?}"
        );
    }

    /// relu(v) = v holds for v > 0: declared `positive`, the rule fires on a constant
    /// whose every element is > 0, and elsewhere is a near miss of guard `positive` that
    /// says why (an element not > 0, a value that is no constant).
    #[test]
    fn a_positive_variable_fires_only_on_a_positive_constant() {
        let rules = load_rules(
            "rule drop-relu\n  var ?v: positive tensor\n  lhs (relu ?v)\n  rhs ?v\n",
            "u.rules",
        )
        .unwrap();
        let options = FusionOptions {
            extra_rules: rules,
            ..FusionOptions::default()
        };
        let model = |data: &str| {
            format!(
                "const @v : tensor<8xf32> = {data}\n\
                 func @f(%x: tensor<8xf32>) -> (y: tensor<8xf32>, z: tensor<8xf32>) {{\n  \
                   %c = const @v : tensor<8xf32>\n  \
                   %r = relu %c : tensor<8xf32>\n  \
                   %s = relu %x : tensor<8xf32>\n  \
                   return %r, %s : tensor<8xf32>, tensor<8xf32>\n}}\n"
            )
        };
        let applied = |r: &FusionReport| {
            r.rules
                .iter()
                .find(|s| s.rule == "drop-relu")
                .map_or(0, |s| s.applied)
        };
        let reasons = |r: &FusionReport| -> Vec<String> {
            r.near_misses
                .iter()
                .filter(|n| n.rule == "drop-relu" && n.guard == "positive")
                .map(|n| n.reason.clone())
                .collect()
        };
        let (f, report) = fuse_text(&model("random<seed = 3, min = 0.5, max = 2.0>"), &options);
        assert_eq!(applied(&report), 1, "{:?}", report.rules);
        // one relu is left: the one of the parameter, which is no constant
        let relus = f
            .insts
            .iter()
            .filter(|i| matches!(i.op, Op::Unary(UnaryOp::Relu)))
            .count();
        assert_eq!(relus, 1);
        let why = reasons(&report);
        assert!(
            why.len() == 1 && why[0].contains("not a constant"),
            "{why:?}"
        );
        // a constant with a negative element: refused, the reason says so
        let (_, report) = fuse_text(&model("random<seed = 3, min = -1.0, max = 2.0>"), &options);
        assert_eq!(applied(&report), 0, "{:?}", report.rules);
        assert!(
            reasons(&report)
                .iter()
                .any(|r| r.contains("an element that is not > 0")),
            "{:?}",
            report.near_misses
        );
    }

    /// A user rule's refusal is a near miss even where a built-in rule fused the op.
    #[test]
    fn a_user_rules_refusal_is_reported_where_a_builtin_rule_fused() {
        let model = include_str!("../../../tests/cases/rule_check/hard_swish_block.tir");
        let rules = load_rules(
            "rule my-hard-swish\n  \
               lhs (mul ?x (hard_sigmoid[alpha=0.16666667, beta=0.5] ?x))\n  \
               rhs (hard_swish ?x)\n  \
               guard single-consumer ?x\n",
            "u.rules",
        )
        .unwrap();
        let options = FusionOptions {
            extra_rules: rules,
            ..FusionOptions::default()
        };
        let (_, report) = fuse_text(model, &options);
        assert!(
            report
                .near_misses
                .iter()
                .any(|n| n.rule == "my-hard-swish" && n.guard == "single-consumer"),
            "{:?}",
            report.near_misses
        );
    }

    /// A written-out float attribute: within the tolerance it fuses and the report says
    /// so; in the near-miss band it is refused by `attributes` with both values; farther
    /// off it is another op's attributes, neither a match nor a near miss.
    #[test]
    fn written_out_float_attributes_match_within_the_tolerance() {
        let base = include_str!("../../../tests/cases/rule_check/hard_swish_block.tir");
        let rules = load_rules(
            "rule hs\n  \
               lhs (mul ?x (hard_sigmoid[alpha=0.1666667, beta=0.5] ?x))\n  \
               rhs (hard_swish ?x)\n",
            "u.rules",
        )
        .unwrap();
        // the built-in rule of the same law would make this one's rewrites no-ops
        let options = FusionOptions {
            extra_rules: rules,
            disabled_rules: vec!["recognize-hard-swish".into()],
            ..FusionOptions::default()
        };
        assert!(base.contains("alpha = 0.16666667"));
        let run = |alpha: &str| {
            let model = base.replace("alpha = 0.16666667", &format!("alpha = {alpha}"));
            fuse_text(&model, &options).1
        };
        let stat = |r: &FusionReport| r.rules.iter().find(|s| s.rule == "hs").cloned().unwrap();
        for (alpha, fires, near) in [
            ("0.1666667", true, false),
            ("0.16666667", true, false),
            ("0.1666669", false, true),
            ("0.2", false, false),
        ] {
            let report = run(alpha);
            let s = stat(&report);
            assert_eq!(s.applied > 0, fires, "alpha {alpha}: {s:?}");
            let approx: Vec<&str> = report.approximate.iter().map(|a| a.note.as_str()).collect();
            // the exact literal is no approximation
            assert_eq!(
                !approx.is_empty(),
                fires && alpha != "0.1666667",
                "alpha {alpha}: {approx:?}"
            );
            let refused = report
                .near_misses
                .iter()
                .filter(|n| n.rule == "hs" && n.guard == "attributes")
                .count();
            assert_eq!(refused > 0, near, "alpha {alpha}: {:?}", report.near_misses);
            // a different constant is not counted as a match at all
            assert_eq!(s.matches > 0, fires || near, "alpha {alpha}: {s:?}");
        }
    }

    /// An unsound user rule is an error where it loads, or a warning when allowed.
    #[test]
    fn unsound_and_untested_user_rules_are_refused_unless_allowed() {
        for text in [
            "rule wrong\n  lhs (relu (add ?x ?y))\n  rhs (add (relu ?x) (relu ?y))\n",
            "rule never\n  lhs (add ?three ?x)\n  rhs (add ?x ?three)\n  guard scalar ?three 3\n",
        ] {
            let rules = load_rules(text, "u.rules").unwrap();
            let name = rules[0].name.clone();
            let mut options = FusionOptions {
                extra_rules: rules,
                ..FusionOptions::default()
            };
            match check_user_rules(&options) {
                Err(PassError::UncheckedRule { rule, finding, .. }) => {
                    assert_eq!(rule, name);
                    assert!(finding.contains(&name), "{finding}");
                }
                other => panic!("{name}: {other:?}"),
            }
            options.allow_unchecked_rules = true;
            let warnings = check_user_rules(&options).unwrap();
            assert_eq!(warnings.len(), 1);
            assert_eq!(warnings[0].code, "rule-unchecked");
            // a disabled rule is not checked
            options.allow_unchecked_rules = false;
            options.disabled_rules = vec![name];
            assert!(check_user_rules(&options).unwrap().is_empty());
        }
        let sound =
            load_rules("rule fine\n  lhs (relu (relu ?x))\n  rhs (relu ?x)\n", "u").unwrap();
        let options = FusionOptions {
            extra_rules: sound,
            ..FusionOptions::default()
        };
        assert!(check_user_rules(&options).unwrap().is_empty());
    }

    #[test]
    fn options_name_only_existing_rules() {
        let opts = FusionOptions {
            disabled_rules: vec!["no-such-rule".into()],
            ..FusionOptions::default()
        };
        assert!(matches!(opts.rules(), Err(PassError::UnknownRule(r)) if r == "no-such-rule"));
        let opts = FusionOptions {
            only_rules: Some(vec!["absorb-relu".into()]),
            ..FusionOptions::default()
        };
        let names: Vec<String> = opts.rules().unwrap().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["absorb-relu"]);
    }

    #[test]
    fn iteration_limit_is_reported_as_a_warning() {
        let m = shared_conv_module();
        let opts = FusionOptions {
            limits: FusionLimits {
                iterations: 1,
                ..FusionLimits::default()
            },
            ..FusionOptions::default()
        };
        let mut warnings = Vec::new();
        let (_, report) = fuse_func(&m.funcs[0], &m.weights, &opts, &mut warnings).unwrap();
        assert_eq!(report.stop_reason, StopReason::IterationLimit(1));
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].code, "fusion-limit");
    }

    /// The time limit holds with egg's clock stopped (`without_calibration`): the hook
    /// reads the OS clock, and the stop is reported as the time limit, not as a hook's.
    #[test]
    fn time_limit_is_enforced_and_reported() {
        let m = shared_conv_module();
        let opts = FusionOptions {
            limits: FusionLimits {
                time: Duration::ZERO,
                ..FusionLimits::default()
            },
            ..FusionOptions::default()
        };
        let mut warnings = Vec::new();
        let (_, report) = fuse_func(&m.funcs[0], &m.weights, &opts, &mut warnings).unwrap();
        assert!(
            matches!(report.stop_reason, StopReason::TimeLimit(s) if s >= 0.0),
            "{:?}",
            report.stop_reason
        );
        // the stopped iteration is recorded, with nothing searched or applied
        assert!(report.iterations <= 1, "{}", report.iterations);
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].message.contains("time limit"),
            "{}",
            warnings[0].message
        );
    }
}
