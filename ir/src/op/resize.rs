//! `resize`: its variant, row, type rule and text schema, its attributes, and the
//! per-axis sampling taps (which input indices each output index reads, with which
//! weights: nearest, linear, cubic, antialiased, cropped) that the interpreter and lowering
//! both use, so they agree on every index and weight.

use super::dim::{Dim, Shape};
use super::rules::{all_f32, OperandTypes};
use crate::text::{AttrDict, AttrError, AttrSchema, Printed};
use crate::types::{DType, Layout, TensorType, F32};

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

/// Nearest moves elements of any type (but fills a crop's outside with a float, so crops
/// `f32`); linear and cubic interpolate `f32`.
pub(super) fn resize_dtype(r: &ResizeAttrs, o: &OperandTypes<'_>) -> Result<DType, String> {
    match r.mode {
        ResizeMode::Nearest(_) if r.coordinate != CoordinateMode::TfCropAndResize => {
            Ok(o.ty(0).dtype)
        }
        ResizeMode::Nearest(_) => all_f32(o),
        ResizeMode::Linear | ResizeMode::Cubic(_) => all_f32(o),
    }
}

/// `sizes`, one per axis with a positive finite scale each (and a finite crop window per
/// axis for `tf_crop_and_resize`).
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
    // a scale of 0 stands for the result's size over the input's, on an axis whose sizes
    // are symbolic (a resize to sizes read from a shape): specialization computes it
    let derived = |k: usize| {
        r.scales[k].0 == 0.0
            && (Dim::from_stored(r.sizes[k]).is_symbolic() || o.dims(0)[k].is_symbolic())
    };
    if let Some(k) = (0..x.rank()).find(|&k| {
        let positive = r.scales[k].0.is_finite() && r.scales[k].0 > 0.0;
        !positive && !derived(k)
    }) {
        let s = r.scales[k].0;
        return Err(format!(
            "resize scale {s} must be positive and finite (0, the size over the input's, \
             only where a size is symbolic)"
        ));
    }
    let cropping = r.coordinate == CoordinateMode::TfCropAndResize;
    if cropping && r.roi.len() != 2 * x.rank() {
        return Err(format!(
            "tf_crop_and_resize of {x} needs a crop window (start and end) per axis: roi \
             holds {} values, not {}",
            r.roi.len(),
            2 * x.rank()
        ));
    }
    if !cropping && !r.roi.is_empty() {
        return Err("resize takes a roi only with coordinate = tf_crop_and_resize".into());
    }
    if let Some(v) = r.roi.iter().find(|v| !v.0.is_finite()) {
        return Err(format!("resize roi value {} must be finite", v.0));
    }
    if let ResizeMode::Cubic(a) = r.mode {
        if !a.0.is_finite() {
            return Err(format!("resize cubic coefficient {} must be finite", a.0));
        }
    }
    if let Layout::Blocked { axis, block } = r.layout {
        if axis != 1 || block == 0 || r.sizes.len() != 4 {
            return Err(format!(
                "resize result layout {:?} does not fit {:?}",
                r.layout, r.sizes
            ));
        }
    }
    Ok(Shape::row_major(Dim::all(&r.sizes)).with_layout(r.layout))
}

/// Nearest only copies; linear and cubic take a multiply and an add per tap (the taps of
/// every resized axis multiplied together), counted for the largest tap count here.
pub(super) fn resize_flops(
    r: &ResizeAttrs,
) -> impl FnOnce(&[&TensorType], &TensorType) -> u64 + '_ {
    move |ins, out| {
        let Some(x) = ins.first() else { return 0 };
        if matches!(r.mode, ResizeMode::Nearest(_)) || x.dims.len() != r.sizes.len() {
            return 0;
        }
        let taps: u64 = (0..x.dims.len())
            .filter(|&k| r.resizes_axis(k, x.dims[k]))
            .map(|k| r.taps_per_output(k) as u64)
            .product();
        2 * taps * out.num_elements() as u64
    }
}

