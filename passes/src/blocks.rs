//! Which kernels compute on channel blocks (NCHW16c): the one statement of it, asked by
//! the layout pass ([`crate::layout`]), which puts a value in blocks only where every
//! writer and reader computes on them, and by lowering ([`crate::lower`]), which refuses
//! a blocked operand no kernel reads. Kept apart from both, so the two cannot drift: a
//! layout the pass picks is one the lowering compiles.
//!
//! The conv predicates assume constant weights (the layout pass and the conv lowering
//! check that themselves); `micro` is the target's conv-tile routines, `None` for
//! Cranelift code only, which computes on no blocks.

use smelt_ir::loops::TileTarget;
use smelt_ir::op::{Conv2dAttrs, Pool2dAttrs, ResizeAttrs};
use smelt_ir::{Layout, Op, TensorType};

use crate::lower::elementwise::broadcast_strides;

/// Channels per block of the channel-blocked activations (`nchw16c`) that pointwise
/// convs on a micro-kernel read and write: one AVX-512 vector of channels, two AVX2
/// ones, four of Cranelift's.
pub const CHANNEL_BLOCK: usize = 16;

/// The layout of channel blocks, `nchw16c`.
pub const CHANNEL_BLOCKS: Layout = Layout::Blocked {
    axis: 1,
    block: CHANNEL_BLOCK as u8,
};

/// Channels in blocks may end in a partial block, its padded lanes zero, when they come
/// in whole vectors of 4: the kernels that take one (pointwise convs on a micro-kernel,
/// depthwise convs, global average pools, unary and binary ops) compute or skip whole
/// vectors. Direct and Winograd convs and the halving max pool read and write whole
/// blocks only.
pub fn fits_partial_blocks(channels: usize) -> bool {
    channels.is_multiple_of(4)
}

/// Whether a conv with attributes `a` and weight type `w` (constant weights assumed) is
/// pointwise on a micro-kernel — 1×1, unpadded, ungrouped, its tiles on a routine of
/// `micro` ([`pointwise_micro_channels`](crate::lower::conv::pointwise_micro_channels)),
/// output channels in whole vectors of 4 — the conv form whose kernel reads its input
/// and writes its result in channel blocks ([`CHANNEL_BLOCKS`]), a partial last block
/// on either side included ([`fits_partial_blocks`]).
pub fn pointwise_on_micro(a: &Conv2dAttrs, w: &TensorType, micro: Option<TileTarget>) -> bool {
    a.groups == 1
        && a.pads == [0; 4]
        && w.rank() == 4
        && w.dims[2..] == [1, 1]
        && fits_partial_blocks(w.dims[0])
        && crate::lower::conv::pointwise_micro_channels(w.dims[0], micro).is_some()
}

/// Whether a conv with attributes `a` and weight type `w` (constant weights assumed) may
/// write its result in channel blocks ([`CHANNEL_BLOCKS`]) on a target with `micro`: a
/// pointwise one ([`pointwise_on_micro`]), or any other ungrouped one with output
/// channels in whole blocks — the packed direct convolution's epilogue and Winograd's
/// output transform then store each vector of 4 channels of a pixel as it is instead of
/// transposing.
pub fn writes_blocks_on_micro(a: &Conv2dAttrs, w: &TensorType, micro: Option<TileTarget>) -> bool {
    pointwise_on_micro(a, w, micro)
        || (micro.is_some()
            && a.groups == 1
            && w.rank() == 4
            && w.dims[0].is_multiple_of(CHANNEL_BLOCK))
}

/// Whether a conv with attributes `a` and weight type `w` (constant weights assumed)
/// reads an input of `channels` channels in channel blocks ([`CHANNEL_BLOCKS`]) on a
/// target with `micro`: a pointwise one whose tiles call the micro-kernel — any output
/// channel count the routines compute at a useful fraction of their lanes
/// ([`pointwise_micro_channels`](crate::lower::conv::pointwise_micro_channels)), its
/// reduction walking the input's blocks as rows whatever its result's layout, a partial
/// last block included ([`fits_partial_blocks`]) — or any other ungrouped one with
/// output channels in quads and input channels in whole blocks (the packed convolution,
/// whose channels-last copy of the input copies 16-channel runs, or Winograd, whose
/// padded copy stays in blocks).
pub fn reads_blocks_on_micro(
    a: &Conv2dAttrs,
    w: &TensorType,
    channels: usize,
    micro: Option<TileTarget>,
) -> bool {
    let pointwise = w.rank() == 4 && w.dims[2..] == [1, 1] && a.pads == [0; 4];
    if pointwise {
        return a.groups == 1
            && fits_partial_blocks(channels)
            && crate::lower::conv::pointwise_micro_channels(w.dims[0], micro).is_some();
    }
    micro.is_some()
        && a.groups == 1
        && w.rank() == 4
        && w.dims[0].is_multiple_of(4)
        && channels.is_multiple_of(CHANNEL_BLOCK)
}

/// The largest depthwise window computed on channel blocks (7×7: MobileNet-family
/// models use 3×3 and 5×5; a larger window would unroll its peeled borders into long
/// code).
pub const DEPTHWISE_BLOCKS_MAX_WINDOW: usize = 7;

