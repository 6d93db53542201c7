//! GridSample (opsets 16, 20, 22): `linear`/`bilinear`, `nearest` and `cubic`/`bicubic`
//! sampling, zeros, border and reflection padding, `align_corners`, over inputs of any
//! spatial rank (4-D images, from 20 also volumes); `float32` only. AffineGrid (20), the
//! grid an affine transform makes, as its function is written: a constant base grid of
//! homogeneous pixel-centre coordinates times the transposed `theta`.

use smelt_ir::op::{GridPadding, GridSampleAttrs, Op, SampleMode};
use smelt_ir::Diagnostic;

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::ConstTensor;

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "AffineGrid"          [20],                           from 20 => affine_grid;
    "GridSample"          [16, 20, 22],                   from 16 => grid_sample;
};

/// GridSample.
pub fn grid_sample(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["mode", "padding_mode", "align_corners"])?;
    // opset 16 spells the modes bilinear and bicubic; 20 renames them linear and cubic
    let (default_mode, linear, cubic) = if cx.version < 20 {
        ("bilinear", "bilinear", "bicubic")
    } else {
        ("linear", "linear", "cubic")
    };
    let mode_name = cx
        .attr_string("mode")?
        .unwrap_or_else(|| default_mode.into());
    let mode = match mode_name.as_str() {
        "nearest" => SampleMode::Nearest,
        m if m == linear => SampleMode::Linear,
        m if m == cubic => SampleMode::Cubic,
        other => {
            return Err(cx.bad_attr(
                "mode",
                format!(
                    "'{other}' is not a mode of GridSample-{} (nearest, {linear}, {cubic})",
                    cx.version
                ),
            ))
        }
    };
    let padding_name = cx
        .attr_string("padding_mode")?
        .unwrap_or_else(|| "zeros".into());
    let padding = GridPadding::NAMES
        .iter()
        .find(|(_, n)| *n == padding_name)
        .map(|(p, _)| *p)
        .ok_or_else(|| {
            cx.bad_attr(
                "padding_mode",
                format!("'{padding_name}' is not a padding mode (zeros, border, reflection)"),
            )
        })?;
    let align_corners = match cx.attr_int_or("align_corners", 0)? {
        0 => false,
        1 => true,
        other => return Err(cx.bad_attr("align_corners", format!("{other} is not 0 or 1"))),
    };
    let rank = cx.dims(0)?.len();
    if cx.version < 20 && rank != 4 {
        return Err(cx.err(
            "onnx-bad-model",
            format!("GridSample-16 samples 4-D inputs, got rank {rank} (volumes need opset 20)"),
        ));
    }
    let x = cx.value(0)?;
    let grid = cx.value(1)?;
    let attrs = GridSampleAttrs {
        mode,
        padding,
        align_corners,
    };
    Ok(vec![Entry::Value(
        cx.emit(Op::GridSample(attrs), &[x, grid])?,
    )])
}

/// AffineGrid: `theta` (`[N, 2, 3]` or `[N, 3, 4]`) applied to the normalized coordinates
/// of every point of the constant `size` (`[N, C, H, W]` or `[N, C, D, H, W]`), giving
/// `[N, H, W, 2]` (or `[N, D, H, W, 3]`), the last axis's coordinate first.
pub fn affine_grid(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["align_corners"])?;
    let align_corners = match cx.attr_int_or("align_corners", 0)? {
        0 => false,
        1 => true,
        other => return Err(cx.bad_attr("align_corners", format!("{other} is not 0 or 1"))),
    };
    let size = cx.const_ints(1, "AffineGrid size")?;
    let theta_dims = cx.dims(0)?;
    let r = size.len().saturating_sub(2);
    if !(r == 2 || r == 3) {
        return Err(cx.err(
            "onnx-bad-model",
            format!("AffineGrid size {size:?} must be [N, C, H, W] or [N, C, D, H, W]"),
        ));
    }
    let spatial: Vec<usize> = size[2..]
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| {
            cx.err(
                "onnx-bad-model",
                format!("AffineGrid size {size:?} is negative"),
            )
        })?;
    let n = theta_dims.first().copied().unwrap_or(0);
    if theta_dims != [n, r, r + 1] || usize::try_from(size[0]).ok() != Some(n) {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "AffineGrid theta {theta_dims:?} must be [N, {r}, {}] with N = size[0] of {size:?}",
                r + 1
            ),
        ));
    }
    let points = spatial
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&p| p.checked_mul(r + 1).is_some_and(|e| e <= u32::MAX as usize))
        .ok_or_else(|| {
            cx.err(
                "onnx-bad-model",
                format!("AffineGrid size {size:?} is too large"),
            )
        })?;
    // the normalized coordinate of index i of an axis of length d (pixel centres, or the
    // corners' centres at -1 and 1 when aligned)
    let coordinate = |i: usize, d: usize| -> f32 {
        let (i, d) = (i as f64, d as f64);
        let v = if align_corners {
            if d > 1.0 {
                -1.0 + 2.0 * i / (d - 1.0)
            } else {
                -1.0
            }
        } else {
            -1.0 + (2.0 * i + 1.0) / d
        };
        v as f32
    };
    // base[p] = (x, y, (z,) 1) for every point, the last spatial axis fastest
    let mut base = Vec::with_capacity(points * (r + 1));
    for p in 0..points {
        let mut rest = p;
        let mut index = vec![0; r];
        for k in (0..r).rev() {
            index[k] = rest % spatial[k];
            rest /= spatial[k];
        }
        for k in (0..r).rev() {
            base.push(coordinate(index[k], spatial[k]));
        }
        base.push(1.0);
    }
    let name = cx.derived_name("base_grid");
    let base = cx.materialize(&ConstTensor::f32(vec![points, r + 1], base), &name)?;
    let theta = cx.value(0)?;
    let theta_t = cx.emit(
        Op::Transpose {
            perm: vec![0, 2, 1],
        },
        &[theta],
    )?;
    let grid = cx.emit(Op::MatMul, &[base, theta_t])?;
    let mut dims = vec![n];
    dims.extend_from_slice(&spatial);
    dims.push(r);
    Ok(vec![Entry::Value(cx.reshape(grid, dims)?)])
}
