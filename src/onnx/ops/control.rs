//! Control flow whose course is known at import: an `If` whose condition is a constant
//! once the input shapes are (exporters test a shape before a squeeze: torch writes one
//! around every LocalResponseNorm), imported as the branch it takes; a `Loop` whose trip
//! count and conditions fold, and a `Scan` over static sequence lengths, unrolled — the
//! body imported once per iteration with its names scoped to it, scan inputs sliced and
//! scan outputs stacked — within a bound on the nodes unrolled.

use smelt_ir::op::{Op, SliceAttrs};
use smelt_ir::Diagnostic;

use super::super::context::{Entry, NodeCtx};
use super::OpRule;
use crate::onnx::proto::GraphProto;
use crate::onnx::tensor::ConstTensor;

/// Most body nodes unrolling may import in one model (iterations × body size, nested
/// bodies included).
const MAX_UNROLLED_NODES: usize = 1 << 16;

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "If"                  [1, 11, 13, 16, 19, 21, 23, 24, 25], from 1 => if_;
    "Loop"                [1, 11, 13, 16, 19, 21, 23, 24, 25], from 1 => loop_;
    "Scan"                [8, 9, 11, 16, 19, 21, 23, 24, 25], from 9 => scan;
};

/// If (every version): the taken branch's nodes, imported in place; its outputs are the
/// node's. A condition computed at run time is a clear error.
pub fn if_(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["then_branch", "else_branch"])?;
    let Some(cond) = cx.const_input(0)? else {
        return Err(cx.err(
            "onnx-dynamic-shape",
            "the condition (input 0) is computed at run time; smelt imports an If only when \
             its condition is known once the input shapes are (a test on shapes), and then \
             imports the branch it takes",
        ));
    };
    let taken = match (cond.is_bool(), cond.i64s()) {
        (true, Some([flag])) => *flag != 0,
        _ => {
            return Err(cx.err(
                "onnx-bad-model",
                format!(
                    "the condition must be one bool, got {} of shape {:?}",
                    cond.type_name(),
                    cond.dims
                ),
            ))
        }
    };
    let name = if taken { "then_branch" } else { "else_branch" };
    let graph = cx
        .attr_graph(name)?
        .ok_or_else(|| cx.bad_attr(name, "is required"))?;
    let outputs = super::super::import_subgraph(cx.imp, graph).map_err(|d| Diagnostic {
        message: format!("in its {name}: {}", d.message),
        ..d
    })?;
    if outputs.len() != cx.node.output.len() {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "its {name} has {} outputs but the node has {}",
                outputs.len(),
                cx.node.output.len()
            ),
        ));
    }
    Ok(outputs)
}

/// Counts one more unrolled iteration of `body` against [`MAX_UNROLLED_NODES`].
fn count_iteration(
    cx: &mut NodeCtx,
    body: &GraphProto,
    iteration: usize,
) -> Result<(), Diagnostic> {
    cx.imp.unrolled_nodes = cx.imp.unrolled_nodes.saturating_add(body.node.len().max(1));
    if cx.imp.unrolled_nodes > MAX_UNROLLED_NODES {
        return Err(cx.err(
            "onnx-too-large",
            format!(
                "unrolling reached {} body nodes at iteration {iteration}: smelt unrolls loops \
                 at import and imports at most {MAX_UNROLLED_NODES}",
                cx.imp.unrolled_nodes
            ),
        ));
    }
    Ok(())
}

/// One iteration of `body`, errors prefixed with the iteration.
fn iterate(
    cx: &mut NodeCtx,
    body: &GraphProto,
    iteration: usize,
    bindings: Vec<Entry>,
) -> Result<Vec<Entry>, Diagnostic> {
    count_iteration(cx, body, iteration)?;
    super::super::import_body(cx.imp, body, bindings).map_err(|d| Diagnostic {
        message: format!("in its body, iteration {iteration}: {}", d.message),
        ..d
    })
}

/// The dims of an entry.
fn entry_dims(cx: &NodeCtx, e: &Entry) -> Result<Vec<usize>, Diagnostic> {
    match e {
        Entry::Value(v) => Ok(cx.type_of(*v).dims.clone()),
        Entry::Const(c) => Ok(c.dims.clone()),
        Entry::Dropped { producer, what } => Err(cx.err(
            "onnx-unsupported-output",
            format!("the {what} of {producer}, which smelt does not compute, reaches a loop"),
        )),
    }
}

