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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use egg::{Id, Language, Runner, SimpleScheduler};
use smelt_ir::graph::{Func, FuncResult, Inst, Module, Param, Value};
use smelt_ir::op::{Conv2dAttrs, GemmAttrs, Op, Pool2dAttrs};
use smelt_ir::types::{TensorType, F32};
use smelt_ir::weights::{random_f32, AlignedBuf, WeightOrigin};
use smelt_ir::{interp, Diagnostic, ErrorStats, Location, Tensor};

use super::analysis::{FusionAnalysis, Outcome};
use super::apply::{compile_rules, GuardContext};
use super::extract::CostTable;
use super::lang::{join_op, Attrs, OpKind, TensorNode};
use super::rules::{AttrSpec, GuardArg, GuardKind, PatternExpr, Rule, RuleAction};
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
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            seed: 0x5eed,
            instances: 8,
            attempts: 400,
            tolerance: 1e-4,
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
}

impl RuleCheck {
    /// One line: verdict, rule, instances, errors, detail.
    pub fn to_text(&self) -> String {
        let verdict = match self.verdict {
            Verdict::Sound => "ok",
            Verdict::Unsound => "UNSOUND",
            Verdict::Untested => "untested",
        };
        let mut line = format!(
            "{verdict:<8} {}: {} instances, max abs error {:.3e}, relative {:.3e}",
            self.rule, self.instances, self.max_abs, self.relative
        );
        if !self.detail.is_empty() {
            line.push_str(&format!(" ({})", self.detail));
        }
        line
    }
}

/// Checks every rule numerically (see the module docs).
pub fn check_rules(rules: &[Rule], options: &CheckOptions) -> Vec<RuleCheck> {
    rules.iter().map(|r| check_rule(r, options)).collect()
}

