//! Conv and ConvTranspose (1-D and 2-D; 1-D runs as 2-D with height 1), ConvInteger and
//! QLinearConv (exact int32 sums of f32 convs over chunks of input channels), Col2Im (as a
//! grouped ConvTranspose whose constant weights place each column entry at its kernel
//! offset), and the `auto_pad` resolution shared with the pools.

use smelt_ir::op::{BinaryOp, Conv2dAttrs, ConvTranspose2dAttrs, Op};
use smelt_ir::{Diagnostic, Value};

use super::{quantize, OpRule};
use crate::onnx::context::{Entry, NodeCtx};
use crate::onnx::tensor::ConstTensor;

/// This family's rows of the operator table (op type, every `since_version` up to
/// [`super::MAX_OPSET`], the oldest smelt implements, handler); `super` sorts them.
pub(super) const ROWS: &[OpRule] = rules! {
    "Conv"                [1, 11, 22],                    from 1  => conv;
    "Col2Im"              [18],                           from 18 => col2im;
    "ConvInteger"         [10],                           from 10 => conv_integer;
    "ConvTranspose"       [1, 11, 22],                    from 1  => conv_transpose;
    "QLinearConv"         [10],                           from 10 => qlinear_conv;
};

/// Largest stride, dilation or pad accepted (the text form's integer limit), so window
/// arithmetic cannot overflow.
const MAX_WINDOW_ATTR: i64 = i32::MAX as i64;

/// Window geometry of a conv or pool node, per spatial axis, after `auto_pad` is resolved.
pub struct Window {
    /// Kernel size per spatial axis.
    pub kernel: Vec<usize>,
    /// Strides.
    pub strides: Vec<usize>,
    /// Dilations.
    pub dilations: Vec<usize>,
    /// Explicit padding: begins for every axis, then ends (ONNX order).
    pub pads: Vec<usize>,
}

impl Window {
    /// Reads `strides`, `dilations`, `pads` and `auto_pad` for a window of `kernel` over
    /// the spatial dims `input`. `dilations_attr` is false for ops without dilations.
    pub fn read(
        cx: &NodeCtx,
        kernel: Vec<usize>,
        input: &[usize],
        dilations_attr: bool,
    ) -> Result<Window, Diagnostic> {
        let n = kernel.len();
        let positive = |name: &str, v: Option<Vec<i64>>| -> Result<Vec<usize>, Diagnostic> {
            match v {
                None => Ok(vec![1; n]),
                Some(v) if v.len() == n && v.iter().all(|&x| (1..=MAX_WINDOW_ATTR).contains(&x)) => {
                    Ok(v.iter().map(|&x| x as usize).collect())
                }
                Some(v) => Err(cx.bad_attr(
                    name,
                    format!("{v:?} must hold {n} positive values (at most {MAX_WINDOW_ATTR}), one per spatial axis"),
                )),
            }
        };
        let strides = positive("strides", cx.attr_ints("strides")?)?;
        let dilations = if dilations_attr {
            positive("dilations", cx.attr_ints("dilations")?)?
        } else {
            vec![1; n]
        };
        let auto_pad = cx
            .attr_string("auto_pad")?
            .unwrap_or_else(|| "NOTSET".into());
        let explicit = cx.attr_ints("pads")?;
        let pads = match auto_pad.as_str() {
            "NOTSET" | "" => match explicit {
                None => vec![0; 2 * n],
                Some(p)
                    if p.len() == 2 * n
                        && p.iter().all(|&x| (0..=MAX_WINDOW_ATTR).contains(&x)) =>
                {
                    p.iter().map(|&x| x as usize).collect()
                }
                Some(p) => {
                    return Err(cx.bad_attr(
                        "pads",
                        format!("{p:?} must hold {} values in 0..={MAX_WINDOW_ATTR}", 2 * n),
                    ))
                }
            },
            "VALID" => vec![0; 2 * n],
            "SAME_UPPER" | "SAME_LOWER" => {
                let mut pads = vec![0; 2 * n];
                for k in 0..n {
                    // output = ceil(input / stride); pad what the last window needs
                    let out = input[k].div_ceil(strides[k]);
                    let span = (kernel[k].saturating_sub(1)) * dilations[k] + 1;
                    let total =
                        ((out.saturating_sub(1)) * strides[k] + span).saturating_sub(input[k]);
                    let small = total / 2;
                    let (begin, end) = if auto_pad == "SAME_UPPER" {
                        (small, total - small)
                    } else {
                        (total - small, small)
                    };
                    pads[k] = begin;
                    pads[k + n] = end;
                }
                pads
            }
            other => {
                return Err(cx.bad_attr(
                    "auto_pad",
                    format!("'{other}' is not NOTSET, SAME_UPPER, SAME_LOWER or VALID"),
                ))
            }
        };
        Ok(Window {
            kernel,
            strides,
            dilations,
            pads,
        })
    }

