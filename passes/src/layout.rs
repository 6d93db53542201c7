//! The layout pass: activations passed between convolutions on a micro-kernel stay in channel blocks (NCHW16c).
//!
//! A pointwise (1×1) conv on a micro-kernel computes a tile of 16 or 32 output channels
//! × up to 56 pixels, vectors along channels. Stored NCHW, that tile goes out as 16–32
//! rows in as many planes, after a 4×4 transpose per 16 results, and its residual comes
//! in the same way; stored in channel blocks (`[n][c/16][h·w][16]`), it is one or two
//! contiguous runs, and the epilogue stores each vector as it is. Reading blocks costs
//! the next pointwise conv nothing: its reduction walks the blocks as rows. In a
//! ResNet bottleneck the block outputs — written by the expanding 1×1 conv with its
//! residual, read by the next block's reducing 1×1 conv and residual — qualify. So do
//! the results of other convs on the micro-kernel: the direct conv's tiles are the same
//! `[pixel][lanes]` sums, and Winograd's output transform computes vectors of 4 channels
//! of one pixel, which it stores as they are.
//!
//! A value is put in blocks when
//! - it is the result of a conv, plain or fused, that the lowering computes on blocks
//!   ([`writes_blocks_on_micro`] with constant weights), or of an op whose kernel reads
//!   blocks only to write blocks — a halving 3×3 max pool ([`max_pool_fits_blocks`]), a
//!   depthwise conv ([`depthwise_on_blocks`]) or a nearest resize repeating whole pixels
//!   ([`resize_repeats_pixels`]: an FPN's upsampling) whose input is in blocks, or a
//!   concatenation along the channels of operands in whole blocks
//!   ([`concat_of_blocks`]: a CSP block's) whose operands are all in blocks, or a
//!   standalone unary or binary op whose full-size operands are all in blocks and whose
//!   others are broadcast along the channels contiguously or not at all
//!   ([`elementwise_operands_fit_blocks`]: an SE block's gating `mul`) — and whose
//!   broadcast post-op operands are per-channel vectors, scalars or one value per pixel
//!   (an image mask, splat across a vector's channels);
//! - every use reads blocks: the input of a conv that reads them
//!   ([`reads_blocks_on_micro`]: pointwise — whatever its output channel count, when its
//!   tiles call the micro-kernel —, direct or Winograd), of such a max pool, depthwise
//!   conv or resize whose result is in blocks, an operand of such a concatenation whose
//!   result is in blocks, the input of a global average pool, a full-size operand of a
//!   standalone unary or binary op (in blocks too, or [`elementwise_reads_blocks`]:
//!   writing row-major, changing the layout as it computes — an SE block's gating `mul`
//!   whose result is also a function result), or a full-size
//!   post-op operand (a residual) of such a conv whose result is in blocks too (the fused
//!   op's type rule wants it laid out as the result);
//! - it is not a function result (callers exchange row-major tensors).
//!
//! So a MobileNet inverted residual — expanding 1×1 conv, depthwise conv, SE gate,
//! projecting 1×1 conv — passes its wide activations in blocks from the expansion
//! through the gate to the projection when their channels come in whole vectors of 4
//! (before, the gating `mul` wrote row-major planes, transposing every 4×4 block:
//! MobileNetV3-large at batch 2, 14.47 → 13.57 ms, minima of 5 × 40 runs).
//!
//! Which convs and pools compute on blocks at all is [`crate::blocks`]'s to say, the
//! same answer the lowering gets; this pass adds the graph conditions.
//!
//! The rules are solved as a greatest fixed point: every candidate starts in blocks and
//! any whose uses fail is dropped, until nothing changes. No `reorder` is inserted: a
//! value is in blocks only where nothing needs it row-major, so the pass never adds a
//! copy. Results change layout through the conv's `layout` attribute, with the type.

use smelt_ir::graph::{Func, Inst, Module, Use, Value};
use smelt_ir::loops::{TileRoutine, TileTarget};
use smelt_ir::op::{Conv2dAttrs, Op};
use smelt_ir::{Layout, TensorType};