/// Whether a conv with attributes `a`, weight type `w` (constant weights assumed) and
/// `channels` input channels is a depthwise one that the channel-block kernel computes
/// from blocks into blocks on a target with `micro`: one input and one output channel per
/// group, channels in whole vectors of 4 ([`fits_partial_blocks`]), a window of at most
/// [`DEPTHWISE_BLOCKS_MAX_WINDOW`] on a side. Its vectors run along channels, so its
/// taps are plain vector loads at any stride, and its borders are the taps it skips.
/// Blocks exist only between kernels with micro-kernel neighbours, hence `micro`; the
/// kernel itself is Cranelift code.
pub fn depthwise_on_blocks(
    a: &Conv2dAttrs,
    w: &TensorType,
    channels: usize,
    micro: Option<TileTarget>,
) -> bool {
    micro.is_some()
        && w.rank() == 4
        && a.groups == channels
        && w.dims[0] == channels
        && w.dims[1] == 1
        && fits_partial_blocks(channels)
        && (1..=DEPTHWISE_BLOCKS_MAX_WINDOW).contains(&w.dims[2])
        && (1..=DEPTHWISE_BLOCKS_MAX_WINDOW).contains(&w.dims[3])
        && a.pads[0] < w.dims[2]
        && a.pads[2] < w.dims[2]
        && a.pads[1] < w.dims[3]
        && a.pads[3] < w.dims[3]
}

/// The factors by which a nearest resize of an input of `x` dims repeats each pixel,
/// when it is one the channel-block kernel computes: rank 4, channels in whole vectors
/// of 4, every output reading input `o / factor` along H and W and the same N and C —
/// a pixel's 16 channels are copied as they are (FPN upsampling: ×2 with `floor` and
/// `asymmetric`).
pub fn resize_repeats_pixels(r: &ResizeAttrs, x: &[usize]) -> Option<Vec<usize>> {
    let factors = crate::lower::resize::replication_factors(r, x)?;
    (x.len() == 4 && factors[..2] == [1, 1] && fits_partial_blocks(x[1])).then_some(factors)
}

/// Whether `op` is a max pool that the channel-block kernel computes for input `x` and
/// result `out` (the halving max-pool kernel, on blocks): [`max_pool_fits_blocks`], with input and
/// result both in blocks.
pub fn max_pool_on_blocks(op: &Op, x: &TensorType, out: &TensorType) -> bool {
    x.layout == CHANNEL_BLOCKS
        && out.layout == CHANNEL_BLOCKS
        && max_pool_fits_blocks(op, &x.dims, &out.dims)
}

/// Whether `op` is a max pool the channel-block kernel can compute from input dims `x`
/// to result dims `out`, whatever their layouts: a halving 3×3 stride-2 window on whole
/// blocks of channels.
pub fn max_pool_fits_blocks(op: &Op, x: &[usize], out: &[usize]) -> bool {
    let Op::MaxPool2d(p) = op else {
        return false;
    };
    x.len() == 4
        && out.len() == 4
        && x[1].is_multiple_of(CHANNEL_BLOCK)
        && halves_with_3x3_windows(p, [x[2], x[3]], [out[2], out[3]])
}

/// Whether a pool is the 3×3, stride-2, pad-1 window that halves an even H and a W that
/// is a multiple of 8 (ResNet's stem pool): every window holds input elements, no
/// window reaches the bottom or right padding, and output rows come in whole vectors.
pub(crate) fn halves_with_3x3_windows(
    p: &Pool2dAttrs,
    [h, w]: [usize; 2],
    [oh, ow]: [usize; 2],
) -> bool {
    p.kernel == [3, 3]
        && p.strides == [2, 2]
        && p.dilations == [1, 1]
        && p.pads[0] == 1
        && p.pads[1] == 1
        && h >= 2
        && h.is_multiple_of(2)
        && w.is_multiple_of(8)
        && (oh, ow) == (h / 2, w / 2)
}

/// Whether a standalone unary or binary f32 op reads its operands of `types` into its
/// row-major `result`: a rank-4 result of channels in whole vectors of 4, each operand of the
/// result's size row-major or in blocks, the others (broadcast into it, an SE gate's
/// per-channel scale) row-major. The kernel changes the layout as it computes, so a
/// depthwise conv feeding an SE block's gating `mul` can stay in blocks.
pub fn elementwise_reads_blocks(op: &Op, types: &[&TensorType], result: &TensorType) -> bool {
    matches!(op, Op::Unary(_) | Op::Binary(_))
        && result.layout == Layout::RowMajor
        && result.rank() == 4
        && result.dtype == smelt_ir::DType::F32
        && fits_partial_blocks(result.dims[1])
        && types.iter().all(|t| {
            t.dtype == smelt_ir::DType::F32
                && (t.layout == Layout::RowMajor
                    || (t.layout == CHANNEL_BLOCKS && t.dims == result.dims))
        })
}

