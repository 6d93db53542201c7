//! Data movement with static windows: Slice, Expand and Tile, folded at import when
//! their data is constant (shape vectors), IR ops otherwise; DepthToSpace and
//! SpaceToDepth as the reshape-transpose-reshape they are. Starts, ends, axes, steps,
//! shapes and repeats must be known at import (constants or folded shape arithmetic);
//! they are normalized here (Slice's clamped as the ONNX spec says), so the IR ops see
//! in-range values only.

use smelt_ir::op::{broadcast, Op, SliceAttrs};
use smelt_ir::Diagnostic;

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "DepthToSpace"        [1, 11, 13, 28],                from 1  => depth_space;
    "Expand"              [8, 13],                        from 8  => expand;
    "Slice"               [1, 10, 11, 13],                from 1  => slice;
    "SpaceToDepth"        [1, 13, 28],                    from 1  => depth_space;
    "Tile"                [1, 6, 13],                     from 6  => tile;
};

/// ONNX Slice's normalization of `starts`, `ends`, `axes` (default: the first
/// `starts.len()` axes) and `steps` (default 1) against the input `dims`: negative
/// indices count from the end, then starts and ends are clamped to the range the step's
/// direction allows. Unlisted axes are taken whole.
pub fn normalize_slice(
    dims: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Result<SliceAttrs, String> {
    let rank = dims.len();
    let n = starts.len();
    if ends.len() != n {
        return Err(format!(
            "starts has {n} entries but ends has {}",
            ends.len()
        ));
    }
    let default_axes: Vec<i64> = (0..n as i64).collect();
    let axes = axes.unwrap_or(&default_axes);
    if axes.len() != n {
        return Err(format!(
            "starts has {n} entries but axes has {}",
            axes.len()
        ));
    }
    if let Some(st) = steps {
        if st.len() != n {
            return Err(format!("starts has {n} entries but steps has {}", st.len()));
        }
    }
    let mut out = SliceAttrs {
        starts: vec![0; rank],
        ends: dims.iter().map(|&d| d as i64).collect(),
        steps: vec![1; rank],
    };
    let mut seen = vec![false; rank];
    for i in 0..n {
        let a = axes[i];
        let k = crate::onnx::context::normalize_axis(a, rank)
            .ok_or_else(|| format!("axis {a} is out of range for rank {rank}"))?;
        if std::mem::replace(&mut seen[k], true) {
            return Err(format!("axes {axes:?} repeat axis {a}"));
        }
        let step = steps.map_or(1, |s| s[i]);
        if step == 0 {
            return Err(format!("step 0 on axis {a}"));
        }
        let dim = dims[k] as i64;
        let from_end = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
        let (start, end) = (from_end(starts[i]), from_end(ends[i]));
        let (start, end) = if step > 0 {
            (start.clamp(0, dim), end.clamp(0, dim))
        } else {
            (start.clamp(0, (dim - 1).max(0)), end.clamp(-1, dim - 1))
        };
        // steps beyond the dim read one element; keep them in the text form's range
        let step = step.clamp(-dim.max(1), dim.max(1));
        out.starts[k] = start;
        out.ends[k] = end;
        out.steps[k] = step;
    }
    Ok(out)
}

/// Slice: starts, ends, axes as attributes before opset 10, inputs (with steps) from 10.
pub fn slice(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    let dims = cx.dims(0)?;
    let (starts, ends, axes, steps) = if cx.version < 10 {
        cx.check_attrs(&["starts", "ends", "axes"])?;
        if cx.num_inputs() > 1 {
            return Err(cx.err(
                "onnx-bad-model",
                format!(
                    "Slice-{} takes starts, ends and axes as attributes; the inputs exist \
                     from opset 10 (this model imports an older opset)",
                    cx.version
                ),
            ));
        }
        let starts = cx
            .attr_ints("starts")?
            .ok_or_else(|| cx.bad_attr("starts", "is required before opset 10"))?;
        let ends = cx
            .attr_ints("ends")?
            .ok_or_else(|| cx.bad_attr("ends", "is required before opset 10"))?;
        (starts, ends, cx.attr_ints("axes")?, None)
    } else {
        cx.check_attrs(&[])?;
        let starts = cx.const_ints(1, "starts")?;
        let ends = cx.const_ints(2, "ends")?;
        let axes = match cx.input_name(3) {
            Some(_) => Some(cx.const_ints(3, "axes")?),
            None => None,
        };
        let steps = match cx.input_name(4) {
            Some(_) => Some(cx.const_ints(4, "steps")?),
            None => None,
        };
        (starts, ends, axes, steps)
    };
    let attrs = normalize_slice(&dims, &starts, &ends, axes.as_deref(), steps.as_deref())
        .map_err(|m| cx.err("onnx-bad-model", format!("Slice: {m}")))?;
    if let Some(c) = cx.const_input(0)? {
        let folded = c.slice(&attrs).map_err(|m| cx.err("onnx-bad-model", m))?;
        return Ok(vec![Entry::constant(folded)]);
    }
    let x = cx.value(0)?;
    Ok(vec![Entry::Value(cx.emit(Op::Slice(attrs), &[x])?)])
}

/// Non-negative entries of a constant integer input, or an error naming it.
fn sizes(cx: &NodeCtx, i: usize, what: &str) -> Result<Vec<usize>, Diagnostic> {
    let v = cx.const_ints(i, what)?;
    v.iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| {
                cx.err(
                    "onnx-bad-model",
                    format!("input {i} (the {what}) {v:?} has a negative entry"),
                )
            })
        })
        .collect()
}

