//! Einsum (opset 12) by decomposition into the ops smelt already compiles: per operand,
//! repeated labels become a diagonal (`gather` of the flattened pair at `i·(n + 1)`), labels
//! no other operand or the output needs are summed out (`reduce_sum`), and size-1 labels
//! another operand broadcasts are dropped; operands then contract pairwise, left to right,
//! as one batched `matmul` each (shared kept labels the batch, shared summed ones the
//! reduction, the rest the rows and columns), and a last `transpose` puts the labels in
//! the output's order. Every contraction exporters write (attention's `bhqd,bhkd->bhqk`,
//! projections `bsd,de->bse`, outer products, traces) lowers this way with no new kernel.

use smelt_ir::op::{Op, ReduceAttrs, Reduction};
use smelt_ir::{DType, Diagnostic, Value};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::ConstTensor;

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "Einsum"              [12],                           from 12 => einsum;
};

/// An axis label: a letter (`a`–`z`, `A`–`Z` as their ASCII code) or, from
/// [`ELLIPSIS_BASE`] on, one of the broadcast dims an ellipsis stands for.
type Label = u32;

/// The first ellipsis label (dims an ellipsis covers, right-aligned across operands).
const ELLIPSIS_BASE: Label = 256;

/// The equation's labels: one list per operand and the output's.
struct Equation {
    operands: Vec<Vec<Label>>,
    output: Vec<Label>,
}

/// Parses `equation` for operands of `ranks`: ellipses expanded (aligned to the right, as
/// numpy broadcasts), the implicit output (no `->`) the ellipsis dims then the letters used
/// once, in ASCII order.
fn parse(equation: &str, ranks: &[usize]) -> Result<Equation, String> {
    let text: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (inputs, output) = match text.split_once("->") {
        Some((i, o)) => (i, Some(o)),
        None => (text.as_str(), None),
    };
    let terms: Vec<&str> = inputs.split(',').collect();
    if terms.len() != ranks.len() {
        return Err(format!(
            "equation '{equation}' names {} operands, the node has {}",
            terms.len(),
            ranks.len()
        ));
    }
    // letters and whether an ellipsis appears, per term
    let letters = |term: &str| -> Result<(Vec<Label>, Option<usize>), String> {
        let mut labels = Vec::new();
        let mut ellipsis = None;
        let mut rest = term;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("...") {
                if ellipsis.replace(labels.len()).is_some() {
                    return Err(format!("term '{term}' of '{equation}' has two ellipses"));
                }
                rest = after;
                continue;
            }
            let c = rest.chars().next().unwrap_or(' ');
            if !c.is_ascii_alphabetic() {
                return Err(format!(
                    "term '{term}' of '{equation}' holds '{c}': labels are letters and '...'"
                ));
            }
            labels.push(c as Label);
            rest = &rest[1..];
        }
        Ok((labels, ellipsis))
    };
    let mut parsed = Vec::with_capacity(terms.len());
    let mut ellipsis_rank = 0;
    for (term, &rank) in terms.iter().zip(ranks) {
        let (labels, ellipsis) = letters(term)?;
        let covered = match ellipsis {
            Some(_) if rank >= labels.len() => rank - labels.len(),
            None if rank == labels.len() => 0,
            _ => {
                return Err(format!(
                    "term '{term}' of '{equation}' labels {} axes of an operand of rank {rank}",
                    labels.len()
                ))
            }
        };
        ellipsis_rank = ellipsis_rank.max(covered);
        parsed.push((labels, ellipsis, covered));
    }
    let expand = |labels: &[Label], ellipsis: Option<usize>, covered: usize| -> Vec<Label> {
        let Some(at) = ellipsis else {
            return labels.to_vec();
        };
        let first = ELLIPSIS_BASE + (ellipsis_rank - covered) as Label;
        let mut out = labels[..at].to_vec();
        out.extend(first..ELLIPSIS_BASE + ellipsis_rank as Label);
        out.extend(&labels[at..]);
        out
    };
    let operands: Vec<Vec<Label>> = parsed.iter().map(|(l, e, c)| expand(l, *e, *c)).collect();
    let output = match output {
        Some(term) => {
            let (labels, ellipsis) = letters(term)?;
            let out = expand(&labels, ellipsis, ellipsis.map_or(0, |_| ellipsis_rank));
            for (j, l) in out.iter().enumerate() {
                if out[..j].contains(l) {
                    return Err(format!("output '{term}' of '{equation}' repeats a label"));
                }
                if *l < ELLIPSIS_BASE && !operands.iter().any(|o| o.contains(l)) {
                    return Err(format!(
                        "output '{term}' of '{equation}' has '{}', which no operand has",
                        char::from_u32(*l).unwrap_or('?')
                    ));
                }
            }
            out
        }
        None => {
            let mut out: Vec<Label> = (0..ellipsis_rank as Label)
                .map(|j| ELLIPSIS_BASE + j)
                .collect();
            let mut once: Vec<Label> = Vec::new();
            for l in operands.iter().flatten().filter(|&&l| l < ELLIPSIS_BASE) {
                let count = operands.iter().flatten().filter(|&&m| m == *l).count();
                if count == 1 && !once.contains(l) {
                    once.push(*l);
                }
            }
            once.sort_unstable();
            out.extend(once);
            out
        }
    };
    Ok(Equation { operands, output })
}

