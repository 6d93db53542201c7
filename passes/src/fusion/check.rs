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
//! Everything is seeded: the same options give the same verdicts.
//!
//! A left-hand side with no instance that satisfies its types and guards makes the rule
//! [`Verdict::Untested`], with the reason (what refused, how often). A right-hand side
//! that contains the matched value itself (`relu(x) → relu(relu(x))`) cannot be extracted
//! without a cycle; it is evaluated directly instead, and a rule that holds is
//! [`Verdict::Cyclic`], not unsound.

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
            (Verdict::Sound, Proof::Proved | Proof::ProvedAtPoints { .. }) => "proved",
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
            (Verdict::Sound | Verdict::Cyclic, Proof::ProvedAtPoints { points, shapes }) => line
                .push_str(&format!(
                    "; both sides equal in exact rational arithmetic at {points} random points \
                     (Schwartz-Zippel: a false polynomial law would differ at almost every \
                     point){shapes}"
                )),
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
            ExactCheck::Agreed => {
                self.agreed += 1;
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
}

/// Why one attempt found nothing to compare.
enum Miss {
    IllTyped,
    NoMatch,
    Refused { guard: String, reason: String },
}

impl Misses {
    fn count(&mut self, why: Miss) {
        match why {
            Miss::IllTyped => self.ill_typed += 1,
            Miss::NoMatch => self.no_match += 1,
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
                GuardKind::Const | GuardKind::Scalar | GuardKind::PerChannel
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

/// A SplitMix64 generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[(self.next() % items.len() as u64) as usize].clone()
    }
}

/// How a constant's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Values {
    /// Uniform in [-1, 1].
    Any,
    /// Uniform in [0.5, 2] (variances, divisors).
    Positive,
    /// Every element equals this value.
    Splat(f64),
}

/// A variable of the instance: its type and whether it is a compile-time constant.
#[derive(Clone, Debug)]
struct VarSpec {
    ty: TensorType,
    constant: Option<Values>,
}

/// One sampled instance of a left-hand side.
struct Instance {
    /// The left-hand side with an absorb target replaced by an anchor op.
    lhs: PatternExpr,
    /// Variable types, in first-seen order.
    vars: Vec<(String, VarSpec)>,
    /// Attributes of attribute variables.
    attrs: BTreeMap<String, Attrs>,
}

/// The sizes shared by one instance.
#[derive(Clone, Copy)]
struct Dims {
    n: usize,
    c: usize,
    o: usize,
    hw: usize,
    m: usize,
    k: usize,
}

impl Instance {
    fn sample(rule: &Rule, lhs: &PatternExpr, seed: u64) -> Option<Instance> {
        let mut rng = Rng(seed);
        let dims = Dims {
            n: rng.pick(&[1, 2]),
            c: rng.pick(&[2, 3, 4]),
            o: rng.pick(&[2, 3, 4]),
            hw: rng.pick(&[4, 5, 6]),
            m: rng.pick(&[2, 3]),
            k: rng.pick(&[3, 4]),
        };
        let mut lhs = lhs.clone();
        if let RuleAction::Absorb { into } = &rule.action {
            let anchor = match rng.next() % 3 {
                0 => "(matmul ?__anchor_a ?__anchor_b)",
                1 => "(max_pool2d[?__anchor_p] ?__anchor_x)",
                _ => "(conv2d[?__anchor_c] ?__anchor_x ?__anchor_w)",
            };
            let anchor = super::rules::parse_pattern(anchor, "checker", 1, 1).ok()?;
            lhs = substitute(&lhs, into, &anchor);
        }
        let mut fresh = 0;
        let lhs = name_any_attrs(&lhs, &mut fresh);
        let mut constants: HashMap<String, Values> = HashMap::new();
        let mut per_channel: BTreeSet<String> = BTreeSet::new();
        let mut ranks: HashMap<String, usize> = HashMap::new();
        for g in &rule.guards {
            let first = g.args.iter().find_map(|a| match a {
                GuardArg::Var(v) => Some(v.clone()),
                GuardArg::Number(_) | GuardArg::Op(_) => None,
            });
            match g.kind {
                GuardKind::Const => {
                    for a in &g.args {
                        if let GuardArg::Var(v) = a {
                            constants.entry(v.clone()).or_insert(Values::Any);
                        }
                    }
                }
                GuardKind::Scalar => {
                    let value = g.args.iter().find_map(|a| match a {
                        GuardArg::Number(n) => Some(*n),
                        GuardArg::Var(_) | GuardArg::Op(_) => None,
                    });
                    if let (Some(v), Some(x)) = (first, value) {
                        constants.insert(v, Values::Splat(x));
                    }
                }
                GuardKind::PerChannel => {
                    if let Some(v) = first {
                        constants.entry(v.clone()).or_insert(Values::Any);
                        per_channel.insert(v);
                    }
                }
                GuardKind::Rank => {
                    let rank = g.args.iter().find_map(|a| match a {
                        GuardArg::Number(n) if *n >= 0.0 && n.fract() == 0.0 => Some(*n as usize),
                        _ => None,
                    });
                    if let (Some(v), Some(r)) = (first, rank) {
                        ranks.insert(v, r);
                    }
                }
                GuardKind::SingleConsumer | GuardKind::Unpadded | GuardKind::NotAfter => {}
            }
        }
        let mut planner = Planner {
            rng,
            dims,
            constants,
            per_channel,
            ranks,
            vars: Vec::new(),
            attrs: BTreeMap::new(),
        };
        planner.plan(&lhs, None)?;
        Some(Instance {
            lhs,
            vars: planner.vars,
            attrs: planner.attrs,
        })
    }

