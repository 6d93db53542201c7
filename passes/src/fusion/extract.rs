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
//! A candidate change is priced incrementally ([`Reached`]): only the classes it makes
//! reachable or unreachable are walked, and its cycle check stops at classes that finish
//! before the changed one in the current graph's walk (they cannot reach it). Only a
//! change that wins is scored by a walk of the whole graph — the score kept, so the
//! search's scores are the same sums as a full walk gives.
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
    /// The reached classes in the order the walk finished them (children first).
    finished: Vec<usize>,
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
        walk.finished.clear();
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
                    walk.finished.push(class);
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

/// The graph of the current choice, kept to price a single-class change without walking
/// the whole graph: how many chosen nodes (and roots) reference each class, where the
/// full walk finished each reached class, how many reached classes compute each anchor.
struct Reached {
    /// References to each class from the chosen nodes of reached classes, and from the
    /// roots; a class is reached when it has any.
    refs: Vec<u32>,
    /// Position of each reached class in the full walk's finishing order; `usize::MAX`
    /// for the others. A class can only reach classes that finished before it.
    finished_at: Vec<usize>,
    /// Reached classes computing each anchor.
    anchor_count: Vec<u32>,
    /// The current graph's score.
    score: Score,
    /// Scratch of the cycle check: 0 = unseen, 1 = on the stack, 2 = done; the classes
    /// it marked (to clear).
    seen: Vec<u8>,
    marked: Vec<usize>,
    stack: Vec<(usize, usize)>,
    /// Scratch of [`Reached::shift_ref`]: the classes whose reference changes next.
    todo: Vec<usize>,
}

/// What a single-class change adds up to while it is priced: the costs of the classes
/// it makes reachable and unreachable, and the repeated anchors it leaves.
struct Tally {
    added: f64,
    removed: f64,
    repeats: i64,
}

impl Reached {
    /// The graph `walk` just walked for `choice` (its score `score`).
    fn new(dense: &Dense, choice: &[usize], roots: &[usize], walk: &Walk, score: Score) -> Reached {
        let n = dense.kids.len();
        let mut refs = vec![0u32; n];
        let mut finished_at = vec![usize::MAX; n];
        let mut anchor_count = vec![0u32; dense.num_anchors];
        for &r in roots {
            refs[r] += 1;
        }
        for (at, &c) in walk.finished.iter().enumerate() {
            finished_at[c] = at;
            let node = choice[c];
            for &k in &dense.kids[c][node] {
                refs[k] += 1;
            }
            let anchor = dense.anchors[c][node];
            if anchor != NO_ANCHOR {
                anchor_count[anchor] += 1;
            }
        }
        Reached {
            refs,
            finished_at,
            anchor_count,
            score,
            seen: vec![0; n],
            marked: Vec::new(),
            stack: Vec::new(),
            todo: Vec::new(),
        }
    }

    fn is_reached(&self, c: usize) -> bool {
        self.refs[c] > 0
    }

    /// The score of the graph with reached class `c` switched to its node `node`, or
    /// `None` when that graph is cyclic or incomplete (as [`Dense::score`] would find);
    /// the graph itself is left as it was. Its cost is summed in another order than a
    /// whole walk's, so it may differ from that walk's in the last bits.
    fn score_switch(
        &mut self,
        dense: &Dense,
        choice: &[usize],
        c: usize,
        node: usize,
    ) -> Option<Score> {
        if !self.acyclic_below(dense, choice, c, node) {
            return None;
        }
        let old = choice[c];
        let before = self.score;
        let mut tally = Tally {
            added: 0.0,
            removed: 0.0,
            repeats: before.repeated_anchors as i64,
        };
        // the new node first, so classes both nodes reach are never dropped on the way
        self.count_anchor(dense.anchors[c][node], true, &mut tally.repeats);
        self.count_anchor(dense.anchors[c][old], false, &mut tally.repeats);
        for &k in &dense.kids[c][node] {
            self.shift_ref(dense, choice, k, true, &mut tally);
        }
        for &k in &dense.kids[c][old] {
            self.shift_ref(dense, choice, k, false, &mut tally);
        }
        let cost =
            before.cost + dense.costs[c][node] - dense.costs[c][old] + tally.added - tally.removed;
        let switched = Score {
            repeated_anchors: tally.repeats.max(0) as usize,
            cost,
        };
        // and back: the same counts, undone
        for &k in &dense.kids[c][old] {
            self.shift_ref(dense, choice, k, true, &mut tally);
        }
        for &k in &dense.kids[c][node] {
            self.shift_ref(dense, choice, k, false, &mut tally);
        }
        self.count_anchor(dense.anchors[c][old], true, &mut tally.repeats);
        self.count_anchor(dense.anchors[c][node], false, &mut tally.repeats);
        debug_assert_eq!(tally.repeats as usize, before.repeated_anchors);
        Some(switched)
    }

