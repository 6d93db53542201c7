//! Building the e-graph of a function: one class per value, commutative operands in
//! canonical order, and the names guard messages give each value.

use super::*;

/// The e-graph built from a function.
pub(super) struct Built {
    pub(super) egraph: FusionGraph,
    /// E-class of every value of the input function.
    pub(super) value_class: Vec<Id>,
    /// The node the input used for each value (canonical at build time).
    pub(super) original: BTreeMap<Id, TensorNode>,
}

/// Builds the e-graph of `func`, putting commutative binary operands in canonical order
/// (compile-time constants and broadcast operands second).
pub(super) fn build(func: &Func, weights: &WeightStore) -> Result<Built, PassError> {
    let analysis = FusionAnalysis {
        weight_types: weights.iter().map(|(_, w)| w.ty.clone()).collect(),
        param_types: func.params.iter().map(|p| p.ty.clone()).collect(),
        ..FusionAnalysis::default()
    };
    let mut egraph = FusionGraph::new(analysis);
    let mut value_class = Vec::with_capacity(func.num_values());
    let mut original = BTreeMap::new();
    for i in 0..func.params.len() {
        value_class.push(egraph.add(TensorNode::Param(i as u32)));
    }
    for (i, inst) in func.insts.iter().enumerate() {
        let internal = |m: String| PassError::Internal {
            pass: "fusion",
            message: m,
        };
        let mut operands = Vec::with_capacity(inst.operands.len());
        for v in &inst.operands {
            operands.push(*value_class.get(v.index()).ok_or_else(|| {
                internal(format!(
                    "instruction {i} uses value {} before its definition",
                    v.0
                ))
            })?);
        }
        let node = match split_op(&inst.op) {
            None => match inst.op {
                Op::Const(w) => TensorNode::Weight(w),
                _ => return Err(internal("only const has no e-node kind".into())),
            },
            Some((kind, attrs)) => {
                if is_commutative_binary(kind) && operands.len() == 2 {
                    let second_first = |a: Id, b: Id| {
                        let (da, db) = (&egraph[a].data, &egraph[b].data);
                        if da.is_const != db.is_const {
                            return da.is_const;
                        }
                        let dims = |d: &analysis::ClassData| d.ty.as_ref().map(|t| t.dims.clone());
                        let out = match (dims(da), dims(db)) {
                            (Some(x), Some(y)) => broadcast(&x, &y).ok(),
                            _ => None,
                        };
                        let is_bcast = |d: Option<Vec<usize>>| out.is_some() && d != out;
                        is_bcast(dims(da)) && !is_bcast(dims(db))
                    };
                    if second_first(operands[0], operands[1]) {
                        operands.swap(0, 1);
                    }
                }
                let attr = egraph.analysis.attrs.intern(attrs);
                let attr_leaf = egraph.add(TensorNode::Attr(attr));
                let mut children = vec![attr_leaf];
                children.extend(operands);
                TensorNode::Op(kind, children.into())
            }
        };
        let id = egraph.add(node.clone());
        if matches!(node, TensorNode::Op(..)) {
            FusionAnalysis::record(&mut egraph, &node, &Provenance::of_inst(i));
        }
        original.insert(id, node);
        value_class.push(id);
    }
    egraph.rebuild();
    Ok(Built {
        egraph,
        value_class,
        original,
    })
}

pub(super) fn is_commutative_binary(kind: OpKind) -> bool {
    kind.binary().is_some_and(|b| b.is_commutative())
}

/// How the user names each value of `func` in guard reasons: `%name` for a parameter,
/// `@name` for a weight, the op's location (node name or file:line:col) otherwise.
pub(super) fn value_labels(func: &Func, weights: &WeightStore) -> Vec<String> {
    let params = func.params.iter().map(|p| format!("%{}", p.name));
    let insts = func.insts.iter().map(|inst| match (&inst.op, &inst.loc) {
        (Op::Const(w), _) => weights
            .get(*w)
            .map(|w| format!("@{}", w.name))
            .unwrap_or_default(),
        (_, Location::Unknown) => String::new(),
        (_, loc) => loc.to_string(),
    });
    params.chain(insts).collect()
}
