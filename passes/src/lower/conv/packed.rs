//! The packed direct convolution: weights packed at compile time along output channels,
//! register tiles of channel vectors × pixels on channels-last (or NCHW) input, the
//! loop-order model and the input-channel split.

use smelt_ir::loops::{
    Access, Affine, BinOp, BufPtr, ConvTile, Expr, KernelBuilder, TileRoutine, TileTarget, VarId,
    Width,
};
use smelt_ir::{AlignedBuf, ConstantSlab, Diagnostic, Value};

use super::{transpose4, Geo, TileAt, TileBufs, CHANNEL_BLOCK};
use crate::lower::elementwise::{dims_name, Epilogue};
use crate::lower::{BufferId, Cx};

/// Bytes of L2 cache per core (AMD Zen 3: 512 KiB) the conv loop order plans for,
/// leaving room for the output, the post-op operands and the stack.
const L2_BUDGET: usize = 384 << 10;

/// The outer loops of a packed convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LoopOrder {
    /// For each channel block, every output row: the whole input is swept once per
    /// block, so it should stay in L2 between blocks.
    BlocksOuter,
    /// For each band of `rows` output rows, every channel block: the band's input rows
    /// stay in L2 while all the weights stream past once per band.
    RowBands { rows: usize },
}

/// Chooses the loop order that moves the fewest bytes from beyond L2: the input once per
/// channel block when it does not fit, or the weights once per row band.
///
/// `blocks` counts every channel block of the convolution (a group's last may be
/// partial). With `bands_only` the choice is among row bands (the outer loop must be one
/// loop for threads to share, and a partial last block is a second loop beside the full
/// ones, which only fits inside a band).
fn loop_order(g: &Geo, lanes: usize, blocks: usize, bands_only: bool) -> LoopOrder {
    let f = std::mem::size_of::<f32>();
    let row_bytes = g.n * g.c * g.wq * f;
    let input = row_bytes * g.hp;
    let block_w = g.cg * g.kh * g.kw * lanes * f;
    let weights = blocks * block_w;
    let blocks_outer = if input + block_w <= L2_BUDGET {
        input + weights
    } else {
        blocks * input + weights
    };
    let mut best = if bands_only {
        (usize::MAX, LoopOrder::RowBands { rows: 1 })
    } else {
        (blocks_outer, LoopOrder::BlocksOuter)
    };
    for band in (1..=g.oh).filter(|r| g.oh.is_multiple_of(*r)) {
        let band_input = ((band - 1) * g.stride[0] + (g.kh - 1) * g.dil[0] + 1) * row_bytes;
        if band_input + block_w > L2_BUDGET {
            break;
        }
        let bands = g.oh / band;
        let moved = if band_input + weights <= L2_BUDGET {
            input + weights
        } else {
            input + bands * weights
        };
        // fewer bytes; on a tie, the longer band (fewer re-reads of each weight block
        // from L2) as long as there are two bands to share between threads
        if moved < best.0 || (moved == best.0 && bands >= 2) {
            best = (moved, LoopOrder::RowBands { rows: band });
        }
    }
    best.1
}

/// The micro-kernel routine for a group of `channels` output channels when its last
/// channel block may be partial (its packed weights zero past the group's end, its
/// padded lanes computed and never stored): the routine that pads the fewest channels
/// (the widest on a tie), if its useful lanes per FMA still beat Cranelift's f32x4 by a
/// quarter — 24 channels on 32 lanes of AVX-512 do 12 useful lanes per FMA, against 4.
fn padded_routine(target: TileTarget, channels: usize) -> Option<TileRoutine> {
    target
        .routines()
        .filter(|r| r.lanes > 0)
        .map(|r| (channels.div_ceil(r.lanes as usize) * r.lanes as usize, r))
        .min_by_key(|&(padded, _)| padded)
        .filter(|&(padded, _)| 4 * channels * target.fma_lanes as usize > 5 * 4 * padded)
        .map(|(_, r)| r)
}

/// For a group of `channels` whose [`padded_routine`] is `routine`: the widest routine
/// for every whole block of its lanes and, for the rest, the narrowest that covers it —
/// the same channels computed, more of them on the wider routine, whose loop does fewer
/// loads per FMA (MobileNetV3's 72, 40, 200 and 240 channels ran wholly on 16-lane
/// tiles). `None` when that gives nothing wider (the routine is the widest, or the rest
/// needs as many lanes as a whole block).
fn wide_with_tail(
    target: TileTarget,
    channels: usize,
    routine: TileRoutine,
) -> Option<(TileRoutine, TileRoutine)> {
    let wide = target.widest;
    let lanes = wide.lanes as usize;
    if wide.lanes <= routine.lanes || channels < lanes {
        return None;
    }
    let rest = channels % lanes;
    let tail = target
        .routines()
        .filter(|r| r.lanes > 0 && (r.lanes as usize) >= rest && r.lanes < wide.lanes)
        .min_by_key(|r| r.lanes)?;
    let padded = channels / lanes * lanes + tail.lanes as usize;
    (rest > 0 && padded == channels.next_multiple_of(routine.lanes as usize))
        .then_some((wide, tail))
}

/// The input channels one pass over a tile covers, and how it starts and ends: the
/// first part starts from the bias, later ones from the partial sums; the last applies
/// the epilogue, earlier ones store partial sums.
struct ChannelPart {
    /// First input channel (within the group) of the part.
    c0: Affine,
    /// Input channels in the part.
    count: usize,
    first: bool,
    last: bool,
}

/// One micro-kernel call of a tile: the routine, the tile's pixels, and where they sit in
/// their block's sweep (when the next block's weights are prefetched).
struct MicroCall<'a> {
    routine: TileRoutine,
    pixels: usize,
    /// Channels of the block the result has (the routine's lanes, or fewer in a group's
    /// partial last block): only these are stored.
    channels: usize,
    sweep: Option<&'a Sweep>,
}

/// Where one tile goes: its row, its channel block (`group · blocks + block`), its first
/// column, and the channels of its block the result has.
#[derive(Clone, Copy)]
struct TilePlace<'a> {
    at: &'a TileAt,
    block_index: &'a Affine,
    q0: &'a Affine,
    channels: usize,
    /// The routine of this block when it is not [`PackedConv::micro`] (the tail's).
    routine: Option<TileRoutine>,
}

/// Where a row of tiles sits in its channel block's sweep of output pixels (the pixels
/// that block's weights are used for before the next block's are), so that each
/// micro-kernel call prefetches its share of the next block's weights.
struct Sweep {
    /// Output pixels of the sweep before this row.
    row_start: Affine,
    /// Weight elements to prefetch per output pixel: the next block over the sweep.
    unit: i64,
}

