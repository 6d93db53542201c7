//! The e-class analysis: type (shape, dtype, layout) and is-constant of every class, plus
//! the per-compilation side tables rules write to (attribute payloads, provenance, events).

use std::collections::{BTreeMap, BTreeSet};

use egg::{Analysis, DidMerge, EGraph, Id, Language};
use smelt_ir::op::Op;
use smelt_ir::types::TensorType;
use smelt_ir::weights::WeightId;

use super::lang::{join_op, AttrId, AttrTable, Attrs, TensorNode};

/// The fusion e-graph.
pub type FusionGraph = EGraph<TensorNode, FusionAnalysis>;

/// What is known about an e-class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassData {
    /// The type of the class's value; `None` for attribute leaves and ill-typed nodes.
    pub ty: Option<TensorType>,
    /// Whether the value can be computed at compile time (weights and ops over them).
    pub is_const: bool,
    /// The attribute payload, for attribute leaves.
    pub attr: Option<AttrId>,
    /// The weight, for a class holding a weight leaf.
    pub weight: Option<WeightId>,
    /// What the input function says about the values in this class (guards read it).
    pub inputs: InputFacts,
}

/// The input function's values merged into a class, summarized so a guard reads them in
/// constant time instead of scanning every value: written once per value before
/// saturation ([`super::apply::GuardContext::annotate`]) and combined on every union.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InputFacts {
    /// The most consumers any input value in the class has (`None`: no input value).
    pub consumers: Option<usize>,
    /// The index of the earliest input value in the class that the user named.
    pub label: Option<usize>,
    /// The smallest and largest index of the input values in the class (`None`: no input
    /// value): a class whose every input value is defined before every one of another
    /// class's cannot read that class's value (the input function is in SSA order).
    pub span: Option<(usize, usize)>,
}

impl InputFacts {
    /// Both classes' facts together: the larger consumer count, the earlier label, the
    /// spans joined.
    pub fn union(self, other: InputFacts) -> InputFacts {
        let earlier = |a: Option<usize>, b: Option<usize>| match (a, b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, None) => x,
            (None, y) => y,
        };
        let span = match (self.span, other.span) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (x, None) => x,
            (None, y) => y,
        };
        InputFacts {
            consumers: self.consumers.max(other.consumers),
            label: earlier(self.label, other.label),
            span,
        }
    }
}

/// A rule's name as the e-graph's side tables keep it: shared, so that recording a match
/// (thousands per compile, most of them repeats in later iterations) copies no string.
pub type RuleName = std::sync::Arc<str>;

/// Which input instructions and rules an e-node stands for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Provenance {
    /// Indices of the input function's instructions this node computes (merged ops),
    /// ascending, each once.
    pub insts: Vec<usize>,
    /// Names of the rules that built this node, in the order they fired.
    pub rules: Vec<RuleName>,
}

impl Provenance {
    /// The provenance of input instruction `i` itself.
    pub fn of_inst(i: usize) -> Provenance {
        Provenance {
            insts: vec![i],
            rules: Vec::new(),
        }
    }

    /// Adds everything `other` records.
    pub fn absorb(&mut self, other: &Provenance) {
        if !other
            .insts
            .iter()
            .all(|i| self.insts.binary_search(i).is_ok())
        {
            self.insts.extend_from_slice(&other.insts);
            self.insts.sort_unstable();
            self.insts.dedup();
        }
        for r in &other.rules {
            if !self.rules.contains(r) {
                self.rules.push(r.clone());
            }
        }
    }
}

/// What happened when a rule matched at a site.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// The rule added this node to the site's class.
    Fired(TensorNode),
    /// A guard refused.
    Refused {
        /// The guard's name.
        guard: String,
        /// Why, in the user's words.
        reason: String,
    },
    /// A written-out float attribute matched the model's within the tolerance
    /// ([`super::attr_match`]), not exactly; recorded beside the rule's `Fired` event.
    Approximate {
        /// Which attribute, both values and the tolerance.
        note: String,
    },
}

/// One match of a rule at an e-class.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RuleEvent {
    /// The rule.
    pub rule: RuleName,
    /// The class matched by the rule's left-hand side root.
    pub class: Id,
    /// What happened.
    pub outcome: Outcome,
}

/// Match and application counts of one rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleCounts {
    /// Times the left-hand side matched (repeated in every iteration).
    pub matches: usize,
    /// Times the rule changed the e-graph.
    pub applied: usize,
    /// Times a guard refused.
    pub refused: usize,
}

/// The analysis and the compilation's side tables.
#[derive(Clone, Debug, Default)]
pub struct FusionAnalysis {
    /// Attribute payloads, interned in first-seen order.
    pub attrs: AttrTable,
    /// Types of the module's weights, by id.
    pub weight_types: Vec<TensorType>,
    /// Types of the function's parameters.
    pub param_types: Vec<TensorType>,
    /// Provenance of e-nodes (keys re-canonicalized after every rebuild).
    pub provenance: BTreeMap<TensorNode, Provenance>,
    /// Every rule match and its outcome.
    pub events: BTreeSet<RuleEvent>,
    /// Per-rule counts.
    pub counts: BTreeMap<RuleName, RuleCounts>,
}

