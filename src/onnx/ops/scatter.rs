//! Scatters with indices known at import: ScatterElements (and its opset-9 name Scatter)
//! and ScatterND. The indices decide, for every element of the flattened data, which
//! updates land there, so each scatter becomes a `gather` of the flattened updates at
//! constant positions and a `where` over a constant mask of the positions written — one
//! such pair per level of duplicate writes when a reduction combines them. Run-time
//! indices are refused, naming the node: they would need a scatter op the IR lacks.

use smelt_ir::op::{BinaryOp, Op};
use smelt_ir::{Diagnostic, Value};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::ConstTensor;

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "Scatter"             [9, 11],                        from 9  => scatter_elements;
    "ScatterElements"     [11, 13, 16, 18],               from 11 => scatter_elements;
    "ScatterND"           [11, 13, 16, 18],               from 11 => scatter_nd;
};

/// How a scatter combines an update with what is already at its position.
#[derive(Clone, Copy)]
enum Combine {
    /// The update replaces the element (the last of duplicate writes wins, as
    /// onnxruntime does; ONNX leaves duplicates undefined here).
    Replace,
    /// `reduction = "add" | "mul" | "max" | "min"`: the element and every update to it
    /// combined in the order of the updates.
    Reduce(BinaryOp),
}

/// The `reduction` attribute (absent before opset 16: replace).
fn combine_of(cx: &NodeCtx) -> Result<Combine, Diagnostic> {
    Ok(match cx.attr_string("reduction")?.as_deref() {
        None | Some("none") => Combine::Replace,
        Some("add") => Combine::Reduce(BinaryOp::Add),
        Some("mul") => Combine::Reduce(BinaryOp::Mul),
        Some("max") => Combine::Reduce(BinaryOp::Max),
        Some("min") => Combine::Reduce(BinaryOp::Min),
        Some(other) => {
            return Err(cx.bad_attr(
                "reduction",
                format!("'{other}' is not one of none, add, mul, max, min"),
            ))
        }
    })
}

/// The indices (input 1) as integers known at import.
fn const_indices(cx: &NodeCtx) -> Result<(Vec<usize>, Vec<i64>), Diagnostic> {
    let Some(c) = cx.const_input(1)? else {
        return Err(cx.err(
            "onnx-dynamic-shape",
            format!(
                "the indices ('{}') are computed at run time; smelt scatters only at \
                 indices known at import (an initializer, a Constant node or foldable \
                 arithmetic)",
                cx.input_name(1).unwrap_or("")
            ),
        ));
    };
    let Some(values) = c.i64s() else {
        return Err(cx.err(
            "onnx-unsupported-dtype",
            format!("indices must be integers, got {}", c.type_name()),
        ));
    };
    Ok((c.dims.clone(), values.to_vec()))
}

/// Row-major strides of `dims`.
fn strides_of(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * dims[k + 1];
    }
    strides
}

/// An index along an axis of `size`, negative ones counting from the end; out of range
/// is an error naming the index and the axis.
fn wrap_index(cx: &NodeCtx, index: i64, size: usize, axis: usize) -> Result<usize, Diagnostic> {
    let size = size as i64;
    let k = if index < 0 { index + size } else { index };
    if !(0..size).contains(&k) {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "index {index} is out of range for axis {axis} of size {size} (valid: {} to {})",
                -size,
                size - 1
            ),
        ));
    }
    Ok(k as usize)
}

/// ScatterElements (and Scatter): `out = data`, then for every index position `p`,
/// `out[p with p[axis] = indices[p]] ⊕= updates[p]`.
pub fn scatter_elements(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis", "reduction"])?;
    cx.check_max_inputs(3)?;
    let combine = combine_of(cx)?;
    let data_dims = cx.dims(0)?;
    let rank = data_dims.len();
    let axis = cx.axis("axis", cx.attr_int_or("axis", 0)?, rank)?;
    let (index_dims, indices) = const_indices(cx)?;
    let update_dims = cx.dims(2)?;
    if index_dims != update_dims || !super::indexing::fits_data_along(&index_dims, &data_dims, axis)
    {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "indices of shape {index_dims:?} and updates of shape {update_dims:?} must \
                 have one shape, of the rank of the data {data_dims:?}, and no dimension \
                 larger than the data's but along axis {axis}"
            ),
        ));
    }
    let strides = strides_of(&data_dims);
    let mut targets = Vec::with_capacity(indices.len());
    let mut coords = vec![0usize; rank];
    for &index in &indices {
        let along = wrap_index(cx, index, data_dims[axis], axis)?;
        let flat: usize = (0..rank)
            .map(|k| if k == axis { along } else { coords[k] } * strides[k])
            .sum();
        targets.push(flat);
        for k in (0..rank).rev() {
            coords[k] += 1;
            if coords[k] < index_dims[k] {
                break;
            }
            coords[k] = 0;
        }
    }
    let out = scatter_flat(cx, &data_dims, &targets, combine)?;
    Ok(vec![Entry::Value(out)])
}

