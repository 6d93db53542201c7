//! Normalizations: BatchNormalization (inference form) and LayerNormalization as IR
//! ops; InstanceNormalization, GroupNormalization, MeanVarianceNormalization, LRN,
//! RMSNormalization and LpNormalization as compositions of IR ops.

use smelt_ir::op::{BinaryOp, Comparison, Op, Pool2dAttrs, ReduceAttrs, Reduction, UnaryOp};
use smelt_ir::{Diagnostic, Layout, Value, F32};

use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::ConstTensor;

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "BatchNormalization"  [1, 6, 7, 9, 14, 15],           from 6  => batch_norm;
    "GroupNormalization"  [18, 21],                       from 18 => group_norm;
    "InstanceNormalization" [1, 6, 22],                   from 1  => instance_norm;
    "LRN"                 [1, 13],                        from 1  => lrn;
    "LayerNormalization"  [17],                           from 17 => layer_norm;
    "LpNormalization"     [1, 22],                        from 1  => lp_norm;
    "MeanVarianceNormalization" [1, 9, 13],               from 9  => mean_variance_norm;
    "RMSNormalization"    [23],                           from 23 => rms_norm;
};

/// BatchNormalization with running statistics. Training mode, and `spatial = 0`
/// (per-element statistics in versions 6 to 7), are rejected.
pub fn batch_norm(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["epsilon", "momentum", "spatial", "is_test", "training_mode"])?;
    if !cx.attr_bool("spatial", true)? {
        return Err(cx.err(
            "onnx-unsupported-attribute",
            "spatial = 0 (statistics per element rather than per channel) is not supported",
        ));
    }
    if cx.attr_bool("training_mode", false)? {
        return Err(cx.err(
            "onnx-unsupported-attribute",
            "training_mode = 1 is not supported: smelt runs inference with the running statistics",
        ));
    }
    let epsilon = cx.attr_float_or("epsilon", 1e-5)?;
    let mut operands = Vec::with_capacity(5);
    for i in 0..5 {
        operands.push(cx.value(i)?);
    }
    let y = cx.emit(
        Op::BatchNorm {
            epsilon: F32(epsilon),
        },
        &operands,
    )?;
    let mut out = vec![Entry::Value(y)];
    for what in [
        "running mean output",
        "running variance output",
        "saved mean output",
        "saved variance output",
    ] {
        out.push(cx.dropped(what));
    }
    Ok(out)
}

/// LayerNormalization over axes `axis..rank` with scale and optional bias; the Mean and
/// InvStdDev outputs are not computed.
pub fn layer_norm(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis", "epsilon", "stash_type"])?;
    let rank = cx.dims(0)?.len();
    let axis = cx.axis("axis", cx.attr_int_or("axis", -1)?, rank)?;
    let epsilon = cx.attr_float_or("epsilon", 1e-5)?;
    // stash_type only selects the precision of the mean and variance; smelt's is at least f32.
    let x = cx.value(0)?;
    let norm_dims = cx.type_of(x).dims[axis..].to_vec();
    let mut operands = vec![x];
    for i in [1, 2] {
        if cx.input_name(i).is_none() {
            continue;
        }
        // Scale and bias may omit leading 1s of the normalized shape.
        let dims = cx.dims(i)?;
        let v = if dims != norm_dims && strip_leading_ones(&dims) == strip_leading_ones(&norm_dims)
        {
            cx.reshaped_input(i, norm_dims.clone())?
        } else {
            cx.value(i)?
        };
        operands.push(v);
    }
    let y = cx.emit(
        Op::LayerNorm {
            axis,
            epsilon: F32(epsilon),
        },
        &operands,
    )?;
    Ok(vec![
        Entry::Value(y),
        cx.dropped("Mean output"),
        cx.dropped("InvStdDev output"),
    ])
}

fn strip_leading_ones(dims: &[usize]) -> &[usize] {
    let first = dims.iter().position(|&d| d != 1).unwrap_or(dims.len());
    &dims[first..]
}

