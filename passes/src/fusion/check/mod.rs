//! The numerical rule checker: is a rule's left-hand side equal to its right-hand side?
//!
//! For each rule and each of its left-hand sides, the checker builds small random
//! instances: shapes follow from where each variable sits (a conv's input is `[N,C,H,W]`,
//! its weight `[O,C/g,KH,KW]`, the other operand of an `add` has the sibling's shape, one
//! value per channel or a scalar, ...), attributes are sampled per op kind (padded and
//! unpadded convs, groups, epsilons), guarded constants become weights (BN variances
//! positive, `scalar` constants their value), and an `apply absorb ?y` target becomes an
//! anchor op. Each instance goes through the real machinery — e-graph, guards, applier —
//! for one iteration; every node the rule adds at the instance's root is then rebuilt as a
//! function and both sides run in the reference interpreter on random inputs. An instance
//! whose guards refuse is not counted. A rule whose relative error (FACTS.md) exceeds the
//! tolerance on any instance is unsound.
//!
//! Inputs are drawn over [`Stratum`]s, not one range: a rule that holds only near zero
//! (hard-swish written without its clip holds on [-3, 3]) must meet magnitudes where it
//! breaks. Each left-hand side's instances cycle through the strata — unit, tiny (±1e-3),
//! wide (±20), large (±[`CheckOptions::large`]), small integers (exact zeros, ±3, ±6),
//! the break points of the rule (0, ±1, ±3, ±6, its guards' values, clip bounds,
//! hard-sigmoid corners) and values just either side of them, all positive, all negative —
//! variables and unguarded constants alike. Elements where both sides give the same
//! infinity, or both NaN, agree; an infinity or NaN on one side only is a difference.
//! An instance where both sides are NaN or infinite on every element compared no number:
//! it is discarded like a guard's refusal, so a rule with nothing else is untested.
//! Everything is seeded: the same options give the same verdicts.
//!
//! A left-hand side with no instance that satisfies its types and guards makes the rule
//! [`Verdict::Untested`], with the reason (what refused, how often). A right-hand side
//! that contains the matched value itself (`relu(x) → relu(relu(x))`) cannot be extracted
//! without a cycle; it is evaluated directly instead, and a rule that holds is
//! [`Verdict::Cyclic`], not unsound.

mod compare;
mod instance;

use compare::*;
use instance::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use egg::{Id, Language, Runner, SimpleScheduler};
use smelt_ir::graph::{Func, FuncResult, Inst, Module, Param, Value};
use smelt_ir::op::{Conv2dAttrs, GemmAttrs, Op, Pool2dAttrs};
use smelt_ir::types::{TensorType, F32};
use smelt_ir::weights::{random_f32, AlignedBuf, WeightOrigin};
use smelt_ir::{interp, Diagnostic, Location, Tensor};

use super::analysis::{FusionAnalysis, Outcome};
use super::apply::{compile_rules, GuardContext};
use super::extract::CostTable;
use super::lang::{join_op, Attrs, OpKind, TensorNode};
use super::polynomial::{exact_check, ExactCheck};
use super::prove::{prove_rule, Proof};
use super::rules::{AttrSpec, GuardArg, GuardKind, PatternExpr, Rule, RuleAction};
use super::smt::{prove_with_solver, SmtOptions};
use super::{build, choose_with_forced, emit, input_nodes, Built, CostModel};

/// How hard to try, and what counts as unsound.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CheckOptions {
    /// Seed of every random choice (the check is deterministic for a seed).
    pub seed: u64,
    /// Instances to compare per left-hand side.
    pub instances: usize,
    /// Attempts per left-hand side before giving up (an attempt fails when the sampled
    /// instance is ill-typed or its guards refuse).
    pub attempts: usize,
    /// Largest relative error (FACTS.md) of a sound rule.
    pub tolerance: f64,
    /// The magnitude of the `large` stratum: values uniform in [-large, large]; also the
    /// box of the solver's `proved within tol` query.
    pub large: f64,
    /// Prove rules with the SMT solver ([`super::smt`]), each query within this many
    /// milliseconds; `None` (the default, and the check where user rules load): never
    /// start a solver process.
    pub solver_timeout_ms: Option<u32>,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            seed: 0x5eed,
            instances: 16,
            attempts: 400,
            tolerance: 1e-4,
            large: 1e3,
            solver_timeout_ms: None,
        }
    }
}

/// The checker's conclusion about one rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every instance agreed within the tolerance.
    Sound,
    /// Some instance differed (or the right-hand side could not be evaluated).
    Unsound,
    /// No instance satisfying the guards was found for some left-hand side.
    Untested,
    /// Both sides agree, but the right-hand side contains the matched value itself
    /// (`relu(x) → relu(relu(x))`): the rule is true, and it makes the e-graph cyclic, so
    /// extraction can never pick its result. Harmless, and useless.
    Cyclic,
}

impl Verdict {
    /// Whether a rule with this verdict is refused where user rules load (unless the
    /// caller allows unchecked rules): unsound or untested.
    pub fn fails(&self) -> bool {
        matches!(self, Verdict::Unsound | Verdict::Untested)
    }

    /// The word `check-rules` prints.
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Sound => "ok",
            Verdict::Unsound => "UNSOUND",
            Verdict::Untested => "UNTESTED",
            Verdict::Cyclic => "cyclic",
        }
    }
}

