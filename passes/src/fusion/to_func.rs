//! From the chosen e-nodes back to a function: classes without a choice filled, forced
//! and withheld sites, and the emitted instructions with their provenance.

use super::*;

/// Gives every class reachable from `node` without a choice its first usable node.
pub(super) fn fill_missing(
    table: &CostTable,
    choice: &mut extract::Choice,
    egraph: &FusionGraph,
    node: &TensorNode,
) {
    use egg::Language;
    let mut stack: Vec<Id> = node.children().iter().map(|c| egraph.find(*c)).collect();
    while let Some(c) = stack.pop() {
        if choice.contains_key(&c) {
            continue;
        }
        let Some(list) = table.nodes.get(&c) else {
            continue;
        };
        let Some(best) = (0..list.len()).min_by(|a, b| list[*a].1.total_cmp(&list[*b].1)) else {
            continue;
        };
        choice.insert(c, best);
        stack.extend(list[best].0.children().iter().copied());
    }
}

/// The input program's node of every canonical class that holds an input value (the
/// earliest value wins where rules merged two), parameters included.
pub(super) fn input_nodes(
    egraph: &FusionGraph,
    func: &Func,
    value_class: &[Id],
    original: &BTreeMap<Id, TensorNode>,
) -> HashMap<Id, TensorNode> {
    let mut out: HashMap<Id, TensorNode> = HashMap::new();
    for (v, id) in value_class.iter().enumerate() {
        let node = if v < func.params.len() {
            TensorNode::Param(v as u32)
        } else {
            match original.get(id) {
                Some(n) => n.clone().map_children(|c| egraph.find(c)),
                None => continue,
            }
        };
        out.entry(egraph.find(*id)).or_insert(node);
    }
    out
}

/// The graph reachable from `roots` when every class in `forced` takes its input node and
/// every other class its node in `full` (classes `full` does not reach take their input
/// node too, or, lacking one, their cheapest); `None` when that graph has a cycle.
pub(super) fn choose_with_forced(
    egraph: &FusionGraph,
    table: &CostTable,
    full: &BTreeMap<Id, TensorNode>,
    inputs: &HashMap<Id, TensorNode>,
    roots: &[Id],
    forced: &BTreeSet<Id>,
) -> Option<BTreeMap<Id, TensorNode>> {
    let pick = |c: Id| -> Option<TensorNode> {
        let from_input = || inputs.get(&c).cloned();
        let from_full = || full.get(&c).cloned();
        let cheapest = || {
            table.nodes.get(&c).and_then(|list| {
                list.iter()
                    .min_by(|a, b| a.1.total_cmp(&b.1))
                    .map(|(n, _)| n.clone())
            })
        };
        if forced.contains(&c) || !full.contains_key(&c) {
            from_input().or_else(from_full).or_else(cheapest)
        } else {
            from_full()
        }
    };
    // Iterative DFS with colours: on the stack (false) or done (true).
    let mut state: HashMap<Id, bool> = HashMap::new();
    let mut chosen = BTreeMap::new();
    for &root in roots {
        let root = egraph.find(root);
        if state.contains_key(&root) {
            continue;
        }
        let node = pick(root)?;
        state.insert(root, false);
        let mut stack: Vec<(Id, TensorNode, usize)> = vec![(root, node, 0)];
        while let Some((class, node, next)) = stack.last_mut() {
            if let Some(&child) = node.children().get(*next) {
                *next += 1;
                let child = egraph.find(child);
                match state.get(&child) {
                    Some(false) => return None,
                    Some(true) => {}
                    None => {
                        let n = pick(child)?;
                        state.insert(child, false);
                        stack.push((child, n, 0));
                    }
                }
            } else {
                state.insert(*class, true);
                chosen.insert(*class, node.clone());
                stack.pop();
            }
        }
    }
    Some(chosen)
}

/// Withholds the fusion sites at `classes` (undoing them back to the input's nodes), last
/// first, skipping any whose undoing would make the graph cyclic. Returns the resulting
/// choice and the classes actually withheld.
pub(super) fn withhold_sites(
    egraph: &FusionGraph,
    table: &CostTable,
    full: &BTreeMap<Id, TensorNode>,
    inputs: &HashMap<Id, TensorNode>,
    roots: &[Id],
    classes: &[Id],
) -> (BTreeMap<Id, TensorNode>, BTreeSet<Id>) {
    let mut forced: BTreeSet<Id> = BTreeSet::new();
    let mut chosen = full.clone();
    for &class in classes.iter().rev() {
        forced.insert(class);
        match choose_with_forced(egraph, table, full, inputs, roots, &forced) {
            Some(c) => chosen = c,
            None => {
                forced.remove(&class);
            }
        }
    }
    (chosen, forced)
}