/// A convolution with weights packed at compile time so that vectors run along output
/// channels: `[group][channel block][kh][kw][input channel][4·V lanes]`, each block
/// holding `4·V` consecutive output channels of its group.
///
/// A register tile is `V` vectors of output channels × `P` consecutive output pixels of
/// one row: per input channel and tap, `V` weight vectors are loaded, each input pixel is
/// loaded once and broadcast, and every accumulator gets one FMA. Strides and dilations
/// only change the input addresses, so the input needs no phase split. At the end, each
/// group of 4 pixels' accumulators is transposed into vectors of one channel × 4 columns
/// for the epilogue and vector stores along W; leftover pixels go lane by lane.
#[derive(Clone)]
pub(crate) struct PackedConv {
    /// Vectors of 4 output channels per tile.
    pub(crate) vecs: usize,
    /// Output pixels per tile (along a row).
    pub(crate) pixels: usize,
    /// Channel blocks per group (the last one partial when a micro-kernel's lanes do not
    /// divide [`PackedConv::channels`]).
    pub(crate) blocks: usize,
    /// Output channels per group.
    pub(crate) channels: usize,
    /// Input channels per trip of the innermost loop.
    pub(crate) unroll: usize,
    /// The input is channels-last (`[n][row][column][channel]`) rather than NCHW.
    pub(crate) channels_last: bool,
    /// The native routine that computes each tile's sums (then `vecs` is 4 and a tile is
    /// up to [`TileRoutine::max_pixels`] pixels of a row), or `None` for Cranelift FMAs.
    pub(crate) micro: Option<TileRoutine>,
    /// The routine of a group's last block when it is narrower than the others' (their
    /// lanes do not divide the channels: 72 channels as two blocks of 32 and one of 16);
    /// only with one group, and not with [`PackedConv::lane_blocked_output`].
    pub(crate) tail: Option<TileRoutine>,
    /// The sums are stored in blocks of the tile's lanes — `[n][o / lanes][oh][ow][lanes]`
    /// — instead of NCHW: a tile's channel vectors go out as they are (no transposes),
    /// and a micro-kernel writes them itself, each pixel's lanes as whole vectors. For an
    /// internal result read by a kernel made for it (Winograd's `M`, whose output
    /// transform then reads each block's tiles as one stream); no bias, no epilogue.
    pub(crate) lane_blocked_output: bool,
    /// The input is in channel blocks (`nchw16c`, a pointwise conv on a micro-kernel):
    /// a call's reduction walks the blocks as its rows.
    pub(crate) blocked_input: bool,
    /// The result is stored in channel blocks (`nchw16c`): the epilogue runs on vectors
    /// of 4 channels of one pixel and stores them as they are, with no transposes.
    pub(crate) blocked_output: bool,
}

impl PackedConv {
    /// The tile for a group of `og` output channels (a multiple of 4), on channels-last
    /// or NCHW input; tiles call `micro` when it is given and `og` is a multiple of 16.
    pub(crate) fn new(
        g: &Geo,
        og: usize,
        channels_last: bool,
        micro: Option<TileTarget>,
    ) -> PackedConv {
        let routine = micro.and_then(|t| t.routine_for(og));
        if let Some(routine) = routine {
            return PackedConv::on_routine(g, og, channels_last, routine);
        }
        // accumulators (V·P) + weight vectors (V) + one broadcast + one spare ≤ 16 registers
        // Candidate tiles (vectors, most pixels): accumulators V·P ≤ 12 with the V weight
        // vectors, the broadcast and its copy in the 16 registers. FMA latency (4 cycles,
        // 2 pipes) needs ≥ 8 independent accumulators for full throughput; a tile with
        // fewer runs at the fraction it fills. Pick the tile of least modelled time per
        // row.
        let candidates: &[(usize, usize)] = if og.is_multiple_of(8) {
            &[(2, 4), (1, 12)]
        } else {
            &[(1, 12)]
        };
        let row_cost = |vecs: usize, max_pixels: usize| -> (u64, usize, usize) {
            // as few tiles as the widest allows, of balanced widths: 28 columns as
            // 10 + 10 + 8 rather than 12 + 12 + 4, 16 as 8 + 8 rather than 12 + 4 (a
            // narrow last tile has too few accumulators to keep both FMA pipes busy)
            let ow = g.ow.max(1);
            let pixels = ow.div_ceil(ow.div_ceil(max_pixels.max(1)));
            let full = g.ow / pixels;
            let rest = g.ow % pixels;
            // time per output channel, in 1/1000 cycles of FMA issue
            let tile = |p: usize| -> u64 {
                let fill = ((vecs * p) as f64 / 8.0).min(1.0);
                (1000.0 * p as f64 / fill) as u64
            };
            let mut cost = full as u64 * tile(pixels);
            if rest > 0 {
                cost += tile(rest);
            }
            // Two vectors share each broadcast, so it cannot fold into a memory operand
            // and needs a copy per FMA pair: measured in the disassembly, 3.4
            // instructions per FMA against 2.9 for one vector (the front end, 6
            // macro-ops per cycle, is the limit at 2 FMAs per cycle).
            if vecs == 2 {
                cost += cost * 15 / 100;
            }
            (cost, vecs, pixels)
        };
        let (_, vecs, pixels) = candidates
            .iter()
            .map(|&(v, p)| row_cost(v, p))
            .min_by_key(|&(cost, v, _)| (cost, v))
            .unwrap_or((0, 1, 1));
        PackedConv {
            vecs,
            pixels,
            blocks: og / (4 * vecs),
            channels: og,
            unroll: 2,
            channels_last,
            micro: None,
            tail: None,
            lane_blocked_output: false,
            blocked_input: false,
            blocked_output: false,
        }
    }

    /// Tiles of a micro-kernel routine: whole calls along a row, then the rest; a group
    /// whose channels the lanes do not divide ends with a partial block.
    fn on_routine(g: &Geo, og: usize, channels_last: bool, routine: TileRoutine) -> PackedConv {
        PackedConv::on_routines(g, og, channels_last, routine, None)
    }

    /// [`PackedConv::on_routine`], the last block on `tail` when it is given.
    fn on_routines(
        g: &Geo,
        og: usize,
        channels_last: bool,
        routine: TileRoutine,
        tail: Option<TileRoutine>,
    ) -> PackedConv {
        let lanes = routine.lanes as usize;
        let pixels = match tail {
            Some(t) => routine.max_pixels.min(t.max_pixels),
            None => routine.max_pixels,
        };
        PackedConv {
            vecs: lanes / 4,
            pixels: g.ow.clamp(1, pixels as usize),
            blocks: og.div_ceil(lanes),
            channels: og,
            unroll: 1,
            channels_last,
            micro: Some(routine),
            tail,
            lane_blocked_output: false,
            blocked_input: false,
            blocked_output: false,
        }
    }

    /// Like [`PackedConv::new`], for a result stored NCHW (or in channel blocks when the
    /// lanes divide `og`): any `og` a micro-kernel routine computes at a useful fraction
    /// of its lanes ([`padded_routine`]), its last block zero-padded — with one group,
    /// the whole blocks on the widest routine and the last on a narrower one where that
    /// computes the same channels ([`wide_with_tail`]); otherwise `og` a multiple of 4
    /// on Cranelift's tiles. `None` when neither applies.
    pub(crate) fn padded(
        g: &Geo,
        og: usize,
        channels_last: bool,
        micro: Option<TileTarget>,
    ) -> Option<PackedConv> {
        let uniform = PackedConv::padded_uniform(g, og, channels_last, micro)?;
        let mixed = match (micro, uniform.micro) {
            (Some(target), Some(routine)) if g.groups == 1 => wide_with_tail(target, og, routine),
            _ => None,
        };
        Some(match mixed {
            Some((wide, tail)) => PackedConv::on_routines(g, og, channels_last, wide, Some(tail)),
            None => uniform,
        })
    }