    /// The instance in words: each variable's type (and `const`), each attribute.
    fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .vars
            .iter()
            .filter(|(v, _)| !v.starts_with("?__"))
            .map(|(v, s)| {
                let c = if s.constant.is_some() { "const " } else { "" };
                format!("{v}: {c}{}", s.ty)
            })
            .collect();
        let mut attrs: Vec<(&String, &Attrs)> = self.attrs.iter().collect();
        attrs.sort_by(|a, b| a.0.cmp(b.0));
        for (v, a) in attrs {
            if let Attrs::Conv2d(c) = a {
                parts.push(format!(
                    "conv strides {:?} pads {:?} groups {}",
                    c.strides, c.pads, c.groups
                ));
            } else if !v.starts_with("?__") {
                parts.push(format!("{v} = {a:?}"));
            }
        }
        parts.join(", ")
    }

    /// Builds the instance as a module: parameters for the variables that are not
    /// constant, weights for those that are, then the ops of `expr` (the left-hand side
    /// when `None`). The weights depend only on `seed` and `draw`, so the module of the
    /// left-hand side and that of the right-hand side see the same constants.
    fn module(
        &self,
        seed: u64,
        draw: &Draw,
        expr: Option<&PatternExpr>,
    ) -> Option<(Module, Value)> {
        let mut module = Module::default();
        let mut func = Func {
            name: "lhs".into(),
            params: Vec::new(),
            insts: Vec::new(),
            results: Vec::new(),
            loc: Location::Unknown,
        };
        for (v, s) in &self.vars {
            if s.constant.is_none() {
                func.params.push(Param {
                    name: v.trim_start_matches('?').to_string(),
                    ty: s.ty.clone(),
                });
            }
        }
        let mut values: HashMap<String, Value> = HashMap::new();
        let mut next_param = 0u32;
        for (i, (v, s)) in self.vars.iter().enumerate() {
            let value = match s.constant {
                None => {
                    next_param += 1;
                    Value(next_param - 1)
                }
                Some(kind) => {
                    let len = s.ty.num_elements();
                    let data = match kind {
                        Values::Any => draw.fill(seed ^ ((i as u64 + 1) * 7919), len),
                        Values::Positive => {
                            random_f32(seed ^ ((i as u64 + 1) * 7919), len, 0.5, 2.0)
                        }
                        Values::Splat(x) => vec![x as f32; len],
                    };
                    let name = module.weights.fresh_name(v.trim_start_matches('?'));
                    let id = module
                        .weights
                        .add(
                            name,
                            s.ty.clone(),
                            AlignedBuf::from_f32(&data),
                            WeightOrigin::Computed,
                        )
                        .ok()?;
                    push(&mut func, &module, Op::Const(id), Vec::new())?
                }
            };
            values.insert(v.clone(), value);
        }
        let root = self.emit_pattern(expr.unwrap_or(&self.lhs), &mut func, &module, &values)?;
        func.results.push(FuncResult {
            name: "out".into(),
            value: root,
        });
        module.funcs.push(func);
        Some((module, root))
    }

    fn emit_pattern(
        &self,
        p: &PatternExpr,
        func: &mut Func,
        module: &Module,
        values: &HashMap<String, Value>,
    ) -> Option<Value> {
        match p {
            PatternExpr::Var(v) => values.get(v).copied(),
            PatternExpr::Op {
                kind,
                attrs,
                children,
            } => {
                let attrs = self.attrs_of(*kind, attrs)?;
                let op = join_op(*kind, &attrs)?;
                let mut operands = Vec::with_capacity(children.len());
                for c in children {
                    operands.push(self.emit_pattern(c, func, module, values)?);
                }
                push(func, module, op, operands)
            }
        }
    }

    fn attrs_of(&self, kind: OpKind, spec: &AttrSpec) -> Option<Attrs> {
        match spec {
            AttrSpec::Literal(a) => Some(a.clone()),
            AttrSpec::Var(v) => self.attrs.get(v).cloned(),
            AttrSpec::Any => kind.default_attrs(),
        }
    }
}

