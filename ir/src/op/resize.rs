//! `resize`: its variant, row, type rule and text schema, its attributes, and the
//! per-axis sampling taps (which input indices each output index reads, with which
//! weights) that the interpreter and lowering both use, so they agree on every index and
//! weight.

use super::dim::{Dim, Shape};
use super::rules::{all_f32, OperandTypes};
use crate::text::{AttrDict, AttrError, AttrSchema, Printed};
use crate::types::{DType, TensorType, F32};

macro_rules! resize_ops {
    ([$($variants:tt)*] [$($rows:tt)*] $next:ident $(, $more:ident)*) => { $next! {
    [$($variants)*
        /// Resampling to `attrs.sizes` by nearest (any element type) or linear (`f32`)
        /// interpolation along each resized axis.
        Resize(ResizeAttrs),
    ]
    [$($rows)*
        Resize "resize" Some(Exact(1)), Plain: (Op::Resize(r)) <=> (Attrs::Resize(r))
            attrs { ..r },
            dtype: |o| resize_dtype(r, o),
            shape: |o| resize_shape(r, o),
            flops: resize_flops(r);
    ]
    $($more),* } };
}
pub(super) use resize_ops;

/// Nearest moves elements of any type; linear interpolates `f32`.
pub(super) fn resize_dtype(r: &ResizeAttrs, o: &OperandTypes<'_>) -> Result<DType, String> {
    match r.mode {
        ResizeMode::Nearest(_) => Ok(o.ty(0).dtype),
        ResizeMode::Linear => all_f32(o),
    }
}

/// `sizes`, one per axis with a positive finite scale each.
pub(super) fn resize_shape(r: &ResizeAttrs, o: &OperandTypes<'_>) -> Result<Shape, String> {
    let x = o.ty(0);
    if r.sizes.len() != x.rank() || r.scales.len() != x.rank() {
        return Err(format!(
            "resize of {x} needs one size and one scale per axis, got {:?} and {} scales",
            r.sizes,
            r.scales.len()
        ));
    }
    // an empty result reads nothing; a non-empty one needs a source element to sample
    if !r.sizes.contains(&0) && o.dims(0).iter().any(|d| d.is(0)) {
        return Err(format!(
            "resize of the empty {x} to {:?}: there is no element to sample",
            r.sizes
        ));
    }
    if let Some(s) = r.scales.iter().find(|s| !(s.0.is_finite() && s.0 > 0.0)) {
        return Err(format!("resize scale {} must be positive and finite", s.0));
    }
    Ok(Dim::all(&r.sizes).into())
}

/// Nearest only copies; linear weighs two taps per axis pair (four per element).
pub(super) fn resize_flops(r: &ResizeAttrs) -> impl FnOnce(&[&TensorType], &TensorType) -> u64 {
    let per_element = match r.mode {
        ResizeMode::Nearest(_) => 0,
        ResizeMode::Linear => 4,
    };
    move |_, out| per_element * out.num_elements() as u64
}

impl AttrSchema for ResizeAttrs {
    fn read(d: &mut AttrDict) -> Result<Self, AttrError> {
        let nearest = d.choice("nearest", "a rounding mode", &NearestMode::NAMES)?;
        let mode = match d.choice(
            "mode",
            "a resize mode",
            &[(false, "nearest"), (true, "linear")],
        )? {
            Some(true) => ResizeMode::Linear,
            _ => ResizeMode::Nearest(nearest.unwrap_or_default()),
        };
        Ok(ResizeAttrs {
            sizes: d.need("sizes", AttrDict::usizes)?,
            scales: d.need("scales", AttrDict::f32s)?,
            mode,
            coordinate: d
                .choice(
                    "coordinate",
                    "a coordinate transform",
                    &CoordinateMode::NAMES,
                )?
                .unwrap_or_default(),
        })
    }

    fn print(&self, rank: usize, out: &mut Printed) {
        out.always("sizes", &self.sizes, rank);
        out.always("scales", &self.scales, rank);
        match self.mode {
            ResizeMode::Linear => out.word("mode", "linear"),
            ResizeMode::Nearest(n) => {
                out.word("mode", "nearest");
                if n != NearestMode::default() {
                    out.word("nearest", n.name());
                }
            }
        }
        if self.coordinate != CoordinateMode::default() {
            out.word("coordinate", self.coordinate.name());
        }
    }
}

/// How a resized output coordinate maps back to an input coordinate (ONNX's
/// `coordinate_transformation_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum CoordinateMode {
    /// `(x + 0.5) / scale - 0.5`.
    #[default]
    HalfPixel,
    /// As `HalfPixel`, but 0 when the output has length 1.
    PytorchHalfPixel,
    /// `x * (in - 1) / (out - 1)` (0 when the output has length 1).
    AlignCorners,
    /// `x / scale`.
    Asymmetric,
    /// `HalfPixel` shifted so the sampled window is centred (opset 19).
    HalfPixelSymmetric,
}

/// How `nearest` rounds an input coordinate to an index (ONNX's `nearest_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum NearestMode {
    /// Round half down, else to nearest.
    #[default]
    RoundPreferFloor,
    /// Round half up, else to nearest.
    RoundPreferCeil,
    /// Round down.
    Floor,
    /// Round up.
    Ceil,
}

