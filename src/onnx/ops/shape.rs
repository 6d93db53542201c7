//! Data movement and shape helpers: Reshape, Flatten, Transpose, Concat, Squeeze,
//! Unsqueeze, Identity, Dropout, and the ops folded at import (Constant, Shape, Gather,
//! ConstantOfShape). Shapes are static, so shape arithmetic always folds to constants.

use smelt_ir::op::Op;
use smelt_ir::{Diagnostic, Value};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::{dtype, ConstData, ConstTensor};

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "Concat"              [1, 4, 11, 13],                 from 4  => concat;
    "Constant"            [1, 9, 11, 12, 13, 19, 21, 23, 24, 25], from 1 => constant;
    "ConstantOfShape"     [9, 20, 21, 23, 24, 25],        from 9  => constant_of_shape;
    "Dropout"             [1, 6, 7, 10, 12, 13, 22],      from 1  => dropout;
    "Flatten"             [1, 9, 11, 13, 21, 23, 24, 25], from 1  => flatten;
    "Gather"              [1, 11, 13],                    from 1  => gather;
    "GatherND"            [11, 12, 13],                   from 11 => gather_nd;
    "Identity"            [1, 13, 14, 16, 19, 21, 23, 24, 25], from 1 => identity;
    "Reshape"             [1, 5, 13, 14, 19, 21, 23, 24, 25], from 1 => reshape;
    "Shape"               [1, 13, 15, 19, 21, 23, 24, 25], from 1 => shape;
    "Squeeze"             [1, 11, 13, 21, 23, 24, 25],    from 1  => squeeze;
    "Transpose"           [1, 13, 21, 23, 24, 25],        from 1  => transpose;
    "Unsqueeze"           [1, 11, 13, 21, 23, 24, 25],    from 1  => unsqueeze;
};

/// Produces input 0 reshaped to `dims`: folded for constants, a `reshape` op otherwise.
fn reshape_to(cx: &mut NodeCtx, dims: Vec<usize>) -> Result<Vec<Entry>, Diagnostic> {
    if let Some(c) = cx.const_input(0)? {
        return Ok(vec![Entry::constant(c.reshaped(dims))]);
    }
    let x = cx.value(0)?;
    Ok(vec![Entry::Value(cx.reshape(x, dims)?)])
}

/// Reshape with a constant target shape: 0 copies the input dim (unless `allowzero`),
/// -1 is inferred from the element count.
pub fn reshape(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["allowzero", "shape"])?;
    let input = cx.dims(0)?;
    let target = if cx.version < 5 {
        cx.attr_ints("shape")?
            .ok_or_else(|| cx.bad_attr("shape", "is required before opset 5"))?
    } else {
        cx.const_ints(1, "target shape")?
    };
    let allow_zero = cx.attr_bool("allowzero", false)?;
    let dims = resolve_reshape(&input, &target, allow_zero).map_err(|m| {
        cx.err(
            "onnx-bad-model",
            format!("cannot reshape {input:?} to {target:?}: {m}"),
        )
    })?;
    reshape_to(cx, dims)
}

/// ONNX Reshape's shape rules on static dims.
fn resolve_reshape(
    input: &[usize],
    target: &[i64],
    allow_zero: bool,
) -> Result<Vec<usize>, String> {
    let total: usize = input.iter().product();
    let mut dims = Vec::with_capacity(target.len());
    let mut infer = None;
    for (i, &t) in target.iter().enumerate() {
        dims.push(match t {
            0 if !allow_zero => *input
                .get(i)
                .ok_or_else(|| format!("0 at position {i} copies a dimension the input lacks"))?,
            -1 if infer.is_none() => {
                infer = Some(i);
                1
            }
            -1 => return Err("more than one -1".into()),
            t if t < 0 => return Err(format!("dimension {t} is negative")),
            t => t as usize,
        });
    }
    let known = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("too large")?;
    if let Some(i) = infer {
        if known == 0 || !total.is_multiple_of(known) {
            return Err(format!("-1 cannot make {total} elements"));
        }
        dims[i] = total / known;
    } else if known != total {
        return Err(format!("{known} elements instead of {total}"));
    }
    Ok(dims)
}