    /// One more (`up`) or one fewer reached class computing `anchor`.
    fn count_anchor(&mut self, anchor: usize, up: bool, repeats: &mut i64) {
        if anchor == NO_ANCHOR {
            return;
        }
        if up {
            if self.anchor_count[anchor] > 0 {
                *repeats += 1;
            }
            self.anchor_count[anchor] += 1;
        } else {
            self.anchor_count[anchor] -= 1;
            if self.anchor_count[anchor] > 0 {
                *repeats -= 1;
            }
        }
    }

    /// One reference more (`up`) or fewer to class `k`: a class this makes reachable
    /// adds its node's cost to `tally.added` and references its children in turn; one it
    /// leaves unreachable adds its cost to `tally.removed` and drops its references.
    fn shift_ref(
        &mut self,
        dense: &Dense,
        choice: &[usize],
        k: usize,
        up: bool,
        tally: &mut Tally,
    ) {
        self.todo.clear();
        self.todo.push(k);
        while let Some(k) = self.todo.pop() {
            let flipped = if up {
                self.refs[k] += 1;
                self.refs[k] == 1
            } else {
                self.refs[k] -= 1;
                self.refs[k] == 0
            };
            if flipped {
                let node = choice[k];
                let sum = if up {
                    &mut tally.added
                } else {
                    &mut tally.removed
                };
                *sum += dense.costs[k][node];
                self.count_anchor(dense.anchors[k][node], up, &mut tally.repeats);
                self.todo.extend_from_slice(&dense.kids[k][node]);
            }
        }
    }

    /// Whether the graph with class `c` switched to `node` is acyclic and complete below
    /// `c`: no class the node reaches reaches `c`, and every class it newly reaches has a
    /// choice and no missing child. The walk stops at reached classes that finished
    /// before `c` (they cannot reach it, and the current graph has no cycle).
    fn acyclic_below(&mut self, dense: &Dense, choice: &[usize], c: usize, node: usize) -> bool {
        let limit = self.finished_at[c];
        let mut ok = true;
        'roots: for &k in &dense.kids[c][node] {
            if k == MISSING {
                ok = false;
                break;
            }
            self.stack.clear();
            self.stack.push((k, 0));
            while let Some(&(x, next)) = self.stack.last() {
                if next == 0 {
                    if x == c {
                        ok = false;
                        break 'roots;
                    }
                    let done = self.seen[x] == 2
                        || (self.finished_at[x] != usize::MAX && self.finished_at[x] < limit);
                    if done {
                        self.stack.pop();
                        continue;
                    }
                    if self.seen[x] == 1 || choice[x] == MISSING {
                        ok = false;
                        break 'roots;
                    }
                    self.seen[x] = 1;
                    self.marked.push(x);
                }
                let kids = &dense.kids[x][choice[x]];
                match kids.get(next) {
                    Some(&child) => {
                        if child == MISSING {
                            ok = false;
                            break 'roots;
                        }
                        if let Some(top) = self.stack.last_mut() {
                            top.1 += 1;
                        }
                        if self.seen[child] != 2 {
                            self.stack.push((child, 0));
                        }
                    }
                    None => {
                        self.seen[x] = 2;
                        self.stack.pop();
                    }
                }
            }
        }
        for &x in &self.marked {
            self.seen[x] = 0;
        }
        self.marked.clear();
        ok
    }
}

