//! GridSample (opsets 16, 20, 22): `linear`/`bilinear`, `nearest` and `cubic`/`bicubic`
//! sampling, zeros, border and reflection padding, `align_corners`, over inputs of any
//! spatial rank (4-D images, from 20 also volumes); `float32` only.

use smelt_ir::op::{GridPadding, GridSampleAttrs, Op, SampleMode};
use smelt_ir::Diagnostic;

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
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