/// An operand on its way through the contraction: its value and each axis's label.
struct Term {
    value: Value,
    labels: Vec<Label>,
}

/// `perm` applied to `v` (nothing when it is the identity).
fn transpose(cx: &mut NodeCtx, v: Value, perm: Vec<usize>) -> Result<Value, Diagnostic> {
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(v);
    }
    cx.emit(Op::Transpose { perm }, &[v])
}

/// Takes the diagonals of repeated labels, drops size-1 axes whose label is larger
/// elsewhere (`sizes`), and sums out the labels not in `keep`.
fn prepare(
    cx: &mut NodeCtx,
    mut t: Term,
    keep: &[Label],
    sizes: &dyn Fn(Label) -> usize,
) -> Result<Term, Diagnostic> {
    // a repeated label: its two axes moved last, flattened, and the diagonal gathered
    while let Some((a, b)) = (0..t.labels.len())
        .flat_map(|a| (a + 1..t.labels.len()).map(move |b| (a, b)))
        .find(|&(a, b)| t.labels[a] == t.labels[b])
    {
        let dims = cx.type_of(t.value).dims.clone();
        if dims[a] != dims[b] {
            return Err(cx.err(
                "onnx-bad-model",
                format!(
                    "Einsum label repeated on axes {a} and {b} of sizes {} and {}: a diagonal \
                     needs equal sizes",
                    dims[a], dims[b]
                ),
            ));
        }
        let n = dims[a];
        let mut perm: Vec<usize> = (0..dims.len()).filter(|&k| k != a && k != b).collect();
        perm.extend([a, b]);
        let moved = transpose(cx, t.value, perm.clone())?;
        let mut flat: Vec<usize> = perm[..perm.len() - 2].iter().map(|&k| dims[k]).collect();
        flat.push(n * n);
        let flat_v = cx.reshape(moved, flat.clone())?;
        let name = cx.derived_name("diagonal");
        let positions = (0..n as i64).map(|i| i * (n as i64 + 1)).collect();
        let positions = cx.materialize(&ConstTensor::i64(vec![n], positions), &name)?;
        let axis = flat.len() - 1;
        t.value = cx.emit(Op::Gather { axis }, &[flat_v, positions])?;
        let label = t.labels[a];
        t.labels = perm[..perm.len() - 2]
            .iter()
            .map(|&k| t.labels[k])
            .collect();
        t.labels.push(label);
    }
    // size-1 axes another operand broadcasts: the value is constant along them
    let dims = cx.type_of(t.value).dims.clone();
    let broadcast: Vec<usize> = (0..dims.len())
        .filter(|&k| dims[k] == 1 && sizes(t.labels[k]) > 1)
        .collect();
    if !broadcast.is_empty() {
        let kept: Vec<usize> = (0..dims.len()).filter(|k| !broadcast.contains(k)).collect();
        t.value = cx.reshape(t.value, kept.iter().map(|&k| dims[k]).collect())?;
        t.labels = kept.iter().map(|&k| t.labels[k]).collect();
    }
    let summed: Vec<usize> = (0..t.labels.len())
        .filter(|&k| !keep.contains(&t.labels[k]))
        .collect();
    if !summed.is_empty() {
        let along = ReduceAttrs {
            axes: summed.clone(),
            keep_dims: false,
        };
        t.value = cx.emit(Op::Reduce(Reduction::Sum, along), &[t.value])?;
        t.labels = (0..t.labels.len())
            .filter(|k| !summed.contains(k))
            .map(|k| t.labels[k])
            .collect();
    }
    Ok(t)
}

