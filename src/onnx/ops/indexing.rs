//! Selections by position: Trilu as a `where` over a constant mask, EyeLike as a
//! constant (it depends only on its input's shape), OneHot as a `where`
//! over the comparison of the indices with the positions, Compress as a `gather` of the
//! positions its constant condition selects, ReverseSequence as a `gather` of the
//! flattened input at the positions its constant sequence lengths give, and GatherElements as a `gather` of the
//! flattened data at flat positions: each index's position along the axis times the axis
//! stride, plus the other coordinates' part (a constant, since shapes are static).
//! Indices known at import are resolved and checked there; run-time ones are wrapped
//! (negative counts from the end) and checked by integer ops, an index out of range
//! becoming a position past the end, which the `gather` refuses at run time — so a bad
//! index is an error from `run`, never a read elsewhere in the data. NonZero's result
//! shape is the count of its input's non-zeros: it folds on a constant input and is
//! refused by name on run-time data (smelt's shapes are known at compile time).

use smelt_ir::op::{BinaryOp, Comparison, LogicOp, Op};
use smelt_ir::{DType, Diagnostic, Value};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::{dtype, ConstData, ConstTensor};

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "Compress"            [9, 11, 28],                    from 9  => compress;
    "EyeLike"             [9, 22],                        from 9  => eye_like;
    "GatherElements"      [11, 13],                       from 11 => gather_elements;
    "NonZero"             [9, 13],                        from 9  => non_zero;
    "OneHot"              [9, 11, 28],                    from 9  => one_hot;
    "ReverseSequence"     [10, 28],                       from 10 => reverse_sequence;
    "Trilu"               [14],                           from 14 => trilu;
};

/// GatherElements: `out[i₀, …, iₙ] = data[i₀, …, indices[i₀, …, iₙ], …, iₙ]` along `axis`.
pub fn gather_elements(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis"])?;
    cx.check_max_inputs(2)?;
    let rank = cx.dims(0)?.len();
    let axis = cx.axis("axis", cx.attr_int_or("axis", 0)?, rank)?;
    let data = cx.value(0)?;
    let indices = match cx.const_input(1)? {
        Some(c) => Indices::Const(c.as_ref().clone()),
        None => Indices::Value(cx.value(1)?),
    };
    Ok(vec![Entry::Value(gather_elements_of(
        cx, data, indices, axis,
    )?)])
}

/// GatherElements' indices: known at import, or computed at run time.
pub enum Indices {
    /// Known at import (int64 or another integer type).
    Const(ConstTensor),
    /// A run-time int64 or int32 tensor.
    Value(Value),
}

/// Whether indices of shape `index_dims` may address data of shape `data_dims` along
/// `axis` (GatherElements, ScatterElements): the same rank, and no dimension larger than
/// the data's except along the axis.
pub(super) fn fits_data_along(index_dims: &[usize], data_dims: &[usize], axis: usize) -> bool {
    index_dims.len() == data_dims.len()
        && index_dims
            .iter()
            .zip(data_dims)
            .enumerate()
            .all(|(k, (&i, &d))| k == axis || i <= d)
}

