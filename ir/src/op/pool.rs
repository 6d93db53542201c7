//! The pooling family: `max_pool2d`, `avg_pool2d` and `global_avg_pool` — variants,
//! rows, type rules, flops and the window attributes' text schema.

use super::dim::{dims_text, Dim, Shape};
use super::rules::{expect_rank, OperandTypes};
use super::Pool2dAttrs;
use crate::text::{AttrDict, AttrError, AttrSchema, Printed};
use crate::types::{Layout, TensorType};

macro_rules! pool_ops {
    ([$($variants:tt)*] [$($rows:tt)*] $next:ident $(, $more:ident)*) => { $next! {
    [$($variants)*
        /// 2-D max pool over NCHW; padding never wins the max.
        MaxPool2d(Pool2dAttrs),
        /// 2-D average pool over NCHW.
        AvgPool2d {
            /// Window geometry.
            pool: Pool2dAttrs,
            /// Divide by the full window size (true) or by the number of input elements (false).
            count_include_pad: bool,
        },
        /// Mean over H and W: `[N,C,H,W] -> [N,C,1,1]`.
        GlobalAvgPool,
    ]
    [$($rows)*
        MaxPool2d "max_pool2d" Some(Exact(1)), Anchor: (Op::MaxPool2d(p)) <=> (Attrs::Pool(p))
            attrs { ..p },
            dtype: all_f32,
            shape: |o| pool_shape(p, o),
            flops: pool_flops(p);
        AvgPool2d "avg_pool2d" Some(Exact(1)), Anchor:
            (Op::AvgPool2d { pool, count_include_pad }) <=> (Attrs::AvgPool { pool, count_include_pad })
            attrs { ..pool, count_include_pad = false },
            dtype: all_f32,
            shape: |o| pool_shape(pool, o),
            flops: pool_flops(pool);
        GlobalAvgPool "global_avg_pool" Some(Exact(1)), Anchor: (Op::GlobalAvgPool) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: global_avg_pool_shape,
            flops: |operands, _| operands.first().map_or(0, |t| t.num_elements() as u64);
    ]
    $($more),* } };
}
pub(super) use pool_ops;

impl Pool2dAttrs {
    /// Output spatial size along axis `i` (0 = H, 1 = W) for an input of `input`; `None`
    /// when no window fits, or in ceil mode for a symbolic input (whether the last window
    /// starts in the end pad depends on its value).
    pub fn output_dim(&self, i: usize, input: Dim) -> Option<Dim> {
        if self.ceil_mode && input.is_symbolic() {
            return None;
        }
        let span = Dim::known(self.kernel[i]).checked_sub(Dim::ONE)? * self.dilations[i] + 1;
        let padded = input + self.pads[i] + self.pads[i + 2];
        let room = padded.checked_sub(span)?;
        let s = self.strides[i];
        let out = if self.ceil_mode {
            room.ceil_div(s) + 1
        } else {
            room.floor_div(s) + 1
        };
        // ONNX/PyTorch rule: the last window must start inside the input or the begin pad.
        let last_start = out.checked_sub(Dim::ONE)? * s;
        if self.ceil_mode && last_start >= input + self.pads[i] {
            return out.checked_sub(Dim::ONE);
        }
        Some(out)
    }

    /// [`Pool2dAttrs::output_dim`] for a known size.
    pub fn output_size(&self, i: usize, input: usize) -> Option<usize> {
        self.output_dim(i, Dim::known(input))
            .and_then(Dim::known_size)
    }
}

/// A pool's result: `[N, C, OH, OW]` in the layout attribute.
pub(super) fn pool_shape(p: &Pool2dAttrs, o: &OperandTypes<'_>) -> Result<Shape, String> {
    let x = expect_rank(o.ty(0), 4, "pool input")?;
    if p.kernel.contains(&0) || p.strides.contains(&0) || p.dilations.contains(&0) {
        return Err("pool kernel, strides and dilations must be positive".into());
    }
    if p.pads[0] >= p.kernel[0] * p.dilations[0]
        || p.pads[1] >= p.kernel[1] * p.dilations[1]
        || p.pads[2] >= p.kernel[0] * p.dilations[0]
        || p.pads[3] >= p.kernel[1] * p.dilations[1]
    {
        return Err(format!(
            "pool pads {:?} must be smaller than the window {:?}",
            p.pads, p.kernel
        ));
    }
    if p.ceil_mode {
        Dim::concrete_all(&x[2..], "a ceil-mode pool")?;
    }
    let result = match (p.output_dim(0, x[2]), p.output_dim(1, x[3])) {
        (Some(oh), Some(ow)) if !oh.is(0) && !ow.is(0) => {
            Shape::row_major(vec![x[0], x[1], oh, ow]).with_layout(p.layout)
        }
        _ => {
            return Err(format!(
                "pool window {:?} does not fit input {}",
                p.kernel,
                o.ty(0)
            ))
        }
    };
    if let Layout::Blocked { axis, block } = p.layout {
        if axis != 1 || block == 0 || !result.dims[1].divisible_by(block as usize) {
            return Err(format!(
                "pool result layout {:?} does not fit {}",
                p.layout,
                dims_text(&result.dims)
            ));
        }
    }
    Ok(result)
}

/// `[N, C, 1, 1, ...]`: every axis after the channels averaged.
pub(super) fn global_avg_pool_shape(o: &OperandTypes<'_>) -> Result<Shape, String> {
    let x = o.ty(0);
    if x.rank() < 3 {
        return Err(format!(
            "global_avg_pool input must have rank >= 3, got {x}"
        ));
    }
    let mut dims = o.dims(0);
    for d in &mut dims[2..] {
        *d = Dim::ONE;
    }
    Ok(dims.into())
}

/// A window's worth of operations per output element.
pub(super) fn pool_flops(p: &Pool2dAttrs) -> impl FnOnce(&[&TensorType], &TensorType) -> u64 {
    let window = (p.kernel[0] * p.kernel[1]) as u64;
    move |_, out| out.num_elements() as u64 * window
}

impl AttrSchema for Pool2dAttrs {
    fn read(d: &mut AttrDict) -> Result<Self, AttrError> {
        let kernel = d.array::<2>("kernel", "[kh, kw]")?;
        let kernel = d.required("kernel", kernel);
        Ok(Pool2dAttrs {
            kernel,
            strides: d.array("strides", "[sh, sw]")?.unwrap_or([1, 1]),
            pads: d
                .array("pads", "[top, left, bottom, right]")?
                .unwrap_or([0; 4]),
            dilations: d.array("dilations", "[dh, dw]")?.unwrap_or([1, 1]),
            ceil_mode: d.bool("ceil_mode")?.unwrap_or(false),
            layout: d.layout("layout")?.unwrap_or(Layout::RowMajor),
        })
    }

    fn print(&self, rank: usize, out: &mut Printed) {
        out.always("kernel", &self.kernel, rank);
        out.unless("strides", &self.strides, &[1, 1], rank);
        out.unless("pads", &self.pads, &[0; 4], rank);
        out.unless("dilations", &self.dilations, &[1, 1], rank);
        out.unless("ceil_mode", &self.ceil_mode, &false, rank);
        out.unless("layout", &self.layout, &Layout::RowMajor, rank);
    }
}
