//! `grid_sample`: its variant, row, type rule and text schema, its attributes, and the
//! per-axis coordinate arithmetic (denormalization, padding, reflection, taps and their
//! weights) the interpreter follows exactly, and which lowering writes out in kernel code.
//!
//! Semantics are ONNX GridSample's (its reference implementation), with three decisions
//! of our own: cubic sampling with border padding clamps each tap into the input and
//! leaves the coordinate alone, as PyTorch (whose exports are the op's users) and
//! onnxruntime do, where the reference clamps the coordinate first (the two differ
//! only outside the input, and no node test covers it); a NaN coordinate samples as
//! padding (zeros padding: outside the input; border and reflection: the axis's start
//! edge), where the reference fails; and a tap of weight 0 contributes nothing, so a
//! non-finite element the sample does not reach never leaks into it.

use super::dim::Shape;
use super::rules::OperandTypes;
use crate::text::{AttrDict, AttrError, AttrSchema, Printed};
use crate::types::TensorType;

macro_rules! grid_sample_ops {
    ([$($variants:tt)*] [$($rows:tt)*] $next:ident $(, $more:ident)*) => { $next! {
    [$($variants)*
        /// Samples `x` (`[N, C, D1 .. Dr]`) at the normalized coordinates of `grid`
        /// (`[N, H1 .. Hk, r]`, the last axis's coordinate first) into `[N, C, H1 .. Hk]`
        /// (ONNX GridSample: nearest, linear or cubic, zeros, border or reflection
        /// padding).
        GridSample(GridSampleAttrs),
    ]
    [$($rows)*
        GridSample "grid_sample" Some(Exact(2)), Plain: (Op::GridSample(g)) <=> (Attrs::GridSample(g))
            attrs { ..g },
            dtype: all_f32,
            shape: grid_sample_shape,
            flops: grid_sample_flops(g);
    ]
    $($more),* } };
}
pub(super) use grid_sample_ops;

/// `[N, C, H1 .. Hk]` from `x: [N, C, D1 .. Dr]` and `grid: [N, H1 .. Hk, r]`.
pub(super) fn grid_sample_shape(o: &OperandTypes<'_>) -> Result<Shape, String> {
    let (x, grid) = (o.ty(0), o.ty(1));
    if x.rank() < 3 {
        return Err(format!(
            "grid_sample input {x} needs a batch, a channel and at least one spatial axis"
        ));
    }
    let spatial = x.rank() - 2;
    if grid.rank() != x.rank() || grid.dims[grid.rank() - 1] != spatial {
        return Err(format!(
            "grid_sample of {x} needs a grid [N, H1 .. H{spatial}, {spatial}] of rank {}, got \
             {grid}",
            x.rank()
        ));
    }
    let (xd, gd) = (o.dims(0), o.dims(1));
    xd[0].expect_eq(gd[0], |a, b| {
        format!("grid_sample input batch {a} differs from the grid's {b}")
    })?;
    let mut dims = vec![xd[0], xd[1]];
    dims.extend_from_slice(&gd[1..gd.len() - 1]);
    // an empty result reads nothing; a non-empty one needs an element to sample
    if !dims.iter().any(|d| d.is(0)) && xd[2..].iter().any(|d| d.is(0)) {
        return Err(format!(
            "grid_sample of the empty {x}: there is no element to sample"
        ));
    }
    Ok(Shape::row_major(dims))
}

/// Each result element takes a multiply and an add per tap (`taps^r`), plus the
/// coordinate arithmetic (counted as 16 per axis).
pub(super) fn grid_sample_flops(
    g: &GridSampleAttrs,
) -> impl FnOnce(&[&TensorType], &TensorType) -> u64 {
    let taps = g.mode.taps() as u64;
    move |ins, out| {
        let Some(x) = ins.first() else { return 0 };
        let r = x.rank().saturating_sub(2) as u32;
        (2 * taps.saturating_pow(r) + 16 * u64::from(r)).saturating_mul(out.num_elements() as u64)
    }
}

/// How `grid_sample` interpolates (ONNX's `mode`; `bilinear`/`bicubic` are opset 16's
/// names of `linear`/`cubic`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum SampleMode {
    /// Linear along every axis: 2 taps per axis.
    #[default]
    Linear,
    /// The nearest element (halves to even, as PyTorch rounds).
    Nearest,
    /// Cubic convolution (Keys, coefficient -0.75) along every axis: 4 taps per axis.
    Cubic,
}

