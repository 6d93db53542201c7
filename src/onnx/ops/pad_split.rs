//! Pad, CenterCropPad and Split. Pad becomes the IR's `pad` (CenterCropPad too, its
//! crops as negative pads) (pads and axes must be known at import;
//! the constant value may be computed at run time, since `pad` takes it as an operand).
//! Split becomes one `slice` per output (folded when the input is constant, as shape
//! vectors are), with the chunk sizes of its opset: the `split` attribute (before 13)
//! or input (from 13, and as an alternative input in Split-1), `num_outputs` (from 18,
//! the last chunk smaller when the axis does not divide), or equal parts.

use smelt_ir::op::{Op, PadAttrs, PadMode, SliceAttrs};
use smelt_ir::{DType, Diagnostic};

use super::OpRule;
use crate::onnx::context::{normalize_axis, Entry, NodeCtx};
use crate::onnx::tensor::{dtype, ConstData, ConstTensor};

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "CenterCropPad"       [18],                           from 18 => center_crop_pad;
    "Pad"                 [1, 2, 11, 13, 18, 19, 21, 23, 24, 25], from 2 => pad;
    "Split"               [1, 2, 11, 13, 18],             from 1  => split;
};

/// Full-rank pads (begins of every axis, then ends) from ONNX's `pads` over `axes`
/// (default: every axis), or what is wrong with them.
pub fn full_rank_pads(rank: usize, pads: &[i64], axes: Option<&[i64]>) -> Result<Vec<i64>, String> {
    let default_axes: Vec<i64> = (0..rank as i64).collect();
    let axes = axes.unwrap_or(&default_axes);
    let n = axes.len();
    if pads.len() != 2 * n {
        return Err(format!(
            "pads has {} entries; it needs a begin and an end for each of the {n} axes ({} entries)",
            pads.len(),
            2 * n
        ));
    }
    let mut out = vec![0; 2 * rank];
    let mut seen = vec![false; rank];
    for (i, &a) in axes.iter().enumerate() {
        let k = normalize_axis(a, rank)
            .ok_or_else(|| format!("axis {a} is out of range for rank {rank}"))?;
        if std::mem::replace(&mut seen[k], true) {
            return Err(format!("axes {axes:?} repeat axis {a}"));
        }
        out[k] = pads[i];
        out[k + rank] = pads[i + n];
    }
    Ok(out)
}

/// Whether a constant holds only zeros (`+0.0` for floats, so a `-0.0` fill is kept).
fn is_zero(c: &ConstTensor) -> bool {
    match &c.data {
        ConstData::I64(v) => v.iter().all(|&x| x == 0),
        ConstData::F32Raw(_) | ConstData::F32Aligned(_) | ConstData::F32(_) => {
            c.f32s().is_some_and(|v| v.iter().all(|x| x.to_bits() == 0))
        }
        ConstData::Unsupported => false,
    }
}

