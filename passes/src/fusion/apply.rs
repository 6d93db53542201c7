//! Turning rules into egg rewrites: pattern compilation, guards, and the appliers that
//! record provenance and every match's outcome.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};

use egg::{
    Applier, ENodeOrVar, Id, Language, Pattern, PatternAst, RecExpr, Rewrite, Subst, Symbol, Var,
};
use smelt_ir::op::{broadcast, FusedOp, Op};
use smelt_ir::types::{DType, Layout, TensorType};
use smelt_ir::weights::{AlignedBuf, WeightStore};

use super::analysis::{
    FusionAnalysis, FusionGraph, InputFacts, Outcome, Provenance, RuleCounts, RuleEvent, RuleName,
};
use super::attr_match::{compare, has_float_fields, AttrMatch};
use super::lang::{join_op, split_op, AttrTable, Attrs, OpKind, TensorNode};
use super::rules::{
    fill_template, parse_literal_attrs, post_op_of, AttrSpec, GuardArg, GuardKind, PatternExpr,
    Rule, RuleAction,
};

/// Facts about the input function that guards need and the e-graph does not carry.
#[derive(Debug, Default)]
pub struct GuardContext {
    /// For each input value: its e-class at build time and its consumer count.
    pub values: Vec<(Id, usize)>,
    /// For each input value: how the user names it in guard reasons (`%x` for a
    /// parameter, `@w` for a weight, the op's location otherwise; empty when unknown).
    pub labels: Vec<String>,
    /// The f32 weights' data by weight id (`None` for other element types), read only
    /// when a value guard (`scalar`) asks about that weight.
    weights: Vec<Option<Arc<AlignedBuf>>>,
    /// Each weight's splat value (`Some(v)` when every element is `v`), computed on the
    /// first ask: one scan of that weight, stopping at the first element that differs,
    /// so a guard costs at most one pass over the constants it names, whatever their size.
    splats: Vec<OnceLock<Option<f32>>>,
    /// Whether each weight's every element is a number > 0, computed on the first ask
    /// (one scan, stopping at the first element that is not).
    positives: Vec<OnceLock<bool>>,
}

impl GuardContext {
    /// The context of one compilation: `values` and `labels` as the fields say, and the
    /// weights the value guards may read (shared, not copied).
    pub fn new(values: Vec<(Id, usize)>, weights: &WeightStore, labels: Vec<String>) -> Self {
        let weights: Vec<Option<Arc<AlignedBuf>>> = weights
            .iter()
            .map(|(_, w)| (w.ty.dtype == DType::F32).then(|| Arc::clone(&w.data)))
            .collect();
        let splats = weights.iter().map(|_| OnceLock::new()).collect();
        let positives = weights.iter().map(|_| OnceLock::new()).collect();
        GuardContext {
            values,
            labels,
            weights,
            splats,
            positives,
        }
    }

    /// Whether f32 weight `w` is non-empty and its every element a number > 0 (NaN is
    /// not; +inf is).
    fn all_positive(&self, w: usize) -> bool {
        let (Some(Some(data)), Some(cell)) = (self.weights.get(w), self.positives.get(w)) else {
            return false;
        };
        *cell.get_or_init(|| {
            let values = data.as_f32();
            !values.is_empty() && values.iter().all(|x| *x > 0.0)
        })
    }

    /// The value every element of f32 weight `w` equals, if there is one (an empty
    /// weight has none).
    fn splat(&self, w: usize) -> Option<f32> {
        let data = self.weights.get(w)?.as_ref()?;
        *self.splats.get(w)?.get_or_init(|| {
            let values = data.as_f32();
            let first = *values.first()?;
            // bit equality: a NaN splat is no number, and -0.0 equals 0.0 below anyway
            values
                .iter()
                .all(|x| x.to_bits() == first.to_bits() || *x == first)
                .then_some(first)
        })
    }

    /// Writes each input value's consumer count and label into its class's
    /// [`InputFacts`], so [`GuardContext::consumers`] and [`GuardContext::describe`]
    /// read them in constant time: the analysis keeps them through every union (a scan
    /// of every value per guard message made a long chain of ops quadratic). Called
    /// once on the freshly built e-graph, before saturation.
    pub fn annotate(&self, egraph: &mut FusionGraph) {
        for (index, (id, consumers)) in self.values.iter().enumerate() {
            let named = self.labels.get(index).is_some_and(|l| !l.is_empty());
            let facts = InputFacts {
                consumers: Some(*consumers),
                label: named.then_some(index),
                span: Some((index, index)),
            };
            let class = egraph.find(*id);
            let data = &mut egraph[class].data;
            data.inputs = data.inputs.union(facts);
        }
    }

