//! SMT proofs of elementwise rules in several variables, over the reals, by the `z3`
//! binary spoken to in SMT-LIB2 through a pipe (`easy-smt`): nothing links against the
//! solver, and only `smelt check-rules` (and CI tests) start it — the check where user
//! rules load samples ([`super::check::CheckOptions::solver_timeout_ms`] is `None` there).
//!
//! The fragment: `add`, `sub`, `mul`, `div` by a nonzero constant, `neg`, `abs`, `relu`,
//! `leaky_relu`, `prelu`, `clip`, `max`, `min`, `hard_sigmoid`, `hard_swish`, `silu` (as
//! `x * sigmoid(x)`), the tanh `gelu` (by its formula, its constants the f32s models
//! carry) and `mish` (as `x * tanh(log(exp(x) + 1))`) with spelled-out attributes, over any number of tensor variables
//! (each a real: every op is elementwise, so a law over scalars is the law over
//! broadcast tensors) and constants fixed by `scalar` guards. Attribute and guard values
//! are the f32s taken exactly, as rationals. `sigmoid`, `tanh`, `erf`, `exp`, `log`,
//! `sqrt` and the exact `gelu` are uninterpreted functions: a proof that holds for every function
//! holds for the real one, and a counterexample that needs one of them to take arbitrary
//! values refutes nothing, so the rule is left to sampling.
//!
//! Per left-hand side, three queries, each under the per-query timeout:
//! 1. `lhs ≠ rhs` for some reals: unsatisfiable is `proved`.
//! 2. Otherwise `|lhs − rhs| > tol · max(1, |lhs|, |rhs|)` for some reals: unsatisfiable
//!    is `proved within tol` (a rule whose attribute is the f32 `0.16666667` for 1/6 holds
//!    only so). When the solver cannot answer that, the same query with every variable
//!    in the box `[-bound, bound]`, and the claim is stated for the box.
//! 3. Otherwise the model of query 2 is the counterexample: the variables' values and
//!    both sides there.
//!
//! A timeout or an `unknown` answer leaves the rule to sampling, with the reason.

use easy_smt::{Context, ContextBuilder, Response, SExpr, SExprData};

use smelt_ir::op::{GeluApproximation, GELU_TANH_CUBIC, GELU_TANH_SCALE};

use super::lang::{Attrs, OpKind};
use super::prove::{scalar_guard_values, Proof, Q};
use super::rules::{AttrSpec, PatternExpr, Rule, RuleAction};

/// The solver program started for proofs.
pub const SOLVER: &str = "z3";

/// The ops without a closed form, encoded as uninterpreted functions of one real.
const UNINTERPRETED: [(OpKind, &str); 7] = [
    (OpKind::Sigmoid, "sigmoid"),
    (OpKind::Tanh, "tanh"),
    (OpKind::Erf, "erf"),
    (OpKind::Exp, "exp"),
    (OpKind::Log, "log"),
    (OpKind::Sqrt, "sqrt"),
    (OpKind::Gelu, "gelu"),
];

/// How one query is asked.
#[derive(Clone, Copy, Debug)]
pub struct SmtOptions {
    /// Milliseconds the solver may spend on one query.
    pub timeout_ms: u32,
    /// The box of the `proved within tol` query when the unbounded one has no answer:
    /// every variable in `[-bound, bound]`.
    pub bound: f64,
    /// The tolerance of that query, relative to `max(1, |lhs|, |rhs|)`.
    pub tolerance: f64,
}

/// The encoding of one rule's terms into one solver context.
struct Encoder<'a> {
    ctx: &'a Context,
    /// `scalar`-guarded variables and their exact values.
    scalars: Vec<(String, Q)>,
    /// The free variables met so far: rule name and solver symbol.
    free: Vec<(String, SExpr)>,
    /// The uninterpreted functions the terms apply.
    functions: Vec<&'static str>,
}