/// Checks one rule numerically.
pub fn check_rule(rule: &Rule, options: &CheckOptions) -> RuleCheck {
    let mut out = RuleCheck {
        rule: rule.name.clone(),
        verdict: Verdict::Sound,
        instances: 0,
        max_abs: 0.0,
        relative: 0.0,
        detail: String::new(),
    };
    let mut worst = -1.0f64;
    for (alt, lhs) in rule.lhs.iter().enumerate() {
        let mut found = 0;
        for attempt in 0..options.attempts {
            if found >= options.instances {
                break;
            }
            let seed = options
                .seed
                .wrapping_add((alt as u64) << 32)
                .wrapping_add(attempt as u64 * 0x9e37_79b9);
            let Some(instance) = Instance::sample(rule, lhs, seed) else {
                continue;
            };
            match compare(rule, &instance, seed) {
                Comparison::NotApplicable => {}
                Comparison::Failed(message) => {
                    out.verdict = Verdict::Unsound;
                    out.detail = format!("{}: {message}", instance.describe());
                    out.instances += 1;
                    return out;
                }
                Comparison::Compared(stats) => {
                    found += 1;
                    out.instances += 1;
                    out.max_abs = out.max_abs.max(stats.max_abs);
                    if stats.relative > worst || stats.relative.is_nan() {
                        worst = stats.relative;
                        out.relative = stats.relative;
                        let what = instance.describe();
                        out.detail = if what.is_empty() {
                            String::new()
                        } else {
                            format!("worst on {what}")
                        };
                    }
                    if stats.relative.is_nan() || stats.relative > options.tolerance {
                        out.verdict = Verdict::Unsound;
                        out.detail = format!(
                            "{} differs: relative error {:.3e} > {:.1e}",
                            instance.describe(),
                            stats.relative,
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
                "no instance of left-hand side {} satisfied the types and guards in {} attempts",
                alt + 1,
                options.attempts
            );
            return out;
        }
    }
    out
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
                GuardKind::SingleConsumer
                | GuardKind::Rank
                | GuardKind::Unpadded
                | GuardKind::NotAfter => {}
            }
        }
        let mut planner = Planner {
            rng,
            dims,
            constants,
            per_channel,
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
    /// constant, weights for those that are, then the left-hand side's ops.
    fn module(&self, seed: u64) -> Option<(Module, Value)> {
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
                        Values::Any => random_f32(seed ^ ((i as u64 + 1) * 7919), len, -1.0, 1.0),
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
        let root = self.emit_pattern(&self.lhs, &mut func, &module, &values)?;
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
                let ty = self.shape_for(v, role);
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
                let op = join_op(*kind, &attrs)?;
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
            other => other.default_attrs()?,
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
    /// The rule did not fire on the instance (a guard refused, or no match).
    NotApplicable,
    /// Both sides ran; the worst error over the right-hand sides.
    Compared(ErrorStats),
    /// The right-hand side could not be built or evaluated.
    Failed(String),
}

fn compare(rule: &Rule, instance: &Instance, seed: u64) -> Comparison {
    let Some((module, root)) = instance.module(seed) else {
        return Comparison::NotApplicable;
    };
    let func = &module.funcs[0];
    let inputs: Vec<Tensor> = func
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| Tensor {
            ty: p.ty.clone(),
            data: random_f32(
                seed.wrapping_add(101 + i as u64),
                p.ty.storage_len(),
                -1.0,
                1.0,
            )
            .into(),
        })
        .collect();
    let Ok(want) = interp::run(&module, func, &inputs) else {
        return Comparison::NotApplicable;
    };
    let Ok(Built {
        mut egraph,
        value_class,
        original,
    }) = build(func, &module.weights)
    else {
        return Comparison::NotApplicable;
    };
    let uses = func.uses();
    let context = Arc::new(GuardContext {
        values: value_class
            .iter()
            .enumerate()
            .map(|(v, id)| (*id, uses.get(v).map_or(0, |u| u.len())))
            .collect(),
        small_weights: module
            .weights
            .iter()
            .map(|(_, w)| (w.ty.num_elements() <= 16).then(|| w.f32s().to_vec()))
            .collect(),
        labels: Vec::new(),
    });
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
    let fired: BTreeSet<TensorNode> = egraph
        .analysis
        .events
        .iter()
        .filter(|e| egraph.find(e.class) == root_class)
        .filter_map(|e| match &e.outcome {
            Outcome::Fired(n) => Some(n.clone().map_children(|c| egraph.find(c))),
            Outcome::Refused { .. } => None,
        })
        .collect();
    if fired.is_empty() {
        return Comparison::NotApplicable;
    }
    let table = CostTable::new(&egraph, &CostModel::default());
    let inputs_nodes = input_nodes(&egraph, func, &value_class, &original);
    let mut worst: Option<ErrorStats> = None;
    for node in fired {
        let full: BTreeMap<Id, TensorNode> = BTreeMap::from([(root_class, node)]);
        let Some(chosen) = choose_with_forced(
            &egraph,
            &table,
            &full,
            &inputs_nodes,
            &[root_class],
            &BTreeSet::new(),
        ) else {
            return Comparison::Failed("the right-hand side makes the graph cyclic".into());
        };
        let rhs = match emit(func, &egraph, &chosen, &[root_class]) {
            Ok((f, _, _)) => f,
            Err(e) => return Comparison::Failed(format!("the right-hand side is invalid: {e}")),
        };
        let rhs_module = Module {
            weights: module.weights.clone(),
            funcs: vec![rhs],
        };
        let got = match interp::run(&rhs_module, &rhs_module.funcs[0], &inputs) {
            Ok(g) => g,
            Err(d) => {
                return Comparison::Failed(format!("the right-hand side does not run: {}", msg(&d)))
            }
        };
        let stats = match ErrorStats::between_tensors(&got[0], &want[0]) {
            Ok(s) => s,
            Err(m) => return Comparison::Failed(m),
        };
        if worst.is_none_or(|w| stats.relative.is_nan() || stats.relative > w.relative) {
            worst = Some(stats);
        }
    }
    worst.map_or(Comparison::NotApplicable, Comparison::Compared)
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