/// Pad: `pads`, `mode` and `value` as attributes in Pad-2; from Pad-11 `pads`, the
/// optional `constant_value` and (from 18) `axes` as inputs; mode `wrap` from Pad-19.
pub fn pad(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    let dims = cx.dims(0)?;
    let rank = dims.len();
    let bad = |cx: &NodeCtx, m: String| cx.err("onnx-bad-model", format!("Pad: {m}"));
    let mode_name = cx.attr_string("mode")?.unwrap_or_else(|| "constant".into());
    let mode = PadMode::from_name(&mode_name).ok_or_else(|| {
        cx.bad_attr(
            "mode",
            format!("'{mode_name}' is not a pad mode (constant, reflect, edge, wrap)"),
        )
    })?;
    if mode == PadMode::Wrap && cx.version < 19 {
        return Err(cx.bad_attr(
            "mode",
            format!(
                "'wrap' exists from Pad-19; this model imports Pad-{}",
                cx.version
            ),
        ));
    }
    // The fill: `None` for zero (the op's default), else a value of the input's type.
    let (pads, fill) = if cx.version < 11 {
        cx.check_attrs(&["pads", "mode", "value"])?;
        if cx.num_inputs() > 1 {
            return Err(bad(
                cx,
                format!(
                    "Pad-{} takes pads and value as attributes; the inputs exist from opset 11",
                    cx.version
                ),
            ));
        }
        let pads = cx
            .attr_ints("pads")?
            .ok_or_else(|| cx.bad_attr("pads", "is required before opset 11"))?;
        let value = cx.attr_float_or("value", 0.0)?;
        let fill = if value.to_bits() == 0 || mode != PadMode::Constant {
            None
        } else {
            Some(fill_constant(cx, value)?)
        };
        (
            full_rank_pads(rank, &pads, None).map_err(|m| bad(cx, m))?,
            fill,
        )
    } else {
        cx.check_attrs(&["mode"])?;
        let pads = cx.const_ints(1, "pads")?;
        let axes = match cx.input_name(3) {
            Some(_) if cx.version < 18 => {
                return Err(bad(
                    cx,
                    format!(
                        "the axes input exists from Pad-18; this model imports Pad-{}",
                        cx.version
                    ),
                ))
            }
            Some(_) => Some(cx.const_ints(3, "axes")?),
            None => None,
        };
        let pads = full_rank_pads(rank, &pads, axes.as_deref()).map_err(|m| bad(cx, m))?;
        // other modes ignore the constant value
        let fill = match cx.input_name(2) {
            Some(_) if mode == PadMode::Constant => match cx.const_input(2)? {
                Some(c) if is_zero(&c) && c.len() == 1 => None,
                _ => Some(cx.value(2)?),
            },
            _ => None,
        };
        if let Some(v) = fill {
            let t = cx.type_of(v);
            if t.num_elements() != 1 {
                return Err(bad(
                    cx,
                    format!("constant_value must hold one element, got {t}"),
                ));
            }
        }
        (pads, fill)
    };
    if pads.iter().all(|&p| p == 0) {
        return Ok(vec![cx.entry(0)?]);
    }
    let x = cx.value(0)?;
    let mut operands = vec![x];
    operands.extend(fill);
    let op = Op::Pad(PadAttrs { pads, mode });
    Ok(vec![Entry::Value(cx.emit(op, &operands)?)])
}

/// Pad-2's float `value` as a one-element constant of input 0's element type: integers
/// take it only when it is a whole number they hold.
fn fill_constant(cx: &mut NodeCtx, value: f32) -> Result<smelt_ir::Value, Diagnostic> {
    let x = cx.value(0)?;
    let d = cx.type_of(x).dtype;
    let c = match d {
        DType::F32 => ConstTensor::f32(vec![], vec![value]),
        // a float16 / bfloat16 input (read by a cast, never here: the importer widens
        // them) would take the value rounded to its type
        DType::F16 | DType::BF16 => ConstTensor::f32(vec![], vec![value])
            .as_float_type(dtype::of_ir(d))
            .unwrap_or_else(|| ConstTensor::f32(vec![], vec![value])),
        DType::I64 | DType::I32 | DType::Bool | DType::I8 | DType::U8 | DType::I16 | DType::U16 => {
            let code = dtype::of_ir(d);
            let whole = value.fract() == 0.0 && value.abs() < 9.0e18;
            if !whole || !dtype::holds(code, value as i64) {
                return Err(cx.bad_attr(
                    "value",
                    format!("{value} is not a value of the input's element type {d}"),
                ));
            }
            ConstTensor {
                dims: vec![],
                data: ConstData::I64(vec![value as i64]),
                onnx_type: code,
            }
        }
    };
    let name = cx.derived_name("pad_value");
    cx.materialize(&c, &name)
}