/// `t` at rank `r` for a `rank` guard: its trailing dims (still broadcast-compatible with
/// what `t` was sampled against), or `t` with leading 1s.
fn with_rank(t: &TensorType, r: usize) -> TensorType {
    let d = &t.dims;
    let dims = if r <= d.len() {
        d[d.len() - r..].to_vec()
    } else {
        let mut v = vec![1; r - d.len()];
        v.extend_from_slice(d);
        v
    };
    TensorType::f32(dims)
}

/// Appends an instruction, type-checking it.
fn push(func: &mut Func, module: &Module, op: Op, operands: Vec<Value>) -> Option<Value> {
    let types: Vec<&TensorType> = operands.iter().map(|v| func.type_of(*v)).collect();
    let weights = &module.weights;
    let ty = op.infer_type(&types, &|w| weights.type_of(w)).ok()?;
    func.insts.push(Inst {
        op,
        operands,
        ty,
        loc: Location::Unknown,
    });
    Some(func.inst_value(func.insts.len() - 1))
}

/// `p` with every unnamed attribute spec (`conv2d` without `[...]`) bound to a fresh
/// variable, so the planner samples attributes for it.
fn name_any_attrs(p: &PatternExpr, fresh: &mut usize) -> PatternExpr {
    match p {
        PatternExpr::Var(_) => p.clone(),
        PatternExpr::Op {
            kind,
            attrs,
            children,
        } => {
            let attrs = match attrs {
                AttrSpec::Any => {
                    *fresh += 1;
                    AttrSpec::Var(format!("?__attrs{fresh}"))
                }
                other => other.clone(),
            };
            PatternExpr::Op {
                kind: *kind,
                attrs,
                children: children.iter().map(|c| name_any_attrs(c, fresh)).collect(),
            }
        }
    }
}

/// `p` with every `?var` replaced by `with`.
fn substitute(p: &PatternExpr, var: &str, with: &PatternExpr) -> PatternExpr {
    match p {
        PatternExpr::Var(v) if v == var => with.clone(),
        PatternExpr::Var(_) => p.clone(),
        PatternExpr::Op {
            kind,
            attrs,
            children,
        } => PatternExpr::Op {
            kind: *kind,
            attrs: attrs.clone(),
            children: children.iter().map(|c| substitute(c, var, with)).collect(),
        },
    }
}

/// Assigns variable types and attributes while walking a left-hand side bottom-up.
struct Planner {
    rng: Rng,
    dims: Dims,
    constants: HashMap<String, Values>,
    per_channel: BTreeSet<String>,
    /// Ranks the `rank` guards ask for, by variable.
    ranks: HashMap<String, usize>,
    vars: Vec<(String, VarSpec)>,
    attrs: BTreeMap<String, Attrs>,
}

impl Planner {
    fn var_type(&self, v: &str) -> Option<TensorType> {
        self.vars
            .iter()
            .find(|(n, _)| n == v)
            .map(|(_, s)| s.ty.clone())
    }