/// A range or distribution the checker draws values from (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stratum {
    /// Uniform in [-1, 1].
    Unit,
    /// Uniform in [-1e-3, 1e-3].
    Tiny,
    /// Uniform in [-20, 20]: past every activation's knee (hard-sigmoid's ±3, relu6's 6).
    Wide,
    /// Uniform in [-large, large] ([`CheckOptions::large`]).
    Large,
    /// Integers in [-8, 8]: exact zeros and the exact break points.
    Integers,
    /// The rule's break points, exactly and just either side of them.
    BreakPoints,
    /// Uniform in [0.01, 20].
    Positive,
    /// Uniform in [-20, -0.01].
    Negative,
}

impl Stratum {
    /// Every stratum, in the order instances cycle through them.
    pub const ALL: [Stratum; 8] = [
        Stratum::Unit,
        Stratum::Wide,
        Stratum::BreakPoints,
        Stratum::Large,
        Stratum::Integers,
        Stratum::Tiny,
        Stratum::Positive,
        Stratum::Negative,
    ];

    /// The stratum in words, e.g. `wide ±20`.
    pub fn describe(self, options: &CheckOptions) -> String {
        match self {
            Stratum::Unit => "unit ±1".into(),
            Stratum::Tiny => "tiny ±1e-3".into(),
            Stratum::Wide => "wide ±20".into(),
            Stratum::Large => format!("large ±{:e}", options.large),
            Stratum::Integers => "integers -8..8".into(),
            Stratum::BreakPoints => "break points".into(),
            Stratum::Positive => "positive 0.01..20".into(),
            Stratum::Negative => "negative -20..-0.01".into(),
        }
    }

    /// `len` values of this stratum; `breaks` are the rule's break points.
    fn fill(self, seed: u64, len: usize, large: f64, breaks: &[f64]) -> Vec<f32> {
        let mut rng = Rng(seed ^ 0xd1b5_4a32_d192_ed03);
        let mut uniform = |lo: f64, hi: f64| lo + (hi - lo) * rng.unit();
        (0..len)
            .map(|_| match self {
                Stratum::Unit => uniform(-1.0, 1.0),
                Stratum::Tiny => uniform(-1e-3, 1e-3),
                Stratum::Wide => uniform(-20.0, 20.0),
                Stratum::Large => uniform(-large, large),
                Stratum::Integers => uniform(-8.0, 9.0).floor().min(8.0),
                Stratum::Positive => uniform(0.01, 20.0),
                Stratum::Negative => uniform(-20.0, -0.01),
                Stratum::BreakPoints => {
                    let b =
                        breaks[(uniform(0.0, breaks.len() as f64) as usize).min(breaks.len() - 1)];
                    let eps = 1e-3 * b.abs().max(1.0);
                    match (uniform(0.0, 4.0)) as u32 {
                        0 => b,
                        1 => b + eps,
                        2 => b - eps,
                        _ => b + uniform(-0.5, 0.5),
                    }
                }
            } as f32)
            .collect()
    }
}

/// The break points of the piecewise ops a rule may meet: 0, ±1, ±3 and ±6 (relu,
/// hard-sigmoid and hard-swish, relu6), and the rule's own numbers — its `scalar` guards'
/// values, the bounds of its spelled-out `clip`s, the corners of its `hard_sigmoid`s.
fn break_points(rule: &Rule) -> Vec<f64> {
    let mut out = vec![0.0, 1.0, 3.0, 6.0];
    for g in &rule.guards {
        if g.kind == GuardKind::Scalar {
            if let Some(GuardArg::Number(n)) =
                g.args.iter().find(|a| matches!(a, GuardArg::Number(_)))
            {
                out.push(*n);
            }
        }
    }
    fn walk(p: &PatternExpr, out: &mut Vec<f64>) {
        if let PatternExpr::Op {
            attrs, children, ..
        } = p
        {
            match attrs {
                AttrSpec::Literal(Attrs::Clip { min, max }) => {
                    out.extend([min.0 as f64, max.0 as f64]);
                }
                AttrSpec::Literal(Attrs::HardSigmoid { alpha, beta }) if alpha.0 != 0.0 => {
                    let (a, b) = (alpha.0 as f64, beta.0 as f64);
                    out.extend([-b / a, (1.0 - b) / a]);
                }
                _ => {}
            }
            for c in children {
                walk(c, out);
            }
        }
    }
    for lhs in &rule.lhs {
        walk(lhs, &mut out);
    }
    if let RuleAction::Rewrite(rhs) = &rule.action {
        walk(rhs, &mut out);
    }
    let mut all: Vec<f64> = out
        .iter()
        .flat_map(|x| [*x, -*x])
        .filter(|x| x.is_finite())
        .collect();
    all.sort_by(f64::total_cmp);
    all.dedup_by(|a, b| a == b);
    all
}

/// What the checker found for one rule.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleCheck {
    /// The rule.
    pub rule: String,
    /// The conclusion.
    pub verdict: Verdict,
    /// Instances compared (over all left-hand sides).
    pub instances: usize,
    /// Largest max-abs error over the instances.
    pub max_abs: f64,
    /// Largest relative error over the instances.
    pub relative: f64,
    /// The worst instance in words (or why none was found, or the evaluation error).
    pub detail: String,
    /// The exact proof attempt over the reals ([`super::prove`], [`super::smt`]).
    pub proof: Proof,
    /// The sampling ranges, in words (what a `sampled` verdict rests on).
    pub ranges: String,
}