/// Flatten to 2-D at `axis` (negative from version 11).
pub fn flatten(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis"])?;
    let input = cx.dims(0)?;
    let rank = input.len();
    let raw = cx.attr_int_or("axis", 1)?;
    // valid range is -rank..=rank
    let axis = if raw == rank as i64 {
        rank
    } else {
        cx.axis("axis", raw, rank)?
    };
    if cx.const_input(0)?.is_some() {
        let outer = input[..axis].iter().product();
        let inner = input[axis..].iter().product();
        return reshape_to(cx, vec![outer, inner]);
    }
    let x = cx.value(0)?;
    Ok(vec![Entry::Value(cx.emit(Op::Flatten { axis }, &[x])?)])
}

/// Transpose (default permutation reverses the axes).
pub fn transpose(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["perm"])?;
    let rank = cx.dims(0)?.len();
    let perm = match cx.attr_ints("perm")? {
        None => (0..rank).rev().collect(),
        Some(p) => p
            .iter()
            .map(|&a| {
                usize::try_from(a)
                    .map_err(|_| cx.bad_attr("perm", format!("{p:?} has a negative entry")))
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    // Shape programs transpose their pads and shape vectors (torch's LRN export does), and
    // a later op needs them constant; float weights fold in const_fold like other weights.
    if let Some(c) = cx.const_input(0)?.filter(|c| !c.is_f32()) {
        let folded = c.transpose(&perm).map_err(|m| cx.bad_attr("perm", m))?;
        return Ok(vec![Entry::constant(folded)]);
    }
    let x = cx.value(0)?;
    Ok(vec![Entry::Value(cx.emit(Op::Transpose { perm }, &[x])?)])
}

/// Concat along `axis`; folded when every input is constant (shape vectors).
pub fn concat(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis"])?;
    let raw = cx
        .attr_int("axis")?
        .ok_or_else(|| cx.bad_attr("axis", "is required"))?;
    let rank = cx.dims(0)?.len();
    let axis = cx.axis("axis", raw, rank)?;
    let n = cx.num_inputs();
    let consts = (0..n)
        .map(|i| cx.const_input(i))
        .collect::<Result<Vec<_>, _>>()?;
    if consts.iter().all(Option::is_some) {
        let parts: Vec<&ConstTensor> = consts.iter().flatten().map(|c| &**c).collect();
        let folded = ConstTensor::concat(&parts, axis).map_err(|m| cx.err("onnx-bad-model", m))?;
        return Ok(vec![Entry::constant(folded)]);
    }
    let mut operands = Vec::with_capacity(n);
    for i in 0..n {
        operands.push(cx.value(i)?);
    }
    Ok(vec![Entry::Value(cx.emit(Op::Concat { axis }, &operands)?)])
}

/// Squeeze: removes the listed size-1 axes, or every size-1 axis.
pub fn squeeze(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axes"])?;
    let input = cx.dims(0)?;
    let drop: Vec<usize> = match cx.versioned_axes(13)? {
        None => (0..input.len()).filter(|&k| input[k] == 1).collect(),
        Some(list) => {
            let mut out = Vec::new();
            for a in list {
                let k = cx.axis("axes", a, input.len())?;
                if input[k] != 1 {
                    return Err(
                        cx.bad_attr("axes", format!("axis {a} has size {}, not 1", input[k]))
                    );
                }
                out.push(k);
            }
            out
        }
    };
    let dims = (0..input.len())
        .filter(|k| !drop.contains(k))
        .map(|k| input[k])
        .collect();
    reshape_to(cx, dims)
}

/// Unsqueeze: inserts size-1 axes at the listed positions of the result.
pub fn unsqueeze(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axes"])?;
    let input = cx.dims(0)?;
    let list = cx
        .versioned_axes(13)?
        .ok_or_else(|| cx.bad_attr("axes", "is required"))?;
    let rank = input.len() + list.len();
    let mut inserted = vec![false; rank];
    for &a in &list {
        let k = cx.axis("axes", a, rank)?;
        if std::mem::replace(&mut inserted[k], true) {
            return Err(cx.bad_attr("axes", format!("{list:?} repeats an axis")));
        }
    }
    let mut rest = input.iter();
    let dims = inserted
        .iter()
        .map(|&ins| {
            if ins {
                1
            } else {
                rest.next().copied().unwrap_or(1)
            }
        })
        .collect();
    reshape_to(cx, dims)
}

/// Identity: the output is the input.
pub fn identity(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    Ok(vec![cx.entry(0)?])
}

/// Dropout at inference is the identity and its mask is all true; training mode is
/// rejected.
pub fn dropout(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["ratio", "is_test", "seed"])?;
    if cx.version >= 12 && cx.input_name(2).is_some() {
        let training = cx.require_const(2, "training_mode flag")?;
        let on = match (training.i64s(), training.f32s()) {
            (Some(v), _) => v.iter().any(|&b| b != 0),
            (None, Some(v)) => v.iter().any(|&b| b != 0.0),
            (None, None) => true,
        };
        if on {
            return Err(cx.err(
                "onnx-unsupported-attribute",
                "training_mode = true is not supported: smelt runs inference",
            ));
        }
    }
    if cx.version < 7 && !cx.attr_bool("is_test", false)? {
        return Err(cx.err(
            "onnx-unsupported-attribute",
            "is_test = 0 (training) is not supported: smelt runs inference",
        ));
    }
    // At inference the mask is all true: a constant, built only when the model names it.
    let mask = match cx.node.output.get(1).filter(|m| !m.is_empty()) {
        Some(_) => {
            let dims = cx.dims(0)?;
            let n = dims.iter().product();
            Entry::constant(ConstTensor {
                dims,
                data: ConstData::I64(vec![1; n]),
                onnx_type: dtype::BOOL,
            })
        }
        None => cx.dropped("mask output"),
    };
    Ok(vec![cx.entry(0)?, mask])
}

/// Constant: exactly one of the value attributes.
pub fn constant(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    const VALUES: [&str; 8] = [
        "value",
        "value_float",
        "value_floats",
        "value_int",
        "value_ints",
        "sparse_value",
        "value_string",
        "value_strings",
    ];
    cx.check_attrs(&VALUES)?;
    if cx.node.attribute.len() != 1 {
        return Err(cx.err("onnx-bad-attribute", "needs exactly one value attribute"));
    }
    let name = cx.node.attribute[0].name().to_string();
    let c = match name.as_str() {
        "value" => cx
            .attr_tensor("value")?
            .ok_or_else(|| cx.bad_attr("value", "has no tensor"))?,
        "value_float" => ConstTensor::f32(vec![], vec![cx.attr_float_or("value_float", 0.0)?]),
        "value_floats" => {
            let v = cx.attr_floats("value_floats")?.unwrap_or_default();
            ConstTensor::f32(vec![v.len()], v)
        }
        "value_int" => ConstTensor::i64(vec![], vec![cx.attr_int_or("value_int", 0)?]),
        "value_ints" => {
            let v = cx.attr_ints("value_ints")?.unwrap_or_default();
            ConstTensor::i64(vec![v.len()], v)
        }
        other => {
            return Err(cx.err(
                "onnx-unsupported-attribute",
                format!("attribute '{other}' (sparse or string constants) is not supported"),
            ))
        }
    };
    Ok(vec![Entry::constant(c)])
}

/// Shape of the input (static, so always a constant), sliced by `start`/`end` (version 15).
pub fn shape(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["start", "end"])?;
    let dims = cx.dims(0)?;
    let rank = dims.len() as i64;
    let clamp = |v: i64| -> usize { (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize };
    let start = clamp(cx.attr_int_or("start", 0)?);
    let end = clamp(cx.attr_int_or("end", rank)?);
    let values: Vec<i64> = dims
        .get(start..end.max(start))
        .unwrap_or(&[])
        .iter()
        .map(|&d| d as i64)
        .collect();
    Ok(vec![Entry::constant(ConstTensor::i64(
        vec![values.len()],
        values,
    ))])
}

/// Gather: folded at import when data and indices are constants (shape programs), else
/// a `gather` op, whose indices the run checks (an embedding lookup by int64 ids).
pub fn gather(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis"])?;
    let rank = cx.dims(0)?.len();
    let axis = cx.axis("axis", cx.attr_int_or("axis", 0)?, rank)?;
    let (Some(data), Some(indices)) = (cx.const_input(0)?, cx.const_input(1)?) else {
        if let Some(sliced) = gather_one_index(cx, axis)? {
            return Ok(vec![Entry::Value(sliced)]);
        }
        let data = cx.value(0)?;
        let indices = cx.value(1)?;
        return Ok(vec![Entry::Value(
            cx.emit(Op::Gather { axis }, &[data, indices])?,
        )]);
    };
    let out = data
        .gather(axis, &indices)
        .map_err(|m| cx.err("onnx-bad-model", m))?;
    Ok(vec![Entry::constant(out)])
}

/// A run-time `data` gathered at one constant index (a scalar, or a one-element list):
/// the `slice` of that position along `axis`, then for a scalar the axis dropped — a
/// contiguous copy instead of a `gather`'s per-element index (torch's `select`, `x[i]`,
/// `unbind` of a fused QKV projection export this way). `None` for any other indices.
fn gather_one_index(cx: &mut NodeCtx, axis: usize) -> Result<Option<Value>, Diagnostic> {
    let Some(indices) = cx.const_input(1)? else {
        return Ok(None);
    };
    let (&[i], true) = (indices.i64s().unwrap_or(&[]), indices.dims.len() <= 1) else {
        return Ok(None);
    };
    let dims = cx.dims(0)?;
    let n = dims[axis] as i64;
    let at = if i < 0 { i + n } else { i };
    if !(0..n).contains(&at) {
        return Err(cx.err(
            "onnx-bad-model",
            format!("index {i} is out of range for axis {axis} of size {n}"),
        ));
    }
    let data = cx.value(0)?;
    let at = at as usize;
    let sliced = cx.slice_along(data, axis, at, at + 1)?;
    if !indices.dims.is_empty() {
        return Ok(Some(sliced));
    }
    let mut kept = dims.clone();
    kept.remove(axis);
    Ok(Some(cx.reshape(sliced, kept)?))
}

/// GatherND (versions 11 to 13, `batch_dims` from 12) with indices known at import (the
/// torch.export-based exporter computes them from aranges over the input shapes): each
/// index tuple becomes one flat position in the data with its indexed axes (and batch
/// axes) merged, so the op is a `gather` along that merged axis — which also folds when
/// the data is constant. Indices computed at run time are a clear error.
pub fn gather_nd(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["batch_dims"])?;
    let data_dims = cx.dims(0)?;
    let index_dims = cx.dims(1)?;
    let batch = usize::try_from(cx.attr_int_or("batch_dims", 0)?)
        .map_err(|_| cx.bad_attr("batch_dims", "must not be negative"))?;
    let q = index_dims.len();
    let depth = index_dims.last().copied().unwrap_or(0);
    if q == 0 || batch >= q || batch + depth > data_dims.len() || depth == 0 {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "indices of shape {index_dims:?} with batch_dims {batch} do not fit data of shape \
                 {data_dims:?} (need 1 <= indices' last dim <= data rank - batch_dims)"
            ),
        ));
    }
    if index_dims[..batch] != data_dims[..batch] {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "the first {batch} (batch) dims of indices {index_dims:?} and data {data_dims:?} differ"
            ),
        ));
    }
    let indexed = &data_dims[batch..batch + depth];
    let per_batch: usize = indexed.iter().product();
    // tuples per batch entry: the index dims between the batch dims and the tuple axis
    let tuples_per_batch: usize = index_dims[batch..q - 1].iter().product();
    let tuple_dims = index_dims[..q - 1].to_vec();
    let tuples: usize = tuple_dims.iter().product();
    let mut merged = vec![data_dims[..batch + depth].iter().product::<usize>()];
    merged.extend_from_slice(&data_dims[batch + depth..]);
    // each tuple's flat position in the merged data: constant indices resolved here,
    // run-time ones computed and checked by integer ops
    let positions = match cx.const_input(1)? {
        Some(indices) => {
            let raw = indices.i64s().ok_or_else(|| {
                cx.err(
                    "onnx-bad-model",
                    format!(
                        "input 1 (the indices) must be int64, got {}",
                        indices.type_name()
                    ),
                )
            })?;
            let mut flat = Vec::with_capacity(tuples);
            for (t, tuple) in raw.chunks_exact(depth).enumerate() {
                let mut at = (t / tuples_per_batch.max(1)) * per_batch;
                let mut stride = per_batch;
                for (k, (&i, &n)) in tuple.iter().zip(indexed).enumerate() {
                    stride /= n;
                    let j = if i < 0 { i + n as i64 } else { i };
                    if !(0..n as i64).contains(&j) {
                        return Err(cx.err(
                            "onnx-bad-model",
                            format!(
                                "index {i} (entry {k} of tuple {t}) is out of range for axis {} \
                                 of size {n}",
                                batch + k
                            ),
                        ));
                    }
                    at += j as usize * stride;
                }
                flat.push(at as i64);
            }
            let positions = ConstTensor::i64(tuple_dims, flat);
            if let Some(c) = cx.const_input(0)? {
                let out = c
                    .reshaped(merged)
                    .gather(0, &positions)
                    .map_err(|m| cx.err("onnx-bad-model", m))?;
                return Ok(vec![Entry::constant(out)]);
            }
            cx.materialize(&positions, &cx.derived_name("positions"))?
        }
        None => run_time_positions(cx, &tuple_dims, indexed, tuples_per_batch, merged[0])?,
    };
    let data = cx.reshaped_input(0, merged)?;
    Ok(vec![Entry::Value(
        cx.emit(Op::Gather { axis: 0 }, &[data, positions])?,
    )])
}

