//! Exact proofs of elementwise rules in one variable, over the reals.
//!
//! A rule whose sides are built from `add`, `sub`, `mul`, `div` by a constant, `neg`,
//! `abs`, `relu`, `leaky_relu`, `clip`, `max`, `min`, `hard_sigmoid` and `hard_swish`,
//! over one tensor variable `?x` and constants fixed by `scalar` guards, is a continuous
//! piecewise polynomial of `x` on each side. Both sides are built exactly — rational
//! coefficients (the f32 attribute and guard values taken exactly), break points where an
//! argument of a piecewise op crosses its knee — and compared piece by piece: the law holds
//! over the reals exactly when every piece's polynomials are identical. Otherwise the
//! pieces that differ give a witness `x` and both sides' values there.
//!
//! Why no SMT solver: for one variable and piecewise-linear knees the case split is
//! finite and small, so exact rational arithmetic decides it with no process, no
//! dependency and no timeout. A rule outside this fragment (two free variables, a
//! transcendental op, a knee of a quadratic argument, attributes bound to a variable, a
//! coefficient that overflows i128) is not proved: the reason is returned and the rule is
//! judged by sampling alone. A free variable declared `positive` (guard `positive`) is
//! compared over `x > 0` only: pieces at or below zero are skipped, one that straddles
//! zero is cut at it. The proof is over the reals; f32 rounding is the sampling
//! check's concern (an exact identity can still round differently in f32, by a few ulps).

use std::cmp::Ordering;

use super::lang::{Attrs, OpKind};
use super::rules::{AttrSpec, GuardArg, GuardKind, PatternExpr, Rule, RuleAction};

/// What the prover concluded about a rule.
#[derive(Clone, Debug, PartialEq)]
pub enum Proof {
    /// Every left-hand side equals the right-hand side for every real `x`.
    Proved,
    /// A left-hand side differs from the right-hand side over the reals; the witness
    /// where the relative difference was largest among the points tried.
    Differs {
        /// The witness in words: `?x = 4`, both sides' values.
        witness: String,
        /// |lhs − rhs| / max(|lhs|, |rhs|, 1) at the witness.
        relative: f64,
    },
    /// `|lhs − rhs| ≤ tolerance · max(1, |lhs|, |rhs|)` for every variable in
    /// `[-bound, bound]`, though not an identity (an attribute written as the f32 nearest
    /// an exact value): proved by the solver ([`super::smt`]).
    ProvedWithin {
        /// The relative tolerance proved.
        tolerance: f64,
        /// The box: every variable in `[-bound, bound]`.
        bound: f64,
    },
    /// Both sides agreed exactly, in rational arithmetic, at this many random points over
    /// the sampled instances ([`super::polynomial`]: Schwartz–Zippel).
    ProvedAtPoints {
        /// Instances evaluated exactly.
        points: usize,
        /// Which conv features the instances covered, in words (empty without convs).
        shapes: String,
        /// Whether `sqrt` of a computed value was an uninterpreted function (a random one,
        /// the same on both sides): the law then holds for every function in its place.
        sqrt_uninterpreted: bool,
    },
    /// An absorb rule: true by definition of the fused op (the anchor followed by its
    /// post-ops), so there is nothing to prove.
    ByDefinition,
    /// Every left-hand side applies a one-operand elementwise op to the result of a pure
    /// data movement (transpose, reshape) and the right-hand side applies the same
    /// movement to the op's result: each element of a movement's result is one element
    /// of its operand, so the op sees the same values either way, for every shape and
    /// every movement attribute.
    CommutesWithMovement,
    /// The rule is outside the fragment the prover decides.
    NotAttempted(String),
}

/// An exact rational, `n / d` with `d > 0`, reduced. Every operation is checked: an
/// overflow ends the proof attempt instead of giving a wrong answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Q {
    /// Numerator.
    pub(super) n: i128,
    /// Denominator, positive.
    pub(super) d: i128,
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.abs()
}

impl Q {
    pub(super) const ZERO: Q = Q { n: 0, d: 1 };
    pub(super) const ONE: Q = Q { n: 1, d: 1 };

