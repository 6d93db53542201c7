//! Pools: MaxPool, AveragePool (1-D and 2-D, and N-D where at most two spatial axes have
//! a window), GlobalAveragePool, and LpPool as an average pool of `|x|ᵖ`.

use smelt_ir::op::{BinaryOp, Op, Pool2dAttrs, UnaryOp};
use smelt_ir::{Diagnostic, Value};

use super::conv::{input_as_4d, output_from_4d, spatial_input, Window};
use super::OpRule;
use crate::onnx::context::{Entry, NodeCtx};

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "AveragePool"         [1, 7, 10, 11, 19, 22],         from 1  => average_pool;
    "GlobalAveragePool"   [1, 22],                        from 1  => global_average_pool;
    "LpPool"              [1, 2, 11, 18, 22],             from 2  => lp_pool;
    "MaxPool"             [1, 8, 10, 11, 12, 22],         from 1  => max_pool;
};

/// A pool node's window over every spatial axis of an input of `x_dims`.
fn pool_window(cx: &NodeCtx, x_dims: &[usize], dilations: bool) -> Result<Window, Diagnostic> {
    let kernel = cx
        .attr_ints("kernel_shape")?
        .ok_or_else(|| cx.bad_attr("kernel_shape", "is required"))?;
    let spatial = x_dims.len().saturating_sub(2);
    if kernel.len() != spatial || kernel.iter().any(|&k| !(1..=i32::MAX as i64).contains(&k)) {
        return Err(cx.bad_attr(
            "kernel_shape",
            format!("{kernel:?} must hold {spatial} positive values"),
        ));
    }
    let kernel = kernel.iter().map(|&k| k as usize).collect();
    Window::read(cx, kernel, &x_dims[2..], dilations)
}

/// The 2-D pool attributes of a 1-D or 2-D window.
fn pool_attrs(cx: &NodeCtx, window: &Window) -> Result<Pool2dAttrs, Diagnostic> {
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
    let y = pool(cx, true, Op::MaxPool2d)?;
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
    let count_include_pad = cx.attr_bool("count_include_pad", false)?;
    let y = pool(cx, cx.version >= 19, |pool| Op::AvgPool2d {
        pool,
        count_include_pad,
    })?;
    Ok(vec![Entry::Value(y)])
}

/// GlobalAveragePool over every spatial axis.
pub fn global_average_pool(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[])?;
    let x = cx.value(0)?;
    Ok(vec![Entry::Value(cx.emit(Op::GlobalAvgPool, &[x])?)])
}

/// Pools input 0 with the node's window by the 2-D pool `op`: 1-D and 2-D inputs as they
/// are, and inputs of more spatial axes when the window is trivial (size, stride and
/// dilation 1, no padding) on all but at most two of them — torch's LocalResponseNorm
/// export sums a channel window with a 3-D AveragePool of kernel [5, 1, 1]. Pools work
/// per channel, so trivial axes right after the channels join them, and each run of
/// trivial axes between windowed ones becomes one axis.
fn pool(
    cx: &mut NodeCtx,
    dilations: bool,
    op: impl FnOnce(Pool2dAttrs) -> Op,
) -> Result<Value, Diagnostic> {
    let x_dims = cx.dims(0)?;
    if x_dims.len() <= 4 {
        let x_dims = spatial_input(cx, 0)?;
        let window = pool_window(cx, &x_dims, dilations)?;
        let attrs = pool_attrs(cx, &window)?;
        let x = input_as_4d(cx, &x_dims)?;
        let y = cx.emit(op(attrs), &[x])?;
        return output_from_4d(cx, y, x_dims.len());
    }
    let window = pool_window(cx, &x_dims, dilations)?;
    let n = window.kernel.len();
    let trivial = |k: usize| {
        window.kernel[k] == 1
            && window.strides[k] == 1
            && window.dilations[k] == 1
            && window.pads[k] == 0
            && window.pads[k + n] == 0
    };
    let spatial = &x_dims[2..];
    let lead = (0..n).take_while(|&k| trivial(k)).count().min(n - 1);
    let channels = x_dims[1] * spatial[..lead].iter().product::<usize>();
    // the remaining axes in groups: each windowed axis alone, each run of trivial ones
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for k in lead..n {
        match groups.last_mut() {
            Some(run) if trivial(k) && trivial(run[0]) => run.push(k),
            _ => groups.push(vec![k]),
        }
    }
    if groups.len() > 2 {
        return Err(cx.err(
            "onnx-unsupported-op",
            format!(
                "input of shape {x_dims:?} is pooled by a window of {:?} over {n} spatial \
                 axes; smelt pools over at most 2 (the others need a window of 1, stride 1, \
                 dilation 1 and no padding)",
                window.kernel
            ),
        ));
    }
    // a group's window is its axis's (a trivial run's is the trivial window)
    let per_group =
        |f: &dyn Fn(usize) -> usize| -> Vec<usize> { groups.iter().map(|g| f(g[0])).collect() };
    let merged = Window {
        kernel: per_group(&|k| window.kernel[k]),
        strides: per_group(&|k| window.strides[k]),
        dilations: per_group(&|k| window.dilations[k]),
        pads: [
            per_group(&|k| window.pads[k]),
            per_group(&|k| window.pads[k + n]),
        ]
        .concat(),
    };
    let attrs = pool_attrs(cx, &merged)?;
    let sizes: Vec<usize> = groups
        .iter()
        .map(|g| g.iter().map(|&k| spatial[k]).product())
        .collect();
    let mut dims4 = vec![x_dims[0], channels];
    if groups.len() == 1 {
        dims4.push(1);
    }
    dims4.extend_from_slice(&sizes);
    let x = cx.reshaped_input(0, dims4)?;
    let y = cx.emit(op(attrs), &[x])?;
    // back to the input's axes: a windowed axis takes its pooled size, trivial ones keep theirs
    let pooled = cx.type_of(y).dims.clone();
    let first = pooled.len() - groups.len();
    let mut out = x_dims[..2].to_vec();
    out.extend_from_slice(&spatial[..lead]);
    for (g, members) in groups.iter().enumerate() {
        if trivial(members[0]) {
            out.extend(members.iter().map(|&k| spatial[k]));
        } else {
            out.push(pooled[first + g]);
        }
    }
    cx.reshape(y, out)
}

