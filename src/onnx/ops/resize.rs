//! Resize (opsets 10 to 19): nearest (every `nearest_mode`), linear and cubic
//! (`cubic_coeff_a`, `exclude_outside`) over any axes, `antialias` for linear and cubic,
//! every coordinate transform (tf_crop_and_resize with a constant `roi` and
//! `extrapolation_value`); output sizes from `scales` or `sizes` (constants), `axes` and
//! `keep_aspect_ratio_policy` from 18. Upsample (7: `scales` attribute; 9: input) is
//! Resize-10's sampling: asymmetric coordinates, nearest rounding down.

use smelt_ir::op::{CoordinateMode, NearestMode, Op, ResizeAttrs, ResizeMode};
use smelt_ir::{Diagnostic, Layout, F32};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "Resize"              [10, 11, 13, 18, 19],           from 10 => resize;
    "Upsample"            [1, 7, 9, 10],                  from 7  => resize;
};

/// An optional constant input of floats (empty when absent or of no elements, as
/// exporters write "not given").
fn floats(cx: &NodeCtx, i: usize, what: &str) -> Result<Vec<f32>, Diagnostic> {
    if cx.input_name(i).is_none() {
        return Ok(Vec::new());
    }
    let c = cx.require_const(i, what)?;
    c.f32s()
        .map(|v| v.into_owned())
        .ok_or_else(|| cx.err("onnx-bad-model", format!("{what} must be float32")))
}