    pub(super) fn new(n: i128, d: i128) -> Option<Q> {
        if d == 0 {
            return None;
        }
        let g = gcd(n, d).max(1);
        let (n, d) = (n / g, d / g);
        Some(if d < 0 {
            Q {
                n: n.checked_neg()?,
                d: d.checked_neg()?,
            }
        } else {
            Q { n, d }
        })
    }

    pub(super) fn int(n: i128) -> Q {
        Q { n, d: 1 }
    }

    /// The exact value of a finite f32.
    pub(super) fn from_f32(x: f32) -> Option<Q> {
        if !x.is_finite() {
            return None;
        }
        let bits = x.to_bits();
        let sign: i128 = if bits >> 31 == 1 { -1 } else { 1 };
        let exp = ((bits >> 23) & 0xff) as i32;
        let frac = (bits & 0x7f_ffff) as i128;
        let (mut mant, mut e) = if exp == 0 {
            (frac, -149)
        } else {
            (frac | 0x80_0000, exp - 150)
        };
        if mant == 0 {
            return Some(Q::ZERO);
        }
        // the smallest denominator: subnormals and small values fit i128 once reduced
        while mant % 2 == 0 && e < 0 {
            mant /= 2;
            e += 1;
        }
        if e >= 0 {
            Q::new(sign * mant.checked_mul(1i128.checked_shl(e as u32)?)?, 1)
        } else if -e < 126 {
            Q::new(sign * mant, 1i128 << (-e))
        } else {
            None
        }
    }

    pub(super) fn add(self, o: Q) -> Option<Q> {
        Q::new(
            self.n
                .checked_mul(o.d)?
                .checked_add(o.n.checked_mul(self.d)?)?,
            self.d.checked_mul(o.d)?,
        )
    }
    pub(super) fn neg(self) -> Q {
        Q {
            n: -self.n,
            d: self.d,
        }
    }
    pub(super) fn sub(self, o: Q) -> Option<Q> {
        self.add(o.neg())
    }
    pub(super) fn mul(self, o: Q) -> Option<Q> {
        Q::new(self.n.checked_mul(o.n)?, self.d.checked_mul(o.d)?)
    }
    pub(super) fn div(self, o: Q) -> Option<Q> {
        Q::new(self.n.checked_mul(o.d)?, self.d.checked_mul(o.n)?)
    }
    fn cmp(self, o: Q) -> Option<Ordering> {
        Some(self.n.checked_mul(o.d)?.cmp(&o.n.checked_mul(self.d)?))
    }
    pub(super) fn to_f64(self) -> f64 {
        self.n as f64 / self.d as f64
    }
}

/// A polynomial in `x`, coefficients from the constant term up, no trailing zeros.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Poly(Vec<Q>);

impl Poly {
    fn constant(c: Q) -> Poly {
        Poly(vec![c]).trim()
    }
    fn trim(mut self) -> Poly {
        while self.0.last() == Some(&Q::ZERO) {
            self.0.pop();
        }
        self
    }
    fn degree(&self) -> usize {
        self.0.len().saturating_sub(1)
    }
    fn coef(&self, i: usize) -> Q {
        self.0.get(i).copied().unwrap_or(Q::ZERO)
    }
    fn add(&self, o: &Poly) -> Option<Poly> {
        let n = self.0.len().max(o.0.len());
        (0..n)
            .map(|i| self.coef(i).add(o.coef(i)))
            .collect::<Option<Vec<Q>>>()
            .map(|c| Poly(c).trim())
    }
    fn neg(&self) -> Poly {
        Poly(self.0.iter().map(|c| c.neg()).collect())
    }
    fn mul(&self, o: &Poly) -> Option<Poly> {
        if self.0.is_empty() || o.0.is_empty() {
            return Some(Poly(Vec::new()));
        }
        // the fragment needs degree 2 at most (hard_swish); more only grows coefficients
        if self.degree() + o.degree() > 4 {
            return None;
        }
        let mut out = vec![Q::ZERO; self.0.len() + o.0.len() - 1];
        for (i, a) in self.0.iter().enumerate() {
            for (j, b) in o.0.iter().enumerate() {
                out[i + j] = out[i + j].add(a.mul(*b)?)?;
            }
        }
        Some(Poly(out).trim())
    }
    fn eval(&self, x: Q) -> Option<Q> {
        let mut acc = Q::ZERO;
        for c in self.0.iter().rev() {
            acc = acc.mul(x)?.add(*c)?;
        }
        Some(acc)
    }
}