    /// The type of `p`; `role` is (parent kind, operand position, sibling types).
    fn plan(
        &mut self,
        p: &PatternExpr,
        role: Option<(OpKind, usize, &[Option<TensorType>])>,
    ) -> Option<TensorType> {
        match p {
            PatternExpr::Var(v) => {
                if let Some(t) = self.var_type(v) {
                    return Some(t);
                }
                let mut ty = self.shape_for(v, role);
                if let Some(&r) = self.ranks.get(v) {
                    ty = with_rank(&ty, r);
                }
                let mut constant = self.constants.get(v).copied();
                let positive = matches!(
                    role,
                    Some((OpKind::BatchNorm, 4, _))
                        | Some((OpKind::Div, 1, _))
                        | Some((OpKind::BnFoldWeight, 2, _))
                        | Some((OpKind::BnFoldBias, 3, _))
                        | Some((OpKind::BnScale, 1, _))
                        | Some((OpKind::BnShift, 3, _))
                );
                if positive {
                    constant = match constant {
                        Some(Values::Any) => Some(Values::Positive),
                        other => other,
                    };
                }
                self.vars.push((
                    v.clone(),
                    VarSpec {
                        ty: ty.clone(),
                        constant,
                    },
                ));
                Some(ty)
            }
            PatternExpr::Op {
                kind,
                attrs,
                children,
            } => {
                let attrs = match attrs {
                    AttrSpec::Literal(a) => a.clone(),
                    AttrSpec::Var(v) => match self.attrs.get(v) {
                        Some(a) => a.clone(),
                        None => {
                            let a = self.sample_attrs(*kind)?;
                            self.attrs.insert(v.clone(), a.clone());
                            a
                        }
                    },
                    AttrSpec::Any => kind.default_attrs()?,
                };
                // Ops and already-typed variables first, so fresh variables see siblings.
                let mut types: Vec<Option<TensorType>> = vec![None; children.len()];
                for (i, c) in children.iter().enumerate() {
                    let known = match c {
                        PatternExpr::Op { .. } => true,
                        PatternExpr::Var(v) => self.var_type(v).is_some(),
                    };
                    if known {
                        types[i] = Some(self.plan(c, None)?);
                    }
                }
                for (i, c) in children.iter().enumerate() {
                    if types[i].is_none() {
                        let siblings = types.clone();
                        types[i] = Some(self.plan(c, Some((*kind, i, &siblings)))?);
                    }
                }
                let types: Vec<TensorType> = types.into_iter().collect::<Option<_>>()?;
                let refs: Vec<&TensorType> = types.iter().collect();
                // planning the operands may resolve the attributes (a depthwise conv's
                // groups become its input's channel count): type the op with them
                let resolved = match p {
                    PatternExpr::Op {
                        attrs: AttrSpec::Var(v),
                        ..
                    } => self.attrs.get(v).cloned().unwrap_or(attrs),
                    PatternExpr::Op { .. } | PatternExpr::Var(_) => attrs,
                };
                let op = join_op(*kind, &resolved)?;
                op.infer_type(&refs, &|_| None).ok()
            }
        }
    }