    /// The 2-D form: 1-D windows become height-1 windows.
    pub fn to_2d(&self) -> ([usize; 2], [usize; 2], [usize; 2], [usize; 4]) {
        if self.kernel.len() == 1 {
            (
                [1, self.kernel[0]],
                [1, self.strides[0]],
                [1, self.dilations[0]],
                [0, self.pads[0], 0, self.pads[1]],
            )
        } else {
            (
                [self.kernel[0], self.kernel[1]],
                [self.strides[0], self.strides[1]],
                [self.dilations[0], self.dilations[1]],
                [self.pads[0], self.pads[1], self.pads[2], self.pads[3]],
            )
        }
    }
}

/// Checks that input `i` is a 1-D or 2-D spatial tensor (`[N, C, L]` or `[N, C, H, W]`)
/// and returns its dims.
pub fn spatial_input(cx: &NodeCtx, i: usize) -> Result<Vec<usize>, Diagnostic> {
    let dims = cx.dims(i)?;
    if dims.len() != 3 && dims.len() != 4 {
        return Err(cx.err(
            "onnx-unsupported-op",
            format!(
                "input of shape {dims:?} has {} spatial dimensions; smelt supports 1 and 2",
                dims.len().saturating_sub(2)
            ),
        ));
    }
    Ok(dims)
}

/// Input 0 as a 4-D value: `[N, C, L]` becomes `[N, C, 1, L]`.
pub fn input_as_4d(cx: &mut NodeCtx, dims: &[usize]) -> Result<Value, Diagnostic> {
    if dims.len() == 3 {
        cx.reshaped_input(0, vec![dims[0], dims[1], 1, dims[2]])
    } else {
        cx.value(0)
    }
}

/// Weight input `i` of `dims` as a 4-D value: `[M, C, K]` becomes `[M, C, 1, K]`.
fn weight_as_4d(cx: &mut NodeCtx, i: usize, dims: &[usize]) -> Result<Value, Diagnostic> {
    if dims.len() == 3 {
        cx.reshaped_input(i, vec![dims[0], dims[1], 1, dims[2]])
    } else {
        cx.value(i)
    }
}

/// A 4-D result back in the input's rank: `[N, C, 1, L]` becomes `[N, C, L]`.
pub fn output_from_4d(cx: &mut NodeCtx, y: Value, rank: usize) -> Result<Value, Diagnostic> {
    if rank == 3 {
        let d = cx.type_of(y).dims.clone();
        cx.reshape(y, vec![d[0], d[1], d[3]])
    } else {
        Ok(y)
    }
}

/// The dims of a conv node's input and weight and its kernel (the weight's spatial dims).
type ConvDims = (Vec<usize>, Vec<usize>, Vec<usize>);

/// A conv's (or transposed conv's) input and weight dims, checked to be of one rank, and
/// the kernel: the weight's spatial dims, which `kernel_shape` must repeat if given.
fn input_weight_and_kernel(cx: &NodeCtx) -> Result<ConvDims, Diagnostic> {
    input_weight_and_kernel_at(cx, 1)
}