/// Whether a standalone unary or binary f32 op computes its result of `result` type in
/// channel blocks from operands of `types`: a rank-4 result of channels in whole vectors
/// of 4, each operand of the result's size in blocks, the others row-major and broadcast
/// along the channels contiguously or not at all (an SE gate's per-image, per-channel
/// scale, a scalar, a per-pixel mask). Its kernel walks the blocks as they are: no
/// transposes, vectors of 4 channels.
pub fn elementwise_on_blocks(op: &Op, types: &[&TensorType], result: &TensorType) -> bool {
    matches!(op, Op::Unary(_) | Op::Binary(_))
        && result.layout == CHANNEL_BLOCKS
        && elementwise_operands_fit_blocks(types, &result.dims)
        && types
            .iter()
            .all(|t| t.dims != result.dims || t.layout == CHANNEL_BLOCKS)
}

/// Whether operands of `types` fit [`elementwise_on_blocks`] for a result of shape `out`,
/// whatever the layout of those of its size (the layout pass asks before it decides):
/// rank 4, f32, channels in whole vectors of 4, every operand of that size or row-major
/// and broadcast along the channels contiguously or not at all.
pub fn elementwise_operands_fit_blocks(types: &[&TensorType], out: &[usize]) -> bool {
    out.len() == 4
        && fits_partial_blocks(out[1])
        && types.iter().all(|t| {
            let strides = broadcast_strides(&t.dims, out);
            t.dtype == smelt_ir::DType::F32
                && t.rank() <= 4
                && match t.dims == out {
                    true => t.layout == CHANNEL_BLOCKS || t.layout == Layout::RowMajor,
                    false => t.layout == Layout::RowMajor && matches!(strides[1], 0 | 1),
                }
        })
}

/// Whether some kernel computes `op` with operands of `types` into `result` as they are
/// laid out: every op on row-major tensors; `reorder` between any; convs (plain or
/// fused) reading and writing channel blocks (their full-size post-op operands laid out
/// as the result, weights, bias and broadcast operands row-major); global average pools
/// and unary and binary ops ([`elementwise_reads_blocks`]) reading them. The conv and
/// pool lowerings check the finer conditions.
pub(crate) fn layouts_have_kernels(op: &Op, types: &[&TensorType], result: &TensorType) -> bool {
    let row_major = |t: &TensorType| t.layout == Layout::RowMajor;
    if types.iter().all(|t| row_major(t)) && row_major(result) {
        return true;
    }
    let (anchor, n_anchor) = match op {
        Op::Fused(f) => (&*f.anchor, types.len() - f.num_post_operands()),
        _ => (op, types.len()),
    };
    let activation = |t: &TensorType| row_major(t) || t.layout == CHANNEL_BLOCKS;
    let post_ok = types[n_anchor..].iter().all(|t| {
        let want = if t.dims == result.dims {
            result.layout
        } else {
            Layout::RowMajor
        };
        t.layout == want
    });
    let Some((x, params)) = types[..n_anchor].split_first() else {
        return false;
    };
    match anchor {
        Op::Reorder { .. } => true,
        Op::Conv2d(_) => {
            activation(x) && params.iter().all(|t| row_major(t)) && activation(result) && post_ok
        }
        Op::GlobalAvgPool => activation(x) && row_major(result) && post_ok,
        Op::MaxPool2d(_) => max_pool_on_blocks(anchor, x, result) && post_ok,
        Op::Resize(r) => {
            x.layout == CHANNEL_BLOCKS
                && result.layout == CHANNEL_BLOCKS
                && resize_repeats_pixels(r, &x.dims).is_some()
        }
        Op::Unary(_) | Op::Binary(_) => {
            elementwise_reads_blocks(op, types, result) || elementwise_on_blocks(op, types, result)
        }
        // (the type rule keeps blocks only for whole blocks along the blocked axis)
        Op::Concat { .. } => {
            types.iter().all(|t| t.layout == CHANNEL_BLOCKS) && result.layout == CHANNEL_BLOCKS
        }
        _ => false,
    }
}

/// Whether `op` on operands of `dims` is a concatenation the layout pass may keep in
/// channel blocks: along the channels of rank-4 values, every operand in whole blocks
/// (so the result's blocks are the operands' blocks, and a kernel copies runs of them
/// or none runs at all, see `lower::copy::concat_in_place`).
pub fn concat_of_blocks<'d>(op: &Op, mut dims: impl Iterator<Item = &'d [usize]>) -> bool {
    matches!(op, Op::Concat { axis: 1 })
        && dims.all(|d| d.len() == 4 && d[1].is_multiple_of(CHANNEL_BLOCK))
}

/// Whether a broadcast post-op operand of shape `dims` walks the channels of a rank-4
/// result of shape `out` contiguously or not at all: a per-channel vector, a scalar, or
/// one value per pixel (an image mask, `[1, 1, H, W]`, splat across a vector's
/// channels) — what an epilogue with vector lanes along channels reads.
pub fn broadcast_walks_channels(dims: &[usize], out: &[usize]) -> bool {
    let s = broadcast_strides(dims, out);
    s.len() == 4 && (s[1] == 0 || (s[0] == 0 && s[2] == 0 && s[3] == 0 && s[1] == 1))
}