impl Encoder<'_> {
    fn rational(&self, q: Q) -> SExpr {
        let real = |n: i128| self.ctx.atom(format!("{}.0", n.unsigned_abs()));
        let magnitude = if q.d == 1 {
            real(q.n)
        } else {
            self.ctx.rdiv(real(q.n), real(q.d))
        };
        if q.n < 0 {
            self.ctx.negate(magnitude)
        } else {
            magnitude
        }
    }

    fn exact(&self, x: f32) -> Result<SExpr, String> {
        Q::from_f32(x)
            .map(|q| self.rational(q))
            .ok_or_else(|| format!("the attribute value {x} is not a finite f32"))
    }

    fn max(&self, a: SExpr, b: SExpr) -> SExpr {
        self.ctx.ite(self.ctx.gte(a, b), a, b)
    }

    fn min(&self, a: SExpr, b: SExpr) -> SExpr {
        self.ctx.ite(self.ctx.lte(a, b), a, b)
    }

    fn clip(&self, a: SExpr, lo: SExpr, hi: SExpr) -> SExpr {
        let raised = self.max(a, lo);
        self.min(raised, hi)
    }

    fn abs(&self, a: SExpr) -> SExpr {
        self.ctx
            .ite(self.ctx.gte(a, self.zero()), a, self.ctx.negate(a))
    }

    fn zero(&self) -> SExpr {
        self.ctx.atom("0.0")
    }

    fn one(&self) -> SExpr {
        self.ctx.atom("1.0")
    }

    fn apply(&mut self, name: &'static str, a: SExpr) -> SExpr {
        if !self.functions.contains(&name) {
            self.functions.push(name);
        }
        self.ctx.list(vec![self.ctx.atom(format!("uf_{name}")), a])
    }

    fn term(&mut self, p: &PatternExpr) -> Result<SExpr, String> {
        match p {
            PatternExpr::Var(v) => {
                if let Some((_, q)) = self.scalars.iter().find(|(n, _)| n == v) {
                    return Ok(self.rational(*q));
                }
                if let Some((_, s)) = self.free.iter().find(|(n, _)| n == v) {
                    return Ok(*s);
                }
                let symbol = self.ctx.atom(format!("v{}_{}", self.free.len(), &v[1..]));
                self.free.push((v.clone(), symbol));
                Ok(symbol)
            }
            PatternExpr::Op {
                kind,
                attrs,
                children,
            } => {
                let mut args = Vec::with_capacity(children.len());
                for c in children {
                    args.push(self.term(c)?);
                }
                let lit = match attrs {
                    AttrSpec::Literal(a) => Some(a),
                    AttrSpec::Any | AttrSpec::Var(_) | AttrSpec::Template { .. } => None,
                };
                let ctx = self.ctx;
                match (kind, lit) {
                    (OpKind::Gelu, Some(Attrs::Gelu(GeluApproximation::Tanh))) => {
                        // 0.5 x (1 + tanh(k (x + c x³))) with k and c the f32s a model
                        // carries them as, tanh uninterpreted
                        let k = self.exact(GELU_TANH_SCALE as f32)?;
                        let c = self.exact(GELU_TANH_CUBIC as f32)?;
                        let x = args[0];
                        let cube = ctx.times(x, ctx.times(x, x));
                        let inner = ctx.times(k, ctx.plus(x, ctx.times(c, cube)));
                        let t = self.apply("tanh", inner);
                        let half = ctx.rdiv(self.one(), ctx.atom("2.0"));
                        return Ok(ctx.times(ctx.times(half, x), ctx.plus(self.one(), t)));
                    }
                    (OpKind::Mish, _) => {
                        // x tanh(log(exp(x) + 1)), each function uninterpreted
                        let e = self.apply("exp", args[0]);
                        let softplus = self.apply("log", ctx.plus(e, self.one()));
                        let t = self.apply("tanh", softplus);
                        return Ok(ctx.times(args[0], t));
                    }
                    _ => {}
                }
                if let Some((_, name)) = UNINTERPRETED.iter().find(|(k, _)| k == kind) {
                    return Ok(self.apply(name, args[0]));
                }
                Ok(match (kind, lit) {
                    (OpKind::Add, _) => ctx.plus(args[0], args[1]),
                    (OpKind::Sub, _) => ctx.sub(args[0], args[1]),
                    (OpKind::Mul, _) => ctx.times(args[0], args[1]),
                    (OpKind::Div, _) => {
                        let divisor = match &children[1] {
                            PatternExpr::Var(v) => self.scalars.iter().find(|(n, _)| n == v),
                            PatternExpr::Op { .. } => None,
                        };
                        match divisor {
                            Some((_, q)) if q.n != 0 => ctx.rdiv(args[0], args[1]),
                            _ => return Err("a divisor is not a nonzero scalar constant".into()),
                        }
                    }
                    (OpKind::Neg, _) => ctx.negate(args[0]),
                    (OpKind::Abs, _) => self.abs(args[0]),
                    (OpKind::Relu, _) => self.max(args[0], self.zero()),
                    (OpKind::Max, _) => self.max(args[0], args[1]),
                    (OpKind::Min, _) => self.min(args[0], args[1]),
                    (OpKind::Clip, Some(Attrs::Clip { min, max })) => {
                        let (lo, hi) = (self.exact(min.0)?, self.exact(max.0)?);
                        self.clip(args[0], lo, hi)
                    }
                    (OpKind::LeakyRelu, Some(Attrs::Alpha(alpha))) => {
                        let scaled = ctx.times(self.exact(alpha.0)?, args[0]);
                        ctx.ite(ctx.gte(args[0], self.zero()), args[0], scaled)
                    }
                    (OpKind::HardSigmoid, Some(Attrs::HardSigmoid { alpha, beta })) => {
                        let lin = ctx.plus(
                            ctx.times(self.exact(alpha.0)?, args[0]),
                            self.exact(beta.0)?,
                        );
                        self.clip(lin, self.zero(), self.one())
                    }
                    (OpKind::HardSwish, _) => {
                        // x * clip(x / 6 + 1/2, 0, 1), the interpreter's definition
                        let sixth = ctx.rdiv(self.one(), ctx.atom("6.0"));
                        let half = ctx.rdiv(self.one(), ctx.atom("2.0"));
                        let lin = ctx.plus(ctx.times(sixth, args[0]), half);
                        let gate = self.clip(lin, self.zero(), self.one());
                        ctx.times(args[0], gate)
                    }
                    (OpKind::PRelu, _) => {
                        let scaled = ctx.times(args[1], args[0]);
                        ctx.ite(ctx.gte(args[0], self.zero()), args[0], scaled)
                    }
                    (OpKind::Silu, _) => {
                        let gate = self.apply("sigmoid", args[0]);
                        ctx.times(args[0], gate)
                    }
                    (k, _) if lit.is_none() && kind.default_attrs().is_none() => {
                        return Err(format!("'{}' has attributes bound to a variable", k.name()))
                    }
                    (k, _) => return Err(format!("'{}' has no SMT encoding", k.name())),
                })
            }
        }
    }
}