/// [`input_weight_and_kernel`] with the weights at input `w` (QLinearConv's are input 3).
fn input_weight_and_kernel_at(cx: &NodeCtx, w: usize) -> Result<ConvDims, Diagnostic> {
    let x_dims = spatial_input(cx, 0)?;
    let w_dims = cx.dims(w)?;
    if w_dims.len() != x_dims.len() {
        return Err(cx.err(
            "onnx-bad-model",
            format!("weight shape {w_dims:?} does not match input shape {x_dims:?}"),
        ));
    }
    let kernel = w_dims[2..].to_vec();
    if let Some(k) = cx.attr_ints("kernel_shape")? {
        if k.iter().map(|&v| v as usize).ne(kernel.iter().copied()) || k.iter().any(|&v| v < 0) {
            return Err(cx.bad_attr(
                "kernel_shape",
                format!("{k:?} does not match the weight's spatial dims {kernel:?}"),
            ));
        }
    }
    Ok((x_dims, w_dims, kernel))
}

/// The attributes of Conv, ConvInteger and QLinearConv.
const CONV_ATTRS: &[&str] = &[
    "auto_pad",
    "dilations",
    "group",
    "kernel_shape",
    "pads",
    "strides",
];

/// The `conv2d` attributes of a conv node of `kernel` over an input of `x_dims`: its
/// positive `group` (whether it divides the channels is the type rule's check),
/// strides, dilations and resolved padding.
fn conv2d_attrs(
    cx: &NodeCtx,
    kernel: &[usize],
    x_dims: &[usize],
) -> Result<Conv2dAttrs, Diagnostic> {
    let group = cx.attr_int_or("group", 1)?;
    if group < 1 {
        return Err(cx.bad_attr("group", format!("{group} must be positive")));
    }
    let window = Window::read(cx, kernel.to_vec(), &x_dims[2..], true)?;
    let (_, strides, dilations, pads) = window.to_2d();
    Ok(Conv2dAttrs {
        strides,
        pads,
        dilations,
        groups: group as usize,
        ..Conv2dAttrs::default()
    })
}

/// Conv with optional bias, groups, dilations, strides, explicit or automatic padding.
pub fn conv(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(CONV_ATTRS)?;
    let (x_dims, w_dims, kernel) = input_weight_and_kernel(cx)?;
    let attrs = conv2d_attrs(cx, &kernel, &x_dims)?;
    let x = input_as_4d(cx, &x_dims)?;
    let w = weight_as_4d(cx, 1, &w_dims)?;
    let mut operands = vec![x, w];
    if let Some(b) = cx.opt_value(2)? {
        operands.push(b);
    }
    let y = cx.emit(Op::Conv2d(attrs), &operands)?;
    let y = output_from_4d(cx, y, x_dims.len())?;
    Ok(vec![Entry::Value(y)])
}