/// Element `at` of `e` along `axis`, that axis removed: folded for a constant.
fn take(cx: &mut NodeCtx, e: &Entry, axis: usize, at: usize) -> Result<Entry, Diagnostic> {
    let dims = entry_dims(cx, e)?;
    let slice = SliceAttrs {
        starts: (0..dims.len())
            .map(|k| if k == axis { at as i64 } else { 0 })
            .collect(),
        ends: (0..dims.len())
            .map(|k| {
                if k == axis {
                    at as i64 + 1
                } else {
                    dims[k] as i64
                }
            })
            .collect(),
        steps: vec![1; dims.len()],
    };
    let mut kept = dims.clone();
    kept.remove(axis);
    match e {
        Entry::Const(c) => {
            let part = c.slice(&slice).map_err(|m| cx.err("onnx-bad-model", m))?;
            Ok(Entry::constant(part.reshaped(kept)))
        }
        Entry::Value(v) => {
            let part = cx.slice_along(*v, axis, at, at + 1)?;
            Ok(Entry::Value(cx.reshape(part, kept)?))
        }
        // `entry_dims` refused it above
        Entry::Dropped { .. } => Ok(e.clone()),
    }
}

/// `parts` stacked along a new `axis`: folded when every part is a constant.
fn stack(cx: &mut NodeCtx, parts: &[Entry], axis: usize, what: &str) -> Result<Entry, Diagnostic> {
    let Some(first) = parts.first() else {
        return Err(cx.err(
            "onnx-bad-model",
            format!("{what} of no iterations: its shape is unknown at import"),
        ));
    };
    let dims = entry_dims(cx, first)?;
    if axis > dims.len() {
        return Err(cx.bad_attr(
            "scan_output_axes",
            format!("axis {axis} is beyond rank {}", dims.len() + 1),
        ));
    }
    let mut grown = dims.clone();
    grown.insert(axis, 1);
    for p in parts {
        let d = entry_dims(cx, p)?;
        if d != dims {
            return Err(cx.err(
                "onnx-bad-model",
                format!("{what}: iterations give shapes {dims:?} and {d:?}"),
            ));
        }
    }
    if parts.iter().all(|p| matches!(p, Entry::Const(_))) {
        let consts: Vec<ConstTensor> = parts
            .iter()
            .filter_map(|p| match p {
                Entry::Const(c) => Some(c.reshaped(grown.clone())),
                _ => None,
            })
            .collect();
        let refs: Vec<&ConstTensor> = consts.iter().collect();
        let joined = ConstTensor::concat(&refs, axis).map_err(|m| cx.err("onnx-bad-model", m))?;
        return Ok(Entry::constant(joined));
    }
    let mut values = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        let v = match p {
            Entry::Value(v) => *v,
            Entry::Const(c) => {
                let name = cx.derived_name(&format!("{what}_{i}"));
                cx.materialize(c, &name)?
            }
            // `entry_dims` refused it above
            Entry::Dropped { .. } => continue,
        };
        values.push(cx.reshape(v, grown.clone())?);
    }
    if values.len() == 1 {
        return Ok(Entry::Value(values[0]));
    }
    Ok(Entry::Value(cx.emit(Op::Concat { axis }, &values)?))
}

/// A constant boolean entry's value (`what` names it in the error).
fn const_flag(cx: &NodeCtx, e: &Entry, what: &str) -> Result<bool, Diagnostic> {
    match e {
        Entry::Const(c) => match (c.is_bool(), c.i64s()) {
            (true, Some([flag])) => Ok(*flag != 0),
            _ => Err(cx.err(
                "onnx-bad-model",
                format!(
                    "{what} must be one bool, got {} of shape {:?}",
                    c.type_name(),
                    c.dims
                ),
            )),
        },
        _ => Err(cx.err(
            "onnx-dynamic-shape",
            format!(
                "{what} is computed at run time; smelt unrolls a Loop at import, so its \
                 condition must be known then"
            ),
        )),
    }
}

/// Loop (every version), unrolled: a constant trip count `M` and conditions known at
/// import. Iteration `i` binds the body's `(i, cond, carried...)`; its outputs are
/// `(cond, carried..., scan parts...)`; the node's outputs are the final carried values and
/// each scan output's parts stacked along a new first axis.
pub fn loop_(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["body"])?;
    let body = cx
        .attr_graph("body")?
        .ok_or_else(|| cx.bad_attr("body", "is required"))?;
    let trips = match cx.input_name(0) {
        None => None,
        Some(_) => {
            let m = cx.const_int(0, "trip count M")?;
            Some(usize::try_from(m.max(0)).unwrap_or(usize::MAX))
        }
    };
    let mut cond = match cx.input_name(1) {
        None => true,
        Some(_) => {
            let e = cx.entry(1)?;
            const_flag(cx, &e, "the condition (input 1)")?
        }
    };
    let carried_count = cx.num_inputs().saturating_sub(2);
    let mut carried: Vec<Entry> = (2..cx.num_inputs())
        .map(|i| cx.entry(i))
        .collect::<Result<_, _>>()?;
    if body.output.len() < 1 + carried_count {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "the body has {} outputs; a Loop with {carried_count} carried values needs the \
                 condition and those at least",
                body.output.len()
            ),
        ));
    }
    let scan_count = body.output.len() - 1 - carried_count;
    let mut scans: Vec<Vec<Entry>> = vec![Vec::new(); scan_count];
    let mut i = 0usize;
    while cond && trips.is_none_or(|m| i < m) {
        let mut bindings = vec![
            Entry::constant(ConstTensor::i64(vec![], vec![i as i64])),
            Entry::constant(ConstTensor::bool(vec![], vec![cond])),
        ];
        bindings.extend(carried.iter().cloned());
        let outs = iterate(cx, body, i, bindings)?;
        cond = const_flag(
            cx,
            &outs[0],
            &format!("the body's condition at iteration {i}"),
        )?;
        carried = outs[1..=carried_count].to_vec();
        for (k, part) in outs[1 + carried_count..].iter().enumerate() {
            scans[k].push(part.clone());
        }
        i += 1;
    }
    let mut outputs = carried;
    for (k, parts) in scans.iter().enumerate() {
        outputs.push(stack(cx, parts, 0, &format!("scan output {k}"))?);
    }
    Ok(outputs)
}