/// How `resize` samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResizeMode {
    /// The nearest input element (any element type).
    Nearest(NearestMode),
    /// Linear interpolation along every resized axis (`f32`).
    Linear,
}

impl Default for ResizeMode {
    fn default() -> ResizeMode {
        ResizeMode::Nearest(NearestMode::default())
    }
}

impl CoordinateMode {
    /// Every mode with its text spelling (ONNX's).
    pub const NAMES: [(CoordinateMode, &'static str); 5] = [
        (CoordinateMode::HalfPixel, "half_pixel"),
        (CoordinateMode::PytorchHalfPixel, "pytorch_half_pixel"),
        (CoordinateMode::AlignCorners, "align_corners"),
        (CoordinateMode::Asymmetric, "asymmetric"),
        (CoordinateMode::HalfPixelSymmetric, "half_pixel_symmetric"),
    ];

    /// The text spelling.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(m, _)| *m == self)
            .map_or("half_pixel", |(_, n)| n)
    }
}

impl NearestMode {
    /// Every mode with its text spelling (ONNX's).
    pub const NAMES: [(NearestMode, &'static str); 4] = [
        (NearestMode::RoundPreferFloor, "round_prefer_floor"),
        (NearestMode::RoundPreferCeil, "round_prefer_ceil"),
        (NearestMode::Floor, "floor"),
        (NearestMode::Ceil, "ceil"),
    ];

    /// The text spelling.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(m, _)| *m == self)
            .map_or("round_prefer_floor", |(_, n)| n)
    }

    fn round(self, x: f64) -> f64 {
        match self {
            NearestMode::RoundPreferFloor if x.fract() == 0.5 => x.floor(),
            NearestMode::RoundPreferCeil if x.fract() == 0.5 => x.ceil(),
            NearestMode::RoundPreferFloor | NearestMode::RoundPreferCeil => x.round(),
            NearestMode::Floor => x.floor(),
            NearestMode::Ceil => x.ceil(),
        }
    }
}

/// `resize` of an N-d tensor to `sizes`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ResizeAttrs {
    /// The result dims (one per axis; an axis of equal size and scale 1 is copied).
    pub sizes: Vec<usize>,
    /// The scale of each axis the coordinate transform divides by (`out / in` when the
    /// model gave sizes; the model's own scale when it gave scales).
    pub scales: Vec<F32>,
    /// Nearest or linear.
    pub mode: ResizeMode,
    /// The coordinate transform.
    pub coordinate: CoordinateMode,
}

/// What one output index of one axis reads: up to two input indices and the weight of
/// the second (the first weighs `1 - w`; nearest has one index and weight 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Taps {
    /// The first input index.
    pub lo: usize,
    /// The second input index (equal to `lo` for nearest).
    pub hi: usize,
    /// The weight of `hi`.
    pub w: f32,
}

impl ResizeAttrs {
    /// Whether axis `k` of an input of `dims` is resampled (not a plain copy).
    pub fn resizes(&self, k: usize, dims: &[usize]) -> bool {
        self.sizes[k] != dims[k] || self.scales[k].0 != 1.0
    }

    /// The taps of every output index of axis `k`, for an input of length `len`.
    pub fn taps(&self, k: usize, len: usize) -> Vec<Taps> {
        let out = self.sizes[k];
        let scale = f64::from(self.scales[k].0);
        let last = len.saturating_sub(1) as f64;
        // the transforms divide by the resized length before flooring (in · scale), as
        // ONNX's reference does: it is `out` when the model gave sizes
        let resized = len as f64 * scale;
        (0..out)
            .map(|x| {
                let x = x as f64;
                let original = match self.coordinate {
                    CoordinateMode::HalfPixel => (x + 0.5) / scale - 0.5,
                    CoordinateMode::PytorchHalfPixel if resized > 1.0 => (x + 0.5) / scale - 0.5,
                    CoordinateMode::PytorchHalfPixel => 0.0,
                    CoordinateMode::AlignCorners if resized > 1.0 => x * last / (resized - 1.0),
                    CoordinateMode::AlignCorners => 0.0,
                    CoordinateMode::Asymmetric => x / scale,
                    CoordinateMode::HalfPixelSymmetric => {
                        let adjustment = out as f64 / (scale * len as f64);
                        let center = len as f64 / 2.0;
                        center * (1.0 - adjustment) + (x + 0.5) / scale - 0.5
                    }
                };
                let clamp = |i: f64| i.clamp(0.0, last) as usize;
                match self.mode {
                    ResizeMode::Nearest(n) => {
                        let i = clamp(n.round(original));
                        Taps {
                            lo: i,
                            hi: i,
                            w: 0.0,
                        }
                    }
                    ResizeMode::Linear => {
                        // outside the input the edge element repeats (ONNX's reference
                        // pads with edge values)
                        let floor = original.floor();
                        Taps {
                            lo: clamp(floor),
                            hi: clamp(floor + 1.0),
                            w: (original - floor) as f32,
                        }
                    }
                }
            })
            .collect()
    }
}