/// InstanceNormalization: `scale[c] * (x - mean) / sqrt(var + epsilon) + bias[c]` with
/// mean and variance over the spatial axes of each (image, channel). Composed of
/// `reduce_mean`, `sub`, `mul`, `add`, `sqrt` and `div` rather than an op of its own:
/// the variance is taken of the centred values (two passes, as the interpreter's
/// `layer_norm` does), which keeps it as exact as one op would be (well inside 1e-5
/// relative against onnxruntime), and every piece already has a kernel.
pub fn instance_norm(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["epsilon"])?;
    let dims = cx.dims(0)?;
    if dims.len() < 3 {
        return Err(cx.err(
            "onnx-bad-model",
            format!("input of shape {dims:?} must be [N, C, D1, ...] with a spatial axis"),
        ));
    }
    let c = dims[1];
    let epsilon = cx.attr_float_or("epsilon", 1e-5)?;
    let per_channel = |cx: &mut NodeCtx, i: usize, what: &str| -> Result<Value, Diagnostic> {
        let d = cx.dims(i)?;
        if d != [c] {
            return Err(cx.err(
                "onnx-bad-model",
                format!("{what} of shape {d:?} must be [{c}], one per input channel"),
            ));
        }
        let mut shape = vec![c];
        shape.resize(dims.len() - 1, 1);
        cx.reshaped_input(i, shape)
    };
    let scale = per_channel(cx, 1, "scale")?;
    let bias = per_channel(cx, 2, "bias")?;
    let x = cx.value(0)?;
    let normal = standardized(
        cx,
        x,
        (2..dims.len()).collect(),
        Epsilon::InVariance(epsilon),
    )?;
    let scaled = cx.emit(Op::Binary(BinaryOp::Mul), &[normal, scale])?;
    let y = cx.emit(Op::Binary(BinaryOp::Add), &[scaled, bias])?;
    Ok(vec![Entry::Value(y)])
}

/// Where a normalization adds its epsilon.
enum Epsilon {
    /// `sqrt(var + ε)` (instance and group normalization).
    InVariance(f32),
    /// `sqrt(var) + ε` (MeanVarianceNormalization's function).
    AfterRoot(f32),
}

/// `(x - mean) / std` over `axes` (kept), the variance taken of the centred values (two
/// passes, as the interpreter's `layer_norm` does, exact well inside 1e-5 relative).
fn standardized(
    cx: &mut NodeCtx,
    x: Value,
    axes: Vec<usize>,
    epsilon: Epsilon,
) -> Result<Value, Diagnostic> {
    let along = ReduceAttrs {
        axes,
        keep_dims: true,
    };
    let mean = cx.emit(Op::Reduce(Reduction::Mean, along.clone()), &[x])?;
    let centred = cx.emit(Op::Binary(BinaryOp::Sub), &[x, mean])?;
    let square = cx.emit(Op::Binary(BinaryOp::Mul), &[centred, centred])?;
    let var = cx.emit(Op::Reduce(Reduction::Mean, along), &[square])?;
    let std = match epsilon {
        Epsilon::InVariance(e) => {
            let eps = cx.scalar(e)?;
            let var = cx.emit(Op::Binary(BinaryOp::Add), &[var, eps])?;
            cx.emit(Op::Unary(UnaryOp::Sqrt), &[var])?
        }
        Epsilon::AfterRoot(e) => {
            let eps = cx.scalar(e)?;
            let root = cx.emit(Op::Unary(UnaryOp::Sqrt), &[var])?;
            cx.emit(Op::Binary(BinaryOp::Add), &[root, eps])?
        }
    };
    cx.emit(Op::Binary(BinaryOp::Div), &[centred, std])
}