    fn sample_attrs(&mut self, kind: OpKind) -> Option<Attrs> {
        let r = &mut self.rng;
        Some(match kind {
            OpKind::Conv2d => {
                let pad = r.pick(&[0, 1]);
                Attrs::Conv2d(Conv2dAttrs {
                    strides: [r.pick(&[1, 1, 2]); 2],
                    pads: [pad; 4],
                    dilations: [1, 1],
                    groups: r.pick(&[1, 1, 1, 0]),
                    ..Conv2dAttrs::default()
                })
            }
            OpKind::ConvTranspose2d => Attrs::ConvTranspose2d(smelt_ir::op::ConvTranspose2dAttrs {
                strides: [r.pick(&[1, 2]); 2],
                pads: [r.pick(&[0, 1]); 4],
                ..Default::default()
            }),
            OpKind::BatchNorm
            | OpKind::BnFoldWeight
            | OpKind::BnFoldBias
            | OpKind::BnScale
            | OpKind::BnShift => Attrs::Epsilon(F32(r.pick(&[1e-5, 1e-3, 0.1]))),
            OpKind::Clip => Attrs::Clip {
                min: F32(r.pick(&[-1.0, 0.0])),
                max: F32(r.pick(&[1.0, 6.0])),
            },
            OpKind::LeakyRelu => Attrs::Alpha(F32(r.pick(&[0.01, 0.2]))),
            OpKind::HardSigmoid => Attrs::HardSigmoid {
                alpha: F32(0.2),
                beta: F32(0.5),
            },
            OpKind::MaxPool2d => Attrs::Pool(Pool2dAttrs {
                kernel: [2, 2],
                strides: [r.pick(&[1, 2]); 2],
                pads: [0; 4],
                dilations: [1, 1],
                ceil_mode: false,
                layout: smelt_ir::Layout::RowMajor,
            }),
            OpKind::AvgPool2d => Attrs::AvgPool {
                pool: Pool2dAttrs {
                    kernel: [2, 2],
                    strides: [2, 2],
                    pads: [0; 4],
                    dilations: [1, 1],
                    ceil_mode: false,
                    layout: smelt_ir::Layout::RowMajor,
                },
                count_include_pad: false,
            },
            OpKind::Gemm => Attrs::Gemm(GemmAttrs {
                alpha: F32(r.pick(&[1.0, 0.5])),
                beta: F32(r.pick(&[1.0, 2.0])),
                trans_a: r.pick(&[false, true]),
                trans_b: r.pick(&[false, true]),
            }),
            OpKind::Flatten | OpKind::Softmax | OpKind::Concat => Attrs::Axis(1),
            OpKind::LayerNorm => Attrs::LayerNorm {
                axis: 1,
                epsilon: F32(1e-5),
            },
            // kinds whose attributes have no sample of their own: the patterns' default
            OpKind::Relu
            | OpKind::Sigmoid
            | OpKind::Tanh
            | OpKind::Erf
            | OpKind::Gelu
            | OpKind::HardSwish
            | OpKind::Silu
            | OpKind::Neg
            | OpKind::Abs
            | OpKind::Sqrt
            | OpKind::Exp
            | OpKind::Log
            | OpKind::Reciprocal
            | OpKind::Add
            | OpKind::Sub
            | OpKind::Mul
            | OpKind::Div
            | OpKind::Min
            | OpKind::Max
            | OpKind::GlobalAvgPool
            | OpKind::Reshape
            | OpKind::Transpose
            | OpKind::Slice
            | OpKind::Pad
            | OpKind::Expand
            | OpKind::Tile
            | OpKind::Reorder
            | OpKind::Gather
            | OpKind::MatMul
            | OpKind::ChannelScale
            | OpKind::ChannelVector
            | OpKind::ConvShiftBias
            | OpKind::Cast
            | OpKind::Equal
            | OpKind::Less
            | OpKind::LessOrEqual
            | OpKind::Greater
            | OpKind::GreaterOrEqual
            | OpKind::And
            | OpKind::Or
            | OpKind::Xor
            | OpKind::Not
            | OpKind::Where
            | OpKind::Mod
            | OpKind::ReduceSum
            | OpKind::ReduceMean
            | OpKind::ReduceMax
            | OpKind::ReduceMin
            | OpKind::Resize
            | OpKind::Fused => kind.default_attrs()?,
        })
    }