/// The elements of `data` that `indices` pick along `axis` (GatherElements); also the
/// losses' pick of each target's class.
pub fn gather_elements_of(
    cx: &mut NodeCtx,
    data: Value,
    indices: Indices,
    axis: usize,
) -> Result<Value, Diagnostic> {
    let data_dims = cx.type_of(data).dims.clone();
    let index_dims = match &indices {
        Indices::Const(c) => c.dims.clone(),
        Indices::Value(v) => cx.type_of(*v).dims.clone(),
    };
    if !fits_data_along(&index_dims, &data_dims, axis) {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "indices of shape {index_dims:?} must have the rank of the data {data_dims:?} \
                 and no dimension larger than the data's but along axis {axis}"
            ),
        ));
    }
    let size = data_dims[axis] as i64;
    let mut strides = vec![1usize; data_dims.len()];
    for k in (0..data_dims.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * data_dims[k + 1];
    }
    let total: usize = data_dims.iter().product();
    // each index position's offset from the coordinates other than the axis
    let count: usize = index_dims.iter().product();
    let mut base = Vec::with_capacity(count);
    let mut coords = vec![0usize; index_dims.len()];
    for _ in 0..count {
        let offset: usize = (0..coords.len())
            .filter(|&k| k != axis)
            .map(|k| coords[k] * strides[k])
            .sum();
        base.push(offset as i64);
        for k in (0..coords.len()).rev() {
            coords[k] += 1;
            if coords[k] < index_dims[k] {
                break;
            }
            coords[k] = 0;
        }
    }
    let flat_data = cx.reshape(data, vec![total])?;
    let positions = match indices {
        Indices::Const(c) => {
            let Some(values) = c.i64s() else {
                return Err(cx.err(
                    "onnx-unsupported-dtype",
                    format!("indices must be integers, got {}", c.type_name()),
                ));
            };
            let mut flat = Vec::with_capacity(count);
            for (&i, &b) in values.iter().zip(&base) {
                let k = if i < 0 { i + size } else { i };
                if !(0..size).contains(&k) {
                    return Err(cx.err(
                        "onnx-bad-model",
                        format!(
                            "index {i} is out of range for axis {axis} of size {size} \
                             (valid: {} to {})",
                            -size,
                            size - 1
                        ),
                    ));
                }
                flat.push(k * strides[axis] as i64 + b);
            }
            let name = cx.derived_name("positions");
            cx.materialize(&ConstTensor::i64(index_dims, flat), &name)?
        }
        Indices::Value(v) => {
            let v = cx.int64_indices(v, "indices")?;
            let (wrapped, valid) = checked_index(cx, v, size)?;
            let stride = cx.int_scalar(strides[axis] as i64)?;
            let along = cx.emit(Op::Binary(BinaryOp::Mul), &[wrapped, stride])?;
            let name = cx.derived_name("offsets");
            let base = cx.materialize(&ConstTensor::i64(index_dims, base), &name)?;
            let flat = cx.emit(Op::Binary(BinaryOp::Add), &[along, base])?;
            // past the end: the gather's run-time check reports it
            let past_end = cx.int_scalar(total as i64)?;
            cx.emit(Op::Where, &[valid, flat, past_end])?
        }
    };
    cx.emit(Op::Gather { axis: 0 }, &[flat_data, positions])
}

/// int64 indices `v` into an axis of `size` with the negative ones counted from the end
/// (`v + size` where `v < 0`), with the constants 0 and `size` it compared against.
pub(super) fn wrap_negative(
    cx: &mut NodeCtx,
    v: Value,
    size: i64,
) -> Result<(Value, Value, Value), Diagnostic> {
    let zero = cx.int_scalar(0)?;
    let size_v = cx.int_scalar(size)?;
    let negative = cx.emit(Op::Compare(Comparison::Less), &[v, zero])?;
    let shifted = cx.emit(Op::Binary(BinaryOp::Add), &[v, size_v])?;
    let wrapped = cx.emit(Op::Where, &[negative, shifted, v])?;
    Ok((wrapped, zero, size_v))
}

/// int64 indices `v` into an axis of `size`, wrapped as [`wrap_negative`] does, and
/// whether each lies in `0..size` once wrapped (an `i1` tensor of `v`'s shape).
pub(super) fn checked_index(
    cx: &mut NodeCtx,
    v: Value,
    size: i64,
) -> Result<(Value, Value), Diagnostic> {
    let (wrapped, zero, size_v) = wrap_negative(cx, v, size)?;
    let above = cx.emit(Op::Compare(Comparison::GreaterOrEqual), &[wrapped, zero])?;
    let below = cx.emit(Op::Compare(Comparison::Less), &[wrapped, size_v])?;
    let valid = cx.emit(Op::Logic(LogicOp::And), &[above, below])?;
    Ok((wrapped, valid))
}