/// GroupNormalization: the channels split into `num_groups` groups, each (image, group)
/// standardized over its channels and spatial positions (`sqrt(var + epsilon)`), then
/// `scale[c] · y + bias[c]` — per channel from opset 21, per group in opset 18 (each
/// group's value repeated over its channels). `stash_type` other than float32 is refused.
pub fn group_norm(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["epsilon", "num_groups", "stash_type"])?;
    let dims = cx.dims(0)?;
    if dims.len() < 3 {
        return Err(cx.err(
            "onnx-bad-model",
            format!("input of shape {dims:?} must be [N, C, D1, ...] with a spatial axis"),
        ));
    }
    let stash = cx.attr_int_or("stash_type", 1)?;
    if stash != 1 {
        return Err(cx.err(
            "onnx-unsupported-attribute",
            format!("stash_type {stash}: smelt computes the statistics in float32 (1)"),
        ));
    }
    let (n, c) = (dims[0], dims[1]);
    let groups = cx
        .attr_int("num_groups")?
        .ok_or_else(|| cx.bad_attr("num_groups", "is required"))?;
    let groups = usize::try_from(groups)
        .ok()
        .filter(|&g| g > 0 && c % g == 0)
        .ok_or_else(|| {
            cx.bad_attr(
                "num_groups",
                format!("{groups} must be positive and divide the {c} channels"),
            )
        })?;
    let epsilon = cx.attr_float_or("epsilon", 1e-5)?;
    let per_group = cx.version < 21;
    let params = if per_group { groups } else { c };
    let mut affine = Vec::with_capacity(2);
    for (i, what) in [(1, "scale"), (2, "bias")] {
        let d = cx.dims(i)?;
        if d != [params] {
            return Err(cx.err(
                "onnx-bad-model",
                format!(
                    "{what} of shape {d:?} must be [{params}], one per {}",
                    if per_group {
                        "group (opset 18)"
                    } else {
                        "channel"
                    }
                ),
            ));
        }
        let mut v = cx.value(i)?;
        if per_group && groups != c {
            // each group's value over its channels
            let name = cx.derived_name(&format!("{what}_channels"));
            let of_group = (0..c as i64).map(|k| k / (c / groups) as i64).collect();
            let of_group = cx.materialize(&ConstTensor::i64(vec![c], of_group), &name)?;
            v = cx.emit(Op::Gather { axis: 0 }, &[v, of_group])?;
        }
        let mut shape = vec![c];
        shape.resize(dims.len() - 1, 1);
        affine.push(cx.reshape(v, shape)?);
    }
    let x = cx.value(0)?;
    let grouped = cx.reshape(
        x,
        vec![n, groups, dims.iter().skip(1).product::<usize>() / groups],
    )?;
    let normal = standardized(cx, grouped, vec![2], Epsilon::InVariance(epsilon))?;
    let normal = cx.reshape(normal, dims)?;
    let scaled = cx.emit(Op::Binary(BinaryOp::Mul), &[normal, affine[0]])?;
    let y = cx.emit(Op::Binary(BinaryOp::Add), &[scaled, affine[1]])?;
    Ok(vec![Entry::Value(y)])
}

/// MeanVarianceNormalization: `(x - mean) / (sqrt(var) + 1e-9)` over `axes` (default
/// `[0, 2, 3]`), as its ONNX function computes (the variance here of the centred values).
pub fn mean_variance_norm(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axes"])?;
    let rank = cx.dims(0)?.len();
    let axes = match cx.attr_ints("axes")? {
        Some(a) => a,
        None => vec![0, 2, 3],
    };
    let mut resolved = axes
        .iter()
        .map(|&a| cx.axis("axes", a, rank))
        .collect::<Result<Vec<_>, _>>()?;
    resolved.sort_unstable();
    resolved.dedup();
    let x = cx.value(0)?;
    let y = standardized(cx, x, resolved, Epsilon::AfterRoot(1e-9))?;
    Ok(vec![Entry::Value(y)])
}

/// LRN: `x / (bias + alpha / size * sum of x² over the channel window)^beta`, the
/// window running from `c - (size - 1) / 2` to `c + size / 2`. Composed rather than an op
/// of its own: the window sum is an `avg_pool2d` with `count_include_pad` over the
/// channels laid out as rows (`[N, 1, C, rest]`, a `size × 1` window padded by the
/// window's halves), so `alpha * avg` is `alpha / size * sum` exactly as ONNX scales it;
/// the power of the (positive) denominator is `exp(-beta * log(d))`. Each step is
/// correctly rounded or nearly (log and exp to a few ulps), so the result is within
/// 1e-5 relative of onnxruntime's.
pub fn lrn(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["alpha", "beta", "bias", "size"])?;
    let dims = cx.dims(0)?;
    if dims.len() < 3 {
        return Err(cx.err(
            "onnx-bad-model",
            format!("input of shape {dims:?} must be [N, C, D1, ...] with a spatial axis"),
        ));
    }
    let size = cx
        .attr_int("size")?
        .ok_or_else(|| cx.bad_attr("size", "is required"))?;
    if !(1..=i32::MAX as i64).contains(&size) {
        return Err(cx.bad_attr("size", format!("{size} must be positive")));
    }
    let size = size as usize;
    let alpha = cx.attr_float_or("alpha", 1e-4)?;
    let beta = cx.attr_float_or("beta", 0.75)?;
    let bias = cx.attr_float_or("bias", 1.0)?;
    if bias.is_nan() || bias <= 0.0 || !alpha.is_finite() || alpha < 0.0 || !beta.is_finite() {
        return Err(cx.err(
            "onnx-unsupported-attribute",
            format!(
                "bias {bias}, alpha {alpha}, beta {beta}: smelt computes LRN for a positive \
                 bias, a non-negative alpha and a finite beta (so the base of the power is positive)"
            ),
        ));
    }
    let (n, c) = (dims[0], dims[1]);
    let rest: usize = dims[2..].iter().product();
    let x = cx.value(0)?;
    let square = cx.emit(Op::Binary(BinaryOp::Mul), &[x, x])?;
    let rows = cx.reshape(square, vec![n, 1, c, rest])?;
    let window = Pool2dAttrs {
        kernel: [size, 1],
        strides: [1, 1],
        pads: [(size - 1) / 2, 0, size / 2, 0],
        dilations: [1, 1],
        ceil_mode: false,
        layout: Layout::RowMajor,
    };
    let avg = cx.emit(
        Op::AvgPool2d {
            pool: window,
            count_include_pad: true,
        },
        &[rows],
    )?;
    let avg = cx.reshape(avg, dims.clone())?;
    let alpha = cx.scalar(alpha)?;
    let scaled = cx.emit(Op::Binary(BinaryOp::Mul), &[avg, alpha])?;
    let bias = cx.scalar(bias)?;
    let base = cx.emit(Op::Binary(BinaryOp::Add), &[scaled, bias])?;
    let log = cx.emit(Op::Unary(UnaryOp::Log), &[base])?;
    let minus_beta = cx.scalar(-beta)?;
    let exponent = cx.emit(Op::Binary(BinaryOp::Mul), &[log, minus_beta])?;
    let factor = cx.emit(Op::Unary(UnaryOp::Exp), &[exponent])?;
    let y = cx.emit(Op::Binary(BinaryOp::Mul), &[x, factor])?;
    Ok(vec![Entry::Value(y)])
}