/// A continuous piecewise polynomial: `polys[i]` on the i-th interval between sorted
/// `breaks` (`polys.len() == breaks.len() + 1`).
#[derive(Clone, Debug)]
struct Pw {
    breaks: Vec<Q>,
    polys: Vec<Poly>,
}

/// A rational point inside interval `i` of `breaks`.
fn interior(breaks: &[Q], i: usize) -> Option<Q> {
    interior_of(i.checked_sub(1).map(|k| breaks[k]), breaks.get(i).copied())
}

/// A point inside the interval `(lo, hi)` (an absent end is unbounded).
fn interior_of(lo: Option<Q>, hi: Option<Q>) -> Option<Q> {
    match (lo, hi) {
        (None, None) => Some(Q::ZERO),
        (None, Some(b)) => b.sub(Q::ONE),
        (Some(a), None) => a.add(Q::ONE),
        (Some(a), Some(b)) => a.add(b)?.div(Q::int(2)),
    }
}

impl Pw {
    fn poly(p: Poly) -> Pw {
        Pw {
            breaks: Vec::new(),
            polys: vec![p],
        }
    }

    /// The index of the interval containing point `x` (not a break point).
    fn piece_at(&self, x: Q) -> Option<usize> {
        let mut i = 0;
        for b in &self.breaks {
            if b.cmp(x)? == Ordering::Less {
                i += 1;
            }
        }
        Some(i)
    }

    /// Both on the union of their break points.
    fn refine(a: &Pw, b: &Pw) -> Option<(Vec<Q>, Vec<Poly>, Vec<Poly>)> {
        let mut breaks: Vec<Q> = a.breaks.iter().chain(&b.breaks).copied().collect();
        let mut err = false;
        breaks.sort_by(|x, y| {
            x.cmp(*y).unwrap_or_else(|| {
                err = true;
                Ordering::Equal
            })
        });
        breaks.dedup();
        if err {
            return None;
        }
        let (mut pa, mut pb) = (Vec::new(), Vec::new());
        for i in 0..=breaks.len() {
            let x = interior(&breaks, i)?;
            pa.push(a.polys[a.piece_at(x)?].clone());
            pb.push(b.polys[b.piece_at(x)?].clone());
        }
        Some((breaks, pa, pb))
    }

    fn zip(a: &Pw, b: &Pw, f: impl Fn(&Poly, &Poly) -> Option<Poly>) -> Option<Pw> {
        let (breaks, pa, pb) = Pw::refine(a, b)?;
        let polys = pa
            .iter()
            .zip(&pb)
            .map(|(x, y)| f(x, y))
            .collect::<Option<Vec<Poly>>>()?;
        Some(Pw { breaks, polys }.merged())
    }

    /// Adjacent equal pieces joined (the function is continuous, so the break is moot).
    fn merged(self) -> Pw {
        let mut breaks = Vec::new();
        let mut polys: Vec<Poly> = Vec::new();
        for (i, p) in self.polys.into_iter().enumerate() {
            if polys.last() == Some(&p) {
                continue;
            }
            if i > 0 {
                breaks.push(self.breaks[i - 1]);
            }
            polys.push(p);
        }
        Pw { breaks, polys }
    }