/// What a coordinate outside the input reads (ONNX's `padding_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum GridPadding {
    /// Zeros outside.
    #[default]
    Zeros,
    /// The coordinate is clamped to the edge element.
    Border,
    /// The coordinate is reflected at the borders until it is inside.
    Reflection,
}

/// `grid_sample`'s attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct GridSampleAttrs {
    /// Nearest, linear or cubic.
    pub mode: SampleMode,
    /// What outside coordinates read.
    pub padding: GridPadding,
    /// Whether -1 and 1 are the centres of the edge elements (else their outer edges).
    pub align_corners: bool,
}

impl SampleMode {
    /// Every mode with its text spelling.
    pub const NAMES: [(SampleMode, &'static str); 3] = [
        (SampleMode::Linear, "linear"),
        (SampleMode::Nearest, "nearest"),
        (SampleMode::Cubic, "cubic"),
    ];

    /// The text spelling.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(m, _)| *m == self)
            .map_or("linear", |(_, n)| n)
    }

    /// Taps per axis.
    pub fn taps(self) -> usize {
        match self {
            SampleMode::Nearest => 1,
            SampleMode::Linear => 2,
            SampleMode::Cubic => 4,
        }
    }

    /// The offset of the first tap from the coordinate's floor.
    pub fn first_tap(self) -> i64 {
        match self {
            SampleMode::Nearest | SampleMode::Linear => 0,
            SampleMode::Cubic => -1,
        }
    }
}

impl GridPadding {
    /// Every padding with its text spelling (ONNX's).
    pub const NAMES: [(GridPadding, &'static str); 3] = [
        (GridPadding::Zeros, "zeros"),
        (GridPadding::Border, "border"),
        (GridPadding::Reflection, "reflection"),
    ];

    /// The text spelling.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(m, _)| *m == self)
            .map_or("zeros", |(_, n)| n)
    }
}

impl AttrSchema for GridSampleAttrs {
    fn read(d: &mut AttrDict) -> Result<Self, AttrError> {
        Ok(GridSampleAttrs {
            mode: d
                .choice("mode", "a sampling mode", &SampleMode::NAMES)?
                .unwrap_or_default(),
            padding: d
                .choice("padding", "a padding mode", &GridPadding::NAMES)?
                .unwrap_or_default(),
            align_corners: d.bool("align_corners")?.unwrap_or(false),
        })
    }

    fn print(&self, rank: usize, out: &mut Printed) {
        if self.mode != SampleMode::default() {
            out.word("mode", self.mode.name());
        }
        if self.padding != GridPadding::default() {
            out.word("padding", self.padding.name());
        }
        out.unless("align_corners", &self.align_corners, &false, rank);
    }
}

/// Keys' cubic coefficient GridSample uses (PyTorch's bicubic).
pub const GRID_CUBIC_A: f64 = -0.75;

/// Zeros padding (and cubic border padding) moves coordinates (and NaN) this far beyond
/// the edges at most: every tap is then outside, whatever the mode, and tap indices stay
/// small integers.
pub const GRID_ZEROS_REACH: f64 = 4.0;

/// Border-free coordinates are limited to this magnitude before reflection, so the
/// reflection's arithmetic stays finite (2^22: beyond it `f32` holds no fraction).
pub const GRID_REFLECT_LIMIT: f64 = 4_194_304.0;

/// The coordinate arithmetic along one spatial axis of length `len`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GridAxis {
    /// The axis length.
    pub len: usize,
    /// `x = g * scale + shift` denormalizes a grid value `g`.
    pub scale: f64,
    /// See `scale`.
    pub shift: f64,
    /// The lowest coordinate inside (-0.5, or 0 with `align_corners`).
    pub low: f64,
    /// The highest coordinate inside (`len - 0.5`, or `len - 1` with `align_corners`).
    pub high: f64,
}

impl GridSampleAttrs {
    /// The coordinate arithmetic of a spatial axis of length `len`.
    pub fn axis(&self, len: usize) -> GridAxis {
        let d = len as f64;
        if self.align_corners {
            GridAxis {
                len,
                scale: (d - 1.0) / 2.0,
                shift: (d - 1.0) / 2.0,
                low: 0.0,
                high: d - 1.0,
            }
        } else {
            GridAxis {
                len,
                scale: d / 2.0,
                shift: (d - 1.0) / 2.0,
                low: -0.5,
                high: d - 0.5,
            }
        }
    }