/// ConvTranspose with optional bias, groups, dilations, strides, `output_padding`, and
/// the result size given by explicit `pads`, by `auto_pad` (`SAME_*`: input size times
/// stride; `VALID`: no pads) or by `output_shape`. The last two become pads as the ONNX
/// reference computes them (`total = stride * (in - 1) + output_padding + span - out`,
/// the odd one at the end for `SAME_UPPER`, at the start otherwise); a negative end pad
/// (a result one row longer than the taps reach) becomes output padding.
pub fn conv_transpose(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&[
        "auto_pad",
        "dilations",
        "group",
        "kernel_shape",
        "output_padding",
        "output_shape",
        "pads",
        "strides",
    ])?;
    let (x_dims, w_dims, kernel) = input_weight_and_kernel(cx)?;
    let spatial = x_dims.len() - 2;
    let group = cx.attr_int_or("group", 1)?;
    let channels = x_dims[1];
    if group < 1 || channels % group as usize != 0 {
        return Err(cx.bad_attr(
            "group",
            format!("{group} must be positive and divide the input's {channels} channels"),
        ));
    }
    if w_dims[0] != channels {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "weight shape {w_dims:?} must have one row per input channel ({channels}): \
                 ConvTranspose weights are [C, O/group, k...]"
            ),
        ));
    }
    let per_axis = |name: &str, default: i64, min: i64| -> Result<Vec<usize>, Diagnostic> {
        match cx.attr_ints(name)? {
            None => Ok(vec![default as usize; spatial]),
            Some(v) if v.len() == spatial && v.iter().all(|&x| (min..=MAX_WINDOW_ATTR).contains(&x)) => {
                Ok(v.iter().map(|&x| x as usize).collect())
            }
            Some(v) => Err(cx.bad_attr(
                name,
                format!("{v:?} must hold {spatial} values in {min}..={MAX_WINDOW_ATTR}, one per spatial axis"),
            )),
        }
    };
    let strides = per_axis("strides", 1, 1)?;
    let dilations = per_axis("dilations", 1, 1)?;
    let output_padding = per_axis("output_padding", 0, 0)?;
    let auto_pad = cx
        .attr_string("auto_pad")?
        .unwrap_or_else(|| "NOTSET".into());
    let output_shape = match cx.attr_ints("output_shape")? {
        None => None,
        // exporters write the spatial dims, some the whole shape
        Some(v) if v.len() == spatial || v.len() == spatial + 2 => {
            let tail = &v[v.len() - spatial..];
            if tail.iter().any(|&d| !(1..=MAX_WINDOW_ATTR).contains(&d)) {
                return Err(cx.bad_attr("output_shape", format!("{v:?} must be positive")));
            }
            Some(tail.to_vec())
        }
        Some(v) => {
            return Err(cx.bad_attr(
                "output_shape",
                format!("{v:?} must hold {spatial} values, one per spatial axis"),
            ))
        }
    };
    // begin and end pads (possibly negative), per axis
    let mut pads: Vec<(i64, i64)> = Vec::with_capacity(spatial);
    for k in 0..spatial {
        let (input, s, d) = (x_dims[k + 2] as i64, strides[k] as i64, dilations[k] as i64);
        let span = (kernel[k] as i64 - 1) * d + 1;
        let reach = s * (input - 1) + output_padding[k] as i64 + span;
        let target = match (&output_shape, auto_pad.as_str()) {
            (Some(shape), _) => Some(shape[k]),
            (None, "SAME_UPPER" | "SAME_LOWER") => Some(input * s),
            (None, "NOTSET" | "" | "VALID") => None,
            (None, other) => {
                return Err(cx.bad_attr(
                    "auto_pad",
                    format!("'{other}' is not NOTSET, SAME_UPPER, SAME_LOWER or VALID"),
                ))
            }
        };
        let pair = match target {
            Some(out) => {
                let total = reach - out;
                let half = total.div_euclid(2);
                if auto_pad == "SAME_UPPER" {
                    (half, total - half)
                } else {
                    (total - half, half)
                }
            }
            None if auto_pad == "VALID" => (0, 0),
            None => match cx.attr_ints("pads")? {
                None => (0, 0),
                Some(p)
                    if p.len() == 2 * spatial
                        && p.iter().all(|&x| (0..=MAX_WINDOW_ATTR).contains(&x)) =>
                {
                    (p[k], p[k + spatial])
                }
                Some(p) => {
                    return Err(cx.bad_attr(
                        "pads",
                        format!(
                            "{p:?} must hold {} values in 0..={MAX_WINDOW_ATTR}",
                            2 * spatial
                        ),
                    ))
                }
            },
        };
        // a result longer than the taps reach by at least a stride (and a dilation)
        // cannot come from this input: ONNX leaves it undefined, PyTorch refuses it
        let extra = output_padding[k] as i64 + (-pair.1).max(0);
        if pair.0 < 0 || (extra > 0 && extra >= s.max(d)) {
            return Err(cx.bad_attr(
                if output_shape.is_some() {
                    "output_shape"
                } else {
                    "output_padding"
                },
                format!(
                    "axis {k}: an input of {input} with stride {s}, dilation {d} and kernel {} \
                     reaches {} positions; the requested result needs {} more at the end and {} \
                     at the start, but at most {} extra at the end and none at the start fit \
                     these strides",
                    kernel[k],
                    reach - output_padding[k] as i64,
                    extra,
                    (-pair.0).max(0),
                    s.max(d) - 1
                ),
            ));
        }
        if pair.0 + pair.1.max(0) >= reach {
            return Err(cx.bad_attr(
                "pads",
                format!("axis {k}: pads {pair:?} crop all {reach} positions of the result"),
            ));
        }
        pads.push(pair);
    }
    let (begin, end): (Vec<usize>, Vec<usize>) = pads
        .iter()
        .map(|&(b, e)| (b as usize, e.max(0) as usize))
        .unzip();
    let extra: Vec<usize> = (0..spatial)
        .map(|k| output_padding[k] + (-pads[k].1).max(0) as usize)
        .collect();
    let attrs = if spatial == 1 {
        ConvTranspose2dAttrs {
            strides: [1, strides[0]],
            pads: [0, begin[0], 0, end[0]],
            dilations: [1, dilations[0]],
            groups: group as usize,
            output_padding: [0, extra[0]],
        }
    } else {
        ConvTranspose2dAttrs {
            strides: [strides[0], strides[1]],
            pads: [begin[0], begin[1], end[0], end[1]],
            dilations: [dilations[0], dilations[1]],
            groups: group as usize,
            output_padding: [extra[0], extra[1]],
        }
    };
    let x = input_as_4d(cx, &x_dims)?;
    let w = if w_dims.len() == 3 {
        cx.reshaped_input(1, vec![w_dims[0], w_dims[1], 1, w_dims[2]])?
    } else {
        cx.value(1)?
    };
    let mut operands = vec![x, w];
    if let Some(b) = cx.opt_value(2)? {
        operands.push(b);
    }
    let y = cx.emit(Op::ConvTranspose2d(attrs), &operands)?;
    let y = output_from_4d(cx, y, x_dims.len())?;
    Ok(vec![Entry::Value(y)])
}

