//! DAG-aware extraction: choose one e-node per needed e-class so the whole graph (every
//! shared class paid once) is cheapest under the cost model.
//!
//! egg's `Extractor` costs trees, so a class feeding two consumers is paid twice
//! (FACTS.md: it computed a shared conv twice). Here the cost of a choice is the sum of
//! the node costs of the classes reachable from the roots, each counted once. The
//! search is greedy: start from (a) the per-class cheapest tree and (b) the input
//! program's own nodes, improve each by single-class changes while the DAG cost drops,
//! keep the cheaper. Ties break by node order (deterministic: node ids come from the
//! input in order). Every candidate is checked acyclic.

use std::collections::{BTreeMap, HashMap};

use egg::{Id, Language};

use super::analysis::FusionGraph;
use super::cost::CostModel;
use super::lang::TensorNode;
use smelt_ir::op::Op;

/// The usable nodes of every class with their own costs, sorted by node order.
pub struct CostTable {
    /// Canonical class ids in increasing order.
    pub classes: Vec<Id>,
    /// For each class: (node, own cost).
    pub nodes: HashMap<Id, Vec<(TensorNode, f64)>>,
}

impl CostTable {
    /// Costs every node of the e-graph.
    pub fn new(egraph: &FusionGraph, model: &CostModel) -> CostTable {
        let mut classes: Vec<Id> = egraph.classes().map(|c| c.id).collect();
        classes.sort();
        let mut nodes = HashMap::new();
        for &c in &classes {
            let mut list: Vec<(TensorNode, f64)> = egraph[c]
                .nodes
                .iter()
                .filter_map(|n| {
                    let n = n.clone().map_children(|k| egraph.find(k));
                    model.node_cost(egraph, c, &n).map(|cost| (n, cost))
                })
                .collect();
            // Equal costs prefer fewer post-ops (gemm's own C operand over an absorbed
            // bias add), then node order.
            let post_ops = |n: &TensorNode| match egraph.analysis.op_of(egraph, n) {
                Some(Op::Fused(f)) => f.post_ops.len(),
                _ => 0,
            };
            list.sort_by(|a, b| (post_ops(&a.0), &a.0).cmp(&(post_ops(&b.0), &b.0)));
            list.dedup_by(|a, b| a.0 == b.0);
            nodes.insert(c, list);
        }
        CostTable { classes, nodes }
    }
}

/// A choice of one node index per class (into [`CostTable::nodes`]).
pub type Choice = HashMap<Id, usize>;

/// The chosen graph.
#[derive(Clone, Debug)]
pub struct Extraction {
    /// The chosen node of every class reachable from the roots.
    pub chosen: BTreeMap<Id, TensorNode>,
    /// Its total cost in seconds (each class once).
    pub cost: f64,
    /// The cost of the input program's own nodes (before fusion), when it is complete.
    pub input_cost: Option<f64>,
}

fn better(a: f64, b: f64) -> bool {
    a < b - 1e-12 * b.abs().max(1e-30)
}

/// The DAG cost of `choice` from `roots`, or `None` when it is cyclic or incomplete.
pub fn dag_cost(table: &CostTable, choice: &Choice, roots: &[Id]) -> Option<f64> {
    // 0 = unseen, 1 = on the stack, 2 = done
    let mut state: HashMap<Id, u8> = HashMap::new();
    let mut total = 0.0;
    for &root in roots {
        if state.get(&root) == Some(&2) {
            continue;
        }
        let mut stack: Vec<(Id, usize)> = vec![(root, 0)];
        state.insert(root, 1);
        while let Some(&(class, next)) = stack.last() {
            let idx = *choice.get(&class)?;
            let (node, cost) = table.nodes.get(&class)?.get(idx)?;
            let children = node.children();
            if next < children.len() {
                let child = children[next];
                if let Some(top) = stack.last_mut() {
                    top.1 += 1;
                }
                match state.get(&child) {
                    Some(1) => return None,
                    Some(_) => {}
                    None => {
                        state.insert(child, 1);
                        stack.push((child, 0));
                    }
                }
            } else {
                total += cost;
                state.insert(class, 2);
                stack.pop();
            }
        }
    }
    Some(total)
}