/// RMSNormalization: `x / sqrt(mean(x²) + epsilon) * scale`, the mean over the axes
/// `axis..rank`, composed of `mul`, `reduce_mean`, `add`, `sqrt` and `div` in the
/// operator's order (the division rounds once where the reference's reciprocal and
/// product round twice). `stash_type` only
/// selects the precision of the mean; smelt's is at least float32.
pub fn rms_norm(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis", "epsilon", "stash_type"])?;
    cx.check_max_inputs(2)?;
    let rank = cx.dims(0)?.len();
    let axis = cx.axis("axis", cx.attr_int_or("axis", -1)?, rank)?;
    let epsilon = cx.attr_float_or("epsilon", 1e-5)?;
    let x = cx.value(0)?;
    let scale = cx.value(1)?;
    let square = cx.emit(Op::Binary(BinaryOp::Mul), &[x, x])?;
    let along = ReduceAttrs {
        axes: (axis..rank).collect(),
        keep_dims: true,
    };
    let mean = cx.emit(Op::Reduce(Reduction::Mean, along), &[square])?;
    let eps = cx.scalar(epsilon)?;
    let shifted = cx.emit(Op::Binary(BinaryOp::Add), &[mean, eps])?;
    let rms = cx.emit(Op::Unary(UnaryOp::Sqrt), &[shifted])?;
    let normal = cx.emit(Op::Binary(BinaryOp::Div), &[x, rms])?;
    let y = cx.emit(Op::Binary(BinaryOp::Mul), &[normal, scale])?;
    Ok(vec![Entry::Value(y)])
}

/// LpNormalization: `x / ‖x‖ₚ` along one axis for p = 1 (the sum of `|x|`) or p = 2 (the
/// square root of the sum of `x²`); a zero norm gives 0 rather than `NaN`, as the
/// operator's reference does.
pub fn lp_norm(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["axis", "p"])?;
    let rank = cx.dims(0)?.len();
    let axis = cx.axis("axis", cx.attr_int_or("axis", -1)?, rank)?;
    let p = cx.attr_int_or("p", 2)?;
    let x = cx.value(0)?;
    let along = ReduceAttrs {
        axes: vec![axis],
        keep_dims: true,
    };
    let norm = match p {
        1 => {
            let a = cx.emit(Op::Unary(UnaryOp::Abs), &[x])?;
            cx.emit(Op::Reduce(Reduction::Sum, along), &[a])?
        }
        2 => {
            let square = cx.emit(Op::Binary(BinaryOp::Mul), &[x, x])?;
            let sum = cx.emit(Op::Reduce(Reduction::Sum, along), &[square])?;
            cx.emit(Op::Unary(UnaryOp::Sqrt), &[sum])?
        }
        _ => return Err(cx.bad_attr("p", format!("{p} is not 1 or 2"))),
    };
    let zero = cx.scalar(0.0)?;
    let vanishes = cx.emit(Op::Compare(Comparison::Equal), &[norm, zero])?;
    let normal = cx.emit(Op::Binary(BinaryOp::Div), &[x, norm])?;
    let y = cx.emit(Op::Where, &[vanishes, zero, normal])?;
    Ok(vec![Entry::Value(y)])
}
