//! The e-graph language: one e-node kind per IR op, attributes as one interned leaf child.
//!
//! The kinds ([`OpKind`]) and attribute payloads ([`Attrs`]) are smelt-ir's op table,
//! used as they are: an op added to the table is an e-node kind with no change here.
//!
//! Every op node's first child is an attribute leaf ([`TensorNode::Attr`]) holding an
//! [`AttrId`] into the compilation's [`AttrTable`]; the remaining children are the
//! op's operands. Weights and function parameters are leaves. Payloads are interned in
//! first-seen order, so ids (and therefore e-node order and every tie-break built on it)
//! depend only on the input, never on what else ran in the process.

use std::collections::HashMap;
use std::fmt;

use egg::{Id, Language};
use smelt_ir::op::Op;
pub use smelt_ir::op::{Attrs, OpKind};
use smelt_ir::weights::WeightId;

/// Splits an op into its e-node kind and attribute payload; `None` for `const`
/// (weights are leaves). The op table in smelt-ir ([`Op::split`]) defines both.
pub fn split_op(op: &Op) -> Option<(OpKind, Attrs)> {
    op.split()
}

/// Rebuilds the IR op from a kind and a payload; `None` when the payload does not fit
/// the kind (a user rule that wired a `conv2d`'s attributes into a `clip`, say).
pub fn join_op(kind: OpKind, attrs: &Attrs) -> Option<Op> {
    kind.join(attrs)
}

/// Index of an interned attribute payload in the compilation's [`AttrTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttrId(pub u32);

/// Attribute payloads of one compilation, interned in first-seen order.
#[derive(Clone, Debug, Default)]
pub struct AttrTable {
    payloads: Vec<Attrs>,
    index: HashMap<Attrs, AttrId>,
}

impl AttrTable {
    /// The id of `attrs`, interning it on first sight.
    pub fn intern(&mut self, attrs: Attrs) -> AttrId {
        if let Some(id) = self.index.get(&attrs) {
            return *id;
        }
        let id = AttrId(self.payloads.len() as u32);
        self.payloads.push(attrs.clone());
        self.index.insert(attrs, id);
        id
    }

    /// The payload of `id`.
    pub fn get(&self, id: AttrId) -> Option<&Attrs> {
        self.payloads.get(id.0 as usize)
    }
}

/// A node of the fusion e-graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TensorNode {
    /// An interned attribute payload; the first child of every op node.
    Attr(AttrId),
    /// The i-th function parameter.
    Param(u32),
    /// A module weight.
    Weight(WeightId),
    /// An op: kind, then children `[attrs, operands...]`.
    Op(OpKind, Box<[Id]>),
}

impl TensorNode {
    /// The op kind, for op nodes.
    pub fn kind(&self) -> Option<OpKind> {
        match self {
            TensorNode::Op(k, _) => Some(*k),
            TensorNode::Attr(_) | TensorNode::Param(_) | TensorNode::Weight(_) => None,
        }
    }

    /// The operand children of an op node (all children but the attribute leaf).
    pub fn operands(&self) -> &[Id] {
        match self {
            TensorNode::Op(_, c) => c.get(1..).unwrap_or(&[]),
            TensorNode::Attr(_) | TensorNode::Param(_) | TensorNode::Weight(_) => &[],
        }
    }

    /// The attribute child of an op node.
    pub fn attr_child(&self) -> Option<Id> {
        match self {
            TensorNode::Op(_, c) => c.first().copied(),
            TensorNode::Attr(_) | TensorNode::Param(_) | TensorNode::Weight(_) => None,
        }
    }
}

/// What [`Language::matches`] compares: the variant and, for leaves, the payload.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NodeTag {
    /// An attribute leaf.
    Attr(AttrId),
    /// A parameter leaf.
    Param(u32),
    /// A weight leaf.
    Weight(WeightId),
    /// An op node of this kind.
    Op(OpKind),
}

impl Language for TensorNode {
    type Discriminant = NodeTag;

    fn discriminant(&self) -> NodeTag {
        match self {
            TensorNode::Attr(a) => NodeTag::Attr(*a),
            TensorNode::Param(p) => NodeTag::Param(*p),
            TensorNode::Weight(w) => NodeTag::Weight(*w),
            TensorNode::Op(k, _) => NodeTag::Op(*k),
        }
    }

    fn matches(&self, other: &Self) -> bool {
        match (self, other) {
            (TensorNode::Op(a, ca), TensorNode::Op(b, cb)) => a == b && ca.len() == cb.len(),
            (a, b) => a == b,
        }
    }

    fn children(&self) -> &[Id] {
        match self {
            TensorNode::Op(_, c) => c,
            TensorNode::Attr(_) | TensorNode::Param(_) | TensorNode::Weight(_) => &[],
        }
    }

    fn children_mut(&mut self) -> &mut [Id] {
        match self {
            TensorNode::Op(_, c) => c,
            TensorNode::Attr(_) | TensorNode::Param(_) | TensorNode::Weight(_) => &mut [],
        }
    }
}

impl fmt::Display for TensorNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorNode::Attr(a) => write!(f, "#attr{}", a.0),
            TensorNode::Param(p) => write!(f, "%param{p}"),
            TensorNode::Weight(w) => write!(f, "@weight{}", w.0),
            TensorNode::Op(k, _) => f.write_str(k.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smelt_ir::types::F32;

    #[test]
    fn attrs_intern_in_first_seen_order() {
        let mut t = AttrTable::default();
        let a = t.intern(Attrs::Epsilon(F32(1e-5)));
        let b = t.intern(Attrs::None);
        assert_eq!((a, b), (AttrId(0), AttrId(1)));
        assert_eq!(t.intern(Attrs::Epsilon(F32(1e-5))), a);
    }
}