    /// [`PackedConv::padded`] with every block on one routine (a lane-blocked result's
    /// layout has blocks of one width).
    pub(crate) fn padded_uniform(
        g: &Geo,
        og: usize,
        channels_last: bool,
        micro: Option<TileTarget>,
    ) -> Option<PackedConv> {
        match micro.and_then(|t| padded_routine(t, og)) {
            Some(routine) => Some(PackedConv::on_routine(g, og, channels_last, routine)),
            None => og
                .is_multiple_of(4)
                .then(|| PackedConv::new(g, og, channels_last, None)),
        }
    }

    /// The channels a group of `og` computes when [`PackedConv::padded`] puts it on a
    /// micro-kernel routine of `micro` (`og` rounded up to whole blocks of the lanes),
    /// or `None` when it stays on Cranelift's tiles.
    pub(crate) fn micro_channels(og: usize, micro: Option<TileTarget>) -> Option<usize> {
        let lanes = micro.and_then(|t| padded_routine(t, og))?.lanes as usize;
        Some(og.next_multiple_of(lanes))
    }

    /// Whether a group's last channel block is partial (or narrower).
    pub(crate) fn ragged(&self) -> bool {
        self.tail.is_some() || self.blocks * self.lanes() != self.channels
    }

    /// Lanes of block `b` of a group: the tail's for the last when there is one.
    fn lanes_of(&self, b: usize) -> usize {
        match self.tail {
            Some(t) if b + 1 == self.blocks => t.lanes as usize,
            _ => self.lanes(),
        }
    }

    /// Output channels a group computes: every block whole (a partial one padded).
    fn group_lanes(&self) -> usize {
        (0..self.blocks).map(|b| self.lanes_of(b)).sum()
    }

    /// Elements of the packed weights: every block whole, a partial one zero-padded.
    pub(crate) fn packed_len(&self, g: &Geo) -> usize {
        g.groups * self.group_lanes() * g.cg * g.kh * g.kw
    }

    /// The same tiles on input and/or result in channel blocks (see
    /// [`PackedConv::blocked_input`] and [`PackedConv::blocked_output`]); only for
    /// micro-kernel tiles, and blocked input only for 1×1 convs.
    pub(crate) fn with_channel_blocks(self, input: bool, output: bool) -> PackedConv {
        PackedConv {
            blocked_input: input,
            blocked_output: output,
            ..self
        }
    }

    /// The same tiles, storing their sums in blocks of their lanes (see
    /// [`PackedConv::lane_blocked_output`]).
    pub(crate) fn with_lane_blocked_output(self) -> PackedConv {
        debug_assert!(
            self.tail.is_none(),
            "a lane-blocked result has blocks of one width"
        );
        PackedConv {
            lane_blocked_output: true,
            ..self
        }
    }

    /// Index of the first sum (lane 0) of the tile at pixel (`at.oh`, `q0`) of channel
    /// block `block_index` (`group · blocks + block`), stored in blocks of the lanes:
    /// `[n][blocks][oh][ow][lanes]` (a partial last block of a group padded to whole
    /// lanes, its padded lanes holding zeros); the tile's next pixel is `lanes` further.
    fn lane_blocked_index(
        &self,
        g: &Geo,
        at: &TileAt,
        block_index: &Affine,
        q0: &Affine,
    ) -> Affine {
        let lanes = self.lanes() as i64;
        // rows `wq` long (≥ `ow`: a layout may pad them, as Winograd's `M` does)
        at.n.scale((g.groups * self.blocks) as i64)
            .add(block_index)
            .scale((g.oh * g.wq) as i64)
            .add(&at.oh.scale(g.wq as i64))
            .add(q0)
            .scale(lanes)
    }

    /// Packed weight elements of one channel block: `kh·kw·cg` rows of the block's lanes.
    fn block_len(&self, g: &Geo) -> i64 {
        (g.kh * g.kw * g.cg * self.lanes()) as i64
    }

    pub(crate) fn lanes(&self) -> usize {
        4 * self.vecs
    }

    /// Input channels per part when a tile's K loop should be split (`None`: one part).
    /// A tile reads its channel block's packed weights and, per kernel row, a run of
    /// input pixels; when that exceeds what L1 keeps across tiles, each pass over the
    /// rows covers only `kc` input channels, with partial sums stored in between (a few
    /// loads and stores per accumulator against `kc·kh·kw` FMAs). Channels-last, a part
    /// is a contiguous run of each pixel's channels; NCHW, it is `kc` channel rows of
    /// which a tile reads about one cache line per kernel row. With few pixels per row
    /// (Winograd's products at 14² and 7²: a 12-pixel and a 4-pixel tile) this is what
    /// keeps the second tile from streaming the weights from L3 again.
    fn channel_split(&self, g: &Geo) -> Option<usize> {
        const L1_BUDGET: usize = 28 << 10;
        if self.micro.is_some() {
            // a call covers every input channel (its weights stream from L2)
            return None;
        }
        let f = std::mem::size_of::<f32>();
        let span = (self.pixels - 1) * g.stride[1] + (g.kw - 1) * g.dil[1] + 1;
        let per_channel_input = if self.channels_last {
            g.kh * span * f
        } else {
            g.kh * (span * f).next_multiple_of(64)
        };
        let bytes = |kc: usize| kc * (g.kh * g.kw * self.lanes() * f + per_channel_input);
        if bytes(g.cg) <= L1_BUDGET {
            return None;
        }
        // the largest part that fits, in whole cache lines of each pixel's channels
        (32..g.cg)
            .rev()
            .filter(|kc| kc.is_multiple_of(16) && g.cg.is_multiple_of(*kc))
            .find(|&kc| bytes(kc) <= L1_BUDGET)
    }

    /// Packs OIHW weights into the blocked form. A BN-folded weight
    /// ([`ScaledRows::parts`](crate::scaled_rows::ScaledRows::parts)) is folded here, one factor per output channel,
    /// bit-identical to packing its folded values, which are then never written out.
    /// What [`PackedConv::pack_from`] reads besides the weights, for
    /// [`Cx::constant_later_from`](crate::lower::Cx::constant_later_from): the filter's
    /// shape and groups, the blocks and their lanes — not the image's size.
    pub(crate) fn pack_recipe(&self, g: &Geo, source_cg: usize) -> String {
        let lanes: Vec<usize> = (0..self.blocks).map(|b| self.lanes_of(b)).collect();
        format!(
            "conv panels kh{} kw{} cg{} source_cg{source_cg} o{} og{} groups{} widest{} \
             lanes{lanes:?}",
            g.kh,
            g.kw,
            g.cg,
            g.o,
            g.og,
            g.groups,
            self.lanes()
        )
    }

    pub(crate) fn pack(&self, g: &Geo, w: &AlignedBuf, slab: &ConstantSlab) -> AlignedBuf {
        self.pack_from(g, w, g.cg, slab)
    }