    /// `pos` where `d >= 0`, `neg` where `d < 0` (continuous when `pos = neg` where
    /// `d = 0`, as for max, min and the knees of the ops here). `None` where a knee of a
    /// non-linear argument would need an irrational break point.
    fn select(d: &Pw, pos: &Pw, neg: &Pw) -> Option<Pw> {
        let (b1, pd, pp) = Pw::refine(d, pos)?;
        let dd = Pw {
            breaks: b1.clone(),
            polys: pd,
        };
        let pp = Pw {
            breaks: b1,
            polys: pp,
        };
        let (breaks, pd, pn) = Pw::refine(&dd, neg)?;
        let pp: Vec<Poly> = (0..=breaks.len())
            .map(|i| Some(pp.polys[pp.piece_at(interior(&breaks, i)?)?].clone()))
            .collect::<Option<_>>()?;
        let mut out_breaks = Vec::new();
        let mut out_polys = Vec::new();
        for i in 0..=breaks.len() {
            let lo = i.checked_sub(1).map(|k| breaks[k]);
            let hi = breaks.get(i).copied();
            let dp = &pd[i];
            // the root of a linear d inside the interval splits it
            let mut cuts = Vec::new();
            match dp.degree() {
                0 => {}
                1 => {
                    let r = dp.coef(0).neg().div(dp.coef(1))?;
                    let above = lo.map_or(Some(true), |l| Some(r.cmp(l)? == Ordering::Greater));
                    let below = hi.map_or(Some(true), |h| Some(r.cmp(h)? == Ordering::Less));
                    if above? && below? {
                        cuts.push(r);
                    }
                }
                _ => return None,
            }
            let mut sub_breaks: Vec<Q> = lo.into_iter().collect();
            sub_breaks.extend(&cuts);
            sub_breaks.extend(hi);
            let first = usize::from(lo.is_some());
            for k in 0..=cuts.len() {
                // a point inside the k-th sub-interval of (lo, hi)
                let x = interior(&sub_breaks, first + k)?;
                let take = if dp.eval(x)?.cmp(Q::ZERO)? != Ordering::Less {
                    &pp[i]
                } else {
                    &pn[i]
                };
                if k > 0 {
                    out_breaks.push(cuts[k - 1]);
                }
                out_polys.push(take.clone());
            }
            if let Some(h) = hi {
                out_breaks.push(h);
            }
        }
        Some(
            Pw {
                breaks: out_breaks,
                polys: out_polys,
            }
            .merged(),
        )
    }

    fn constant_value(&self) -> Option<Q> {
        match self.polys.as_slice() {
            [p] if p.degree() == 0 => Some(p.coef(0)),
            _ => None,
        }
    }
}

fn konst(c: Q) -> Pw {
    Pw::poly(Poly::constant(c))
}

fn add(a: &Pw, b: &Pw) -> Option<Pw> {
    Pw::zip(a, b, |x, y| x.add(y))
}
fn sub(a: &Pw, b: &Pw) -> Option<Pw> {
    Pw::zip(a, b, |x, y| x.add(&y.neg()))
}
fn mul(a: &Pw, b: &Pw) -> Option<Pw> {
    Pw::zip(a, b, |x, y| x.mul(y))
}
fn max(a: &Pw, b: &Pw) -> Option<Pw> {
    Pw::select(&sub(a, b)?, a, b)
}
fn min(a: &Pw, b: &Pw) -> Option<Pw> {
    Pw::select(&sub(a, b)?, b, a)
}
fn clip(a: &Pw, lo: Q, hi: Q) -> Option<Pw> {
    min(&max(a, &konst(lo))?, &konst(hi))
}

/// The rule's one free variable and the exact values of its `scalar`-guarded constants.
struct Env {
    free: Option<String>,
    scalars: Vec<(String, Q)>,
}