impl AttrSchema for ResizeAttrs {
    fn read(d: &mut AttrDict) -> Result<Self, AttrError> {
        let nearest = d.choice("nearest", "a rounding mode", &NearestMode::NAMES)?;
        let cubic_a = d.f32("cubic_a")?;
        let mode = match d.choice(
            "mode",
            "a resize mode",
            &[(0, "nearest"), (1, "linear"), (2, "cubic")],
        )? {
            Some(1) => ResizeMode::Linear,
            Some(2) => ResizeMode::Cubic(cubic_a.unwrap_or(ResizeMode::DEFAULT_CUBIC_A)),
            _ => ResizeMode::Nearest(nearest.unwrap_or_default()),
        };
        Ok(ResizeAttrs {
            sizes: d.need("sizes", AttrDict::sizes)?,
            scales: d.need("scales", AttrDict::f32s)?,
            mode,
            coordinate: d
                .choice(
                    "coordinate",
                    "a coordinate transform",
                    &CoordinateMode::NAMES,
                )?
                .unwrap_or_default(),
            antialias: d.bool("antialias")?.unwrap_or(false),
            exclude_outside: d.bool("exclude_outside")?.unwrap_or(false),
            roi: d.f32s("roi")?.unwrap_or_default(),
            extrapolation: d.f32("extrapolation")?.unwrap_or_default(),
            layout: d.layout("layout")?.unwrap_or(Layout::RowMajor),
        })
    }

    fn print(&self, rank: usize, out: &mut Printed) {
        out.always("sizes", &self.sizes, rank);
        out.always("scales", &self.scales, rank);
        match self.mode {
            ResizeMode::Linear => out.word("mode", "linear"),
            ResizeMode::Cubic(a) => {
                out.word("mode", "cubic");
                out.unless("cubic_a", &a, &ResizeMode::DEFAULT_CUBIC_A, rank);
            }
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
        out.unless("antialias", &self.antialias, &false, rank);
        out.unless("exclude_outside", &self.exclude_outside, &false, rank);
        if !self.roi.is_empty() {
            out.always("roi", &self.roi, rank);
        }
        out.unless("extrapolation", &self.extrapolation, &F32(0.0), rank);
        out.unless("layout", &self.layout, &Layout::RowMajor, rank);
    }
}

/// How a resized output coordinate maps back to an input coordinate (ONNX's
/// `coordinate_transformation_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum CoordinateMode {
    /// `(x + 0.5) / scale - 0.5`.
    #[default]
    HalfPixel,
    /// As `HalfPixel`, but -0.5 when the output has length 1.
    PytorchHalfPixel,
    /// `x * (in - 1) / (out - 1)` (0 when the output has length 1).
    AlignCorners,
    /// `x / scale`.
    Asymmetric,
    /// `HalfPixel` shifted so the sampled window is centred (opset 19).
    HalfPixelSymmetric,
    /// The crop window `[start, end]` of [`ResizeAttrs::roi`] (fractions of `in - 1`)
    /// spread over the output; an output whose coordinate falls outside the input takes
    /// [`ResizeAttrs::extrapolation`], as TensorFlow's `crop_and_resize`.
    TfCropAndResize,
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
    /// Cubic convolution (Keys) with coefficient `a` along every resized axis (`f32`):
    /// four taps per axis, or more with antialias when shrinking.
    Cubic(F32),
}

impl Default for ResizeMode {
    fn default() -> ResizeMode {
        ResizeMode::Nearest(NearestMode::default())
    }
}

impl ResizeMode {
    /// ONNX's default `cubic_coeff_a`, -0.75 (PyTorch's bicubic too; TensorFlow's is -0.5).
    pub const DEFAULT_CUBIC_A: F32 = F32(-0.75);
}