impl FusionAnalysis {
    /// The IR op of an op node, or `None` for leaves and payloads that do not fit the kind.
    pub fn op_of(&self, egraph: &FusionGraph, node: &TensorNode) -> Option<Op> {
        match node {
            TensorNode::Op(kind, children) => {
                let attr = egraph[*children.first()?].data.attr?;
                join_op(*kind, self.attrs.get(attr)?)
            }
            TensorNode::Weight(w) => Some(Op::Const(*w)),
            TensorNode::Attr(_) | TensorNode::Param(_) => None,
        }
    }

    /// The payload of an attribute class.
    pub fn attrs_of(&self, egraph: &FusionGraph, class: Id) -> Option<&Attrs> {
        self.attrs.get(egraph[class].data.attr?)
    }

    /// Rewrites provenance keys to their canonical form after unions, merging entries
    /// that became equal.
    pub fn recanonicalize(egraph: &mut FusionGraph) {
        // Only the entries whose children were merged move; the rest (most of them, in
        // every iteration but the first few) keep their key and are not touched.
        let stale: Vec<TensorNode> = egraph
            .analysis
            .provenance
            .keys()
            .filter(|node| node.children().iter().any(|&c| egraph.find(c) != c))
            .cloned()
            .collect();
        for node in stale {
            let Some(prov) = egraph.analysis.provenance.remove(&node) else {
                continue;
            };
            let key = node.map_children(|c| egraph.find(c));
            match egraph.analysis.provenance.entry(key) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(prov);
                }
                std::collections::btree_map::Entry::Occupied(mut o) => o.get_mut().absorb(&prov),
            }
        }
    }

    /// Records provenance for a node (merging with what is known).
    pub fn record(egraph: &mut FusionGraph, node: &TensorNode, prov: &Provenance) {
        let key = node.clone().map_children(|c| egraph.find(c));
        egraph
            .analysis
            .provenance
            .entry(key)
            .or_default()
            .absorb(prov);
    }

    /// The provenance of a node (canonicalizing it first).
    pub fn provenance_of(egraph: &FusionGraph, node: &TensorNode) -> Provenance {
        Self::provenance_ref(egraph, node)
            .cloned()
            .unwrap_or_default()
    }

    /// [`FusionAnalysis::provenance_of`], borrowed; `None` where nothing is recorded.
    pub fn provenance_ref<'g>(
        egraph: &'g FusionGraph,
        node: &TensorNode,
    ) -> Option<&'g Provenance> {
        let key = node.clone().map_children(|c| egraph.find(c));
        egraph.analysis.provenance.get(&key)
    }
}

impl Analysis<TensorNode> for FusionAnalysis {
    type Data = ClassData;

    fn make(egraph: &mut FusionGraph, enode: &TensorNode, _id: Id) -> ClassData {
        match enode {
            TensorNode::Attr(a) => ClassData {
                ty: None,
                is_const: true,
                attr: Some(*a),
                weight: None,
                inputs: InputFacts::default(),
            },
            TensorNode::Param(p) => ClassData {
                ty: egraph.analysis.param_types.get(*p as usize).cloned(),
                is_const: false,
                attr: None,
                weight: None,
                inputs: InputFacts::default(),
            },
            TensorNode::Weight(w) => ClassData {
                ty: egraph.analysis.weight_types.get(w.0 as usize).cloned(),
                is_const: true,
                attr: None,
                weight: Some(*w),
                inputs: InputFacts::default(),
            },
            TensorNode::Op(_, children) => {
                let operands = &children[1.min(children.len())..];
                let is_const = operands.iter().all(|c| egraph[*c].data.is_const);
                let types: Option<Vec<&TensorType>> = operands
                    .iter()
                    .map(|c| egraph[*c].data.ty.as_ref())
                    .collect();
                let op = egraph.analysis.op_of(egraph, enode);
                let weight_types = &egraph.analysis.weight_types;
                let ty = match (op, types) {
                    (Some(op), Some(types)) => op
                        .infer_type(&types, &|w| weight_types.get(w.0 as usize).cloned())
                        .ok(),
                    _ => None,
                };
                ClassData {
                    ty,
                    is_const,
                    attr: None,
                    weight: None,
                    inputs: InputFacts::default(),
                }
            }
        }
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> DidMerge {
        let (mut a_changed, mut b_changed) = (false, false);
        match (&a.ty, &b.ty) {
            (None, Some(_)) => {
                a.ty = b.ty.clone();
                a_changed = true;
            }
            (Some(_), None) => b_changed = true,
            (None, None) | (Some(_), Some(_)) => {}
        }
        if b.is_const && !a.is_const {
            a.is_const = true;
            a_changed = true;
        } else if a.is_const && !b.is_const {
            b_changed = true;
        }
        if a.attr.is_none() && b.attr.is_some() {
            a.attr = b.attr;
            a_changed = true;
        } else if a.attr.is_some() && b.attr.is_none() {
            b_changed = true;
        }
        match (a.weight, b.weight) {
            (None, Some(w)) => {
                a.weight = Some(w);
                a_changed = true;
            }
            (Some(x), Some(y)) if y < x => {
                a.weight = Some(y);
                a_changed = true;
            }
            (Some(_), None) => b_changed = true,
            (Some(x), Some(y)) if x < y => b_changed = true,
            _ => {}
        }
        let inputs = a.inputs.union(b.inputs);
        a_changed |= inputs != a.inputs;
        b_changed |= inputs != b.inputs;
        a.inputs = inputs;
        DidMerge(a_changed, b_changed)
    }
}
