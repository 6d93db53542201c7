//! The normalization family: `batch_norm`, `layer_norm` and `softmax` — variants, rows,
//! type rules and flops.

use super::dim::Shape;
use super::rules::{expect_vector, OperandTypes};

macro_rules! norm_ops {
    ([$($variants:tt)*] [$($rows:tt)*] $next:ident $(, $more:ident)*) => { $next! {
    [$($variants)*
        /// Inference batch norm: `x[N,C,...], scale[C], bias[C], mean[C], var[C]`.
        BatchNorm {
            /// Added to the variance before the square root.
            epsilon: F32,
        },
        /// Layer normalization over axes `axis..rank`: `x, scale, bias?`.
        LayerNorm {
            /// First normalized axis.
            axis: usize,
            /// Added to the variance.
            epsilon: F32,
        },
        /// Softmax along `axis`.
        Softmax {
            /// The axis.
            axis: usize,
        },
    ]
    [$($rows)*
        BatchNorm "batch_norm" Some(Exact(5)), Plain: (Op::BatchNorm { epsilon }) <=> (Attrs::Epsilon(epsilon))
            attrs { epsilon = DEFAULT_EPSILON },
            dtype: all_f32,
            shape: batch_norm_shape,
            flops: |_, out| 2 * out.num_elements() as u64;
        LayerNorm "layer_norm" Some(Range(2, 3)), Anchor:
            (Op::LayerNorm { axis, epsilon }) <=> (Attrs::LayerNorm { axis, epsilon })
            attrs { axis, epsilon = DEFAULT_EPSILON },
            dtype: all_f32,
            shape: |o| layer_norm_shape(*axis, o),
            flops: |_, out| 8 * out.num_elements() as u64;
        Softmax "softmax" Some(Exact(1)), Plain: (Op::Softmax { axis }) <=> (Attrs::Axis(axis))
            attrs { axis },
            dtype: all_f32,
            shape: |o| softmax_shape(*axis, o),
            flops: |_, out| 5 * out.num_elements() as u64;
    ]
    $($more),* } };
}
pub(super) use norm_ops;

/// `x`'s shape, with one scale, bias, mean and variance per channel.
pub(super) fn batch_norm_shape(o: &OperandTypes<'_>) -> Result<Shape, String> {
    let x = o.ty(0);
    if x.rank() < 2 {
        return Err(format!("batch_norm input must have rank >= 2, got {x}"));
    }
    let c = o.dims(0)[1];
    for (i, name) in ["scale", "bias", "mean", "var"].iter().enumerate() {
        expect_vector(o.ty(i + 1), c, name, "input channel count")?;
    }
    Ok(o.dims(0).into())
}

/// `x`'s shape, with scale and bias shaped as the normalized axes.
pub(super) fn layer_norm_shape(axis: usize, o: &OperandTypes<'_>) -> Result<Shape, String> {
    let x = o.ty(0);
    if axis >= x.rank() {
        return Err(format!("layer_norm axis {axis} out of range for {x}"));
    }
    let dims = o.dims(0);
    let norm = &dims[axis..];
    for i in 1..o.len() {
        if o.dims(i) != norm {
            return Err(format!(
                "layer_norm {} has shape {}, expected dims {:?}",
                ["scale", "bias"][i - 1],
                o.ty(i),
                &x.dims[axis..]
            ));
        }
    }
    Ok(dims.into())
}

/// `x`'s shape, the axis in range.
pub(super) fn softmax_shape(axis: usize, o: &OperandTypes<'_>) -> Result<Shape, String> {
    let x = o.ty(0);
    if axis >= x.rank() {
        return Err(format!("softmax axis {axis} out of range for {x}"));
    }
    Ok(o.dims(0).into())
}
