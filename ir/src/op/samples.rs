//! Sample ops, one or more of every kind with attributes away from their defaults: the
//! text form's round-trip test and the rule checker's per-structure attribute choice
//! start from them. A kind without attributes is its own sample (derived from the op
//! table), so only a kind with attributes needs a sample here.

use std::sync::LazyLock;

use super::{
    Attrs, Conv2dAttrs, ConvTranspose2dAttrs, CoordinateMode, GeluApproximation, GemmAttrs,
    GridPadding, GridSampleAttrs, NearestMode, Op, OpKind, PadAttrs, PadMode, Pool2dAttrs,
    ReduceAttrs, Reduction, ResizeAttrs, ResizeMode, SampleMode, SliceAttrs, UnaryOp,
};
use crate::types::{DType, Layout, F32};

/// The samples: every attribute-free kind in table order, then the kinds with attributes
/// (some twice, where one sample cannot show every field away from its default).
pub fn samples() -> &'static [Op] {
    static SAMPLES: LazyLock<Vec<Op>> = LazyLock::new(|| {
        let mut all: Vec<Op> = OpKind::ALL
            .iter()
            .filter_map(|k| k.join(&Attrs::None))
            .collect();
        all.extend(with_attributes());
        all
    });
    &SAMPLES
}

impl OpKind {
    /// This kind's first sample; `None` only for `fused` (whose payload is other ops).
    pub fn sample(self) -> Option<&'static Op> {
        samples().iter().find(|op| op.kind() == Some(self))
    }
}

/// The kinds with attributes, each with its attributes away from their defaults.
fn with_attributes() -> Vec<Op> {
    let pool = Pool2dAttrs {
        kernel: [3, 2],
        strides: [2, 1],
        pads: [1, 0, 1, 0],
        dilations: [1, 2],
        ceil_mode: true,
        layout: Layout::RowMajor,
    };
    vec![
        Op::Conv2d(Conv2dAttrs {
            strides: [2, 2],
            pads: [1, 0, 2, 1],
            dilations: [2, 1],
            groups: 4,
            layout: Layout::RowMajor,
        }),
        Op::Conv2d(Conv2dAttrs {
            layout: Layout::Blocked { axis: 1, block: 16 },
            ..Conv2dAttrs::default()
        }),
        Op::ConvTranspose2d(ConvTranspose2dAttrs {
            strides: [2, 3],
            pads: [1, 0, 2, 1],
            dilations: [2, 1],
            groups: 2,
            output_padding: [1, 0],
        }),
        Op::BatchNorm { epsilon: F32(1e-3) },
        Op::Unary(UnaryOp::Clip {
            min: F32(0.0),
            max: F32(6.0),
        }),
        Op::Unary(UnaryOp::LeakyRelu { alpha: F32(0.2) }),
        Op::Unary(UnaryOp::Gelu {
            approximate: GeluApproximation::None,
        }),
        Op::Unary(UnaryOp::Gelu {
            approximate: GeluApproximation::Tanh,
        }),
        Op::Unary(UnaryOp::HardSigmoid {
            alpha: F32(0.25),
            beta: F32(0.4),
        }),
        Op::LayerNorm {
            axis: 2,
            epsilon: F32(1e-6),
        },
        Op::MaxPool2d(pool.clone()),
        Op::AvgPool2d {
            pool,
            count_include_pad: true,
        },
        Op::Flatten { axis: 2 },
        Op::Reshape { shape: vec![2, 8] },
        Op::Transpose {
            perm: vec![1, 0, 2],
        },
        Op::Gemm(GemmAttrs {
            alpha: F32(0.5),
            beta: F32(2.0),
            trans_a: true,
            trans_b: true,
        }),
        Op::Slice(SliceAttrs {
            starts: vec![0, 4, 1],
            ends: vec![2, -1, 5],
            steps: vec![1, -2, 3],
        }),
        Op::Pad(PadAttrs {
            pads: vec![0, 2, -1, 1, 0, 3],
            mode: PadMode::Reflect,
        }),
        Op::Pad(PadAttrs {
            pads: vec![1, 0],
            mode: PadMode::Constant,
        }),
        Op::Expand {
            shape: vec![2, 3, 4],
        },
        Op::Tile {
            repeats: vec![1, 3],
        },
        Op::Concat { axis: 1 },
        Op::Softmax { axis: 3 },
        Op::Reorder {
            layout: Layout::Blocked { axis: 1, block: 8 },
        },
        Op::BnFoldWeight { epsilon: F32(1e-4) },
        Op::BnFoldBias { epsilon: F32(2e-5) },
        Op::BnScale { epsilon: F32(3e-5) },
        Op::BnShift { epsilon: F32(4e-5) },
        Op::Cast { to: DType::I64 },
        Op::Cast { to: DType::Bool },
        Op::Mod { fmod: true },
        Op::Mod { fmod: false },
        Op::Gather { axis: 2 },
        Op::Reduce(
            Reduction::Sum,
            ReduceAttrs {
                axes: vec![1, 2],
                keep_dims: true,
            },
        ),
        Op::Reduce(
            Reduction::Mean,
            ReduceAttrs {
                axes: vec![0],
                keep_dims: false,
            },
        ),
        Op::Reduce(Reduction::Max, ReduceAttrs::default()),
        Op::Reduce(Reduction::Min, ReduceAttrs::default()),
        Op::Resize(ResizeAttrs {
            sizes: vec![1, 2, 8, 6],
            scales: vec![F32(1.0), F32(1.0), F32(2.0), F32(1.5)],
            mode: ResizeMode::Linear,
            coordinate: CoordinateMode::AlignCorners,
            ..ResizeAttrs::default()
        }),
        Op::Resize(ResizeAttrs {
            sizes: vec![1, 1, 3, 5],
            scales: vec![F32(1.0), F32(1.0), F32(0.6), F32(0.5)],
            mode: ResizeMode::Cubic(F32(-0.5)),
            antialias: true,
            exclude_outside: true,
            ..ResizeAttrs::default()
        }),
        Op::Resize(ResizeAttrs {
            sizes: vec![4, 4],
            scales: vec![F32(1.0), F32(0.8)],
            mode: ResizeMode::Linear,
            coordinate: CoordinateMode::TfCropAndResize,
            roi: vec![F32(0.0), F32(0.2), F32(1.0), F32(1.2)],
            extrapolation: F32(10.0),
            ..ResizeAttrs::default()
        }),
        Op::Resize(ResizeAttrs {
            sizes: vec![3, 4],
            scales: vec![F32(1.0), F32(0.5)],
            mode: ResizeMode::Nearest(NearestMode::Floor),
            coordinate: CoordinateMode::Asymmetric,
            ..ResizeAttrs::default()
        }),
        Op::GridSample(GridSampleAttrs {
            mode: SampleMode::Cubic,
            padding: GridPadding::Reflection,
            align_corners: true,
        }),
        Op::GridSample(GridSampleAttrs {
            mode: SampleMode::Nearest,
            padding: GridPadding::Border,
            align_corners: false,
        }),
    ]
}