    /// Consumers of the values in `class` (the largest count among the input values in it;
    /// `None` when no input value is in it).
    fn consumers(&self, egraph: &FusionGraph, class: Id) -> Option<usize> {
        egraph[class].data.inputs.consumers
    }

    /// The user's name of the earliest input value in `class`, if it has one.
    fn label(&self, egraph: &FusionGraph, class: Id) -> Option<&str> {
        let index = egraph[class].data.inputs.label?;
        self.labels.get(index).map(String::as_str)
    }

    /// A short description of a class for guard reasons: its op, the user's name of the
    /// value (when the input has it) and its type, e.g. `conv2d "conv3" tensor<...>`.
    pub fn describe(&self, egraph: &FusionGraph, class: Id) -> String {
        let data = &egraph[class].data;
        let what = egraph[class]
            .nodes
            .first()
            .map(|n| match n {
                TensorNode::Op(k, _) => k.name().to_string(),
                TensorNode::Param(_) => "parameter".to_string(),
                TensorNode::Weight(_) => "const".to_string(),
                TensorNode::Attr(_) => "attributes".to_string(),
            })
            .unwrap_or_default();
        let mut out = what;
        if let Some(label) = self.label(egraph, class) {
            out.push(' ');
            out.push_str(label);
        }
        if let Some(t) = &data.ty {
            out.push(' ');
            out.push_str(&t.to_string());
        }
        out
    }
}

fn var(name: &str) -> Var {
    // Names were validated by the rule loader (`?` followed by word characters).
    name.parse().expect("validated variable name")
}

/// A written-out attribute payload with float fields on a left-hand side: compiled as a
/// fresh variable the applier compares with the literal within a tolerance
/// ([`attr_match`](super::attr_match)), since an exact pattern would silently miss a
/// model whose exporter rounded the same constant differently.
#[derive(Debug)]
struct LiteralAttrs {
    var: Var,
    kind: OpKind,
    attrs: Attrs,
}

/// Attributes of a right-hand side with values from matched constants
/// (`layer_norm[axis=2, epsilon=?eps]`): compiled as a fresh variable that the applier
/// binds, each time the rule fires, to the payload the text reads as once each hole is
/// its constant's value.
#[derive(Debug)]
struct TemplateAttrs {
    var: Var,
    kind: OpKind,
    text: String,
    holes: Vec<Var>,
}

/// Compiles a pattern to an egg pattern AST, interning literal attributes. With
/// `literals` (a left-hand side), literals with float fields become variables listed
/// there instead; attribute templates (right-hand sides) become variables listed in
/// `templates`.
fn compile_pattern(
    p: &PatternExpr,
    attrs: &mut AttrTable,
    fresh: &mut usize,
    out: &mut PatternAst<TensorNode>,
    literals: &mut Option<&mut Vec<LiteralAttrs>>,
    templates: &mut Vec<TemplateAttrs>,
) -> Id {
    match p {
        PatternExpr::Var(v) => out.add(ENodeOrVar::Var(var(v))),
        PatternExpr::Op {
            kind,
            attrs: spec,
            children,
        } => {
            let attr_id = match spec {
                AttrSpec::Any => {
                    *fresh += 1;
                    out.add(ENodeOrVar::Var(var(&format!("?__attrs{fresh}"))))
                }
                AttrSpec::Var(v) => out.add(ENodeOrVar::Var(var(v))),
                AttrSpec::Template { text, holes } => {
                    *fresh += 1;
                    let v = var(&format!("?__template{fresh}"));
                    templates.push(TemplateAttrs {
                        var: v,
                        kind: *kind,
                        text: text.clone(),
                        holes: holes.iter().map(|h| var(h)).collect(),
                    });
                    out.add(ENodeOrVar::Var(v))
                }
                AttrSpec::Literal(a) => match literals {
                    Some(list) if has_float_fields(a) => {
                        *fresh += 1;
                        let v = var(&format!("?__literal{fresh}"));
                        list.push(LiteralAttrs {
                            var: v,
                            kind: *kind,
                            attrs: a.clone(),
                        });
                        out.add(ENodeOrVar::Var(v))
                    }
                    _ => {
                        let id = attrs.intern(a.clone());
                        out.add(ENodeOrVar::ENode(TensorNode::Attr(id)))
                    }
                },
            };
            let mut ids = vec![attr_id];
            for c in children {
                ids.push(compile_pattern(c, attrs, fresh, out, literals, templates));
            }
            out.add(ENodeOrVar::ENode(TensorNode::Op(*kind, ids.into())))
        }
    }
}

/// What the applier builds.
#[derive(Debug)]
enum Action {
    Instantiate(PatternAst<TensorNode>),
    Absorb(Var),
}

#[derive(Debug)]
struct CompiledGuard {
    kind: GuardKind,
    vars: Vec<Var>,
    numbers: Vec<f64>,
    ops: Vec<OpKind>,
}