/// `a` and `b` contracted by one batched `matmul`: shared labels in `keep` are the batch,
/// shared ones not in it are summed, the others become rows (`a`'s) and columns (`b`'s).
fn contract(cx: &mut NodeCtx, a: Term, b: Term, keep: &[Label]) -> Result<Term, Diagnostic> {
    let shared = |l: &Label| b.labels.contains(l);
    let batch: Vec<Label> = a
        .labels
        .iter()
        .copied()
        .filter(|l| shared(l) && keep.contains(l))
        .collect();
    let summed: Vec<Label> = a
        .labels
        .iter()
        .copied()
        .filter(|l| shared(l) && !keep.contains(l))
        .collect();
    let rows: Vec<Label> = a.labels.iter().copied().filter(|l| !shared(l)).collect();
    let cols: Vec<Label> = b
        .labels
        .iter()
        .copied()
        .filter(|l| !a.labels.contains(l))
        .collect();
    let a_dims = cx.type_of(a.value).dims.clone();
    let b_dims = cx.type_of(b.value).dims.clone();
    let pos = |labels: &[Label], l: Label| labels.iter().position(|&m| m == l).unwrap_or(0);
    let size_in = |labels: &[Label], dims: &[usize], group: &[Label]| -> Vec<usize> {
        group.iter().map(|&l| dims[pos(labels, l)]).collect()
    };
    let batch_dims = size_in(&a.labels, &a_dims, &batch);
    let row_dims = size_in(&a.labels, &a_dims, &rows);
    let col_dims = size_in(&b.labels, &b_dims, &cols);
    let k: usize = size_in(&a.labels, &a_dims, &summed).iter().product();
    let m: usize = row_dims.iter().product();
    let n: usize = col_dims.iter().product();
    let order = |labels: &[Label], groups: [&[Label]; 3]| -> Vec<usize> {
        groups
            .iter()
            .flat_map(|g| g.iter().map(|&l| pos(labels, l)))
            .collect()
    };
    let a_perm = order(&a.labels, [&batch, &rows, &summed]);
    let b_perm = order(&b.labels, [&batch, &summed, &cols]);
    let a_v = transpose(cx, a.value, a_perm)?;
    let b_v = transpose(cx, b.value, b_perm)?;
    let with_batch = |tail: [usize; 2]| -> Vec<usize> {
        let mut d = batch_dims.clone();
        d.extend(tail);
        d
    };
    let a_v = cx.reshape(a_v, with_batch([m, k]))?;
    let b_v = cx.reshape(b_v, with_batch([k, n]))?;
    let product = cx.emit(Op::MatMul, &[a_v, b_v])?;
    let mut dims = batch_dims.clone();
    dims.extend(&row_dims);
    dims.extend(&col_dims);
    let value = cx.reshape(product, dims)?;
    let mut labels = batch;
    labels.extend(rows);
    labels.extend(cols);
    Ok(Term { value, labels })
}

