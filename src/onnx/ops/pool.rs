//! Pools: MaxPool, AveragePool (1-D and 2-D) and GlobalAveragePool.

use smelt_ir::op::{Op, Pool2dAttrs};
use smelt_ir::Diagnostic;

use super::conv::{input_as_4d, output_from_4d, spatial_input, Window};
use crate::onnx::context::{Entry, NodeCtx};

/// Reads the window of a pool node and builds the 2-D pool attributes.
fn pool_attrs(cx: &NodeCtx, x_dims: &[usize], dilations: bool) -> Result<Pool2dAttrs, Diagnostic> {
    let kernel = cx
        .attr_ints("kernel_shape")?
        .ok_or_else(|| cx.bad_attr("kernel_shape", "is required"))?;
    let spatial = x_dims.len() - 2;
    if kernel.len() != spatial || kernel.iter().any(|&k| !(1..=i32::MAX as i64).contains(&k)) {
        return Err(cx.bad_attr(
            "kernel_shape",
            format!("{kernel:?} must hold {spatial} positive values"),
        ));
    }
    let kernel = kernel.iter().map(|&k| k as usize).collect();
    let window = Window::read(cx, kernel, &x_dims[2..], dilations)?;
    let (kernel, strides, dilations, pads) = window.to_2d();
    Ok(Pool2dAttrs {
        kernel,
        strides,
        pads,
        dilations,
        ceil_mode: cx.attr_bool("ceil_mode", false)?,
        layout: smelt_ir::Layout::RowMajor,
    })
}

/// MaxPool; the optional Indices output is not computed (an error if used).
pub fn max_pool(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[
        "auto_pad",
        "ceil_mode",
        "dilations",
        "kernel_shape",
        "pads",
        "storage_order",
        "strides",
    ])?;
    let x_dims = spatial_input(cx, 0)?;
    let attrs = pool_attrs(cx, &x_dims, true)?;
    let x = input_as_4d(cx, &x_dims)?;
    let y = cx.emit(Op::MaxPool2d(attrs), &[x])?;
    let y = output_from_4d(cx, y, x_dims.len())?;
    Ok(vec![Entry::Value(y), cx.dropped("Indices output")])
}

/// AveragePool with `count_include_pad` and `ceil_mode` (dilations from version 19).
pub fn average_pool(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[
        "auto_pad",
        "ceil_mode",
        "count_include_pad",
        "dilations",
        "kernel_shape",
        "pads",
        "strides",
    ])?;
    let x_dims = spatial_input(cx, 0)?;
    let attrs = pool_attrs(cx, &x_dims, cx.version >= 19)?;
    let count_include_pad = cx.attr_bool("count_include_pad", false)?;
    let x = input_as_4d(cx, &x_dims)?;
    let op = Op::AvgPool2d {
        pool: attrs,
        count_include_pad,
    };
    let y = cx.emit(op, &[x])?;
    let y = output_from_4d(cx, y, x_dims.len())?;
    Ok(vec![Entry::Value(y)])
}

/// GlobalAveragePool over every spatial axis.
pub fn global_average_pool(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let x = cx.value(0)?;
    Ok(vec![Entry::Value(cx.emit(Op::GlobalAvgPool, &[x])?)])
}