/// ScatterND: indices of shape `[..., k]` address slices `data[i₀, …, iₖ₋₁, ...]`, each
/// combined with the matching slice of the updates (shape `indices.shape[:-1] +
/// data.shape[k:]`).
pub fn scatter_nd(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["reduction"])?;
    cx.check_max_inputs(3)?;
    let combine = combine_of(cx)?;
    let data_dims = cx.dims(0)?;
    let (index_dims, indices) = const_indices(cx)?;
    let update_dims = cx.dims(2)?;
    let depth = index_dims.last().copied().unwrap_or(0);
    let mut want = index_dims[..index_dims.len().saturating_sub(1)].to_vec();
    if depth <= data_dims.len() {
        want.extend_from_slice(&data_dims[depth..]);
    }
    if index_dims.is_empty() || depth == 0 || depth > data_dims.len() || update_dims != want {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "indices of shape {index_dims:?} must end in a length from 1 to the data's \
                 rank ({}), and the updates' shape {update_dims:?} must be the indices' \
                 leading dimensions then the data's after that length",
                data_dims.len()
            ),
        ));
    }
    let strides = strides_of(&data_dims);
    let slice: usize = data_dims[depth..].iter().product();
    let mut targets = Vec::with_capacity(indices.len() / depth * slice);
    for tuple in indices.chunks_exact(depth) {
        let mut base = 0;
        for (k, &index) in tuple.iter().enumerate() {
            base += wrap_index(cx, index, data_dims[k], k)? * strides[k];
        }
        targets.extend(base..base + slice);
    }
    let out = scatter_flat(cx, &data_dims, &targets, combine)?;
    Ok(vec![Entry::Value(out)])
}

/// Data (input 0, of `data_dims`) with update `u` (input 2, flattened) combined into
/// flat position `targets[u]`: per level of duplicate writes, a `gather` of the updates
/// landing there and a `where` keeping the rest.
fn scatter_flat(
    cx: &mut NodeCtx,
    data_dims: &[usize],
    targets: &[usize],
    combine: Combine,
) -> Result<Value, Diagnostic> {
    let total: usize = data_dims.iter().product();
    // writes[p]: the updates landing at flat position p, in update order
    let mut writes: Vec<Vec<i64>> = vec![Vec::new(); total];
    for (u, &p) in targets.iter().enumerate() {
        writes[p].push(u as i64);
    }
    let levels: Vec<Vec<Option<i64>>> = match combine {
        Combine::Replace => vec![writes.iter().map(|w| w.last().copied()).collect()],
        Combine::Reduce(_) => {
            let deepest = writes.iter().map(Vec::len).max().unwrap_or(0);
            (0..deepest)
                .map(|level| writes.iter().map(|w| w.get(level).copied()).collect())
                .collect()
        }
    };
    let data = cx.value(0)?;
    let mut acc = cx.reshape(data, vec![total])?;
    let updates = cx.value(2)?;
    let update_count = cx.type_of(updates).dims.iter().product();
    let updates = cx.reshape(updates, vec![update_count])?;
    for level in levels {
        let mask: Vec<bool> = level.iter().map(Option::is_some).collect();
        if !mask.contains(&true) {
            continue;
        }
        // positions no update reaches read update 0, which the mask then discards
        let picks: Vec<i64> = level.iter().map(|u| u.unwrap_or(0)).collect();
        let name = cx.derived_name("scatter_positions");
        let picks = cx.materialize(&ConstTensor::i64(vec![total], picks), &name)?;
        let name = cx.derived_name("scatter_mask");
        let mask = cx.materialize(&ConstTensor::bool(vec![total], mask), &name)?;
        let landed = cx.emit(Op::Gather { axis: 0 }, &[updates, picks])?;
        let landed = match combine {
            Combine::Replace => landed,
            Combine::Reduce(op) => cx.emit(Op::Binary(op), &[acc, landed])?,
        };
        acc = cx.emit(Op::Where, &[mask, landed, acc])?;
    }
    cx.reshape(acc, data_dims.to_vec())
}