use crate::blocks::{
    broadcast_walks_channels, concat_of_blocks, depthwise_on_blocks,
    elementwise_operands_fit_blocks, elementwise_reads_blocks, fits_partial_blocks,
    max_pool_fits_blocks, reads_blocks_on_micro, resize_repeats_pixels, writes_blocks_on_micro,
    CHANNEL_BLOCKS,
};
use crate::manager::{Pass, PassContext, PassError};

/// The layout pass (`layout` in pipelines), for a target with a micro-kernel:
/// [`Executable::compile`](../../smelt/struct.Executable.html) runs the same assignment
/// by itself for the kernels it compiles with, so this pass is for printing the result.
#[derive(Clone, Copy, Debug)]
pub struct LayoutPass {
    /// The routines the target's conv tiles call (`None`: no blocks, nothing changes).
    pub micro: Option<TileTarget>,
}

impl Default for LayoutPass {
    fn default() -> Self {
        // a target with one 16-lane routine: the layouts depend only on whether conv
        // tiles have a routine, and every target with one has a 16-lane one
        LayoutPass {
            micro: Some(TileTarget {
                widest: TileRoutine {
                    lanes: 16,
                    max_pixels: 60,
                    block_pixels: 6,
                },
                narrower: None,
                fma_lanes: 8,
            }),
        }
    }
}

impl Pass for LayoutPass {
    fn name(&self) -> &'static str {
        "layout"
    }

    fn run(&self, module: &mut Module, _cx: &mut PassContext) -> Result<(), PassError> {
        for i in 0..module.funcs.len() {
            if let Some(f) = assign_layouts(&module.funcs[i], self.micro) {
                module.funcs[i] = f;
            }
        }
        Ok(())
    }
}