/// Improves `choice` by single-class changes while its [`Score`] improves.
///
/// A class the current graph does not reach is skipped: changing its node cannot change
/// the graph's cost, so trying it could only be refused.
fn improve(
    table: &CostTable,
    dense: &Dense,
    choice: Choice,
    roots: &[Id],
) -> Option<(Choice, Score)> {
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
    let mut graph = Reached::new(dense, &current, &roots, &walk, score);
    let candidates: Vec<usize> = (0..dense.kids.len())
        .filter(|c| dense.kids[*c].len() > 1)
        .collect();
    for _sweep in 0..8 {
        let mut improved = false;
        for &c in &candidates {
            let chosen = current[c];
            if chosen == MISSING || !graph.is_reached(c) {
                continue;
            }
            for i in 0..dense.kids[c].len() {
                if i == chosen {
                    continue;
                }
                let wins = graph
                    .score_switch(dense, &current, c, i)
                    .is_some_and(|s| s.beats(score));
                if !wins {
                    continue;
                }
                // the winner's score by a whole walk, the sum every score here is
                current[c] = i;
                match dense.score(&current, &roots, &mut walk) {
                    Some(new) if new.beats(score) => {
                        score = new;
                        graph = Reached::new(dense, &current, &roots, &walk, score);
                        improved = true;
                        break;
                    }
                    _ => current[c] = chosen,
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
    let dense = Dense::new(table);
    let a = improve(table, &dense, greedy, &roots);
    let b = improve(table, &dense, from_input, &roots);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
        }
    }

    /// Random classes of 1–3 nodes, each with up to 3 children among the classes after
    /// it (and now and then before it, or missing, so that some switches close cycles or
    /// reach a class without a table entry), costs in 0..4, a few shared anchors.
    fn random_dense(rng: &mut Rng, n: usize) -> Dense {
        let (mut kids, mut costs, mut anchors) = (Vec::new(), Vec::new(), Vec::new());
        for c in 0..n {
            let nodes = 1 + rng.below(3);
            kids.push(
                (0..nodes)
                    .map(|_| {
                        (0..rng.below(4))
                            .map(|_| match rng.below(12) {
                                0 => MISSING,
                                1 | 2 => rng.below(n),
                                _ if c + 1 < n => c + 1 + rng.below(n - c - 1),
                                _ => rng.below(n),
                            })
                            .collect()
                    })
                    .collect(),
            );
            costs.push((0..nodes).map(|_| rng.below(400) as f64 / 100.0).collect());
            anchors.push(
                (0..nodes)
                    .map(|_| match rng.below(3) {
                        0 => rng.below(4),
                        _ => NO_ANCHOR,
                    })
                    .collect(),
            );
        }
        Dense {
            index: HashMap::new(),
            kids,
            costs,
            anchors,
            num_anchors: 4,
        }
    }

    #[test]
    fn switches_are_priced_as_a_whole_walk_prices_them() {
        let mut rng = Rng(0x5eed_1234_abcd_0001);
        let (mut compared, mut refused) = (0, 0);
        for _graph in 0..1000 {
            let n = 2 + rng.below(14);
            let dense = random_dense(&mut rng, n);
            let roots = vec![0, rng.below(n)];
            let mut choice: Vec<usize> = dense.kids.iter().map(|k| rng.below(k.len())).collect();
            let mut walk = Walk::default();
            let Some(score) = dense.score(&choice, &roots, &mut walk) else {
                continue;
            };
            let mut graph = Reached::new(&dense, &choice, &roots, &walk, score);
            for c in 0..n {
                if !graph.is_reached(c) {
                    continue;
                }
                for node in 0..dense.kids[c].len() {
                    if node == choice[c] {
                        continue;
                    }
                    let priced = graph.score_switch(&dense, &choice, c, node);
                    let old = choice[c];
                    choice[c] = node;
                    let walked = dense.score(&choice, &roots, &mut Walk::default());
                    choice[c] = old;
                    match (priced, walked) {
                        (None, None) => refused += 1,
                        (Some(p), Some(w)) => {
                            assert_eq!(
                                p.repeated_anchors, w.repeated_anchors,
                                "class {c} → {node}"
                            );
                            assert!((p.cost - w.cost).abs() <= 1e-9 * w.cost.abs().max(1.0));
                            compared += 1;
                        }
                        (p, w) => panic!("class {c} → node {node}: priced {p:?}, walked {w:?}"),
                    }
                    // the graph is left as it was
                    let fresh = Reached::new(&dense, &choice, &roots, &walk, score);
                    assert_eq!(graph.refs, fresh.refs);
                    assert_eq!(graph.anchor_count, fresh.anchor_count);
                }
            }
        }
        assert!(
            compared > 200 && refused > 50,
            "compared {compared}, refused {refused}"
        );
    }
}