/// Trilu: the upper (`upper = 1`, the default) or lower triangle of the last two axes,
/// the diagonal shifted by `k` (input 1, known at import), the rest zero — a `where`
/// over a constant mask of the positions kept.
pub fn trilu(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["upper"])?;
    cx.check_max_inputs(2)?;
    let dims = cx.dims(0)?;
    if dims.len() < 2 {
        return Err(cx.err(
            "onnx-bad-model",
            format!("input of shape {dims:?} must have at least 2 dimensions"),
        ));
    }
    let upper = cx.attr_bool("upper", true)?;
    let k = match cx.input_name(1) {
        None => 0,
        Some(_) => cx.const_int(1, "diagonal offset k")?,
    };
    let (rows, cols) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let mut kept = Vec::with_capacity(rows * cols);
    for i in 0..rows as i64 {
        for j in 0..cols as i64 {
            kept.push(if upper { j - i >= k } else { j - i <= k });
        }
    }
    let x = cx.value(0)?;
    let dtype = cx.type_of(x).dtype;
    let name = cx.derived_name("triangle");
    let mask = cx.materialize(&ConstTensor::bool(vec![rows, cols], kept), &name)?;
    let zero = cx.scalar(0.0)?;
    let zero = match dtype {
        DType::F32 => zero,
        _ => cx.emit(Op::Cast { to: dtype }, &[zero])?,
    };
    Ok(vec![Entry::Value(cx.emit(Op::Where, &[mask, x, zero])?)])
}

/// EyeLike: ones on the diagonal shifted by `k`, zeros elsewhere, in the input's 2-D
/// shape and of type `dtype` (default: the input's) — a constant, since only the
/// input's shape matters.
pub fn eye_like(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["dtype", "k"])?;
    cx.check_max_inputs(1)?;
    let dims = cx.dims(0)?;
    let [rows, cols] = dims[..] else {
        return Err(cx.err(
            "onnx-bad-model",
            format!("input of shape {dims:?} must have 2 dimensions"),
        ));
    };
    let k = cx.attr_int_or("k", 0)?;
    let input_type = match cx.entry(0)? {
        Entry::Const(c) => c.onnx_type,
        Entry::Value(_) | Entry::Dropped { .. } => {
            let x = cx.value(0)?;
            dtype::of_ir(cx.type_of(x).dtype)
        }
    };
    let onnx_type = match cx.attr_int("dtype")? {
        None => input_type,
        Some(code) => i32::try_from(code)
            .map_err(|_| cx.bad_attr("dtype", format!("{code} is not an ONNX type code")))?,
    };
    let on = |i: usize, j: usize| j as i64 - i as i64 == k;
    // 0 and 1 are exact in float16 and bfloat16 too
    let data = if matches!(onnx_type, dtype::FLOAT | dtype::FLOAT16 | dtype::BFLOAT16) {
        ConstData::F32(
            (0..rows * cols)
                .map(|p| f32::from(u8::from(on(p / cols, p % cols))))
                .collect(),
        )
    } else if matches!(
        onnx_type,
        dtype::INT64
            | dtype::INT32
            | dtype::INT16
            | dtype::INT8
            | dtype::UINT16
            | dtype::UINT8
            | dtype::BOOL
    ) {
        ConstData::I64(
            (0..rows * cols)
                .map(|p| i64::from(on(p / cols, p % cols)))
                .collect(),
        )
    } else {
        return Err(cx.err(
            "onnx-unsupported-dtype",
            format!(
                "output type {} is not one smelt computes with (float32, float16, \
                 bfloat16, int64, int32, int16, int8, uint16, uint8, bool)",
                dtype::name(onnx_type)
            ),
        ));
    };
    Ok(vec![Entry::constant(ConstTensor {
        dims,
        data,
        onnx_type,
    })])
}