/// The chunk sizes of a Split of an axis of `dim` into `outputs` outputs: `split` as
/// given (summing to `dim`), `num_outputs` chunks of `ceil(dim / n)` with a smaller
/// last one, or (neither) equal parts.
pub fn split_sizes(
    dim: usize,
    outputs: usize,
    split: Option<&[i64]>,
    num_outputs: Option<i64>,
) -> Result<Vec<usize>, String> {
    let sizes: Vec<usize> = match (split, num_outputs) {
        (Some(_), Some(_)) => {
            return Err("give either the split input or num_outputs, not both".into())
        }
        (Some(s), None) => {
            if s.len() != outputs {
                return Err(format!(
                    "split {s:?} has {} entries for {outputs} outputs",
                    s.len()
                ));
            }
            let sizes = s
                .iter()
                .map(|&v| {
                    usize::try_from(v).map_err(|_| format!("split {s:?} has a negative entry"))
                })
                .collect::<Result<Vec<usize>, String>>()?;
            let sum = sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b));
            if sum != Some(dim) {
                return Err(format!("split {s:?} does not sum to the axis size {dim}"));
            }
            sizes
        }
        (None, Some(n)) => {
            if n < 1 || n as u64 != outputs as u64 {
                return Err(format!(
                    "num_outputs {n} must be the node's number of outputs, {outputs}"
                ));
            }
            let chunk = dim.div_ceil(outputs);
            let last = dim.checked_sub(chunk * (outputs - 1)).filter(|&l| l > 0);
            let Some(last) = last else {
                return Err(format!(
                    "an axis of size {dim} has no {outputs} chunks of {chunk} with a smaller last one"
                ));
            };
            let mut v = vec![chunk; outputs - 1];
            v.push(last);
            v
        }
        (None, None) => {
            if outputs == 0 || !dim.is_multiple_of(outputs) {
                return Err(format!(
                    "an axis of size {dim} does not split into {outputs} equal parts"
                ));
            }
            vec![dim / outputs; outputs]
        }
    };
    Ok(sizes)
}

/// Split along `axis` into one `slice` per output.
pub fn split(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    let known: &[&str] = if cx.version >= 18 {
        &["axis", "num_outputs"]
    } else if cx.version >= 13 {
        &["axis"]
    } else {
        &["axis", "split"]
    };
    cx.check_attrs(known)?;
    let dims = cx.dims(0)?;
    let rank = dims.len();
    let axis = cx.attr_int_or("axis", 0)?;
    let k = cx.axis("axis", axis, rank)?;
    let split = if cx.version >= 13 || (cx.version == 1 && cx.input_name(1).is_some()) {
        match cx.input_name(1) {
            Some(_) => Some(cx.const_ints(1, "split")?),
            None => None,
        }
    } else {
        if cx.num_inputs() > 1 {
            return Err(cx.err(
                "onnx-bad-model",
                format!(
                    "Split-{} takes split as an attribute; the input exists from opset 13",
                    cx.version
                ),
            ));
        }
        cx.attr_ints("split")?
    };
    let num_outputs = if cx.version >= 18 {
        cx.attr_int("num_outputs")?
    } else {
        None
    };
    let outputs = cx.node.output.len();
    let sizes = split_sizes(dims[k], outputs, split.as_deref(), num_outputs)
        .map_err(|m| cx.err("onnx-bad-model", format!("Split: {m}")))?;
    let constant = cx.const_input(0)?;
    let mut entries = Vec::with_capacity(outputs);
    let mut start = 0usize;
    for size in sizes {
        let mut s = SliceAttrs {
            starts: vec![0; rank],
            ends: dims.iter().map(|&d| d as i64).collect(),
            steps: vec![1; rank],
        };
        s.starts[k] = start as i64;
        s.ends[k] = (start + size) as i64;
        start += size;
        if let Some(c) = &constant {
            let folded = c.slice(&s).map_err(|m| cx.err("onnx-bad-model", m))?;
            entries.push(Entry::constant(folded));
        } else if size == dims[k] {
            entries.push(cx.entry(0)?);
        } else {
            let x = cx.value(0)?;
            entries.push(Entry::Value(cx.emit(Op::Slice(s), &[x])?));
        }
    }
    Ok(entries)
}

