//! Normalizations: BatchNormalization (inference form) and LayerNormalization.

use smelt_ir::op::Op;
use smelt_ir::{Diagnostic, F32};

use crate::onnx::context::{Entry, NodeCtx};

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