/// The applier of one rule (one left-hand side alternative).
#[derive(Debug)]
struct RuleApplier {
    rule: RuleName,
    lhs: PatternAst<TensorNode>,
    action: Action,
    guards: Vec<CompiledGuard>,
    /// Written-out float attributes, compared before the guards.
    literals: Vec<LiteralAttrs>,
    /// Right-hand-side attributes with values from matched constants.
    templates: Vec<TemplateAttrs>,
    context: Arc<GuardContext>,
}

/// Compiles rules into egg rewrites for one compilation (literal attributes are interned
/// into this compilation's table).
pub fn compile_rules(
    rules: &[Rule],
    attrs: &mut AttrTable,
    context: &Arc<GuardContext>,
) -> Result<Vec<Rewrite<TensorNode, FusionAnalysis>>, String> {
    let mut out = Vec::new();
    for rule in rules {
        for (alternative, lhs) in rule.lhs.iter().enumerate() {
            let mut fresh = 0;
            let mut lhs_ast = PatternAst::default();
            let mut literals = Vec::new();
            // the loader refuses templates on a left-hand side, so this stays empty
            let mut lhs_templates = Vec::new();
            compile_pattern(
                lhs,
                attrs,
                &mut fresh,
                &mut lhs_ast,
                &mut Some(&mut literals),
                &mut lhs_templates,
            );
            let mut templates = Vec::new();
            let action = match &rule.action {
                RuleAction::Rewrite(rhs) => {
                    let mut ast = PatternAst::default();
                    // the right-hand side builds with the rule's own values, exactly
                    compile_pattern(rhs, attrs, &mut fresh, &mut ast, &mut None, &mut templates);
                    Action::Instantiate(ast)
                }
                RuleAction::Absorb { into } => Action::Absorb(var(into)),
            };
            let guards = rule
                .guards
                .iter()
                .map(|g| CompiledGuard {
                    kind: g.kind,
                    vars: g
                        .args
                        .iter()
                        .filter_map(|a| match a {
                            GuardArg::Var(v) => Some(var(v)),
                            GuardArg::Number(_) | GuardArg::Op(_) => None,
                        })
                        .collect(),
                    numbers: g
                        .args
                        .iter()
                        .filter_map(|a| match a {
                            GuardArg::Number(n) => Some(*n),
                            GuardArg::Var(_) | GuardArg::Op(_) => None,
                        })
                        .collect(),
                    ops: g
                        .args
                        .iter()
                        .filter_map(|a| match a {
                            GuardArg::Op(k) => Some(*k),
                            GuardArg::Var(_) | GuardArg::Number(_) => None,
                        })
                        .collect(),
                })
                .collect();
            let applier = RuleApplier {
                rule: RuleName::from(rule.name.as_str()),
                lhs: lhs_ast.clone(),
                action,
                guards,
                literals,
                templates,
                context: Arc::clone(context),
            };
            let searcher = Pattern::new(lhs_ast);
            // egg wants unique names; counts and reports use the rule's own name.
            let egg_name = if rule.lhs.len() > 1 {
                format!("{}#{}", rule.name, alternative + 1)
            } else {
                rule.name.clone()
            };
            out.push(Rewrite::new(egg_name, searcher, applier)?);
        }
    }
    Ok(out)
}

impl RuleApplier {
    /// `subst` with each attribute template bound to its payload: every hole the value of
    /// its splat constant, the text read by the op's attribute schema. A hole that is not
    /// a constant with one value throughout refuses the match (guard `attributes`).
    fn fill_templates(
        &self,
        egraph: &mut FusionGraph,
        subst: &Subst,
    ) -> Result<Subst, (String, String)> {
        let mut out = subst.clone();
        for t in &self.templates {
            let mut values: Vec<(String, f32)> = Vec::with_capacity(t.holes.len());
            for &h in &t.holes {
                let class = subst[h];
                let value = egraph[class]
                    .data
                    .weight
                    .and_then(|w| self.context.splat(w.0 as usize));
                let Some(v) = value else {
                    return Err((
                        "attributes".into(),
                        format!(
                            "{h} ({}) is not a constant with one value throughout, so it cannot \
                             give `{}` its value",
                            self.context.describe(egraph, class),
                            t.text.trim()
                        ),
                    ));
                };
                values.push((h.to_string(), v));
            }
            let value_of = |name: &str| {
                values
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or(f32::NAN, |(_, v)| *v)
            };
            let text = fill_template(&t.text, &value_of);
            let attrs = parse_literal_attrs(t.kind, &text).map_err(|m| {
                (
                    "attributes".to_string(),
                    format!("{} attributes `{}`: {m}", t.kind.name(), text.trim()),
                )
            })?;
            let id = egraph.analysis.attrs.intern(attrs);
            let leaf = egraph.add(TensorNode::Attr(id));
            out.insert(t.var, leaf);
        }
        Ok(out)
    }

