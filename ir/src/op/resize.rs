//! `resize`: its attributes and the per-axis sampling taps (which input indices each
//! output index reads, with which weights) that the interpreter and lowering both use, so
//! they agree on every index and weight.

use crate::types::F32;

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