    /// A type for a fresh variable at `role`.
    fn shape_for(
        &mut self,
        v: &str,
        role: Option<(OpKind, usize, &[Option<TensorType>])>,
    ) -> TensorType {
        let d = self.dims;
        let image = TensorType::f32([d.n, d.c, d.hw, d.hw]);
        let matrix = TensorType::f32([d.m, d.k]);
        let sib = |s: &[Option<TensorType>], i: usize| s.get(i).cloned().flatten();
        let Some((kind, pos, siblings)) = role else {
            return if self.rng.next().is_multiple_of(3) {
                matrix
            } else {
                image
            };
        };
        match (kind, pos) {
            (OpKind::Conv2d, 0) | (OpKind::BatchNorm, 0) | (OpKind::MaxPool2d, 0) => image,
            (OpKind::AvgPool2d, 0) | (OpKind::GlobalAvgPool, 0) => image,
            (OpKind::Conv2d, 1) => {
                let c = sib(siblings, 0).and_then(|t| t.dims.get(1).copied());
                let c = c.unwrap_or(d.c);
                // Groups: the sampled conv attributes say 0 for "depthwise".
                let groups = self.pending_groups(c);
                let o = if groups == 1 {
                    d.o
                } else {
                    groups * self.rng.pick(&[1, 2])
                };
                let k = self.rng.pick(&[1, 3]);
                TensorType::f32([o, c / groups, k, k])
            }
            (OpKind::Conv2d, 2) => {
                let o = sib(siblings, 1).map_or(d.o, |t| t.dims.first().copied().unwrap_or(d.o));
                TensorType::f32([o])
            }
            (OpKind::BatchNorm, _) => {
                let c = sib(siblings, 0).and_then(|t| t.dims.get(1).copied());
                TensorType::f32([c.unwrap_or(d.c)])
            }
            (OpKind::MatMul, 0) | (OpKind::Gemm, 0) => matrix,
            (OpKind::MatMul, 1) | (OpKind::Gemm, 1) => {
                let k = sib(siblings, 0).map_or(d.k, |t| t.dims.last().copied().unwrap_or(d.k));
                TensorType::f32([k, d.o])
            }
            (OpKind::Gemm, 2) => TensorType::f32([d.o]),
            (k, _) if k.binary().is_some() => {
                let other = sib(siblings, 1 - pos.min(1));
                match other {
                    Some(s) => self.broadcast_partner(v, &s),
                    None => image,
                }
            }
            _ => image,
        }
    }

    /// The groups of the conv being planned: the most recently sampled conv attributes,
    /// with 0 ("depthwise") resolved to the input's channel count.
    fn pending_groups(&mut self, c: usize) -> usize {
        let conv = self
            .attrs
            .iter_mut()
            .filter_map(|(_, a)| match a {
                Attrs::Conv2d(a) => Some(a),
                _ => None,
            })
            .find(|a| a.groups == 0);
        match conv {
            Some(a) => {
                a.groups = c;
                c
            }
            None => self
                .attrs
                .values()
                .find_map(|a| match a {
                    Attrs::Conv2d(a) if c.is_multiple_of(a.groups) => Some(a.groups),
                    _ => None,
                })
                .unwrap_or(1),
        }
    }

    /// A shape for the other operand of a binary op whose first operand is `s`.
    fn broadcast_partner(&mut self, v: &str, s: &TensorType) -> TensorType {
        let mut options: Vec<Vec<usize>> = Vec::new();
        let scalar = matches!(self.constants.get(v), Some(Values::Splat(_)));
        if scalar {
            return TensorType::f32([1]);
        }
        if s.rank() >= 2 {
            let c = s.dims[1];
            let mut per_channel = vec![1; s.rank()];
            per_channel[1] = c;
            options.push(per_channel.clone());
            options.push(per_channel[1..].to_vec());
        }
        if !self.per_channel.contains(v) {
            options.push(s.dims.clone());
            options.push(vec![1]);
            if let Some(last) = s.dims.last() {
                options.push(vec![*last]);
            }
        }
        if options.is_empty() {
            options.push(s.dims.clone());
        }
        TensorType::f32(self.rng.pick(&options))
    }
}

/// The outcome of comparing one instance's sides.
enum Comparison {
    /// The rule did not fire on the instance, and why.
    NotApplicable(Miss),
    /// Both sides ran; the worst difference over the right-hand sides, whether one was
    /// evaluated directly because it is cyclic, and the worst element in words.
    Compared {
        diff: Diff,
        cyclic: bool,
        example: String,
        /// The same instance evaluated exactly at a random rational point.
        exact: ExactCheck,
        /// The instance's conv features.
        features: ConvFeatures,
    },
    /// The right-hand side could not be built or evaluated.
    Failed(String),
}

/// The difference of two results.
#[derive(Clone, Copy, Debug, Default)]
struct Diff {
    max_abs: f64,
    /// max |got − want| / max |want| (FACTS.md), infinite when one side only is not finite.
    relative: f64,
    /// The flat index of the worst element.
    worst: usize,
}