/// Col2Im (opset 18): `input [N, C·∏block, L]` of column blocks summed back into an image
/// `[N, C, image...]` (the inverse of im2col, PyTorch's `fold`). Column `l` is the block at
/// grid position `l` (row-major over the blocks that fit), and its entry `c·K + k` lands on
/// kernel offset `k` of channel `c`: exactly a transposed conv with `C` groups of `K` input
/// channels each, over the input seen as `[N, C·K, blocks...]`, whose constant weights are
/// 1 where the input channel's kernel offset is the tap and 0 elsewhere. 1-D and 2-D images.
pub fn col2im(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(&["dilations", "pads", "strides"])?;
    let dims = cx.dims(0)?;
    let image = cx.const_ints(1, "image_shape")?;
    let block = cx.const_ints(2, "block_shape")?;
    let spatial = image.len();
    if dims.len() != 3 || block.len() != spatial || spatial == 0 {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "Col2Im takes an input [N, C·∏block, L] and image_shape and block_shape of one \
                 length; got an input of shape {dims:?}, image_shape {image:?} and block_shape \
                 {block:?}"
            ),
        ));
    }
    if spatial > 2 {
        return Err(cx.err(
            "onnx-unsupported-op",
            format!("Col2Im of a {spatial}-D image: smelt's transposed convs are 1-D and 2-D"),
        ));
    }
    let positive = |name: &str, v: &[i64]| -> Result<Vec<usize>, Diagnostic> {
        match v.iter().all(|&x| (1..=MAX_WINDOW_ATTR).contains(&x)) {
            true => Ok(v.iter().map(|&x| x as usize).collect()),
            false => Err(cx.err(
                "onnx-bad-model",
                format!("Col2Im {name} {v:?} must be positive"),
            )),
        }
    };
    let image = positive("image_shape", &image)?;
    let block = positive("block_shape", &block)?;
    let per_axis =
        |name: &str, len: usize, default: i64, min: i64| -> Result<Vec<i64>, Diagnostic> {
            match cx.attr_ints(name)? {
                None => Ok(vec![default; len]),
                Some(v)
                    if v.len() == len
                        && v.iter().all(|&x| (min..=MAX_WINDOW_ATTR).contains(&x)) =>
                {
                    Ok(v)
                }
                Some(v) => Err(cx.bad_attr(
                    name,
                    format!("{v:?} must hold {len} values in {min}..={MAX_WINDOW_ATTR}"),
                )),
            }
        };
    let strides = per_axis("strides", spatial, 1, 1)?;
    let dilations = per_axis("dilations", spatial, 1, 1)?;
    let pads = per_axis("pads", 2 * spatial, 0, 0)?;
    // blocks per axis, and the rows the last stride leaves uncovered at the end (the
    // transposed conv's output padding)
    let mut grid = Vec::with_capacity(spatial);
    let mut leftover = Vec::with_capacity(spatial);
    for k in 0..spatial {
        let span = dilations[k] * (block[k] as i64 - 1) + 1;
        let room = image[k] as i64 + pads[k] + pads[k + spatial] - span;
        if room < 0 {
            return Err(cx.err(
                "onnx-bad-model",
                format!(
                    "Col2Im axis {k}: a block spanning {span} does not fit the padded image of {}",
                    image[k] as i64 + pads[k] + pads[k + spatial]
                ),
            ));
        }
        grid.push((room / strides[k] + 1) as usize);
        leftover.push((room % strides[k]) as usize);
    }
    let taps: usize = block.iter().product();
    let blocks: usize = grid.iter().product();
    if dims[1] % taps != 0 || dims[2] != blocks {
        return Err(cx.err(
            "onnx-bad-model",
            format!(
                "Col2Im input of shape {dims:?}: its dim 1 must be a multiple of the block's {taps} \
                 taps and its dim 2 the {blocks} blocks that fit ({grid:?})"
            ),
        ));
    }
    let channels = dims[1] / taps;
    // 2-D geometry, 1-D as height 1
    let two = |v: &[usize], one: usize| {
        if spatial == 1 {
            [one, v[0]]
        } else {
            [v[0], v[1]]
        }
    };
    let [gh, gw] = two(&grid, 1);
    let [kh, kw] = two(&block, 1);
    let pick = |v: &[i64], at: usize, one: i64| {
        if spatial == 1 {
            [one, v[at]]
        } else {
            [v[at], v[at + 1]]
        }
    };
    let to_usize = |p: [i64; 2]| [p[0] as usize, p[1] as usize];
    let [pt, pl] = to_usize(pick(&pads, 0, 0));
    let [pb, pr] = to_usize(pick(&pads, spatial, 0));
    let weight_len = dims[1]
        .checked_mul(taps)
        .ok_or_else(|| cx.err("onnx-bad-model", "Col2Im weights overflow"))?;
    cx.imp
        .reserve("Col2Im's placement weights", weight_len as u64 * 4)?;
    let mut weights = vec![0.0f32; weight_len];
    for c in 0..channels {
        for k in 0..taps {
            // input channel c·K + k, its only output channel, tap k
            weights[(c * taps + k) * taps + k] = 1.0;
        }
    }
    let name = cx.derived_name("placement");
    let w = cx.materialize(&ConstTensor::f32(vec![dims[1], 1, kh, kw], weights), &name)?;
    let x = cx.reshaped_input(0, vec![dims[0], dims[1], gh, gw])?;
    let attrs = ConvTranspose2dAttrs {
        strides: to_usize(pick(&strides, 0, 1)),
        pads: [pt, pl, pb, pr],
        dilations: to_usize(pick(&dilations, 0, 1)),
        groups: channels,
        output_padding: two(&leftover, 0),
    };
    let y = cx.emit(Op::ConvTranspose2d(attrs), &[x, w])?;
    let mut out = vec![dims[0], channels];
    out.extend(&image);
    let y = cx.reshape(y, out)?;
    Ok(vec![Entry::Value(y)])
}