fn encode(p: &PatternExpr, env: &Env) -> Result<Pw, String> {
    const OVERFLOW: &str = "a coefficient overflows exact 128-bit arithmetic";
    let ovf = || OVERFLOW.to_string();
    match p {
        PatternExpr::Var(v) => {
            if let Some((_, q)) = env.scalars.iter().find(|(n, _)| n == v) {
                return Ok(konst(*q));
            }
            if env.free.as_deref() == Some(v.as_str()) {
                return Ok(Pw::poly(Poly(vec![Q::ZERO, Q::ONE])));
            }
            Err(format!("{v} is neither the free variable nor a scalar"))
        }
        PatternExpr::Op {
            kind,
            attrs,
            children,
        } => {
            let args = children
                .iter()
                .map(|c| encode(c, env))
                .collect::<Result<Vec<Pw>, String>>()?;
            let lit = match attrs {
                AttrSpec::Literal(a) => Some(a),
                AttrSpec::Any | AttrSpec::Var(_) | AttrSpec::Template { .. } => None,
            };
            let f = |x: f32| Q::from_f32(x).ok_or_else(ovf);
            let a = &args;
            let out = match (kind, lit) {
                (OpKind::Add, _) => add(&a[0], &a[1]),
                (OpKind::Sub, _) => sub(&a[0], &a[1]),
                (OpKind::Mul, _) => mul(&a[0], &a[1]),
                (OpKind::Div, _) => match a[1].constant_value() {
                    Some(c) if c != Q::ZERO => mul(&a[0], &konst(Q::ONE.div(c).ok_or_else(ovf)?)),
                    _ => return Err("a divisor is not a nonzero constant".into()),
                },
                (OpKind::Neg, _) => {
                    Some(Pw::zip(&a[0], &a[0], |x, _| Some(x.neg())).ok_or_else(ovf)?)
                }
                (OpKind::Abs, _) => {
                    let n = Pw::zip(&a[0], &a[0], |x, _| Some(x.neg())).ok_or_else(ovf)?;
                    Pw::select(&a[0], &a[0], &n)
                }
                (OpKind::Relu, _) => max(&a[0], &konst(Q::ZERO)),
                (OpKind::Max, _) => max(&a[0], &a[1]),
                (OpKind::Min, _) => min(&a[0], &a[1]),
                (OpKind::Clip, Some(Attrs::Clip { min, max })) => clip(&a[0], f(min.0)?, f(max.0)?),
                (OpKind::LeakyRelu, Some(Attrs::Alpha(alpha))) => {
                    let scaled = mul(&a[0], &konst(f(alpha.0)?)).ok_or_else(ovf)?;
                    Pw::select(&a[0], &a[0], &scaled)
                }
                (OpKind::HardSigmoid, Some(Attrs::HardSigmoid { alpha, beta })) => {
                    let lin = mul(&a[0], &konst(f(alpha.0)?))
                        .and_then(|l| add(&l, &konst(f(beta.0).ok()?)))
                        .ok_or_else(ovf)?;
                    clip(&lin, Q::ZERO, Q::ONE)
                }
                (OpKind::HardSwish, _) => {
                    // x * clip(x / 6 + 1/2, 0, 1), the interpreter's definition
                    let sixth = Q::new(1, 6).ok_or_else(ovf)?;
                    let half = Q::new(1, 2).ok_or_else(ovf)?;
                    let lin = mul(&a[0], &konst(sixth))
                        .and_then(|l| add(&l, &konst(half)))
                        .ok_or_else(ovf)?;
                    clip(&lin, Q::ZERO, Q::ONE).and_then(|h| mul(&a[0], &h))
                }
                (k, _) if lit.is_none() && kind.default_attrs().is_none() => {
                    return Err(format!("'{}' has attributes bound to a variable", k.name()))
                }
                (k, _) => return Err(format!("'{}' has no exact encoding", k.name())),
            };
            out.ok_or_else(|| {
                "a knee of a non-linear argument, or a coefficient overflow".to_string()
            })
        }
    }
}

/// A value in words: the shortest f32 text, in exponent form when tiny or huge.
fn num(x: f64) -> String {
    let f = x as f32;
    if f != 0.0 && (f.abs() < 1e-4 || f.abs() >= 1e7) {
        format!("{f:e}")
    } else {
        format!("{f}")
    }
}

/// The value each `scalar` guard pins its variable to, exactly (the model's constant is
/// within the guard's tolerance of it; a proof is for the f32 the checker builds, the
/// value itself); both provers start from these.
pub(super) fn scalar_guard_values(rule: &Rule) -> Result<Vec<(String, Q)>, Proof> {
    let mut scalars = Vec::new();
    for g in &rule.guards {
        if g.kind != GuardKind::Scalar {
            continue;
        }
        if let (Some(GuardArg::Var(v)), Some(GuardArg::Number(n))) = (g.args.first(), g.args.get(1))
        {
            match Q::from_f32(*n as f32) {
                Some(q) => scalars.push((v.clone(), q)),
                None => return Err(Proof::NotAttempted(format!("{v}'s value is not exact"))),
            }
        }
    }
    Ok(scalars)
}