impl RuleCheck {
    /// What `check-rules` calls the rule: `proved`, `proved within tol`, `by definition`,
    /// `sampled` (sound on every sample, no proof), `refuted`, `UNTESTED` or `cyclic`.
    pub fn status(&self) -> &'static str {
        match (&self.verdict, &self.proof) {
            (Verdict::Unsound, _) => "refuted",
            (Verdict::Untested, _) => "UNTESTED",
            (Verdict::Cyclic, _) => "cyclic",
            (
                Verdict::Sound,
                Proof::Proved | Proof::ProvedAtPoints { .. } | Proof::CommutesWithMovement,
            ) => "proved",
            (Verdict::Sound, Proof::ProvedWithin { .. }) => "proved within tol",
            (Verdict::Sound, Proof::ByDefinition) => "by definition",
            (Verdict::Sound, Proof::Differs { .. } | Proof::NotAttempted(_)) => "sampled",
        }
    }

    /// One line: status, rule, instances, errors, detail.
    pub fn to_text(&self) -> String {
        let status = self.status();
        // errors of zero over no instance would read as a perfect score
        let mut line = if self.instances == 0 {
            format!("{status:<8} {}: no instance compared", self.rule)
        } else {
            format!(
                "{status:<8} {}: {} instances, max abs error {:.3e}, relative {:.3e}",
                self.rule, self.instances, self.max_abs, self.relative
            )
        };
        if !self.detail.is_empty() {
            line.push_str(&format!(" ({})", self.detail));
        }
        match (&self.verdict, &self.proof) {
            (Verdict::Sound | Verdict::Cyclic, Proof::Proved) => {
                line.push_str("; an identity over the reals, f32 rounding as sampled")
            }
            (
                Verdict::Sound | Verdict::Cyclic,
                Proof::ProvedAtPoints {
                    points,
                    shapes,
                    sqrt_uninterpreted,
                },
            ) => {
                line.push_str(&format!(
                    "; both sides equal in exact rational arithmetic at {points} random points \
                     (Schwartz-Zippel: a false polynomial law would differ at almost every \
                     point){shapes}"
                ));
                if *sqrt_uninterpreted {
                    line.push_str(
                        "; sqrt uninterpreted (a random function of its exact argument, the \
                         same on both sides), so the law holds for every function in its place",
                    );
                }
            }
            (Verdict::Unsound, Proof::Proved) => {
                line.push_str("; an identity over the reals: the difference is f32 rounding")
            }
            (Verdict::Sound | Verdict::Cyclic, Proof::ProvedWithin { tolerance, bound }) => {
                let over = if bound.is_finite() {
                    format!("every variable in [-{bound:e}, {bound:e}]")
                } else {
                    "all real inputs".to_string()
                };
                line.push_str(&format!(
                    "; not an identity, but |lhs - rhs| <= {tolerance:.0e} * max(1, |lhs|, |rhs|) \
                     for {over} (an f32 value stands for an exact one)"
                ))
            }
            (Verdict::Sound | Verdict::Cyclic, Proof::ByDefinition) => line.push_str(
                "; an absorb rule: the fused op is defined as the anchor followed by its post-ops",
            ),
            (Verdict::Sound | Verdict::Cyclic, Proof::CommutesWithMovement) => line.push_str(
                "; an elementwise op commutes with data movement: each element of a \
                 transpose's or reshape's result is one element of its operand",
            ),
            (Verdict::Sound | Verdict::Cyclic, Proof::Differs { witness, relative }) => line
                .push_str(&format!(
                    "; sampled over {}: not an identity over the reals (at {witness}, \
                     relative {relative:.1e}, within the tolerance)",
                    self.ranges
                )),
            (Verdict::Sound | Verdict::Cyclic, Proof::NotAttempted(why)) => {
                line.push_str(&format!("; sampled over {}", self.ranges));
                if !why.is_empty() {
                    line.push_str(&format!(": {why}"));
                }
            }
            _ => {}
        }
        line
    }
}

/// Checks every rule numerically (see the module docs).
pub fn check_rules(rules: &[Rule], options: &CheckOptions) -> Vec<RuleCheck> {
    rules.iter().map(|r| check_rule(r, options)).collect()
}

/// Checks one rule: sampled (see the module docs), and proved exactly over the reals
/// where the rule is in the prover's fragment ([`super::prove`]). An exact difference
/// beyond the tolerance refutes a rule the samples missed.
pub fn check_rule(rule: &Rule, options: &CheckOptions) -> RuleCheck {
    let mut out = sample_rule(rule, options);
    out.ranges = Stratum::ALL
        .iter()
        .map(|s| s.describe(options))
        .collect::<Vec<_>>()
        .join(", ");
    let at_points = std::mem::replace(&mut out.proof, prove_rule(rule));
    if let Proof::NotAttempted(why) = &out.proof {
        // the exact one-variable prover declined: polynomial laws by exact evaluation
        // (done beside the sampling), then the solver when the caller allows one
        let mut proof = at_points;
        if let (Proof::NotAttempted(_), Some(timeout_ms)) = (&proof, options.solver_timeout_ms) {
            proof = prove_with_solver(
                rule,
                &SmtOptions {
                    timeout_ms,
                    bound: options.large,
                    tolerance: options.tolerance,
                },
            );
        }
        out.proof = match proof {
            Proof::NotAttempted(second) if options.solver_timeout_ms.is_none() => {
                Proof::NotAttempted(format!("{why}; {second}"))
            }
            other => other,
        };
    }
    if let (Proof::Differs { relative, .. }, Some(timeout_ms)) =
        (&out.proof, options.solver_timeout_ms)
    {
        // not an identity, but maybe within the tolerance everywhere in the box: only the
        // solver can say (the one-variable prover compares at a few points)
        if *relative <= options.tolerance {
            let within = prove_with_solver(
                rule,
                &SmtOptions {
                    timeout_ms,
                    bound: options.large,
                    tolerance: options.tolerance,
                },
            );
            if matches!(within, Proof::ProvedWithin { .. } | Proof::Differs { .. }) {
                out.proof = within;
            }
        }
    }
    if let (Verdict::Sound, Proof::Differs { witness, relative }) = (&out.verdict, &out.proof) {
        if relative.is_nan() || *relative > options.tolerance {
            out.verdict = Verdict::Unsound;
            out.detail = format!(
                "refuted exactly over the reals, where the samples missed it: at {witness}; \
                 relative error {relative:.3e} > {:.1e}",
                options.tolerance
            );
        }
    }
    out
}