/// Expand: numpy broadcast of input 0 with the constant shape of input 1.
pub fn expand(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let dims = cx.dims(0)?;
    let shape = sizes(cx, 1, "shape")?;
    if let Some(c) = cx.const_input(0)? {
        let folded = c
            .expand(&shape)
            .map_err(|m| cx.err("onnx-bad-model", format!("Expand: {m}")))?;
        return Ok(vec![Entry::constant(folded)]);
    }
    let out =
        broadcast(&dims, &shape).map_err(|m| cx.err("onnx-bad-model", format!("Expand: {m}")))?;
    if out == dims {
        return Ok(vec![cx.entry(0)?]);
    }
    let x = cx.value(0)?;
    Ok(vec![Entry::Value(
        cx.emit(Op::Expand { shape: out }, &[x])?,
    )])
}

/// Tile (from version 6): `repeats[k]` copies of input 0 along each axis `k`.
pub fn tile(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let repeats = sizes(cx, 1, "repeats")?;
    if let Some(c) = cx.const_input(0)? {
        let folded = c
            .tile(&repeats)
            .map_err(|m| cx.err("onnx-bad-model", format!("Tile: {m}")))?;
        return Ok(vec![Entry::constant(folded)]);
    }
    if repeats.iter().all(|&r| r == 1) && repeats.len() == cx.dims(0)?.len() {
        return Ok(vec![cx.entry(0)?]);
    }
    let x = cx.value(0)?;
    Ok(vec![Entry::Value(cx.emit(Op::Tile { repeats }, &[x])?)])
}

/// DepthToSpace and SpaceToDepth: blocks of `blocksize²` channels become `blocksize ×
/// blocksize` pixels (or back). Each is what ONNX defines it as, a reshape to rank 6, a
/// transpose and a reshape, so it is imported as exactly that: the IR's data movement
/// ops compute it, and no kernel of its own is needed. `DCR` (depth, column, row: the
/// default) and `CRD` say how a channel index splits into the block's row and column.
pub fn depth_space(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["blocksize", "mode"])?;
    let to_space = cx.node.op_type() == "DepthToSpace";
    let dims = cx.dims(0)?;
    let &[n, c, h, w] = dims.as_slice() else {
        return Err(cx.err(
            "onnx-bad-model",
            format!("input of shape {dims:?} must be 4-D [N, C, H, W]"),
        ));
    };
    let b = cx
        .attr_int("blocksize")?
        .ok_or_else(|| cx.bad_attr("blocksize", "is required"))?;
    let mode = cx.attr_string("mode")?.unwrap_or_else(|| "DCR".into());
    let crd = match mode.as_str() {
        "DCR" => false,
        "CRD" => true,
        other => return Err(cx.bad_attr("mode", format!("'{other}' is not DCR or CRD"))),
    };
    if !(1..=i32::MAX as i64).contains(&b) {
        return Err(cx.bad_attr("blocksize", format!("{b} must be positive")));
    }
    let b = b as usize;
    let (shape, perm, result) = if to_space {
        if !c.is_multiple_of(b * b) {
            return Err(cx.bad_attr(
                "blocksize",
                format!("{b} squared must divide the input's {c} channels"),
            ));
        }
        let cb = c / (b * b);
        if crd {
            (
                vec![n, cb, b, b, h, w],
                vec![0, 1, 4, 2, 5, 3],
                vec![n, cb, h * b, w * b],
            )
        } else {
            (
                vec![n, b, b, cb, h, w],
                vec![0, 3, 4, 1, 5, 2],
                vec![n, cb, h * b, w * b],
            )
        }
    } else {
        if !h.is_multiple_of(b) || !w.is_multiple_of(b) {
            return Err(cx.bad_attr(
                "blocksize",
                format!("{b} must divide the input's height {h} and width {w}"),
            ));
        }
        let (hb, wb) = (h / b, w / b);
        let perm = if crd {
            vec![0, 1, 3, 5, 2, 4]
        } else {
            vec![0, 3, 5, 1, 2, 4]
        };
        (vec![n, c, hb, b, wb, b], perm, vec![n, c * b * b, hb, wb])
    };
    let x = cx.value(0)?;
    let split = cx.reshape(x, shape)?;
    let moved = cx.emit(Op::Transpose { perm }, &[split])?;
    let y = cx.reshape(moved, result)?;
    Ok(vec![Entry::Value(y)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_normalizes_negative_and_out_of_range_indices() {
        let s = normalize_slice(&[10, 4], &[-3, 0], &[i64::MAX, -1], None, None).unwrap();
        assert_eq!(
            (s.starts, s.ends, s.steps),
            (vec![7, 0], vec![10, 3], vec![1, 1])
        );
        // negative steps: ends below -dim clamp to -1 (run down to index 0)
        let s = normalize_slice(&[10], &[i64::MAX], &[i64::MIN], None, Some(&[-1])).unwrap();
        assert_eq!(s.result_dims(&[10]), Ok(vec![10]));
        assert_eq!((s.starts, s.ends, s.steps), (vec![9], vec![-1], vec![-1]));
        let s = normalize_slice(&[10, 4], &[1], &[3], Some(&[-1]), Some(&[2])).unwrap();
        assert_eq!(
            (s.starts, s.ends, s.steps),
            (vec![0, 1], vec![10, 3], vec![1, 2])
        );
        assert!(normalize_slice(&[10], &[0], &[1], None, Some(&[0])).is_err());
        assert!(normalize_slice(&[10, 4], &[0, 0], &[1, 1], Some(&[1, -1]), None).is_err());
        assert!(normalize_slice(&[10], &[0], &[1], Some(&[1]), None).is_err());
    }
}