/// The cheapest tree per class (children's best costs summed), to a fixpoint.
fn greedy_tree(table: &CostTable) -> Choice {
    let mut best: HashMap<Id, (f64, usize)> = HashMap::new();
    loop {
        let mut changed = false;
        for c in &table.classes {
            for (i, (node, own)) in table.nodes[c].iter().enumerate() {
                let mut children: Vec<Id> = node.children().to_vec();
                children.sort();
                children.dedup();
                let mut total = *own;
                let mut ready = true;
                for k in &children {
                    match best.get(k) {
                        Some((cost, _)) => total += cost,
                        None => {
                            ready = false;
                            break;
                        }
                    }
                }
                if !ready {
                    continue;
                }
                let replace = match best.get(c) {
                    None => true,
                    Some((cur, _)) => better(total, *cur),
                };
                if replace {
                    best.insert(*c, (total, i));
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    best.into_iter().map(|(c, (_, i))| (c, i)).collect()
}

/// A child class that has no entry in the cost table.
const MISSING: usize = usize::MAX;

/// The cost table in dense form for the search: classes by index (in
/// [`CostTable::classes`] order), each node's children as class indices.
struct Dense {
    /// Dense index of every class of the table.
    index: HashMap<Id, usize>,
    /// Per class, per node: children (attribute leaf included, in node order).
    kids: Vec<Vec<Vec<usize>>>,
    /// Per class, per node: own cost.
    costs: Vec<Vec<f64>>,
}

/// Scratch space of [`Dense::cost`], reused across calls.
#[derive(Default)]
struct Walk {
    /// 0 = unseen, 1 = on the stack, 2 = done.
    state: Vec<u8>,
    stack: Vec<(usize, usize)>,
}

impl Dense {
    fn new(table: &CostTable) -> Dense {
        let index: HashMap<Id, usize> = table
            .classes
            .iter()
            .enumerate()
            .map(|(i, c)| (*c, i))
            .collect();
        let mut kids = Vec::with_capacity(table.classes.len());
        let mut costs = Vec::with_capacity(table.classes.len());
        for c in &table.classes {
            let list = &table.nodes[c];
            kids.push(
                list.iter()
                    .map(|(n, _)| {
                        n.children()
                            .iter()
                            .map(|k| index.get(k).copied().unwrap_or(MISSING))
                            .collect()
                    })
                    .collect(),
            );
            costs.push(list.iter().map(|(_, cost)| *cost).collect());
        }
        Dense { index, kids, costs }
    }

    /// [`dag_cost`] over dense indices: the same walk in the same order (so the same
    /// floating-point sum); `choice[c] == MISSING` means no choice. On success,
    /// `walk.state[c] == 2` exactly for the classes reachable from the roots.
    fn cost(&self, choice: &[usize], roots: &[usize], walk: &mut Walk) -> Option<f64> {
        walk.state.clear();
        walk.state.resize(self.kids.len(), 0);
        walk.stack.clear();
        let mut total = 0.0;
        for &root in roots {
            if root == MISSING {
                return None;
            }
            if walk.state[root] == 2 {
                continue;
            }
            walk.stack.push((root, 0));
            walk.state[root] = 1;
            while let Some(top) = walk.stack.last_mut() {
                let (class, next) = *top;
                let idx = *choice.get(class)?;
                let children = self.kids[class].get(idx)?;
                if let Some(&child) = children.get(next) {
                    top.1 += 1;
                    if child == MISSING {
                        return None;
                    }
                    match walk.state[child] {
                        1 => return None,
                        0 => {
                            walk.state[child] = 1;
                            walk.stack.push((child, 0));
                        }
                        _ => {}
                    }
                } else {
                    total += self.costs[class][idx];
                    walk.state[class] = 2;
                    walk.stack.pop();
                }
            }
        }
        Some(total)
    }
}

/// Improves `choice` by single-class changes while the DAG cost drops.
///
/// A class the current graph does not reach is skipped: changing its node cannot change
/// the graph's cost, so trying it could only be refused.
fn improve(table: &CostTable, choice: Choice, roots: &[Id]) -> Option<(Choice, f64)> {
    let dense = Dense::new(table);
    let mut current: Vec<usize> = table
        .classes
        .iter()
        .map(|c| choice.get(c).copied().unwrap_or(MISSING))
        .collect();
    let roots: Vec<usize> = roots
        .iter()
        .map(|r| dense.index.get(r).copied().unwrap_or(MISSING))
        .collect();
    let mut walk = Walk::default();
    let mut cost = dense.cost(&current, &roots, &mut walk)?;
    let mut reached: Vec<bool> = walk.state.iter().map(|s| *s == 2).collect();
    let candidates: Vec<usize> = (0..dense.kids.len())
        .filter(|c| dense.kids[*c].len() > 1)
        .collect();
    for _sweep in 0..8 {
        let mut improved = false;
        for &c in &candidates {
            let chosen = current[c];
            if chosen == MISSING || !reached[c] {
                continue;
            }
            for i in 0..dense.kids[c].len() {
                if i == chosen {
                    continue;
                }
                current[c] = i;
                match dense.cost(&current, &roots, &mut walk) {
                    Some(new) if better(new, cost) => {
                        cost = new;
                        improved = true;
                        for (r, s) in reached.iter_mut().zip(&walk.state) {
                            *r = *s == 2;
                        }
                        break;
                    }
                    _ => {
                        current[c] = chosen;
                    }
                }
            }
        }
        if !improved {
            break;
        }
    }
    let choice = table
        .classes
        .iter()
        .zip(&current)
        .filter(|(_, i)| **i != MISSING)
        .map(|(c, i)| (*c, *i))
        .collect();
    Some((choice, cost))
}

/// Extracts the cheapest graph found from `roots`. `original` gives, per class, the node
/// the input program used there (the second starting point of the search).
pub fn extract(
    egraph: &FusionGraph,
    table: &CostTable,
    roots: &[Id],
    original: &BTreeMap<Id, TensorNode>,
) -> Result<Extraction, String> {
    let roots: Vec<Id> = roots.iter().map(|r| egraph.find(*r)).collect();
    let greedy = greedy_tree(table);
    let mut from_input = greedy.clone();
    for (class, node) in original {
        let class = egraph.find(*class);
        let node = node.clone().map_children(|k| egraph.find(k));
        if let Some(i) = table.nodes[&class].iter().position(|(n, _)| *n == node) {
            from_input.insert(class, i);
        }
    }
    let input_cost = dag_cost(table, &from_input, &roots);
    let a = improve(table, greedy, &roots);
    let b = improve(table, from_input, &roots);
    let (choice, cost) = match (a, b) {
        (Some(a), Some(b)) => {
            if better(b.1, a.1) {
                b
            } else {
                a
            }
        }
        (Some(a), None) => a,
        (None, Some(b)) => b,
        (None, None) => return Err("no acyclic, well-typed graph could be extracted".to_string()),
    };
    // Keep only the reachable classes.
    let mut chosen = BTreeMap::new();
    let mut stack = roots.clone();
    while let Some(c) = stack.pop() {
        if chosen.contains_key(&c) {
            continue;
        }
        let node = table.nodes[&c][choice[&c]].0.clone();
        stack.extend(node.children().iter().copied());
        chosen.insert(c, node);
    }
    Ok(Extraction {
        chosen,
        cost,
        input_cost,
    })
}