/// The total cost of a chosen graph (each class once); `None` if a node has no cost.
pub(super) fn chosen_cost(table: &CostTable, chosen: &BTreeMap<Id, TensorNode>) -> Option<f64> {
    chosen
        .iter()
        .map(|(c, n)| {
            table
                .nodes
                .get(c)?
                .iter()
                .find(|(m, _)| m == n)
                .map(|(_, cost)| *cost)
        })
        .sum()
}

/// Rebuilds a function from the chosen nodes: post-order from the results, operands in
/// order, so the output order is canonical. Returns the function, its fusion sites and
/// the class of each site.
pub(super) fn emit(
    input: &Func,
    egraph: &FusionGraph,
    chosen: &BTreeMap<Id, TensorNode>,
    roots: &[Id],
) -> Result<(Func, Vec<FusionSite>, Vec<Id>), PassError> {
    let internal = |m: String| PassError::Internal {
        pass: "fusion",
        message: m,
    };
    let weight_loc: HashMap<u32, Location> = input
        .insts
        .iter()
        .rev()
        .filter_map(|i| match i.op {
            Op::Const(w) => Some((w.0, i.loc.clone())),
            _ => None,
        })
        .collect();
    let mut out = Func {
        name: input.name.clone(),
        params: input.params.clone(),
        insts: Vec::new(),
        results: Vec::new(),
        loc: input.loc.clone(),
    };
    let mut sites = Vec::new();
    let mut site_classes = Vec::new();
    let mut value_of: HashMap<Id, Value> = HashMap::new();
    for &root in roots {
        let root = egraph.find(root);
        // Iterative post-order.
        let mut stack: Vec<(Id, bool)> = vec![(root, false)];
        while let Some((class, expanded)) = stack.pop() {
            if value_of.contains_key(&class) {
                continue;
            }
            let node = chosen
                .get(&class)
                .ok_or_else(|| internal(format!("class {class} has no chosen node")))?;
            if !expanded {
                stack.push((class, true));
                for c in node.operands().iter().rev() {
                    let c = egraph.find(*c);
                    if !value_of.contains_key(&c) {
                        stack.push((c, false));
                    }
                }
                continue;
            }
            let value = match node {
                TensorNode::Param(p) => Value(*p),
                TensorNode::Attr(_) => return Err(internal("attribute used as a value".into())),
                TensorNode::Weight(w) => {
                    let ty = egraph[class]
                        .data
                        .ty
                        .clone()
                        .ok_or_else(|| internal(format!("weight {} has no type", w.0)))?;
                    out.insts.push(Inst {
                        op: Op::Const(*w),
                        operands: Vec::new(),
                        ty,
                        loc: weight_loc.get(&w.0).cloned().unwrap_or_default(),
                    });
                    out.inst_value(out.insts.len() - 1)
                }
                TensorNode::Op(..) => {
                    let op = egraph
                        .analysis
                        .op_of(egraph, node)
                        .ok_or_else(|| internal("op node without attributes".into()))?;
                    let operands: Vec<Value> = node
                        .operands()
                        .iter()
                        .map(|c| value_of[&egraph.find(*c)])
                        .collect();
                    let types: Vec<&TensorType> =
                        operands.iter().map(|v| out.type_of(*v)).collect();
                    let weights = &egraph.analysis.weight_types;
                    let ty = op
                        .infer_type(&types, &|w| weights.get(w.0 as usize).cloned())
                        .map_err(|m| {
                            internal(format!("extracted '{}' is ill-typed: {m}", op.name()))
                        })?;
                    let none = Provenance::default();
                    let prov = FusionAnalysis::provenance_ref(egraph, node).unwrap_or(&none);
                    let merged_insts: Vec<&Inst> = prov
                        .insts
                        .iter()
                        .filter_map(|i| input.insts.get(*i))
                        .collect();
                    let merged: Vec<Location> =
                        merged_insts.iter().map(|inst| inst.loc.clone()).collect();
                    let loc = Location::fuse(merged.clone());
                    // Weight-prep ops are folded away by const_fold; they are not sites.
                    if !prov.rules.is_empty() && !op.is_weight_prep() {
                        sites.push(FusionSite {
                            inst: out.insts.len(),
                            op: op_summary(&op),
                            rules: prov.rules.iter().map(|r| r.to_string()).collect(),
                            merged_ops: merged_insts
                                .iter()
                                .map(|inst| inst.op.name().to_string())
                                .collect(),
                            merged,
                        });
                        site_classes.push(class);
                    }
                    out.insts.push(Inst {
                        op,
                        operands,
                        ty,
                        loc,
                    });
                    out.inst_value(out.insts.len() - 1)
                }
            };
            value_of.insert(class, value);
        }
    }
    out.results = input
        .results
        .iter()
        .zip(roots)
        .map(|(r, root)| FuncResult {
            name: r.name.clone(),
            value: value_of[&egraph.find(*root)],
        })
        .collect();
    Ok((out, sites, site_classes))
}