    /// Checks every guard; the first refusal's guard name and reason.
    fn check_guards(
        &self,
        egraph: &FusionGraph,
        eclass: Id,
        subst: &Subst,
    ) -> Result<(), (String, String)> {
        for g in &self.guards {
            let refuse = |reason: String| Err((g.kind.name().to_string(), reason));
            match g.kind {
                GuardKind::Const => {
                    for v in &g.vars {
                        if !egraph[subst[*v]].data.is_const {
                            return refuse(format!(
                                "{v} ({}) is not a compile-time constant",
                                self.context.describe(egraph, subst[*v])
                            ));
                        }
                    }
                }
                GuardKind::Scalar => {
                    let v = g.vars[0];
                    let want = g.numbers[0];
                    let tol = g.numbers.get(1).copied().unwrap_or(1e-6);
                    let class = subst[v];
                    let data = &egraph[class].data;
                    let Some(w) = data.weight else {
                        return refuse(format!(
                            "{v} ({}) is not a constant tensor",
                            self.context.describe(egraph, class)
                        ));
                    };
                    match self.context.splat(w.0 as usize) {
                        Some(x) if (x as f64 - want).abs() <= tol * want.abs().max(1.0) => {}
                        Some(x) => {
                            return refuse(format!(
                                "{v} ({}) is the constant {x}, not {want} (tolerance {tol:e})",
                                self.context.describe(egraph, class)
                            ))
                        }
                        None => {
                            return refuse(format!(
                                "{v} ({}) is a constant whose elements are not all equal",
                                self.context.describe(egraph, class)
                            ))
                        }
                    }
                }
                GuardKind::PerChannel => {
                    let c = subst[g.vars[0]];
                    let y = g.vars.get(1).map_or(eclass, |v| subst[*v]);
                    let ct = egraph[c].data.ty.as_ref();
                    let yt = egraph[y].data.ty.as_ref();
                    let ok = match (ct, yt) {
                        (Some(ct), Some(yt)) if yt.rank() >= 2 => {
                            let ch = yt.dims[1];
                            let d = &ct.dims;
                            let trailing_ones = yt.rank() - 2;
                            let per_channel = |rest: &[usize]| {
                                rest.len() == trailing_ones && rest.iter().all(|x| *x == 1)
                            };
                            egraph[c].data.is_const
                                && ((d.len() == 1 && d[0] == ch && trailing_ones == 0)
                                    || (!d.is_empty() && d[0] == ch && per_channel(&d[1..]))
                                    || (d.len() >= 2
                                        && d[0] == 1
                                        && d[1] == ch
                                        && per_channel(&d[2..])))
                        }
                        _ => false,
                    };
                    if !ok {
                        return refuse(format!(
                            "{} ({}) is not a per-channel constant of {}",
                            g.vars[0],
                            self.context.describe(egraph, c),
                            self.context.describe(egraph, y)
                        ));
                    }
                }
                GuardKind::Rank => {
                    let v = g.vars[0];
                    let want = g.numbers[0];
                    let rank = egraph[subst[v]].data.ty.as_ref().map(|t| t.rank());
                    if rank.map(|r| r as f64) != Some(want) {
                        return refuse(format!(
                            "{v} ({}) does not have rank {want}",
                            self.context.describe(egraph, subst[v])
                        ));
                    }
                }
                GuardKind::Unpadded => {
                    let v = g.vars[0];
                    match egraph.analysis.attrs_of(egraph, subst[v]) {
                        Some(Attrs::Conv2d(a)) if a.pads == [0; 4] => {}
                        Some(Attrs::Conv2d(a)) => {
                            return refuse(format!(
                                "the conv pads its input by {:?}; the padding is zeros, not the \
                                 shifted values, so folding would be wrong at the borders",
                                a.pads
                            ))
                        }
                        _ => return refuse(format!("{v} are not conv2d attributes")),
                    }
                }
                GuardKind::NotAfter => {
                    let v = g.vars[0];
                    for &kind in &g.ops {
                        let found = egraph[subst[v]]
                            .nodes
                            .iter()
                            .any(|n| n.kind() == Some(kind));
                        if found {
                            return refuse(format!(
                                "{v} is computed by a {}, which another rule handles",
                                kind.name()
                            ));
                        }
                    }
                }
                GuardKind::Positive => {
                    let v = g.vars[0];
                    let class = subst[v];
                    let positive = egraph[class]
                        .data
                        .weight
                        .is_some_and(|w| self.context.all_positive(w.0 as usize));
                    if !positive {
                        let why = if egraph[class].data.weight.is_some() {
                            "a constant with an element that is not > 0"
                        } else {
                            "not a constant, so its values are not known to be > 0"
                        };
                        return refuse(format!(
                            "{v} ({}) is {why}",
                            self.context.describe(egraph, class)
                        ));
                    }
                }
                GuardKind::SingleValue => {
                    let v = g.vars[0];
                    let class = subst[v];
                    let data = &egraph[class].data;
                    let one = data
                        .ty
                        .as_ref()
                        .is_some_and(|t| t.dims.iter().all(|&d| d == 1));
                    if data.weight.is_none() || !one {
                        let what = match (data.weight.is_some(), &data.ty) {
                            (false, _) => "not a constant".to_string(),
                            (true, Some(t)) => format!("a constant of shape {:?}", t.dims),
                            (true, None) => "a constant of unknown shape".to_string(),
                        };
                        return refuse(format!(
                            "{v} ({}) is {what}, not a single value",
                            self.context.describe(egraph, class)
                        ));
                    }
                }
                GuardKind::SingleConsumer => {
                    let v = subst[g.vars[0]];
                    if let Some(n) = self.context.consumers(egraph, v) {
                        if n != 1 {
                            return refuse(format!(
                                "{} ({}) has {n} consumers",
                                g.vars[0],
                                self.context.describe(egraph, v)
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The class of every node of the left-hand side under `subst` (None if absent).
    fn lhs_classes(&self, egraph: &FusionGraph, subst: &Subst) -> Vec<Option<Id>> {
        let mut ids: Vec<Option<Id>> = Vec::with_capacity(self.lhs.as_ref().len());
        for n in self.lhs.as_ref() {
            let id = match n {
                ENodeOrVar::Var(v) => Some(subst[*v]),
                ENodeOrVar::ENode(node) => {
                    let mut ok = true;
                    let concrete = node.clone().map_children(|c| {
                        ids[usize::from(c)].unwrap_or_else(|| {
                            ok = false;
                            c
                        })
                    });
                    if ok {
                        egraph.lookup(concrete)
                    } else {
                        None
                    }
                }
            };
            ids.push(id);
        }
        ids
    }

    /// Provenance of the matched left-hand side op nodes.
    fn matched_provenance(&self, egraph: &FusionGraph, classes: &[Option<Id>]) -> Provenance {
        let mut prov = Provenance::default();
        for (i, n) in self.lhs.as_ref().iter().enumerate() {
            if let (ENodeOrVar::ENode(node @ TensorNode::Op(..)), Some(_)) = (n, classes[i]) {
                let concrete = node
                    .clone()
                    .map_children(|c| classes[usize::from(c)].unwrap_or(c));
                if let Some(p) = FusionAnalysis::provenance_ref(egraph, &concrete) {
                    prov.absorb(p);
                }
            }
        }
        prov
    }

    fn record(egraph: &mut FusionGraph, rule: &RuleName, class: Id, outcome: Outcome) {
        egraph.analysis.events.insert(RuleEvent {
            rule: rule.clone(),
            class,
            outcome,
        });
    }

    /// This rule's counts.
    fn counts<'g>(&self, egraph: &'g mut FusionGraph) -> &'g mut RuleCounts {
        egraph.analysis.counts.entry(self.rule.clone()).or_default()
    }

    fn instantiate(
        &self,
        egraph: &mut FusionGraph,
        eclass: Id,
        subst: &Subst,
        rhs: &RecExpr<ENodeOrVar<TensorNode>>,
        prov: &Provenance,
    ) -> Vec<Id> {
        let mut ids: Vec<Id> = Vec::with_capacity(rhs.as_ref().len());
        let mut root = None;
        for n in rhs.as_ref() {
            let id = match n {
                ENodeOrVar::Var(v) => subst[*v],
                ENodeOrVar::ENode(node) => {
                    let concrete = node.clone().map_children(|c| ids[usize::from(c)]);
                    let id = egraph.add(concrete.clone());
                    if matches!(concrete, TensorNode::Op(..)) {
                        FusionAnalysis::record(egraph, &concrete, prov);
                    }
                    root = Some(concrete);
                    id
                }
            };
            ids.push(id);
        }
        let Some(&new) = ids.last() else {
            return vec![];
        };
        // A right-hand side that is a bare variable adds no node; the match then equals
        // a node already in that variable's class, recorded so the report and the rule
        // checker see the rule fire like any other.
        let root = root.or_else(|| egraph[new].nodes.first().cloned());
        let changed = egraph.union(eclass, new);
        if let Some(node) = root {
            let canonical = node.map_children(|c| egraph.find(c));
            Self::record(egraph, &self.rule, eclass, Outcome::Fired(canonical));
        }
        if changed {
            self.counts(egraph).applied += 1;
            vec![new]
        } else {
            vec![]
        }
    }

    /// Merges the elementwise root into the anchors producing `into`.
    fn absorb(
        &self,
        egraph: &mut FusionGraph,
        eclass: Id,
        subst: &Subst,
        into: Var,
        classes: &[Option<Id>],
    ) -> Result<Vec<Id>, (String, String)> {
        let nodes = self.lhs.as_ref();
        let Some(ENodeOrVar::ENode(TensorNode::Op(kind, children))) = nodes.last() else {
            return Ok(vec![]);
        };
        let root_classes: Vec<Option<Id>> =
            children.iter().map(|c| classes[usize::from(*c)]).collect();
        let Some(root_concrete) = root_classes
            .iter()
            .copied()
            .collect::<Option<Vec<Id>>>()
            .map(|ids| TensorNode::Op(*kind, ids.into()))
        else {
            return Ok(vec![]);
        };
        let op = egraph
            .analysis
            .op_of(egraph, &root_concrete)
            .ok_or_else(|| {
                (
                    "attributes".to_string(),
                    format!("'{}' has attributes that do not fit it", kind.name()),
                )
            })?;
        // Operand positions of the root (children[0] is the attribute leaf).
        let into_pos = children[1..]
            .iter()
            .position(|c| matches!(&nodes[usize::from(*c)], ENodeOrVar::Var(v) if *v == into))
            .ok_or_else(|| ("absorb".to_string(), "malformed absorb rule".to_string()))?;
        let anchor_class = subst[into];
        let other: Option<Id> = match children.len() {
            3 => root_classes[1 + (1 - into_pos)],
            _ => None,
        };
        let Some(post) = post_op_of(&op, into_pos == 0) else {
            return Err((
                "elementwise".to_string(),
                format!("'{}' has no fused form", op.name()),
            ));
        };
        // Candidate anchors: anchor ops and fused ops in the class, in node order.
        let mut candidates: Vec<(TensorNode, Op)> = Vec::new();
        for n in &egraph[anchor_class].nodes {
            if let Some(a) = egraph.analysis.op_of(egraph, n) {
                if a.is_anchor() || matches!(a, Op::Fused(_)) {
                    candidates.push((n.clone(), a));
                }
            }
        }
        if candidates.is_empty() {
            // An input or a constant is simply not what this rule is about; only an op
            // that cannot anchor is worth a near-miss note.
            let is_leaf = egraph[anchor_class]
                .nodes
                .iter()
                .any(|n| matches!(n, TensorNode::Param(_) | TensorNode::Weight(_)));
            if is_leaf {
                return Ok(vec![]);
            }
            return Err((
                "anchor".into(),
                format!(
                    "{} is not computed by an anchor op (conv2d, conv_transpose2d, gemm, matmul, layer_norm, pool) or a fused op",
                    self.context.describe(egraph, anchor_class)
                ),
            ));
        }
        let anchor_ty = egraph[anchor_class].data.ty.clone();
        let Some(anchor_ty) = anchor_ty else {
            return Err(("type".into(), "the anchor's type is unknown".into()));
        };
        if anchor_ty.layout != Layout::RowMajor {
            return Err((
                "layout".into(),
                format!("the anchor result {anchor_ty} is not row-major"),
            ));
        }
        if let Some(o) = other {
            let Some(ot) = egraph[o].data.ty.clone() else {
                return Err(("type".into(), "the other operand's type is unknown".into()));
            };
            if ot.layout != Layout::RowMajor {
                return Err(("layout".into(), format!("operand {ot} is not row-major")));
            }
            let fits = broadcast(&anchor_ty.dims, &ot.dims).is_ok_and(|d| d == anchor_ty.dims);
            if !fits {
                return Err((
                    "broadcast".into(),
                    format!(
                        "{} operand {ot} does not broadcast to the anchor result {anchor_ty} without changing its shape",
                        op.name()
                    ),
                ));
            }
        }
        if let Some(o) = other {
            if reads_value_of(egraph, o, anchor_class) {
                return Err((
                    "reads-anchor".into(),
                    format!(
                        "the other operand of '{}' is computed from the anchor's own result, \
                         which would then be computed twice",
                        op.name()
                    ),
                ));
            }
        }
        let root_prov = FusionAnalysis::provenance_of(egraph, &root_concrete);
        let mut changed = Vec::new();
        for (node, anchor_op) in candidates {
            let (fused, operands) = match anchor_op {
                Op::Fused(mut f) => {
                    f.post_ops.push(post);
                    (f, node.operands().to_vec())
                }
                a => (
                    FusedOp {
                        anchor: Box::new(a),
                        post_ops: vec![post],
                    },
                    node.operands().to_vec(),
                ),
            };
            let mut kids = operands;
            if let Some(o) = other {
                kids.push(o);
            }
            let Some((kind, attrs)) = split_op(&Op::Fused(fused)) else {
                continue;
            };
            let attr = egraph.analysis.attrs.intern(attrs);
            let attr_leaf = egraph.add(TensorNode::Attr(attr));
            let mut all = vec![attr_leaf];
            all.extend(kids);
            let new_node = TensorNode::Op(kind, all.into());
            let mut prov = FusionAnalysis::provenance_of(egraph, &node);
            prov.absorb(&root_prov);
            prov.rules.push(self.rule.clone());
            let id = egraph.add(new_node.clone());
            FusionAnalysis::record(egraph, &new_node, &prov);
            let canonical = new_node.map_children(|c| egraph.find(c));
            Self::record(egraph, &self.rule, eclass, Outcome::Fired(canonical));
            if egraph.union(eclass, id) {
                self.counts(egraph).applied += 1;
                changed.push(id);
            }
        }
        Ok(changed)
    }
}

impl Applier<TensorNode, FusionAnalysis> for RuleApplier {
    fn apply_one(
        &self,
        egraph: &mut FusionGraph,
        eclass: Id,
        subst: &Subst,
        _searcher_ast: Option<&PatternAst<TensorNode>>,
        _rule_name: Symbol,
    ) -> Vec<Id> {
        // Literal attributes first: a payload that is another op's (not within the
        // near-miss band) was never a match, as for an exact pattern.
        let mut approximate = Vec::new();
        let mut near = None;
        for lit in &self.literals {
            let model = egraph.analysis.attrs_of(egraph, subst[lit.var]);
            match model.map(|m| compare(m, &lit.attrs)) {
                Some(AttrMatch::Exact) => {}
                Some(AttrMatch::Within(notes)) => approximate.extend(notes),
                Some(AttrMatch::Near(notes)) => {
                    near.get_or_insert_with(Vec::new).extend(
                        notes
                            .into_iter()
                            .map(|n| format!("{} attributes: {n}", lit.kind.name())),
                    );
                }
                Some(AttrMatch::Different) | None => return vec![],
            }
        }
        self.counts(egraph).matches += 1;
        let refused = |egraph: &mut FusionGraph, (guard, reason): (String, String)| {
            self.counts(egraph).refused += 1;
            Self::record(
                egraph,
                &self.rule,
                eclass,
                Outcome::Refused { guard, reason },
            );
            vec![]
        };
        if let Some(notes) = near {
            return refused(egraph, ("attributes".to_string(), notes.join("; ")));
        }
        if let Err(r) = self.check_guards(egraph, eclass, subst) {
            return refused(egraph, r);
        }
        // kept as events; the report shows them where this rule fired at this class
        for note in approximate {
            Self::record(egraph, &self.rule, eclass, Outcome::Approximate { note });
        }
        let classes = self.lhs_classes(egraph, subst);
        match &self.action {
            Action::Instantiate(rhs) => {
                let subst = match self.fill_templates(egraph, subst) {
                    Ok(s) => s,
                    Err(r) => return refused(egraph, r),
                };
                if let Err(r) = rhs_fits(egraph, eclass, &subst, rhs) {
                    return refused(egraph, r);
                }
                let mut prov = self.matched_provenance(egraph, &classes);
                prov.rules.push(self.rule.clone());
                self.instantiate(egraph, eclass, &subst, rhs, &prov)
            }
            Action::Absorb(into) => match self.absorb(egraph, eclass, subst, *into, &classes) {
                Ok(ids) => ids,
                Err(r) => refused(egraph, r),
            },
        }
    }

    fn vars(&self) -> Vec<Var> {
        let mut vars: BTreeSet<Var> = BTreeSet::new();
        match &self.action {
            Action::Instantiate(rhs) => {
                for n in rhs.as_ref() {
                    if let ENodeOrVar::Var(v) = n {
                        vars.insert(*v);
                    }
                }
                // a template's variable is bound by the applier, its holes by the match
                for t in &self.templates {
                    vars.remove(&t.var);
                    vars.extend(t.holes.iter().copied());
                }
            }
            Action::Absorb(v) => {
                vars.insert(*v);
            }
        }
        for g in &self.guards {
            vars.extend(g.vars.iter().copied());
        }
        vars.into_iter().collect()
    }
}

/// How deep [`reads_value_of`] follows operands before it gives up (and answers no).
const MAX_READ_DEPTH: usize = 256;

/// Whether every way the e-graph has of computing `class` reads the value of `anchor`:
/// then an op over both cannot be fused into `anchor`'s op, since `class` must be
/// computed from that op's plain result first (the anchor would run twice, which
/// extraction never picks). Absorbing such ops anyway (a layer norm's `x − mean(x)` into
/// the op computing `x`) only grows post-op chains that saturation then extends along the
/// whole residual stream of a transformer, one layer per iteration. Answers no where it
/// cannot tell (a cycle, a class deeper than [`MAX_READ_DEPTH`]), so no fusion is lost.
fn reads_value_of(egraph: &FusionGraph, class: Id, anchor: Id) -> bool {
    let anchor = egraph.find(anchor);
    let mut memo: HashMap<Id, bool> = HashMap::new();
    reads_value(egraph, egraph.find(class), anchor, &mut memo, 0)
}

fn reads_value(
    egraph: &FusionGraph,
    class: Id,
    anchor: Id,
    memo: &mut HashMap<Id, bool>,
    depth: usize,
) -> bool {
    if class == anchor {
        return true;
    }
    if let Some(&known) = memo.get(&class) {
        return known;
    }
    // defined before every input value of the anchor's class: cannot read it
    let before = match (
        egraph[class].data.inputs.span,
        egraph[anchor].data.inputs.span,
    ) {
        (Some((_, last)), Some((first, _))) => last < first,
        _ => false,
    };
    if before || depth >= MAX_READ_DEPTH {
        return false;
    }
    // a cycle back to this class proves nothing
    memo.insert(class, false);
    let reads = egraph[class].nodes.iter().all(|n| {
        n.children()
            .iter()
            .any(|&c| reads_value(egraph, egraph.find(c), anchor, memo, depth + 1))
    });
    memo.insert(class, reads);
    reads
}

/// What a right-hand side node stands for while its type is checked.
enum Slot {
    Class(Id),
    Attr(super::lang::AttrId),
    Type(TensorType),
}

/// Checks that the right-hand side, instantiated under `subst`, is well-typed and has the
/// matched class's shape; otherwise the guard `type` refuses (a rule, built-in or a
/// user's, never adds an ill-typed alternative).
fn rhs_fits(
    egraph: &FusionGraph,
    eclass: Id,
    subst: &Subst,
    rhs: &RecExpr<ENodeOrVar<TensorNode>>,
) -> Result<(), (String, String)> {
    let refuse = |m: String| Err(("type".to_string(), m));
    let mut slots: Vec<Slot> = Vec::with_capacity(rhs.as_ref().len());
    for n in rhs.as_ref() {
        let slot = match n {
            ENodeOrVar::Var(v) => Slot::Class(subst[*v]),
            ENodeOrVar::ENode(TensorNode::Attr(a)) => Slot::Attr(*a),
            ENodeOrVar::ENode(TensorNode::Op(kind, children)) => {
                let attr = match children.first().map(|c| &slots[usize::from(*c)]) {
                    Some(Slot::Attr(a)) => Some(*a),
                    Some(Slot::Class(c)) => egraph[*c].data.attr,
                    Some(Slot::Type(_)) | None => None,
                };
                let Some(op) = attr
                    .and_then(|a| egraph.analysis.attrs.get(a))
                    .and_then(|a| join_op(*kind, a))
                else {
                    return refuse(format!(
                        "'{}' gets attributes that do not fit it",
                        kind.name()
                    ));
                };
                let mut types = Vec::with_capacity(children.len());
                for c in &children[1..] {
                    match &slots[usize::from(*c)] {
                        Slot::Class(id) => match &egraph[*id].data.ty {
                            Some(t) => types.push(t.clone()),
                            None => {
                                return refuse(format!("an operand of '{}' has no type", op.name()))
                            }
                        },
                        Slot::Type(t) => types.push(t.clone()),
                        Slot::Attr(_) => {
                            return refuse(format!("an operand of '{}' is attributes", op.name()))
                        }
                    }
                }
                let refs: Vec<&TensorType> = types.iter().collect();
                let weights = &egraph.analysis.weight_types;
                match op.infer_type(&refs, &|w| weights.get(w.0 as usize).cloned()) {
                    Ok(t) => Slot::Type(t),
                    Err(m) => return refuse(format!("the right-hand side is ill-typed: {m}")),
                }
            }
            ENodeOrVar::ENode(leaf) => match egraph.lookup(leaf.clone()) {
                Some(id) => Slot::Class(id),
                None => return refuse("the right-hand side names an unknown leaf".into()),
            },
        };
        slots.push(slot);
    }
    let got = match slots.last() {
        Some(Slot::Type(t)) => Some(t.clone()),
        Some(Slot::Class(c)) => egraph[*c].data.ty.clone(),
        Some(Slot::Attr(_)) | None => None,
    };
    let want = egraph[eclass].data.ty.as_ref();
    match (got, want) {
        (Some(g), Some(w)) if g.dims == w.dims && g.layout == w.layout => Ok(()),
        (Some(g), Some(w)) => refuse(format!(
            "the right-hand side computes {g}, the matched op {w}"
        )),
        _ => Ok(()),
    }
}
