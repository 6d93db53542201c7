//! The convolution family: `conv2d`'s and `conv_transpose2d`'s variants, rows, type rules,
//! flops and text schemas.

use super::dim::{dims_text, Dim, Shape};
use super::rules::{expect_rank, expect_vector, OperandTypes};
use super::{Conv2dAttrs, ConvTranspose2dAttrs};
use crate::text::{AttrDict, AttrError, AttrSchema, Printed};
use crate::types::{Layout, TensorType};

macro_rules! conv_ops {
    ([$($variants:tt)*] [$($rows:tt)*] $next:ident $(, $more:ident)*) => { $next! {
    [$($variants)*
        /// 2-D convolution: `x[N,C,H,W], w[O,C/groups,KH,KW], bias[O]?`.
        Conv2d(Conv2dAttrs),
        /// 2-D transposed convolution: `x[N,C,H,W], w[C,O/groups,KH,KW], bias[O]?`; each
        /// input pixel scatters `x * w` onto the output window at `pixel * stride - pad`.
        ConvTranspose2d(ConvTranspose2dAttrs),
    ]
    [$($rows)*
        Conv2d "conv2d" Some(Range(2, 3)), Anchor: (Op::Conv2d(a)) <=> (Attrs::Conv2d(a))
            attrs { ..a },
            dtype: all_f32,
            shape: |o| conv2d_shape(a, o),
            flops: conv2d_flops;
        ConvTranspose2d "conv_transpose2d" Some(Range(2, 3)), Anchor:
            (Op::ConvTranspose2d(a)) <=> (Attrs::ConvTranspose2d(a))
            attrs { ..a },
            dtype: all_f32,
            shape: |o| conv_transpose2d_shape(a, o),
            flops: conv_transpose2d_flops;
    ]
    $($more),* } };
}
pub(super) use conv_ops;

/// The conv's result: `[N, O, OH, OW]` in the layout attribute.
pub(super) fn conv2d_shape(a: &Conv2dAttrs, o: &OperandTypes<'_>) -> Result<Shape, String> {
    let x = expect_rank(o.ty(0), 4, "conv2d input")?;
    let w = expect_rank(o.ty(1), 4, "conv2d weight")?;
    if a.strides.contains(&0) || a.dilations.contains(&0) || a.groups == 0 {
        return Err("conv2d strides, dilations and groups must be positive".into());
    }
    let [n, c, h, wd] = [x[0], x[1], x[2], x[3]];
    let [out_c, cg, kh, kw] = [w[0], w[1], w[2], w[3]];
    if !c.divisible_by(a.groups) || !out_c.divisible_by(a.groups) {
        return Err(format!(
            "conv2d groups = {} must divide input channels {c} and output channels {out_c}",
            a.groups
        ));
    }
    (cg * a.groups).expect_eq(c, |_, _| {
        format!(
            "conv2d weight has {cg} input channels per group, input has {c} channels in {} groups",
            a.groups
        )
    })?;
    if let Some(b) = o.get(2) {
        expect_vector(b, out_c, "conv2d bias", "output channel count")?;
    }
    let out = |i: usize, input: Dim, k: Dim| -> Option<Dim> {
        let span = k.checked_sub(Dim::ONE)? * a.dilations[i] + 1;
        let padded = input + a.pads[i] + a.pads[i + 2];
        Some(padded.checked_sub(span)?.floor_div(a.strides[i]) + 1)
    };
    match (out(0, h, kh), out(1, wd, kw)) {
        (Some(oh), Some(ow)) => {
            let result = Shape::row_major(vec![n, out_c, oh, ow]).with_layout(a.layout);
            if let Layout::Blocked { axis, block } = a.layout {
                if axis >= 4 || block == 0 {
                    return Err(format!(
                        "conv2d result layout {a:?} does not fit {}",
                        dims_text(&result.dims)
                    ));
                }
            }
            Ok(result)
        }
        _ => Err(format!(
            "conv2d kernel {kh}x{kw} (dilations {:?}) does not fit the padded input {h}x{wd}",
            a.dilations
        )),
    }
}

/// Each output element takes `C/groups * KH * KW` multiply-adds, that is `|w| / O`.
pub(super) fn conv2d_flops(operands: &[&TensorType], result: &TensorType) -> u64 {
    let out = result.num_elements() as u64;
    let w = operands.get(1).map_or(0, |t| t.num_elements() as u64);
    let per_out = w / (result.dims.get(1).copied().unwrap_or(1).max(1) as u64);
    2 * out * per_out
}

impl AttrSchema for Conv2dAttrs {
    fn read(d: &mut AttrDict) -> Result<Self, AttrError> {
        let def = Conv2dAttrs::default();
        Ok(Conv2dAttrs {
            strides: d.array("strides", "[sh, sw]")?.unwrap_or(def.strides),
            pads: d
                .array("pads", "[top, left, bottom, right]")?
                .unwrap_or(def.pads),
            dilations: d.array("dilations", "[dh, dw]")?.unwrap_or(def.dilations),
            groups: d.usize("groups")?.unwrap_or(def.groups),
            layout: d.layout("layout")?.unwrap_or(def.layout),
        })
    }