/// CenterCropPad: each listed axis (`axes`, default all) cropped or zero-padded to its
/// target length (input 1, known at import) around its centre — the odd element of a
/// crop or pad at the end — as one `pad` whose negative pads crop.
pub fn center_crop_pad(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axes"])?;
    cx.check_max_inputs(2)?;
    let dims = cx.dims(0)?;
    let rank = dims.len();
    let shape = cx.const_ints(1, "shape")?;
    let axes = match cx.attr_ints("axes")? {
        Some(listed) => listed
            .iter()
            .map(|&a| cx.axis("axes", a, rank))
            .collect::<Result<Vec<_>, _>>()?,
        None => (0..rank).collect(),
    };
    if shape.len() != axes.len() {
        return Err(cx.err(
            "onnx-bad-model",
            format!("shape {shape:?} must have one length per axis of {axes:?}"),
        ));
    }
    let mut pads = vec![0i64; 2 * rank];
    for (&a, &target) in axes.iter().zip(&shape) {
        if target <= 0 {
            return Err(cx.err(
                "onnx-bad-model",
                format!("target length {target} of axis {a} must be positive"),
            ));
        }
        // positive: added around the input; negative: cropped from it
        let grow = target - dims[a] as i64;
        let begin = grow.signum() * (grow.abs() / 2);
        pads[a] = begin;
        pads[rank + a] = grow - begin;
    }
    let x = cx.value(0)?;
    let op = Op::Pad(PadAttrs {
        pads,
        mode: PadMode::Constant,
    });
    Ok(vec![Entry::Value(cx.emit(op, &[x])?)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pads_over_axes_become_full_rank() {
        assert_eq!(
            full_rank_pads(4, &[0, 3, 0, 4], Some(&[1, 3])),
            Ok(vec![0, 0, 0, 3, 0, 0, 0, 4])
        );
        assert_eq!(
            full_rank_pads(4, &[0, 3, 0, 4], Some(&[-3, -1])),
            Ok(vec![0, 0, 0, 3, 0, 0, 0, 4])
        );
        assert_eq!(full_rank_pads(2, &[1, 2, 3, 4], None), Ok(vec![1, 2, 3, 4]));
        assert!(full_rank_pads(2, &[1, 2], None)
            .unwrap_err()
            .contains("4 entries"));
        assert!(full_rank_pads(2, &[1, 2, 3, 4], Some(&[0, 0])).is_err());
        assert!(full_rank_pads(2, &[1, 2], Some(&[2])).is_err());
    }

    #[test]
    fn split_sizes_follow_each_opset_form() {
        assert_eq!(split_sizes(7, 4, None, Some(4)), Ok(vec![2, 2, 2, 1]));
        assert_eq!(split_sizes(8, 3, None, Some(3)), Ok(vec![3, 3, 2]));
        assert_eq!(split_sizes(6, 3, None, None), Ok(vec![2, 2, 2]));
        assert_eq!(split_sizes(6, 2, Some(&[2, 4]), None), Ok(vec![2, 4]));
        assert!(split_sizes(7, 3, None, None)
            .unwrap_err()
            .contains("equal parts"));
        assert!(split_sizes(6, 2, Some(&[2, 3]), None)
            .unwrap_err()
            .contains("sum"));
        assert!(split_sizes(5, 4, None, Some(4)).is_err());
        assert!(split_sizes(6, 3, None, Some(2))
            .unwrap_err()
            .contains("number of outputs"));
        // an empty chunk is an empty output, as ONNX allows
        assert_eq!(split_sizes(6, 2, Some(&[6, 0]), None), Ok(vec![6, 0]));
        assert!(split_sizes(6, 2, Some(&[3, 3]), Some(2)).is_err());
    }
}