/// A solver value as a number: `1.5`, `(- 2.0)`, `(/ 1.0 3.0)`; `None` for algebraic
/// numbers and anything else.
fn number(ctx: &Context, e: SExpr) -> Option<f64> {
    match ctx.get(e) {
        SExprData::Atom(a) => a.parse().ok(),
        SExprData::String(_) => None,
        SExprData::List(items) => {
            let op = ctx.get_atom(*items.first()?)?;
            let args: Option<Vec<f64>> = items[1..].iter().map(|x| number(ctx, *x)).collect();
            let args = args?;
            match (op, args.as_slice()) {
                ("-", [x]) => Some(-x),
                ("-", [x, y]) => Some(x - y),
                ("/", [x, y]) => Some(x / y),
                ("+", [x, y]) => Some(x + y),
                ("*", [x, y]) => Some(x * y),
                _ => None,
            }
        }
    }
}

/// A value in words, the way the checker prints them.
fn show(x: f64) -> String {
    let f = x as f32;
    if f != 0.0 && (f.abs() < 1e-4 || f.abs() >= 1e7) {
        format!("{f:e}")
    } else {
        format!("{f}")
    }
}

/// The outcome of one left-hand side.
enum Side {
    Proved,
    /// Within the tolerance, for all reals (`None`) or over the box.
    ProvedWithin(Option<f64>),
    Refuted {
        witness: String,
        relative: f64,
    },
    Undecided(String),
}

fn solver_error(e: std::io::Error) -> String {
    format!("the SMT solver `{SOLVER}` failed or could not be started ({e}); install it (apt-get install z3)")
}

