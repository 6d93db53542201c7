//! The weight-preparation family: ops that const_fold always evaluates at compile time
//! (the BN fold's `bn_fold_weight`, `bn_fold_bias`, `bn_scale`, `bn_shift`, and
//! `channel_scale`, `channel_vector`, `conv_shift_bias`) — variants, rows and type
//! rules. They cost nothing at run time (no flops).

use super::dim::{Dim, Shape};
use super::rules::{expect_rank, expect_vector, OperandTypes};

macro_rules! weight_prep_ops {
    ([$($variants:tt)*] [$($rows:tt)*] $next:ident $(, $more:ident)*) => { $next! {
    [$($variants)*
        /// Weight preparation for BN folding: `w[O,...], scale[O], var[O] ->
        /// w * scale / sqrt(var + epsilon)` per output channel. Evaluated at compile time.
        BnFoldWeight {
            /// The batch norm's epsilon.
            epsilon: F32,
        },
        /// Weight preparation for BN folding: `scale, bias, mean, var, conv_bias? ->
        /// (conv_bias - mean) * scale / sqrt(var + epsilon) + bias` (conv_bias = 0 when absent).
        BnFoldBias {
            /// The batch norm's epsilon.
            epsilon: F32,
        },
        /// Weight preparation for BN as a per-channel affine map over NCHW: `scale[C], var[C]
        /// -> scale / sqrt(var + epsilon)` shaped `[C,1,1]`. Evaluated at compile time.
        BnScale {
            /// The batch norm's epsilon.
            epsilon: F32,
        },
        /// Weight preparation for BN as a per-channel affine map over NCHW: `scale, bias, mean,
        /// var -> bias - mean * scale / sqrt(var + epsilon)` shaped `[C,1,1]`. Compile time.
        BnShift {
            /// The batch norm's epsilon.
            epsilon: F32,
        },
        /// Weight preparation: `w[O,...], s -> w * s[o]` along `w`'s first axis, where `s`
        /// holds `O` values in any shape (`[O]`, `[O,1,1]`, `[1,O,1,1]`). Compile time.
        ChannelScale,
        /// Weight preparation: the values of a per-channel constant (`[1,C,1,1]`, `[C,1,1]`)
        /// as a vector `[C]`, e.g. to become a conv bias. Compile time.
        ChannelVector,
        /// Weight preparation: `w[O,C/g,KH,KW], t (C values) -> b[O]` with
        /// `b[o] = sum over c, kh, kw of w[o,c,kh,kw] * t[group(o) * C/g + c]`: the bias that
        /// adding `t` per input channel before an unpadded conv contributes. Compile time.
        ConvShiftBias,
    ]
    [$($rows)*
        BnFoldWeight "bn_fold_weight" Some(Exact(3)), WeightPrep:
            (Op::BnFoldWeight { epsilon }) <=> (Attrs::Epsilon(epsilon))
            attrs { epsilon = DEFAULT_EPSILON },
            dtype: all_f32,
            shape: bn_fold_weight_shape,
            flops: no_flops;
        BnFoldBias "bn_fold_bias" Some(Range(4, 5)), WeightPrep:
            (Op::BnFoldBias { epsilon }) <=> (Attrs::Epsilon(epsilon))
            attrs { epsilon = DEFAULT_EPSILON },
            dtype: all_f32,
            shape: |o| channel_vectors(o, &["scale", "bias", "mean", "var", "conv_bias"], false),
            flops: no_flops;
        BnScale "bn_scale" Some(Exact(2)), WeightPrep: (Op::BnScale { epsilon }) <=> (Attrs::Epsilon(epsilon))
            attrs { epsilon = DEFAULT_EPSILON },
            dtype: all_f32,
            shape: |o| channel_vectors(o, &["scale", "var"], true),
            flops: no_flops;
        BnShift "bn_shift" Some(Exact(4)), WeightPrep: (Op::BnShift { epsilon }) <=> (Attrs::Epsilon(epsilon))
            attrs { epsilon = DEFAULT_EPSILON },
            dtype: all_f32,
            shape: |o| channel_vectors(o, &["scale", "bias", "mean", "var"], true),
            flops: no_flops;
        ChannelScale "channel_scale" Some(Exact(2)), WeightPrep: (Op::ChannelScale) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: channel_scale_shape,
            flops: no_flops;
        ChannelVector "channel_vector" Some(Exact(1)), WeightPrep: (Op::ChannelVector) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: |o| Ok(vec![Dim::product(&o.dims(0)).unwrap_or(Dim::ONE)].into()),
            flops: no_flops;
        ConvShiftBias "conv_shift_bias" Some(Exact(2)), WeightPrep: (Op::ConvShiftBias) <=> (Attrs::None)
            attrs {},
            dtype: all_f32,
            shape: conv_shift_bias_shape,
            flops: no_flops;
    ]
    $($more),* } };
}
pub(super) use weight_prep_ops;

/// The weight's shape, with one scale and variance per output channel.
pub(super) fn bn_fold_weight_shape(o: &OperandTypes<'_>) -> Result<Shape, String> {
    let w = o.dims(0);
    let Some(&out_c) = w.first() else {
        return Err("bn_fold_weight weight must have rank >= 1".into());
    };
    expect_vector(o.ty(1), out_c, "scale", "output channel count")?;
    expect_vector(o.ty(2), out_c, "var", "output channel count")?;
    Ok(w.into())
}

/// Every operand (named by `names`) a vector of the first one's length `C`; the result
/// is `[C]`, or `[C, 1, 1]` when `per_pixel_map`.
pub(super) fn channel_vectors(
    o: &OperandTypes<'_>,
    names: &[&str],
    per_pixel_map: bool,
) -> Result<Shape, String> {
    let c = o.dims(0).first().copied().unwrap_or(Dim::known(0));
    for (t, name) in o.all().iter().zip(names) {
        expect_vector(t, c, name, "channel count")?;
    }
    Ok(if per_pixel_map {
        vec![c, Dim::ONE, Dim::ONE]
    } else {
        vec![c]
    }
    .into())
}

/// The weight's shape, with as many scales as its first axis.
pub(super) fn channel_scale_shape(o: &OperandTypes<'_>) -> Result<Shape, String> {
    let (w, s) = (o.dims(0), o.dims(1));
    match w.first() {
        Some(&out_c) if Dim::product(&s) == Some(out_c) => Ok(w.into()),
        _ => Err(format!(
            "channel_scale needs one scale per index of the first axis of {}, got {}",
            o.ty(0),
            o.ty(1)
        )),
    }
}

/// `[O]`, when the shift's `C` values are whole groups of the weight's input channels.
pub(super) fn conv_shift_bias_shape(o: &OperandTypes<'_>) -> Result<Shape, String> {
    let w = expect_rank(o.ty(0), 4, "conv_shift_bias weight")?;
    let (out_c, cg) = (w[0], w[1]);
    let c = Dim::product(&o.dims(1)).unwrap_or(Dim::known(0));
    // weights are constants: their dims are known
    let (c, cg, out_c) = (
        c.concrete("conv_shift_bias")?,
        cg.concrete("conv_shift_bias")?,
        out_c.concrete("conv_shift_bias")?,
    );
    let groups_fit = cg != 0 && c >= cg && c.is_multiple_of(cg) && out_c.is_multiple_of(c / cg);
    if !groups_fit {
        return Err(format!(
            "conv_shift_bias: {} has no whole number of groups of the {cg} input channels of weight {}",
            o.ty(1),
            o.ty(0)
        ));
    }
    Ok(vec![Dim::known(out_c)].into())
}