/// Scan (from version 9), unrolled over the scan inputs' common length: the body binds
/// `(states..., one slice of each scan input)` and gives `(states..., scan parts...)`,
/// with each scan input's axis and direction and each scan output's (its parts stacked
/// along its axis, last iteration first when reversed).
pub fn scan(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[
        "body",
        "num_scan_inputs",
        "scan_input_axes",
        "scan_input_directions",
        "scan_output_axes",
        "scan_output_directions",
    ])?;
    let body = cx
        .attr_graph("body")?
        .ok_or_else(|| cx.bad_attr("body", "is required"))?;
    let inputs = cx.num_inputs();
    let scan_inputs = cx
        .attr_int("num_scan_inputs")?
        .ok_or_else(|| cx.bad_attr("num_scan_inputs", "is required"))?;
    let scan_inputs = usize::try_from(scan_inputs)
        .ok()
        .filter(|&m| (1..=inputs).contains(&m))
        .ok_or_else(|| {
            cx.bad_attr(
                "num_scan_inputs",
                format!("{scan_inputs} must be between 1 and the node's {inputs} inputs"),
            )
        })?;
    let states = inputs - scan_inputs;
    if body.output.len() < states {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "the body has {} outputs for {states} states",
                body.output.len()
            ),
        ));
    }
    let scan_outputs = body.output.len() - states;
    let list = |cx: &NodeCtx, name: &str, len: usize| -> Result<Vec<i64>, Diagnostic> {
        match cx.attr_ints(name)? {
            None => Ok(vec![0; len]),
            Some(v) if v.len() == len => Ok(v),
            Some(v) => Err(cx.bad_attr(name, format!("{v:?} must hold {len} values"))),
        }
    };
    let in_axes = list(cx, "scan_input_axes", scan_inputs)?;
    let in_dirs = list(cx, "scan_input_directions", scan_inputs)?;
    let out_axes = list(cx, "scan_output_axes", scan_outputs)?;
    let out_dirs = list(cx, "scan_output_directions", scan_outputs)?;
    let mut state: Vec<Entry> = (0..states).map(|i| cx.entry(i)).collect::<Result<_, _>>()?;
    let mut sequences = Vec::with_capacity(scan_inputs);
    let mut length = None;
    for j in 0..scan_inputs {
        let e = cx.entry(states + j)?;
        let dims = entry_dims(cx, &e)?;
        let axis = cx.axis("scan_input_axes", in_axes[j], dims.len())?;
        match length {
            None => length = Some(dims[axis]),
            Some(l) if l == dims[axis] => {}
            Some(l) => {
                return Err(cx.err(
                    "onnx-bad-model",
                    format!(
                        "scan input {j} is {} long where the first is {l}",
                        dims[axis]
                    ),
                ))
            }
        }
        sequences.push((e, axis, in_dirs[j] != 0));
    }
    let length = length.unwrap_or(0);
    let mut parts: Vec<Vec<Entry>> = vec![Vec::new(); scan_outputs];
    for t in 0..length {
        let mut bindings = state.clone();
        for (e, axis, reverse) in &sequences {
            let at = if *reverse { length - 1 - t } else { t };
            bindings.push(take(cx, e, *axis, at)?);
        }
        let outs = iterate(cx, body, t, bindings)?;
        state = outs[..states].to_vec();
        for (k, p) in outs[states..].iter().enumerate() {
            parts[k].push(p.clone());
        }
    }
    let mut outputs = state;
    for (k, mut p) in parts.into_iter().enumerate() {
        if out_dirs[k] != 0 {
            p.reverse();
        }
        let rank = match p.first() {
            Some(e) => entry_dims(cx, e)?.len() + 1,
            None => 1,
        };
        let axis = cx.axis("scan_output_axes", out_axes[k], rank)?;
        outputs.push(stack(cx, &p, axis, &format!("scan output {k}"))?);
    }
    Ok(outputs)
}