/// The sampling check of one rule.
fn sample_rule(rule: &Rule, options: &CheckOptions) -> RuleCheck {
    let mut out = RuleCheck {
        rule: rule.name.clone(),
        verdict: Verdict::Sound,
        instances: 0,
        max_abs: 0.0,
        relative: 0.0,
        detail: String::new(),
        proof: Proof::NotAttempted(String::new()),
        ranges: String::new(),
    };
    let breaks = break_points(rule);
    let mut worst = -1.0f64;
    let mut cyclic = false;
    let mut exact_tally = ExactTally::default();
    for (alt, lhs) in rule.lhs.iter().enumerate() {
        let mut found = 0;
        let mut misses = Misses::default();
        for attempt in 0..options.attempts {
            if found >= options.instances {
                break;
            }
            let seed = options
                .seed
                .wrapping_add((alt as u64) << 32)
                .wrapping_add(attempt as u64 * 0x9e37_79b9);
            // The next stratum in turn: a refused attempt retries the same one, so every
            // stratum is met whenever the rule can be instantiated at all.
            let stratum = Stratum::ALL[found % Stratum::ALL.len()];
            let draw = Draw {
                stratum,
                large: options.large,
                breaks: &breaks,
            };
            let Some(instance) = Instance::sample(rule, lhs, seed) else {
                misses.ill_typed += 1;
                continue;
            };
            let where_ = || {
                let what = instance.describe();
                let on = stratum.describe(options);
                if what.is_empty() {
                    format!("{on} inputs")
                } else {
                    format!("{on} inputs, {what}")
                }
            };
            match compare(rule, &instance, seed, &draw) {
                Comparison::NotApplicable(why) => misses.count(why),
                Comparison::Failed(message) => {
                    out.verdict = Verdict::Unsound;
                    out.detail = format!("{}: {message}", where_());
                    out.instances += 1;
                    return out;
                }
                Comparison::Compared {
                    diff,
                    cyclic: c,
                    example,
                    exact,
                    features,
                } => {
                    exact_tally.add(exact, &features);
                    found += 1;
                    cyclic |= c;
                    out.instances += 1;
                    out.max_abs = out.max_abs.max(diff.max_abs);
                    if diff.relative > worst {
                        worst = diff.relative;
                        out.relative = diff.relative;
                        out.detail = format!("worst on {}", where_());
                    }
                    if diff.relative.is_nan() || diff.relative > options.tolerance {
                        out.verdict = Verdict::Unsound;
                        out.detail = format!(
                            "refuted on {}: {example}; relative error {:.3e} > {:.1e}",
                            where_(),
                            diff.relative,
                            options.tolerance
                        );
                        return out;
                    }
                }
            }
        }
        if found == 0 {
            out.verdict = Verdict::Untested;
            out.detail = format!(
                "no instance of left-hand side {} satisfied the types and guards in {} attempts: {}",
                alt + 1,
                options.attempts,
                misses.explain(rule, lhs)
            );
            return out;
        }
    }
    out.proof = exact_tally.proof();
    if cyclic {
        out.verdict = Verdict::Cyclic;
        out.detail = format!(
            "true on every instance, but the right-hand side contains the matched value \
             itself, so the e-graph gets a cycle and extraction never uses it; {}",
            out.detail
        );
    }
    out
}

/// The exact evaluations of a rule's instances ([`super::polynomial`]).
#[derive(Default)]
struct ExactTally {
    /// Instances whose sides agreed exactly.
    agreed: usize,
    /// The first difference found.
    differed: Option<(String, f64)>,
    /// Why some instance could not be evaluated exactly (the first reason).
    outside: Option<String>,
    /// Agreeing instances that took `sqrt` as uninterpreted.
    sqrt_uninterpreted: usize,
    /// Instances with a padded, a strided, a grouped conv.
    padded: usize,
    strided: usize,
    grouped: usize,
}

/// Fewer instances than this agreeing exactly prove nothing.
const EXACT_POINTS: usize = 8;

impl ExactTally {
    fn add(&mut self, exact: ExactCheck, features: &ConvFeatures) {
        match exact {
            ExactCheck::Agreed { sqrt_uninterpreted } => {
                self.agreed += 1;
                self.sqrt_uninterpreted += usize::from(sqrt_uninterpreted);
                self.padded += usize::from(features.padded);
                self.strided += usize::from(features.strided);
                self.grouped += usize::from(features.grouped);
            }
            ExactCheck::Differed { witness, relative } => {
                self.differed.get_or_insert((witness, relative));
            }
            ExactCheck::Outside(why) => {
                self.outside.get_or_insert(why);
            }
        }
    }