/// `func` with its activations in channel blocks wherever the rules above allow, for
/// conv tiles calling `micro`; `None` when no value qualifies, or when `func` already
/// has a layout other than row-major (its author's choice is kept).
pub fn assign_layouts(func: &Func, micro: Option<TileTarget>) -> Option<Func> {
    let row_major = |t: &TensorType| t.layout == Layout::RowMajor;
    if !func.params.iter().all(|p| row_major(&p.ty)) || !func.insts.iter().all(|i| row_major(&i.ty))
    {
        return None;
    }
    let first_inst = func.params.len();
    let mut blocked: Vec<bool> = (0..func.num_values())
        .map(|v| v >= first_inst && writes_blocks(func, v - first_inst, micro))
        .collect();
    let uses = func.uses();
    loop {
        let mut changed = false;
        for v in 0..blocked.len() {
            if blocked[v] && !stays_blocked(func, &blocked, &uses[v], v, micro) {
                blocked[v] = false;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    if !blocked.contains(&true) {
        return None;
    }
    let mut out = func.clone();
    for (i, inst) in out.insts.iter_mut().enumerate() {
        if blocked[first_inst + i] {
            if let Some(layout) = result_layout_mut(&mut inst.op) {
                *layout = CHANNEL_BLOCKS;
            }
            inst.ty = inst.ty.with_layout(CHANNEL_BLOCKS);
        }
    }
    Some(out)
}

/// The attributes of instruction `i` when it is a conv (plain or fused) with constant
/// weights, with its weight type: the convs the lowering may compute on blocks.
fn const_conv(func: &Func, i: usize) -> Option<(&Conv2dAttrs, &TensorType)> {
    let inst = &func.insts[i];
    let a = conv_attrs(&inst.op)?;
    let w = *inst.operands.get(1)?;
    matches!(func.inst_of(w)?.op, Op::Const(_)).then(|| (a, func.type_of(w)))
}

/// Whether the instruction `i` is a conv that reads its input, of `channels` channels,
/// in channel blocks.
fn computes_on_blocks(func: &Func, i: usize, channels: usize, micro: Option<TileTarget>) -> bool {
    const_conv(func, i).is_some_and(|(a, w)| reads_blocks_on_micro(a, w, channels, micro))
}

/// Whether instruction `i` may write its result in blocks: a conv whose kernel on the
/// micro-kernel does ([`writes_blocks_on_micro`]), or an op whose kernel reads and
/// writes blocks ([`blocks_from_blocks`]), whose broadcast post-op operands walk the
/// channels contiguously or not at all, and whose post-ops run in its register tile.
fn writes_blocks(func: &Func, i: usize, micro: Option<TileTarget>) -> bool {
    let writer = const_conv(func, i).is_some_and(|(a, w)| writes_blocks_on_micro(a, w, micro))
        || blocks_from_blocks(func, i, micro)
        || block_concat(func, i, micro)
        || block_elementwise(func, i, micro);
    // a long post-op list runs as a separate row-major pass (MAX_POST_IN_REGISTERS)
    let post_in_registers = match &func.insts[i].op {
        Op::Fused(f) => f.post_ops.len() <= crate::lower::MAX_POST_IN_REGISTERS,
        _ => true,
    };
    writer && post_in_registers && post_operands_walk_channels(func, &func.insts[i])
}

/// Whether instruction `i` is an op (plain or fused) whose channel-block kernel reads
/// blocks only to write blocks: a halving max pool, or a depthwise conv
/// ([`depthwise_on_blocks`]). Its input and result are in blocks together or not at all.
fn blocks_from_blocks(func: &Func, i: usize, micro: Option<TileTarget>) -> bool {
    let inst = &func.insts[i];
    let anchor = match &inst.op {
        Op::Fused(f) => &*f.anchor,
        op => op,
    };
    let Some(&x) = inst.operands.first() else {
        return false;
    };
    let x_dims = &func.type_of(x).dims;
    let depthwise = const_conv(func, i)
        .is_some_and(|(a, w)| x_dims.len() == 4 && depthwise_on_blocks(a, w, x_dims[1], micro));
    let resize = match anchor {
        Op::Resize(r) => resize_repeats_pixels(r, x_dims).is_some(),
        _ => false,
    };
    depthwise
        || (micro.is_some() && (resize || max_pool_fits_blocks(anchor, x_dims, &inst.ty.dims)))
}

/// Whether instruction `i` is a concatenation that may stay in blocks
/// ([`concat_of_blocks`]): its operands and its result are in blocks together or not at
/// all.
fn block_concat(func: &Func, i: usize, micro: Option<TileTarget>) -> bool {
    let inst = &func.insts[i];
    let dims = inst.operands.iter().map(|&v| &func.type_of(v).dims[..]);
    micro.is_some() && concat_of_blocks(&inst.op, dims)
}

/// Whether instruction `i` is a standalone unary or binary op that may compute in blocks
/// ([`elementwise_operands_fit_blocks`]: an SE block's gating `mul`, so that the
/// projection reads blocks too): its full-size operands and its result are in blocks
/// together or not at all.
fn block_elementwise(func: &Func, i: usize, micro: Option<TileTarget>) -> bool {
    let inst = &func.insts[i];
    let types: Vec<&TensorType> = inst.operands.iter().map(|&v| func.type_of(v)).collect();
    micro.is_some()
        && matches!(inst.op, Op::Unary(_) | Op::Binary(_))
        && inst.ty.dtype == smelt_ir::DType::F32
        && types.iter().any(|t| t.dims == inst.ty.dims)
        && elementwise_operands_fit_blocks(&types, &inst.ty.dims)
}

/// Whether every post-op operand of `inst` has the result's full size or walks its
/// channels contiguously or not at all (a per-channel vector, a scalar, a per-pixel
/// mask): what an epilogue with vector lanes along channels reads.
fn post_operands_walk_channels(func: &Func, inst: &Inst) -> bool {
    post_operands(inst).iter().all(|&p| {
        let t = func.type_of(p);
        t.dims == inst.ty.dims || broadcast_walks_channels(&t.dims, &inst.ty.dims)
    })
}

/// Whether operand `operand` of instruction `i`, a rank-4 value of `channels`
/// channels, may be read in channel blocks: the input of a conv computing on blocks, of
/// a global average pool (whose epilogue runs along channels), or a full-size operand of
/// a standalone unary or binary f32 op ([`elementwise_reads_blocks`]).
fn reads_blocks(
    func: &Func,
    i: usize,
    operand: usize,
    channels: usize,
    micro: Option<TileTarget>,
) -> bool {
    if !fits_partial_blocks(channels) {
        return false;
    }
    let inst = &func.insts[i];
    if let Op::Unary(_) | Op::Binary(_) = inst.op {
        let types: Vec<&TensorType> = inst.operands.iter().map(|&v| func.type_of(v)).collect();
        let full = types[operand].dims == inst.ty.dims;
        return full && elementwise_reads_blocks(&inst.op, &types, &inst.ty);
    }
    if operand != 0 {
        return false;
    }
    let pool = match &inst.op {
        Op::GlobalAvgPool => true,
        Op::Fused(f) => matches!(*f.anchor, Op::GlobalAvgPool),
        _ => false,
    };
    if pool {
        return post_operands_walk_channels(func, inst);
    }
    computes_on_blocks(func, i, channels, micro)
}

/// Whether value `v` (in blocks so far) may stay in blocks: its full-size post-op
/// operands are in blocks, and every use reads blocks.
fn stays_blocked(
    func: &Func,
    blocked: &[bool],
    uses: &[Use],
    v: usize,
    micro: Option<TileTarget>,
) -> bool {
    let first_inst = func.params.len();
    let producer = &func.insts[v - first_inst];
    let residuals_blocked = post_operands(producer)
        .iter()
        .filter(|&&p| func.type_of(p).dims == producer.ty.dims)
        .all(|p| blocked[p.index()]);
    // a max pool or depthwise conv writes blocks only from blocks, a concatenation only
    // from operands all in blocks, a unary or binary op only from full-size operands all
    // in blocks
    let full_size_blocked = || {
        producer
            .operands
            .iter()
            .filter(|&&p| func.type_of(p).dims == producer.ty.dims)
            .all(|p| blocked[p.index()])
    };
    let input_blocked = (!blocks_from_blocks(func, v - first_inst, micro)
        || blocked[producer.operands[0].index()])
        && (!block_concat(func, v - first_inst, micro)
            || producer.operands.iter().all(|p| blocked[p.index()]))
        && (!block_elementwise(func, v - first_inst, micro) || full_size_blocked());
    residuals_blocked
        && input_blocked
        && uses.iter().all(|u| match *u {
            Use::Result(_) => false,
            Use::Operand { inst, operand } => {
                let reader = &func.insts[inst];
                let dims = &func.type_of(Value(v as u32)).dims;
                let first_post = reader.operands.len() - post_operands(reader).len();
                // a residual only into a result in blocks (the type rule), while a conv
                // or pool reads blocks as its input whatever its result's layout, and a
                // max pool or depthwise conv only into blocks
                let full_residual =
                    operand >= first_post && *dims == reader.ty.dims && blocked[first_inst + inst];
                let into_blocks = ((operand == 0 && blocks_from_blocks(func, inst, micro))
                    || block_concat(func, inst, micro))
                    && blocked[first_inst + inst];
                full_residual || into_blocks || reads_blocks(func, inst, operand, dims[1], micro)
            }
        })
}

/// The post-op operands of a fused op (empty for other ops).
fn post_operands(inst: &Inst) -> &[Value] {
    match &inst.op {
        Op::Fused(f) => &inst.operands[inst.operands.len() - f.num_post_operands()..],
        _ => &[],
    }
}

/// The conv attributes of a conv or of a fused op anchored on one.
fn conv_attrs(op: &Op) -> Option<&Conv2dAttrs> {
    match op {
        Op::Conv2d(a) => Some(a),
        Op::Fused(f) => match &*f.anchor {
            Op::Conv2d(a) => Some(a),
            _ => None,
        },
        _ => None,
    }
}

/// The result layout attribute of a conv or max pool, plain or fused.
fn result_layout_mut(op: &mut Op) -> Option<&mut Layout> {
    let anchor = match op {
        Op::Fused(f) => &mut *f.anchor,
        op => op,
    };
    match anchor {
        Op::Conv2d(a) => Some(&mut a.layout),
        Op::MaxPool2d(p) => Some(&mut p.layout),
        Op::Resize(r) => Some(&mut r.layout),
        _ => None,
    }
}