/// ReverseSequence: along `time_axis`, the first `sequence_lens[b]` elements of each
/// batch entry `b` (along `batch_axis`) reversed, the rest kept — one `gather` of the
/// flattened input at constant positions, so the lengths must be known at import.
pub fn reverse_sequence(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["batch_axis", "time_axis"])?;
    cx.check_max_inputs(2)?;
    let dims = cx.dims(0)?;
    let rank = dims.len();
    let batch_axis = cx.attr_int_or("batch_axis", 1)?;
    let time_axis = cx.attr_int_or("time_axis", 0)?;
    let (batch_axis, time_axis) = match (batch_axis, time_axis) {
        (0, 1) | (1, 0) if rank >= 2 => (batch_axis as usize, time_axis as usize),
        _ => {
            return Err(cx.err(
                "onnx-bad-model",
                format!(
                    "batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1 \
                     (either way round) of an input of rank 2 or more, got shape {dims:?}"
                ),
            ))
        }
    };
    let lens = cx.const_ints(1, "sequence_lens")?;
    let (batch, time) = (dims[batch_axis], dims[time_axis]);
    if lens.len() != batch {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "sequence_lens has {} values for a batch of {batch}",
                lens.len()
            ),
        ));
    }
    if let Some(bad) = lens.iter().find(|&&l| !(0..=time as i64).contains(&l)) {
        return Err(cx.err(
            "onnx-bad-model",
            format!("sequence length {bad} is outside 0 to the time axis' {time}"),
        ));
    }
    let mut strides = vec![1usize; rank];
    for k in (0..rank - 1).rev() {
        strides[k] = strides[k + 1] * dims[k + 1];
    }
    let total: usize = dims.iter().product();
    let mut positions = Vec::with_capacity(total);
    for p in 0..total {
        let b = p / strides[batch_axis] % batch;
        let t = p / strides[time_axis] % time;
        let len = lens[b] as usize;
        let source_t = if t < len { len - 1 - t } else { t };
        let source = p - t * strides[time_axis] + source_t * strides[time_axis];
        positions.push(source as i64);
    }
    let x = cx.value(0)?;
    let flat = cx.reshape(x, vec![total])?;
    let name = cx.derived_name("reversed_positions");
    let positions = cx.materialize(&ConstTensor::i64(vec![total], positions), &name)?;
    let picked = cx.emit(Op::Gather { axis: 0 }, &[flat, positions])?;
    Ok(vec![Entry::Value(cx.reshape(picked, dims)?)])
}

/// OneHot: `values[1]` where the new axis' position equals the index (negative ones
/// counting from the end), `values[0]` elsewhere — an index outside `[-depth, depth)`
/// matches no position, so its row is all off, as the operator says. `depth` must be
/// known at import; float indices are truncated to integers, as ONNX casts them.
pub fn one_hot(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis"])?;
    cx.check_max_inputs(3)?;
    let index_dims = cx.dims(0)?;
    let axis = cx.axis("axis", cx.attr_int_or("axis", -1)?, index_dims.len() + 1)?;
    let depth = cx.require_const(1, "depth")?;
    let depth = match (depth.i64s(), depth.f32s()) {
        (Some([d]), _) => *d,
        (None, Some(d)) if d.len() == 1 && d[0].is_finite() => d[0].trunc() as i64,
        _ => {
            return Err(cx.err(
                "onnx-bad-model",
                format!(
                    "depth must be one number, got a tensor of shape {:?}",
                    depth.dims
                ),
            ))
        }
    };
    if !(1..=i32::MAX as i64).contains(&depth) {
        return Err(cx.err("onnx-bad-model", format!("depth {depth} must be positive")));
    }
    if cx.dims(2)? != [2] {
        return Err(cx.err(
            "onnx-bad-model",
            format!("values of shape {:?} must be [off, on]", cx.dims(2)?),
        ));
    }
    let indices = cx.value(0)?;
    let indices = match cx.type_of(indices).dtype {
        DType::I64 => indices,
        DType::I32
        | DType::F32
        | DType::F16
        | DType::BF16
        | DType::I8
        | DType::U8
        | DType::I16
        | DType::U16 => cx.emit(Op::Cast { to: DType::I64 }, &[indices])?,
        DType::Bool => {
            return Err(cx.err(
                "onnx-unsupported-dtype",
                "indices must be numbers, got bool",
            ))
        }
    };
    let (wrapped, zero, _) = wrap_negative(cx, indices, depth)?;
    let mut dims = index_dims.clone();
    dims.insert(axis, 1);
    let wrapped = cx.reshape(wrapped, dims.clone())?;
    let mut iota_dims = vec![1; dims.len()];
    iota_dims[axis] = depth as usize;
    let name = cx.derived_name("positions");
    let iota = cx.materialize(&ConstTensor::i64(iota_dims, (0..depth).collect()), &name)?;
    let hot = cx.emit(Op::Compare(Comparison::Equal), &[wrapped, iota])?;
    let values = cx.value(2)?;
    let off = cx.emit(Op::Gather { axis: 0 }, &[values, zero])?;
    let one = cx.int_scalar(1)?;
    let on = cx.emit(Op::Gather { axis: 0 }, &[values, one])?;
    Ok(vec![Entry::Value(cx.emit(Op::Where, &[hot, on, off])?)])
}