/// Einsum.
pub fn einsum(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["equation"])?;
    let equation = cx
        .attr_string("equation")?
        .ok_or_else(|| cx.bad_attr("equation", "is required"))?;
    let count = cx.num_inputs();
    if count == 0 {
        return Err(cx.err("onnx-bad-model", "Einsum needs at least one operand"));
    }
    let mut values = Vec::with_capacity(count);
    let mut ranks = Vec::with_capacity(count);
    for i in 0..count {
        let v = cx.value(i)?;
        let ty = cx.type_of(v);
        if ty.dtype != DType::F32 {
            return Err(cx.err(
                "onnx-unsupported-dtype",
                format!(
                    "Einsum operand {i} is {}: smelt contracts float32 (its matmul's type)",
                    ty.dtype
                ),
            ));
        }
        ranks.push(ty.dims.len());
        values.push(v);
    }
    let eq = parse(&equation, &ranks).map_err(|m| cx.bad_attr("equation", m))?;
    // each label's size: equal wherever it appears, or 1 where it broadcasts
    let mut sizes: Vec<(Label, usize)> = Vec::new();
    for (i, labels) in eq.operands.iter().enumerate() {
        let dims = cx.type_of(values[i]).dims.clone();
        for (&l, &d) in labels.iter().zip(&dims) {
            match sizes.iter_mut().find(|(m, _)| *m == l) {
                None => sizes.push((l, d)),
                Some((_, s)) if *s == d || d == 1 => {}
                Some((_, s)) if *s == 1 => *s = d,
                Some((_, s)) => {
                    return Err(cx.bad_attr(
                        "equation",
                        format!(
                            "label '{}' is {s} long in one operand and {d} in operand {i}",
                            label_name(l)
                        ),
                    ))
                }
            }
        }
    }
    let size_of = |l: Label| sizes.iter().find(|(m, _)| *m == l).map_or(1, |&(_, s)| s);
    // the labels still needed after operand `i`: the output's and the later operands'
    let needed_after = |i: usize| -> Vec<Label> {
        let mut keep = eq.output.clone();
        keep.extend(eq.operands[i + 1..].iter().flatten());
        keep
    };
    let mut terms = values.into_iter().zip(eq.operands.iter().cloned());
    let (first, labels) = terms
        .next()
        .ok_or_else(|| cx.err("onnx-bad-model", "no operand"))?;
    let mut keep = needed_after(0);
    let mut acc = prepare(
        cx,
        Term {
            value: first,
            labels,
        },
        &keep,
        &size_of,
    )?;
    for (i, (value, labels)) in terms.enumerate() {
        let i = i + 1;
        let later = needed_after(i);
        let mut with_acc = later.clone();
        with_acc.extend(&acc.labels);
        let next = prepare(cx, Term { value, labels }, &with_acc, &size_of)?;
        let mut with_next = later.clone();
        with_next.extend(&next.labels);
        acc = prepare(cx, acc, &with_next, &size_of)?;
        acc = contract(cx, acc, next, &later)?;
        keep = later;
    }
    acc = prepare(cx, acc, &keep, &size_of)?;
    // output labels an operand dropped as broadcast (size 1 there, larger nowhere kept)
    // cannot occur: a label kept in the output keeps its largest size
    let perm: Vec<usize> = eq
        .output
        .iter()
        .map(|l| acc.labels.iter().position(|m| m == l))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            cx.err(
                "onnx-bad-model",
                format!("Einsum '{equation}': an output label is missing after contraction"),
            )
        })?;
    let y = transpose(cx, acc.value, perm)?;
    Ok(vec![Entry::Value(y)])
}

/// A label as written (`...` dims spelled by position).
fn label_name(l: Label) -> String {
    match char::from_u32(l).filter(|_| l < ELLIPSIS_BASE) {
        Some(c) => c.to_string(),
        None => format!("...[{}]", l - ELLIPSIS_BASE),
    }
}