    fn proof(self) -> Proof {
        if let Some((witness, relative)) = self.differed {
            return Proof::Differs { witness, relative };
        }
        if let Some(why) = self.outside {
            return Proof::NotAttempted(why);
        }
        if self.agreed < EXACT_POINTS {
            return Proof::NotAttempted(format!(
                "only {} instances were evaluated exactly",
                self.agreed
            ));
        }
        let shapes = if self.padded + self.strided + self.grouped == 0 {
            String::new()
        } else {
            format!(
                "; convs padded in {}, strided in {}, grouped in {} of them",
                self.padded, self.strided, self.grouped
            )
        };
        Proof::ProvedAtPoints {
            points: self.agreed,
            shapes,
            sqrt_uninterpreted: self.sqrt_uninterpreted > 0,
        }
    }
}

/// Which conv features an instance has.
struct ConvFeatures {
    padded: bool,
    strided: bool,
    grouped: bool,
}

/// Why attempts at instantiating a left-hand side found nothing to compare.
#[derive(Default)]
struct Misses {
    /// The sampled shapes or attributes did not type-check.
    ill_typed: usize,
    /// The left-hand side did not match the instance built from it.
    no_match: usize,
    /// Guard refusals: the first reason of each guard, and how often it refused.
    refused: BTreeMap<String, (usize, String)>,
    /// Instances where both sides were NaN or infinite on every element.
    non_finite: usize,
}

/// Why one attempt found nothing to compare.
enum Miss {
    IllTyped,
    NoMatch,
    /// Both sides NaN or infinite everywhere: nothing was compared.
    NonFinite,
    Refused {
        guard: String,
        reason: String,
    },
}

impl Misses {
    fn count(&mut self, why: Miss) {
        match why {
            Miss::IllTyped => self.ill_typed += 1,
            Miss::NoMatch => self.no_match += 1,
            Miss::NonFinite => self.non_finite += 1,
            Miss::Refused { guard, reason } => {
                self.refused.entry(guard).or_insert((0, reason)).0 += 1;
            }
        }
    }

    /// The reasons, most frequent first, with a hint for the common mistakes.
    fn explain(&self, rule: &Rule, lhs: &PatternExpr) -> String {
        let mut parts: Vec<(usize, String)> = Vec::new();
        for (guard, (n, reason)) in &self.refused {
            parts.push((*n, format!("guard `{guard}` refused {n} (e.g. {reason})")));
        }
        if self.no_match > 0 {
            parts.push((
                self.no_match,
                format!("the pattern matched nothing {} times", self.no_match),
            ));
        }
        if self.non_finite > 0 {
            parts.push((
                self.non_finite,
                format!(
                    "{} instances were NaN or infinite on every element of both sides, so \
                     they compared no number",
                    self.non_finite
                ),
            ));
        }
        if self.ill_typed > 0 {
            parts.push((
                self.ill_typed,
                format!(
                    "{} sampled instances did not type-check (shapes or attributes the \
                     checker cannot build for this pattern)",
                    self.ill_typed
                ),
            ));
        }
        parts.sort_by_key(|p| std::cmp::Reverse(p.0));
        let mut text = parts
            .into_iter()
            .map(|(_, t)| t)
            .collect::<Vec<_>>()
            .join("; ");
        if let Some(op) = constant_first(rule, lhs) {
            text.push_str(&format!(
                "; hint: the fusion pass puts compile-time constants second in `{op}`, so a \
                 pattern with the constant operand first never matches one"
            ));
        }
        text
    }
}

/// A commutative op of `lhs` whose first operand is a variable the guards make constant
/// and whose second is not: it never matches, since the e-graph orders constants second.
fn constant_first(rule: &Rule, lhs: &PatternExpr) -> Option<&'static str> {
    let constant = |p: &PatternExpr| match p {
        PatternExpr::Var(v) => rule.guards.iter().any(|g| {
            matches!(
                g.kind,
                GuardKind::Const
                    | GuardKind::Scalar
                    | GuardKind::PerChannel
                    | GuardKind::Positive
                    | GuardKind::SingleValue
            ) && g.args.first() == Some(&GuardArg::Var(v.clone()))
                || g.kind == GuardKind::Const && g.args.contains(&GuardArg::Var(v.clone()))
        }),
        PatternExpr::Op { .. } => false,
    };
    match lhs {
        PatternExpr::Var(_) => None,
        PatternExpr::Op { kind, children, .. } => {
            if super::is_commutative_binary(*kind)
                && children.len() == 2
                && constant(&children[0])
                && !constant(&children[1])
            {
                return Some(kind.name());
            }
            children.iter().find_map(|c| constant_first(rule, c))
        }
    }
}

/// How the values of one instance are drawn.
struct Draw<'a> {
    stratum: Stratum,
    large: f64,
    breaks: &'a [f64],
}