impl CoordinateMode {
    /// Every mode with its text spelling (ONNX's).
    pub const NAMES: [(CoordinateMode, &'static str); 6] = [
        (CoordinateMode::HalfPixel, "half_pixel"),
        (CoordinateMode::PytorchHalfPixel, "pytorch_half_pixel"),
        (CoordinateMode::AlignCorners, "align_corners"),
        (CoordinateMode::Asymmetric, "asymmetric"),
        (CoordinateMode::HalfPixelSymmetric, "half_pixel_symmetric"),
        (CoordinateMode::TfCropAndResize, "tf_crop_and_resize"),
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
    /// model gave sizes; the model's own scale when it gave scales). In a symbolic module
    /// 0 stands for `out / in` on an axis whose sizes are symbolic, computed (as the
    /// importer does, `(out as f64 / in as f64) as f32`) when it is specialized.
    pub scales: Vec<F32>,
    /// Nearest, linear or cubic.
    pub mode: ResizeMode,
    /// The coordinate transform.
    pub coordinate: CoordinateMode,
    /// Linear and cubic widen their kernel by `1 / scale` along a shrunk axis (and
    /// normalize its weights), so every input element contributes (ONNX's `antialias`).
    pub antialias: bool,
    /// Taps that fall outside the input weigh 0 and the rest are renormalized (ONNX's
    /// `exclude_outside`); otherwise the edge element repeats.
    pub exclude_outside: bool,
    /// For `tf_crop_and_resize` only: every axis's crop start, then every axis's crop end
    /// (fractions of `in - 1`, ONNX's `roi` layout); empty otherwise.
    pub roi: Vec<F32>,
    /// For `tf_crop_and_resize`: the value of an output whose coordinate falls outside.
    pub extrapolation: F32,
    /// Layout of the result: row-major, or channels in blocks (`nchw16c`) where the
    /// layout pass chose it for a nearest resize that repeats each pixel a whole number
    /// of times, reading blocks (text attribute `layout`).
    pub layout: Layout,
}

/// How one axis is sampled: each output index reads [`AxisTaps::per_output`] input
/// indices, each with a weight, stored output by output.
#[derive(Clone, Debug, PartialEq)]
pub struct AxisTaps {
    /// Taps per output index (1 for nearest and for a copied axis).
    pub per_output: usize,
    /// The input index of tap `t` of output `o` at `o * per_output + t`, within the input.
    pub index: Vec<usize>,
    /// Its weight (1 for nearest; the weights of an output sum to 1 unless it is outside).
    pub weight: Vec<f64>,
    /// Per output index: whether its coordinate falls inside the input (always, except
    /// for `tf_crop_and_resize`, where an outside output takes the extrapolation value and
    /// its taps weigh 0).
    pub inside: Vec<bool>,
}

impl ResizeAttrs {
    /// Each scale of 0 (in a symbolic module: the size over the input's) computed for an
    /// input of `input` dims, as the importer computes the scale of a resize to sizes:
    /// `(out as f64 / in as f64) as f32`.
    pub fn derive_scales(&mut self, input: &[usize]) {
        for (k, s) in self.scales.iter_mut().enumerate() {
            if let (0.0, Some(&n), Some(&out)) = (s.0, input.get(k), self.sizes.get(k)) {
                if n > 0 {
                    *s = F32((out as f64 / n as f64) as f32);
                }
            }
        }
    }

    /// Whether axis `k` of an input of `dims` is resampled (not a plain copy).
    pub fn resizes(&self, k: usize, dims: &[usize]) -> bool {
        self.resizes_axis(k, dims[k])
    }

    /// Whether axis `k`, of input length `len`, is resampled (not a plain copy).
    pub fn resizes_axis(&self, k: usize, len: usize) -> bool {
        let rank = self.sizes.len();
        let crops = self.coordinate == CoordinateMode::TfCropAndResize
            && (self.roi.get(k).map(|v| v.0) != Some(0.0)
                || self.roi.get(rank + k).map(|v| v.0) != Some(1.0));
        self.sizes[k] != len || self.scales[k].0 != 1.0 || crops
    }

    /// The reach of the interpolation kernel in input elements at scale 1: 1 for linear,
    /// 2 for cubic, and 0 for nearest (one tap).
    fn support(&self) -> f64 {
        match self.mode {
            ResizeMode::Nearest(_) => 0.0,
            ResizeMode::Linear => 1.0,
            ResizeMode::Cubic(_) => 2.0,
        }
    }

    /// The kernel's stretch along axis `k`: antialias widens it by `1 / scale` when the
    /// axis shrinks.
    fn kernel_scale(&self, k: usize) -> f64 {
        if self.antialias {
            f64::from(self.scales[k].0).min(1.0)
        } else {
            1.0
        }
    }

    /// The first tap's offset from the sampled coordinate's left neighbour and the tap
    /// count, along resized axis `k`: taps `start .. start + count` with `count = 2 - 2·start`
    /// (ONNX's reference: `floor(-support / scale) + 1`).
    fn tap_window(&self, k: usize) -> (i64, usize) {
        if matches!(self.mode, ResizeMode::Nearest(_)) {
            return (0, 1);
        }
        let start = (-self.support() / self.kernel_scale(k)).floor() as i64 + 1;
        (start, (2 - 2 * start) as usize)
    }

    /// Taps per output index along axis `k` when it is resized.
    pub fn taps_per_output(&self, k: usize) -> usize {
        self.tap_window(k).1
    }

    /// The kernel's weight at distance `x` (in input elements, already scaled).
    fn kernel(&self, x: f64) -> f64 {
        let x = x.abs();
        match self.mode {
            ResizeMode::Nearest(_) => 1.0,
            ResizeMode::Linear => (1.0 - x).max(0.0),
            ResizeMode::Cubic(a) => {
                let a = f64::from(a.0);
                if x <= 1.0 {
                    ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
                } else {
                    0.0
                }
            }
        }
    }

    /// The input coordinate output index `x` of axis `k` samples, for an input of length
    /// `len`, and whether it lies inside the input (`tf_crop_and_resize` only can leave it).
    fn source(&self, k: usize, len: usize, x: f64) -> (f64, bool) {
        let out = self.sizes[k];
        let scale = f64::from(self.scales[k].0);
        let last = len.saturating_sub(1) as f64;
        // the transforms divide by the resized length before flooring (in · scale), as
        // ONNX's reference does: it is `out` when the model gave sizes
        let resized = len as f64 * scale;
        let original = match self.coordinate {
            CoordinateMode::HalfPixel => (x + 0.5) / scale - 0.5,
            CoordinateMode::PytorchHalfPixel if resized > 1.0 => (x + 0.5) / scale - 0.5,
            // the reference's -0.5 (nearest rounds it to 0, linear clamps to the edge)
            CoordinateMode::PytorchHalfPixel => -0.5,
            CoordinateMode::AlignCorners if resized > 1.0 => x * last / (resized - 1.0),
            CoordinateMode::AlignCorners => 0.0,
            CoordinateMode::Asymmetric => x / scale,
            CoordinateMode::HalfPixelSymmetric => {
                let adjustment = out as f64 / (scale * len as f64);
                let center = len as f64 / 2.0;
                center * (1.0 - adjustment) + (x + 0.5) / scale - 0.5
            }
            CoordinateMode::TfCropAndResize => {
                let rank = self.sizes.len();
                let start = self.roi.get(k).map_or(0.0, |v| f64::from(v.0));
                let end = self.roi.get(rank + k).map_or(1.0, |v| f64::from(v.0));
                let at = if resized == 1.0 {
                    (end - start) * last / 2.0
                } else {
                    x * (end - start) * last / (resized - 1.0)
                };
                let at = at + start * last;
                return (at, (0.0..=last).contains(&at));
            }
        };
        (original, true)
    }

    /// The taps of every output index of axis `k`, for an input of length `len`: one tap
    /// of weight 1 on a copied axis; for a resized one the neighbours ONNX's reference
    /// reads (edge-padded, so indices clamp into the input) with the kernel's weights.
    pub fn taps(&self, k: usize, len: usize) -> AxisTaps {
        let out = self.sizes[k];
        if !self.resizes_axis(k, len) {
            return AxisTaps {
                per_output: 1,
                index: (0..out).collect(),
                weight: vec![1.0; out],
                inside: vec![true; out],
            };
        }
        let (start, count) = self.tap_window(k);
        let last = len.saturating_sub(1) as i64;
        let kernel_scale = self.kernel_scale(k);
        let mut taps = AxisTaps {
            per_output: count,
            index: Vec::with_capacity(out * count),
            weight: Vec::with_capacity(out * count),
            inside: Vec::with_capacity(out),
        };
        for x in 0..out {
            let (original, inside) = self.source(k, len, x as f64);
            taps.inside.push(inside);
            if !inside {
                taps.index.extend(std::iter::repeat_n(0, count));
                taps.weight.extend(std::iter::repeat_n(0.0, count));
                continue;
            }
            if let ResizeMode::Nearest(n) = self.mode {
                taps.index
                    .push(n.round(original).clamp(0.0, last as f64) as usize);
                taps.weight.push(1.0);
                continue;
            }
            // the left neighbour, strictly left of an integer coordinate (ratio in (0, 1])
            // as the reference prefers
            let floor = original.floor();
            let ratio = if original == floor {
                1.0
            } else {
                original - floor
            };
            let left = (original - ratio) as i64;
            let first = taps.weight.len();
            for i in start..start + count as i64 {
                let at = left + i;
                let w = self.kernel(kernel_scale * (i as f64 - ratio));
                let outside = at < 0 || at > last;
                taps.index.push(at.clamp(0, last) as usize);
                taps.weight.push(if self.exclude_outside && outside {
                    0.0
                } else {
                    w
                });
            }
            // antialias normalizes its widened kernel; exclude_outside renormalizes what
            // is left inside
            if self.antialias || self.exclude_outside {
                let ws = &mut taps.weight[first..];
                let sum: f64 = ws.iter().sum();
                if sum != 0.0 {
                    ws.iter_mut().for_each(|w| *w /= sum);
                }
            }
        }
        taps
    }
}