/// Proves `rule` with the solver, or says why not (see the module docs).
pub fn prove_with_solver(rule: &Rule, options: &SmtOptions) -> Proof {
    let RuleAction::Rewrite(rhs) = &rule.action else {
        return Proof::ByDefinition;
    };
    let scalars = match scalar_guard_values(rule) {
        Ok(s) => s,
        Err(p) => return p,
    };
    let mut ctx = match ContextBuilder::new()
        .solver(SOLVER)
        .solver_args(["-smt2", "-in", "-v:0"])
        .build()
    {
        Ok(ctx) => ctx,
        Err(e) => return Proof::NotAttempted(solver_error(e)),
    };
    // the widest claim all left-hand sides share: None = exact, then all reals, then the box
    let mut within: Option<Option<f64>> = None;
    for lhs in &rule.lhs {
        match prove_side(&mut ctx, lhs, rhs, &scalars, &rule.positive_vars(), options) {
            Ok(Side::Proved) => {}
            Ok(Side::ProvedWithin(bound)) => {
                within = Some(match (within, bound) {
                    (Some(Some(b)), _) | (_, Some(b)) => Some(b),
                    _ => None,
                })
            }
            Ok(Side::Refuted { witness, relative }) => return Proof::Differs { witness, relative },
            Ok(Side::Undecided(why)) => return Proof::NotAttempted(why),
            Err(e) => return Proof::NotAttempted(e),
        }
    }
    match within {
        None => Proof::Proved,
        Some(bound) => Proof::ProvedWithin {
            tolerance: options.tolerance,
            bound: bound.unwrap_or(f64::INFINITY),
        },
    }
}

/// Query 2 of the module docs: is `|l − r| > tol · max(1, |l|, |r|)` satisfiable, for
/// all reals or with every variable in `[-bound, bound]`? Unsatisfiable is
/// [`Side::ProvedWithin`], a model the counterexample.
fn within(
    ctx: &mut Context,
    l: SExpr,
    r: SExpr,
    free: &[(String, SExpr)],
    bound: Option<f64>,
    options: &SmtOptions,
) -> Result<Side, String> {
    let tolerance = Q::from_f32(options.tolerance as f32)
        .ok_or_else(|| "the tolerance is not a finite f32".to_string())?;
    let enc = Encoder {
        ctx,
        scalars: Vec::new(),
        free: Vec::new(),
        functions: Vec::new(),
    };
    let tol = enc.rational(tolerance);
    let mut facts = Vec::new();
    if let Some(bound) = bound {
        let b =
            Q::from_f32(bound as f32).ok_or_else(|| "the bound is not a finite f32".to_string())?;
        let b = enc.rational(b);
        for (_, v) in free {
            facts.push(enc.ctx.lte(enc.ctx.negate(b), *v));
            facts.push(enc.ctx.lte(*v, b));
        }
    }
    let scale = enc.max(enc.one(), enc.max(enc.abs(l), enc.abs(r)));
    let gap = enc.abs(enc.ctx.sub(l, r));
    facts.push(enc.ctx.gt(gap, enc.ctx.times(tol, scale)));
    ctx.push().map_err(solver_error)?;
    for f in facts {
        ctx.assert(f).map_err(solver_error)?;
    }
    let answer = ctx.check().map_err(solver_error)?;
    let side = match answer {
        Response::Unsat => Side::ProvedWithin(bound),
        Response::Unknown => Side::Undecided(format!(
            "the solver gave no answer on the tolerance within {} ms",
            options.timeout_ms
        )),
        Response::Sat => {
            let mut asked: Vec<SExpr> = free.iter().map(|(_, s)| *s).collect();
            asked.push(l);
            asked.push(r);
            let values = ctx.get_value(asked).map_err(solver_error)?;
            let nums: Vec<Option<f64>> = values.iter().map(|(_, v)| number(ctx, *v)).collect();
            let text = |i: usize| match nums[i] {
                Some(x) => show(x),
                None => ctx.display(values[i].1).to_string(),
            };
            let vars: Vec<String> = free
                .iter()
                .enumerate()
                .map(|(i, (name, _))| format!("{name} = {}", text(i)))
                .collect();
            let n = free.len();
            let relative = match (nums[n], nums[n + 1]) {
                (Some(a), Some(b)) => (a - b).abs() / a.abs().max(b.abs()).max(1.0),
                _ => f64::NAN,
            };
            Side::Refuted {
                witness: format!(
                    "{}: left-hand side = {}, right-hand side = {}",
                    vars.join(", "),
                    text(n),
                    text(n + 1)
                ),
                relative,
            }
        }
    };
    ctx.pop().map_err(solver_error)?;
    Ok(side)
}