/// Whether `lhs` is `(f (m[a] ?x))` and `rhs` is `(m[a] (f ?x))` for a one-operand
/// elementwise `f` (with the same attributes on both sides) and a pure data movement `m`
/// (transpose, reshape) with the same attributes.
fn commutes_with_movement(lhs: &PatternExpr, rhs: &PatternExpr) -> bool {
    let PatternExpr::Op {
        kind: f,
        attrs: f_attrs,
        children: f_operands,
    } = lhs
    else {
        return false;
    };
    let [PatternExpr::Op {
        kind: m,
        attrs: m_attrs,
        children: m_operands,
    }] = &f_operands[..]
    else {
        return false;
    };
    let [x @ PatternExpr::Var(_)] = &m_operands[..] else {
        return false;
    };
    let moved = PatternExpr::Op {
        kind: *m,
        attrs: m_attrs.clone(),
        children: vec![PatternExpr::Op {
            kind: *f,
            attrs: f_attrs.clone(),
            children: vec![x.clone()],
        }],
    };
    super::rules::elementwise_kind(*f)
        && matches!(m, OpKind::Transpose | OpKind::Reshape)
        && *rhs == moved
}

/// Tries to prove `rule` exactly over the reals (see the module docs).
pub fn prove_rule(rule: &Rule) -> Proof {
    let RuleAction::Rewrite(rhs) = &rule.action else {
        return Proof::ByDefinition;
    };
    if rule.lhs.iter().all(|lhs| commutes_with_movement(lhs, rhs)) {
        return Proof::CommutesWithMovement;
    }
    let scalars = match scalar_guard_values(rule) {
        Ok(s) => s,
        Err(p) => return p,
    };
    let mut worst: Option<(f64, String)> = None;
    for lhs in &rule.lhs {
        let free: Vec<String> = lhs
            .vars()
            .into_iter()
            .filter(|v| !scalars.iter().any(|(s, _)| s == v))
            .collect();
        if free.len() > 1 {
            return Proof::NotAttempted(format!(
                "more than one free variable ({})",
                free.join(", ")
            ));
        }
        // a `positive` free variable: the law is claimed for x > 0 only
        let positive = free
            .first()
            .is_some_and(|v| rule.positive_vars().contains(v));
        let env = Env {
            free: free.first().cloned(),
            scalars: scalars.clone(),
        };
        let (l, r) = match (encode(lhs, &env), encode(rhs, &env)) {
            (Ok(l), Ok(r)) => (l, r),
            (Err(m), _) | (_, Err(m)) => return Proof::NotAttempted(m),
        };
        let Some((breaks, pl, pr)) = Pw::refine(&l, &r) else {
            return Proof::NotAttempted("a coefficient overflows exact arithmetic".into());
        };
        for i in 0..=breaks.len() {
            if pl[i] == pr[i] {
                continue;
            }
            let mut lo = i.checked_sub(1).map(|j| breaks[j]);
            let hi = breaks.get(i).copied();
            if positive {
                // only the part of the piece where x > 0 is claimed
                let at_or_below_zero = |q: Q| q.cmp(Q::ZERO) != Some(Ordering::Greater);
                if hi.is_some_and(at_or_below_zero) {
                    continue;
                }
                if lo.is_none_or(at_or_below_zero) {
                    lo = Some(Q::ZERO);
                }
            }
            // polynomials of degree <= 4 that differ agree at 4 points at most: try
            // several points of the piece and keep the worst
            let Some(mid) = interior_of(lo, hi) else {
                return Proof::NotAttempted("a coefficient overflows exact arithmetic".into());
            };
            let mut points = vec![mid];
            for k in 1..=4 {
                let step = Q::new(k, 7).unwrap_or(Q::ONE);
                let p = match (lo, hi) {
                    (Some(a), Some(b)) => b.sub(a).and_then(|w| w.mul(step)).and_then(|d| a.add(d)),
                    (None, Some(b)) => b.sub(Q::int(k * 1000)),
                    (Some(a), None) => a.add(Q::int(k * 1000)),
                    (None, None) => Some(Q::int(k * 1000)),
                };
                points.extend(p);
            }
            for x in points {
                let (Some(a), Some(b)) = (pl[i].eval(x), pr[i].eval(x)) else {
                    continue;
                };
                let (a, b) = (a.to_f64(), b.to_f64());
                // relative to the values' size, absolute below 1: near a zero crossing a
                // rounding-sized difference is no refutation (as FACTS.md's relative
                // error over a whole tensor is not)
                let rel = (a - b).abs() / a.abs().max(b.abs()).max(1.0);
                if worst.as_ref().is_none_or(|(w, _)| rel > *w) {
                    let name = env.free.as_deref().unwrap_or("x");
                    worst = Some((
                        rel,
                        format!(
                            "{name} = {}: left-hand side = {}, right-hand side = {}",
                            num(x.to_f64()),
                            num(a),
                            num(b)
                        ),
                    ));
                }
            }
        }
    }
    match worst {
        None => Proof::Proved,
        Some((relative, witness)) => Proof::Differs { witness, relative },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::rules::load_rules;

    fn prove(text: &str) -> Proof {
        prove_rule(&load_rules(text, "t.rules").unwrap()[0])
    }

    #[test]
    fn relu6_spelled_with_min_and_max_is_proved() {
        let p = prove(
            "rule r\n  lhs (min (max ?x ?lo) ?hi)\n  lhs (max (min ?x ?hi) ?lo)\n  \
             rhs (clip[min=0, max=6] ?x)\n  guard scalar ?lo 0\n  guard scalar ?hi 6\n",
        );
        assert_eq!(p, Proof::Proved);
    }

    #[test]
    fn hard_swish_without_its_clip_differs_past_three() {
        let p = prove(
            "rule r\n  lhs (div (mul ?x (add ?x ?three)) ?six)\n  rhs (hard_swish ?x)\n  \
             guard scalar ?three 3\n  guard scalar ?six 6\n",
        );
        let Proof::Differs { witness, relative } = p else {
            panic!("{p:?}")
        };
        assert!(relative > 0.1, "{witness} {relative}");
        // the witness is outside [-3, 3], where the two sides differ
        let x: f64 = witness
            .split_once(" = ")
            .and_then(|(_, r)| r.split(':').next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!(x.abs() > 3.0, "{witness}");
    }

    #[test]
    fn hard_swish_as_x_times_hard_sigmoid_is_exact_only_with_alpha_one_sixth() {
        // 0.16666667 is an f32, not 1/6: not an identity over the reals, but close
        let p = prove(
            "rule r\n  lhs (mul ?x (hard_sigmoid[alpha=0.16666667, beta=0.5] ?x))\n  \
             rhs (hard_swish ?x)\n",
        );
        assert!(
            matches!(p, Proof::Differs { relative, .. } if relative < 1e-6),
            "{p:?}"
        );
        // relu(x) = max(x, 0) = x - min(x, 0), and leaky_relu with slope 0 is relu
        assert_eq!(
            prove("rule r\n  lhs (sub ?x (min ?x ?z))\n  rhs (relu ?x)\n  guard scalar ?z 0\n"),
            Proof::Proved
        );
        assert_eq!(
            prove("rule r\n  lhs (leaky_relu[alpha=0] ?x)\n  rhs (relu ?x)\n"),
            Proof::Proved
        );
    }

    #[test]
    fn outside_the_fragment_nothing_is_claimed() {
        for (text, why) in [
            (
                "rule r\n  lhs (relu (add ?a ?b))\n  rhs (add (relu ?a) (relu ?b))\n",
                "free",
            ),
            (
                "rule r\n  lhs (mul ?x (sigmoid ?x))\n  rhs (silu ?x)\n",
                "sigmoid",
            ),
        ] {
            let p = prove(text);
            assert!(
                matches!(&p, Proof::NotAttempted(m) if m.contains(why)),
                "{text}: {p:?}"
            );
        }
        // an elementwise op moved across a transpose or reshape, the same attributes on
        // both sides; a different movement attribute or a two-operand op is not that law
        assert_eq!(
            prove(
                "rule r\n  lhs (sigmoid (transpose[?p] ?x))\n  rhs (transpose[?p] (sigmoid ?x))\n"
            ),
            Proof::CommutesWithMovement
        );
        assert_ne!(
            prove("rule r\n  lhs (sigmoid (transpose[?p] ?x))\n  rhs (transpose[perm=[1, 0]] (sigmoid ?x))\n"),
            Proof::CommutesWithMovement
        );
        assert_ne!(
            prove("rule r\n  lhs (sigmoid (slice[?p] ?x))\n  rhs (slice[?p] (sigmoid ?x))\n"),
            Proof::CommutesWithMovement
        );
        // an absorb rule is true by definition of the fused op: nothing is proved
        assert_eq!(
            prove("rule r\n  lhs (relu ?y)\n  apply absorb ?y\n"),
            Proof::ByDefinition
        );
    }
}