impl Draw<'_> {
    fn fill(&self, seed: u64, len: usize) -> Vec<f32> {
        self.stratum.fill(seed, len, self.large, self.breaks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::{builtin_rules, load_rules};

    #[test]
    fn every_builtin_rule_is_sound_and_tested() {
        for check in check_rules(&builtin_rules(), &CheckOptions::default()) {
            eprintln!("{}", check.to_text());
            assert_eq!(check.verdict, Verdict::Sound, "{}", check.to_text());
            assert!(check.instances >= 8, "{}", check.to_text());
        }
    }

    fn check_text(text: &str) -> RuleCheck {
        let rules = load_rules(text, "planted.rules").expect("loads");
        check_rule(&rules[0], &CheckOptions::default())
    }

    /// Wrong only for |x| > 3: inputs in [-1, 1] alone call it sound.
    #[test]
    fn hard_swish_without_its_clip_is_refuted_with_a_counterexample() {
        let text = "rule r\n  lhs (div (mul ?x (add ?x ?three)) ?six)\n  rhs (hard_swish ?x)\n  \
                    guard scalar ?three 3\n  guard scalar ?six 6\n";
        let check = check_text(text);
        assert_eq!(check.verdict, Verdict::Unsound, "{}", check.to_text());
        assert!(check.detail.contains("refuted on"), "{}", check.to_text());
        assert!(check.detail.contains("?x = "), "{}", check.to_text());
        // and the unit stratum alone does not see it: the strata are what catch it
        let only_unit = Stratum::Unit.fill(1, 1000, 1e3, &[0.0]);
        assert!(only_unit.iter().all(|x| x.abs() <= 1.0));
    }

    #[test]
    fn relu_of_shift_and_of_scale_are_refuted() {
        for op in ["add", "mul"] {
            let text = format!(
                "rule r\n  lhs (relu ({op} ?x ?c))\n  rhs ({op} (relu ?x) ?c)\n  guard const ?c\n"
            );
            let check = check_text(&text);
            assert_eq!(check.verdict, Verdict::Unsound, "{}", check.to_text());
            // the counterexample names both the element's input and the constant
            for part in ["left-hand side = ", "right-hand side = ", "?x = ", "?c = "] {
                assert!(check.detail.contains(part), "{}", check.to_text());
            }
        }
    }

    /// relu(v) = v holds for v > 0 only. Declared `positive`, every prover assumes it:
    /// the samples are positive, the one-variable proof is over v > 0 and so is the
    /// solver's; undeclared, the rule is refuted.
    #[test]
    fn a_positive_variable_is_assumed_by_every_prover() {
        let with = "rule r\n  var ?v: positive tensor\n  lhs (relu ?v)\n  rhs ?v\n";
        let check = check_text(with);
        assert_eq!(check.verdict, Verdict::Sound, "{}", check.to_text());
        assert!(check.instances >= 8, "{}", check.to_text());
        assert_eq!(check.proof, Proof::Proved, "{}", check.to_text());
        let rule = &load_rules(with, "t.rules").unwrap()[0];
        let smt = SmtOptions {
            timeout_ms: 5000,
            bound: 1e3,
            tolerance: 1e-5,
        };
        // the solver alone (z3 is part of the test setup), and with the sign flipped
        assert_eq!(prove_with_solver(rule, &smt), Proof::Proved);
        let flipped = load_rules(
            "rule r\n  var ?v: positive tensor\n  lhs (relu (neg ?v))\n  rhs (neg ?v)\n",
            "t.rules",
        )
        .unwrap();
        assert!(
            matches!(prove_with_solver(&flipped[0], &smt), Proof::Differs { .. }),
            "relu(-v) = -v is false for every v > 0"
        );
        let check = check_text("rule r\n  var ?v: tensor\n  lhs (relu ?v)\n  rhs ?v\n");
        assert_eq!(check.verdict, Verdict::Unsound, "{}", check.to_text());
        assert!(
            matches!(check.proof, Proof::Differs { .. }),
            "{}",
            check.to_text()
        );
    }

    /// sqrt(-|x| - 1) is NaN for every input, and twice it too: the sides "agree" on
    /// every sample without comparing a number. Such instances are discarded, so the rule
    /// is untested, with why, not sound.
    #[test]
    fn instances_that_are_nan_on_both_sides_are_not_agreement() {
        let text = "rule r\n  lhs (sqrt (sub (neg (abs ?x)) ?one))\n  \
                    rhs (add (sqrt (sub (neg (abs ?x)) ?one)) (sqrt (sub (neg (abs ?x)) ?one)))\n  \
                    guard scalar ?one 1\n";
        let check = check_text(text);
        assert_eq!(check.verdict, Verdict::Untested, "{}", check.to_text());
        assert!(
            check.detail.contains("NaN or infinite on every element"),
            "{}",
            check.to_text()
        );
        // where the sides are numbers, the same shape of rule is compared and refuted
        let text = "rule r\n  lhs (sqrt (add (abs ?x) ?one))\n  \
                    rhs (add (sqrt (add (abs ?x) ?one)) (sqrt (add (abs ?x) ?one)))\n  \
                    guard scalar ?one 1\n";
        assert_eq!(check_text(text).verdict, Verdict::Unsound);
    }

    /// A bare-variable right-hand side used to record no firing, so the rule was
    /// "untested" and then fired on models.
    #[test]
    fn dropping_an_operand_is_unsound_not_untested() {
        let check = check_text("rule r\n  lhs (add ?x ?y)\n  rhs ?x\n");
        assert_eq!(check.verdict, Verdict::Unsound, "{}", check.to_text());
    }

    #[test]
    fn a_true_rule_that_makes_the_graph_cyclic_is_reported_as_cyclic() {
        let check = check_text("rule r\n  lhs (relu ?x)\n  rhs (relu (relu ?x))\n");
        assert_eq!(check.verdict, Verdict::Cyclic, "{}", check.to_text());
        assert!(!check.verdict.fails());
        // a false one stays unsound
        let check = check_text("rule r\n  lhs (relu ?x)\n  rhs (relu (neg (relu ?x)))\n");
        assert_eq!(check.verdict, Verdict::Unsound, "{}", check.to_text());
    }

    /// min(relu(x), 50000) = relu(x) is wrong only past 50000: two instances (the unit
    /// and wide strata) miss it, the exact proof does not, and gives a witness; relu6
    /// spelled out is proved.
    #[test]
    fn the_exact_proof_refutes_what_the_samples_miss_and_proves_relu6() {
        let text =
            "rule r\n  lhs (min (relu ?x) ?big)\n  rhs (relu ?x)\n  guard scalar ?big 50000\n";
        let rules = load_rules(text, "t.rules").unwrap();
        let few = CheckOptions {
            instances: 2,
            ..CheckOptions::default()
        };
        let sampled = sample_rule(&rules[0], &few);
        assert_eq!(sampled.verdict, Verdict::Sound, "{}", sampled.to_text());
        let check = check_rule(&rules[0], &few);
        assert_eq!(check.verdict, Verdict::Unsound, "{}", check.to_text());
        assert!(
            check.detail.contains("refuted exactly over the reals")
                && check.detail.contains("?x = 5"),
            "{}",
            check.detail
        );
        let relu6 = builtin_rules()
            .into_iter()
            .find(|r| r.name == "recognize-relu6")
            .unwrap();
        let check = check_rule(&relu6, &CheckOptions::default());
        assert_eq!(check.proof, Proof::Proved);
        assert!(
            check.to_text().starts_with("proved   recognize-relu6:"),
            "{}",
            check.to_text()
        );
    }

    #[test]
    fn an_uninstantiable_rule_is_untested_with_the_reason() {
        let check = check_text(
            "rule r\n  lhs (add ?three ?x)\n  rhs (add ?x ?three)\n  guard scalar ?three 3\n",
        );
        assert_eq!(check.verdict, Verdict::Untested, "{}", check.to_text());
        assert!(check.verdict.fails());
        let line = check.to_text();
        assert!(
            line.starts_with("UNTESTED r: no instance compared ("),
            "{line}"
        );
        assert!(!line.contains("max abs error"), "{line}");
        assert!(
            check.detail.contains("guard `scalar` refused"),
            "{}",
            check.detail
        );
        assert!(
            check.detail.contains("constants second in `add`"),
            "{}",
            check.detail
        );
    }

    #[test]
    fn a_rank_guard_gets_instances_of_that_rank() {
        let check = check_text(
            "rule r\n  lhs (add ?x ?c)\n  rhs (add ?c ?x)\n  guard const ?c\n  guard rank ?c 0\n",
        );
        assert_eq!(check.verdict, Verdict::Sound, "{}", check.to_text());
        assert!(check.instances >= 16, "{}", check.to_text());
    }

    #[test]
    fn the_check_is_deterministic_and_meets_every_stratum() {
        let rules = builtin_rules();
        let a = check_rules(&rules, &CheckOptions::default());
        let b = check_rules(&rules, &CheckOptions::default());
        assert_eq!(a, b);
        let breaks = [0.0, 3.0, -3.0];
        for s in Stratum::ALL {
            let v = s.fill(7, 64, 1e3, &breaks);
            let max = v.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            match s {
                Stratum::Tiny => assert!(max <= 1e-3),
                Stratum::Large => assert!(max > 20.0, "{max}"),
                Stratum::Integers => assert!(v.iter().all(|x| x.fract() == 0.0)),
                Stratum::Positive => assert!(v.iter().all(|x| *x > 0.0)),
                Stratum::Negative => assert!(v.iter().all(|x| *x < 0.0)),
                Stratum::BreakPoints => assert!(v.iter().any(|x| breaks.contains(&(*x as f64)))),
                Stratum::Unit | Stratum::Wide => {}
            }
        }
    }

    #[test]
    fn break_points_include_the_rules_own_numbers() {
        let rules = load_rules(
            "rule r\n  lhs (clip[min=-2, max=5] (mul ?x ?c))\n  rhs (clip[min=-2, max=5] (mul ?x ?c))\n  \
             guard scalar ?c 0.25\n",
            "b.rules",
        )
        .unwrap();
        let b = break_points(&rules[0]);
        for x in [0.0, 3.0, -6.0, -2.0, 5.0, 0.25, -0.25] {
            assert!(b.contains(&x), "{x} missing from {b:?}");
        }
    }

    #[test]
    fn relu_does_not_distribute_over_add() {
        let rules = load_rules(
            "rule relu-distributes\n  lhs (relu (add ?a ?b))\n  rhs (add (relu ?a) (relu ?b))\n",
            "planted.rules",
        )
        .expect("loads");
        let check = check_rule(&rules[0], &CheckOptions::default());
        assert_eq!(check.verdict, Verdict::Unsound, "{}", check.to_text());
    }

    #[test]
    fn folding_a_shift_into_a_padded_conv_is_unsound() {
        // fold-shift-into-next-conv without its `unpadded` guard.
        let rules = load_rules(
            "rule fold-shift-into-any-conv\n  \
               lhs (conv2d[?c] (add ?x ?t) ?w)\n  \
               rhs (conv2d[?c] ?x ?w (conv_shift_bias ?w ?t))\n  \
               guard const ?w ?t\n  \
               guard per-channel ?t ?x\n",
            "planted.rules",
        )
        .expect("loads");
        let check = check_rule(&rules[0], &CheckOptions::default());
        assert_eq!(check.verdict, Verdict::Unsound, "{}", check.to_text());
        assert!(
            check.detail.contains("pads [1, 1, 1, 1]"),
            "{}",
            check.to_text()
        );
    }

    /// The built-in layer norm, written out as exporters below opset 17 do, is proved
    /// at random rational points: the reduction as the sums it is, `layer_norm` by its
    /// definition, the square root of the computed variance uninterpreted and applied to
    /// the same value on both sides, the epsilon the applier read from `?eps`.
    #[test]
    fn recognize_layer_norm_is_proved_with_sqrt_uninterpreted() {
        let rule = builtin_rules()
            .into_iter()
            .find(|r| r.name == "recognize-layer-norm")
            .expect("a built-in recognize-layer-norm");
        let check = check_rule(&rule, &CheckOptions::default());
        assert_eq!(check.status(), "proved", "{}", check.to_text());
        assert!(
            matches!(
                check.proof,
                Proof::ProvedAtPoints {
                    points,
                    sqrt_uninterpreted: true,
                    ..
                } if points >= EXACT_POINTS
            ),
            "{}",
            check.to_text()
        );
        assert!(
            check.to_text().contains("sqrt uninterpreted"),
            "{}",
            check.to_text()
        );
    }

    /// A written-out layer norm over the last axis of a rank-3 `?x`, with `variance` the
    /// term under the root (`M` stands for the mean) and `affine` the end of the pattern.
    fn layer_norm_rule(axes: &str, under_root: &str, affine: &str, rhs: &str) -> String {
        let mean = format!("(reduce_mean[axes=[{axes}], keep_dims=true] ?x)");
        let under_root = under_root.replace('M', &mean).replace("AXES", axes);
        format!(
            "rule planted-layer-norm\n  \
               lhs  (add (mul (div (sub ?x {mean}) (sqrt {under_root})) {affine}\n  \
               rhs  {rhs}\n  \
               guard const ?g ?b\n  \
               guard rank ?x 3\n"
        )
    }

    const VARIANCE_PLUS_EPS: &str =
        "(add (reduce_mean[axes=[AXES], keep_dims=true] (mul (sub ?x M) (sub ?x M))) ?eps)";
    const TEMPLATE_RHS: &str = "(layer_norm[axis=2, epsilon=?eps] ?x ?g ?b)";

    /// The planted mistakes in a written-out layer norm are refuted with a
    /// counterexample: the mean over the wrong axis, the epsilon missing, the variance
    /// without its square, gamma and beta swapped. The exact evaluation differs too, but
    /// with sqrt a random function a difference is no witness, so the real roots of the
    /// samples refute them.
    #[test]
    fn planted_mistakes_in_a_layer_norm_are_refuted_with_a_counterexample() {
        let with_eps = |text: String| text.replace("guard const ?g ?b", "guard const ?g ?b ?eps");
        let planted = [
            (
                "mean over the wrong axis",
                with_eps(layer_norm_rule(
                    "1",
                    VARIANCE_PLUS_EPS,
                    "?g) ?b)",
                    TEMPLATE_RHS,
                )),
            ),
            (
                "epsilon missing",
                layer_norm_rule(
                    "2",
                    "(reduce_mean[axes=[2], keep_dims=true] (mul (sub ?x M) (sub ?x M)))",
                    "?g) ?b)",
                    "(layer_norm[axis=2, epsilon=0.00001] ?x ?g ?b)",
                ),
            ),
            (
                "variance without the square",
                with_eps(layer_norm_rule(
                    "2",
                    "(add (reduce_mean[axes=[2], keep_dims=true] (sub ?x M)) ?eps)",
                    "?g) ?b)",
                    TEMPLATE_RHS,
                )),
            ),
            (
                "gamma and beta swapped",
                with_eps(layer_norm_rule(
                    "2",
                    VARIANCE_PLUS_EPS,
                    "?b) ?g)",
                    TEMPLATE_RHS,
                )),
            ),
        ];
        for (mistake, text) in planted {
            let check = check_text(&text);
            assert_eq!(check.status(), "refuted", "{mistake}: {}", check.to_text());
            for part in [
                "refuted on",
                "left-hand side = ",
                "right-hand side = ",
                "?x = ",
            ] {
                assert!(
                    check.detail.contains(part),
                    "{mistake}: {}",
                    check.to_text()
                );
            }
        }
        // the template written correctly is proved, as the built-in rule
        let right = with_eps(layer_norm_rule(
            "2",
            VARIANCE_PLUS_EPS,
            "?g) ?b)",
            TEMPLATE_RHS,
        ));
        let check = check_text(&right);
        assert_eq!(check.status(), "proved", "{}", check.to_text());
    }

    /// sqrt(4 x²) = 2 sqrt(x²) is true, but not for every function in place of sqrt: the
    /// exact evaluation's difference is no refutation, and the rule is sampled.
    #[test]
    fn a_difference_with_sqrt_uninterpreted_refutes_nothing() {
        let check = check_text(
            "rule r\n  lhs (sqrt (mul (mul ?x ?x) ?four))\n  \
             rhs (add (sqrt (mul ?x ?x)) (sqrt (mul ?x ?x)))\n  guard scalar ?four 4\n",
        );
        assert_eq!(check.status(), "sampled", "{}", check.to_text());
        assert!(
            check.to_text().contains("square roots of different values"),
            "{}",
            check.to_text()
        );
    }
}