    /// The taps of grid value `g` along `axis`: `(index, weight)` for each of the
    /// mode's taps, the index inside the axis and the weight 0 for a tap zeros padding
    /// reads as 0.
    pub fn taps(&self, axis: &GridAxis, g: f64) -> Vec<(usize, f64)> {
        let x = self.coordinate(axis, g);
        let last = axis.len.saturating_sub(1) as f64;
        let floor = x.floor();
        let t = x - floor;
        let weights: Vec<f64> = match self.mode {
            SampleMode::Nearest => vec![1.0],
            SampleMode::Linear => vec![1.0 - t, t],
            SampleMode::Cubic => cubic_weights(t).to_vec(),
        };
        let first = if self.mode == SampleMode::Nearest {
            x
        } else {
            floor + self.mode.first_tap() as f64
        };
        weights
            .into_iter()
            .enumerate()
            .map(|(i, w)| {
                let at = first + i as f64;
                let (at, w) = match self.padding {
                    GridPadding::Zeros if (0.0..=last).contains(&at) => (at, w),
                    GridPadding::Zeros => (0.0, 0.0),
                    GridPadding::Border => (at, w),
                    GridPadding::Reflection => (reflect(at, axis).trunc(), w),
                };
                (at.clamp(0.0, last) as usize, w)
            })
            .collect()
    }

    /// The sampled coordinate of grid value `g` along `axis`, after padding's clamp or
    /// reflection (and rounding, for nearest).
    pub fn coordinate(&self, axis: &GridAxis, g: f64) -> f64 {
        let last = axis.len.saturating_sub(1) as f64;
        let mut x = g * axis.scale + axis.shift;
        if self.mode == SampleMode::Nearest {
            // halves to even, as PyTorch and the reference round
            x = x.round_ties_even();
        }
        match self.padding {
            GridPadding::Zeros => {
                // NaN and far coordinates: every tap outside
                let (lo, hi) = (-GRID_ZEROS_REACH, last + GRID_ZEROS_REACH);
                if x >= lo {
                    x.min(hi)
                } else {
                    lo
                }
            }
            // cubic clamps each tap, not the coordinate, as PyTorch and onnxruntime do
            // (the reference clamps the coordinate, which moves the taps): beyond the
            // reach every tap is the edge element either way
            GridPadding::Border if self.mode == SampleMode::Cubic => {
                let (lo, hi) = (-GRID_ZEROS_REACH, last + GRID_ZEROS_REACH);
                if x >= lo {
                    x.min(hi)
                } else {
                    lo
                }
            }
            GridPadding::Border => {
                // below the start, or NaN
                if x < axis.low || x.is_nan() {
                    0.0
                } else if x > axis.high {
                    last
                } else {
                    x
                }
            }
            GridPadding::Reflection => {
                let x = if x.is_nan() { axis.low } else { x };
                reflect(x.clamp(-GRID_REFLECT_LIMIT, GRID_REFLECT_LIMIT), axis)
            }
        }
    }
}

/// `x` reflected at the axis's borders until it lies between them (the reference's
/// `_gs_reflect`); the start edge when the borders coincide (one element, aligned).
pub fn reflect(x: f64, axis: &GridAxis) -> f64 {
    let range = axis.high - axis.low;
    if range <= 0.0 {
        return axis.low;
    }
    let (distance, from, to) = if x < axis.low {
        (axis.low - x, axis.low, axis.high)
    } else if x > axis.high {
        (x - axis.high, axis.high, axis.low)
    } else {
        return x;
    };
    let n = (distance / range).floor();
    let rest = distance - n * range;
    let toward = if from < to { 1.0 } else { -1.0 };
    if n % 2.0 == 0.0 {
        from + toward * rest
    } else {
        to - toward * rest
    }
}

/// The cubic weights of taps `floor - 1 .. floor + 2` at fraction `t` (Keys, -0.75).
pub fn cubic_weights(t: f64) -> [f64; 4] {
    let a = GRID_CUBIC_A;
    let near = |x: f64| ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    let far = |x: f64| ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}