/// The flat positions in the merged data (`total` rows) of run-time GatherND index tuples:
/// per tuple its batch entry's base (a constant) plus each entry, wrapped when negative,
/// times its axis's stride; a tuple with an entry out of range goes past the end, which
/// the `gather`'s own run-time check reports (never a read elsewhere).
fn run_time_positions(
    cx: &mut NodeCtx,
    tuple_dims: &[usize],
    indexed: &[usize],
    tuples_per_batch: usize,
    total: usize,
) -> Result<Value, Diagnostic> {
    use smelt_ir::op::{BinaryOp, LogicOp};

    let indices = cx.value(1)?;
    let indices = cx.int64_indices(indices, "GatherND's indices")?;
    let rank = tuple_dims.len() + 1;
    let per_batch: usize = indexed.iter().product();
    let tuples: usize = tuple_dims.iter().product();
    let base: Vec<i64> = (0..tuples)
        .map(|t| ((t / tuples_per_batch.max(1)) * per_batch) as i64)
        .collect();
    let name = cx.derived_name("batch_base");
    let mut flat = cx.materialize(&ConstTensor::i64(tuple_dims.to_vec(), base), &name)?;
    let mut valid: Option<Value> = None;
    let mut stride = per_batch;
    for (k, &n) in indexed.iter().enumerate() {
        stride /= n;
        let entry = cx.slice_along(indices, rank - 1, k, k + 1)?;
        let entry = cx.reshape(entry, tuple_dims.to_vec())?;
        let (wrapped, ok) = super::indexing::checked_index(cx, entry, n as i64)?;
        valid = Some(match valid {
            None => ok,
            Some(v) => cx.emit(Op::Logic(LogicOp::And), &[v, ok])?,
        });
        let s = cx.int_scalar(stride as i64)?;
        let along = cx.emit(Op::Binary(BinaryOp::Mul), &[wrapped, s])?;
        flat = cx.emit(Op::Binary(BinaryOp::Add), &[flat, along])?;
    }
    let past_end = cx.int_scalar(total as i64)?;
    match valid {
        Some(v) => cx.emit(Op::Where, &[v, flat, past_end]),
        None => Ok(flat),
    }
}