/// The exact int32 conv `(x - x_zp) ⊛ (w - w_zp)` of inputs `x` and `w` (zero points at
/// `x_zp`, `w_zp`), as the sum in int32 of f32 convs over chunks of input channels whose
/// reduction (channels · kernel taps) is at most [`quantize::EXACT_CHUNK`]: every partial sum is an
/// integer below 2^24, exact whatever the order. Padding is of the centred input, 0: the
/// zero point, as ONNX pads.
fn integer_conv(cx: &mut NodeCtx, [x_zp, w, w_zp]: [usize; 3]) -> Result<Value, Diagnostic> {
    let (x_dims, w_dims, kernel) = input_weight_and_kernel_at(cx, w)?;
    let attrs = conv2d_attrs(cx, &kernel, &x_dims)?;
    let group = attrs.groups;
    if x_dims[1] % group != 0 {
        return Err(cx.bad_attr(
            "group",
            format!("{group} must divide the {} channels", x_dims[1]),
        ));
    }
    let taps: usize = kernel.iter().product();
    let per_group = x_dims[1] / group;
    let chunk = quantize::EXACT_CHUNK / taps.max(1);
    if chunk == 0 || (group > 1 && per_group > chunk) {
        return Err(cx.err(
            "onnx-unsupported-op",
            format!(
                "an integer conv of {per_group} input channels per group and a {kernel:?} \
                 kernel: smelt sums exactly at most {} products per f32 chunk and \
                 splits only ungrouped convs",
                quantize::EXACT_CHUNK
            ),
        ));
    }
    let xv = input_as_4d(cx, &x_dims)?;
    let wv = weight_as_4d(cx, w, &w_dims)?;
    let xv = quantize::centred(cx, xv, x_zp, 0)?;
    let wv = quantize::centred(cx, wv, w_zp, 3)?;
    let channels = x_dims[1];
    let step = if group > 1 { channels } else { chunk };
    let y = quantize::exact_int_sum(cx, channels, step, |cx, lo, hi| {
        let (xc, wc) = if lo == 0 && hi == channels {
            (xv, wv)
        } else {
            (
                cx.slice_along(xv, 1, lo, hi)?,
                cx.slice_along(wv, 1, lo, hi)?,
            )
        };
        cx.emit(Op::Conv2d(attrs.clone()), &[xc, wc])
    })?;
    output_from_4d(cx, y, x_dims.len())
}