    fn print(&self, rank: usize, out: &mut Printed) {
        let def = Conv2dAttrs::default();
        out.unless("strides", &self.strides, &def.strides, rank);
        out.unless("pads", &self.pads, &def.pads, rank);
        out.unless("dilations", &self.dilations, &def.dilations, rank);
        out.unless("groups", &self.groups, &def.groups, rank);
        out.unless("layout", &self.layout, &def.layout, rank);
    }
}

/// The transposed conv's result: `[N, O, OH, OW]`, each size the full scatter's span
/// (plus the output padding) minus the pads.
pub(super) fn conv_transpose2d_shape(
    a: &ConvTranspose2dAttrs,
    o: &OperandTypes<'_>,
) -> Result<Shape, String> {
    let x = expect_rank(o.ty(0), 4, "conv_transpose2d input")?;
    let w = expect_rank(o.ty(1), 4, "conv_transpose2d weight")?;
    if a.strides.contains(&0) || a.dilations.contains(&0) || a.groups == 0 {
        return Err("conv_transpose2d strides, dilations and groups must be positive".into());
    }
    let [n, c, h, wd] = [x[0], x[1], x[2], x[3]];
    let [wc, og, kh, kw] = [w[0], w[1], w[2], w[3]];
    if !c.divisible_by(a.groups) {
        return Err(format!(
            "conv_transpose2d groups = {} must divide the input channels {c}",
            a.groups
        ));
    }
    wc.expect_eq(c, |_, _| {
        format!(
            "conv_transpose2d weight {} must have one row per input channel ({c})",
            o.ty(1)
        )
    })?;
    let out_c = og * a.groups;
    if let Some(b) = o.get(2) {
        expect_vector(b, out_c, "conv_transpose2d bias", "output channel count")?;
    }
    // (input - 1)·stride + (k - 1)·dilation + 1 + output padding - pads, positive
    let out = |i: usize, input: Dim, k: Dim| -> Option<Dim> {
        let span = k.checked_sub(Dim::ONE)? * a.dilations[i] + 1;
        let full = input.checked_sub(Dim::ONE)? * a.strides[i] + span + a.output_padding[i];
        let out = full.checked_sub(Dim::known(a.pads[i]) + a.pads[i + 2])?;
        (!out.is(0)).then_some(out)
    };
    match (out(0, h, kh), out(1, wd, kw)) {
        (Some(oh), Some(ow)) => Ok(Shape::row_major(vec![n, out_c, oh, ow])),
        _ => Err(format!(
            "conv_transpose2d kernel {kh}x{kw} (strides {:?}, dilations {:?}, output padding \
             {:?}) over the input {h}x{wd} leaves nothing inside pads {:?}",
            a.strides, a.dilations, a.output_padding, a.pads
        )),
    }
}

/// Every input element meets `O/groups * KH * KW` taps: `2 * |x| * |w| / C`.
pub(super) fn conv_transpose2d_flops(operands: &[&TensorType], _result: &TensorType) -> u64 {
    let x = operands.first().map_or(0, |t| t.num_elements() as u64);
    let w = operands.get(1).map_or(0, |t| t.num_elements() as u64);
    let c = operands
        .get(1)
        .and_then(|t| t.dims.first().copied())
        .unwrap_or(1)
        .max(1) as u64;
    2 * x * (w / c)
}

impl AttrSchema for ConvTranspose2dAttrs {
    fn read(d: &mut AttrDict) -> Result<Self, AttrError> {
        let def = ConvTranspose2dAttrs::default();
        Ok(ConvTranspose2dAttrs {
            strides: d.array("strides", "[sh, sw]")?.unwrap_or(def.strides),
            pads: d
                .array("pads", "[top, left, bottom, right]")?
                .unwrap_or(def.pads),
            dilations: d.array("dilations", "[dh, dw]")?.unwrap_or(def.dilations),
            groups: d.usize("groups")?.unwrap_or(def.groups),
            output_padding: d
                .array("output_padding", "[bottom, right]")?
                .unwrap_or(def.output_padding),
        })
    }

    fn print(&self, rank: usize, out: &mut Printed) {
        let def = ConvTranspose2dAttrs::default();
        out.unless("strides", &self.strides, &def.strides, rank);
        out.unless("pads", &self.pads, &def.pads, rank);
        out.unless("dilations", &self.dilations, &def.dilations, rank);
        out.unless("groups", &self.groups, &def.groups, rank);
        out.unless(
            "output_padding",
            &self.output_padding,
            &def.output_padding,
            rank,
        );
    }
}