/// ConstantOfShape: a constant of the given (constant) shape filled with `value`.
pub fn constant_of_shape(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["value"])?;
    let shape = cx.const_ints(0, "shape")?;
    let mut dims = Vec::with_capacity(shape.len());
    for &d in &shape {
        dims.push(usize::try_from(d).map_err(|_| {
            cx.err(
                "onnx-bad-model",
                format!("shape {shape:?} has a negative dimension"),
            )
        })?);
    }
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= (smelt_ir::types::MAX_TENSOR_BYTES / 8) as usize)
        .ok_or_else(|| cx.err("onnx-bad-model", format!("shape {shape:?} is too large")))?;
    let value = cx
        .attr_tensor("value")?
        .unwrap_or_else(|| ConstTensor::f32(vec![1], vec![0.0]));
    if value.len() != 1 {
        return Err(cx.bad_attr("value", "must hold exactly one element"));
    }
    // a few bytes of shape ask for up to the tensor limit: budgeted before it is filled
    let elem = if matches!(value.data, ConstData::I64(_)) {
        8
    } else {
        4
    };
    cx.imp.reserve(
        &format!("the constant of shape {shape:?}"),
        (n * elem) as u64,
    )?;
    let data = match &value.data {
        ConstData::I64(v) => ConstData::I64(vec![v[0]; n]),
        ConstData::F32(_) | ConstData::F32Raw(_) | ConstData::F32Aligned(_) => {
            ConstData::F32(vec![value.f32s().map(|v| v[0]).unwrap_or(0.0); n])
        }
        ConstData::Unsupported => {
            return Err(cx.err(
                "onnx-unsupported-dtype",
                format!("value of type {} is not supported", value.type_name()),
            ))
        }
    };
    let onnx_type = if value.onnx_type == 0 {
        dtype::FLOAT
    } else {
        value.onnx_type
    };
    Ok(vec![Entry::constant(ConstTensor {
        dims,
        data,
        onnx_type,
    })])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::context::normalize_axis;

    #[test]
    fn reshape_zero_copies_and_minus_one_infers() {
        assert_eq!(
            resolve_reshape(&[2, 3, 4], &[0, -1], false).unwrap(),
            vec![2, 12]
        );
        assert_eq!(resolve_reshape(&[2, 3, 4], &[-1], false).unwrap(), vec![24]);
        assert_eq!(resolve_reshape(&[0, 3], &[0, 3], true).unwrap(), vec![0, 3]);
        assert!(resolve_reshape(&[2, 3, 4], &[-1, -1], false).is_err());
        assert!(resolve_reshape(&[2, 3, 4], &[5, -1], false).is_err());
        assert!(resolve_reshape(&[2, 3], &[7], false).is_err());
    }

    #[test]
    fn negative_axes_normalize() {
        assert_eq!(normalize_axis(-1, 4), Some(3));
        assert_eq!(normalize_axis(-4, 4), Some(0));
        assert_eq!(normalize_axis(4, 4), None);
        assert_eq!(normalize_axis(-5, 4), None);
    }
}