/// LpPool (1-D and 2-D): `(Σ |x|ᵖ)^(1/p)` over each window, as an `avg_pool2d` of `|x|ᵖ`
/// counting the padding (padded zeros add nothing) times the window size. Powers up to 4
/// are products, higher ones `exp(p·log|x|)`; the root is `sqrt` for p = 2, else
/// `exp(log(s)/p)` (0 stays 0 through `log`'s −∞). `ceil_mode` windows running past the
/// padding would need their own count, so `ceil_mode = 1` is refused.
pub fn lp_pool(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[
        "auto_pad",
        "ceil_mode",
        "dilations",
        "kernel_shape",
        "p",
        "pads",
        "strides",
    ])?;
    if cx.attr_bool("ceil_mode", false)? {
        return Err(cx.err(
            "onnx-unsupported-attribute",
            "ceil_mode = 1 is not supported for LpPool (a window past the padding sums fewer elements)",
        ));
    }
    let p = cx.attr_int_or("p", 2)?;
    if !(1..=64).contains(&p) {
        return Err(cx.bad_attr("p", format!("{p} must be between 1 and 64")));
    }
    let x_dims = spatial_input(cx, 0)?;
    let window = pool_window(cx, &x_dims, cx.version >= 18)?;
    let attrs = pool_attrs(cx, &window)?;
    let size: usize = window.kernel.iter().product();
    let x = input_as_4d(cx, &x_dims)?;
    let a = cx.emit(Op::Unary(UnaryOp::Abs), &[x])?;
    let mul = |cx: &mut NodeCtx, l: Value, r: Value| cx.emit(Op::Binary(BinaryOp::Mul), &[l, r]);
    let powered = match p {
        1 => a,
        2 => mul(cx, a, a)?,
        3 => {
            let s = mul(cx, a, a)?;
            mul(cx, s, a)?
        }
        4 => {
            let s = mul(cx, a, a)?;
            mul(cx, s, s)?
        }
        _ => {
            let l = cx.emit(Op::Unary(UnaryOp::Log), &[a])?;
            let pv = cx.scalar(p as f32)?;
            let e = mul(cx, l, pv)?;
            cx.emit(Op::Unary(UnaryOp::Exp), &[e])?
        }
    };
    let avg = cx.emit(
        Op::AvgPool2d {
            pool: attrs,
            count_include_pad: true,
        },
        &[powered],
    )?;
    let count = cx.scalar(size as f32)?;
    let sum = mul(cx, avg, count)?;
    let y = match p {
        1 => sum,
        2 => cx.emit(Op::Unary(UnaryOp::Sqrt), &[sum])?,
        _ => {
            let l = cx.emit(Op::Unary(UnaryOp::Log), &[sum])?;
            let inv = cx.scalar(1.0 / p as f32)?;
            let e = mul(cx, l, inv)?;
            cx.emit(Op::Unary(UnaryOp::Exp), &[e])?
        }
    };
    Ok(vec![Entry::Value(output_from_4d(cx, y, x_dims.len())?)])
}