/// Compares `got` with `want` element by element (both row-major, same shape): the same
/// infinity or NaN on both sides agree, a non-finite value on one side only is an
/// infinite error; a reference of zeros counts absolute differences.
fn diff(got: &[f32], want: &[f32]) -> Diff {
    let scale = want
        .iter()
        .filter(|w| w.is_finite())
        .fold(0.0f64, |m, w| m.max((*w as f64).abs()));
    let scale = if scale > 0.0 { scale } else { 1.0 };
    let mut out = Diff::default();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (*g as f64, *w as f64);
        let d = if g == w || (g.is_nan() && w.is_nan()) {
            0.0
        } else if g.is_finite() && w.is_finite() {
            (g - w).abs()
        } else {
            f64::INFINITY
        };
        if d > out.max_abs {
            out.max_abs = d;
            out.worst = i;
        }
    }
    out.relative = out.max_abs / scale;
    out
}

fn compare(rule: &Rule, instance: &Instance, seed: u64, draw: &Draw) -> Comparison {
    let Some((module, root)) = instance.module(seed, draw, None) else {
        return Comparison::NotApplicable(Miss::IllTyped);
    };
    let func = &module.funcs[0];
    let inputs: Vec<Tensor> = func
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| Tensor {
            ty: p.ty.clone(),
            data: draw
                .fill(seed.wrapping_add(101 + i as u64), p.ty.storage_len())
                .into(),
        })
        .collect();
    let Ok(want) = interp::run(&module, func, &inputs) else {
        return Comparison::NotApplicable(Miss::IllTyped);
    };
    let Ok(Built {
        mut egraph,
        value_class,
        original,
    }) = build(func, &module.weights)
    else {
        return Comparison::NotApplicable(Miss::IllTyped);
    };
    let uses = func.uses();
    let context = Arc::new(GuardContext::new(
        value_class
            .iter()
            .enumerate()
            .map(|(v, id)| (*id, uses.get(v).map_or(0, |u| u.len())))
            .collect(),
        &module.weights,
        Vec::new(),
    ));
    context.annotate(&mut egraph);
    let Ok(rewrites) = compile_rules(
        std::slice::from_ref(rule),
        &mut egraph.analysis.attrs,
        &context,
    ) else {
        return Comparison::Failed("the rule does not compile".into());
    };
    let runner = Runner::<TensorNode, FusionAnalysis>::new(FusionAnalysis::default())
        .with_egraph(egraph)
        .with_iter_limit(1)
        .with_node_limit(10_000)
        .with_scheduler(SimpleScheduler)
        .run(&rewrites);
    let mut egraph = runner.egraph;
    egraph.rebuild();
    FusionAnalysis::recanonicalize(&mut egraph);
    let root_class = egraph.find(value_class[root.index()]);
    let at_root = || {
        egraph
            .analysis
            .events
            .iter()
            .filter(|e| egraph.find(e.class) == root_class)
    };
    let fired: BTreeSet<TensorNode> = at_root()
        .filter_map(|e| match &e.outcome {
            Outcome::Fired(n) => Some(n.clone().map_children(|c| egraph.find(c))),
            Outcome::Refused { .. } | Outcome::Approximate { .. } => None,
        })
        .collect();
    if fired.is_empty() {
        let refusal = at_root().find_map(|e| match &e.outcome {
            Outcome::Refused { guard, reason } => Some(Miss::Refused {
                guard: guard.clone(),
                reason: reason.clone(),
            }),
            Outcome::Fired(_) | Outcome::Approximate { .. } => None,
        });
        return Comparison::NotApplicable(refusal.unwrap_or(Miss::NoMatch));
    }
    let table = CostTable::new(&egraph, &CostModel::default());
    let inputs_nodes = input_nodes(&egraph, func, &value_class, &original);
    let want = want[0].f32s_row_major();
    let mut worst: Option<(Diff, bool, Vec<f32>)> = None;
    let mut exact = ExactCheck::Agreed;
    for node in fired {
        let full: BTreeMap<Id, TensorNode> = BTreeMap::from([(root_class, node)]);
        let chosen = choose_with_forced(
            &egraph,
            &table,
            &full,
            &inputs_nodes,
            &[root_class],
            &BTreeSet::new(),
        );
        let (rhs_module, cyclic) = match (chosen, &rule.action) {
            (Some(chosen), _) => match emit(func, &egraph, &chosen, &[root_class]) {
                Ok((f, _, _)) => (
                    Module {
                        weights: module.weights.clone(),
                        funcs: vec![f],
                    },
                    false,
                ),
                Err(e) => {
                    return Comparison::Failed(format!("the right-hand side is invalid: {e}"))
                }
            },
            // The right-hand side needs the matched value to compute it: it is true or
            // false all the same, so evaluate it as written.
            (None, RuleAction::Rewrite(rhs)) => match instance.module(seed, draw, Some(rhs)) {
                Some((m, _)) => (m, true),
                None => {
                    return Comparison::Failed(
                        "the right-hand side makes the graph cyclic and does not type-check".into(),
                    )
                }
            },
            (None, RuleAction::Absorb { .. }) => {
                return Comparison::Failed("the absorbed form makes the graph cyclic".into())
            }
        };
        let got = match interp::run(&rhs_module, &rhs_module.funcs[0], &inputs) {
            Ok(g) => g,
            Err(d) => {
                return Comparison::Failed(format!("the right-hand side does not run: {}", msg(&d)))
            }
        };
        if got[0].ty.dims != want_dims(&module) {
            return Comparison::Failed(format!(
                "the right-hand side is {}, the left-hand side {}",
                got[0].ty,
                module.funcs[0].type_of(root)
            ));
        }
        let got = got[0].f32s_row_major();
        // the worst exact finding over the nodes: a difference, else a reason, else agreed
        let here = if cyclic {
            ExactCheck::Outside("the right-hand side is evaluated as written".into())
        } else {
            exact_check(&module, &rhs_module, seed)
        };
        match (&exact, here) {
            (ExactCheck::Differed { .. }, _) => {}
            (_, d @ ExactCheck::Differed { .. }) => exact = d,
            (ExactCheck::Outside(_), _) => {}
            (_, here) => exact = here,
        }
        let d = diff(&got, &want);
        if worst
            .as_ref()
            .is_none_or(|(w, _, _)| d.relative.is_nan() || d.relative > w.relative)
        {
            worst = Some((d, cyclic, got));
        }
    }
    let Some((d, cyclic, got)) = worst else {
        return Comparison::NotApplicable(Miss::NoMatch);
    };
    let example = counterexample(instance, &module, &inputs, d.worst, &got, &want);
    let mut features = ConvFeatures {
        padded: false,
        strided: false,
        grouped: false,
    };
    for inst in &module.funcs[0].insts {
        if let Op::Conv2d(c) = &inst.op {
            features.padded |= c.pads.iter().any(|p| *p > 0);
            features.strided |= c.strides.iter().any(|s| *s > 1);
            features.grouped |= c.groups > 1;
        }
    }
    Comparison::Compared {
        diff: d,
        cyclic,
        example,
        exact,
        features,
    }
}