fn prove_side(
    ctx: &mut Context,
    lhs: &PatternExpr,
    rhs: &PatternExpr,
    scalars: &[(String, Q)],
    positive: &[String],
    options: &SmtOptions,
) -> Result<Side, String> {
    let (l, r, free, functions) = {
        let mut enc = Encoder {
            ctx,
            scalars: scalars.to_vec(),
            free: Vec::new(),
            functions: Vec::new(),
        };
        let l = enc.term(lhs)?;
        let r = enc.term(rhs)?;
        (l, r, enc.free, enc.functions)
    };
    ctx.push().map_err(solver_error)?;
    let timeout = ctx.numeral(options.timeout_ms);
    ctx.set_option(":timeout", timeout).map_err(solver_error)?;
    let real = ctx.real_sort();
    for (_, symbol) in &free {
        let name = ctx.get_atom(*symbol).unwrap_or_default().to_string();
        ctx.declare_const(name, real).map_err(solver_error)?;
    }
    for f in &functions {
        ctx.declare_fun(format!("uf_{f}"), vec![real], real)
            .map_err(solver_error)?;
    }
    // a `positive` variable's constraint holds in every query of this side
    for (name, symbol) in &free {
        if positive.contains(name) {
            let fact = ctx.gt(*symbol, ctx.atom("0.0"));
            ctx.assert(fact).map_err(solver_error)?;
        }
    }
    let undecided = |what: &str| {
        format!(
            "the solver gave no answer {what} within {} ms",
            options.timeout_ms
        )
    };
    let uninterpreted = || {
        format!(
            "{} uninterpreted, and the sides do not apply it to the same arguments",
            functions.join(", ")
        )
    };
    // 1. an identity over the reals?
    ctx.push().map_err(solver_error)?;
    let differ = ctx.not(ctx.eq(l, r));
    ctx.assert(differ).map_err(solver_error)?;
    let first = ctx.check().map_err(solver_error)?;
    ctx.pop().map_err(solver_error)?;
    let out = match first {
        Response::Unsat => Side::Proved,
        Response::Unknown => Side::Undecided(undecided("on the identity")),
        Response::Sat if !functions.is_empty() => Side::Undecided(uninterpreted()),
        Response::Sat => {
            // 2. within the tolerance for all reals, or, when the solver cannot say, over
            // the box
            let mut side = Side::Undecided(undecided("on the tolerance"));
            for bound in [None, Some(options.bound)] {
                side = within(ctx, l, r, &free, bound, options)?;
                if !matches!(side, Side::Undecided(_)) {
                    break;
                }
            }
            side
        }
    };
    ctx.pop().map_err(solver_error)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::rules::load_rules;

    fn prove(text: &str) -> Proof {
        let rules = load_rules(text, "t.rules").expect("rule parses");
        prove_with_solver(
            &rules[0],
            &SmtOptions {
                timeout_ms: 5000,
                bound: 1e3,
                tolerance: 1e-4,
            },
        )
    }

    /// relu(x + c) = relu(x) + c is false; the counterexample names both variables and
    /// both sides (this test needs z3 and fails without it).
    #[test]
    fn a_false_rule_in_two_variables_gets_a_counterexample() {
        let p = prove("rule r\n  lhs (relu (add ?x ?c))\n  rhs (add (relu ?x) ?c)\n");
        let Proof::Differs { witness, relative } = &p else {
            panic!("{p:?}");
        };
        assert!(*relative > 1e-4, "{p:?}");
        for part in ["?x = ", "?c = ", "left-hand side = ", "right-hand side = "] {
            assert!(witness.contains(part), "{witness}");
        }
    }

    #[test]
    fn a_true_rule_in_two_variables_is_proved_and_absorb_is_by_definition() {
        assert_eq!(
            prove("rule r\n  lhs (max ?x ?y)\n  rhs (neg (min (neg ?x) (neg ?y)))\n"),
            Proof::Proved
        );
        assert_eq!(
            prove("rule r\n  lhs (relu ?y)\n  apply absorb ?y\n"),
            Proof::ByDefinition
        );
        // erf of different arguments: uninterpreted, so no refutation either way
        let p = prove("rule r\n  lhs (erf (mul ?x ?y))\n  rhs (erf ?x)\n");
        assert!(
            matches!(&p, Proof::NotAttempted(m) if m.contains("uninterpreted")),
            "{p:?}"
        );
    }
}