/// Resize.
pub fn resize(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[
        "scales",
        "mode",
        "coordinate_transformation_mode",
        "nearest_mode",
        "cubic_coeff_a",
        "exclude_outside",
        "extrapolation_value",
        "antialias",
        "axes",
        "keep_aspect_ratio_policy",
    ])?;
    let dims = cx.dims(0)?;
    let rank = dims.len();
    let mode = cx.attr_string("mode")?.unwrap_or_else(|| "nearest".into());
    let upsample = cx.node.op_type() == "Upsample";
    // Resize-10 and Upsample have no coordinate or rounding attributes: asymmetric, and floor
    let (default_coordinate, default_nearest) = if cx.version < 11 || upsample {
        ("asymmetric", "floor")
    } else {
        ("half_pixel", "round_prefer_floor")
    };
    let coordinate_name = cx
        .attr_string("coordinate_transformation_mode")?
        .unwrap_or_else(|| default_coordinate.into());
    let coordinate = CoordinateMode::NAMES
        .iter()
        .find(|(_, n)| *n == coordinate_name)
        .map(|(c, _)| *c)
        .ok_or_else(|| {
            cx.bad_attr(
                "coordinate_transformation_mode",
                format!("'{coordinate_name}' is not a transform"),
            )
        })?;
    let nearest_name = cx
        .attr_string("nearest_mode")?
        .unwrap_or_else(|| default_nearest.into());
    let nearest = NearestMode::NAMES
        .iter()
        .find(|(_, n)| *n == nearest_name)
        .map(|(m, _)| *m)
        .ok_or_else(|| cx.bad_attr("nearest_mode", format!("'{nearest_name}' is not a mode")))?;
    let mode = match mode.as_str() {
        "nearest" => ResizeMode::Nearest(nearest),
        "linear" => ResizeMode::Linear,
        "cubic" => {
            let a = cx.attr_float_or("cubic_coeff_a", ResizeMode::DEFAULT_CUBIC_A.0)?;
            if !a.is_finite() {
                return Err(cx.bad_attr("cubic_coeff_a", format!("{a} is not finite")));
            }
            ResizeMode::Cubic(F32(a))
        }
        other => return Err(cx.bad_attr("mode", format!("'{other}' is not a mode"))),
    };
    let antialias = cx.attr_int_or("antialias", 0)? != 0;
    if antialias && matches!(mode, ResizeMode::Nearest(_)) {
        return Err(cx.bad_attr(
            "antialias",
            "applies to linear and cubic resizing, not nearest",
        ));
    }
    let exclude_outside = cx.attr_int_or("exclude_outside", 0)? != 0;
    // inputs: Resize-10 (X, scales); from 11 (X, roi, scales, sizes)
    let (scales_in, sizes_in) = if cx.version < 11 {
        (1, None)
    } else {
        (2, Some(3))
    };
    let listed_axes: Vec<usize> = match cx.attr_ints("axes")? {
        None => (0..rank).collect(),
        Some(a) => a
            .iter()
            .map(|&k| cx.axis("axes", k, rank))
            .collect::<Result<_, _>>()?,
    };
    let given_scales = match (upsample, cx.version) {
        (true, v) if v < 9 => cx
            .attr_floats("scales")?
            .ok_or_else(|| cx.bad_attr("scales", "is required"))?,
        _ => floats(cx, scales_in, "scales")?,
    };
    let given_sizes = match sizes_in.filter(|&i| cx.input_name(i).is_some()) {
        Some(i) => {
            let c = cx.require_const(i, "sizes")?;
            c.i64s().map(|v| v.to_vec()).unwrap_or_default()
        }
        None => Vec::new(),
    };
    let mut sizes = dims.clone();
    let mut scales = vec![F32(1.0); rank];
    match (given_scales.is_empty(), given_sizes.is_empty()) {
        (false, true) => {
            if given_scales.len() != listed_axes.len() {
                return Err(cx.err(
                    "onnx-bad-model",
                    format!(
                        "{} scales for {} axes",
                        given_scales.len(),
                        listed_axes.len()
                    ),
                ));
            }
            for (&k, &s) in listed_axes.iter().zip(&given_scales) {
                if !(s.is_finite() && s > 0.0) {
                    return Err(cx.err("onnx-bad-model", format!("scale {s} must be positive")));
                }
                sizes[k] = (dims[k] as f64 * f64::from(s)).floor() as usize;
                scales[k] = F32(s);
            }
        }
        (true, false) => {
            if given_sizes.len() != listed_axes.len() {
                return Err(cx.err(
                    "onnx-bad-model",
                    format!("{} sizes for {} axes", given_sizes.len(), listed_axes.len()),
                ));
            }
            let wanted: Vec<f64> = given_sizes.iter().map(|&s| s as f64).collect();
            let policy = cx
                .attr_string("keep_aspect_ratio_policy")?
                .unwrap_or_else(|| "stretch".into());
            let ratio = |k: usize, j: usize| wanted[j] / dims[k] as f64;
            let common = match policy.as_str() {
                "stretch" => None,
                "not_larger" => Some(
                    (0..listed_axes.len())
                        .map(|j| ratio(listed_axes[j], j))
                        .fold(f64::INFINITY, f64::min),
                ),
                "not_smaller" => Some(
                    (0..listed_axes.len())
                        .map(|j| ratio(listed_axes[j], j))
                        .fold(0.0, f64::max),
                ),
                other => {
                    return Err(cx.bad_attr(
                        "keep_aspect_ratio_policy",
                        format!("'{other}' is not a policy"),
                    ))
                }
            };
            for (j, &k) in listed_axes.iter().enumerate() {
                let (size, scale) = match common {
                    None => (wanted[j], ratio(k, j)),
                    // sizes round half up from the common scale (the spec's rule)
                    Some(s) => ((s * dims[k] as f64 + 0.5).floor(), s),
                };
                sizes[k] = size as usize;
                scales[k] = F32(scale as f32);
            }
        }
        (true, true) => return Err(cx.err("onnx-bad-model", "Resize needs scales or sizes")),
        (false, false) => {
            return Err(cx.err("onnx-bad-model", "Resize takes scales or sizes, not both"))
        }
    }
    // tf_crop_and_resize's window: starts then ends of the listed axes, spread to every
    // axis (an unlisted one keeps all of itself, [0, 1])
    let (roi, extrapolation) = if coordinate == CoordinateMode::TfCropAndResize {
        let given = if cx.version < 11 {
            Vec::new()
        } else {
            floats(cx, 1, "roi")?
        };
        let n = listed_axes.len();
        if given.len() != 2 * n {
            return Err(cx.err(
                "onnx-bad-model",
                format!(
                    "tf_crop_and_resize needs a constant roi of {} values (a start and an end \
                     per resized axis), got {}",
                    2 * n,
                    given.len()
                ),
            ));
        }
        let mut roi = vec![F32(0.0); rank];
        roi.extend(std::iter::repeat_n(F32(1.0), rank));
        for (j, &k) in listed_axes.iter().enumerate() {
            roi[k] = F32(given[j]);
            roi[rank + k] = F32(given[n + j]);
        }
        let e = cx.attr_float_or("extrapolation_value", 0.0)?;
        (roi, F32(e))
    } else {
        (Vec::new(), F32(0.0))
    };
    let x = cx.value(0)?;
    let attrs = ResizeAttrs {
        sizes,
        scales,
        mode,
        coordinate,
        antialias,
        exclude_outside,
        roi,
        extrapolation,
        layout: Layout::RowMajor,
    };
    Ok(vec![Entry::Value(cx.emit(Op::Resize(attrs), &[x])?)])
}
