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
//!
//! Anchors (conv, gemm, matmul, norms, pools) are never computed twice: a graph that
//! computes the same anchor on the same operands in two classes (a conv fused into two
//! consumers with different post-ops) loses to any graph with fewer such duplicates,
//! whatever the roofline says. The roofline prices a small conv by its bytes, so two
//! fused convs reading the same input can look cheaper than one conv and a few
//! elementwise kernels; but an anchor reduces over many inputs per output, and its
//! real cost grows with its work, which duplicating doubles.

use std::collections::{BTreeMap, HashMap};

use egg::{Id, Language};

use super::analysis::FusionGraph;
use super::cost::CostModel;
use super::lang::TensorNode;
use smelt_ir::op::Op;

/// What an anchor computes, fused or not: the anchor op and its own operand classes
/// (post-op operands left out). Two nodes with the same key compute the same values.
type AnchorKey = (Op, Vec<Id>);

/// The usable nodes of every class with their own costs, sorted by node order.
pub struct CostTable {
    /// Canonical class ids in increasing order.
    pub classes: Vec<Id>,
    /// For each class: (node, own cost).
    pub nodes: HashMap<Id, Vec<(TensorNode, f64)>>,
    /// For each class, parallel to `nodes`: the anchor computation of each node computed
    /// at run time (an anchor op, or a fused op's anchor), `None` for other nodes.
    anchors: HashMap<Id, Vec<Option<AnchorKey>>>,
}

/// The anchor computation `node` performs at run time, if it is one (see [`AnchorKey`]).
fn anchor_key(egraph: &FusionGraph, node: &TensorNode, cost: f64) -> Option<AnchorKey> {
    if cost == 0.0 {
        // constant operands only: folded at compile time, never run
        return None;
    }
    let operands = node.operands();
    let op = egraph.analysis.op_of(egraph, node)?;
    if let Op::Fused(f) = op {
        let own = operands.len().checked_sub(f.num_post_operands())?;
        return Some((*f.anchor, operands[..own].to_vec()));
    }
    op.is_anchor().then(|| (op, operands.to_vec()))
}

impl CostTable {
    /// Costs every node of the e-graph.
    pub fn new(egraph: &FusionGraph, model: &CostModel) -> CostTable {
        let mut classes: Vec<Id> = egraph.classes().map(|c| c.id).collect();
        classes.sort();
        let mut nodes = HashMap::new();
        let mut anchors = HashMap::new();
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
            anchors.insert(
                c,
                list.iter()
                    .map(|(n, cost)| anchor_key(egraph, n, *cost))
                    .collect(),
            );
            nodes.insert(c, list);
        }
        CostTable {
            classes,
            nodes,
            anchors,
        }
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

/// A node that computes no anchor (in [`Dense::anchors`]).
const NO_ANCHOR: usize = usize::MAX;

/// How good a graph is: first the number of anchor computations it repeats (see the
/// module doc), then its cost in seconds.
#[derive(Clone, Copy, Debug)]
struct Score {
    repeated_anchors: usize,
    cost: f64,
}

impl Score {
    /// Whether `self` is strictly better than `other`.
    fn beats(self, other: Score) -> bool {
        self.repeated_anchors < other.repeated_anchors
            || (self.repeated_anchors == other.repeated_anchors && better(self.cost, other.cost))
    }
}

/// The cost table in dense form for the search: classes by index (in
/// [`CostTable::classes`] order), each node's children as class indices.
struct Dense {
    /// Dense index of every class of the table.
    index: HashMap<Id, usize>,
    /// Per class, per node: children (attribute leaf included, in node order).
    kids: Vec<Vec<Vec<usize>>>,
    /// Per class, per node: own cost.
    costs: Vec<Vec<f64>>,
    /// Per class, per node: the dense id of the anchor computation it performs, or
    /// [`NO_ANCHOR`].
    anchors: Vec<Vec<usize>>,
    /// How many distinct anchor computations there are.
    num_anchors: usize,
}

/// Scratch space of [`Dense::cost`], reused across calls.
#[derive(Default)]
struct Walk {
    /// 0 = unseen, 1 = on the stack, 2 = done.
    state: Vec<u8>,
    stack: Vec<(usize, usize)>,
    /// Per anchor computation: whether a reached class already computes it.
    anchor_seen: Vec<bool>,
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
        let mut anchors = Vec::with_capacity(table.classes.len());
        let mut anchor_ids: HashMap<&AnchorKey, usize> = HashMap::new();
        for c in &table.classes {
            anchors.push(
                table.anchors[c]
                    .iter()
                    .map(|key| match key {
                        Some(key) => {
                            let next = anchor_ids.len();
                            *anchor_ids.entry(key).or_insert(next)
                        }
                        None => NO_ANCHOR,
                    })
                    .collect(),
            );
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
        Dense {
            index,
            kids,
            costs,
            anchors,
            num_anchors: anchor_ids.len(),
        }
    }

    /// [`dag_cost`] over dense indices: the same walk in the same order (so the same
    /// floating-point sum), with the anchor computations repeated along the way;
    /// `choice[c] == MISSING` means no choice. On success, `walk.state[c] == 2` exactly
    /// for the classes reachable from the roots.
    fn score(&self, choice: &[usize], roots: &[usize], walk: &mut Walk) -> Option<Score> {
        walk.state.clear();
        walk.state.resize(self.kids.len(), 0);
        walk.stack.clear();
        walk.anchor_seen.clear();
        walk.anchor_seen.resize(self.num_anchors, false);
        let mut total = 0.0;
        let mut repeated_anchors = 0;
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
                    let anchor = self.anchors[class][idx];
                    if anchor != NO_ANCHOR {
                        if walk.anchor_seen[anchor] {
                            repeated_anchors += 1;
                        }
                        walk.anchor_seen[anchor] = true;
                    }
                    walk.state[class] = 2;
                    walk.stack.pop();
                }
            }
        }
        Some(Score {
            repeated_anchors,
            cost: total,
        })
    }
}

/// Improves `choice` by single-class changes while its [`Score`] improves.
///
/// A class the current graph does not reach is skipped: changing its node cannot change
/// the graph's cost, so trying it could only be refused.
fn improve(table: &CostTable, choice: Choice, roots: &[Id]) -> Option<(Choice, Score)> {
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
    let mut score = dense.score(&current, &roots, &mut walk)?;
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
                match dense.score(&current, &roots, &mut walk) {
                    Some(new) if new.beats(score) => {
                        score = new;
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
    Some((choice, score))
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
    let (choice, score) = match (a, b) {
        (Some(a), Some(b)) => {
            if b.1.beats(a.1) {
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
        cost: score.cost,
        input_cost,
    })
}