/// The dims of the left-hand side's result.
fn want_dims(module: &Module) -> Vec<usize> {
    let f = &module.funcs[0];
    f.type_of(f.results[0].value).dims.clone()
}

/// The worst element in words: its index, both sides' values there, and the values of
/// the variables that have the result's shape (elementwise rules: the element's inputs).
fn counterexample(
    instance: &Instance,
    module: &Module,
    inputs: &[Tensor],
    at: usize,
    got: &[f32],
    want: &[f32],
) -> String {
    let dims = want_dims(module);
    let mut index = Vec::with_capacity(dims.len());
    let mut rest = at;
    for d in dims.iter().rev() {
        index.push(rest % d.max(&1));
        rest /= d.max(&1);
    }
    index.reverse();
    let mut vars: Vec<String> = Vec::new();
    let mut param = 0;
    for (v, s) in &instance.vars {
        let value = if s.constant.is_none() {
            param += 1;
            inputs
                .get(param - 1)
                .map(|t| t.f32s_row_major())
                .filter(|_| s.ty.dims == dims)
                .and_then(|d| d.get(at).copied())
        } else {
            None
        };
        if let Some(x) = value {
            if !v.starts_with("?__") {
                vars.push(format!("{v} = {x}"));
            }
        }
    }
    let mut text = format!(
        "at {index:?} left-hand side = {}, right-hand side = {}",
        want.get(at).copied().unwrap_or(f32::NAN),
        got.get(at).copied().unwrap_or(f32::NAN)
    );
    if !vars.is_empty() {
        text.push_str(&format!(" ({})", vars.join(", ")));
    }
    text
}

fn msg(d: &Diagnostic) -> String {
    d.message.clone()
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
        }
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
}