/// ConvInteger: the int32 conv of the centred int8/uint8 input and weights.
pub fn conv_integer(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(CONV_ATTRS)?;
    cx.check_max_inputs(4)?;
    Ok(vec![Entry::Value(integer_conv(cx, [2, 1, 3])?)])
}

/// QLinearConv: the int32 conv of the centred quantized input and weights plus the int32
/// bias, requantized as its reference does: `saturate(round_half_even((C + B) ·
/// x_scale·w_scale / y_scale) + y_zero_point)`, `w_scale` per tensor or per output channel.
pub fn qlinear_conv(cx: &mut NodeCtx) -> Result<Vec<Entry>, Diagnostic> {
    cx.check_attrs(CONV_ATTRS)?;
    cx.check_max_inputs(9)?;
    for (i, what) in [(1, "x_scale"), (4, "w_scale"), (6, "y_scale")] {
        quantize::check_float(cx, i, what)?;
    }
    let rank = cx.dims(0)?.len();
    let mut c = integer_conv(cx, [2, 3, 5])?;
    if cx.input_name(8).is_some() {
        // one int32 bias per output channel
        let b = cx.value(8)?;
        let b = quantize::along_leading_axis(cx, b, rank - 2)?;
        c = cx.emit(Op::Binary(BinaryOp::Add), &[c, b])?;
    }
    let w_scale = cx.value(4)?;
    let w_scale = quantize::along_leading_axis(cx, w_scale, rank - 2)?;
    let scales = [cx.value(1)?, w_scale, cx.value(6)?];
    Ok(vec![Entry::Value(quantize::requantize(cx, c, scales, 7)?)])
}