    /// [`PackedConv::pack`] of weights with `source_cg` input channels per group when
    /// the tiles reduce over `g.cg` ≥ `source_cg`: the channels past the source's are
    /// zero (a partial channel block's padding, read as whole blocks).
    pub(crate) fn pack_from(
        &self,
        g: &Geo,
        w: &AlignedBuf,
        source_cg: usize,
        slab: &ConstantSlab,
    ) -> AlignedBuf {
        let lanes = self.lanes();
        let taps = g.kh * g.kw;
        let filter = g.cg * taps;
        let source_filter = source_cg.min(g.cg) * taps;
        let (src, scale) = crate::scaled_rows::ScaledRows::rows_of(w, g.o);
        slab.f32_with(self.packed_len(g), |out| {
            if filter == 0 || lanes == 0 {
                return;
            }
            // One block of `lanes` output channels at a time: its filters are first
            // copied (and folded: a vectorizable loop over each filter) into `rows`
            // (≤ 150 KB, stays in L2), then interleaved into the block in output order
            // ([group][block][kh][kw][c][lane]), so every output line is written once.
            let mut rows = vec![0.0f32; lanes * filter];
            let mut rest = &mut out[..];
            for b in 0..g.groups * self.blocks {
                let block_lanes = self.lanes_of(b % self.blocks);
                let (block, after) = std::mem::take(&mut rest).split_at_mut(filter * block_lanes);
                rest = after;
                let lanes = block_lanes;
                let rows = &mut rows[..lanes * filter];
                let group_end = (b / self.blocks + 1) * g.og;
                // blocks before the last are whole blocks of the widest lanes
                let o0 = b / self.blocks * g.og + b % self.blocks * self.lanes();
                for (l, row) in rows.chunks_exact_mut(filter).enumerate() {
                    let o = o0 + l;
                    let (row, padding) = row.split_at_mut(source_filter);
                    padding.fill(0.0);
                    match src
                        .get(o * source_filter..(o + 1) * source_filter)
                        .filter(|_| o < group_end)
                    {
                        Some(from) => match scale.and_then(|s| s.get(o)) {
                            Some(&alpha) => {
                                for (d, &x) in row.iter_mut().zip(from) {
                                    *d = crate::scaled_rows::ScaledRows::value(x, alpha);
                                }
                            }
                            None => row.copy_from_slice(from),
                        },
                        None => row.fill(0.0),
                    }
                }
                for tap in 0..taps {
                    for c in 0..g.cg {
                        let at = (tap * g.cg + c) * lanes;
                        for (l, d) in block[at..at + lanes].iter_mut().enumerate() {
                            *d = rows[l * filter + c * taps + tap];
                        }
                    }
                }
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn kernel(
        &self,
        cx: &mut Cx,
        g: &Geo,
        xp: BufferId,
        wbuf: BufferId,
        operands: &[Value],
        mut epi: Epilogue,
        out: BufferId,
    ) -> Result<(), Diagnostic> {
        let has_bias = operands.len() > 2;
        if self.ragged() && self.blocked_output && !g.o.is_multiple_of(4) {
            return Err(cx.unsupported(
                "a partial channel block stored in channel blocks needs whole vectors of 4 channels",
            ));
        }
        if self.lane_blocked_output && (has_bias || !epi.is_empty()) {
            return Err(
                cx.unsupported("sums stored channels-last per group take no bias or post-ops")
            );
        }
        let mut b = KernelBuilder::new(&format!(
            "conv2d_packed_{}{}_{}_g{}_o{}x{}{}p{}{}{}{}{}",
            dims_name(&[g.n, g.c, g.hp, g.wq]),
            if self.blocked_input { "c16" } else { "" },
            g.window_name(),
            g.groups,
            g.o,
            self.lanes(),
            self.tail.map_or(String::new(), |t| format!("t{}", t.lanes)),
            self.pixels,
            if has_bias { "_bias" } else { "" },
            if epi.is_empty() { "" } else { "_fused" },
            if self.lane_blocked_output { "_lb" } else { "" },
            if self.blocked_output { "_out16c" } else { "" }
        ));
        // A leading SiLU, sigmoid or GELU runs natively on a tile's whole lanes with the
        // bias (below), and so does a store routine on a partial last block of a
        // channel-blocked result: both read the bias past the operand's end, so a
        // constant bias gets a copy padded with zeros to whole tiles (YOLO's 255-channel
        // heads, MobileNetV3's 72- and 120-channel expansions).
        let lanes = self.lanes();
        let padded_bias = match operands.get(2) {
            Some(&bias)
                if g.groups == 1
                    && !g.o.is_multiple_of(lanes)
                    && (epi.after_leading_activation().is_some() || self.blocked_output) =>
            {
                cx.padded_constant("bias_padded", bias, g.o.next_multiple_of(lanes))
            }
            _ => None,
        };
        let bias = padded_bias.or_else(|| operands.get(2).map(|&v| cx.buf(v)));
        let (mut bufs, mut args) =
            TileBufs::declare_with_bias(&mut b, cx, xp, ("w_packed", wbuf), bias, &mut epi, out);
        bufs.bias_whole_tiles |= padded_bias.is_some();
        let split = self.channel_split(g);
        if split.is_some() {
            let len = g.n * g.o * g.oh * g.ow;
            let pb = cx.temp("partial", len);
            args.push(pb);
            bufs.partial = Some(b.arg("partial", len, Access::Write));
        }
        b.set_parallel();
        // Output rows `row0 + 0..count` of image `n` for one channel block: with the input
        // channels split, all rows for one part, then all rows for the next (so the
        // part's weights and input rows stay in L1 across tiles).
        let rows = |b: &mut KernelBuilder,
                    n: Affine,
                    grp: &Affine,
                    (blk, channels, routine): (&Affine, usize, Option<TileRoutine>),
                    row0: Affine,
                    count: usize| {
            // Each micro-kernel call prefetches its share of the next block's weights,
            // unless there is no next block or the input channels are split (each part
            // sweeps the rows with a slice of the block).
            let block_len = self.block_len(g);
            let sweep_pixels = (g.n * count * g.ow) as i64;
            let prefetch_next =
                self.micro.is_some() && split.is_none() && g.groups * self.blocks > 1;
            let each_row = |b: &mut KernelBuilder, part: &ChannelPart| {
                b.for_loop(0, count as i64, 1, |b, r| {
                    let sweep = prefetch_next.then(|| Sweep {
                        row_start: n
                            .scale((count * g.ow) as i64)
                            .add(&Affine::var(r).scale(g.ow as i64)),
                        unit: (block_len + sweep_pixels - 1) / sweep_pixels.max(1),
                    });
                    let sweep = sweep.as_ref();
                    let at = TileAt {
                        n: n.clone(),
                        o0: grp.scale(g.og as i64).add(&blk.scale(self.lanes() as i64)),
                        c0: grp.scale(g.cg as i64),
                        oh: row0.add(&Affine::var(r)),
                    };
                    let block_index = grp.scale(self.blocks as i64).add(blk);
                    let p = self.pixels;
                    let main = g.ow / p * p;
                    let tile = |b: &mut KernelBuilder, q0: &Affine, pixels: usize| {
                        let tile_at = TilePlace {
                            at: &at,
                            block_index: &block_index,
                            q0,
                            channels,
                            routine,
                        };
                        self.tile(b, g, &bufs, &epi, &tile_at, pixels, part, sweep);
                    };
                    b.for_loop(0, main as i64, p as i64, |b, q| tile(b, &Affine::var(q), p));
                    if main < g.ow {
                        tile(b, &Affine::constant(main as i64), g.ow - main);
                    }
                });
            };
            match split {
                None => {
                    let whole = ChannelPart {
                        c0: Affine::constant(0),
                        count: g.cg,
                        first: true,
                        last: true,
                    };
                    each_row(b, &whole);
                }
                Some(kc) => {
                    let parts = g.cg / kc;
                    let part = |c0: Affine, first: bool, last: bool| ChannelPart {
                        c0,
                        count: kc,
                        first,
                        last,
                    };
                    each_row(b, &part(Affine::constant(0), true, false));
                    b.for_loop(1, parts as i64 - 1, 1, |b, k| {
                        each_row(b, &part(Affine::var(k).scale(kc as i64), false, false))
                    });
                    let last = Affine::constant(((parts - 1) * kc) as i64);
                    each_row(b, &part(last, false, true));
                }
            }
        };
        let all_rows =
            |b: &mut KernelBuilder, grp: &Affine, blk: (&Affine, usize, Option<TileRoutine>)| {
                b.for_loop(0, g.n as i64, 1, |b, n| {
                    rows(b, Affine::var(n), grp, blk, Affine::constant(0), g.oh)
                });
            };
        let grp0 = Affine::constant(0);
        // a partial last block is a second loop beside the full blocks': inside a group
        // loop or a row band, never the outer loop that threads share
        let bands_only = self.ragged() && g.groups == 1;
        match loop_order(g, self.lanes(), g.groups * self.blocks, bands_only) {
            LoopOrder::BlocksOuter if g.groups == 1 => {
                b.for_loop(0, self.blocks as i64, 1, |b, blk| {
                    all_rows(b, &grp0, (&Affine::var(blk), self.lanes(), None))
                });
            }
            LoopOrder::BlocksOuter => {
                b.for_loop(0, g.groups as i64, 1, |b, grp| {
                    let grp = Affine::var(grp);
                    self.for_group_blocks(b, |b, blk, channels, routine| {
                        all_rows(b, &grp, (blk, channels, routine))
                    });
                });
            }
            LoopOrder::RowBands { rows: band } => {
                b.for_loop(0, (g.oh / band) as i64, 1, |b, bi| {
                    let row0 = Affine::var(bi).scale(band as i64);
                    b.for_loop(0, g.groups as i64, 1, |b, grp| {
                        let grp = Affine::var(grp);
                        self.for_group_blocks(b, |b, blk, channels, routine| {
                            b.for_loop(0, g.n as i64, 1, |b, n| {
                                let blk = (blk, channels, routine);
                                rows(b, Affine::var(n), &grp, blk, row0.clone(), band)
                            });
                        });
                    });
                });
            }
        }
        cx.step(b.finish(), args)
    }

    /// Runs `body` for each channel block of a group: its index, the channels of it the
    /// result has, and its routine when it is the tail's (`None`: [`PackedConv::micro`]).
    fn for_group_blocks(
        &self,
        b: &mut KernelBuilder,
        body: impl Fn(&mut KernelBuilder, &Affine, usize, Option<TileRoutine>),
    ) {
        match self.tail {
            Some(tail) => {
                let whole = self.blocks - 1;
                let lanes = self.lanes();
                b.for_loop(0, whole as i64, 1, |b, blk| {
                    body(b, &Affine::var(blk), lanes, None)
                });
                let rest = self.channels - whole * lanes;
                body(b, &Affine::constant(whole as i64), rest, Some(tail));
            }
            None => b.for_blocks(self.channels, self.lanes(), |b, blk, channels| {
                body(b, blk, channels, None)
            }),
        }
    }

    /// One tile: `V` channel vectors × `pixels` output pixels from column `q0`.
    #[allow(clippy::too_many_arguments)]
    fn tile(
        &self,
        b: &mut KernelBuilder,
        g: &Geo,
        bufs: &TileBufs,
        epi: &Epilogue,
        place: &TilePlace,
        pixels: usize,
        part: &ChannelPart,
        sweep: Option<&Sweep>,
    ) {
        let TilePlace {
            at,
            block_index,
            q0,
            channels,
            routine,
        } = *place;
        if let Some(routine) = routine.or(self.micro) {
            let call = MicroCall {
                routine,
                pixels,
                channels,
                sweep,
            };
            return self.micro_tile(b, g, bufs, epi, at, block_index, q0, call);
        }
        let w4 = Width::F32x4;
        let lanes = self.lanes() as i64;
        let accs: Vec<Vec<VarId>> = (0..self.vecs)
            .map(|_| (0..pixels).map(|_| b.var(w4)).collect())
            .collect();
        // partial sums: [n][o/4][oh][ow][4], so a tile's accumulators are consecutive
        let out_plane = (g.oh * g.ow) as i64;
        let partial_index = |v: usize, p: usize| {
            at.n.scale(g.o as i64 * out_plane)
                .add(&at.o0.plus(4 * v as i64).scale(out_plane))
                .add(&at.oh.scale(4 * g.ow as i64))
                .add(&q0.plus(p as i64).scale(4))
        };
        if let (false, Some(pbuf)) = (part.first, bufs.partial) {
            for (v, row) in accs.iter().enumerate() {
                for (p, &acc) in row.iter().enumerate() {
                    b.assign(acc, Expr::load(pbuf, partial_index(v, p), w4));
                }
            }
        }
        for (v, row) in accs.iter().enumerate() {
            if !part.first {
                break;
            }
            let init = match bufs.bias {
                Some(bias) => Expr::load(bias, at.o0.plus(4 * v as i64), w4),
                None => Expr::constant(0.0, w4),
            };
            let init = if pixels > 1 && !init.is_trivial() {
                b.let_(init, w4)
            } else {
                init
            };
            for &acc in row {
                b.assign(acc, init.clone());
            }
        }
        let block_len = self.block_len(g);
        // One FMA per accumulator for input channel `c` at tap (kh, kw).
        let step = |b: &mut KernelBuilder, kh: &Affine, kw: &Affine, c: &Affine| {
            let tap = kh.scale(g.kw as i64).add(kw);
            let wbase = block_index
                .scale(block_len)
                .add(&c.scale(lanes))
                .add(&tap.scale(g.cg as i64 * lanes));
            let ws: Vec<Expr> = (0..self.vecs)
                .map(|v| {
                    let load = Expr::load(bufs.w, wbase.plus(4 * v as i64), w4);
                    if pixels > 1 {
                        b.let_(load, w4)
                    } else {
                        load
                    }
                })
                .collect();
            let row = at
                .oh
                .scale(g.stride[0] as i64)
                .add(&kh.scale(g.dil[0] as i64));
            // the input of pixel p is at xbase + p·pixel_step
            let (xbase, pixel_step) = if self.channels_last {
                let ci = g.c as i64;
                let base =
                    at.n.scale(g.hp as i64 * g.wq as i64 * ci)
                        .add(&row.scale(g.wq as i64 * ci))
                        .add(&q0.scale(g.stride[1] as i64 * ci))
                        .add(&kw.scale(g.dil[1] as i64 * ci))
                        .add(&at.c0.add(c));
                (base, g.stride[1] as i64 * ci)
            } else {
                let plane = (g.hp * g.wq) as i64;
                let base =
                    at.n.scale(g.c as i64 * plane)
                        .add(&at.c0.add(c).scale(plane))
                        .add(&row.scale(g.wq as i64))
                        .add(&q0.scale(g.stride[1] as i64))
                        .add(&kw.scale(g.dil[1] as i64));
                (base, g.stride[1] as i64)
            };
            for p in 0..pixels {
                let xi = xbase.plus(p as i64 * pixel_step);
                let xv = Expr::Splat(Box::new(Expr::load(bufs.x, xi, Width::Scalar)));
                let xv = if self.vecs > 1 { b.let_(xv, w4) } else { xv };
                // the broadcast first: x86 FMAs overwrite their first factor, and the
                // broadcast is the operand that dies
                for (v, row_accs) in accs.iter().enumerate() {
                    let acc = row_accs[p];
                    b.assign(acc, Expr::fma(xv.clone(), ws[v].clone(), Expr::Var(acc)));
                }
            }
        };
        // Channels-last input with unit column dilation: the taps of one kernel row
        // read kw·cg consecutive input floats against kw·cg consecutive packed weight
        // vectors, so (kw, channel) runs as one loop over `chans` (the stem's 7×3
        // becomes one loop of 21).
        let whole = part.count == g.cg;
        let flat = self.channels_last && g.dil[1] == 1 && g.groups == 1 && whole;
        let (taps_w, chans) = if flat {
            (1, g.kw * g.cg)
        } else {
            (g.kw, part.count)
        };
        let step = |b: &mut KernelBuilder, kh: &Affine, kw: &Affine, c: &Affine| {
            step(b, kh, kw, &c.add(&part.c0))
        };
        let unroll = self.unroll.min(chans).max(1);
        if chans / unroll >= 2 || g.kh == 1 {
            // a loop over input channels per tap, `unroll` channels per trip
            let main = chans / unroll * unroll;
            for kh in 0..g.kh {
                let kh = Affine::constant(kh as i64);
                for kw in 0..taps_w {
                    let kw = Affine::constant(kw as i64);
                    b.for_loop(0, main as i64, unroll as i64, |b, c| {
                        for u in 0..unroll {
                            step(b, &kh, &kw, &Affine::var(c).plus(u as i64));
                        }
                    });
                    b.for_loop(main as i64, chans as i64, 1, |b, c| {
                        step(b, &kh, &kw, &Affine::var(c))
                    });
                }
            }
        } else {
            // Few input channels (a network's stem): loops over kernel rows and columns,
            // so each loop body holds at most two weight vectors. Straight-line taps
            // would make the weight loads invariant in the row loops or, in one body,
            // keep every tap's weights live at once; either way Cranelift spills them.
            b.for_loop(0, g.kh as i64, 1, |b, kh| {
                b.for_loop(0, g.kw as i64, 1, |b, kw| {
                    let (kh, kw) = (Affine::var(kh), Affine::var(kw));
                    if g.cg <= 2 {
                        for c in 0..g.cg {
                            step(b, &kh, &kw, &Affine::constant(c as i64));
                        }
                    } else {
                        b.for_loop(0, g.cg as i64, 1, |b, c| step(b, &kh, &kw, &Affine::var(c)));
                    }
                });
            });
        }
        if !part.last {
            if let Some(pbuf) = bufs.partial {
                for (v, row) in accs.iter().enumerate() {
                    for (p, &acc) in row.iter().enumerate() {
                        b.store(pbuf, partial_index(v, p), Expr::Var(acc), w4);
                    }
                }
            }
            return;
        }
        if self.lane_blocked_output {
            let base = self.lane_blocked_index(g, at, block_index, q0);
            for (v, row_accs) in accs.iter().enumerate() {
                for (p, &acc) in row_accs.iter().enumerate() {
                    let at = base.plus((p * self.lanes() + 4 * v) as i64);
                    b.store(bufs.out, at, Expr::Var(acc), w4);
                }
            }
            return;
        }
        let out_index = |o: &Affine, col: &Affine| {
            at.n.scale(g.o as i64 * out_plane)
                .add(&o.scale(out_plane))
                .add(&at.oh.scale(g.ow as i64))
                .add(col)
        };
        for (v, row_accs) in accs.iter().enumerate() {
            // Groups of 4 pixels: a 4×4 transpose turns 4 accumulators (4 channels each)
            // into 4 vectors of one channel × 4 consecutive columns, so the post-ops run
            // on f32x4 and the stores are vector stores along W.
            let quads = row_accs.len() / 4;
            for quad in 0..quads {
                let tile: Vec<Expr> = row_accs[4 * quad..4 * quad + 4]
                    .iter()
                    .map(|&acc| Expr::Var(acc))
                    .collect();
                let col = q0.plus(4 * quad as i64);
                for (l, channel) in transpose4(b, &tile).into_iter().enumerate() {
                    let o = at.o0.plus(4 * v as i64 + l as i64);
                    let idx = [at.n.clone(), o.clone(), at.oh.clone(), col.clone()];
                    let val = epi.apply(b, channel, &idx, w4);
                    b.store(bufs.out, out_index(&o, &col), val, w4);
                }
            }
            // the tail pixels, one lane at a time
            for l in 0..4 {
                let o = at.o0.plus(4 * v as i64 + l);
                for (p, &acc) in row_accs.iter().enumerate().skip(4 * quads) {
                    let col = q0.plus(p as i64);
                    let s = Expr::lane(Expr::Var(acc), l as u8);
                    let idx = [at.n.clone(), o.clone(), at.oh.clone(), col.clone()];
                    let val = epi.apply(b, s, &idx, Width::Scalar);
                    b.store(bufs.out, out_index(&o, &col), val, Width::Scalar);
                }
            }
        }
    }

    /// One micro-kernel tile: the routine sums `lanes` channels × `pixels` pixels —
    /// straight into the result when it is stored by quads of channels, else into a local
    /// buffer `[pixel][lanes]` — and the epilogue finishes them: stored in channel blocks,
    /// per pixel and vector of 4 channels as they are; stored NCHW, per 4 pixels a 4×4
    /// transpose per channel vector, then vector stores along W, as in the Cranelift
    /// tile.
    #[allow(clippy::too_many_arguments)]
    fn micro_tile(
        &self,
        b: &mut KernelBuilder,
        g: &Geo,
        bufs: &TileBufs,
        epi: &Epilogue,
        at: &TileAt,
        block_index: &Affine,
        q0: &Affine,
        call: MicroCall,
    ) {
        let MicroCall {
            routine,
            pixels,
            channels,
            sweep,
        } = call;
        let w4 = Width::F32x4;
        let lanes = routine.lanes;
        // where the routine leaves its sums: the result itself, channels-last within
        // the group, or `[pixel][lanes]` in a stack buffer for the epilogue
        // where the result of channel `o0 + o` (`o` < lanes) at pixel `p` of the tile is
        // stored in channel blocks: `[n][o/16][oh·ow][16]`, a partial last block padded
        // to 16; `o0` is a multiple of 16
        let out_plane = (g.oh * g.ow) as i64;
        let unit = CHANNEL_BLOCK as i64;
        let stored_channels = g.o.next_multiple_of(CHANNEL_BLOCK) as i64;
        let stored_at = |p: &Affine, o: i64| {
            at.n.scale(stored_channels * out_plane)
                .add(&at.o0.scale(out_plane))
                .add(&at.oh.scale(g.ow as i64 * unit))
                .add(&q0.add(p).scale(unit))
                .plus(o / unit * unit * out_plane + o % unit)
        };
        // A leading SiLU or sigmoid post-op runs with the bias on the routine's
        // full-width vectors, natively, over the whole tile (a partial block's padded
        // lanes have no bias to read: Cranelift code then); the rest of the epilogue as
        // usual.
        let native_activation = (channels == lanes as usize || bufs.bias_whole_tiles)
            .then(|| epi.after_leading_activation())
            .flatten();
        // A tile of whole stored channel blocks (16 lanes, or 32: two blocks) whose
        // epilogue a store-rows routine applies (a bias, a residual, a ReLU) is one run
        // `[pixel][16]` of the result per block: the routine writes its sums there, among
        // its FMAs, rather than to the stack for a separate pass to copy (MobileNetV3's
        // 16→64 at 112²: 1.08 → 0.92 ms with 16 lanes on AVX2; 0.35 → 0.31 ms with 32 on
        // AVX-512), and the epilogue runs on them in place, block by block. A partial last
        // tile whose lanes are all stored (24 channels on 32 lanes, 8 on 16) qualifies
        // when its padded lanes come out zero as the layout requires: their weights and
        // bias are zero, a residual's padded lanes are, and every activation on the way
        // maps zero to zero (not a sigmoid). (A non-finite input makes them NaN rather
        // than zero — where the pixel's real lanes are already non-finite.)
        let stored_lanes = channels.next_multiple_of(CHANNEL_BLOCK) == lanes as usize;
        let direct_finish = epi.native_finish().filter(|finish| {
            self.blocked_output
                && lanes % unit == 0
                && (channels == lanes as usize
                    || (stored_lanes && finish.keeps_zero() && bufs.bias_whole_tiles))
        });
        let direct = direct_finish.is_some();
        let block_run = unit * out_plane;
        let (sums, sums_at, out_pixel_stride, out_vec_stride, out_block_stride) =
            if self.lane_blocked_output {
                let at = self.lane_blocked_index(g, at, block_index, q0);
                (bufs.out, at, lanes, 4, 16)
            } else if direct {
                let at = stored_at(&Affine::constant(0), 0);
                (bufs.out, at, unit, 4, block_run)
            } else {
                let local = b.local(pixels * lanes as usize);
                (local, Affine::constant(0), lanes, 4, 16)
            };
        let row = at.oh.scale(g.stride[0] as i64);
        let (ci, plane) = (g.c as i64, (g.hp * g.wq) as i64);
        let flat = self.channels_last && g.dil[1] == 1 && g.groups == 1;
        let (x, tile) = if self.blocked_input {
            // [n][c/16][pixel][16]: the reduction's rows are the channel blocks (its
            // weights `[c][lanes]` then run on in the same order), a pixel's 16
            // channels are consecutive
            let unit = CHANNEL_BLOCK as i64;
            let x =
                at.n.scale(ci * plane)
                    .add(&at.c0.scale(plane))
                    .add(&row.scale(g.wq as i64 * unit))
                    .add(&q0.scale(g.stride[1] as i64 * unit));
            let tile = ConvTile {
                lanes,
                pixels: pixels as i64,
                rows: (g.cg / CHANNEL_BLOCK) as i64,
                row_stride: plane * unit,
                taps: 1,
                tap_stride: 0,
                chans: unit,
                chan_stride: 1,
                pixel_stride: g.stride[1] as i64 * unit,
                w_tap_stride: unit * lanes,
                out_pixel_stride,
                out_vec_stride,
                out_block_stride,
                next_len: 0,
                finish: 0,
                accumulate: false,
            };
            (x, tile)
        } else if self.channels_last {
            let x =
                at.n.scale(g.hp as i64 * g.wq as i64 * ci)
                    .add(&row.scale(g.wq as i64 * ci))
                    .add(&q0.scale(g.stride[1] as i64 * ci))
                    .add(&at.c0);
            let (taps, tap_stride, chans) = if flat {
                (1, 0, g.kw * g.cg)
            } else {
                (g.kw, g.dil[1] as i64 * ci, g.cg)
            };
            let tile = ConvTile {
                lanes,
                pixels: pixels as i64,
                rows: g.kh as i64,
                row_stride: g.dil[0] as i64 * g.wq as i64 * ci,
                taps: taps as i64,
                tap_stride,
                chans: chans as i64,
                chan_stride: 1,
                pixel_stride: g.stride[1] as i64 * ci,
                w_tap_stride: (chans as i64) * lanes,
                out_pixel_stride,
                out_vec_stride,
                out_block_stride,
                next_len: 0,
                finish: 0,
                accumulate: false,
            };
            (x, tile)
        } else {
            let x =
                at.n.scale(ci * plane)
                    .add(&at.c0.scale(plane))
                    .add(&row.scale(g.wq as i64))
                    .add(&q0.scale(g.stride[1] as i64));
            let tile = ConvTile {
                lanes,
                pixels: pixels as i64,
                rows: g.kh as i64,
                row_stride: g.dil[0] as i64 * g.wq as i64,
                taps: g.kw as i64,
                tap_stride: g.dil[1] as i64,
                chans: g.cg as i64,
                chan_stride: plane,
                pixel_stride: g.stride[1] as i64,
                w_tap_stride: g.cg as i64 * lanes,
                out_pixel_stride,
                out_vec_stride,
                out_block_stride,
                next_len: 0,
                finish: 0,
                accumulate: false,
            };
            (x, tile)
        };
        // the epilogue's operand rows (a residual) stream in while the routine computes
        if self.blocked_output {
            let first = stored_at(&Affine::constant(0), 0);
            let runs = lanes / unit;
            epi.prefetch_stored(b, &first, runs, unit * out_plane, unit * pixels as i64);
        } else {
            let tile_at = [at.n.clone(), at.o0.clone(), at.oh.clone(), q0.clone()];
            epi.prefetch(b, &tile_at, 1, channels, pixels);
        }
        // A direct tile whose epilogue is the store routine's (a bias, a residual, ReLU or
        // hard-swish) finishes its sums in registers before its one store: the result is
        // written once, not stored, read back and stored again by the routine
        // (MobileNetV3-large's 16 → 64 expansion at 112²: 0.27–0.29 → 0.23–0.24 ms).
        let in_tile = direct_finish.and_then(|f| f.in_tile());
        let (tile, tile_bias, tile_residual) = match in_tile {
            Some((residual, act)) => (
                ConvTile {
                    finish: ConvTile::finish_code(act),
                    ..tile
                },
                bufs.bias.map(|buf| BufPtr {
                    buf,
                    index: at.o0.clone(),
                }),
                residual.map(|buf| BufPtr {
                    buf,
                    index: sums_at.clone(),
                }),
            ),
            None => (tile, None, None),
        };
        let block_len = self.block_len(g);
        // this call's share of the next block's weights: the run past the last block is
        // moved back into the buffer (`Stmt::ConvTile`), a harmless re-fetch
        let (tile, next) = match sweep {
            Some(s) => {
                let at = block_index
                    .plus(1)
                    .scale(block_len)
                    .add(&s.row_start.add(q0).scale(s.unit));
                let tile = ConvTile {
                    next_len: (s.unit * pixels as i64).min(block_len),
                    ..tile
                };
                (
                    tile,
                    Some(BufPtr {
                        buf: bufs.w,
                        index: at,
                    }),
                )
            }
            None => (tile, None),
        };
        b.conv_tile_finished(
            BufPtr {
                buf: bufs.x,
                index: x,
            },
            BufPtr {
                buf: bufs.w,
                index: block_index.scale(block_len),
            },
            BufPtr {
                buf: sums,
                index: sums_at.clone(),
            },
            next,
            tile_bias,
            tile_residual,
            tile,
        );
        if self.lane_blocked_output || in_tile.is_some() {
            return;
        }
        // a tile written straight into its blocks of the result: the epilogue in place
        // there, a block's run at a time, on the routines' full-width vectors
        if let Some(finish) = direct_finish {
            for r in 0..lanes / unit {
                let run = BufPtr {
                    buf: bufs.out,
                    index: sums_at.plus(r * block_run),
                };
                let bias = bufs.bias.map(|buf| BufPtr {
                    buf,
                    index: at.o0.plus(r * unit),
                });
                finish.emit(b, run, bias, pixels as i64, unit);
            }
            return;
        }
        let (epi, bias) = match native_activation {
            Some((act, rest)) => {
                let bias = bufs.bias.map(|buf| BufPtr {
                    buf,
                    index: at.o0.clone(),
                });
                let sums_at = BufPtr {
                    buf: sums,
                    index: sums_at.clone(),
                };
                b.activation_rows(act, sums_at, bias, pixels as i64, lanes);
                (rest, None)
            }
            None => (epi.clone(), bufs.bias),
        };
        let epi = &epi;
        let out_index = |o: &Affine, col: &Affine| {
            at.n.scale(g.o as i64 * out_plane)
                .add(&o.scale(out_plane))
                .add(&at.oh.scale(g.ow as i64))
                .add(col)
        };
        // the sums of pixel `p`, channels `4v..4v + 4` (`v` an affine vector index), plus
        // their bias
        let sum = |b: &mut KernelBuilder, p: &Affine, v: &Affine| {
            let s = Expr::load(sums, p.scale(lanes).add(&v.scale(4)), w4);
            match bias {
                Some(bias) => {
                    let bv = Expr::load(bias, at.o0.add(&v.scale(4)), w4);
                    b.let_(Expr::binary(BinOp::Add, s, bv), w4)
                }
                None => s,
            }
        };
        if self.blocked_output {
            // per pixel, each vector of 4 channels as the routine left it: no transposes.
            // A partial last block's padded lanes get zeros (its readers compute on whole
            // blocks, against zero weights: the lanes must hold finite values), and a
            // tile's lanes past that block are not stored at all.
            let real_vecs = (channels / 4) as i64;
            let stored_vecs = (channels.next_multiple_of(CHANNEL_BLOCK) / 4) as i64;
            b.for_loop(0, pixels as i64, 1, |b, p| {
                let p = Affine::var(p);
                let col = q0.add(&p);
                for v in real_vecs..stored_vecs.min(lanes / 4) {
                    let zero = Expr::constant(0.0, w4);
                    b.store(bufs.out, stored_at(&p, 4 * v), zero, w4);
                }
                for v in 0..real_vecs {
                    let s = sum(b, &p, &Affine::constant(v));
                    let o = at.o0.plus(4 * v);
                    let idx = [at.n.clone(), o, at.oh.clone(), col.clone()];
                    let stored = stored_at(&p, 4 * v);
                    let val = epi.apply_along_channels(b, s, &idx, &stored, w4);
                    b.store(bufs.out, stored, val, w4);
                }
            });
            return;
        }
        // with no residual, the tile stored transposed by a native routine — each
        // channel's pixels one run of its plane, the bias and a ReLU or hard-swish
        // applied on the way — rather than Cranelift code per 4×4 block (YOLO's heads:
        // 16 of its 61 ms of code generation)
        if let Some((None, act)) = epi.as_store_rows() {
            b.store_planes(
                act,
                BufPtr {
                    buf: sums,
                    index: sums_at.clone(),
                },
                bias.map(|buf| BufPtr {
                    buf,
                    index: at.o0.clone(),
                }),
                BufPtr {
                    buf: bufs.out,
                    index: out_index(&at.o0, q0),
                },
                pixels as i64,
                channels as i64,
                lanes,
                out_plane,
            );
            return;
        }
        // the channels the result has: whole vectors of 4, then (in a group's partial
        // last block) up to 3 more, whose bias is read per channel: a vector load would
        // run past the group's end
        let (full_vecs, rest) = ((channels / 4) as i64, channels % 4);
        let bias_of = |o: &Affine| bias.map(|bias| Expr::load(bias, o.clone(), Width::Scalar));
        // a loop over pairs of channel vectors rather than `vecs` copies of the body: the
        // code stays small (Cranelift's time grows with it: ResNet-50 lower + codegen
        // 104 → 87 ms), and the loop costs a few instructions per pair. Channels outer,
        // pixels inner: each channel's run of the row is written whole before the next
        // channel's, so a cache line is filled by consecutive stores — with pixels
        // outer, a line waits for the tile's other channels, whose planes (4 KiB
        // multiples apart at 160² or 320²) all fall in one L1 set and evict it.
        let quads = pixels / 4;
        let pair = if full_vecs % 2 == 0 { 2 } else { 1 };
        b.for_loop(0, full_vecs, pair, |b, v0| {
            b.for_loop(0, quads as i64, 1, |b, quad| {
                let p0 = Affine::var(quad).scale(4);
                let col = q0.add(&p0);
                for u in 0..pair {
                    let v = Affine::var(v0).plus(u);
                    let tile: Vec<Expr> = (0..4).map(|i| sum(b, &p0.plus(i), &v)).collect();
                    for (l, channel) in transpose4(b, &tile).into_iter().enumerate() {
                        let o = at.o0.add(&v.scale(4)).plus(l as i64);
                        let idx = [at.n.clone(), o.clone(), at.oh.clone(), col.clone()];
                        let val = epi.apply(b, channel, &idx, w4);
                        b.store(bufs.out, out_index(&o, &col), val, w4);
                    }
                }
            });
        });
        if rest > 0 {
            b.for_loop(0, quads as i64, 1, |b, quad| {
                let p0 = Affine::var(quad).scale(4);
                let col = q0.add(&p0);
                let v = Affine::constant(full_vecs);
                let tile: Vec<Expr> = (0..4)
                    .map(|i| Expr::load(sums, p0.plus(i).scale(lanes).add(&v.scale(4)), w4))
                    .collect();
                for (l, channel) in transpose4(b, &tile).into_iter().enumerate().take(rest) {
                    let o = at.o0.plus(4 * full_vecs + l as i64);
                    let channel = match bias_of(&o) {
                        Some(bv) => Expr::binary(BinOp::Add, channel, Expr::splat_to(bv, w4)),
                        None => channel,
                    };
                    let idx = [at.n.clone(), o.clone(), at.oh.clone(), col.clone()];
                    let val = epi.apply(b, channel, &idx, w4);
                    b.store(bufs.out, out_index(&o, &col), val, w4);
                }
            });
        }
        // the tail pixels, one lane at a time
        for p in 4 * quads..pixels {
            let col = q0.plus(p as i64);
            b.for_loop(0, full_vecs, 1, |b, v| {
                let v = Affine::var(v);
                let s = sum(b, &Affine::constant(p as i64), &v);
                let s = if s.is_trivial() { s } else { b.let_(s, w4) };
                for l in 0..4 {
                    let o = at.o0.add(&v.scale(4)).plus(l);
                    let idx = [at.n.clone(), o.clone(), at.oh.clone(), col.clone()];
                    let val = epi.apply(b, Expr::lane(s.clone(), l as u8), &idx, Width::Scalar);
                    b.store(bufs.out, out_index(&o, &col), val, Width::Scalar);
                }
            });
            for l in 0..rest as i64 {
                let o = at.o0.plus(4 * full_vecs + l);
                let s = Expr::load(
                    sums,
                    Affine::constant(p as i64 * lanes + 4 * full_vecs + l),
                    Width::Scalar,
                );
                let s = match bias_of(&o) {
                    Some(bv) => Expr::binary(BinOp::Add, s, bv),
                    None => s,
                };
                let idx = [at.n.clone(), o.clone(), at.oh.clone(), col.clone()];
                let val = epi.apply(b, s, &idx, Width::Scalar);
                b.store(bufs.out, out_index(&o, &col), val, Width::Scalar);
            }
        }
    }
}