/// Compress: the slices along `axis` (of the flattened input without one) whose
/// condition is true, as a `gather` of their positions; the condition must be known at
/// import, since it decides the result's shape.
pub fn compress(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis"])?;
    cx.check_max_inputs(2)?;
    let dims = cx.dims(0)?;
    let condition = cx.require_const(1, "condition")?;
    let (Some(flags), true) = (condition.i64s(), condition.dims.len() == 1) else {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "the condition must be a 1-D bool tensor, got {} of shape {:?}",
                condition.type_name(),
                condition.dims
            ),
        ));
    };
    let x = cx.value(0)?;
    let (x, axis) = match cx.attr_int("axis")? {
        Some(a) => (x, cx.axis("axis", a, dims.len())?),
        None => (cx.reshape(x, vec![dims.iter().product()])?, 0),
    };
    let length = cx.type_of(x).dims[axis];
    if flags.len() > length {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "the condition has {} values for an axis of {length}",
                flags.len()
            ),
        ));
    }
    let picked: Vec<i64> = (0..flags.len() as i64)
        .filter(|&i| flags[i as usize] != 0)
        .collect();
    if picked.is_empty() {
        return Err(cx.err(
            "onnx-bad-model",
            "the condition selects nothing: smelt's tensors have no empty dimensions",
        ));
    }
    let name = cx.derived_name("selected");
    let picked = cx.materialize(&ConstTensor::i64(vec![picked.len()], picked), &name)?;
    Ok(vec![Entry::Value(
        cx.emit(Op::Gather { axis }, &[x, picked])?,
    )])
}

/// NonZero: the coordinates `[rank, count]` of the non-zero elements in row-major order,
/// folded on a constant input. On run-time data the result's shape depends on the values,
/// which smelt's compiled shapes cannot: a clear error.
pub fn non_zero(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    cx.check_max_inputs(1)?;
    let Some(x) = cx.const_input(0)? else {
        return Err(cx.err(
            "onnx-dynamic-shape",
            "the input is computed at run time, and NonZero's result has one column per \
             non-zero element: a shape known only from the data, which smelt's compiled \
             shapes cannot take (it folds NonZero of a constant)",
        ));
    };
    let nonzero: Vec<bool> = match (&x.data, x.f32s()) {
        (ConstData::I64(v), _) => v.iter().map(|&e| e != 0).collect(),
        (_, Some(v)) => v.iter().map(|&e| e != 0.0).collect(),
        _ => {
            return Err(cx.err(
                "onnx-unsupported-dtype",
                format!(
                    "NonZero of {}: smelt folds it on float32, integer and bool",
                    x.type_name()
                ),
            ))
        }
    };
    let rank = x.dims.len();
    let positions: Vec<usize> = (0..nonzero.len()).filter(|&i| nonzero[i]).collect();
    cx.imp.reserve(
        "NonZero's coordinates",
        (rank.max(1) * positions.len() * 8) as u64,
    )?;
    let mut coords = vec![0i64; rank * positions.len()];
    for (j, &p) in positions.iter().enumerate() {
        let mut rest = p;
        for k in (0..rank).rev() {
            coords[k * positions.len() + j] = (rest % x.dims[k]) as i64;
            rest /= x.dims[k];
        }
    }
    Ok(vec![Entry::constant(ConstTensor::i64(
        vec![rank, positions.len()],
        coords,
    ))])
}
